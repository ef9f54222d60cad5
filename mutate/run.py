"""`make mutate`: put each mutant (`mutants.py`) into a copy of the tree, one
at a time, and see which tests kill it.

For each mutant: its area's fuzzers alone, at `make test`'s budget (the
"ci" hypothesis profile, without shrinking); if they do not kill it, the
area's other tests. A mutant that survives both fails the run, and so does
one whose snippet is not in its file exactly once (the code changed: update
the mutant). The report gives, per area, which mutants the fuzzers kill and
which only the other tests kill; `--write-docs` puts the table on
`docs/development.md` and the run in `mutate/results.json`.

Usage: python mutate/run.py [--only ID ...] [--area AREA ...] [--write-docs | --render]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "mutate"))

from mutants import AREAS, MUTANTS, Mutant  # noqa: E402

TIMEOUT_S = 1800
START, END = "<!-- mutation table: start -->", "<!-- mutation table: end -->"


def _copy_tree(dest: pathlib.Path) -> None:
  """The working tree as git sees it (tracked and new files, not ignored ones)."""
  names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode().split("\0")
  for name in filter(None, names):
    src = ROOT / name
    if src.is_file():
      (dest / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dest / name)


def _check_snippets(mutants: list[Mutant]) -> list[str]:
  problems = []
  for m in mutants:
    path = ROOT / m.file
    text = path.read_text() if path.is_file() else None
    n = -1 if text is None else text.count(m.old)
    if n != 1:
      where = "the file does not exist" if n < 0 else f"it is there {n} times"
      problems.append(f"mutant {m.id!r}: its snippet must be in {m.file} exactly once, but "
                      f"{where}. The code changed: update the mutant in mutate/mutants.py.\n"
                      f"  snippet: {m.old!r}")
  return problems


def _pytest(tree: pathlib.Path, paths: tuple[str, ...]) -> tuple[str, float, str]:
  """Run pytest on `paths` in `tree`: ("failed" / "passed" / "error" / "timeout",
  seconds, the tail of its output)."""
  env = dict(os.environ, PYTHONPATH=str(tree), JSE_MUTATE="1")
  env.pop("JSE_FUZZ", None)
  t0 = time.monotonic()
  try:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        *paths], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired as e:
    out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (
        e.stdout or "")
    return "timeout", time.monotonic() - t0, out[-2000:]
  outcome = {0: "passed", 1: "failed"}.get(r.returncode, "error")
  return outcome, time.monotonic() - t0, (r.stdout + r.stderr)[-3000:]


def _run_one(tree: pathlib.Path, m: Mutant, tests_ok: dict[str, bool]) -> dict:
  path = tree / m.file
  original = path.read_text()
  path.write_text(original.replace(m.old, m.new))
  area = AREAS[m.area]
  result = {"id": m.id, "area": m.area, "file": m.file, "effect": m.effect}
  try:
    outcome, secs, tail = _pytest(tree, area.fuzzers)
    result["fuzzers"] = {"outcome": outcome, "seconds": round(secs, 1)}
    if outcome in ("failed", "timeout"):
      result["killed_by"] = "fuzzers"
      return result
    if outcome == "error":
      result["killed_by"] = "error"
      result["tail"] = tail
      return result
    outcome, secs, tail = _pytest(tree, area.tests)
    result["tests"] = {"outcome": outcome, "seconds": round(secs, 1)}
    result["killed_by"] = ("tests" if outcome in ("failed", "timeout")
                           else "error" if outcome == "error" else "survived")
    if result["killed_by"] != "tests":
      result["tail"] = tail
  finally:
    path.write_text(original)
  if result["killed_by"] == "tests":  # the tests must pass without the mutant
    key = m.area
    if key not in tests_ok:
      outcome, _, tail = _pytest(tree, area.tests)
      tests_ok[key] = outcome == "passed"
      if not tests_ok[key]:
        result["baseline_tail"] = tail
    if not tests_ok[key]:
      result["killed_by"] = "error"
      result["tail"] = f"the area's tests fail without the mutant too:\n{result['baseline_tail']}"
  return result


def _table(results: list[dict]) -> str:
  by_area: dict[str, list[dict]] = {}
  for r in results:
    by_area.setdefault(r["area"], []).append(r)
  fuzzed = sum(r["killed_by"] == "fuzzers" for r in results)
  lines = ["| Area | Killed by the fuzzers | Killed only by the other tests | Survived |",
           "|---|---|---|---|"]
  for area in AREAS:
    rs = by_area.get(area, [])
    if not rs:
      continue
    cols = [", ".join(f"`{r['id']}`" for r in rs if r["killed_by"] == kind) or "-"
            for kind in ("fuzzers", "tests")]
    bad = ", ".join(f"`{r['id']}`" for r in rs if r["killed_by"] not in ("fuzzers", "tests"))
    lines.append(f"| {area} | {cols[0]} | {cols[1]} | {bad or '-'} |")
  lines.append("")
  lines.append(f"Of {len(results)} mutants, the fuzzers alone kill {fuzzed}, only the other "
               f"tests kill {sum(r['killed_by'] == 'tests' for r in results)}, and "
               f"{sum(r['killed_by'] not in ('fuzzers', 'tests') for r in results)} survive.")
  return "\n".join(lines)


def _write_docs(results: list[dict], meta: dict | None = None) -> None:
  doc = ROOT / "docs" / "development.md"
  text = doc.read_text()
  if START not in text or END not in text:
    raise SystemExit(f"{doc} has no {START} ... {END} markers for the table")
  head, rest = text.split(START, 1)
  _, tail = rest.split(END, 1)
  doc.write_text(f"{head}{START}\n{_table(results)}\n{END}{tail}")
  meta = meta or {"date": datetime.date.today().isoformat(),
                  "python": platform.python_version()}
  (ROOT / "mutate" / "results.json").write_text(json.dumps({
      **meta, "results": [{k: v for k, v in r.items() if k != "tail"} for r in results]},
      indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", nargs="*", default=[], help="mutant ids")
  parser.add_argument("--area", nargs="*", default=[], help="areas")
  parser.add_argument("--write-docs", action="store_true",
                      help="write the table to docs/development.md and mutate/results.json")
  parser.add_argument("--render", action="store_true",
                      help="run nothing: write the table of mutate/results.json again")
  args = parser.parse_args(argv)
  if args.render:
    saved = json.loads((ROOT / "mutate" / "results.json").read_text())
    _write_docs(saved.pop("results"), saved)
    return 0
  unknown = [i for i in args.only if i not in {m.id for m in MUTANTS}]
  unknown += [a for a in args.area if a not in AREAS]
  if unknown:
    print(f"make mutate: unknown mutants or areas {unknown}", file=sys.stderr)
    return 2
  chosen = [m for m in MUTANTS if (not args.only or m.id in args.only)
            and (not args.area or m.area in args.area)]
  problems = _check_snippets(list(MUTANTS))
  if problems:
    print("make mutate: " + "\n".join(problems), file=sys.stderr)
    return 2
  results: list[dict] = []
  tests_ok: dict[str, bool] = {}
  with tempfile.TemporaryDirectory(prefix="jse-mutate-") as tmp:
    tree = pathlib.Path(tmp)
    _copy_tree(tree)
    for k, m in enumerate(chosen, 1):
      r = _run_one(tree, m, tests_ok)
      results.append(r)
      secs = r["fuzzers"]["seconds"] + r.get("tests", {}).get("seconds", 0)
      verdict = (f"killed by the {r['killed_by']}" if r["killed_by"] in ("fuzzers", "tests")
                 else "SURVIVED" if r["killed_by"] == "survived" else "could not be run")
      print(f"[{k}/{len(chosen)}] {m.area}: {m.id}: {verdict} ({secs:.0f} s)", flush=True)
      if r["killed_by"] not in ("fuzzers", "tests"):
        print("  " + r.get("tail", "").replace("\n", "\n  "), flush=True)
  print()
  print(_table(results))
  if args.write_docs and not args.only and not args.area:
    _write_docs(results)
  failed = [r["id"] for r in results if r["killed_by"] not in ("fuzzers", "tests")]
  if failed:
    print(f"\nmake mutate: FAILED: {failed} survived (or could not be run)", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
