"""Shardable ordered effects: effect-type sets, the debug primitives and
their lowerings, lowering-context sharding. (Runtime tokens: `tokens.py`.)

Touches: `jax._src.effects` (effect-type sets), `jax._src.debugging`
(`debug_callback_p`, `debug_print_p`, effects), `jax._src.callback`
(`emit_python_callback`), `jax._src.dispatch`
(`prim_requires_devices_during_lowering`),
`jax._src.sharding_impls`, `jax._src.interpreters.mlir` (lowering rules,
contexts), `jax._src.config` / `mesh` / `xla_bridge` (a debug callback's
context), MLIR `func` / `sdy` dialects. Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the keyword arguments of
`callback.emit_python_callback`, the lowering-context attributes read by
`axis_context_kind` / `operand_sharding`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax

#
# Shardable ordered effects (`_effects/`). The effect-type sets live in
# `jax._src.effects` (`EffectTypeSet`, whose only state is `_effect_types`);
# `partial_eval_kept_effects` exists since 2025-06 (jax 0.7), so it is looked
# up by name. The debug primitives, their platform lowering tables
# (`mlir._platform_specific_lowerings`, keyed platform -> primitive ->
# `LoweringRuleEntry(rule, inline)`), `callback.emit_python_callback` and
# `callback._callback_op_sharding` have the same shape in jax 0.10.2 and
# 0.12.x. There is no public API for any of this: JAX only declares its own
# `OrderedIOEffect` shardable (jax 0.4.17).
# ---------------------------------------------------------------------------
import numpy as _fx_np
from jax._src import callback as _fx_callback
from jax._src import config as _fx_config
from jax._src import debugging as _fx_debugging
from jax._src import dispatch as _fx_dispatch
from jax._src import effects as _fx_effects
from jax._src import mesh as _fx_mesh
from jax._src import sharding_impls as _fx_sharding_impls
from jax._src import xla_bridge as _fx_xla_bridge
from jax._src.interpreters import mlir as _fx_mlir
from jax._src.lib import xla_client as _fx_xc
from jax._src.lib.mlir import ir as _ir_module
from jax._src.lib.mlir.dialects import func as _fx_func
from jax._src.lib.mlir.dialects import sdy as _sdy_module

from jax_sharding_ext._edit import Edit, replaced_error
from jax_sharding_ext._jax.tables import MISSING

# Untyped: jaxlib 0.8.x's stubs of these MLIR modules declare neither the
# value classes nor the attribute classes read below.
_fx_ir: Any = _ir_module
_fx_sdy: Any = _sdy_module

Effect = _fx_effects.Effect
"""Base class of every JAX effect (also public as `jax.extend.core.Effect` since jax 0.10.0)."""

EFFECT_TYPE_SET_NAMES = (
    "ordered_effects", "shardable_ordered_effects", "lowerable_effects",
    "control_flow_allowed_effects", "custom_derivatives_allowed_effects",
    "remat_allowed_effects", "partial_eval_kept_effects")
"""The `EffectTypeSet`s of `jax._src.effects` an effect type can join."""

def effect_type_set(name: str) -> Any:
  """The `EffectTypeSet` called `name`, or None if this JAX has no such set."""
  return getattr(_fx_effects, name, None)


def effect_types_in(name: str) -> frozenset[type]:
  """A snapshot of the types in the effect-type set `name` (empty if absent)."""
  s = effect_type_set(name)
  return frozenset(s._effect_types) if s is not None else frozenset()


def is_ordered_effect(effect: Any) -> bool:
  return _fx_effects.ordered_effects.contains(effect)


class SetMemberEdit(Edit):
  """Add `item` to the plain Python set `target`; undo removes it if we added it.

  A member that was already there is left alone both ways, so stock
  memberships survive `uninstall()`.
  """

  def __init__(self, name: str, target: set | None, item: Any):
    self.name = name
    self.target = target
    self.item = item
    self._added = False

  def _target(self) -> set | None:
    return self.target

  def _apply(self) -> None:
    target = self._target()
    self._added = target is not None and self.item not in target
    if target is not None and self._added:
      target.add(self.item)

  def _revert(self) -> None:
    target = self._target()
    if target is not None and self._added:
      target.discard(self.item)
    self._added = False


class EffectTypeSetEdit(SetMemberEdit):
  """Add `effect_type` to JAX's effect-type set `set_name`; undo removes it.

  `EffectTypeSet` only has `add_type`; removal edits its `_effect_types` set
  (the same in every JAX since the sets were introduced). A set this JAX does
  not have is skipped.
  """

  def __init__(self, set_name: str, effect_type: type):
    super().__init__(set_name, None, effect_type)

  def _target(self) -> set | None:
    s = effect_type_set(self.name)
    return None if s is None else s._effect_types


# The debug primitives and their effects (jax/_src/debugging.py).
debug_callback_p = _fx_debugging.debug_callback_p
debug_print_p = _fx_debugging.debug_print_p  # its own primitive since jax 0.7
OrderedDebugEffect = _fx_debugging.OrderedDebugEffect
ordered_debug_effect = _fx_debugging.ordered_debug_effect
debug_effect = _fx_debugging.debug_effect

uncacheable_primitives: set = _fx_mlir._uncacheable_primitives
"""Primitives lowered inline at each use (`mlir.register_lowering(cacheable=False)`).
`debug_callback_p` is in it (TPU channel ids); `sharded_callback` relies on
inline lowering to see its operand's producer."""

prim_requires_devices_during_lowering: set = _fx_dispatch.prim_requires_devices_during_lowering
"""Primitives whose lowering needs the concrete device assignment (io_callback_p)."""


class LoweringEdit(Edit):
  """Wrap the lowering rule of `prim` on `platform` (None: the default rule).

  `make_rule(prev_rule)` builds the new rule around the rule that was there;
  `revert()` puts back the previous `LoweringRuleEntry` object itself. This
  edits the table `mlir._get_lowering_rules` reads, the same table
  `mlir.register_lowering` writes.
  """

  def __init__(self, prim: Any, platform: str | None, make_rule: Callable[[Any], Any]):
    self.prim = prim
    self.platform = platform
    self.make_rule = make_rule
    self.name = f"mlir lowering[{platform or 'default'}]"
    self._prev: Any = MISSING
    self._entry: Any = None

  def _table(self) -> dict:
    if self.platform is None:
      return _fx_mlir._lowerings
    return _fx_mlir._platform_specific_lowerings[self.platform]

  def _apply(self) -> None:
    table = self._table()
    prev = table.get(self.prim, MISSING)
    if prev is MISSING:  # nothing to wrap on this platform
      self._prev, self._entry = MISSING, None
    else:
      self._prev = prev
      self._entry = _fx_mlir.LoweringRuleEntry(self.make_rule(prev.rule), prev.inline)
      table[self.prim] = self._entry

  def _check_revert(self) -> None:
    if self._entry is not None and self._table().get(self.prim, MISSING) is not self._entry:
      raise replaced_error(f"the {self.name} rule of `{self.prim}`")

  def _revert(self) -> None:
    if self._entry is not None:
      self._check_revert()
      self._table()[self.prim] = self._prev
    self._prev, self._entry = MISSING, None


def lowering_platforms(prim: Any) -> list[str | None]:
  """Platforms (None = default rule) that have a lowering rule for `prim`."""
  out: list[str | None] = [None] if prim in _fx_mlir._lowerings else []
  out += sorted(p for p, t in _fx_mlir._platform_specific_lowerings.items() if prim in t)
  return out


def axis_context_kind(ctx) -> str:
  """Classify a lowering context.

  "auto": `jit` over several devices (bulk-array semantics);
  "single": `jit` on one device; "manual": inside `shard_map` with every mesh
  axis manual (per-device semantics); "partial": `shard_map` with some axes
  left automatic; "nested": a `shard_map` inside another one (the inner one's
  mesh is the context mesh, whose outer axes are already `Manual`, in jax
  0.10.2 and 0.12.x); "other": anything else (pmap's replica context).
  """
  ac = ctx.module_context.axis_context
  if isinstance(ac, _fx_sharding_impls.ShardingContext):
    return "auto" if ac.num_devices > 1 else "single"
  if isinstance(ac, _fx_sharding_impls.SPMDAxisContext):
    if any(t == jax.sharding.AxisType.Manual for t in getattr(ac.mesh, "axis_types", ())):
      return "nested"
    if frozenset(ac.manual_axes) == frozenset(ac.mesh.axis_names):
      return "manual"
    return "partial"
  return "other"


def auto_axes_in_shard_map(ctx) -> tuple[str, ...]:
  """Mesh axes left automatic by the enclosing `shard_map` (empty outside one)."""
  ac = ctx.module_context.axis_context
  if not isinstance(ac, _fx_sharding_impls.SPMDAxisContext):
    return ()
  return tuple(a for a in ac.mesh.axis_names if a not in ac.manual_axes)


def lowering_device_assignment(ctx) -> tuple | None:
  """The devices of a `jit` being lowered (None when lowered without them)."""
  ac = ctx.module_context.axis_context
  return getattr(ac, "device_assignment", None)


def callback_op_sharding(ctx) -> Any:
  """The op sharding stock `io_callback` gives its custom call in `ctx`.

  Under multi-device `jit`: MAXIMAL on logical device 0 (runs once, on the
  global value). Inside a fully manual `shard_map`: MANUAL (runs on every
  device, on its local value). Shardy or GSPMD form, following
  `jax_use_shardy_partitioner`.
  """
  return _fx_callback._callback_op_sharding(
      ctx.module_context.axis_context, None, ctx.avals_out)


def emit_ordered_callback(ctx, callback: Callable[..., Any], args: Sequence[Any],
                          effect: Any, *, sharding: Any, partitioned: bool = False):
  """Emit a side-effecting host callback threaded on `effect`'s token.

  What `io_callback(ordered=True)` emits (`callback.io_callback_lowering`):
  the token of `effect` goes in, the new one comes out and replaces it in
  `ctx`'s token set, and `sharding` annotates the custom call.
  """
  token = ctx.tokens_in.get(effect)
  result, token, _ = _fx_callback.emit_python_callback(
      ctx, callback, token, list(args), ctx.avals_in, ctx.avals_out,
      has_side_effect=True, returns_token=True, partitioned=partitioned,
      sharding=sharding)
  ctx.set_tokens_out(ctx.tokens_in.update_tokens(_fx_mlir.TokenSet({effect: token})))
  return result


def emit_host_callback(ctx, callback: Callable[..., Any], args: Sequence[Any],
                       effect: Any, *, sharding: Any):
  """Emit a side-effecting host callback that takes numpy arrays as they come.

  For an ordered `effect` as `emit_ordered_callback`; for an unordered one
  with no token, as stock `debug_callback` emits it. `callback` gets the
  operands as the numpy arrays the host-callback runtime made (its own
  copies, read-only: jaxlib 0.10.2 and 0.12.x) and returns nothing; call it
  through `call_like_debug_callback` for the debug callback's context.
  """
  def host(*flat_args):
    callback(*flat_args)
    return ()

  if is_ordered_effect(effect):
    return emit_ordered_callback(ctx, host, args, effect, sharding=sharding)
  # `returns_token=True` as stock's unordered debug callback: on TPU the
  # callback's completion is then received back (no token to thread here).
  result, _, _ = _fx_callback.emit_python_callback(
      ctx, host, None, list(args), ctx.avals_in, ctx.avals_out,
      has_side_effect=True, returns_token=True, sharding=sharding)
  return result


def call_like_debug_callback(fn: Callable[..., Any], *args: Any) -> None:
  """`fn(*args)` in the context stock `debug_callback_impl` gives a debug
  callback (default device: the CPU; no concrete or abstract mesh), logging
  a failure as it does, without its `device_put` of the arguments: `args`
  stay the host callback's numpy arrays, so no CPU backend is needed (without
  one the default device is left as it is). (Same in jax 0.10.2 and 0.12.x.)
  """
  try:
    on_cpu: Any = _fx_config.default_device(_fx_xla_bridge.local_devices(backend="cpu")[0])
  except RuntimeError:  # no CPU backend (e.g. JAX_PLATFORMS=tpu)
    on_cpu = contextlib.nullcontext()
  with (on_cpu,
        _fx_sharding_impls._internal_use_concrete_mesh(_fx_mesh.empty_concrete_mesh),
        _fx_mesh.use_abstract_mesh(_fx_mesh.empty_abstract_mesh)):
    try:
      fn(*args)
    except BaseException:
      _fx_debugging.logger.exception("jax.debug.callback failed")
      raise


def lower_fun_multiple_results(fun: Callable[..., Any]) -> Callable[..., Any]:
  """`mlir.lower_fun(fun, multiple_results=True)`: lower a traced function inline."""
  return _fx_mlir.lower_fun(fun, multiple_results=True)


def _sdy_mesh_and_spec(attr, device_assignment):
  ts = _fx_sdy.TensorShardingAttr(attr)
  mesh_attr = ts.mesh_or_ref
  if not _attr_is(_fx_sdy.MeshAttr, mesh_attr):
    return None  # a symbol reference: meshes are only inlined while lowering
  mesh_attr = _fx_sdy.MeshAttr(mesh_attr)
  axes = [_fx_sdy.MeshAxisAttr(a) for a in mesh_attr.axes]
  if not axes:
    return None  # maximal sharding: one device holds the value
  sizes = [a.size for a in axes]
  ids = list(mesh_attr.device_ids) or list(range(int(_fx_np.prod(sizes))))
  if len(ids) != len(device_assignment):
    return None
  devices = _fx_np.array([device_assignment[i] for i in ids], dtype=object).reshape(sizes)
  spec = []
  for dim in ts.dimension_shardings:
    refs = [_fx_sdy.AxisRefAttr(r) for r in _fx_sdy.DimensionShardingAttr(dim).axes]
    if any(r.sub_axis_info is not None for r in refs):
      return None  # split axes ("x":(1)2) have no PartitionSpec equivalent
    names = tuple(r.name for r in refs)
    spec.append(None if not names else names[0] if len(names) == 1 else names)
  return devices, tuple(a.name for a in axes), tuple(spec)


def _hlo_mesh_and_spec(attr, device_assignment):
  try:
    hs = _fx_xc.HloSharding.from_string(_fx_ir.StringAttr(attr).value)
  except Exception:  # a proto-encoded or unparsable sharding: give up
    return None
  n = len(device_assignment)
  if hs.is_replicated():
    return _fx_np.array(device_assignment, dtype=object), ("_jse_r",), ()
  if not hs.is_tiled() or hs.subgroup_types() or hs.num_devices() != n:
    return None
  dims = list(hs.tile_assignment_dimensions())
  ids = list(hs.tile_assignment_devices())
  devices = _fx_np.array([device_assignment[i] for i in ids], dtype=object).reshape(dims)
  names = tuple(f"_jse_{i}" for i in range(len(dims)))
  ndim = len(dims) - (1 if hs.replicate_on_last_tile_dim() else 0)
  spec = tuple(names[i] if dims[i] > 1 else None for i in range(ndim))
  return devices, names, spec


def operand_sharding(ctx, value) -> tuple[Any, tuple[str, ...], tuple] | None:
  """The sharding a lowered operand is known to have, as (devices, names, spec).

  Known means written in the IR at this point of lowering: a `jit` argument
  (the `sdy.sharding` / `mhlo.sharding` attribute of a `func.func` argument)
  or the result of `with_sharding_constraint` (`sdy.sharding_constraint`, or
  the GSPMD `@Sharding` custom call). `devices` is an object array shaped
  like the mesh, `spec` a PartitionSpec tuple over `names`. None otherwise
  (an intermediate value: XLA decides its sharding later).
  """
  da = lowering_device_assignment(ctx)
  if da is None:
    return None
  attr = None
  if not isinstance(value, _fx_ir.BlockArgument | _fx_ir.OpResult):
    # jaxlib 0.8.x's MLIR bindings hand lowering rules plain `ir.Value`s
    # (later ones give the concrete class), cast by the class's own test.
    for cls in (_fx_ir.BlockArgument, _fx_ir.OpResult):
      test = getattr(cls, "isinstance", None)
      if test is not None and test(value):
        value = cls(value)
        break
  if isinstance(value, _fx_ir.BlockArgument):
    owner = value.owner.owner
    if isinstance(owner, _fx_func.FuncOp) and owner.arg_attrs is not None:
      arg_attrs = _fx_ir.DictAttr(owner.arg_attrs[value.arg_number])
      for key in ("sdy.sharding", "mhlo.sharding"):
        if key in arg_attrs:
          attr = arg_attrs[key]
          break
  elif isinstance(value, _fx_ir.OpResult):
    op = value.owner
    if op.name == "sdy.sharding_constraint":
      attr = op.attributes["sharding"]
    elif (op.name == "stablehlo.custom_call" and "mhlo.sharding" in op.attributes
          and _fx_ir.StringAttr(op.attributes["call_target_name"]).value == "Sharding"):
      attr = op.attributes["mhlo.sharding"]
  if attr is None:
    return None
  if _attr_is(_fx_sdy.TensorShardingAttr, attr):
    return _sdy_mesh_and_spec(attr, da)
  if _attr_is(_fx_ir.StringAttr, attr):
    return _hlo_mesh_and_spec(attr, da)
  return None


def _attr_is(cls, attr) -> bool:
  # `Attr.isinstance` exists for some attribute classes only; a cast is the
  # check every MLIR binding version has.
  try:
    cls(attr)
  except (ValueError, TypeError):
    return False
  return True
