"""What a benchmark module states as its targets (`targets()` in each
`bench_*.py`), and how `run_all.py` measures them: each reads medians from the
report's rows, by benchmark-title prefix and variant name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class Rows:
  """The rows of one run, looked up by title prefix and variant."""

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
  measure: Callable[[Rows], float]
  fmt: str
  ok: Callable[[float], bool] | None  # None: a reference number, not a target
  note: str = ""  # shown when missed


def ratio(title: str, num: str, den: str) -> Callable[[Rows], float]:
  """The median of variant `num` over that of `den`, in one benchmark."""
  return lambda r: r.median(title, num) / r.median(title, den)


def difference(title: str, variant: str, base: str) -> Callable[[Rows], float]:
  """The median of `variant` minus that of `base`, in one benchmark."""
  return lambda r: r.median(title, variant) - r.median(title, base)


def at_most(what: str, measure: Callable[[Rows], float], limit: float, fmt: str,
            note: str = "") -> Target:
  """A target `measure <= limit` (`fmt` formats the value, its unit included)."""
  return Target(what, f"<= {fmt.format(limit)}", measure, fmt, lambda v: v <= limit, note)


def at_least(what: str, measure: Callable[[Rows], float], limit: float, fmt: str,
             note: str = "") -> Target:
  return Target(what, f">= {fmt.format(limit)}", measure, fmt, lambda v: v >= limit, note)


def curve(r: Rows, name: str, case: str | None = None, variant: str | None = None
          ) -> dict[int, dict]:
  """`{x: row}` of one scaling curve's variant (its first non-base one by default)."""
  rows = [x for x in r.rows if x.get("curve") == name and (case is None or x["case"] == case)]
  variant = variant or next(x["variant"] for x in rows if x["variant"] != x["base"])
  return {x["x"]: x for x in rows if x["variant"] == variant}


def worst(name: str, variant: str | None = None, case: str | None = None,
          pick: Callable = max) -> Callable[[Rows], float]:
  """The worst ratio over a curve's points (max for times, min for throughputs)."""
  def measure(r: Rows) -> float:
    points = curve(r, name, case, variant)
    if not points:
      raise KeyError(name)
    return pick(p["ratio"] for p in points.values())
  return measure
