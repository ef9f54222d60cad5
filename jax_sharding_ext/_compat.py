"""The one module of `jax_sharding_ext` that touches `jax._src`.

JAX has no public API for the things this package extends: the tables that
map a Python type to an abstract value, shard an argument, build a result, or
canonicalise a value; the effect-type sets; the config-state constructors; the
transfer-guard thread state. Every one of them moved at least once in JAX's
history (see `STYLE.md`, section 0). So every access lives here, grouped by
extension point, each behind a feature check that names the JAX version it
serves. The rest of the package sees one stable, package-local signature per
extension point and never imports `jax._src`.

Supported: JAX 0.10.2 (Python 3.11) and JAX 0.12.x (Python 3.12). An
unsupported JAX fails at import with a message naming the version found and the
versions supported, instead of a confusing `AttributeError` deep in a handler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

MIN_JAX = (0, 10, 2)
MAX_JAX_EXCLUSIVE = (0, 13, 0)
JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__[:3])


class UnsupportedJaxVersionError(ImportError):
  """The installed JAX is outside the range this package was built against."""


def check_version(version: tuple[int, ...] = JAX_VERSION) -> None:
  """Raise `UnsupportedJaxVersionError` unless `version` is supported."""
  if not (MIN_JAX <= tuple(version) < MAX_JAX_EXCLUSIVE):
    raise UnsupportedJaxVersionError(
        f"jax_sharding_ext supports jax >= {'.'.join(map(str, MIN_JAX))} and "
        f"< {'.'.join(map(str, MAX_JAX_EXCLUSIVE))}, but jax {'.'.join(map(str, version))} "
        "is installed. Install a supported version, e.g. "
        "`pip install 'jax>=0.10.2,<0.13'`.")


check_version()

# All private imports below. If one of them fails, the version check above
# passed, so the message names the module that moved.
try:
  from jax._src import array as _array
  from jax._src import config as _config
  from jax._src import core as _core
  from jax._src import dtypes as _dtypes
  from jax._src import xla_bridge as _xb
  from jax._src.interpreters import mlir as _mlir
  from jax._src.interpreters import pxla as _pxla
  from jax._src.lib import guard_lib as _guard_lib
  from jax._src.lib import xla_client as _xc
except ImportError as e:  # pragma: no cover - only on an unsupported JAX
  raise UnsupportedJaxVersionError(
      f"jax_sharding_ext could not import a JAX internal it needs ({e}) from "
      f"jax {jax.__version__}. This JAX release moved it; please report the "
      "version so `_compat.py` can learn the new location.") from e

_MISSING = object()

ArrayImpl = _array.ArrayImpl
"""The concrete `jax.Array` class (not subclassable: it is a C++ type)."""

InvalidInputException = _dtypes.InvalidInputException

# ---------------------------------------------------------------------------
# Reversible table edits.
#
# Every dict-like table this package writes into is edited through `TableEdit`,
# which remembers what was there before so `uninstall()` can restore exactly
# the prior contents, and refuses to clobber an entry someone else replaced in
# the meantime (chex `restrict_backends` style).
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class TableEdit:
  """One `table[key] = value` that can be undone."""

  name: str
  table: Any
  key: Any
  value: Any
  prev: Any = _MISSING
  applied: bool = False

  def apply(self) -> None:
    if self.applied:
      return
    self.prev = self.table.get(self.key, _MISSING)
    self.table[self.key] = self.value
    self.applied = True

  def revert(self) -> None:
    if not self.applied:
      return
    current = self.table.get(self.key, _MISSING)
    if current is not self.value:
      raise RuntimeError(
          f"Cannot uninstall jax_sharding_ext: {self.name}[{self.key!r}] was "
          "replaced by someone else after jax_sharding_ext installed it. "
          "Uninstall the other extension first.")
    if self.prev is _MISSING:
      del self.table[self.key]
    else:
      self.table[self.key] = self.prev
    self.applied = False


# ---------------------------------------------------------------------------
# pytype_aval_mappings: `core.pytype_aval_mappings` only since jax 0.5.0
# (commits 2c722d9b13, 3cecbf34f2); before that also `xla.pytype_aval_mappings`
# and `api_util._shaped_abstractify_handlers`.
# ---------------------------------------------------------------------------

pytype_aval_mappings: dict[type, Callable[[Any], Any]] = _core.pytype_aval_mappings
_array_aval = _core.pytype_aval_mappings[ArrayImpl]


def array_aval(arr: Any) -> Any:
  """Return the aval stock JAX gives the `jax.Array` `arr` (with sharding)."""
  return _array_aval(arr)


# ---------------------------------------------------------------------------
# shard_arg_handlers: signature `(xs, shardings, layouts, copy_semantics)`,
# batched, since jax 0.4.36 (5046cedbfc batched in 0.4.30, 6e1c23610d layouts
# in 0.4.32, 0bb30f0777 copy_semantics in 0.4.36). Both supported releases
# have this signature, so handlers are written against it directly.
# ---------------------------------------------------------------------------

ShardArgHandler = Callable[[Sequence[Any], Sequence[Any], Sequence[Any], Sequence[Any]],
                           Sequence[Any]]
shard_arg_handlers: dict[type, ShardArgHandler] = _pxla.shard_arg_handlers
_array_shard_arg = _pxla.shard_arg_handlers[ArrayImpl]


def array_shard_arg(arrays, shardings, layouts, copy_semantics) -> Sequence[Any]:
  """Shard `jax.Array`s exactly as stock JAX does (zero-copy when it can)."""
  return _array_shard_arg(arrays, shardings, layouts, copy_semantics)


# ---------------------------------------------------------------------------
# global_result_handlers: keyed by `core.ShapedArray`, handler
# `(global_aval, out_sharding, committed) -> _jax.ResultHandler` since jax
# 0.4.26 (217f08236e). `ResultHandler.wrap(fn)` post-processes each output.
# ---------------------------------------------------------------------------

global_result_handlers: dict[type, Callable[..., Any]] = _pxla.global_result_handlers
ShapedArray = _core.ShapedArray


def is_plain_dtype(dtype) -> bool:
  """True for the dtypes a `GlobalDeviceArray` can hold (not float0/extended)."""
  return not (dtype == _dtypes.float0 or _dtypes.issubdtype(dtype, _dtypes.extended))


# ---------------------------------------------------------------------------
# Value canonicalisation. Since jax 0.10.2 (cd8549e7cf) the registry lives in
# C++ (`_jax.register_canonicalize_value_handler`) and has no way to remove an
# entry; `dtypes.canonicalize_value_handlers` is a write-only shim, so it is
# never read here. To keep `uninstall()` honest, the handler registered is a
# switch: while installed it is the identity, after uninstall it raises the
# same `InvalidInputException` stock JAX raises for an unknown type.
# ---------------------------------------------------------------------------

_canonicalize_enabled: dict[type, bool] = {}


def _make_canonicalize_switch(typ: type) -> Callable[[Any], Any]:
  def canonicalize(x):
    if _canonicalize_enabled.get(typ):
      return x
    raise InvalidInputException(
        f"Argument '{x}' of type {type(x)} is not a valid JAX type. "
        "(jax_sharding_ext is uninstalled; call `jax_sharding_ext.install()`.)")
  return canonicalize


class RegisterOnceEdit:
  """An edit of a JAX registry that has no way to remove an entry.

  The entry is registered the first time it is applied and stays; applying and
  reverting then only switch it on and off (`_enable`), so `uninstall()`
  restores stock behaviour even though the registration itself remains.
  """

  name = ""

  def __init__(self, typ: type):
    self.typ = typ
    self.applied = False

  def _available(self) -> bool:
    return True

  def _register(self) -> None:
    raise NotImplementedError

  def _enable(self, on: bool) -> None:
    raise NotImplementedError

  def apply(self) -> None:
    if self.applied or not self._available():
      return
    if self.typ not in self._registered:
      self._register()
      self._registered.add(self.typ)
    self._enable(True)
    self.applied = True

  def revert(self) -> None:
    if self.applied:
      self._enable(False)
      self.applied = False


class CanonicalizeEdit(RegisterOnceEdit):
  """Canonicalise `typ` as the identity; reverted, it raises as stock does."""

  name = "canonicalize_value_handlers"
  _registered: set[type] = set()

  def _register(self) -> None:
    _dtypes.register_canonicalize_value_handler(self.typ, _make_canonicalize_switch(self.typ))

  def _enable(self, on: bool) -> None:
    _canonicalize_enabled[self.typ] = on


def canonicalize_value(x: Any) -> Any:
  """`dtypes.canonicalize_value`: numpy/Python values to JAX's dtype rules."""
  return _dtypes.canonicalize_value(x)


# ---------------------------------------------------------------------------
# MLIR constant handlers: a value closed over by a jitted function is embedded
# as a constant through `mlir.register_constant_handler` (a dict,
# `mlir._constant_handlers`, in both supported releases).
# ---------------------------------------------------------------------------

constant_handlers: dict[type, Callable[..., Any]] = _mlir._constant_handlers
_array_constant_handler = _mlir._constant_handlers[ArrayImpl]


def array_constant_handler(arr, aval):
  return _array_constant_handler(arr, aval)


# ---------------------------------------------------------------------------
# Placing host data on devices. `pxla.batched_device_put` is what
# `jax.make_array_from_callback` uses: one C++ call for all shards, no
# per-shard Python dispatch.
# ---------------------------------------------------------------------------


def batched_device_put(shape, dtype, sharding, values, devices):
  """Place one host or device value per device as one global `jax.Array`."""
  aval = _core.update_aval_with_sharding(_core.ShapedArray(tuple(shape), dtype), sharding)
  return _pxla.batched_device_put(aval, sharding, list(values), list(devices))


# ---------------------------------------------------------------------------
# Config flags: `config.bool_state` since jax 0.4.31 (ce0d9e9b9f).
# ---------------------------------------------------------------------------


def define_bool_flag(name: str, default: bool, help: str, *,
                     include_in_jit_key: bool = False,
                     include_in_trace_context: bool = False) -> Any:
  """Define a JAX config flag (env var, absl flag, `jax.config.update`).

  Idempotent: a flag that JAX (or an earlier import of this package) already
  defined is returned as is, since JAX cannot undefine one.
  """
  existing = _config.config_states.get(name)
  if existing is not None:
    return existing
  state = _config.bool_state(name=name, default=default, help=help,
                             include_in_jit_key=include_in_jit_key,
                             include_in_trace_context=include_in_trace_context)
  # `config_with_absl()` defines absl flags for the options that exist when it
  # runs; one defined later has to be added to absl by hand.
  if getattr(_config.config, "use_absl", False):
    _config.config.absl_flags.DEFINE_bool(name, state.value, help)
  return state


# ---------------------------------------------------------------------------
# Transfer-guard thread state: set by `jax.device_put` / `jax.device_get`
# (`config.explicit_device_put_scope` / `explicit_device_get_scope`).
# ---------------------------------------------------------------------------

def in_explicit_device_put() -> bool:
  """True inside `jax.device_put(...)` on this thread."""
  return bool(_guard_lib.thread_local_state().explicit_device_put)


# ---------------------------------------------------------------------------
# Backends (tests check that importing this package initialises none).
# ---------------------------------------------------------------------------


def initialized_backends() -> dict[str, Any]:
  return dict(_xb._backends)


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations",)]
del _xc  # imported only to fail early if the module moved


# --- transfer guards ---
# ---------------------------------------------------------------------------
# What `_transfer.py` needs to apply JAX's transfer guard to GDA transfers.
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
#   `_transfer.py` already judged: jaxlib would otherwise judge the inner steps
#   again with its own classification (on CPU a reshard of a sharded array is
#   fetched through the host and judged "host_to_device"; `from_callback`
#   placement is not inside `explicit_device_put_scope`, so jaxlib judges it
#   implicit) and log it a second time.
# * The CPU rule for device_to_host (seed 000: fetching a buffer on a CPU
#   device is always allowed). jax 0.10.2 fetches shard by shard
#   (`_single_device_array_to_np_array_did_copy`), and jaxlib skips the guard
#   for a CPU buffer there. jax 0.12 (jaxlib extension >= 495 with IFRT >= 71,
#   the gate in `ArrayImpl._value` / `copy_to_host_async`) fetches a
#   multi-device array in one batched IFRT copy (`_to_np_array_did_copy`,
#   `_jax.batched_copy_to_host_async`), and that path guards CPU buffers like
#   any other: stock `np.asarray` of a sharded CPU `jax.Array` raises under
#   "disallow" in 0.12 (single-device arrays are still exempt).
#   `JAXLIB_GUARDS_CPU_FETCH` says which behaviour this JAX has; `_transfer`
#   keeps the seed's rule for a GDA on both by running every fetch it judged
#   with jaxlib's guard suspended (a no-op for CPU buffers in 0.10.2).
# * Same-placement test: `array._sharding_indices_and_eq` (with the
#   `_fallback_check_via_indices` fallback) is how `_array_shard_arg` decides
#   whether an argument moves (jax 0.10.2); reusing it keeps "is this a
#   transfer" identical to stock. If a JAX release drops them, the public
#   `devices_indices_map` comparison below gives the same answer, slower.
# * `ArrayCopySemantics` (jax 0.4.36, 0bb30f0777): jaxlib guards every copy
#   that is not `REUSE_INPUT`, even onto the same devices.
# ---------------------------------------------------------------------------

from jax._src.lib import xla_client as _tg_xc  # noqa: E402

ArrayCopySemantics = _tg_xc.ArrayCopySemantics
REUSE_INPUT = ArrayCopySemantics.REUSE_INPUT
ALWAYS_COPY = ArrayCopySemantics.ALWAYS_COPY

TRANSFER_DIRECTIONS = ("host_to_device", "device_to_device", "device_to_host")
"""The three directions jaxlib's guard state has, in canonical order."""

from jax._src import lib as _tg_lib  # noqa: E402

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
  level = getattr(_tg_thread_state(), direction)
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
  explicit = bool(getattr(state, explicit_flag))
  level = getattr(state, direction)
  if level is None:
    level = getattr(_tg_global_state(), direction)
    if level is None:
      return "allow", explicit
  return _TG_LEVEL_NAMES[level], explicit


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


_sharding_indices_and_eq = getattr(_array, "_sharding_indices_and_eq", None)
_fallback_check_via_indices = getattr(_array, "_fallback_check_via_indices", None)
if _fallback_check_via_indices is None:  # pragma: no cover
  _sharding_indices_and_eq = None


__all__ += ["ArrayCopySemantics", "REUSE_INPUT", "ALWAYS_COPY", "TRANSFER_DIRECTIONS",
            "JAXLIB_GUARDS_CPU_FETCH",
            "transfer_guard_level", "transfer_guard_query", "suspend_transfer_guards",
            "restore_transfer_guards", "sharding_platform", "same_shard_placement"]


# ---------------------------------------------------------------------------
# --- effects ---
#
# Shardable ordered effects (`_effects.py`). The effect-type sets live in
# `jax._src.effects` (`EffectTypeSet`, whose only state is `_effect_types`);
# `partial_eval_kept_effects` exists since 2025-06 (jax 0.7), so it is looked
# up by name. The debug primitives, their platform lowering tables
# (`mlir._platform_specific_lowerings`, keyed platform -> primitive ->
# `LoweringRuleEntry(rule, inline)`), `callback.emit_python_callback` and
# `callback._callback_op_sharding` have the same shape in jax 0.10.2 and
# 0.12.x. There is no public API for any of this: JAX only declares its own
# `OrderedIOEffect` shardable (seed 002, jax 0.4.17).
# ---------------------------------------------------------------------------

import numpy as _fx_np  # noqa: E402
from jax._src import callback as _fx_callback  # noqa: E402
from jax._src import debugging as _fx_debugging  # noqa: E402
from jax._src import dispatch as _fx_dispatch  # noqa: E402
from jax._src import effects as _fx_effects  # noqa: E402
from jax._src import sharding_impls as _fx_sharding_impls  # noqa: E402
from jax._src.interpreters import mlir as _fx_mlir  # noqa: E402
from jax._src.lib import xla_client as _fx_xc  # noqa: E402
from jax._src.lib.mlir import ir as _fx_ir  # noqa: E402
from jax._src.lib.mlir.dialects import func as _fx_func  # noqa: E402
from jax._src.lib.mlir.dialects import sdy as _fx_sdy  # noqa: E402

Effect = _fx_effects.Effect
"""Base class of every JAX effect (also public as `jax.extend.core.Effect`)."""

EFFECT_TYPE_SET_NAMES = (
    "ordered_effects", "shardable_ordered_effects", "lowerable_effects",
    "control_flow_allowed_effects", "custom_derivatives_allowed_effects",
    "remat_allowed_effects", "partial_eval_kept_effects")
"""The `EffectTypeSet`s of `jax._src.effects` an effect type can join."""

HAS_PARTIAL_EVAL_KEPT_EFFECTS = hasattr(_fx_effects, "partial_eval_kept_effects")
"""`effects.partial_eval_kept_effects` (2025-06, jax 0.7+): keeps effectful
equations through partial evaluation / DCE. True on both supported releases."""


def effect_type_set(name: str) -> Any:
  """The `EffectTypeSet` called `name`, or None if this JAX has no such set."""
  return getattr(_fx_effects, name, None)


def effect_types_in(name: str) -> frozenset[type]:
  """A snapshot of the types in the effect-type set `name` (empty if absent)."""
  s = effect_type_set(name)
  return frozenset(s._effect_types) if s is not None else frozenset()


def is_ordered_effect(effect: Any) -> bool:
  return _fx_effects.ordered_effects.contains(effect)


class SetMemberEdit:
  """Add `item` to the plain Python set `target`; undo removes it if we added it.

  A member that was already there is left alone both ways, so stock
  memberships survive `uninstall()`.
  """

  def __init__(self, name: str, target: set | None, item: Any):
    self.name = name
    self.target = target
    self.item = item
    self.applied = False
    self._added = False

  def _target(self) -> set | None:
    return self.target

  def apply(self) -> None:
    if self.applied:
      return
    target = self._target()
    self._added = target is not None and self.item not in target
    if self._added:
      target.add(self.item)
    self.applied = True

  def revert(self) -> None:
    if not self.applied:
      return
    if self._added:
      self._target().discard(self.item)
    self._added = False
    self.applied = False


class EffectTypeSetEdit(SetMemberEdit):
  """Add `effect_type` to JAX's effect-type set `set_name`; undo removes it.

  `EffectTypeSet` only has `add_type`; removal edits its `_effect_types` set
  (the same in every JAX since the sets were introduced). A set this JAX does
  not have is skipped.
  """

  def __init__(self, set_name: str, effect_type: type):
    super().__init__(set_name, None, effect_type)

  def _target(self) -> set | None:
    s = effect_type_set(self.name)
    return None if s is None else s._effect_types


# The debug primitives and their effects (jax/_src/debugging.py).
debug_callback_p = _fx_debugging.debug_callback_p
debug_print_p = _fx_debugging.debug_print_p  # its own primitive since jax 0.7
OrderedDebugEffect = _fx_debugging.OrderedDebugEffect
ordered_debug_effect = _fx_debugging.ordered_debug_effect
debug_effect = _fx_debugging.debug_effect

uncacheable_primitives: set = _fx_mlir._uncacheable_primitives
"""Primitives lowered inline at each use (`mlir.register_lowering(cacheable=False)`).
`debug_callback_p` is in it (TPU channel ids); `sharded_callback` relies on
inline lowering to see its operand's producer."""

prim_requires_devices_during_lowering: set = _fx_dispatch.prim_requires_devices_during_lowering
"""Primitives whose lowering needs the concrete device assignment (io_callback_p)."""


class LoweringEdit:
  """Wrap the lowering rule of `prim` on `platform` (None: the default rule).

  `make_rule(prev_rule)` builds the new rule around the rule that was there;
  `revert()` puts back the previous `LoweringRuleEntry` object itself. This
  edits the table `mlir._get_lowering_rules` reads, the same table
  `mlir.register_lowering` writes.
  """

  def __init__(self, prim: Any, platform: str | None, make_rule: Callable[[Any], Any]):
    self.prim = prim
    self.platform = platform
    self.make_rule = make_rule
    self.name = f"mlir lowering[{platform or 'default'}]"
    self.applied = False
    self._prev: Any = _MISSING
    self._entry: Any = None

  def _table(self) -> dict:
    if self.platform is None:
      return _fx_mlir._lowerings
    return _fx_mlir._platform_specific_lowerings[self.platform]

  def apply(self) -> None:
    if self.applied:
      return
    table = self._table()
    prev = table.get(self.prim, _MISSING)
    if prev is _MISSING:  # nothing to wrap on this platform
      self._prev, self._entry = _MISSING, None
    else:
      self._prev = prev
      self._entry = _fx_mlir.LoweringRuleEntry(self.make_rule(prev.rule), prev.inline)
      table[self.prim] = self._entry
    self.applied = True

  def revert(self) -> None:
    if not self.applied:
      return
    if self._entry is not None:
      table = self._table()
      if table.get(self.prim, _MISSING) is not self._entry:
        raise RuntimeError(
            f"Cannot uninstall jax_sharding_ext: the {self.name} rule of "
            f"`{self.prim}` was replaced by someone else after jax_sharding_ext "
            "installed it. Uninstall the other extension first.")
      table[self.prim] = self._prev
    self._prev, self._entry = _MISSING, None
    self.applied = False


def lowering_platforms(prim: Any) -> list[str | None]:
  """Platforms (None = default rule) that have a lowering rule for `prim`."""
  out: list[str | None] = [None] if prim in _fx_mlir._lowerings else []
  out += sorted(p for p, t in _fx_mlir._platform_specific_lowerings.items() if prim in t)
  return out


def axis_context_kind(ctx) -> str:
  """Classify a lowering context.

  "auto": `jit` over several devices (bulk-array semantics);
  "single": `jit` on one device; "manual": inside `shard_map` with every mesh
  axis manual (per-device semantics); "partial": `shard_map` with some axes
  left automatic; "nested": a `shard_map` inside another one (the inner one's
  mesh is the context mesh, whose outer axes are already `Manual`, in jax
  0.10.2 and 0.12.x); "other": anything else (pmap's replica context).
  """
  ac = ctx.module_context.axis_context
  if isinstance(ac, _fx_sharding_impls.ShardingContext):
    return "auto" if ac.num_devices > 1 else "single"
  if isinstance(ac, _fx_sharding_impls.SPMDAxisContext):
    if any(t == jax.sharding.AxisType.Manual for t in getattr(ac.mesh, "axis_types", ())):
      return "nested"
    if frozenset(ac.manual_axes) == frozenset(ac.mesh.axis_names):
      return "manual"
    return "partial"
  return "other"


def auto_axes_in_shard_map(ctx) -> tuple[str, ...]:
  """Mesh axes left automatic by the enclosing `shard_map` (empty outside one)."""
  ac = ctx.module_context.axis_context
  if not isinstance(ac, _fx_sharding_impls.SPMDAxisContext):
    return ()
  return tuple(a for a in ac.mesh.axis_names if a not in ac.manual_axes)


def lowering_device_assignment(ctx) -> tuple | None:
  """The devices of a `jit` being lowered (None when lowered without them)."""
  ac = ctx.module_context.axis_context
  return getattr(ac, "device_assignment", None)


def callback_op_sharding(ctx) -> Any:
  """The op sharding stock `io_callback` gives its custom call in `ctx`.

  Under multi-device `jit`: MAXIMAL on logical device 0 (runs once, on the
  global value). Inside a fully manual `shard_map`: MANUAL (runs on every
  device, on its local value). Shardy or GSPMD form, following
  `jax_use_shardy_partitioner`.
  """
  return _fx_callback._callback_op_sharding(
      ctx.module_context.axis_context, None, ctx.avals_out)


def emit_ordered_callback(ctx, callback: Callable[..., Any], args: Sequence[Any],
                          effect: Any, *, sharding: Any, partitioned: bool = False):
  """Emit a side-effecting host callback threaded on `effect`'s token.

  What `io_callback(ordered=True)` emits (`callback.io_callback_lowering`):
  the token of `effect` goes in, the new one comes out and replaces it in
  `ctx`'s token set, and `sharding` annotates the custom call.
  """
  token = ctx.tokens_in.get(effect)
  result, token, _ = _fx_callback.emit_python_callback(
      ctx, callback, token, list(args), ctx.avals_in, ctx.avals_out,
      has_side_effect=True, returns_token=True, partitioned=partitioned,
      sharding=sharding)
  ctx.set_tokens_out(ctx.tokens_in.update_tokens(_fx_mlir.TokenSet({effect: token})))
  return result


def lower_fun_multiple_results(fun: Callable[..., Any]) -> Callable[..., Any]:
  """`mlir.lower_fun(fun, multiple_results=True)`: lower a traced function inline."""
  return _fx_mlir.lower_fun(fun, multiple_results=True)


def _sdy_mesh_and_spec(attr, device_assignment):
  ts = _fx_sdy.TensorShardingAttr(attr)
  mesh_attr = ts.mesh_or_ref
  if not _attr_is(_fx_sdy.MeshAttr, mesh_attr):
    return None  # a symbol reference: meshes are only inlined while lowering
  mesh_attr = _fx_sdy.MeshAttr(mesh_attr)
  axes = [_fx_sdy.MeshAxisAttr(a) for a in mesh_attr.axes]
  if not axes:
    return None  # maximal sharding: one device holds the value
  sizes = [a.size for a in axes]
  ids = list(mesh_attr.device_ids) or list(range(int(_fx_np.prod(sizes))))
  if len(ids) != len(device_assignment):
    return None
  devices = _fx_np.array([device_assignment[i] for i in ids], dtype=object).reshape(sizes)
  spec = []
  for dim in ts.dimension_shardings:
    refs = [_fx_sdy.AxisRefAttr(r) for r in _fx_sdy.DimensionShardingAttr(dim).axes]
    if any(r.sub_axis_info is not None for r in refs):
      return None  # split axes ("x":(1)2) have no PartitionSpec equivalent
    names = tuple(r.name for r in refs)
    spec.append(None if not names else names[0] if len(names) == 1 else names)
  return devices, tuple(a.name for a in axes), tuple(spec)


def _hlo_mesh_and_spec(attr, device_assignment):
  try:
    hs = _fx_xc.HloSharding.from_string(_fx_ir.StringAttr(attr).value)
  except Exception:  # a proto-encoded or unparsable sharding: give up
    return None
  n = len(device_assignment)
  if hs.is_replicated():
    return _fx_np.array(device_assignment, dtype=object), ("_jse_r",), ()
  if not hs.is_tiled() or hs.subgroup_types() or hs.num_devices() != n:
    return None
  dims = list(hs.tile_assignment_dimensions())
  ids = list(hs.tile_assignment_devices())
  devices = _fx_np.array([device_assignment[i] for i in ids], dtype=object).reshape(dims)
  names = tuple(f"_jse_{i}" for i in range(len(dims)))
  ndim = len(dims) - (1 if hs.replicate_on_last_tile_dim() else 0)
  spec = tuple(names[i] if dims[i] > 1 else None for i in range(ndim))
  return devices, names, spec


def operand_sharding(ctx, value) -> tuple[Any, tuple[str, ...], tuple] | None:
  """The sharding a lowered operand is known to have, as (devices, names, spec).

  Known means written in the IR at this point of lowering: a `jit` argument
  (the `sdy.sharding` / `mhlo.sharding` attribute of a `func.func` argument)
  or the result of `with_sharding_constraint` (`sdy.sharding_constraint`, or
  the GSPMD `@Sharding` custom call). `devices` is an object array shaped
  like the mesh, `spec` a PartitionSpec tuple over `names`. None otherwise
  (an intermediate value: XLA decides its sharding later).
  """
  da = lowering_device_assignment(ctx)
  if da is None:
    return None
  attr = None
  if isinstance(value, _fx_ir.BlockArgument):
    owner = value.owner.owner
    if isinstance(owner, _fx_func.FuncOp) and owner.arg_attrs is not None:
      arg_attrs = _fx_ir.DictAttr(owner.arg_attrs[value.arg_number])
      for key in ("sdy.sharding", "mhlo.sharding"):
        if key in arg_attrs:
          attr = arg_attrs[key]
          break
  elif isinstance(value, _fx_ir.OpResult):
    op = value.owner
    if op.name == "sdy.sharding_constraint":
      attr = op.attributes["sharding"]
    elif (op.name == "stablehlo.custom_call" and "mhlo.sharding" in op.attributes
          and _fx_ir.StringAttr(op.attributes["call_target_name"]).value == "Sharding"):
      attr = op.attributes["mhlo.sharding"]
  if attr is None:
    return None
  if _attr_is(_fx_sdy.TensorShardingAttr, attr):
    return _sdy_mesh_and_spec(attr, da)
  if _attr_is(_fx_ir.StringAttr, attr):
    return _hlo_mesh_and_spec(attr, da)
  return None


def _attr_is(cls, attr) -> bool:
  # `Attr.isinstance` exists for some attribute classes only; a cast is the
  # check every MLIR binding version has.
  try:
    cls(attr)
  except (ValueError, TypeError):
    return False
  return True


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
`_effects._TrackedRuntimeTokens` overrides both."""


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


def get_runtime_tokens() -> Any:
  return _fx_dispatch.runtime_tokens


def set_runtime_tokens(tokens: Any) -> None:
  """Swap the object dispatch reads as `dispatch.runtime_tokens`.

  `pxla` and `jax.effects_barrier` look it up as a module attribute at every
  call (jax 0.10.2 and 0.12.x), so a swap takes effect at once.
  """
  _fx_dispatch.runtime_tokens = tokens


__all__ += ["Effect", "EFFECT_TYPE_SET_NAMES", "HAS_PARTIAL_EVAL_KEPT_EFFECTS",
            "effect_type_set", "effect_types_in", "is_ordered_effect", "EffectTypeSetEdit",
            "SetMemberEdit", "debug_callback_p", "debug_print_p", "OrderedDebugEffect",
            "ordered_debug_effect", "debug_effect", "uncacheable_primitives",
            "prim_requires_devices_during_lowering", "LoweringEdit", "lowering_platforms",
            "axis_context_kind", "auto_axes_in_shard_map", "lowering_device_assignment", "callback_op_sharding",
            "emit_ordered_callback", "lower_fun_multiple_results", "operand_sharding",
            "RuntimeTokenSet", "failed_token_error", "get_runtime_tokens",
            "set_runtime_tokens"]


# --- host callbacks and pmap, found by code object ----------------------------
# Two questions with no public answer, both answered from code objects (no
# table exists for either):
#
# * Is this thread inside a host callback? Every host callback (debug
#   callbacks and prints, `io_callback`, `pure_callback`) runs the
#   `_wrapped_callback` closures of `callback.emit_python_callback`, whose
#   frames are then on the stack. `effects_barrier()` needs to know: there it
#   must not wait for the computation that is running it.
# * Was an equation traced inside `jax.pmap`? pmap is `jit(shard_map(_fun))`
#   (`pmap._cached_shard_map`, jax 0.10.2 and 0.12.x), so its body looks like
#   any `shard_map` when lowered; the equation's trace-time traceback
#   (`ctx.traceback.raw_frames()`) contains pmap's `_fun` frame.
# If a JAX release renames these, the `HAS_*` flags below turn False and
# `tests/test_effects.py` names the function that moved.
# ---------------------------------------------------------------------------

import sys as _cb_sys  # noqa: E402
import types as _cb_types  # noqa: E402

from jax._src import pmap as _cb_pmap  # noqa: E402


def _nested_codes(fn: Any, name: str) -> frozenset:
  """Code objects named `name` defined (at any depth) inside function `fn`.

  A decorated `fn` (e.g. `util.cache()`'s `memoized_fun`, as
  `pmap._cached_shard_map` is) is searched through the functions its
  closure holds.
  """
  found = set()
  todo = [getattr(fn, "__code__", None)]
  for cell in getattr(fn, "__closure__", None) or ():
    try:
      held = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    if isinstance(held, _cb_types.FunctionType):
      todo.append(held.__code__)
  while todo:
    code = todo.pop()
    if code is None:
      continue
    for c in code.co_consts:
      if isinstance(c, _cb_types.CodeType):
        if c.co_name == name:
          found.add(c)
        todo.append(c)
  return frozenset(found)


_HOST_CALLBACK_CODES = _nested_codes(getattr(_fx_callback, "emit_python_callback", None),
                                     "_wrapped_callback")
HAS_HOST_CALLBACK_FRAMES = bool(_HOST_CALLBACK_CODES)
"""True when `callback.emit_python_callback`'s `_wrapped_callback` closures were found."""

_PMAP_BODY_CODES = _nested_codes(getattr(_cb_pmap, "_cached_shard_map", None), "_fun")
HAS_PMAP_BODY_CODE = bool(_PMAP_BODY_CODES)
"""True when the body function of `jax.pmap` (`pmap._cached_shard_map._fun`) was found."""


def in_host_callback() -> bool:
  """True when the calling thread is running a JAX host callback."""
  frame = _cb_sys._getframe(1)
  while frame is not None:
    if frame.f_code in _HOST_CALLBACK_CODES:
      return True
    frame = frame.f_back
  return False


def traced_inside_pmap(ctx) -> bool:
  """True when the equation lowered with `ctx` was traced inside `jax.pmap`."""
  tb = getattr(ctx, "traceback", None)
  if tb is None or not _PMAP_BODY_CODES:
    return False
  codes, _ = tb.raw_frames()
  return any(c in _PMAP_BODY_CODES for c in codes)


__all__ += ["HAS_HOST_CALLBACK_FRAMES", "HAS_PMAP_BODY_CODE", "in_host_callback",
            "traced_inside_pmap"]


# --- donation and pjit ---
# ---------------------------------------------------------------------------
# Which arguments of the running call are donated (`jax.jit(...,
# donate_argnums=...)`, `donate_argnames`, legacy `pjit(donate_argnums=...)`).
#
# jax 0.10.2 and 0.12.x hand *every* jit argument to `shard_arg_handlers` with
# `ArrayCopySemantics.REUSE_INPUT` (`pxla.InputsHandler`), donated or not: the
# donation itself is applied afterwards by PjRt inside `execute_sharded`. So a
# handler cannot tell from its `copy_semantics` that an argument is donated,
# and PjRt's check for `f(donate(a), a)` ("Attempt to use a buffer that was
# previously donated in the same call") fails on some partitions and then
# crashes the process (measured: SIGSEGV with 8 CPU devices, jax 0.10.2).
#
# The donation vector of the running call is a local of the Python frames that
# dispatch it, which are on the stack whenever a GDA reaches its shard-arg
# handler (warm calls on jit's C++ fast path do not; `_donation.dispatch_key`
# sends the risky ones back to this Python path):
# * `pjit._pjit_call_impl_python(*args, donated_invars=...)` (top-level
#   `jax.jit` calls) and `pjit._pjit_call_impl` (`jit_p.bind`, e.g. under
#   `jax.debug_key_reuse`): `args` and `donated_invars` align one to one;
#   `pjit._run_python_pjit`'s `p.arg_names` names the non-constant ones.
# * `stages.Compiled.__call__` (AOT `jit(f).lower(...).compile()(...)`): the
#   public `Compiled.donate_argnums` (flat indices) over the flattened
#   `(args, kwargs)`.
# No public API exposes this; a JAX that renames these functions makes
# `HAS_CALL_DONATION_INFO` False and the check is skipped (stock behaviour).
#
# The mesh of `with mesh:` (legacy pjit): `Mesh.__enter__` pushes onto
# `mesh.thread_resources` (deprecated public alias
# `jax.interpreters.pxla.thread_resources`, which warns); `jax.set_mesh`
# sets `mesh.get_concrete_mesh()` (public `jax.sharding.get_mesh()`, which
# refuses to run under a trace, hence the internal spelling).
# ---------------------------------------------------------------------------

import sys as _dn_sys  # noqa: E402

import jax.stages as _dn_stages  # noqa: E402
from jax._src import mesh as _dn_mesh  # noqa: E402
from jax._src import pjit as _dn_pjit  # noqa: E402


def _dn_code(owner: Any, name: str) -> Any:
  return getattr(getattr(owner, name, None), "__code__", None)


_DN_JIT_IMPL_CODES = frozenset(
    c for c in (_dn_code(_dn_pjit, "_pjit_call_impl_python"),
                _dn_code(_dn_pjit, "_pjit_call_impl")) if c is not None)
_DN_RUN_PYTHON_PJIT_CODE = _dn_code(_dn_pjit, "_run_python_pjit")
_DN_COMPILED_CALL_CODE = _dn_code(getattr(_dn_stages, "Compiled", None), "__call__")

HAS_CALL_DONATION_INFO = bool(_DN_JIT_IMPL_CODES)
"""True when the jit dispatch frames that carry the donation vector were found."""


@dataclasses.dataclass(frozen=True)
class CallDonation:
  """The flat arguments of the running jit call and which of them are donated."""

  args: tuple
  donated: tuple
  names: tuple | None  # one per entry of `args` ('' when unknown), or None


def _dn_arg_names(frame: Any, n_args: int) -> tuple | None:
  for _ in range(4):
    frame = frame.f_back
    if frame is None:
      return None
    if frame.f_code is _DN_RUN_PYTHON_PJIT_CODE:
      names = getattr(frame.f_locals.get("p"), "arg_names", None)
      if names is None or len(names) > n_args:
        return None
      return ("",) * (n_args - len(names)) + tuple(names)  # constants come first
  return None


def current_call_donation(max_depth: int = 24) -> CallDonation | None:
  """Donation info of the jit call being dispatched on this thread, or None.

  Meant to be called from inside a `shard_arg_handlers` entry.
  """
  frame = _dn_sys._getframe(1)
  for _ in range(max_depth):
    if frame is None:
      return None
    code = frame.f_code
    if code in _DN_JIT_IMPL_CODES:
      loc = frame.f_locals
      args, donated = loc.get("args"), loc.get("donated_invars")
      if args is None or donated is None or len(args) != len(donated):
        return None
      return CallDonation(tuple(args), tuple(donated), _dn_arg_names(frame, len(args)))
    if code is _DN_COMPILED_CALL_CODE:
      loc = frame.f_locals
      compiled = loc.get("self")
      args = jax.tree_util.tree_leaves((loc.get("args", ()), loc.get("kwargs", {})))
      try:
        donate = set(compiled.donate_argnums)
      except Exception:  # pragma: no cover - a Compiled without args_info
        return None
      return CallDonation(tuple(args), tuple(i in donate for i in range(len(args))), None)
    frame = frame.f_back
  return None


def context_mesh() -> Any:
  """The mesh of the innermost `with mesh:` on this thread, else `jax.set_mesh`'s.

  Returns None when neither is active.
  """
  mesh = _dn_mesh.thread_resources.env.physical_mesh
  if not mesh.empty:
    return mesh
  mesh = _dn_mesh.get_concrete_mesh()
  return None if mesh is None or mesh.empty else mesh


__all__ += ["HAS_CALL_DONATION_INFO", "CallDonation", "current_call_donation", "context_mesh"]


# --- dispatch ---------------------------------------------------------------
# jit's C++ fast path (`PjitFunction`) accepts only `ArrayImpl`, numpy arrays
# and scalars as leaves; any other type drops every call to the Python
# `cache_miss` path (about 10x slower on one device). Its one extension point
# is `tree_util.dispatch_registry`, the pytree registry the C++ path flattens
# arguments (and re-flattens outputs) with, and nothing else does; JAX's own
# PRNG key arrays and `EArray` use it the same way. A type registered there as
# a dataclass node with data field `_arr` reaches the fast path as that
# `ArrayImpl`, while `jax.tree_util`, tracing and the extension tables still
# see it as a leaf. Present in jax 0.10.2 and 0.12.x; when missing, dispatch
# stays correct but takes the slow path.
# The registry has no unregister; `DispatchNodeEdit.revert` instead changes the
# node's static field, so cached C++ signatures stop matching and calls fall
# back to the Python path (where an uninstalled type is rejected).

try:
  from jax._src import tree_util as _tree_util
  _dispatch_registry = getattr(_tree_util, "dispatch_registry", None)
except ImportError:  # pragma: no cover
  _dispatch_registry = None

HAS_DISPATCH_REGISTRY = _dispatch_registry is not None


class DispatchOff:
  """Static field value of a dispatch node while the package is uninstalled."""

  __slots__ = ()

  def __repr__(self):
    return "<jax_sharding_ext uninstalled>"


DISPATCH_OFF = DispatchOff()


class DispatchNodeEdit(RegisterOnceEdit):
  """Let jit's C++ fast path unpack `typ` to its `_arr` (see above)."""

  name = "tree_util.dispatch_registry"
  _registered: set[type] = set()

  def _available(self) -> bool:
    return HAS_DISPATCH_REGISTRY

  def _register(self) -> None:
    _dispatch_registry.register_dataclass_node(self.typ, ["_arr"], ["_dispatch_key"])

  def _enable(self, on: bool) -> None:
    # The key itself is a property (`_donation.dispatch_key`); off, it returns
    # DISPATCH_OFF, which no cached C++ signature has.
    self.typ._dispatch_off = None if on else DISPATCH_OFF


def dispatch_flatten(x: Any) -> tuple[list[Any], Any]:
  """Flatten `x` as jit's C++ dispatch does (for tests and benchmarks)."""
  return _dispatch_registry.flatten(x)


__all__ += ["HAS_DISPATCH_REGISTRY", "DISPATCH_OFF", "DispatchNodeEdit", "dispatch_flatten"]


# --- output flag: which jit is being compiled --------------------------------
# The GDA-era `jax_parallel_functions_output_gda` flag turned the outputs of
# the user's pjit calls into GDAs, never the results of eager operations. In
# today's JAX every eager operation is a jit too: `x + 1` compiles a jitted
# primitive (`dispatch.apply_primitive`) and most `jax.numpy` functions are
# jitted internally. A result handler is built while its executable is
# compiled, inside the `cache_miss` closure of `pjit._cpp_pjit(fun, ...)`
# (jax 0.10.2 and 0.12.x), whose `fun` is the function being jitted; reading
# it from that frame tells a user's jit from one of JAX's own. Compile time
# only, never per call. Without such a frame (AOT `.lower().compile()`), the
# caller compiled the user's function directly.

def _of_nested_code(fn: Any, name: str) -> Any:
  """The code object of the function `name` defined inside `fn`, or None."""
  consts = getattr(getattr(fn, "__code__", None), "co_consts", ())
  return next((c for c in consts if getattr(c, "co_name", None) == name), None)


_OF_CACHE_MISS_CODE = _of_nested_code(getattr(_dn_pjit, "_cpp_pjit", None), "cache_miss")


def jitted_function_being_compiled() -> Any:
  """The Python function of the innermost `jax.jit` cache miss on this thread.

  None when no `jax.jit` call is being dispatched (e.g. AOT compilation).
  """
  if _OF_CACHE_MISS_CODE is None:
    return None
  f = _dn_sys._getframe(1)
  while f is not None:
    if f.f_code is _OF_CACHE_MISS_CODE:
      return f.f_locals.get("fun")
    f = f.f_back
  return None


__all__ += ["jitted_function_being_compiled"]


# --- device_put with no target ---------------------------------------------
# `jax.device_put(x)` (no device, no sharding) keeps a committed `jax.Array`
# where it is: `dispatch._device_put_sharding_impl` returns it unchanged (or
# copies it onto its own sharding). Any other type is treated like host data
# and lands on the default device, uncommitted, before a shard-arg handler
# ever sees it (the handler is only told the default device's sharding), so
# a GDA would silently move all its shards to device 0. The one place that
# sees "no target" together with the value is `dispatch._batched_device_put_impl`,
# which `jax.device_put` calls eagerly through the module attribute (jax
# 0.10.2 and 0.12.x; under a trace it binds `device_put_p`, whose operands
# are tracers). No table exists for it, so the attribute is wrapped, with a
# reversible edit that refuses to clobber someone else's wrapper.
# ---------------------------------------------------------------------------

_DP_IMPL_NAME = "_batched_device_put_impl"


class DevicePutDefaultEdit:
  """`jax.device_put(x)` with no target uses `default_of(x)` for values of `typ`."""

  name = f"dispatch.{_DP_IMPL_NAME}"

  def __init__(self, typ: type, default_of: Callable[[Any], Any]):
    self.typ = typ
    self.default_of = default_of
    self.prev: Any = None
    self.wrapper: Any = None

  def apply(self) -> None:
    if self.wrapper is not None:
      return
    prev = getattr(_fx_dispatch, _DP_IMPL_NAME)
    typ, default_of = self.typ, self.default_of

    def _batched_device_put_impl(*xs, devices, **kwargs):
      if any(type(x) is typ and d is None for x, d in zip(xs, devices, strict=True)):
        devices = [default_of(x) if type(x) is typ and d is None else d
                   for x, d in zip(xs, devices, strict=True)]
      return prev(*xs, devices=devices, **kwargs)

    self.prev = prev
    self.wrapper = _batched_device_put_impl
    setattr(_fx_dispatch, _DP_IMPL_NAME, _batched_device_put_impl)

  def revert(self) -> None:
    if self.wrapper is None:
      return
    if getattr(_fx_dispatch, _DP_IMPL_NAME) is not self.wrapper:
      raise RuntimeError(
          f"Cannot uninstall jax_sharding_ext: {self.name} was replaced by "
          "someone else after jax_sharding_ext wrapped it. Uninstall the other "
          "extension first.")
    setattr(_fx_dispatch, _DP_IMPL_NAME, self.prev)
    self.prev = self.wrapper = None


__all__ += ["DevicePutDefaultEdit"]


# --- AOT calls ----------------------------------------------------------------
# A compiled executable (`jax.jit(...).lower(...).compile()`, also legacy
# `pjit(...).lower(...).compile()`) checks its arguments' shardings in
# `pxla.MeshExecutable.call` (`check_array_xla_sharding_layout_match`), but
# only those of `ArrayImpl` arguments: any other type is resharded silently by
# its shard-arg handler. A GDA's handler runs inside that frame on the AOT
# path and never on the `jax.jit` path (which calls `unsafe_call` directly and
# resolves committed shardings itself), so finding the frame tells the
# handler to apply stock's check instead of resharding. Rare path only: the
# handler looks only when an argument would move.
# ---------------------------------------------------------------------------

_AOT_CALL_CODE = _dn_code(getattr(_pxla, "MeshExecutable", None), "call")

HAS_AOT_CALL_FRAME = _AOT_CALL_CODE is not None
"""True when `pxla.MeshExecutable.call` (the AOT argument check) was found."""


def in_aot_call(max_depth: int = 16) -> bool:
  """True when called (from a shard-arg handler) inside an AOT executable call."""
  frame = _dn_sys._getframe(1)
  for _ in range(max_depth):
    if frame is None:
      return False
    if frame.f_code is _AOT_CALL_CODE:
      return True
    frame = frame.f_back
  return False


__all__ += ["HAS_AOT_CALL_FRAME", "in_aot_call"]


# ---------------------------------------------------------------------------
# Traceback filtering (`jax._src.traceback_util`, stable since jax 0.2). An
# error from bad input should show the user's line and the message, not the
# package's frames: public entry points are JAX API boundaries, and the
# package's directory is one of JAX's excluded paths while installed, so JAX
# filters (or, under IPython, hides) those frames exactly as it does its own,
# obeying `jax_traceback_filtering`.
# ---------------------------------------------------------------------------

import os as _tb_os  # noqa: E402

from jax._src import traceback_util as _tb_util  # noqa: E402

api_boundary = _tb_util.api_boundary
"""Decorator: `fun` is an API boundary below which frames are filtered."""

PACKAGE_DIR = _tb_os.path.dirname(_tb_os.path.abspath(__file__))


class TracebackExclusionEdit:
  """Adds the package's directory to JAX's traceback exclusions; undoable."""

  name = "traceback exclusion paths"

  def __init__(self, path: str = PACKAGE_DIR):
    self.path = path
    self.applied = False

  def apply(self) -> None:
    if not self.applied:
      _tb_util._exclude_paths.append(self.path)
      self.applied = True

  def revert(self) -> None:
    if self.applied:
      # The last occurrence is ours (appended after any earlier one).
      paths = _tb_util._exclude_paths
      del paths[len(paths) - 1 - paths[::-1].index(self.path)]
      self.applied = False


__all__ += ["PACKAGE_DIR", "TracebackExclusionEdit", "api_boundary"]
