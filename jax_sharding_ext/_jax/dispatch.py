"""jit's C++ dispatch: the pytree registry its fast path flattens arguments
with (`jax._src.tree_util.dispatch_registry`), and the node data that decides
which warm calls of a GDA may reuse a cached executable.

Checked against JAX 0.10.2 (Python 3.11) and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the registry's name or its
`register_node` signature; `HAS_DISPATCH_REGISTRY` turns False and GDA calls
take jit's slower Python path (still correct). And the interpreter's
reference counting (`SOLE_OWNER_REFCOUNT` is measured at import, and
`tests/test_dispatch.py` fails if warm calls stop hitting the fast path).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from jax_sharding_ext._edit import STATE
from jax_sharding_ext._jax.buffers import later_deleted, view_freed, watched_shards
from jax_sharding_ext._jax.tables import ArrayImpl, RegisterOnceEdit

# --- the registry -------------------------------------------------------------
# jit's C++ fast path (`PjitFunction`) accepts only `ArrayImpl`, numpy arrays
# and scalars as leaves; any other type drops every call to the Python
# `cache_miss` path (about 10x slower on one device). Its one extension point
# is `tree_util.dispatch_registry`, the pytree registry the C++ path flattens
# arguments (and rebuilds outputs) with, and nothing else does; JAX's own
# PRNG key arrays and `EArray` use it the same way. A type registered there as
# a node whose one child is its `ArrayImpl` reaches the fast path as that
# array, while `jax.tree_util`, tracing and the extension tables still see it
# as a leaf. A custom node (`register_node`: a Python flatten and unflatten
# function) rather than a dataclass node: C++ rebuilds a dataclass node by
# calling its class with keyword arguments (~0.4 us a GDA output, measured),
# a custom node by calling the unflatten function (~0.14 us). Present in jax
# 0.10.2 and 0.12.x; when missing, dispatch stays correct but takes the slow
# path.
# The registry has no unregister; uninstalled, the flatten function returns
# `DISPATCH_OFF` as node data, so cached C++ signatures stop matching and
# calls fall back to the Python path (where an uninstalled type is rejected).

try:
  from jax._src import tree_util as _tree_util
  _dispatch_registry: Any = getattr(_tree_util, "dispatch_registry", None)
except ImportError:  # pragma: no cover
  _dispatch_registry = None

HAS_DISPATCH_REGISTRY = _dispatch_registry is not None


class DispatchOff:
  """Node data of a dispatch node while the package is uninstalled."""

  __slots__ = ()

  def __repr__(self):
    return "<jax_sharding_ext uninstalled>"


DISPATCH_OFF = DispatchOff()


class DispatchNodeEdit(RegisterOnceEdit):
  """Let jit's C++ fast path unpack a view type to its private array.

  Instances of `typ` hold their `jax.Array` in the slot `_arr` and the
  bookkeeping `view_flatten` reads (`_shared`, `_later`, `_key`); `unflatten(node_data,
  (array,))` rebuilds an output.
  """

  name = "tree_util.dispatch_registry"
  _registered: set[type] = set()

  def __init__(self, typ: type, unflatten: Any):
    super().__init__(typ)
    self._unflatten = unflatten

  def _available(self) -> bool:
    return HAS_DISPATCH_REGISTRY

  def _register(self) -> None:
    _dispatch_registry.register_node(self.typ, view_flatten, self._unflatten)


def dispatch_flatten(x: Any) -> tuple[list[Any], Any]:
  """Flatten `x` as jit's C++ dispatch does (for tests)."""
  return _dispatch_registry.flatten(x)


# --- the node data: when may a warm call reuse a cached executable? ------------
# A warm `jax.jit` call never reaches `shard_arg_handlers`: the C++ dispatch
# path unpacks a GDA to its private `jax.Array` through the registry above
# and executes directly. There, stock jaxlib crashes the process (SIGSEGV, 8
# CPU devices; for plain `jax.Array`s too) for an array that was already
# donated and for a call that donates an array it also passes undonated
# (`f(donate(g), g)`, `f(donate(g), g.to_jax_array())`). The flatten function
# is the one piece of Python that C++ runs for every GDA argument of every
# call, and the node data it returns is part of the C++ cache key: C++
# compares it with `==` against the node data of each cached call of the
# same shape, after flattening the whole call and before running anything
# (it never hashes it). So the node data decides which calls may reuse a
# cached executable:
#
# * `None` (the plain fast path) when the GDA's private array has no other
#   reference and the GDA is not shared (`_array/family.py`): then no other
#   argument of the call can hold its buffers.
# * an `AliasKey` when its buffers may appear elsewhere in the call: its
#   private array is referenced again (the same GDA earlier in this call:
#   C++ holds every leaf it has flattened), or the GDA is shared (a
#   `jax.Array` over its buffers exists outside it, and may be passed in this
#   call: nothing can tell, since C++ runs no Python for a `jax.Array` leaf).
#   An alias has the GDA's dtype and shard shape, and C++ only matches calls
#   whose arguments have the same shapes, dtypes and shardings at the same
#   places. So the key's `__eq__` matches a cached call whenever that call's
#   executable could not be hurt by an alias (`record_call` says when).
#   Every other call takes the Python path, where the donation check sees
#   the whole call.
# * a fresh `object()` for a deleted GDA (matches nothing: the Python path
#   raises the GDA-era error), `DISPATCH_OFF` while uninstalled.
#
# What the cached executable donates is recorded on the keys of the call that
# filled the cache entry (`record_call`), by the donation check on that
# call's Python path.

_getrefcount = sys.getrefcount
_get_ident = threading.get_ident


class _RefcountProbe:
  __slots__ = ("_arr",)
  _arr: object


def _sole_owner_refcount() -> int:
  """`getrefcount` of an object held only by one slot, read as `view_flatten` reads it.

  Measured rather than assumed (3 on CPython 3.11 and 3.12: the slot, the
  local, the argument of `getrefcount`), so an interpreter that counts
  differently keeps the check sound.
  """
  probe = _RefcountProbe()
  probe._arr = object()
  arr = probe._arr
  return _getrefcount(arr)


SOLE_OWNER_REFCOUNT = _sole_owner_refcount()


class AliasKey:
  """Node data of a GDA whose buffers may appear elsewhere in the call."""

  __slots__ = ("safe", "thread")

  def __init__(self):
    # Recorded by the Python path of the call that fills the cache entry.
    self.safe: bool | None = None
    self.thread = _get_ident()

  def __eq__(self, other: object) -> bool:
    # One side is the cached call's key; the other is new and has no record.
    # No record at all (no GDA of the cached call reached
    # `shard_arg_handlers`: it failed, or never passed this argument to its
    # executable) matches nothing.
    if type(other) is AliasKey:
      return bool(self.safe or other.safe)
    return False  # `None`, a deleted GDA's or an uninstalled key

  __hash__ = object.__hash__  # C++ compares node data; it never hashes it

  def __repr__(self) -> str:
    return "<GDA dispatch key: buffers possibly shared>"


def view_flatten(gda: Any) -> tuple[tuple[Any], Any]:
  """How jit's C++ dispatch flattens a GDA: `((its private jax.Array,), node data)`."""
  arr = gda._arr
  if _getrefcount(arr) == SOLE_OWNER_REFCOUNT and STATE.installed and not arr.is_deleted():
    if not gda._shared:
      return (arr,), None
    later = gda._later  # `view_freed`, inlined: this runs for every argument
    if later is None:
      later = watched_shards(gda)
    if not (later and later_deleted(later)):  # another array over one may be gone
      return (arr,), _alias_key(gda)
  return (arr,), _slow_key(gda)


def _slow_key(gda: Any) -> Any:
  if not STATE.installed:
    return DISPATCH_OFF  # a key no warm entry has
  if view_freed(gda):
    return object()  # never cached: the Python path raises
  return _alias_key(gda)  # the private array is referenced again


def _alias_key(gda: Any) -> AliasKey:
  key = gda._key  # unrecorded, so no cache entry relies on it: reusable
  if key is None or key.thread != _get_ident():
    key = gda._key = AliasKey()
  return key


def record_call(args: Any, donated: Any, gdas: Any, view_type: Any) -> None:
  """Record on the call's dispatch keys whether an alias could hurt its executable.

  `args` / `donated` are the flat arguments of the running call and which
  are donated, or None when they could not be read (then nothing is
  recorded safe); `gdas` the batch of `view_type` arguments being handed to
  the executable.

  A later call reuses this executable only if it matches this one leaf by
  leaf: the same shapes, dtypes and shardings, a `jax.Array` where this call
  had one, a GDA on an alias key where this one had one, and a GDA whose
  node data is None (its buffers' only owner when flattened) where this one
  had that. So the arguments a keyed GDA `x` may share a buffer with in such
  a call are: any `jax.Array` and any keyed GDA with a buffer of `x`'s dtype
  and shard shape (stock can build those over `x`'s buffers, on any mesh of
  the same devices), and any GDA with `x`'s very shape, dtype and sharding
  (it may be `x` itself, passed again: its first occurrence is flattened
  before C++ holds a second reference). If one of them or `x` is donated,
  the executable is not safe for `x`.
  """
  if args is None:  # the donation could not be read: never skip the check
    for g in gdas:
      _record(g, False)
    return
  keyed: list[Any] = [x for x in args if type(x) is view_type and x._key is not None]
  if not keyed:
    return
  for x in keyed:
    arr = x._arr
    loose, exact = _loose_like(arr), _like(arr)
    n_like = n_donated = 0
    for y, d in zip(args, donated, strict=True):
      if type(y) is view_type:
        other = y._arr
        if not (_loose_like(other) == loose if y._key is not None else _like(other) == exact):
          continue
      elif type(y) is ArrayImpl:
        if _loose_like(y) != loose:
          continue
      else:
        continue
      n_like += 1
      n_donated += bool(d)
    _record(x, n_like == 1 or n_donated == 0)


def _like(arr: Any) -> tuple:
  return (arr.shape, arr.dtype, arr.sharding)


def _loose_like(arr: Any) -> tuple:
  return (arr.dtype, arr.sharding.shard_shape(arr.shape))


def _record(gda: Any, safe: bool) -> None:
  key = gda._key
  if key is None:
    return
  gda._key = None
  if key.safe is None and key.thread == _get_ident():
    key.safe = safe
