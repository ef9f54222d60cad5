"""What `_transfers/` needs to apply JAX's transfer guard to GDA transfers.

Touches: `jax._src.lib.guard_lib` (levels, thread-local and global guard
state), `jax._src.lib.xla_client` (`ArrayCopySemantics`), `jax._src.array`
(sharding comparison helpers), `jax._src.lib` (jaxlib version). Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the guard-state field names
(`host_to_device`, `device_to_device`, `device_to_host`) or the
`TransferGuardLevel` enum; `JAXLIB_GUARDS_CPU_FETCH` encodes a behaviour that
changed between 0.10.2 and 0.12.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax._src import array as _array
from jax._src import lib as _tg_lib
from jax._src.lib import guard_lib as _guard_lib
from jax._src.lib import xla_client as _tg_xc

# ---------------------------------------------------------------------------
# What `_transfers/` needs to apply JAX's transfer guard to GDA transfers.
#
# * Guard levels: in jaxlib's `guard_lib` (earlier `transfer_guard_lib`; the
#   `from jax._src.lib import guard_lib` at the top fails early if it moves)
#   the effective level of a direction is
#   `guard_lib.thread_local_state().<direction>`, falling back to
#   `guard_lib.global_state().<direction>`, falling back to ALLOW. That is what
#   jaxlib's C++ `GetTransferGuardAction*` reads, and what `jax.transfer_guard*`
#   (thread-local hook) and `jax.config.update("jax_transfer_guard*", ...)` /
#   the `--jax_transfer_guard*` flags (global hook) write, so reading it here
#   gives a GDA exactly the level a `jax.Array` gets, thread semantics
#   included (jaxlib's thread-local state is a C++ `thread_local`, so a new
#   thread starts empty and sees the global option). No public getter exists:
#   `jax.config.jax_transfer_guard` is set-only by design.
# * Suspending jaxlib's own guard for the duration of a GDA transfer that
#   `_transfers/` already judged: jaxlib would otherwise judge the inner steps
#   again with its own classification (on CPU a reshard of a sharded array is
#   fetched through the host and judged "host_to_device"; `from_callback`
#   placement is not inside `explicit_device_put_scope`, so jaxlib judges it
#   implicit) and log it a second time.
# * The CPU rule for device_to_host (fetching a buffer on a CPU device is
#   always allowed). jax 0.10.2 fetches shard by shard
#   (`_single_device_array_to_np_array_did_copy`), and jaxlib skips the guard
#   for a CPU buffer there. jax 0.12 (jaxlib extension >= 495 with IFRT >= 71,
#   the gate in `ArrayImpl._value` / `copy_to_host_async`) fetches a
#   multi-device array in one batched IFRT copy (`_to_np_array_did_copy`,
#   `_jax.batched_copy_to_host_async`), and that path guards CPU buffers like
#   any other: stock `np.asarray` of a sharded CPU `jax.Array` raises under
#   "disallow" in 0.12 (single-device arrays are still exempt).
#   `JAXLIB_GUARDS_CPU_FETCH` says which behaviour this JAX has; `_transfers`
#   applies the same rule to a GDA.
# * Same-placement test: `array._sharding_indices_and_eq` (with the
#   `_fallback_check_via_indices` fallback) is how `_array_shard_arg` decides
#   whether an argument moves (jax 0.10.2); reusing it (`moving_args`) keeps
#   "is this a transfer" identical to stock. If a JAX release drops them, the public
#   `devices_indices_map` comparison below gives the same answer, slower.
# * `ArrayCopySemantics` (jax 0.4.36, 0bb30f0777): jaxlib guards every copy
#   that is not `REUSE_INPUT`, even onto the same devices.
# ---------------------------------------------------------------------------

ArrayCopySemantics = _tg_xc.ArrayCopySemantics
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY

TRANSFER_DIRECTIONS = ("host_to_device", "device_to_device", "device_to_host")
"""The three directions jaxlib's guard state has, in canonical order."""

JAXLIB_GUARDS_CPU_FETCH: bool = (
    getattr(_tg_lib, "jaxlib_extension_version", 0) >= 495
    and getattr(_tg_lib, "ifrt_version", 0) >= 71)
"""True when stock JAX guards fetching a multi-device CPU array (jax 0.12.x;
False on jax 0.10.2, which exempts every CPU fetch). See the comment above."""

_TG = _guard_lib.TransferGuardLevel
_TG_ALLOW = _TG.ALLOW
_TG_LEVEL_NAMES = {
    _TG.ALLOW: "allow",
    _TG.LOG: "log",
    _TG.DISALLOW: "disallow",
    _TG.LOG_EXPLICIT: "log_explicit",
    _TG.DISALLOW_EXPLICIT: "disallow_explicit",
}
_tg_thread_state = _guard_lib.thread_local_state
_tg_global_state = _guard_lib.global_state


def transfer_guard_level(direction: str) -> str:
  """The effective guard level of `direction` on this thread, as JAX's name.

  `direction` is one of `TRANSFER_DIRECTIONS`. Thread-local (context manager)
  level first, then the global option, then "allow", as jaxlib does.
  """
  return _level(_tg_thread_state(), direction)


def _level(thread_state, direction: str) -> str:
  level = getattr(thread_state, direction)
  if level is None:
    level = getattr(_tg_global_state(), direction)
    if level is None:
      return "allow"
  return _TG_LEVEL_NAMES[level]


def transfer_guard_query(direction: str, explicit_flag: str) -> tuple[str, bool]:
  """`(transfer_guard_level(direction), explicit)` with one thread-state lookup.

  `explicit_flag` is "explicit_device_put" (set by `jax.device_put`) or
  "explicit_device_get" (set by `jax.device_get`): the flag jaxlib consults
  for this direction (host_to_device and device_to_device use the put flag).
  """
  state = _tg_thread_state()
  return _level(state, direction), bool(getattr(state, explicit_flag))


def suspend_transfer_guards() -> tuple:
  """Set this thread's guard levels to ALLOW; return what to restore."""
  state = _tg_thread_state()
  saved = (state.host_to_device, state.device_to_device, state.device_to_host)
  state.host_to_device = state.device_to_device = state.device_to_host = _TG_ALLOW
  return saved


def restore_transfer_guards(saved: tuple) -> None:
  """Undo `suspend_transfer_guards` (restores None = "not set" too)."""
  state = _tg_thread_state()
  state.host_to_device, state.device_to_device, state.device_to_host = saved


def sharding_platform(sharding) -> str:
  """The platform of a sharding's devices ("cpu", "gpu", "tpu", ...).

  `Sharding._internal_device_list` (present in jax 0.10.2) is a cached C++
  `DeviceList`; indexing it is about twice as fast as the public `device_set`,
  which is the fallback.
  """
  try:
    return sharding._internal_device_list[0].platform
  except AttributeError:  # pragma: no cover - only if JAX renames it
    return next(iter(sharding.device_set)).platform


def addressable_devices(sharding, shape) -> tuple:
  """The devices of this process a sharding places `shape` on, in its order
  (the keys of `addressable_devices_indices_map(shape)`).

  `Sharding._addressable_device_assignment` (present in jax 0.8 to 0.12) is
  the same tuple, cached on the sharding: a transfer ledger's record reads it
  without computing every shard's index.
  """
  try:
    return sharding._addressable_device_assignment
  except AttributeError:  # pragma: no cover - only if JAX renames it
    return tuple(sharding.addressable_devices_indices_map(shape))


def same_shard_placement(src_sharding, dst_sharding, shape) -> bool:
  """True when `_array_shard_arg` hands the buffers over without copying.

  Its own test (`_sharding_indices_and_eq`) only compares the HLO shardings,
  which name devices by position; the buffers then go to
  `batched_copy_array_to_devices_with_sharding` with the destination's device
  list, which copies them when the device order differs (and jaxlib guards
  that as device_to_device). So the device lists are compared too.
  """
  if _sharding_indices_and_eq is None:  # pragma: no cover - only if JAX drops it
    return (src_sharding.devices_indices_map(tuple(shape))
            == dst_sharding.devices_indices_map(tuple(shape)))
  if src_sharding._internal_device_list != dst_sharding._internal_device_list:
    return False
  try:
    return bool(_sharding_indices_and_eq(src_sharding, dst_sharding, len(shape)))
  except NotImplementedError:
    return bool(_fallback_check_via_indices(src_sharding, dst_sharding, tuple(shape)))


def moving_args(arrays, shardings, layouts, copy_semantics) -> list[int] | None:
  """Indices of the arguments whose buffers `_array_shard_arg` would copy.

  Mirrors stock's decision: same placement (`same_shard_placement`) and
  layout with `REUSE_INPUT` hands the buffers over; anything else copies,
  and jaxlib guards it as device_to_device (even a copy onto the same
  devices). Returns None when nothing moves (the common `jax.jit` case, kept
  to a few attribute reads per argument).
  """
  moving = None
  for i in range(len(arrays)):
    a, s, layout, cs = arrays[i], shardings[i], layouts[i], copy_semantics[i]
    src = a.sharding
    if cs is REUSE_INPUT and layout is None and (src is s or src == s):
      continue
    if not a.is_fully_addressable:
      continue  # cannot move; stock raises its own NotImplementedError
    if (cs is not REUSE_INPUT
        or (layout is not None and a.format.layout != layout)
        or not same_shard_placement(src, s, a.shape)):
      if moving is None:
        moving = []
      moving.append(i)
  return moving


def writes_in_place(arr, sharding, layout, copy_semantics) -> bool:
  """A donation onto the same placement: jaxlib guards it, but no new buffer is written."""
  return (copy_semantics != ALWAYS_COPY
          and (layout is None or arr.format.layout == layout)
          and same_shard_placement(arr.sharding, sharding, arr.shape))


def process_holds_value(sharding, shape) -> bool:
  """True when this process's devices hold the whole value of an array of
  `shape` with `sharding`: all its devices are this process's, it is fully
  replicated, or (several processes) this process's devices cover every
  distinct shard. The rule stock's `np.asarray(jax.Array)` applies
  (`array._process_has_full_value_in_mcjax`, which jax 0.10.2 calls only for
  arrays that are not fully replicated)."""
  if sharding.is_fully_addressable:
    return True
  if sharding.is_fully_replicated and sharding.has_addressable_devices:
    return True
  return _process_has_full_value is not None and bool(_process_has_full_value(sharding,
                                                                               tuple(shape)))


_process_has_full_value: Callable[..., Any] | None = getattr(
    _array, "_process_has_full_value_in_mcjax", None)
_sharding_indices_and_eq: Any = getattr(_array, "_sharding_indices_and_eq", None)
_fallback_check_via_indices: Any = getattr(_array, "_fallback_check_via_indices", None)
if _fallback_check_via_indices is None:  # pragma: no cover
  _sharding_indices_and_eq = None
