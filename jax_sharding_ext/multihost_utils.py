"""`jax.experimental.multihost_utils` for pytrees that hold `GlobalDeviceArray`s.

Every public name of stock `jax.experimental.multihost_utils`, with the same
signature and defaults (checked against JAX 0.10.2 and 0.12). The functions
that take data accept pytrees mixing `GlobalDeviceArray`, `jax.Array` and
numpy; each is stock's function with a zero-copy conversion at the boundary
(a GDA is handed to stock as its `jax.Array` view, and a `jax.Array` coming
back for a GDA leaf is wrapped as a GDA again). All communication is stock's,
over JAX's distributed runtime.

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

Porting: `from jax.experimental import multihost_utils` becomes
`from jax_sharding_ext import multihost_utils`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils as _stock
from jax.sharding import NamedSharding, PartitionSpec

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.records import is_spec_leaf
from jax_sharding_ext._jax import tracebacks as jax_tracebacks

# Stock names that take no array data: the same objects.
ProcessFailureError = _stock.ProcessFailureError
live_devices = _stock.live_devices
reached_preemption_sync_point = _stock.reached_preemption_sync_point
sync_global_devices = _stock.sync_global_devices
host_local_array_to_global_array_p = _stock.host_local_array_to_global_array_p
global_array_to_host_local_array_p = _stock.global_array_to_host_local_array_p
ltg_abstract_eval = _stock.ltg_abstract_eval
ltg_batcher = _stock.ltg_batcher
gtl_abstract_eval = _stock.gtl_abstract_eval

__all__ = [
    "ProcessFailureError",
    "assert_equal",
    "broadcast_one_to_all",
    "global_array_to_host_local_array",
    "global_array_to_host_local_array_impl",
    "global_array_to_host_local_array_p",
    "gtl_abstract_eval",
    "host_local_array_to_global_array",
    "host_local_array_to_global_array_impl",
    "host_local_array_to_global_array_p",
    "live_devices",
    "ltg_abstract_eval",
    "ltg_batcher",
    "process_allgather",
    "reached_preemption_sync_point",
    "sync_global_devices",
]


def _is_gda(x: Any) -> bool:
  return isinstance(x, GlobalDeviceArray)


def _views(tree: Any) -> tuple[Any, list[bool]]:
  """`tree` with each GDA leaf as its zero-copy `jax.Array`, and which were GDAs."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  was_gda = [_is_gda(x) for x in leaves]
  views = [x.to_jax_array() if g else x for x, g in zip(leaves, was_gda, strict=True)]
  return jax.tree_util.tree_unflatten(treedef, views), was_gda


def _as_gda(x: Any) -> Any:
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    return GlobalDeviceArray.from_jax_array(x)
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


def _impl_keeping_gdas(stock_impl, arr, global_mesh, pspec):
  if not _is_gda(arr):
    return stock_impl(arr, global_mesh=global_mesh, pspec=pspec)
  return _as_gda(stock_impl(arr.to_jax_array(), global_mesh=global_mesh, pspec=pspec))


def host_local_array_to_global_array_impl(
    arr: Any, *, global_mesh: jax.sharding.Mesh, pspec: Any):
  """Stock's impl, with a GDA in giving a GDA out."""
  return _impl_keeping_gdas(_stock.host_local_array_to_global_array_impl, arr,
                            global_mesh, pspec)


def global_array_to_host_local_array_impl(
    arr: Any, *, global_mesh: jax.sharding.Mesh, pspec: Any):
  """Stock's impl, with a GDA in giving a GDA (on the local mesh) out."""
  return _impl_keeping_gdas(_stock.global_array_to_host_local_array_impl, arr,
                            global_mesh, pspec)


@jax_tracebacks.api_boundary
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
    >>> batch = {"x": np.ones((4, 8)), "y": np.zeros((4,))}  # this host's rows
    >>> g = host_local_array_to_global_array(batch, mesh, P("data"))
  """
  views, was_gda = _views(local_inputs)
  pspecs = _none_as_replicated(pspecs)
  views = _checked_local_inputs(views, global_mesh, pspecs)
  out = _stock.host_local_array_to_global_array(views, global_mesh, pspecs)
  return _rewrap(out, was_gda)


def _none_as_replicated(pspecs: Any) -> Any:
  """`None` in `pspecs` as `PartitionSpec()`: replicated, as `None` meant in
  GDA-era pjit axis resources (stock multihost_utils rejects `None`)."""
  return jax.tree_util.tree_map(lambda s: PartitionSpec() if s is None else s,
                                pspecs, is_leaf=lambda x: x is None)


def _checked_local_inputs(views: Any, global_mesh: Any, pspecs: Any) -> Any:
  """Check each local leaf divides over the local mesh (naming the leaf), and
  place a concrete device array of another sharding on the local sharding first
  (stock fails inside `batched_device_put` for a multi-device array it must
  slice). The check reads only shapes, which are static, so it also runs on
  traced leaves; a traced leaf is handed to stock unchanged."""
  spec_def: Any  # a PyTreeDef (jaxlib publishes no type for it)
  path_specs, spec_def = jax.tree_util.tree_flatten_with_path(pspecs, is_leaf=is_spec_leaf)
  try:
    subtrees = spec_def.flatten_up_to(views)
  except ValueError:
    return views  # not a prefix: stock raises its own error
  local_mesh = global_mesh.local_mesh
  spec_paths, specs = zip(*path_specs, strict=True) if path_specs else ((), ())
  out = []
  for path, spec, sub in zip(spec_paths, specs, subtrees, strict=True):
    if not isinstance(spec, PartitionSpec):
      out.append(sub)  # None or junk: stock's error names it
      continue
    local = NamedSharding(local_mesh, spec)

    def one(subpath, x, path=path, spec=spec, local=local):
      shape = np.shape(x)
      for dim, entry in enumerate(spec):
        names = entry if isinstance(entry, tuple) else (entry,)
        parts = int(np.prod([local_mesh.shape[n] for n in names
                             if n is not None and n in local_mesh.shape]))
        if dim < len(shape) and shape[dim] % parts:
          raise ValueError(
              f"`host_local_array_to_global_array`: the local input "
              f"{jax.tree_util.keystr((*path, *subpath)) or 'local_inputs'} of shape "
              f"{shape} cannot be globalised with pspec {spec}: its dimension {dim} "
              f"({shape[dim]}) must divide evenly over this process's {parts} "
              f"devices along {entry!r} (local mesh {dict(local_mesh.shape)}). "
              "Give every process a local batch whose size is a multiple of that.")
      if isinstance(x, jax.core.Tracer):
        return x  # traced (inside jit, vmap, grad): stock's primitive takes it as is
      if (isinstance(x, jax.Array) and x.is_fully_addressable
          and len(x.sharding.device_set) > 1
          and not x.sharding.is_equivalent_to(local, x.ndim)):
        return jax.device_put(x, local)
      return x
    out.append(jax.tree_util.tree_map_with_path(one, sub))
  return jax.tree_util.tree_unflatten(spec_def, out)


@jax_tracebacks.api_boundary
def global_array_to_host_local_array(
    global_inputs: Any, global_mesh: jax.sharding.Mesh, pspecs: Any):
  """Each global array's part on this process's devices, per leaf.

  Stock `multihost_utils.global_array_to_host_local_array`, for pytrees that
  may hold `GlobalDeviceArray` leaves: a GDA leaf comes back as a GDA over
  `global_mesh.local_mesh`; other leaves as stock returns them. A `None` in
  `pspecs` means replicated (`PartitionSpec()`).
  """
  views, was_gda = _views(global_inputs)
  out = _stock.global_array_to_host_local_array(
      views, global_mesh, _none_as_replicated(pspecs))
  return _rewrap(out, was_gda)


@jax_tracebacks.api_boundary
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
  """
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


@jax_tracebacks.api_boundary
def broadcast_one_to_all(in_tree: Any, is_source: bool | None = None) -> Any:
  """Broadcast data from a source process (process 0 by default) to all others.

  Stock `multihost_utils.broadcast_one_to_all`: returns numpy leaves. A
  `GlobalDeviceArray` on the calling process's devices is its value there; a
  GDA spanning processes raises `ValueError` (it is already global).

  Args:
    in_tree: a pytree of arrays, the same shapes on every process.
    is_source: whether this process is the source; None means process 0.
  """
  host = jax.tree_util.tree_map(lambda x: _host_value(x, "broadcast_one_to_all"), in_tree)
  return _stock.broadcast_one_to_all(host, is_source=is_source)


@jax_tracebacks.api_boundary
def assert_equal(in_tree, fail_message: str = ''):
  """Verify that every process has the same pytree of values.

  Stock `multihost_utils.assert_equal`; raises `AssertionError` starting with
  `fail_message` on every process when any process's value differs. A
  `GlobalDeviceArray` on one process's devices counts as that process's
  value. A fully replicated GDA spanning processes is compared replica by
  replica: each process contributes the data of its first local shard (its
  local replica), and these are gathered and compared across processes, so a
  "replicated" array that the hosts filled differently (e.g. each from its
  own seed) fails. This is stricter than stock, which compares nothing for a
  global `jax.Array` (each process checks its own replica against itself);
  a plain `jax.Array` leaf keeps stock's behaviour. A GDA sharded across
  processes raises `ValueError` (there is no per-process value).
  """
  def one(x):
    if not _is_gda(x) or x.is_fully_addressable:
      return _host_value(x, "assert_equal")
    if not x.is_fully_replicated:
      # Stock compares this process's first shard with the global value: a
      # broadcasting error, or for some shapes a silently wrong comparison.
      raise ValueError(
          f"`assert_equal` got a GlobalDeviceArray of shape {x.shape} sharded as "
          f"{x.mesh_axes} across processes: each process holds a different part "
          "of it, so there is no per-process value to compare. Compare "
          "`process_allgather(gda)` (its global value, the same everywhere), or a "
          "fully replicated GDA.")
    # This process's replica as its host value: stock gathers every process's
    # and compares them all.
    return np.asarray(jax.device_get(x.local_data(0)))
  return _stock.assert_equal(jax.tree_util.tree_map(one, in_tree), fail_message)
