"""The benchmark results: the data `make bench` writes, and its markdown.

`run_all.py` measures and saves one run as `results.json` (next to the
report): the environment, every (benchmark, variant) row with its median and
ratio, the scaling curves' points, each target as evaluated, the wall time
per benchmark and any failure. Everything shown of a run is drawn from that
data alone, by the functions here (no JAX import): `RESULTS.md` for the
repository, and the documentation site's benchmark pages and figures
(`docs/_ext/bench_figures.py`). So a number has one source, and changing how
it is shown needs no new measurement (`run_all.py --render`).
"""

from __future__ import annotations

import json
import os

import scaling_report

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_JSON = os.path.join(HERE, "results.json")


def load(path: str = RESULTS_JSON) -> dict:
  with open(path) as f:
    return json.load(f)


def save(results: dict, path: str = RESULTS_JSON) -> None:
  with open(path, "w") as f:
    json.dump(results, f, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    f.write("\n")


def _cell(text: object) -> str:
  return str(text).replace("|", "\\|")


def _number(v: float) -> str:
  return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def environment(results: dict) -> list[str]:
  """Where and when the run was made, as a markdown list."""
  env = results["environment"]
  return [
      f"- Date: {results['started']}",
      f"- JAX {env['jax']}, jaxlib {env['jaxlib']}, jax_sharding_ext "
      f"{env['jax_sharding_ext']}, Python {env['python']}",
      f"- Machine: {env['machine']}",
      f"- Devices: {env['devices']}; XLA_FLAGS=`{env['XLA_FLAGS']}`",
  ]


def targets(results: dict) -> list[str]:
  """Each benchmark's targets as evaluated in this run (development goals)."""
  lines = ["| Target | Goal | Measured | Status |", "|---|---|---|---|"]
  for t in results["targets"]:
    lines.append(f"| {_cell(t['what'])} | {_cell(t['goal'])} | {t['measured']} | "
                 f"{_cell(t['status'])} |")
  return lines


def before_and_after(results: dict) -> list[str]:
  """Each target of this run next to its value in the run this one replaced
  (`previous`, saved by `run_all.py`), matched by what it measures."""
  previous = results.get("previous")
  if not previous:
    return []
  before = {t["what"]: t["measured"] for t in previous["targets"]}
  lines = [f"Each target against the run this one replaced ({previous['started']}, "
           f"JAX {previous['environment']['jax']}); `-`: not measured then.", "",
           "| Target | Goal | Before | Now | Status |", "|---|---|---|---|---|"]
  for t in results["targets"]:
    lines.append(f"| {_cell(t['what'])} | {_cell(t['goal'])} | "
                 f"{_cell(before.get(t['what'], '-'))} | {t['measured']} | "
                 f"{_cell(t['status'])} |")
  return lines


def scaling(results: dict, images: dict[str, str]) -> list[str]:
  """The scaling curves: a table each, then its plot (`images`: name -> path)."""
  about = results.get("scaling", {})
  return scaling_report.markdown(results["rows"], images, about.get("about", ""),
                                 about.get("reps", {}))


def measurements(results: dict) -> list[str]:
  """One row per (benchmark, variant) that is not a scaling curve's point."""
  lines = [
      "Ratio is this variant's median / the base variant's median. Time units "
      "(us, ms): lower is faster. GB/s: higher is faster. MiB: peak live device "
      "bytes over the run (one run per variant, not a median). The scaling "
      "curves' points are in their tables.",
      "",
      "| Benchmark | Variant | Median | Unit | Ratio | Base |",
      "|---|---|---:|---|---:|---|",
  ]
  for r in (r for r in results["rows"] if not r.get("curve")):
    ratio = "-" if r["ratio"] != r["ratio"] else f"{r['ratio']:.2f}x"  # NaN: no base
    lines.append(f"| {_cell(r['benchmark'])} | {_cell(r['variant'])} | "
                 f"{_number(r['median'])} | {r['unit']} | {ratio} | {_cell(r['base'])} |")
  return lines


def wall_times(results: dict) -> list[str]:
  return [f"- {name}: {s:.0f} s" for name, s in results["seconds"].items()]


def markdown(results: dict, images: dict[str, str]) -> str:
  """The whole report (RESULTS.md): environment, targets, curves, every row,
  wall times and failures."""
  quick = " --quick (few iterations: smoke numbers)" if results.get("quick") else ""
  lines = [
      "# Benchmark results", "",
      f"Written by `benchmarks/run_all.py`{quick} (`make bench`) from the data it "
      "saved in `results.json`. Every benchmark compares its variants side by side "
      "in one process, interleaved, and reports medians.", "",
      *environment(results),
      f"- Wall time: {sum(results['seconds'].values()):.0f} s in all", "",
      "## Targets", "", *targets(results), "",
      *(["## Before and after", "", *before_and_after(results), ""]
        if results.get("previous") else []),
      *scaling(results, images),
      "## All measurements", "", *measurements(results), "",
      "## Wall time per benchmark", "", *wall_times(results),
  ]
  if results.get("failures"):
    lines += ["", "## Failures", ""]
    for name, tb in results["failures"].items():
      lines += [f"### {name}", "", "```", tb.rstrip(), "```", ""]
  return "\n".join(lines).rstrip() + "\n"
