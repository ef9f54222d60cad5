"""Every example script runs to completion as a user would run it."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

EXAMPLES_DIR = pathlib.Path(__file__).parent.parent / "examples"
MULTIHOST = EXAMPLES_DIR / "multihost_train.py"  # tested on its own below
EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.py") if p != MULTIHOST)


def _run(script):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=300, env=env, cwd=script.parent)


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script):
  res = _run(script)
  assert res.returncode == 0, f"{script.name} failed:\n{res.stdout}\n{res.stderr}"
  assert res.stdout.strip(), f"{script.name} printed nothing"


@pytest.mark.multiprocess
def test_multihost_train_runs_two_processes_deterministically():
  runs = [_run(MULTIHOST) for _ in range(2)]
  for res in runs:
    assert res.returncode == 0, f"failed:\n{res.stdout}\n{res.stderr}"
  out = runs[0].stdout
  assert out == runs[1].stdout, (out, runs[1].stdout)
  assert out.startswith("2 processes, 8 devices"), out
  losses = [float(x) for x in re.findall(r"^step \d+  loss (\S+)", out, re.M)]
  assert len(losses) == 5 and losses == sorted(losses, reverse=True), out
  assert "examples per host [80, 80]" in out and "all 2 hosts hold the same weights" in out
  data = repr(jax.sharding.PartitionSpec("data"))  # as this JAX writes a spec
  assert ("checkpoint step_5: saved by 2 hosts, restored as GlobalDeviceArray with "
          f"mesh_axes {data}: equal to the trained weights") in out
  # A checkpoint written by 2 processes over 8 devices restores in 1 process on 2.
  assert ("checkpoint step_5: restored in 1 process on 2 devices as GlobalDeviceArray with "
          f"mesh_axes {data}: equal to the trained weights") in out
