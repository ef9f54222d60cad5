"""The fuzzers' harness: a risky example's crash, hang or failure in the child
is a test failure that names the example, and the child is replaced after."""

import _fuzz
import _isolated
import pytest


def test_child_reports_result_failure_crash_and_hang():
  assert _isolated.run("builtins:abs", -5) == 5
  with pytest.raises(_isolated.ChildCrashed, match=r"SIGSEGV(.|\n)*example\n  0"):
    _isolated.run("ctypes:string_at", 0)
  with pytest.raises(_isolated.ExampleFailed, match="math domain error"):
    _isolated.run("math:log", 0)
  with pytest.raises(_isolated.ChildHung, match="gave no answer"):
    _isolated.run("time:sleep", 30, timeout=3)
  assert _isolated.run("builtins:abs", -7) == 7  # a new child after the hang


def test_a_saved_example_is_a_test_of_the_same_target(tmp_path, monkeypatch):
  monkeypatch.setattr(_fuzz, "FOUND", tmp_path)
  path = _fuzz.save_found("math:log", 0)
  text = path.read_text()
  assert "EXAMPLE = 0  # noqa: F405\n" in text and "_isolated.run('math:log', EXAMPLE)" in text
  namespace: dict = {}
  exec(compile(text, str(path), "exec"), namespace)
  with pytest.raises(_isolated.ExampleFailed, match="math domain error"):
    namespace["test_found"]()


def test_a_saved_failure_that_passes_alone_is_saved_with_the_examples_before_it(
    tmp_path, monkeypatch):
  """The child runs examples one after another; a failure that needs state
  an earlier example left is saved as the shortest run of examples before it
  that makes it fail again in a fresh child, and that file fails."""
  monkeypatch.setattr(_fuzz, "FOUND", tmp_path)
  monkeypatch.setattr(_fuzz, "FUZZ", True)
  child = _isolated.Child()
  monkeypatch.setattr(_isolated, "_CHILD", child)
  try:
    _fuzz.isolated("_stateful_target:remember", 2)
    with pytest.raises(_isolated.ExampleFailed, match="left behind"):
      _fuzz.isolated("_stateful_target:check", 2)
  finally:
    child.close()
  path, = tmp_path.glob("test_found_*.py")
  assert "EXAMPLE = 2" in path.read_text()
  _fuzz.verify_found()
  text = path.read_text()
  assert "passes on its own" in text and "SEQUENCE = [" in text, text
  namespace: dict = {}
  exec(compile(text, str(path), "exec"), namespace)
  assert namespace["SEQUENCE"] == [("_stateful_target:remember", 2),
                                   ("_stateful_target:check", 2)]
  with pytest.raises(_isolated.ExampleFailed, match="left behind"):
    namespace["test_found"]()


def test_a_saved_failure_that_fails_alone_stays_a_single_example(tmp_path, monkeypatch):
  monkeypatch.setattr(_fuzz, "FOUND", tmp_path)
  monkeypatch.setattr(_fuzz, "FUZZ", True)
  with pytest.raises(_isolated.ExampleFailed, match="whatever ran before"):
    _fuzz.isolated("_stateful_target:always_fails", 7)
  path, = tmp_path.glob("test_found_*.py")
  before = path.read_text()
  _fuzz.verify_found()
  assert path.read_text() == before and "EXAMPLE = 7" in before
