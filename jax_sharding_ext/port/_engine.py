"""One module through the tool: parse (`ast`), analyze, and, for `--write`, edit.

`check_text` returns the findings; `fix_text` the text with every fixable
finding's edits applied. An import statement that changes is rewritten with
libcst (only that statement is parsed by it); every other edit is a splice of
the exact characters an `ast` node spans. `fix_text` repeats until nothing is
left to fix (an edit that overlapped another waits for the next round), at
most a few rounds, and refuses a result that does not compile. A round in
which every finding was fixable and every edit applied is the last: the
rewritten text is parsed (it must compile) but not analyzed again, as the
fixes of one round leave nothing to find (the fuzzer checks this against a
full analysis), unless the module has a star import or the round imports a
name the code uses unbound.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import warnings
from typing import cast

from jax_sharding_ext.port import _align, _analyze, _arrays, _files, _scope, _source, _values
from jax_sharding_ext.port._context import Context, Fixed
from jax_sharding_ext.port._finding import Finding
from jax_sharding_ext.port._imports import Note
from jax_sharding_ext.port._length import Growth
from jax_sharding_ext.port._project import Project
from jax_sharding_ext.port._source import Edit, Text, choose_all, splice

_ROUNDS = 4


# What code must spell for any rule to find something in it: an import (every
# rule on names, and most on values, starts at one), or a name that a rule
# judges on any object (`.device_buffers`, `.device()`, a value named like a
# mesh, the removed array classes' own attributes; `.indices` needs a jit).
_SPELLED = re.compile("|".join(["import", "device", "mesh", *sorted(
    re.escape(a) for a in _arrays.REMOVED_SURFACE if a != "indices")]), re.IGNORECASE)


def could_find(text: str) -> bool:
  """False when no rule can find anything in `text` (it spells none of the
  words every finding needs): the module need not be parsed."""
  return _SPELLED.search(text) is not None


def parse(text: str, path: str) -> ast.Module:
  """The module's `ast`, or a SyntaxError naming `path` (a module too deep for
  Python's own parser is one as well: Python cannot run it either)."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # e.g. invalid escape sequences
      return ast.parse(text, path)
  except SyntaxError as e:
    e.filename = path
    raise
  except (RecursionError, MemoryError) as e:
    raise SyntaxError(f"too deeply nested for Python's parser ({type(e).__name__})",
                      (path, 1, 1, None)) from None
  except ValueError as e:  # a null byte
    raise SyntaxError(str(e), (path, 1, 1, None)) from None


@dataclasses.dataclass
class Result:
  findings: list[Finding]
  ctx: Context


def context(text: str, path: str, tree: ast.Module | None = None,
            project: Project | None = None) -> Context:
  """What the rules read of one module (nothing judged yet)."""
  tree = tree if tree is not None else parse(text, path)
  walk = _scope.walk(tree, _analyze.dead_try, _values.WATCHED | _arrays.watched())
  return Context(tree, Text(text), walk, path, project)


def load(path: str, project: Project) -> Context | None:
  """Another file of the project, for the rules that follow calls into it."""
  try:
    return context(_source.decode(_files.read(path))[0], path, project=project)
  except (_files.Unreadable, SyntaxError):
    return None


def project_of(paths: list[str]) -> Project:
  """The project of a run over `paths` (the files it reads others from)."""
  holder: list[Project] = []
  project = Project(paths, lambda path: load(path, holder[0]))
  holder.append(project)
  return project


def analyze(text: str, path: str, tree: ast.Module | None = None,
            project: Project | None = None) -> Result:
  if project is None:
    project = project_of([path])
  ctx = context(text, path, tree, project)
  _analyze.analyze(ctx.tree, ctx)
  return Result(_findings(ctx, path), ctx)


def _position(ctx: Context, note: Note) -> tuple[int, int]:
  if note.pos is not None:
    line, col = note.pos
  else:
    line, col = note.node.lineno, note.node.col_offset  # type: ignore[union-attr]
  return line, ctx.text.column(line, col) + 1


def _findings(ctx: Context, path: str) -> list[Finding]:
  """One finding per (place, code); a fixable one wins over a report."""
  best: dict[tuple[int, int, str], Finding] = {}
  for note in ctx.notes:
    line, col = _position(ctx, note)
    f = Finding(path, line, col, note.code, note.message, note.fixable)
    key = (line, col, note.code)
    if key not in best or (f.fixable and not best[key].fixable):
      best[key] = f
  return sorted(best.values())


def _import_edit(ctx: Context, node: ast.Import | ast.ImportFrom, plan) -> Edit:
  from jax_sharding_ext.port import _rewrite  # libcst: only for what --write changes
  text = ctx.text
  start, end = text.start(node), text.end(node)
  first = text.starts[node.lineno - 1]
  end_lineno = cast(int, node.end_lineno)  # set on every parsed statement
  after = text.line(end_lineno).encode("utf-8")[node.end_col_offset:].decode("utf-8")
  alone = (not text.text[first:start].strip()
           and (not after.strip() or after.strip().startswith("#")))
  if alone:
    body = ctx.walk.body_of(node)
    indent = text.text[first:start]
    end_line = text.line_end(end_lineno)
    lines = text.text[first:end_line]
    new = _rewrite.rewrite_lines(lines, indent, plan, len(body) == 1, text.newline)
    return Edit(first, end_line, new)
  return Edit(start, end, _rewrite.rewrite_statement(text.text[start:end], plan))


def edit_groups(ctx: Context) -> list[list[Edit]]:
  """The edits of every fixable finding, import statements first; the added
  imports go with each finding that needs them."""
  needs: set[str] = set()
  for note in ctx.notes:
    if isinstance(note, Fixed):
      needs.update(note.needs)
  insertion = ctx.insertion(needs)

  def edits(note: Fixed) -> list[Edit]:
    return [*note.edits, *([insertion] if insertion is not None and note.needs else [])]

  # An import that goes takes the rewrites of its uses with it: all or none.
  groups = [[_import_edit(ctx, s.node, ctx.plans[id(s.node)]),
             *(e for n in ctx.waits.get(id(s.node), []) if isinstance(n, Fixed) for e in edits(n))]
            for s in ctx.walk.imports if id(s.node) in ctx.plans]
  groups += [edits(note) for note in ctx.notes if isinstance(note, Fixed)]
  return groups


def check_text(text: str, path: str = "<source>", project: Project | None = None
               ) -> list[Finding]:
  return analyze(text, path, project=project).findings


def fix_text(text: str, path: str = "<source>", project: Project | None = None,
             growth: Growth | None = None) -> tuple[str, list[Finding], list[Finding]]:
  """(the text with every fixable finding fixed, the findings of the text as
  given, the findings left in the fixed text). `growth` follows the lines the
  rewrite touches."""
  project = project if project is not None else project_of([path])
  result = analyze(text, path, project=project)
  before = result.findings
  for _ in range(_ROUNDS):
    if not any(f.fixable for f in result.findings):
      break
    edits, every = choose_all(edit_groups(result.ctx))
    edits = sorted(edits + _align.realign(result.ctx.text, edits), key=lambda e: (e.start, e.end))
    new = splice(text, edits)
    if new == text:
      break
    settled = every and all(n.fixable for n in result.ctx.notes) and _closed(result.ctx)
    old = result.ctx.text
    result = None  # type: ignore[assignment]  # one module's tree in memory at a time
    try:
      tree = parse(new, path)
    except SyntaxError as e:
      raise RuntimeError(f"{path}: the rewrite does not compile ({e.msg} at line "
                         f"{e.lineno}); nothing written. Please report this.") from None
    if settled:  # every finding was fixed in this round: nothing is left
      if growth is not None:
        growth.rewrite(old, edits, Text(new))
      return new, before, []
    text, result = new, analyze(new, path, tree, project)
    if growth is not None:
      growth.rewrite(old, edits, result.ctx.text)
  return text, before, result.findings


def _closed(ctx: Context) -> bool:
  """Whether a round that makes every fix of `ctx` leaves nothing to find: no
  star import (whose names the rewrite may bind), and no module the round
  imports whose name the code uses unbound (the new import would bind it)."""
  if any(isinstance(s.node, ast.ImportFrom) and s.node.names[0].name == "*"
         for s in ctx.walk.imports):
    return False
  needs = {m.partition(".")[0] for n in ctx.notes if isinstance(n, Fixed) for m in n.needs}
  return not any(not ctx.bindings(root, scope) for root in needs
                 for _node, _parts, scope in ctx.walk.uses_of(root))
