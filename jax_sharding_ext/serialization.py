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

import asyncio
from collections.abc import Callable as _Callable
from collections.abc import Sequence as _Sequence
from typing import Any as _Any
from typing import overload as _overload

try:
  import tensorstore as ts
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
  raise ImportError(
      "`jax_sharding_ext.serialization` needs tensorstore, an optional extra: "
      "pip install 'jax-sharding-ext[checkpoint]'") from e

import jax
from jax.experimental import multihost_utils as _multihost

from jax_sharding_ext import _public
from jax_sharding_ext._array import gda as _gda
from jax_sharding_ext._array import shard_math as _shard_math
from jax_sharding_ext._checkpoint import args as _args
from jax_sharding_ext._checkpoint import checks as _checks
from jax_sharding_ext._checkpoint import integrity as _integrity
from jax_sharding_ext._checkpoint import locations as _locations
from jax_sharding_ext._checkpoint import manager as _manager
from jax_sharding_ext._checkpoint import markers as _markers
from jax_sharding_ext._checkpoint import metadata as _metadata
from jax_sharding_ext._checkpoint import reading as _reading
from jax_sharding_ext._checkpoint import recording as _recording
from jax_sharding_ext._checkpoint import running as _running
from jax_sharding_ext._checkpoint import saving as _saving
from jax_sharding_ext._jax import checkpoint as _jax_checkpoint
from jax_sharding_ext._jax import tracebacks as _tracebacks

# The types of the signatures (evaluated when defined, so that `help()` and
# `inspect.signature` show them), kept out of the public namespace.
_Mesh = jax.sharding.Mesh
_GlobalDeviceArray = _gda.GlobalDeviceArray
_Shape = _shard_math.Shape
_Index = _shard_math.Index
_MeshAxes = _shard_math.MeshAxes
_TensorstoreSpec = _args.TensorstoreSpec
_DTypeLike = _args.DTypeLike

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
AsyncManager = _jax_checkpoint.AsyncManager
GlobalAsyncCheckpointManagerBase = _manager.GlobalAsyncCheckpointManagerBase
GlobalAsyncCheckpointManager = _manager.GlobalAsyncCheckpointManager
# Private names of the GDA-era module that GDA-era code reads.
_CHECKPOINT_SUCCESS = _jax_checkpoint.CHECKPOINT_SUCCESS
_LimitInFlightBytes = _jax_checkpoint.LimitInFlightBytes
_spec_has_metadata = _metadata.spec_has_metadata
_get_metadata = _metadata.gda_metadata
_GDA_METADATA = _metadata.GDA_METADATA

# `dir()`, `help()` and tab completion list the public names (and the GDA-era
# private ones old code reads), not the modules and helpers used here.
__dir__ = _public.module_dir(__name__, "_CHECKPOINT_SUCCESS", "_LimitInFlightBytes", "_spec_has_metadata", "_get_metadata", "_GDA_METADATA")


# -- the old module's functions -------------------------------------------------------


async def create_async_array_from_callback(
    global_shape: _Shape,
    inp_sharding: jax.sharding.Sharding,
    data_callback: _Callable[[_Index], _Any],
):
  """Build a `jax.Array` from awaiting `data_callback(index)` per addressable device.

  `data_callback` is an async function returning the host data at `index`
  (a tuple of slices); the calls run concurrently.

  Example:
    >>> import asyncio
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> async def read(index):   # e.g. from a file or a remote store
    ...   return np.arange(8.0)[index]
    >>> sharding = jax.sharding.NamedSharding(mesh, P('x'))
    >>> arr = asyncio.run(create_async_array_from_callback((8,), sharding, read))
    >>> arr.sharding == sharding, arr.addressable_data(1)
    (True, Array([1.], dtype=float32))
  """
  shape = _shard_math.canonical_shape(global_shape)
  idx = inp_sharding.devices_indices_map(shape)
  mine = inp_sharding.addressable_devices
  devices = [d for d in idx if d in mine]
  local = await asyncio.gather(*(data_callback(idx[d]) for d in devices))
  dbs = [jax.device_put(x, d) for x, d in zip(local, devices, strict=True)]
  return jax.make_array_from_single_device_arrays(shape, inp_sharding, dbs)


async def create_async_gda_from_callback(
    global_shape: _Shape,
    global_mesh: _Mesh,
    mesh_axes: _MeshAxes,
    data_callback: _Callable[[_Index], _Any],
):
  """Build a `GlobalDeviceArray` from awaiting `data_callback(index)` per local device.

  As `create_async_array_from_callback`, on `global_mesh` with `mesh_axes`.

  Example:
    >>> import asyncio
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> async def read(index):
    ...   return np.arange(16.0).reshape(8, 2)[index]
    >>> asyncio.run(create_async_gda_from_callback((8, 2), mesh, P('x'), read))
    GlobalDeviceArray(shape=(8, 2), dtype=float32,
      global_mesh_shape={'x': 4, 'y': 2}, mesh_axes=PartitionSpec('x',))
  """
  lay = _shard_math.layout(global_shape, global_mesh, mesh_axes)
  arr = await create_async_array_from_callback(
      lay.shape, jax.sharding.NamedSharding(global_mesh, lay.spec), data_callback)
  return _gda.GlobalDeviceArray._wrap(arr, mesh_axes)


def get_tensorstore_spec(ckpt_path: str):
  """Return the zarr spec for `ckpt_path` (a local path, or `gs://bucket/path`).

  Example:
    >>> get_tensorstore_spec('/checkpoints/step_5/w')
    {'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': '/checkpoints/step_5/w'}}
  """
  return _jax_checkpoint.get_tensorstore_spec(ckpt_path)


async def async_serialize(arr_inp, tensorstore_spec, commit_future=None, *,
                          metadata=_GDA_METADATA):
  """Write this process's shards of `arr_inp` (a GDA or `jax.Array`).

  Stock `async_serialize`; with `commit_future` (a list) the commit futures
  are appended to it instead of awaited. A spec without metadata gets the
  GDA-era module's (`_get_metadata`), or stock's with `metadata="stock"`.
  Writes no commit marker.

  Example:
    >>> import asyncio, tempfile
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
    ...                                           lambda index: np.arange(8.0)[index])
    >>> spec = get_tensorstore_spec(tempfile.mkdtemp() + '/w')
    >>> _ = asyncio.run(async_serialize(gda, spec))   # awaits the writes
    >>> restored, = run_deserialization([mesh], [P('x')], [spec])
    >>> np.asarray(restored)
    array([0., 1., 2., 3., 4., 5., 6., 7.], dtype=float32)
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
    out = await _jax_checkpoint.async_serialize(arr, spec)
    await _integrity.write_records([regions], [spec], fresh)
  else:
    first = len(commit_future)
    out = await _jax_checkpoint.async_serialize(arr, spec, commit_future=commit_future)
    commit_future.append(_saving.RecordsAfter(commit_future[first:], [arr], [spec], fresh))
  _recording.saved([arr], where)
  return out


@_tracebacks.api_boundary
def run_serialization(arrays, tensorstore_specs, *, metadata=_GDA_METADATA):
  """Write GDAs / `jax.Array`s, one tensorstore spec each, and commit them.

  Every process calls it with the same arrays; it returns once every process
  has written its shards (a barrier when there are several processes).
  Everything that can refuse the save (bad input, a stored array of another
  shape, dtype, sharding or compression, a path another save is still
  writing) is checked before the commit markers and the first byte are
  written. `metadata`: as for `async_serialize`.

  Example:
    >>> import tempfile
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> gda = jse.GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
    ...                                           lambda index: np.ones((8, 2))[index])
    >>> ckpt = tempfile.mkdtemp()
    >>> run_serialization([gda], [get_tensorstore_spec(f'{ckpt}/w')])   # committed on return
    >>> run_serialization([gda], [get_tensorstore_spec(f'{ckpt}/w_zstd')], metadata='stock')
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
  """Return the bytes read (whole chunks) to read all of the open array `t`.

  Example:
    >>> import tempfile, tensorstore
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
    ...                                           lambda index: np.zeros(8, np.float32)[index])
    >>> spec = get_tensorstore_spec(tempfile.mkdtemp() + '/w')
    >>> run_serialization([gda], [spec])
    >>> estimate_read_memory_footprint(tensorstore.open(spec).result())   # 8 float32s
    32
  """
  return _jax_checkpoint.estimate_read_memory_footprint(t, t.domain)




@_overload
async def async_deserialize(
    mesh: _Mesh, mesh_axes: _MeshAxes, tensorstore_spec: _TensorstoreSpec,
    global_shape: _Shape | None = None, dtype: _DTypeLike | None = None,
    byte_limiter: _LimitInFlightBytes | None = None) -> _GlobalDeviceArray: ...
@_overload
async def async_deserialize(
    in_sharding: jax.sharding.Sharding, tensorstore_spec: _TensorstoreSpec,
    global_shape: _Shape | None = None, dtype: _DTypeLike | None = None,
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

  Example:
    >>> import asyncio, tempfile
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> gda = jse.GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
    ...                                           lambda index: np.ones((8, 2))[index])
    >>> spec = get_tensorstore_spec(tempfile.mkdtemp() + '/w')
    >>> run_serialization([gda], [spec])
    >>> asyncio.run(async_deserialize(mesh, P('y'), spec))   # the 0.3.17 form, resharded
    GlobalDeviceArray(shape=(8, 2), dtype=float32,
      global_mesh_shape={'x': 4, 'y': 2}, mesh_axes=PartitionSpec('y',))
    >>> sharding = jax.sharding.NamedSharding(mesh, P('x'))
    >>> padded = asyncio.run(async_deserialize(sharding, spec, global_shape=(12, 2)))
    >>> np.asarray(padded)[6:].T   # rows 8 and up are zeros
    array([[1., 1., 0., 0., 0., 0.],
           [1., 1., 0., 0., 0., 0.]], dtype=float32)
  """
  where = _recording.site()
  out = await _reading.read_one(*_args.bind(_args.ASYNC_DESERIALIZE, args, kwargs))
  _recording.restored([out], where)
  return out


@_overload
def run_deserialization(
    global_meshes: _Sequence[_Mesh], mesh_axes: _Sequence[_MeshAxes],
    tensorstore_specs: _Sequence[_TensorstoreSpec],
    global_shapes: _Sequence[_Shape | None] | None = None,
    dtypes: _Sequence[_DTypeLike | None] | None = None,
    concurrent_gb: int = 32) -> list[_GlobalDeviceArray]: ...
@_overload
def run_deserialization(
    shardings: _Sequence[jax.sharding.Sharding], tensorstore_specs: _Sequence[_TensorstoreSpec],
    global_shapes: _Sequence[_Shape | None] | None = None,
    dtypes: _Sequence[_DTypeLike | None] | None = None,
    concurrent_gb: int = 32) -> list[jax.Array]: ...
@_tracebacks.api_boundary
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

  Example:
    >>> import tempfile
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> gda = jse.GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
    ...                                           lambda index: np.ones((8, 2))[index])
    >>> specs = [get_tensorstore_spec(tempfile.mkdtemp() + '/w')]
    >>> run_serialization([gda], specs)
    >>> w, = run_deserialization([mesh], [P(None, 'y')], specs)   # the 0.3.17 form
    >>> w.mesh_axes
    P(None, 'y')
    >>> w, = run_deserialization([jax.sharding.NamedSharding(mesh, P('x'))], specs,
    ...                          dtypes=[np.int32])   # the 0.3.22 form, cast on the host
    >>> w.dtype, w.mesh_axes
    (dtype('int32'), P('x',))
  """
  where = _recording.site()
  forms = _args.RUN_DESERIALIZATION
  out = _reading.read_many(forms, *_args.bind(forms, args, kwargs))
  _recording.restored(out, where)
  return out


# `help()`, `inspect.signature` and IDEs that read it show the sharding form
# (the last GDA-era one, which stock keeps) with its types; the docstrings
# give both forms, and `typing.get_overloads` returns both.
_args.show_signature(async_deserialize)
_args.show_signature(run_deserialization)
