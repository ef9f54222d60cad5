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


def stock_result_handler(aval, sharding, committed):
  """The result handler stock JAX installed for `ShapedArray` outputs."""
  return _stock_shaped_array_result_handler(aval, sharding, committed)


_stock_shaped_array_result_handler = _pxla.global_result_handlers[ShapedArray]


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


class CanonicalizeEdit:
  """Enable canonicalisation of `typ` as the identity; undo disables it."""

  name = "canonicalize_value_handlers"

  def __init__(self, typ: type):
    self.typ = typ
    self.applied = False

  def apply(self) -> None:
    if self.applied:
      return
    if self.typ not in _canonicalize_enabled:
      _dtypes.register_canonicalize_value_handler(self.typ, _make_canonicalize_switch(self.typ))
    _canonicalize_enabled[self.typ] = True
    self.applied = True

  def revert(self) -> None:
    if self.applied:
      _canonicalize_enabled[self.typ] = False
      self.applied = False


def canonicalize_value(x: Any) -> Any:
  """`dtypes.canonicalize_value`: numpy/Python values to JAX's dtype rules."""
  return _dtypes.canonicalize_value(x)


def is_canonicalize_enabled(typ: type) -> bool:
  return bool(_canonicalize_enabled.get(typ))


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


def in_explicit_device_get() -> bool:
  """True inside `jax.device_get(...)` on this thread."""
  return bool(_guard_lib.thread_local_state().explicit_device_get)


# ---------------------------------------------------------------------------
# Backends (tests check that importing this package initialises none).
# ---------------------------------------------------------------------------


def initialized_backends() -> dict[str, Any]:
  return dict(_xb._backends)


def process_index() -> int:
  return _xb.process_index()


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations",)]
del _xc  # imported only to fail early if the module moved
