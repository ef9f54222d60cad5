"""JAX's runtime tokens: the per-thread tokens that order effects from one
dispatched computation to the next (`jax._src.dispatch.runtime_tokens`), and
the tracked token set this package installs in their place.

Touches: `jax._src.dispatch` (`runtime_tokens`, `RuntimeTokenSet`), token
buffers (`core.Token._buf`), `Sharding._device_assignment`. Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the token set's attributes
(`current_tokens`, `output_runtime_tokens`) or the signature of
`get_token_input`; the effects tests fail naming the token set.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import jax
from jax._src import dispatch as _fx_dispatch

from jax_sharding_ext._edit import Edit, replaced_error
from jax_sharding_ext._jax import transfer as jax_transfer

_lock = threading.RLock()

RuntimeTokenSet: type = type(_fx_dispatch.runtime_tokens)
"""`dispatch.RuntimeTokenSet`: a `threading.local` holding, per thread, the
tokens of the last dispatched computation (`current_tokens` per ordered
effect, `output_runtime_tokens` per device). `jax.effects_barrier()` blocks on
the calling thread's only.

`pxla.ExecuteReplicated` calls `get_token_input(effect, devices)` for the
input token of each ordered effect (the effect's current token, or a fresh
one), then `set_token_result` / `set_output_runtime_token`;
`jax.effects_barrier()` and the `atexit` hook `dispatch.wait_for_tokens` call
`block_until_ready()`, which blocks on every token and then `clear()`s. Same
in jax 0.10.2 and 0.12.x.

Stock flaw, kept by every release so far: when a computation fails after
dispatch (asynchronously: e.g. a raising ordered callback over several
devices), the tokens it returns carry the error for good.
`block_until_ready()` raises before `clear()`, so every later barrier raises
it again (and twice at exit), and `get_token_input` hands the failed token to
the next computation with that effect, which then fails without running.
`TrackedRuntimeTokens` below overrides both."""


def failed_token_error(token: Any) -> BaseException | None:
  """The error of an ordered-effect token whose computation failed, else None.

  `token` is a `core.Token` (a value of `RuntimeTokenSet.current_tokens`),
  whose `_buf` is a `jax.Array`. Never blocks: a token whose computation is
  still running, or that has no buffer, counts as not failed.
  """
  buf = getattr(token, "_buf", None)
  if buf is None or not hasattr(buf, "is_ready") or not buf.is_ready():
    return None
  try:
    buf.block_until_ready()  # ready: returns or raises at once
  except jax.errors.JaxRuntimeError as e:
    return e
  return None


def token_is_ready(token: Any) -> bool:
  """Whether the computation that produced `token` has surely finished (or
  failed). False where jaxlib cannot tell without waiting (the per-device
  tokens of unordered effects have no `is_ready`)."""
  buf = getattr(token, "_buf", None)
  if buf is None or not hasattr(buf, "is_ready"):
    return False
  try:
    return bool(buf.is_ready())
  except jax.errors.JaxRuntimeError:
    return True  # failed: finished


def token_is_on(token: Any, devices: Any) -> bool:
  """Whether `token`'s buffer is live and laid out on `devices`, in order.

  `devices` is what `pxla.ExecuteReplicated` passes to `get_token_input` (its
  local devices); a token returned by a computation on the same devices is
  `NamedSharding(Mesh(devices, 'x'), P('x'))` (several devices) or
  `SingleDeviceSharding` (one), and `execute_sharded` takes its per-device
  buffers as they are. Reads `Sharding._device_assignment` (private; same
  in jax 0.10.2 and 0.12.x).
  """
  buf: Any = getattr(token, "_buf", None)
  try:
    return (not buf.is_deleted()
            and tuple(buf.sharding._device_assignment) == tuple(devices))
  except AttributeError:
    return False


def get_runtime_tokens() -> Any:
  return _fx_dispatch.runtime_tokens


def set_runtime_tokens(tokens: Any) -> None:
  """Swap the object dispatch reads as `dispatch.runtime_tokens`.

  `pxla` and `jax.effects_barrier` look it up as a module attribute at every
  call (jax 0.10.2 and 0.12.x), so a swap takes effect at once.
  """
  _fx_dispatch.runtime_tokens = tokens


_thread_token_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Thread -> that thread's `RuntimeTokenSet` attribute dict (the live one)."""


class TrackedRuntimeTokens(RuntimeTokenSet):
  """JAX's per-thread runtime tokens, also reachable from other threads.

  It also recovers from a failed computation, where the stock token set stays
  broken (see `RuntimeTokenSet`): a barrier reports the failure once
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
      return self._placed_token(eff, devices, *args, **kwargs)
    if token_is_on(token, devices):
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
    if failed_token_error(token) is not None:
      # The computation that produced it has finished, and failed: its
      # effects are over, so program order holds with a fresh token. (A
      # token still running is passed on: if it fails, so does this call.)
      del self.current_tokens[eff]
      self.failed_tokens.append(token)
    return self._placed_token(eff, devices, *args, **kwargs)

  def _placed_token(self, eff, devices, *args, **kwargs):
    """Stock's token for `eff` on `devices`: a new empty one placed on them,
    or the last one moved onto them. JAX's own bookkeeping, not the user's
    data, so the transfer guard does not judge it (stock's guard would call
    placing the first token a host_to_device transfer, and refuse it under
    "disallow")."""
    saved = jax_transfer.suspend_transfer_guards()
    try:
      return super().get_token_input(eff, devices, *args, **kwargs)
    finally:
      jax_transfer.restore_transfer_guards(saved)

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


class RuntimeTokensEdit(Edit):
  """Swap `dispatch.runtime_tokens` for a tracked instance; undo swaps back.

  The calling thread's pending tokens move across both ways. Tokens other
  threads hold in the object being replaced stay there (a thread that
  dispatched ordered effects before `install()` starts a new chain after it).
  A failure set aside by `get_token_input` and not yet raised by a barrier is
  dropped by `uninstall()` (the stock token set has no place for it).
  """

  name = "dispatch.runtime_tokens"

  def __init__(self):
    self._old: Any = None
    self._new: Any = None

  def _apply(self) -> None:
    old = get_runtime_tokens()
    new = TrackedRuntimeTokens()
    new.current_tokens = old.current_tokens
    new.output_runtime_tokens = old.output_runtime_tokens
    self._old, self._new = old, new
    set_runtime_tokens(new)

  def _check_revert(self) -> None:
    if get_runtime_tokens() is not self._new:
      raise replaced_error("`dispatch.runtime_tokens`")

  def _revert(self) -> None:
    self._check_revert()
    self._old.current_tokens = self._new.current_tokens
    self._old.output_runtime_tokens = self._new.output_runtime_tokens
    set_runtime_tokens(self._old)
    self._old = self._new = None


def all_pending_tokens() -> list:
  """The tokens of the effects every thread (this one too) has dispatched
  and no barrier has cleared yet, failures set aside included."""
  with _lock:
    states = list(_thread_token_states.values())
  return [token for state in states
          for token in (*_pending_tokens(state), *tuple(state.get("failed_tokens", ())))]


def other_threads_pending_tokens() -> list:
  """The tokens of the ordered effects every other thread has dispatched."""
  me = threading.current_thread()
  with _lock:
    states = [s for t, s in _thread_token_states.items() if t is not me]
  return [token for state in states for token in _pending_tokens(state)]


def _pending_tokens(state: dict) -> list:
  for _ in range(3):  # the owning thread may be mid-update
    try:
      return [*tuple(state.get("current_tokens", {}).values()),
              *tuple(state.get("output_runtime_tokens", {}).values())]
    except RuntimeError:
      continue
  return []
