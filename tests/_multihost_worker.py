"""One process of `test_multiprocess.py::test_multihost_utils` (started by
`_multihost.run_workers`): the GDA-era multi-host workflow through
`jax_sharding_ext.multihost_utils` on a 4x2 ('x', 'y') mesh of 8 global
devices, whatever the split (N=2 with 4 devices each, N=4 with 2 each).

'x' runs across processes and 'y' within one, so with N processes each
process owns `4 // N` rows of the mesh. Extra arguments pick a smaller
scenario: `sync` (one `sync_global_devices`), `die K` (process K exits before
a collective the others enter), `ckpt DIR` (sharded checkpoints in DIR),
`assert_equal` (`assert_equal` on GDAs replicated over every process). Prints
`ORDERED <k> <sum>` lines from ordered `jax.debug.print` for the runner to
check, and `WORKER OK` at the end.
"""

from _worker_boot import boot, main_guard

W = boot()

import functools  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils as stock_mu  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sharding_ext  # noqa: E402
from jax_sharding_ext import GlobalDeviceArray as GDA  # noqa: E402
from jax_sharding_ext import multihost_utils as mu  # noqa: E402

PID, N, L = W.process_id, W.num_processes, W.local_devices
F32 = np.float32


def raises(exc_type, fn, *args, **kwargs) -> str:
  try:
    fn(*args, **kwargs)
  except exc_type as e:
    return str(e)
  raise AssertionError(f"{fn.__name__} did not raise {exc_type.__name__}")


def is_plain_array(x) -> bool:
  return isinstance(x, jax.Array) and not isinstance(x, GDA)


def local_leaves(p):
  """Process p's host-local inputs (every process can rebuild any p's)."""
  rows = 2 * (4 // N)
  a = np.arange(rows * 3, dtype=F32).reshape(rows, 3) + 100 * p
  b = np.arange(rows * 4, dtype=F32).reshape(rows, 4) + 1000 * p
  d = np.arange(2 * L, dtype=F32) + 10 * p
  return a, b, d


def check_round_trip(mesh):
  """host-local -> global -> jit -> host-local on a pytree of all three kinds."""
  local_mesh = mesh.local_mesh
  a, b, d = local_leaves(PID)
  const = np.arange(6, dtype=F32).reshape(3, 2)
  tree = {
      "a": a,  # numpy
      "b": jax.device_put(b, NamedSharding(local_mesh, P("x", "y"))),  # jax.Array
      "cd": (GDA.from_callback((3, 2), local_mesh, P(None), lambda i: const[i]),
             GDA.from_callback(d.shape, local_mesh, P(("x", "y")), lambda i: d[i])),
  }
  pspecs = {"a": P("x"), "b": P("x", "y"), "cd": (P(None), P(("x", "y")))}

  g = mu.host_local_array_to_global_array(tree, mesh, pspecs)
  assert is_plain_array(g["a"]) and is_plain_array(g["b"]), (type(g["a"]), type(g["b"]))
  assert all(isinstance(x, GDA) for x in g["cd"]), [type(x) for x in g["cd"]]
  assert g["cd"][1].mesh == mesh and g["cd"][1].mesh_axes == P(("x", "y"))
  assert not any(x.is_fully_addressable for x in jax.tree.leaves(g))
  every = [local_leaves(p) for p in range(N)]
  want = {"a": np.concatenate([e[0] for e in every]),
          "b": np.concatenate([e[1] for e in every]),
          "cd": (const, np.concatenate([e[2] for e in every]))}
  got = mu.process_allgather(g, tiled=True)  # tiled: the plain global jax.Arrays need it
  jax.tree.map(np.testing.assert_array_equal, got, want)

  out = jax.jit(lambda t: jax.tree.map(lambda x: x * 2 + 1, t))(g)
  back = {"a": out["a"], "b": out["b"],
          "cd": tuple(GDA.from_jax_array(x) for x in out["cd"])}
  host = mu.global_array_to_host_local_array(back, mesh, pspecs)
  assert is_plain_array(host["a"]) and is_plain_array(host["b"])
  assert all(isinstance(x, GDA) and x.is_fully_addressable for x in host["cd"])
  assert host["cd"][1].mesh == local_mesh
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), y * 2 + 1),
               host, {"a": a, "b": b, "cd": (const, d)})

  # One spec for a whole batch dict; a tuple of specs with `None` subtrees
  # (`None` means replicated, as in GDA-era pjit).
  g = mu.host_local_array_to_global_array({"x": a, "y": a[:, 0]}, mesh, P("x"))
  assert g["x"].shape == (a.shape[0] * N, 3) and g["y"].shape == (a.shape[0] * N,)
  g = mu.host_local_array_to_global_array((a, None, {"w": const}), mesh,
                                          (P("x"), None, None))
  assert g[1] is None and g[2]["w"].shape == const.shape
  assert g[2]["w"].sharding.is_fully_replicated
  np.testing.assert_array_equal(mu.process_allgather(g[2]["w"], tiled=True), const)

  # A `None` spec (replicated) for a global GDA that spans processes, onto a
  # mesh of this process's devices: JAX cannot reshard it, and stock refuses
  # `None` for the same `jax.Array` with a `ValueError` naming `pspecs`; so
  # does the package (not the `NotImplementedError` of the reshard).
  spans = back["cd"][1]
  local_only = Mesh(np.array(jax.local_devices()), ("x",))
  stock_msg = raises(ValueError, stock_mu.global_array_to_host_local_array,
                     {"w": spans.to_jax_array()}, local_only, None)
  assert "pspecs" in stock_msg, stock_msg
  for pspecs in (None, {"w": None}):
    msg = raises(ValueError, mu.global_array_to_host_local_array, {"w": spans}, local_only,
                 pspecs)
    assert "`None` is not a valid input to the pspecs argument" in msg, msg
  # The same for a replicated scalar spanning processes, where JAX refuses the
  # reshard as one needing cross-host transfers (a ValueError of its own).
  scalar = GDA.from_jax_array(jax.device_put(np.complex64(1 + 2j), NamedSharding(mesh, P())))
  assert "pspecs" in raises(ValueError, stock_mu.global_array_to_host_local_array,
                            (scalar.to_jax_array(),), local_only, None)
  msg = raises(ValueError, mu.global_array_to_host_local_array, (scalar,), local_only, None)
  assert "`None` is not a valid input to the pspecs argument" in msg, msg

  # A numpy leaf is the global value: each process gets its part of it, also
  # where the local mesh is smaller than the global one (stock slices it by
  # the global shape over the local mesh and fails inside XLA).
  whole = np.arange(8 * 3, dtype=F32).reshape(8, 3)
  part = mu.global_array_to_host_local_array({"w": whole}, mesh, {"w": P("x")})["w"]
  assert is_plain_array(part) and part.shape == (8 // N, 3), (type(part), part.shape)
  rows = 8 // N
  np.testing.assert_array_equal(np.asarray(part), whole[PID * rows:(PID + 1) * rows])

  # A local batch that cannot be globalised: a clear error naming the leaf.
  msg = raises(ValueError, mu.host_local_array_to_global_array,
               {"tokens": np.zeros((2 * L - 1, 3), F32)}, mesh, P(("x", "y")))
  assert "['tokens']" in msg and "divide evenly" in msg, msg
  W.log("round trip ok")
  return g, back["cd"]


def check_collectives(mesh, global_gdas):
  replicated, sharded = global_gdas  # spanning every process
  d_global = np.concatenate([local_leaves(p)[2] for p in range(N)]) * 2 + 1

  # process_allgather: a GDA is its global value, tiled or not.
  for tiled in (False, True):
    np.testing.assert_array_equal(mu.process_allgather(sharded, tiled=tiled), d_global)
  h = np.array([PID, PID + 1])
  stacked = mu.process_allgather({"g": sharded, "h": h})
  np.testing.assert_array_equal(stacked["g"], d_global)
  np.testing.assert_array_equal(stacked["h"], [[p, p + 1] for p in range(N)])
  tiled = mu.process_allgather({"g": sharded, "h": h}, tiled=True)
  np.testing.assert_array_equal(tiled["h"], np.concatenate([[p, p + 1] for p in range(N)]))
  counts = mu.process_allgather(jnp.array([3 * PID]), tiled=False)
  np.testing.assert_array_equal(counts, [[3 * p] for p in range(N)])
  # A plain global jax.Array is its global value too, tiled or not (as in JAX
  # 0.4.x; stock now raises for tiled=False), also next to its own GDA.
  plain = sharded.to_jax_array()
  for tiled in (False, True):
    np.testing.assert_array_equal(mu.process_allgather(plain, tiled=tiled), d_global)
  both = mu.process_allgather({"gda": sharded, "view": plain})
  np.testing.assert_array_equal(both["gda"], d_global)
  np.testing.assert_array_equal(both["view"], d_global)
  assert raises(Exception, stock_mu.process_allgather, plain, tiled=False)

  # broadcast_one_to_all: numpy out; default source 0, or an explicit one.
  out = mu.broadcast_one_to_all({"seed": np.int32(7 * PID + 3), "v": np.arange(3) + PID})
  assert isinstance(out["seed"], np.ndarray) and int(out["seed"]) == 3, out
  np.testing.assert_array_equal(out["v"], np.arange(3))
  assert float(mu.broadcast_one_to_all(F32(PID), is_source=PID == N - 1)) == N - 1
  assert bool(mu.broadcast_one_to_all(jnp.array(PID == 0))) is True
  local = GDA.from_callback((2,), mesh.local_mesh, P(None), lambda i: np.full(2, PID, F32)[i])
  np.testing.assert_array_equal(mu.broadcast_one_to_all(local), [0, 0])
  msg = raises(ValueError, mu.broadcast_one_to_all, {"w": sharded})
  assert "already global" in msg and "process_allgather" in msg, msg

  # assert_equal: passes on equal values, raises with the message everywhere.
  start = mu.broadcast_one_to_all(np.int32(time.time()) + PID)
  mu.assert_equal(start, "start times differ")
  mu.assert_equal({"cfg": np.arange(4), "lr": F32(0.1), "w": replicated}, "configs differ")
  mu.assert_equal(local - local, "local GDAs differ")  # equal zeros everywhere
  msg = raises(AssertionError, mu.assert_equal, np.int32(PID), "step mismatch")
  assert msg.startswith("step mismatch"), msg
  msg = raises(AssertionError, mu.assert_equal, GDA.from_jax_array(local), "gda mismatch")
  assert msg.startswith("gda mismatch"), msg
  msg = raises(ValueError, mu.assert_equal, sharded)
  assert "process_allgather" in msg, msg

  t0 = time.monotonic()
  mu.sync_global_devices("jse collectives done")
  W.log(f"collectives ok (sync {time.monotonic() - t0:.2f} s)")


def host_batch(step, p, rows):
  rng = np.random.default_rng(1000 * step + p)
  return rng.normal(size=(rows, 4)).astype(F32), rng.normal(size=(rows,)).astype(F32)


def check_data_loading(mesh):
  """The GDA-era loop: per-host numpy batches, GDAs on the global mesh,
  3 donated steps, every process agreeing on the loss."""
  rows = 16 // N  # this process's share of the global batch of 16
  offset = PID * rows
  w0 = np.linspace(-1, 1, 4).astype(F32)

  @functools.partial(jax.jit, donate_argnums=0)
  def train_step(w, x, y):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * grad, loss

  with jax_sharding_ext.parallel_functions_output_gda(True):
    w = GDA.from_callback((4,), mesh, P(None), lambda i: w0[i])
    losses = []
    for step in range(3):
      x_local, y_local = host_batch(step, PID, rows)

      def x_cb(indices, x_local=x_local):
        for idx in indices:
          assert offset <= idx[0].start < idx[0].stop <= offset + rows, (idx, offset)
        return [x_local[idx[0].start - offset: idx[0].stop - offset] for idx in indices]

      x = GDA.from_batched_callback((16, 4), mesh, P("x"), x_cb)
      y = GDA.from_callback((16,), mesh, P("x"),
                            lambda idx, y_local=y_local: y_local[idx[0].start - offset:
                                                                 idx[0].stop - offset])
      old = w
      w, loss = train_step(w, x, y)
      assert old.is_deleted() and isinstance(w, GDA), (old.is_deleted(), type(w))
      losses.append(float(mu.process_allgather(loss)))
    mu.assert_equal(np.array(losses, F32), "processes disagree on the loss")

  # The same three steps in numpy on the whole global batch.
  w_ref = w0.astype(np.float64)
  for step, loss in enumerate(losses):
    x, y = (np.concatenate(z) for z in zip(*(host_batch(step, p, rows) for p in range(N)), strict=True))
    err = x @ w_ref - y
    np.testing.assert_allclose(loss, np.mean(err ** 2), rtol=1e-5)
    w_ref = w_ref - 0.1 * (2 / len(y)) * (x.T @ err)
  np.testing.assert_allclose(mu.process_allgather(w), w_ref, rtol=1e-5)
  W.log(f"data loading ok, losses {losses}")


def check_ordered_prints(mesh):
  data = np.arange(16, dtype=F32).reshape(8, 2)
  x = GDA.from_callback((8, 2), mesh, P("x", "y"), lambda i: data[i])

  @jax.jit
  def f(x, base):
    for k in range(3):
      jax.debug.print("ORDERED {k} {s}", k=base + k, s=x.sum(), ordered=True)
      x = x + 1
    return x

  for call in range(2):
    x = f(x, 3 * call)
  jax.effects_barrier()
  mu.sync_global_devices("jse ordered prints done")


def check_checkpoints(root: str):
  """Both processes write one 8-device GDA into one directory, each only its
  own shards, then restore it with other mesh axes and check their shards."""
  import asyncio
  import os

  from jax_sharding_ext import serialization

  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  data = np.arange(64, dtype=np.float32).reshape(8, 8)
  gda = GDA.from_callback((8, 8), mesh, P("x", "y"), lambda i: data[i])
  spec = lambda name: serialization.get_tensorstore_spec(f"{root}/{name}")

  def check(out, spec_used, want):
    assert isinstance(out, GDA) and out.mesh_axes == spec_used and not out.is_fully_addressable
    assert [s.device for s in out.local_shards] == list(mesh.local_devices)
    for s in out.local_shards:
      np.testing.assert_array_equal(np.asarray(s.data), want[s.index])

  # run_serialization: every process writes its shards; restore twice.
  serialization.run_serialization([gda], [spec("run")])
  for axes in (P("y", "x"), P(None), P(("x", "y"))):
    out, = serialization.run_deserialization([mesh], [axes], [spec("run")])
    check(out, axes, data)

  # Only process 0 writes (the low-level call): each process writes only its
  # own shards, so only the chunks of process 0's devices are stored, and a
  # restore refuses the partial array (process 1 recorded no chunks).
  if PID == 0:
    asyncio.run(serialization.async_serialize(gda, spec("only0")))
  mu.sync_global_devices("jse only0 written")
  stored = {(i, j): os.path.exists(f"{root}/only0/{i}.{j}") for i in range(4) for j in range(2)}
  assert stored == {(i, j): mesh.devices[i, j].process_index == 0 for (i, j) in stored}, stored
  msg = raises(ValueError, serialization.run_deserialization, [mesh], [P(None)],
               [spec("only0")])
  assert "is damaged: its chunk records ['jax_sharding_ext.chunks.1'] are missing" in msg, msg

  # The manager: background commit, process 0 renames once everyone is done.
  calls = []

  def on_commit():
    calls.append(1)
    os.rename(f"{root}/tmp", f"{root}/final")
  manager = serialization.GlobalAsyncCheckpointManager(timeout_secs=60)
  manager.serialize([gda], [spec("tmp/w")], on_commit_callback=on_commit)
  manager.wait_until_finished()
  assert calls == ([1] if PID == 0 else []), calls
  out, = manager.deserialize([mesh], [P("x")], [spec("final/w")])
  check(out, P("x"), data)

  # Orbax: PyTreeCheckpointer and CheckpointManager, GDA leaves restored as GDAs.
  import orbax.checkpoint as ocp

  from jax_sharding_ext import orbax_support

  state = {"w": gda, "b": GDA.from_callback((8,), mesh, P(None), lambda i: data[0][i])}
  target = {"w": GDA.from_callback((8, 8), mesh, P(None, "x"), lambda i: data[i] * 0),
            "b": GDA.from_callback((8,), mesh, P("y"), lambda i: data[0][i] * 0)}
  restore = ocp.args.PyTreeRestore(item=target,
                                   restore_args=orbax_support.restore_args_for(target))
  ckptr = ocp.PyTreeCheckpointer()
  ckptr.save(f"{root}/orbax", state)
  out = ckptr.restore(f"{root}/orbax", args=restore)
  check(out["w"], P(None, "x"), data)
  check(out["b"], P("y"), data[0])
  with ocp.CheckpointManager(f"{root}/managed") as mngr:
    for step in range(2):
      mngr.save(step, args=ocp.args.PyTreeSave(state))
    mngr.wait_until_finished()
    assert mngr.latest_step() == 1, mngr.all_steps()
    out = mngr.restore(1, args=restore)
  check(out["w"], P(None, "x"), data)
  mu.sync_global_devices("jse checkpoints done")
  W.log("checkpoints ok")


def check_assert_equal_replicas():
  """`assert_equal` on GDAs replicated over all 8 devices: equal values pass on
  every process; values that some process filled differently (its own seed,
  its own buffers) raise AssertionError with the message on every process."""
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))

  def replicated(seed, shape=(3, 4)):
    value = np.random.default_rng(seed).normal(size=shape).astype(F32)
    return GDA.from_callback(shape, mesh, P(), lambda i: value[i])

  def per_host_buffers(fill):
    bufs = [jax.device_put(np.full((2, 2), fill, F32), d) for d in mesh.local_devices]
    return GDA((2, 2), mesh, P(), bufs)

  def must_fail(tree, message):
    msg = raises(AssertionError, mu.assert_equal, tree, message)
    assert msg.startswith(message), msg
    W.log(f"assert_equal raised {msg[:len(message)]!r}")

  # The same value everywhere: passes on every process.
  same = {"w": replicated(0), "b": replicated(1, ()), "step": np.int32(5)}
  assert same["w"].is_fully_replicated and not same["w"].is_fully_addressable
  mu.assert_equal(same, "equal params differ")
  mu.assert_equal(per_host_buffers(7.0), "equal buffers differ")
  # Each host initialised from its own seed: the bug assert_equal exists to catch.
  must_fail({"w": replicated(PID), "step": np.int32(5)}, "params differ")
  # Only the last process differs: every process still raises.
  must_fail(replicated(int(PID == N - 1), ()), "last host differs")
  # The constructor with per-host buffers.
  must_fail(per_host_buffers(float(PID)), "buffers differ")
  # Sharded across processes: still no per-process value to compare.
  sharded = GDA.from_callback((8, 2), mesh, P("x"), lambda i: np.ones((8, 2), F32)[i])
  msg = raises(ValueError, mu.assert_equal, sharded, "sharded")
  assert "process_allgather" in msg, msg
  mu.sync_global_devices("jse assert_equal done")
  W.log("assert_equal ok")


def die_before_collective(dead: int):
  """Process `dead` exits abruptly; the others enter collectives it never joins."""
  if PID == dead:
    W.log("exiting before the collective")
    os._exit(3)
  mu.sync_global_devices("jse peer is dead")
  mu.process_allgather(np.int32(PID))
  raise AssertionError("collectives returned although a peer died")


def main():
  assert (jax.process_count(), jax.process_index(), jax.local_device_count()) == (N, PID, L)
  if W.args[:1] == ("sync",):
    return mu.sync_global_devices("jse sync only")
  if W.args[:1] == ("ckpt",):
    return check_checkpoints(W.args[1])
  if W.args[:1] == ("die",):
    return die_before_collective(int(W.args[1]))
  if W.args[:1] == ("assert_equal",):
    return check_assert_equal_replicas()
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  _, global_gdas = check_round_trip(mesh)
  check_collectives(mesh, global_gdas)
  check_data_loading(mesh)
  check_ordered_prints(mesh)


if __name__ == "__main__":
  main_guard(main)
