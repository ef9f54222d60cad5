"""The machinery behind `serialization`: what it checks, writes and runs.

- the metadata of a new array: the GDA-era module's (`gda_metadata`, the
  default) or stock `array_serialization`'s (`metadata="stock"`);
- checks of the arrays and specs to write, all without I/O, and of a stored
  array a save would overwrite (`checked_arrays`, `check_targets`);
- commit markers (`set_markers`, `check_committed`) and one writer per path
  (`hold_paths`, `release_paths`);
- running a coroutine from any thread, also inside a running event loop
  (`call`, `run`).

Needs tensorstore (imported by `serialization` first, with the error naming
the extra).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tensorstore as ts
from jax.experimental.array_serialization import serialization as _stock

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._jax import checkpoint as jax_checkpoint

TS_CONTEXT = _stock.TS_CONTEXT
spec_has_metadata = jax_checkpoint.spec_has_metadata

COMMIT_MARKER = "jax_sharding_ext.uncommitted"
"""Key in an array's kvstore while its checkpoint is not yet committed."""

# Kvstore drivers where several processes may write the marker key at once.
_MARKER_DRIVERS = frozenset({"file", "gcs", "s3", "memory"})


# -- the metadata of a new array ------------------------------------------------------

GDA_METADATA = "gda_serialization"
STOCK_METADATA = "stock"


def gda_metadata(arr: Any) -> dict:
  """The zarr metadata `jax.experimental.gda_serialization` wrote for `arr`.

  As its `_get_metadata` returned it (JAX 0.3.17 to 0.4.x): gzip
  compression, one chunk per shard (the shape of the first addressable shard,
  at least 1 in every dimension, as a numpy array), the global `shape` and the
  zarr `dtype` ('bfloat16' and the other extension types by name, as
  tensorstore spells them). A new dict each call: callers may edit it.
  """
  if not isinstance(arr, jax.Array) or isinstance(arr, jax.core.Tracer):
    raise TypeError(
        "`serialization._get_metadata` takes a GlobalDeviceArray or a concrete jax.Array, "
        f"got {type(arr).__name__}.")
  dtype = np.dtype(arr.dtype)
  return {
      "compressor": {"id": "gzip"},
      "shape": arr.shape,
      "chunks": np.array(np.maximum(1, arr.addressable_data(0).shape)),
      "dtype": dtype.name if dtype.kind == "V" else dtype.str,
  }


def checked_metadata_choice(fn: str, metadata: Any) -> str:
  if isinstance(metadata, str) and metadata in (GDA_METADATA, STOCK_METADATA):
    return metadata
  choices = (f"'{GDA_METADATA}' (the default: gzip, one chunk per shard, as the GDA-era "
             f"module wrote) or '{STOCK_METADATA}' (stock `array_serialization`'s)")
  if isinstance(metadata, str):
    raise ValueError(f"`{fn}`: metadata must be {choices}, got {metadata!r}.")
  raise TypeError(f"`{fn}`: metadata must be {choices}, got {type(metadata).__name__}. "
                  "To give the metadata itself, put it under the tensorstore spec's "
                  "'metadata' key.")


def _new_metadata(arr: jax.Array, driver: Any, choice: str) -> dict:
  """The metadata a save adds to a spec without any: the GDA-era module's for
  the zarr driver (the one driver it wrote), stock's otherwise."""
  if choice == GDA_METADATA and driver == "zarr":
    return gda_metadata(arr)
  return jax_checkpoint.tensorstore_metadata(arr, driver=driver)


# -- checks without I/O ---------------------------------------------------------------


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


def _spec_to_write(arr: jax.Array, spec: dict, at: str, choice: str) -> dict:
  """A copy of `spec` completed as the save completes it (the metadata of
  `choice` and the zarr dtype from `arr`) and parsed by tensorstore, so that
  a spec that would be refused half-way through a save is refused before it."""
  full = dict(spec)
  try:
    if not spec_has_metadata(full):
      full["metadata"] = _new_metadata(arr, full["driver"], choice)
    if full["driver"] == "zarr" and "dtype" not in full:
      full["dtype"] = jax.numpy.dtype(arr.dtype).name
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
                   choice: str) -> tuple[list, list, list]:
  """Flat lists (arrays as `jax.Array`s, specs, the specs as the save
  completes them), validated without any I/O before anything is written.

  Once every check has passed, a spec without metadata gets the metadata of
  `choice` written into it (the GDA-era module, too, filled in the caller's
  spec), so that stock writes exactly what was checked.
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
  full, seen = [], {}
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
    key = path_key(spec)
    if key is not None and key in seen:
      raise ValueError(f"`{fn}`: tensorstore_specs[{seen[key]}] and tensorstore_specs[{i}] "
                       f"both name '{spec_path(spec)}'; give each array its own path.")
    seen[key] = i
    full.append(_spec_to_write(arr, spec, at, choice))
  for spec, done in zip(specs, full, strict=True):
    if choice == GDA_METADATA and spec.get("driver") == "zarr" and not spec_has_metadata(spec):
      spec["metadata"] = done["metadata"]
  return out, specs, full


def checked_dtype(dtype: Any, at: str) -> Any:
  if dtype is None:
    return None
  try:
    return jax.numpy.dtype(dtype)
  except TypeError:
    raise TypeError(f"{at} is not a dtype: {dtype!r}.") from None


def same_length(fn: str, n: int, **seqs: Any) -> list[list]:
  out = []
  for name, seq in seqs.items():
    seq = [None] * n if seq is None else list(seq)
    if len(seq) != n:
      raise ValueError(f"`{fn}`: got {n} tensorstore_specs but {len(seq)} {name}; "
                       f"give one entry of `{name}` per spec.")
    out.append(seq)
  return out


def _stored(spec: Any) -> Any:
  """The spec of the stored array under `spec`: a 'cast' spec (as GDA-era
  orbax wrote and read through) stores its 'base'."""
  while isinstance(spec, Mapping) and spec.get("driver") == "cast" and "base" in spec:
    spec = spec["base"]
  return spec


def _kvstore(spec: Any) -> Any:
  """The kvstore (a dict or a URL string) the array under `spec` is stored in, or None."""
  spec = _stored(spec)
  return spec.get("kvstore") if isinstance(spec, Mapping) else None


def _reason(e: Exception) -> str:
  """tensorstore's error text without the spec it appends (long, and ours)."""
  return str(e).split(" [tensorstore_spec=")[0]


def spec_path(spec: Any) -> str:
  """A readable location for error messages."""
  kv = _kvstore(spec)
  if isinstance(kv, dict):
    base = {"gcs": f"gs://{kv.get('bucket', '')}/", "s3": f"s3://{kv.get('bucket', '')}/"}
    return base.get(kv.get("driver"), "") + str(kv.get("path", ""))
  if isinstance(kv, str):
    return kv
  return repr(_stored(spec))


def path_key(spec: Any) -> str | None:
  """What identifies the location `spec` writes to, or None if it names none."""
  kv = _kvstore(spec)
  if isinstance(kv, dict) and kv.get("driver") in _MARKER_DRIVERS:
    path = str(kv.get("path", "")).rstrip("/")
    if kv.get("driver") == "file" and path:
      path = os.path.normpath(path)
    return repr((kv.get("driver"), kv.get("bucket"), path))
  if isinstance(kv, dict):  # e.g. ocdbt over a base kvstore: every entry counts
    return repr(sorted((k, repr(v)) for k, v in kv.items()))
  if isinstance(kv, str):
    return kv.rstrip("/")
  return None


# -- commit markers, and checks that read ----------------------------------------------


def _marker_kvstore(spec: Any) -> Any:
  """The kvstore spec of the directory holding `spec`'s array, or None."""
  kv = _kvstore(spec)
  if isinstance(kv, dict) and kv.get("driver") in _MARKER_DRIVERS:
    kv = dict(kv)
    kv["path"] = str(kv.get("path", "")).rstrip("/") + "/"
    return kv
  return None


_MARKER_TEXT = b"written by jax_sharding_ext; not yet committed"


async def marker_stores(specs: Sequence[Any]) -> list:
  """Where the "not yet committed" markers of `specs`' arrays go: a local
  directory as its path (plain file operations, a tenth of tensorstore's
  cost), any other kvstore opened (opening creates nothing)."""
  kvs = [kv for kv in map(_marker_kvstore, specs) if kv is not None]
  opened = iter(await asyncio.gather(*(ts.KvStore.open(kv, context=TS_CONTEXT)
                                       for kv in kvs if kv.get("driver") != "file")))
  return [kv["path"] if kv.get("driver") == "file" else next(opened) for kv in kvs]


async def mark(stores: Sequence[Any], present: bool) -> None:
  """Write (`present`) or remove the "not yet committed" marker in each store."""
  async def one(store):
    if isinstance(store, str):
      _mark_local(store, present)
    elif present:
      await store.write(COMMIT_MARKER, _MARKER_TEXT)
    else:
      await store.delete_range(ts.KvStore.KeyRange(COMMIT_MARKER, COMMIT_MARKER + "\0"))
  await asyncio.gather(*map(one, stores))


def _mark_local(directory: str, present: bool) -> None:
  marker = os.path.join(directory, COMMIT_MARKER)
  if present:  # written whole or not at all, as tensorstore's file driver writes
    os.makedirs(directory, exist_ok=True)
    tmp = f"{marker}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
      f.write(_MARKER_TEXT)
    os.replace(tmp, marker)
  else:
    try:
      os.remove(marker)
    except FileNotFoundError:
      pass


async def set_markers(specs: Sequence[Any], present: bool) -> None:
  await mark(await marker_stores(specs), present)


async def check_committed(spec: Any, at: str) -> None:
  kv = _marker_kvstore(spec)
  if kv is None:
    return
  store = await ts.KvStore.open(kv, context=TS_CONTEXT)
  if (await store.read(COMMIT_MARKER)).state == "value":
    raise ValueError(
        f"{at}: the checkpoint at '{spec_path(spec)}' was never committed (its "
        f"'{COMMIT_MARKER}' marker is still there): a process stopped or a write "
        "failed before every process had finished writing, so it may be partial. "
        "Restore an earlier checkpoint.")


async def _check_target(full_spec: dict, at: str, choice: str) -> None:
  """Open the array at `full_spec` (a spec completed by `_spec_to_write`) as
  stock's save opens it, without creating anything: a new path is fine; an
  array there that the save would refuse (another shape, dtype, chunking or
  compression), or a location that cannot be opened, is refused now, before
  any write."""
  if _new_local_path(full_spec):
    return  # nothing stored there: nothing to refuse (and no open to pay for)
  try:
    await ts.open(ts.Spec(full_spec), open=True, context=TS_CONTEXT,
                  chunk_layout=jax_checkpoint.TS_CHUNK_LAYOUT)
  except ValueError as e:
    reason = _reason(e)
    if reason.startswith("NOT_FOUND"):
      return
    other = STOCK_METADATA if choice == GDA_METADATA else GDA_METADATA
    hint = (f" The array there has another compression: it was written with "
            f"metadata={other!r}; pass that to overwrite it in place." if "compressor" in reason
            else "")
    raise ValueError(
        f"{at}: cannot write to '{spec_path(full_spec)}' ({reason}); nothing was "
        f"written.{hint} If an array of another shape, dtype or sharding is stored there, "
        "write to a new path or delete the old array first.") from None


def _new_local_path(spec: Any) -> bool:
  """True when `spec` stores on the local file system where nothing exists yet."""
  kv = _kvstore(spec)
  return (isinstance(kv, dict) and kv.get("driver") == "file"
          and not os.path.lexists(str(kv.get("path", ""))))


async def check_targets(fn: str, full_specs: Sequence[dict], choice: str) -> None:
  await asyncio.gather(*(_check_target(spec, where(fn, "tensorstore_specs", i), choice)
                         for i, spec in enumerate(full_specs)))


async def open_existing(spec: Any, at: str) -> ts.TensorStore:
  try:
    return await ts.open(ts.Spec(spec) if isinstance(spec, dict) else spec,
                         open=True, context=TS_CONTEXT)
  except ValueError as e:
    reason = _reason(e)
    if "NOT_FOUND" in reason:
      raise ValueError(f"{at}: no checkpoint at '{spec_path(spec)}' ({reason}). "
                       "Check the path, and that the checkpoint was committed.") from None
    raise ValueError(f"{at}: cannot open the checkpoint at '{spec_path(spec)}': "
                     f"{reason}") from None


# -- one writer per path ----------------------------------------------------------
#
# Every save (a `run_serialization` call, or a `GlobalAsyncCheckpointManager`
# checkpoint until its `wait_until_finished()` returns) holds the paths it
# writes. A second save to a held path is refused before it writes its marker:
# otherwise the first save's commit would remove the marker they share while
# the second still writes, and a crash then would leave a partial checkpoint
# that restores as complete. A writer that has been garbage collected holds
# nothing.

_writers_lock = threading.Lock()
_writers: dict[str, tuple[weakref.ref, str]] = {}  # path key -> (writer, what it is)
MANAGER_WRITER = ("a GlobalAsyncCheckpointManager checkpoint that has not been waited for; "
                  "call `wait_until_finished()` on that manager first")
RUN_WRITER = ("a `run_serialization` call that has not returned (in another thread); "
              "let it return first")


class SaveInProgress:
  """The writer of one `run_serialization` call (weakly referenced)."""


def hold_paths(fn: str, specs: Sequence[Any], writer: Any, what: str) -> list[str]:
  """Record `writer` (described by `what`: whom it is and how to wait for it)
  as the one writer of `specs`' paths, or raise if another live writer holds
  one of them."""
  keys = [path_key(spec) for spec in specs]
  with _writers_lock:
    for i, key in enumerate(keys):
      held = _writers.get(key) if key is not None else None
      if held is not None and held[0]() is not None and held[0]() is not writer:
        raise RuntimeError(
            f"{where(fn, 'tensorstore_specs', i)}: '{spec_path(specs[i])}' is being "
            f"written by {held[1]}, or write to another path. Nothing was written: two "
            "saves to one path at once would remove each other's commit marker and mix "
            "their chunks.")
    ref = weakref.ref(writer)
    held_keys = [key for key in keys if key is not None]
    for key in held_keys:
      _writers[key] = (ref, what)
  return held_keys


def release_paths(keys: Sequence[str], writer: Any) -> None:
  with _writers_lock:
    for key in keys:
      held = _writers.get(key)
      if held is not None and held[0]() in (writer, None):
        del _writers[key]


# -- running coroutines -----------------------------------------------------------


def _loop_is_running() -> bool:
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return False
  return True


def call(fn: Callable[[], Any]) -> Any:
  """`fn()`, on a helper thread if this thread runs an event loop (where
  `asyncio.run`, used by stock and by us, refuses to start). `fn` never runs
  inside an `except` block, so its errors carry no chained exception of ours."""
  if not _loop_is_running():
    return fn()
  result: dict[str, Any] = {}

  def target():
    try:
      result["value"] = fn()
    except BaseException as e:  # re-raised in the caller's thread
      result["error"] = e
  t = threading.Thread(target=target, name="jax_sharding_ext.serialization")
  t.start()
  t.join()
  if "error" in result:
    raise result["error"]
  return result["value"]


def run(coro_fn: Callable[[], Any]) -> Any:
  """`asyncio.run(coro_fn())`, also where this thread already runs a loop.

  An error of the coroutine is caught inside it and raised here, so its
  traceback holds the caller's frames and the coroutine's, not asyncio's.
  """
  async def caught():
    try:
      return await coro_fn(), None
    except Exception as e:  # raised again below, outside asyncio
      return None, e
  value, error = call(lambda: asyncio.run(caught()))
  if error is not None:
    raise error
  return value
