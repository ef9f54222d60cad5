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
