"""Building a GDA's `jax.Array` from the values a data callback returns.

`GlobalDeviceArray.from_callback` and `from_batched_callback` ask for one
value per local device, check them all, then place them in one
`pxla.batched_device_put` (through `_transfers.moves.place_host_shards`,
which judges and records the transfer), as stock
`jax.make_array_from_callback` does.

The per-call work is kept to what depends on the values: the layout, the
local devices and their indices, and the `NamedSharding` are cached per
(shape, mesh, mesh_axes); checks run once per distinct value type and dtype,
not once per device.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_sharding_ext._array.checks import check_buffers
from jax_sharding_ext._array.shard_math import Index, Layout, index_key, layout
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._transfers import moves


def require_callable(fn: Any, name: str) -> None:
  if not callable(fn):
    raise TypeError(f"`{name}` must be callable, got {type(fn).__name__}.")


def placement(global_shape: Any, mesh: Mesh, mesh_axes: Any
              ) -> tuple[Layout, list[Any], list[Index]]:
  """(validated layout, local devices, their indices) for a new GDA."""
  lay = layout(global_shape, mesh, mesh_axes)
  devices, positions = _local_devices(mesh)
  if positions is None:  # every device is local, in mesh order
    return lay, devices, list(lay.indices)
  indices = lay.indices
  return lay, devices, [indices[i] for i in positions]


@functools.lru_cache(maxsize=256)
def _local_devices(mesh: Mesh) -> tuple[list[Any], list[int] | None]:
  """`mesh.local_devices`, and their positions in `mesh.devices.flat`
  (None when every device of the mesh is local)."""
  local = list(mesh.local_devices)
  flat = list(mesh.devices.flat)
  if local == flat:
    return local, None
  pos = {d: i for i, d in enumerate(flat)}
  return local, [pos[d] for d in local]


@functools.lru_cache(maxsize=256)
def named_sharding(mesh: Mesh, spec: PartitionSpec) -> NamedSharding:
  return NamedSharding(mesh, spec)


def checked_batch(values: Any, n: int) -> Sequence[Any]:
  """The list `from_batched_callback`'s callback returned, checked."""
  if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
    raise TypeError(
        "`data_callback` of `from_batched_callback` must return a list with one "
        f"array per index, got {type(values).__name__}.")
  if len(values) != n:
    raise ValueError(
        f"`data_callback` of `from_batched_callback` was given {n} "
        f"indices (one per local device) but returned {len(values)} arrays.")
  return values


def host_values_array(lay: Layout, mesh: Mesh, mesh_axes: Any, devices: Sequence[Any],
                      indices: Sequence[Index], values: Sequence[Any]
                      ) -> tuple[jax.Array, bool]:
  """One `jax.Array` over `mesh` from one value per local device, and whether
  it may share buffers with a value: a `jax.Array` already on its device is
  adopted as it is, without a copy."""
  prepared = _prepared(lay, mesh_axes, devices, indices, values)
  dtype = prepared[0].dtype if prepared else np.dtype(np.float32)  # no local devices
  arr = moves.place_host_shards(lay.shape, dtype, named_sharding(mesh, lay.spec),
                                prepared, devices)
  return arr, moves.has_device_values(prepared)


def _prepared(lay, mesh_axes, devices, indices, values) -> list[Any]:
  """The values as arrays of one canonical dtype and the shard shape, or raise."""
  shard_shape = lay.shard_shape
  seen_types: set[type] = set()
  seen_dtypes: dict[Any, bool] = {}  # dtype -> needs canonicalising
  dtype = None
  array_t = jax_tables.ArrayImpl
  out = []
  for i, v in enumerate(values):
    t = type(v)
    if t not in seen_types:
      if issubclass(t, jax.core.Tracer):
        raise TypeError(
            "`data_callback` returned a traced value; GDAs are built from "
            "concrete data outside `jax.jit`.")
      if not issubclass(t, (np.ndarray, jax.Array)):
        v = np.asarray(v)
      else:
        seen_types.add(t)
    if t is not np.ndarray and isinstance(v, jax.Array):
      if v.is_deleted():  # (stock may hand such an array back as its result)
        raise RuntimeError(
            f"`data_callback` returned a deleted or donated `jax.Array` for index "
            f"{indices[i]}; return data that is still alive.")
      if t is not array_t and hasattr(v, "__jax_array__"):  # a GDA: its `jax.Array`,
        v = v.__jax_array__()  # zero-copy (jaxlib places only those)
    dt = v.dtype
    convert = seen_dtypes.get(dt)
    if convert is None:
      if dt == np.dtype(object) or not jax_tables.is_plain_dtype(dt):
        raise TypeError(
            f"`data_callback` returned dtype {dt} for index {indices[i]}; return "
            "numeric array data.")
      convert = seen_dtypes[dt] = jax_tables.canonical_dtype(dt) != dt
    if convert:
      v = jax_tables.canonicalize_value(v)
    if tuple(v.shape) != shard_shape:
      raise ValueError(
          f"`data_callback` returned shape {tuple(v.shape)} for index {indices[i]} "
          f"(device {devices[i]}), but shards of global shape "
          f"{lay.shape} with mesh axes {mesh_axes!r} have shape "
          f"{shard_shape}. Return `global_data[index]`.")
    if dtype is None:
      dtype = v.dtype
    elif v.dtype != dtype:
      raise ValueError(
          f"`data_callback` returned dtype {v.dtype} for index {indices[i]} (device "
          f"{devices[i]}) but {dtype} for an earlier index; every shard must "
          "have the same dtype.")
    out.append(v)
  return out


def by_index(devices: Sequence[Any], indices: Sequence[Index]
             ) -> list[tuple[Index, tuple[Any, ...]]]:
  """One `(index, devices holding it)` entry per distinct index, in mesh order."""
  groups: dict[tuple, tuple[Index, list[Any]]] = {}
  for d, idx in zip(devices, indices, strict=True):
    groups.setdefault(index_key(idx), (idx, []))[1].append(d)
  return [(idx, tuple(devs)) for idx, devs in groups.values()]


def device_arrays(lay: Layout, mesh: Mesh, mesh_axes: Any, devices: Sequence[Any],
                  arrays: Any) -> list[jax.Array]:
  """What a `from_batched_callback_with_devices` callback returned, in
  `devices` order and checked as constructor buffers; an error names the
  callback."""
  try:
    return check_buffers(lay, mesh, mesh_axes, in_device_order(arrays, devices))
  except (TypeError, ValueError, RuntimeError) as e:
    raise type(e)(
        "`data_callback` of `from_batched_callback_with_devices` must return one "
        "single-device `jax.Array` per local device (its shard there), but what it "
        f"returned cannot be the GDA's buffers: {e}") from None


def in_device_order(arrays: Any, devices: Sequence[Any]) -> Any:
  """`arrays` reordered to `devices` when each lives on exactly one of them;
  anything else as given (the constructor's checks then name the problem)."""
  if isinstance(arrays, Sequence) and len(arrays) == len(devices):
    on: dict[Any, Any] = {}
    for a in arrays:
      if isinstance(a, jax.Array) and len(a.sharding.device_set) == 1:
        on.setdefault(next(iter(a.sharding.device_set)), a)
    if set(on) == set(devices):
      return [on[d] for d in devices]
  return arrays
