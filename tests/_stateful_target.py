"""Targets for `test_fuzz_harness.py`: a defect that lives in state one
example leaves behind for the next (as a cache would)."""

_SEEN: list = []


def remember(x):
  """Passes, and leaves `x` behind in the process."""
  _SEEN.append(x)


def check(x):
  """Fails when an earlier example in this process left `x` behind."""
  assert x not in _SEEN, f"{x} was left behind by an earlier example"


def always_fails(x):
  raise AssertionError(f"fails on {x} whatever ran before")
