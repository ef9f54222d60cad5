"""One process of `test_multihost_utils.py`'s cross-process `assert_equal`,
`process_allgather` and `broadcast_one_to_all` tests (started by
`_multihost.run_workers`; any number of processes).

Each scenario builds this process's tree (the last process, or each process,
differs where the scenario says), calls the helper, prints `SCENARIO <name>
<json>` with what happened (`ok`, or the exception's type and message), and
meets the others at a barrier. The runner checks every process's lines.
"""

from _worker_boot import boot, main_guard

W = boot()

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils as stock_mu  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jax_sharding_ext import GlobalDeviceArray as GDA  # noqa: E402
from jax_sharding_ext import multihost_utils as mu  # noqa: E402

PID, N = W.process_id, W.num_processes
LAST = PID == N - 1
F32 = np.float32


def deep_float():
  w = np.arange(4096, dtype=F32)
  if LAST:
    w[3000] = -1
  return {"weights": {"w": w, "b": np.zeros(3, F32)}}


def replicated(fill):
  mesh = Mesh(np.array(jax.devices()), ("g",))
  return GDA.from_callback((2, 3), mesh, P(), lambda i: np.full((2, 3), fill, F32)[i])


def sharded():
  mesh = Mesh(np.array(jax.devices()), ("g",))
  data = np.arange(2 * len(jax.devices()), dtype=F32)
  return GDA.from_callback(data.shape, mesh, P("g"), lambda i: data[i])


SCENARIOS = {
    # assert_equal
    "equal": lambda: mu.assert_equal(
        {"a": np.arange(6).reshape(2, 3), "b": [np.float32(1.5), True, None],
         "c": (jax.numpy.ones(4), replicated(2.0)), "d": np.zeros((0, 3)), "e": 7},
        "equal trees"),
    "deep_float": lambda: mu.assert_equal(deep_float(), "weights differ"),
    "int": lambda: mu.assert_equal(
        {"table": np.arange(12, dtype=np.int32).reshape(3, 4) + (LAST and
                                                                  np.eye(3, 4, 2, dtype=np.int32))},
        "tables differ"),
    "bool": lambda: mu.assert_equal({"mask": np.array([True, False, not LAST])}, "masks differ"),
    "scalar": lambda: mu.assert_equal({"step": np.int32(PID)}, "steps differ"),
    "python_scalar": lambda: mu.assert_equal({"lr": 0.1 if not LAST else 0.2}, "lrs differ"),
    "zero_d": lambda: mu.assert_equal(np.asarray(F32(PID == 0)), "flags differ"),
    "dtype": lambda: mu.assert_equal({"x": np.arange(4, dtype=np.int32 if LAST else F32)},
                                     "dtypes differ"),
    "shape": lambda: mu.assert_equal({"x": np.arange(5 if LAST else 4, dtype=F32)},
                                     "shapes differ"),
    "empty_shape": lambda: mu.assert_equal({"x": np.zeros((0, 4 if LAST else 3))}, "empties"),
    "extra_key": lambda: mu.assert_equal(
        {"a": np.ones(2), **({"b": np.ones(2)} if LAST else {})}, "keys differ"),
    "list_tuple": lambda: mu.assert_equal({"xs": (np.ones(2),) if LAST else [np.ones(2)]},
                                          "containers differ"),
    "none_leaf": lambda: mu.assert_equal({"opt": np.ones(2) if LAST else None}, "nones differ"),
    "gda": lambda: mu.assert_equal({"params": {"w": replicated(float(LAST))}}, "params differ"),
    "nan_everywhere": lambda: mu.assert_equal({"loss": np.array([np.nan, 1.0], F32)}, "nan"),
    "float64": lambda: mu.assert_equal({"t": np.float64(1.0 + (1e-12 if LAST else 0.0))},
                                       "times differ"),
    "not_array_on_one": lambda: mu.assert_equal({"name": "run" if LAST else np.ones(2)},
                                                "names"),
    "sharded_gda": lambda: mu.assert_equal({"w": sharded()}, "sharded"),
    "sharded_array": lambda: mu.assert_equal({"w": sharded().to_jax_array()}, "sharded"),
    "replicated_array": lambda: mu.assert_equal(
        {"w": replicated(float(LAST)).to_jax_array()}, "replicas"),
    # process_allgather and broadcast_one_to_all: layouts must agree
    "allgather_shape": lambda: mu.process_allgather({"batch": np.ones(3 if LAST else 4, F32)}),
    "allgather_structure": lambda: mu.process_allgather(
        {"a": np.ones(2, F32), **({"b": np.ones(2, F32)} if LAST else {})}),
    "allgather_ok": lambda: mu.process_allgather({"v": np.full(2, PID, np.int32)})["v"].tolist(),
    "broadcast_dtype": lambda: mu.broadcast_one_to_all({"seed": np.int32(1) if LAST else F32(1)}),
    "broadcast_ok": lambda: mu.broadcast_one_to_all({"seed": np.int32(10 + PID)})["seed"].tolist(),
    # the conversions: a mesh whose processes' devices are not blocks
    "interleaved_mesh": lambda: mu.host_local_array_to_global_array(
        {"x": np.ones(4, F32)}, interleaved(), P("x")),
}


def interleaved():
  devices = np.array(jax.devices()).reshape(N, -1)  # process-major
  return Mesh(devices.T.reshape(-1), ("x",))


def main():
  for name, fn in SCENARIOS.items():
    try:
      result = fn()
      record = {"outcome": "ok", "value": result if isinstance(result, list | int) else None}
    except Exception as e:  # the outcome under test
      record = {"outcome": "raise", "type": type(e).__name__, "message": str(e)}
    print(f"SCENARIO {name} {json.dumps(record)}", flush=True)
    stock_mu.sync_global_devices(f"scenario {name}")


main_guard(main)
