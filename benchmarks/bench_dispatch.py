"""Dispatch cost of a tiny jitted function: GlobalDeviceArray vs jax.Array.

Targets: a GDA within 1.1x of jax.Array on 1 device and at its speed (1.0x)
on 8, a sole owner of its buffers (`from_callback`) and a shared GDA (made
with `from_jax_array` from an array the program keeps) alike. A GDA whose
buffers the program also holds (the `jax.Array` it was made from, or one
`to_jax_array()` returned, kept in a variable) within 1.05x of a sole-owner
GDA, for a function that donates nothing and for a donating step, with the
jitted function's C++ cache size constant.

Where the time goes (instructions per call counted with callgrind, which a
busy machine does not change; JAX 0.10.2, Python 3.11, 1 device): a warm
call of a GDA runs no Python of this package but the flatten function jit's
C++ fast path calls for each GDA argument (`_jax.dispatch.view_flatten`),
~2.9k instructions a GDA against ~16k a leaf for a whole `jax.Array` call
(`x * 2 + 1` of a small array): ~1.1k in jaxlib's handling of a custom
pytree node (the Python call, its result tuples, the node data compared
with the cached call's), ~0.7k the function's bytecode (the reference count,
one slot, a gate global), ~0.2k `is_deleted()` (a donated GDA must not reach
the executable: with 8 devices that crashes the process). A shared GDA
whose buffers are alive used to add a Python `AliasKey.__eq__` call and a
key object per call (1.74x the instructions of stock at 1,000 leaves,
against 1.21x for a sole owner); it now flattens to one `KEYED` object that
C++ matches by identity (1.19x against 1.18x), plus, on several devices, a
`is_deleted()` of each later shard (another array over one may have freed
it). With the output flag on, each GDA output costs ~2.6k more in its
unflatten function (`_array.gda.rebuild`: a Python object allocated and
later freed, six slots set), and twice the objects make Python's collector
run twice as often.

Run: .venv/bin/python benchmarks/bench_dispatch.py
"""

import _common  # first: sets XLA_FLAGS before JAX starts
import jax
import numpy as np
from _targets import Target, at_most, ratio
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

    def fresh_gda(sharding=sharding):
      return _sole_owner(sharding, (8, 8))

    arr, gda = fresh_array(), fresh_gda()
    for n_args in (1, 10):
      f = jax.jit(lambda *xs: [x + 1 for x in xs])
      arrs = [arr, *(fresh_array() for _ in range(n_args - 1))]
      gdas = [gda, *(fresh_gda() for _ in range(n_args - 1))]
      kept = [fresh_array() for _ in range(n_args)]  # alive: the GDAs made from them are shared
      shared = [GlobalDeviceArray.from_jax_array(a) for a in kept]
      res = _common.interleaved({
          "jax.Array": lambda f=f, a=arrs: jax.block_until_ready(f(*a)),
          "GlobalDeviceArray": lambda f=f, g=gdas: jax.block_until_ready(f(*g)),
          SHARED: lambda f=f, g=shared: jax.block_until_ready(f(*g)),
      }, n=n)
      rows += _common.report(f"dispatch, {n_dev} device(s), {n_args} arg(s)", res, "jax.Array")
    rows += _shared_buffers(n, n_dev, sharding, fresh_array, fresh_gda)
    with parallel_functions_output_gda(True):
      f = jax.jit(lambda x: x + 1)
      res = _common.interleaved({
          "jax.Array": lambda f=f, a=arr: f(a).block_until_ready(),
          "GlobalDeviceArray": lambda f=f, g=gda: f(g).block_until_ready(),
      }, n=n)
      rows += _common.report(f"dispatch, {n_dev} device(s), output flag on", res, "jax.Array")
  return rows


SHARED = "GlobalDeviceArray made from a kept jax.Array"


def _sole_owner(sharding, shape) -> GlobalDeviceArray:
  """A GDA that is the only owner of its buffers, as one `from_callback`
  builds from host data or a jit returns. A GDA made from a `jax.Array`
  (`from_jax_array`) or one that handed its buffers out (`to_jax_array()`)
  is shared for as long as it lives: jit's dispatch watches its buffers."""
  data = np.ones(shape, np.float32)
  return GlobalDeviceArray.from_callback(shape, sharding.mesh, sharding.spec,
                                         lambda index: data[index])


def _shared_buffers(n, n_dev, sharding, fresh_array, fresh_gda) -> list[dict]:
  """Sole-owner GDA vs a GDA whose buffers a live `jax.Array` also holds."""
  rows = []
  x = fresh_array()
  made_from_x = GlobalDeviceArray.from_jax_array(x)  # `x` stays alive
  viewed = fresh_gda()
  view = viewed.to_jax_array()  # kept alive
  sole = fresh_gda()
  f = jax.jit(lambda v: v * 2)
  res = _common.interleaved({
      "sole owner": lambda g=sole: f(g).block_until_ready(),
      "made from a kept jax.Array": lambda g=made_from_x: f(g).block_until_ready(),
      "to_jax_array() kept": lambda g=viewed: f(g).block_until_ready(),
  }, n=n)
  rows += _common.report(f"shared buffers, {n_dev} device(s), no donation", res, "sole owner")
  rows += _cache_rows(f"shared buffers, {n_dev} device(s), no donation", f,
                      lambda: f(made_from_x))
  # A donating training step: the state chain is donated, the batch GDA
  # shares its buffers with a kept `jax.Array` (or not).
  step = jax.jit(lambda state, b: state + b.sum(), donate_argnums=0)
  batch_x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(sharding.mesh, P("x")))
  shared_batch = GlobalDeviceArray.from_jax_array(batch_x)
  sole_batch = _sole_owner(batch_x.sharding, batch_x.shape)
  states = {"sole owner": fresh_gda(), "batch made from a kept jax.Array": fresh_gda()}

  def stepper(name, batch):
    def call():
      states[name] = step(states[name], batch)
      states[name].block_until_ready()
    return call

  with parallel_functions_output_gda(True):
    res = _common.interleaved({
        "sole owner": stepper("sole owner", sole_batch),
        "batch made from a kept jax.Array": stepper("batch made from a kept jax.Array",
                                                    shared_batch),
    }, n=n)
    rows += _common.report(f"shared buffers, {n_dev} device(s), donating step", res,
                           "sole owner")
    name = "batch made from a kept jax.Array"
    rows += _cache_rows(f"shared buffers, {n_dev} device(s), donating step", step,
                        stepper(name, shared_batch))
  del x, view
  return rows


def _cache_rows(title: str, f, call, calls: int = 500) -> list[dict]:
  """The jitted function's C++ cache size before and after `calls` more calls."""
  before = f._cache_size()
  for _ in range(calls):
    call()
  after = f._cache_size()
  print(f"  C++ cache entries: {before} before, {after} after {calls} more calls")
  return [{"benchmark": title, "variant": f"cache entries added by {calls} calls",
           "median": float(after - before), "unit": "entries", "ratio": float("nan"),
           "base": "-"}]


def targets() -> list[Target]:
  out = [Target(f"shared buffers, {n_dev} device(s), {case}: C++ cache entries added by "
                "500 calls", "0",
                lambda r, t=f"shared buffers, {n_dev} device(s), {case}":
                r.median(t, "cache entries added by 500 calls"), "{:.0f}", lambda v: v == 0)
         for n_dev in (1, 8) for case in ("no donation", "donating step")]
  out += [at_most(f"dispatch, {n_dev} device(s), {case}: GDA / jax.Array",
                  ratio(f"dispatch, {n_dev} device(s), {case}", "GlobalDeviceArray",
                        "jax.Array"), limit, "{:.2f}x")
          for n_dev, limit in ((1, 1.1), (8, 1.0))
          for case in ("1 arg(s)", "10 arg(s)", "output flag on")]
  out += [at_most(f"dispatch, {n_dev} device(s), {case}: shared GDA / jax.Array",
                  ratio(f"dispatch, {n_dev} device(s), {case}", SHARED, "jax.Array"), limit,
                  "{:.2f}x")
          for n_dev, limit in ((1, 1.1), (8, 1.0)) for case in ("1 arg(s)", "10 arg(s)")]
  out += [at_most(f"shared buffers, {n_dev} device(s), {case}: {variant} / sole owner",
                  ratio(f"shared buffers, {n_dev} device(s), {case}", variant, "sole owner"),
                  1.05, "{:.2f}x")
          for n_dev in (1, 8)
          for case, variant in (("no donation", "made from a kept jax.Array"),
                                ("no donation", "to_jax_array() kept"),
                                ("donating step", "batch made from a kept jax.Array"))]
  return out


if __name__ == "__main__":
  _common.print_environment()
  run()
