"""Quickstart: a GlobalDeviceArray on 8 virtual CPU devices with stock jax.jit.

Run with `make demo` (or `.venv/bin/python examples/quickstart.py`).
"""

import os

# Eight virtual CPU devices; must be set before JAX starts its CPU backend.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, Mesh
from jax_sharding_ext import PartitionSpec as P


def main():
  print(f"jax {jax.__version__}, jax_sharding_ext {jse.__version__}, "
        f"{jax.device_count()} devices")
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  global_data = np.arange(16, dtype=np.float32).reshape(8, 2)

  # 1. Build a GDA from a callback, called once per local device with its index.
  gda = GlobalDeviceArray.from_callback((8, 2), mesh, P("x", "y"),
                                        lambda index: global_data[index])
  print("\n", repr(gda), sep="")
  print("shards (device, index, replica id, data):")
  for shard in gda.local_shards:
    print(f"  {shard.device}  {shard.index}  {shard.replica_id}  "
          f"{np.asarray(shard.data).ravel().tolist()}")

  # 2. Stock jax.jit and jax.numpy accept it; the computation follows its sharding.
  @jax.jit
  def step(x):
    return jnp.tanh(x @ x.T) * 2.0

  out = step(gda)
  print("\njit output type:", type(out).__name__, "sharding:", out.sharding.spec)
  np.testing.assert_allclose(out, np.tanh(global_data @ global_data.T) * 2.0, rtol=1e-5)

  # 3. The GDA-era output flag: jit outputs with a NamedSharding come back as GDAs.
  with jse.parallel_functions_output_gda(True):
    out_gda = step(gda)
  print("with jax_parallel_functions_output_gda:", repr(out_gda))
  print("first local shard of the output:", out_gda.local_data(0).shape)

  # 4. Zero-copy both ways.
  arr = gda.to_jax_array()
  same = [s.data.unsafe_buffer_pointer() for s in arr.addressable_shards] == [
      s.data.unsafe_buffer_pointer() for s in gda.local_shards]
  print("to_jax_array shares the device buffers:", same)
  print("\nquickstart OK")


if __name__ == "__main__":
  main()
