"""`jax_sharding_ext.global_device_array` stands in for the whole GDA-era
module `jax.experimental.global_device_array` (JAX 0.3.17 to 0.4.1): GDA-era
code that imported it as `gda_lib` runs with that one import changed."""

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import global_device_array as gda_lib

# The module-level names of `jax/experimental/global_device_array.py` at JAX
# 0.4.1 that code outside JAX used.
OLD_NAMES = ["ArrayLike", "Device", "DeviceArray", "GlobalDeviceArray", "Index", "MeshAxes",
             "PartitionSpec", "Shape", "Shard", "get_shard_indices",
             "get_shard_indices_replica_ids", "get_shard_shape", "_hashed_index",
             "_get_indices", "_get_shard_indices_replica_ids_uncached"]


def test_every_old_name_is_there():
  missing = [n for n in OLD_NAMES if not hasattr(gda_lib, n)]
  assert missing == []
  assert gda_lib.MeshAxes is P and gda_lib.DeviceArray is jax.Array
  assert isinstance(jax.devices()[0], gda_lib.Device)


# --- GDA-era multi-host input pipelines planned their loading with the old
# module: one data source per distinct shard index (replicas share it, told
# apart with `gda_lib._hashed_index`), then a GDA from the loaded shards. A
# loader written that way against `gda_lib`:


def plan_sources(shape: gda_lib.Shape, mesh: Mesh, axes: gda_lib.MeshAxes
                 ) -> tuple[dict[gda_lib.Device, int], dict[int, gda_lib.Index]]:
  """Each device's source number, and each source's index (in first-seen order)."""
  source_of_hash: dict[int, int] = {}
  index_of_source: dict[int, gda_lib.Index] = {}
  device_source: dict[gda_lib.Device, int] = {}
  for device, index in gda_lib.get_shard_indices(shape, mesh, axes).items():
    n = source_of_hash.setdefault(gda_lib._hashed_index(index), len(source_of_hash))
    index_of_source.setdefault(n, index)
    device_source[device] = n
  return device_source, index_of_source


def load_batch(read: Any, shape: gda_lib.Shape, mesh: Mesh, axes: gda_lib.MeshAxes
               ) -> gda_lib.GlobalDeviceArray:
  device_source, index_of_source = plan_sources(shape, mesh, axes)
  loaded = {n: read(index_of_source[n]) for n in sorted(set(device_source.values()))}
  buffers = [jax.device_put(loaded[device_source[d]], d) for d in mesh.local_devices]
  return gda_lib.GlobalDeviceArray(shape, mesh, axes, buffers)


def test_a_loader_planned_with_the_old_module(mesh_2d):
  shape = (16, 4)
  device_source, index_of_source = plan_sources(shape, mesh_2d, P("x"))
  assert len(index_of_source) == 4  # 'x' has 4 positions; 'y' replicates
  for row in range(4):  # the devices of one mesh row share one source
    assert {device_source[d] for d in mesh_2d.devices[row]} == {row}
  assert [i[0].stop - i[0].start for i in index_of_source.values()] == [4] * 4
  data = np.arange(64, dtype=np.float32).reshape(shape)
  reads = []
  batch = load_batch(lambda i: reads.append(i) or data[i], shape, mesh_2d, P("x"))
  assert len(reads) == 4  # one read per distinct shard, not per device
  assert isinstance(batch, gda_lib.GlobalDeviceArray)
  np.testing.assert_array_equal(np.asarray(batch), data)
  assert [s.replica_id for s in batch.local_shards[:2]] == [0, 1]


def test_old_helpers_keep_their_meaning(mesh_2d):
  shape = (8, 2)
  indices = gda_lib._get_indices(shape, mesh_2d, P("x", "y"))
  by_device = gda_lib.get_shard_indices(shape, mesh_2d, P("x", "y"))
  assert list(indices) == [by_device[d] for d in mesh_2d.devices.flat]
  assert (gda_lib._get_shard_indices_replica_ids_uncached(shape, mesh_2d, P("x"))
          == gda_lib.get_shard_indices_replica_ids(shape, mesh_2d, P("x")))
  assert gda_lib.get_shard_shape(shape, mesh_2d, P("x", None)) == (2, 2)
  a, b = (slice(0, 2), slice(None)), (slice(0, 2), slice(None, None, None))
  assert gda_lib._hashed_index(a) == gda_lib._hashed_index(b)
  assert gda_lib._hashed_index(a) != gda_lib._hashed_index((slice(2, 4), slice(None)))
