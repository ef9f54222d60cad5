"""A GDA-era training step through legacy `pjit`, per call, against stock
`jax.jit` on the same arrays.

The state is a dict of 26 small leaves (a few KiB: dispatch-bound), donated
to every step and fed back, on 1 device and on a 4 x 2 mesh; each sample is a
whole step (`block_until_ready` included). Side by side, interleaved:

* stock: `jax.jit(step, donate_argnums=0)` on `jax.Array` leaves (the base);
* `jax.jit(step, donate_argnums=0)` on GDA leaves;
* `pjit(step, in_axis_resources=FROM_GDA, out_axis_resources=P('x', 'y'),
  donate_argnums=0)` on GDA leaves, the GDA era's recommended spelling;
* `pjit(step, in_axis_resources=P('x', 'y'), ...)` on GDA leaves;

each with the output flag off and on (on: the outputs come back as GDAs, as
GDA-era code had it). Medians; ratios against stock.

Targets: both `pjit` spellings at most 1.05x stock `jax.jit` on the same
GDAs (the same flag), on 1 and 8 devices, flag off and on: `pjit` at
`jax.jit`'s speed. What `jax.jit` itself costs on GDAs against `jax.Array`s
(one Python call per leaf in and out of jit and in `jax.block_until_ready`)
is the dispatch benchmarks' subject.

Where the time goes: a `pjit` call is `jax.jit`'s call plus a few Python
frames: JAX's traceback boundary, the check that a `FROM_GDA` argument has a
`NamedSharding` to take (a set of the leaves' types: all GDAs), the context
mesh (`with mesh:` / `jax.set_mesh`; ~1 us, most of it JAX's own config
read) and the `jax.jit` for that mesh, reused from the last call when the
mesh is the same object; errors are explained only after `jax.jit` raises.

Run: `.venv/bin/python benchmarks/bench_pjit.py [--n 300]`
"""

import argparse

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts
import jax
import numpy as np
from _targets import Target, at_most, ratio
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import FROM_GDA, GlobalDeviceArray, parallel_functions_output_gda, pjit

LEAVES = 26
STOCK = "jax.jit, jax.Array"
JIT_GDA = "jax.jit, GDA"
VARIANTS = (JIT_GDA, "pjit(FROM_GDA)", "pjit(specs)")
TARGET = 1.05


def _update(state):
  return {k: v * 0.999 + 0.001 for k, v in state.items()}


def _title(n_dev: int, flag: bool) -> str:
  return f"legacy pjit step, {n_dev} device(s), {LEAVES} donated leaves, flag {'on' if flag else 'off'}"


def run(n: int = 300) -> list[dict]:
  rows = []
  devs = jax.devices()
  for n_dev, mesh_shape in ((1, (1, 1)), (8, (4, 2))):
    mesh = Mesh(np.array(devs[:n_dev]).reshape(mesh_shape), ("x", "y"))
    sharding = NamedSharding(mesh, P("x", "y"))
    shapes = [(8 * (1 + i % 3), 8 * (1 + i % 2)) for i in range(LEAVES)]
    host = {f"w{i:02d}": np.full(s, i, np.float32) for i, s in enumerate(shapes)}
    fns = {
        STOCK: jax.jit(_update, donate_argnums=0),
        JIT_GDA: jax.jit(_update, donate_argnums=0),
        "pjit(FROM_GDA)": pjit(_update, in_axis_resources=FROM_GDA,
                               out_axis_resources=P("x", "y"), donate_argnums=0),
        "pjit(specs)": pjit(_update, in_axis_resources=P("x", "y"),
                            out_axis_resources=P("x", "y"), donate_argnums=0),
    }
    for flag in (False, True):
      state = {STOCK: {k: jax.device_put(v, sharding) for k, v in host.items()}}
      for name in VARIANTS:
        state[name] = {k: GlobalDeviceArray.from_callback(v.shape, mesh, P("x", "y"),
                                                          lambda i, v=v: v[i])
                       for k, v in host.items()}

      def stepper(name, flag=flag, state=state, fns=fns, mesh=mesh):
        fn = fns[name]
        use_flag = flag and name != STOCK  # stock runs as stock does

        def step():
          with jax.set_mesh(mesh), parallel_functions_output_gda(use_flag):
            state[name] = jax.block_until_ready(fn(state[name]))
        return step

      res = _common.interleaved({name: stepper(name) for name in (STOCK, *VARIANTS)},
                                n=n, warmup=10)
      for name in VARIANTS:  # the same values after the same steps
        for k in host:
          np.testing.assert_allclose(np.asarray(state[name][k]), np.asarray(state[STOCK][k]),
                                     rtol=1e-6)
        assert all(type(v) is GlobalDeviceArray for v in state[name].values()) is flag, name
      rows += _common.report(_title(n_dev, flag), res, STOCK)
  return rows




def targets() -> list[Target]:
  return [at_most(f"{_title(n_dev, flag)}: {variant} / {JIT_GDA}",
                  ratio(_title(n_dev, flag), variant, JIT_GDA), TARGET, "{:.2f}x")
          for n_dev in (1, 8) for flag in (False, True)
          for variant in ("pjit(FROM_GDA)", "pjit(specs)")]


if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=300, help="interleaved steps per variant")
  args = ap.parse_args()
  _common.print_environment()
  run(args.n)
