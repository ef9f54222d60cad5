"""`install()` / `uninstall()`: every edit this package makes to JAX's tables.

`import jax_sharding_ext` calls `install()`. Installing is idempotent (a second
call changes nothing) and reversible: each edit remembers the entry it
replaced, and `uninstall()` puts back exactly the prior contents, in reverse
order. Two things JAX cannot undo stay after `uninstall()`, inert: the
`jax_parallel_functions_output_gda` config option (no handler reads it any
more), and the C++ canonicalisation entry for `GlobalDeviceArray` (it switches
to raising stock JAX's "not a valid JAX type" error).

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

from jax_sharding_ext._array import gda as _gda
from jax_sharding_ext._dispatch import donation as _donation
from jax_sharding_ext._dispatch import output as _output
from jax_sharding_ext._effects import lowering as _effects
from jax_sharding_ext._jax import dispatch as jax_dispatch
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._notebook import cell_hook as _notebook
from jax_sharding_ext._transfers import moves as _transfer

_lock = threading.RLock()
_edits: list | None = None
_installed = False


class _ResultHandlerEdit(jax_tables.TableEdit):
  """Wraps whatever `ShapedArray` result handler was there before."""

  def apply(self) -> None:
    super().apply()
    _output._wrapped_result_handler = self.prev

  def revert(self) -> None:
    super().revert()
    _output._wrapped_result_handler = None


# ---------------------------------------------------------------------------
# Handlers for JAX's extension tables. Installed by `install()` below.
# ---------------------------------------------------------------------------


def _gda_aval(x: _gda.GlobalDeviceArray):
  return jax_tables.array_aval(x._checked_array("use it in a JAX operation"))


def _gda_shard_arg(xs, shardings, layouts, copy_semantics):
  return _transfer.shard_args(xs, shardings, layouts, copy_semantics)


def _gda_constant_handler(x: _gda.GlobalDeviceArray, aval):
  # Embedding fetches the value to the host: an implicit transfer.
  return _transfer.embed_constant(x, aval)


def _gda_device_put_default(x: _gda.GlobalDeviceArray):
  # `jax.device_put(gda)` keeps a committed array where it is, as for a
  # `jax.Array` (stock returns it unchanged, or copies it in place).
  return x._checked_array("pass it to `jax.device_put`").sharding


def _build_edits() -> list:
  GDA = _gda.GlobalDeviceArray
  return [
      jax_tables.TableEdit("pytype_aval_mappings", jax_tables.pytype_aval_mappings, GDA,
                        _gda_aval),
      jax_tables.TableEdit("shard_arg_handlers", jax_tables.shard_arg_handlers, GDA,
                        _gda_shard_arg),
      jax_tables.CanonicalizeEdit(GDA),
      jax_tables.TableEdit("mlir constant handlers", jax_tables.constant_handlers, GDA,
                        _gda_constant_handler),
      _ResultHandlerEdit("global_result_handlers", jax_tables.global_result_handlers,
                         jax_tables.ShapedArray, _output.result_handler),
      jax_dispatch.DispatchNodeEdit(GDA, _donation.dispatch_flatten, _gda._rebuild),
      jax_tables.DevicePutDefaultEdit(GDA, _gda_device_put_default),
      *_effects.table_edits(),
      _notebook.IPythonHookEdit(),
      jax_tracebacks.TracebackExclusionEdit(),
  ]


def install() -> None:
  """Register everything into JAX's tables. Idempotent."""
  global _edits, _installed
  with _lock:
    if _installed:
      return
    reinstall = _edits is not None
    if _edits is None:
      _edits = _build_edits()
    with _no_other_thread_reading_tables("install()"):
      done = []
      try:
        for edit in _edits:
          edit.apply()
          done.append(edit)
      except BaseException:
        for edit in reversed(done):
          edit.revert()
        raise
    _installed = True
    if reinstall:
      _drop_cached_executables()


def uninstall() -> None:
  """Restore every table this package touched to its exact prior contents."""
  global _installed
  with _lock:
    if not _installed:
      return
    with _no_other_thread_reading_tables("uninstall()"):
      for edit in reversed(_edits):
        edit.revert()
    _installed = False
    _drop_cached_executables()


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


def _drop_cached_executables() -> None:
  # A compiled executable keeps the result handlers it was built with, so one
  # compiled while installed would keep returning GDAs after `uninstall()`
  # (and the reverse after a re-install). The first install needs no clearing:
  # nothing was compiled with this package's handlers yet.
  jax.clear_caches()


def is_installed() -> bool:
  return _installed
