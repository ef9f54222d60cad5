"""What a save or restore checks before it writes or reads an array.

- the arrays and specs of a save, all without I/O (`checked_arrays`): the
  specs are completed on copies, so the caller's dicts are never changed;
- a stored array a save would overwrite (`check_targets`);
- the dtypes and sequence lengths of a restore, and the stored array it
  opens (`open_existing`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._checkpoint import locations
from jax_sharding_ext._checkpoint import metadata as _metadata
from jax_sharding_ext._checkpoint.metadata import GDA_METADATA, STOCK_METADATA, TS_CONTEXT
from jax_sharding_ext._jax import checkpoint as jax_checkpoint

# Chunked drivers whose writes can keep chunks equal to the fill value.
_CHUNKED_DRIVERS = frozenset({"zarr", "zarr3", "n5"})


def where(fn: str, arg: str, i: int | None) -> str:
  return f"`{fn}`: {arg}" + ("" if i is None else f"[{i}]")


def _array_to_write(x: Any, at: str) -> jax.Array:
  """The `jax.Array` to hand to stock for `x`, or a clear error."""
  if isinstance(x, GlobalDeviceArray):
    return x.to_jax_array()
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    if x.is_deleted():
      raise RuntimeError(f"{at} is a `jax.Array` that has been deleted or donated.")
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      raise TypeError(
          f"{at} is a typed PRNG key array (dtype {x.dtype}), which a tensorstore "
          "checkpoint cannot hold (stock `array_serialization` raises a TypeError too). "
          "Save `jax.random.key_data(keys)` instead and rebuild the keys after "
          "restoring with `jax.random.wrap_key_data(data, impl=...)`.")
    return x
  raise TypeError(
      f"{at} must be a GlobalDeviceArray or a jax.Array, got {type(x).__name__}. "
      "Place host data on devices first (`GlobalDeviceArray.from_callback` or "
      "`jax.device_put`).")


def _keeping_every_chunk(spec: dict) -> dict:
  """`spec` (a copy down to the stored array) whose writes store every chunk,
  also one equal to the fill value (tensorstore leaves those out by
  default), so that a missing chunk always means a lost one."""
  if spec.get("driver") == "cast" and isinstance(spec.get("base"), Mapping):
    return dict(spec, base=_keeping_every_chunk(dict(spec["base"])))
  if spec.get("driver") in _CHUNKED_DRIVERS:
    spec["store_data_equal_to_fill_value"] = True
  return spec


def _spec_to_write(arr: jax.Array, spec: dict, at: str, choice: str) -> dict:
  """A copy of `spec` completed as the save completes it (the metadata of
  `choice`, the zarr dtype from `arr`, every chunk stored) and parsed by
  tensorstore, so that a spec that would be refused half-way through a save
  is refused before it. `spec` itself is left as it was."""
  full = dict(spec)
  try:
    if not _metadata.spec_has_metadata(full):
      full["metadata"] = _metadata.new_metadata(arr, full["driver"], choice)
    if full["driver"] == "zarr" and "dtype" not in full:
      full["dtype"] = jax.numpy.dtype(arr.dtype).name
    full = _keeping_every_chunk(full)
    ts.Spec(full)
  except (KeyError, TypeError, ValueError) as e:
    reason = f"it has no {e} entry" if isinstance(e, KeyError) else str(e)
    raise ValueError(f"{at} is not a tensorstore spec this array can be written to: "
                     f"{reason}. Build it with `get_tensorstore_spec(path)`.") from None
  metadata = full.get("metadata")
  if isinstance(metadata, dict) and "shape" in metadata:
    if tuple(metadata["shape"]) != tuple(arr.shape):
      raise ValueError(f"{at} has metadata shape {tuple(metadata['shape'])}, but the "
                       f"array has shape {tuple(arr.shape)}; drop the spec's 'metadata' "
                       "or make it match the array.")
  return full


def checked_arrays(fn: str, arrays: Any, tensorstore_specs: Any,
                   choice: str) -> tuple[list, list]:
  """Flat lists (arrays as `jax.Array`s, the specs as the save writes them),
  validated without any I/O before anything is written.

  The specs written are copies completed with the metadata of `choice`: the
  caller's dicts are never changed, so a spec reused for another save (say
  with another `metadata`) means the same the second time. (The GDA-era
  module, and stock `array_serialization` today, fill the metadata into the
  caller's spec.)
  """
  if isinstance(arrays, jax.Array):
    raise TypeError(f"`{fn}`: `arrays` must be a sequence of arrays; wrap a single "
                    "array in a list.")
  arrays, specs = list(arrays), list(tensorstore_specs)
  if len(arrays) != len(specs):
    raise ValueError(f"`{fn}`: got {len(arrays)} arrays but {len(specs)} "
                     "tensorstore_specs; give one spec per array.")
  out = [_array_to_write(a, where(fn, "arrays", i)) for i, a in enumerate(arrays)]
  multi_process = jax.process_count() > 1
  full: list[dict] = []
  seen: dict[Any, int] = {}
  for i, (arr, spec) in enumerate(zip(out, specs, strict=True)):
    at = where(fn, "tensorstore_specs", i)
    if not isinstance(spec, dict):
      raise TypeError(f"{at} must be a dict (e.g. from "
                      f"`get_tensorstore_spec(path)`), got {type(spec).__name__}.")
    if multi_process and arr.is_fully_addressable:
      raise ValueError(
          f"{where(fn, 'arrays', i)} lives on this process's devices only; a "
          "multi-process checkpoint needs global arrays (every process would write "
          "its own different value to the same path). Make it global first, e.g. "
          "with `multihost_utils.host_local_array_to_global_array`.")
    done = locations.pinned(_spec_to_write(arr, spec, at, choice))
    key = locations.path_key(done)
    if key is not None and key in seen:
      raise ValueError(f"`{fn}`: tensorstore_specs[{seen[key]}] and tensorstore_specs[{i}] "
                       f"both name '{locations.spec_path(done)}'; give each array its own "
                       "path.")
    seen[key] = i
    full.append(done)
  return out, full


def checked_dtype(dtype: Any, at: str) -> Any:
  """`dtype` as a numpy dtype a JAX array can have (None stays None), or a
  TypeError naming `at`."""
  if dtype is None:
    return None
  try:
    out = jax.numpy.dtype(dtype)
  except TypeError:
    raise TypeError(f"{at} is not a dtype: {dtype!r}.") from None
  if not (jax.dtypes.issubdtype(out, np.number) or jax.dtypes.issubdtype(out, np.bool_)):
    raise TypeError(f"{at} is {out}, which a JAX array cannot have; give a numeric or bool "
                    "dtype (e.g. 'float32'), or None to keep the stored one.")
  return out


def same_length(fn: str, n: int, **seqs: Any) -> list[list]:
  out = []
  for name, seq in seqs.items():
    seq = [None] * n if seq is None else list(seq)
    if len(seq) != n:
      raise ValueError(f"`{fn}`: got {n} tensorstore_specs but {len(seq)} {name}; "
                       f"give one entry of `{name}` per spec.")
    out.append(seq)
  return out


def _not_a_directory(full_spec: dict) -> str | None:
  """The nearest existing path at or above a local array's directory, when
  it is not a directory (a file where the array's directory would go)."""
  loc = locations.locate(full_spec)
  if loc is None or loc.local_dir is None:
    return None
  path = loc.local_dir
  while not os.path.lexists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return None if os.path.isdir(path) else path


async def _check_target(full_spec: dict, at: str, choice: str) -> None:
  """Open the array at `full_spec` (a spec completed by `_spec_to_write`) as
  stock's save opens it, without creating anything: a new path is fine; an
  array there that the save would refuse (another shape, dtype, chunking or
  compression), or a location that cannot be opened, is refused now, before
  any write."""
  blocking = _not_a_directory(full_spec)
  if blocking is not None:
    raise ValueError(
        f"{at}: cannot write to '{locations.spec_path(full_spec)}': '{blocking}' is a file, "
        "and a checkpoint array is a directory; nothing was written. Give a path that is a "
        "directory or does not exist yet.")
  if locations.new_local_path(full_spec):
    return  # nothing stored there: nothing to refuse (and no open to pay for)
  try:
    await ts.open(ts.Spec(full_spec), open=True, context=TS_CONTEXT,
                  chunk_layout=jax_checkpoint.TS_CHUNK_LAYOUT)
  except ValueError as e:
    reason = locations.reason(e)
    if reason.startswith("NOT_FOUND"):
      return
    other = STOCK_METADATA if choice == GDA_METADATA else GDA_METADATA
    hint = (f" The array there has another compression: it was written with "
            f"metadata={other!r}; pass that to overwrite it in place." if "compressor" in reason
            else "")
    raise ValueError(
        f"{at}: cannot write to '{locations.spec_path(full_spec)}' ({reason}); nothing was "
        f"written.{hint} If an array of another shape, dtype or sharding is stored there, "
        "write to a new path or delete the old array first.") from None


async def check_targets(fn: str, full_specs: Sequence[dict], choice: str) -> None:
  await asyncio.gather(*(_check_target(spec, where(fn, "tensorstore_specs", i), choice)
                         for i, spec in enumerate(full_specs)))


async def open_existing(spec: Any, at: str) -> ts.TensorStore:
  try:
    return await ts.open(ts.Spec(spec) if isinstance(spec, dict) else spec,
                         open=True, context=TS_CONTEXT)
  except ValueError as e:
    reason = locations.reason(e)
    if "NOT_FOUND" in reason:
      raise ValueError(f"{at}: no checkpoint at '{locations.spec_path(spec)}' ({reason}). "
                       "Check the path, and that the checkpoint was committed.") from None
    raise ValueError(f"{at}: cannot open the checkpoint at '{locations.spec_path(spec)}': "
                     f"{reason}") from None
