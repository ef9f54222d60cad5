"""Run risky examples in a child process, so a crash or a hang is a failure.

A property whose example may kill the process (a SIGSEGV inside XLA, an abort
inside a collective) or hang it runs that example through `run(target,
example)`: a long-lived child Python with the suite's 8 virtual CPU devices
and the package installed imports `target` ("module:function", a module of
`tests/`), calls it with the example and sends back what it returned or what
it raised. The child is reused between examples (one JAX start-up for many
examples) and replaced after it dies.

* The function raised: `run` raises `ExampleFailed` with the child's
  traceback (an `AssertionError` there is the property failing).
* The child died (a signal, `os._exit`): `ChildCrashed`, naming the signal
  and the example, with the tail of the child's output, where `faulthandler`
  has written every thread's stack.
* No answer within `timeout` seconds: the child's stacks are dumped, it is
  killed, and `ChildHung` names the example.

Between examples the child puts back what an example may change globally:
the package installed, the output flag off, no transfer guard.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

TESTS = pathlib.Path(__file__).resolve().parent


class ExampleFailed(AssertionError):
  """The example's function raised in the child (its traceback is the message)."""


class ChildCrashed(AssertionError):
  """The child process died while running an example."""


class ChildHung(AssertionError):
  """The child gave no answer within the timeout."""


def _send(fd: int, obj: Any) -> None:
  data = pickle.dumps(obj)
  data = struct.pack("<Q", len(data)) + data
  while data:
    n = os.write(fd, data)
    data = data[n:]


def _recv_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
  out = b""
  while len(out) < n:
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise TimeoutError
    chunk = os.read(fd, n - len(out))
    if not chunk:
      return None
    out += chunk
  return out


def _recv(fd: int, deadline: float | None = None) -> Any:
  head = _recv_exact(fd, 8, deadline)
  if head is None:
    raise EOFError
  body = _recv_exact(fd, struct.unpack("<Q", head)[0], deadline)
  if body is None:
    raise EOFError
  return pickle.loads(body)


class Child:
  """One child Python that runs examples; see the module docstring."""

  def __init__(self, devices: int = 8):
    self.devices = devices
    self.proc: subprocess.Popen | None = None
    self.log: Any = None
    self.history: list[tuple[str, Any]] = []
    """The `(target, example)`s this child process has run, in order (what
    state an example may have left behind for the next ones)."""

  def _start(self) -> None:
    if self.log is not None:
      self.log.close()
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    self.log = tempfile.TemporaryFile()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env["JSE_TEST_DEVICES"] = str(self.devices)
    self.proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", str(TESTS / "_isolated_child.py"),
         str(to_child_r), str(from_child_w)],
        pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
        stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=str(TESTS.parent))
    os.close(to_child_r)
    os.close(from_child_w)
    self.to_child, self.from_child = to_child_w, from_child_r
    try:
      ready = _recv(self.from_child, time.monotonic() + 120)
    except (EOFError, TimeoutError):
      self._kill()
      raise ChildCrashed(f"the example child did not start:\n{self._tail()}") from None
    assert ready == "ready", ready

  def _tail(self, n: int = 6000) -> str:
    if self.log is None:
      return ""
    self.log.seek(0)
    text = self.log.read().decode(errors="replace")
    return text[-n:]

  def _kill(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    for fd in ("to_child", "from_child"):
      if hasattr(self, fd):
        try:
          os.close(getattr(self, fd))
        except OSError:
          pass
        delattr(self, fd)
    self.proc = None

  def run(self, target: str, example: Any, timeout: float = 120.0) -> Any:
    """Call `target(example)` in the child; return its result (see module doc)."""
    if self.proc is None or self.proc.poll() is not None:
      self._kill()
      self._start()
      self.history = []
    assert self.proc is not None
    self.history.append((target, example))
    self.log.seek(0)
    self.log.truncate()
    try:
      _send(self.to_child, (target, example))
      kind, value = _recv(self.from_child, time.monotonic() + timeout)
    except TimeoutError:
      self.proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack
      time.sleep(1.0)
      tail = self._tail()
      self._kill()
      raise ChildHung(f"{target} gave no answer within {timeout:.0f} s for the "
                      f"example\n  {example!r}\nchild output:\n{tail}") from None
    except (EOFError, BrokenPipeError):
      code = self.proc.wait()
      tail = self._tail()
      self._kill()
      how = (f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
      raise ChildCrashed(f"the child died ({how}) running {target} on the example\n"
                         f"  {example!r}\nchild output:\n{tail}") from None
    if kind == "ok":
      return value
    raise ExampleFailed(f"{target} failed on the example\n  {example!r}\n{value}")

  def close(self) -> None:
    self._kill()
    if self.log is not None:
      self.log.close()
      self.log = None


_CHILD: Child | None = None


def run(target: str, example: Any, timeout: float = 120.0) -> Any:
  """`Child.run` on the shared child of this test process."""
  global _CHILD
  if _CHILD is None:
    _CHILD = Child()
  return _CHILD.run(target, example, timeout)


def history() -> list[tuple[str, Any]]:
  """What the shared child has run since it started (see `Child.history`)."""
  return list(_CHILD.history) if _CHILD is not None else []


def close() -> None:
  global _CHILD
  if _CHILD is not None:
    _CHILD.close()
    _CHILD = None
