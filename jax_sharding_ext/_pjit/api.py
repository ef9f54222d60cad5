"""`pjit`: the GDA-era front door, implemented over stock `jax.jit`.

`pjit(fun, in_axis_resources, out_axis_resources, static_argnums,
donate_argnums)` keeps the legacy signature (and accepts the modern
`in_shardings` / `out_shardings` spellings). Each call:

1. resolves the specs into shardings under the context mesh (`resolve.py`);
2. calls a `jax.jit` of `fun` built for exactly those shardings. The jitted
   functions are cached per resolution (the mesh and the static keyword
   arguments), so a steady loop reuses one `jax.jit` and its compiled
   executable; jit itself keys its caches on argument shapes and shardings
   (so on those of `FROM_GDA` arguments too).

Specs are pytree prefixes of the *non-static* positional arguments (old pjit
and `jax.jit` agree on this). Outputs are whatever `jax.jit` returns, so the
`jax_parallel_functions_output_gda` flag turns every output with a
`NamedSharding` (0-d included) into a `GlobalDeviceArray`. Donation goes
through `jax.jit`'s `donate_argnums` and is checked like any GDA donation
(`_dispatch/donation.py`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax.sharding import NamedSharding

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.records import FromGda, is_spec_leaf
from jax_sharding_ext._jax import config as jax_config
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._pjit import resolve
from jax_sharding_ext._pjit.spec import UNSPECIFIED, PjitSpec, parse

_GDA = frozenset({GlobalDeviceArray})
_ARRAY = frozenset({jax_tables.ArrayImpl})
_GDA_OR_ARRAY = frozenset({GlobalDeviceArray, jax_tables.ArrayImpl})
_NAMED = frozenset({NamedSharding})


def _have_named_shardings(values: list, types: set) -> bool:
  """True when every value is a GDA or a `jax.Array` with a `NamedSharding`
  (what `FROM_GDA` takes the sharding of); `types` is the set of their types.
  A few passes in C."""
  if types <= _GDA:
    return True
  if types == _ARRAY:
    arrays = values
  elif types <= _GDA_OR_ARRAY:
    arrays = [v for v in values if type(v) is jax_tables.ArrayImpl]
  else:
    return False
  return set(map(type, map(jax_tables.sharding_of, arrays))) <= _NAMED


def _shallow_leaves(args: tuple) -> list:
  """Each argument, or the values of an argument that is a plain dict, list or
  tuple: the leaves themselves when nothing is nested deeper."""
  out = []
  for a in args:
    t = type(a)
    if t is dict:
      out.extend(a.values())
    elif t is list or t is tuple:
      out.extend(a)
    else:
      out.append(a)
  return out


_CACHE_SIZE = 64
"""jax.jit objects kept per `pjit` function (one per mesh and static keywords)."""


class _Pjit:
  """One `pjit` function: its `PjitSpec` and its cache of `jax.jit`s.

  A call resolves what depends on the call (the context mesh, static keyword
  arguments), takes the `jax.jit` for that resolution from the cache (or
  builds it), and calls it; on a `ValueError` from JAX it gives the old
  pjit's message when a GDA's mesh or partitioning disagrees with the specs.

  A `FROM_GDA` argument needs no resolution: its in sharding is left to
  `jax.jit`, which takes a committed array's own sharding and keys its caches
  on it. What remains per call is the check that it has one to take (a GDA,
  or a `jax.Array` with a `NamedSharding`), a type test per leaf at the
  leaf positions under `FROM_GDA` (kept per argument structure).
  """

  def __init__(self, spec: PjitSpec):
    self.spec = spec
    self.cache: dict = {}
    self.from_gda_positions: dict = {}  # argument treedef -> leaf positions
    self.lock = threading.Lock()
    self.last: tuple = (None, None)  # (mesh, its jax.jit) of the last call without static kwargs
    # What each call must do, decided once (the hot path reads two bools).
    self.check_args = spec.negative_nums is not None or spec.in_empty
    self.from_gda_everywhere = isinstance(spec.in_specs, FromGda) and not spec.static_pos

  def _mesh(self) -> Any:
    return jax_config.context_mesh() if self.spec.needs_mesh else None

  def prepare(self, args, kwargs):
    """The `jax.jit` to call for these arguments, and the kwargs to pass it."""
    spec = self.spec
    if self.check_args:
      resolve.check_call(spec, args)
    static_kw: tuple = ()
    if kwargs:
      static_kw, kwargs = resolve.split_kwargs(spec, kwargs)
    if self.from_gda_everywhere:
      leaves = _shallow_leaves(args)
      if not _have_named_shardings(leaves, set(map(type, leaves))):
        self._check_from_gda(args)  # nested deeper, or refused
    elif spec.has_from_gda:
      self._check_from_gda(args)
    mesh = jax_config.context_mesh() if spec.needs_mesh else None
    last_mesh, last_f = self.last  # a steady loop calls under one mesh
    if last_mesh is mesh and not static_kw and last_f is not None:
      return last_f, kwargs
    key = (mesh, static_kw)
    f = self.cache.get(key)
    if f is None:
      f = jax.jit(_target(spec, static_kw),
                  **_jit_kwargs(spec, static_kw, resolve.resolve_in(spec, mesh),
                                resolve.resolve_out(spec, mesh)))
      with self.lock:
        f = self.cache.setdefault(key, f)
        while len(self.cache) > _CACHE_SIZE:
          del self.cache[next(iter(self.cache))]  # the oldest
    if not static_kw:
      self.last = (mesh, f)
    return f, kwargs

  def _check_from_gda(self, args: tuple) -> None:
    """Raise the GDA-era error if a leaf under `FROM_GDA` has no
    `NamedSharding` to take (any argument structure)."""
    spec = self.spec
    dyn_args = resolve.dynamic_args(spec, args)[1] if spec.static_pos else args
    if isinstance(spec.in_specs, FromGda):  # every leaf
      leaves = jax.tree_util.tree_leaves(dyn_args)
      if _have_named_shardings(leaves, set(map(type, leaves))):
        return
      positions: Any = range(len(leaves))
    else:
      leaves, treedef = jax.tree_util.tree_flatten(dyn_args)
      positions = self.from_gda_positions.get(treedef)
      if positions is None:
        positions = self.from_gda_positions[treedef] = resolve.from_gda_positions(
            spec, dyn_args)
    array_t = jax_tables.ArrayImpl
    for i in positions:
      x = leaves[i]
      t = type(x)
      if t is GlobalDeviceArray or (t is array_t and type(x.sharding) is NamedSharding):
        continue
      resolve.check_from_gda(spec, args)  # the GDA-era error, naming the argument
      return

  def run(self, method: str, args, kwargs):
    """`.lower` or `.trace` for these arguments."""
    f, kwargs = self.prepare(args, kwargs)
    try:
      return getattr(f, method)(*args, **kwargs)
    except ValueError as e:
      return self.retry(method, args, kwargs, f, e)

  def retry(self, method: str | None, args, kwargs, f, error: ValueError):
    """After jit refused the arguments (it checks committed arguments'
    shardings before running anything): place eager arrays as their specs
    say and call again, or raise the GDA-era error that explains `error`."""
    call = f if method is None else getattr(f, method)
    placed = resolve.place_eager_arrays(self.spec, self._mesh(), args)
    if placed is not None:
      return call(*placed, **kwargs)
    better = resolve.explain(self.spec, self._mesh(), args)
    if better is None:
      raise error
    raise better from error


def _jit_kwargs(spec: PjitSpec, static_kw: tuple, in_res: Any, out_res: Any) -> dict:
  kw = dict(spec.jit_kwargs)
  if in_res is not UNSPECIFIED:
    kw["in_shardings"] = in_res
  if out_res is not UNSPECIFIED:
    kw["out_shardings"] = out_res
  rest = tuple(n for n in spec.static_names if n not in dict(static_kw))
  if rest:
    kw["static_argnames"] = rest
  else:
    kw.pop("static_argnames", None)
  return kw


def _target(spec: PjitSpec, static_kw: tuple) -> Callable:
  """The function `jax.jit` compiles: `fun` with the static keyword arguments
  bound, and its outputs checked against the out specs when they are given."""
  fun = spec.fun
  if static_kw:
    # `jax.jit` refuses keyword arguments, static ones included, once
    # `in_shardings` is given (jax 0.10.2); bind them here instead. Static
    # values are hashable and part of the cache key, as in jit's own cache.
    fun = functools.partial(fun, **dict(static_kw))
  if not spec.out_given:
    return fun
  inner, name, specs = fun, spec.out_name, spec.out_specs
  spec_tree = jax.tree_util.tree_structure(specs, is_leaf=is_spec_leaf)

  @functools.wraps(spec.fun)
  def checked(*args, **kwargs):
    # At trace time, so that a mismatch names the parameter the user wrote
    # (stock names `out_shardings`, and raises a bare AssertionError for `()`).
    out = inner(*args, **kwargs)
    try:
      spec_tree.flatten_up_to(out)
    except ValueError:
      raise ValueError(
          f"pjit {name} specification must be a tree prefix of the outputs: got "
          f"{name}={specs!r} (structure {spec_tree}), but the function returned "
          f"{jax.tree_util.tree_structure(out)}. Give one spec per output with the "
          "outputs' own containers (a list for a list, a tuple for a tuple), or one "
          "spec for all of them.") from None
    return out
  return checked


@jax_tracebacks.api_boundary
def pjit(fun: Callable,
         in_axis_resources: Any = UNSPECIFIED,
         out_axis_resources: Any = UNSPECIFIED,
         static_argnums: int | Iterable[int] | None = None,
         donate_argnums: int | Iterable[int] | None = None,
         *,
         in_shardings: Any = UNSPECIFIED,
         out_shardings: Any = UNSPECIFIED,
         static_argnames: str | Iterable[str] | None = None,
         donate_argnames: str | Iterable[str] | None = None,
         keep_unused: bool = False,
         inline: bool = False) -> Callable:
  """Compile `fun` with GDA-era `pjit`'s signature, on stock `jax.jit`.

  A bare `PartitionSpec` in the specs resolves against the mesh of the
  enclosing `with jax.set_mesh(mesh):` (or the deprecated `with mesh:`) at
  each call.

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
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
    ...                                       lambda index: np.ones((8, 2))[index])
    >>> f = pjit(lambda x: x @ x.T, in_axis_resources=FROM_GDA,
    ...          out_axis_resources=P('x', 'y'))
    >>> with jax.set_mesh(mesh):   # the mesh the bare `P('x', 'y')` resolves against
    ...   out = f(gda)
    >>> out.shape, out.sharding == jax.sharding.NamedSharding(mesh, P('x', 'y'))
    ((8, 8), True)
    >>> with parallel_functions_output_gda(True), jax.set_mesh(mesh):
    ...   type(f(gda)).__name__
    'GlobalDeviceArray'
  """
  state = _Pjit(parse(fun, in_axis_resources, out_axis_resources, static_argnums,
                      donate_argnums, in_shardings, out_shardings, static_argnames,
                      donate_argnames, keep_unused=keep_unused, inline=inline))

  @functools.wraps(fun)
  @jax_tracebacks.api_boundary
  def wrapped(*args, **kwargs):
    f, kwargs = state.prepare(args, kwargs)
    try:
      return f(*args, **kwargs)
    except ValueError as e:
      return state.retry(None, args, kwargs, f, e)

  def lower(*args, **kwargs):
    """Lower for these arguments (`jax.jit(...).lower`) under the context mesh."""
    return state.run("lower", args, kwargs)

  def trace(*args, **kwargs):
    """Trace for these arguments (`jax.jit(...).trace`) under the context mesh."""
    return state.run("trace", args, kwargs)

  wrapped.lower = lower  # type: ignore[attr-defined]
  wrapped.trace = trace  # type: ignore[attr-defined]
  return wrapped
