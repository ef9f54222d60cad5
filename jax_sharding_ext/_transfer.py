"""The one place where a GlobalDeviceArray's data moves.

Every transfer a `GlobalDeviceArray` makes goes through a function here:

* `place_host_shards`: host data from the `from_*callback` constructors onto
  the local devices (explicit, host_to_device);
* `shard_args`: the `shard_arg_handlers` entry, used by `jax.jit` arguments
  (no copy when the sharding already matches) and by `jax.device_put`
  (explicit; device_to_device when it reshards);
* `to_host`: `np.asarray(gda)` (implicit) and `jax.device_get(gda)`
  (explicit), device_to_host.

`from_jax_array` / `to_jax_array` hand the same device buffers over and are
not transfers, so they do not come through here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jax_sharding_ext import _compat


def place_host_shards(shape, dtype, sharding, values: Sequence[Any], devices: Sequence[Any]):
  """Place one value per local device (host or device data) as one `jax.Array`."""
  return _compat.batched_device_put(shape, dtype, sharding, values, devices)


def shard_args(gdas, shardings, layouts, copy_semantics):
  """Hand GDAs to a computation; stock JAX reshards only where it must."""
  arrays = [g._checked_array("pass it to a JAX computation") for g in gdas]
  return _compat.array_shard_arg(arrays, shardings, layouts, copy_semantics)


def to_host(gda, dtype=None) -> np.ndarray:
  """Gather the global value of a fully addressable GDA as numpy."""
  arr = gda._checked_array("fetch it to the host")
  if not arr.is_fully_addressable:
    raise RuntimeError(
        f"Cannot convert {gda} to numpy: it spans devices of other processes "
        "(it is not fully addressable). Use "
        "`jax.experimental.multihost_utils.process_allgather(gda.to_jax_array(), "
        "tiled=True)` to gather the global value on every process, or read "
        "`gda.local_shards`.")
  return np.asarray(arr, dtype=dtype)
