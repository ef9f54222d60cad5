"""Orbax checkpointing for pytrees with `GlobalDeviceArray` leaves.

A GDA is a `jax.Array`, so orbax saves GDA leaves with its `jax.Array`
handler: shard by shard, each process its own shards, no whole-array fetch,
under orbax's `jax.Array` type string (stock orbax, with or without this
package, reads them back as `jax.Array`s). Importing this module makes that
handler a `GdaHandler`, a copy of orbax's registered `ArrayHandler` (same
options) that also restores GDAs:

* where the target pytree holds a GDA (`StandardRestore(state)`,
  `PyTreeRestore(item=state)` with `construct_restore_args`): a GDA on the
  target's mesh with the target's `mesh_axes`;
* where the restore args ask for one:
  `ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, mesh=mesh, mesh_axes=P("x"))`,
  `gda_restore_args(mesh, mesh_axes)`, or `restore_args_for(target)`.
  `mesh_axes` there takes every spelling `GlobalDeviceArray.from_callback`
  takes (a `PartitionSpec`, a list or tuple of axis names, tuples of names and
  `None`s, or `None` for fully replicated), with the same errors for invalid
  ones; the restored GDA keeps `mesh_axes` as given, and orbax, which builds
  a `NamedSharding` from them, gets the equivalent `PartitionSpec`.

`as_jax_arrays` / `as_gdas` convert a pytree's leaves both ways (zero-copy);
no orbax call needs them.

The handler stays registered after `jax_sharding_ext.uninstall()` (it is
orbax's registry, not JAX's, and it handles `jax.Array` leaves exactly as
orbax's own handler does).

Needs orbax-checkpoint: `pip install 'jax-sharding-ext[checkpoint]'`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import os
from typing import Any as _Any

try:
  import orbax.checkpoint as ocp
  import tensorstore as ts
  from orbax.checkpoint import checkpoint_utils, type_handlers
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
  raise ImportError(
      "`jax_sharding_ext.orbax_support` needs orbax-checkpoint, an optional extra: "
      "pip install 'jax-sharding-ext[checkpoint]'") from e

import jax

from jax_sharding_ext import _public
from jax_sharding_ext._array import gda as _gda
from jax_sharding_ext._array import records as _records
from jax_sharding_ext._array import shard_math as _shard_math
from jax_sharding_ext._checkpoint import checks as _checks
from jax_sharding_ext._checkpoint import recording as _recording

# orbax's frames stand between the user's line and a save or restore.
_ORBAX_DIRS = (os.path.dirname(os.path.dirname(ocp.__file__)) + os.sep,)

__all__ = ["GdaHandler", "as_gdas", "as_jax_arrays", "gda_restore_args", "restore_args_for"]

# `dir()`, `help()` and tab completion list the public names, not the modules
# and helpers used here.
__dir__ = _public.module_dir(__name__)


def _view(x: _Any) -> _Any:
  return x.to_jax_array() if isinstance(x, _gda.GlobalDeviceArray) else x


class GdaHandler(type_handlers.ArrayHandler):
  """Orbax's `ArrayHandler`, for GDA leaves too.

  Saves a GDA as its zero-copy `jax.Array` (the same bytes, metadata and type
  string as a `jax.Array` leaf). Restores as a GDA where the restore args ask
  for `restore_type=GlobalDeviceArray`, else as orbax's `ArrayHandler` does.
  Importing this module registers it for `jax.Array` leaves (so GDA leaves
  too); orbax calls its methods, not user code.

  Example:
    >>> import orbax.checkpoint as ocp
    >>> isinstance(ocp.type_handlers.get_type_handler(jax.Array), GdaHandler)
    True
  """

  async def serialize(self, values, infos, args=None):
    """Write each leaf (a GDA as its `jax.Array`), shard by shard; orbax's `serialize`.

    The save is recorded in an open transfer ledger (device_to_host, your line).

    Example:
      >>> import tempfile, orbax.checkpoint as ocp
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                           lambda index: np.arange(8.0)[index])
      >>> with jse.transfer_ledger() as ledger:
      ...   ocp.PyTreeCheckpointer().save(tempfile.mkdtemp() + '/state', {'w': gda})
      >>> [(r.direction, r.nbytes) for r in ledger.records]
      [('device_to_host', 32)]
    """
    where = _recording.site(_ORBAX_DIRS)
    out = await super().serialize([_view(v) for v in values], infos, args)
    # The copies to the host are done (orbax commits in the background).
    _recording.saved(
        [v.to_jax_array() for v in values if isinstance(v, _gda.GlobalDeviceArray)], where)
    return out

  async def deserialize(self, infos, args=None):
    """Read each leaf; as a GDA where its restore args ask for one. Orbax's `deserialize`.

    Example:
      >>> import tempfile, orbax.checkpoint as ocp
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = jse.GlobalDeviceArray.from_callback((8, 2), mesh, ['x', None],
      ...                                           lambda index: np.ones((8, 2))[index])
      >>> path = tempfile.mkdtemp() + '/state'
      >>> ckptr = ocp.StandardCheckpointer()
      >>> ckptr.save(path, {'w': gda, 'step': np.array(7)})
      >>> ckptr.wait_until_finished()   # it saves in the background
      >>> out = ckptr.restore(path, {'w': gda, 'step': np.array(0)})
      >>> out['w']   # a GDA where the target holds one, with its mesh axes
      GlobalDeviceArray(shape=(8, 2), dtype=float32,
        global_mesh_shape={'x': 4, 'y': 2}, mesh_axes=['x', None])
    """
    where = _recording.site(_ORBAX_DIRS)
    out = await self._deserialize(infos, args)
    _recording.restored([a for a in out if isinstance(a, _gda.GlobalDeviceArray)], where)
    return out

  async def _deserialize(self, infos, args):
    for arg in args or ():
      _check_request(arg)
    if args is not None:
      # A GDA request without `global_shape` is checked against the saved shape.
      unsized = [i for i, arg in enumerate(args)
                 if _gda_request(arg) and _shape_of(arg) is None]
      shapes: dict[int, _Any] = {}
      if unsized:
        saved = await self._saved_shapes([infos[i] for i in unsized])
        shapes = dict(zip(unsized, saved, strict=True))
      arrays = await super().deserialize(
          infos, [_for_orbax(arg, shapes.get(i)) for i, arg in enumerate(args)])
    else:
      arrays = await super().deserialize(infos, args)
    args = args or [None] * len(arrays)
    return [_as_requested(a, arg) for a, arg in zip(arrays, args, strict=True)]

  async def _saved_shapes(self, infos):
    """The shapes of the stored arrays, read from their own metadata only.

    Not through `self.metadata`, which also reads the `_sharding` file: orbax
    0.4.x wrote its members under the plain parameter names, today's orbax
    looks them up under base64 names, so a checkpoint of 2023 would fail there
    although its arrays restore."""
    specs = [type_handlers.get_json_tspec_read(
        info, use_ocdbt=bool(info.is_ocdbt_checkpoint),
        metadata_key=getattr(self, "_metadata_key", None)) for info in infos]
    stores = await asyncio.gather(*(
        ts.open(ts.Spec(spec), open=True, context=info.ts_context)
        for spec, info in zip(specs, infos, strict=True)))
    return [tuple(t.shape) for t in stores]


def _spec(mesh: _Any, mesh_axes: _Any, shape: _Any = None) -> jax.sharding.PartitionSpec:
  """The `PartitionSpec` of GDA-era `mesh_axes` on `mesh`, checked as
  `GlobalDeviceArray.from_callback` checks them (the same errors).

  With `shape`, everything is checked (rank and divisibility too) and the spec
  is the one `from_callback` gives the array. Without, the types and the axis
  names are; the spec then drops trailing `None`s, so it fits any rank.
  """
  if not isinstance(mesh, jax.sharding.Mesh):
    raise TypeError(
        f"`mesh` must be a `jax.sharding.Mesh` to restore a GlobalDeviceArray, got "
        f"{type(mesh).__name__} {mesh!r:.80}.")
  if shape is not None:
    return _shard_math.layout(shape, mesh, mesh_axes).spec
  axes = _shard_math.canonical_mesh_axes(mesh_axes)
  # Size 0 divides evenly among any axes: only the names are checked here.
  return _shard_math.to_partition_spec(
      _shard_math.normalize_mesh_axes((0,) * len(axes), mesh, axes))


def _gda_request(arg: _Any) -> bool:
  """Whether `arg` asks for a GDA on `mesh` with `mesh_axes` (`None`, or not
  given, with no `sharding`: fully replicated, as for `from_callback`)."""
  return (isinstance(arg, ocp.ArrayRestoreArgs) and arg.restore_type is _gda.GlobalDeviceArray
          and arg.mesh is not None and (arg.mesh_axes is not None or arg.sharding is None))


def _check_request(arg: _Any) -> None:
  """Refuse, before anything is read, what a GDA request cannot restore: a
  `mesh` that is not a `Mesh`, a `global_shape` (or `shape`) that is not a
  shape, a `dtype` no JAX array has; each error names the argument (as
  `from_callback` and `serialization` name them)."""
  if getattr(arg, "restore_type", None) is not _gda.GlobalDeviceArray:
    return
  if arg.mesh is not None and not isinstance(arg.mesh, jax.sharding.Mesh):
    _spec(arg.mesh, arg.mesh_axes)  # its TypeError naming `mesh`
  for name in ("global_shape", "shape"):
    value = getattr(arg, name, None)
    if value is not None and not isinstance(value, _records.GdaShape):
      _shard_math.canonical_shape(value, name)
  _checks.checked_dtype(arg.dtype, "`dtype` of the ArrayRestoreArgs")


def _shape_of(arg: _Any) -> _Any:
  return arg.global_shape if arg.global_shape is not None else arg.shape


def _for_orbax(arg: _Any, saved_shape: _Any = None) -> _Any:
  """`arg` as orbax's `ArrayHandler` takes it: a GDA request's `mesh_axes`
  checked against the shape it restores to (given, else `saved_shape`) and
  handed on as the `PartitionSpec` `from_callback` gives that shape (orbax
  builds `NamedSharding(mesh, mesh_axes)` from them)."""
  if not _gda_request(arg):
    return arg
  shape = _shape_of(arg)
  spec = _spec(arg.mesh, arg.mesh_axes, saved_shape if shape is None else shape)
  return dataclasses.replace(arg, mesh_axes=spec)


def _as_requested(arr: _Any, arg: _Any) -> _Any:
  if getattr(arg, "restore_type", None) is _gda.GlobalDeviceArray:
    mesh_axes = getattr(arg, "mesh_axes", None)
    checked = True
  elif isinstance(getattr(arg, "global_shape", None), _records.GdaShape):  # the target was a GDA
    mesh_axes = arg.global_shape.mesh_axes
    checked = False
    if _shard_math.layout(arr.shape, arr.sharding.mesh, mesh_axes).spec != arr.sharding.spec:
      mesh_axes = None  # restored to another sharding than the target's
  else:
    return arr
  if not isinstance(arr.sharding, jax.sharding.NamedSharding):
    raise ValueError(
        "Restoring as a GlobalDeviceArray needs a NamedSharding (or `mesh` and "
        f"`mesh_axes`) in the ArrayRestoreArgs, got sharding {arr.sharding}.")
  if checked and mesh_axes is not None:
    # The errors `from_callback` gives (rank, divisibility) for this shape.
    spec = _shard_math.layout(arr.shape, arr.sharding.mesh, mesh_axes).spec
    want = jax.sharding.NamedSharding(arr.sharding.mesh, spec)
    if want.spec != arr.sharding.spec:
      if not want.is_equivalent_to(arr.sharding, arr.ndim):
        raise ValueError(
            f"Restoring as a GlobalDeviceArray with `mesh_axes` {mesh_axes!r} gave an "
            f"array with sharding {arr.sharding}, which those mesh axes do not describe. "
            "Give `mesh` and `mesh_axes` (e.g. `gda_restore_args(mesh, mesh_axes)`), or "
            "a `sharding` whose spec they match.")
      # The same buffers under the spec `from_callback` gives (e.g. trailing Nones).
      arr = jax.make_array_from_single_device_arrays(
          arr.shape, want, [s.data for s in arr.addressable_shards])
  return _gda.GlobalDeviceArray._wrap(arr, mesh_axes)


def gda_restore_args(mesh: jax.sharding.Mesh, mesh_axes: _Any,
                     **kwargs: _Any) -> ocp.ArrayRestoreArgs:
  """`ArrayRestoreArgs` restoring a leaf as a GDA on `mesh` with `mesh_axes`.

  `mesh_axes` takes every spelling `GlobalDeviceArray.from_callback` takes: a
  `PartitionSpec`, a list or tuple of axis names, tuples of names and `None`s,
  or `None` (fully replicated). The restored GDA's `mesh_axes` are the ones
  given. Invalid ones raise `from_callback`'s `TypeError` / `ValueError`:
  here, or, for a rank or divisibility mismatch when no `global_shape` is
  given, on restore (against the saved shape, before any data is read).

  `kwargs` go to `ArrayRestoreArgs` (e.g. `global_shape`, `dtype`,
  `strict=False` to pad or truncate).

  Example:
    >>> import tempfile, orbax.checkpoint as ocp
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> w = jax.device_put(np.ones((8, 2)), jax.sharding.NamedSharding(mesh, P('x')))
    >>> path = tempfile.mkdtemp() + '/state'
    >>> ocp.PyTreeCheckpointer().save(path, {'w': w})   # saved from a jax.Array
    >>> out = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
    ...     restore_args={'w': gda_restore_args(mesh, ('y', None))}))
    >>> out['w']   # restored as a GDA, on the mesh axes asked for
    GlobalDeviceArray(shape=(8, 2), dtype=float32,
      global_mesh_shape={'x': 4, 'y': 2}, mesh_axes=('y', None))
  """
  spec = _spec(mesh, mesh_axes, kwargs.get("global_shape", kwargs.get("shape")))
  return ocp.ArrayRestoreArgs(restore_type=_gda.GlobalDeviceArray, mesh=mesh, mesh_axes=mesh_axes,
                              sharding=jax.sharding.NamedSharding(mesh, spec), **kwargs)


def restore_args_for(target: _Any) -> _Any:
  """Return restore args for a pytree like `target`.

  GDA leaves restore as GDAs on their mesh and mesh axes (shape and dtype
  from the leaf); other leaves as
  `orbax.checkpoint.checkpoint_utils.construct_restore_args` makes them.

  Example:
    >>> import tempfile, orbax.checkpoint as ocp
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> state = {'w': jse.GlobalDeviceArray.from_callback(
    ...              (8,), mesh, P('x'), lambda index: np.arange(8.0)[index]),
    ...          'b': jax.device_put(np.zeros(8, np.float32),
    ...                              jax.sharding.NamedSharding(mesh, P()))}
    >>> path = tempfile.mkdtemp() + '/state'
    >>> ocp.PyTreeCheckpointer().save(path, state)
    >>> out = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
    ...     item=state, restore_args=restore_args_for(state)))
    >>> type(out['w']).__name__, type(out['b']).__name__
    ('GlobalDeviceArray', 'ArrayImpl')
  """
  def one(x):
    if isinstance(x, _gda.GlobalDeviceArray):
      return gda_restore_args(x.mesh, x.mesh_axes, global_shape=x.shape, dtype=x.dtype)
    return checkpoint_utils.construct_restore_args(x)
  return jax.tree_util.tree_map(one, target)


def as_jax_arrays(tree: _Any) -> _Any:
  """Return `tree` with every GDA leaf as its zero-copy `jax.Array`.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
    ...                                           lambda index: np.zeros(8)[index])
    >>> tree = as_jax_arrays({'w': gda, 'step': 3})
    >>> type(tree['w']).__name__, tree['step']
    ('ArrayImpl', 3)
  """
  return jax.tree_util.tree_map(_view, tree)


def as_gdas(tree: _Any) -> _Any:
  """Return `tree` with every `jax.Array` leaf with a `NamedSharding` as a GDA (no copy).

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> w = jax.device_put(np.zeros(8), jax.sharding.NamedSharding(mesh, P('x')))
    >>> tree = as_gdas({'w': w, 'step': 3})
    >>> type(tree['w']).__name__, tree['w'].mesh_axes
    ('GlobalDeviceArray', P('x',))
  """
  def one(x):
    if (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        and isinstance(x.sharding, jax.sharding.NamedSharding)):
      return _gda.GlobalDeviceArray.from_jax_array(x)
    return x
  return jax.tree_util.tree_map(one, tree)


def _register() -> None:
  """Make orbax's `jax.Array` handler a `GdaHandler` (idempotent).

  The handler is a copy of the one orbax has registered for `jax.Array` (same
  options, same ArrayMetadata store) whose class is `GdaHandler`: it handles
  `jax.Array` leaves exactly as before. Orbax finds a handler by `issubclass`,
  so GDA leaves (a `jax.Array` subclass) get the same one; registering the
  GDA type itself would replace the `jax.Array` entry.
  """
  base = type_handlers.get_type_handler(jax.Array)
  if isinstance(base, GdaHandler):
    return
  handler = copy.copy(base)
  handler.__class__ = GdaHandler if type(base) is type_handlers.ArrayHandler else type(
      "GdaHandler", (GdaHandler, type(base)), {})
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)  # orbax warns of the intended override
  try:
    type_handlers.register_type_handler(jax.Array, handler, override=True)
  finally:
    absl_logger.setLevel(level)


_register()
