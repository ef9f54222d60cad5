"""Specs to shardings, per call: pure functions of a `PjitSpec`, the context
mesh and the arguments. Also the GDA-era error texts.

A bare `PartitionSpec` resolves against the mesh of the enclosing `with
mesh:` block (or `jax.set_mesh(mesh)`), `None` as fully replicated over that
mesh (unspecified when there is no mesh, as stock pjit does), a `Sharding`
as is, and `FROM_GDA` as the argument's own sharding (a `GlobalDeviceArray`,
or a `jax.Array` with a `NamedSharding`).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.records import FromGda, is_spec_leaf
from jax_sharding_ext._array.shard_math import old_spec_repr, without_trailing_nones
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._pjit.spec import UNSPECIFIED, PjitSpec, check_static_donate


def dynamic_args(spec: PjitSpec, args: tuple) -> tuple[list[int], tuple]:
  """The positions and values of the non-static positional arguments."""
  n = len(args)
  static = {i % n for i in spec.static_pos if -n <= i < n}
  dyn_pos = [i for i in range(n) if i not in static]
  return dyn_pos, tuple(args[i] for i in dyn_pos)


def spec_subtrees(spec: PjitSpec, dyn_args: tuple) -> list:
  """Each in spec leaf's part of the non-static arguments (a prefix match)."""
  try:
    return spec.in_treedef.flatten_up_to(dyn_args)
  except ValueError as e:
    raise ValueError(
        f"`{spec.in_name}` must be a pytree prefix of the non-static positional "
        f"arguments: got {spec.in_name}={spec.in_specs!r} for {len(dyn_args)} "
        f"non-static argument(s) with structure "
        f"{jax.tree_util.tree_structure(dyn_args)}. ({e})") from None


def resolve_out(spec: PjitSpec, mesh: Any) -> Any:
  """The out shardings for `jax.jit`, or UNSPECIFIED."""
  if not spec.out_given:
    return UNSPECIFIED
  return jax.tree_util.tree_map(lambda s: to_sharding(s, mesh, spec.out_name),
                                spec.out_specs, is_leaf=is_spec_leaf)


def resolve_in(spec: PjitSpec, mesh: Any) -> Any:
  """The in shardings for `jax.jit`, or UNSPECIFIED. A `FROM_GDA` leaf is
  None: `jax.jit` then takes each argument's own sharding (a GDA is a
  committed array), and keys its caches on it."""
  if not spec.in_given:
    return UNSPECIFIED
  return jax.tree_util.tree_map(
      lambda s: None if isinstance(s, FromGda) else to_sharding(s, mesh, spec.in_name),
      spec.in_specs, is_leaf=is_spec_leaf)


def from_gda_positions(spec: PjitSpec, dyn_args: tuple) -> tuple[int, ...]:
  """The positions, among the leaves of `dyn_args`, under `FROM_GDA` specs."""
  counts = [len(jax.tree_util.tree_leaves(sub)) for sub in spec_subtrees(spec, dyn_args)]
  leaf_specs = jax.tree_util.tree_leaves(spec.in_specs, is_leaf=is_spec_leaf)
  out: list[int] = []
  start = 0
  for leaf_spec, n in zip(leaf_specs, counts, strict=True):
    if isinstance(leaf_spec, FromGda):
      out.extend(range(start, start + n))
    start += n
  return tuple(out)


def check_from_gda(spec: PjitSpec, args: tuple) -> None:
  """Raise the GDA-era error if a `FROM_GDA` argument has no sharding to take
  (not a GDA, nor a `jax.Array` with a `NamedSharding`)."""
  dyn_pos, dyn_args = dynamic_args(spec, args)
  with_paths, _ = jax.tree_util.tree_flatten_with_path(spec.in_specs, is_leaf=is_spec_leaf)
  for (path, leaf_spec), sub in zip(with_paths, spec_subtrees(spec, dyn_args), strict=True):
    if not isinstance(leaf_spec, FromGda):
      continue

    def leaf(subpath, x, path=path):
      full = (*path, *subpath)
      if full and isinstance(full[0], jax.tree_util.SequenceKey):
        where = f"argument {dyn_pos[full[0].idx]}" + jax.tree_util.keystr(tuple(full[1:]))
      else:
        where = "argument " + jax.tree_util.keystr(full)
      return _from_gda_sharding(x, where)
    jax.tree_util.tree_map_with_path(leaf, sub)


def split_kwargs(spec: PjitSpec, kwargs: dict) -> tuple[tuple, dict]:
  """(static keyword arguments as a hashable key, the keyword arguments left)."""
  if not (kwargs and spec.in_given):
    return (), kwargs
  dynamic = sorted(k for k in kwargs if k not in spec.static_names)
  if dynamic:
    raise ValueError(
        f"`pjit` with `{spec.in_name}` matches specs to positional arguments, so "
        f"non-static keyword arguments are not supported; got {dynamic}. Pass "
        "them positionally, or list them in `static_argnames`.")
  static_kw = tuple(sorted(kwargs.items()))
  try:
    hash(static_kw)
  except TypeError:
    raise TypeError(
        f"Static keyword arguments of `pjit` must be hashable, got {kwargs!r}.") from None
  return static_kw, {}


def check_call(spec: PjitSpec, args: tuple) -> None:
  """The checks that need the number of arguments."""
  if spec.negative_nums is not None and args:
    check_static_donate(*spec.negative_nums, len(args))
  if spec.in_empty:
    num_dyn = len(dynamic_args(spec, args)[1])
    if num_dyn:
      raise _prefix_error(
          spec.in_name, spec.in_specs, num_dyn,
          f"But pjit {spec.in_name} is the wrong length: got a tuple or list of "
          f"length 0 for an args tuple of length {num_dyn}.")


def explain(spec: PjitSpec, mesh: Any, args: tuple) -> ValueError | None:
  """The old pjit's message if a GDA argument disagrees with the specs."""
  if not spec.in_given or spec.in_empty:
    return None
  try:
    subtrees = spec_subtrees(spec, dynamic_args(spec, args)[1])
  except ValueError:
    return None
  leaf_specs = jax.tree_util.tree_leaves(spec.in_specs, is_leaf=is_spec_leaf)
  for leaf_spec, sub in zip(leaf_specs, subtrees, strict=True):
    for x in jax.tree_util.tree_leaves(sub):
      if not isinstance(x, GlobalDeviceArray) or x.is_deleted():
        continue
      if mesh is not None and x.mesh != mesh:
        return ValueError(
            "Pjit's mesh and GDA's mesh should be equal. Got Pjit mesh: "
            f"{mesh},\n GDA mesh: {x.mesh}. Build the GDA on the mesh of the "
            "enclosing `with mesh:`, or call pjit under the GDA's mesh.")
      if isinstance(leaf_spec, FromGda):
        continue
      sharding = to_sharding(leaf_spec, mesh, spec.in_name)
      if sharding is not None and not sharding.is_equivalent_to(x.sharding, x.ndim):
        pjit_spec = sharding.spec if isinstance(sharding, NamedSharding) else sharding
        return ValueError(
            "Got an input GDA to pjit with different partitioning than specified "
            f"in the {spec.in_name} argument to pjit. The partitioning must "
            f"match, or use `jax.experimental.pjit.FROM_GDA` in `{spec.in_name}`. "
            f"Got GDA spec: {old_spec_repr(x.mesh_axes)} and pjit spec: "
            f"{old_spec_repr(pjit_spec)} for GDA: GlobalDeviceArray(shape={x.shape}, "
            f"dtype={x.dtype}). (Here `FROM_GDA` is `jax_sharding_ext.FROM_GDA`.)")
  return None


def place_eager_arrays(spec: PjitSpec, mesh: Any, args: tuple) -> tuple | None:
  """`args` with each eagerly computed array placed as its spec says, or None
  when there is none.

  Under the legacy `with mesh:` an array JAX computed eagerly stayed on one
  device, uncommitted, and pjit placed it as its spec said. Under
  `jax.set_mesh` (what the porting assistant writes for `with mesh:`) the
  same array is committed and fully replicated over the mesh, and `jax.jit`
  refuses it for any other in sharding. Legacy pjit places such an array
  (a `jax.Array`, fully replicated over the mesh its spec resolves against)
  as it placed the legacy one: an explicit `jax.device_put`, a copy.
  """
  if not spec.in_given or spec.in_empty:
    return None
  dyn_pos, dyn_args = dynamic_args(spec, args)
  try:
    subtrees = spec_subtrees(spec, dyn_args)
  except ValueError:
    return None
  leaf_specs = jax.tree_util.tree_leaves(spec.in_specs, is_leaf=is_spec_leaf)
  placed = False

  def place(sharding: Any, x: Any) -> Any:
    nonlocal placed
    if (type(x) is jax_tables.ArrayImpl and isinstance(sharding, NamedSharding)
        and not x.is_deleted() and isinstance(x.sharding, NamedSharding)
        and x.sharding.mesh == sharding.mesh and x.sharding.is_fully_replicated
        and not sharding.is_equivalent_to(x.sharding, x.ndim)):
      placed = True
      return jax.device_put(x, sharding)
    return x

  new = []
  for leaf_spec, sub in zip(leaf_specs, subtrees, strict=True):
    if isinstance(leaf_spec, FromGda):
      new.append(sub)
      continue
    sharding = to_sharding(leaf_spec, mesh, spec.in_name)
    new.append(jax.tree_util.tree_map(lambda x, s=sharding: place(s, x), sub))
  if not placed:
    return None
  out = list(args)
  for i, value in zip(dyn_pos, spec.in_treedef.unflatten(new), strict=True):
    out[i] = value
  return tuple(out)


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


def to_sharding(spec: Any, mesh: Any, what: str) -> Any:
  """One spec leaf (not FROM_GDA) as what `jax.jit` takes: a Sharding or None."""
  if spec is None:
    return None if mesh is None else NamedSharding(mesh, PartitionSpec())
  if isinstance(spec, PartitionSpec):
    if mesh is None:
      raise _no_mesh_error(spec, what)
    _check_axes_defined(spec, mesh, what)
    # The old pjit dropped trailing `None`s before checking a spec against the
    # value's rank, so `P(('data', 'model'), None)` partitions a rank-1 value.
    return NamedSharding(mesh, without_trailing_nones(spec))
  return spec  # a Sharding


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


def _prefix_error(name: str, specs: Any, num_dyn: int, detail: str) -> ValueError:
  # Stock's wording for a wrong-length tuple (api_util.flatten_axis_resources),
  # which stock itself replaces by a bare AssertionError for `()`.
  return ValueError(
      f"pjit {name} specification must be a tree prefix of the positional "
      f"arguments tuple. In particular, pjit {name} must either be a Sharding, a "
      f"PartitionSpec, or a tuple of length equal to the number of positional "
      f"arguments. {detail} (got {name}={specs!r} for {num_dyn} non-static "
      "argument(s)).")
