"""Saving and restoring a 256 MiB float32 array over 8 devices: GB/s of
`jax_sharding_ext.serialization` (a GlobalDeviceArray) against stock
`jax.experimental.array_serialization` (the same bytes as a `jax.Array`),
for both kinds of metadata the package writes.

- GDA-era metadata (the package's default: zarr, gzip, one chunk per shard,
  as `jax.experimental.gda_serialization` wrote): stock is given the same
  metadata in its spec, so both write and read identical checkpoints;
- stock metadata (`metadata="stock"`: zstd): stock writes with its own
  defaults, as the package does.

A third save variant, stock with its own zstd metadata next to the gzip
ones, shows what the old format costs by itself.

Both write zarr through tensorstore to the same local disk (`--dir`, default
a temporary directory), mesh 4x2, `P('x', 'y')`. Saves go to a fresh
directory each time (removed after the clock stops); restores read one
checkpoint of each kind, written once, onto the same sharding. Samples of
every variant are interleaved (`_common.interleaved`); medians are reported
as throughput (GB/s, 1e9 bytes per second; ratio > 1 is faster than stock).

What the wrapper adds per call: the input checks, the commit marker (one
small key written before the save and deleted after it), the chunk record
(one small key per array, after the writes; for zstd the crc32 of every chunk
written, taken from the page cache as each chunk file lands) and, on restore, one extra metadata
open, one marker read and the chunk check (the record read, each chunk read
by this process stat-ed, and for zstd its bytes checked against the recorded
crc32, concurrently with the read, unless its file is unchanged since it
was last checked). Target: >= 0.95x stock's throughput on the same
metadata, for saves and restores (>= 0.97x for the zstd save).

Restores run twice over: from unchanged files (tensorstore serves them from
its chunk cache, and the package checks no chunk twice), and after the files
changed (every chunk file's time stamps are moved after each sample, so
tensorstore reads every chunk again and the package checks every chunk
again). The second also restores a copy of the package's checkpoint without
its chunk record, which the package restores unchecked, as stock's: the
ratio of the two is the cost of the check (target: at most 5%).

Where the time goes in a zstd save (`metadata="stock"`; JAX 0.10.2, 8 CPU
devices, 2 cores, a loaded machine (load 4-13): time stamps around stock's
writes, 12-16 saves per run, medians): stock's writes take ~0.45-1.1 s here
(~0.46 s on a quiet machine), with about one core busy: it copies each
shard to pinned host memory (on CPU a real copy: ~140 ms for 256 MiB),
tensorstore compresses the 8 chunks of ~31 MB and writes each to
`<key>.__lock`, then renames it into place; the chunks land over the last
~30% of the write, the last two together at its end. The package adds
~2 ms before the writes (input checks, the commit marker, the mark) and
after them, before, 13-26 ms: the crc32 of every chunk file for the record,
read back from the page cache (mapped, isal crc32: ~1.5-6 ms a chunk), then
the commit marker and the record (~0.6 ms). Now a helper thread polls for
the chunk files (every 2 ms, at most ~5% of a core) and hands each one that
lands to the crc32 workers while tensorstore still compresses the others;
the record uses that crc32 if the file's state (inode, size, times) is still
the one read, and reads any other chunk itself (one written again, one that
landed after the last poll). After the writes that leaves 5-8 ms (the last
one or two chunks, read in parallel), ~2.3 ms before them: ~7 ms in all,
~1.5% of a quiet save, against ~15 ms before.

Run: `.venv/bin/python benchmarks/bench_checkpoint.py [--reps 7] [--mib 256] [--dir D]`
"""

import argparse
import itertools
import os
import shutil
import tempfile

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts
import jax
import numpy as np
from _targets import Target, at_least, at_most, ratio
from jax.experimental.array_serialization import serialization as stock
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization

# The first names are the ones benchmarks/run_all.py reads (the default metadata).
OURS_SAVE, STOCK_SAVE = "serialization.run_serialization (GDA)", "stock run_serialization"
OURS_SAVE_Z = "serialization, metadata='stock' (GDA)"
STOCK_SAVE_Z = "stock, its own zstd metadata"
OURS_LOAD, STOCK_LOAD = "serialization.run_deserialization (GDA)", "stock run_deserialization"
OURS = {OURS_SAVE, OURS_SAVE_Z, OURS_LOAD}
OURS_UNCHECKED = "serialization, chunk record removed (unchecked)"
GZIP, ZSTD = "GDA-era metadata (gzip, the default)", "stock metadata (zstd)"
RECORD = "jax_sharding_ext.chunks.0"  # the chunk record process 0 writes
OWN_MARK = ".jax_sharding_ext"  # the mark saying the package wrote the checkpoint


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

  def save_ours(**kw):
    p = path()
    serialization.run_serialization([gda], [serialization.get_tensorstore_spec(p)], **kw)
    return p

  def save_stock(gda_metadata: bool):
    p = path()
    tspec = stock.get_tensorstore_spec(p)
    if gda_metadata:
      tspec["metadata"] = serialization._get_metadata(arr)
    stock.run_serialization([arr], [tspec])
    return p

  written = {GZIP: save_ours(), ZSTD: save_stock(gda_metadata=False)}
  # The package's checkpoints (with chunk records), and copies without a
  # record or the package's mark (read as another writer's: unchecked).
  checked = {GZIP: written[GZIP], ZSTD: save_ours(metadata="stock")}
  unchecked = {kind: path() for kind in checked}
  for kind in checked:
    shutil.copytree(checked[kind], unchecked[kind])
    for name in (RECORD, OWN_MARK):
      os.remove(os.path.join(unchecked[kind], name))
  sharding = NamedSharding(mesh, spec)

  def load_ours(kind, where=written):
    return serialization.run_deserialization(
        [sharding], [serialization.get_tensorstore_spec(where[kind])])[0].block_until_ready()

  def load_stock(kind, where=written):
    return stock.run_deserialization(
        [sharding], [stock.get_tensorstore_spec(where[kind])])[0].block_until_ready()

  stamp = itertools.count(1)

  def files_changed(out) -> None:
    """Free `out`, then move every chunk file's time stamps: tensorstore and
    the package then read and check every chunk again."""
    out.delete()
    t = 10**9 * (1_600_000_000 + next(stamp))
    for where in (checked, unchecked):
      for d in where.values():
        for name in os.listdir(d):
          os.utime(os.path.join(d, name), ns=(t, t))

  # The same bytes come back every way.
  for kind in written:
    for out in (load_ours(kind), load_stock(kind), load_ours(kind, checked),
                load_ours(kind, unchecked)):
      np.testing.assert_array_equal(np.asarray(out), host)
      out.delete()

  try:
    saves = _common.interleaved({
        f"{GZIP}|{OURS_SAVE}": save_ours,
        f"{GZIP}|{STOCK_SAVE}": lambda: save_stock(gda_metadata=True),
        f"{GZIP}|{STOCK_SAVE_Z}": lambda: save_stock(gda_metadata=False),
        f"{ZSTD}|{OURS_SAVE_Z}": lambda: save_ours(metadata="stock"),
        f"{ZSTD}|{STOCK_SAVE}": lambda: save_stock(gda_metadata=False),
    }, n=reps, warmup=1, teardown=shutil.rmtree)
    loads = _common.interleaved({
        f"{kind}|{name}": (lambda f=f, kind=kind: f(kind))
        for kind in (GZIP, ZSTD) for name, f in ((OURS_LOAD, load_ours), (STOCK_LOAD, load_stock))
    }, n=reps, warmup=1, teardown=lambda x: x.delete())
    fresh = _common.interleaved({
        f"{kind}|{name}": (lambda f=f, kind=kind, where=where: f(kind, where))
        for kind in (GZIP, ZSTD)
        for name, f, where in ((OURS_LOAD, load_ours, checked),
                               (OURS_UNCHECKED, load_ours, unchecked),
                               (STOCK_LOAD, load_stock, checked))
    }, n=reps, warmup=1, teardown=files_changed)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  return _report(host.nbytes, saves, loads) + _report_check(host.nbytes, fresh)


def _report_check(nbytes: int, medians: dict) -> list[dict]:
  """Restores after the files changed: the package (checked, unchecked) and stock."""
  size = f"{nbytes / 2 ** 20:.0f} MiB float32 over 8 devices"
  rows = []
  for kind in (GZIP, ZSTD):
    got = {k.split("|", 1)[1]: nbytes / v for k, v in medians.items()
           if k.startswith(f"{kind}|")}
    rows += _common.report(f"checkpoint restore after the files changed, {size}, {kind}", got,
                           STOCK_LOAD, unit=1e9, unit_name="GB/s")
    cost = got[OURS_UNCHECKED] / got[OURS_LOAD] - 1
    print(f"  restore after the files changed, {kind}: GDA / stock throughput "
          f"{got[OURS_LOAD] / got[STOCK_LOAD]:.3f}x; cost of the chunk check (checked vs "
          f"unchecked time) {100 * cost:+.1f}% (target <= 5%: {'ok' if cost <= 0.05 else 'MISSED'})")
  return rows


def _report(nbytes: int, saves: dict, loads: dict) -> list[dict]:
  size = f"{nbytes / 2 ** 20:.0f} MiB float32 over 8 devices"
  rows, throughput = [], {}
  for what, medians, base in (("checkpoint save", saves, STOCK_SAVE),
                              ("checkpoint restore", loads, STOCK_LOAD)):
    for kind in (GZIP, ZSTD):
      got = {k.split("|", 1)[1]: nbytes / v for k, v in medians.items()
             if k.startswith(f"{kind}|")}
      throughput[what, kind] = got
      rows += _common.report(f"{what}, {size}, {kind}", got, base, unit=1e9, unit_name="GB/s")
      ratio = next(v for k, v in got.items() if k in OURS) / got[base]
      limit = _limit(what, kind)
      print(f"  {what}, {kind}: GDA / stock throughput {ratio:.3f}x  "
            f"(target >= {limit}x: {'ok' if ratio >= limit else 'MISSED'})")
  gzip_save = throughput["checkpoint save", GZIP][OURS_SAVE]
  zstd_save = throughput["checkpoint save", ZSTD][OURS_SAVE_Z]
  gzip_load = throughput["checkpoint restore", GZIP][OURS_LOAD]
  zstd_load = throughput["checkpoint restore", ZSTD][OURS_LOAD]
  print(f"\n  the GDA-era format (gzip) / metadata='stock' (zstd), this package: save "
        f"{gzip_save / zstd_save:.2f}x, restore {gzip_load / zstd_load:.2f}x")
  return rows


def _limit(what: str, kind: str) -> float:
  """The target GDA / stock throughput of a save or restore of `kind`."""
  return 0.97 if (what, kind) == ("checkpoint save", ZSTD) else 0.95


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=7, help="interleaved samples per variant")
  ap.add_argument("--mib", type=int, default=256, help="array size in MiB")
  ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
  args = ap.parse_args()
  _common.print_environment()
  run(reps=args.reps, mib=args.mib, directory=args.dir)


def targets() -> list[Target]:
  formats = (("gzip", GZIP), ("zstd", ZSTD))
  after = "checkpoint restore after the files changed, 256 MiB float32 over 8 devices"
  return [
      *(at_least(f"{what}, 256 MiB over 8 devices, {fmt}: GDA / stock jax.Array (GB/s)",
                 ratio(f"{what}, 256 MiB float32 over 8 devices, {kind}", ours, base),
                 _limit(what, kind), "{:.2f}x", note)
        for fmt, kind in formats
        for what, ours, base, note in (
            ("checkpoint save", OURS_SAVE if kind == GZIP else OURS_SAVE_Z, STOCK_SAVE,
             "" if kind == GZIP else "zstd: the crc32 of every chunk file written (the "
             "record that makes a damaged chunk an error), taken as each file lands"),
            ("checkpoint restore", OURS_LOAD, STOCK_LOAD, ""))),
      *(at_least(f"checkpoint restore after the files changed, 256 MiB, {fmt}: GDA (chunks "
                 "checked) / stock jax.Array (GB/s)",
                 ratio(f"{after}, {kind}", OURS_LOAD, STOCK_LOAD), 0.95,
                 "{:.3f}x") for fmt, kind in formats),
      *(at_most(f"checkpoint restore after the files changed, 256 MiB, {fmt}: time with the "
                "chunk check / without (checked vs unchecked restore)",
                ratio(f"{after}, {kind}", OURS_UNCHECKED, OURS_LOAD), 1.05, "{:.3f}x",
                "zstd: a crc32 pass over every chunk read, competing for the cores with "
                "tensorstore's reads") for fmt, kind in formats),
  ]


if __name__ == "__main__":
  main()
