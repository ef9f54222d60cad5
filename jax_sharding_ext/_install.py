"""`install()` / `uninstall()`: apply and revert every capability's edits.

`import jax_sharding_ext` calls `install()`. Installing is idempotent (a second
call changes nothing) and reversible: each edit (`_edit.Edit`) remembers the
entry it replaced, and `uninstall()` puts back exactly the prior contents, in
reverse order. Things JAX cannot undo stay after `uninstall()`, inert: the
config options this package defines (no handler reads them any more), the
registrations in JAX's C++ canonicalisation and dispatch registries (their
handlers read `STATE` and act as stock JAX does for an unknown type), and the
shared lock that JAX's lowering and effectful execution take (`_jax/readers.py`).

Nothing here touches a device: installing never initialises a backend, so
`jax.distributed.initialize()` can still be called after the import.

Both are safe while other threads use JAX. One lowering reads several of the
tables at different times, so a swap must never land in the middle of one:
lowerings and executions with effects hold the shared side of
`jax_readers.LOCK`, and a swap holds its exclusive side, so it waits for
those in flight and new ones wait for it. A call therefore runs either fully
installed or fully uninstalled (where a GDA or a multi-device ordered effect
gets stock JAX's error, or the package's "uninstalled" one), never against
half-swapped tables. A swap that waits more than `_SWAP_WAIT_S` seconds
raises `RuntimeError` and changes nothing; so does one called from inside a
lowering or a host callback (it would wait for itself).
"""

from __future__ import annotations

import threading

import jax

from jax_sharding_ext._dispatch import handlers, output
from jax_sharding_ext._edit import STATE
from jax_sharding_ext._effects import barrier, lowering, user_effects
from jax_sharding_ext._jax import dispatch as jax_dispatch
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import readers as jax_readers
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._notebook import cell_hook

_lock = threading.RLock()

EDITS = [
    *handlers.EDITS,  # GlobalDeviceArray in JAX's tables
    *output.EDITS,  # the output flag's result handler
    *lowering.EDITS,  # ordered debug effects over several devices
    *barrier.EDITS,  # every thread's runtime tokens
    *user_effects.EDITS,  # effects declared with `declare_effect` / `mark_shardable`
    *cell_hook.EDITS,  # the end-of-cell barrier under IPython
    *jax_tracebacks.EDITS,  # the package's frames filtered from tracebacks
]
"""Every edit of every capability (each module lists its own in `EDITS`, next
to the handlers they register), in the order `install()` applies them."""

_ever_installed = False


def install() -> None:
  """Register everything into JAX's tables. Idempotent.

  `import jax_sharding_ext` calls it; call it again to undo `uninstall()`.
  It initialises no JAX backend.

  Example:
    >>> uninstall()
    >>> install()
    >>> install()   # a second call changes nothing
    >>> is_installed()
    True
  """
  global _ever_installed
  with _lock:
    if STATE.installed:
      return
    with _no_other_thread_reading_tables("install()"):
      done = []
      try:
        for edit in EDITS:
          edit.apply()
          done.append(edit)
      except BaseException:
        for edit in reversed(done):
          edit.revert()
        raise
      STATE.installed = True
      jax_dispatch.open_gate(True)
    if _ever_installed:
      _drop_cached_executables()
    _ever_installed = True


def uninstall() -> None:
  """Restore every table this package touched to its exact prior contents.

  Idempotent. Afterwards, passing a GDA to JAX raises `RuntimeError` saying
  the package is uninstalled; `install()` makes it work again. A config
  option it defined stays defined, with no effect.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
    ...                                       lambda index: np.zeros(8)[index])
    >>> uninstall()
    >>> jax.jit(lambda x: x + 1)(gda)
    Traceback (most recent call last):
    RuntimeError: ...uninstalled...
    >>> install()
    >>> jax.jit(lambda x: x + 1)(gda).shape
    (8,)
  """
  with _lock:
    if not STATE.installed:
      return
    with _no_other_thread_reading_tables("uninstall()"):
      for edit in EDITS:  # refuse before changing anything
        edit.check_revert()
      # Uninstalled before the first table changes, as installed only after
      # the last: a call that meets a half-swapped table on another thread
      # (its Python path reads tables outside the lock) gets the package's
      # "uninstalled" error from the handlers that read `STATE`.
      STATE.installed = False
      jax_dispatch.open_gate(False)
      for edit in reversed(EDITS):
        edit.revert()
    _drop_cached_executables()


def is_installed() -> bool:
  """Return whether this package's handlers are in JAX's tables now.

  True after `import jax_sharding_ext` and `install()`, False after
  `uninstall()`.

  Example:
    >>> is_installed()
    True
    >>> uninstall()
    >>> is_installed()
    False
    >>> install()
  """
  return STATE.installed


def _drop_cached_executables() -> None:
  # The one place this package clears JAX's caches. A compiled executable
  # keeps the result handlers and lowering rules it was built with, so one
  # compiled while installed would keep returning GDAs and running its
  # ordered effects after `uninstall()` (and the reverse after a
  # re-install), instead of raising stock JAX's error. The first install
  # needs no clearing: nothing was compiled with this package's handlers yet.
  # Public, and initialises no backend.
  jax.clear_caches()


_SWAP_WAIT_S = 60.0


class _no_other_thread_reading_tables:
  """Hold the exclusive side of the lock JAX's table readers share."""

  def __init__(self, what: str):
    self.what = what

  def __enter__(self) -> None:
    _READERS.apply()  # before the first swap: from then on readers take the lock
    if jax_readers.LOCK.holds_shared() or jax_frames.in_host_callback():
      raise RuntimeError(
          f"jax_sharding_ext.{self.what} was called from inside a JAX lowering or a "
          "host callback, which the swap would have to wait for; nothing was "
          "changed. Call it outside JAX computations.")
    if not jax_readers.LOCK.acquire_exclusive(_SWAP_WAIT_S):
      raise RuntimeError(
          f"jax_sharding_ext.{self.what} waited {_SWAP_WAIT_S:.0f} s for "
          f"{jax_readers.LOCK.busy()} lowering(s) or computation(s) with effects on "
          "other threads to finish, and changed nothing. Call it when no other "
          "thread is compiling.")

  def __exit__(self, *exc) -> None:
    jax_readers.LOCK.release_exclusive()


_READERS = jax_readers.ReadersLockEdit()
