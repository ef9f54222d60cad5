"""The two calling conventions of the GDA-era deserialization functions.

JAX 0.3.17 to 0.3.21 took a mesh and mesh axes,
`async_deserialize(mesh, mesh_axes, tensorstore_spec, ...)`; JAX 0.3.22 to
0.4.x took a `Sharding` in their place,
`async_deserialize(in_sharding, tensorstore_spec, ...)` (the same change for
`run_deserialization` and the manager's `deserialize`, which take sequences).
`bind` tells the two apart by the type of the first argument (a `Mesh` or a
`Sharding`, or a sequence of them), whether it is passed by position or by
either keyword, then binds the call to the signature of that vintage as it
was written; anything that mixes the two is a `TypeError` naming both.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Iterable, Mapping
from typing import Any, cast

import tensorstore as ts
from jax.sharding import Mesh, PartitionSpec, Sharding

MESH, SHARDING = "mesh", "sharding"

TensorstoreSpec = dict[str, Any] | ts.Spec
"""A tensorstore spec: a dict (e.g. from `get_tensorstore_spec(path)`) or a `ts.Spec`."""
DTypeLike = Any
"""A numpy or JAX dtype, or its name."""


@dataclasses.dataclass(frozen=True)
class Forms:
  """The two signatures of one function (`many`: it takes sequences)."""
  fn: str
  mesh: inspect.Signature
  sharding: inspect.Signature
  many: bool

  def names(self, kind: str) -> list[str]:
    return list((self.mesh if kind == MESH else self.sharding).parameters)

  def both(self) -> str:
    return (f"`{self.fn}` takes {self.mesh} as in JAX 0.3.17 to 0.3.21, or {self.sharding} "
            "as in JAX 0.3.22 to 0.4.x")


def _async_deserialize_mesh(mesh, mesh_axes, tensorstore_spec, global_shape=None, dtype=None,
                            byte_limiter=None): ...
def _async_deserialize_sharding(in_sharding, tensorstore_spec, global_shape=None, dtype=None,
                                byte_limiter=None): ...
def _run_deserialization_mesh(global_meshes, mesh_axes, tensorstore_specs, global_shapes=None,
                              dtypes=None, concurrent_gb=32): ...
def _run_deserialization_sharding(shardings, tensorstore_specs, global_shapes=None, dtypes=None,
                                  concurrent_gb=32): ...
# The manager's: the old ones, plus `concurrent_gb` as stock's manager takes it today.
def _deserialize_mesh(global_meshes, mesh_axes, tensorstore_specs, global_shapes=None,
                      dtypes=None, concurrent_gb=32): ...
def _deserialize_sharding(shardings, tensorstore_specs, global_shapes=None, dtypes=None,
                          concurrent_gb=32): ...


def _forms(fn: str, mesh: Any, sharding: Any, many: bool) -> Forms:
  return Forms(fn, inspect.signature(mesh), inspect.signature(sharding), many)


ASYNC_DESERIALIZE = _forms("async_deserialize", _async_deserialize_mesh,
                           _async_deserialize_sharding, many=False)
RUN_DESERIALIZATION = _forms("run_deserialization", _run_deserialization_mesh,
                             _run_deserialization_sharding, many=True)
MANAGER_DESERIALIZE = _forms("GlobalAsyncCheckpointManager.deserialize", _deserialize_mesh,
                             _deserialize_sharding, many=True)


def _kind(x: Any) -> str | None:
  if isinstance(x, Mesh):
    return MESH
  if isinstance(x, Sharding):
    return SHARDING
  return None


def _first(forms: Forms, args: tuple, kwargs: dict) -> tuple[str | None, Any, str]:
  """(keyword it came by or None, the first argument, how to name it)."""
  m, s = forms.names(MESH)[0], forms.names(SHARDING)[0]
  if m in kwargs and s in kwargs:
    raise TypeError(f"{forms.both()}; got both `{m}` and `{s}`. Pass one of the two forms.")
  if args:
    return None, args[0], "the first argument"
  for name in (m, s):
    if name in kwargs:
      return name, kwargs[name], f"`{name}`"
  raise TypeError(f"{forms.both()}; got neither `{m}` nor `{s}`.")


def _kind_of_many(forms: Forms, first: list, named: str, keyword: str | None,
                  kwargs: dict, n_args: int) -> str:
  kinds = {_kind(x) for x in first}
  if None in kinds:
    i = [_kind(x) for x in first].index(None)
    m, s = forms.names(MESH)[0], forms.names(SHARDING)[0]
    raise TypeError(f"`{forms.fn}`: {m}[{i}] must be a jax.sharding.Mesh (the mesh, mesh_axes "
                    f"form) or {s}[{i}] a jax.sharding.Sharding (the shardings form), got "
                    f"{type(first[i]).__name__}. {forms.both()}.")
  if len(kinds) > 1:
    raise TypeError(f"{forms.both()}; {named} mixes meshes and shardings. Give all meshes "
                    "(with mesh_axes) or all shardings.")
  if kinds:
    return cast(str, kinds.pop())  # None was refused above
  # An empty sequence: the keywords decide, else the number of positionals.
  if keyword is not None:
    return MESH if keyword == forms.names(MESH)[0] else SHARDING
  if set(kwargs) & (set(forms.names(MESH)) - set(forms.names(SHARDING))):
    return MESH
  return MESH if n_args >= 3 else SHARDING


def bind(forms: Forms, args: tuple, kwargs: dict) -> tuple[str, dict[str, Any]]:
  """The form of a call (`MESH` or `SHARDING`) and its arguments by name,
  defaults filled in; the sequences of a `many` function as lists."""
  keyword, first, named = _first(forms, args, kwargs)
  if forms.many:
    if isinstance(first, Mesh | Sharding) or not isinstance(first, Iterable):
      raise TypeError(f"{forms.both()}; {named} must be a sequence (one entry per tensorstore "
                      f"spec), got {type(first).__name__}. Wrap a single one in a list.")
    first = list(first)
    kind = _kind_of_many(forms, first, named, keyword, kwargs, len(args))
  else:
    found = _kind(first)
    if found is None:
      raise TypeError(f"{forms.both()}; {named} is a {type(first).__name__}, neither a "
                      "jax.sharding.Mesh nor a jax.sharding.Sharding.")
    kind = found
  if keyword is not None and keyword != forms.names(kind)[0]:
    what = {(MESH, False): "a Mesh", (SHARDING, False): "a Sharding",
            (MESH, True): "a sequence of meshes", (SHARDING, True): "a sequence of shardings"}
    raise TypeError(f"{forms.both()}; `{keyword}` is {what[kind, forms.many]}. Pass it as "
                    f"`{forms.names(kind)[0]}` with the rest of its form.")
  args = (first, *args[1:]) if keyword is None else args
  kwargs = dict(kwargs, **({} if keyword is None else {keyword: first}))
  try:
    bound = (forms.mesh if kind == MESH else forms.sharding).bind(*args, **kwargs)
  except TypeError as e:
    other = SHARDING if kind == MESH else MESH
    stray = sorted(set(kwargs) & (set(forms.names(other)) - set(forms.names(kind))))
    hint = ""
    if stray and kind == SHARDING:
      hint = f" A Sharding carries its mesh axes: drop {stray[0]}, or pass a Mesh first."
    elif stray:
      hint = f" A Mesh goes with mesh_axes: drop {stray[0]}, or pass the Sharding first."
    first_is = "a Mesh" if kind == MESH else "a Sharding"
    raise TypeError(f"{forms.both()}; with {first_is} first: {e}.{hint}") from None
  bound.apply_defaults()
  out = dict(bound.arguments)
  _check_rest(forms, kind, out)
  return kind, out


def _is_spec(x: Any) -> bool:
  return isinstance(x, Mapping | ts.Spec)


def _check_rest(forms: Forms, kind: str, a: dict) -> None:
  """Refuse a Sharding given with mesh axes, a Mesh given with a Sharding,
  and anything but tensorstore specs where the specs go."""
  spec_name = "tensorstore_specs" if forms.many else "tensorstore_spec"
  specs = a[spec_name]
  if forms.many:
    if _is_spec(specs) or not isinstance(specs, Iterable):
      raise TypeError(f"`{forms.fn}`: {spec_name} must be a sequence of tensorstore specs "
                      f"(one per array), got {type(specs).__name__}. Wrap a single spec in "
                      "a list.")
    specs = a[spec_name] = list(specs)
    entries = [(f"{spec_name}[{i}]", x) for i, x in enumerate(specs)]
  else:
    entries = [(spec_name, specs)]
  if kind == MESH:
    axes = a["mesh_axes"]
    if forms.many and isinstance(axes, Iterable) and not isinstance(axes, PartitionSpec):
      axes = a["mesh_axes"] = list(axes)
    for i, x in enumerate(axes if isinstance(axes, list) else [axes]):
      if isinstance(x, Sharding):
        at = f"mesh_axes[{i}]" if forms.many else "mesh_axes"
        raise TypeError(f"{forms.both()}; {at} is a Sharding, which already says where "
                        "the array goes. Pass the sharding alone in place of the mesh.")
  for at, x in entries:
    if _is_spec(x):
      continue
    if kind == SHARDING and (x is None or isinstance(x, PartitionSpec | tuple | list)):
      raise TypeError(f"{forms.both()}; {at} is {x!r}, which looks like mesh axes. A Sharding "
                      "carries its mesh axes: drop them, or pass a Mesh and mesh_axes.")
    raise TypeError(f"`{forms.fn}`: {at} must be a tensorstore spec (a dict, e.g. from "
                    f"`get_tensorstore_spec(path)`, or a `tensorstore.Spec`), got "
                    f"{type(x).__name__}.")


def show_signature(fn: Any) -> None:
  """Give `fn` (which takes `*args, **kwargs` and is bound by `bind`) the
  signature of its last `typing.overload`, the sharding form, so that
  `inspect.signature` and `help()` show real parameters, types and
  defaults. Both forms stay available from `typing.get_overloads(fn)`."""
  forms = typing.get_overloads(fn)
  if forms:
    fn.__signature__ = inspect.signature(forms[-1])
