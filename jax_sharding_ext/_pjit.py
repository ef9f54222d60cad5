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
import inspect
import operator
import threading
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from jax_sharding_ext import _compat
from jax_sharding_ext._donation import rebase_donate_argnums
from jax_sharding_ext._gda import FROM_GDA, GlobalDeviceArray, _FromGda, _Sentinel


class _Unspecified(_Sentinel):
  _name = "UNSPECIFIED"


_UNSPECIFIED = _Unspecified()

_CACHE_SIZE = 64
"""jax.jit objects kept per `pjit` function (one per distinct resolution)."""


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


class _SpecError(ValueError):
  """A `pjit` spec that cannot be resolved (raised as is, never re-wrapped)."""


def _no_mesh_error(spec: Any, what: str) -> ValueError:
  return _SpecError(
      f"`pjit` got the PartitionSpec {spec!r} in `{what}`, but no mesh is active, "
      "and a PartitionSpec names axes of a mesh. Call the function inside "
      "`with mesh:` (or `with jax.set_mesh(mesh):`), or pass "
      "`NamedSharding(mesh, spec)` instead of the bare spec.")


def _to_sharding(spec: Any, mesh: Any, what: str) -> Any:
  """One spec leaf (not FROM_GDA) as what `jax.jit` takes: a Sharding or None."""
  if spec is None:
    return None if mesh is None else NamedSharding(mesh, PartitionSpec())
  if isinstance(spec, PartitionSpec):
    if mesh is None:
      raise _no_mesh_error(spec, what)
    return NamedSharding(mesh, spec)
  return spec  # a Sharding


def _from_gda_sharding(x: Any, where: str) -> Any:
  if isinstance(x, GlobalDeviceArray):
    return x.sharding
  if isinstance(x, jax.core.Tracer):
    return None  # nested in another trace: follow the traced value
  if isinstance(x, jax.Array):
    if isinstance(x.sharding, NamedSharding):
      return x.sharding
    raise _SpecError(
        f"`FROM_GDA` in `in_axis_resources` takes the sharding of {where}, but that "
        f"`jax.Array` has a {type(x.sharding).__name__}, not a `NamedSharding` "
        f"({x.sharding}). Give a `PartitionSpec` for this argument, or place it "
        "with `jax.device_put(x, NamedSharding(mesh, spec))` first.")
  raise _SpecError(
      f"`FROM_GDA` in `in_axis_resources` needs a `GlobalDeviceArray` (or a "
      f"`jax.Array` with a `NamedSharding`), but {where} is a non-GDA input of "
      f"type {type(x).__name__}: it has no sharding to take. Give a "
      "`PartitionSpec` for it instead, e.g. `in_axis_resources=(FROM_GDA, P('x'))`, "
      "or build it with `GlobalDeviceArray.from_callback(...)`.")


def _argnums_tuple(value: Any, name: str) -> tuple[int, ...]:
  if value is None:
    return ()
  if isinstance(value, int) and not isinstance(value, bool):
    return (value,)
  if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
    raise TypeError(f"`{name}` must be an int or a sequence of ints, got {value!r}.")
  try:
    return tuple(operator.index(v) for v in value)
  except TypeError:
    raise TypeError(f"`{name}` must contain only ints, got {value!r}.") from None


def _argnames_tuple(value: Any, name: str) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,)
  value = tuple(value)
  if not all(isinstance(v, str) for v in value):
    raise TypeError(f"`{name}` must be a str or a sequence of str, got {value!r}.")
  return value


def _positional_index(fun: Callable) -> dict[str, int]:
  try:
    params = inspect.signature(fun).parameters.values()
  except (TypeError, ValueError):
    return {}
  return {p.name: i for i, p in enumerate(params)
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}


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
    ValueError: a `PartitionSpec` is used with no mesh active, `FROM_GDA`
      meets an argument without a `NamedSharding`, both spellings of a
      parameter are given, or an argument is both static and donated.

  Example:
    >>> f = pjit(lambda x: x @ x.T, in_axis_resources=P('x', 'y'),
    ...          out_axis_resources=P('x', 'y'))
    >>> with global_mesh:
    ...   out = f(gda)
  """
  if not callable(fun):
    raise TypeError(f"`pjit` needs a callable as `fun`, got {type(fun).__name__}.")
  if in_axis_resources is not _UNSPECIFIED and in_shardings is not _UNSPECIFIED:
    raise ValueError(
        "`pjit` got both `in_axis_resources` and `in_shardings`; they are the old "
        "and new names of the same parameter. Pass only one.")
  if out_axis_resources is not _UNSPECIFIED and out_shardings is not _UNSPECIFIED:
    raise ValueError(
        "`pjit` got both `out_axis_resources` and `out_shardings`; they are the "
        "old and new names of the same parameter. Pass only one.")
  in_name = "in_shardings" if in_shardings is not _UNSPECIFIED else "in_axis_resources"
  out_name = "out_shardings" if out_shardings is not _UNSPECIFIED else "out_axis_resources"
  in_specs = _listify_top(in_shardings if in_name == "in_shardings" else in_axis_resources)
  out_specs = _listify_top(out_shardings if out_name == "out_shardings" else out_axis_resources)

  static_nums = _argnums_tuple(static_argnums, "static_argnums")
  donate_nums = _argnums_tuple(donate_argnums, "donate_argnums")
  static_names = _argnames_tuple(static_argnames, "static_argnames")
  donate_names = _argnames_tuple(donate_argnames, "donate_argnames")
  # The old pjit's rule: an argument cannot be both static and donated.
  rebase_donate_argnums([i for i in donate_nums if i >= 0], [i for i in static_nums if i >= 0])
  both = sorted(set(static_names) & set(donate_names))
  if both:
    raise ValueError(
        f"`static_argnames` {static_names} and `donate_argnames` {donate_names} "
        f"cannot intersect ({both}): a static argument has no buffer to donate.")

  in_given = in_specs is not _UNSPECIFIED
  out_given = out_specs is not _UNSPECIFIED
  in_leaves, _ = (_check_leaves(in_specs, in_name, allow_from_gda=True)
                  if in_given else ([], None))
  if out_given:
    _check_leaves(out_specs, out_name, allow_from_gda=False)
  has_from_gda = any(isinstance(leaf, _FromGda) for leaf in in_leaves)
  out_leaves = (jax.tree_util.tree_leaves(out_specs, is_leaf=_is_spec_leaf)
                if out_given else [])
  needs_mesh = any(leaf is None or isinstance(leaf, PartitionSpec)
                   for leaf in (*in_leaves, *out_leaves))

  # Positions of static arguments, from numbers and names (as jax.jit does).
  by_name = _positional_index(fun)
  static_pos_known = set(static_nums) | {by_name[n] for n in static_names if n in by_name}

  jit_kwargs = dict(static_argnums=static_nums or None, donate_argnums=donate_nums or None,
                    keep_unused=keep_unused, inline=inline)
  if static_names:
    jit_kwargs["static_argnames"] = static_names
  if donate_names:
    jit_kwargs["donate_argnames"] = donate_names

  cache: collections.OrderedDict = collections.OrderedDict()
  lock = threading.Lock()

  def resolve_out(mesh):
    if not out_given:
      return _UNSPECIFIED
    return jax.tree_util.tree_map(lambda s: _to_sharding(s, mesh, out_name), out_specs,
                                  is_leaf=_is_spec_leaf)

  def resolve_in(mesh, args):
    if not in_given:
      return _UNSPECIFIED
    if not has_from_gda:
      return jax.tree_util.tree_map(lambda s: _to_sharding(s, mesh, in_name), in_specs,
                                    is_leaf=_is_spec_leaf)
    n = len(args)
    static = {i % n for i in static_pos_known if -n <= i < n}
    dyn_pos = [i for i in range(n) if i not in static]
    dyn_args = tuple(args[i] for i in dyn_pos)

    def one(path, spec, sub):
      if not isinstance(spec, _FromGda):
        return _to_sharding(spec, mesh, in_name)

      def leaf(subpath, x):
        full = (*path, *subpath)
        if full and isinstance(full[0], jax.tree_util.SequenceKey):
          where = (f"argument {dyn_pos[full[0].idx]}"
                   + jax.tree_util.keystr(tuple(full[1:])))
        else:
          where = "argument " + jax.tree_util.keystr(full)
        return _from_gda_sharding(x, where)
      return jax.tree_util.tree_map_with_path(leaf, sub)

    try:
      return jax.tree_util.tree_map_with_path(one, in_specs, dyn_args, is_leaf=_is_spec_leaf)
    except _SpecError:
      raise
    except ValueError as e:
      raise ValueError(
          f"`{in_name}` must be a pytree prefix of the non-static positional "
          f"arguments: got {in_name}={in_specs!r} for {len(dyn_args)} non-static "
          f"argument(s) with structure {jax.tree_util.tree_structure(dyn_args)}. "
          f"({e})") from None

  def cached(key):
    with lock:
      f = cache.get(key)
      if f is not None:
        cache.move_to_end(key)
      return f

  def build(key, in_res, out_res, static_kw):
    kw = dict(jit_kwargs)
    if in_res is not _UNSPECIFIED:
      kw["in_shardings"] = in_res
    if out_res is not _UNSPECIFIED:
      kw["out_shardings"] = out_res
    target = fun
    if static_kw:
      # `jax.jit` refuses keyword arguments, static ones included, once
      # `in_shardings` is given (jax 0.10.2); bind them here instead. Static
      # values are hashable and part of the cache key, as in jit's own cache.
      target = functools.partial(fun, **dict(static_kw))
      rest = tuple(n for n in static_names if n not in dict(static_kw))
      if rest:
        kw["static_argnames"] = rest
      else:
        kw.pop("static_argnames", None)
    f = jax.jit(target, **kw)
    with lock:
      f = cache.setdefault(key, f)
      while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return f

  def split_kwargs(kwargs):
    if not (kwargs and in_given):
      return (), kwargs
    dynamic = sorted(k for k in kwargs if k not in static_names)
    if dynamic:
      raise ValueError(
          f"`pjit` with `{in_name}` matches specs to positional arguments, so "
          f"non-static keyword arguments are not supported; got {dynamic}. Pass "
          "them positionally, or list them in `static_argnames`.")
    static_kw = tuple(sorted(kwargs.items()))
    try:
      hash(static_kw)
    except TypeError:
      raise TypeError(
          f"Static keyword arguments of `pjit` must be hashable, got {kwargs!r}.") from None
    return static_kw, {}

  def prepare(args, kwargs):
    static_kw, kwargs = split_kwargs(kwargs)
    mesh = _compat.context_mesh() if needs_mesh else None
    if not has_from_gda:  # the resolution depends on the mesh only
      key = (mesh, static_kw)
      f = cached(key)
      if f is None:
        f = build(key, resolve_in(mesh, args), resolve_out(mesh), static_kw)
      return f, kwargs
    in_res = resolve_in(mesh, args)
    leaves, treedef = jax.tree_util.tree_flatten(in_res, is_leaf=lambda x: x is None)
    key = (mesh, static_kw, treedef, tuple(leaves))
    f = cached(key)
    if f is None:
      f = build(key, in_res, resolve_out(mesh), static_kw)
    return f, kwargs

  @functools.wraps(fun)
  def wrapped(*args, **kwargs):
    f, kwargs = prepare(args, kwargs)
    return f(*args, **kwargs)

  def lower(*args, **kwargs):
    """Lower for these arguments (`jax.jit(...).lower`) under the context mesh."""
    f, kwargs = prepare(args, kwargs)
    return f.lower(*args, **kwargs)

  def trace(*args, **kwargs):
    """Trace for these arguments (`jax.jit(...).trace`) under the context mesh."""
    f, kwargs = prepare(args, kwargs)
    return f.trace(*args, **kwargs)

  wrapped.lower = lower  # type: ignore[attr-defined]
  wrapped.trace = trace  # type: ignore[attr-defined]
  return wrapped
