"""Checkpoint saves and restores in the transfer ledger.

A save moves this process's shards of each array to the host (device_to_host:
its shards of replica 0, the ones written); a restore places the data read on
this process's devices (host_to_device: every shard, each replica counts).
Both are explicit: a checkpoint call asks for the move. One record per array,
made once the call has succeeded (a save or restore that failed, or that the
transfer guard blocked, records nothing), with the user's line as its site.

The transfer guard itself judges the moves stock `array_serialization` (or
orbax) makes, exactly as for a `jax.Array`: the package adds no judgement of
its own, so a GDA's checkpoint is allowed, logged or refused as the same
`jax.Array`'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import threading
from collections.abc import Iterable
from typing import Any, cast

import jax
import numpy as np

from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._transfers import ledger
from jax_sharding_ext._transfers.guard import D2H, H2D

# Between the user's line and a checkpoint call there may be event-loop,
# thread and orbax frames as well as this package's and JAX's.
_SKIP = jax_frames.NOT_USER_CODE + tuple(
    os.path.dirname(cast(str, m.__file__)) + os.sep
    for m in (asyncio, concurrent.futures)) + (
    threading.__file__,)


def site(extra_skip: tuple[str, ...] = ()) -> Any:
  """The user's line that started the checkpoint call (None if no ledger is open)."""
  if not ledger.OPEN:
    return None
  return jax_frames.user_call_site(_SKIP + extra_skip)


def saved(arrays: Iterable[jax.Array], where: Any) -> None:
  """Record the save of `arrays` (this process's shards of replica 0)."""
  if not ledger.OPEN:
    return
  for arr in arrays:
    devices = tuple(s.device for s in arr.addressable_shards if s.replica_id == 0)
    ledger.add(D2H, True, _shard_nbytes(arr) * len(devices), tuple(arr.shape),
               np.dtype(arr.dtype), devices, (), where)


def restored(arrays: Iterable[jax.Array], where: Any) -> None:
  """Record the restore of `arrays` (every shard on this process's devices)."""
  if not ledger.OPEN:
    return
  for arr in arrays:
    devices = tuple(arr.sharding.addressable_devices_indices_map(arr.shape))
    ledger.add(H2D, True, _shard_nbytes(arr) * len(devices), tuple(arr.shape),
               np.dtype(arr.dtype), (), devices, where)


def _shard_nbytes(arr: jax.Array) -> int:
  return math.prod(arr.sharding.shard_shape(arr.shape)) * np.dtype(arr.dtype).itemsize
