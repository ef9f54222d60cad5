"""Checkpoints and pickles cross JAX releases: what another supported
release writes (the package's checkpoints in both metadata formats, the
GDA-era manager's, an orbax checkpoint of GDAs, a pickle of GDAs), this one
restores exactly.

The writer runs in the other release's venv, as a subprocess
(`_cross_release_worker.py`); the suite of each release reads what each of
the others wrote, so `make test`, which runs the suite on the oldest
supported JAX, on 0.10.2 and on 0.12.x, checks every direction between them.
`make test` names the venvs' interpreters in `JSE_RELEASE_PYTHONS` and each
must exist there; run by hand, the test looks for the same venvs in the
checkout and skips, saying which one is missing, when one is absent.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import _cross_release_worker as _worker
import jax
import pytest

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
WORKER = TESTS / "_cross_release_worker.py"
# The venvs `make test` creates (Makefile: .venv, VENV_OLDEST, VENV312).
DEFAULT_VENVS = (".venv", ".venv-jax0.8.3", ".venv312")
TIMEOUT_S = 300


def _required() -> list[pathlib.Path] | None:
  """The interpreters `make test` requires, or None outside `make test`."""
  listed = os.environ.get("JSE_RELEASE_PYTHONS", "").split()
  return [pathlib.Path(p) for p in listed] or None


def _own_prefix() -> pathlib.Path:
  return pathlib.Path(sys.prefix).resolve()


def _others() -> list[tuple[str, pathlib.Path]]:
  required = _required()
  pythons = required or [ROOT / v / "bin" / "python" for v in DEFAULT_VENVS]
  out = []
  for python in pythons:
    venv = python.parent.parent
    if venv.resolve() == _own_prefix():
      continue
    out.append((venv.name, python))
  return out


def _python_or_skip(python: pathlib.Path) -> pathlib.Path:
  if python.exists():
    return python
  venv = python.parent.parent
  message = (f"the venv {venv} of another JAX release is missing: "
             f"`make install JAX=...` (or `make test-venvs`) creates it")
  if _required() is not None:
    pytest.fail(f"make test needs every release's venv, but {message}")
  pytest.skip(message)


def _run(python: pathlib.Path, mode: str, directory: pathlib.Path) -> dict:
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  res = subprocess.run([str(python), str(WORKER), mode, str(directory)], capture_output=True,
                       text=True, timeout=TIMEOUT_S, cwd=str(TESTS), env=env)
  assert res.returncode == 0, (f"{python} {mode} failed:\n{res.stdout[-4000:]}\n"
                               f"{res.stderr[-4000:]}")
  return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name, python", _others(), ids=[n for n, _ in _others()])
def test_written_by_another_release_restores_here(name, python, tmp_path):
  del name
  wrote = _run(_python_or_skip(python), "write", tmp_path)
  assert wrote["jax"] != jax.__version__, "the other venv has this very JAX release"
  assert _worker.read(tmp_path) == wrote["checked"] > 0
