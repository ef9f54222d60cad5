"""`GlobalDeviceArray`: the GDA-era API as a zero-copy view over `jax.Array`.

A `GlobalDeviceArray` is a `jax.Array` (a Python subclass, so libraries that
check `isinstance(x, jax.Array)` take it) that holds exactly one private
`jax.Array` whose sharding is `NamedSharding(mesh, spec)`, plus the
`mesh_axes` the user gave. Its device buffers *are* that array's buffers:
`from_jax_array` / `to_jax_array` move nothing (they wrap and return other
`jax.Array` objects over the same buffers, see `family.py`), and
handing a GDA to `jax.jit` passes those buffers straight to the executable
when the sharding matches.

Stock JAX accepts it through its extension tables (`_dispatch/handlers.py`;
the output flag in `_dispatch/output.py`) as a committed array; every
transfer of its data goes through `_transfers/moves.py`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jax_sharding_ext._array import construct, family
from jax_sharding_ext._array.checks import check_buffers, extended_dtype_error, local_shard_data
from jax_sharding_ext._array.records import FROM_SHARDING, GdaShape, Shard
from jax_sharding_ext._array.shard_math import Index, MeshAxes, Shape, layout, old_spec_repr
from jax_sharding_ext._array.surface import _ArraySurface
from jax_sharding_ext._edit import STATE, uninstalled_error
from jax_sharding_ext._jax import buffers as jax_buffers
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._transfers import moves

_USE = "use it in a JAX operation"


class GlobalDeviceArray(_ArraySurface, jax.Array):
  """A logical array sharded across the devices (and processes) of a mesh.

  Each process holds a `GlobalDeviceArray` for the same global array; it can
  read the shape, dtype and sharding of the whole, pass it to `jax.jit`,
  `pjit`, `jax.numpy`, `shard_map`, and read the data of the shards on its own
  devices (`local_shards`). It is a zero-copy view over a `jax.Array`:
  `to_jax_array()` returns that array and `from_jax_array()` wraps one.

  Args:
    global_shape: shape of the global array.
    global_mesh: the mesh of every participating device.
    mesh_axes: at most one entry per dimension: a mesh axis name, a tuple of
      names (split over their product), or None (not split); or a
      `PartitionSpec`.
    device_buffers: one single-device `jax.Array` per device of
      `global_mesh.local_devices`, in that order.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> data = np.arange(16).reshape(8, 2)
    >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
    ...                                       lambda index: data[index])
    >>> gda.local_shards[0].index
    (slice(0, 2, None), slice(0, 1, None))
  """

  # `_init` and `rebuild` (the hot path of every GDA output) set every slot.
  __slots__ = ("_arr", "_mesh", "_mesh_axes", "_local_shards", "_host_fetched", "_shared",
               "_key", "__weakref__")
  _arr: Any  # the private `jax.Array` (its sharding a `NamedSharding`)
  _mesh: Mesh | None
  _mesh_axes: Any
  _local_shards: list[Shard] | None
  _host_fetched: bool
  _shared: bool
  _key: Any
  __array_priority__ = 100

  # A GDA is always committed to its devices (read by `jax.jit`).
  _committed = True

  @jax_tracebacks.api_boundary  # bad input shows the user's line
  def __init__(self, global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes,
               device_buffers: Sequence[jax.Array]):
    lay = layout(global_shape, global_mesh, mesh_axes)
    buffers = check_buffers(lay, global_mesh, mesh_axes, device_buffers)
    arr = jax.make_array_from_single_device_arrays(
        lay.shape, construct.named_sharding(global_mesh, lay.spec), buffers)
    self._init(arr, global_mesh, mesh_axes)
    # The buffers stay the caller's too (and whatever array they are shards of).
    family.mark_shared(self)

  def _init(self, arr: jax.Array, mesh: Mesh, mesh_axes: MeshAxes) -> None:
    self._arr = arr
    self._mesh = mesh
    self._mesh_axes = mesh_axes
    self._local_shards = None
    # Set by the first fetch to the host (`_transfers/moves.py`); later
    # fetches read the host copy, as for a `jax.Array`, and are not transfers.
    self._host_fetched = False
    # Whether arrays outside this GDA may hold its buffers (`family.py`), and the key of the
    # last jit call that flattened this GDA on a slow key (`_jax/dispatch.py`).
    self._shared = False
    self._key = None

  @classmethod
  def _wrap(cls, arr: jax.Array, mesh_axes: MeshAxes | None = None, *,
            shared: bool = False) -> GlobalDeviceArray:
    """Wrap `arr` (NamedSharding, already validated) without any checks.

    `shared`: `arr` holds buffers of arrays the caller handed in.
    """
    self = rebuild(None, (arr,))
    if mesh_axes is not None:
      self._mesh_axes = mesh_axes
    if shared:
      family.mark_shared(self)
    return self

  # -- conversions ----------------------------------------------------------

  @classmethod
  @jax_tracebacks.api_boundary
  def from_jax_array(cls, arr: jax.Array) -> GlobalDeviceArray:
    """Wrap a `jax.Array` with a `NamedSharding`; no copy, no transfer.

    `mesh_axes` of the result is `arr.sharding.spec`.
    """
    if isinstance(arr, GlobalDeviceArray):
      return arr
    if not isinstance(arr, jax.Array) or isinstance(arr, jax.core.Tracer):
      raise TypeError(
          "`GlobalDeviceArray.from_jax_array` needs a concrete `jax.Array`, got "
          f"{type(arr).__name__}. Inside `jax.jit` work with the traced value "
          "directly; GDAs exist only outside traced code.")
    if not isinstance(arr.sharding, NamedSharding):
      raise ValueError(
          "`GlobalDeviceArray.from_jax_array` needs a `jax.Array` whose sharding "
          f"is a `NamedSharding`, got {arr.sharding}. Use "
          "`jax.device_put(arr, NamedSharding(mesh, spec))` first.")
    if arr.is_deleted():
      raise RuntimeError(
          "`GlobalDeviceArray.from_jax_array` got a `jax.Array` that has been "
          "deleted or donated.")
    if not jax_tables.is_plain_dtype(arr.dtype):
      raise TypeError(extended_dtype_error(arr.dtype, "The `jax.Array`"))
    self = cls._wrap(arr)
    self._arr = family.handed_out(self, arr)
    return self

  def to_jax_array(self) -> jax.Array:
    """Return a `jax.Array` over this GDA's buffers (no copy).

    It shares the buffers, deletion and donation with the GDA: deleting or
    donating either deletes both, as for two names of one array.
    """
    return family.handed_out(self, self._checked_array("convert it with `to_jax_array()`"))

  @property
  def __jax_array__(self) -> Callable[[], jax.Array]:
    # A property, so that JAX's own `getattr(x, "__jax_array__", None)`
    # probe gets the clear error while the package is uninstalled (rather
    # than stock's ValueError about `__jax_array__`). A RuntimeError, not a
    # TypeError: `jax.jit` replaces any TypeError from reading an argument's
    # type with its generic "Error interpreting argument" text.
    if not STATE.installed or jax_frames.asked_by_abstractification():
      raise uninstalled_error(str(self))
    return self._jax_array

  def _jax_array(self) -> jax.Array:
    # A sibling (`to_jax_array`): `jnp.asarray(gda)` returns a `jax.Array`
    # over its buffers, never the private array itself.
    return family.handed_out(self, self._checked_array(_USE))

  def _checked_array(self, action: str) -> jax.Array:
    arr = self._arr
    if arr.is_deleted() or (self._shared and jax_buffers.shard_deleted(arr)):
      raise RuntimeError(
          f"GlobalDeviceArray has been deleted. Cannot {action}: this "
          f"GlobalDeviceArray (shape={self.shape}, dtype={self.dtype}) has been "
          "deleted or donated. After `jax.jit(..., donate_argnums=...)` use the "
          "function's output instead of the donated input.")
    return arr

  def _shard_array(self, action: str) -> jax.Array:
    """`_checked_array`, with its single-device arrays built: for uses that
    read them (jaxlib builds them on first use, and not safely across
    threads; `_jax/buffers.py`)."""
    return jax_buffers.ready(self._checked_array(action))

  @property
  def _value(self) -> np.ndarray:
    """The GDA-era private spelling of `np.asarray(gda)` (a fetch to the host)."""
    return self.__array__()

  def _check_if_deleted(self) -> None:
    """The GDA-era check: `RuntimeError` if the GDA was deleted or donated."""
    self._checked_array("use it")

  def _host_array(self) -> jax.Array:
    """The view, after fetching its value to the host (an implicit transfer)."""
    moves.to_host(self)
    return self._arr

  # -- constructors from host data ------------------------------------------

  @classmethod
  @jax_tracebacks.api_boundary
  def from_callback(cls, global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes,
                    data_callback: Callable[[Index], Any]) -> GlobalDeviceArray:
    """Build a GDA from `data_callback(index)`, called once per local device.

    Args:
      global_shape: shape of the global array.
      global_mesh: the mesh.
      mesh_axes: see `GlobalDeviceArray`.
      data_callback: takes an index into the global array (a tuple of slices)
        and returns the data there, as any array-like (numpy, `jax.Array`,
        nested lists). It is called for every local device, replicas included.

    A `jax.Array` with a copy on its device is adopted without a copy (one
    spanning other devices is moved there first), as by stock
    `jax.make_array_from_callback`: the GDA then shares its buffers with that
    array, and one call cannot donate the one while passing the other. On CPU
    devices jaxlib may adopt a suitably aligned numpy array returned by the
    callback as the device buffer instead of copying it (as stock
    `jax.make_array_from_callback` and `jax.device_put` do), so do not modify
    the returned memory afterwards; return a copy if you reuse the buffer.
    """
    construct.require_callable(data_callback, "data_callback")
    lay, devices, indices = construct.placement(global_shape, global_mesh, mesh_axes)
    values = [data_callback(idx) for idx in indices]
    arr, shared = construct.host_values_array(lay, global_mesh, mesh_axes, devices, indices,
                                              values)
    return cls._wrap(arr, mesh_axes, shared=shared)

  @classmethod
  @jax_tracebacks.api_boundary
  def from_batched_callback(cls, global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes,
                            data_callback: Callable[[Sequence[Index]], Sequence[Any]]
                            ) -> GlobalDeviceArray:
    """Like `from_callback`, but `data_callback` is called once.

    It gets the list of indices of all local devices (in
    `global_mesh.local_devices` order) and returns one array-like per index.
    """
    construct.require_callable(data_callback, "data_callback")
    lay, devices, indices = construct.placement(global_shape, global_mesh, mesh_axes)
    values = construct.checked_batch(data_callback(list(indices)), len(indices))
    arr, shared = construct.host_values_array(lay, global_mesh, mesh_axes, devices, indices,
                                              values)
    return cls._wrap(arr, mesh_axes, shared=shared)

  @classmethod
  @jax_tracebacks.api_boundary
  def from_batched_callback_with_devices(
      cls, global_shape: Shape, global_mesh: Mesh, mesh_axes: MeshAxes,
      data_callback: Callable[[Sequence[tuple[Index, tuple[Any, ...]]]], Sequence[jax.Array]],
  ) -> GlobalDeviceArray:
    """Like `from_batched_callback`, but the callback places the data itself.

    `data_callback` gets one `(index, devices)` entry per distinct local index
    (the devices holding that index, in mesh order) and returns one
    single-device `jax.Array` per local device, e.g. by calling
    `jax.device_put(data, device)`. The arrays may come in
    `global_mesh.local_devices` order or grouped per entry; they are matched to
    devices by where they live.
    """
    construct.require_callable(data_callback, "data_callback")
    lay, devices, indices = construct.placement(global_shape, global_mesh, mesh_axes)
    arrays = data_callback(construct.by_index(devices, indices))
    return cls(lay.shape, global_mesh, mesh_axes,
               construct.device_arrays(lay, global_mesh, mesh_axes, devices, arrays))

  # -- attributes ---------------------------------------------------------------

  @property
  def shape(self) -> Shape:
    return GdaShape(self._arr.shape, self)

  @property
  def dtype(self) -> np.dtype:
    return self._arr.dtype

  @property
  def ndim(self) -> int:
    return self._arr.ndim

  @property
  def size(self) -> int:
    return math.prod(self._arr.shape)

  @property
  def nbytes(self) -> int:
    return self.size * self.dtype.itemsize

  @property
  def mesh(self) -> Mesh:
    mesh = self._mesh
    if mesh is None:
      mesh = self._mesh = self._arr.sharding.mesh
    return mesh

  @property
  def mesh_axes(self) -> MeshAxes:
    axes = self._mesh_axes
    if axes is FROM_SHARDING:
      axes = self._mesh_axes = self._arr.sharding.spec
    return axes

  @property
  def sharding(self) -> NamedSharding:
    return self._arr.sharding

  @property
  def format(self):
    return self._arr.format

  @property
  def is_fully_replicated(self) -> bool:
    return self._arr.sharding.is_fully_replicated

  @property
  def is_fully_addressable(self) -> bool:
    return self._arr.sharding.is_fully_addressable

  @property
  def local_shards(self) -> list[Shard]:
    """The shards on this process's devices, in `mesh.local_devices` order.

    Their `data` are the GDA's own buffers: from here on, arrays the package
    does not see may be built over them (`family.py`).
    """
    arr = self._checked_array("read its local shards")
    shards = self._local_shards
    if shards is None:
      family.mark_shared(self)
      lay = layout(self.shape, self.mesh, self.mesh_axes)
      indices, rids = lay.indices, lay.replica_ids
      pos = {d: i for i, d in enumerate(self.mesh.devices.flat)}
      try:
        data = {next(iter(a.sharding.device_set)): a
                for a in jax_buffers.single_device_arrays(arr)}
        shards = [Shard(d, indices[pos[d]], rids[pos[d]], data[d])
                  for d in self.mesh.local_devices]
      except Exception:  # deleted by another thread meanwhile: say so
        self._checked_array("read its local shards")
        raise
      self._local_shards = shards
    return list(shards)

  addressable_shards = local_shards

  @property
  def global_shards(self) -> list[Shard]:
    """Every device's shard; `data` is None for devices of other processes."""
    local = {s.device: s for s in self.local_shards}
    lay = layout(self.shape, self.mesh, self.mesh_axes)
    indices, rids = lay.indices, lay.replica_ids
    return [local.get(d) or Shard(d, idx, rid, None)
            for d, idx, rid in zip(self.mesh.devices.flat, indices, rids, strict=True)]

  def local_data(self, i: int) -> jax.Array:
    """The data of local shard `i` (Python indexing) as a single-device array."""
    return local_shard_data(self.local_shards, i, "local_data")

  def addressable_data(self, index: int) -> Any:  # a single-device `jax.Array`
    """`jax.Array.addressable_data`: `local_data(index)`."""
    return local_shard_data(self.local_shards, index, "addressable_data")

  @property
  def _device_buffers(self) -> list[jax.Array]:
    """The GDA-era attribute: the local shards' data, in `mesh.local_devices` order."""
    return [cast(jax.Array, s.data) for s in self.local_shards]

  def block_until_ready(self) -> GlobalDeviceArray:
    try:
      self._arr.block_until_ready()
    except RuntimeError:
      self._checked_array("wait for it")  # deleted: raises the GDA-era error
      raise  # the computation failed
    return self

  def copy_to_host_async(self) -> None:
    """Start fetching the value to the host (a device_to_host transfer)."""
    moves.start_host_copy(self)

  def delete(self) -> None:
    """Free the device buffers; later uses raise `RuntimeError`."""
    jax_buffers.delete(self._arr)
    self._local_shards = None

  def is_deleted(self) -> bool:
    """True once deleted or donated, also through another array over one of
    its buffers (a shared GDA, `family.py`)."""
    arr = self._arr
    return arr.is_deleted() or (self._shared and jax_buffers.shard_deleted(arr))

  def devices(self) -> set:
    return self._arr.devices()

  def __copy__(self) -> GlobalDeviceArray:
    return type(self)._wrap(copy.copy(self._checked_array("copy it")), self.mesh_axes)

  def __deepcopy__(self, memo) -> GlobalDeviceArray:
    """A GDA with new device buffers holding the same values (as `jax.Array`)."""
    arr = copy.deepcopy(self._checked_array("copy it"), memo)
    return type(self)._wrap(arr, copy.deepcopy(self.mesh_axes, memo))

  def __array__(self, dtype: Any = None, context: None = None,
                copy: bool | None = None) -> np.ndarray:
    # As for the same `jax.Array`: the value is fetched once and kept on the
    # host; `copy=False` returns that copy (an error only where `dtype` needs
    # another one), `copy=True` a new one.
    return moves.to_host(self, dtype, copy)

  def __len__(self) -> int:
    if not self.shape:
      raise TypeError("len() of unsized object")
    return self.shape[0]

  def __eq__(self, other: object):
    raise NotImplementedError(
        "GlobalDeviceArray equality is intentionally unimplemented. "
        "Implement desired functionality explicitly, e.g. to check if all "
        "values are equal: "
        "pjit(lambda x, y: x == y, "
        "in_axis_resources=FROM_GDA, out_axis_resources=None)")

  __ne__ = __eq__  # `jax.Array` declares `__ne__` abstract; `!=` keeps the same error
  __hash__ = None  # type: ignore[assignment]

  def __str__(self) -> str:
    return f"GlobalDeviceArray(shape={self.shape}, dtype={self.dtype}{self._deleted_note()})"

  def __repr__(self) -> str:
    return (f"GlobalDeviceArray(shape={self.shape}, dtype={self.dtype}, "
            f"global_mesh_shape={dict(self.mesh.shape)}, "
            f"mesh_axes={old_spec_repr(self.mesh_axes)}{self._deleted_note()})")

  def _deleted_note(self) -> str:
    # Stock `jax.Array` raises in repr once deleted; a notebook must still be
    # able to display a donated GDA, so it says so instead.
    return ", deleted=True" if self.is_deleted() else ""

  def __reduce__(self):
    """Pickle by value, as stock does for a sharded `jax.Array`.

    The value is fetched (an implicit device_to_host transfer) and stored
    with the mesh's device ids, axis names and `mesh_axes`. Unpickled where
    those devices exist, it is a GDA on the same mesh; elsewhere a
    `jax.Array` on the default device, as stock unpickles any array.
    """
    value = self.__array__()
    mesh = self.mesh
    ids = np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices)
    return (_unpickle, (value, ids, tuple(mesh.axis_names), self.mesh_axes,
                        self._arr.aval.weak_type))

  def _repr_html_(self) -> str:
    from jax_sharding_ext._notebook.html import gda_html
    return gda_html(self)

  def __treescope_ndarray_adapter__(self):
    from jax_sharding_ext._notebook.treescope import adapter
    return adapter()


def _unpickle(value: np.ndarray, device_ids: np.ndarray, axis_names: tuple,
              mesh_axes: MeshAxes, weak_type: bool = False):
  by_id = {d.id: d for d in jax.devices()}
  if not all(int(i) in by_id for i in device_ids.flat):
    out = jax.numpy.asarray(value)
    return jax_buffers.weakly_typed(out) if weak_type else out
  mesh = Mesh(np.vectorize(lambda i: by_id[int(i)], otypes=[object])(device_ids), axis_names)
  gda = GlobalDeviceArray.from_callback(value.shape, mesh, mesh_axes, lambda idx: value[idx])
  if weak_type:  # as stock keeps it: `pickle.loads(pickle.dumps(x)) + f16` stays f16
    gda = GlobalDeviceArray.from_jax_array(jax_buffers.weakly_typed(gda.to_jax_array()))
  return gda


_new = object.__new__


def rebuild(key: Any, children: Sequence[jax.Array]) -> GlobalDeviceArray:
  """A GDA over `children[0]`: the unflatten function of the GDA's dispatch
  registry node (`key`, its node data, is unused), so on the hot path of every
  warm call with the output flag on: `_init` inlined, the mesh and mesh axes
  read from `arr.sharding` on first use."""
  del key
  self = _new(GlobalDeviceArray)
  self._arr, = children
  self._mesh = None
  self._mesh_axes = FROM_SHARDING
  self._local_shards = None
  self._host_fetched = False
  self._shared = False
  self._key = None
  return self
