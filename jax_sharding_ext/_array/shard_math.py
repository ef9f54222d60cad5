"""Shard math of the GlobalDeviceArray era: indices, replica ids, shard shapes.

A `mesh_axes` entry per array dimension says which mesh axes split that
dimension: an axis name, a tuple of names (split over their product, first
name major), or `None` (not split). Missing trailing entries are `None`.

The indices follow the old `pxla.spec_to_indices` exactly: a split dimension
gets `slice(start, stop)`, an unsplit one `slice(None)`. Devices are keyed in
`mesh.devices.flat` order, and replica ids count up from 0 per distinct index
in that order. The results agree with stock
`NamedSharding(mesh, spec).devices_indices_map(shape)` (a property test checks
this), but are computed here in pure Python so they are cheap, cached and
independent of how JAX builds its HLO shardings.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jax_sharding_ext._jax import tracebacks as jax_tracebacks

Shape = tuple[int, ...]
Index = tuple[slice, ...]
AxisEntry = str | tuple[str, ...] | None
"""One dimension's entry of GDA-era mesh axes: an axis name, a tuple of names
(split over their product), or None (not split)."""

MeshAxes = PartitionSpec | Sequence[AxisEntry] | None
"""GDA-era mesh axes: a `PartitionSpec`, a list or tuple with at most one
entry per dimension, or None (fully replicated)."""
NormalizedAxes = tuple[tuple[str, ...], ...]


_SHAPE_RULE = (
    "Shapes must be 1D sequences of concrete values of integer type (Python or "
    "numpy ints), as for `jax.make_array_from_callback`.")


def canonical_shape(global_shape: Any, name: str = "global_shape") -> Shape:
  """Return `global_shape` as a tuple of Python ints, or raise.

  Runs before any cache lookup: `(8.0, 2)` equals and hashes like `(8, 2)`,
  so a float that reached a cache would poison the entry for the int shape.

  Raises:
    TypeError: not a sequence, or an entry that is not an integer.
    ValueError: a negative dimension.
  """
  if type(global_shape) is tuple and all(type(d) is int for d in global_shape):
    shape = global_shape  # the common case, already canonical
  else:
    if isinstance(global_shape, np.ndarray) and global_shape.ndim == 1:
      global_shape = global_shape.tolist()
    if isinstance(global_shape, (str, bytes)) or not isinstance(global_shape, Sequence):
      raise TypeError(
          f"`{name}` must be a tuple of ints, got {type(global_shape).__name__} "
          f"{global_shape!r}. {_SHAPE_RULE}")
    dims = []
    for i, d in enumerate(global_shape):
      if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
        raise TypeError(
            f"`{name}` must be a tuple of ints, got {tuple(global_shape)!r}: entry "
            f"{i} is {d!r} ({type(d).__name__}). {_SHAPE_RULE} Pass e.g. "
            f"`({', '.join('8' for _ in global_shape)})`.")
      dims.append(int(d))
    shape = tuple(dims)
  if any(d < 0 for d in shape):
    raise ValueError(f"`{name}` {shape} has a negative dimension.")
  return shape


def canonical_mesh_axes(mesh_axes: MeshAxes) -> tuple[str | tuple[str, ...] | None, ...]:
  """Return `mesh_axes` as a hashable tuple of `None` / name / tuple of names.

  Checks types only (names against the mesh are checked by
  `normalize_mesh_axes`); runs before any cache lookup.

  Raises:
    TypeError: `mesh_axes` or one of its entries has the wrong type.
  """
  if mesh_axes is None:
    return ()
  if isinstance(mesh_axes, str) or not isinstance(mesh_axes, (PartitionSpec, tuple, list)):
    raise TypeError(
        "`mesh_axes` must be a PartitionSpec or a list/tuple of axis names, "
        f"tuples of axis names, or None; got {type(mesh_axes).__name__} {mesh_axes!r}."
        + (f" Wrap a single axis as `PartitionSpec({mesh_axes!r})`."
           if isinstance(mesh_axes, str) else ""))
  out: list[Any] = []
  for dim, entry in enumerate(mesh_axes):
    if entry is None or type(entry) is str:
      out.append(entry)
      continue
    names = (entry,) if isinstance(entry, str) else entry
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
      raise TypeError(
          f"`mesh_axes` entry {entry!r} for dimension {dim} must be a mesh axis "
          "name (str), a tuple of axis names, or None.")
    names = tuple(str(n) for n in names)
    # An empty tuple of names splits nothing: `None`, as `PartitionSpec` reads it.
    out.append(names[0] if isinstance(entry, str) else names or None)
  return tuple(out)


def normalize_mesh_axes(shape: Shape, mesh: Mesh,
                        axes: tuple[Any, ...]) -> NormalizedAxes:
  """One tuple of mesh-axis names per dimension, checked against the mesh.

  `shape` and `axes` are canonical (`canonical_shape`, `canonical_mesh_axes`).

  Raises:
    ValueError: an unknown or repeated axis, too many entries, or a dimension
      that does not divide evenly among its axes.
  """
  if len(axes) > len(shape):
    if any(e is not None for e in axes[len(shape):]):
      raise ValueError(
          f"`mesh_axes` {axes!r} has {len(axes)} entries but the array has rank "
          f"{len(shape)} (shape {shape}). Give at most one entry per dimension "
          "(trailing `None`s beyond the rank are allowed and ignored).")
    axes = axes[:len(shape)]
  out: list[tuple[str, ...]] = []
  seen: dict[str, int] = {}
  for dim, entry in enumerate(axes):
    names: tuple[str, ...] = () if entry is None else (entry,) if isinstance(entry, str) else entry
    for name in names:
      if name not in mesh.shape:
        raise ValueError(
            f"Resource axis: {name} of mesh_axes is undefined. `mesh_axes` "
            f"{axes!r} names mesh axis {name!r}, which is not in the mesh (axes "
            f"{tuple(mesh.axis_names)}).")
      if name in seen:
        raise ValueError(
            f"`mesh_axes` {axes!r} uses mesh axis {name!r} for dimensions "
            f"{seen[name]} and {dim}; each mesh axis may split at most one "
            "dimension.")
      seen[name] = dim
    parts = math.prod(mesh.shape[n] for n in names)
    if shape[dim] % parts:
      raise ValueError(
          f"Dimension {dim} of `global_shape` {shape} has size {shape[dim]}, "
          f"which is not divisible by {parts}, the product of its mesh axes "
          f"{names} (mesh shape {dict(mesh.shape)}). Pad the array or choose "
          "mesh axes whose sizes divide it.")
    out.append(names)
  out.extend(() for _ in range(len(shape) - len(axes)))
  return tuple(out)


def to_partition_spec(axes: NormalizedAxes, n_given: int | None = None) -> PartitionSpec:
  """The `PartitionSpec` of normalised axes.

  With `n_given` (the number of entries the user wrote), it has that many
  entries, at most one per dimension: `P('x', None)` stays `P('x', None)`, as
  `jax.device_put(x, NamedSharding(mesh, P('x', None)))` keeps it (JAX treats
  `P('x')` and `P('x', None)` as different specs). Without, trailing Nones are
  dropped.
  """
  entries: list[Any] = [None if not a else a[0] if len(a) == 1 else a for a in axes]
  if n_given is not None:
    return PartitionSpec(*entries[:n_given])
  return without_trailing_nones(PartitionSpec(*entries))


def without_trailing_nones(spec: PartitionSpec) -> PartitionSpec:
  """`spec` without its trailing `None` entries (`P('x', None)` as `P('x')`)."""
  entries = list(spec)
  while entries and entries[-1] is None:
    entries.pop()
  return spec if len(entries) == len(spec) else PartitionSpec(*entries)


def index_key(index: Index) -> tuple:
  """A shard index as a hashable key, the same for every replica of the
  shard: the `(start, stop)` of each slice, as the GDA-era module keyed them."""
  return tuple((s.start, s.stop) for s in index)


class Layout(NamedTuple):
  """Where the shards of one (shape, mesh, mesh_axes) live."""

  shape: Shape
  indices: tuple[Index, ...]  # in mesh.devices.flat order
  replica_ids: tuple[int, ...]
  shard_shape: Shape
  spec: PartitionSpec


def layout(global_shape: Any, mesh: Any, mesh_axes: MeshAxes) -> Layout:
  """Validate the arguments, then return their (cached) `Layout`.

  Every entry point goes through here, so no unchecked value reaches the
  cache: shapes become tuples of ints and `mesh_axes` a canonical tuple first.

  Raises:
    TypeError: a wrong type for any argument (a mesh over something other
      than devices too).
    ValueError: a shape and mesh axes that do not fit the mesh, or a mesh no
      array can live on (`check_mesh`).
  """
  shape = canonical_shape(global_shape)
  if not isinstance(mesh, Mesh):
    raise TypeError(
        f"`global_mesh` must be a `jax.sharding.Mesh`, got {type(mesh).__name__}.")
  return _layout(shape, mesh, canonical_mesh_axes(mesh_axes))


def check_mesh(mesh: Mesh) -> None:
  """Refuse a mesh no array can live on, naming what is wrong with it.

  Stock `Mesh` accepts these, and what follows fails deep inside JAX
  (`ZeroDivisionError`, an XLA `INVALID_ARGUMENT`, an `AttributeError`), or
  worse: on a mesh that lists a device twice, the two shards meant for it
  share one buffer and the array's value is partly uninitialised memory.

  Raises:
    ValueError: no devices, an axis name used twice, a device listed twice.
    TypeError: something other than a `jax.Device` where a device belongs.
  """
  devices, names = mesh.devices, tuple(mesh.axis_names)
  if devices.size == 0:
    raise ValueError(
        f"`global_mesh` has no devices (its devices array has shape {devices.shape}); an "
        "array needs at least one. Build the mesh over devices, e.g. "
        "`Mesh(np.array(jax.devices()), ('x',))`.")
  twice = [n for i, n in enumerate(names) if n in names[:i]]
  if twice:
    raise ValueError(
        f"`global_mesh` has the axis name {twice[0]!r} more than once (axis names "
        f"{names}); each mesh axis needs its own name, e.g. `Mesh(devices, ('x', 'y'))`.")
  flat = list(devices.flat)
  for d in flat:
    if not isinstance(d, jax.Device):
      raise TypeError(
          f"`global_mesh` holds {d!r} ({type(d).__name__}) where a device belongs; "
          "a mesh is built over `jax.Device` objects, not device ids or names: e.g. "
          f"`Mesh(np.array(jax.devices()[:{devices.size}]).reshape({devices.shape}), "
          f"{names})`.")
  if len(set(flat)) != len(flat):
    again = next(d for i, d in enumerate(flat) if d in flat[:i])
    raise ValueError(
        f"`global_mesh` lists device {again} more than once (devices "
        f"{[d.id for d in flat]}); each device may appear once in a mesh, so that each "
        "shard has its own buffer. Build the mesh over distinct devices, e.g. "
        "`jax.devices()`.")


@functools.lru_cache(maxsize=4096)
def _layout(shape: Shape, mesh: Mesh, axes_key: tuple[Any, ...]) -> Layout:
  check_mesh(mesh)  # once per cache entry
  axes = normalize_mesh_axes(shape, mesh, axes_key)
  names = tuple(mesh.axis_names)
  sizes = tuple(mesh.devices.shape)
  shard_shape = tuple(
      d // math.prod(mesh.shape[n] for n in a) for d, a in zip(shape, axes, strict=True))
  indices: list[Index] = []
  replica_ids: list[int] = []
  counts: dict[tuple, int] = {}
  for pos in np.ndindex(*sizes):
    coord = dict(zip(names, pos, strict=True))
    index = []
    for chunk, a in zip(shard_shape, axes, strict=True):
      if not a:
        index.append(slice(None))
        continue
      block = 0
      for n in a:
        block = block * mesh.shape[n] + coord[n]
      index.append(slice(block * chunk, (block + 1) * chunk))
    index_t = tuple(index)
    key = index_key(index_t)
    replica_ids.append(counts.get(key, 0))
    counts[key] = replica_ids[-1] + 1
    indices.append(index_t)
  return Layout(shape, tuple(indices), tuple(replica_ids), shard_shape,
                to_partition_spec(axes, len(axes_key)))


@jax_tracebacks.api_boundary
def get_shard_indices(global_shape: Shape, global_mesh: Mesh,
                      mesh_axes: MeshAxes) -> Mapping[Any, Index]:
  """Return `{device: index}` for every device of `global_mesh`.

  Args:
    global_shape: shape of the global array.
    global_mesh: the mesh; devices are keyed in `global_mesh.devices.flat` order.
    mesh_axes: a `PartitionSpec`, or a list/tuple of axis names, tuples of
      axis names, or None, at most one per dimension.

  Returns:
    A dict from each device to its index, a tuple of `slice` with
    `slice(None)` for dimensions that are not split.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> indices = get_shard_indices((8, 4), mesh, P('x'))
    >>> indices[mesh.devices[1, 0]]   # row 1 of 'x'; 'y' does not split
    (slice(2, 4, None), slice(None, None, None))
    >>> get_shard_indices((8, 4), mesh, ['x', 'y'])[mesh.devices[0, 1]]   # a list works too
    (slice(0, 2, None), slice(2, 4, None))
  """
  lay = layout(global_shape, global_mesh, mesh_axes)
  return dict(zip(global_mesh.devices.flat, lay.indices, strict=True))


@jax_tracebacks.api_boundary
def get_shard_indices_replica_ids(global_shape: Shape, global_mesh: Mesh,
                                  mesh_axes: MeshAxes) -> Mapping[Any, tuple[Index, int]]:
  """Return `{device: (index, replica_id)}` for every device of `global_mesh`.

  Replica ids count up from 0 for each distinct index, in
  `global_mesh.devices.flat` order. Arguments as for `get_shard_indices`.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> ids = get_shard_indices_replica_ids((8, 4), mesh, P('x'))
    >>> [ids[d][1] for d in mesh.devices[0]]   # two replicas of each row block
    [0, 1]
    >>> ids[mesh.devices[0, 1]][0] == ids[mesh.devices[0, 0]][0]
    True
  """
  lay = layout(global_shape, global_mesh, mesh_axes)
  return dict(zip(global_mesh.devices.flat, zip(lay.indices, lay.replica_ids, strict=True),
                  strict=True))


@jax_tracebacks.api_boundary
def get_shard_shape(global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes) -> Shape:
  """Return the shape of every shard of the global array.

  Arguments as for `get_shard_indices`; every shard has the same shape.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> get_shard_shape((8, 4), mesh, P('x', 'y')), get_shard_shape((8, 4), mesh, P(('x', 'y')))
    ((2, 2), (1, 4))
    >>> get_shard_shape((8, 4), mesh, P())   # replicated: the whole array
    (8, 4)
  """
  return layout(global_shape, global_mesh, mesh_axes).shard_shape


def old_spec_repr(spec: Any) -> str:
  """`spec` as GDA-era JAX printed it: `PartitionSpec('x',)` (today `P('x',)`).

  Other `mesh_axes` spellings (lists, tuples) print as they are.
  """
  if not isinstance(spec, PartitionSpec):
    return repr(spec)
  return f"PartitionSpec{tuple(spec)!r}"
