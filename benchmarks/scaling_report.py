"""The scaling curves of `bench_scaling.py` as report tables and plots, drawn
from the benchmark rows alone: `markdown(rows, images, about, reps)` for the
report and `plot(rows, directory)`, one PNG per figure (matplotlib, Agg; the
`[bench]` extra). It imports no benchmark: what the curves measure comes in
with the results data."""

from __future__ import annotations

import os


def _points(rows: list[dict], curve: str, case: str | None = None) -> dict[str, dict]:
  """`{variant: {x: row}}` of one curve (and case), variants in their order."""
  out: dict[str, dict] = {}
  for r in rows:
    if r.get("curve") == curve and (case is None or r["case"] == case):
      out.setdefault(r["variant"], {})[r["x"]] = r
  return out


def _cases(rows: list[dict], curve: str) -> list[str]:
  return list(dict.fromkeys(r["case"] for r in rows if r.get("curve") == curve))


# name: (title, x label, panels); a panel: (curve, y label, value, per x, variants (None:
# all; "gda": all but the base), log y). The plots show measurements only: the
# targets are development goals, listed in the report's Targets table.
_FIGURES = {
    "dispatch": ("jit dispatch of a list of (4, 4) float32 leaves, 1 device", "leaves", [
        ("dispatch", "us per leaf", "median", True, None, False),
        ("dispatch", "time, GDA / jax.Array", "ratio", False, "gda", False)]),
    "construction": ("construction of a 2 MiB float32 array, P('x', 'y')", "devices", [
        ("construction", "GB/s", "median", False, None, False),
        ("construction", "throughput, GDA / stock", "ratio", False, "gda", False)]),
    "shard_math": ("shard math and the layout picture", "devices", [
        ("shard_math", "us per call", "median", False, None, True),
        ("picture", "layout picture, ms", "median", False, None, True)]),
    "transfers": ("transfers of a (64, 64) float32 array, by shards", "shards", [
        ("transfers", "us per call", "median", False, None, True),
        ("ledger", "open ledger, us added per recorded fetch", "median", False,
         ("added by the ledger (median of paired differences)",
          "added by the ledger, move excluded"), False)]),
    "checkpoint": ("checkpoint save / restore, float32 over 8 devices", "MiB", [
        ("checkpoint", "GB/s", "median", False, None, True),
        ("checkpoint", "throughput, GDA / stock", "ratio", False, "gda", False)]),
}


def _series(rows: list[dict], curve: str, value: str, per_x: bool, variants
            ) -> list[tuple[str, list, str]]:
  """(label, points, line style) per (case, variant): a colour per case (or per
  variant when there is one case), the base variant dashed."""
  out = []
  cases = _cases(rows, curve)
  for i, case in enumerate(cases):
    for j, (variant, pts) in enumerate(_points(rows, curve, case).items()):
      base = next(iter(pts.values()))["base"]
      if (variants == "gda" and variant == base) or (
          isinstance(variants, tuple) and variant not in variants):
        continue
      line = sorted((x, r[value] / (x if per_x else 1)) for x, r in pts.items())
      label = f"{variant}, {case}" if case else variant
      out.append((label, line, f"C{i if len(cases) > 1 else j}" + "-" * (1 + (variant == base))))
  return out


def plot(rows: list[dict], directory: str) -> dict[str, str]:
  """Draw one PNG per curve into `directory`; return `{name: path}`."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  os.makedirs(directory, exist_ok=True)
  written = {}
  for name, (title, xlabel, panels) in _FIGURES.items():
    if not any(r.get("curve") == panels[0][0] for r in rows):
      continue
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 4.6))
    for ax, (curve, ylabel, value, per_x, variants, logy) in zip(axes, panels, strict=True):
      series = _series(rows, curve, value, per_x, variants)
      xs = sorted({x for _, pts, _ in series for x, _ in pts})
      for label, pts, style in series:
        if pts:
          ax.plot(*zip(*pts, strict=True), style, marker="o", markersize=3, label=label)
      if value == "ratio":  # where stock is
        ax.axhline(1.0, color="black", linewidth=0.6, alpha=0.6, label="stock (1.0x)")
      ax.set_xscale("log")
      ax.set_xticks(xs, [f"{x:,}" for x in xs])
      ax.minorticks_off()
      if logy:
        ax.set_yscale("log")
      ax.set(xlabel=xlabel, ylabel=ylabel)
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    written[name] = os.path.join(directory, f"scaling_{name}.png")
    fig.savefig(written[name], dpi=90)
    plt.close(fig)
  return written


def _num(v: float) -> str:
  return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def _table(rows: list[dict], curve: str, xname: str, per: str = "", ratios: bool = True
           ) -> list[str]:
  """Markdown: one row per (case, x) with each variant's median (and per `per`
  unit of x), then each ratio to the base; a new table where the variants change."""
  lines: list[str] = []
  header = None
  for case in _cases(rows, curve):
    pts = _points(rows, curve, case)
    names = list(pts)
    first = next(iter(pts[names[0]].values()))
    base, unit = first["base"], first["unit"]
    others = [k for k in names if k != base] if ratios else []
    head = ([xname] + (["case"] if case else []) + [f"{k} ({unit})" for k in names]
            + [f"{k} ({unit} per {per})" for k in names if per]
            + [f"{k} / {base}" for k in others])
    if head != header:
      lines += ([""] if lines else []) + [_md_row(head), "|" + "---|" * len(head)]
      header = head
    for x in sorted(pts[names[0]]):
      cells = [f"{x:,}"] + ([case] if case else [])
      cells += [_num(pts[k][x]["median"]) if x in pts[k] else "-" for k in names]
      cells += [_num(pts[k][x]["median"] / x) if x in pts[k] else "-" for k in names if per]
      cells += [f"{pts[k][x]['ratio']:.2f}x" if x in pts[k] else "-" for k in others]
      lines.append(_md_row(cells))
  return lines


def _md_row(cells: list[str]) -> str:
  return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


# (curve, heading, x name, per-x unit, what a ratio means (None: no ratios), plot after it)
_SECTIONS = [
    ("dispatch", "jit dispatch by leaves (1 device)", "leaves", "leaf", "time", "dispatch"),
    ("construction", "construction by devices", "devices", "", "throughput", "construction"),
    ("shard_math", "shard math by devices", "devices", "", "time", None),
    ("picture", "layout picture by shards", "shards", "", "time", "shard_math"),
    ("transfers", "transfers by shards", "shards", "", "time", None),
    ("ledger", "open ledger by shards", "shards", "", None, "transfers"),
    ("checkpoint", "checkpoint by size (8 devices)", "MiB", "", "throughput", "checkpoint"),
]


def markdown(rows: list[dict], images: dict[str, str], about: str,
             reps: dict[str, dict]) -> list[str]:
  """The scaling section of a report: what was measured (`about`, markdown),
  the repetitions per point (`reps`: `{curve: {x: n}}`), then per curve a
  table and its plot.

  `images` maps a plot's name to its PNG path as the report should link it.
  """
  if not any(r.get("curve") for r in rows):
    return []
  counts = "; ".join(f"{c}: " + ", ".join(f"{int(x):,}: {n}" for x, n in r.items())
                     for c, r in reps.items())
  lines = ["## Scaling", "", about, "",
           f"Repetitions per point (full run, per variant): {counts}; a 1 GiB save is "
           "one sample.", ""]
  for curve, heading, xname, per, ratio, image in _SECTIONS:
    table = _table(rows, curve, xname, per, ratio is not None)
    if table:
      better = "lower is faster" if ratio == "time" else "higher is faster"
      note = [f"Ratios are {ratio} ratios: {better}.", ""] if ratio else []
      lines += [f"### {heading[0].upper()}{heading[1:]}", "", *note, *table, ""]
    if image in images:
      lines += [f"![{image} curves]({images[image]})", ""]
  return lines


