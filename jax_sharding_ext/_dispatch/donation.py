"""Buffer donation for `GlobalDeviceArray` (`donate_argnums`).

A GDA is a view over one private `jax.Array`, and `jax.jit` hands that
array's buffers to the executable through its `shard_arg_handlers` entry
(`handlers.py`). A
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
* `jax_dispatch.view_flatten` flattens a GDA for jit's C++ dispatch
  registry, the only Python that runs for an argument of a warm call. Its
  node data sends a call with a deleted GDA to the Python path above, and
  keys a GDA whose buffers may appear elsewhere in the call. For the call
  that fills a cache entry, `check_donated_args` judges whether an alias of
  a keyed argument could hurt its executable (`jax_dispatch.record_call`);
  if so, the entry stays off the C++ fast path and every call matching it
  takes the Python path. Every other call keeps the fast path.

Calls made only of `jax.Array`s never reach this package (stock behaviour).

`donation_vector` and `rebase_donate_argnums` are the GDA era's public
helpers for code that maps `donate_argnums` onto flattened arguments itself.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np

from jax_sharding_ext._array import family
from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._jax import buffers as jax_buffers
from jax_sharding_ext._jax import dispatch as jax_dispatch
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
  if isinstance(value, bool | np.bool_):
    raise TypeError(f"`{name}` must be an int or a sequence of ints, got {value!r}.")
  if not isinstance(value, Iterable):
    try:  # an int, a numpy integer, as `jax.jit` takes them
      return (operator.index(value),)
    except TypeError:
      pass
  if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
    raise TypeError(
        f"`{name}` must be an int or a sequence of ints, got {value!r} "
        f"({type(value).__name__}). For example `{name}=(0, 2)`.")
  out = []
  for v in value:
    if isinstance(v, bool | np.bool_):
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
  `donate_argnums`; keyword arguments are never donated (as in the GDA era: use
  `jax.jit(..., donate_argnames=...)` for those). A `GlobalDeviceArray` is one
  leaf. A negative argnum is read as `jax.jit` (so legacy `pjit`) reads it in
  this JAX: counted from the end of `args` where `jax.jit` counts it from the
  end of the positional parameters (jax 0.12), matching no argument where
  `jax.jit` matches none (jax 0.10.2, and the GDA-era helper).

  Args:
    donate_argnums: an int or an iterable of ints, positions in `args`.
    args: the positional arguments (pytrees).
    kwargs: the keyword arguments (pytrees).

  Returns:
    A tuple of bools, in `jax.tree_util` flattening order of `args` then
    `kwargs`.

  Example:
    >>> x, y, z, w = np.zeros(2), np.ones(2), 1.0, 2.0
    >>> donation_vector((0,), ((x, y), z), {"w": w})   # argument 0 has two leaves
    (True, True, False, False)
  """
  donated = set(parse_argnums(donate_argnums, "donate_argnums"))
  if jax_donation.JIT_COUNTS_NEGATIVE_ARGNUMS:
    donated = {i + len(args) if i < 0 else i for i in donated}
  res: list[bool] = []
  for i, arg in enumerate(args):
    res.extend((i in donated,) * len(jax.tree_util.tree_leaves(arg)))
  res.extend((False,) * len(jax.tree_util.tree_leaves(kwargs)))
  return tuple(res)


def rebase_donate_argnums(donate_argnums: int | Iterable[int],
                          static_argnums: int | Iterable[int]) -> tuple[int, ...]:
  """Shift `donate_argnums` to index the arguments left after removing statics.

  Args:
    donate_argnums: an int or an iterable of ints.
    static_argnums: an int or an iterable of ints.

  Returns:
    A tuple of unique, sorted ints: each donated position minus the number of
    static positions before it.

  Raises:
    ValueError: an argument is both static and donated.

  Example:
    >>> rebase_donate_argnums((3, 4), (0, 1))   # arguments 0 and 1 are static
    (1, 2)
    >>> rebase_donate_argnums(1, 1)
    Traceback (most recent call last):
    ValueError: ...
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

  Called by the GDA `shard_arg_handlers` entry with the batch of GDA
  arguments, before any of them is handed to the executable; the whole call
  is checked, not only this batch. Also records, on the dispatch keys of the
  call's GDAs, what jit's C++ cache needs to know about this executable.
  """
  if not gdas:
    return
  info = jax_donation.current_call_donation()
  if info is None:
    jax_dispatch.record_call(None, None, gdas, GlobalDeviceArray)
    return
  jax_dispatch.record_call(info.args, info.donated, gdas, GlobalDeviceArray)
  if not any(info.donated):
    return
  pair = _donated_alias(info.args, info.donated)
  if pair is None:
    return
  i, j = pair
  x, other = info.args[i], info.args[j]
  kind = ("the same GlobalDeviceArray" if other is x else
          "views of the same device buffers")
  raise RuntimeError(
      f"Cannot donate {_arg_label(info, i)}: the same call also passes it as "
      f"{_arg_label(info, j)} ({kind}: {_describe(x)}). A donated array's "
      "buffers are reused for the outputs, so it can be passed only once per "
      "call. Pass a copy for one of them (e.g. `jnp.copy(x)`), or remove it "
      "from `donate_argnums` / `donate_argnames`. Nothing was executed or "
      "donated.")


def _donated_alias(args: Sequence[Any], donated: Sequence[bool]) -> tuple[int, int] | None:
  """`(i, j)`: donated argument `i` shares a device buffer with argument `j`, or None.

  The same array twice is found by identity. Otherwise two arrays can share a
  buffer only if it has the dtype and shard shape of both, and neither is a
  GDA that is its buffers' only owner (`family.py`); those pairs are compared
  by buffer address. An address this platform cannot tell counts as shared:
  refusing is safe, running is not.
  """
  array_t = jax_tables.ArrayImpl
  arrays: dict[int, tuple[Any, bool]] = {}  # index -> (the jax.Array handed over, owned)
  may_share: dict[int, bool] = {}
  for i, x in enumerate(args):
    t = type(x)
    if t is GlobalDeviceArray:
      arrays[i], may_share[i] = (x._arr, True), family.is_shared(x)
    elif t is array_t:
      arrays[i], may_share[i] = (x, False), True
  first: dict[int, int] = {}
  for i, (arr, _) in arrays.items():
    j = first.setdefault(id(arr), i)
    if j != i and (donated[i] or donated[j]):
      return (i, j) if donated[i] else (j, i)
  groups: dict[tuple, list[int]] = {}
  for i, (arr, _) in arrays.items():
    if may_share[i] and not arr.is_deleted():
      groups.setdefault((arr.dtype, arr.sharding.shard_shape(arr.shape)), []).append(i)
  where: dict[int, frozenset | None] = {}
  for group in groups.values():
    if len(group) < 2 or not any(donated[i] for i in group):
      continue
    for i in group:
      if i not in where:
        arr, owned = arrays[i]
        where[i] = jax_buffers.addresses(arr, owned=owned)
    for i in group:
      if donated[i]:
        for j in group:
          if j != i and _may_share(where[i], where[j]):
            return i, j
  return None


def _may_share(a: frozenset | None, b: frozenset | None) -> bool:
  return a is None or b is None or bool(a & b)
