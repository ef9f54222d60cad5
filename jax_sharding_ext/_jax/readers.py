"""JAX's readers of the tables this package edits, made to take a shared lock,
so that `install()` / `uninstall()` swap the tables under the exclusive side
of it (`swapping`) without stopping other threads.

Touches: `pxla.lower_sharding_computation` (every `jax.jit`, `pjit`,
`shard_map` and AOT lowering; called through the module attribute, by
`pjit._resolve_and_lower`) and `pxla.ExecuteReplicated.__call__` (every
execution on jit's Python path, which also starts it with no fast-path
verdict, `dispatch.new_execution`). Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: either name. `HAS_READERS` then turns
False, the edit wraps what it finds, and `tests/test_compat.py` names the
function that moved.

One lowering reads several of the edited tables at different times: it first
checks which ordered effects may be sharded (the effect-type sets), then runs
the lowering rules; run against half-swapped tables it emits HLO that XLA
refuses with an INTERNAL error. An execution with effects takes its input
tokens from `dispatch.runtime_tokens` and hands back its output tokens later.
Both take the shared side of `LOCK` for their duration; a swap takes the
exclusive side, so it waits for the lowerings and executions in flight, and
new ones wait for it for up to `HOLD_BACK` (a swap is a few hundred
microseconds).

The wrappers are put in place by the first `install()` and stay after
`uninstall()`: a lowering that started while the package was uninstalled
must be waited for by the next `install()`, so it must have taken the lock.
Uninstalled, they take and release the lock, and the lowering refuses a
computation the package staged for its own lowering rules (`_needing_install`).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from jax._src import core as _core
from jax._src.interpreters import pxla as _pxla

from jax_sharding_ext._edit import STATE, Edit
from jax_sharding_ext._jax.dispatch import new_execution

HOLD_BACK = 0.05
"""Seconds a waiting exclusive taker holds new shared takers back."""


class SharedExclusiveLock:
  """Many holders of the shared side, or one of the exclusive side.

  A thread that holds the shared side may take it again (a lowering that
  lowers another computation). A waiting exclusive taker holds new shared
  takers back for `HOLD_BACK` seconds, so that a stream of lowerings cannot
  starve a swap; then it lets them in again and takes the exclusive side at
  the first moment nobody holds the shared side. A holder may be waiting for
  another thread's lowering (a host callback that compiles on a thread pool),
  which must not wait for the swap that waits for the holder.
  """

  def __init__(self):
    self._cond = threading.Condition(threading.Lock())
    self._shared = 0
    self._exclusive = False
    self._waiting = 0  # exclusive takers holding new shared takers back
    self._mine = threading.local()

  def acquire_shared(self) -> None:
    depth = getattr(self._mine, "depth", 0)
    with self._cond:
      if depth == 0:
        while self._exclusive or self._waiting:
          self._cond.wait()
      self._shared += 1
    self._mine.depth = depth + 1

  def release_shared(self) -> None:
    self._mine.depth -= 1
    with self._cond:
      self._shared -= 1
      if self._shared == 0:
        self._cond.notify_all()

  def holds_shared(self) -> bool:
    return getattr(self._mine, "depth", 0) > 0

  def acquire_exclusive(self, timeout: float) -> bool:
    """Take the exclusive side; False (nothing taken) after `timeout` seconds."""
    start = time.monotonic()
    deadline, hold_until = start + timeout, start + min(HOLD_BACK, timeout)
    with self._cond:
      self._waiting += 1
      holding = True
      try:
        while self._exclusive or self._shared:
          now = time.monotonic()
          if now >= deadline:
            return False
          if holding and now >= hold_until:  # let the shared takers in again
            holding = False
            self._waiting -= 1
            self._cond.notify_all()
          self._cond.wait((hold_until if holding else deadline) - now)
        self._exclusive = True
        return True
      finally:
        if holding:
          self._waiting -= 1
        self._cond.notify_all()

  def release_exclusive(self) -> None:
    with self._cond:
      self._exclusive = False
      self._cond.notify_all()

  def busy(self) -> int:
    """How many shared holders there are now."""
    with self._cond:
      return self._shared


LOCK = SharedExclusiveLock()

_ExecuteReplicated: Any = getattr(_pxla, "ExecuteReplicated", None)
HAS_READERS = (callable(getattr(_pxla, "lower_sharding_computation", None))
               and _ExecuteReplicated is not None and "__call__" in vars(_ExecuteReplicated))


def _lowering(fn: Any) -> Any:
  """`lower_sharding_computation` under the shared lock; uninstalled, it
  refuses a computation that only the installed package can lower."""
  def wrapper(*args, **kwargs):
    LOCK.acquire_shared()
    try:
      if not STATE.installed:
        staged = _needing_install(args[0] if args else kwargs.get("closed_jaxpr"))
        if staged is not None:
          raise RuntimeError(type(staged).UNINSTALLED_ERROR)
      return fn(*args, **kwargs)
    finally:
      LOCK.release_shared()
  return functools.update_wrapper(wrapper, fn)


def _needing_install(jaxpr: Any) -> Any:
  """The first parameter of an equation of `jaxpr` (or of a jaxpr inside it)
  whose type has an `UNINSTALLED_ERROR`: a value the package staged that only
  its installed lowering rules handle (`sharded_callback`'s callback). Traced
  while installed and lowered after `uninstall()`, such a computation gets
  that error, as staging it uninstalled does, not what stock's lowering makes
  of it (e.g. refusing its ordered effect on several devices)."""
  todo = [getattr(jaxpr, "jaxpr", jaxpr)]
  while todo:
    for eqn in todo.pop().eqns:
      for value in eqn.params.values():
        if getattr(type(value), "UNINSTALLED_ERROR", None):
          return value
      todo.extend(_core.jaxprs_in_params(eqn.params))
  return None


def _shared_if_effects(call: Any) -> Any:
  def __call__(self, *args):
    new_execution()  # no fast-path verdict of an earlier call carries over
    # Executions without effects read no edited table: no lock.
    if not (self.ordered_effects or self.has_unordered_effects or self.has_host_callbacks):
      return call(self, *args)
    LOCK.acquire_shared()
    try:
      return call(self, *args)
    finally:
      LOCK.release_shared()
  return functools.update_wrapper(__call__, call)


class ReadersLockEdit(Edit):
  """Make JAX's lowering and effectful execution take `LOCK`'s shared side.

  Applied by the first `install()`; never taken back (see the module
  docstring), so `revert()` changes nothing.
  """

  name = "pxla readers of the edited tables"
  _wrapped = False

  def _apply(self) -> None:
    if ReadersLockEdit._wrapped or not HAS_READERS:
      return
    _pxla.lower_sharding_computation = _lowering(_pxla.lower_sharding_computation)
    _ExecuteReplicated.__call__ = _shared_if_effects(_ExecuteReplicated.__call__)
    ReadersLockEdit._wrapped = True

  def _revert(self) -> None:
    pass
