"""GlobalDeviceArray and `jax_sharding_ext.multihost_utils` under real
multi-process JAX (`jax.distributed` on 127.0.0.1, CPU collectives).

The checks run in worker processes (`_multiprocess_worker.py`,
`_multihost_worker.py`); these tests start them through `_multihost.py`,
which enforces a hard timeout, always kills them, and reports which worker
failed first with every worker's output.
"""

import asyncio
import re
import signal
import socket
from pathlib import Path

import pytest
from _multihost import run_workers
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import serialization

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).parent
GDA_WORKER = HERE / "_multiprocess_worker.py"
UTILS_WORKER = HERE / "_multihost_worker.py"
CHECKPOINT_WORKER = HERE / "_checkpoint_worker.py"
SPLITS = [pytest.param(2, 4, id="2x4"), pytest.param(4, 2, id="4x2")]  # N, local devices


def _check(run):
  if not run.ok:
    pytest.fail(run.report(), pytrace=False)


def test_gda_multiprocess():
  _check(run_workers(GDA_WORKER, 2, 4))


@pytest.mark.parametrize("num_processes, local_devices", SPLITS)
def test_multihost_utils(num_processes, local_devices):
  run = run_workers(UTILS_WORKER, num_processes, local_devices)
  _check(run)
  for i in range(num_processes):
    assert f"[worker {i}] data loading ok" in run.stdout(i), run.report()
  # Ordered prints: every printed line once, in program order, per process.
  printed = [[int(k) for k in re.findall(r"^ORDERED (\d+) ", run.stdout(i), re.M)]
             for i in range(num_processes)]
  assert all(p == sorted(p) and len(set(p)) == len(p) for p in printed), printed
  assert sorted(k for p in printed for k in p) == list(range(6)), printed
  sums = re.findall(r"^ORDERED (\d+) (\S+)$", "".join(run.stdout(i) for i in range(num_processes)),
                    re.M)
  assert {int(k): float(s) for k, s in sums} == {k: 120.0 + 16 * k for k in range(6)}, sums


def test_dead_worker_fails_the_others_and_is_named():
  """Worker 2 of 4 exits before a collective: the other three must fail on
  their own, well within the timeout, and the report must name worker 2."""
  run = run_workers(UTILS_WORKER, 4, 2, args=("die", 2), timeout=90,
                    stop_on_failure=False, heartbeat_s=4)
  assert not run.timed_out, run.report()
  assert run.first_failed == 2 and run.returncodes[2] == 3, run.report()
  assert all(rc != 0 for rc in run.returncodes), run.report()
  assert run.summary().startswith("worker 2 of 4 failed first"), run.summary()
  for i in (0, 1, 3):
    err = run.outputs[i][1]
    assert "collectives returned" not in err, run.report()
    assert "JAX distributed service detected fatal errors" in err or "unhealthy" in err, (
        run.report())
  assert run.elapsed < 60, run.report()


def test_port_clash_is_retried():
  """The coordinator's port is taken: the workers say so and the run is
  retried on a fresh port."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    run = run_workers(UTILS_WORKER, 2, 4, args=("sync",), port=taken, timeout=60)
  _check(run)
  assert run.ports[0] == taken and len(run.ports) == 2 and run.ports[1] != taken, run.ports


def test_port_clash_on_every_try_is_reported():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    run = run_workers(UTILS_WORKER, 2, 4, args=("sync",), port=taken, attempts=1, timeout=60)
  assert not run.ok and run.port_clash and run.ports == [taken], run.report()
  assert run.summary().startswith(f"the coordinator's port {taken} was in use"), run.report()


def test_sharded_checkpoints_two_processes(tmp_path):
  """Two processes write one 8-device GDA into one directory (each its own
  shards), restore it with other mesh axes, and commit through the manager."""
  run = run_workers(UTILS_WORKER, 2, 4, args=("ckpt", tmp_path))
  _check(run)
  assert all("checkpoints ok" in run.stdout(i) for i in range(2)), run.report()
  assert (tmp_path / "final" / "w" / ".zarray").exists() and not (tmp_path / "tmp").exists()


def test_a_save_killed_midway_is_refused_through_every_spelling(tmp_path, mesh_2d):
  """Worker 2 of 4 is killed in the middle of a `GlobalAsyncCheckpointManager`
  save to a URL kvstore spec: the others never commit, and a restore in one
  process refuses the checkpoint through every spelling of its location
  (instead of giving worker 2's quarter as zeros); with the marker gone, the
  chunk records still refuse it."""
  run = run_workers(CHECKPOINT_WORKER, 4, 2, args=(tmp_path, 2), timeout=150,
                    stop_on_failure=False, heartbeat_s=4)
  assert not run.timed_out, run.report()
  assert run.returncodes[2] == -signal.SIGKILL, run.report()
  assert all(rc != 0 for rc in run.returncodes), run.report()
  assert not any("COMMITTED" in run.stdout(i) for i in range(4)), run.report()
  a = tmp_path / "a"
  assert (a / serialization.COMMIT_MARKER).exists()
  assert [(a / f"{i}.0").exists() for i in range(4)] == [True, True, False, True]
  spellings = [
      {"driver": "zarr", "kvstore": f"file://{a}/"},
      {"driver": "zarr", "kvstore": f"file://{a}"},
      {"driver": "zarr", "kvstore": {"driver": "file", "path": str(a)}},
      {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{tmp_path}/"}, "path": "a"},
      serialization.get_tensorstore_spec(str(a)),
      {"driver": "cast", "dtype": "float32", "base": {"driver": "zarr",
                                                      "kvstore": f"file://{a}/"}},
  ]
  sharding = NamedSharding(mesh_2d, P("x"))
  for spec in spellings:
    with pytest.raises(ValueError, match="was never committed"):
      serialization.run_deserialization([sharding], [spec])
    with pytest.raises(ValueError, match="was never committed"):
      asyncio.run(serialization.async_deserialize(mesh_2d, P("x"), spec))
    with pytest.raises(ValueError, match="was never committed"):
      serialization.GlobalAsyncCheckpointManager().deserialize([sharding], [spec])
  (a / serialization.COMMIT_MARKER).unlink()
  with pytest.raises(ValueError, match=r"is damaged: its chunk records \[.*chunks\.2'\] are "
                                       "missing"):
    serialization.run_deserialization([sharding], [spellings[0]])
