"""GDA-era `jax.experimental.gda_serialization.serialization`, on stock JAX.

A drop-in for the module JAX removed with GDA, for code of every vintage:
the same public names, signatures and defaults, and both calling conventions
of its deserialization functions, told apart by the type of the first
argument:

- JAX 0.3.17 to 0.3.21: `async_deserialize(mesh, mesh_axes, tensorstore_spec,
  global_shape=None, dtype=None, byte_limiter=None)`,
  `run_deserialization(global_meshes, mesh_axes, tensorstore_specs, ...)` and
  the manager's `deserialize(global_meshes, mesh_axes, tensorstore_specs, ...)`;
- JAX 0.3.22 to 0.4.x: `async_deserialize(in_sharding, tensorstore_spec,
  global_shape=None, dtype=None, byte_limiter=None)`,
  `run_deserialization(shardings, tensorstore_specs, ...)` and
  `deserialize(shardings, tensorstore_specs, ...)`.

Both give `GlobalDeviceArray`s: on the mesh with the mesh axes, or for a
`NamedSharding` on its mesh with its spec as `mesh_axes`. Another kind of
`Sharding` (e.g. `SingleDeviceSharding`) gives a plain `jax.Array`: JAX 0.4.1
returned one for it when `jax_array` was on and raised a ValueError when it
was off, and a GDA cannot have such a sharding. A call that mixes the two
forms (meshes with shardings, a sharding with mesh axes) is a `TypeError`
naming both. The write functions took the same arguments in every vintage.

A new array is written as the GDA-era module wrote it (`_get_metadata`: zarr,
gzip, one chunk per shard, the metadata's 'dtype'), which readers of 2022
(tensorstore before 0.1.35, no zstd) can open; `metadata="stock"` on
`async_serialize`, `run_serialization` and the manager's `serialize` writes
stock `array_serialization`'s metadata instead (zstd). Metadata already in a
spec is used as given. Either kind, and stock's checkpoints, restore here.

The work is done by stock `jax.experimental.array_serialization` and
tensorstore; this module converts at the boundary (a GDA is written as its
zero-copy `jax.Array`; a restored `jax.Array` is wrapped as a GDA) and adds
what the old module lacked:

- checks before anything is written or read: a non-array argument, a typed
  PRNG key array, specs that do not match the arrays or that tensorstore
  rejects, two arrays for one path, a stored array that this one cannot
  overwrite (another shape, dtype, chunking or compression), a rank mismatch,
  an unknown dtype, a missing checkpoint, each a `TypeError` / `ValueError`
  naming the argument. A refused save leaves its paths exactly as they were
  (no marker, no byte);
- commit markers: `run_serialization` and `GlobalAsyncCheckpointManager`
  put a marker key (`COMMIT_MARKER`) into each array's kvstore before the
  first write and remove it only once every process has committed; a restore
  refuses an array that still has it (also through a 'cast' spec), so a
  partial checkpoint is never taken as complete. (The low-level
  `async_serialize` writes no marker.) Checkpoints without a marker (e.g.
  written by stock JAX) restore as usual.
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
from collections.abc import Callable, Sequence
from typing import Any, overload

try:
  import tensorstore as ts
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
  raise ImportError(
      "`jax_sharding_ext.serialization` needs tensorstore, an optional extra: "
      "pip install 'jax-sharding-ext[checkpoint]'") from e

import jax
from jax.experimental import multihost_utils as _multihost
from jax.sharding import Mesh, NamedSharding

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.shard_math import Index, MeshAxes, Shape, canonical_shape, layout
from jax_sharding_ext._checkpoint import args as _args
from jax_sharding_ext._checkpoint import checks as _checks
from jax_sharding_ext._checkpoint import integrity as _integrity
from jax_sharding_ext._checkpoint import locations as _locations
from jax_sharding_ext._checkpoint import markers as _markers
from jax_sharding_ext._checkpoint import metadata as _metadata
from jax_sharding_ext._checkpoint import reading as _reading
from jax_sharding_ext._checkpoint import recording as _recording
from jax_sharding_ext._checkpoint import running as _running
from jax_sharding_ext._checkpoint import saving as _saving
from jax_sharding_ext._jax import checkpoint as jax_checkpoint
from jax_sharding_ext._jax import tracebacks as jax_tracebacks

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

TS_CONTEXT = _metadata.TS_CONTEXT
COMMIT_MARKER = _markers.COMMIT_MARKER
# Private names of the GDA-era module that GDA-era code reads.
_CHECKPOINT_SUCCESS = jax_checkpoint.CHECKPOINT_SUCCESS
_LimitInFlightBytes = jax_checkpoint.LimitInFlightBytes
_spec_has_metadata = _metadata.spec_has_metadata
_get_metadata = _metadata.gda_metadata
_GDA_METADATA = _metadata.GDA_METADATA


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
  mine = inp_sharding.addressable_devices
  devices = [d for d in idx if d in mine]
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
  return jax_checkpoint.get_tensorstore_spec(ckpt_path)


async def async_serialize(arr_inp, tensorstore_spec, commit_future=None, *,
                          metadata=_GDA_METADATA):
  """Write this process's shards of `arr_inp` (a GDA or `jax.Array`).

  Stock `async_serialize`; with `commit_future` (a list) the commit futures
  are appended to it instead of awaited. A spec without metadata gets the
  GDA-era module's (`_get_metadata`), or stock's with `metadata="stock"`.
  Writes no commit marker.
  """
  fn = "async_serialize"
  where = _recording.site()
  choice = _metadata.checked_metadata_choice(fn, metadata)
  (arr,), (spec,) = _checks.checked_arrays(fn, [arr_inp], [tensorstore_spec], choice)
  fresh = [_locations.new_local_path(spec)]
  # Both checks finish before either error is raised: this runs in the
  # caller's event loop, which may close as soon as the error reaches it.
  for error in await asyncio.gather(_checks.check_targets(fn, [spec], choice),
                                    _saving.check_host_copy(fn, [arr]), return_exceptions=True):
    if isinstance(error, BaseException):
      raise error
  await _integrity.start_records([spec])
  if commit_future is None:
    regions = _integrity.written_regions(arr)
    out = await jax_checkpoint.async_serialize(arr, spec)
    await _integrity.write_records([regions], [spec], fresh)
  else:
    first = len(commit_future)
    out = await jax_checkpoint.async_serialize(arr, spec, commit_future=commit_future)
    commit_future.append(_saving.RecordsAfter(commit_future[first:], [arr], [spec], fresh))
  _recording.saved([arr], where)
  return out


@jax_tracebacks.api_boundary
def run_serialization(arrays, tensorstore_specs, *, metadata=_GDA_METADATA):
  """Write GDAs / `jax.Array`s, one tensorstore spec each, and commit them.

  Every process calls it with the same arrays; it returns once every process
  has written its shards (a barrier when there are several processes).
  Everything that can refuse the save (bad input, a stored array of another
  shape, dtype, sharding or compression, a path another save is still
  writing) is checked before the commit markers and the first byte are
  written. `metadata`: as for `async_serialize`.
  """
  fn = "run_serialization"
  where = _recording.site()
  choice = _metadata.checked_metadata_choice(fn, metadata)
  arrs, specs = _checks.checked_arrays(fn, arrays, tensorstore_specs, choice)
  writer = _markers.SaveInProgress()
  held = _markers.hold_paths(fn, specs, writer, _markers.RUN_WRITER)
  try:
    multi_process = jax.process_count() > 1
    # One event loop for the whole save on one process, as stock's
    # `run_serialization` (starting a loop costs about 0.1 ms).
    _running.run(lambda: _saving.save(fn, arrs, specs, choice, commit=not multi_process))
    if multi_process:
      _multihost.sync_global_devices("jax_sharding_ext.serialization.run_serialization")
      if jax.process_index() == 0:
        _running.run(lambda: _markers.set_markers(specs, False))
      _multihost.sync_global_devices("jax_sharding_ext.serialization.committed")
  finally:
    _markers.release_paths(held, writer)
  _recording.saved(arrs, where)


def estimate_read_memory_footprint(t: ts.TensorStore) -> int:
  """Bytes read (whole chunks) to read all of `t`."""
  return jax_checkpoint.estimate_read_memory_footprint(t, t.domain)


TensorstoreSpec = dict[str, Any] | ts.Spec
"""A tensorstore spec: a dict (e.g. from `get_tensorstore_spec(path)`) or a `ts.Spec`."""
DTypeLike = Any  # a numpy / JAX dtype or its name


@overload
async def async_deserialize(
    mesh: Mesh, mesh_axes: MeshAxes, tensorstore_spec: TensorstoreSpec,
    global_shape: Shape | None = None, dtype: DTypeLike | None = None,
    byte_limiter: _LimitInFlightBytes | None = None) -> GlobalDeviceArray: ...
@overload
async def async_deserialize(
    in_sharding: jax.sharding.Sharding, tensorstore_spec: TensorstoreSpec,
    global_shape: Shape | None = None, dtype: DTypeLike | None = None,
    byte_limiter: _LimitInFlightBytes | None = None) -> jax.Array: ...
async def async_deserialize(*args, **kwargs):
  """Read a checkpoint as a `GlobalDeviceArray`. Either form of its vintage:

  - `async_deserialize(mesh, mesh_axes, tensorstore_spec, global_shape=None,
    dtype=None, byte_limiter=None)` (JAX 0.3.17 to 0.3.21): a GDA on `mesh`
    with `mesh_axes`;
  - `async_deserialize(in_sharding, tensorstore_spec, global_shape=None,
    dtype=None, byte_limiter=None)` (JAX 0.3.22 to 0.4.x): for a
    `NamedSharding`, a GDA on its mesh with its spec as `mesh_axes`; for
    another `Sharding`, a `jax.Array`.

  `global_shape` larger than the stored shape zero-pads, smaller truncates;
  `dtype` casts on the host. Each process reads only its devices' shards.
  """
  where = _recording.site()
  out = await _reading.read_one(*_args.bind(_args.ASYNC_DESERIALIZE, args, kwargs))
  _recording.restored([out], where)
  return out


@overload
def run_deserialization(
    global_meshes: Sequence[Mesh], mesh_axes: Sequence[MeshAxes],
    tensorstore_specs: Sequence[TensorstoreSpec],
    global_shapes: Sequence[Shape | None] | None = None,
    dtypes: Sequence[DTypeLike | None] | None = None,
    concurrent_gb: int = 32) -> list[GlobalDeviceArray]: ...
@overload
def run_deserialization(
    shardings: Sequence[jax.sharding.Sharding], tensorstore_specs: Sequence[TensorstoreSpec],
    global_shapes: Sequence[Shape | None] | None = None,
    dtypes: Sequence[DTypeLike | None] | None = None,
    concurrent_gb: int = 32) -> list[jax.Array]: ...
@jax_tracebacks.api_boundary
def run_deserialization(*args, **kwargs):
  """Read checkpoints as `GlobalDeviceArray`s. Either form of its vintage:

  - `run_deserialization(global_meshes, mesh_axes, tensorstore_specs,
    global_shapes=None, dtypes=None, concurrent_gb=32)` (JAX 0.3.17 to
    0.3.21);
  - `run_deserialization(shardings, tensorstore_specs, global_shapes=None,
    dtypes=None, concurrent_gb=32)` (JAX 0.3.22 to 0.4.x).

  One entry of each sequence per spec; each gives what `async_deserialize`
  gives for it. At most `concurrent_gb` GB of host memory is in flight per
  process.
  """
  where = _recording.site()
  forms = _args.RUN_DESERIALIZATION
  out = _reading.read_many(forms, *_args.bind(forms, args, kwargs))
  _recording.restored(out, where)
  return out


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
  def deserialize(self, *args, **kwargs):
    """Deserialize GDAs from TensorStore: `(global_meshes, mesh_axes,
    tensorstore_specs, global_shapes=None, dtypes=None)` (JAX 0.3.17 to
    0.3.21) or `(shardings, tensorstore_specs, global_shapes=None,
    dtypes=None)` (JAX 0.3.22 to 0.4.x)."""


AsyncManager = jax_checkpoint.AsyncManager


class GlobalAsyncCheckpointManager(jax_checkpoint.ExtraCommitFutures,
                                   jax_checkpoint.StockCheckpointManager,
                                   GlobalAsyncCheckpointManagerBase):
  """Checkpoints GDAs (and `jax.Array`s) asynchronously through TensorStore.

  Stock `GlobalAsyncCheckpointManager` with the GDA-era `serialize` /
  `deserialize` (both forms of `deserialize`, as `run_deserialization`): the
  writes and the commit run in the background; once every process has
  committed, process 0 removes the commit markers and runs
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
    >>> gda, = manager.deserialize([NamedSharding(mesh, P("x"))],
    ...                            [get_tensorstore_spec(final)])
  """

  @jax_tracebacks.api_boundary
  def serialize(self, arrays, tensorstore_specs, *, on_commit_callback,
                metadata=_GDA_METADATA):
    """Start writing `arrays` (GDAs or `jax.Array`s), one spec each.

    Returns once this process's shards are copied out of device memory; the
    arrays may then be donated or deleted. `metadata`: as for
    `async_serialize`.
    """
    fn = "GlobalAsyncCheckpointManager.serialize"
    where = _recording.site()
    if not callable(on_commit_callback):
      raise TypeError(f"`{fn}`: on_commit_callback must be callable, got "
                      f"{type(on_commit_callback).__name__}.")
    choice = _metadata.checked_metadata_choice(fn, metadata)
    arrs, specs = _checks.checked_arrays(fn, arrays, tensorstore_specs, choice)
    self.wait_until_finished()  # also releases the paths of the previous checkpoint
    held = _markers.hold_paths(fn, specs, self, _markers.MANAGER_WRITER)
    try:
      _, fresh = _running.run(lambda: _saving.prepare(fn, arrs, specs, choice))

      def commit():  # process 0, after every process has committed its writes
        _running.run(lambda: _markers.set_markers(specs, False))
        on_commit_callback()
      # Each process records its chunks once its writes are committed.
      self._jse_extra_commit = lambda futures: _saving.RecordsAfter(futures, arrs, specs, fresh)
      try:
        _running.call(lambda: super(GlobalAsyncCheckpointManager, self).serialize(
            arrs, specs, on_commit_callback=commit))
      finally:
        self._jse_extra_commit = None
    except BaseException:
      _markers.release_paths(held, self)
      raise
    self._jse_held_paths = held
    _recording.saved(arrs, where)  # the data is on the host now; the commit runs on

  def wait_until_finished(self):
    """Block until the background commit has finished; raise its error.

    Then (error or not) this manager's checkpoint no longer holds its paths.
    """
    try:
      super().wait_until_finished()
    finally:
      _markers.release_paths(getattr(self, "_jse_held_paths", ()), self)
      self._jse_held_paths = []

  # Stock's manager takes only the sharding form; this one also takes the
  # GDA-era mesh form, so its signature widens stock's.
  @overload  # type: ignore[override]
  def deserialize(
      self, global_meshes: Sequence[Mesh], mesh_axes: Sequence[MeshAxes],
      tensorstore_specs: Sequence[TensorstoreSpec],
      global_shapes: Sequence[Shape | None] | None = None,
      dtypes: Sequence[DTypeLike | None] | None = None,
      concurrent_gb: int = 32) -> list[GlobalDeviceArray]: ...
  @overload
  def deserialize(
      self, shardings: Sequence[jax.sharding.Sharding],
      tensorstore_specs: Sequence[TensorstoreSpec],
      global_shapes: Sequence[Shape | None] | None = None,
      dtypes: Sequence[DTypeLike | None] | None = None,
      concurrent_gb: int = 32) -> list[jax.Array]: ...
  @jax_tracebacks.api_boundary
  def deserialize(self, *args, **kwargs):
    """Wait for a checkpoint in flight, then read as `run_deserialization`:
    `(global_meshes, mesh_axes, tensorstore_specs, global_shapes=None,
    dtypes=None)` (JAX 0.3.17 to 0.3.21) or `(shardings, tensorstore_specs,
    global_shapes=None, dtypes=None)` (JAX 0.3.22 to 0.4.x); both also take
    `concurrent_gb=32`, as stock's manager does."""
    where = _recording.site()
    self.wait_until_finished()
    forms = _args.MANAGER_DESERIALIZE
    out = _reading.read_many(forms, *_args.bind(forms, args, kwargs))
    _recording.restored(out, where)
    return out


# `help()`, `inspect.signature` and IDEs that read it show the sharding form
# (the last GDA-era one, which stock keeps) with its types; the docstrings
# give both forms, and `typing.get_overloads` returns both.
_args.show_signature(async_deserialize)
_args.show_signature(run_deserialization)
_args.show_signature(GlobalAsyncCheckpointManager.deserialize)
