"""What a `GlobalDeviceArray` says about its global array and where it lives.

`_Placement` is the part behind the GDA's descriptive attributes: shape,
dtype, size, the mesh and `mesh_axes` it was built with, its
`NamedSharding`, its devices. Each is read from the GDA's private
`jax.Array` (or what the constructor was given) without touching the data,
so all but `devices()` also work on a deleted or donated GDA, as on a
`jax.Array`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from jax.sharding import Mesh, NamedSharding

from jax_sharding_ext._array.records import FROM_SHARDING, GdaShape
from jax_sharding_ext._array.shard_math import MeshAxes, Shape


class _Placement:
  """A part of `GlobalDeviceArray` (`_public.assembled`): shape, dtype, mesh, `mesh_axes`, sharding and devices of a GDA.

  The class assembled from it provides `_arr` (its `jax.Array`, whose sharding is a
  `NamedSharding`), `_mesh` (the constructor's mesh, or None to read it from
  `_arr`'s sharding) and `_mesh_axes` (what the constructor was given, or
  `FROM_SHARDING` for the sharding's spec).
  """

  __slots__ = ()

  if TYPE_CHECKING:  # provided by the class assembled from it
    _arr: Any
    _mesh: Mesh | None
    _mesh_axes: Any

  @property
  def shape(self) -> Shape:
    """The global shape (a tuple of ints).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
      ...                                       lambda index: np.zeros((8, 2))[index])
      >>> gda.shape
      (8, 2)
    """
    return GdaShape(self._arr.shape, self)

  @property
  def dtype(self) -> np.dtype:
    """The dtype of every shard.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8, dtype=np.int32)[index])
      >>> gda.dtype
      dtype('int32')
    """
    return self._arr.dtype

  @property
  def ndim(self) -> int:
    """The number of dimensions of the global array.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> GlobalDeviceArray.from_callback((8, 2), mesh, P('x'),
      ...                                 lambda index: np.zeros((8, 2))[index]).ndim
      2
    """
    return self._arr.ndim

  @property
  def size(self) -> int:
    """The number of elements of the global array.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> GlobalDeviceArray.from_callback((8, 2), mesh, P('x'),
      ...                                 lambda index: np.zeros((8, 2))[index]).size
      16
    """
    return math.prod(self._arr.shape)

  @property
  def nbytes(self) -> int:
    """The bytes of the global array, counting each element once (not each replica).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> GlobalDeviceArray.from_callback((8,), mesh, P(),   # replicated: still 8 elements
      ...                                 lambda index: np.zeros(8, np.float32)[index]).nbytes
      32
    """
    return self.size * self.dtype.itemsize

  @property
  def mesh(self) -> Mesh:
    """The mesh of every device that holds a shard (on every process).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x'),
      ...                                       lambda index: np.zeros((8, 2))[index])
      >>> gda.mesh == mesh, dict(gda.mesh.shape)
      (True, {'x': 4, 'y': 2})
    """
    mesh = self._mesh
    if mesh is None:
      mesh = self._mesh = self._arr.sharding.mesh  # type: ignore[misc]  # the GDA's slot
    return mesh

  @property
  def mesh_axes(self) -> MeshAxes:
    """How the dimensions are split over the mesh, as the constructor was given it.

    A list, tuple or `PartitionSpec`, unchanged; a GDA made from a
    `jax.Array` (`from_jax_array`, a `jax.jit` output with the output flag
    on) has its `NamedSharding`'s `PartitionSpec`.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, ['x', None],
      ...                                       lambda index: np.zeros((8, 2))[index])
      >>> gda.mesh_axes
      ['x', None]
      >>> GlobalDeviceArray.from_jax_array(gda.to_jax_array()).mesh_axes
      P('x', None)
    """
    axes = self._mesh_axes
    if axes is FROM_SHARDING:
      axes = self._mesh_axes = self._arr.sharding.spec
    return axes

  @property
  def sharding(self) -> NamedSharding:
    """The `NamedSharding(mesh, spec)` of the global array (`jax.Array.sharding`).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, ['x', None],
      ...                                       lambda index: np.zeros((8, 2))[index])
      >>> gda.sharding == jax.sharding.NamedSharding(mesh, P('x', None))
      True
    """
    return self._arr.sharding

  @property
  def format(self):
    """The device layout and sharding of the shards (`jax.Array.format`).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.zeros(8)[index])
      >>> gda.format == gda.to_jax_array().format
      True
    """
    return self._arr.format

  @property
  def is_fully_replicated(self) -> bool:
    """True when every device holds the whole array.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> def cb(index):
      ...   return np.zeros(8)[index]
      >>> GlobalDeviceArray.from_callback((8,), mesh, P(), cb).is_fully_replicated
      True
      >>> GlobalDeviceArray.from_callback((8,), mesh, P('x'), cb).is_fully_replicated
      False
    """
    return self._arr.sharding.is_fully_replicated

  @property
  def is_fully_addressable(self) -> bool:
    """True when this process holds every shard (always, in one process).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                 lambda index: np.zeros(8)[index]).is_fully_addressable
      True
    """
    return self._arr.sharding.is_fully_addressable

  def devices(self) -> set:
    """Return the set of devices that hold a shard (`jax.Array.devices`).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()[:4]), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.zeros(8)[index])
      >>> gda.devices() == set(jax.devices()[:4])
      True
    """
    return self._arr.devices()
