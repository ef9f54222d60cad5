"""JAX's extension tables keyed by Python type, and reversible edits of them.

Touches: `jax._src.core` (`pytype_aval_mappings`, `ShapedArray`),
`jax._src.interpreters.pxla` (`shard_arg_handlers`, `global_result_handlers`,
`batched_device_put`), `jax._src.interpreters.mlir` (`_constant_handlers`),
`jax._src.dtypes` (`register_canonicalize_value_handler`, which writes
jaxlib's C++ registry), `jax._src.array` (`ArrayImpl`), `jax._src.dispatch`
(`_batched_device_put_impl`), and the eager rules (`Primitive.impl`) of
`jax.experimental.multihost_utils`' two primitives. Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: a table renamed or moved (the import
below fails with the module's name), or the canonicalisation registry's C++
signature (`CanonicalizeEdit`), or `dispatch._batched_device_put_impl`
(`DevicePutEdit` refuses to apply and says so).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jax_sharding_ext._edit import STATE, Edit, replaced_error, uninstalled_error
from jax_sharding_ext._jax import UnsupportedJaxVersionError

# All private imports below. If one of them fails, the version check above
# passed, so the message names the module that moved.
try:
  from jax._src import array as _array
  from jax._src import core as _core
  from jax._src import dispatch as _fx_dispatch
  from jax._src import dtypes as _dtypes
  from jax._src.interpreters import mlir as _mlir
  from jax._src.interpreters import pxla as _pxla
except ImportError as e:  # pragma: no cover - only on an unsupported JAX
  raise UnsupportedJaxVersionError(
      f"jax_sharding_ext could not import a JAX internal it needs ({e}) from "
      f"jax {jax.__version__}. This JAX release moved it; please report the "
      "version so `jax_sharding_ext/_jax/` can learn the new location.") from e

MISSING = object()

ArrayImpl = _array.ArrayImpl
"""The concrete `jax.Array` class (not subclassable: it is a C++ type)."""


# ---------------------------------------------------------------------------
# Reversible table edits.
#
# Every dict-like table this package writes into is edited through `TableEdit`,
# which remembers what was there before so `uninstall()` can restore exactly
# the prior contents, and refuses to clobber an entry someone else replaced in
# the meantime (chex `restrict_backends` style).
# ---------------------------------------------------------------------------


class TableEdit(Edit):
  """One `table[key] = value` that can be undone."""

  def __init__(self, name: str, table: Any, key: Any, value: Any):
    self.name, self.table, self.key, self.value = name, table, key, value
    self.prev: Any = MISSING

  def _apply(self) -> None:
    self.prev = self.table.get(self.key, MISSING)
    self.table[self.key] = self.value

  def _check_revert(self) -> None:
    if self.table.get(self.key, MISSING) is not self.value:
      raise replaced_error(f"{self.name}[{self.key!r}]")

  def _revert(self) -> None:
    self._check_revert()
    if self.prev is MISSING:
      del self.table[self.key]
    else:
      self.table[self.key] = self.prev


# ---------------------------------------------------------------------------
# pytype_aval_mappings: `core.pytype_aval_mappings` only since jax 0.5.0
# (commits 2c722d9b13, 3cecbf34f2); before that also `xla.pytype_aval_mappings`
# and `api_util._shaped_abstractify_handlers`.
# ---------------------------------------------------------------------------

pytype_aval_mappings: dict[type, Callable[[Any], Any]] = _core.pytype_aval_mappings
_array_aval = _core.pytype_aval_mappings[ArrayImpl]


sharding_of = operator.attrgetter("_sharding")
"""`jax.Array.sharding` read in C (the public property is Python)."""


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

# An executable's result handlers are built with its `unsafe_call`
# (`pxla.UnloadedMeshExecutable.build_unsafe_call`), lazily: a jit cache miss
# builds it right after compiling, but an AOT `Compiled` only at its first
# call, so a handler that reads the config would see the config of that
# first call, for ever after. `EagerResultHandlersEdit` builds it when the
# executable is loaded (`UnloadedMeshExecutable.load`, every compilation in
# jax 0.10.2 and 0.12.x), so that a `Compiled` keeps the config it was
# compiled under. No table exists for this; the method is wrapped with a
# reversible edit that refuses to clobber someone else's wrapper.

_LOAD_OWNER: Any = getattr(_pxla, "UnloadedMeshExecutable", None)


class EagerResultHandlersEdit(Edit):
  """Choose an executable's result handlers when it is compiled."""

  name = "pxla.UnloadedMeshExecutable.load"

  def __init__(self):
    self.prev: Any = None
    self.wrapper: Any = None

  def _apply(self) -> None:
    if _LOAD_OWNER is None or not hasattr(_LOAD_OWNER, "load"):  # pragma: no cover
      return  # this JAX compiles elsewhere: handlers stay lazy (stock behaviour)
    prev = _LOAD_OWNER.__dict__["load"]

    def load(self_):
      executable = prev(self_)
      try:
        _ = executable.unsafe_call  # builds the result handlers now
      except Exception:  # pragma: no cover - left to the first call, as stock does
        pass
      return executable

    self.prev, self.wrapper = prev, load
    _LOAD_OWNER.load = load

  def _check_revert(self) -> None:
    if self.wrapper is not None and _LOAD_OWNER.__dict__.get("load") is not self.wrapper:
      raise replaced_error(self.name)

  def _revert(self) -> None:
    if self.wrapper is None:  # pragma: no cover
      return
    self._check_revert()
    _LOAD_OWNER.load = self.prev
    self.prev = self.wrapper = None


@functools.lru_cache(maxsize=256)
def is_plain_dtype(dtype) -> bool:
  """True for the dtypes a `GlobalDeviceArray` can hold: JAX's array dtypes of
  numbers (not strings, objects or dates, which JAX refuses; not float0 or
  extended dtypes)."""
  if dtype == _dtypes.float0 or _dtypes.issubdtype(dtype, _dtypes.extended):
    return False
  try:
    _dtypes.check_valid_dtype(dtype)
  except TypeError:
    return False
  return True


# ---------------------------------------------------------------------------
# Value canonicalisation. Since jax 0.10.2 (jaxlib extension 464, cd8549e7cf)
# the registry lives in C++ (`_jax.register_canonicalize_value_handler`) and
# has no way to remove an entry; `dtypes.canonicalize_value_handlers` is a
# write-only shim, so it is never read here. To keep `uninstall()` honest, the
# handler registered reads the install state: installed, it is the identity;
# uninstalled, it raises the package's "uninstalled" error.
# Before (jax 0.8.x to 0.10.1) `dtypes.canonicalize_value_handlers` is a plain
# dict that `dtypes.canonicalize_value` reads (the type, then its MRO), so the
# entry is an ordinary `TableEdit` that `uninstall()` takes out.
# ---------------------------------------------------------------------------

CANONICALIZE_TABLE_IS_DICT = type(_dtypes.canonicalize_value_handlers) is dict
"""True before jax 0.10.2: the canonicalisation registry is a Python dict."""


class RegisterOnceEdit(Edit):
  """An entry in a JAX registry that has no way to remove one.

  The entry is registered the first time it is applied and stays; its
  handler reads `STATE.installed`, so after `uninstall()` it refuses the type
  (or acts as stock JAX does for it) even though the registration remains.
  """

  _registered: set[type]

  def __init__(self, typ: type):
    self.typ = typ

  def _available(self) -> bool:
    return True

  def _register(self) -> None:
    raise NotImplementedError

  def _apply(self) -> None:
    if self.typ not in self._registered and self._available():
      self._register()
      self._registered.add(self.typ)

  def _revert(self) -> None:
    pass  # the handler reads `STATE.installed`


def _canonicalize_switch(x):
  # Uninstalled: the package's RuntimeError, as `__jax_array__` raises it.
  # Not stock's `InvalidInputException`: jit turns that into a TypeError
  # saying the type is not a valid JAX type, which is what a call racing
  # `uninstall()` would then show (traced installed, run uninstalled).
  if STATE.installed:
    return x
  raise uninstalled_error(str(x))


class _RegisteredCanonicalizeEdit(RegisterOnceEdit):
  """Canonicalise `typ` as the identity; uninstalled, it raises as stock does."""

  name = "canonicalize_value_handlers"
  _registered: set[type] = set()

  def _register(self) -> None:
    # jax 0.10.2 and later (older stubs lack it).
    _dtypes.register_canonicalize_value_handler(  # type: ignore[attr-defined, unused-ignore]
        self.typ, _canonicalize_switch)


class _DictCanonicalizeEdit(TableEdit):
  """Canonicalise `typ` as the identity (the dict registry before jax 0.10.2)."""

  def __init__(self, typ: type):
    super().__init__("dtypes.canonicalize_value_handlers", _dtypes.canonicalize_value_handlers,
                     typ, _canonicalize_switch)


def CanonicalizeEdit(typ: type) -> Edit:  # named as the class it returns
  """The edit that makes JAX canonicalise values of `typ` as the identity."""
  if CANONICALIZE_TABLE_IS_DICT:
    return _DictCanonicalizeEdit(typ)
  return _RegisteredCanonicalizeEdit(typ)


def canonicalize_value(x: Any) -> Any:
  """`dtypes.canonicalize_value`: numpy/Python values to JAX's dtype rules."""
  return _dtypes.canonicalize_value(x)


def canonical_dtype(dtype: Any) -> Any:
  """`dtype` under JAX's dtype rules (e.g. float64 as float32 without x64)."""
  return _dtypes.canonicalize_dtype(dtype)


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


# --- jax.device_put of a GDA ---------------------------------------------
# Two decisions of `jax.device_put` look at the value's class, and no table
# exists for either; both are made in `dispatch._batched_device_put_impl`,
# which `jax.device_put` calls eagerly through the module attribute (jax
# 0.10.2 and 0.12.x; under a trace it binds `device_put_p`, whose operands
# are tracers), with the values and their targets side by side:
# * no target (`jax.device_put(x)`): a committed `jax.Array` stays where it
#   is (`dispatch._device_put_sharding_impl` returns it unchanged, or copies
#   it onto its own sharding); any other type is treated like host data and
#   lands on the default device, uncommitted, before a shard-arg handler ever
#   sees it, so a GDA would silently move all its shards to device 0;
# * a target or a value spanning other processes: only an `ArrayImpl` is
#   resharded there (`_different_device_order_reshard` and the cross-host
#   copy); any other type is refused ("device_put's second argument must be
#   a Device or a Sharding which represents addressable devices").
# The attribute is wrapped, with a reversible edit that refuses to clobber
# someone else's wrapper.
# ---------------------------------------------------------------------------

_DP_IMPL_NAME = "_batched_device_put_impl"


class DevicePutEdit(Edit):
  """`jax.device_put` of values of `typ`.

  `prepare(xs, devices)` returns the values and targets to hand to stock, and
  a function to call with stock's results once it has placed them (or None).
  """

  name = f"dispatch.{_DP_IMPL_NAME}"

  def __init__(self, typ: type, prepare: Callable[[list, list], tuple]):
    self.typ = typ
    self.prepare = prepare
    self.prev: Any = None
    self.wrapper: Any = None

  def _apply(self) -> None:
    prev = getattr(_fx_dispatch, _DP_IMPL_NAME)
    typ, prepare = self.typ, self.prepare

    def _batched_device_put_impl(*xs, devices, **kwargs):
      if not any(type(x) is typ for x in xs):
        return prev(*xs, devices=devices, **kwargs)
      xs, devices, done = prepare(list(xs), list(devices))
      out = prev(*xs, devices=devices, **kwargs)
      if done is not None:
        done(out)
      return out

    self.prev = prev
    self.wrapper = _batched_device_put_impl
    setattr(_fx_dispatch, _DP_IMPL_NAME, _batched_device_put_impl)

  def _check_revert(self) -> None:
    if getattr(_fx_dispatch, _DP_IMPL_NAME) is not self.wrapper:
      raise replaced_error(self.name)

  def _revert(self) -> None:
    self._check_revert()
    setattr(_fx_dispatch, _DP_IMPL_NAME, self.prev)
    self.prev = self.wrapper = None


class PrimitiveImplEdit(Edit):
  """A primitive's eager rule (`prim.impl`, what `def_impl` set) given values
  of `typ` as `convert(x)`: for a stock rule that recognises only its own
  array class."""

  def __init__(self, prim: Any, typ: type, convert: Callable[[Any], Any]):
    self.prim, self.typ, self.convert = prim, typ, convert
    self.name = f"{prim.name}.impl"
    self.prev: Any = None
    self.wrapper: Any = None

  def _apply(self) -> None:
    prev, typ, convert = self.prim.impl, self.typ, self.convert

    def impl(*args, **params):
      return prev(*(convert(a) if type(a) is typ else a for a in args), **params)

    self.prev, self.wrapper = prev, impl
    self.prim.impl = impl

  def _check_revert(self) -> None:
    if self.prim.impl is not self.wrapper:
      raise replaced_error(self.name)

  def _revert(self) -> None:
    self._check_revert()
    self.prim.impl = self.prev
    self.prev = self.wrapper = None


def multihost_primitives() -> tuple[Any, ...]:
  """`jax.experimental.multihost_utils`' primitives whose eager rules test for
  `ArrayImpl` (`host_local_array_to_global_array`,
  `global_array_to_host_local_array`); those this JAX lacks are left out."""
  from jax.experimental import multihost_utils as _mhu
  names = ("host_local_array_to_global_array_p", "global_array_to_host_local_array_p")
  return tuple(getattr(_mhu, n) for n in names if hasattr(_mhu, n))


# Stock `multihost_utils` names this package re-exports as they are, which
# not every supported release has: `ProcessFailureError` (jax 0.10.1).
# A name this JAX lacks is absent from `jax_sharding_ext.multihost_utils` too.
OPTIONAL_MULTIHOST_NAMES = ("ProcessFailureError",)


def optional_multihost_names() -> dict[str, Any]:
  """Those of `OPTIONAL_MULTIHOST_NAMES` this JAX's `multihost_utils` has."""
  from jax.experimental import multihost_utils as _mhu
  return {n: getattr(_mhu, n) for n in OPTIONAL_MULTIHOST_NAMES if hasattr(_mhu, n)}
