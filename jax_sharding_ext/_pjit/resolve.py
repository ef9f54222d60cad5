"""Argument and spec checks for `pjit` (`_pjit.py`): specs to shardings,
`FROM_GDA` resolution, argnums / argnames, GDA-era error texts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.records import FROM_GDA, _FromGda, _Sentinel
from jax_sharding_ext._dispatch.donation import rebase_donate_argnums


class _Unspecified(_Sentinel):
  _name = "UNSPECIFIED"


_UNSPECIFIED = _Unspecified()


def _is_spec_leaf(x: Any) -> bool:
  return x is None or isinstance(x, (PartitionSpec, Sharding, _FromGda))


def _listify_top(specs: Any) -> Any:
  # Old pjit turned a top-level list into a tuple (one entry per argument).
  return tuple(specs) if isinstance(specs, list) else specs


def _check_leaves(specs: Any, what: str, *, allow_from_gda: bool) -> tuple[list, Any]:
  leaves, treedef = jax.tree_util.tree_flatten(specs, is_leaf=_is_spec_leaf)
  for leaf in leaves:
    if leaf is FROM_GDA or isinstance(leaf, _FromGda):
      if not allow_from_gda:
        raise ValueError(
            f"`FROM_GDA` is only valid in `in_axis_resources`, not in `{what}`: an "
            "output has no input array to take a sharding from. Give a "
            "`PartitionSpec` (or `None` for replicated) for each output.")
      continue
    if _is_spec_leaf(leaf):
      continue
    hint = ""
    if isinstance(leaf, str):
      hint = f" Use `PartitionSpec({leaf!r})` instead of the bare axis name."
    raise TypeError(
        f"`{what}` entries must be `PartitionSpec`, `None` (replicated), a "
        f"`jax.sharding.Sharding`" + (", or `FROM_GDA`" if allow_from_gda else "") +
        f"; got {leaf!r} ({type(leaf).__name__}) in {what}={specs!r}.{hint}")
  return leaves, treedef


def _no_mesh_error(spec: Any, what: str) -> ValueError:
  return ValueError(
      f"`pjit` got the PartitionSpec {spec!r} in `{what}`, but no mesh is active, "
      "and a PartitionSpec names axes of a mesh. Call the function inside "
      "`with mesh:` (or `with jax.set_mesh(mesh):`), or pass "
      "`NamedSharding(mesh, spec)` instead of the bare spec.")


def _check_axes_defined(spec: PartitionSpec, mesh: Any, what: str) -> None:
  for entry in spec:
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
      continue
    for name in entry if isinstance(entry, tuple) else (entry,):
      if name not in mesh.axis_names:
        # The old pjit's text first: GDA-era tests match on it.
        raise ValueError(
            f"Resource axis: {name} of {what} is undefined. The active mesh has "
            f"axes {tuple(mesh.axis_names)}, and {what} gave {spec}. Use one of "
            "those axis names, or enter the mesh that defines this axis.")


def _to_sharding(spec: Any, mesh: Any, what: str) -> Any:
  """One spec leaf (not FROM_GDA) as what `jax.jit` takes: a Sharding or None."""
  if spec is None:
    return None if mesh is None else NamedSharding(mesh, PartitionSpec())
  if isinstance(spec, PartitionSpec):
    if mesh is None:
      raise _no_mesh_error(spec, what)
    _check_axes_defined(spec, mesh, what)
    return NamedSharding(mesh, _without_trailing_nones(spec))
  return spec  # a Sharding


def _without_trailing_nones(spec: PartitionSpec) -> PartitionSpec:
  """The old pjit dropped trailing `None`s before checking a spec against the
  value's rank, so `P(('data', 'model'), None)` partitions a rank-1 value."""
  entries = list(spec)
  while entries and entries[-1] is None:
    entries.pop()
  return spec if len(entries) == len(spec) else PartitionSpec(*entries)


def _from_gda_sharding(x: Any, where: str) -> Any:
  if isinstance(x, GlobalDeviceArray):
    return x.sharding
  if isinstance(x, jax.core.Tracer):
    return None  # nested in another trace: follow the traced value
  if isinstance(x, jax.Array):
    if isinstance(x.sharding, NamedSharding):
      return x.sharding
    raise ValueError(
        f"`FROM_GDA` in `in_axis_resources` takes the sharding of {where}, but that "
        f"`jax.Array` has a {type(x.sharding).__name__}, not a `NamedSharding` "
        f"({x.sharding}). Give a `PartitionSpec` for this argument, or place it "
        "with `jax.device_put(x, NamedSharding(mesh, spec))` first.")
  raise ValueError(
      # The old pjit's text first: GDA-era tests match on it.
      "For a non-GDA input, the corresponding resource in in_axis_resources "
      "cannot be `pjit.FROM_GDA`. "
      f"`FROM_GDA` in `in_axis_resources` needs a `GlobalDeviceArray` (or a "
      f"`jax.Array` with a `NamedSharding`), but {where} is a non-GDA input of "
      f"type {type(x).__name__}: it has no sharding to take. Give a "
      "`PartitionSpec` for it instead, e.g. `in_axis_resources=(FROM_GDA, P('x'))`, "
      "or build it with `GlobalDeviceArray.from_callback(...)`.")


def _argnames_tuple(value: Any, name: str) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,)
  value = tuple(value)
  if not all(isinstance(v, str) for v in value):
    raise TypeError(f"`{name}` must be a str or a sequence of str, got {value!r}.")
  return value


def _signature_info(fun: Callable) -> tuple[dict[str, int], int | None]:
  """Positions of `fun`'s positional parameters by name, and their count
  (None when `fun` takes `*args` or has no signature)."""
  try:
    params = list(inspect.signature(fun).parameters.values())
  except (TypeError, ValueError):
    return {}, None
  positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  fixed = None if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
  return {p.name: i for i, p in enumerate(positional)}, fixed


def _pick_spelling(old: Any, new: Any, old_name: str, new_name: str) -> tuple[str, Any]:
  """The name and value of whichever spelling of a parameter was given."""
  if old is not _UNSPECIFIED and new is not _UNSPECIFIED:
    raise ValueError(
        f"`pjit` got both `{old_name}` and `{new_name}`; they are the old and new "
        "names of the same parameter. Pass only one.")
  if new is not _UNSPECIFIED:
    return new_name, _listify_top(new)
  return old_name, _listify_top(old)


def _check_static_donate(static: Iterable[int], donate: Iterable[int], num_args: int) -> None:
  """The old pjit's rule, negative positions included: an argument cannot be
  both static and donated."""
  def norm(nums):
    return [i % num_args for i in nums if -num_args <= i < num_args]
  rebase_donate_argnums(norm(donate), norm(static))


def _prefix_error(name: str, specs: Any, num_dyn: int, detail: str) -> ValueError:
  # Stock's wording for a wrong-length tuple (api_util.flatten_axis_resources),
  # which stock itself replaces by a bare AssertionError for `()`.
  return ValueError(
      f"pjit {name} specification must be a tree prefix of the positional "
      f"arguments tuple. In particular, pjit {name} must either be a Sharding, a "
      f"PartitionSpec, or a tuple of length equal to the number of positional "
      f"arguments. {detail} (got {name}={specs!r} for {num_dyn} non-static "
      "argument(s)).")
