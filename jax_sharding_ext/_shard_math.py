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
from typing import Any

import numpy as np
from jax.sharding import Mesh, PartitionSpec

Shape = tuple[int, ...]
Index = tuple[slice, ...]
MeshAxes = Any  # PartitionSpec | Sequence[str | tuple[str, ...] | None]
NormalizedAxes = tuple[tuple[str, ...], ...]


def normalize_mesh_axes(global_shape: Sequence[int], mesh: Mesh,
                        mesh_axes: MeshAxes) -> NormalizedAxes:
  """Return one tuple of mesh-axis names per dimension, validated.

  Raises:
    TypeError: `mesh_axes` or one of its entries has the wrong type.
    ValueError: an unknown or repeated axis, too many entries, or a dimension
      that does not divide evenly among its axes.
  """
  if not isinstance(mesh, Mesh):
    raise TypeError(
        f"`global_mesh` must be a `jax.sharding.Mesh`, got {type(mesh).__name__}.")
  try:
    shape = tuple(int(d) for d in global_shape)
  except TypeError:
    raise TypeError(
        f"`global_shape` must be a sequence of ints, got {global_shape!r}.") from None
  if any(d < 0 for d in shape):
    raise ValueError(f"`global_shape` {shape} has a negative dimension.")
  if mesh_axes is None:
    mesh_axes = ()
  if isinstance(mesh_axes, str) or not isinstance(mesh_axes, (PartitionSpec, Sequence)):
    raise TypeError(
        "`mesh_axes` must be a PartitionSpec or a list/tuple of axis names, "
        f"tuples of axis names, or None; got {mesh_axes!r}."
        + (f" Wrap a single axis as `PartitionSpec({mesh_axes!r})`."
           if isinstance(mesh_axes, str) else ""))
  entries = tuple(mesh_axes)
  if len(entries) > len(shape):
    raise ValueError(
        f"`mesh_axes` {mesh_axes!r} has {len(entries)} entries but the array has "
        f"rank {len(shape)} (shape {shape}). Give at most one entry per dimension.")
  out: list[tuple[str, ...]] = []
  seen: dict[str, int] = {}
  for dim, entry in enumerate(entries):
    if entry is None:
      names: tuple[Any, ...] = ()
    elif isinstance(entry, str):
      names = (entry,)
    elif isinstance(entry, (tuple, list)):
      names = tuple(entry)
    else:
      raise TypeError(
          f"`mesh_axes` entry {entry!r} for dimension {dim} must be an axis "
          "name, a tuple of axis names, or None.")
    for name in names:
      if not isinstance(name, str):
        raise TypeError(
            f"`mesh_axes` entry {entry!r} for dimension {dim} contains "
            f"{name!r}, which is not an axis name (str).")
      if name not in mesh.shape:
        raise ValueError(
            f"`mesh_axes` {mesh_axes!r} names mesh axis {name!r}, which is not "
            f"in the mesh (axes {tuple(mesh.axis_names)}).")
      if name in seen:
        raise ValueError(
            f"`mesh_axes` {mesh_axes!r} uses mesh axis {name!r} for dimensions "
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
  out.extend(() for _ in range(len(shape) - len(entries)))
  return tuple(out)


def to_partition_spec(axes: NormalizedAxes) -> PartitionSpec:
  """The `PartitionSpec` equivalent of normalised axes (trailing Nones dropped)."""
  entries: list[Any] = [None if not a else a[0] if len(a) == 1 else a for a in axes]
  while entries and entries[-1] is None:
    entries.pop()
  return PartitionSpec(*entries)


def _hashable(shape, mesh_axes):
  """Lists are accepted for `global_shape` / `mesh_axes`; the caches need tuples."""
  if isinstance(mesh_axes, list):
    mesh_axes = tuple(tuple(e) if isinstance(e, list) else e for e in mesh_axes)
  return tuple(shape), mesh_axes


@functools.lru_cache(maxsize=4096)
def _layout(shape: Shape, mesh: Mesh, mesh_axes: MeshAxes):
  """(indices in mesh.devices.flat order, replica ids, shard shape)."""
  axes = normalize_mesh_axes(shape, mesh, mesh_axes)
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
    key = tuple((s.start, s.stop) for s in index_t)
    replica_ids.append(counts.get(key, 0))
    counts[key] = replica_ids[-1] + 1
    indices.append(index_t)
  return tuple(indices), tuple(replica_ids), shard_shape


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
  """
  shape, mesh_axes = _hashable(global_shape, mesh_axes)
  indices, _, _ = _layout(shape, global_mesh, mesh_axes)
  return dict(zip(global_mesh.devices.flat, indices, strict=True))


def get_shard_indices_replica_ids(global_shape: Shape, global_mesh: Mesh,
                                  mesh_axes: MeshAxes) -> Mapping[Any, tuple[Index, int]]:
  """Return `{device: (index, replica_id)}` for every device of `global_mesh`.

  Replica ids count up from 0 for each distinct index, in
  `global_mesh.devices.flat` order.
  """
  shape, mesh_axes = _hashable(global_shape, mesh_axes)
  indices, rids, _ = _layout(shape, global_mesh, mesh_axes)
  return dict(zip(global_mesh.devices.flat, zip(indices, rids, strict=True), strict=True))


def get_shard_shape(global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes) -> Shape:
  """Return the shape of every shard of the global array."""
  shape, mesh_axes = _hashable(global_shape, mesh_axes)
  return _layout(shape, global_mesh, mesh_axes)[2]
