"""Building a GDA from data callbacks: the constructors, and the work behind them.

`_FromCallbacks` is the part behind `GlobalDeviceArray.from_callback`,
`from_batched_callback` and `from_batched_callback_with_devices`; the
functions below build the GDA's `jax.Array` from the values a callback
returns.

`from_callback` and `from_batched_callback` ask for one
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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_sharding_ext._array.checks import check_buffers
from jax_sharding_ext._array.shard_math import Index, Layout, MeshAxes, Shape, index_key, layout
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._transfers import moves

if TYPE_CHECKING:
  from jax_sharding_ext._array.gda import GlobalDeviceArray


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


class _FromCallbacks:
  """A part of `GlobalDeviceArray` (`_public.assembled`): the GDA-era constructors that take a data callback.

  The class assembled from it provides `_wrap(arr, mesh_axes, shared=...)` (a GDA
  over a checked `jax.Array`) and a constructor taking device buffers.
  """

  __slots__ = ()

  if TYPE_CHECKING:  # provided by the class assembled from it
    @classmethod
    def _wrap(cls, arr: jax.Array, mesh_axes: Any = None, *,
              shared: bool = False) -> GlobalDeviceArray: ...

  @classmethod
  @jax_tracebacks.api_boundary
  def from_callback(cls, global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes,
                    data_callback: Callable[[Index], Any]) -> GlobalDeviceArray:
    """Build a GDA from `data_callback(index)`, called once per local device.

    A `jax.Array` the callback returns with a copy on its device is adopted
    without a copy (one spanning other devices, or a GDA, is moved there
    first as an explicit device_to_device transfer), as by stock
    `jax.make_array_from_callback`: the GDA then shares its buffers with that
    array, and one call cannot donate the one while passing the other. On CPU
    devices jaxlib may adopt a suitably aligned numpy array returned by the
    callback as the device buffer instead of copying it (as stock
    `jax.make_array_from_callback` and `jax.device_put` do), so do not modify
    the returned memory afterwards; return a copy if you reuse the buffer.

    Args:
      global_shape: shape of the global array.
      global_mesh: the mesh.
      mesh_axes: see `GlobalDeviceArray`.
      data_callback: takes an index into the global array (a tuple of slices)
        and returns the data there, as any array-like (numpy, `jax.Array`,
        nested lists, a GDA). It is called for every local device, replicas
        included.

    Returns:
      A GDA whose `mesh_axes` are `mesh_axes` as given.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> data = np.arange(16).reshape(8, 2)
      >>> calls = []
      >>> def cb(index):
      ...   calls.append(index)
      ...   return data[index]
      >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x'), cb)
      >>> len(calls)   # once per local device, replicas included
      8
      >>> calls[0]
      (slice(0, 2, None), slice(None, None, None))
      >>> np.array_equal(np.asarray(gda), data)
      True
    """
    require_callable(data_callback, "data_callback")
    lay, devices, indices = placement(global_shape, global_mesh, mesh_axes)
    values = [data_callback(idx) for idx in indices]
    arr, shared = host_values_array(lay, global_mesh, mesh_axes, devices, indices,
                                              values)
    return cls._wrap(arr, mesh_axes, shared=shared)

  @classmethod
  @jax_tracebacks.api_boundary
  def from_batched_callback(cls, global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes,
                            data_callback: Callable[[Sequence[Index]], Sequence[Any]]
                            ) -> GlobalDeviceArray:
    """Like `from_callback`, but `data_callback` is called once.

    It gets the list of indices of all local devices (in
    `global_mesh.local_devices` order) and returns one array-like per index.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> data = np.arange(8.0)
      >>> def load(indices):   # one call: read every local shard at once
      ...   return [data[index] for index in indices]
      >>> gda = GlobalDeviceArray.from_batched_callback((8,), mesh, P('x'), load)
      >>> gda.local_data(3)
      Array([3.], dtype=float32)
    """
    require_callable(data_callback, "data_callback")
    lay, devices, indices = placement(global_shape, global_mesh, mesh_axes)
    values = checked_batch(data_callback(list(indices)), len(indices))
    arr, shared = host_values_array(lay, global_mesh, mesh_axes, devices, indices,
                                              values)
    return cls._wrap(arr, mesh_axes, shared=shared)

  @classmethod
  @jax_tracebacks.api_boundary
  def from_batched_callback_with_devices(
      cls, global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes,
      data_callback: Callable[[Sequence[tuple[Index, tuple[Any, ...]]]], Sequence[jax.Array]],
  ) -> GlobalDeviceArray:
    """Like `from_batched_callback`, but the callback places the data itself.

    `data_callback` gets one `(index, devices)` entry per distinct local index
    (the devices holding that index, in mesh order) and returns one
    single-device `jax.Array` per local device, e.g. by calling
    `jax.device_put(data, device)`. The arrays may come in
    `global_mesh.local_devices` order or grouped per entry; they are matched to
    devices by where they live.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> data = np.arange(8.0)
      >>> def place(entries):   # one entry per distinct shard: read it once
      ...   return [jax.device_put(data[index], d) for index, devices in entries
      ...           for d in devices]
      >>> gda = GlobalDeviceArray.from_batched_callback_with_devices((8,), mesh, P('x'), place)
      >>> [s.replica_id for s in gda.local_shards[:2]]
      [0, 1]
    """
    require_callable(data_callback, "data_callback")
    lay, devices, indices = placement(global_shape, global_mesh, mesh_axes)
    arrays = data_callback(by_index(devices, indices))
    buffers = device_arrays(lay, global_mesh, mesh_axes, devices, arrays)
    return cast(Any, cls)(lay.shape, global_mesh, mesh_axes, buffers)
