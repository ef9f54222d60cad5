"""GDAs spanning processes next to the same `jax.Array`s, under real
multi-process JAX (`jax.distributed` on 127.0.0.1): `jax.device_put`
reshards, and the value of a fully replicated GDA on every process. The
checks run in `_global_array_worker.py`, started through `_multihost.py`
(hard timeout, workers always killed)."""

from pathlib import Path

import pytest
from _multihost import run_workers

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).parent / "_global_array_worker.py"


@pytest.mark.parametrize("num_processes, local_devices",
                         [pytest.param(2, 4, id="2x4"), pytest.param(4, 2, id="4x2")])
def test_global_gdas_match_their_jax_arrays(num_processes, local_devices):
  run = run_workers(WORKER, num_processes, local_devices, timeout=240)
  if not run.ok:
    pytest.fail(run.report(), pytrace=False)
  for i in range(num_processes):
    out = run.stdout(i)
    for step in ("49 reshards ok", "pytree and ledger ok", "guard levels ok",
                 "replicated scalars ok"):
      assert step in out, run.report()
