"""`effects_barrier()`: wait for the effects every thread has dispatched.

`jax.effects_barrier()` waits only for the calling thread's runtime tokens
(`dispatch.runtime_tokens` is a `threading.local`). On `install()` it is
replaced by a `_TrackedRuntimeTokens` instance that also records each
thread's state, so `effects_barrier()` can wait for every thread's pending
ordered effects too. `uninstall()` puts the original back.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import jax

from jax_sharding_ext._jax import effects as jax_effects
from jax_sharding_ext._jax import frames as jax_frames

_lock = threading.RLock()

# ---------------------------------------------------------------------------
# effects_barrier: every thread's tokens.
# ---------------------------------------------------------------------------

_thread_token_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Thread -> that thread's `RuntimeTokenSet` attribute dict (the live one)."""


class _TrackedRuntimeTokens(jax_effects.RuntimeTokenSet):
  """JAX's per-thread runtime tokens, also reachable from other threads.

  It also recovers from a failed computation, where the stock token set stays
  broken (see `jax_effects.RuntimeTokenSet`): a barrier reports the failure once
  and starts over, and an ordered effect whose last token is known to have
  failed starts a new token chain instead of inheriting the error.
  """

  def __init__(self):
    super().__init__()
    # Tokens of failed computations taken out of `current_tokens` by
    # `get_token_input`, kept so that the next barrier reports their error.
    self.failed_tokens = []
    # For a `threading.local`, `__init__` runs once in each thread that uses
    # it, and `self.__dict__` is that thread's attribute dict; `clear()`
    # rebinds attributes inside that same dict.
    with _lock:
      _thread_token_states[threading.current_thread()] = self.__dict__

  def get_token_input(self, eff, devices, *args, **kwargs):
    token = self.current_tokens.get(eff)
    if token is None:
      return super().get_token_input(eff, devices, *args, **kwargs)
    if jax_effects.token_is_on(token, devices):
      # Stock waits for the previous computation's token, then places a
      # fresh empty token on every device (`_token_shard_arg`: a
      # `device_put` of 8 host values, then `make_array_...` of the result:
      # ~110 us of 8-device calls). The token it waited for is already there:
      # pass it on after the same wait. The wait stays: handing XLA CPU a
      # token still being computed lets devices start the next call at
      # different times, and collectives in it deadlock (measured: the
      # all-reduce rendezvous waits forever for the devices that lag).
      try:
        token.block_until_ready()
      except jax.errors.JaxRuntimeError:
        pass  # failed: set aside below, like a failure seen without waiting
      else:
        return token
    if jax_effects.failed_token_error(token) is not None:
      # The computation that produced it has finished, and failed: its
      # effects are over, so program order holds with a fresh token. (A
      # token still running is passed on: if it fails, so does this call.)
      del self.current_tokens[eff]
      self.failed_tokens.append(token)
    return super().get_token_input(eff, devices, *args, **kwargs)

  def clear(self):
    super().clear()
    self.failed_tokens = []

  def block_until_ready(self):
    """Wait for every token; raise the first failure once, then start over."""
    error = None
    for token in [*self.failed_tokens, *self.current_tokens.values(),
                  *self.output_runtime_tokens.values()]:
      try:
        token.block_until_ready()
      except jax.errors.JaxRuntimeError as e:
        error = error or e
    self.clear()
    if error is not None:
      raise error


class _RuntimeTokensEdit:
  """Swap `dispatch.runtime_tokens` for a tracked instance; undo swaps back.

  The calling thread's pending tokens move across both ways. Tokens other
  threads hold in the object being replaced stay there (a thread that
  dispatched ordered effects before `install()` starts a new chain after it).
  A failure set aside by `get_token_input` and not yet raised by a barrier is
  dropped by `uninstall()` (the stock token set has no place for it).
  """

  name = "dispatch.runtime_tokens"

  def __init__(self):
    self.applied = False
    self._old: Any = None
    self._new: Any = None

  def apply(self) -> None:
    if self.applied:
      return
    old = jax_effects.get_runtime_tokens()
    new = _TrackedRuntimeTokens()
    new.current_tokens = old.current_tokens
    new.output_runtime_tokens = old.output_runtime_tokens
    self._old, self._new = old, new
    jax_effects.set_runtime_tokens(new)
    self.applied = True

  def revert(self) -> None:
    if not self.applied:
      return
    if jax_effects.get_runtime_tokens() is not self._new:
      raise RuntimeError(
          "Cannot uninstall jax_sharding_ext: `dispatch.runtime_tokens` was "
          "replaced by someone else after jax_sharding_ext installed it. "
          "Uninstall the other extension first.")
    self._old.current_tokens = self._new.current_tokens
    self._old.output_runtime_tokens = self._new.output_runtime_tokens
    jax_effects.set_runtime_tokens(self._old)
    self._old = self._new = None
    self.applied = False


def _pending_tokens(state: dict) -> list:
  for _ in range(3):  # the owning thread may be mid-update
    try:
      return [*tuple(state.get("current_tokens", {}).values()),
              *tuple(state.get("output_runtime_tokens", {}).values())]
    except RuntimeError:
      continue
  return []


def effects_barrier() -> None:
  """Wait until every effect already dispatched, on every device, has run.

  `jax.effects_barrier()` waits for the effects dispatched by the calling
  thread (and raises if one of them failed). This also waits for those
  dispatched by every other thread; their failures are left for those
  threads' own barriers.

  A failure is reported once: the barrier that raises it also forgets it, and
  later ordered effects start afresh (after an asynchronous failure on
  several devices, stock JAX raises it at every barrier and fails every later
  computation with the same ordered effect).
  """
  if jax_frames.in_host_callback():
    # Called from inside a host callback: the computation running it cannot
    # finish first, so wait only for what stock's barrier waits for there
    # (this thread's own effects: none).
    jax.effects_barrier()
    return
  try:
    jax.effects_barrier()
  finally:  # this thread's failure is raised after the wait, not instead
    me = threading.current_thread()
    with _lock:
      states = [(t, s) for t, s in _thread_token_states.items() if t is not me]
    for _, state in states:
      for token in _pending_tokens(state):
        try:
          token.block_until_ready()
        except jax.errors.JaxRuntimeError:
          pass  # reported to the thread that dispatched it
