"""`jax.Array`'s surface on `GlobalDeviceArray`, forwarded to its `jax.Array` view.

The GDA of the GDA era had no operators, no indexing and no array methods.
Today's code expects them: with `jax_parallel_functions_output_gda` on, a
jitted loss comes back as a 0-d GDA and `float(loss)`, `f"{loss:.3f}"`,
`loss.item()` must work, and optax / flax tree maps do `t * 0.5` on every
leaf. So `_ArraySurface` gives a GDA exactly what its zero-copy `jax.Array`
view gives: each operator, method and property is that of the view, and the
results are what `jax.Array` returns (`jax.Array`s, as eager operations
already are), except that where `jax.Array` returns the array itself
(`astype` to its own dtype, `x[...]`, `reshape` to its own shape,
`to_device` of its own sharding) the GDA returns itself: its private
`jax.Array` is never handed out. Nothing old changes meaning: `==` / `!=`
keep the GDA-era `NotImplementedError` (defined on the class itself), `len`,
`str`, `repr` and `__array__` keep the GDA's own.

Conversions that read the value on the host (`float`, `int`, `complex`,
`operator.index`, `bool`, `format` with a spec, `item`, `tolist`,
`tobytes`) first fetch it through `_transfers.moves.to_host`, so the fetch is judged
by the transfer guard and recorded in the transfer ledger like
`np.asarray(gda)`; the view then reads its cached host copy. A conversion
that `jax.Array` refuses without reading the value (e.g. `float` of a
non-scalar) is refused the same way, before anything moves.
"""

from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any

from jax_sharding_ext._array import family
from jax_sharding_ext._jax.tables import ArrayImpl

_OPERATORS = (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "divmod", "pow", "matmul",
    "and", "or", "xor", "lshift", "rshift",
)
_BINARY = tuple(f"__{op}__" for op in _OPERATORS) + tuple(f"__r{op}__" for op in _OPERATORS) + (
    "__lt__", "__le__", "__gt__", "__ge__",
)
_UNARY = ("__neg__", "__pos__", "__abs__", "__invert__", "__round__", "__array_namespace__")
_SHARD_READING_UNARY = ("__iter__", "__reversed__", "__dlpack_device__", "__buffer__",
                        "__release_buffer__")
"""Methods whose stock implementation reads the array's single-device arrays."""

PUBLIC_METHODS = (
    "T", "all", "any", "argmax", "argmin", "argpartition", "argsort", "astype", "at",
    "byteswap", "choose", "clip", "compress", "conj", "conjugate", "copy", "cumprod",
    "cumsum", "device", "diagonal", "dot", "flat", "flatten", "imag", "mT", "max", "mean",
    "min", "nonzero", "prod", "ptp", "ravel", "real", "repeat", "reshape", "round",
    "searchsorted", "sort", "squeeze", "std", "sum", "swapaxes", "take", "to_device",
    "trace", "transpose", "var", "view", "is_ready", "platform", "_split", "_multi_slice",
    "_chunk_iter", "_unstack",
)
"""Names of `jax.Array` forwarded as they are (the GDA defines the rest)."""

SHARD_READING_METHODS = ("on_device_size_in_bytes", "unsafe_buffer_pointer")
"""Names of `jax.Array` whose stock implementation reads its single-device arrays."""

UNCHECKED = ("aval", "weak_type", "traceback", "__numpy_dtype__", "committed", "itemsize")
"""Names of `jax.Array` that stock reads without a live buffer (also once deleted)."""

HOST_METHODS = ("item", "tolist", "tobytes")
"""Public names of `jax.Array` that read the value on the host."""

_ACTION = "use it in a JAX operation"

_OWNERS: tuple[type[_ArraySurface], ...] = ()
"""The classes that took `_ArraySurface`'s members (`taken_by`)."""


def taken_by(cls: type[_ArraySurface]) -> None:
  """Record that `cls` has `_ArraySurface`'s members: its instances, as
  operands and indices, are unwrapped to their `jax.Array` views."""
  global _OWNERS
  if cls not in _OWNERS:
    _OWNERS += (cls,)


def _unwrap(x: Any) -> Any:
  """A GDA operand becomes its `jax.Array` view (also inside index tuples)."""
  if isinstance(x, _OWNERS):
    return x._checked_array(_ACTION)
  if type(x) is tuple:
    return tuple(_unwrap(e) for e in x)
  return x


def _own(gda: Any, arr: Any, out: Any) -> Any:
  """`out`, or `gda` where stock returned its array itself (`arr`)."""
  return gda if out is arr else out


def _binary(name: str):
  def method(self, other):
    arr = self._checked_array(_ACTION)
    return _own(self, arr, getattr(arr, name)(_unwrap(other)))
  method.__name__ = name
  return method


def _unary(name: str):
  def method(self, *args, **kwargs):
    arr = self._checked_array(_ACTION)
    return _own(self, arr, getattr(arr, name)(*args, **kwargs))
  method.__name__ = name
  return method


def _forwarded(name: str) -> Any:
  if isinstance(inspect.getattr_static(ArrayImpl, name), types.FunctionType):
    method = _unary(name)
    method.__doc__ = f"`jax.Array.{name}` of the zero-copy `jax.Array` view."
    method.__signature__ = _parameters_of(getattr(ArrayImpl, name))
    return method

  def get(self):
    arr = self._checked_array(_ACTION)
    return _own(self, arr, getattr(arr, name))
  return property(get, doc=f"`jax.Array.{name}` of the zero-copy `jax.Array` view.")


def _parameters_of(fn: Any) -> inspect.Signature:
  """`fn`'s parameters without their annotations (which name types of JAX's
  private modules): what `help()` and the API reference show for a
  forwarded method."""
  sig = inspect.signature(fn)
  return sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                 for p in sig.parameters.values()],
                     return_annotation=inspect.Signature.empty)


def _shard_reading(name: str) -> property:
  def get(self):
    return getattr(self._shard_array(_ACTION), name)
  return property(get, doc=f"`jax.Array.{name}` of the zero-copy `jax.Array` view.")


def _unchecked(name: str) -> property:
  def get(self):
    return getattr(self._arr, name)
  return property(get, doc=f"`jax.Array.{name}` of the zero-copy `jax.Array` view.")


def _shard_reading_unary(name: str):
  def method(self, *args, **kwargs):
    return getattr(self._shard_array(_ACTION), name)(*args, **kwargs)
  method.__name__ = name
  return method


def _host_forwarded(name: str) -> property:
  def get(self):
    return getattr(self._host_array(), name)
  return property(get, doc=f"`jax.Array.{name}`; the value is fetched as by `np.asarray`.")


def _scalar_conversion(name: str, fetch_if) -> Any:
  def method(self):
    arr = self._host_array() if fetch_if(self) else self._checked_array(_ACTION)
    return getattr(arr, name)()
  method.__name__ = name
  return method


def _is_scalar(self) -> bool:
  return self.ndim == 0


class _ArraySurface:
  """A part of `GlobalDeviceArray` (`_public.assembled`): operators, indexing, methods and conversions of `jax.Array`.

  The class assembled from it provides `_arr` (the view), `_checked_array(action)`
  (the live view, or a `RuntimeError` if deleted), `_shard_array(action)`
  (the same, with its single-device arrays built, safely across threads) and
  `_host_array()` (the view, after fetching its value to the host as an
  implicit, guarded, recorded transfer).
  """

  __slots__ = ()

  if TYPE_CHECKING:  # provided by the class assembled from it
    _arr: Any

    def _checked_array(self, action: str) -> Any: ...
    def _shard_array(self, action: str) -> Any: ...
    def _host_array(self) -> Any: ...

  def __getitem__(self, idx):
    arr = self._checked_array(_ACTION)
    return _own(self, arr, arr[_unwrap(idx)])

  def __setitem__(self, idx, value):
    self._checked_array(_ACTION)[_unwrap(idx)] = value  # raises jax.Array's TypeError

  def __contains__(self, value):
    return _unwrap(value) in self._checked_array(_ACTION)

  # `jax.Array` refuses these before reading the value when the array is not
  # a scalar (or, for `bool`, has more than one element); fetch only if it
  # will read it.
  __float__ = _scalar_conversion("__float__", _is_scalar)
  __int__ = _scalar_conversion("__int__", _is_scalar)
  __complex__ = _scalar_conversion("__complex__", _is_scalar)
  __index__ = _scalar_conversion("__index__", _is_scalar)
  __bool__ = _scalar_conversion("__bool__", lambda self: self.size == 1)

  def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
    """`jax.Array.__dlpack__` (one device). The consumer may wrap the
    buffer as an array the package does not see (`family.py`)."""
    arr = self._shard_array(_ACTION)
    family.mark_shared(self)
    return arr.__dlpack__(*args, **kwargs)

  def _rewrap_with_aval_and_sharding(self, aval: Any, sharding: Any) -> Any:
    """`jax.Array._rewrap_with_aval_and_sharding`: a `jax.Array` over the
    same buffers with another aval and sharding (no copy)."""
    out = self._checked_array(_ACTION)._rewrap_with_aval_and_sharding(aval, sharding)
    family.mark_shared(self)
    return out

  def __format__(self, format_spec: str) -> str:
    if not format_spec:  # `f"{gda}"` is `str(gda)`, as for any Python object
      return str(self)
    return self._host_array().__format__(format_spec)


def _define(names, make) -> None:
  """Give `_ArraySurface` each of `names` that this JAX's `jax.Array` has."""
  for name in names:
    if hasattr(ArrayImpl, name):
      setattr(_ArraySurface, name, make(name))


for _name in _BINARY:
  setattr(_ArraySurface, _name, _binary(_name))
del _name
_define(_UNARY, _unary)
_define(_SHARD_READING_UNARY, _shard_reading_unary)
_define(PUBLIC_METHODS, _forwarded)
_define(SHARD_READING_METHODS, _shard_reading)
_define(UNCHECKED, _unchecked)
_define(HOST_METHODS, _host_forwarded)
