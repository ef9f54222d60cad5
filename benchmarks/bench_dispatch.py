"""Dispatch cost of a tiny jitted function: GlobalDeviceArray vs jax.Array.

Targets (issue 6): GDA within 1.3x of jax.Array on 1 device, 1.1x on 8.
Run: .venv/bin/python benchmarks/bench_dispatch.py
"""

import _common  # first: sets XLA_FLAGS before JAX starts
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, parallel_functions_output_gda


def run(n: int = 2000) -> list[dict]:
  rows = []
  devs = jax.devices()
  for n_dev, mesh_shape in ((1, (1, 1)), (8, (4, 2))):
    mesh = Mesh(np.array(devs[:n_dev]).reshape(mesh_shape), ("x", "y"))
    sharding = NamedSharding(mesh, P("x", "y"))

    def fresh_array(sharding=sharding):
      return jax.device_put(np.ones((8, 8), np.float32), sharding)

    def fresh_gda():
      # A GDA that is the only owner of its `jax.Array`, as one built by
      # `from_callback` or returned by jit is. While anything else holds that
      # array (or the GDA is passed twice), a call is checked for donation
      # aliasing on JAX's Python path (README "Limits").
      return GlobalDeviceArray.from_jax_array(fresh_array())

    arr, gda = fresh_array(), fresh_gda()
    for n_args in (1, 10):
      f = jax.jit(lambda *xs: [x + 1 for x in xs])
      arrs = [arr, *(fresh_array() for _ in range(n_args - 1))]
      gdas = [gda, *(fresh_gda() for _ in range(n_args - 1))]
      res = _common.interleaved({
          "jax.Array": lambda f=f, a=arrs: jax.block_until_ready(f(*a)),
          "GlobalDeviceArray": lambda f=f, g=gdas: jax.block_until_ready(f(*g)),
      }, n=n)
      rows += _common.report(f"dispatch, {n_dev} device(s), {n_args} arg(s)", res, "jax.Array")
    with parallel_functions_output_gda(True):
      f = jax.jit(lambda x: x + 1)
      res = _common.interleaved({
          "jax.Array": lambda f=f, a=arr: f(a).block_until_ready(),
          "GlobalDeviceArray": lambda f=f, g=gda: f(g).block_until_ready(),
      }, n=n)
      rows += _common.report(f"dispatch, {n_dev} device(s), output flag on", res, "jax.Array")
  return rows


if __name__ == "__main__":
  _common.print_environment()
  run()
