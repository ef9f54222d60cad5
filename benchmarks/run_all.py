"""Run every benchmark and write `benchmarks/RESULTS.md`.

Runs each `bench_*.py` module's `run()` in a fresh process of its own (so no
benchmark measures the compiled functions, arrays and memory that an earlier
one left behind), prints their output as it goes, then writes a markdown report: date, versions, machine, device count, whether
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
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts
from _targets import Rows, Target

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT = os.path.join(HERE, "RESULTS.md")

# (module, keyword arguments of its run() for a full run, for --quick).
BENCHES: list[tuple[str, dict, dict]] = [
    ("bench_dispatch", {"n": 2000}, {"n": 200}),
    ("bench_transfer_guard", {"n": 2000}, {"n": 200}),
    ("bench_effects", {"calls": 200, "rounds": 15}, {"calls": 50, "rounds": 5}),
    ("bench_donation", {"steps": 50, "mib": 64}, {"steps": 10, "mib": 64}),
    ("bench_construction", {"reps": 21}, {"reps": 5, "adopt_n": 200}),
    ("bench_scaling", {}, {"quick": True}),
    ("bench_checkpoint", {"reps": 15}, {"reps": 3}),
    ("bench_train_loop", {"n": 400}, {"n": 50}),
    ("bench_pjit", {"n": 400}, {"n": 50}),
    ("bench_import", {"runs": 21}, {"runs": 5}),
    ("bench_port", {"runs": 5}, {"runs": 1}),
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


def _targets() -> list[Target]:
  """Every benchmark module's own targets (`targets()`)."""
  return [t for name, _, _ in BENCHES for t in importlib.import_module(name).targets()]


def write_report(path: str, rows: list[dict], env: dict[str, str], *, quick: bool,
                 started: datetime.datetime, seconds: dict[str, float],
                 failures: dict[str, str]) -> list[tuple[Target, str, str]]:
  results = []
  table = Rows(rows)
  for t in _targets():
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


def _run_in_child(name: str, kwargs: dict) -> dict:
  """`name`'s `run(**kwargs)` in a new Python process: its rows and failures."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "rows.json")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name,
                           json.dumps(kwargs), out], cwd=HERE, check=False)
    if proc.returncode != 0 or not os.path.exists(out):
      return {"rows": [], "failures": {name: f"exited with status {proc.returncode} (above)"}}
    with open(out) as f:
      return json.load(f)


def _child(name: str, kwargs_json: str, out: str) -> int:
  """Run one benchmark module and write its rows and failures to `out`."""
  rows, failures = [], {}
  try:
    module = importlib.import_module(name)
    rows = module.run(**json.loads(kwargs_json))
    failures = {f"{name}: {part}": text
                for part, text in getattr(module, "FAILURES", {}).items()}
  except Exception:  # report it; the other benchmarks go on
    failures[name] = traceback.format_exc()
    print(failures[name], file=sys.stderr)
  with open(out, "w") as f:
    json.dump({"rows": rows, "failures": failures}, f,
              default=lambda o: o.item() if hasattr(o, "item") else str(o))
  return 0


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
    got = _run_in_child(name, kwargs)
    rows += got["rows"]
    failures.update(got["failures"])
    seconds[name] = time.perf_counter() - t0

  results = write_report(args.output, rows, env, quick=args.quick, started=started,
                         seconds=seconds, failures=failures)
  print(f"\n=== targets (written to {os.path.relpath(args.output)})")
  for t, measured, status in results:
    print(f"  [{status.split(' (')[0]:>12}] {t.what}: {measured} (goal {t.goal})")
  print(f"total {sum(seconds.values()):.0f} s")
  return 1 if failures else 0


if __name__ == "__main__":
  if sys.argv[1:2] == ["--child"]:
    sys.exit(_child(*sys.argv[2:5]))
  sys.exit(main())
