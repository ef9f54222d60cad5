"""jit's C++ dispatch: the pytree registry its fast path flattens arguments
with (`jax._src.tree_util.dispatch_registry`), the node data that decides
which warm calls of a GDA may reuse a cached executable, and the verdict
that keeps a cache entry off the fast path
(`pxla.reflatten_outputs_for_dispatch`).

Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the registry's name or its
`register_node` signature; `HAS_DISPATCH_REGISTRY` turns False and GDA calls
take jit's slower Python path (still correct). `reflatten_outputs_for_dispatch`
renamed (`HAS_FAST_PATH_VERDICT` turns False; `tests/test_compat.py` names
it). And the interpreter's reference counting (`SOLE_OWNER_REFCOUNT` is
measured at import, and `tests/test_dispatch.py` fails if warm calls stop
hitting the fast path).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

from jax._src.interpreters import pxla as _pxla

from jax_sharding_ext._edit import STATE, Edit, replaced_error
from jax_sharding_ext._jax.buffers import view_freed, watched_shards
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
  bookkeeping `view_flatten` reads (`_node`, and `_later` while `_node` is
  `KEYED`); `unflatten(node_data, (array,))` rebuilds an output.
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
# (it never hashes it; equal objects compare by identity, with no Python).
# So the node data decides which calls may reuse a cached executable:
#
# * `None` when the GDA is its buffers' only owner (`_node` is None: no array
#   outside it holds them, `_array/family.py`) and its private array has no
#   other reference (not the same GDA earlier in this call: C++ holds every
#   leaf it has flattened). No other argument of the call can hold its
#   buffers.
# * `KEYED` (one object) when its buffers may appear elsewhere in the call:
#   the GDA is shared (a `jax.Array` over its buffers exists outside it and
#   may be passed in this call: nothing can tell, since C++ runs no Python for
#   a `jax.Array` leaf), or its private array was seen held twice (the same
#   GDA twice in a call). Such a GDA is keyed for good (`_node`), so that the
#   Python path of the call that fills a cache entry knows which of its
#   arguments were keyed (`record_call`). All of its buffers are alive: a
#   shared GDA's later shards are watched (another array over one may have
#   freed it).
# * a fresh `object()` for a deleted GDA (matches nothing: the Python path
#   raises the GDA-era error), `DISPATCH_OFF` while uninstalled.
#
# A keyed call matches a cached one by identity, at a sole owner's speed.
# What makes that safe is the Python path of the call that fills the cache
# entry: it sees the whole call (`_dispatch/donation.py`), and when an alias
# of a keyed argument could hurt its executable (it donates an argument a
# keyed one could share a buffer with), it keeps the entry off the fast path
# (`FastPathVerdictEdit`): every later call of that signature takes the
# Python path, where the donation check sees it. Whether an alias could
# hurt is decided from what the signature fixes (which arguments are GDAs,
# keyed or not, their shapes, dtypes and shardings, and the function's
# donation), so one answer holds for every call that matches the entry.

_getrefcount = sys.getrefcount
_get_ident = threading.get_ident
_is_deleted = ArrayImpl.is_deleted


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
_sole = 0
"""`SOLE_OWNER_REFCOUNT` while installed, else 0 (no count matches: every GDA
takes `_rare`, which gives `DISPATCH_OFF`). `open_gate` sets it."""


def open_gate(installed: bool) -> None:
  """Follow `STATE.installed` (called wherever it changes) on the fast path."""
  global _sole
  _sole = SOLE_OWNER_REFCOUNT if installed else 0


class _Keyed:
  """Node data of a GDA whose buffers may appear elsewhere in the call."""

  __slots__ = ()

  def __repr__(self) -> str:
    return "<GDA dispatch key: buffers possibly shared>"


KEYED = _Keyed()


def view_flatten(gda: Any) -> tuple[tuple[Any], Any]:
  """How jit's C++ dispatch flattens a GDA: `((its private jax.Array,), node data)`."""
  arr = gda._arr
  if _getrefcount(arr) == _sole and not _is_deleted(arr):
    if gda._node is None:
      return (arr,), None
    later = gda._later  # `jax_buffers.view_freed`, inlined: this runs for every argument
    if later is None:
      later = watched_shards(gda)
    if not later or not any(map(_is_deleted, later)):
      return (arr,), KEYED
  return (arr,), _rare(gda)


def _rare(gda: Any) -> Any:
  """Node data of a GDA off the plain paths: uninstalled, deleted (or a shared
  GDA with a buffer freed through another array), or held twice."""
  if not STATE.installed:
    return DISPATCH_OFF  # a key no warm entry has
  if view_freed(gda):
    return object()  # never cached: the Python path raises
  mark_keyed(gda)  # its private array is held again: the same GDA twice in this call
  return KEYED


def mark_keyed(view: Any, *, shared: bool = False) -> None:
  """Key `view` on jit's dispatch path for good (`KEYED`).

  `shared`: arrays outside `view` may hold its buffers, so its later shards
  are watched from now on (read on first use, `jax_buffers.watched_shards`).
  `_shared` and `_later` are set before `_node`, which readers check first.
  """
  if shared:
    if view._node is None or not view._shared:
      view._shared = True
      view._later = None
      view._node = KEYED
  elif view._node is None:
    view._shared = False
    view._later = ()  # no array outside it holds its buffers: nothing to watch
    view._node = KEYED


# --- the verdict: may this cache entry serve later calls on the fast path? ----

_verdict = threading.local()


def new_execution() -> None:
  """Forget the verdict of an earlier call: every execution on jit's Python
  path starts with none (the one it gets is read after it has run)."""
  _verdict.unsafe = False


def record_call(args: Any, donated: Any, gdas: Any, view_type: Any) -> None:
  """Decide whether an alias could hurt the running call's executable.

  Called on jit's Python path, by the donation check of a call with GDA
  arguments (`gdas`, the batch of `view_type` arguments being handed to the
  executable), before anything runs. `args` / `donated` are the flat
  arguments the executable receives and which are donated, or None when they
  could not be read (then a call with a keyed GDA is judged unsafe).

  A later call reuses this call's cache entry only if it matches this one
  leaf by leaf: the same shapes, dtypes and shardings, a `jax.Array` where
  this call had one, a keyed GDA where this one had one, and a GDA of node
  data None (its buffers' only owner, held once) where this one had that. So
  the arguments a keyed GDA `x` may share a buffer with in such a call are:
  any `jax.Array` and any keyed GDA with a buffer of `x`'s dtype and shard
  shape (stock can build those over `x`'s buffers, on any mesh of the same
  devices), and any GDA with `x`'s very shape, dtype and sharding (it may be
  `x` itself, passed again: its first occurrence is flattened before C++
  holds a second reference). If one of them or `x` is donated, the entry
  must stay off the fast path.
  """
  if args is None:  # the donation could not be read: never skip the check
    if any(g._node is KEYED for g in gdas):
      _verdict.unsafe = True
    return
  keyed = [x for x in args if type(x) is view_type and x._node is KEYED]
  for x in keyed:
    arr = x._arr
    loose, exact = _loose_like(arr), _like(arr)
    n_like = n_donated = 0
    for y, d in zip(args, donated, strict=True):
      if type(y) is view_type:
        other = y._arr
        if not (_loose_like(other) == loose if y._node is KEYED else _like(other) == exact):
          continue
      elif type(y) is ArrayImpl:
        if _loose_like(y) != loose:
          continue
      else:
        continue
      n_like += 1
      n_donated += bool(d)
    if n_like > 1 and n_donated:
      _verdict.unsafe = True
      return


def _like(arr: Any) -> tuple:
  return (arr.shape, arr.dtype, arr.sharding)


def _loose_like(arr: Any) -> tuple:
  return (arr.dtype, arr.sharding.shard_shape(arr.shape))


class _NotAnArray:
  """An output jit's C++ fast path cannot rebuild (`FastPathVerdictEdit`)."""

  __slots__ = ()


_NOT_AN_ARRAY = _NotAnArray()
_reflatten_owner: Any = _pxla
HAS_FAST_PATH_VERDICT = callable(getattr(_pxla, "reflatten_outputs_for_dispatch", None))


class FastPathVerdictEdit(Edit):
  """Keep a cache entry off jit's C++ fast path when `record_call` says so.

  jit's Python path (a cache miss, `jax.jit` and AOT `Compiled` alike) asks
  `pxla.reflatten_outputs_for_dispatch` for the outputs of the call it has
  just run, and caches the executable for C++ only if every output it gives
  is a `jax.Array`; otherwise the entry stays and every call that matches it
  takes the Python path. For a call judged unsafe, the wrapper adds one
  output that is not an array. Present in jax 0.8.3 to 0.12; when missing,
  no GDA ever leaves the Python path on a keyed signature (see `_rare`).
  """

  name = "pxla.reflatten_outputs_for_dispatch"

  def __init__(self):
    self.prev: Any = None
    self.wrapper: Any = None

  def _apply(self) -> None:
    if not HAS_FAST_PATH_VERDICT:  # pragma: no cover
      return
    prev = _reflatten_owner.reflatten_outputs_for_dispatch

    def reflatten_outputs_for_dispatch(out_tree, out_flat):
      out, tree = prev(out_tree, out_flat)
      if getattr(_verdict, "unsafe", False):
        _verdict.unsafe = False
        out = [*out, _NOT_AN_ARRAY]
      return out, tree

    self.prev = prev
    self.wrapper = functools.update_wrapper(reflatten_outputs_for_dispatch, prev)
    _reflatten_owner.reflatten_outputs_for_dispatch = self.wrapper

  def _check_revert(self) -> None:
    if (self.wrapper is not None
        and _reflatten_owner.reflatten_outputs_for_dispatch is not self.wrapper):
      raise replaced_error(self.name)

  def _revert(self) -> None:
    if self.wrapper is None:  # pragma: no cover
      return
    self._check_revert()
    _reflatten_owner.reflatten_outputs_for_dispatch = self.prev
    self.prev = self.wrapper = None
