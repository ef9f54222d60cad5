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

import hashlib
import json
from typing import Any

import jax
import jax.numpy as jnp
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
  views = _checked_inputs("host_local_array_to_global_array", views, global_mesh, pspecs)
  out = _stock.host_local_array_to_global_array(views, global_mesh, pspecs)
  return _rewrap(out, was_gda)


def _none_as_replicated(pspecs: Any) -> Any:
  """`None` in `pspecs` as `PartitionSpec()`: replicated, as `None` meant in
  GDA-era pjit axis resources (stock multihost_utils rejects `None`)."""
  return jax.tree_util.tree_map(lambda s: PartitionSpec() if s is None else s,
                                pspecs, is_leaf=lambda x: x is None)


def _checked_inputs(fn: str, views: Any, global_mesh: Any, pspecs: Any) -> Any:
  """Check `fn`'s arguments, naming the one that is wrong (stock fails on
  them with an `AttributeError`, an `IndexError` or an exception of its own
  class), and prepare the leaves for stock.

  `global_mesh` must be a `Mesh` and each spec a `PartitionSpec` that names
  only axes of the mesh, each at most once (an empty tree's specs are
  checked too). A leaf that stock converts (not one that is already what
  `fn` makes, which stock returns as it is) must have no spec entry beyond
  its rank and divide evenly: a local leaf over the local mesh, a global one
  over `global_mesh`. A Python scalar leaf is taken as its numpy value, and
  for `host_local_array_to_global_array` a concrete device array of another
  sharding is placed on the local sharding first (stock fails inside
  `batched_device_put` for a multi-device array it must slice). The checks
  read only shapes, which are static, so they also run on traced leaves; a
  traced leaf is handed to stock unchanged.
  """
  arg = "local_inputs" if fn == "host_local_array_to_global_array" else "global_inputs"
  if not isinstance(global_mesh, jax.sharding.Mesh):
    raise TypeError(
        f"`{fn}`: `global_mesh` must be a `jax.sharding.Mesh`, got a "
        f"{type(global_mesh).__name__} ({global_mesh!r:.80}). Build one with "
        "`Mesh(np.array(jax.devices()).reshape(...), axis_names)`.")
  spec_def: Any  # a PyTreeDef (jaxlib publishes no type for it)
  path_specs, spec_def = jax.tree_util.tree_flatten_with_path(pspecs, is_leaf=is_spec_leaf)
  for spec_path, spec in path_specs:
    _check_spec(fn, spec, jax.tree_util.keystr(spec_path), global_mesh)
  try:
    subtrees = spec_def.flatten_up_to(views)
  except ValueError:
    return views  # not a prefix: stock raises its own error
  spec_paths, specs = zip(*path_specs, strict=True) if path_specs else ((), ())
  out = []
  for path, spec, sub in zip(spec_paths, specs, subtrees, strict=True):
    if not isinstance(spec, PartitionSpec):
      out.append(sub)  # a Sharding: stock's rules
      continue

    def one(subpath, x, path=path, spec=spec):
      where = jax.tree_util.keystr((*path, *subpath)) or arg
      if isinstance(x, bool | int | float | complex):
        x = np.asarray(x)  # stock reads `.dtype` / `.shape` off the Python scalar
      if (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
          and x.is_fully_addressable == (fn == "global_array_to_host_local_array")):
        return x  # already what `fn` makes: stock returns it as it is
      shape = np.shape(x)
      used = [dim for dim, entry in enumerate(spec) if entry is not None]
      if used and used[-1] >= len(shape):
        raise ValueError(
            f"`{fn}`: the pspec {spec} partitions dimension {used[-1]}, but the input "
            f"{where} of shape {shape} has rank {len(shape)}. Give `pspecs` at most "
            f"{len(shape)} entries for it (trailing `None`s are fine).")
      if fn == "host_local_array_to_global_array":
        return _fits_local_mesh(fn, x, where, shape, spec, global_mesh)
      _fits_global_mesh(fn, where, shape, spec, global_mesh)
      _local_mesh(fn, global_mesh)
      return x
    out.append(jax.tree_util.tree_map_with_path(one, sub))
  return jax.tree_util.tree_unflatten(spec_def, out)


def _check_spec(fn: str, spec: Any, where: str, mesh: jax.sharding.Mesh) -> None:
  if not is_spec_leaf(spec):
    raise TypeError(
        f"`{fn}`: `pspecs`{where} must be a `PartitionSpec` (or a pytree of them, a "
        f"prefix of the inputs), got a {type(spec).__name__} ({spec!r:.60}). Write "
        f"`PartitionSpec({spec!r:.30})` for one axis.")
  if not isinstance(spec, PartitionSpec):
    return
  names = [n for entry in spec for n in (entry if isinstance(entry, tuple) else (entry,))
           if n is not None]
  unknown = [n for n in names if n not in mesh.axis_names]
  if unknown:
    raise ValueError(
        f"`{fn}`: `pspecs`{where} {spec} names the mesh axes {unknown}, but "
        f"`global_mesh` has the axes {tuple(mesh.axis_names)}.")
  twice = sorted({n for n in names if names.count(n) > 1}, key=str)
  if twice:
    raise ValueError(
        f"`{fn}`: `pspecs`{where} {spec} uses the mesh axes {twice} more than once; "
        "each mesh axis may partition at most one dimension.")


def _fits_global_mesh(fn: str, where: str, shape: tuple, spec: PartitionSpec,
                      global_mesh: jax.sharding.Mesh) -> None:
  for dim, entry in enumerate(spec):
    names = entry if isinstance(entry, tuple) else (entry,)
    parts = int(np.prod([global_mesh.shape[n] for n in names if n is not None]))
    if dim < len(shape) and shape[dim] % parts:
      raise ValueError(
          f"`{fn}`: the global input {where} of shape {shape} cannot be split with "
          f"pspec {spec}: its dimension {dim} ({shape[dim]}) must divide evenly over the "
          f"{parts} devices along {entry!r} of `global_mesh` {dict(global_mesh.shape)}.")


def _local_mesh(fn: str, global_mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  try:
    return global_mesh.local_mesh
  except ValueError as e:  # JAX's message names neither the argument nor the mesh
    raise ValueError(
        f"`{fn}`: `global_mesh` {dict(global_mesh.shape)} does not give this process's "
        f"devices a contiguous block ({e}). Order the devices so that each process's "
        "devices are a sub-block of the mesh, e.g. `Mesh(np.array(jax.devices())"
        ".reshape(jax.process_count(), -1), ...)`.") from None


def _fits_local_mesh(fn: str, x: Any, where: str, shape: tuple, spec: PartitionSpec,
                     global_mesh: jax.sharding.Mesh) -> Any:
  local_mesh = _local_mesh(fn, global_mesh)
  for dim, entry in enumerate(spec):
    names = entry if isinstance(entry, tuple) else (entry,)
    parts = int(np.prod([local_mesh.shape[n] for n in names
                         if n is not None and n in local_mesh.shape]))
    if dim < len(shape) and shape[dim] % parts:
      raise ValueError(
          f"`{fn}`: the local input {where} of shape "
          f"{shape} cannot be globalised with pspec {spec}: its dimension {dim} "
          f"({shape[dim]}) must divide evenly over this process's {parts} "
          f"devices along {entry!r} (local mesh {dict(local_mesh.shape)}). "
          "Give every process a local batch whose size is a multiple of that.")
  if isinstance(x, jax.core.Tracer):
    return x  # traced (inside jit, vmap, grad): stock's primitive takes it as is
  if (isinstance(x, jax.Array) and x.is_fully_addressable
      and len(x.sharding.device_set) > 1):
    local = NamedSharding(local_mesh, spec)
    if not x.sharding.is_equivalent_to(local, x.ndim):
      return jax.device_put(x, local)
  return x


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
  pspecs = _none_as_replicated(pspecs)
  views = _checked_inputs("global_array_to_host_local_array", views, global_mesh, pspecs)
  out = _stock.global_array_to_host_local_array(views, global_mesh, pspecs)
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

  Raises:
    ValueError: on every process, naming the path, when the processes' trees
      differ in structure, shapes or dtypes (they first agree on that with a
      small fixed-size gather; stock's gather would abort the processes).
    TypeError: naming the leaf, for a leaf that is not an array.
  """
  _agree_on_layout(in_tree, "process_allgather")

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
    in_tree: a pytree of arrays, the same structure, shapes and dtypes on
      every process (checked first, with a small fixed-size gather: when they
      differ, every process raises `ValueError` naming the path).
    is_source: whether this process is the source; None means process 0.
  """
  _agree_on_layout(in_tree, "broadcast_one_to_all")
  host = jax.tree_util.tree_map(lambda x: _host_value(x, "broadcast_one_to_all"), in_tree)
  return _stock.broadcast_one_to_all(host, is_source=is_source)


@jax_tracebacks.api_boundary
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
  """
  for x in jax.tree_util.tree_leaves(in_tree):
    if isinstance(x, jax.core.Tracer):
      np.asarray(x)  # JAX's own error for a traced value, before any collective
  prefix = f"{fail_message}. " if fail_message else ""
  lines, errors, values = _describe(in_tree, "assert_equal", _assert_equal_leaf)
  if jax.process_count() == 1:
    if errors:
      raise errors[0]
    return
  digests = [_digest(np.ascontiguousarray(v).tobytes()) for _, v in values]
  every = _agree(lines, errors, _digest(b"".join(digests)),
                 lambda where: AssertionError(f"{prefix}`assert_equal`: the processes' "
                                              f"trees differ {where}."))
  if len({bytes(row[_FINGERPRINT_DESC:]) for row in every}) == 1:
    return
  # Some values differ: find the leaves whose digests differ, then gather
  # only those leaves (the same ones on every process) and compare them.
  per_leaf = _gather_bytes(b"".join(digests))
  n = _DIGEST_SIZE
  differing = [j for j in range(len(values))
               if len({bytes(row[j * n:(j + 1) * n]) for row in per_leaf}) > 1]
  payload = b"".join(np.ascontiguousarray(values[j][1]).tobytes() for j in differing)
  gathered = _gather_bytes(payload)
  reports, offset = [], 0
  for j in differing:
    where, value = values[j]
    size = value.nbytes
    per_process = [np.frombuffer(bytes(row[offset:offset + size]), value.dtype)
                   .reshape(value.shape) for row in gathered]
    offset += size
    report = _value_difference(where, per_process)
    if report:
      reports.append((where, report))
  if not reports:
    return  # only NaN payloads or signed zeros differ
  message = f"{prefix}`assert_equal`: the processes' values differ at {reports[0][1]}"
  if len(reports) > 1:
    message += f" The values at {', '.join(w for w, _ in reports[1:])} differ too."
  raise AssertionError(message)


# ---------------------------------------------------------------------------
# Agreeing across processes before a collective. Each process describes its
# tree as lines (path, what is there) in preorder; the processes exchange a
# fixed-size fingerprint of that description (its length and digest) with
# stock `process_allgather`, and only when the fingerprints differ, the
# descriptions themselves (padded to the longest, whose length every process
# now knows). Every collective here has the same shape on every process, and
# every process takes the same branches, so all raise together.
# ---------------------------------------------------------------------------

_DIGEST_SIZE = 32
_FINGERPRINT_DESC = 8 + _DIGEST_SIZE  # length and digest of the description


def _digest(data: bytes) -> bytes:
  return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).digest()


def _padded(n: int) -> int:
  """A gather's size: few distinct sizes, so few compilations."""
  if n <= 1 << 20:
    return max(128, 1 << (n - 1).bit_length())
  return -(-n // (1 << 20)) * (1 << 20)


def _gather_bytes(data: bytes, size: int | None = None) -> np.ndarray:
  """Every process's `data` as a (processes, size) uint8 array. `size` (by
  default `len(data)`) must be the same on every process."""
  size = len(data) if size is None else size
  buf = np.zeros(_padded(size), np.uint8)
  buf[:len(data)] = np.frombuffer(data, np.uint8)
  return np.asarray(_stock.process_allgather(buf, tiled=False))


Line = tuple[str, str]
"""A node of a described tree: its path (`in_tree` for the root) and what is
there; a refused leaf's text starts with `!`."""


def _describe(tree: Any, fn: str, leaf: Any) -> tuple[list[Line], list[Exception], list]:
  """`tree` as preorder lines, the refusals of its leaves (exceptions, not
  raised yet) and the `(path, value)`s that `leaf(x, where)` returned."""
  lines: list[Line] = []
  errors: list[Exception] = []
  values: list = []

  def walk(node, path):
    where = jax.tree_util.keystr(path) or "in_tree"
    if node is None:
      lines.append((where, "None"))
      return
    children, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and not children[0][0]:
      try:
        text, value = leaf(node, where)
      except (TypeError, ValueError) as e:
        errors.append(e)
        lines.append((where, f"!{type(e).__name__}: {e}"))
        return
      lines.append((where, text))
      if value is not None:
        values.append((where, value))
      return
    lines.append((where, _node_text(node, treedef, [k for k, _ in children])))
    for key, child in children:
      walk(child, (*path, *key))
  walk(tree, ())
  return lines, errors, values


def _node_text(node: Any, treedef: Any, keys: list) -> str:
  if type(node) is dict:
    return f"a dict with keys {[k.key for (k,) in keys]}"
  if type(node) in (list, tuple):
    return f"a {type(node).__name__} of {len(keys)}"
  return f"a {type(node).__qualname__} node, {treedef}"


def _agree(lines: list[Line], errors: list[Exception], extra: bytes, mismatch) -> np.ndarray:
  """Gather every process's fingerprint (with `extra`, the same size on
  every process); return them when all descriptions agree, else raise on
  every process: `mismatch(where)` for a difference, or the refusal of the
  first process that refused a leaf."""
  desc = json.dumps(lines).encode()
  every = _gather_bytes(len(desc).to_bytes(8, "little") + _digest(desc) + extra)
  if len({bytes(row[:_FINGERPRINT_DESC]) for row in every}) == 1:
    if errors:
      raise errors[0]  # the same refusal on every process
    return every
  lengths = [int.from_bytes(bytes(row[:8]), "little") for row in every]
  gathered = _gather_bytes(desc, max(lengths))
  per_process = [[tuple(line) for line in json.loads(bytes(row[:n]))]
                 for row, n in zip(gathered, lengths, strict=True)]
  for k, described in enumerate(per_process):
    refused = next((text for _, text in described if text.startswith("!")), None)
    if refused is not None:
      name, _, why = refused[1:].partition(": ")
      raise (TypeError if name == "TypeError" else ValueError)(
          f"process {k} refused its input: {why}")
  raise mismatch(_first_difference(per_process))


def _processes(ks: list[int]) -> str:
  return f"process {ks[0]}" if len(ks) == 1 else f"processes {', '.join(map(str, ks))}"


def _grouped(texts: list[str], verb: str = "has") -> str:
  """`process 0 has A; processes 1, 2 have B` from one text per process."""
  order: dict[str, list[int]] = {}
  for k, text in enumerate(texts):
    order.setdefault(text, []).append(k)
  return "; ".join(f"{_processes(ks)} {verb if len(ks) == 1 else 'have'} {text}"
                   for text, ks in order.items())


def _first_difference(per_process: list[list[Line]]) -> str:
  """Where the descriptions first differ, and what each process has there.
  Preorder keeps them aligned up to there: equal nodes have equal keys."""
  for i in range(max(map(len, per_process))):
    here = [d[i] if i < len(d) else None for d in per_process]
    if len(set(here)) > 1:
      where = next(line[0] for line in here if line is not None)
      return f"at {where}: " + _grouped([line[1] if line else "nothing" for line in here])
  return "in order"  # unreachable: differing descriptions differ somewhere


def _is_array_dtype(dtype: Any) -> bool:
  return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))


def _not_an_array(fn: str, x: Any, where: str) -> TypeError:
  if isinstance(x, jax.Array):
    what, fix = (f"an array of dtype {x.dtype}",
                 "For PRNG keys, pass `jax.random.key_data(key)`.")
  else:
    what, fix = (f"a {type(x).__name__} ({x!r:.60})",
                 "Convert it to a numpy array, or leave it out of the tree.")
  return TypeError(
      f"`{fn}` takes arrays and scalars of numbers or booleans, but the leaf {where} is "
      f"{what}. {fix}")


def _spanning(fn: str, x: Any, where: str) -> ValueError:
  kind = "GlobalDeviceArray" if _is_gda(x) else "jax.Array"
  spec = x.mesh_axes if _is_gda(x) else getattr(x.sharding, "spec", x.sharding)
  if fn == "broadcast_one_to_all":
    return ValueError(
        f"`broadcast_one_to_all` takes host-local values, but the leaf {where} is a {kind} "
        f"of shape {x.shape} that spans processes: it is already global, so there is "
        "nothing to broadcast. Use `process_allgather` for its value on every process, or "
        "pass a host-local value (e.g. `np.asarray(gda.local_data(0))`).")
  return ValueError(
      f"`assert_equal` got a {kind} of shape {x.shape} sharded as {spec} across "
      f"processes at {where}: each process holds a different part of it, so there is no "
      "per-process value to compare. Compare `process_allgather(x)` (its global value, "
      "the same everywhere), or a fully replicated array.")


def _assert_equal_leaf(x: Any, where: str) -> tuple[str, np.ndarray | None]:
  """A leaf's description and this process's value to compare (or None)."""
  if isinstance(x, jax.Array) and not _is_array_dtype(x.dtype):
    raise _not_an_array("assert_equal", x, where)
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if not x.is_fully_replicated:
      raise _spanning("assert_equal", x, where)
    if not isinstance(x, GlobalDeviceArray):  # stock: each process checks its replica
      return f"an array of dtype {x.dtype} and shape {x.shape} (global: not compared)", None
    value = np.asarray(jax.device_get(x.local_data(0)))  # this process's replica
  elif isinstance(x, jax.Array):
    value = np.asarray(jax.device_get(x))
  else:
    try:
      value = np.asarray(x)
    except Exception:
      raise _not_an_array("assert_equal", x, where) from None
    if not _is_array_dtype(value.dtype):
      raise _not_an_array("assert_equal", x, where)
  return f"an array of dtype {value.dtype} and shape {value.shape}", value


def _value_difference(where: str, per_process: list[np.ndarray]) -> str | None:
  """Where processes' values of one leaf differ, or None if they are equal."""
  first = per_process[0]
  same = np.ones(first.shape, bool)
  for other in per_process[1:]:
    eq = first == other
    if jnp.issubdtype(first.dtype, jnp.inexact):
      with np.errstate(invalid="ignore"):
        eq = eq | (np.isnan(first) & np.isnan(other))
    same &= eq
  if same.all():
    return None
  head = f"{where} ({first.dtype}, shape {first.shape})"
  if first.ndim == 0:
    return f"{head}: " + _grouped([str(v[()]) for v in per_process]) + "."
  k = int(np.argmin(same.reshape(-1)))
  idx = tuple(int(i) for i in np.unravel_index(k, first.shape))
  text = (f"{head}, in {int(same.size - same.sum())} of {same.size} elements; the first at "
          f"index {idx}: " + _grouped([str(v[idx]) for v in per_process]) + ".")
  if first.size <= 16:
    text += " Whole values: " + _grouped(
        [np.array2string(v, separator=", ").replace("\n", "") for v in per_process]) + "."
  return text


def _layout_leaf(fn: str):
  """The description of a leaf whose layout (not value) must agree before
  `fn`'s collective."""
  def leaf(x: Any, where: str) -> tuple[str, None]:
    if isinstance(x, jax.Array):
      if not _is_array_dtype(x.dtype):
        raise _not_an_array(fn, x, where)
      if fn == "broadcast_one_to_all" and _is_gda(x) and not x.is_fully_addressable:
        raise _spanning(fn, x, where)
      how = ("global" if not x.is_fully_addressable
             else "this process's own GDA" if _is_gda(x) else "host-local")
      return f"an array of dtype {_canonical(x.dtype)} and shape {x.shape} ({how})", None
    try:
      value = np.asarray(x)  # numpy as it is; a scalar is cheap to convert
    except Exception:
      raise _not_an_array(fn, x, where) from None
    if not _is_array_dtype(value.dtype):
      raise _not_an_array(fn, x, where)
    return (f"an array of dtype {_canonical(value.dtype)} and shape {value.shape} "
            "(host-local)"), None
  return leaf


def _canonical(dtype: Any) -> np.dtype:
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _agree_on_layout(in_tree: Any, fn: str) -> None:
  """Raise on every process unless all pass `in_tree` with the same
  structure, shapes and dtypes (what `fn`'s collective needs). A leaf that
  is not an array is refused in one process too, as it would be in many."""
  if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(in_tree)):
    return  # traced: stock's own error
  lines, errors, _ = _describe(in_tree, fn, _layout_leaf(fn))
  if jax.process_count() == 1:
    if errors:
      raise errors[0]
    return
  _agree(lines, errors, b"", lambda where: ValueError(
      f"`{fn}` needs `in_tree` with the same structure, shapes and dtypes on every "
      f"process, but the processes' trees differ {where}."))
