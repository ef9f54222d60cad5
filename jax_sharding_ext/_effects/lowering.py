"""The lowering of ordered debug prints and callbacks over several devices.

Joining `shardable_ordered_effects` lets an ordered debug effect past
`pxla`'s one-device check; the wrapped lowering rules below then emit its
host callback with the sharding `io_callback(ordered=True)` uses (see
`_effects/__init__.py`), and lower `sharded_callback` to a `shard_map`. The
edits (`EDITS`) follow the rules they install.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax_sharding_ext._effects.sharded_callback import (
    LocalShardCallback,
    ShardedCallback,
    lower_sharded_callback,
)
from jax_sharding_ext._jax import effects as jax_effects
from jax_sharding_ext._jax import frames as jax_frames

# ---------------------------------------------------------------------------
# Lowering: ordered debug callbacks with a sharding XLA accepts.
# ---------------------------------------------------------------------------


def _debug_callback_effect(params: dict) -> Any:
  return params["effect"]


def _debug_print_effect(params: dict) -> Any:
  return jax_effects.ordered_debug_effect if params["ordered"] else jax_effects.debug_effect


def _partitioned_error(ctx) -> str:
  n = len(jax_effects.lowering_device_assignment(ctx) or ()) or "several"
  return (
      "`jax.debug.callback(..., ordered=True, partitioned=True)` can't run under "
      f"`jax.jit` over {n} devices: XLA can't thread an ordering token through a "
      "partitioned callback (it aborts compiling). Use `partitioned=False` (runs "
      "once, on the global value), `jax_sharding_ext.sharded_callback(fn, x)` "
      "(runs once per shard, in order), or call it inside `shard_map`.")


def _nested_manual_error(ctx, kind: str) -> str:
  if kind == "partial":
    auto = ", ".join(repr(a) for a in jax_effects.auto_axes_in_shard_map(ctx))
    where = f"a `shard_map` that leaves mesh axes {auto} automatic"
    fix = "make every mesh axis manual (drop `axis_names=`)"
  else:
    where = "a `shard_map` nested in another `shard_map`"
    fix = "make all axes manual in one `shard_map`"
  return (
      f"An ordered `jax.debug.print` / `jax.debug.callback` inside {where} can't "
      "be lowered: XLA aborts on an ordering token inside nested manual "
      "computations (stock `io_callback(ordered=True)` fails there too). To fix, "
      f"{fix}, move the print out of the inner `shard_map`, or pass `ordered=False`.")


def _pmap_error(effect) -> str:
  return (
      # The GDA-era text first (GDA-era tests match on it), then stock's.
      "Ordered effects not supported in `pmap`. "
      "The following ordered effects are not supported for more than 1 device: "
      f"[{effect}]. jax_sharding_ext keeps stock JAX's rejection under `jax.pmap` "
      "(it widens acceptance only where it guarantees program order). Use "
      "`jax.shard_map` (ordered prints run per device in program order there) or "
      "`jax.jit` over a sharded array, or pass `ordered=False`.")


def _make_lowering(prim: Any, effect_of: Callable[[dict], Any]):
  """The wrapper around `prim`'s stock lowering rule (see `_effects/__init__.py`)."""

  def make_rule(prev_rule):
    def rule(ctx, *args, **params):
      callback = params.get("callback")
      if isinstance(callback, ShardedCallback):
        return lower_sharded_callback(ctx, *args, **params)
      effect = effect_of(params)
      kind = jax_effects.axis_context_kind(ctx)
      if isinstance(callback, LocalShardCallback) and kind == "manual":
        # `sharded_callback`'s per-device callback (in the `shard_map` it
        # lowers to): numpy operands straight to it, no `device_put`.
        return jax_effects.emit_host_callback(
            ctx, callback.host_call, args, effect,
            sharding=jax_effects.callback_op_sharding(ctx))
      if not jax_effects.is_ordered_effect(effect) or kind in ("single", "other"):
        return prev_rule(ctx, *args, **params)
      if kind in ("partial", "nested"):
        raise ValueError(_nested_manual_error(ctx, kind))
      if jax_frames.traced_inside_pmap(ctx):
        raise ValueError(_pmap_error(effect))
      partitioned = bool(params.get("partitioned", False))
      if partitioned and kind == "auto":
        raise ValueError(_partitioned_error(ctx))

      def _callback(*flat_args):
        prim.impl(*flat_args, **params)
        return ()

      # Inside a manual shard_map the operands are already local, so
      # `partitioned` makes no difference to what the callback sees.
      return jax_effects.emit_ordered_callback(
          ctx, _callback, args, effect, sharding=jax_effects.callback_op_sharding(ctx))

    rule.__name__ = rule.__qualname__ = f"jax_sharding_ext_{prim.name}_lowering"
    return rule

  return make_rule


EDITS: list = [
    jax_effects.EffectTypeSetEdit("shardable_ordered_effects", jax_effects.OrderedDebugEffect),
    # `sharded_callback` needs the devices while lowering (as io_callback_p).
    jax_effects.SetMemberEdit("prim_requires_devices_during_lowering",
                              jax_effects.prim_requires_devices_during_lowering,
                              jax_effects.debug_callback_p),
    # Lower inline, so the operand's producer is visible (already so in
    # jax 0.10.2 / 0.12.x because of the TPU registration; kept explicit).
    jax_effects.SetMemberEdit("uncacheable_primitives", jax_effects.uncacheable_primitives,
                              jax_effects.debug_callback_p),
]
for _prim, _effect_of in ((jax_effects.debug_callback_p, _debug_callback_effect),
                          (jax_effects.debug_print_p, _debug_print_effect)):
  _make_rule = _make_lowering(_prim, _effect_of)
  EDITS += [jax_effects.LoweringEdit(_prim, platform, _make_rule)
            for platform in jax_effects.lowering_platforms(_prim)]
