"""`sharded_callback(fn, x)`: call `fn` once per shard of `x`, on the device
holding it, in program order with the other ordered prints and callbacks.

Staged as a `debug_callback_p` whose callback is a `ShardedCallback`; the
wrapped lowering rule (`lowering.py`) recognises it and lowers a `shard_map`
over the shards' mesh instead of one host callback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from jax_sharding_ext._edit import STATE
from jax_sharding_ext._jax import effects as jax_effects
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import tracebacks as jax_tracebacks


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedCallback:
  """The `callback` parameter of a `debug_callback_p` staged by `sharded_callback`.

  The wrapped lowering rule recognises it and lowers a `shard_map` instead of
  one host callback. Compared by identity, like any debug callback function.
  """

  fn: Callable[..., Any]
  sharding: Any  # NamedSharding | SingleDeviceSharding | None

  # Staging or lowering it while the package is uninstalled raises this
  # (`_jax/readers.py` for a call traced before `uninstall()`).
  UNINSTALLED_ERROR: ClassVar[str] = (
      "`sharded_callback` needs jax_sharding_ext installed, but it was "
      "uninstalled. Call `jax_sharding_ext.install()` first.")

  def __call__(self, *args):
    # Only reached when the primitive is evaluated eagerly under a
    # transformation (e.g. `jax.grad` or `jax.vmap` without `jit`), where the
    # value has already been moved to the host and its shards are lost.
    raise ValueError(
        "`sharded_callback` was evaluated eagerly under a JAX transformation "
        "(`jax.grad` / `jax.vmap` without `jax.jit`), where the shards of its "
        "argument are not known. Wrap the function in `jax.jit`.")


class LocalShardCallback:
  """The per-device host callback: maps the device's flat position in the mesh
  (one scalar operand, computed on the device) to (index, device), both
  looked up once at lowering time.

  The lowering rule (`lowering.py`) calls it straight from the host callback
  with the numpy arrays the runtime made (`host_call`), in a debug callback's
  context: not through `debug_callback_p.impl`, whose `device_put` of every
  operand onto the CPU device (to hand `jax.debug.callback` arrays) would cost
  more than the rest of the call, only for `fn` to get numpy data back.
  """

  def __init__(self, fn: Callable[..., Any], mesh: Mesh, spec: PartitionSpec,
               shape: tuple[int, ...]):
    self.fn = fn
    indices = NamedSharding(mesh, spec).devices_indices_map(tuple(shape))
    self.shards = [(indices[d], d) for d in mesh.devices.flat]

  def __call__(self, data, position):
    index, device = self.shards[int(position)]
    if type(data) is not np.ndarray:
      data = np.asarray(data)  # a `jax.Array` (through `debug_callback_p.impl`)
    elif not data.flags.owndata:
      # A view of memory the runtime may reuse after the call (the runtime
      # hands over its own copies; keep that promise if it ever stops).
      data = data.copy()
      data.flags.writeable = False
    self.fn(data, index, device)

  def host_call(self, data, position) -> None:
    jax_effects.call_like_debug_callback(self, data, position)


def _mesh_of(devices, names) -> Mesh:
  return Mesh(np.asarray(devices, dtype=object), tuple(names))


def _resolve_mesh_and_spec(ctx, x, callback: ShardedCallback, device_assignment,
                           aval) -> tuple[Mesh, PartitionSpec]:
  sharding = callback.sharding
  if sharding is None:
    if len(device_assignment) == 1:
      return _mesh_of(list(device_assignment), ("_jse_d",)), PartitionSpec()
    found = jax_effects.operand_sharding(ctx, x)
    if found is None:
      raise ValueError(
          f"`sharded_callback` can't tell the shards of its argument (shape "
          f"{tuple(aval.shape)}, dtype {aval.dtype}) in a computation over "
          f"{len(device_assignment)} devices: it is neither a `jit` argument "
          "nor a `with_sharding_constraint` result, so XLA picks its sharding "
          "later. Pass `sharding=NamedSharding(mesh, spec)`, or constrain it "
          "with `jax.lax.with_sharding_constraint`.")
    devices, names, entries = found
    return _mesh_of(devices, names), PartitionSpec(*entries)
  if isinstance(sharding, SingleDeviceSharding):
    mesh, spec = _mesh_of([next(iter(sharding.device_set))], ("_jse_d",)), PartitionSpec()
  else:
    mesh, spec = sharding.mesh, sharding.spec
  if set(mesh.devices.flat) != set(device_assignment):
    raise ValueError(
        f"`sharded_callback(..., sharding=...)` got a sharding over devices "
        f"{sorted(d.id for d in mesh.devices.flat)}, but the computation runs on "
        f"devices {sorted(d.id for d in device_assignment)}. Pass a sharding "
        "over the computation's devices.")
  return mesh, spec


def _with_context_axis_types(mesh: Mesh) -> Mesh:
  """`mesh`, with the axis types of the context mesh if it is the same mesh.

  `shard_map` insists that its mesh equals the context mesh (`jax.set_mesh`,
  explicit sharding), axis types included; a mesh rebuilt from the IR has
  `Auto` axes.
  """
  context = jax.sharding.get_abstract_mesh()
  if (context is None or context.empty or context.axis_names != mesh.axis_names
      or tuple(context.axis_sizes) != tuple(mesh.axis_sizes)
      or tuple(context.axis_types) == tuple(mesh.axis_types)):
    return mesh
  return Mesh(mesh.devices, mesh.axis_names, axis_types=context.axis_types)


def lower_sharded_callback(ctx, x, *, callback, effect, partitioned):
  del partitioned
  kind = jax_effects.axis_context_kind(ctx)
  if kind in ("manual", "partial", "nested"):
    raise ValueError(
        "`sharded_callback` was called inside `shard_map`, where values are "
        "already per device. Use `jax.debug.callback(fn, x, ordered=True)` there "
        "(it runs once per device with the local value), or call "
        "`sharded_callback` outside the `shard_map`.")
  device_assignment = jax_effects.lowering_device_assignment(ctx)
  if kind == "other" or device_assignment is None:
    raise ValueError(
        "`sharded_callback` can only be staged by `jax.jit` (not `pmap`, and not "
        "lowered without devices).")
  aval = ctx.avals_in[0]
  mesh, spec = _resolve_mesh_and_spec(ctx, x, callback, device_assignment, aval)
  local = LocalShardCallback(callback.fn, mesh, spec, aval.shape)

  def body(x_local):
    position = 0  # row-major flat index of this device in `mesh.devices`
    for name in mesh.axis_names:
      position = position * mesh.shape[name] + lax.axis_index(name)
    jax_effects.debug_callback_p.bind(x_local, position, callback=local, effect=effect,
                                      partitioned=False)
    return []

  def staged(x_global):
    jax.shard_map(body, mesh=_with_context_axis_types(mesh), in_specs=(spec,),
                  out_specs=[], check_vma=False)(x_global)
    return []

  return jax_effects.lower_fun_multiple_results(staged)(ctx, x)


def _check_sharding(sharding: Any) -> None:
  if isinstance(sharding, SingleDeviceSharding):
    return
  if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
    return
  raise TypeError(
      f"`sharded_callback(..., sharding=...)` needs a `NamedSharding` over a "
      f"concrete `Mesh` or a `SingleDeviceSharding`, got {sharding!r}. Build one "
      "with `jax.sharding.NamedSharding(mesh, PartitionSpec(...))`.")


@jax_tracebacks.api_boundary
def sharded_callback(fn: Callable[..., Any], x: Any, *, sharding: Any = None,
                     ordered: bool = True) -> None:
  """Call `fn(data, index, device)` once per addressable shard of `x`.

  `data` is the shard as a numpy array, `index` its tuple of slices into the
  global array, `device` the `jax.Device` holding it. Replicated shards are
  visited once per device holding a copy. With `ordered=True` the calls of a
  device happen in program order with every other ordered print and callback
  (`jax.debug.print(..., ordered=True)` shares the token); calls of different
  devices at one program point are unordered, and may run at the same time
  on different threads.

  Inside `jax.jit` the call is staged (no `shard_map` needed). The shards are
  those of `sharding` if given (the value is resharded to it), else those of
  `x` when they are known while lowering: a `jit` argument, the result of
  `jax.lax.with_sharding_constraint`, or any value under explicit sharding
  (`jax.set_mesh` with `AxisType.Explicit` axes). Eagerly, on a `jax.Array` or
  `GlobalDeviceArray`, it waits for the ordered effects already dispatched by
  this thread and then calls `fn` on the host for each addressable shard.

  Args:
    fn: called as `fn(data, index, device)`; its return value is ignored.
    x: a `jax.Array`, `GlobalDeviceArray`, or a traced value inside `jit`.
      A numpy array needs `sharding=`. A list or tuple is taken as one array
      (`numpy.asarray(x)`; inside `jit`, where it may hold traced values,
      `jax.numpy.asarray(x)`), so eagerly and under `jit` it visits, or is
      refused, alike.
    sharding: a `NamedSharding` (over a concrete `Mesh`) or
      `SingleDeviceSharding` giving the shards to visit.
    ordered: keep program order per device (default True).

  Returns:
    None.

  Raises:
    TypeError: `fn` is not callable, `ordered` is not a bool, or `sharding` is
      not a supported sharding.
    ValueError: the shards of `x` cannot be known; pass `sharding=`.
    RuntimeError: jax_sharding_ext is uninstalled.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ('x',))
    >>> x = jax.device_put(np.arange(4.0), jax.sharding.NamedSharding(mesh, P('x')))
    >>> seen = []
    >>> @jax.jit
    ... def step(x):
    ...   sharded_callback(lambda data, index, device: seen.append((device.id, index, data)), x)
    ...   return x * 2
    >>> y = step(x)
    >>> effects_barrier()
    >>> sorted(seen, key=lambda s: s[0])
    [(0, (slice(0, 2, None),), array([0., 1.], dtype=float32)),
     (1, (slice(2, 4, None),), array([2., 3.], dtype=float32))]
  """
  if not STATE.installed:
    raise RuntimeError(ShardedCallback.UNINSTALLED_ERROR)
  x = _checked_callback_args(fn, x, sharding, ordered)
  if isinstance(x, jax.core.Tracer):
    effect = jax_effects.ordered_debug_effect if ordered else jax_effects.debug_effect
    jax_effects.debug_callback_p.bind(x, callback=ShardedCallback(fn, sharding),
                                      effect=effect, partitioned=False)
  else:
    _eager_sharded_callback(fn, x, sharding, ordered)
  return None


def _checked_callback_args(fn, x, sharding, ordered) -> Any:
  """`sharded_callback`'s arguments checked; `x` as a `jax.Array`, tracer or
  numpy array."""
  if not callable(fn):
    raise TypeError(
        f"`sharded_callback(fn, x)` needs a callable `fn(data, index, device)`, "
        f"got {type(fn).__name__} {fn!r}.")
  if not isinstance(ordered, bool):
    raise TypeError(f"`sharded_callback(..., ordered=...)` must be True or False, got {ordered!r}.")
  if sharding is not None:
    _check_sharding(sharding)
  given = type(x).__name__ if isinstance(x, (list, tuple)) else None
  if isinstance(x, (list, tuple, np.ndarray, np.generic, int, float, complex)):
    x = _as_one_array(x)  # host data: placed with `sharding=` below
    if not jax_tables.is_plain_dtype(x.dtype) or x.dtype == np.dtype(object):
      raise TypeError(
          f"`sharded_callback(fn, x)` needs numeric array data for `x`, got dtype "
          f"{x.dtype}.")
  elif not isinstance(x, (jax.Array, jax.core.Tracer)):
    raise TypeError(
        f"`sharded_callback(fn, x)` needs an array for `x` (a `jax.Array`, a "
        f"`GlobalDeviceArray`, a traced value inside `jit`, or host data with "
        f"`sharding=`), got {type(x).__name__} {x!r:.80}.")
  if sharding is not None and hasattr(x, "shape"):
    listed = "" if given is None else (
        f" `x` is a {given}, taken as one array of that shape (as `numpy.asarray(x)`); "
        "to visit the shards of each element, call `sharded_callback` once per element.")
    spec = getattr(sharding, "spec", ())
    if len(spec) > len(x.shape):
      raise ValueError(
          f"`sharded_callback(..., sharding={sharding})` has {len(spec)} "
          f"PartitionSpec entries but the value has rank {len(x.shape)} (shape "
          f"{tuple(x.shape)}); give at most one entry per dimension.{listed}")
    try:
      sharding.shard_shape(tuple(x.shape))
    except ValueError as e:
      raise ValueError(
          f"`sharded_callback(..., sharding={sharding})` does not fit a value of "
          f"shape {tuple(x.shape)}: {str(e).rstrip('.')}.{listed}") from None
  return x


def _as_one_array(x: Any) -> Any:
  """Host data `x` as one array, as `numpy.asarray(x)` makes it; a list or
  tuple holding traced values (inside `jit`) as `jax.numpy.asarray(x)` makes
  it, since numpy cannot read those."""
  traced = isinstance(x, (list, tuple)) and any(
      isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))
  try:
    return jnp.asarray(x) if traced else np.asarray(x)
  except (TypeError, ValueError) as e:
    raise TypeError(
        f"`sharded_callback(fn, x)` takes a {type(x).__name__} `x` as one array, but "
        f"this one does not make an array: {e} Pass one array (e.g. "
        "`jax.numpy.stack(x)`), or call `sharded_callback` once per element.") from None


def _eager_sharded_callback(fn, x, sharding, ordered) -> None:
  """Outside `jit`: wait for earlier ordered effects, then visit each shard."""
  if isinstance(x, jax.Array):
    if sharding is not None and not x.sharding.is_equivalent_to(sharding, x.ndim):
      x = jax.device_put(x, sharding)
  elif sharding is not None:
    x = jax.device_put(x, sharding)
  else:
    raise ValueError(
        f"`sharded_callback` got a {type(x).__name__}, which has no shards. Pass "
        "`sharding=NamedSharding(mesh, spec)` to place it, or pass a `jax.Array`.")
  if ordered:
    jax.effects_barrier()  # effects dispatched before this call run first
  for shard in x.addressable_shards:
    fn(np.asarray(shard.data), shard.index, shard.device)
