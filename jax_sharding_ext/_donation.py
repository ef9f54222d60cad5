"""Buffer donation for `GlobalDeviceArray` (seed `004_*`, `donate_argnums`).

A GDA is a view over one `jax.Array`, and `jax.jit` hands that array's buffers
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
  only Python that runs for an argument of a warm call, so that a call with a
  deleted GDA, or with any other reference to a GDA's array (a possible
  alias), misses the C++ cache and takes the Python path above.

Calls made only of `jax.Array`s never reach this package (stock behaviour).

`donation_vector` and `rebase_donate_argnums` are the seed's public helpers
for code that maps `donate_argnums` onto flattened arguments itself.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from jax_sharding_ext._jax import donation as jax_donation
from jax_sharding_ext._jax import tables as jax_tables


def _argnums(value: Any, name: str) -> tuple[int, ...]:
  """Normalise an int or an iterable of ints, naming `name` on bad input."""
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
  nums = _argnums(donate_argnums, "donate_argnums")
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
  donate = sorted(set(_argnums(donate_argnums, "donate_argnums")))
  static = sorted(set(_argnums(static_argnums, "static_argnums")))
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
# The check run by the GDA `shard_arg_handlers` entry.
# ---------------------------------------------------------------------------


def _arg_label(info: jax_donation.CallDonation, i: int) -> str:
  name = info.names[i] if info.names is not None else ""
  return f"`{name}` (flat argument {i})" if name else f"flat argument {i}"


def _describe(x: Any) -> str:
  if isinstance(x, jax_tables.ArrayImpl):
    return f"jax.Array(shape={tuple(x.shape)}, dtype={x.dtype})"
  return str(x)


def check_donated_args(gdas: Sequence[Any]) -> None:
  """Raise `RuntimeError` if the running call donates an array it also reads.

  Called by `_transfer.shard_args` with the batch of GDA arguments, before any
  of them is handed to the executable.
  """
  if not gdas:
    return
  # The whole call is checked, not only this batch; the batch gives the GDA
  # type (so this module needs no import of `_gda`, which imports it).
  GlobalDeviceArray = type(gdas[0])
  info = jax_donation.current_call_donation()
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
    positions.setdefault(id(arr), []).append(i)
  for i, (x, donated) in enumerate(zip(info.args, info.donated, strict=True)):
    if not donated:
      continue
    t = type(x)
    if t is not GlobalDeviceArray and t is not array_t:
      continue
    same = positions[id(x._arr if t is GlobalDeviceArray else x)]
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
# jit's C++ fast path: the GDA dispatch-registry node's static key.
#
# A warm `jax.jit` call never reaches `shard_arg_handlers`: the C++ dispatch
# path unpacks a GDA to its `jax.Array` through `tree_util.dispatch_registry`
# (`jax_dispatch.DispatchNodeEdit`: a custom node whose flatten function is
# `dispatch_flatten`, children `(gda._arr,)`, node data the key below) and
# executes directly. There, stock jaxlib 0.10.2 crashes the process (SIGSEGV,
# 8 CPU devices) for an array that was already donated and for a call that
# donates an array it also passes undonated (`f(donate(g), g)`,
# `f(g.to_jax_array(), donate(g))`). The flatten function is the one piece of
# Python that C++ runs for every GDA argument of every call, and the node data
# it returns is part of the C++ cache key, so that key decides which calls may
# use a cached executable:
#
# * `None` (cacheable: the fast path) only when nothing but this GDA holds a
#   reference to its `jax.Array`. Then no other argument of the call can be
#   that array: every argument of a call is referenced by the call itself
#   (C++ holds each leaf it has flattened, the caller holds the arguments),
#   so an alias anywhere in the call -- the same GDA twice, two GDAs over one
#   array, the GDA's own `to_jax_array()` -- shows as an extra reference.
# * a fresh `object()` otherwise (deleted, or referenced elsewhere): it matches
#   no cache entry, so the call takes the Python path, where
#   `GlobalDeviceArray._checked_array` refuses a deleted array and
#   `check_donated_args` refuses a donated alias, before anything runs.
#
# The price of soundness: while the program keeps another reference to a
# GDA's `jax.Array` (`arr = gda.to_jax_array()` kept alive, or the array a GDA
# was made from with `from_jax_array`), calls with that GDA take JAX's Python
# dispatch path. Counting references cannot tell "held by a variable" from
# "passed again in this call" (an earlier version tried, and a call could
# then reuse an executable cached by a call with a different aliasing).
# ---------------------------------------------------------------------------

import sys as _sys  # noqa: E402

_getrefcount = _sys.getrefcount


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


def dispatch_flatten(gda: Any) -> tuple[tuple[Any], Any]:
  """How jit's C++ dispatch flattens a GDA: `((its jax.Array,), node data)`.

  The node data is the key described above: `None` for a sole owner, else a
  fresh `object()`, or `DISPATCH_OFF` while uninstalled.
  """
  arr = gda._arr
  if _getrefcount(arr) == _SOLE_OWNER and gda._dispatch_off is None and not arr.is_deleted():
    return (arr,), None
  off = gda._dispatch_off  # uninstalled: a key no warm entry has
  return (arr,), (object() if off is None else off)  # object(): never cached
