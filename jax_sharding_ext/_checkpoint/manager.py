"""The GDA-era checkpoint managers of `serialization`.

`GlobalAsyncCheckpointManagerBase` is the GDA-era interface;
`GlobalAsyncCheckpointManager` is stock `array_serialization`'s manager with
the GDA-era `serialize` / `deserialize` (both vintages of `deserialize`),
commit markers and one writer per path. `serialization` exports both.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import overload

import jax
from jax.sharding import Mesh

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.shard_math import MeshAxes, Shape
from jax_sharding_ext._checkpoint import args as call_forms
from jax_sharding_ext._checkpoint import checks, markers, reading, recording, running, saving
from jax_sharding_ext._checkpoint import metadata as metadata_lib
from jax_sharding_ext._checkpoint.args import DTypeLike, TensorstoreSpec
from jax_sharding_ext._jax import checkpoint as jax_checkpoint
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._public import public

GDA_METADATA = metadata_lib.GDA_METADATA

@public("jax_sharding_ext.serialization")
class GlobalAsyncCheckpointManagerBase(metaclass=abc.ABCMeta):
  """Interface for checkpointing GDAs asynchronously (the GDA-era signatures).

  A checkpoint started with `serialize` commits in the background; the next
  `serialize`, `deserialize` or `wait_until_finished` waits for it first.
  GDA-era code subclassed it (or typed a manager argument with it);
  `GlobalAsyncCheckpointManager` implements it.

  Example:
    >>> issubclass(GlobalAsyncCheckpointManager, GlobalAsyncCheckpointManagerBase)
    True
    >>> GlobalAsyncCheckpointManagerBase()   # an interface: abstract
    Traceback (most recent call last):
    TypeError: Can't instantiate abstract class GlobalAsyncCheckpointManagerBase ...
  """

  @abc.abstractmethod
  def check_for_errors(self):
    """Raise an error of the background commit, if any (non-blocking).

    Example:
      >>> GlobalAsyncCheckpointManager().check_for_errors()   # nothing failed
    """

  @abc.abstractmethod
  def wait_until_finished(self):
    """Block until the background commit has finished; raise its error.

    Example:
      >>> GlobalAsyncCheckpointManager().wait_until_finished()   # nothing in flight
    """

  @abc.abstractmethod
  def serialize(self, arrays, tensorstore_specs, *,
                on_commit_callback: Callable[[], None]):
    """Start serializing GDAs to TensorStore; commit in the background.

    Example:
      >>> import tempfile
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                           lambda index: np.zeros(8)[index])
      >>> manager, committed = GlobalAsyncCheckpointManager(), []
      >>> manager.serialize([gda], [get_tensorstore_spec(tempfile.mkdtemp() + '/w')],
      ...                   on_commit_callback=lambda: committed.append('w'))
      >>> manager.wait_until_finished()   # the commit has run (on a thread of its own)
      >>> committed
      ['w']
    """

  @abc.abstractmethod
  def deserialize(self, *args, **kwargs):
    """Deserialize GDAs from TensorStore: `(global_meshes, mesh_axes,
    tensorstore_specs, global_shapes=None, dtypes=None)` (JAX 0.3.17 to
    0.3.21) or `(shardings, tensorstore_specs, global_shapes=None,
    dtypes=None)` (JAX 0.3.22 to 0.4.x).

    Example:
      >>> import tempfile
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                           lambda index: np.zeros(8)[index])
      >>> spec = get_tensorstore_spec(tempfile.mkdtemp() + '/w')
      >>> run_serialization([gda], [spec])
      >>> GlobalAsyncCheckpointManager().deserialize([mesh], [P()], [spec])
      [GlobalDeviceArray(shape=(8,), dtype=float32,
        global_mesh_shape={'x': 8}, mesh_axes=PartitionSpec())]
    """


@public("jax_sharding_ext.serialization")
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
    >>> import os, tempfile
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> gda = jse.GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
    ...                                           lambda index: np.ones((8, 2))[index])
    >>> ckpt = tempfile.mkdtemp()
    >>> tmp, final = f'{ckpt}/step_1.tmp', f'{ckpt}/step_1'
    >>> manager = GlobalAsyncCheckpointManager()
    >>> manager.serialize([gda], [get_tensorstore_spec(f'{tmp}/w')],
    ...                   on_commit_callback=lambda: os.rename(tmp, final))
    >>> # ... training goes on while the checkpoint is written ...
    >>> manager.wait_until_finished()   # raises a write's or the callback's error
    >>> w, = manager.deserialize([jax.sharding.NamedSharding(mesh, P('x'))],
    ...                          [get_tensorstore_spec(f'{final}/w')])
    >>> w.mesh_axes, np.asarray(w).sum()
    (P('x',), np.float32(16.0))
  """

  @jax_tracebacks.api_boundary
  def serialize(self, arrays, tensorstore_specs, *, on_commit_callback,
                metadata=GDA_METADATA):
    """Start writing `arrays` (GDAs or `jax.Array`s), one spec each.

    Returns once this process's shards are copied out of device memory; the
    arrays may then be donated or deleted. `metadata`: as for
    `async_serialize`.

    Example:
      >>> import tempfile
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                           lambda index: np.ones(8)[index])
      >>> manager, committed = GlobalAsyncCheckpointManager(), []
      >>> manager.serialize([gda], [get_tensorstore_spec(tempfile.mkdtemp() + '/w')],
      ...                   on_commit_callback=lambda: committed.append('step 1'))
      >>> gda.delete()   # its data is on the host already
      >>> manager.wait_until_finished()   # the commit has run (on a thread of its own)
      >>> committed
      ['step 1']
    """
    fn = "GlobalAsyncCheckpointManager.serialize"
    where = recording.site()
    if not callable(on_commit_callback):
      raise TypeError(f"`{fn}`: on_commit_callback must be callable, got "
                      f"{type(on_commit_callback).__name__}.")
    choice = metadata_lib.checked_metadata_choice(fn, metadata)
    arrs, specs = checks.checked_arrays(fn, arrays, tensorstore_specs, choice)
    self.wait_until_finished()  # also releases the paths of the previous checkpoint
    held = markers.hold_paths(fn, specs, self, markers.MANAGER_WRITER)
    try:
      _, fresh = running.run(lambda: saving.prepare(fn, arrs, specs, choice))

      def commit():  # process 0, after every process has committed its writes
        running.run(lambda: markers.set_markers(specs, False))
        on_commit_callback()
      # Each process records its chunks once its writes are committed.
      self._jse_extra_commit = lambda futures: saving.RecordsAfter(futures, arrs, specs, fresh)
      try:
        running.call(lambda: super(GlobalAsyncCheckpointManager, self).serialize(
            arrs, specs, on_commit_callback=commit))
      finally:
        self._jse_extra_commit = None
    except BaseException:
      markers.release_paths(held, self)
      raise
    self._jse_held_paths = held
    recording.saved(arrs, where)  # the data is on the host now; the commit runs on

  def serialize_with_paths(self, arrays, paths, *, on_commit_callback=None, transaction=None,
                           metadata=GDA_METADATA):
    """Start writing `arrays` to `paths`: `serialize` with `get_tensorstore_spec(path)`.

    Stock's convenience form (a local path or `gs://` URL per array);
    `on_commit_callback` may be left out. A tensorstore `transaction` is
    refused: the commit markers and chunk records are written outside it.

    Example:
      >>> import tempfile
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                           lambda index: np.arange(8.0)[index])
      >>> path = tempfile.mkdtemp() + '/w'
      >>> manager = GlobalAsyncCheckpointManager()
      >>> manager.serialize_with_paths([gda], [path])
      >>> manager.deserialize_with_paths([gda.sharding], [path])
      [GlobalDeviceArray(shape=(8,), dtype=float32,
        global_mesh_shape={'x': 8}, mesh_axes=PartitionSpec('x',))]
    """
    if transaction is not None:
      raise TypeError(
          "`GlobalAsyncCheckpointManager.serialize_with_paths` does not take a tensorstore "
          "`transaction`: the commit markers and chunk records that make a checkpoint "
          "restore exactly or raise are written outside it. Leave it out.")
    specs = [jax_checkpoint.get_tensorstore_spec(p) for p in paths]
    self.serialize(arrays, specs, on_commit_callback=on_commit_callback or (lambda: None),
                   metadata=metadata)

  def wait_until_finished(self):
    """Block until the background commit has finished; raise its error.

    Then (error or not) this manager's checkpoint no longer holds its paths.

    Example:
      >>> import tempfile
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                           lambda index: np.ones(8)[index])
      >>> manager = GlobalAsyncCheckpointManager()
      >>> def fail():
      ...   raise OSError('disk full')
      >>> manager.serialize([gda], [get_tensorstore_spec(tempfile.mkdtemp() + '/w')],
      ...                   on_commit_callback=fail)
      >>> manager.wait_until_finished()
      Traceback (most recent call last):
      OSError: disk full
    """
    try:
      super().wait_until_finished()
    finally:
      markers.release_paths(getattr(self, "_jse_held_paths", ()), self)
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
    `concurrent_gb=32`, as stock's manager does.

    Example:
      >>> import tempfile
      >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
      >>> gda = jse.GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
      ...                                           lambda index: np.ones((8, 2))[index])
      >>> spec = get_tensorstore_spec(tempfile.mkdtemp() + '/w')
      >>> manager = GlobalAsyncCheckpointManager()
      >>> manager.serialize([gda], [spec], on_commit_callback=lambda: None)
      >>> w, = manager.deserialize([mesh], [P('y')], [spec])   # waits for the commit first
      >>> w.mesh_axes
      P('y',)
    """
    where = recording.site()
    self.wait_until_finished()
    forms = call_forms.MANAGER_DESERIALIZE
    out = reading.read_many(forms, *call_forms.bind(forms, args, kwargs))
    recording.restored(out, where)
    return out


# `help()`, `inspect.signature` and IDEs that read it show the sharding form
# (the last GDA-era one, which stock keeps) with its types; the docstring
# gives both forms, and `typing.get_overloads` returns both.
call_forms.show_signature(GlobalAsyncCheckpointManager.deserialize)
