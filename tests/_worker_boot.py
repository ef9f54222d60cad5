"""Worker side of the multi-process tests (see `_multihost.py`).

A worker script does, before anything imports JAX::

  from _worker_boot import boot, main_guard
  ctx = boot()           # argv: ID N PORT LOCAL_DEVICES [ARGS...]
  import jax ...
  main_guard(main)       # runs main(); prints WORKER OK, or exits 1 at once

`boot` gives this process LOCAL_DEVICES virtual CPU devices, picks CPU
collectives, and joins the distributed runtime on 127.0.0.1:PORT with short
timeouts, so a dead peer makes the others fail instead of hang.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
import traceback

from _multihost import PORT_IN_USE_EXIT, RELEASE_ENV  # shared with the runner

# How soon the runtime declares a silent peer dead; the fault test lowers it.
HEARTBEAT_TIMEOUT_S = int(os.environ.get("JSE_TEST_HEARTBEAT_S", "10"))


@dataclasses.dataclass(frozen=True)
class Worker:
  process_id: int
  num_processes: int
  local_devices: int
  args: tuple[str, ...]

  def log(self, msg: str) -> None:
    print(f"[worker {self.process_id}] {msg}", flush=True)


def boot() -> Worker:
  process_id, num_processes, port, local_devices = (int(a) for a in sys.argv[1:5])
  os.environ["JAX_PLATFORMS"] = "cpu"
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                 os.environ.get("XLA_FLAGS", "")).split()
  os.environ["XLA_FLAGS"] = " ".join(
      [f"--xla_force_host_platform_device_count={local_devices}", *flags])

  import jax

  if hasattr(jax.config, "jax_cpu_collectives_implementation"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
        process_id=process_id, initialization_timeout=60,
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  except Exception as e:
    if "Failed to start RPC server" in str(e):
      print(f"[worker {process_id}] coordinator port {port} is in use", flush=True)
      os._exit(PORT_IN_USE_EXIT)
    raise
  return Worker(process_id, num_processes, local_devices, tuple(sys.argv[5:]))


def main_guard(main) -> None:
  """Run `main()`; on success print WORKER OK and exit 0, on any failure exit
  1, both at once with `os._exit`.

  `main()` ends with a barrier every process passes, so nothing needs the
  distributed runtime afterwards. Skipping `jax.distributed.shutdown()` (and
  its atexit call) matters: after a failure it would wait for peers that are
  themselves waiting for us, and even after success process 0's shutdown
  sometimes hangs once process 1 has exited (stock JAX 0.10.2, about 1 run in
  10 here).
  """
  try:
    main()
  except BaseException:
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
  print("WORKER OK", flush=True)
  sys.stderr.flush()
  _wait_for_the_others()
  os._exit(0)


def _wait_for_the_others(timeout: float = 30.0) -> None:
  """Process 0 hosts the coordination service: exiting while another process
  still runs makes that one's runtime threads end it with an error (JAX
  0.8.x: "Terminating process because the JAX distributed service detected
  fatal errors"). So it waits until the runner says the others have exited."""
  release = os.environ.get(RELEASE_ENV)
  if release is None or sys.argv[1] != "0":
    return
  deadline = time.monotonic() + timeout
  while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.02)
