"""One process of `test_fuzz_multihost.py`'s runs (started by `_multihost.run_workers`).

argv after the harness's own: the path of a file holding the batch's
`repr` (a tuple of `strategies.MhCase`) and the index of its first case to
run. For each case the worker writes `MHSTART i`, runs the helper on its own
tree (`test_fuzz_multihost.run_case`), writes `MHRESULT <json>`, meets the
others at a barrier and writes `MHDONE i`. A case that hangs for 10 s ends
the process (faulthandler dumps every thread's stack first).

Everything the process writes (these lines, JAX's and gloo's logs, a stack
dump) goes to `<batch file>.<process id>.log`, appended across runs of the
batch: the harness reads its pipes only when the workers end, and a long
batch would fill them.
"""

from _worker_boot import boot, main_guard

W = boot()

import faulthandler  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import strategies  # noqa: E402
import test_fuzz_multihost as fuzz  # noqa: E402
from jax.experimental import multihost_utils as stock_mu  # noqa: E402

CASE_TIMEOUT_S = 10


def main():
  path, first = W.args[0], int(W.args[1])
  log = os.open(f"{path}.{W.process_id}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
  saved = os.dup(1), os.dup(2)
  sys.stdout.flush()
  os.dup2(log, 1)
  os.dup2(log, 2)
  try:
    run(path, first)
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)


def run(path: str, first: int) -> None:
  import jax_sharding_ext
  W.log(f"package {jax_sharding_ext.__file__}")
  with open(path) as f:
    batch = eval(f.read(), vars(strategies))  # the batch's repr (plain data)
  for i in range(first, len(batch)):
    print(f"MHSTART {i}", flush=True)
    faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
    record = fuzz.run_case(batch[i], W.process_id, W.num_processes)
    print("MHRESULT " + json.dumps({"i": i, **record}), flush=True)
    stock_mu.sync_global_devices(f"mh case {i}")  # stock's: a fixed-size uint32 gather
    faulthandler.cancel_dump_traceback_later()
    print(f"MHDONE {i}", flush=True)
  sys.stdout.flush()


main_guard(main)
