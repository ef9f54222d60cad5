"""Checks of the device buffers and dtypes handed to a `GlobalDeviceArray`."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import jax

from jax_sharding_ext._jax import tables as jax_tables


def check_buffers(lay, mesh, mesh_axes, buffers) -> list[jax.Array]:
  """Validate constructor `device_buffers`, naming the first bad one; return
  them as stock `jax.Array`s (a GDA over one device hands over its own,
  zero-copy: stock's constructor takes only those)."""
  if isinstance(buffers, (str, bytes)) or not isinstance(buffers, Sequence):
    raise TypeError(
        "`device_buffers` must be a list of single-device `jax.Array`s, one per "
        f"device of `global_mesh.local_devices`; got {type(buffers).__name__}.")
  local_devices = list(mesh.local_devices)
  spec_text = f"shape {lay.shape} and mesh axes {mesh_axes!r}"
  if len(buffers) != len(local_devices):
    got = [_device_of(b) for b in buffers]
    raise ValueError(
        f"`GlobalDeviceArray` with {spec_text} expects {len(local_devices)} local "
        f"shards, but got {len(buffers)} buffers on devices {got}. Pass one buffer "
        "per device in `global_mesh.local_devices` order, or build it with "
        "`GlobalDeviceArray.from_callback(...)`.")
  arrays: list[jax.Array] = []
  for i, (b, d) in enumerate(zip(buffers, local_devices, strict=True)):
    if not isinstance(b, jax.Array) or isinstance(b, jax.core.Tracer):
      raise TypeError(
          f"`device_buffers[{i}]` must be a concrete single-device `jax.Array`, "
          f"got {type(b).__name__}. Use `jax.device_put(x, device)` to place it.")
    if b.is_deleted():
      raise RuntimeError(f"`device_buffers[{i}]` has been deleted or donated.")
    if type(b) is not jax_tables.ArrayImpl and hasattr(b, "__jax_array__"):
      b = b.__jax_array__()  # a GDA
    arrays.append(b)
    devs = b.sharding.device_set
    if len(devs) != 1:
      raise ValueError(
          f"`device_buffers[{i}]` spans {len(devs)} devices; each buffer must "
          "live on exactly one device. Use `GlobalDeviceArray.from_jax_array` "
          "for a sharded `jax.Array`.")
    if next(iter(devs)) != d:
      raise ValueError(
          "The `global_mesh.local_devices` and `device_buffers` device order "
          f"doesn't match: `device_buffers[{i}]` is on {next(iter(devs))} but "
          f"`global_mesh.local_devices[{i}]` is {d}. Got buffers on "
          f"{[_device_of(x) for x in buffers]}, expected {local_devices}. Please "
          "use `global_mesh.local_devices` to put arrays on devices instead of "
          "`jax.local_devices()`.")
  shard_shape = lay.shard_shape
  shapes = [tuple(b.shape) for b in buffers]
  if any(s != shard_shape for s in shapes):
    raise ValueError(
        f"`GlobalDeviceArray` with {spec_text} on mesh {dict(mesh.shape)} expects "
        f"every shard to have shape {shard_shape}, but the buffers have shapes "
        f"{shapes}.")
  dtypes_ = [b.dtype for b in buffers]
  for i, dt in enumerate(dtypes_):
    if not jax_tables.is_plain_dtype(dt):
      raise TypeError(extended_dtype_error(dt, f"`device_buffers[{i}]`"))
  if any(dt != dtypes_[0] for dt in dtypes_):
    raise ValueError(
        "Input arrays to `GlobalDeviceArray` must have matching dtypes, got "
        f"{[str(dt) for dt in dtypes_]} in `device_buffers`. Cast them to one dtype.")
  return arrays


def local_shard_data(shards: Sequence[Any], i: Any, method: str) -> jax.Array:
  """`shards[i].data` by Python indexing of the local shards (a bool is an
  int, as for a list and stock `jax.Array.addressable_data`), naming `method`."""
  if isinstance(i, slice):
    raise TypeError(f"`{method}` takes the int index of one local shard, got a slice; "
                    "read several from `local_shards`.")
  try:
    k = operator.index(i)
  except TypeError:
    raise TypeError(f"`{method}` index must be an int, got {type(i).__name__}.") from None
  if not -len(shards) <= k < len(shards):
    raise IndexError(f"`{method}({i})` is out of range: this GlobalDeviceArray has "
                     f"{len(shards)} local shards.")
  return shards[k].data


def extended_dtype_error(dtype, what: str) -> str:
  return (
      f"{what} has dtype {dtype}, which a `GlobalDeviceArray` cannot hold: typed "
      "PRNG key arrays and other extended dtypes are not arrays of numbers (the "
      "GDA era had none). Keep them as `jax.Array`s, or pass "
      "`jax.random.key_data(keys)` (a uint32 array) and rewrap with "
      "`jax.random.wrap_key_data` inside your function.")


def _device_of(b) -> Any:
  try:
    devs = b.sharding.device_set
    return next(iter(devs)) if len(devs) == 1 else sorted(devs, key=lambda d: d.id)
  except AttributeError:
    return type(b).__name__
