"""A GDA-era multi-host training loop, run as 2 local processes.

Run: `.venv/bin/python examples/multihost_train.py`

Without arguments the script starts 2 copies of itself, each with 4 virtual
CPU devices, joined through `jax.distributed` on 127.0.0.1, and shows what
process 0 printed. Each copy runs the program one would start once per host
on a real cluster (there: `--process-id K --num-processes N --coordinator
host0:port`, and no virtual devices):

- every host checks it runs the same config (`multihost_utils.assert_equal`)
  and takes the seed host 0 chose (`broadcast_one_to_all`);
- every host reads only its own rows of each global batch, with numpy, and
  `GlobalDeviceArray.from_batched_callback` places them on the global mesh;
- the parameters are a replicated GlobalDeviceArray donated to every jitted
  step (the old parameters' buffers are reused);
- metrics come back with `process_allgather`: the global loss (the same on
  every host) and each host's own count of examples;
- the trained parameters are checkpointed with
  `serialization.GlobalAsyncCheckpointManager` (each host writes its own
  shards, process 0 commits once all are done) and restored resharded;
- then one more process, alone and with 2 devices, restores that checkpoint
  (written by 2 processes over 8 devices) onto its own mesh: a checkpoint
  restores under any process count.

The checkpoint part needs the `checkpoint` extra
(`pip install 'jax-sharding-ext[checkpoint]'`).

The output is deterministic: the same numbers on every run.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile

NUM_PROCESSES, LOCAL_DEVICES = 2, 4
GLOBAL_BATCH, FEATURES, STEPS, LR = 32, 8, 5, 0.1
CONFIG = {"global_batch": GLOBAL_BATCH, "features": FEATURES, "steps": STEPS}


def train(process_id: int, num_processes: int, coordinator: str, log=sys.stdout,
          ckpt_dir: str | None = None) -> None:
  import functools

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  import jax_sharding_ext
  from jax_sharding_ext import GlobalDeviceArray, multihost_utils

  if hasattr(jax.config, "jax_cpu_collectives_implementation"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives
  jax.distributed.initialize(coordinator, num_processes=num_processes,
                             process_id=process_id, initialization_timeout=60,
                             heartbeat_timeout_seconds=10)
  say = functools.partial(print, file=log, flush=True) if process_id == 0 else (lambda *a: None)
  mesh = Mesh(np.array(jax.devices()).reshape(-1, 2), ("data", "model"))
  say(f"{jax.process_count()} processes, {jax.device_count()} devices, "
      f"mesh {dict(mesh.shape)}; this host has {jax.local_device_count()}")

  multihost_utils.assert_equal(np.array(list(CONFIG.values())), "hosts disagree on the config")
  seed = int(multihost_utils.broadcast_one_to_all(np.int32(1234 if process_id == 0 else -1)))
  say(f"seed from host 0: {seed}")

  rng = np.random.default_rng(seed)  # the same on every host
  true_w = rng.normal(size=FEATURES).astype(np.float32)
  rows = GLOBAL_BATCH // num_processes  # this host's share of each batch
  first_row = process_id * rows

  def host_batch(step):
    """This host's rows of global batch `step` (a real loader reads files)."""
    r = np.random.default_rng([seed, step, process_id])
    x = r.normal(size=(rows, FEATURES)).astype(np.float32)
    return x, x @ true_w + 0.1 * r.normal(size=rows).astype(np.float32)

  def global_batch(local):
    # Called with the global index of each of this host's devices' shards.
    def cb(indices):
      return [local[i[0].start - first_row: i[0].stop - first_row] for i in indices]
    shape = (GLOBAL_BATCH, *local.shape[1:])
    return GlobalDeviceArray.from_batched_callback(shape, mesh, P("data"), cb)

  @functools.partial(jax.jit, donate_argnums=0)
  def step_fn(w, x, y):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - LR * grad, loss

  examples_seen = 0
  with jax_sharding_ext.parallel_functions_output_gda(True):  # outputs as GDAs
    w = GlobalDeviceArray.from_callback((FEATURES,), mesh, P(None),
                                        lambda i: np.zeros(FEATURES, np.float32)[i])
    for step in range(STEPS):
      x_local, y_local = host_batch(step)
      old_w = w
      w, loss = step_fn(w, global_batch(x_local), global_batch(y_local))
      assert old_w.is_deleted(), "the parameters were not donated"
      examples_seen += len(x_local)
      metrics = multihost_utils.process_allgather(
          {"loss": loss, "examples": np.int32(examples_seen)})
      say(f"step {step}  loss {float(metrics['loss']):.4f}  "
          f"examples per host {metrics['examples'].tolist()}")

  final_w = multihost_utils.process_allgather(w)  # its global value, on every host
  multihost_utils.assert_equal(final_w, "hosts disagree on the trained weights")
  say(f"|w - true_w| = {np.linalg.norm(final_w - true_w):.4f}; "
      f"all {num_processes} hosts hold the same weights")

  if ckpt_dir is not None:
    # Save in the background (each host writes its own shards), commit once
    # every host is done (process 0 renames the directory), restore resharded.
    from jax_sharding_ext import serialization  # pip install 'jax-sharding-ext[checkpoint]'

    name = f"step_{STEPS}"
    tmp, final = os.path.join(ckpt_dir, name + ".tmp"), os.path.join(ckpt_dir, name)
    manager = serialization.GlobalAsyncCheckpointManager(timeout_secs=60)
    manager.serialize([w], [serialization.get_tensorstore_spec(os.path.join(tmp, "w"))],
                      on_commit_callback=lambda: os.rename(tmp, final))
    manager.wait_until_finished()
    restored, = manager.deserialize([mesh], [P("data")],
                                    [serialization.get_tensorstore_spec(os.path.join(final, "w"))])
    same = bool(np.array_equal(multihost_utils.process_allgather(restored), final_w))
    multihost_utils.assert_equal(np.bool_(same), "hosts disagree on the restored weights")
    say(f"checkpoint {name}: saved by {num_processes} hosts, restored as "
        f"{type(restored).__name__} with mesh_axes {restored.mesh_axes}: "
        f"{'equal' if same else 'DIFFERENT'} to the trained weights")
    if process_id == 0:
      np.save(os.path.join(ckpt_dir, "trained_w.npy"), final_w)
  multihost_utils.sync_global_devices("multihost_train done")


def restore_alone(ckpt_dir: str) -> None:
  """Restore the checkpoint the training processes wrote, in this one process.

  Each process of a restore reads the chunks its own devices need, whichever
  process wrote them, so the number of processes and devices may differ from
  the save's: here 1 process with 2 devices reads what 2 processes with 4
  devices each wrote.
  """
  import jax
  import numpy as np
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import serialization

  mesh = Mesh(np.array(jax.devices()), ("data",))
  name = f"step_{STEPS}"
  spec = serialization.get_tensorstore_spec(os.path.join(ckpt_dir, name, "w"))
  w, = serialization.run_deserialization([mesh], [P("data")], [spec])
  same = bool(np.array_equal(np.asarray(w), np.load(os.path.join(ckpt_dir, "trained_w.npy"))))
  print(f"checkpoint {name}: restored in {jax.process_count()} process on "
        f"{jax.device_count()} devices as {type(w).__name__} with mesh_axes {w.mesh_axes}: "
        f"{'equal' if same else 'DIFFERENT'} to the trained weights", flush=True)


def launch(timeout: float = 120) -> int:
  """Start NUM_PROCESSES local copies of this script; show process 0's report.

  The report goes through a file, not stdout: the CPU collectives (Gloo)
  print connection notices on stdout from their own threads.
  """
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={LOCAL_DEVICES}")
  with tempfile.TemporaryDirectory() as tmp:
    report = os.path.join(tmp, "report.txt")
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--process-id", str(i), "--num-processes",
         str(NUM_PROCESSES), "--coordinator", f"127.0.0.1:{port}", "--report", report,
         "--ckpt-dir", os.path.join(tmp, "checkpoints")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(NUM_PROCESSES)]
    try:
      outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
      for p in procs:
        p.kill()  # a no-op for those that finished; never leave one behind
    if os.path.exists(report):
      with open(report) as f:
        print(f.read(), end="")
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    for i in failed:
      print(f"--- process {i} failed (exit code {procs[i].returncode}):\n{outputs[i]}")
    if failed:
      return 1
    alone = subprocess.run(
        [sys.executable, __file__, "--restore", os.path.join(tmp, "checkpoints")],
        env=dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=2"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    print(alone.stdout, end="")
  return alone.returncode


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--process-id", type=int)
  parser.add_argument("--num-processes", type=int, default=NUM_PROCESSES)
  parser.add_argument("--coordinator", default=None, help="host:port of process 0")
  parser.add_argument("--report", default=None, help="file for process 0's report "
                      "(default: stdout)")
  parser.add_argument("--ckpt-dir", default=None, help="a directory every host can "
                      "write (shared storage on a real cluster); omitted: no checkpoint")
  parser.add_argument("--restore", default=None, metavar="CKPT_DIR", help="restore the "
                      "checkpoint in CKPT_DIR in this one process, and compare it")
  args = parser.parse_args()
  if args.restore is not None:
    restore_alone(args.restore)
    sys.exit(0)
  if args.process_id is None:
    sys.exit(launch())
  if args.report and args.process_id == 0:
    with open(args.report, "w") as log:
      train(args.process_id, args.num_processes, args.coordinator, log, args.ckpt_dir)
  else:
    train(args.process_id, args.num_processes, args.coordinator, ckpt_dir=args.ckpt_dir)
