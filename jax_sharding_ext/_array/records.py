"""The small records of the GDA API: the `FROM_GDA` sentinel and its type
(and the test for a leaf of a sharding-spec pytree), the `Shard` record and
the GDA's shape tuple.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import PartitionSpec, Sharding

from jax_sharding_ext._array.shard_math import Index
from jax_sharding_ext._public import public


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


@public("jax_sharding_ext")
class FromGdaType:
  """The type of `FROM_GDA`, legacy `pjit`'s "this argument's own sharding".

  `FROM_GDA` is its one instance: calling the type returns it, and it
  pickles as `jax_sharding_ext.FROM_GDA`. In `in_axis_resources`, the
  argument must be a `GlobalDeviceArray` or a `jax.Array` with a
  `NamedSharding`; anything else is a `ValueError`, as in the GDA era.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
    ...                                       lambda index: np.arange(8.0)[index])
    >>> double = pjit(lambda x: 2 * x, in_axis_resources=FROM_GDA)
    >>> double(gda).sharding == gda.sharding   # no mesh context needed
    True
    >>> double(np.arange(8.0))
    Traceback (most recent call last):
    ValueError: ...
    >>> isinstance(FROM_GDA, FromGdaType), FromGdaType() is FROM_GDA
    (True, True)
  """

  __slots__ = ()

  def __new__(cls) -> FromGdaType:
    return FROM_GDA

  def __repr__(self) -> str:
    return "FROM_GDA"

  def __reduce__(self) -> str:
    return "FROM_GDA"  # pickle stores the global `jax_sharding_ext.FROM_GDA`


FROM_GDA: FromGdaType = object.__new__(FromGdaType)
"""Legacy `pjit` `in_axis_resources` entry: use the argument's own sharding."""

FromGda = FromGdaType
"""The type's name in pickles of `FROM_GDA` written before it pickled as the global."""


def is_spec_leaf(x: Any) -> bool:
  """A leaf of a pytree of sharding specs (pjit's axis resources,
  `multihost_utils`' pspecs): `None`, a `PartitionSpec`, a `Sharding` or
  `FROM_GDA`."""
  return x is None or isinstance(x, (PartitionSpec, Sharding, FromGda))


@public("jax_sharding_ext")
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

  Example:
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x'),
    ...                                       lambda index: np.arange(16.0).reshape(8, 2)[index])
    >>> shard = gda.local_shards[3]
    >>> shard.device == mesh.devices.flat[3], shard.index, shard.replica_id
    (True, (slice(2, 4, None), slice(None, None, None)), 1)
    >>> shard.data
    Array([[4., 5.],
           [6., 7.]], dtype=float32)
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
