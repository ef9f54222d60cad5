"""The shards of a `GlobalDeviceArray`: the GDA-era per-device access.

`_ShardAccess` is the part behind `local_shards` (also
`addressable_shards`), `global_shards`, `local_data` (also
`addressable_data`) and the GDA-era private `_device_buffers`. A shard's
`data` is one of the GDA's own device buffers as a single-device
`jax.Array` (no copy), so reading it marks the GDA shared (`family.py`):
from then on arrays the package does not see may hold its buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import jax

from jax_sharding_ext._array import family
from jax_sharding_ext._array.checks import local_shard_data
from jax_sharding_ext._array.records import Shard
from jax_sharding_ext._array.shard_math import layout
from jax_sharding_ext._jax import buffers as jax_buffers


class _ShardAccess:
  """A part of `GlobalDeviceArray` (`_public.assembled`): the shards of a GDA, local and global.

  The class assembled from it provides `_local_shards` (the cached local shards, or
  None), `_checked_array(action)` (its live `jax.Array`, or the GDA-era
  `RuntimeError` once deleted) and the `shape`, `mesh` and `mesh_axes` the
  shards are laid out by.
  """

  __slots__ = ()

  if TYPE_CHECKING:  # provided by the class assembled from it
    _local_shards: list[Shard] | None
    shape: Any
    mesh: Any
    mesh_axes: Any

    def _checked_array(self, action: str) -> Any: ...

  @property
  def local_shards(self) -> list[Shard]:
    """The shards on this process's devices, in `mesh.local_devices` order.

    Each `Shard`'s `data` is one of the GDA's own device buffers (no copy).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x'),
      ...                                       lambda index: np.arange(16).reshape(8, 2)[index])
      >>> len(gda.local_shards)
      8
      >>> shard = gda.local_shards[1]   # 'y' does not split: device 1 holds a replica
      >>> shard.device == mesh.local_devices[1], shard.index, shard.replica_id
      (True, (slice(0, 2, None), slice(None, None, None)), 1)
      >>> shard.data
      Array([[0, 1],
             [2, 3]], dtype=int32)
    """
    arr = self._checked_array("read its local shards")
    shards = self._local_shards
    if shards is None:
      family.mark_shared(self)
      lay = layout(self.shape, self.mesh, self.mesh_axes)
      indices, rids = lay.indices, lay.replica_ids
      pos = {d: i for i, d in enumerate(self.mesh.devices.flat)}
      try:
        data = {next(iter(a.sharding.device_set)): a
                for a in jax_buffers.single_device_arrays(arr)}
        shards = [Shard(d, indices[pos[d]], rids[pos[d]], data[d])
                  for d in self.mesh.local_devices]
      except Exception:  # deleted by another thread meanwhile: say so
        self._checked_array("read its local shards")
        raise
      self._local_shards = shards  # type: ignore[misc]  # the GDA's slot
    return list(shards)

  @property
  def addressable_shards(self) -> list[Shard]:
    """`jax.Array`'s name for `local_shards`: the same list.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8)[index])
      >>> gda.addressable_shards == gda.local_shards
      True
    """
    return self.local_shards

  @property
  def global_shards(self) -> list[Shard]:
    """Every device's shard, in `mesh.devices.flat` order.

    A shard on a device of another process has `data=None`.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
      ...                                       lambda index: np.zeros((8, 2))[index])
      >>> [s.index for s in gda.global_shards[:2]]
      [(slice(0, 2, None), slice(0, 1, None)), (slice(0, 2, None), slice(1, 2, None))]
      >>> all(s.data is not None for s in gda.global_shards)   # one process: all local
      True
    """
    local = {s.device: s for s in self.local_shards}
    lay = layout(self.shape, self.mesh, self.mesh_axes)
    indices, rids = lay.indices, lay.replica_ids
    return [local.get(d) or Shard(d, idx, rid, None)
            for d, idx, rid in zip(self.mesh.devices.flat, indices, rids, strict=True)]

  def local_data(self, i: int) -> jax.Array:
    """Return the data of local shard `i` as a single-device `jax.Array`.

    `i` follows Python indexing (`-1` is the last local shard); out of range
    it is an `IndexError` naming `i` and the number of local shards.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8)[index])
      >>> gda.local_data(0), gda.local_data(-1)
      (Array([0], dtype=int32), Array([7], dtype=int32))
    """
    return local_shard_data(self.local_shards, i, "local_data")

  def addressable_data(self, index: int) -> Any:  # a single-device `jax.Array`
    """Return `local_data(index)` (`jax.Array`'s name for it).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8)[index])
      >>> gda.addressable_data(2)
      Array([2], dtype=int32)
    """
    return local_shard_data(self.local_shards, index, "addressable_data")

  @property
  def _device_buffers(self) -> list[jax.Array]:
    """The GDA-era attribute: the local shards' data, in `mesh.local_devices` order."""
    return [cast(jax.Array, s.data) for s in self.local_shards]
