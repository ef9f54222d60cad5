"""Saving and restoring a 256 MiB float32 array over 8 devices: GB/s of
`jax_sharding_ext.serialization` (a GlobalDeviceArray) against stock
`jax.experimental.array_serialization` (the same bytes as a `jax.Array`).

Both write zarr through tensorstore to the same local disk (`--dir`, default
a temporary directory), mesh 4x2, `P('x', 'y')`. Saves go to a fresh
directory each time (removed after the clock stops); restores read one
checkpoint written once, onto the same sharding. Samples are interleaved
(`_common.interleaved`); medians are reported as throughput (GB/s, 1e9
bytes per second; ratio > 1 is faster than stock).

What the wrapper adds per call: the input checks, the commit marker (one
small key written before the save and deleted after it) and, on restore, one
extra metadata open and one marker read. Target (issue 12): >= 0.95x stock
for both.

Run: `.venv/bin/python benchmarks/bench_checkpoint.py [--reps 7] [--mib 256] [--dir D]`
"""

import argparse
import itertools
import shutil
import tempfile

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts
import jax
import numpy as np
from jax.experimental.array_serialization import serialization as stock
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization

OURS_SAVE, STOCK_SAVE = "serialization.run_serialization (GDA)", "stock run_serialization"
OURS_LOAD, STOCK_LOAD = "serialization.run_deserialization (GDA)", "stock run_deserialization"


def run(reps: int = 7, mib: int = 256, directory: str | None = None) -> list[dict]:
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
  spec = P("x", "y")
  cols = 8192
  shape = (mib * 2 ** 20 // (4 * cols), cols)
  host = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
  gda = GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: host[i])
  arr = gda.to_jax_array()
  root = tempfile.mkdtemp(prefix="bench_checkpoint_", dir=directory)
  counter = itertools.count()
  print(f"\ncheckpoint: {host.nbytes / 2 ** 20:.0f} MiB float32 over 8 devices, mesh 4x2, "
        f"P('x', 'y'), zarr in {root}; {reps} interleaved samples each")

  def path():
    return f"{root}/c{next(counter)}"

  def save_ours():
    p = path()
    serialization.run_serialization([gda], [serialization.get_tensorstore_spec(p)])
    return p

  def save_stock():
    p = path()
    stock.run_serialization([arr], [stock.get_tensorstore_spec(p)])
    return p

  written = save_stock()
  sharding = NamedSharding(mesh, spec)

  def load_ours():
    return serialization.run_deserialization(
        [mesh], [spec], [serialization.get_tensorstore_spec(written)])[0].block_until_ready()

  def load_stock():
    return stock.run_deserialization(
        [sharding], [stock.get_tensorstore_spec(written)])[0].block_until_ready()

  # The same bytes come back either way.
  a, b = load_ours(), load_stock()
  np.testing.assert_array_equal(np.asarray(a), host)
  np.testing.assert_array_equal(np.asarray(b), host)
  del a, b

  try:
    saves = _common.interleaved({OURS_SAVE: save_ours, STOCK_SAVE: save_stock}, n=reps,
                                warmup=1, teardown=shutil.rmtree)
    loads = _common.interleaved({OURS_LOAD: load_ours, STOCK_LOAD: load_stock}, n=reps,
                                warmup=1, teardown=lambda x: x.delete())
  finally:
    shutil.rmtree(root, ignore_errors=True)
  rows = []
  for title, medians, base in (("checkpoint save", saves, STOCK_SAVE),
                               ("checkpoint restore", loads, STOCK_LOAD)):
    throughput = {k: host.nbytes / v for k, v in medians.items()}
    rows += _common.report(f"{title}, {host.nbytes / 2 ** 20:.0f} MiB float32 over 8 devices",
                           throughput, base, unit=1e9, unit_name="GB/s")
    ratio = next(v for k, v in throughput.items() if k != base) / throughput[base]
    print(f"  {title} GDA / stock throughput: {ratio:.3f}x  "
          f"(target >= 0.95x: {'ok' if ratio >= 0.95 else 'MISSED'})")
  return rows


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=7, help="interleaved samples per variant")
  ap.add_argument("--mib", type=int, default=256, help="array size in MiB")
  ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
  args = ap.parse_args()
  _common.print_environment()
  run(reps=args.reps, mib=args.mib, directory=args.dir)


if __name__ == "__main__":
  main()
