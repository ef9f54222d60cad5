"""Ordered prints and callbacks in a sharded program on 8 virtual CPU devices.

Stock JAX rejects `jax.debug.print(..., ordered=True)` in a `jit` over more
than one device. After `import jax_sharding_ext` it works: under `jit` an
ordered print runs once per program point on the global value; inside
`shard_map` once per device on the local value; `sharded_callback` visits
every shard. Program order holds per device.

Run: `python examples/ordered_effects.py`
"""

import os
import re

# The device count must be set before JAX starts its CPU backend.
_flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 {_flags}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sharding_ext as jse  # noqa: E402


def main():
  print(f"jax {jax.__version__}, {jax.device_count()} devices")
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  x = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("x", "y")))

  # 1. Ordered prints under jit over 8 devices: once each, in program order,
  #    on the global value. A scan inside keeps its iterations in order.
  @jax.jit
  def step(x):
    jax.debug.print("step: sum={s}", s=x.sum(), ordered=True)

    def body(c, k):
      jax.debug.print("  scan {k}: max={m}", k=k, m=c.max(), ordered=True)
      return c * 2, None

    y, _ = jax.lax.scan(body, x, np.arange(3))
    jax.debug.print("step: done, mean={m}", m=y.mean(), ordered=True)
    return y

  print("-- jit over 8 devices")
  step(x)
  jse.effects_barrier()

  # 2. Inside shard_map: once per device, on the local block. Lines of one
  #    device stay in order; devices interleave.
  def local(v):
    i, j = jax.lax.axis_index("x"), jax.lax.axis_index("y")
    jax.debug.print("  device ({i},{j}) first:  local sum {s}", i=i, j=j, s=v.sum(), ordered=True)
    jax.debug.print("  device ({i},{j}) second: local max {m}", i=i, j=j, m=v.max(), ordered=True)
    return v

  print("-- shard_map: one line pair per device")
  jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y")))(x)
  jse.effects_barrier()

  # 3. sharded_callback: fn(data, index, device) once per shard, no shard_map.
  shards = {}

  @jax.jit
  def inspect(x):
    jse.sharded_callback(lambda data, index, device: shards.update({device.id: (index, data)}), x)
    return x + 1

  inspect(x)
  jse.effects_barrier()
  print("-- sharded_callback: shard of each device")
  for dev_id in sorted(shards):
    index, data = shards[dev_id]
    rows, cols = (f"{s.start}:{s.stop}" for s in index)
    print(f"  device {dev_id}: x[{rows}, {cols}] sum={data.sum()}")


if __name__ == "__main__":
  main()
