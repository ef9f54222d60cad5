"""GlobalDeviceArray under real multi-process JAX (`jax.distributed`).

Starts 2 worker processes (`_multiprocess_worker.py`) with 4 virtual CPU
devices each, joined through a coordinator on 127.0.0.1, so the mesh spans 8
global devices of which each process owns 4. The checks themselves run in the
workers; this test only starts them, enforces a hard timeout, and shows each
process's output when something fails.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

NUM_PROCESSES = 2
TIMEOUT_S = 120
WORKER = Path(__file__).with_name("_multiprocess_worker.py")


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_workers(num_processes: int, timeout: float):
  """Run the workers; return (returncodes, outputs, timed_out)."""
  port = _free_port()
  env = dict(os.environ)
  env.pop("JSE_TEST_DEVICES", None)
  env["PYTHONUNBUFFERED"] = "1"
  procs = []
  for i in range(num_processes):
    procs.append(subprocess.Popen(
        [sys.executable, "-W", "error", str(WORKER), str(i), str(num_processes), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        cwd=str(WORKER.parent.parent), start_new_session=True))
  deadline = time.monotonic() + timeout
  timed_out = False
  try:
    # Poll so that one worker failing stops the other at once (it would
    # otherwise wait for its peer in a collective until the timeout).
    while True:
      codes = [p.poll() for p in procs]  # poll every worker, not just the first running one
      if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
        break
      if time.monotonic() > deadline:
        timed_out = True
        break
      time.sleep(0.1)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    outputs = [p.communicate(timeout=30) for p in procs]
  return [p.returncode for p in procs], outputs, timed_out


def _report(returncodes, outputs, timed_out, timeout=TIMEOUT_S) -> str:
  parts = [f"workers timed out after {timeout} s" if timed_out
           else f"worker return codes: {returncodes}"]
  for i, (rc, (out, err)) in enumerate(zip(returncodes, outputs, strict=True)):
    parts.append(f"[process={i}] returncode={rc}\n"
                 f"--- stdout ---\n{out.decode(errors='replace')}\n"
                 f"--- stderr ---\n{err.decode(errors='replace')}")
  return "\n".join(parts)


@pytest.mark.multiprocess
def test_gda_multiprocess():
  returncodes, outputs, timed_out = _run_workers(NUM_PROCESSES, TIMEOUT_S)
  ok = (not timed_out and returncodes == [0] * NUM_PROCESSES
        and all(b"WORKER OK" in out for out, _ in outputs))
  if not ok:
    report = _report(returncodes, outputs, timed_out)
    print(report)
    pytest.fail(report, pytrace=False)
