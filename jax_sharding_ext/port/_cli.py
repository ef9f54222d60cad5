"""`python -m jax_sharding_ext.port PATH...`: the command line of the porting tool.

Exit status: 0 no findings, 1 findings remain, 2 a usage error (a path that
cannot be read, a file that does not parse, libcst missing). Every file is
read and parsed before anything is written, so on a usage error nothing is.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import TextIO

from jax_sharding_ext.port import LIBCST_MISSING
from jax_sharding_ext.port._finding import Finding

PROG = "jax-sharding-ext-port"
_SKIP_DIRS = ("__pycache__", "node_modules", "site-packages")


class UsageError(Exception):
  """A path that cannot be read or a file that does not parse: exit status 2."""


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog=PROG, description="Find the GDA-era JAX code that needs jax_sharding_ext (JSE1xx, "
      "imports --write rewrites), whose meaning changed (JSE2xx) or that JAX removed (JSE3xx).")
  p.add_argument("paths", nargs="*", metavar="PATH",
                 help="Python files, or directories to search for *.py files")
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--write", action="store_true",
                    help="rewrite the JSE1xx imports in place, then print what is left")
  mode.add_argument("--diff", action="store_true",
                    help="print the unified diff --write would make; write nothing")
  p.add_argument("--ignore", default="", metavar="CODES",
                 help="comma-separated codes or prefixes (JSE201,JSE3) not to print or count; "
                 "--write still rewrites every JSE1xx import")
  p.add_argument("--codes", action="store_true", help="list the finding codes and exit")
  return p


def _files(paths: Sequence[str]) -> list[tuple[str, pathlib.Path]]:
  """(path as shown, path) of every file to read, each once, in a stable order."""
  out: list[tuple[str, pathlib.Path]] = []
  seen: set[pathlib.Path] = set()
  for arg in paths:
    path = pathlib.Path(arg)
    if path.is_dir():
      found = []
      for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        found += [pathlib.Path(root, n) for n in sorted(names) if n.endswith(".py")]
      pairs = [(str(f), f) for f in found]
    elif path.is_file():
      pairs = [(arg, path)]
    else:
      raise UsageError(f"{arg}: no such file or directory")
    for shown, f in pairs:
      if f.resolve() not in seen:
        seen.add(f.resolve())
        out.append((shown, f))
  return out


def _read_all(engine, files):
  """[(shown, path, source bytes, module)], or a UsageError naming the file."""
  parsed = []
  for shown, path in files:
    try:
      source = path.read_bytes()
    except OSError as e:
      raise UsageError(f"{shown}: cannot read: {e.strerror or e}") from None
    try:
      parsed.append((shown, path, source, engine.parse(source, shown)))
    except SyntaxError as e:
      where = f"{shown}:{e.lineno}:{e.offset or 1}" if e.lineno else shown
      raise UsageError(f"{where}: does not parse: {e.msg}") from None
  return parsed


def _ignored(codes: str):
  prefixes = tuple(c.strip().upper() for c in codes.split(",") if c.strip())
  return lambda f: bool(prefixes) and f.code.startswith(prefixes)


def _print_findings(findings: list[Finding], ignore, out: TextIO) -> int:
  shown = [f for f in findings if not ignore(f)]
  for f in shown:
    print(f, file=out)
  return len(shown)


def _plural(n: int, word: str) -> str:
  return f"{n} {word}{'' if n == 1 else 's'}"


@dataclasses.dataclass
class _File:
  shown: str
  path: pathlib.Path
  source: bytes
  findings: list[Finding]
  fixed: bytes


def _diff(files: list[_File], out: TextIO) -> None:
  for f in files:
    out.writelines(difflib.unified_diff(
        f.source.decode("utf-8", "replace").splitlines(keepends=True),
        f.fixed.decode("utf-8", "replace").splitlines(keepends=True),
        f"a/{f.shown}", f"b/{f.shown}"))


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
  from jax_sharding_ext.port import _load_engine  # libcst: only now
  engine = _load_engine()
  ignore = _ignored(args.ignore)
  files = []
  for shown, path, source, module in _read_all(engine, _files(args.paths)):
    findings, fixed = engine.check_module(module, shown)
    files.append(_File(shown, path, source, findings, fixed.bytes))
  findings = [f for file in files for f in file.findings]
  changed = [f for f in files if f.fixed != f.source]
  fixes = sum(f.fixable for f in findings)
  if args.write:
    for f in changed:
      try:
        f.path.write_bytes(f.fixed)
      except OSError as e:
        raise UsageError(f"{f.shown}: cannot write: {e.strerror or e}") from None
    left = [g for f in changed
            for g in engine.check_module(engine.parse(f.fixed, f.shown), f.shown)[0]]
    left += [g for f in files if f not in changed for g in f.findings]
    n = _print_findings(sorted(left), ignore, out)
    print(f"fixed {_plural(fixes, 'import')} in {_plural(len(changed), 'file')}; "
          f"{_plural(n, 'finding')} left", file=err)
    return 1 if n else 0
  if args.diff:
    _diff(changed, out)
    n = sum(not ignore(f) for f in findings)
    print(f"--write would fix {_plural(fixes, 'import')} in {_plural(len(changed), 'file')}; "
          "nothing written", file=err)
    return 1 if n else 0
  n = _print_findings(findings, ignore, out)
  fixable = sum(f.fixable for f in findings if not ignore(f))
  print(f"{_plural(n, 'finding')} ({fixable} fixable with --write) in "
        f"{_plural(len(files), 'file')}", file=err)
  return 1 if n else 0


def _print_codes(out: TextIO) -> None:
  from jax_sharding_ext.port._reports import CODES
  for code, meaning in CODES.items():
    print(f"{code}  {meaning}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
  """The console script: returns the exit status (0, 1 or 2)."""
  parser = _parser()
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # argparse: --help (0) or a usage error (2)
    return int(e.code or 0)
  if args.codes:
    _print_codes(sys.stdout)
    return 0
  if not args.paths:
    parser.print_usage(sys.stderr)
    print(f"{PROG}: error: give at least one PATH", file=sys.stderr)
    return 2
  try:
    return run(args, sys.stdout, sys.stderr)
  except UsageError as e:
    print(f"{PROG}: error: {e}" + ("" if "cannot write" in str(e) else "; nothing written"),
          file=sys.stderr)
    return 2
  except ImportError as e:
    if str(e) != LIBCST_MISSING:
      raise
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
