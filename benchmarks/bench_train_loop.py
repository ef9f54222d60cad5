"""A training loop over a dict of 20 donated GDA leaves vs the same loop over
`jax.Array` leaves.

`step = jax.jit(update, donate_argnums=0)` updates every leaf of the state
(mixed shapes, `big` a few MiB in all, `small` a few KiB: dispatch-bound) and
the outputs are fed back, as in a training loop. The GDA loop runs with the
output flag on (outputs come back as GDAs, as GDA-era code had it); the
`jax.Array` loop with it off. Samples are whole steps (dispatch + compute +
`block_until_ready`), interleaved; medians reported.

Target: GDA / jax.Array <= 1.10x on 1 device and on 8.

Where the time goes (small state, 1 device, JAX 0.10.2; a step is ~85 us
for `jax.Array` on a quiet machine): the GDA step adds ~13 us, in two equal
parts. Dispatch: jit's C++ path calls the package's flatten function for
each GDA argument (its sole-owner key, `_jax.dispatch.view_flatten`) and its
unflatten function for each GDA output (`_array.gda.rebuild`): ~0.3 us a leaf,
~6.5 us for 20 (dispatch alone: ~25 us against ~18.5 us). And
`jax.block_until_ready`: stock waits for all `jax.Array` leaves in one C++
call (`batched_block_until_ready`, ~4 us for 20) and calls each other leaf's
`block_until_ready()` (~0.5 us a GDA leaf, ~10.6 us for 20). Neither is
more than one Python call a leaf; what is left is that call. With a few MiB
of state (`big`) or 8 devices the ratio is 1.02x-1.07x.

Run: `.venv/bin/python benchmarks/bench_train_loop.py [--n 300]`
"""

import argparse

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts
import jax
import numpy as np
from _targets import Target, at_most, ratio
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, parallel_functions_output_gda

LEAVES = 20


def _shapes(size: str) -> list[tuple[int, int]]:
  """20 mixed 2-D shapes, every dimension a multiple of 8 (any mesh divides)."""
  base = [(512, 256), (256, 256), (128, 64), (256, 128), (64, 64)] if size == "big" else [
      (8, 8), (16, 8), (8, 16), (8, 24), (8, 8)]
  return [base[i % len(base)] for i in range(LEAVES)]


def _update(state):
  return {k: v * 0.999 + 0.001 for k, v in state.items()}


def run(n: int = 300) -> list[dict]:
  rows = []
  devs = jax.devices()
  for n_dev, mesh_shape in ((1, (1, 1)), (8, (4, 2))):
    mesh = Mesh(np.array(devs[:n_dev]).reshape(mesh_shape), ("x", "y"))
    sharding = NamedSharding(mesh, P("x", "y"))
    for size in ("big", "small"):
      shapes = _shapes(size)
      nbytes = sum(4 * a * b for a, b in shapes)
      host = {f"w{i}": np.full(s, i, np.float32) for i, s in enumerate(shapes)}
      step = jax.jit(_update, donate_argnums=0)
      loops = {
          "arrays": {k: jax.device_put(v, sharding) for k, v in host.items()},
          "gdas": {k: GlobalDeviceArray.from_callback(v.shape, mesh, P("x", "y"),
                                                      lambda i, v=v: v[i])
                   for k, v in host.items()},
      }

      def array_step(loops=loops, step=step):
        loops["arrays"] = jax.block_until_ready(step(loops["arrays"]))

      def gda_step(loops=loops, step=step):
        with parallel_functions_output_gda(True):
          loops["gdas"] = jax.block_until_ready(step(loops["gdas"]))

      res = _common.interleaved({"jax.Array": array_step, "GlobalDeviceArray": gda_step},
                                n=n, warmup=5)
      assert all(type(v) is GlobalDeviceArray for v in loops["gdas"].values())
      for k in host:  # the same values after the same steps
        np.testing.assert_allclose(np.asarray(loops["gdas"][k]),
                                   np.asarray(loops["arrays"][k]), rtol=1e-6)
      rows += _common.report(
          f"training loop, {n_dev} device(s), {LEAVES} donated leaves, {size} "
          f"({nbytes / 2 ** 20:.2f} MiB)", res, "jax.Array")
  return rows


def targets() -> list[Target]:
  return [at_most(f"training loop, {d} device(s), 20 donated leaves, {size}: GDA / jax.Array",
                  ratio(f"training loop, {d} device(s), 20 donated leaves, {size}",
                        "GlobalDeviceArray", "jax.Array"), 1.10, "{:.2f}x")
          for d in (1, 8) for size in ("big", "small")]


if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=300, help="interleaved steps per variant")
  args = ap.parse_args()
  _common.print_environment()
  run(args.n)
