"""Shardable ordered effects: ordered prints and callbacks on many devices.

JAX threads one token per *ordered* effect through a computation and from one
dispatched computation to the next, so that effects of that kind happen in
program order (see `jax/_src/effects.py`). Stock JAX refuses ordered effects
in a computation over more than one device unless the effect type is in
`effects.shardable_ordered_effects`; only `io_callback(ordered=True)` is.

**What "shardable ordered" promises.** On every device, the effects of one
kind happen in program order, within one call and across calls dispatched
one after another from a thread. At one program point, the effects of
different devices are *not* ordered among themselves: devices run
concurrently, and XLA gives no order between them. Nor is there an order
between effects of *different* kinds (each kind has its own token), nor
between threads.

**What this capability does.** On `install()`:

* `OrderedDebugEffect` (`jax.debug.print(..., ordered=True)`,
  `jax.debug.callback(..., ordered=True)`) joins `shardable_ordered_effects`,
  so `pxla` no longer rejects it for more than one device (`lowering.py`).
* That alone makes XLA fail with "Side-effect HLO must have sharding": the
  stock lowering of an *ordered* debug callback emits its host callback with
  no sharding. So the platform lowering rules of `debug_callback_p` and
  `debug_print_p` are wrapped (reversible edits of the table
  `mlir.register_lowering` writes). For an ordered effect the wrapper emits
  the callback as `io_callback(ordered=True)` does: threaded on the effect's
  token, with the sharding `io_callback` uses. Under multi-device `jit` that
  is MAXIMAL on the first device: the callback runs once per program point
  and sees the global value. Inside a fully manual `shard_map` it is MANUAL:
  the callback runs once per device with that device's local value. One
  device, unordered callbacks and `pmap` go to the stock rule unchanged.
* `sharded_callback(fn, x)` (`sharded_callback.py`) is a debug callback whose lowering knows the
  sharding of `x` (given, or written in the IR: a `jit` argument, a
  `with_sharding_constraint` result, a value under explicit sharding) and
  lowers to a `shard_map` over that sharding's mesh, so `fn` runs once per
  shard on the device holding it, threaded on the same token as ordered
  prints. `debug_callback_p` is added to
  `dispatch.prim_requires_devices_during_lowering` so the lowering knows the
  devices.
* `declare_effect` / `mark_shardable` (`user_effects.py`) add user effect
  types to JAX's effect-type sets; these memberships are undone by
  `uninstall()` too.
* `dispatch.runtime_tokens` (a `threading.local`) is replaced by a subclass
  instance that also records each thread's state, so `effects_barrier()`
  (`barrier.py`) waits for the effects dispatched by *every* thread, not
  only the caller's. The subclass is in `_jax/tokens.py`.

**What it does not do.** It does not order effects across devices at one
program point, nor effects of different types against each other. Two
combinations on which XLA aborts the process raise `ValueError` instead: a
partitioned ordered callback (`jax.debug.callback(..., ordered=True,
partitioned=True)`) under multi-device `jit`, and an ordered print inside
nested manual computations: a `shard_map` inside another, or one that leaves
some mesh axes automatic (`axis_names=`), which JAX lowers to nested manual
computations (stock `io_callback(ordered=True)` aborts there too). Your own
primitive with a declared shardable effect must give its side-effecting op a
sharding in its lowering; declaring the effect only lets it past `pxla`'s
check.
"""
