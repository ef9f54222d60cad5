"""GDA-era `jax.experimental.gda_serialization.serialization`, on stock JAX.

A drop-in for the module JAX removed with GDA (the `mesh, mesh_axes`
signatures of JAX 0.3.17 to 0.3.21): the same public names, signatures and
defaults. The work is done by stock `jax.experimental.array_serialization`
and tensorstore; this module converts at the boundary (a GDA is written as
its zero-copy `jax.Array`; a restored `jax.Array` is wrapped as a GDA on the
requested mesh and mesh axes) and adds what the old module lacked:

- checks before anything is written or read: a non-array argument, a typed
  PRNG key array, specs that do not match the arrays or that tensorstore
  rejects, two arrays for one path, a stored array that this one cannot
  overwrite (another shape, dtype or chunking), a rank mismatch, an unknown
  dtype, a missing checkpoint, each a `TypeError` / `ValueError` naming the
  argument. A refused save leaves its paths exactly as they were (no marker,
  no byte);
- commit markers: `run_serialization` and `GlobalAsyncCheckpointManager`
  put a marker key (`COMMIT_MARKER`) into each array's kvstore before the
  first write and remove it only once every process has committed; a restore
  refuses an array that still has it, so a partial checkpoint is never taken
  as complete. (The low-level `async_serialize` writes no marker.)
  Checkpoints without a marker (e.g. written by stock JAX) restore as usual.
- one writer per path: a save to a path that another save of this process
  is still writing (or has not yet been waited for) is a `RuntimeError`, so
  one writer's commit can never remove the marker of another writer's
  unfinished checkpoint (see `GlobalAsyncCheckpointManager`).
- `GlobalAsyncCheckpointManager` works in a single process without
  `jax.distributed.initialize()` (stock's manager does; the old one refused).
- the `run_*` functions work where an event loop is already running (a
  Jupyter notebook): they then run on a helper thread. Either way an error
  is raised at the caller's line, with no event-loop exception chained to it
  and no asyncio frames.

Needs tensorstore: `pip install 'jax-sharding-ext[checkpoint]'`.

Porting: `from jax.experimental.gda_serialization import serialization`
becomes `from jax_sharding_ext import serialization`.
"""

from __future__ import annotations

import abc
import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

try:
  import tensorstore as ts
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
  raise ImportError(
      "`jax_sharding_ext.serialization` needs tensorstore, an optional extra: "
      "pip install 'jax-sharding-ext[checkpoint]'") from e

import jax
from jax.experimental import multihost_utils as _multihost
from jax.experimental.array_serialization import serialization as _stock
from jax.experimental.array_serialization import tensorstore_impl as _ts_impl
from jax.sharding import Mesh, NamedSharding

from jax_sharding_ext._gda import GlobalDeviceArray
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._shard_math import Index, MeshAxes, Shape, canonical_shape, layout

__all__ = [
    "COMMIT_MARKER",
    "TS_CONTEXT",
    "AsyncManager",
    "GlobalAsyncCheckpointManager",
    "GlobalAsyncCheckpointManagerBase",
    "async_deserialize",
    "async_serialize",
    "create_async_array_from_callback",
    "create_async_gda_from_callback",
    "estimate_read_memory_footprint",
    "get_tensorstore_spec",
    "run_deserialization",
    "run_serialization",
]

TS_CONTEXT = _stock.TS_CONTEXT
_CHECKPOINT_SUCCESS = _stock._CHECKPOINT_SUCCESS
_LimitInFlightBytes = _stock._LimitInFlightBytes
_spec_has_metadata = _ts_impl._spec_has_metadata
_get_metadata = _stock._get_metadata

COMMIT_MARKER = "jax_sharding_ext.uncommitted"
"""Key in an array's kvstore while its checkpoint is not yet committed."""

# Kvstore drivers where several processes may write the marker key at once.
_MARKER_DRIVERS = frozenset({"file", "gcs", "s3", "memory"})


# -- validation ---------------------------------------------------------------


def _where(fn: str, arg: str, i: int | None) -> str:
  return f"`{fn}`: {arg}" + ("" if i is None else f"[{i}]")


def _array_to_write(x: Any, where: str) -> jax.Array:
  """The `jax.Array` to hand to stock for `x`, or a clear error."""
  if isinstance(x, GlobalDeviceArray):
    return x.to_jax_array()
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    if x.is_deleted():
      raise RuntimeError(f"{where} is a `jax.Array` that has been deleted or donated.")
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      raise TypeError(
          f"{where} is a typed PRNG key array (dtype {x.dtype}), which a tensorstore "
          "checkpoint cannot hold (stock `array_serialization` raises a TypeError too). "
          "Save `jax.random.key_data(keys)` instead and rebuild the keys after "
          "restoring with `jax.random.wrap_key_data(data, impl=...)`.")
    return x
  raise TypeError(
      f"{where} must be a GlobalDeviceArray or a jax.Array, got {type(x).__name__}. "
      "Place host data on devices first (`GlobalDeviceArray.from_callback` or "
      "`jax.device_put`).")


def _spec_to_write(arr: jax.Array, spec: dict, where: str) -> dict:
  """A copy of `spec` completed as stock's `async_serialize` completes it (the
  metadata and the zarr dtype from `arr`) and parsed by tensorstore, so that
  a spec stock would refuse half-way through a save is refused before it."""
  full = dict(spec)
  try:
    if not _spec_has_metadata(full):
      full["metadata"] = _ts_impl._get_tensorstore_metadata(arr, driver=full["driver"])
    if full["driver"] == "zarr" and "dtype" not in full:
      full["dtype"] = jax.numpy.dtype(arr.dtype).name
    ts.Spec(full)
  except (KeyError, TypeError, ValueError) as e:
    reason = f"it has no {e} entry" if isinstance(e, KeyError) else str(e)
    raise ValueError(f"{where} is not a tensorstore spec this array can be written to: "
                     f"{reason}. Build it with `get_tensorstore_spec(path)`.") from None
  metadata = full.get("metadata")
  if isinstance(metadata, dict) and "shape" in metadata:
    if tuple(metadata["shape"]) != tuple(arr.shape):
      raise ValueError(f"{where} has metadata shape {tuple(metadata['shape'])}, but the "
                       f"array has shape {tuple(arr.shape)}; drop the spec's 'metadata' "
                       "or make it match the array.")
  return full


def _checked_arrays(fn: str, arrays: Any, tensorstore_specs: Any) -> tuple[list, list, list]:
  """Flat lists (arrays as `jax.Array`s, specs, the specs as stock completes
  them), validated without any I/O before anything is written."""
  if isinstance(arrays, GlobalDeviceArray | jax.Array):
    raise TypeError(f"`{fn}`: `arrays` must be a sequence of arrays; wrap a single "
                    "array in a list.")
  arrays, specs = list(arrays), list(tensorstore_specs)
  if len(arrays) != len(specs):
    raise ValueError(f"`{fn}`: got {len(arrays)} arrays but {len(specs)} "
                     "tensorstore_specs; give one spec per array.")
  out = [_array_to_write(a, _where(fn, "arrays", i)) for i, a in enumerate(arrays)]
  multi_process = jax.process_count() > 1
  full, seen = [], {}
  for i, (arr, spec) in enumerate(zip(out, specs, strict=True)):
    where = _where(fn, "tensorstore_specs", i)
    if not isinstance(spec, dict):
      raise TypeError(f"{where} must be a dict (e.g. from "
                      f"`get_tensorstore_spec(path)`), got {type(spec).__name__}.")
    if multi_process and arr.is_fully_addressable:
      raise ValueError(
          f"{_where(fn, 'arrays', i)} lives on this process's devices only; a "
          "multi-process checkpoint needs global arrays (every process would write "
          "its own different value to the same path). Make it global first, e.g. "
          "with `multihost_utils.host_local_array_to_global_array`.")
    key = _path_key(spec)
    if key is not None and key in seen:
      raise ValueError(f"`{fn}`: tensorstore_specs[{seen[key]}] and tensorstore_specs[{i}] "
                       f"both name '{_spec_path(spec)}'; give each array its own path.")
    seen[key] = i
    full.append(_spec_to_write(arr, spec, where))
  return out, specs, full


def _checked_dtype(dtype: Any, where: str) -> Any:
  if dtype is None:
    return None
  try:
    return jax.numpy.dtype(dtype)
  except TypeError:
    raise TypeError(f"{where} is not a dtype: {dtype!r}.") from None


def _same_length(fn: str, n: int, **seqs: Any) -> list[list]:
  out = []
  for name, seq in seqs.items():
    seq = [None] * n if seq is None else list(seq)
    if len(seq) != n:
      raise ValueError(f"`{fn}`: got {n} tensorstore_specs but {len(seq)} {name}; "
                       f"give one entry of `{name}` per spec.")
    out.append(seq)
  return out


def _spec_path(spec: Any) -> str:
  """A readable location for error messages."""
  kv = spec.get("kvstore") if isinstance(spec, dict) else None
  if isinstance(kv, dict):
    base = {"gcs": f"gs://{kv.get('bucket', '')}/", "s3": f"s3://{kv.get('bucket', '')}/"}
    return base.get(kv.get("driver"), "") + str(kv.get("path", ""))
  if isinstance(kv, str):
    return kv
  return repr(spec)


def _path_key(spec: Any) -> str | None:
  """What identifies the location `spec` writes to, or None if it names none."""
  kv = spec.get("kvstore") if isinstance(spec, dict) else None
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


# -- commit markers -------------------------------------------------------------


def _marker_kvstore(spec: Any) -> Any:
  """The kvstore spec of the directory holding `spec`'s array, or None."""
  kv = spec.get("kvstore") if isinstance(spec, dict) else None
  if isinstance(kv, dict) and kv.get("driver") in _MARKER_DRIVERS:
    kv = dict(kv)
    kv["path"] = str(kv.get("path", "")).rstrip("/") + "/"
    return kv
  return None


async def _set_markers(specs: Sequence[Any], present: bool) -> None:
  async def one(kv):
    store = await ts.KvStore.open(kv, context=TS_CONTEXT)
    if present:
      await store.write(COMMIT_MARKER, b"written by jax_sharding_ext; not yet committed")
    else:
      await store.delete_range(ts.KvStore.KeyRange(COMMIT_MARKER, COMMIT_MARKER + "\0"))
  await asyncio.gather(*(one(kv) for kv in map(_marker_kvstore, specs) if kv is not None))


async def _check_committed(spec: Any, where: str) -> None:
  kv = _marker_kvstore(spec)
  if kv is None:
    return
  store = await ts.KvStore.open(kv, context=TS_CONTEXT)
  if (await store.read(COMMIT_MARKER)).state == "value":
    raise ValueError(
        f"{where}: the checkpoint at '{_spec_path(spec)}' was never committed (its "
        f"'{COMMIT_MARKER}' marker is still there): a process stopped or a write "
        "failed before every process had finished writing, so it may be partial. "
        "Restore an earlier checkpoint.")


async def _check_target(full_spec: dict, where: str) -> None:
  """Open the array at `full_spec` (a spec completed by `_spec_to_write`) as
  stock's save opens it, without creating anything: a new path is fine; an
  array there that stock's save would refuse (another shape, dtype or chunking),
  or a location that cannot be opened, is refused now, before any write."""
  try:
    await ts.open(ts.Spec(full_spec), open=True, context=TS_CONTEXT,
                  chunk_layout=_ts_impl._TS_CHUNK_LAYOUT)
  except ValueError as e:
    reason = str(e).split(" [tensorstore_spec=")[0]  # the spec is long and ours
    if reason.startswith("NOT_FOUND"):
      return
    raise ValueError(
        f"{where}: cannot write to '{_spec_path(full_spec)}' ({reason}); nothing was "
        "written. If an array of another shape, dtype or sharding is stored there, "
        "write to a new path or delete the old array first.") from None


async def _check_targets(fn: str, full_specs: Sequence[dict]) -> None:
  await asyncio.gather(*(_check_target(spec, _where(fn, "tensorstore_specs", i))
                         for i, spec in enumerate(full_specs)))


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
_MANAGER_WRITER = ("a GlobalAsyncCheckpointManager checkpoint that has not been waited for; "
                   "call `wait_until_finished()` on that manager first")
_RUN_WRITER = ("a `run_serialization` call that has not returned (in another thread); "
               "let it return first")


class _SaveInProgress:
  """The writer of one `run_serialization` call (weakly referenced)."""


def _hold_paths(fn: str, specs: Sequence[Any], writer: Any, what: str) -> list[str]:
  """Record `writer` (described by `what`: whom it is and how to wait for it)
  as the one writer of `specs`' paths, or raise if another live writer holds
  one of them."""
  keys = [_path_key(spec) for spec in specs]
  with _writers_lock:
    for i, key in enumerate(keys):
      held = _writers.get(key) if key is not None else None
      if held is not None and held[0]() is not None and held[0]() is not writer:
        raise RuntimeError(
            f"{_where(fn, 'tensorstore_specs', i)}: '{_spec_path(specs[i])}' is being "
            f"written by {held[1]}, or write to another path. Nothing was written: two "
            "saves to one path at once would remove each other's commit marker and mix "
            "their chunks.")
    ref = weakref.ref(writer)
    held_keys = [key for key in keys if key is not None]
    for key in held_keys:
      _writers[key] = (ref, what)
  return held_keys


def _release_paths(keys: Sequence[str], writer: Any) -> None:
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


def _call(fn: Callable[[], Any]) -> Any:
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


def _run(coro_fn: Callable[[], Any]) -> Any:
  """`asyncio.run(coro_fn())`, also where this thread already runs a loop.

  An error of the coroutine is caught inside it and raised here, so its
  traceback holds the caller's frames and the coroutine's, not asyncio's.
  """
  async def caught():
    try:
      return await coro_fn(), None
    except Exception as e:  # raised again below, outside asyncio
      return None, e
  value, error = _call(lambda: asyncio.run(caught()))
  if error is not None:
    raise error
  return value


# -- the old module's functions -------------------------------------------------------


async def create_async_array_from_callback(
    global_shape: Shape,
    inp_sharding: jax.sharding.Sharding,
    data_callback: Callable[[Index], Any],
):
  """A `jax.Array` whose addressable shards come from awaiting
  `data_callback(index)` (an awaitable of host data) per device."""
  shape = canonical_shape(global_shape)
  idx = inp_sharding.devices_indices_map(shape)
  devices = [d for d in idx if d.process_index == jax.process_index()]
  local = await asyncio.gather(*(data_callback(idx[d]) for d in devices))
  dbs = [jax.device_put(x, d) for x, d in zip(local, devices, strict=True)]
  return jax.make_array_from_single_device_arrays(shape, inp_sharding, dbs)


async def create_async_gda_from_callback(
    global_shape: Shape,
    global_mesh: Mesh,
    mesh_axes: MeshAxes,
    data_callback: Callable[[Index], Any],
):
  """A `GlobalDeviceArray` whose local shards come from awaiting
  `data_callback(index)` (an awaitable of host data) per local device."""
  lay = layout(global_shape, global_mesh, mesh_axes)
  arr = await create_async_array_from_callback(
      lay.shape, NamedSharding(global_mesh, lay.spec), data_callback)
  return GlobalDeviceArray._wrap(arr, mesh_axes)


def get_tensorstore_spec(ckpt_path: str):
  """The zarr spec for `ckpt_path` (a local path, or `gs://bucket/path`)."""
  return _stock.get_tensorstore_spec(ckpt_path)


async def async_serialize(arr_inp, tensorstore_spec, commit_future=None):
  """Write this process's shards of `arr_inp` (a GDA or `jax.Array`).

  Stock `async_serialize`; with `commit_future` (a list) the commit futures
  are appended to it instead of awaited. Writes no commit marker.
  """
  (arr,), _, _ = _checked_arrays("async_serialize", [arr_inp], [tensorstore_spec])
  return await _stock.async_serialize(arr, tensorstore_spec, commit_future=commit_future)


@jax_tracebacks.api_boundary
def run_serialization(arrays, tensorstore_specs):
  """Write GDAs / `jax.Array`s, one tensorstore spec each, and commit them.

  Every process calls it with the same arrays; it returns once every process
  has written its shards (a barrier when there are several processes).
  Everything that can refuse the save (bad input, a stored array of another
  shape, dtype or sharding, a path another save is still writing) is checked
  before the commit markers and the first byte are written.
  """
  fn = "run_serialization"
  arrs, specs, full_specs = _checked_arrays(fn, arrays, tensorstore_specs)
  writer = _SaveInProgress()
  held = _hold_paths(fn, specs, writer, _RUN_WRITER)
  try:
    _run(lambda: _check_targets(fn, full_specs))
    _run(lambda: _set_markers(specs, True))
    _run(lambda: _write_all(arrs, specs))
    multi_process = jax.process_count() > 1
    if multi_process:
      _multihost.sync_global_devices("jax_sharding_ext.serialization.run_serialization")
    if jax.process_index() == 0:
      _run(lambda: _set_markers(specs, False))
    if multi_process:
      _multihost.sync_global_devices("jax_sharding_ext.serialization.committed")
  finally:
    _release_paths(held, writer)


async def _write_all(arrs: Sequence[jax.Array], specs: Sequence[Any]) -> None:
  """Stock's `run_serialization`, as a coroutine."""
  await asyncio.gather(*(_stock.async_serialize(a, s) for a, s in zip(arrs, specs, strict=True)))


def estimate_read_memory_footprint(t: ts.TensorStore) -> int:
  """Bytes read (whole chunks) to read all of `t`."""
  return _ts_impl.estimate_read_memory_footprint(t, t.domain)


async def _open_existing(spec: Any, where: str) -> ts.TensorStore:
  try:
    return await ts.open(ts.Spec(spec) if isinstance(spec, dict) else spec,
                         open=True, context=TS_CONTEXT)
  except ValueError as e:
    reason = str(e).split(" [tensorstore_spec=")[0]  # the spec is long and ours
    if "NOT_FOUND" in reason:
      raise ValueError(f"{where}: no checkpoint at '{_spec_path(spec)}' ({reason}). "
                       "Check the path, and that the checkpoint was committed.") from None
    raise ValueError(f"{where}: cannot open the checkpoint at '{_spec_path(spec)}': "
                     f"{reason}") from None


async def async_deserialize(mesh, mesh_axes, tensorstore_spec,
                            global_shape=None, dtype=None,
                            byte_limiter: _LimitInFlightBytes | None = None):
  """Read a checkpoint as a `GlobalDeviceArray` on `mesh` with `mesh_axes`.

  `global_shape` larger than the stored shape zero-pads, smaller truncates;
  `dtype` casts on the host. Each process reads only its devices' shards.
  """
  where = f"`async_deserialize` of '{_spec_path(tensorstore_spec)}'"
  dtype = _checked_dtype(dtype, f"{where}: dtype")
  t = await _open_existing(tensorstore_spec, where)
  await _check_committed(tensorstore_spec, where)
  shape = t.shape if global_shape is None else canonical_shape(global_shape)
  if len(shape) != t.rank:
    raise ValueError(f"{where}: global_shape {tuple(shape)} has rank {len(shape)}, but "
                     f"the stored array has rank {t.rank} (shape {t.shape}).")
  lay = layout(shape, mesh, mesh_axes)
  arr = await _stock.async_deserialize(
      NamedSharding(mesh, lay.spec), tensorstore_spec, lay.shape, dtype,
      byte_limiter=byte_limiter)
  return GlobalDeviceArray._wrap(arr, mesh_axes)


@jax_tracebacks.api_boundary
def run_deserialization(global_meshes, mesh_axes, tensorstore_specs,
                        global_shapes=None, dtypes=None, concurrent_gb=32):
  """Read checkpoints as `GlobalDeviceArray`s, one mesh and mesh_axes each.

  At most `concurrent_gb` GB of host memory is in flight per process.
  """
  specs = list(tensorstore_specs)
  meshes, axes, shapes, dts = _same_length(
      "run_deserialization", len(specs), global_meshes=global_meshes,
      mesh_axes=mesh_axes, global_shapes=global_shapes, dtypes=dtypes)
  for i, m in enumerate(meshes):
    if not isinstance(m, Mesh):
      raise TypeError(f"{_where('run_deserialization', 'global_meshes', i)} must be a "
                      f"jax.sharding.Mesh, got {type(m).__name__}.")
  for i, d in enumerate(dts):
    _checked_dtype(d, _where("run_deserialization", "dtypes", i))

  async def read_all():
    limiter = _LimitInFlightBytes(concurrent_gb * 10**9)
    return await asyncio.gather(*(
        async_deserialize(*args, byte_limiter=limiter)
        for args in zip(meshes, axes, specs, shapes, dts, strict=True)))
  return _run(read_all)


# -- the checkpoint manager -------------------------------------------------------------


class GlobalAsyncCheckpointManagerBase(metaclass=abc.ABCMeta):
  """Interface for checkpointing GDAs asynchronously (the GDA-era signatures).

  A checkpoint started with `serialize` commits in the background; the next
  `serialize`, `deserialize` or `wait_until_finished` waits for it first.
  """

  @abc.abstractmethod
  def check_for_errors(self):
    """Raise an error of the background commit, if any (non-blocking)."""

  @abc.abstractmethod
  def wait_until_finished(self):
    """Block until the background commit has finished; raise its error."""

  @abc.abstractmethod
  def serialize(self, arrays, tensorstore_specs, *,
                on_commit_callback: Callable[[], None]):
    """Serialize GDAs to TensorStore."""

  @abc.abstractmethod
  def deserialize(self, global_meshes, mesh_axes, tensorstore_specs,
                  global_shapes=None, dtypes=None):
    """Deserialize GDAs from TensorStore."""


AsyncManager = _stock.AsyncManager


class GlobalAsyncCheckpointManager(_stock.GlobalAsyncCheckpointManager,
                                   GlobalAsyncCheckpointManagerBase):
  """Checkpoints GDAs (and `jax.Array`s) asynchronously through TensorStore.

  Stock `GlobalAsyncCheckpointManager` with the GDA-era `serialize` /
  `deserialize`: the writes and the commit run in the background; once every
  process has committed, process 0 removes the commit markers and runs
  `on_commit_callback` exactly once (e.g. renaming a temporary directory to
  its final name). An error in a write or in the callback is raised by the
  next `check_for_errors` / `wait_until_finished` / `serialize`. Works in a
  single process without `jax.distributed.initialize()`.

  One writer per path: a checkpoint holds its paths from `serialize` until
  this manager's `wait_until_finished()` returns (the next `serialize` calls
  it first), and a save to a held path by another manager or by
  `run_serialization` is a `RuntimeError`, before it writes anything. All
  writers of a path share its commit marker, so a second writer would have its
  marker removed by the first one's commit while it still writes, and a
  crash then would leave a partial checkpoint that restores as complete;
  refusing it also keeps two writers' chunks from mixing in one array. The
  rule depends only on the order of calls, never on how far the background
  commit has got, so every process of a multi-process job decides alike.
  (Saves from different jobs to one path are not detected.)

  Example:
    >>> manager = GlobalAsyncCheckpointManager()
    >>> manager.serialize([gda], [get_tensorstore_spec(tmp)],
    ...                   on_commit_callback=lambda: os.rename(tmp, final))
    >>> ...  # training goes on while the checkpoint is written
    >>> manager.wait_until_finished()
  """

  @jax_tracebacks.api_boundary
  def serialize(self, arrays, tensorstore_specs, *, on_commit_callback):
    """Start writing `arrays` (GDAs or `jax.Array`s), one spec each.

    Returns once this process's shards are copied out of device memory; the
    arrays may then be donated or deleted.
    """
    fn = "GlobalAsyncCheckpointManager.serialize"
    if not callable(on_commit_callback):
      raise TypeError(f"`{fn}`: on_commit_callback must be callable, got "
                      f"{type(on_commit_callback).__name__}.")
    arrs, specs, full_specs = _checked_arrays(fn, arrays, tensorstore_specs)
    self.wait_until_finished()  # also releases the paths of the previous checkpoint
    held = _hold_paths(fn, specs, self, _MANAGER_WRITER)
    try:
      _run(lambda: _check_targets(fn, full_specs))
      _run(lambda: _set_markers(specs, True))

      def commit():  # process 0, after every process has committed its writes
        _run(lambda: _set_markers(specs, False))
        on_commit_callback()
      _call(lambda: super(GlobalAsyncCheckpointManager, self).serialize(
          arrs, specs, on_commit_callback=commit))
    except BaseException:
      _release_paths(held, self)
      raise
    self._jse_held_paths = held

  def wait_until_finished(self):
    """Block until the background commit has finished; raise its error.

    Then (error or not) this manager's checkpoint no longer holds its paths.
    """
    try:
      super().wait_until_finished()
    finally:
      _release_paths(getattr(self, "_jse_held_paths", ()), self)
      self._jse_held_paths = []

  @jax_tracebacks.api_boundary
  def deserialize(self, global_meshes, mesh_axes, tensorstore_specs,
                  global_shapes=None, dtypes=None):
    """Wait for a checkpoint in flight, then `run_deserialization`."""
    self.wait_until_finished()
    return run_deserialization(global_meshes, mesh_axes, tensorstore_specs,
                               global_shapes, dtypes)
