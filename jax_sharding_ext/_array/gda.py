"""`GlobalDeviceArray`: the GDA-era API as a zero-copy view over `jax.Array`.

A `GlobalDeviceArray` is a `jax.Array` (a Python subclass, so libraries that
check `isinstance(x, jax.Array)` take it) that holds exactly one private
`jax.Array` whose sharding is `NamedSharding(mesh, spec)`, plus the
`mesh_axes` the user gave. Its device buffers *are* that array's buffers:
`from_jax_array` / `to_jax_array` move nothing (they wrap and return other
`jax.Array` objects over the same buffers, see `family.py`), and
handing a GDA to `jax.jit` passes those buffers straight to the executable
when the sharding matches.

This module holds the class, its constructor and zero-copy conversions, its
life (deletion, donation, copies, pickling) and its text. Its parts hold the
rest, one responsibility each: the constructors from data callbacks
(`_FromCallbacks`, `construct.py`), what it says about its global array and
placement (`_Placement`, `placement.py`), its shards (`_ShardAccess`,
`shards.py`) and the rest of `jax.Array`'s surface (`_ArraySurface`,
`surface.py`). The class takes their members as its own
(`_public.assembled`) rather than inheriting them, so `help()`, its method
resolution order and reprs show `GlobalDeviceArray` and `jax.Array` alone;
type checkers see the parts as bases.

Stock JAX accepts it through its extension tables (`_dispatch/handlers.py`;
the output flag in `_dispatch/output.py`) as a committed array; every
transfer of its data goes through `_transfers/moves.py`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_sharding_ext._array import construct, family, surface
from jax_sharding_ext._array.checks import check_buffers, extended_dtype_error
from jax_sharding_ext._array.construct import _FromCallbacks
from jax_sharding_ext._array.placement import _Placement
from jax_sharding_ext._array.records import FROM_SHARDING, Shard
from jax_sharding_ext._array.shard_math import MeshAxes, Shape, layout, old_spec_repr
from jax_sharding_ext._array.shards import _ShardAccess
from jax_sharding_ext._array.surface import _ArraySurface
from jax_sharding_ext._edit import STATE, uninstalled_error
from jax_sharding_ext._jax import buffers as jax_buffers
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import tracebacks as jax_tracebacks
from jax_sharding_ext._public import assembled, public
from jax_sharding_ext._transfers import moves

_USE = "use it in a JAX operation"

if TYPE_CHECKING:  # what `assembled` gives the class at run time, as bases
  class _Assembled(_FromCallbacks, _Placement, _ShardAccess, _ArraySurface, jax.Array): ...
else:
  _Assembled = jax.Array


@assembled(_FromCallbacks, _Placement, _ShardAccess, _ArraySurface)
@public("jax_sharding_ext")
class GlobalDeviceArray(_Assembled):
  """A logical array sharded across the devices (and processes) of a mesh.

  Each process holds a `GlobalDeviceArray` for the same global array; it can
  read the shape, dtype and sharding of the whole, pass it to `jax.jit`,
  `pjit`, `jax.numpy`, `shard_map`, and read the data of the shards on its own
  devices (`local_shards`). It is a zero-copy view over a `jax.Array`:
  `to_jax_array()` returns that array and `from_jax_array()` wraps one.
  It has `jax.Array`'s operators, methods and properties too (forwarded to
  that view; their results are `jax.Array`s), and `isinstance(gda,
  jax.Array)` is True.

  Args:
    global_shape: shape of the global array.
    global_mesh: the mesh of every participating device.
    mesh_axes: at most one entry per dimension: a mesh axis name, a tuple of
      names (split over their product), or None (not split); or a
      `PartitionSpec`.
    device_buffers: one single-device `jax.Array` per device of
      `global_mesh.local_devices`, in that order.

  Raises:
    ValueError: the buffers' devices, shard shapes or dtypes do not match
      the mesh and `mesh_axes` (the message names what differs), or
      `mesh_axes` names an axis the mesh lacks or uses one twice.
    TypeError: a shape entry is not an int, or a buffer is not a `jax.Array`.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
    >>> data = np.arange(16).reshape(8, 2)
    >>> gda = GlobalDeviceArray.from_callback((8, 2), mesh, P('x', 'y'),
    ...                                       lambda index: data[index])
    >>> gda
    GlobalDeviceArray(shape=(8, 2), dtype=int32,
      global_mesh_shape={'x': 4, 'y': 2}, mesh_axes=PartitionSpec('x', 'y'))
    >>> gda.local_shards[0].index
    (slice(0, 2, None), slice(0, 1, None))
    >>> out = jax.jit(lambda x: x * 2)(gda)   # stock jit, following the GDA's sharding
    >>> out.sharding == gda.sharding
    True

    The constructor itself takes one buffer per local device:

    >>> buffers = [jax.device_put(data[s.index], s.device) for s in gda.local_shards]
    >>> GlobalDeviceArray((8, 2), mesh, P('x', 'y'), buffers).shape
    (8, 2)
  """

  # `_init` and `rebuild` (the hot path of every GDA output) set every slot.
  __slots__ = ("_arr", "_node", "_mesh", "_mesh_axes", "_local_shards", "_host_fetched",
               "_shared", "_later", "__weakref__")
  if TYPE_CHECKING:  # for type checkers only: `help()` lists no private annotations
    _arr: Any  # the private `jax.Array` (its sharding a `NamedSharding`)
    _mesh: Mesh | None
    _mesh_axes: Any
    _local_shards: list[Shard] | None
    _host_fetched: bool
    # How jit's dispatch keys it: None while it is its buffers' only owner, else
    # `KEYED` for good (`_jax/dispatch.py`); `_shared` and `_later` are set
    # when it is keyed (`mark_keyed`), and read only then.
    _node: Any
    _shared: bool  # arrays outside it may hold its buffers (`family.py`)
    _later: tuple[Any, ...] | None  # its shards to watch (`buffers.watched_shards`)
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
    # Its buffers' only owner until marked otherwise (`family.py`).
    self._node = None

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

    `mesh_axes` of the result is `arr.sharding.spec`. A GDA is returned as it
    is. The two share their buffers: donating or deleting one deletes both.

    Raises:
      ValueError: the sharding is not a `NamedSharding`.
      TypeError: `arr` is not a concrete `jax.Array` (a tracer, numpy).
      RuntimeError: `arr` was deleted or donated.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> arr = jax.device_put(np.arange(8), jax.sharding.NamedSharding(mesh, P('x')))
      >>> gda = GlobalDeviceArray.from_jax_array(arr)
      >>> gda.mesh_axes, gda.local_data(0).unsafe_buffer_pointer() == (
      ...     arr.addressable_data(0).unsafe_buffer_pointer())
      (P('x',), True)
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

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8)[index])
      >>> arr = gda.to_jax_array()
      >>> type(arr) is GlobalDeviceArray, arr.sharding == gda.sharding
      (False, True)
      >>> arr.delete()
      >>> gda.is_deleted()
      True
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
    if jax_buffers.view_freed(self):
      raise RuntimeError(
          f"GlobalDeviceArray has been deleted. Cannot {action}: this "
          f"GlobalDeviceArray (shape={self.shape}, dtype={self.dtype}) has been "
          "deleted or donated. After `jax.jit(..., donate_argnums=...)` use the "
          "function's output instead of the donated input.")
    return self._arr

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

  def block_until_ready(self) -> GlobalDeviceArray:
    """Wait until the computation that produces this GDA has finished; return it.

    Raises the computation's error if it failed, and the GDA-era
    `RuntimeError` if the GDA was deleted or donated.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8)[index])
      >>> gda.block_until_ready() is gda
      True
    """
    try:
      self._arr.block_until_ready()
    except RuntimeError:
      self._checked_array("wait for it")  # deleted: raises the GDA-era error
      raise  # the computation failed
    return self

  def copy_to_host_async(self) -> None:
    """Start fetching the value to the host (a device_to_host transfer).

    A later `np.asarray(gda)` reads the host copy. The transfer guard judges
    the fetch and the transfer ledger records it, as for `np.asarray`.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8)[index])
      >>> gda.copy_to_host_async()
      >>> np.asarray(gda)
      array([0, 1, 2, 3, 4, 5, 6, 7], dtype=int32)
    """
    moves.start_host_copy(self)

  def delete(self) -> None:
    """Free the device buffers; later uses raise `RuntimeError`.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8)[index])
      >>> gda.delete()
      >>> gda.local_data(0)
      Traceback (most recent call last):
      RuntimeError: GlobalDeviceArray has been deleted. ...
    """
    jax_buffers.delete(self._arr)
    self._local_shards = None

  def is_deleted(self) -> bool:
    """Return True once deleted or donated, also through another array over
    its buffers (e.g. its `to_jax_array()` donated to a `jax.jit` call).

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> gda = GlobalDeviceArray.from_callback((8,), mesh, P('x'),
      ...                                       lambda index: np.arange(8.0)[index])
      >>> step = jax.jit(lambda x: x + 1, donate_argnums=0)
      >>> out = step(gda)
      >>> gda.is_deleted(), out.is_deleted()
      (True, False)
    """
    return jax_buffers.view_freed(self)

  def __copy__(self) -> GlobalDeviceArray:
    return type(self)._wrap(copy.copy(self._checked_array("copy it")), self.mesh_axes)

  def __deepcopy__(self, memo) -> GlobalDeviceArray:
    """A GDA with new device buffers holding the same values (as `jax.Array`)."""
    arr = copy.deepcopy(self._checked_array("copy it"), memo)
    return type(self)._wrap(arr, copy.deepcopy(self.mesh_axes, memo))

  # (JAX 0.8.x's `basearray.pyi` declares no `context`; JAX 0.10 does.)
  def __array__(self, dtype: Any = None, context: None = None,  # type: ignore[override, unused-ignore]
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
    mesh_axes, as_spec = self.mesh_axes, False
    if type(mesh_axes) is PartitionSpec and not (getattr(mesh_axes, "unreduced", None)
                                                 or getattr(mesh_axes, "reduced", None)):
      # A `PartitionSpec` pickles in a form that only JAX releases close to
      # the writer's read (jax 0.8.x names a function 0.10.x lacks); its
      # entries (None, axis names, tuples of them) read on every release.
      mesh_axes, as_spec = tuple(mesh_axes), True
    return (_unpickle, (value, ids, tuple(mesh.axis_names), mesh_axes,
                        self._arr.aval.weak_type, as_spec))

  def _repr_html_(self) -> str:
    from jax_sharding_ext._notebook.html import gda_html
    return gda_html(self)

  def __treescope_ndarray_adapter__(self):
    from jax_sharding_ext._notebook.treescope import adapter
    return adapter()


surface.taken_by(GlobalDeviceArray)


def _unpickle(value: np.ndarray, device_ids: np.ndarray, axis_names: tuple,
              mesh_axes: MeshAxes, weak_type: bool = False, as_spec: bool = False):
  if as_spec and isinstance(mesh_axes, tuple):  # a `PartitionSpec`'s entries
    mesh_axes = PartitionSpec(*mesh_axes)
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
  self._node = None
  return self
