"""Per-call cost of ordered callbacks in a jitted function over 8 CPU devices.

Three versions of the same jitted step, side by side in one run:

* `debug.callback`: two `jax.debug.callback(..., ordered=True)` (possible over
  several devices only with `jax_sharding_ext` installed);
* `io_callback`: two `io_callback(..., ordered=True)` (stock JAX, already a
  shardable ordered effect);
* `none`: no callback.

Each sample times a batch of calls followed by `block_until_ready()` on the
last result and `jax.effects_barrier()`, so every callback has run. Samples of
the three versions are interleaved (rotating which goes first) and the median
per call is reported, with ratios. Target: `debug.callback` within 1.2x of
`io_callback`.

Run: `.venv/bin/python benchmarks/bench_effects.py [--calls 200] [--rounds 15]`
"""

import os
import re

_flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 {_flags}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sharding_ext  # noqa: E402, F401  (makes ordered debug callbacks shardable)


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


def _time_batch(fn, x, calls: int) -> float:
  start = time.perf_counter()
  out = None
  for _ in range(calls):
    out = fn(x)
  out.block_until_ready()
  jax.effects_barrier()
  return (time.perf_counter() - start) / calls


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=200, help="calls per timed sample")
  parser.add_argument("--rounds", type=int, default=15, help="interleaved samples per version")
  args = parser.parse_args()

  devices = jax.devices()
  print(f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}")
  print(f"devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform})")
  print(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
  print(f"samples: {args.rounds} rounds x {args.calls} calls, interleaved\n")

  mesh = Mesh(np.array(devices[:8]).reshape(4, 2), ("x", "y"))
  x = jax.device_put(np.arange(64 * 64, dtype=np.float32).reshape(64, 64),
                     NamedSharding(mesh, P("x", "y")))
  versions = {
      "debug.callback x2 (ordered)": jax.jit(step_debug),
      "io_callback x2 (ordered)": jax.jit(step_io),
      "no callback": jax.jit(step_none),
  }
  for fn in versions.values():  # compile and warm up
    _time_batch(fn, x, 20)

  samples: dict[str, list[float]] = {name: [] for name in versions}
  names = list(versions)
  for r in range(args.rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    for name in order:
      samples[name].append(_time_batch(versions[name], x, args.calls))

  med = {name: statistics.median(s) for name, s in samples.items()}
  width = max(map(len, names))
  print(f"{'version':<{width}}  median/call   min/call")
  for name in names:
    print(f"{name:<{width}}  {med[name] * 1e6:8.1f} us  {min(samples[name]) * 1e6:8.1f} us")
  debug, io, none = (med[n] for n in names)
  print()
  print(f"debug.callback / io_callback = {debug / io:.3f}x  (target <= 1.2x)")
  print(f"debug.callback / no callback = {debug / none:.3f}x")
  print(f"io_callback    / no callback = {io / none:.3f}x")


if __name__ == "__main__":
  main()
