"""How the cost grows with leaves, shards and bytes: GlobalDeviceArray against
`jax.Array`, point by point.

Every point runs both sides in one process, interleaved call by call
(alternating order), and reports medians. Each curve runs in its own fresh
subprocess with a hard timeout (one per device count, since the count of
virtual CPU devices is fixed when JAX starts):

* dispatch: `jax.jit` of a list of 1, 10, 100 and 1,000 (4, 4) float32 leaves
  on 1 device (the case where per-leaf overhead shows most), the output flag
  off and on, donating the list or not; the `jax.Array` side is stock (flag
  off, outputs fed back when donated). A sample is the call plus waiting for
  its last output (one execution: every output is then ready); the flag is
  switched outside the clock. Reported per call and per leaf.
* construction: `from_callback` / `from_batched_callback` against
  `jax.make_array_from_callback` of a (1024, 512) float32 array (2 MiB),
  `P('x', 'y')` on meshes 1x1, 4x2, 8x8 and 32x16 (1 to 512 devices); the
  array is deleted after the clock stops. Throughput (GB/s).
* shard math and the layout picture, 1 to 512 devices: `get_shard_indices`
  against `NamedSharding.devices_indices_map` for a new shape each call
  (nothing cached) and for the same shape; `get_shard_indices_replica_ids`
  against the (index, replica id) of stock's `jax.Array.global_shards`; the
  notebook picture `gda._repr_html_()` of a freshly wrapped GDA against
  stock's text picture `jax.debug.visualize_sharding` (rich, captured).
* transfers, 1 to 512 shards of a (64, 64) float32 array: the implicit fetch
  `np.asarray(x)` of a never-fetched array (guard check included), an
  explicit reshard `jax.device_put(x, P('y', 'x'))` judged by the guard
  (`jax.transfer_guard("disallow")`, which allows explicit transfers), and a
  GDA fetch in its own `transfer_ledger()` against one without: the median of
  paired differences, and the same with the move replaced by a no-op (what
  the ledger adds, without a fetch's own variation, which grows with shards).
* checkpoint: `jax_sharding_ext.serialization.run_serialization` /
  `run_deserialization` of a GDA (the basic calls) against stock
  `array_serialization` of the same `jax.Array` writing the same format (the
  package's compressor and chunks, read from the `.zarray` it wrote), random
  float32 data of 1 MiB to 1 GiB over 8 devices (mesh 4x2), zarr in a
  temporary directory: each save to a new directory removed after the clock
  stops, restores from one checkpoint; shards are made on their devices (no
  whole-array host copy) and freed memory is handed back to the OS between
  samples. GB/s.

Repetitions (`REPS`) keep the whole run to about four minutes on a 2-core
machine; `--quick` uses far fewer and skips the 1 GiB checkpoint. The
tables and plots of the report are drawn from the rows alone by
`scaling_report.py`.

Where the time goes in dispatch by leaves (instructions counted with
callgrind, JAX 0.10.2, 1 device, Python's collector off): stock spends about
16k instructions a leaf in a warm call (the C++ fast path, the execution and
the output arrays). Each GDA leaf adds the flatten function jit's C++ path
calls for it (`_jax.dispatch.view_flatten`), ~2.9k: ~2.1k is what jaxlib
charges any custom pytree node with a Python flatten function (the call,
the tuples it returns, iterating its children, comparing its node data),
~0.8k the function's checks (a reference count for the same GDA twice in a
call, `is_deleted()` for a donated one: either crashes stock on several
devices). With the flag on, each output adds ~2.6k in its unflatten
function (`_array.gda.rebuild`: a Python object with six slots, later
freed), and Python's collector runs twice as often (twice the objects). So a
leaf of a few bytes on one device, where stock's own cost is smallest, is
where a GDA pays most: about 1.2x with the flag off and 1.4x with it on and
donated, at any number of leaves; with more bytes or devices per leaf the
same instructions disappear in stock's (the training loop and the 8-device
rows). Nothing cheaper keeps the checks: jaxlib's other node kind (a
dataclass node, read in C++) would run none of them.

Run: `.venv/bin/python benchmarks/bench_scaling.py [--quick] [--only CURVE ...]
[--plots DIR]`
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import io
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import _common  # first: sets XLA_FLAGS before JAX starts (children set their own)
import jax
import numpy as np
from _targets import Target, at_least, at_most, worst
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, parallel_functions_output_gda

HERE = os.path.dirname(os.path.abspath(__file__))
LEAVES = (1, 10, 100, 1000)
DEVICES = (1, 8, 64, 512)
MESHES = {1: (1, 1), 8: (4, 2), 64: (8, 8), 512: (32, 16)}
CHECKPOINT_MIB = (1, 16, 256, 1024)
STOCK, GDA = "jax.Array", "GlobalDeviceArray"
# Full run; `--quick` divides each count by 5 (at least 2-5).
REPS = {
    "dispatch": {1: 3000, 10: 2000, 100: 600, 1000: 200},
    "construction": {1: 300, 8: 300, 64: 150, 512: 40},
    "shard_math": {1: 400, 8: 400, 64: 200, 512: 40},
    "picture": {1: 100, 8: 100, 64: 30, 512: 8},
    "transfers": {1: 600, 8: 400, 64: 150, 512: 40},
    # a 1 GiB save takes ~35 s here (gzip of random data): one sample
    "checkpoint save": {1: 15, 16: 9, 256: 3, 1024: 1},
    "checkpoint restore": {1: 15, 16: 9, 256: 5, 1024: 3},
}
TIMEOUT_S = {"dispatch": 300, "devices": 300, "checkpoint": 420}


def _reps(curve: str, x: int, quick: bool) -> int:
  n = REPS[curve][x]
  return max(n // 5, 5 if n >= 25 else min(n, 2)) if quick else n


def _timed(variants: dict, n: int, warmup: int = 3, samples: bool = False) -> dict:
  """Median seconds of each variant's timed call, interleaved (or, with
  `samples`, every sample: the i-th of each variant were taken side by side).

  A variant is `(context, prepare, call)`: `prepare()` runs untimed and its
  result is passed to `call`, which alone is timed, inside `context()`
  (entered and left outside the clock).
  """
  names = list(variants)
  times: dict[str, list[float]] = {k: [] for k in names}
  clock = time.perf_counter
  for i in range(warmup + n):
    for k in names if i % 2 == 0 else reversed(names):
      context, prepare, call = variants[k]
      arg = prepare()
      with context():
        t0 = clock()
        call(arg)
        dt = clock() - t0
      del arg
      if i >= warmup:
        times[k].append(dt)
  return times if samples else {k: statistics.median(v) for k, v in times.items()}


def _rows(curve: str, case: str, x: int, title: str, medians: dict, base: str,
          **kw) -> list[dict]:
  """`_common.report`'s rows, tagged with their curve, case and x for plots."""
  rows = _common.report(title, medians, base, **kw)
  for r in rows:
    r.update(curve=curve, case=case, x=x)
  return rows


def _each(items):
  """A zero-argument callable returning the next of `items` per call."""
  it = iter(items)
  return lambda: next(it)


# ---------------------------------------------------------------------------
# Curves (each runs in a child process).
# ---------------------------------------------------------------------------


def dispatch_curve(quick: bool) -> list[dict]:
  sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("x", "y")), P())
  rows = []
  for leaves, flag_on, donate in itertools.product(LEAVES, (False, True), (False, True)):
    res = _dispatch_point(sharding, leaves, flag_on, donate, _reps("dispatch", leaves, quick))
    case = f"flag {'on' if flag_on else 'off'}, {'donated' if donate else 'not donated'}"
    rows += _rows("dispatch", case, leaves, f"scaling: jit dispatch, {leaves} leaves, {case}",
                  res, STOCK)
    print(f"  per leaf: jax.Array {res[STOCK] / leaves * 1e6:.3f} us, "
          f"GDA {res[GDA] / leaves * 1e6:.3f} us", flush=True)
  return rows


def _dispatch_point(sharding, leaves: int, flag_on: bool, donate: bool, n: int) -> dict:
  host = [np.full((4, 4), i, np.float32) for i in range(leaves)]
  f = jax.jit(lambda xs: [x * 2 + 1 for x in xs], donate_argnums=0 if donate else ())
  mesh = sharding.mesh
  place = {STOCK: lambda: jax.device_put(host, sharding),
           GDA: lambda: [GlobalDeviceArray.from_callback(h.shape, mesh, P(), lambda i, h=h: h[i])
                         for h in host]}
  state = {side: make() for side, make in place.items()}
  # Donated with the flag off, outputs are jax.Arrays: then every call donates
  # freshly placed inputs instead (placed outside the clock), on both sides.
  fresh = donate and not flag_on

  def call(xs, side):
    out = f(xs)
    out[-1].block_until_ready()
    if donate and not fresh:  # feed the outputs back, as a training loop does
      state[side] = out

  on = lambda: parallel_functions_output_gda(True)
  res = _timed({side: (on if flag_on and side == GDA else contextlib.nullcontext,
                       place[side] if fresh else lambda side=side: state[side],
                       lambda xs, side=side: call(xs, side))
                for side in (STOCK, GDA)}, n)
  if donate and not fresh:  # the same number of steps on both sides: the same values
    assert all(type(g) is GlobalDeviceArray for g in state[GDA])
    np.testing.assert_array_equal(np.asarray(state[GDA][-1]), np.asarray(state[STOCK][-1]))
  return res


def _mesh(n_dev: int) -> Mesh:
  return Mesh(np.array(jax.devices()[:n_dev]).reshape(MESHES[n_dev]), ("x", "y"))


def construction_curve(n_dev: int, quick: bool) -> list[dict]:
  mesh, spec, shape = _mesh(n_dev), P("x", "y"), (1024, 512)
  sharding = NamedSharding(mesh, spec)
  host = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
  one = lambda index: host[index]
  batch = lambda indices: [host[i] for i in indices]
  fns = {
      "jax.make_array_from_callback":
          lambda: jax.make_array_from_callback(shape, sharding, one).block_until_ready(),
      "GlobalDeviceArray.from_callback":
          lambda: GlobalDeviceArray.from_callback(shape, mesh, spec, one).block_until_ready(),
      "GlobalDeviceArray.from_batched_callback": lambda: GlobalDeviceArray.from_batched_callback(
          shape, mesh, spec, batch).block_until_ready(),
  }
  for f in fns.values():  # the same bytes in the same places
    out = f()
    assert [s.device for s in out.addressable_shards] == list(mesh.devices.flat)
    np.testing.assert_array_equal(np.asarray(out), host)
    out.delete()
  res = _common.interleaved(fns, n=_reps("construction", n_dev, quick), warmup=5,
                            teardown=lambda x: x.delete())
  return _rows("construction", "", n_dev, f"scaling: construction, 2 MiB over {n_dev} devices",
               {k: host.nbytes / v for k, v in res.items()}, "jax.make_array_from_callback",
               unit=1e9, unit_name="GB/s")


def shard_math_curve(n_dev: int, quick: bool) -> list[dict]:
  mesh, spec = _mesh(n_dev), P("x", "y")
  sharding = NamedSharding(mesh, spec)
  rows_, cols = MESHES[n_dev]
  n = _reps("shard_math", n_dev, quick)
  # A new shape per call: neither side has it cached.
  shapes = [(rows_ * k, cols * 2) for k in range(1, 2 * (n + 10) + 1)]
  shape = (64, 64)
  arr = jax.device_put(np.zeros(shape, np.float32), sharding)
  bounds = lambda index: [sl.indices(d)[:2] for sl, d in zip(index, shape, strict=True)]
  stock_ids = {s.device: (bounds(s.index), s.replica_id) for s in arr.global_shards}
  assert stock_ids == {d: (bounds(i), r) for d, (i, r) in
                       jse.get_shard_indices_replica_ids(shape, mesh, spec).items()}
  new_a, new_b = _each(shapes[0::2]), _each(shapes[1::2])
  cases = {
      "shard indices, new shape each call": {
          "NamedSharding.devices_indices_map": lambda: sharding.devices_indices_map(new_a()),
          "get_shard_indices": lambda: jse.get_shard_indices(new_b(), mesh, spec)},
      "shard indices, same shape": {
          "NamedSharding.devices_indices_map": lambda: sharding.devices_indices_map(shape),
          "get_shard_indices": lambda: jse.get_shard_indices(shape, mesh, spec)},
      "indices and replica ids": {
          "jax.Array.global_shards": lambda: [(s.index, s.replica_id) for s in arr.global_shards],
          "get_shard_indices_replica_ids":
              lambda: jse.get_shard_indices_replica_ids(shape, mesh, spec)},
  }
  rows = []
  for case, fns in cases.items():
    res = _common.interleaved(fns, n=n, warmup=5)
    rows += _rows("shard_math", case, n_dev, f"scaling: {case}, {n_dev} devices", res,
                  next(iter(fns)))

  def picture():
    return GlobalDeviceArray.from_jax_array(arr)._repr_html_()

  def stock_picture():
    with contextlib.redirect_stdout(io.StringIO()):
      jax.debug.visualize_sharding(shape, sharding)

  assert picture().count("class='jse-shard'") == n_dev
  res = _common.interleaved({"jax.debug.visualize_sharding (text)": stock_picture,
                             "GlobalDeviceArray._repr_html_": picture},
                            n=_reps("picture", n_dev, quick), warmup=2)
  rows += _rows("picture", "", n_dev, f"scaling: layout picture, {n_dev} shards", res,
                "jax.debug.visualize_sharding (text)", unit=1e-3, unit_name="ms")
  return rows


def transfers_curve(n_dev: int, quick: bool) -> list[dict]:
  mesh, shape = _mesh(n_dev), (64, 64)
  n, warmup = _reps("transfers", n_dev, quick), 5
  make = jax.jit(lambda i: jax.numpy.full(shape, i, np.float32),
                 out_shardings=NamedSharding(mesh, P("x", "y")))

  def fresh(count, gda):  # never fetched (a jit output carries no host copy)
    out = [make(i) for i in range(count)]
    jax.block_until_ready(out)
    return [GlobalDeviceArray.from_jax_array(a) for a in out] if gda else out

  rows = []
  count = n + warmup
  plain, gdas = _each(fresh(count, False)), _each(fresh(count, True))
  res = _common.interleaved({STOCK: lambda: np.asarray(plain()),
                             GDA: lambda: np.asarray(gdas())}, n=n, warmup=warmup)
  rows += _rows("transfers", "implicit fetch", n_dev, f"scaling: implicit fetch, {n_dev} shards",
                res, STOCK)

  target = NamedSharding(mesh, P("y", "x"))
  x = make(0)
  g = GlobalDeviceArray.from_jax_array(make(1))
  # Explicit transfers are allowed, each one judged. Results are dropped, not
  # deleted: a shard that stays in place may share its buffer with `x`.
  with jax.transfer_guard("disallow"):
    res = _common.interleaved(
        {STOCK: lambda: jax.device_put(x, target, may_alias=False).block_until_ready(),
         GDA: lambda: jax.device_put(g, target, may_alias=False).block_until_ready()},
        n=n, warmup=warmup)
  rows += _rows("transfers", "guarded reshard", n_dev,
                f"scaling: guarded reshard, {n_dev} shards", res, STOCK)

  idle, busy = _each(fresh(count, True)), _each(fresh(count, True))
  records = []

  def in_ledger(_):
    with jse.transfer_ledger() as ledger:
      np.asarray(busy())
    records.append(len(ledger.records))

  # A fetch varies by more than the ledger adds: pair them (median of differences).
  times = _timed({"GDA fetch, no ledger open": (contextlib.nullcontext, idle, np.asarray),
                  "GDA fetch in its own ledger": (contextlib.nullcontext, lambda: None,
                                                  in_ledger)}, n, warmup, samples=True)
  assert set(records) == {1}
  res = {k: statistics.median(v) for k, v in times.items()}
  res[ADDED] = statistics.median(b - a for a, b in zip(*times.values(), strict=True))
  res[ADDED_EXACT] = _ledger_alone(make(2), max(n, 1000))
  rows += _rows("ledger", "", n_dev, f"scaling: ledger on a GDA fetch, {n_dev} shards", res,
                "GDA fetch, no ledger open")
  return rows


ADDED = "added by the ledger (median of paired differences)"
ADDED_EXACT = "added by the ledger, move excluded"


def _ledger_alone(arr, n: int) -> float:
  """What an open ledger adds to a GDA fetch (enter, record, exit), with the move
  itself replaced by a no-op, so a fetch's own variation does not hide it."""
  from jax_sharding_ext._transfers import moves

  gda, noop = GlobalDeviceArray.from_jax_array(arr), lambda: None
  inner = gda._arr

  def judge():
    gda._host_fetched = False  # each call judges (and records) a first fetch
    moves._fetch(gda, inner, noop)

  def judge_in_ledger():
    with jse.transfer_ledger():
      judge()

  res = _common.interleaved({"off": judge, "on": judge_in_ledger}, n=n, warmup=50)
  return res["on"] - res["off"]


def checkpoint_curve(mib: int, root: str, quick: bool) -> list[dict]:
  """One size's save / restore points, in `root` (the parent removes it, also
  after a timeout). One process per size: each save, stock's as much as the
  package's, leaves about the array's size of memory behind in the process
  (tensorstore, jax 0.10.2), so a process that saved 1 GiB a few times holds
  several GiB."""
  return _checkpoint_point(root, mib, _reps("checkpoint save", mib, quick),
                           _reps("checkpoint restore", mib, quick))


def _checkpoint_point(root: str, mib: int, n_save: int, n_restore: int) -> list[dict]:
  from jax.experimental.array_serialization import serialization as stock

  from jax_sharding_ext import serialization

  mesh, spec, cols = _mesh(8), P("x", "y"), 4096
  sharding = NamedSharding(mesh, spec)
  shape = (mib * 2 ** 20 // (4 * cols), cols)
  # Random shards made where they go: no whole-array host copy.
  gda = GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: np.random.default_rng(
      i[0].start).random(sharding.shard_shape(shape), dtype=np.float32))
  arr, nbytes = gda.to_jax_array(), gda.nbytes
  paths = (os.path.join(root, f"{mib}-{i}") for i in itertools.count())
  written = next(paths)  # the checkpoint both sides restore
  serialization.run_serialization([gda], [serialization.get_tensorstore_spec(written)])
  # Stock writes the same format as the package (compressor, chunks): read it back.
  zarray = os.path.join(written, ".zarray")
  same = {}
  if os.path.exists(zarray):
    with open(zarray) as f:
      meta = json.load(f)
    same = {"compressor": meta["compressor"], "chunks": meta["chunks"], "shape": list(shape)}

  def save(ours: bool) -> str:
    p = next(paths)
    if ours:
      serialization.run_serialization([gda], [serialization.get_tensorstore_spec(p)])
    else:
      tspec = stock.get_tensorstore_spec(p)
      if same:
        tspec["metadata"] = dict(same)
      stock.run_serialization([arr], [tspec])
    return p

  def load(ours: bool):
    if ours:
      tspec = serialization.get_tensorstore_spec(written)
      return serialization.run_deserialization([mesh], [spec], [tspec])[0].block_until_ready()
    tspec = stock.get_tensorstore_spec(written)
    return stock.run_deserialization([sharding], [tspec])[0].block_until_ready()

  for ours in (True, False):  # the same bytes come back either way
    back = load(ours)
    for a, b in zip(back.addressable_shards, arr.addressable_shards, strict=True):
      np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    back.delete()
  stock_save = "stock run_serialization" + (", same format" if same else "")

  def done(x) -> None:
    if isinstance(x, str):
      shutil.rmtree(x)
    else:
      x.delete()
    _release_memory()

  saves = _common.interleaved({"serialization.run_serialization (GDA)": lambda: save(True),
                               stock_save: lambda: save(False)},
                              n=n_save, warmup=int(n_save > 2), teardown=done)
  loads = _common.interleaved({"serialization.run_deserialization (GDA)": lambda: load(True),
                               "stock run_deserialization": lambda: load(False)},
                              n=n_restore, warmup=int(n_restore > 2), teardown=done)
  shutil.rmtree(written)
  gda.delete()
  rows = []
  for what, res in (("save", saves), ("restore", loads)):
    rows += _rows("checkpoint", what, mib, f"scaling: checkpoint {what}, {mib} MiB over 8 devices",
                  {k: nbytes / v for k, v in res.items()}, list(res)[1], unit=1e9,
                  unit_name="GB/s")
  return rows


def _release_memory() -> None:
  """Give memory that tensorstore's threads freed back to the OS (glibc keeps it in
  per-thread arenas), between samples and outside the clock, so that repeated
  1 GiB saves do not pile up several GiB of retained heap."""
  gc.collect()
  try:
    ctypes.CDLL(None).malloc_trim(0)
  except (OSError, AttributeError):  # not glibc
    pass


# ---------------------------------------------------------------------------
# Driver: one child process per curve / device count, with a hard timeout.
# ---------------------------------------------------------------------------


def _child(argv: list[str]) -> list[dict]:
  what, quick = argv[0], "--quick" in argv
  if what == "dispatch":
    return dispatch_curve(quick)
  if what == "checkpoint":
    return checkpoint_curve(int(argv[1]), argv[2], quick)
  n_dev = int(argv[1])
  rows = construction_curve(n_dev, quick)
  rows += shard_math_curve(n_dev, quick)
  return rows + transfers_curve(n_dev, quick)


def _spawn(args: list[str], n_dev: int, timeout: float) -> list[dict]:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={n_dev}")
  cmd = [sys.executable, os.path.abspath(__file__), "--child", *args]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                        check=True)
  out, _, result = proc.stdout.rpartition("RESULT ")
  print(out.rstrip(), flush=True)
  return json.loads(result)


FAILURES: dict[str, str] = {}
"""The curves that failed in the last `run()` (e.g. a timeout), with the child's stderr."""


def run(quick: bool = False, only: tuple[str, ...] = ()) -> list[dict]:
  """Every curve (or those in `only`: dispatch, devices, checkpoint); rows."""
  jobs = [("dispatch", ["dispatch"], 1)]
  jobs += [(f"devices {n}", ["devices", str(n)], n) for n in DEVICES]
  jobs += [(f"checkpoint {mib} MiB", ["checkpoint", str(mib)], 8)
           for mib in (CHECKPOINT_MIB[:-1] if quick else CHECKPOINT_MIB)]
  rows = []
  FAILURES.clear()
  for name, args, n_dev in jobs:
    kind = name.split()[0]
    if only and kind not in only:
      continue
    print(f"\n--- scaling: {name}", flush=True)
    t0 = time.perf_counter()
    # A temporary directory for the child, removed here even when the child is
    # killed at its timeout.
    tmp = tempfile.mkdtemp(prefix="bench_scaling_")
    try:
      rows += _spawn(args + ([tmp] if kind == "checkpoint" else [])
                     + (["--quick"] if quick else []), n_dev, TIMEOUT_S[kind])
    except (subprocess.SubprocessError, ValueError) as e:  # go on with the others
      err = getattr(e, "stderr", None) or ""
      err = err.decode() if isinstance(err, bytes) else err
      FAILURES[name] = f"{e}\n" + "\n".join(err.splitlines()[-30:])
      print(f"  FAILED: {FAILURES[name]}", file=sys.stderr, flush=True)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
  return rows


def main() -> None:
  if sys.argv[1:2] == ["--child"]:
    print("RESULT " + json.dumps(_child(sys.argv[2:])))
    return
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="far fewer repetitions (smoke run)")
  ap.add_argument("--only", nargs="+", default=(), choices=("dispatch", "devices", "checkpoint"))
  ap.add_argument("--plots", default=None, help="draw the PNGs into this directory")
  args = ap.parse_args()
  _common.print_environment()
  rows = run(quick=args.quick, only=tuple(args.only))
  if args.plots:
    from scaling_report import plot
    for path in plot(rows, args.plots).values():
      print(f"wrote {path}")


def targets() -> list[Target]:
  from _targets import curve

  cases = [f"flag {f}, {d}" for f in ("off", "on") for d in ("not donated", "donated")]
  out = [at_most(f"jit dispatch, 1-1,000 (4, 4) leaves, {c}: GDA / jax.Array, worst point",
                 worst("dispatch", GDA, c), 1.10, "{:.2f}x") for c in cases]

  def growth(r) -> float:
    """Worst, over the dispatch cases, of GDA's time ratio at 1,000 leaves / at 100."""
    found = {x["case"] for x in r.rows if x.get("curve") == "dispatch"}
    if not found:
      raise KeyError("dispatch")
    return max(curve(r, "dispatch", c)[1000]["ratio"] / curve(r, "dispatch", c)[100]["ratio"]
               for c in found)
  out.append(at_most("jit dispatch per-leaf cost flat: GDA/jax.Array ratio at 1,000 leaves / "
                     "at 100, worst case", growth, 1.10, "{:.2f}x"))
  out += [at_least(f"{name}, 1-512 devices, 2 MiB: throughput / make_array_from_callback, "
                   "worst point", worst("construction", f"GlobalDeviceArray.{name}", pick=min),
                   0.95, "{:.2f}x") for name in ("from_callback", "from_batched_callback")]
  out.append(Target("layout picture (`_repr_html_`), 512 shards", "< 50 ms",
                    lambda r: curve(r, "picture", variant="GlobalDeviceArray._repr_html_")
                    [512]["median"], "{:.1f} ms", lambda v: v < 50))
  out += [Target(f"implicit fetch / guarded reshard, 1-512 shards: {c}, GDA / {STOCK}, worst "
                 "point (reference)", "-", worst("transfers", GDA, c), "{:.2f}x", None)
          for c in ("implicit fetch", "guarded reshard")]
  out += [at_least(f"checkpoint {what}, 1 MiB-1 GiB over 8 devices: GDA / stock (same format), "
                   "worst point", worst("checkpoint", case=what, pick=min), 0.95, "{:.2f}x")
          for what in ("save", "restore")]
  return out


if __name__ == "__main__":
  main()
