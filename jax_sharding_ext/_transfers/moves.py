"""The one place where a GlobalDeviceArray's data moves.

Every transfer a `GlobalDeviceArray` makes goes through a function here:

* `place_host_shards`: host data from the `from_callback` /
  `from_batched_callback` constructors onto the local devices (explicit,
  host_to_device; device_to_device for a callback value that is a
  `jax.Array` on another device);
* `shard_args`: the `shard_arg_handlers` entry, used by `jax.jit` arguments
  (no copy when the sharding already matches: not a transfer; implicit
  device_to_device when it reshards) and by `jax.device_put` (explicit;
  device_to_device when it reshards or copies);
* `to_host` / `start_host_copy`: `np.asarray(gda)` / `gda.copy_to_host_async()`
  (implicit) and `jax.device_get(gda)` (explicit), device_to_host;
* `embed_constant`: a GDA closed over by a jitted function is fetched and
  embedded as a constant (implicit, device_to_host).

`from_jax_array` / `to_jax_array` hand the same device buffers over and are
not transfers, so they do not come through here; neither does
`from_batched_callback_with_devices`, whose callback places the data itself
(with `jax.device_put`, which stock JAX guards).

Transfer guard. Each transfer is classified (direction; explicit when made
inside `jax.device_put` / `jax.device_get`, as jaxlib decides, and always for
the `from_callback` family) and judged against JAX's own guard state for that
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
`jax_sharding_ext` logger whose record points at the user's call. Fetching
from CPU devices is always allowed (seed rule; stock jaxlib applies it to
every fetch in jax 0.10.2 but not to multi-device arrays in jax 0.12, see
`jax_transfer.JAXLIB_GUARDS_CPU_FETCH`). Once judged, the move runs
with jaxlib's own guard suspended on this thread, so a transfer is judged and
logged once, under this module's classification (jaxlib would judge the
inner steps differently: on CPU it fetches a reshard through the host and
calls it host_to_device, and it calls `from_callback` placement implicit).

As in stock JAX, a fetched value is kept on the host: the first of
`copy_to_host_async()` / `np.asarray` / `jax.device_get` on a GDA is the
transfer, later fetches read the host copy and are not transfers.

Ledger. With a `transfer_ledger()` open on this thread, each transfer that
completes adds one `TransferRecord` (see `_ledger.py`); with none open the
cost is one module-global read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jax_sharding_ext._dispatch import donation as _donation
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import transfer as jax_transfer
from jax_sharding_ext._transfers import ledger as _ledger

logger = logging.getLogger("jax_sharding_ext")
"""Where "log" guard levels report GDA transfers (level WARNING)."""


def place_host_shards(shape, dtype, sharding, values: Sequence[Any], devices: Sequence[Any]):
  """Place one value per local device (host or device data) as one `jax.Array`.

  An explicit transfer (the `from_callback` family): host values are
  host_to_device, a `jax.Array` value on another device is device_to_device,
  one already on its device does not move.
  """
  if _all_host_data(values):  # the usual case: numpy data from the callback
    h2d, d2d = range(len(values)), ()
  else:
    h2d = [i for i, v in enumerate(values) if not isinstance(v, jax.Array)]
    d2d = [i for i, v in enumerate(values)
           if isinstance(v, jax.Array) and not _already_on(v, devices[i])]
  recording = _ledger._open_count
  levels = []
  for direction, idx in ((H2D, h2d), (D2D, d2d)):
    if idx:
      level = jax_transfer.transfer_guard_level(direction)
      if level != "allow" or recording:
        levels.append((direction, idx, level))
  if not levels:
    # Nothing to judge, log or record, and jaxlib (which would call this
    # placement implicit) has nothing to judge either.
    return jax_tables.batched_device_put(shape, dtype, sharding, values, devices)
  itemsize = np.dtype(dtype).itemsize
  moves = []
  for direction, idx, level in levels:
    action = _ACTIONS[level][True]
    if action == "allow" and not recording:
      continue  # suspended below all the same: jaxlib would judge it implicit
    src = () if direction == H2D else tuple(
        d for i in idx for d in _devices_of(values[i]))
    moves.append(_Move(direction, True, shape, dtype,
                       sum(math.prod(np.shape(values[i])) for i in idx) * itemsize,
                       src, tuple(devices[i] for i in idx), action))
  _judge(moves)
  saved = jax_transfer.suspend_transfer_guards()
  try:
    out = jax_tables.batched_device_put(shape, dtype, sharding, values, devices)
  finally:
    jax_transfer.restore_transfer_guards(saved)
  if recording:
    _record(moves)
  return out


def _all_host_data(values: Sequence[Any]) -> bool:
  """True when no value is a `jax.Array`: one subclass test per distinct type,
  not one `isinstance` (an ABC check, ~0.13 us) per device."""
  return not any(issubclass(t, jax.Array) for t in set(map(type, values)))


def shard_args(gdas, shardings, layouts, copy_semantics):
  """Hand GDAs to a computation; stock JAX reshards only where it must."""
  arrays = [g._checked_array("pass it to a JAX computation") for g in gdas]
  _donation.check_donated_args(gdas)  # f(donate(x), x): refuse before anything runs
  moving = _moving_args(arrays, shardings, layouts, copy_semantics)
  if not moving:  # the common `jax.jit` case: the buffers are handed over as is
    return jax_tables.array_shard_arg(arrays, shardings, layouts, copy_semantics)
  if jax_frames.in_aot_call():
    raise _aot_mismatch_error(arrays, shardings, moving)
  return _reshard(arrays, shardings, layouts, copy_semantics, moving)


def _aot_mismatch_error(arrays, shardings, moving) -> ValueError:
  """Stock's error for a compiled executable called with other shardings.

  `MeshExecutable.call` raises it for a committed `jax.Array` whose sharding
  is not equivalent to the compiled one; a GDA is always committed.
  """
  lines = [f"GlobalDeviceArray argument with shape {arrays[i].shape}:\n"
           f"  Passed sharding: {arrays[i].sharding}\n  Required sharding: {shardings[i]}"
           for i in moving]
  return ValueError(
      # The GDA-era text first: GDA-era tests match on it.
      "GDA sharding does not match the input sharding. "
      "Computation was compiled for input shardings that disagree with the "
      f"shardings of arguments passed to it. Here are the {len(lines)} "
      "mismatches:\n" + "\n".join(lines) + "\nReshard the argument first "
      "(`jax.device_put(gda, sharding)`), or lower and compile for its sharding.")


def to_host(gda, dtype=None) -> np.ndarray:
  """Gather the global value of a fully addressable GDA as numpy."""
  arr = gda._checked_array("fetch it to the host")
  if gda._host_fetched:  # the value is already on the host: nothing moves
    return np.asarray(arr, dtype=dtype)
  if not arr.sharding.is_fully_addressable:
    raise RuntimeError(
        f"Cannot convert {gda} to numpy: it spans devices of other processes "
        "(it is not fully addressable). Use "
        "`jax.experimental.multihost_utils.process_allgather(gda.to_jax_array(), "
        "tiled=True)` to gather the global value on every process, or read "
        "`gda.local_shards`.")
  return _fetch(gda, arr, lambda: np.asarray(arr, dtype=dtype))


def start_host_copy(gda) -> None:
  """`gda.copy_to_host_async()`: start the device_to_host transfer."""
  arr = gda._checked_array("fetch it to the host")
  if not arr.sharding.is_fully_addressable:  # local shards only; jaxlib guards each buffer
    arr.copy_to_host_async()
  elif not gda._host_fetched:
    _fetch(gda, arr, arr.copy_to_host_async)


def embed_constant(gda, aval):
  """A GDA closed over by a jitted function: fetched to the host and embedded.

  Stock JAX's constant handler reads the array's value, an implicit
  device_to_host transfer (jaxlib guards it for a `jax.Array` too).
  """
  arr = gda._checked_array("embed it as a constant")
  if gda._host_fetched or not arr.sharding.is_fully_addressable:
    return jax_tables.array_constant_handler(arr, aval)
  return _fetch(gda, arr, lambda: jax_tables.array_constant_handler(arr, aval))


# ---------------------------------------------------------------------------
# Classification, guard decision, logging, recording.
# ---------------------------------------------------------------------------

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

def guard_action(direction: str, explicit: bool) -> str:
  """What JAX's guard says about a transfer now: "allow", "log" or "disallow"."""
  return _ACTIONS[jax_transfer.transfer_guard_level(direction)][explicit]


class _Move:
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


def _judge(moves) -> None:
  """Raise for the first disallowed move (nothing has moved yet), then log."""
  for m in moves:
    if m.action == "disallow":
      raise _disallowed_error(m)
  for m in moves:
    if m.action == "log":
      _log(m)


def _record(moves) -> None:
  # The record keeps the call site; its text is built when first read.
  for m in moves:
    _ledger.add(m.direction, m.explicit, m.nbytes, m.shape, m.dtype, m.src, m.dst, m.site())


def _moving_args(arrays, shardings, layouts, copy_semantics) -> list[int] | None:
  """Indices of the arguments whose buffers `_array_shard_arg` would copy.

  Mirrors stock: same placement (`_sharding_indices_and_eq`, same device
  order) and layout with `REUSE_INPUT` hands the buffers over; anything else
  copies, and jaxlib guards it as device_to_device (even a copy onto the same
  devices). Returns None when nothing moves (the common `jax.jit` case, kept
  to a few attribute reads per argument).
  """
  moving = None
  reuse = jax_transfer.REUSE_INPUT
  for i in range(len(arrays)):
    a, s, layout, cs = arrays[i], shardings[i], layouts[i], copy_semantics[i]
    src = a.sharding
    if cs is reuse and layout is None and (src is s or src == s):
      continue
    if not a.is_fully_addressable:
      continue  # cannot move; stock raises its own NotImplementedError
    if (cs is not reuse
        or (layout is not None and a.format.layout != layout)
        or not jax_transfer.same_shard_placement(src, s, a.shape)):
      if moving is None:
        moving = []
      moving.append(i)
  return moving


def _reshard(arrays, shardings, layouts, copy_semantics, moving):
  level, explicit = jax_transfer.transfer_guard_query(D2D, "explicit_device_put")
  action = _ACTIONS[level][explicit]
  recording = _ledger._open_count
  moves = []
  if action != "allow" or recording:
    for i in moving:
      a, s = arrays[i], shardings[i]
      dst = tuple(s.addressable_devices_indices_map(a.shape))
      nbytes = math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize * len(dst)
      m = _Move(D2D, explicit, a.shape, a.dtype, nbytes,
                tuple(a.sharding.addressable_devices_indices_map(a.shape)), dst, action)
      # A donation onto the same placement is guarded by jaxlib but writes no
      # new buffer: judged, not recorded.
      in_place = (copy_semantics[i] != jax_transfer.ALWAYS_COPY
                  and (layouts[i] is None or a.format.layout == layouts[i])
                  and jax_transfer.same_shard_placement(a.sharding, s, a.shape))
      moves.append((m, in_place))
    _judge([m for m, _ in moves])
  saved = jax_transfer.suspend_transfer_guards()
  try:
    out = jax_tables.array_shard_arg(arrays, shardings, layouts, copy_semantics)
  finally:
    jax_transfer.restore_transfer_guards(saved)
  if recording:
    _record([m for m, in_place in moves if not in_place])
  return out


def _fetch(gda, arr, move):
  """Judge, run and record `move`, the fetch of `gda`'s value to the host."""
  level, explicit = jax_transfer.transfer_guard_query(D2H, "explicit_device_get")
  action = _ACTIONS[level][explicit]
  judged = action != "allow"  # the guard level acts on this fetch
  # Seed rule: fetching from CPU devices is always allowed, so no level
  # applies there.
  if judged and _fetch_always_allowed(arr):
    action = "allow"
  recording = _ledger._open_count
  m = None
  if action != "allow":
    m = _Move(D2H, explicit, arr.shape, arr.dtype, gda.nbytes, _devices_of(arr), (), action)
    _judge((m,))
  if judged:
    # Judged here, so jaxlib must not judge it again: on "log" it would log a
    # second line, and where the CPU rule allowed the fetch, jax 0.12's
    # batched host copy would still guard it (`jax_transfer.JAXLIB_GUARDS_CPU_FETCH`).
    saved = jax_transfer.suspend_transfer_guards()
    try:
      out = move()
    finally:
      jax_transfer.restore_transfer_guards(saved)
  else:
    out = move()
  gda._host_fetched = True
  if recording:
    if m is None:  # the usual case: only the ledger needs to know
      _ledger.add(D2H, explicit, gda.nbytes, arr.shape, arr.dtype, _devices_of(arr), (),
                  jax_frames.user_call_site())
    else:
      _record((m,))
  return out


def _fetch_always_allowed(arr) -> bool:
  """True when `arr` lives on CPU devices (tests patch this to act as a GPU)."""
  return jax_transfer.sharding_platform(arr.sharding) == "cpu"


def _already_on(v, device) -> bool:
  """`pxla.batched_device_put`'s test for a value that needs no copy."""
  s = v.sharding
  return s.num_devices == 1 and device in s.device_set


def _devices_of(v) -> tuple:
  return tuple(v.sharding.addressable_devices_indices_map(v.shape))


def _where(devices) -> str:
  if not devices:
    return "host"
  ids = [d.id for d in devices]
  return f"{devices[0].platform} devices {ids}" if len(ids) > 1 else str(devices[0])


def _guard_fn(direction: str) -> str:
  return f"jax.transfer_guard_{direction}"


def _log(m: _Move) -> None:
  if not logger.isEnabledFor(logging.WARNING):
    return
  site = m.site()
  kind = "explicit" if m.explicit else "implicit"
  msg = (f"{m.direction.replace('_', '-')} transfer ({kind}): {m.describe()}, at "
         f"{_ledger.site_text(site)}")
  if site is None:
    logger.warning(msg)
    return
  # The record points at the user's call, not at this module.
  record = logger.makeRecord(logger.name, logging.WARNING, site.filename, site.lineno,
                             msg, (), None, site.function)
  logger.handle(record)


def _disallowed_error(m: _Move) -> Exception:
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
      f"{m.describe()} ({kind}, at {_ledger.site_text(m.site())}). The transfer guard level "
      f"for {m.direction} is {level!r}, which disallows {which}. Nothing was "
      f"transferred and the array is unchanged; {fix}. See "
      "https://docs.jax.dev/en/latest/transfer_guard.html")
