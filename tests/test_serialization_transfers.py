"""Checkpoint saves and restores move every byte between device and host, and
the transfer ledger sees them: one record per array, device_to_host for a
save (this process's shards of replica 0), host_to_device for a restore
(every shard placed), explicit, with the user's line as the site. The
transfer guard judges them exactly as it judges stock `array_serialization`
(and orbax) moving the same `jax.Array`; a blocked one records nothing.
"""

import asyncio
import inspect
import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, orbax_support, serialization

HERE = os.path.relpath(__file__)  # sites read relative to the working directory
LEVELS = ["allow", "log", "disallow", "log_explicit", "disallow_explicit"]


def _line():
  """The line after the caller's."""
  return inspect.currentframe().f_back.f_lineno + 1


def _gda(mesh, spec):
  data = np.arange(32, dtype=np.float32).reshape(8, 4)
  return GlobalDeviceArray.from_callback((8, 4), mesh, spec, lambda i: data[i]), data


def _spec(path):
  return serialization.get_tensorstore_spec(str(path))


def _check(records, direction, nbytes, devices, site):
  assert len(records) == 1, records
  r = records[0]
  assert (r.direction, r.explicit, r.nbytes, r.shape, r.dtype) == (
      direction, True, nbytes, (8, 4), np.dtype(np.float32))
  assert (r.src, r.dst) == ((devices, ()) if direction == "device_to_host" else ((), devices))
  assert r.site == f"{HERE}:{site}"


@pytest.mark.parametrize("how", ["run_serialization", "async_serialize", "manager.serialize"])
def test_a_save_is_recorded_device_to_host(mesh_2d, tmp_path, how):
  """P('x') is replicated over 'y': the save moves replica 0 of each row
  block (4 shards, 128 bytes) from the devices that hold it."""
  gda, _ = _gda(mesh_2d, P("x"))
  replica0 = tuple(mesh_2d.devices[:, 0])
  manager = serialization.GlobalAsyncCheckpointManager()
  with jse.transfer_ledger() as ledger:
    if how == "run_serialization":
      site = _line()
      serialization.run_serialization([gda], [_spec(tmp_path / "w")])
    elif how == "async_serialize":
      site = _line()
      asyncio.run(serialization.async_serialize(gda, _spec(tmp_path / "w")))
    else:
      site = _line()
      manager.serialize([gda], [_spec(tmp_path / "w")], on_commit_callback=lambda: None)
  manager.wait_until_finished()
  _check(ledger.records, "device_to_host", 128, replica0, site)


@pytest.mark.parametrize("how", ["run_deserialization", "async_deserialize",
                                 "manager.deserialize"])
def test_a_restore_is_recorded_host_to_device(mesh_2d, tmp_path, how):
  """Restored with P('x') on the 4x2 mesh, every one of the 8 shards (each
  replica) is placed: 256 bytes."""
  gda, data = _gda(mesh_2d, P("x", "y"))
  serialization.run_serialization([gda], [_spec(tmp_path / "w")])
  with jse.transfer_ledger() as ledger:
    if how == "run_deserialization":
      site = _line()
      out, = serialization.run_deserialization([mesh_2d], [P("x")], [_spec(tmp_path / "w")])
    elif how == "async_deserialize":
      site = _line()
      out = asyncio.run(serialization.async_deserialize(mesh_2d, P("x"), _spec(tmp_path / "w")))
    else:
      site = _line()
      out, = serialization.GlobalAsyncCheckpointManager().deserialize(
          [NamedSharding(mesh_2d, P("x"))], [_spec(tmp_path / "w")])
  _check(ledger.records, "host_to_device", 256, tuple(mesh_2d.devices.flat), site)
  np.testing.assert_array_equal(np.asarray(out), data)


def test_orbax_saves_and_restores_of_gda_leaves_are_recorded(mesh_2d, tmp_path):
  """Through `orbax_support`'s handler: one record per GDA leaf (a plain
  `jax.Array` leaf is not this package's array and is not recorded), the
  site being the user's line, not orbax's."""
  gda, data = _gda(mesh_2d, P("x", "y"))
  other = jax.device_put(np.ones(4, np.float32), NamedSharding(mesh_2d, P()))
  ckptr = ocp.PyTreeCheckpointer()
  with jse.transfer_ledger() as saved:
    site = _line()
    ckptr.save(tmp_path / "c", {"w": gda, "b": other})
  _check(saved.records, "device_to_host", 128, tuple(mesh_2d.devices.flat), site)
  args = {"w": orbax_support.gda_restore_args(mesh_2d, P("x", "y")),
          "b": ocp.ArrayRestoreArgs(sharding=other.sharding)}
  with jse.transfer_ledger() as restored:
    site = _line()
    out = ckptr.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(restore_args=args))
  assert type(out["w"]) is GlobalDeviceArray
  _check(restored.records, "host_to_device", 128, tuple(mesh_2d.devices.flat), site)
  np.testing.assert_array_equal(np.asarray(out["w"]), data)


_GUARD_CHILD = r"""
import asyncio, json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np, orbax.checkpoint as ocp
from jax.experimental.array_serialization import serialization as stock
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, orbax_support, serialization

root = sys.argv[1]
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
data = np.arange(32, dtype=np.float32).reshape(8, 4)
gda = GlobalDeviceArray.from_callback((8, 4), mesh, P("x", "y"), lambda i: data[i])
arr, sharding = gda.to_jax_array(), NamedSharding(mesh, P("x", "y"))
spec = lambda name: serialization.get_tensorstore_spec(f"{root}/{name}")
serialization.run_serialization([gda], [spec("base")])
ocp.PyTreeCheckpointer().save(f"{root}/obase", {"w": gda})
n = iter(range(1000))

def stock_save():  # stock's run_serialization, its refused writes let finish
  async def go():
    try:
      await stock.async_serialize(arr, spec(f"s{next(n)}"))
    finally:
      await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}),
                           return_exceptions=True)
  asyncio.run(go())

restore_args = lambda a: ocp.args.PyTreeRestore(restore_args={"w": a})
pairs = {
    "save": (stock_save,
             lambda: serialization.run_serialization([gda], [spec(f"g{next(n)}")])),
    "restore": (lambda: stock.run_deserialization([sharding], [spec("base")]),
                lambda: serialization.run_deserialization([sharding], [spec("base")])),
    "orbax save": (lambda: ocp.PyTreeCheckpointer().save(f"{root}/o{next(n)}", {"w": arr}),
                   lambda: ocp.PyTreeCheckpointer().save(f"{root}/o{next(n)}", {"w": gda})),
    "orbax restore": (
        lambda: ocp.PyTreeCheckpointer().restore(
            f"{root}/obase", args=restore_args(ocp.ArrayRestoreArgs(sharding=sharding))),
        lambda: ocp.PyTreeCheckpointer().restore(
            f"{root}/obase", args=restore_args(orbax_support.gda_restore_args(mesh, P("x", "y"))))),
}

def outcome(fn):
  try:
    fn()
  except jax.errors.JaxRuntimeError as e:
    return ["raises", str(e).split(":")[0]]
  return ["allowed", None]

out = {}
for level in %(levels)r:
  for what, (theirs, ours) in pairs.items():
    with jax.transfer_guard(level):
      want = outcome(theirs)
      with jse.transfer_ledger() as ledger:
        got = outcome(ours)
    out[f"{level} {what}"] = [want, got, len(ledger.records)]
print("RESULT " + json.dumps(out))
"""


def test_the_guard_judges_a_checkpoint_as_stocks_of_the_same_jax_array(tmp_path):
  """Under every guard level, a GDA's save and restore (serialization and
  orbax) are allowed or refused exactly as stock's of the same `jax.Array`,
  with jaxlib's error; a refused one records nothing, an allowed one one
  record. (On CPU, JAX 0.10.2's stock save copies each shard to pinned host
  memory with `jax.device_put`, an explicit transfer refused only by
  "disallow_explicit"; JAX 0.12's fetches it, which the CPU rule always
  allows; every restore places each shard with `jax.device_put`, explicit.)
  In a subprocess: when the guard refuses one shard, stock's and orbax's own
  event loops close under their other shards' tasks (for a plain `jax.Array`
  too), which Python reports as unraisable errors at some later moment."""
  code = _GUARD_CHILD % {"levels": LEVELS}
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, timeout=300, env=env)
  lines = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
  assert res.returncode == 0 and lines, res.stderr[-4000:]
  results = json.loads(lines[0][len("RESULT "):])
  assert len(results) == 4 * len(LEVELS)
  for case, (want, got, records) in results.items():
    assert got == want, case
    assert records == (0 if got[0] == "raises" else 1), (case, records)
  raised = {case for case, (want, _, _) in results.items() if want[0] == "raises"}
  assert raised and all(c.startswith("disallow_explicit") for c in raised), raised


def _save_async(gda, spec):
  async def go():
    futures = []
    await serialization.async_serialize(gda, spec, futures)
    for f in futures:
      f.result()
  asyncio.run(go())


def _save_manager(gda, spec):
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([gda], [spec], on_commit_callback=lambda: None)
  manager.wait_until_finished()


@pytest.mark.parametrize("save", [
    lambda gda, spec: serialization.run_serialization([gda], [spec]), _save_async,
    _save_manager], ids=["run_serialization", "async_serialize", "manager.serialize"])
@pytest.mark.parametrize("level", ["disallow", "disallow_explicit"])
def test_a_save_the_guard_refuses_leaves_the_stored_checkpoint_intact(mesh_2d, tmp_path, save,
                                                                      level):
  """Where the guard refuses stock's copies of the shards to the host (JAX
  0.10.2 on CPU under "disallow_explicit"), the save raises jaxlib's error
  before it writes anything, so the checkpoint stored at that path restores
  as before; stock would have raised at its first shard with others written.
  Where the guard allows the copies, the new values are stored."""
  old, old_data = _gda(mesh_2d, P("x", "y"))
  save(old, _spec(tmp_path / "w"))
  new_data = old_data * 2 + 1
  new = GlobalDeviceArray.from_callback((8, 4), mesh_2d, P("x", "y"), lambda i: new_data[i])
  try:
    with jax.transfer_guard(level):
      save(new, _spec(tmp_path / "w"))
  except jax.errors.JaxRuntimeError as e:
    assert str(e).startswith("INVALID_ARGUMENT: Disallowed"), e
    assert "refused this before writing anything" in str(e)
    want = old_data
  else:
    want = new_data
  got, = serialization.run_deserialization([mesh_2d], [P("x", "y")], [_spec(tmp_path / "w")])
  np.testing.assert_array_equal(np.asarray(got), want)
