"""`install()` / `uninstall()`: apply and revert every capability's edits.

`import jax_sharding_ext` calls `install()`. Installing is idempotent (a second
call changes nothing) and reversible: each edit (`_edit.Edit`) remembers the
entry it replaced, and `uninstall()` puts back exactly the prior contents, in
reverse order. Two things JAX cannot undo stay after `uninstall()`, inert: the
config options this package defines (no handler reads them any more), and
the registrations in JAX's C++ canonicalisation and dispatch registries (their
handlers read `STATE` and act as stock JAX does for an unknown type).

Nothing here touches a device: installing never initialises a backend, so
`jax.distributed.initialize()` can still be called after the import.

Both are safe while other threads use JAX. One lowering reads several of the
tables at different times, so a swap must never land in the middle of one:
`install()` / `uninstall()` first wait until no other thread is lowering a
computation or running one with ordered effects (`_jax.frames`), then swap
every table without letting another thread run Python in between. A call
therefore runs either fully installed or fully uninstalled (where a GDA or a
multi-device ordered effect gets stock JAX's error, or the package's
"uninstalled" one), never against half-swapped tables. A swap that finds
another thread lowering for more than `_SWAP_WAIT_S` seconds raises
`RuntimeError` and changes nothing.
"""

from __future__ import annotations

import sys
import threading
import time

import jax

from jax_sharding_ext._dispatch import handlers, output
from jax_sharding_ext._edit import STATE
from jax_sharding_ext._effects import barrier, lowering, user_effects
from jax_sharding_ext._jax import frames as jax_frames
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
  """Register everything into JAX's tables. Idempotent."""
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
    if _ever_installed:
      _drop_cached_executables()
    _ever_installed = True


def uninstall() -> None:
  """Restore every table this package touched to its exact prior contents."""
  with _lock:
    if not STATE.installed:
      return
    with _no_other_thread_reading_tables("uninstall()"):
      for edit in EDITS:  # refuse before changing anything
        edit.check_revert()
      for edit in reversed(EDITS):
        edit.revert()
      STATE.installed = False
    _drop_cached_executables()


def is_installed() -> bool:
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
_NO_SWITCH_S = 10.0  # the interpreter's thread switch interval during a swap


class _no_other_thread_reading_tables:
  """Wait until no other thread lowers or runs an ordered-effect call, then
  keep every other thread from running Python until the block ends.

  Other threads run Python only when this one blocks or its switch interval
  expires; the swap inside is pure Python that does neither.
  """

  def __init__(self, what: str):
    self.what = what

  def __enter__(self) -> None:
    self.interval = sys.getswitchinterval()
    deadline = time.monotonic() + _SWAP_WAIT_S
    while True:
      sys.setswitchinterval(_NO_SWITCH_S)
      busy = jax_frames.other_threads_reading_tables()
      if not busy:
        return
      sys.setswitchinterval(self.interval)
      if time.monotonic() > deadline:
        raise RuntimeError(
            f"jax_sharding_ext.{self.what} waited {_SWAP_WAIT_S:.0f} s for other "
            f"threads ({busy}) to finish lowering or running JAX computations, "
            "and changed nothing. Call it when no other thread is compiling.")
      time.sleep(0.001)

  def __exit__(self, *exc) -> None:
    sys.setswitchinterval(self.interval)
