"""`jax.experimental.multihost_utils` for pytrees that hold `GlobalDeviceArray`s.

The API of stock `jax.experimental.multihost_utils`, with the same
signatures and defaults (checked against JAX 0.10.2 and 0.12): the six
functions of JAX's API reference, the GDA era's
`reached_preemption_sync_point`, and stock's `live_devices` /
`ProcessFailureError`. (The primitives and rules behind stock's two
conversions inside a trace are not API; reading one as an attribute of this
module gives stock's object.) The functions that take data accept pytrees
mixing `GlobalDeviceArray`, `jax.Array` and numpy; each is stock's function
with a zero-copy conversion at the boundary (a GDA is handed to stock as its
`jax.Array` view, and a `jax.Array` coming back for a GDA leaf is wrapped as
a GDA again). All communication is stock's, over JAX's distributed runtime.

GDA leaves keep the GDA-era semantics:

- `host_local_array_to_global_array` / `global_array_to_host_local_array`:
  GDA in, GDA out (numpy / `jax.Array` in: `jax.Array` out, as stock).
- `process_allgather`: a GDA's global value as numpy on every process;
  `tiled` does not apply to it (the GDA-era docstring: "This does not affect
  GDA inputs as the GDA output will always be concatenated").
- `broadcast_one_to_all` / `assert_equal`: a GDA on one process's devices is
  that process's value; a GDA spanning processes is already global and is
  refused by `broadcast_one_to_all` with a `ValueError`. `assert_equal`
  compares a fully replicated GDA spanning processes by one local replica per
  process (stock compares nothing for such an array) and refuses one sharded
  across processes with a `ValueError`.

Safe whatever each process passes: `assert_equal`, `process_allgather` and
`broadcast_one_to_all` first make the processes agree on the tree's
structure, shapes and dtypes (one small fixed-size gather), so a difference
is an error naming the path, raised on every process, never processes
aborted in mismatched collectives; `assert_equal` then names the leaf whose
values differ and shows them. The conversions check their arguments (a
`global_mesh` that is no `Mesh`, a spec that is no `PartitionSpec`, uses an
axis twice, names one the mesh lacks or partitions a dimension beyond its
leaf's rank) and raise a
`TypeError` / `ValueError` naming the argument or the leaf.

Porting: `from jax.experimental import multihost_utils` becomes
`from jax_sharding_ext import multihost_utils`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils as _stock

from jax_sharding_ext import _public
from jax_sharding_ext._array import gda as _gda
from jax_sharding_ext._jax import tables as _jax_tables
from jax_sharding_ext._jax import tracebacks as _tracebacks
from jax_sharding_ext._multihost import agree as _agree
from jax_sharding_ext._multihost import checks as _checks

# Stock names that take no array data: the same objects.
live_devices = _stock.live_devices
reached_preemption_sync_point = _stock.reached_preemption_sync_point
sync_global_devices = _stock.sync_global_devices

# Stock names not every supported JAX has: present here exactly when stock
# has them.
_optional_stock_names = _jax_tables.optional_multihost_names()
if "ProcessFailureError" in _optional_stock_names:
  ProcessFailureError = _optional_stock_names["ProcessFailureError"]

# The API: the six functions of stock's API reference, the GDA era's
# `reached_preemption_sync_point`, and stock's fault-tolerance pair (the
# error where this JAX has it).
__all__ = [
    *_optional_stock_names,
    "assert_equal",
    "broadcast_one_to_all",
    "global_array_to_host_local_array",
    "host_local_array_to_global_array",
    "live_devices",
    "process_allgather",
    "reached_preemption_sync_point",
    "sync_global_devices",
]

# The machinery behind stock's two conversions inside a trace (their
# primitives, eager rules and abstract-evaluation and batching rules): not
# API, neither stock's documented one nor the GDA era's; an attribute of
# this module still gives stock's object, for code that reached for it.
_STOCK_INTERNALS = frozenset({
    "host_local_array_to_global_array_p", "global_array_to_host_local_array_p",
    "host_local_array_to_global_array_impl", "global_array_to_host_local_array_impl",
    "ltg_abstract_eval", "ltg_batcher", "gtl_abstract_eval",
})


def __getattr__(name: str) -> Any:
  if name in _STOCK_INTERNALS and hasattr(_stock, name):
    return getattr(_stock, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# `dir()`, `help()` and tab completion list the public names, not the modules
# and helpers used here.
__dir__ = _public.module_dir(__name__)

def _is_gda(x: Any) -> bool:
  return isinstance(x, _gda.GlobalDeviceArray)


def _views(tree: Any) -> tuple[Any, list[bool]]:
  """`tree` with each GDA leaf as its zero-copy `jax.Array`, and which were GDAs."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  was_gda = [_is_gda(x) for x in leaves]
  views = [x.to_jax_array() if g else x for x, g in zip(leaves, was_gda, strict=True)]
  return jax.tree_util.tree_unflatten(treedef, views), was_gda


def _as_gda(x: Any) -> Any:
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    return _gda.GlobalDeviceArray.from_jax_array(x)
  return x  # traced (inside jit): stays what the trace made it


def _rewrap(tree: Any, was_gda: list[bool]) -> Any:
  """GDA leaves back as GDAs (zero-copy); other leaves as stock returned them."""
  if not any(was_gda):
    return tree
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return jax.tree_util.tree_unflatten(
      treedef, [_as_gda(x) if g else x for x, g in zip(leaves, was_gda, strict=True)])


def _host_value(x: Any, fn: str) -> Any:
  """A GDA on this process's devices as its numpy value (an explicit fetch)."""
  if not _is_gda(x):
    return x
  if not x.is_fully_addressable:
    raise ValueError(
        f"`{fn}` takes host-local values, but got a GlobalDeviceArray of shape "
        f"{x.shape} that spans {len({d.process_index for d in x.mesh.devices.flat})} "
        "processes: it is already global, so there is nothing to broadcast. Use "
        "`process_allgather(gda)` for its value on every process, or pass a "
        "host-local value (e.g. `np.asarray(gda.local_data(0))`).")
  return np.asarray(jax.device_get(x))


@_tracebacks.api_boundary
def host_local_array_to_global_array(
    local_inputs: Any, global_mesh: jax.sharding.Mesh, pspecs: Any):
  """Each process's host-local values as one global array per leaf.

  Stock `multihost_utils.host_local_array_to_global_array` (see its
  docstring), for pytrees that may hold `GlobalDeviceArray` leaves: a GDA
  leaf comes back as a GDA over `global_mesh`; numpy and `jax.Array` leaves
  come back as stock returns them (`jax.Array`). `pspecs` is a pytree prefix
  of `local_inputs` (one `PartitionSpec` may cover a whole batch dict); a
  `None` in it means replicated (`PartitionSpec()`), as in GDA-era pjit.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('data',))
    >>> batch = {"x": np.ones((8, 4)), "y": np.zeros((8,))}   # this host's rows
    >>> g = host_local_array_to_global_array(batch, mesh, P("data"))
    >>> g["x"].shape, g["x"].sharding.spec   # one process: its rows are all the rows
    ((8, 4), P('data',))

    On N processes each passing 8 rows, `g["x"].shape` is `(8 * N, 4)`. A
    GDA leaf comes back as a GDA:

    >>> local = jse.GlobalDeviceArray.from_callback((8,), mesh, P('data'),
    ...                                             lambda index: np.arange(8.0)[index])
    >>> type(host_local_array_to_global_array(local, mesh, P('data'))).__name__
    'GlobalDeviceArray'
  """
  views, was_gda = _views(local_inputs)
  pspecs = _checks.none_as_replicated(pspecs)
  views = _checks.checked_inputs("host_local_array_to_global_array", views, global_mesh, pspecs)
  out = _stock.host_local_array_to_global_array(views, global_mesh, pspecs)
  return _rewrap(out, was_gda)


@_tracebacks.api_boundary
def global_array_to_host_local_array(
    global_inputs: Any, global_mesh: jax.sharding.Mesh, pspecs: Any):
  """Each global array's part on this process's devices, per leaf.

  Stock `multihost_utils.global_array_to_host_local_array`, for pytrees that
  may hold `GlobalDeviceArray` leaves: a GDA leaf comes back as a GDA over
  `global_mesh.local_mesh`; other leaves as stock returns them. A `None` in
  `pspecs` means replicated (`PartitionSpec()`).

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('data',))
    >>> params = jse.GlobalDeviceArray.from_callback((8, 2), mesh, P('data'),
    ...                                              lambda index: np.ones((8, 2))[index])
    >>> local = global_array_to_host_local_array({"w": params}, mesh, {"w": P('data')})
    >>> type(local["w"]).__name__, local["w"].shape   # one process: this host has it all
    ('GlobalDeviceArray', (8, 2))
  """
  fn = "global_array_to_host_local_array"
  views, was_gda = _views(global_inputs)
  given, pspecs = pspecs, _checks.none_as_replicated(pspecs)
  views = _checks.checked_inputs(fn, views, global_mesh, pspecs)
  try:
    out = _stock.global_array_to_host_local_array(views, global_mesh, pspecs)
  except (NotImplementedError, ValueError) as e:
    # The reshard a `None` (replicated) asks for, refused: stock refuses `None`
    # itself with a ValueError naming `pspecs`, and so does this function.
    # (JAX raises NotImplementedError for an input it cannot reshard, and a
    # ValueError where the reshard would need cross-host transfers.)
    if not _checks.has_none(given):
      raise
    raise _checks.none_not_replicable(fn, global_mesh, e) from None
  return _rewrap(out, was_gda)


@_tracebacks.api_boundary
def process_allgather(in_tree: Any, tiled: bool = False) -> Any:
  """Gather data from across processes, as numpy.

  Args:
    in_tree: a pytree of arrays. A `GlobalDeviceArray` or a global
      (non-fully-addressable) `jax.Array` gives its global value on every
      process; every other leaf must have the same shape on every process.
    tiled: for host-local leaves, concatenate (True) or stack along a new
      leading axis (False, the default). Does not affect GDA leaves or global
      `jax.Array` leaves, whose output is always the global value (as in
      JAX 0.4.x; stock now raises for a global `jax.Array` with `tiled=False`).

  Returns:
    A pytree of numpy arrays.

  Raises:
    ValueError: on every process, naming the path, when the processes' trees
      differ in structure, shapes or dtypes (they first agree on that with a
      small fixed-size gather; stock's gather would abort the processes).
    TypeError: naming the leaf, for a leaf that is not an array.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
    ...                                           lambda index: np.arange(8)[index])
    >>> out = process_allgather({"gda": gda, "step": np.int32(3)})
    >>> out["gda"]   # the global value, on every process
    array([0, 1, 2, 3, 4, 5, 6, 7], dtype=int32)
    >>> out["step"]   # one entry per process (tiled=False stacks them)
    array([3], dtype=int32)
  """
  _agree.agree_on_layout(in_tree, "process_allgather")

  def one(x):
    if _is_gda(x):
      if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
      return _stock.process_allgather(x.to_jax_array(), tiled=True)
    if (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        and not x.is_fully_addressable):
      return _stock.process_allgather(x, tiled=True)  # already global: its value
    return _stock.process_allgather(x, tiled=tiled)
  return jax.tree_util.tree_map(one, in_tree)


@_tracebacks.api_boundary
def broadcast_one_to_all(in_tree: Any, is_source: bool | None = None) -> Any:
  """Broadcast data from a source process (process 0 by default) to all others.

  Stock `multihost_utils.broadcast_one_to_all`: returns numpy leaves. A
  `GlobalDeviceArray` on the calling process's devices is its value there; a
  GDA spanning processes raises `ValueError` (it is already global).

  Args:
    in_tree: a pytree of arrays, the same structure, shapes and dtypes on
      every process (checked first, with a small fixed-size gather: when they
      differ, every process raises `ValueError` naming the path).
    is_source: whether this process is the source; None means process 0.

  Returns:
    The source's `in_tree`, as numpy leaves, on every process.

  Example:
    >>> seed = 1234 if jax.process_index() == 0 else -1
    >>> int(broadcast_one_to_all(np.int32(seed)))   # process 0's value everywhere
    1234
  """
  _agree.agree_on_layout(in_tree, "broadcast_one_to_all")
  host = jax.tree_util.tree_map(lambda x: _host_value(x, "broadcast_one_to_all"), in_tree)
  return _stock.broadcast_one_to_all(host, is_source=is_source)


@_tracebacks.api_boundary
def assert_equal(in_tree, fail_message: str = ''):
  """Verify that every process has the same pytree of values.

  Stock `multihost_utils.assert_equal`, safe whatever the processes pass:
  they first agree on the tree's structure and each leaf's dtype and shape
  (a fixed-size fingerprint gathered from every process), then on the values
  (one digest per process, and only the leaves that differ are gathered). So
  processes whose trees differ in structure, shape or dtype never enter
  mismatched collectives; every process raises the same `AssertionError`,
  starting with `fail_message`, that names the path (as
  `jax.tree_util.keystr` spells it) where the trees first differ and shows
  what each process has there: both structures, dtypes and shapes, or for a
  value the first differing index, each process's element there and how many
  elements differ. Values compare as numpy's `==`, except that NaN equals NaN
  (processes that agree on a NaN agree); leaves of 64-bit dtypes compare at
  full precision.

  A `GlobalDeviceArray` on one process's devices counts as that process's
  value. A fully replicated GDA spanning processes is compared replica by
  replica: each process contributes the data of its first local shard (its
  local replica), so a "replicated" array that the hosts filled differently
  (e.g. each from its own seed) fails. This is stricter than stock, which
  compares nothing for a global `jax.Array`; a fully replicated global
  `jax.Array` leaf keeps stock's behaviour (its replicas are not compared).
  A GDA or `jax.Array` sharded across processes, or a leaf that is not an
  array of numbers or booleans, raises `ValueError` / `TypeError` naming the
  leaf, on every process.

  Example:
    >>> config = {"lr": np.float32(0.1), "layers": np.int32(4)}
    >>> assert_equal(config, "hosts disagree on the config")   # returns None when equal
    >>> assert_equal({"seed": np.int32(jax.process_index())})   # differs if processes > 1
  """
  _agree.check_equal(in_tree, fail_message)
