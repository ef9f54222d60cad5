"""Run every benchmark; save the results data and write `benchmarks/RESULTS.md`.

Runs each `bench_*.py` module's `run()` in a fresh process of its own (so no
benchmark measures the compiled functions, arrays and memory that an earlier
one left behind), prints their output as it goes, evaluates every module's
targets, and saves the run as `benchmarks/results.json`: date, versions,
machine, device count, every (benchmark, variant) row with its median and
ratio, the scaling curves' points, the targets, wall times and failures.
`report.py` draws the markdown report from that data alone, and the scaling
plots go to `docs/scaling_*.png` (or next to a report written elsewhere);
the documentation site's benchmark pages and figures are drawn from the same
data when it is built.

Run: `make bench`, or `.venv/bin/python benchmarks/run_all.py [--quick]
[--only NAME ...] [--output PATH]`. `--quick` uses far fewer iterations (a
smoke run; its numbers are noisier and the report says so). `--render`
measures nothing: it writes the report and plots again from the saved data.
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
import report
import scaling_report
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


def _images(path: str, rows: list[dict]) -> dict[str, str]:
  """Draw the scaling plots; `{name: path relative to the report}`.

  The PNGs go to `docs/` for the default report, else to `<report>_plots/`
  next to the report.
  """
  if not any(r.get("curve") for r in rows):
    return {}
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
  return {k: os.path.relpath(v, out_dir) for k, v in written.items()}


def _targets() -> list[Target]:
  """Every benchmark module's own targets (`targets()`)."""
  return [t for name, _, _ in BENCHES for t in importlib.import_module(name).targets()]


def evaluate_targets(rows: list[dict]) -> list[dict]:
  """Each target measured on `rows`: what, goal, measured (text) and status."""
  results = []
  table = Rows(rows)
  for t in _targets():
    try:
      v = t.measure(table)
    except (KeyError, ZeroDivisionError, StopIteration):  # not run (e.g. --only)
      results.append({"what": t.what, "goal": t.goal, "measured": "not measured",
                      "status": "NOT MEASURED"})
      continue
    if t.ok is None:
      status = "reference"
    else:
      status = "met" if t.ok(v) else "MISSED" + (f" ({t.note})" if t.note else "")
    results.append({"what": t.what, "goal": t.goal, "measured": t.fmt.format(v),
                    "status": status})
  return results


def _scaling_about() -> dict:
  """What the scaling curves measure and their repetitions (from bench_scaling)."""
  import bench_scaling
  about = bench_scaling.__doc__.split("\n\n", 1)[1].split("\n\nRepetitions")[0].strip()
  return {"about": about, "reps": bench_scaling.REPS}


def data_path(report_path: str) -> str:
  """Where the data of the report at `report_path` is saved."""
  if os.path.abspath(report_path) == DEFAULT_OUTPUT:
    return report.RESULTS_JSON
  return os.path.splitext(report_path)[0] + ".json"


def write(path: str, results: dict) -> None:
  """Save `results` next to the report, then write the report and its plots."""
  report.save(results, data_path(path))
  text = report.markdown(results, _images(path, results["rows"]))
  with open(path, "w") as f:
    f.write(text)


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
  ap.add_argument("--render", action="store_true",
                  help="measure nothing: write the report and plots from the saved data")
  args = ap.parse_args()
  if args.render:
    write(args.output, report.load(data_path(args.output)))
    print(f"wrote {os.path.relpath(args.output)} from {os.path.relpath(data_path(args.output))}")
    return 0

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

  results = {
      "started": started.strftime("%Y-%m-%d %H:%M UTC"),
      "previous": _previous(args.output),
      "quick": args.quick,
      "environment": env,
      "seconds": seconds,
      "failures": failures,
      "rows": rows,
      "targets": evaluate_targets(rows),
      "scaling": _scaling_about(),
  }
  write(args.output, results)
  _print_targets(args.output, results)
  return 1 if failures else 0


def _previous(path: str) -> dict | None:
  """The targets of the full run saved where this one goes (the report's
  "Before and after" table), or None."""
  try:
    old = report.load(data_path(path))
  except (OSError, ValueError):
    return None
  if old.get("quick"):
    return old.get("previous")  # a smoke run replaces no measurement
  return {"started": old["started"], "environment": old["environment"],
          "targets": old["targets"]}


def _print_targets(path: str, results: dict) -> None:
  print(f"\n=== targets (written to {os.path.relpath(path)})")
  for t in results["targets"]:
    print(f"  [{t['status'].split(' (')[0]:>12}] {t['what']}: {t['measured']} "
          f"(goal {t['goal']})")
  print(f"total {sum(results['seconds'].values()):.0f} s")


if __name__ == "__main__":
  if sys.argv[1:2] == ["--child"]:
    sys.exit(_child(*sys.argv[2:5]))
  sys.exit(main())
