"""`make bench-check`: the dispatch-bound benchmarks again, each ratio against
the committed `benchmarks/results.json`; fails when one drifts more than 10%
the worse way.

Runs, each in a fresh process as `make bench` runs them and with the same
repetitions: `bench_dispatch`, `bench_pjit`, `bench_train_loop`,
`bench_transfer_guard` (the guard and the open ledger) and the dispatch
curve of `bench_scaling` (1 to 1,000 leaves, the output flag off and on,
donated or not). About two minutes on a 2-core machine.

Compared: every (benchmark, variant) row whose ratio to its base (stock JAX,
or a sole-owner GDA) was measured side by side in one process, where both
medians are at least 3 us, and every count that must not grow (jit cache
entries added by 500 calls). A ratio over a shorter base is noise: the 2 us
implicit fetch of a `jax.Array` made the GDA's ratio move between 1.3x and
2.2x over quiet runs of the same code on a 2-core machine (`make bench`
holds those paths to absolute targets). The dispatch curve counts by its
worst point per case (flag off or on, donated or not), as `make bench`'s
targets read it.
A ratio is worse when it is higher for a time, lower for a throughput. A
benchmark with a row more than 10% worse runs once more and its better
measurement counts, so that one noisy sample does not fail the check; a
machine busy with other work still can: run it on a quiet machine.

Run: `make bench-check`, or `.venv/bin/python benchmarks/check.py [--only NAME ...]
[--tolerance 0.10]`. After a change that moves a ratio on purpose, `make
bench` records the new baseline.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time

import _common  # first: sets XLA_FLAGS (8 CPU devices) before JAX starts
import report
import run_all

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKED: dict[str, dict] = {
    "bench_dispatch": {"n": 2000},
    "bench_pjit": {"n": 400},
    "bench_train_loop": {"n": 400},
    "bench_transfer_guard": {"n": 2000},
    "bench_scaling": {"only": ["dispatch"]},
}
TOLERANCE = 0.10
MIN_MEDIAN_US = 3.0
THROUGHPUT_UNITS = ("GB/s",)


def comparable(row: dict) -> bool:
  """Whether `row` is checked: a ratio to another variant of its benchmark,
  measured side by side, of medians long enough to time; or a count."""
  if row.get("unit") == "entries":
    return True
  ratio = row.get("ratio")
  if ratio is None or not math.isfinite(ratio) or row["variant"] == row["base"]:
    return False
  if row["variant"].startswith("added by"):  # a difference, checked through its ratio
    return False
  if row.get("unit") != "us":
    return True
  base_median = row["median"] / ratio
  return min(row["median"], base_median) >= MIN_MEDIAN_US


def drift(old: dict, new: dict) -> float:
  """How much worse `new` is than `old` (0.05: 5% worse; negative: better)."""
  if old.get("unit") == "entries":
    return math.inf if new["median"] > old["median"] else 0.0
  if old.get("unit") in THROUGHPUT_UNITS:
    return old["ratio"] / new["ratio"] - 1
  return new["ratio"] / old["ratio"] - 1


def _key(row: dict) -> tuple[str, str]:
  return row["benchmark"], row["variant"]


_CURVE_POINT = re.compile(r"^(scaling: jit dispatch), \d+ leaves, ")


def worst_points(rows: list[dict]) -> list[dict]:
  """`rows` with each dispatch curve's points (1 to 1,000 leaves) replaced by
  the curve's worst point, as `make bench`'s targets read the curve. One
  point, measured on fresh arrays each call, moved by more than 10% between
  quiet runs of the same code; the worst of four points did not."""
  out: list[dict] = []
  worst: dict[tuple[str, str], dict] = {}
  for r in rows:
    m = _CURVE_POINT.match(r["benchmark"])
    if m is None or not comparable(r):
      out.append(r)
      continue
    curve = m.group(1) + ", 1-1,000 leaves, " + r["benchmark"][m.end():] + ", worst point"
    key = (curve, r["variant"])
    if key not in worst or r["ratio"] > worst[key]["ratio"]:
      worst[key] = {**r, "benchmark": curve}
  return out + list(worst.values())


def compare(baseline: list[dict], rows: list[dict]) -> list[dict]:
  """One line per checked row present in both: what, was, now, drift."""
  old = {_key(r): r for r in worst_points(baseline) if comparable(r)}
  out = []
  for r in worst_points(rows):
    o = old.get(_key(r))
    if o is None or not comparable(r):
      continue
    out.append({"benchmark": r["benchmark"], "variant": r["variant"], "base": r["base"],
                "unit": r.get("unit"), "was": o, "now": r, "drift": drift(o, r)})
  return out


def _value(row: dict) -> str:
  if row.get("unit") == "entries":
    return f"{row['median']:.0f}"
  return f"{row['ratio']:.3f}x"


def _measure(name: str) -> list[dict]:
  print(f"\n=== {name} ({', '.join(f'{k}={v}' for k, v in CHECKED[name].items())})",
        flush=True)
  got = run_all._run_in_child(name, CHECKED[name])
  if got["failures"]:
    raise SystemExit(f"bench-check: {name} failed: {got['failures']}")
  return got["rows"]


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", nargs="+", choices=sorted(CHECKED), metavar="NAME",
                  help=f"check only these benchmarks ({', '.join(CHECKED)})")
  ap.add_argument("--tolerance", type=float, default=TOLERANCE,
                  help="the drift that fails the check (default: 0.10, 10%% worse)")
  args = ap.parse_args()
  baseline = report.load(report.RESULTS_JSON)
  env, then = _common.environment(), baseline["environment"]
  _common.print_environment()
  print(f"# baseline: {os.path.relpath(report.RESULTS_JSON)} of {baseline['started']} "
        f"(jax {then['jax']}, {then['machine']})")
  if (then["jax"], then["machine"]) != (env["jax"], env["machine"]):
    print("# NOTE: the baseline was measured with another JAX or on another machine; "
          "ratios may differ for that reason alone.")
  if baseline.get("quick"):
    raise SystemExit("bench-check: the committed results are a --quick run; run `make bench`.")
  t0 = time.perf_counter()
  lines: list[dict] = []
  for name in args.only or CHECKED:
    found = compare(baseline["rows"], _measure(name))
    if not found:
      raise SystemExit(f"bench-check: no row of {name} matches the baseline; its titles or "
                       "variants changed: run `make bench` to record a new baseline.")
    if any(x["drift"] > args.tolerance for x in found):
      print(f"  {name}: a ratio drifted more than {args.tolerance:.0%}; measuring again",
            flush=True)
      again = {(x["benchmark"], x["variant"]): x for x in compare(baseline["rows"],
                                                                  _measure(name))}
      found = [min(x, again.get((x["benchmark"], x["variant"]), x), key=lambda y: y["drift"])
               for x in found]
    lines += found
  failed = [x for x in lines if x["drift"] > args.tolerance]
  _print_table(lines, args.tolerance)
  print(f"\nbench-check: {len(lines)} ratios in {time.perf_counter() - t0:.0f} s; "
        + (f"{len(failed)} more than {args.tolerance:.0%} worse than the baseline"
           if failed else "none drifted the worse way"))
  return 1 if failed else 0


def _print_table(lines: list[dict], tolerance: float) -> None:
  width = max(len(f"{x['benchmark']}: {x['variant']}") for x in lines)
  print(f"\n{'benchmark: variant (vs base)':<{width}}  {'baseline':>9}  {'now':>9}  change")
  for x in lines:
    what = f"{x['benchmark']}: {x['variant']}"
    change = "grew" if x["unit"] == "entries" and x["drift"] > 0 else f"{x['drift']:+.1%}"
    flag = "  WORSE" if x["drift"] > tolerance else ""
    print(f"{what:<{width}}  {_value(x['was']):>9}  {_value(x['now']):>9}  {change}{flag}")


if __name__ == "__main__":
  sys.exit(main())
