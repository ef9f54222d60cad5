"""What a `pjit` function knows before it is called: its arguments, parsed
and checked once (`PjitSpec`, frozen; after JAX's own `PjitInfo`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
from jax.sharding import PartitionSpec

from jax_sharding_ext._array.records import FromGda, Sentinel, is_spec_leaf
from jax_sharding_ext._dispatch.donation import parse_argnums, rebase_donate_argnums
from jax_sharding_ext._jax import donation as jax_donation


class _Unspecified(Sentinel):
  _name = "UNSPECIFIED"


UNSPECIFIED = _Unspecified()
"""A `pjit` parameter that was not given (`None` is a valid spec: replicated)."""


class PjitSpec(NamedTuple):
  """Everything about a `pjit` function that does not depend on the call."""

  fun: Callable[..., Any]
  in_name: str  # "in_axis_resources" or "in_shardings", as the user spelled it
  in_specs: Any  # a pytree of spec leaves, or UNSPECIFIED
  in_treedef: Any  # of `in_specs`, None when unspecified
  out_name: str
  out_specs: Any
  has_from_gda: bool  # some in spec leaf is FROM_GDA
  needs_mesh: bool  # some spec leaf is a PartitionSpec or None
  static_names: tuple[str, ...]
  static_pos: frozenset[int]  # static positions, negative ones included
  negative_nums: tuple[tuple[int, ...], tuple[int, ...]] | None  # checked per call
  jit_kwargs: tuple[tuple[str, Any], ...]  # for `jax.jit`, before shardings

  @property
  def in_given(self) -> bool:
    return self.in_specs is not UNSPECIFIED

  @property
  def out_given(self) -> bool:
    return self.out_specs is not UNSPECIFIED

  @property
  def in_empty(self) -> bool:
    # `type(...) is tuple`: a `PartitionSpec()` equals `()` on some JAX
    # releases (0.8.x), and is a spec, not an empty tuple of specs.
    return self.in_given and type(self.in_specs) is tuple and not self.in_specs


def parse(fun: Callable, in_axis_resources: Any, out_axis_resources: Any, static_argnums: Any,
          donate_argnums: Any, in_shardings: Any, out_shardings: Any, static_argnames: Any,
          donate_argnames: Any, **jit_kwargs: Any) -> PjitSpec:
  """`pjit`'s arguments checked (stock's rules, plus the negative overlap
  stock misses) and frozen."""
  if not callable(fun):
    raise TypeError(f"`pjit` needs a callable as `fun`, got {type(fun).__name__}.")
  in_name, in_specs = _pick_spelling(in_axis_resources, in_shardings,
                                     "in_axis_resources", "in_shardings")
  if isinstance(in_specs, list):
    # Old pjit took a top-level list of in specs as the tuple of arguments
    # (out specs stay as given: a list matches a function returning a list).
    in_specs = tuple(in_specs)
  out_name, out_specs = _pick_spelling(out_axis_resources, out_shardings,
                                       "out_axis_resources", "out_shardings")
  in_leaves, in_treedef = ([], None) if in_specs is UNSPECIFIED else _check_leaves(
      in_specs, in_name, allow_from_gda=True)
  out_leaves = [] if out_specs is UNSPECIFIED else _check_leaves(
      out_specs, out_name, allow_from_gda=False)[0]

  static_nums = parse_argnums(static_argnums, "static_argnums")
  donate_nums = parse_argnums(donate_argnums, "donate_argnums")
  static_names = _argnames(static_argnames, "static_argnames")
  donate_names = _argnames(donate_argnames, "donate_argnames")
  rebase_donate_argnums([i for i in donate_nums if i >= 0], [i for i in static_nums if i >= 0])
  by_name, num_positional = signature_info(fun)
  if num_positional:  # negative positions too, when the signature fixes the count
    check_static_donate(static_nums, donate_nums, num_positional)
  both = sorted(set(static_names) & set(donate_names))
  if both:
    raise ValueError(
        f"`static_argnames` {static_names} and `donate_argnames` {donate_names} "
        f"cannot intersect ({both}): a static argument has no buffer to donate.")
  jit_kwargs.update(static_argnums=static_nums or None, donate_argnums=donate_nums or None)
  if static_names:
    jit_kwargs["static_argnames"] = static_names
  if donate_names:
    jit_kwargs["donate_argnames"] = donate_names

  return PjitSpec(
      fun=fun, in_name=in_name, in_specs=in_specs, in_treedef=in_treedef,
      out_name=out_name, out_specs=out_specs,
      has_from_gda=any(isinstance(leaf, FromGda) for leaf in in_leaves),
      needs_mesh=any(leaf is None or isinstance(leaf, PartitionSpec)
                     for leaf in (*in_leaves, *out_leaves)),
      static_names=static_names,
      static_pos=frozenset(static_nums) | {by_name[n] for n in static_names if n in by_name},
      negative_nums=((static_nums, donate_nums)
                     if any(i < 0 for i in (*static_nums, *donate_nums)) else None),
      jit_kwargs=tuple(jit_kwargs.items()))


def _pick_spelling(old: Any, new: Any, old_name: str, new_name: str) -> tuple[str, Any]:
  """The name and value of whichever spelling of a parameter was given."""
  if old is not UNSPECIFIED and new is not UNSPECIFIED:
    raise ValueError(
        f"`pjit` got both `{old_name}` and `{new_name}`; they are the old and new "
        "names of the same parameter. Pass only one.")
  return (new_name, new) if new is not UNSPECIFIED else (old_name, old)


def _check_leaves(specs: Any, what: str, *, allow_from_gda: bool) -> tuple[list, Any]:
  leaves, treedef = jax.tree_util.tree_flatten(specs, is_leaf=is_spec_leaf)
  for leaf in leaves:
    if isinstance(leaf, FromGda):
      if not allow_from_gda:
        raise ValueError(
            f"`FROM_GDA` is only valid in `in_axis_resources`, not in `{what}`: an "
            "output has no input array to take a sharding from. Give a "
            "`PartitionSpec` (or `None` for replicated) for each output.")
      continue
    if is_spec_leaf(leaf):
      continue
    hint = ""
    if isinstance(leaf, str):
      hint = f" Use `PartitionSpec({leaf!r})` instead of the bare axis name."
    raise TypeError(
        f"`{what}` entries must be `PartitionSpec`, `None` (replicated), a "
        f"`jax.sharding.Sharding`" + (", or `FROM_GDA`" if allow_from_gda else "") +
        f"; got {leaf!r} ({type(leaf).__name__}) in {what}={specs!r}.{hint}")
  return leaves, treedef


def _argnames(value: Any, name: str) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,)
  value = tuple(value)
  if not all(isinstance(v, str) for v in value):
    raise TypeError(f"`{name}` must be a str or a sequence of str, got {value!r}.")
  return value


def signature_info(fun: Callable) -> tuple[dict[str, int], int | None]:
  """Positions of `fun`'s positional parameters by name, and their count
  (None when `fun` takes `*args` or has no signature)."""
  try:
    params = list(inspect.signature(fun).parameters.values())
  except (TypeError, ValueError):
    return {}, None
  positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  fixed = None if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
  return {p.name: i for i, p in enumerate(positional)}, fixed


def check_static_donate(static: Iterable[int], donate: Iterable[int], num_args: int) -> None:
  """The old pjit's rule, negative positions included: an argument cannot be
  both static and donated. A negative donated position names an argument
  only where this JAX's `jax.jit` reads it so (see `donation_vector`)."""
  def norm(nums, negative=True):
    return [i % num_args for i in nums if -num_args <= i < num_args and (negative or i >= 0)]
  rebase_donate_argnums(norm(donate, jax_donation.JIT_COUNTS_NEGATIVE_ARGNUMS), norm(static))
