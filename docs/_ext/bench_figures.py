"""The site's benchmark figures and pages, drawn from `benchmarks/results.json`.

`make bench` saves one run's measurements there (`benchmarks/run_all.py`);
the build reads them here, so every figure the site shows comes from that
run and is written in one place:

- `figures(results)`: the figures of the Speed and Developing pages by name,
  used there as MyST substitutions (`{{ dispatch }}`). Each is defined once
  below (`FIGURES`) by the tables it summarises, and spans every row of
  them: a summary never leaves out a row of its own table. A table that is
  missing raises, and the build fails.
- `write_pages(results, directory)`: the Benchmark results page's content
  (what was measured, on what, every row and curve) and the development
  page's (each target and whether it was met, wall times), as markdown files
  those pages include.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import sys
from collections.abc import Callable

DOCS = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS = DOCS.parent / "benchmarks"
RESULTS_JSON = BENCHMARKS / "results.json"
sys.path.insert(0, str(BENCHMARKS))

import report  # noqa: E402  (benchmarks/report.py: the data and its markdown)

GDA, STOCK = "GlobalDeviceArray", "jax.Array"


@dataclasses.dataclass(frozen=True)
class Table:
  """Every row of one table of the results: the rows of `variants` whose
  title matches `title` (a regular expression, matched at the start of the
  benchmark's title, or for a scaling curve's points of their case); `curve`
  names the curve (None: rows that are no curve's point), `x` one point of it
  (the page then names that point)."""

  title: str
  variants: tuple[str, ...]
  curve: str | None = None
  x: int | None = None

  def rows(self, results: dict) -> list[dict]:
    key = "case" if self.curve else "benchmark"
    found = [r for r in results["rows"]
             if r.get("curve") == self.curve and r["variant"] in self.variants
             and re.match(self.title, r[key]) and (self.x is None or r.get("x") == self.x)]
    if not found:
      raise KeyError(f"no benchmark row {self.title!r} / {self.variants} "
                     f"(curve {self.curve}, x {self.x})")
    return found


def _median(results: dict, benchmark: str, variant: str) -> float:
  (row,) = [r for r in results["rows"] if r["benchmark"] == benchmark and r["variant"] == variant]
  return row["median"]


@dataclasses.dataclass(frozen=True)
class Figure:
  """One figure a page shows: `of` each row of its tables, as a span
  `low–high` over all of them (or the one value, if the table has one row).

  `of`: "ratio" (the row's median / its benchmark's `base` variant's median,
  by default the row's own base), "median", or "difference" (the row's
  median minus the `base` variant's)."""

  tables: tuple[Table, ...]
  of: str = "ratio"
  base: str | None = None
  fmt: Callable[[float], str] = lambda v: f"{v:.2f}x"

  def values(self, results: dict) -> list[float]:
    out = []
    for table in self.tables:
      for row in table.rows(results):
        if self.of == "median":
          out.append(row["median"])
          continue
        base = _median(results, row["benchmark"], self.base or row["base"])
        out.append(row["median"] / base if self.of == "ratio" else row["median"] - base)
    return out

  def render(self, results: dict) -> str:
    return _span(self.values(results), self.fmt)


def _span(values, fmt) -> str:
  """`low–high` of `values` as formatted (one value if they format alike)."""
  values = list(values)
  low, high = fmt(min(values)), fmt(max(values))
  if low == high:
    return low
  (lnum, _, lunit), (hnum, _, hunit) = low.partition(" "), high.partition(" ")
  return f"{lnum}–{hnum} {lunit}" if lunit and lunit == hunit else f"{low}–{high}"


def _us(v: float) -> str:
  return f"{v:.1f} us" if v < 10 else f"{v:.0f} us"


def _s(v: float) -> str:
  return f"{v:.1f} s"


def _t(title: str, *variants: str, curve: str | None = None, x: int | None = None) -> Table:
  return Table(title, variants, curve, x)


_TRAIN = r"training loop, \d+ device\(s\), 20 donated leaves, "
_PJIT = r"legacy pjit step, \d+ device\(s\), 26 donated leaves, flag "
_SAVE = r"checkpoint save, 256 MiB"
_RESTORE = r"checkpoint restore, 256 MiB"
_CHANGED = r"checkpoint restore after the files changed, 256 MiB"
_GZIP_SAVE = re.escape("checkpoint save, 256 MiB float32 over 8 devices, GDA-era metadata (gzip")
_SER, _DESER = "serialization.run_serialization (GDA)", "serialization.run_deserialization (GDA)"
_LEDGER = "added by the ledger (median of paired differences)"
_PORT = r"porting assistant, 1 MB files"

FIGURES: dict[str, Figure] = {
    # Speed, at a glance: a jitted call, the fixed cases and the curve by leaves
    "dispatch": Figure((_t("dispatch, ", GDA), _t("", GDA, curve="dispatch"))),
    "shared": Figure((_t("shared buffers, ", "made from a kept jax.Array", "to_jax_array() kept",
                         "batch made from a kept jax.Array"),)),
    "shared_cache": Figure((_t("shared buffers, ", "cache entries added by 500 calls"),),
                           of="median", fmt=lambda v: f"{v:.0f}"),
    "train_big": Figure((_t(_TRAIN + "big", GDA),)),
    "train_small_1": Figure((_t(_TRAIN.replace(r"\d+", "1") + "small", GDA),)),
    "train_small_8": Figure((_t(_TRAIN.replace(r"\d+", "8") + "small", GDA),)),
    **{f"pjit_{flag}_{name}": Figure((_t(_PJIT + flag, variant),), base="jax.jit, GDA")
       for flag in ("on", "off")
       for name, variant in (("from_gda", "pjit(FROM_GDA)"), ("specs", "pjit(specs)"))},
    "effects_debug": Figure((_t("ordered effects, 8 devices", "debug.callback x2 (ordered)"),),
                            base="io_callback x2 (ordered), stock tokens"),
    "effects_sharded": Figure((_t("per-shard callbacks, 8 devices", "sharded_callback x2"),),
                              base="io_callback x2 in shard_map (ordered)"),
    "construction": Figure((_t("construction throughput, 256 MiB",
                               "GlobalDeviceArray.from_callback"),),
                           base="jax.make_array_from_callback"),
    "first_view": Figure((_t("first view of a fresh GDA, ", "first to_jax_array() of a fresh GDA"),),
                         of="median", fmt=_us),
    "fetch_added": Figure((_t("implicit fetch of a fresh ", "GlobalDeviceArray np.asarray"),),
                          of="difference", base="jax.Array np.asarray", fmt=_us),
    # the 256 MiB checkpoint in both formats, and the curve from 1 MiB to 1 GiB
    "ckpt_save": Figure((_t(_SAVE, _SER, "serialization, metadata='stock' (GDA)"),
                         _t("save", _SER, curve="checkpoint"))),
    "ckpt_restore": Figure((_t(_RESTORE, _DESER), _t("restore", _DESER, curve="checkpoint"))),
    # a restore after every file of the checkpoint changed: against stock,
    # and against the same restore with its chunk records removed (unchecked)
    "ckpt_restore_changed": Figure((_t(_CHANGED, _DESER),)),
    "ckpt_check_cost": Figure((_t(_CHANGED, _DESER),),
                              base="serialization, chunk record removed (unchecked)"),
    # stock's zstd format against the GDA-era gzip, saving the same random data
    "ckpt_zstd_speedup": Figure((_t(_GZIP_SAVE, "stock, its own zstd metadata"),),
                                base="stock run_serialization"),
    # one recorded fetch, 1 to 512 shards
    "ledger": Figure((_t("ledger on a GDA implicit fetch", _LEDGER),
                      _t("", _LEDGER, curve="ledger")), of="median", fmt=_us),
    "import": Figure((_t("import time", "import jax; import jax_sharding_ext"),),
                     fmt=lambda v: f"{(v - 1) * 100:.0f}%"),
    "donation_peak": Figure((_t("donation: peak live bytes", "GDA, donate=True"),),
                            base="GDA, donate=False"),
    "donation_vs_array": Figure((_t("donation: peak live bytes", "GDA, donate=True"),),
                                base="jax.Array, donate=True"),
    # Speed, how the cost grows: each curve's every point
    "scaling_dispatch_off": Figure((_t("flag off", GDA, curve="dispatch"),)),
    "scaling_dispatch_on": Figure((_t("flag on", GDA, curve="dispatch"),)),
    "scaling_construction": Figure((_t("", "GlobalDeviceArray.from_callback",
                                       "GlobalDeviceArray.from_batched_callback",
                                       curve="construction"),)),
    "picture_ms": Figure((_t("", "GlobalDeviceArray._repr_html_", curve="picture", x=512),),
                         of="median", fmt=lambda v: f"{v:.1f} ms"),
    "picture_vs_text": Figure((_t("", "GlobalDeviceArray._repr_html_", curve="picture"),)),
    "transfers": Figure((_t("", GDA, curve="transfers"),)),
    "ledger_move_excluded": Figure((_t("", "added by the ledger, move excluded", curve="ledger"),),
                                   of="median", fmt=_us),
    # the training step one Python call per leaf costs most on
    "step_small_us": Figure((_t(_TRAIN.replace(r"\d+", "1") + "small", STOCK),), of="median",
                            fmt=_us),
    "step_small_added": Figure((_t(_TRAIN.replace(r"\d+", "1") + "small", GDA),),
                               of="difference", base=STOCK, fmt=_us),
    # the porting assistant, fresh processes
    "port_check": Figure((_t(_PORT, "1 MB GDA-era file, check"),), of="median", fmt=_s),
    "port_write": Figure((_t(_PORT, "1 MB GDA-era file, --write"),), of="median", fmt=_s),
    "port_plain": Figure((_t(_PORT, "1 MB file without jax, check"),), of="median", fmt=_s),
    "port_comment": Figure((_t(_PORT, "1 MB file, jax only in a comment, check"),),
                           of="median", fmt=_s),
}
"""Every measured figure the pages show, by the substitution name they use."""


def figures(results: dict) -> dict[str, str]:
  """Every figure the pages show, by the name they use it under."""
  return {
      **{name: figure.render(results) for name, figure in FIGURES.items()},
      "bench_minutes": f"{math.ceil(sum(results['seconds'].values()) / 60)} minutes",
      "bench_date": results["started"].split()[0],
  }


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
