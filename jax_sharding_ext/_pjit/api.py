"""`pjit`: the GDA-era front door, implemented over stock `jax.jit`.

`pjit(fun, in_axis_resources, out_axis_resources, static_argnums,
donate_argnums)` keeps the legacy signature (and accepts the modern
`in_shardings` / `out_shardings` spellings). Each call:

1. resolves the specs into shardings: a bare `PartitionSpec` against the mesh
   of the enclosing `with mesh:` block (or `jax.set_mesh(mesh)`), `None` as
   fully replicated over that mesh (unspecified when there is no mesh, as
   stock pjit does), a `Sharding` as is, and `FROM_GDA` as the argument's own
   sharding (a `GlobalDeviceArray`, or a `jax.Array` with a `NamedSharding`);
2. calls a `jax.jit` of `fun` built for exactly those shardings. The jitted
   functions are cached per resolution (the mesh, plus the shardings of the
   `FROM_GDA` arguments), so a steady loop reuses one `jax.jit` and its
   compiled executable; jit itself keys its caches on argument shapes.

Specs are pytree prefixes of the *non-static* positional arguments (old pjit
and `jax.jit` agree on this). Outputs are whatever `jax.jit` returns, so the
`jax_parallel_functions_output_gda` flag turns every output with a
`NamedSharding` (0-d included) into a `GlobalDeviceArray`. Donation goes
through `jax.jit`'s `donate_argnums` and is checked like any GDA donation
(`_donation.py`).
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.records import _FromGda
from jax_sharding_ext._array.shard_math import old_spec_repr
from jax_sharding_ext._dispatch.donation import parse_argnums, rebase_donate_argnums
from jax_sharding_ext._jax import donation as jax_donation
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._pjit.resolve import (
  _UNSPECIFIED,
  _argnames_tuple,
  _check_leaves,
  _check_static_donate,
  _from_gda_sharding,
  _is_spec_leaf,
  _pick_spelling,
  _prefix_error,
  _signature_info,
  _to_sharding,
)

_CACHE_SIZE = 64
"""jax.jit objects kept per `pjit` function (one per distinct resolution)."""


class _Pjit:
  """One `pjit` function: its parsed arguments and its cache of `jax.jit`s.

  A call runs named steps: `_split_kwargs` (static keyword arguments into the
  key), `_resolve_in` / `_resolve_out` (specs to shardings under the context
  mesh), `_jit_for` (the cached `jax.jit` for that resolution), and on a
  `ValueError` from JAX, `_explain` (the old pjit's message when a GDA's mesh
  or partitioning disagrees with the specs).
  """

  def __init__(self, fun, in_name, in_specs, out_name, out_specs, static_nums,
               donate_nums, static_names, donate_names, jit_kwargs):
    self.fun = fun
    self.in_name, self.in_specs = in_name, in_specs
    self.out_name, self.out_specs = out_name, out_specs
    self.in_given = in_specs is not _UNSPECIFIED
    self.out_given = out_specs is not _UNSPECIFIED
    in_leaves, self.in_treedef = (
        _check_leaves(in_specs, in_name, allow_from_gda=True) if self.in_given else ([], None))
    out_leaves = (_check_leaves(out_specs, out_name, allow_from_gda=False)[0]
                  if self.out_given else [])
    self.has_from_gda = any(isinstance(leaf, _FromGda) for leaf in in_leaves)
    self.needs_mesh = any(leaf is None or isinstance(leaf, PartitionSpec)
                          for leaf in (*in_leaves, *out_leaves))
    self.in_empty = self.in_given and in_specs == ()
    by_name, _ = _signature_info(fun)
    self.static_names = static_names
    self.static_pos = set(static_nums) | {by_name[n] for n in static_names if n in by_name}
    # Negative positions are checked per call, once the count is known.
    self.negative_nums = (static_nums, donate_nums) if any(
        i < 0 for i in (*static_nums, *donate_nums)) else None
    self.jit_kwargs = jit_kwargs
    self.cache: collections.OrderedDict = collections.OrderedDict()
    self.lock = threading.Lock()

  def _dynamic_args(self, args: tuple) -> tuple[list[int], tuple]:
    n = len(args)
    static = {i % n for i in self.static_pos if -n <= i < n}
    dyn_pos = [i for i in range(n) if i not in static]
    return dyn_pos, tuple(args[i] for i in dyn_pos)

  def _spec_subtrees(self, dyn_args: tuple) -> list:
    """Each in spec leaf's part of the non-static arguments (a prefix match)."""
    try:
      return self.in_treedef.flatten_up_to(dyn_args)
    except ValueError as e:
      raise ValueError(
          f"`{self.in_name}` must be a pytree prefix of the non-static positional "
          f"arguments: got {self.in_name}={self.in_specs!r} for {len(dyn_args)} "
          f"non-static argument(s) with structure "
          f"{jax.tree_util.tree_structure(dyn_args)}. ({e})") from None

  def _resolve_out(self, mesh):
    if not self.out_given:
      return _UNSPECIFIED
    return jax.tree_util.tree_map(lambda s: _to_sharding(s, mesh, self.out_name),
                                  self.out_specs, is_leaf=_is_spec_leaf)

  def _resolve_in(self, mesh, args):
    if not self.in_given:
      return _UNSPECIFIED
    if not self.has_from_gda:
      return jax.tree_util.tree_map(lambda s: _to_sharding(s, mesh, self.in_name),
                                    self.in_specs, is_leaf=_is_spec_leaf)
    dyn_pos, dyn_args = self._dynamic_args(args)
    with_paths, _ = jax.tree_util.tree_flatten_with_path(self.in_specs, is_leaf=_is_spec_leaf)
    resolved = []
    for (path, spec), sub in zip(with_paths, self._spec_subtrees(dyn_args), strict=True):
      if not isinstance(spec, _FromGda):
        resolved.append(_to_sharding(spec, mesh, self.in_name))
        continue

      def leaf(subpath, x, path=path):
        full = (*path, *subpath)
        if full and isinstance(full[0], jax.tree_util.SequenceKey):
          where = f"argument {dyn_pos[full[0].idx]}" + jax.tree_util.keystr(tuple(full[1:]))
        else:
          where = "argument " + jax.tree_util.keystr(full)
        return _from_gda_sharding(x, where)
      resolved.append(jax.tree_util.tree_map_with_path(leaf, sub))
    return self.in_treedef.unflatten(resolved)

  def _split_kwargs(self, kwargs):
    if not (kwargs and self.in_given):
      return (), kwargs
    dynamic = sorted(k for k in kwargs if k not in self.static_names)
    if dynamic:
      raise ValueError(
          f"`pjit` with `{self.in_name}` matches specs to positional arguments, so "
          f"non-static keyword arguments are not supported; got {dynamic}. Pass "
          "them positionally, or list them in `static_argnames`.")
    static_kw = tuple(sorted(kwargs.items()))
    try:
      hash(static_kw)
    except TypeError:
      raise TypeError(
          f"Static keyword arguments of `pjit` must be hashable, got {kwargs!r}.") from None
    return static_kw, {}

  def _check_call(self, args):
    if self.negative_nums is not None and args:
      _check_static_donate(*self.negative_nums, len(args))
    if self.in_empty:
      num_dyn = len(self._dynamic_args(args)[1])
      if num_dyn:
        raise _prefix_error(
            self.in_name, self.in_specs, num_dyn,
            f"But pjit {self.in_name} is the wrong length: got a tuple or list of "
            f"length 0 for an args tuple of length {num_dyn}.")

  def _target(self, static_kw) -> Callable:
    fun = self.fun
    if static_kw:
      # `jax.jit` refuses keyword arguments, static ones included, once
      # `in_shardings` is given (jax 0.10.2); bind them here instead. Static
      # values are hashable and part of the cache key, as in jit's own cache.
      fun = functools.partial(fun, **dict(static_kw))
    if self.out_given and self.out_specs == ():
      # Stock raises a bare AssertionError for `out_shardings=()` when the
      # function returns anything but `()`; check at trace time instead.
      inner, name = fun, self.out_name

      @functools.wraps(self.fun)
      def fun(*args, **kwargs):
        out = inner(*args, **kwargs)
        if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(()):
          raise ValueError(
              f"pjit {name} specification must be a tree prefix of the outputs: "
              f"got {name}=() (no outputs), but the function returned "
              f"{jax.tree_util.tree_structure(out)}. Give one spec per output, or "
              "one spec for all of them.")
        return out
    return fun

  def _jit_for(self, mesh, static_kw, in_res):
    if self.has_from_gda:
      leaves, treedef = jax.tree_util.tree_flatten(in_res, is_leaf=lambda x: x is None)
      key = (mesh, static_kw, treedef, tuple(leaves))
    else:
      key = (mesh, static_kw)
    with self.lock:
      f = self.cache.get(key)
      if f is not None:
        self.cache.move_to_end(key)
        return f
    if in_res is None:  # not resolved yet: the resolution depends on the mesh only
      in_res = self._resolve_in(mesh, ())
    kw = dict(self.jit_kwargs)
    if in_res is not _UNSPECIFIED:
      kw["in_shardings"] = in_res
    out_res = self._resolve_out(mesh)
    if out_res is not _UNSPECIFIED:
      kw["out_shardings"] = out_res
    rest = tuple(n for n in self.static_names if n not in dict(static_kw))
    if rest:
      kw["static_argnames"] = rest
    else:
      kw.pop("static_argnames", None)
    f = jax.jit(self._target(static_kw), **kw)
    with self.lock:
      f = self.cache.setdefault(key, f)
      while len(self.cache) > _CACHE_SIZE:
        self.cache.popitem(last=False)
    return f

  def prepare(self, args, kwargs):
    """The `jax.jit` to call for these arguments, and the kwargs to pass it."""
    self._check_call(args)
    static_kw, kwargs = self._split_kwargs(kwargs)
    mesh = jax_donation.context_mesh() if self.needs_mesh else None
    in_res = self._resolve_in(mesh, args) if self.has_from_gda else None
    return self._jit_for(mesh, static_kw, in_res), kwargs

  def run(self, method: str | None, args, kwargs):
    """Call (`method=None`), `.lower` or `.trace` for these arguments."""
    f, kwargs = self.prepare(args, kwargs)
    try:
      return (f if method is None else getattr(f, method))(*args, **kwargs)
    except ValueError as e:
      better = self._explain(args)
      if better is None:
        raise
      raise better from e

  def _explain(self, args) -> ValueError | None:
    """The old pjit's message if a GDA argument disagrees with the specs."""
    if not self.in_given or self.in_empty:
      return None
    mesh = jax_donation.context_mesh() if self.needs_mesh else None
    _, dyn_args = self._dynamic_args(args)
    try:
      subtrees = self._spec_subtrees(dyn_args)
    except ValueError:
      return None
    specs = jax.tree_util.tree_leaves(self.in_specs, is_leaf=_is_spec_leaf)
    for spec, sub in zip(specs, subtrees, strict=True):
      for x in jax.tree_util.tree_leaves(sub):
        if not isinstance(x, GlobalDeviceArray) or x.is_deleted():
          continue
        if mesh is not None and x.mesh != mesh:
          return ValueError(
              "Pjit's mesh and GDA's mesh should be equal. Got Pjit mesh: "
              f"{mesh},\n GDA mesh: {x.mesh}. Build the GDA on the mesh of the "
              "enclosing `with mesh:`, or call pjit under the GDA's mesh.")
        if isinstance(spec, _FromGda):
          continue
        sharding = _to_sharding(spec, mesh, self.in_name)
        if sharding is not None and not sharding.is_equivalent_to(x.sharding, x.ndim):
          pjit_spec = sharding.spec if isinstance(sharding, NamedSharding) else sharding
          return ValueError(
              "Got an input GDA to pjit with different partitioning than specified "
              f"in the {self.in_name} argument to pjit. The partitioning must "
              f"match, or use `jax.experimental.pjit.FROM_GDA` in `{self.in_name}`. "
              f"Got GDA spec: {old_spec_repr(x.mesh_axes)} and pjit spec: "
              f"{old_spec_repr(pjit_spec)} for GDA: GlobalDeviceArray(shape={x.shape}, "
              f"dtype={x.dtype}). (Here `FROM_GDA` is `jax_sharding_ext.FROM_GDA`.)")
    return None


def _jit_options(fun, static_argnums, donate_argnums, static_argnames, donate_argnames,
                 **jit_kwargs) -> tuple:
  """The static / donated arguments checked (stock's rules, plus the negative
  overlap stock misses), and the keyword arguments for `jax.jit`."""
  static_nums = parse_argnums(static_argnums, "static_argnums")
  donate_nums = parse_argnums(donate_argnums, "donate_argnums")
  static_names = _argnames_tuple(static_argnames, "static_argnames")
  donate_names = _argnames_tuple(donate_argnames, "donate_argnames")
  rebase_donate_argnums([i for i in donate_nums if i >= 0], [i for i in static_nums if i >= 0])
  _, num_positional = _signature_info(fun)
  if num_positional:  # negative positions too, when the signature fixes the count
    _check_static_donate(static_nums, donate_nums, num_positional)
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
  return static_nums, donate_nums, static_names, donate_names, jit_kwargs


@jax_tracebacks.api_boundary
def pjit(fun: Callable,
         in_axis_resources: Any = _UNSPECIFIED,
         out_axis_resources: Any = _UNSPECIFIED,
         static_argnums: int | Iterable[int] | None = None,
         donate_argnums: int | Iterable[int] | None = None,
         *,
         in_shardings: Any = _UNSPECIFIED,
         out_shardings: Any = _UNSPECIFIED,
         static_argnames: str | Iterable[str] | None = None,
         donate_argnames: str | Iterable[str] | None = None,
         keep_unused: bool = False,
         inline: bool = False) -> Callable:
  """Compile `fun` for the mesh of the enclosing `with mesh:` (GDA-era `pjit`).

  Args:
    fun: the function to compile.
    in_axis_resources: a pytree prefix of the non-static positional arguments
      whose leaves are `PartitionSpec` (resolved against the context mesh),
      `None` (fully replicated), a `jax.sharding.Sharding`, or `FROM_GDA` (the
      argument's own sharding; it must be a `GlobalDeviceArray` or a
      `jax.Array` with a `NamedSharding`). Omitted: each argument keeps its
      sharding (`jax.jit`'s default).
    out_axis_resources: a pytree prefix of the outputs, with the same leaves
      except `FROM_GDA`. Omitted: XLA chooses.
    static_argnums: positional arguments that are compile-time constants.
    donate_argnums: positional arguments whose buffers the computation may
      reuse for its outputs (`GlobalDeviceArray` or `jax.Array`); they are
      deleted by the call.
    in_shardings: modern spelling of `in_axis_resources` (give one of them).
    out_shardings: modern spelling of `out_axis_resources`.
    static_argnames, donate_argnames, keep_unused, inline: as in `jax.jit`.

  Returns:
    A function with the signature of `fun`; it also has `.lower(*args)`.

  Raises:
    ValueError: a `PartitionSpec` is used with no mesh active or names an axis
      the mesh lacks, `FROM_GDA` meets an argument without a `NamedSharding`,
      a GDA's mesh or partitioning disagrees with the specs, the specs are
      not a prefix of the arguments, both spellings of a parameter are
      given, or an argument is both static and donated.

  Example:
    >>> f = pjit(lambda x: x @ x.T, in_axis_resources=P('x', 'y'),
    ...          out_axis_resources=P('x', 'y'))
    >>> with global_mesh:
    ...   out = f(gda)
  """
  if not callable(fun):
    raise TypeError(f"`pjit` needs a callable as `fun`, got {type(fun).__name__}.")
  in_name, in_specs = _pick_spelling(in_axis_resources, in_shardings,
                                     "in_axis_resources", "in_shardings")
  out_name, out_specs = _pick_spelling(out_axis_resources, out_shardings,
                                       "out_axis_resources", "out_shardings")
  static_nums, donate_nums, static_names, donate_names, jit_kwargs = _jit_options(
      fun, static_argnums, donate_argnums, static_argnames, donate_argnames,
      keep_unused=keep_unused, inline=inline)
  state = _Pjit(fun, in_name, in_specs, out_name, out_specs, static_nums, donate_nums,
                static_names, donate_names, jit_kwargs)

  @functools.wraps(fun)
  @jax_tracebacks.api_boundary
  def wrapped(*args, **kwargs):
    return state.run(None, args, kwargs)

  def lower(*args, **kwargs):
    """Lower for these arguments (`jax.jit(...).lower`) under the context mesh."""
    return state.run("lower", args, kwargs)

  def trace(*args, **kwargs):
    """Trace for these arguments (`jax.jit(...).trace`) under the context mesh."""
    return state.run("trace", args, kwargs)

  wrapped.lower = lower  # type: ignore[attr-defined]
  wrapped.trace = trace  # type: ignore[attr-defined]
  return wrapped
