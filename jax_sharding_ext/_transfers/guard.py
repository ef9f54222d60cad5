"""The transfer guard for GDA transfers: classify, judge, log, record.

Each transfer is classified (direction; explicit when made inside
`jax.device_put` / `jax.device_get`, as jaxlib decides, and always for the
`from_callback` family) and judged against JAX's own guard state for that
direction, read exactly where jaxlib reads it (thread-local level, else the
global option, else "allow"), with jaxlib's level table:

=================== ======== ========
level               implicit explicit
=================== ======== ========
allow               allow    allow
log                 log      allow
disallow            raise    allow
log_explicit        log      log
disallow_explicit   raise    raise
=================== ======== ========

A disallowed transfer raises `jax.errors.JaxRuntimeError` (a `RuntimeError`,
the type stock JAX raises) before anything moves; "log" logs a warning on the
`jax_sharding_ext` logger whose record points at the user's call. Once
judged, the move runs with jaxlib's own guard suspended on this thread
(`guarded`), so a transfer is judged and logged once, under this
classification (jaxlib would judge the inner steps differently: on CPU it
fetches a reshard through the host and calls it host_to_device, and it calls
`from_callback` placement implicit).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import jax
import numpy as np

from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import transfer as jax_transfer
from jax_sharding_ext._transfers import ledger

logger = logging.getLogger("jax_sharding_ext")
"""Where "log" guard levels report GDA transfers (level WARNING)."""

H2D, D2D, D2H = jax_transfer.TRANSFER_DIRECTIONS

_ACTIONS: dict[str, tuple[str, str]] = {
    # level: (action for an implicit transfer, for an explicit one); jaxlib's
    # `GetTransferGuardAction` table.
    "allow": ("allow", "allow"),
    "log": ("log", "allow"),
    "disallow": ("disallow", "allow"),
    "log_explicit": ("log", "log"),
    "disallow_explicit": ("disallow", "disallow"),
}


def action(level: str, explicit: bool) -> str:
  """What the guard `level` says about a transfer: "allow", "log" or "disallow"."""
  return _ACTIONS[level][explicit]


class Move:
  """One classified transfer of one GDA (or one direction of a placement)."""

  __slots__ = ("direction", "explicit", "shape", "dtype", "nbytes", "src", "dst", "action",
               "_site")

  def __init__(self, direction, explicit, shape, dtype, nbytes, src, dst, action):
    self.direction = direction
    self.explicit = explicit
    self.shape = tuple(shape)
    self.dtype = np.dtype(dtype)
    self.nbytes = int(nbytes)
    self.src = src
    self.dst = dst
    self.action = action
    self._site = None

  def site(self) -> jax_frames.CallSite | None:
    """The user's call that made this transfer (found once, kept)."""
    if self._site is None:
      self._site = jax_frames.user_call_site()
    return self._site

  def describe(self) -> str:
    return (f"GlobalDeviceArray(shape={self.shape}, dtype={self.dtype}), "
            f"{self.nbytes} bytes from {_where(self.src)} to {_where(self.dst)}")


class guarded:
  """`with guarded(moves):` the one sequence every guarded transfer runs.

  On entry, judge `moves` (raise for the first disallowed one, before
  anything moves; then log); run the block with jaxlib's own guard suspended
  on this thread (as JAX's `explicit_device_put_scope` scopes a
  `jax.device_put`); on a clean exit, record `recorded` (default: `moves`)
  in the transfer ledgers open on this thread. A block that raises records
  nothing.
  """

  __slots__ = ("moves", "recorded", "saved")

  def __init__(self, moves: Sequence[Move], recorded: Sequence[Move] | None = None):
    self.moves = moves
    self.recorded = moves if recorded is None else recorded

  def __enter__(self) -> None:
    for m in self.moves:
      if m.action == "disallow":
        raise _disallowed_error(m)
    for m in self.moves:
      if m.action == "log":
        _log(m)
    self.saved = jax_transfer.suspend_transfer_guards()

  def __exit__(self, typ, value, tb) -> None:
    jax_transfer.restore_transfer_guards(self.saved)
    if typ is None and ledger.OPEN:
      for m in self.recorded:
        # The record keeps the call site; its text is built when first read.
        ledger.add(m.direction, m.explicit, m.nbytes, m.shape, m.dtype, m.src, m.dst,
                   m.site())


def _where(devices) -> str:
  if not devices:
    return "host"
  ids = [d.id for d in devices]
  return f"{devices[0].platform} devices {ids}" if len(ids) > 1 else str(devices[0])


def _guard_fn(direction: str) -> str:
  return f"jax.transfer_guard_{direction}"


def _log(m: Move) -> None:
  if not logger.isEnabledFor(logging.WARNING):
    return
  site = m.site()
  kind = "explicit" if m.explicit else "implicit"
  msg = (f"{m.direction.replace('_', '-')} transfer ({kind}): {m.describe()}, at "
         f"{ledger.site_text(site)}")
  if site is None:
    logger.warning(msg)
    return
  # The record points at the user's call, not at this module.
  record = logger.makeRecord(logger.name, logging.WARNING, site.filename, site.lineno,
                             msg, (), None, site.function)
  logger.handle(record)


def _disallowed_error(m: Move) -> Exception:
  level = jax_transfer.transfer_guard_level(m.direction)
  kind = "explicit" if m.explicit else "implicit"
  which = "all transfers" if level == "disallow_explicit" else "implicit transfers"
  if m.explicit:
    fix = (f"allow it around this call with `with {_guard_fn(m.direction)}(\"allow\"):`")
  elif m.direction == D2H:
    fix = ("fetch it explicitly with `jax.device_get(x)`, or allow it with "
           f"`with {_guard_fn(m.direction)}(\"allow\"):`")
  else:
    fix = ("reshard it explicitly first with `jax.device_put(x, sharding)`, or allow it "
           f"with `with {_guard_fn(m.direction)}(\"allow\"):`")
  # Same type and message prefix as jaxlib's own guard error.
  return jax.errors.JaxRuntimeError(
      f"INVALID_ARGUMENT: Disallowed {m.direction.replace('_', '-')} transfer: "
      f"{m.describe()} ({kind}, at {ledger.site_text(m.site())}). The transfer guard level "
      f"for {m.direction} is {level!r}, which disallows {which}. Nothing was "
      f"transferred and the array is unchanged; {fix}. See "
      "https://docs.jax.dev/en/latest/transfer_guard.html")
