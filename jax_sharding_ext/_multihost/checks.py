"""The arguments of the conversions between host-local and global arrays.

`host_local_array_to_global_array` and `global_array_to_host_local_array`
hand their pytrees to stock `multihost_utils`, which fails on a wrong
`global_mesh` or spec with an `AttributeError`, an `IndexError` or an
exception of its own class, and on a leaf that does not divide over the mesh
with a bare `AssertionError`. `checked_inputs` checks them first and names
the argument or the leaf; `none_as_replicated` reads `None` in `pspecs` as
GDA-era pjit did.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jax_sharding_ext._array.records import is_spec_leaf


def none_as_replicated(pspecs: Any) -> Any:
  """`None` in `pspecs` as `PartitionSpec()`: replicated, as `None` meant in
  GDA-era pjit axis resources (stock multihost_utils rejects `None`)."""
  return jax.tree_util.tree_map(lambda s: PartitionSpec() if s is None else s,
                                pspecs, is_leaf=lambda x: x is None)


def has_none(pspecs: Any) -> bool:
  """Whether `pspecs` has a `None` (which `none_as_replicated` replaces)."""
  return any(s is None for s in jax.tree_util.tree_leaves(pspecs, is_leaf=lambda x: x is None))


def none_not_replicable(fn: str, global_mesh: Any, error: BaseException) -> ValueError:
  """The error for a `None` spec (replicated) that stock cannot honour: an
  input spanning other processes that is not already replicated over
  `global_mesh` (stock raises `NotImplementedError` for `PartitionSpec()`
  there, and a `ValueError` for any `None`)."""
  return ValueError(
      f"`{fn}`: `None` is not a valid input to the pspecs argument for an input that spans "
      "other processes' devices and is not replicated over `global_mesh` "
      f"{dict(global_mesh.shape)}: a `None` spec means replicated (`PartitionSpec()`), as in "
      f"GDA-era pjit, and JAX cannot reshard such an input ({error}). Give the input's own "
      "`PartitionSpec` over its mesh in `pspecs`.")


def checked_inputs(fn: str, views: Any, global_mesh: Any, pspecs: Any) -> Any:
  """Check `fn`'s arguments, naming the one that is wrong (stock fails on
  them with an `AttributeError`, an `IndexError` or an exception of its own
  class), and prepare the leaves for stock.

  `global_mesh` must be a `Mesh` and each spec a `PartitionSpec` that names
  only axes of the mesh, each at most once (an empty tree's specs are
  checked too). A leaf that stock converts (not one that is already what
  `fn` makes, which stock returns as it is) must have no spec entry beyond
  its rank and divide evenly: a local leaf over the local mesh, a global one
  over `global_mesh`. A leaf that is not an array of numbers (a string, an
  object) is a `TypeError` naming it. A Python scalar leaf is taken as its
  numpy value; for `host_local_array_to_global_array` a concrete device
  array of another sharding is placed on the local sharding first (stock
  fails inside `batched_device_put` for a multi-device array it must
  slice), and for `global_array_to_host_local_array` a host value becomes
  the global array it is the value of. The checks read only shapes, which
  are static, so they also run on traced leaves; a traced leaf is handed to
  stock unchanged.
  """
  arg = "local_inputs" if fn == "host_local_array_to_global_array" else "global_inputs"
  if not isinstance(global_mesh, jax.sharding.Mesh):
    raise TypeError(
        f"`{fn}`: `global_mesh` must be a `jax.sharding.Mesh`, got a "
        f"{type(global_mesh).__name__} ({global_mesh!r:.80}). Build one with "
        "`Mesh(np.array(jax.devices()).reshape(...), axis_names)`.")
  spec_def: Any  # a PyTreeDef (jaxlib publishes no type for it)
  path_specs, spec_def = jax.tree_util.tree_flatten_with_path(pspecs, is_leaf=is_spec_leaf)
  for spec_path, spec in path_specs:
    _check_spec(fn, spec, jax.tree_util.keystr(spec_path), global_mesh)
  try:
    subtrees = spec_def.flatten_up_to(views)
  except ValueError:
    return views  # not a prefix: stock raises its own error
  spec_paths, specs = zip(*path_specs, strict=True) if path_specs else ((), ())
  out = []
  for path, spec, sub in zip(spec_paths, specs, subtrees, strict=True):
    if not isinstance(spec, PartitionSpec):
      out.append(sub)  # a Sharding: stock's rules
      continue

    def one(subpath, x, path=path, spec=spec):
      where = jax.tree_util.keystr((*path, *subpath)) or arg
      if isinstance(x, bool | int | float | complex):
        # Stock reads `.dtype` / `.shape` off the Python scalar. Its numpy
        # value in JAX's dtype (float32 unless x64, as `jnp.asarray` gives):
        # stock makes the aval from a numpy input's own dtype on some
        # releases (a float64 aval over float32 data on jax 0.8.x).
        x = np.asarray(x, dtype=jax.dtypes.canonicalize_dtype(np.result_type(x)))
      if _not_an_array(x):  # stock: JAX's TypeError, which names no leaf
        raise TypeError(
            f"`{fn}`: the input {where} ({x!r:.40}, of type {type(x).__name__}) is not an "
            "array of numbers, so JAX cannot make an array of it. Give a numpy array, a JAX "
            "array or a Python number, or leave it out of the tree.")
      if (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
          and x.is_fully_addressable == (fn == "global_array_to_host_local_array")):
        return x  # already what `fn` makes: stock returns it as it is
      shape = np.shape(x)
      used = [dim for dim, entry in enumerate(spec) if entry is not None]
      if used and used[-1] >= len(shape):
        raise ValueError(
            f"`{fn}`: the pspec {spec} partitions dimension {used[-1]}, but the input "
            f"{where} of shape {shape} has rank {len(shape)}. Give `pspecs` at most "
            f"{len(shape)} entries for it (trailing `None`s are fine).")
      if fn == "host_local_array_to_global_array":
        return _fits_local_mesh(fn, x, where, shape, spec, global_mesh)
      _fits_global_mesh(fn, where, shape, spec, global_mesh)
      _local_mesh(fn, global_mesh)
      if not isinstance(x, jax.Array | jax.core.Tracer) and np.asarray(x).dtype.kind in "biufc":
        return _global_from_host(x, spec, global_mesh)
      return x  # (anything else: stock's own error)
    out.append(jax.tree_util.tree_map_with_path(one, sub))
  return jax.tree_util.tree_unflatten(spec_def, out)


def _not_an_array(x: Any) -> bool:
  """Whether JAX cannot take `x` as an array (a string, an arbitrary object, a
  numpy array of strings, objects or dates)."""
  if isinstance(x, jax.Array | jax.core.Tracer) or hasattr(x, "__jax_array__"):
    return False
  if isinstance(x, np.ndarray | np.generic):
    return not (jax.dtypes.issubdtype(x.dtype, np.number)
                or jax.dtypes.issubdtype(x.dtype, np.bool_))
  return True


def _check_spec(fn: str, spec: Any, where: str, mesh: jax.sharding.Mesh) -> None:
  if not is_spec_leaf(spec):
    raise TypeError(
        f"`{fn}`: `pspecs`{where} must be a `PartitionSpec` (or a pytree of them, a "
        f"prefix of the inputs), got a {type(spec).__name__} ({spec!r:.60}). Write "
        f"`PartitionSpec({spec!r:.30})` for one axis.")
  if not isinstance(spec, PartitionSpec):
    return
  names = [n for entry in spec for n in (entry if isinstance(entry, tuple) else (entry,))
           if n is not None]
  unknown = [n for n in names if n not in mesh.axis_names]
  if unknown:
    raise ValueError(
        f"`{fn}`: `pspecs`{where} {spec} names the mesh axes {unknown}, but "
        f"`global_mesh` has the axes {tuple(mesh.axis_names)}.")
  twice = sorted({n for n in names if names.count(n) > 1}, key=str)
  if twice:
    raise ValueError(
        f"`{fn}`: `pspecs`{where} {spec} uses the mesh axes {twice} more than once; "
        "each mesh axis may partition at most one dimension.")


def _fits_global_mesh(fn: str, where: str, shape: tuple, spec: PartitionSpec,
                      global_mesh: jax.sharding.Mesh) -> None:
  for dim, entry in enumerate(spec):
    names = entry if isinstance(entry, tuple) else (entry,)
    parts = int(np.prod([global_mesh.shape[n] for n in names if n is not None]))
    if dim < len(shape) and shape[dim] % parts:
      raise ValueError(
          f"`{fn}`: the global input {where} of shape {shape} cannot be split with "
          f"pspec {spec}: its dimension {dim} ({shape[dim]}) must divide evenly over the "
          f"{parts} devices along {entry!r} of `global_mesh` {dict(global_mesh.shape)}.")


def _global_from_host(x: Any, spec: PartitionSpec, global_mesh: jax.sharding.Mesh) -> Any:
  """A host value given to `global_array_to_host_local_array` as the global
  array it is the value of. (Stock slices a numpy leaf by its global shape
  over the local mesh: wrong, an XLA error, once the local mesh is smaller
  than the global one.)"""
  value = np.asarray(x)
  return jax.make_array_from_callback(value.shape, NamedSharding(global_mesh, spec),
                                      lambda index: value[index])


def _local_mesh(fn: str, global_mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  try:
    return global_mesh.local_mesh
  except ValueError as e:  # JAX's message names neither the argument nor the mesh
    raise ValueError(
        f"`{fn}`: `global_mesh` {dict(global_mesh.shape)} does not give this process's "
        f"devices a contiguous block ({e}). Order the devices so that each process's "
        "devices are a sub-block of the mesh, e.g. `Mesh(np.array(jax.devices())"
        ".reshape(jax.process_count(), -1), ...)`.") from None


def _fits_local_mesh(fn: str, x: Any, where: str, shape: tuple, spec: PartitionSpec,
                     global_mesh: jax.sharding.Mesh) -> Any:
  local_mesh = _local_mesh(fn, global_mesh)
  for dim, entry in enumerate(spec):
    names = entry if isinstance(entry, tuple) else (entry,)
    parts = int(np.prod([local_mesh.shape[n] for n in names
                         if n is not None and n in local_mesh.shape]))
    if dim < len(shape) and shape[dim] % parts:
      raise ValueError(
          f"`{fn}`: the local input {where} of shape "
          f"{shape} cannot be globalised with pspec {spec}: its dimension {dim} "
          f"({shape[dim]}) must divide evenly over this process's {parts} "
          f"devices along {entry!r} (local mesh {dict(local_mesh.shape)}). "
          "Give every process a local batch whose size is a multiple of that.")
  if isinstance(x, jax.core.Tracer):
    return x  # traced (inside jit, vmap, grad): stock's primitive takes it as is
  if (isinstance(x, jax.Array) and x.is_fully_addressable
      and len(x.sharding.device_set) > 1):
    local = NamedSharding(local_mesh, spec)
    if not x.sharding.is_equivalent_to(local, x.ndim):
      return jax.device_put(x, local)
  return x
