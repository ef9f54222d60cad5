"""Cost of transfer-guard checks and of the (inactive) transfer ledger.

Target: under 2 us added per operation.

* guard check: what `_transfers` adds to one GDA implicit transfer, with the
  move itself replaced by a no-op (the precise number), and the one check
  an inactive ledger costs.
* implicit fetch end to end: `np.asarray(x)` of a fresh array (the first
  fetch is the transfer; later ones read the host copy), GDA vs jax.Array.
  Every call gets its own never-fetched array, built before timing.
* an open ledger on the same fetch of an (8, 2) array on 1 device and of an
  (8, 8) array over 8 devices: each fetch in its own `transfer_ledger()`
  (enter, one record, exit) against the fetch with none open. Target: at
  most 5 us added per recorded transfer, on 1 device and on 8 (the record
  keeps the call site; its text is built only when read).
* shard_args: the Python-path argument handler with a matching sharding (not
  a transfer), GDA vs jax.Array's own handler.

Where an open ledger's time goes (instructions counted with callgrind, which
a busy machine does not change; a fetch with the move itself a no-op, JAX
0.10.2): ~20k a recorded transfer, from ~41k. Opening and closing the ledger
~7k (was ~12k: a lock around a global count; now one list of open ledgers,
whose appends and removals are atomic). The record ~13k (was ~29k): the
user's call site ~5k (a walk of the frames up to the user's; its text is
built when read), one list shared by the nested ledgers ~3k (was a frozen
dataclass built at once, ~9k: it is built when `records` is first read),
shape, dtype and bytes from the array's aval ~1.5k (were Python properties,
~5k), and the source devices the sharding's cached device assignment, read
when the record is built (was `addressable_devices_indices_map`, which
computes every shard's index: ~5k, and more with more shards).

Run: .venv/bin/python benchmarks/bench_transfer_guard.py
"""

import statistics
import time

import _common  # first: sets XLA_FLAGS before JAX starts
import jax
import numpy as np
from _targets import Target, at_most, difference
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext._dispatch import handlers
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._jax import transfer as jax_transfer
from jax_sharding_ext._transfers import ledger as ledger_module
from jax_sharding_ext._transfers import moves


def _fresh_arrays(mesh, shape, count):
  """`count` distinct, never-fetched arrays (jit outputs carry no host copy)."""
  sharding = NamedSharding(mesh, P("x", "y"))
  make = jax.jit(lambda i: jax.numpy.full(shape, i, np.float32), out_shardings=sharding)
  out = [make(i) for i in range(count)]
  jax.block_until_ready(out)
  return out


def _fetch_each(arrays):
  it = iter(arrays)
  return lambda: np.asarray(next(it))


def run(n: int = 2000, warmup: int = 100) -> list[dict]:
  rows = []
  devs = jax.devices()
  noop = lambda: None

  # 1. What the guard adds to one GDA implicit transfer: `moves._fetch`
  #    with the move itself replaced by a no-op (decision + CPU rule + ledger
  #    check + bookkeeping). A jax.Array pays its check inside jaxlib's C++.
  mesh = Mesh(np.array(devs).reshape(4, 2), ("x", "y"))
  gda = jse.GlobalDeviceArray.from_jax_array(_fresh_arrays(mesh, (8, 2), 1)[0])
  arr = gda.to_jax_array()
  res = _common.interleaved({
      "no-op move": noop,
      "guard check + no-op move": lambda: moves._fetch(gda, arr, noop),
      "inactive ledger check": lambda: not ledger_module.OPEN,
  }, n=20000, warmup=1000)
  rows += _common.report("guard check on a GDA implicit fetch, move excluded", res,
                         "no-op move")
  added = res["guard check + no-op move"] - res["no-op move"]
  print(f"  added per operation by the guard check: {added * 1e6:.2f} us "
        f"(inactive ledger check: {(res['inactive ledger check'] - res['no-op move']) * 1e6:.2f} us)")

  # 2. End to end: `np.asarray` of a fresh (never fetched) array, GDA vs
  #    jax.Array, on 1 device (cheap transfer, so small differences show) and
  #    on 8 devices.
  for n_dev, mesh_shape, shape in ((1, (1, 1), (8, 2)), (8, (4, 2), (8, 2)),
                                   (8, (4, 2), (512, 256))):
    mesh = Mesh(np.array(devs[:n_dev]).reshape(mesh_shape), ("x", "y"))
    count = n + warmup
    plain = _fresh_arrays(mesh, shape, count)
    gdas = [jse.GlobalDeviceArray.from_jax_array(a) for a in _fresh_arrays(mesh, shape, count)]
    res = _common.interleaved({
        "jax.Array np.asarray": _fetch_each(plain),
        "GlobalDeviceArray np.asarray": _fetch_each(gdas),
    }, n=n, warmup=warmup)
    rows += _common.report(
        f"implicit fetch of a fresh {shape} float32 array, {n_dev} device(s)", res,
        "jax.Array np.asarray")
    added = res["GlobalDeviceArray np.asarray"] - res["jax.Array np.asarray"]
    print(f"  added per operation (whole GDA path): {added * 1e6:.2f} us")

  # 3. An open ledger on the same fetch (enter + record + exit), 1 and 8 devices.
  for n_dev, mesh_shape, shape in ((1, (1, 1), (8, 2)), (8, (4, 2), (8, 8))):
    rows += _ledger_rows(Mesh(np.array(devs[:n_dev]).reshape(mesh_shape), ("x", "y")), shape,
                         n, warmup)

  # 4. Python-path argument handling with a matching sharding (not a
  #    transfer): GDA handler vs jax.Array's own. Includes the donation check
  #    that shares this handler.
  mesh = Mesh(np.array(devs).reshape(4, 2), ("x", "y"))
  arr = _fresh_arrays(mesh, (8, 2), 1)[0]
  gda = jse.GlobalDeviceArray.from_jax_array(arr)
  s, reuse = arr.sharding, jax_transfer.REUSE_INPUT
  arrs, gdas, ss, nones, cs = [arr], [gda], [s], [None], [reuse]
  res = _common.interleaved({
      "jax.Array shard_arg": lambda: jax_tables.array_shard_arg(arrs, ss, nones, cs),
      "GDA shard_arg handler": lambda: handlers.shard_arg(gdas, ss, nones, cs),
      "GDA transfer test alone": lambda: jax_transfer.moving_args(arrs, ss, nones, cs),
  }, n=n, warmup=warmup)
  rows += _common.report("shard_args, matching sharding, 8 devices (no transfer)", res,
                         "jax.Array shard_arg")
  return rows


def _ledger_rows(mesh, shape, n: int, warmup: int) -> list[dict]:
  """A GDA fetch in its own ledger against one with no ledger open.

  Besides both medians, the median of the paired differences (each ledger
  fetch minus the plain fetch timed next to it): on 8 devices a fetch varies
  by more than what the ledger adds, and pairing cancels the drift.
  """
  count = n + warmup
  idle = [jse.GlobalDeviceArray.from_jax_array(a) for a in _fresh_arrays(mesh, shape, count)]
  busy = [jse.GlobalDeviceArray.from_jax_array(a) for a in _fresh_arrays(mesh, shape, count)]
  fetch_idle, fetch_busy = _fetch_each(idle), _fetch_each(busy)
  ledgers = []

  def fetch_in_ledger():
    with jse.transfer_ledger() as ledger:
      fetch_busy()
    ledgers.append(ledger)

  clock, times = time.perf_counter, {IDLE: [], BUSY: [], ADDED: []}
  for i in range(count):
    pair = {}
    for name, fn in ((IDLE, fetch_idle), (BUSY, fetch_in_ledger))[::1 if i % 2 else -1]:
      t0 = clock()
      fn()
      pair[name] = clock() - t0
    if i >= warmup:
      for name in (IDLE, BUSY):
        times[name].append(pair[name])
      times[ADDED].append(pair[BUSY] - pair[IDLE])
  res = {k: statistics.median(v) for k, v in times.items()}
  n_dev = mesh.devices.size
  rows = _common.report(f"ledger on a GDA implicit fetch, {shape}, {n_dev} "
                        f"device{'s' if n_dev > 1 else ''}", res, IDLE)
  assert all(len(ledger.records) == 1 for ledger in ledgers)
  print(f"  added per recorded transfer: {res[ADDED] * 1e6:.2f} us (median of paired "
        f"differences; difference of medians {(res[BUSY] - res[IDLE]) * 1e6:.2f} us; "
        "target <= 5 us)")
  return rows


IDLE, BUSY = "GDA fetch, no ledger open", "GDA fetch in its own ledger"
ADDED = "added by the ledger (median of paired differences)"


def targets() -> list[Target]:
  guard = "guard check on a GDA implicit fetch"
  fetch = "implicit fetch of a fresh (8, 2) float32 array, 1 device"
  ledger = "ledger on a GDA implicit fetch"
  return [
      at_most("guard check added to a GDA implicit fetch (move excluded)",
              difference(guard, "guard check + no-op move", "no-op move"), 2, "{:.2f} us"),
      at_most("inactive ledger check, added per operation",
              difference(guard, "inactive ledger check", "no-op move"), 2, "{:.2f} us"),
      at_most("whole GDA implicit fetch vs jax.Array's, (8, 2), 1 device, added",
              difference(fetch, "GlobalDeviceArray np.asarray", "jax.Array np.asarray"), 2,
              "{:.2f} us"),
      at_most("open ledger, added per recorded transfer (enter + record + exit)",
              difference(ledger, "GDA fetch in its own ledger", "GDA fetch, no ledger open"),
              5, "{:.2f} us"),
      *(at_most(f"open ledger, added per recorded transfer, {case} (enter + record + exit; "
                "median of paired differences)",
                lambda r, t=f"{ledger}, {case}": r.median(
                    t, "added by the ledger (median of paired differences)"), 5, "{:.2f} us")
        for case in ("(8, 2), 1 device", "(8, 8), 8 devices")),
  ]


if __name__ == "__main__":
  _common.print_environment()
  run()
