"""One process of `test_multiprocess.py` (started by `_multihost.run_workers`).

With 4 virtual CPU devices per process (see `_worker_boot.boot`), checks `GlobalDeviceArray` over a
mesh of all 8 global devices. Prints `WORKER OK` at the end; any failed check
raises (non-zero exit).
"""

from _worker_boot import boot, main_guard

W = boot()
process_id, num_processes, LOCAL_DEVICES = W.process_id, W.num_processes, W.local_devices

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sharding_ext  # noqa: E402
from jax_sharding_ext import GlobalDeviceArray  # noqa: E402


def log(msg):
  print(f"[worker {process_id}] {msg}", flush=True)


def expected_layout(mesh, spec_kind):
  """{device: (index, replica_id)} for global shape (8, 2) on the 4x2 mesh."""
  out = {}
  for (i, j), d in np.ndenumerate(mesh.devices):
    rows = slice(2 * i, 2 * i + 2)
    if spec_kind == "xy":
      out[d] = ((rows, slice(j, j + 1)), 0)
    else:  # P('x'): replicated over 'y'
      out[d] = ((rows, slice(None)), j)
  return out


def check_shards(gda, mesh, spec_kind, global_data, scale=1):
  layout = expected_layout(mesh, spec_kind)
  local_devs = [d for d in mesh.devices.flat if d.process_index == process_id]
  assert local_devs == list(mesh.local_devices), (local_devs, mesh.local_devices)

  local = gda.local_shards
  assert [s.device for s in local] == local_devs, [s.device for s in local]
  for s in local:
    idx, rid = layout[s.device]
    assert s.index == idx, (s.device, s.index, idx)
    assert s.replica_id == rid, (s.device, s.replica_id, rid)
    assert s.data is not None
    assert s.data.devices() == {s.device}
    np.testing.assert_array_equal(np.asarray(s.data), global_data[idx] * scale)
  assert [s.device for s in gda.addressable_shards] == local_devs

  shards = gda.global_shards
  assert [s.device for s in shards] == list(mesh.devices.flat)
  assert len(shards) == 8
  for s in shards:
    idx, rid = layout[s.device]
    assert s.index == idx, (s.device, s.index, idx)
    assert s.replica_id == rid, (s.device, s.replica_id, rid)
    if s.device.process_index == process_id:
      assert s.data is not None, s
      np.testing.assert_array_equal(np.asarray(s.data), global_data[idx] * scale)
    else:
      assert s.data is None, s
  assert sum(s.data is None for s in shards) == 4


def main():
  assert jax.process_count() == num_processes, jax.process_count()
  assert jax.process_index() == process_id, jax.process_index()
  assert jax.device_count() == LOCAL_DEVICES * num_processes, jax.devices()
  assert jax.local_device_count() == LOCAL_DEVICES, jax.local_devices()

  devices = jax.devices()
  mesh = Mesh(np.array(devices).reshape(4, 2), ("x", "y"))
  assert mesh.devices.size == 8
  assert {d.process_index for d in mesh.devices.flat} == set(range(num_processes))
  assert len(mesh.local_devices) == LOCAL_DEVICES
  log(f"mesh {mesh.devices.tolist()}")

  global_data = np.arange(16, dtype=np.int32).reshape(8, 2)

  for spec_kind, spec in (("xy", P("x", "y")), ("x", P("x"))):
    layout = expected_layout(mesh, spec_kind)
    calls = []

    def cb(index, calls=calls):
      calls.append(index)
      return global_data[index]

    gda = GlobalDeviceArray.from_callback((8, 2), mesh, spec, cb)
    # The callback runs once per *local* device only, with that device's index.
    assert len(calls) == LOCAL_DEVICES, calls
    assert calls == [layout[d][0] for d in mesh.local_devices], calls

    assert gda.shape == (8, 2) and gda.dtype == np.int32
    assert isinstance(gda.sharding, NamedSharding)
    assert gda.is_fully_addressable is False
    assert gda.is_fully_replicated is False
    check_shards(gda, mesh, spec_kind, global_data)

    try:
      np.asarray(gda)
    except RuntimeError as e:
      assert "process_allgather" in str(e), str(e)
    else:
      raise AssertionError("np.asarray on a multi-process GDA did not raise")

    out = jax.jit(lambda x: x * 2)(gda)
    assert isinstance(out, jax.Array) and not isinstance(out, GlobalDeviceArray), type(out)
    assert out.sharding.is_equivalent_to(gda.sharding, 2), out.sharding
    for s in out.addressable_shards:
      idx, _ = layout[s.device]
      np.testing.assert_array_equal(np.asarray(s.data), global_data[idx] * 2)

    with jax_sharding_ext.parallel_functions_output_gda(True):
      out_gda = jax.jit(lambda x: x * 2)(gda)
    assert isinstance(out_gda, GlobalDeviceArray), type(out_gda)
    assert out_gda.is_fully_addressable is False
    check_shards(out_gda, mesh, spec_kind, global_data, scale=2)

    gathered = multihost_utils.process_allgather(gda.to_jax_array(), tiled=True)
    np.testing.assert_array_equal(np.asarray(gathered), global_data)
    gathered2 = multihost_utils.process_allgather(out_gda.to_jax_array(), tiled=True)
    np.testing.assert_array_equal(np.asarray(gathered2), global_data * 2)
    log(f"spec {spec} ok")

  # Keep both processes alive until both have finished their checks.
  multihost_utils.sync_global_devices("jse_multiprocess_done")


if __name__ == "__main__":
  main_guard(main)
