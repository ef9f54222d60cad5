"""Run every benchmark and write `benchmarks/RESULTS.md`.

Runs each `bench_*.py` module's `run()` in this process (the import-time
benchmark starts its own fresh subprocesses), prints their output as it goes,
then writes a markdown report: date, versions, machine, device count, whether
each target was met, the scaling curves (a table and a plot each; the plots
go to `docs/scaling_*.png`, or next to a report written elsewhere), and one
row per (benchmark, variant) with its median and ratio.

Run: `make bench`, or `.venv/bin/python benchmarks/run_all.py [--quick]
[--only NAME ...] [--output PATH]`. `--quick` uses far fewer iterations (a
smoke run; its numbers are noisier and the report says so).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT = os.path.join(HERE, "RESULTS.md")

# (module, keyword arguments of its run() for a full run, for --quick).
BENCHES: list[tuple[str, dict, dict]] = [
    ("bench_dispatch", {"n": 2000}, {"n": 200}),
    ("bench_transfer_guard", {"n": 2000}, {"n": 200}),
    ("bench_effects", {"calls": 200, "rounds": 15}, {"calls": 50, "rounds": 5}),
    ("bench_donation", {"steps": 50, "mib": 64}, {"steps": 10, "mib": 64}),
    ("bench_construction", {"reps": 21}, {"reps": 5, "adopt_n": 200}),
    # Before bench_checkpoint: each checkpoint save leaves memory behind in this
    # process, and the scaling run's 1 GiB checkpoint child needs several GiB.
    ("bench_scaling", {}, {"quick": True}),
    ("bench_checkpoint", {"reps": 15}, {"reps": 3}),
    ("bench_train_loop", {"n": 400}, {"n": 50}),
    ("bench_pjit", {"n": 400}, {"n": 50}),
    ("bench_import", {"runs": 21}, {"runs": 5}),
    ("bench_port", {"runs": 5}, {"runs": 1}),
]


# ---------------------------------------------------------------------------
# Targets: each reads medians from the rows, by benchmark-title prefix and
# variant name.
# ---------------------------------------------------------------------------


class _Rows:
  def __init__(self, rows: list[dict]):
    self.rows = rows

  def median(self, title_prefix: str, variant: str) -> float:
    for r in self.rows:
      if r["benchmark"].startswith(title_prefix) and r["variant"] == variant:
        return r["median"]
    raise KeyError(f"{title_prefix!r} / {variant!r}")


@dataclass
class Target:
  what: str
  goal: str
  measure: Callable[[_Rows], float]
  fmt: str
  ok: Callable[[float], bool] | None  # None: a reference number, not a target
  note: str = ""  # shown when missed


_CHECK_FORMATS = (("gzip", "GDA-era metadata (gzip, the default)"),
                  ("zstd", "stock metadata (zstd)"))


def _ratio(title, num, den):
  return lambda r: r.median(title, num) / r.median(title, den)


def _dispatch(n_dev: int, case: str, limit: float) -> Target:
  return Target(f"dispatch, {n_dev} device(s), {case}: GDA / jax.Array",
                f"<= {limit}x", _ratio(f"dispatch, {n_dev} device(s), {case}",
                                      "GlobalDeviceArray", "jax.Array"),
                "{:.2f}x", lambda v, limit=limit: v <= limit)


def _shared(n_dev: int, case: str, variant: str) -> Target:
  return Target(f"shared buffers, {n_dev} device(s), {case}: {variant} / sole owner",
                "<= 1.15x", _ratio(f"shared buffers, {n_dev} device(s), {case}",
                                  variant, "sole owner"),
                "{:.2f}x", lambda v: v <= 1.15)


def _ledger_added(title: str) -> Callable[[_Rows], float]:
  return lambda r: r.median(title, "added by the ledger (median of paired differences)")


def _ledger_targets() -> list[Target]:
  return [Target(f"open ledger, added per recorded transfer, {case} (enter + record "
                 "+ exit; median of paired differences)", "<= 10 us",
                 _ledger_added(f"ledger on a GDA implicit fetch, {case}"), "{:.2f} us",
                 lambda v: v <= 10)
          for case in ("(8, 2), 1 device", "(8, 8), 8 devices")]


def _curve(r: _Rows, curve: str, case: str | None = None, variant: str | None = None
           ) -> dict[int, dict]:
  """`{x: row}` of one scaling curve's variant (its first non-base one by default)."""
  rows = [x for x in r.rows if x.get("curve") == curve and (case is None or x["case"] == case)]
  variant = variant or next(x["variant"] for x in rows if x["variant"] != x["base"])
  return {x["x"]: x for x in rows if x["variant"] == variant}


def _worst(curve: str, variant: str | None = None, case: str | None = None, worst=max):
  """The worst ratio over a curve's points (max for times, min for throughputs)."""
  def measure(r: _Rows) -> float:
    points = _curve(r, curve, case, variant)
    if not points:
      raise KeyError(curve)
    return worst(p["ratio"] for p in points.values())
  return measure


def _growth(r: _Rows) -> float:
  """Worst, over the dispatch cases, of GDA's time ratio at 1,000 leaves / at 100."""
  cases = {x["case"] for x in r.rows if x.get("curve") == "dispatch"}
  if not cases:
    raise KeyError("dispatch")
  return max(_curve(r, "dispatch", c)[1000]["ratio"] / _curve(r, "dispatch", c)[100]["ratio"]
             for c in cases)


def _scaling_targets() -> list[Target]:
  """The scaling curves of benchmarks/bench_scaling.py (tables in the report)."""
  gda, stock = "GlobalDeviceArray", "jax.Array"
  cases = [f"flag {f}, {d}" for f in ("off", "on") for d in ("not donated", "donated")]
  out = [Target(f"jit dispatch, 1-1,000 (4, 4) leaves, {c}: GDA / jax.Array, worst "
                "point", "<= 1.15x", _worst("dispatch", gda, c), "{:.2f}x", lambda v: v <= 1.15)
         for c in cases]
  out.append(Target("jit dispatch per-leaf cost flat: GDA/jax.Array ratio at 1,000 "
                    "leaves / at 100, worst case", "<= 1.10x", _growth, "{:.2f}x",
                    lambda v: v <= 1.10))
  out += [Target(f"{name}, 1-512 devices, 2 MiB: throughput / "
                 "make_array_from_callback, worst point", ">= 0.95x",
                 _worst("construction", f"GlobalDeviceArray.{name}", worst=min), "{:.2f}x",
                 lambda v: v >= 0.95)
          for name in ("from_callback", "from_batched_callback")]
  out.append(Target("layout picture (`_repr_html_`), 512 shards", "< 50 ms",
                    lambda r: _curve(r, "picture", variant="GlobalDeviceArray._repr_html_")
                    [512]["median"], "{:.1f} ms", lambda v: v < 50))
  out += [Target(f"implicit fetch / guarded reshard, 1-512 shards: {c}, GDA / "
                 f"{stock}, worst point (reference)", "-", _worst("transfers", gda, c),
                 "{:.2f}x", None) for c in ("implicit fetch", "guarded reshard")]
  out += [Target(f"checkpoint {what}, 1 MiB-1 GiB over 8 devices: GDA / stock "
                 "(same format), worst point", ">= 0.95x",
                 _worst("checkpoint", case=what, worst=min), "{:.2f}x", lambda v: v >= 0.95)
          for what in ("save", "restore")]
  return out


_GUARD = "guard check on a GDA implicit fetch"
_FETCH1 = "implicit fetch of a fresh (8, 2) float32 array, 1 device"
_DONATION = "donation: peak live bytes"
_CONSTRUCTION = "construction throughput"

TARGETS: list[Target] = [
    Target("2 ordered `jax.debug.callback` / 2 ordered `io_callback`, 8 devices, per call",
           "<= 1.2x", _ratio("ordered effects", "debug.callback x2 (ordered)",
                             "io_callback x2 (ordered)"),
           "{:.2f}x", lambda v: v <= 1.2),
    Target("2 ordered `jax.debug.callback` / 2 ordered `io_callback` with stock JAX's "
           "tokens, 8 devices, per call", "<= 0.8x",
           _ratio("ordered effects", "debug.callback x2 (ordered)",
                  "io_callback x2 (ordered), stock tokens"),
           "{:.2f}x", lambda v: v <= 0.8,
           "see the docstring of benchmarks/bench_effects.py"),
    Target("guard check added to a GDA implicit fetch (move excluded)", "< 2 us",
           lambda r: r.median(_GUARD, "guard check + no-op move") - r.median(_GUARD, "no-op move"),
           "{:.2f} us", lambda v: v < 2),
    Target("inactive ledger check, added per operation", "< 2 us",
           lambda r: r.median(_GUARD, "inactive ledger check") - r.median(_GUARD, "no-op move"),
           "{:.2f} us", lambda v: v < 2),
    Target("whole GDA implicit fetch vs jax.Array's, (8, 2), 1 device, added", "< 2 us",
           lambda r: (r.median(_FETCH1, "GlobalDeviceArray np.asarray")
                      - r.median(_FETCH1, "jax.Array np.asarray")),
           "{:.2f} us", lambda v: v < 2),
    Target("peak live bytes: GDA+donation / jax.Array+donation", "<= 1.05x",
           _ratio(_DONATION, "GDA, donate=True", "jax.Array, donate=True"),
           "{:.3f}x", lambda v: v <= 1.05),
    Target("peak live bytes: GDA+donation / GDA without donation", "about 0.5x (0.45-0.55)",
           _ratio(_DONATION, "GDA, donate=True", "GDA, donate=False"),
           "{:.3f}x", lambda v: abs(v - 0.5) <= 0.05),
    *(Target(f"shared buffers, {n_dev} device(s), {case}: C++ cache entries added by "
             "500 calls", "0", lambda r, t=f"shared buffers, {n_dev} device(s), {case}":
             r.median(t, "cache entries added by 500 calls"), "{:.0f}", lambda v: v == 0)
      for n_dev in (1, 8) for case in ("no donation", "donating step")),
    _dispatch(1, "1 arg(s)", 1.3),
    _dispatch(1, "10 arg(s)", 1.3),
    _dispatch(1, "output flag on", 1.3),
    _dispatch(8, "1 arg(s)", 1.1),
    _dispatch(8, "10 arg(s)", 1.1),
    _dispatch(8, "output flag on", 1.1),
    *(_shared(n_dev, case, variant) for n_dev in (1, 8)
      for case, variant in (("no donation", "made from a kept jax.Array"),
                            ("no donation", "to_jax_array() kept"),
                            ("donating step", "batch made from a kept jax.Array"))),
    Target("construction throughput: from_callback / make_array_from_callback", ">= 0.95x",
           _ratio(_CONSTRUCTION, "GlobalDeviceArray.from_callback",
                  "jax.make_array_from_callback"),
           "{:.2f}x", lambda v: v >= 0.95),
    Target("construction throughput, donation intact: from_callback / "
           "make_array_from_callback", ">= 1.15x",
           _ratio(_CONSTRUCTION, "GlobalDeviceArray.from_callback",
                  "jax.make_array_from_callback"),
           "{:.2f}x", lambda v: v >= 1.15,
           "see \"Where the time goes\" in benchmarks/bench_construction.py"),
    Target("construction throughput: from_callback / numpy copy (physical limit)",
           ">= 0.5x (within 2x)",
           _ratio(_CONSTRUCTION, "GlobalDeviceArray.from_callback",
                  "numpy copy (physical limit)"),
           "{:.2f}x", lambda v: v >= 0.5,
           "see \"Where the time goes\" in benchmarks/bench_construction.py"),
    Target("(reference) construction throughput: stock make_array_from_callback / "
           "numpy copy", "-",
           _ratio(_CONSTRUCTION, "jax.make_array_from_callback",
                  "numpy copy (physical limit)"),
           "{:.2f}x", None),
    Target("checkpoint save, 256 MiB over 8 devices: GDA / stock jax.Array (GB/s)",
           ">= 0.95x", _ratio("checkpoint save", "serialization.run_serialization (GDA)",
                              "stock run_serialization"),
           "{:.2f}x", lambda v: v >= 0.95),
    Target("checkpoint restore, 256 MiB over 8 devices: GDA / stock jax.Array (GB/s)",
           ">= 0.95x", _ratio("checkpoint restore", "serialization.run_deserialization (GDA)",
                              "stock run_deserialization"),
           "{:.2f}x", lambda v: v >= 0.95),
    *[Target(f"checkpoint restore after the files changed, 256 MiB, {fmt}: GDA (chunks "
             "checked) / stock jax.Array (GB/s)", ">= 0.95x",
             _ratio(f"checkpoint restore after the files changed, 256 MiB float32 over 8 "
                    f"devices, {kind}", "serialization.run_deserialization (GDA)",
                    "stock run_deserialization"),
             "{:.3f}x", lambda v: v >= 0.95)
      for fmt, kind in _CHECK_FORMATS],
    *[Target(f"checkpoint restore after the files changed, 256 MiB, {fmt}: time with the "
             "chunk check / without (checked vs unchecked restore)", "<= 1.05x",
             _ratio(f"checkpoint restore after the files changed, 256 MiB float32 over 8 "
                    f"devices, {kind}", "serialization, chunk record removed (unchecked)",
                    "serialization.run_deserialization (GDA)"),
             "{:.3f}x", lambda v: v <= 1.05,
             "zstd: a crc32 pass over every chunk read, competing for the cores with "
             "tensorstore's reads")
      for fmt, kind in _CHECK_FORMATS],
    Target("2 sharded_callback / 2 ordered io_callback in shard_map, 8 devices, per call",
           "<= 1.2x", _ratio("per-shard callbacks", "sharded_callback x2",
                             "io_callback x2 in shard_map (ordered)"),
           "{:.2f}x", lambda v: v <= 1.2),
    Target("open ledger, added per recorded transfer (enter + record + exit)", "<= 15 us",
           lambda r: (r.median("ledger on a GDA implicit fetch", "GDA fetch in its own ledger")
                      - r.median("ledger on a GDA implicit fetch", "GDA fetch, no ledger open")),
           "{:.2f} us", lambda v: v <= 15),
    *[Target(f"training loop, {d} device(s), 20 donated leaves, {size}: GDA / jax.Array",
             "<= 1.10x", _ratio(f"training loop, {d} device(s), 20 donated leaves, {size}",
                                "GlobalDeviceArray", "jax.Array"),
             "{:.2f}x", lambda v: v <= 1.10)
      for d in (1, 8) for size in ("big", "small")],
    Target("import time added by `import jax_sharding_ext` to `import jax`", "< 10%",
           lambda r: 100 * (r.median("import time", "import jax; import jax_sharding_ext")
                            / r.median("import time", "import jax") - 1),
           "{:.1f}%", lambda v: v < 10),
    *_ledger_targets(),
    *(Target(f"porting assistant, {what} (fresh process)", f"<= {limit:g} s",
             lambda r, v=variant: r.median("porting assistant, 1 MB files", v), "{:.2f} s",
             lambda v, limit=limit: v <= limit)
      for what, variant, limit in (
          ("1 MB GDA-era file, --write", "1 MB GDA-era file, --write", 10),
          ("1 MB GDA-era file, check", "1 MB GDA-era file, check", 10),
          ("1 MB file without jax", "1 MB file without jax, check", 2))),
    Target("porting assistant, peak memory on a 1 MB GDA-era file, --write (reference)", "-",
           lambda r: r.median("porting assistant, peak memory", "1 MB GDA-era file, --write"),
           "{:.0f} MiB", None),
    *_scaling_targets(),
]


# ---------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------


def _cell(text: object) -> str:
  return str(text).replace("|", "\\|")


def _number(v: float) -> str:
  return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def _scaling_section(path: str, rows: list[dict]) -> list[str]:
  """The scaling curves: a table each and a plot drawn from these rows.

  The PNGs go to `docs/` for the default report, else to `<report>_plots/`
  next to the report; the report links them relatively.
  """
  if not any(r.get("curve") for r in rows):
    return []
  import scaling_report

  out_dir = os.path.dirname(os.path.abspath(path))
  if os.path.abspath(path) == DEFAULT_OUTPUT:
    png_dir = os.path.join(os.path.dirname(HERE), "docs")
  else:
    png_dir = os.path.splitext(os.path.abspath(path))[0] + "_plots"
  try:
    written = scaling_report.plot(rows, png_dir)
  except ImportError as e:  # matplotlib (extra [bench]) missing: tables only
    print(f"no plots: {e}", file=sys.stderr)
    written = {}
  return scaling_report.markdown(rows, {k: os.path.relpath(v, out_dir)
                                       for k, v in written.items()})


def _module_targets() -> list[Target]:
  """The targets a benchmark module states itself (`targets()`: title,
  variant, base variant, largest ratio; or with no base, the largest median
  in microseconds)."""
  out = []
  for name, _, _ in BENCHES:
    module = importlib.import_module(name)
    for title, variant, base, limit in getattr(module, "targets", list)():
      if base is None:
        out.append(Target(f"{title}: {variant}", f"<= {limit} us",
                          lambda r, t=title, v=variant: r.median(t, v), "{:.2f} us",
                          lambda v, limit=limit: v <= limit))
      else:
        out.append(Target(f"{title}: {variant} / {base}", f"<= {limit}x",
                          _ratio(title, variant, base), "{:.2f}x",
                          lambda v, limit=limit: v <= limit))
  return out


def write_report(path: str, rows: list[dict], env: dict[str, str], *, quick: bool,
                 started: datetime.datetime, seconds: dict[str, float],
                 failures: dict[str, str]) -> list[tuple[Target, str, str]]:
  results = []
  table = _Rows(rows)
  for t in [*TARGETS, *_module_targets()]:
    try:
      v = t.measure(table)
    except (KeyError, ZeroDivisionError, StopIteration):  # not run (e.g. --only)
      results.append((t, "not measured", "NOT MEASURED"))
      continue
    if t.ok is None:
      status = "reference"
    else:
      status = "met" if t.ok(v) else "MISSED" + (f" ({t.note})" if t.note else "")
    results.append((t, t.fmt.format(v), status))

  import jax
  devices = jax.devices()
  lines = [
      "# Benchmark results",
      "",
      f"Written by `benchmarks/run_all.py`{' --quick (few iterations: smoke numbers)' if quick else ''}"
      " (`make bench`). Every benchmark compares its variants side by side in one "
      "process, interleaved, and reports medians.",
      "",
      f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')}"
      f" (total {sum(seconds.values()):.0f} s)",
      f"- JAX {env['jax']}, jaxlib {env['jaxlib']}, jax_sharding_ext "
      f"{env['jax_sharding_ext']}, Python {env['python']}",
      f"- Machine: {env['machine']}",
      f"- Devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}); "
      f"XLA_FLAGS=`{env['XLA_FLAGS']}`",
      "",
      "## Targets",
      "",
      "| Target | Goal | Measured | Status |",
      "|---|---|---|---|",
  ]
  for t, measured, status in results:
    lines.append(f"| {_cell(t.what)} | "
                 f"{_cell(t.goal)} | {measured} | {status} |")
  lines += ["", *_scaling_section(path, rows)]
  lines += [
      "## All measurements",
      "",
      "Ratio is this variant's median / the base variant's median. Time units "
      "(us, ms): lower is faster. GB/s: higher is faster. MiB: peak live device "
      "bytes over the run (one run per variant, not a median). The scaling "
      "curves' points are in their tables above.",
      "",
      "| Benchmark | Variant | Median | Unit | Ratio | Base |",
      "|---|---|---:|---|---:|---|",
  ]
  for r in (r for r in rows if not r.get("curve")):
    lines.append(f"| {_cell(r['benchmark'])} | {_cell(r['variant'])} | "
                 f"{_number(r['median'])} | {r['unit']} | {r['ratio']:.2f}x | "
                 f"{_cell(r['base'])} |")
  lines += ["", "## Wall time per benchmark", ""]
  lines += [f"- {name}: {s:.0f} s" for name, s in seconds.items()]
  if failures:
    lines += ["", "## Failures", ""]
    for name, tb in failures.items():
      lines += [f"### {name}", "", "```", tb.rstrip(), "```", ""]
  with open(path, "w") as f:
    f.write("\n".join(lines).rstrip() + "\n")
  return results


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="far fewer iterations (smoke run)")
  ap.add_argument("--only", nargs="+", metavar="NAME",
                  help="run only these modules (e.g. bench_dispatch)")
  ap.add_argument("--output", default=DEFAULT_OUTPUT,
                  help="where to write the markdown report (default: benchmarks/RESULTS.md)")
  args = ap.parse_args()

  started = datetime.datetime.now(datetime.UTC)
  env = _common.environment()
  _common.print_environment()
  rows: list[dict] = []
  seconds: dict[str, float] = {}
  failures: dict[str, str] = {}
  for name, full, quick in BENCHES:
    if args.only and name not in args.only:
      continue
    kwargs = quick if args.quick else full
    print(f"\n=== {name} ({', '.join(f'{k}={v}' for k, v in kwargs.items())})", flush=True)
    t0 = time.perf_counter()
    try:
      module = importlib.import_module(name)
      rows += module.run(**kwargs)
      for part, text in getattr(module, "FAILURES", {}).items():  # parts that failed
        failures[f"{name}: {part}"] = text
    except Exception:  # report it, go on with the others
      failures[name] = traceback.format_exc()
      print(failures[name], file=sys.stderr)
    seconds[name] = time.perf_counter() - t0
    gc.collect()
    sys.stdout.flush()

  results = write_report(args.output, rows, env, quick=args.quick, started=started,
                         seconds=seconds, failures=failures)
  print(f"\n=== targets (written to {os.path.relpath(args.output)})")
  for t, measured, status in results:
    print(f"  [{status.split(' (')[0]:>12}] {t.what}: {measured} (goal {t.goal})")
  print(f"total {sum(seconds.values()):.0f} s")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
