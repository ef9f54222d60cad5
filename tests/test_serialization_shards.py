"""What each restored shard holds, device by device.

A checkpoint restores as a `GlobalDeviceArray` whether it was written from a
GDA or from a plain `jax.Array`, and its shards carry what the GDA-era format
gave them: the block of each device with its index and replica id, zeros
where a larger `global_shape` reaches past the stored array, the requested
dtype, and JAX's 32-bit types for 64-bit host data (x64 off, as stock
`array_serialization` restores them). Any tensorstore spec restores, not only
a zarr directory the package wrote.
"""

import jax
import numpy as np
import pytest
import tensorstore as ts
from jax.experimental.array_serialization import serialization as stock
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization

WRITTEN_FROM = ["GlobalDeviceArray", "jax.Array"]


def _place(kind, mesh, axes, host):
  """`host` laid out on `mesh` by `axes`, as a GDA or as a plain `jax.Array`."""
  def block(index):
    return host[index]
  if kind == "GlobalDeviceArray":
    return GlobalDeviceArray.from_callback(host.shape, mesh, axes, block)
  return jax.make_array_from_callback(host.shape, NamedSharding(mesh, axes), block)


def _path(tmp_path, name):
  return serialization.get_tensorstore_spec(str(tmp_path / name))


def _shards(gda):
  """{device id: (index, replica id, data on the host)} of a restored GDA.

  Its GDA-era `local_shards` and its `jax.Array` `addressable_shards` must
  describe the same shards.
  """
  assert type(gda) is GlobalDeviceArray
  local = {s.device.id: (s.index, s.replica_id, np.asarray(s.data)) for s in gda.local_shards}
  assert sorted(local) == sorted(s.device.id for s in gda.addressable_shards)
  for s in gda.addressable_shards:
    index, replica, data = local[s.device.id]
    assert (s.index, s.replica_id) == (index, replica)
    np.testing.assert_array_equal(np.asarray(s.data), data)
  return dict(sorted(local.items()))


def _values(shards):
  return {device: data.tolist() for device, (_, _, data) in shards.items()}


def _blocks(shards):
  """The distinct (shape, dtype name) of the shards' data."""
  return {(data.shape, data.dtype.name) for _, _, data in shards.values()}


@pytest.mark.parametrize("kind", WRITTEN_FROM)
def test_three_arrays_saved_in_one_call_restore_shard_by_shard(mesh_2d, mesh_1d, tmp_path,
                                                               kind):
  low = np.arange(16).reshape(8, 2)  # int64 on the host
  high = np.arange(16, 32).reshape(8, 2)
  empty = np.array([])  # float64, no elements
  specs = [_path(tmp_path, name) for name in ("low", "high", "empty")]
  serialization.run_serialization(
      [_place(kind, mesh_2d, P("x", "y"), low), _place(kind, mesh_2d, P("x", "y"), high),
       _place(kind, mesh_1d, P(None), empty)], specs)

  tiled, by_rows, replicated = serialization.run_deserialization(
      [mesh_2d, mesh_2d, mesh_1d], [P("x", "y"), P("x"), P(None)], specs)

  # Tiled as written: device d of the 4x2 mesh holds rows 2*(d//2), 2*(d//2)+1
  # of column d%2, one copy of each block.
  assert (tiled.shape, tiled.dtype) == ((8, 2), np.int32)
  shards = _shards(tiled)
  assert _values(shards) == {0: [[0], [2]], 1: [[1], [3]], 2: [[4], [6]], 3: [[5], [7]],
                             4: [[8], [10]], 5: [[9], [11]], 6: [[12], [14]], 7: [[13], [15]]}
  assert _blocks(shards) == {((2, 1), "int32")}
  assert {replica for _, replica, _ in shards.values()} == {0}

  # Split over rows only: both devices of a mesh row hold the same whole-width
  # block, as replicas 0 and 1.
  assert (by_rows.shape, by_rows.dtype) == ((8, 2), np.int32)
  shards = _shards(by_rows)
  assert _values(shards)[0] == _values(shards)[1] == [[16, 17], [18, 19]]
  assert [shards[d][1] for d in (0, 1)] == [0, 1]
  assert _blocks(shards) == {((2, 2), "int32")}

  # No elements, replicated: every device has the whole (empty) array.
  assert (replicated.shape, replicated.dtype) == ((0,), np.float32)
  shards = _shards(replicated)
  assert [(index, replica) for index, replica, _ in shards.values()] == [
      ((slice(None),), i) for i in range(8)]
  assert _blocks(shards) == {((0,), "float32")}


# Stored from a 2x2 mesh as (8, 2) int32 (arange), restored as (12, 2) float32
# tiled over the 4x2 mesh: each device holds three rows of one column; rows 8
# to 11 lie past the stored array and read as zeros.
PADDED_SHARDS = {
    0: [[0], [2], [4]], 1: [[1], [3], [5]],
    2: [[6], [8], [10]], 3: [[7], [9], [11]],
    4: [[12], [14], [0]], 5: [[13], [15], [0]],
    6: [[0], [0], [0]], 7: [[0], [0], [0]],
}


@pytest.mark.parametrize("kind", WRITTEN_FROM)
def test_a_larger_global_shape_on_a_larger_mesh_pads_each_shard_with_zeros(
    mesh_factory, mesh_2d, tmp_path, kind):
  host = np.arange(16, dtype=np.int32).reshape(8, 2)
  small_mesh = mesh_factory((2, 2), ("x", "y"))
  serialization.run_serialization([_place(kind, small_mesh, P("x", "y"), host)],
                                  [_path(tmp_path, "w")])

  out, = serialization.run_deserialization([mesh_2d], [P("x", "y")], [_path(tmp_path, "w")],
                                           [(12, 2)], [np.float32])

  assert (out.shape, out.dtype) == ((12, 2), np.float32)
  shards = _shards(out)
  assert _values(shards) == PADDED_SHARDS
  assert _blocks(shards) == {((3, 1), "float32")}


@pytest.mark.parametrize("axes", [P(), P(None)], ids=["P()", "P(None)"])
@pytest.mark.parametrize("kind", WRITTEN_FROM)
def test_a_scalar_restores_on_every_device_in_the_dtype_asked_for(mesh_factory, tmp_path, kind,
                                                                  axes):
  mesh = mesh_factory((2,), ("x",))
  serialization.run_serialization([_place(kind, mesh, axes, np.array(4))],
                                  [_path(tmp_path, "s")])

  as_stored, cast = serialization.run_deserialization(
      [mesh, mesh], [axes, axes], [_path(tmp_path, "s"), _path(tmp_path, "s")],
      [None, ()], [None, np.float32])

  for out, dtype in ((as_stored, np.int32), (cast, np.float32)):
    assert (out.shape, out.dtype) == ((), dtype)
    shards = _shards(out)
    assert [(device, index, replica) for device, (index, replica, _) in shards.items()] == [
        (0, (), 0), (1, (), 1)]
    for _, _, data in shards.values():
      assert (data.shape, data.dtype, data.item()) == ((), dtype, 4)


@pytest.mark.parametrize("axes, blocks", [
    (P(None), [slice(None), slice(None)]),
    (P("x"), [slice(0, 512), slice(512, 1024)]),
], ids=["replicated", "split"])
def test_an_in_memory_tensorstore_array_restores(mesh_factory, axes, blocks):
  """Not a zarr directory: tensorstore's `array` driver, with no kvstore and no
  commit marker to look for. The int64 values arrive as int32, as stock
  `array_serialization` restores them."""
  mesh = mesh_factory((2,), ("x",))
  host = np.arange(1024)
  out, = serialization.run_deserialization([mesh], [axes], [ts.array(host).spec()])
  theirs, = stock.run_deserialization([NamedSharding(mesh, axes)], [ts.array(host).spec()])
  assert (out.shape, out.dtype) == ((1024,), theirs.dtype) == ((1024,), np.int32)
  shards = _shards(out)
  assert [index for index, _, _ in shards.values()] == [(b,) for b in blocks]
  for (_, _, data), block in zip(shards.values(), blocks, strict=True):
    assert data.dtype == np.int32
    np.testing.assert_array_equal(data, host[block])
