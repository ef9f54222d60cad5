"""Worker: GDAs that span processes, next to the same `jax.Array`s.

* `jax.device_put(gda, NamedSharding(global_mesh, spec))` reshards a GDA
  spanning processes exactly as stock reshards its `jax.Array` (every target
  spec; a pytree mixing GDAs and `jax.Array`s; the same outcome under each
  transfer guard level), and the ledger records the reshard;
* a fully replicated GDA (a jitted loss with the output flag on) gives its
  value on every process: `float`, `.item()`, `format`, `np.asarray`, as the
  same `jax.Array` does.

Run by `test_multiprocess_arrays.py` through `_multihost.py`.
"""

from _worker_boot import boot, main_guard

ctx = boot()

import itertools  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_sharding_ext as jse  # noqa: E402
from jax_sharding_ext import GlobalDeviceArray  # noqa: E402

SPECS = [P(), P("x"), P("y"), P("x", "y"), P("y", "x"), P(("x", "y")), P(None, "x")]
DATA = np.arange(64, dtype=np.float32).reshape(8, 8)


def gathered(x):
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def outcome(fn):
  try:
    return "ok", fn()
  except Exception as e:  # compared between the GDA and its jax.Array
    return "error", type(e).__name__


def check_reshards(mesh):
  for src, dst in itertools.product(SPECS, SPECS):
    g = GlobalDeviceArray.from_callback(DATA.shape, mesh, src, lambda i: DATA[i])
    x = g.to_jax_array()
    target = NamedSharding(mesh, dst)
    ours, stock = jax.device_put(g, target), jax.device_put(x, target)
    assert type(ours) is type(stock), (src, dst, type(ours))
    assert ours.sharding == stock.sharding == target, (src, dst, ours.sharding)
    np.testing.assert_array_equal(gathered(ours), DATA)
    for a, b in zip(ours.addressable_shards, stock.addressable_shards, strict=True):
      assert a.device == b.device and a.index == b.index
      np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    assert not g.is_deleted()
  ctx.log(f"{len(SPECS) ** 2} reshards ok")


def check_pytree_and_ledger(mesh):
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh, P("x", "y"), lambda i: DATA[i])
  x = jax.device_put(DATA, NamedSharding(mesh, P("x")))
  tree = {"g": g, "x": x, "n": [g]}
  with jse.transfer_ledger() as ledger:
    out = jax.device_put(tree, NamedSharding(mesh, P("y")))
  assert all(type(v) is jax.Array or isinstance(v, jax.Array) for v in jax.tree.leaves(out))
  for leaf in jax.tree.leaves(out):
    assert not isinstance(leaf, GlobalDeviceArray)
    np.testing.assert_array_equal(gathered(leaf), DATA)
  records = [(r.direction, r.explicit) for r in ledger.records]
  assert records == [("device_to_device", True)] * 2, records  # the two GDA leaves
  local = NamedSharding(mesh, P("y"))
  assert ledger.records[0].nbytes == (
      DATA.nbytes // 2 * len(local.addressable_devices)), ledger.records[0]
  assert ledger.records[0].site.endswith(".py:" + ledger.records[0].site.split(":")[-1])
  ctx.log("pytree and ledger ok")


def check_guard_levels(mesh):
  target = NamedSharding(mesh, P("y"))
  for level in ("allow", "log", "disallow", "log_explicit", "disallow_explicit"):
    g = GlobalDeviceArray.from_callback(DATA.shape, mesh, P("x"), lambda i: DATA[i])
    x = g.to_jax_array()
    with jax.transfer_guard(level):
      ours = outcome(lambda g=g: jax.device_put(g, target).sharding)
      stock = outcome(lambda x=x: jax.device_put(x, target).sharding)
    assert ours == stock, (level, ours, stock)
  ctx.log("guard levels ok")


def check_replicated_scalars(mesh):
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh, P("x", "y"), lambda i: DATA[i])
  assert not g.is_fully_addressable
  with jse.parallel_functions_output_gda(True):
    loss = jax.jit(lambda v: (v ** 2).mean())(g)
    rows = jax.jit(lambda v: v.sum(0), out_shardings=NamedSharding(mesh, P()))(g)
  assert isinstance(loss, GlobalDeviceArray) and loss.is_fully_replicated, type(loss)
  assert not loss.is_fully_addressable
  x = loss.to_jax_array()
  want = float((DATA ** 2).mean())
  assert float(loss) == float(x) == want
  assert loss.item() == x.item() == want
  assert f"{loss:.3f}" == f"{x:.3f}" == f"{want:.3f}"
  assert np.asarray(loss) == np.asarray(x) == want
  assert int(loss) == int(x) and complex(loss) == complex(x) and bool(loss) == bool(x)
  np.testing.assert_array_equal(np.asarray(rows), DATA.sum(0))
  assert rows.tolist() == rows.to_jax_array().tolist()
  # Not replicated: still refused, as stock refuses the same jax.Array.
  assert outcome(lambda: np.asarray(g))[0] == outcome(lambda: np.asarray(g.to_jax_array()))[0]
  assert outcome(lambda: np.asarray(g))[0] == "error"
  ctx.log("replicated scalars ok")


def main():
  n = ctx.num_processes
  assert jax.process_count() == n
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  check_reshards(mesh)
  check_pytree_and_ledger(mesh)
  check_guard_levels(mesh)
  check_replicated_scalars(mesh)
  multihost_utils.sync_global_devices("jse_global_arrays_done")


if __name__ == "__main__":
  main_guard(main)
