"""The small records of the GDA API: the `FROM_GDA` sentinel (and the test
for a leaf of a sharding-spec pytree), the `Shard` record and the GDA's shape
tuple.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import PartitionSpec, Sharding

from jax_sharding_ext._array.shard_math import Index


class Sentinel:
  """A named singleton (one instance per subclass) that pickles to itself."""

  def __new__(cls):
    inst = cls.__dict__.get("_instance")
    if inst is None:
      inst = super().__new__(cls)
      cls._instance = inst
    return inst

  _name = "SENTINEL"

  def __repr__(self):
    return self._name

  def __reduce__(self):
    return (type(self), ())


class FromGda(Sentinel):
  """Sentinel for legacy `pjit(in_axis_resources=FROM_GDA)`."""

  _name = "FROM_GDA"
FROM_GDA = FromGda()
"""Legacy `pjit` `in_axis_resources` entry: use the argument's own sharding."""


def is_spec_leaf(x: Any) -> bool:
  """A leaf of a pytree of sharding specs (pjit's axis resources,
  `multihost_utils`' pspecs): `None`, a `PartitionSpec`, a `Sharding` or
  `FROM_GDA`."""
  return x is None or isinstance(x, (PartitionSpec, Sharding, FromGda))


@dataclasses.dataclass(frozen=True)
class Shard:
  """A single data shard of a `GlobalDeviceArray`.

  Attributes:
    device: the device holding this shard.
    index: the index into the global array (a tuple of slices).
    replica_id: which replica of the global array this shard belongs to; 0
      for every shard of fully sharded data.
    data: the shard as a single-device `jax.Array`; `None` when `device`
      belongs to another process.
  """

  device: Any
  index: Index
  replica_id: int
  data: jax.Array | None = None


class GdaShape(tuple):
  """A GDA's shape: a plain tuple that also remembers the GDA's `mesh_axes`.

  Libraries that describe a restore target by its shape, dtype and sharding
  (orbax's `construct_restore_args`, used by `StandardRestore`) copy the
  shape object; `orbax_support` reads `mesh_axes` from it to restore a GDA
  where the target held one.
  """

  _axes: tuple[Any, Any]

  def __new__(cls, shape, gda: Any):
    self = super().__new__(cls, shape)
    self._axes = gda._mesh_axes, gda._arr.sharding
    return self

  @property
  def mesh_axes(self) -> Any:
    axes, sharding = self._axes
    return sharding.spec if axes is FROM_SHARDING else axes

  def __reduce__(self):
    return (tuple, (tuple(self),))  # pickles as the plain tuple it is


FROM_SHARDING = object()
"""`_mesh_axes` of a GDA made by `_wrap` until first read: the array's spec."""
