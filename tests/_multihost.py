"""Runner side of the multi-process tests: start N workers under
`jax.distributed` on 127.0.0.1, enforce a hard timeout, always kill them.

A worker is a script that calls `_worker_boot.boot()` before it imports JAX
(see there). `run_workers` starts one subprocess per process in its own
session, stops all of them as soon as one fails (the others would otherwise
wait for it in a collective until the timeout), and returns a `Run` whose
`report()` says which worker failed first and shows every worker's output.

If the coordinator cannot bind its port (another program took the free port
between our probe and its bind), the run is retried on a new port. Process 0
then either exits with `PORT_IN_USE_EXIT` (see `_worker_boot.boot`) or, in
some runs, JAX itself crashes (SIGSEGV) after logging gRPC's "Failed to add
port to server"; both count as a clash.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _jax_warnings import STOCK_WARNINGS_IGNORED

PORT_IN_USE_EXIT = 75  # EX_TEMPFAIL: process 0 could not bind the coordinator port
_BIND_FAILED = "Failed to add port to server"  # gRPC's log line
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Run:
  """What a run of the workers did."""
  returncodes: list[int]
  outputs: list[tuple[str, str]]  # (stdout, stderr) per worker
  timed_out: bool
  first_failed: int | None  # the worker seen failing first, if any
  elapsed: float
  ports: list[int]  # every port tried, the last one used

  @property
  def port_clash(self) -> bool:
    """Process 0 could not bind the coordinator's port."""
    return bool(self.returncodes) and (
        self.returncodes[0] == PORT_IN_USE_EXIT
        or (self.returncodes[0] != 0 and _BIND_FAILED in self.outputs[0][1]))

  @property
  def ok(self) -> bool:
    return (not self.timed_out and all(rc == 0 for rc in self.returncodes)
            and all("WORKER OK" in out for out, _ in self.outputs))

  def stdout(self, i: int) -> str:
    return self.outputs[i][0]

  def summary(self) -> str:
    n = len(self.returncodes)
    if self.port_clash:
      return (f"the coordinator's port {self.ports[-1]} was in use on all "
              f"{len(self.ports)} tries (ports {self.ports}); return codes {self.returncodes}")
    if self.timed_out:
      return f"{n} workers timed out after {self.elapsed:.0f} s (return codes {self.returncodes})"
    if self.first_failed is not None:
      return (f"worker {self.first_failed} of {n} failed first (return code "
              f"{self.returncodes[self.first_failed]}); return codes {self.returncodes}")
    return f"{n} workers finished in {self.elapsed:.1f} s, return codes {self.returncodes}"

  def report(self) -> str:
    parts = [self.summary()]
    for i, (rc, (out, err)) in enumerate(zip(self.returncodes, self.outputs, strict=True)):
      parts.append(f"[process={i}] returncode={rc}\n--- stdout ---\n{out}\n"
                   f"--- stderr ---\n{err[-6000:]}")
    return "\n".join(parts)


RELEASE_ENV = "JSE_TEST_OTHERS_EXITED"


def _start(script, i, num_processes, port, local_devices, args, env):
  # Output goes to files, not pipes: nothing reads a pipe until the workers
  # end, and a worker that printed more than a pipe holds would block.
  out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
  p = subprocess.Popen(
      [sys.executable, "-W", "error", *STOCK_WARNINGS_IGNORED, str(script), str(i),
       str(num_processes), str(port),
       str(local_devices), *map(str, args)],
      stdout=out, stderr=err, env=env, cwd=str(REPO), start_new_session=True)
  p.outputs = (out, err)
  return p


def _read(p: subprocess.Popen) -> tuple[str, str]:
  texts = []
  for f in p.outputs:
    f.seek(0)
    texts.append(f.read().decode(errors="replace"))
    f.close()
  return texts[0], texts[1]


def _kill(p: subprocess.Popen) -> None:
  if p.poll() is None:
    try:
      os.killpg(p.pid, signal.SIGKILL)  # the worker and anything it started
    except ProcessLookupError:
      pass


def _once(script, num_processes, local_devices, args, timeout, port, stop_on_failure,
          heartbeat_s) -> Run:
  env = {k: v for k, v in os.environ.items() if k not in ("JSE_TEST_DEVICES", "XLA_FLAGS")}
  env["PYTHONUNBUFFERED"] = "1"
  # Created once every other worker has exited: process 0 (which hosts the
  # coordination service) waits for it before it exits (`_worker_boot.main_guard`).
  release = Path(tempfile.mkdtemp()) / "others-exited"
  env[RELEASE_ENV] = str(release)
  if heartbeat_s is not None:
    env["JSE_TEST_HEARTBEAT_S"] = str(heartbeat_s)
  start = time.monotonic()
  procs = []
  first_failed = None
  timed_out = False
  try:
    for i in range(num_processes):
      procs.append(_start(script, i, num_processes, port, local_devices, args, env))
    while True:
      codes = [p.poll() for p in procs]
      if all(c is not None for c in codes[1:]) and not release.exists():
        release.touch()
      failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
      if failed and first_failed is None:
        first_failed = failed[0]
      if (failed and stop_on_failure) or all(c is not None for c in codes):
        break
      if time.monotonic() - start > timeout:
        timed_out = True
        break
      time.sleep(0.05)
  finally:
    for p in procs:
      _kill(p)
    for p in procs:
      p.wait(timeout=30)
    outputs = [_read(p) for p in procs]
    shutil.rmtree(release.parent, ignore_errors=True)
  return Run([p.returncode for p in procs], outputs, timed_out, first_failed,
             time.monotonic() - start, [port])


def run_workers(script, num_processes: int, local_devices: int, args=(),
                timeout: float = 120, port: int | None = None, attempts: int = 3,
                stop_on_failure: bool = True, heartbeat_s: int | None = None) -> Run:
  """Run `script` as `num_processes` processes of `local_devices` CPU devices.

  Each worker gets argv `ID N PORT LOCAL_DEVICES *args`. Retries on a new
  port when the coordinator's port was taken; `port` fixes the first try's.
  With `stop_on_failure=False` the others are left to fail on their own
  (until the timeout), to test how they notice a dead peer; `heartbeat_s`
  sets how soon the runtime declares a silent peer dead (default 10 s).
  """
  ports = []
  for _ in range(attempts):
    run = _once(script, num_processes, local_devices, args, timeout,
                port if port is not None and not ports else free_port(), stop_on_failure,
                heartbeat_s)
    ports += run.ports
    run.ports = ports
    if not run.port_clash:
      return run
  return run
