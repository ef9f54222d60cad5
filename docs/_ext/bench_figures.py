"""The site's benchmark figures and pages, drawn from `benchmarks/results.json`.

`make bench` saves one run's measurements there (`benchmarks/run_all.py`);
the build reads them here, so every figure the site shows comes from that
run and is written in one place:

- `figures(results)`: the figures of the Speed and Developing pages by name,
  used there as MyST substitutions (`{{ dispatch }}`). Each is defined once
  below from the rows it summarises; a row that is missing raises, and the
  build fails.
- `write_pages(results, directory)`: the Benchmark results page's content
  (what was measured, on what, every row and curve) and the development
  page's (each target and whether it was met, wall times), as markdown files
  those pages include.
"""

from __future__ import annotations

import math
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS = DOCS.parent / "benchmarks"
RESULTS_JSON = BENCHMARKS / "results.json"
sys.path.insert(0, str(BENCHMARKS))

import report  # noqa: E402  (benchmarks/report.py: the data and its markdown)

GDA, STOCK = "GlobalDeviceArray", "jax.Array"


class Rows:
  """The rows of one run, looked up by benchmark title prefix and variant."""

  def __init__(self, results: dict):
    self.rows = results["rows"]

  def where(self, prefix: str, variant: str, curve: str | None = None) -> list[dict]:
    """Every row whose title (or, for a curve, case) starts with `prefix`."""
    key = "case" if curve else "benchmark"
    found = [r for r in self.rows if r.get("curve") == curve and r["variant"] == variant
             and r[key].startswith(prefix)]
    if not found:
      raise KeyError(f"no benchmark row {prefix!r} / {variant!r} (curve {curve})")
    return found

  def median(self, title: str, variant: str) -> float:
    (row,) = self.where(title, variant)
    return row["median"]

  def ratio(self, title: str, num: str, den: str) -> float:
    return self.median(title, num) / self.median(title, den)

  def ratios(self, prefix: str, num: str, den: str) -> list[float]:
    """`num / den` in every benchmark whose title starts with `prefix`."""
    return [r["median"] / self.median(r["benchmark"], den) for r in self.where(prefix, num)]

  def curve(self, name: str, variant: str, case: str = "") -> dict[int, dict]:
    return {r["x"]: r for r in self.where(case, variant, curve=name)}


def _x(v: float) -> str:
  return f"{v:.2f}x"


def _span(values, fmt=_x) -> str:
  """`low–high` of `values` as formatted (one value if they format alike)."""
  values = list(values)
  low, high = fmt(min(values)), fmt(max(values))
  if low == high:
    return low
  (lnum, _, lunit), (hnum, _, hunit) = low.partition(" "), high.partition(" ")
  return f"{lnum}–{hnum} {lunit}" if lunit and lunit == hunit else f"{low}–{high}"


def _us(v: float) -> str:
  return f"{v:.1f} us" if v < 10 else f"{v:.0f} us"


def figures(results: dict) -> dict[str, str]:
  """Every figure the pages show, by the name they use it under."""
  r = Rows(results)
  train = "training loop, {} device(s), 20 donated leaves, {}"
  pjit = "legacy pjit step, {} device(s), 26 donated leaves, flag {}"
  seconds = sum(results["seconds"].values())
  dispatch = {c: [p["ratio"] for p in r.curve("dispatch", GDA, f"flag {c}").values()]
              for c in ("off", "on")}
  picture = r.curve("picture", "GlobalDeviceArray._repr_html_")
  most = max(picture)
  return {
      # a tiny jit call, 1 and 8 devices, 1 and 10 arguments, flag off and on
      "dispatch": _span(x["ratio"] for x in r.where("dispatch, ", GDA)),
      "shared": _span([*r.ratios("shared buffers, ", "made from a kept jax.Array", "sole owner"),
                       *r.ratios("shared buffers, ", "to_jax_array() kept", "sole owner"),
                       *r.ratios("shared buffers, ", "batch made from a kept jax.Array",
                                 "sole owner")]),
      "shared_cache": f"{max(x['median'] for x in r.where('shared buffers, ', 'cache entries added by 500 calls')):.0f}",
      "train_big": _span(r.where(train.format(n, "big"), GDA)[0]["ratio"] for n in (1, 8)),
      "train_small_1": _x(r.where(train.format(1, "small"), GDA)[0]["ratio"]),
      "train_small_8": _x(r.where(train.format(8, "small"), GDA)[0]["ratio"]),
      "step_small_us": _us(r.where(train.format(1, "small"), STOCK)[0]["median"]),
      "step_small_added": _us(r.where(train.format(1, "small"), GDA)[0]["median"]
                              - r.where(train.format(1, "small"), STOCK)[0]["median"]),
      **{f"pjit_{flag}_{name}": _span(r.ratio(pjit.format(n, flag), variant, "jax.jit, GDA")
                                      for n in (1, 8))
         for flag in ("on", "off")
         for name, variant in (("from_gda", "pjit(FROM_GDA)"), ("specs", "pjit(specs)"))},
      "effects_debug": _x(r.ratio("ordered effects, 8 devices", "debug.callback x2 (ordered)",
                                  "io_callback x2 (ordered), stock tokens")),
      "effects_sharded": _x(r.ratio("per-shard callbacks, 8 devices", "sharded_callback x2",
                                    "io_callback x2 in shard_map (ordered)")),
      "construction": _x(r.ratio("construction throughput, 256 MiB",
                                 "GlobalDeviceArray.from_callback", "jax.make_array_from_callback")),
      "first_view": _us(r.median("first view of a fresh GDA, 64 devices",
                                 "first to_jax_array() of a fresh GDA")),
      "fetch_added": _us(r.median("implicit fetch of a fresh (8, 2) float32 array, 1 device",
                                  "GlobalDeviceArray np.asarray")
                         - r.median("implicit fetch of a fresh (8, 2) float32 array, 1 device",
                                    "jax.Array np.asarray")),
      "ckpt_save": _span([*r.ratios("checkpoint save, 256 MiB", "serialization.run_serialization (GDA)",
                                    "stock run_serialization"),
                          *r.ratios("checkpoint save, 256 MiB", "serialization, metadata='stock' (GDA)",
                                    "stock run_serialization")]),
      "ckpt_restore": _span(r.ratios("checkpoint restore, 256 MiB",
                                     "serialization.run_deserialization (GDA)",
                                     "stock run_deserialization")),
      # a restore after every file of the checkpoint changed: against stock,
      # and against the same restore with its chunk records removed (unchecked)
      "ckpt_restore_changed": _span(r.ratios(_CHANGED, "serialization.run_deserialization (GDA)",
                                             "stock run_deserialization")),
      "ckpt_check_cost": _span(
          row["median"] / r.median(row["benchmark"], "serialization, chunk record removed (unchecked)")
          for row in r.where(_CHANGED, "serialization.run_deserialization (GDA)")),
      # stock's zstd format against the GDA-era gzip, saving the same random data
      "ckpt_zstd_speedup": _x(r.ratio(_GZIP_SAVE, "stock, its own zstd metadata",
                                      "stock run_serialization")),
      "ledger": _span((x["median"] for x in r.where(
          "ledger on a GDA implicit fetch", "added by the ledger (median of paired differences)")),
          _us),
      "import": f"{(r.ratio('import time', 'import jax; import jax_sharding_ext', 'import jax') - 1) * 100:.0f}%",
      "donation_peak": _x(r.ratio("donation: peak live bytes", "GDA, donate=True", "GDA, donate=False")),
      "donation_vs_array": _x(r.ratio("donation: peak live bytes", "GDA, donate=True",
                                      "jax.Array, donate=True")),
      "scaling_dispatch_off": _span(dispatch["off"]),
      "scaling_dispatch_on": _span(dispatch["on"]),
      "scaling_construction": _span(
          p["ratio"] for p in r.curve("construction", "GlobalDeviceArray.from_callback").values()),
      "picture_ms": f"{picture[most]['median']:.1f} ms",
      "picture_vs_text": _x(picture[most]["ratio"]),
      "transfers_most": _span(r.curve("transfers", GDA, case)[max(r.curve("transfers", GDA, case))]
                              ["ratio"] for case in ("implicit fetch", "guarded reshard")),
      "scaling_ckpt_save": _span(p["ratio"] for p in r.curve("checkpoint", _ckpt_variant(r, "save"),
                                                             "save").values()),
      "scaling_ckpt_restore": _span(p["ratio"] for p in r.curve(
          "checkpoint", _ckpt_variant(r, "restore"), "restore").values()),
      "port_check": f"{r.median('porting assistant, 1 MB files', '1 MB GDA-era file, check'):.1f} s",
      "port_write": f"{r.median('porting assistant, 1 MB files', '1 MB GDA-era file, --write'):.1f} s",
      "port_plain": f"{r.median('porting assistant, 1 MB files', '1 MB file without jax, check'):.1f} s",
      "bench_minutes": f"{math.ceil(seconds / 60)} minutes",
      "bench_date": results["started"].split()[0],
  }


_CHANGED = "checkpoint restore after the files changed, 256 MiB"
_GZIP_SAVE = "checkpoint save, 256 MiB float32 over 8 devices, GDA-era metadata (gzip"


def _ckpt_variant(r: Rows, case: str) -> str:
  """The package's variant of the checkpoint curve's `case` (not the base)."""
  return next(x["variant"] for x in r.rows if x.get("curve") == "checkpoint"
              and x["case"] == case and x["variant"] != x["base"])


def write_pages(results: dict, directory: pathlib.Path) -> None:
  """The included parts of the Benchmark results and Developing pages."""
  directory.mkdir(exist_ok=True)
  images = {p.stem.removeprefix("scaling_"): p.name for p in DOCS.glob("scaling_*.png")}
  pages = {
      "results.md": [*report.environment(results), "", *report.scaling(results, images),
                     "## All measurements", "", *report.measurements(results)],
      "targets.md": [*report.targets(results), "", "Wall time per benchmark:", "",
                     *report.wall_times(results)],
  }
  for name, lines in pages.items():
    text = "\n".join(lines).rstrip() + "\n"
    path = directory / name
    if not path.exists() or path.read_text() != text:  # keep an unchanged file's timestamp
      path.write_text(text)


def load() -> dict:
  return report.load(str(RESULTS_JSON))
