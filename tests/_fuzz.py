"""What every fuzzer of the suite shares: its budget, and saving what it finds.

Each property runs a few examples under `make test` (the "ci" profile,
derandomized, so a run is repeatable) and many under `make fuzz` (the "fuzz"
profile: a seed printed by `make fuzz`, `JSE_FUZZ_SCALE` times the examples).

`isolated(target, example)` runs one example in the suite's child process
(`_isolated.py`). Under `make fuzz` a failing example is also written to
`tests/found/test_found_<property>.py`, an ordinary test that runs the same
target on that example; hypothesis replays the shrunk example last, so the
file ends up holding the shrunk one. Copy it into a regression test named
after the behaviour, then delete the file. `JSE_FUZZ_LOG=path` also appends
every failing example to `path`.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import re
from typing import Any

import _isolated
from hypothesis import HealthCheck, settings

FUZZ = os.environ.get("JSE_FUZZ") == "1"
"""True under `make fuzz`."""

SCALE = int(os.environ.get("JSE_FUZZ_SCALE", "20"))
FOUND = pathlib.Path(__file__).resolve().parent / "found"

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much,
                                      HealthCheck.function_scoped_fixture])
settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("fuzz", derandomize=False, **_COMMON)
settings.load_profile("fuzz" if FUZZ else "ci")


def budget(examples: int, **kwargs: Any) -> settings:
  """Settings of one property: `examples` examples under `make test`,
  `JSE_FUZZ_SCALE` times as many under `make fuzz`."""
  return settings(max_examples=examples * SCALE if FUZZ else examples, **kwargs)


def _current_test() -> str:
  name = os.environ.get("PYTEST_CURRENT_TEST", "unknown::unknown").split(" ")[0]
  return re.sub(r"\W+", "_", name.split("::")[-1].split("[")[0])


def save_found(target: str, example: Any) -> pathlib.Path:
  """Write `example` as a test of `target` under `tests/found/`."""
  FOUND.mkdir(exist_ok=True)
  name = _current_test()
  path = FOUND / f"test_found_{name}.py"
  path.write_text(
      f'"""Found by `make fuzz` (seed {os.environ.get("JSE_FUZZ_SEED", "?")}, '
      f'{datetime.date.today()}): the shrunk example of `{name}`.\n\n'
      "Copy it into a regression test named after the behaviour it shows,\n"
      'then delete this file."""\n\n'
      "import _isolated\n"
      "from strategies import *  # noqa: F403  (the example's types)\n\n"
      f"EXAMPLE = {example!r}  # noqa: F405\n\n\n"
      "def test_found():\n"
      f"  _isolated.run({target!r}, EXAMPLE)\n")
  return path


LOG = os.environ.get("JSE_FUZZ_LOG")
"""A file to append every failing example to (one line each, with the last
line of its error), to see every defect a run meets, not only the shrunk one."""


def isolated(target: str, example: Any, timeout: float = 120.0) -> Any:
  """Run `target(example)` in the child; under `make fuzz` save a failure."""
  try:
    return _isolated.run(target, example, timeout)
  except AssertionError as e:
    if FUZZ:
      save_found(target, example)
    if LOG:
      last = [line for line in str(e).splitlines() if line.strip()][-1]
      with open(LOG, "a") as f:
        f.write(f"{example!r}\t{type(e).__name__}: {last[:300]}\n")
    raise
