"""Per-call cost of ordered callbacks in a jitted function over 8 CPU devices.

Three versions of the same jitted step, side by side in one run:

* `debug.callback`: two `jax.debug.callback(..., ordered=True)` (possible over
  several devices only with `jax_sharding_ext` installed);
* `io_callback`: two `io_callback(..., ordered=True)` (already a shardable
  ordered effect in stock JAX), measured twice: with stock JAX's runtime
  token set (what a program without `jax_sharding_ext` gets; the package is
  otherwise not involved in an `io_callback`) and with the package's;
* `none`: no callback.

The package's runtime token set passes the previous call's token on in
place after waiting for it; stock waits for it the same way, then places a
fresh empty token on every device (`_token_shard_arg`). The stock variant
swaps stock's token set in for its samples (`jax_tokens.set_runtime_tokens`;
a swap between samples, after a barrier, outside the clock).

And per-shard callbacks: two `jax_sharding_ext.sharded_callback(fn, x)` (one
host call per shard, with its index and device) against stock's way to make
the same per-shard calls, two `io_callback(..., ordered=True)` inside a
`shard_map` that passes each device's mesh position (with stock's token
set). Target: `sharded_callback` at most 1.0x the stock `shard_map` version.

Each sample times a batch of calls followed by `block_until_ready()` on the
last result and `jax.effects_barrier()`, so every callback has run. Samples of
the versions are interleaved (`_common.interleaved`: the order flips every
round) and the median per call is reported, with ratios. Targets:
`debug.callback` within 1.2x of `io_callback` with the package, and
<= 0.8x stock `io_callback`.

Where the time goes (JAX 0.10.2, 8 CPU devices, 2 cores; time stamps in
the token set, the callback impl and the callbacks, medians over 200 calls
of `debug.callback x2`, ~770 us a call with the package): ~60 us of jit's
Python path before the tokens; ~410 us waiting for the previous call's
token, i.e. for the rest of its device execution (the callbacks themselves
start ~200 us into it; stock's `debug_callback_impl` spends 40-80 us a
callback placing its arguments on the CPU device, contending for the GIL);
~200 us in `execute_sharded`; ~95 us of result and token handling after it.
Stock adds ~100 us of placing a fresh token on every device after the wait;
the package passes the waited-for token on instead (0.88x-0.90x measured).
Reaching 0.8x needs calls to overlap: handing the next call a token still
being computed (no wait) made XLA CPU deadlock in this benchmark (the
all-reduce rendezvous of `x.sum()` waited forever for two devices: devices
start the next call at different times and the collectives of two calls
interleave), so the wait stays.

Where the time goes in the per-shard rows (JAX 0.10.2, 8 CPU devices, 2
cores, a loaded machine; time stamps around the host-callback work, summed
over the callback threads, per call of the step, i.e. 16 host calls):
before, each of `sharded_callback`'s host calls went through
`debug_callback_p.impl`, which `device_put`s its two operands (the shard and
the device's position) onto the CPU device (~80 us uncontended, measured
alone; 330-550 us under the load of 8 callback threads on 2 cores) only for
the callback to turn them back into numpy: ~5-7 ms of `device_put` per call
summed over the threads, ~3.2 ms wall per call, about what stock pays (its
`io_callback_impl` `device_put`s three operands per host call, ~1.7 ms
summed, plus ~0.3 ms placing a fresh token on 8 devices on the main thread).
Now the lowering emits the per-device host callback itself and hands `fn`
the numpy arrays the runtime made (its own copies), in the context stock
gives a debug callback (~3 us): the 16 host calls take ~65 us per call
together, and a call costs ~0.7-1.6 ms wall (jit's Python path, the wait
for the previous call's token, XLA's host-callback round trips).

Run: `.venv/bin/python benchmarks/bench_effects.py [--calls 200] [--rounds 15]`
"""

import argparse

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts
import jax
import jax.numpy as jnp
import numpy as np
from _targets import Target, at_most, ratio
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext  # makes ordered debug callbacks shardable
from jax_sharding_ext._jax import tokens as jax_tokens

DEBUG = "debug.callback x2 (ordered)"
IO = "io_callback x2 (ordered)"
IO_STOCK = "io_callback x2 (ordered), stock tokens"
NONE = "no callback"
SHARDED = "sharded_callback x2"
STOCK_SHARDED = "io_callback x2 in shard_map (ordered)"


def _sink(*args):
  del args


def step_none(x):
  return jnp.sin(x) * 2.0 + 1.0


def step_debug(x):
  jax.debug.callback(_sink, x.sum(), ordered=True)
  y = jnp.sin(x) * 2.0 + 1.0
  jax.debug.callback(_sink, y.max(), ordered=True)
  return y


def step_io(x):
  io_callback(_sink, None, x.sum(), ordered=True)
  y = jnp.sin(x) * 2.0 + 1.0
  io_callback(_sink, None, y.max(), ordered=True)
  return y


def _shard_sink(data, index, device):
  del data, index, device


def _step_sharded(sharding):
  def step(x):
    jax_sharding_ext.sharded_callback(_shard_sink, x)  # a jit argument: shards known
    y = jnp.sin(x) * 2.0 + 1.0
    jax_sharding_ext.sharded_callback(_shard_sink, y, sharding=sharding)
    return y
  return step


def _stock_sharded(mesh):
  def body(v):
    i, j = jax.lax.axis_index("x"), jax.lax.axis_index("y")
    io_callback(_sink, None, v, i, j, ordered=True)
    w = jnp.sin(v) * 2.0 + 1.0
    io_callback(_sink, None, w, i, j, ordered=True)
    return w
  return jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))


def _batch(fn, x, calls: int):
  """`calls` calls of `fn`, then wait for the last result and every effect."""
  def go():
    out = None
    for _ in range(calls):
      out = fn(x)
    out.block_until_ready()
    jax.effects_barrier()
  return go


def _with_stock_tokens(sample):
  """`sample` run with stock JAX's runtime token set, then the package's again."""
  stock = jax_tokens.RuntimeTokenSet()
  def go():
    ours = jax_tokens.get_runtime_tokens()
    jax_tokens.set_runtime_tokens(stock)
    try:
      sample()  # ends with jax.effects_barrier(): no token left behind
    finally:
      jax_tokens.set_runtime_tokens(ours)
  return go


def run(calls: int = 200, rounds: int = 15) -> list[dict]:
  devices = jax.devices()
  print(f"\nordered effects: {rounds} interleaved samples x {calls} calls per version")
  mesh = Mesh(np.array(devices[:8]).reshape(4, 2), ("x", "y"))
  x = jax.device_put(np.arange(64 * 64, dtype=np.float32).reshape(64, 64),
                     NamedSharding(mesh, P("x", "y")))
  versions = {DEBUG: jax.jit(step_debug), IO: jax.jit(step_io), NONE: jax.jit(step_none)}
  for fn in versions.values():  # compile and warm up
    _batch(fn, x, 20)()

  samples = {k: _batch(fn, x, calls) for k, fn in versions.items()}
  samples[IO_STOCK] = _with_stock_tokens(_batch(versions[IO], x, calls))
  samples[IO_STOCK]()  # warm up the stock token path
  res = _common.interleaved(samples, n=rounds, warmup=0)
  per_call = {k: v / calls for k, v in res.items()}
  rows = _common.report("ordered effects, 8 devices, per call", per_call, IO_STOCK)
  ratio = per_call[DEBUG] / per_call[IO]
  print(f"  debug.callback / io_callback = {ratio:.3f}x  (target <= 1.2x: "
        f"{'ok' if ratio <= 1.2 else 'MISSED'})")
  ratio = per_call[DEBUG] / per_call[IO_STOCK]
  print(f"  debug.callback / stock io_callback = {ratio:.3f}x  (target <= 0.8x: "
        f"{'ok' if ratio <= 0.8 else 'MISSED'})")
  print(f"  debug.callback / no callback = {per_call[DEBUG] / per_call[NONE]:.3f}x")
  print(f"  io_callback    / no callback = {per_call[IO] / per_call[NONE]:.3f}x")

  sharded = {SHARDED: jax.jit(_step_sharded(x.sharding)),
             STOCK_SHARDED: jax.jit(_stock_sharded(mesh))}
  for fn in sharded.values():
    _batch(fn, x, 5)()
  calls_sharded = max(1, calls // 4)  # 16 host calls per call: fewer calls per sample
  samples = {SHARDED: _batch(sharded[SHARDED], x, calls_sharded),
             STOCK_SHARDED: _with_stock_tokens(_batch(sharded[STOCK_SHARDED], x, calls_sharded))}
  samples[STOCK_SHARDED]()
  res = _common.interleaved(samples, n=rounds, warmup=0)
  per_call = {k: v / calls_sharded for k, v in res.items()}
  rows += _common.report("per-shard callbacks, 8 devices, per call", per_call, STOCK_SHARDED)
  ratio = per_call[SHARDED] / per_call[STOCK_SHARDED]
  print(f"  sharded_callback / stock shard_map io_callback = {ratio:.3f}x  (target <= 1.0x: "
        f"{'ok' if ratio <= 1.0 else 'MISSED'})")
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=200, help="calls per timed sample")
  parser.add_argument("--rounds", type=int, default=15, help="interleaved samples per version")
  args = parser.parse_args()
  _common.print_environment()
  run(calls=args.calls, rounds=args.rounds)


def targets() -> list[Target]:
  title = "ordered effects"
  return [
      at_most("2 ordered `jax.debug.callback` / 2 ordered `io_callback`, 8 devices, per call",
              ratio(title, "debug.callback x2 (ordered)", "io_callback x2 (ordered)"), 1.2,
              "{:.2f}x"),
      at_most("2 ordered `jax.debug.callback` / 2 ordered `io_callback` with stock JAX's "
              "tokens, 8 devices, per call",
              ratio(title, "debug.callback x2 (ordered)",
                    "io_callback x2 (ordered), stock tokens"), 0.8, "{:.2f}x",
              "see the docstring of benchmarks/bench_effects.py"),
      at_most("2 sharded_callback / 2 ordered io_callback in shard_map, 8 devices, per call",
              ratio("per-shard callbacks", "sharded_callback x2",
                    "io_callback x2 in shard_map (ordered)"), 1.0, "{:.2f}x"),
  ]


if __name__ == "__main__":
  main()
