"""Orbax checkpointing for pytrees with `GlobalDeviceArray` leaves.

Importing this module registers `GdaHandler` in orbax's public type-handler
registry (`orbax.checkpoint.type_handlers.register_type_handler`) for GDA
and `jax.Array` leaves (for `jax.Array` it behaves exactly as orbax's own
`ArrayHandler`, whose options it copies), so
`PyTreeCheckpointer` / `CheckpointManager` with `PyTreeSave` save a GDA leaf
exactly as a `jax.Array`: shard by shard, each process its own shards, no
whole-array fetch, under orbax's `jax.Array` type string. Stock orbax (with or
without this package) therefore restores those leaves as `jax.Array`s.

To restore as GDAs, ask for them in the restore args:

  ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, mesh=mesh, mesh_axes=P("x"))

or let `restore_args_for(target)` build them from a target pytree (GDA leaves
restore as GDAs on the target's mesh and mesh axes; other leaves as orbax's
`checkpoint_utils.construct_restore_args` says).

`StandardCheckpointer` is different: it turns every leaf that is not a numpy
array or `jax.Array` but has `__array__` into numpy before any handler sees
it, which for a GDA is a fetch of the whole array to one host (a
`RuntimeError` across processes). Give it `as_jax_arrays(tree)` (zero-copy
views) instead, and `as_gdas(restored)` afterwards.

Needs orbax-checkpoint: `pip install 'jax-sharding-ext[checkpoint]'`.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

try:
  import orbax.checkpoint as ocp
  from orbax.checkpoint import checkpoint_utils, type_handlers
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
  raise ImportError(
      "`jax_sharding_ext.orbax_support` needs orbax-checkpoint, an optional extra: "
      "pip install 'jax-sharding-ext[checkpoint]'") from e

import jax
from jax.sharding import NamedSharding

from jax_sharding_ext._gda import GlobalDeviceArray
from jax_sharding_ext._shard_math import layout

__all__ = ["GdaHandler", "as_gdas", "as_jax_arrays", "gda_restore_args", "restore_args_for"]


def _view(x: Any) -> Any:
  return x.to_jax_array() if isinstance(x, GlobalDeviceArray) else x


class GdaHandler(type_handlers.ArrayHandler):
  """Orbax's `ArrayHandler`, for GDA leaves too.

  Saves a GDA as its zero-copy `jax.Array` (the same bytes, metadata and type
  string as a `jax.Array` leaf). Restores as a GDA where the restore args ask
  for `restore_type=GlobalDeviceArray`, else as orbax's `ArrayHandler` does.
  """

  async def serialize(self, values, infos, args=None):
    return await super().serialize([_view(v) for v in values], infos, args)

  async def deserialize(self, infos, args=None):
    arrays = await super().deserialize(infos, args)
    args = args or [None] * len(arrays)
    return [_as_requested(a, arg) for a, arg in zip(arrays, args, strict=True)]


def _as_requested(arr: Any, arg: Any) -> Any:
  if getattr(arg, "restore_type", None) is not GlobalDeviceArray:
    return arr
  if not isinstance(arr.sharding, NamedSharding):
    raise ValueError(
        "Restoring as a GlobalDeviceArray needs a NamedSharding (or `mesh` and "
        f"`mesh_axes`) in the ArrayRestoreArgs, got sharding {arr.sharding}.")
  mesh_axes = getattr(arg, "mesh_axes", None)
  return GlobalDeviceArray._wrap(arr, mesh_axes)


def gda_restore_args(mesh: jax.sharding.Mesh, mesh_axes: Any,
                     **kwargs: Any) -> ocp.ArrayRestoreArgs:
  """`ArrayRestoreArgs` restoring a leaf as a GDA on `mesh` with `mesh_axes`.

  `kwargs` go to `ArrayRestoreArgs` (e.g. `global_shape`, `dtype`,
  `strict=False` to pad or truncate).
  """
  shape = kwargs.get("global_shape", kwargs.get("shape"))
  spec = (layout(shape, mesh, mesh_axes).spec if shape is not None
          else jax.sharding.PartitionSpec(*mesh_axes))
  return ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, mesh=mesh, mesh_axes=mesh_axes,
                              sharding=NamedSharding(mesh, spec), **kwargs)


def restore_args_for(target: Any) -> Any:
  """Restore args for a pytree like `target`: GDA leaves restore as GDAs on
  their mesh and mesh axes (shape and dtype from the leaf), other leaves as
  `orbax.checkpoint.checkpoint_utils.construct_restore_args` makes them."""
  def one(x):
    if isinstance(x, GlobalDeviceArray):
      return gda_restore_args(x.mesh, x.mesh_axes, global_shape=x.shape, dtype=x.dtype)
    return checkpoint_utils.construct_restore_args(x)
  return jax.tree_util.tree_map(one, target)


def as_jax_arrays(tree: Any) -> Any:
  """`tree` with every GDA leaf as its zero-copy `jax.Array`."""
  return jax.tree_util.tree_map(_view, tree)


def as_gdas(tree: Any) -> Any:
  """`tree` with every `jax.Array` leaf with a NamedSharding as a GDA (no copy)."""
  def one(x):
    if (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        and isinstance(x.sharding, NamedSharding)):
      return GlobalDeviceArray.from_jax_array(x)
    return x
  return jax.tree_util.tree_map(one, tree)


def _register() -> None:
  """Make orbax use one `GdaHandler` for `jax.Array` and GDA leaves (idempotent).

  The handler is a copy of the one orbax has registered for `jax.Array` (same
  options, same ArrayMetadata store) whose class is `GdaHandler`: it handles
  `jax.Array` leaves exactly as before. One instance for both matters: orbax
  batches leaves per handler and each batch writes the process's ArrayMetadata
  file, so two handlers would overwrite each other's.
  """
  base = type_handlers.get_type_handler(jax.Array)
  if isinstance(base, GdaHandler):
    return
  handler = copy.copy(base)
  handler.__class__ = GdaHandler if type(base) is type_handlers.ArrayHandler else type(
      "GdaHandler", (GdaHandler, type(base)), {})
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)  # orbax warns of the intended overrides
  try:
    type_handlers.register_type_handler(jax.Array, handler, override=True)
    type_handlers.register_type_handler(GlobalDeviceArray, handler, override=True)
  finally:
    absl_logger.setLevel(level)


_register()
