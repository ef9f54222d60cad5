"""The one place where a GlobalDeviceArray's data moves.

Every transfer a `GlobalDeviceArray` makes goes through a function here:

* `place_host_shards`: host data from the `from_callback` /
  `from_batched_callback` constructors onto the local devices (explicit,
  host_to_device; device_to_device for a callback value that is a
  `jax.Array` with no copy on its device);
* `shard_arrays`: called by the GDA's `shard_arg_handlers` entry
  (`_dispatch/handlers.py`) for `jax.jit` arguments (no copy when the
  sharding already matches: not a transfer; implicit device_to_device when
  it reshards) and for `jax.device_put` (explicit; device_to_device when it
  reshards or copies);
* `to_host` / `start_host_copy`: `np.asarray(gda)` / `gda.copy_to_host_async()`
  (implicit) and `jax.device_get(gda)` (explicit), device_to_host;
* `embed_constant`: a GDA closed over by a jitted function is fetched and
  embedded as a constant (implicit, device_to_host).

`from_jax_array` / `to_jax_array` hand the same device buffers over and are
not transfers, so they do not come through here; neither does
`from_batched_callback_with_devices`, whose callback places the data itself
(with `jax.device_put`, which stock JAX guards).

Each is classified and judged by the transfer guard (`guard.py`), and
recorded in the open transfer ledgers (`ledger.py`); with no ledger open and
every guard level "allow", nothing is built and the move runs as stock's.
Fetching from CPU devices is allowed as stock jaxlib allows it for the same
`jax.Array`: always in jax 0.10.2; in jax 0.12 where it fetches one buffer
(one device, or a fully replicated array; see
`jax_transfer.JAXLIB_GUARDS_CPU_FETCH`).

As in stock JAX, a fetched value is kept on the host: the first of
`copy_to_host_async()` / `np.asarray` / `jax.device_get` on a GDA is the
transfer, later fetches read the host copy and are not transfers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jax_sharding_ext._jax import buffers as jax_buffers
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import transfer as jax_transfer
from jax_sharding_ext._transfers import ledger
from jax_sharding_ext._transfers.guard import D2D, D2H, H2D, Move, action, guarded


def place_host_shards(shape, dtype, sharding, values: Sequence[Any], devices: Sequence[Any]):
  """Place one value per local device (host or device data) as one `jax.Array`.

  An explicit transfer (the `from_callback` family): host values are
  host_to_device, a `jax.Array` value elsewhere is device_to_device, one
  already on its device does not move: a single-device array there is
  adopted, a fully replicated one hands over its copy there. A `jax.Array`
  over several devices is first put on its device, as stock
  `jax.make_array_from_callback` does (jaxlib places single-device arrays
  only).
  """
  h2d: Sequence[int]
  d2d: Sequence[int]
  spread = False
  if _all_host_data(values):  # the usual case: numpy data from the callback
    h2d, d2d = range(len(values)), ()
  else:
    h2d = [i for i, v in enumerate(values) if not isinstance(v, jax.Array)]
    d2d = [i for i, v in enumerate(values)
           if isinstance(v, jax.Array) and not _already_on(v, devices[i])]
    spread = any(isinstance(v, jax.Array) and v.sharding.num_devices > 1 for v in values)
  recording = ledger.OPEN
  levels = []
  for direction, idx in ((H2D, h2d), (D2D, d2d)):
    if idx:
      level = jax_transfer.transfer_guard_level(direction)
      if level != "allow" or recording:
        levels.append((direction, idx, level))
  if not levels:
    # Nothing to judge, log or record, and jaxlib (which would call this
    # placement implicit) has nothing to judge either.
    return _place(shape, dtype, sharding, values, devices, spread)
  itemsize = np.dtype(dtype).itemsize
  moves = []
  for direction, idx, level in levels:
    act = action(level, True)
    if act == "allow" and not recording:
      continue  # suspended all the same: jaxlib would judge it implicit
    src = () if direction == H2D else tuple(
        d for i in idx for d in _devices_of(values[i]))
    moves.append(Move(direction, True, shape, dtype,
                      sum(math.prod(np.shape(values[i])) for i in idx) * itemsize,
                      src, tuple(devices[i] for i in idx), act))
  with guarded(moves):
    return _place(shape, dtype, sharding, values, devices, spread)


def _place(shape, dtype, sharding, values, devices, spread: bool):
  if spread:  # each array over several devices put on its device (judged already)
    values = [jax.device_put(v, d) if isinstance(v, jax.Array) and v.sharding.num_devices > 1
              else v for v, d in zip(values, devices, strict=True)]
  return jax_tables.batched_device_put(shape, dtype, sharding, values, devices)


def has_device_values(values: Sequence[Any]) -> bool:
  """True when some of `values` are `jax.Array`s (placing one already on its
  device adopts it without a copy)."""
  return not _all_host_data(values)


def _all_host_data(values: Sequence[Any]) -> bool:
  """True when no value is a `jax.Array`: one subclass test per distinct type,
  not one `isinstance` (an ABC check, ~0.13 us) per device."""
  return not any(issubclass(t, jax.Array) for t in set(map(type, values)))


def shard_arrays(arrays, shardings, layouts, copy_semantics):
  """Hand GDAs' arrays to a computation; stock JAX reshards only where it must."""
  moving = jax_transfer.moving_args(arrays, shardings, layouts, copy_semantics)
  if not moving:  # the common `jax.jit` case: the buffers are handed over as is
    return jax_tables.array_shard_arg(arrays, shardings, layouts, copy_semantics)
  if jax_frames.in_aot_call():
    raise _aot_mismatch_error(arrays, shardings, moving)
  level, explicit = jax_transfer.transfer_guard_query(D2D, "explicit_device_put")
  act = action(level, explicit)
  moves, recorded = [], []
  if act != "allow" or ledger.OPEN:
    for i in moving:
      a, s = arrays[i], shardings[i]
      dst = tuple(s.addressable_devices_indices_map(a.shape))
      nbytes = math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize * len(dst)
      m = Move(D2D, explicit, a.shape, a.dtype, nbytes, _devices_of(a), dst, act)
      moves.append(m)
      if not jax_transfer.writes_in_place(a, s, layouts[i], copy_semantics[i]):
        recorded.append(m)  # one written in place is judged, not recorded
  with guarded(moves, recorded):
    return jax_tables.array_shard_arg(arrays, shardings, layouts, copy_semantics)


def across_processes(arr, sharding) -> Move | None:
  """The explicit device_to_device reshard of `arr` onto `sharding` where one
  of them spans other processes, as this process sees it (its devices' bytes);
  None when no ledger is open."""
  if not ledger.OPEN:
    return None
  dst = tuple(sharding.addressable_devices_indices_map(arr.shape))
  nbytes = math.prod(sharding.shard_shape(arr.shape)) * arr.dtype.itemsize * len(dst)
  return Move(D2D, True, arr.shape, arr.dtype, nbytes, _devices_of(arr), dst, "allow")


def record(done: Sequence[Move | None]) -> None:
  """Record moves that stock made (and judged) in the open transfer ledgers."""
  for m in done:
    if m is not None and ledger.OPEN:
      ledger.add(m.direction, m.explicit, m.nbytes, m.shape, m.dtype, m.src, m.dst, m.site())


def _aot_mismatch_error(arrays, shardings, moving) -> ValueError:
  """Stock's error for a compiled executable called with other shardings.

  `MeshExecutable.call` raises it for a committed `jax.Array` whose sharding
  is not equivalent to the compiled one; a GDA is always committed.
  """
  lines = [f"GlobalDeviceArray argument with shape {arrays[i].shape}:\n"
           f"  Passed sharding: {arrays[i].sharding}\n  Required sharding: {shardings[i]}"
           for i in moving]
  return ValueError(
      # The GDA-era text first: GDA-era tests match on it.
      "GDA sharding does not match the input sharding. "
      "Computation was compiled for input shardings that disagree with the "
      f"shardings of arguments passed to it. Here are the {len(lines)} "
      "mismatches:\n" + "\n".join(lines) + "\nReshard the argument first "
      "(`jax.device_put(gda, sharding)`), or lower and compile for its sharding.")


def to_host(gda, dtype=None, copy=None) -> np.ndarray:
  """The global value of a GDA whose value this process holds, as numpy
  (`dtype` and `copy` as `np.asarray` of the same `jax.Array` takes them)."""
  if copy is not None:  # numpy >= 2 passes it only when the caller gave it
    return np.asarray(to_host(gda), dtype=dtype, copy=copy)
  arr = gda._checked_array("fetch it to the host")
  if gda._host_fetched:  # the value is already on the host: nothing moves
    return np.asarray(arr, dtype=dtype)
  sharding = jax_tables.sharding_of(arr)
  if not (sharding.is_fully_addressable
          or jax_transfer.process_holds_value(sharding, arr.shape)):
    raise RuntimeError(
        f"Cannot convert {gda} to numpy: it spans devices of other processes "
        "(it is not fully addressable). Use "
        "`jax.experimental.multihost_utils.process_allgather(gda.to_jax_array(), "
        "tiled=True)` to gather the global value on every process, or read "
        "`gda.local_shards`.")
  if not sharding.is_fully_replicated:  # stock's fetch reads the per-shard arrays:
    jax_buffers.ready(arr)  # their cache is built under the lock, once
  return _fetch(gda, arr, lambda: np.asarray(arr, dtype=dtype))


def holds_value(arr) -> bool:
  """True when this process holds `arr`'s whole value (stock's `np.asarray` rule)."""
  return jax_transfer.process_holds_value(arr.sharding, arr.shape)


def start_host_copy(gda) -> None:
  """`gda.copy_to_host_async()`: start the device_to_host transfer."""
  arr = gda._shard_array("fetch it to the host")
  if not holds_value(arr):  # local shards only; jaxlib guards each buffer
    arr.copy_to_host_async()
  elif not gda._host_fetched:
    _fetch(gda, arr, arr.copy_to_host_async)


def embed_constant(gda, aval):
  """A GDA closed over by a jitted function: fetched to the host and embedded.

  Stock JAX's constant handler reads the array's value, an implicit
  device_to_host transfer (jaxlib guards it for a `jax.Array` too).
  """
  arr = gda._shard_array("embed it as a constant")
  if gda._host_fetched or not holds_value(arr):
    return jax_tables.array_constant_handler(arr, aval)
  return _fetch(gda, arr, lambda: jax_tables.array_constant_handler(arr, aval))


def _fetch(gda, arr, move):
  """Judge, run and record `move`, the fetch of `gda`'s value to the host."""
  level, explicit = jax_transfer.transfer_guard_query(D2H, "explicit_device_get")
  act = action(level, explicit)
  if act != "allow" and _fetch_always_allowed(arr):
    act = "allow"  # stock's CPU rule
  if level == "allow":  # the usual case: nothing to judge or log
    out = move()
    if ledger.OPEN:  # only the ledger needs to know
      aval = arr.aval  # (the C++ property `shape` and `dtype` read in Python)
      ledger.add(D2H, explicit, math.prod(aval.shape) * aval.dtype.itemsize, aval.shape,
                 aval.dtype, jax_tables.sharding_of(arr), (), jax_frames.user_call_site())
  else:
    # Judged here, so jaxlib must not judge it again: on "log" it would log a
    # second line.
    m = Move(D2H, explicit, arr.shape, arr.dtype, gda.nbytes, _devices_of(arr), (), act)
    with guarded((m,)):
      out = move()
  gda._host_fetched = True
  return out


def _fetch_always_allowed(arr) -> bool:
  """True where stock never guards fetching `arr`: CPU devices, and for jax
  0.12 only where it fetches one buffer (one device, or a fully replicated
  array). Tests patch this to act as a GPU."""
  sharding = arr.sharding
  if jax_transfer.sharding_platform(sharding) != "cpu":
    return False
  return not jax_transfer.JAXLIB_GUARDS_CPU_FETCH or sharding.is_fully_replicated


def _already_on(v, device) -> bool:
  """True when placing `v` on `device` copies nothing: a single-device array
  there (`pxla.batched_device_put`'s test), or a fully replicated one with a
  copy there (`jax.device_put` hands that copy over)."""
  s = v.sharding
  return device in s.device_set and (s.num_devices == 1 or s.is_fully_replicated)


def _devices_of(v) -> tuple:
  return jax_transfer.addressable_devices(v.sharding, v.shape)
