"""`python -m jax_sharding_ext.port PATH...`: the command line of the porting tool.

Files are handled one at a time (read, checked, rewritten with `--write`),
so memory does not grow with the tree; one that does not mention `jax`, or
spells none of the words a finding needs (`_engine.could_find`), is not
parsed. The files of the run are one project (`_project`), whose other files
a rule reads only when it follows a value into them. A file that cannot be read or does not parse (or that meets a
defect of the tool) is reported on stderr, left as it is, and the run goes
on; the exit status is then 2. Otherwise it is 1 when findings are left
(those not `--ignore`d), else 0.
`-` reads a module from stdin; with `--write` the rewritten module goes to
stdout and the findings left to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import gc
import pathlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from jax_sharding_ext.port import LIBCST_MISSING, _files, _length
from jax_sharding_ext.port._finding import Finding
from jax_sharding_ext.port._source import Text

PROG = "jax-sharding-ext-port"


_DESCRIPTION = """\
Find the GDA-era JAX code that needs jax_sharding_ext or a change (JSE1xx
imports, JSE2xx changed meanings, JSE3xx removed APIs), and with --write make
every change that has one meaning."""

_EPILOG = f"""\
examples:
  {PROG} src/ notebooks/ train.py
      print the findings, one a line
  {PROG} --diff train.py
      show the changes --write would make
  {PROG} --write src/ train.py
      make them, and print what is left
  {PROG} --write - < old.py > new.py
      a module from stdin, rewritten to stdout (findings on stderr)
  {PROG} --ignore JSE3 src/
      leave the JSE3xx findings out
  python -m jax_sharding_ext.port ...
      the same command

exit status:
  0  no findings (left): none found, or --write fixed them all
  1  findings left (those --ignore does not hide)
  2  a file could not be read or does not parse (the other files are
     handled all the same), or the command line is wrong

A finding prints as `path:line:col: CODE message` (in a notebook,
`nb.ipynb:cell N:line:col: ...`); one that ends in "(--write fixes this)" is
a change --write makes. --write and --diff also note on stderr the lines they
make longer than the file's line length (configured, else its longest line).
"""


def _version() -> str:
  import importlib.metadata

  import jax

  from jax_sharding_ext import __version__
  try:
    libcst = f"libcst {importlib.metadata.version('libcst')}"
  except importlib.metadata.PackageNotFoundError:
    libcst = "libcst missing: pip install 'jax-sharding-ext[port]'"
  return f"{PROG} {__version__} (JAX {jax.__version__}, {libcst})"


class _Version(argparse.Action):
  """`--version`: the versions are looked up only when asked for."""

  def __call__(self, parser, namespace, values, option_string=None) -> None:
    print(_version())
    parser.exit()


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog=PROG, description=_DESCRIPTION, epilog=_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("-V", "--version", action=_Version, nargs=0,
                 help="print the version (and JAX's and libcst's) and exit")
  p.add_argument("paths", nargs="*", metavar="PATH",
                 help="Python files, notebooks (.ipynb), directories to search for them, "
                 "or - for stdin")
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--write", action="store_true",
                    help="make every change marked '(--write fixes this)' in place, then "
                    "print what is left")
  mode.add_argument("--diff", action="store_true",
                    help="print the unified diff --write would make; write nothing")
  p.add_argument("--ignore", default="", metavar="CODES",
                 help="comma-separated codes or prefixes (JSE201,JSE3) not to print or count; "
                 "--write still fixes them")
  p.add_argument("--codes", action="store_true", help="list the finding codes and exit")
  return p


def _ignored(codes: str) -> Callable[[Finding], bool]:
  prefixes = tuple(c.strip().upper() for c in codes.split(",") if c.strip())
  return lambda f: bool(prefixes) and f.code.startswith(prefixes)


def _plural(n: int, word: str) -> str:
  return f"{n} {word}{'' if n == 1 else 's'}"


def _mentions_jax(raw: bytes) -> bool:
  return b"jax" in raw or b"orbax" in raw


@dataclasses.dataclass
class _Run:
  args: argparse.Namespace
  engine: object
  out: TextIO
  err: TextIO
  ignore: Callable[[Finding], bool]
  project: Any = None  # the files of the run (`_project.Project`), for rules across files
  files: int = 0
  errors: int = 0
  shown_findings: int = 0
  fixable: int = 0
  fixed: int = 0
  changed: int = 0
  grown_lines: int = 0  # lines the rewrite made longer than their file's line length

  def error(self, message: str) -> None:
    self.errors += 1
    print(f"{PROG}: error: {message}", file=self.err)

  def report(self, findings: list[Finding], stream: TextIO | None = None) -> None:
    for f in findings:
      if not self.ignore(f):
        self.shown_findings += 1
        print(f, file=stream or self.out)

  def grown(self, shown: str, growth: Any, fixed: str, limit: Callable[[], Any],
            where: Callable[[int], str] | None = None) -> None:
    """Notes (on stderr) the lines the rewrite made longer than the file's line length."""
    if not growth.origin:
      return
    found = limit()
    if found is None:
      return
    verb = "would make" if self.args.diff else "made"
    for line, now, was in growth.grown(Text(fixed), found.length):
      self.grown_lines += 1
      place = where(line) if where is not None else f"{shown}:{line}"
      grew = f", from {was}" if was is not None else ""
      print(f"{place}: note: --write {verb} this line {now} characters long{grew}, past the "
            f"file's {found.length} ({found.source}); wrap it", file=self.err)

  def diff(self, shown: str, before: str, after: str) -> None:
    self.out.writelines(difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        f"a/{shown}", f"b/{shown}"))


def _fix(run: _Run, text: str, shown: str, growth: Any
         ) -> tuple[str, list[Finding], list[Finding]]:
  """(fixed text, findings before, findings left), or raises SyntaxError / RuntimeError."""
  return run.engine.fix_text(text, shown, run.project, growth)  # type: ignore[attr-defined]


def _python(run: _Run, shown: str, path: str, raw: bytes) -> None:
  from jax_sharding_ext.port import _source
  if not _mentions_jax(raw):
    if path == "-" and run.args.write:
      sys.stdout.buffer.write(raw)
    return
  text, encoding, bom = _source.decode(raw)
  if not run.engine.could_find(text):  # type: ignore[attr-defined]
    if path == "-" and run.args.write:
      sys.stdout.buffer.write(raw)
    return
  if not (run.args.write or run.args.diff):
    findings = run.engine.check_text(text, shown, run.project)  # type: ignore[attr-defined]
    run.fixable += sum(f.fixable and not run.ignore(f) for f in findings)
    run.report(findings)
    return
  growth = _length.Growth()
  fixed, before, left = _fix(run, text, shown, growth)
  run.grown(shown, growth, fixed, lambda: _length.limit(path, text.splitlines()))
  if run.args.diff:
    run.fixable += sum(f.fixable for f in before)
    run.shown_findings += sum(not run.ignore(f) for f in before)
    if fixed != text:
      run.changed += 1
      run.diff(shown, text, fixed)
    return
  run.fixed += sum(f.fixable for f in before)
  if path == "-":
    sys.stdout.flush()
    sys.stdout.buffer.write(_source.encode(fixed, encoding, bom))
    sys.stdout.flush()
    run.report(left, run.err)
    return
  if fixed != text:
    _write(run, shown, path, _source.encode(fixed, encoding, bom))
  run.report(left)


def _write(run: _Run, shown: str, path: str, data: bytes) -> None:
  try:
    pathlib.Path(path).write_bytes(data)
    run.changed += 1
  except OSError as e:
    run.error(f"{shown}: cannot write: {e.strerror or e}")


def _in_cells(findings: list[Finding], shown: str, nb: Any, text: str) -> list[Finding]:
  """`findings` in `text` (a notebook's `module_text`) as places in its cells."""
  from jax_sharding_ext.port import _notebook
  starts, lines = _notebook.cell_starts(text), text.split("\n")
  out = []
  for f in findings:
    number, line = _notebook.locate(starts, f.line)
    out.append(dataclasses.replace(f, path=f"{shown}:cell {number}", line=line,
                                   col=_notebook.column(nb, lines[f.line - 1], f.col)))
  return out


def _notebook_file(run: _Run, shown: str, path: str, raw: bytes) -> None:
  from jax_sharding_ext.port import _notebook
  try:
    nb = _notebook.load(raw, shown)
  except ValueError as e:
    run.error(f"{shown}: {e}")
    return
  for number, bad in nb.broken.items():
    run.error(f"{shown}:cell {number}:{bad.lineno or 1}:{bad.offset or 1}: does not parse: "
              f"{bad.msg}; cell left as it is")
  text, _ = _notebook.module_text(nb)
  if not (_mentions_jax(text.encode("utf-8"))
          and run.engine.could_find(text)):  # type: ignore[attr-defined]
    return
  if not (run.args.write or run.args.diff):
    findings = run.engine.check_text(text, shown, run.project)  # type: ignore[attr-defined]
    run.fixable += sum(f.fixable and not run.ignore(f) for f in findings)
    run.report(_in_cells(findings, shown, nb, text))
    return
  growth = _length.Growth(lambda line: len(_notebook.cell_line(nb, line)))
  fixed, before, left = _fix(run, text, shown, growth)
  starts = _notebook.cell_starts(fixed)
  run.grown(shown, growth, fixed, lambda: _length.limit(path, _notebook.code_lines(nb, text)),
            lambda line: "{}:cell {}:{}".format(shown, *_notebook.locate(starts, line)))
  data = _notebook.dump(nb, fixed) if fixed != text else raw
  if run.args.diff:
    run.fixable += sum(f.fixable for f in before)
    run.shown_findings += sum(not run.ignore(f) for f in before)
    if data != raw:
      run.changed += 1
      run.diff(shown, raw.decode("utf-8", "replace"), data.decode("utf-8"))
    return
  run.fixed += sum(f.fixable for f in before)
  if data != raw:
    _write(run, shown, path, data)
  run.report(_in_cells(left, shown, nb, fixed))


@contextlib.contextmanager
def _frozen() -> Iterator[None]:
  """What the process made before the files (JAX, this package) is left out of
  the collections after each file (`gc.freeze`), and put back at the end: a
  caller of `main` keeps its collector as it was. Where the caller froze
  objects itself, its freeze is left alone."""
  own = gc.get_freeze_count() == 0
  if own:
    gc.freeze()
  try:
    yield
  finally:
    if own:
      gc.unfreeze()


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
  """Python's cycle collector paused while one file is handled, then run once.

  A module's `ast` has a node per token or so, and the collector, run every
  few hundred allocations, walks all the objects that survive: on a large file
  it took a third of the run and more. The tool makes few reference cycles;
  one collection after each file frees those (the objects from before the
  files, frozen at startup, are not walked again).
  """
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()
      gc.collect()


def _one(run: _Run, shown: str, path: str) -> None:
  try:
    raw = sys.stdin.buffer.read() if path == "-" else _files.read(path)
  except _files.Unreadable as e:
    run.error(f"{shown}: {e}")
    return
  run.files += 1
  with _no_cycle_collection():
    _handle(run, shown, path, raw)


def _handle(run: _Run, shown: str, path: str, raw: bytes) -> None:
  try:
    if path.endswith(".ipynb"):
      _notebook_file(run, shown, path, raw)
    else:
      _python(run, shown, path, raw)
  except SyntaxError as e:
    where = f"{shown}:{e.lineno}:{e.offset or 1}" if e.lineno else shown
    run.error(f"{where}: does not parse: {e.msg}")
  except RuntimeError as e:
    run.error(str(e))
  except Exception as e:  # a defect of the tool: this file is left as it is, the run goes on
    run.error(f"{shown}: internal error ({type(e).__name__}: {e}); the file is left as it is. "
              "Please report this.")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
  from jax_sharding_ext.port import _load_engine
  engine = _load_engine(rewrite=args.write or args.diff)  # libcst: only now, and only to rewrite
  state = _Run(args, engine, out, err, _ignored(args.ignore))
  paths = list(_files.paths(args.paths))
  state.project = state.engine.project_of([path for _, path, _ in paths])  # type: ignore[attr-defined]
  with _frozen():
    for shown, path, _named in paths:
      _one(state, shown, path)
      out.flush()
  files = _plural(state.files, "file")
  if args.write:
    print(f"fixed {_plural(state.fixed, 'finding')} in {_plural(state.changed, 'file')}; "
          f"{_plural(state.shown_findings, 'finding')} left", file=err)
  elif args.diff:
    print(f"--write would fix {_plural(state.fixable, 'finding')} in "
          f"{_plural(state.changed, 'file')}; nothing written", file=err)
  else:
    print(f"{_plural(state.shown_findings, 'finding')} ({state.fixable} fixable with "
          f"--write) in {files}", file=err)
  if state.grown_lines:
    print(f"{_plural(state.grown_lines, 'line')} made longer than the file's line length "
          "(notes above)", file=err)
  if state.errors:
    print(f"{PROG}: {_plural(state.errors, 'problem')} (above)", file=err)
    return 2
  return 1 if state.shown_findings else 0


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
    print(f"{PROG}: error: give at least one PATH (or - for stdin)", file=sys.stderr)
    return 2
  try:
    return run(args, sys.stdout, sys.stderr)
  except ImportError as e:
    if str(e) != LIBCST_MISSING:
      raise
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
