"""Buffer donation for `GlobalDeviceArray` (`donate_argnums`).

A GDA is a view over one private `jax.Array`, and `jax.jit` hands that array's buffers
to the executable through `shard_arg_handlers` (`_transfer.shard_args`). A
donated argument is donated by PjRt when the executable runs, exactly as for
a `jax.Array`: XLA writes an output into the donated buffers where it can
alias them, and afterwards the wrapped array is deleted, so
`gda.is_deleted()` is true and every later use of the GDA (`local_data`,
`local_shards`, `np.asarray`, `to_jax_array`, passing it to `jit`) raises
`RuntimeError` from `GlobalDeviceArray._checked_array`.

What stock JAX does not do, and this module adds, is refuse a call that
donates an array that the same call also reads through another argument
(`f(donate(x), x)`, the same GDA twice in a pytree, a GDA next to its own
`to_jax_array()`), or an array that was already donated: PjRt notices those
only per partition, while it runs, and with several devices the process then
crashes (jaxlib 0.10.2). Two pieces make sure such a call never runs:

* `check_donated_args` runs in the GDA `shard_arg_handlers` entry (the Python
  dispatch path: a first call, a retrace, AOT `Compiled` calls), after
  compilation but before anything is executed or donated. It reads which
  arguments of the running call are donated (`jax_donation.current_call_donation`;
  the handler's own `copy_semantics` are `REUSE_INPUT` for every jit argument,
  donated or not) and raises `RuntimeError` naming both arguments. It checks
  every array argument of a call that involves a GDA.
* `dispatch_flatten` flattens a GDA for jit's C++ dispatch registry, the
  only Python that runs for an argument of a warm call. Its node data sends
  a call with a deleted GDA, or a call whose executable an alias of a GDA's
  buffers could hurt, to the Python path above; every other call keeps the
  C++ fast path (see "jit's C++ fast path" below).

Calls made only of `jax.Array`s never reach this package (stock behaviour).

`donation_vector` and `rebase_donate_argnums` are the GDA era's public
helpers for code that maps `donate_argnums` onto flattened arguments itself.
"""

from __future__ import annotations

import operator
import sys as _sys
import threading as _threading
import weakref as _weakref
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from jax_sharding_ext._jax import donation as jax_donation
from jax_sharding_ext._jax import tables as jax_tables


def parse_argnums(value: Any, name: str) -> tuple[int, ...]:
  """Normalise an int or an iterable of ints, naming `name` on bad input.

  The package's one parser of `static_argnums` / `donate_argnums`. A bool is
  refused, alone or inside the iterable: `True` is an int to Python, and read
  as argument 1 it would silently donate or freeze the wrong argument.
  """
  if value is None:
    return ()
  if isinstance(value, (int,)) and not isinstance(value, bool):
    return (value,)
  if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
    raise TypeError(
        f"`{name}` must be an int or a sequence of ints, got {value!r} "
        f"({type(value).__name__}). For example `{name}=(0, 2)`.")
  out = []
  for v in value:
    if isinstance(v, bool):
      raise TypeError(f"`{name}` must contain ints, got {v!r} in {value!r}.")
    try:
      out.append(operator.index(v))
    except TypeError:
      raise TypeError(
          f"`{name}` must contain ints, got {v!r} ({type(v).__name__}) in "
          f"{value!r}.") from None
  return tuple(out)


def donation_vector(donate_argnums: int | Iterable[int], args: Sequence[Any],
                    kwargs: dict[str, Any]) -> tuple[bool, ...]:
  """Return one bool per leaf of `args` and `kwargs`: is that leaf donated.

  Every leaf of positional argument `i` is donated when `i` is in
  `donate_argnums`; keyword arguments are never donated (seed semantics: use
  `jax.jit(..., donate_argnames=...)` for those). A `GlobalDeviceArray` is one
  leaf. Negative argnums count from the end of `args`, as in `jax.jit`.

  Args:
    donate_argnums: an int or an iterable of ints, positions in `args`.
    args: the positional arguments (pytrees).
    kwargs: the keyword arguments (pytrees).

  Returns:
    A tuple of bools, in `jax.tree_util` flattening order of `args` then
    `kwargs`.

  Example:
    >>> donation_vector((0,), ((x, y), z), {"w": w})
    (True, True, False, False)
  """
  nums = parse_argnums(donate_argnums, "donate_argnums")
  n = len(args)
  donated = {i + n if i < 0 else i for i in nums}
  res: list[bool] = []
  for i, arg in enumerate(args):
    res.extend((i in donated,) * jax.tree_util.tree_structure(arg).num_leaves)
  res.extend((False,) * jax.tree_util.tree_structure(kwargs).num_leaves)
  return tuple(res)


def rebase_donate_argnums(donate_argnums: int | Iterable[int],
                          static_argnums: int | Iterable[int]) -> tuple[int, ...]:
  """Shift `donate_argnums` to index the arguments left after removing statics.

  >>> rebase_donate_argnums((3, 4), (0, 1))
  (1, 2)

  Args:
    donate_argnums: an int or an iterable of ints.
    static_argnums: an int or an iterable of ints.

  Returns:
    A tuple of unique, sorted ints: each donated position minus the number of
    static positions before it.

  Raises:
    ValueError: an argument is both static and donated.
  """
  donate = sorted(set(parse_argnums(donate_argnums, "donate_argnums")))
  static = sorted(set(parse_argnums(static_argnums, "static_argnums")))
  if any(i < 0 for i in (*donate, *static)):
    raise ValueError(
        "`rebase_donate_argnums` needs non-negative argnums (it does not know "
        f"the number of arguments), got donate_argnums={donate} and "
        f"static_argnums={static}. Normalise negative positions with "
        "`i % num_args` first.")
  both = sorted(set(donate) & set(static))
  if both:
    raise ValueError(
        f"`static_argnums` {static} and `donate_argnums` {donate} cannot "
        f"intersect: argument(s) {both} are both static and donated. A static "
        "argument is a Python value baked into the compiled function, so it has "
        "no device buffer to donate; remove it from one of the two.")
  out = []
  i = 0
  for d in donate:
    while i < len(static) and static[i] < d:
      i += 1
    out.append(d - i)
  return tuple(out)


# ---------------------------------------------------------------------------
# Which objects share device buffers.
#
# A GDA keeps a private `jax.Array` (`gda._arr`) that it never hands out:
# `to_jax_array()` returns a *sibling*, a second `jax.Array` object over the
# same buffers, and `from_jax_array(x)` wraps a sibling of `x`. Siblings share
# deletion and donation (deleting one deletes all), so to the user they are
# one array; to this module they are a *family*, the set of objects whose
# buffers are the same. Knowing the family is what lets a call with a GDA
# whose buffers the program also holds elsewhere keep jit's C++ fast path.
# ---------------------------------------------------------------------------


class _Family:
  """The live `jax.Array` objects (weakly held) over one set of buffers."""

  __slots__ = ("members",)

  def __init__(self):
    self.members: list[_weakref.ref] = []

  def others_alive(self, arr: Any) -> bool:
    for ref in self.members:
      m = ref()
      if m is not None and m is not arr:
        return True
    return False


_family_of: dict[int, tuple[_weakref.ref, _Family]] = {}
"""`id(array)` -> (a weak reference to it, its family), for family members."""


def _join(arr: Any, family: _Family) -> None:
  key = id(arr)
  ref = _weakref.ref(arr, _Forget(key))
  family.members[:] = [m for m in family.members if m() is not None]
  family.members.append(ref)
  _family_of[key] = (ref, family)


class _Forget:
  """Weak-reference callback: drop a dead array's `_family_of` entry."""

  __slots__ = ("key", "table")

  def __init__(self, key: int):
    self.key, self.table = key, _family_of  # the table, even at shutdown

  def __call__(self, ref: _weakref.ref) -> None:
    entry = self.table.get(self.key)
    if entry is not None and entry[0] is ref:
      del self.table[self.key]


def family_of(arr: Any) -> _Family | None:
  entry = _family_of.get(id(arr))
  if entry is None or entry[0]() is not arr:
    return None
  return entry[1]


def buffers_id(arr: Any) -> int:
  """The same number for every `jax.Array` object over the same buffers."""
  family = family_of(arr)
  return id(arr) if family is None else id(family)


def sibling_of(gda: Any, arr: Any) -> Any:
  """A new `jax.Array` over `arr`'s buffers, recorded in `gda`'s family.

  `arr` is the GDA's private array (for `to_jax_array`) or the array a GDA is
  made from (for `from_jax_array`); either way both end up in one family.
  """
  family = family_of(arr)
  if family is None:
    family = _Family()
    _join(arr, family)
  sibling = jax_tables.sibling_array(arr)
  _join(sibling, family)
  gda._family = family
  return sibling


# ---------------------------------------------------------------------------
# The check run by the GDA `shard_arg_handlers` entry (the Python path).
# ---------------------------------------------------------------------------


def _arg_label(info: jax_donation.CallDonation, i: int) -> str:
  name = info.names[i] if info.names is not None else ""
  return f"`{name}` (flat argument {i})" if name else f"flat argument {i}"


def _describe(x: Any) -> str:
  if isinstance(x, jax_tables.ArrayImpl) and type(x) is jax_tables.ArrayImpl:
    return f"jax.Array(shape={tuple(x.shape)}, dtype={x.dtype})"
  return str(x)


def check_donated_args(gdas: Sequence[Any]) -> None:
  """Raise `RuntimeError` if the running call donates an array it also reads.

  Called by `_transfer.shard_args` with the batch of GDA arguments, before any
  of them is handed to the executable. Also records, on the dispatch keys of
  the call's GDAs, what jit's C++ cache needs to know about this executable
  (see `_AliasKey`).
  """
  if not gdas:
    return
  # The whole call is checked, not only this batch; the batch gives the GDA
  # type (so this module needs no import of `_gda`, which imports it).
  GlobalDeviceArray = type(gdas[0])
  info = jax_donation.current_call_donation()
  _record_call(info, gdas, GlobalDeviceArray)
  if info is None or not any(info.donated):
    return

  array_t = jax_tables.ArrayImpl
  positions: dict[int, list[int]] = {}
  for i, x in enumerate(info.args):
    t = type(x)
    if t is GlobalDeviceArray:
      arr = x._arr
    elif t is array_t:
      arr = x
    else:
      continue
    positions.setdefault(buffers_id(arr), []).append(i)
  for i, (x, donated) in enumerate(zip(info.args, info.donated, strict=True)):
    if not donated:
      continue
    t = type(x)
    if t is not GlobalDeviceArray and t is not array_t:
      continue
    same = positions[buffers_id(x._arr if t is GlobalDeviceArray else x)]
    if len(same) < 2:
      continue
    j = same[0] if same[0] != i else same[1]
    other = info.args[j]
    kind = ("the same GlobalDeviceArray" if other is x else
            "views of the same device buffers")
    raise RuntimeError(
        f"Cannot donate {_arg_label(info, i)}: the same call also passes it as "
        f"{_arg_label(info, j)} ({kind}: {_describe(x)}). A donated array's "
        "buffers are reused for the outputs, so it can be passed only once per "
        "call. Pass a copy for one of them (e.g. `jnp.copy(x)`), or remove it "
        "from `donate_argnums` / `donate_argnames`. Nothing was executed or "
        "donated.")


# ---------------------------------------------------------------------------
# jit's C++ fast path: the GDA dispatch-registry node's data.
#
# A warm `jax.jit` call never reaches `shard_arg_handlers`: the C++ dispatch
# path unpacks a GDA to its private `jax.Array` through
# `tree_util.dispatch_registry` (`jax_dispatch.DispatchNodeEdit`: a custom
# node whose flatten function is `dispatch_flatten`) and executes directly.
# There, stock jaxlib crashes the process (SIGSEGV, 8 CPU devices; for plain
# `jax.Array`s too) for an array that was already donated and for a call
# that donates an array it also passes undonated (`f(donate(g), g)`,
# `f(donate(g), g.to_jax_array())`). The flatten function is the one piece of
# Python that C++ runs for every GDA argument of every call, and the node data
# it returns is part of the C++ cache key: C++ compares it with `==` against
# the node data of each cached call of the same shape, after flattening the
# whole call and before running anything. So the node data decides which
# calls may reuse a cached executable:
#
# * `None` (the plain fast path) when the GDA's private array has no other
#   reference and no sibling alive: then no other argument of the call can
#   share its buffers.
# * an `_AliasKey` when its buffers may appear elsewhere in the call: its
#   private array is referenced again (the same GDA earlier in this call:
#   C++ holds every leaf it has flattened), or a sibling is alive (the
#   `jax.Array` the GDA was made from, or one `to_jax_array()` returned, held
#   by a variable or passed in this call: nothing can tell which, since C++
#   runs no Python for a `jax.Array` leaf). An alias always has the GDA's
#   shape, dtype and sharding, and C++ only matches calls whose arguments
#   have the same ones at the same places. So the key's `__eq__` matches a
#   cached call whenever that call's executable could not be hurt: it
#   donates no argument like the GDA, or the GDA is the only argument like
#   itself. Every other call takes the Python path, where
#   `check_donated_args` sees the whole call.
# * a fresh `object()` for a deleted GDA (matches nothing: the Python path
#   raises the GDA-era error), `DISPATCH_OFF` while uninstalled.
#
# What the cached executable donates is recorded on the keys of the call that
# filled the cache entry, by `check_donated_args` on that call's Python path.
# ---------------------------------------------------------------------------

_getrefcount = _sys.getrefcount
_get_ident = _threading.get_ident


class _RefcountProbe:
  __slots__ = ("_arr",)


def _sole_owner_refcount() -> int:
  """`getrefcount` of an object held only by one slot, read as `dispatch_flatten` reads it.

  Measured rather than assumed (3 on CPython 3.11 and 3.12: the slot, the
  local, the argument of `getrefcount`), so an interpreter that counts
  differently keeps the check sound; `tests/test_dispatch.py` fails if warm
  calls stop hitting the fast path.
  """
  probe = _RefcountProbe()
  probe._arr = object()
  arr = probe._arr
  return _getrefcount(arr)


_SOLE_OWNER = _sole_owner_refcount()


class _AliasKey:
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
    if type(other) is _AliasKey:
      return bool(self.safe or other.safe)
    return False  # `None`, a deleted GDA's or an uninstalled key

  __hash__ = object.__hash__  # C++ compares node data; it never hashes it

  def __repr__(self) -> str:
    return "<GDA dispatch key: buffers possibly shared>"


def _record_call(info, gdas, GlobalDeviceArray) -> None:
  """Record on the call's dispatch keys whether an alias could hurt its executable."""
  if info is None:  # the donation could not be read: never skip the check
    for g in gdas:
      _record(g, False)
    return
  keyed = [x for x in info.args if type(x) is GlobalDeviceArray and x._key is not None]
  if not keyed:
    return
  like: dict[tuple, list[int]] = {}  # (shape, dtype, sharding) -> [args, donated]
  for x, donated in zip(info.args, info.donated, strict=True):
    arr = x._arr if type(x) is GlobalDeviceArray else x
    if type(arr) is jax_tables.ArrayImpl:
      counts = like.setdefault(_like(arr), [0, 0])
      counts[0] += 1
      counts[1] += bool(donated)
  for x in keyed:
    n_like, n_donated = like[_like(x._arr)]
    _record(x, n_like == 1 or n_donated == 0)


def _like(arr: Any) -> tuple:
  return (arr.shape, arr.dtype, arr.sharding)


def _record(gda: Any, safe: bool) -> None:
  key = gda._key
  if key is None:
    return
  gda._key = None
  if key.safe is None and key.thread == _get_ident():
    key.safe = safe


def dispatch_flatten(gda: Any) -> tuple[tuple[Any], Any]:
  """How jit's C++ dispatch flattens a GDA: `((its private jax.Array,), node data)`."""
  arr = gda._arr
  if _getrefcount(arr) == _SOLE_OWNER and gda._dispatch_off is None and not arr.is_deleted():
    family = gda._family
    if family is None:
      return (arr,), None
    if not family.others_alive(arr):
      gda._family = None  # every sibling is gone: the plain fast path again
      return (arr,), None
    key = gda._key  # unrecorded, so no cache entry relies on it: reusable
    if key is None or key.thread != _get_ident():
      key = _alias_key(gda)
  else:
    key = _slow_key(gda)
  return (arr,), key


def _slow_key(gda: Any) -> Any:
  off = gda._dispatch_off
  if off is not None:
    return off  # uninstalled: a key no warm entry has
  if gda._arr.is_deleted():
    return object()  # never cached: the Python path raises
  return _alias_key(gda)  # the private array is referenced again


def _alias_key(gda: Any) -> _AliasKey:
  key = gda._key  # unrecorded, so no cache entry relies on it: reusable
  if key is None or key.thread != _get_ident():
    key = gda._key = _AliasKey()
  return key
