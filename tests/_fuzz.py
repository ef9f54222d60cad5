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

The child runs many examples, one after another, so a defect may live in
state an earlier example left behind (a cache, a registry), and the saved
example then passes on its own. At the end of the session
(`verify_found`), each saved example is run alone in a fresh child; if it
passes there, the file is rewritten to run, in one fresh child, the
shortest run of the examples before it (as the child ran them) that makes
it fail, and says so.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import re
from typing import Any

import _isolated
from hypothesis import HealthCheck, Phase, settings

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
# `make mutate`: the examples of `make test`, and a failure is enough: no shrinking.
settings.register_profile("mutate", derandomize=True, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate), **_COMMON)
MUTATE = os.environ.get("JSE_MUTATE") == "1"
settings.load_profile("fuzz" if FUZZ else "mutate" if MUTATE else "ci")


def budget(examples: int, **kwargs: Any) -> settings:
  """Settings of one property: `examples` examples under `make test`,
  `JSE_FUZZ_SCALE` times as many under `make fuzz`."""
  return settings(max_examples=examples * SCALE if FUZZ else examples, **kwargs)


def _current_test() -> str:
  name = os.environ.get("PYTEST_CURRENT_TEST", "unknown::unknown").split(" ")[0]
  return re.sub(r"\W+", "_", name.split("::")[-1].split("[")[0])


_HEADER = ('"""Found by `make fuzz` (seed {seed}, {date}): {what} of `{name}`.\n\n'
           "{note}Copy it into a regression test named after the behaviour it shows,\n"
           'then delete this file."""\n\n'
           "import _isolated\n"
           "from strategies import *  # noqa: F403  (the example's types)\n\n")

_SAVED: dict[pathlib.Path, tuple[str, Any, list[tuple[str, Any]], Any]] = {}
"""Every file `save_found` wrote this session: its target, example, the
examples run before it and its context (for `verify_found`)."""


def save_found(target: str, example: Any, before: list[tuple[str, Any]] | None = None,
               context: Any = None) -> pathlib.Path:
  """Write `example` as a test of `target` under `tests/found/`. `before`:
  the `(target, example)`s run before it in the same process, ending with
  it (by default what the shared child has run). `context`: an example of
  `target` that holds this one and what ran before it in one process (a
  multi-host batch up to the failing case), for when it passes alone."""
  FOUND.mkdir(exist_ok=True)
  name = _current_test()
  path = FOUND / f"test_found_{name}.py"
  path.write_text(_HEADER.format(
      seed=os.environ.get("JSE_FUZZ_SEED", "?"), date=datetime.date.today(),
      what="the shrunk example", name=name, note="") +
      f"EXAMPLE = {example!r}  # noqa: F405\n\n\n"
      "def test_found():\n"
      f"  _isolated.run({target!r}, EXAMPLE)\n")
  _SAVED[path] = (target, example, list(before if before is not None else _isolated.history()),
                  context)
  return path


def _fails_in_fresh_child(sequence: list[tuple[str, Any]]) -> bool:
  """Whether the last of `sequence` fails when a fresh child runs them all in order."""
  child = _isolated.Child()
  try:
    for target, example in sequence[:-1]:
      try:
        child.run(target, example)
      except AssertionError:
        pass  # as it did in the run that found it (shrinking runs failing examples)
    child.run(*sequence[-1])
  except AssertionError:
    return True
  finally:
    child.close()
  return False


def _write_sequence(path: pathlib.Path, sequence: list[tuple[str, Any]], note: str) -> None:
  name = path.stem.removeprefix("test_found_")
  path.write_text(_HEADER.format(
      seed=os.environ.get("JSE_FUZZ_SEED", "?"), date=datetime.date.today(),
      what=f"a sequence of {len(sequence)} examples, the last failing,", name=name,
      note=note) +
      f"SEQUENCE = {sequence!r}  # noqa: F405\n\n\n"
      "def test_found():\n"
      "  child = _isolated.Child()\n"
      "  try:\n"
      "    for target, example in SEQUENCE[:-1]:\n"
      "      try:\n"
      "        child.run(target, example)\n"
      "      except AssertionError:\n"
      "        pass  # as it did in the run that found it\n"
      "    child.run(*SEQUENCE[-1])\n"
      "  finally:\n"
      "    child.close()\n")


def verify_found() -> None:
  """Check that each example saved this session fails on its own in a fresh
  child; where it does not, save the examples before it that make it fail
  (the shortest run of them ending with it: 2, 4, 8, ... examples)."""
  for path, (target, example, before, context) in list(_SAVED.items()):
    if _fails_in_fresh_child([(target, example)]):
      continue
    if context is not None:
      note = ("The example passes on its own: it fails after the cases before it in one "
              "run,\nwhich left state behind. " if _fails_in_fresh_child([(target, context)])
              else "The example did not fail again, not even after the cases before it: it "
              "may\ndepend on timing. ")
      _write_sequence(path, [(target, context)], note)
      continue
    history = before if before and before[-1] == (target, example) else [
        *before, (target, example)]
    n = 2
    while True:
      suffix = history[-n:]
      if _fails_in_fresh_child(suffix):
        _write_sequence(path, suffix, "The last example passes on its own: it fails after the "
                        "examples before it,\nwhich left state behind. ")
        break
      if n >= len(history):
        _write_sequence(path, history, "The last example did not fail again in a fresh child, "
                        "not even after the\nexamples before it: it may depend on timing. ")
        break
      n *= 2
  _SAVED.clear()


LOG = os.environ.get("JSE_FUZZ_LOG")
"""A file to append every failing example to (one line each, with the last
line of its error), to see every defect a run meets, not only the shrunk one."""


def isolated(target: str, example: Any, timeout: float = 120.0) -> Any:
  """Run `target(example)` in the child; under `make fuzz` save a failure."""
  try:
    return _isolated.run(target, example, timeout)
  except AssertionError as e:
    if FUZZ:
      save_found(target, example, _isolated.history())
    if LOG:
      last = [line for line in str(e).splitlines() if line.strip()][-1]
      with open(LOG, "a") as f:
        f.write(f"{example!r}\t{type(e).__name__}: {last[:300]}\n")
    raise
