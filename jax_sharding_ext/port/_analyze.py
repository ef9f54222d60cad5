"""Finding GDA-era code in one module, and planning every change `--write` makes (`ast`).

One walk (`_scope`) collects the imports, every use of a name (the outermost
attribute chain, resolved through Python's scopes to the import it reaches),
the calls, `with` items, decorators and watched attributes. The imports are
planned first (`_imports`): a name bound by an import that `--write` points
elsewhere is *redirected*, and its uses are judged by what they reach after
the rewrite. A use is then, by the longest matching prefix of its symbol:
renamed (`_rules.rename_for`: this package's names, and where JAX moved the
name, `_moves`; a removed array class in an annotation is `jax.Array`; a
read of the legacy mesh is `current_mesh()`, `_mesh_env`), reported
(`_reports.REPORTS`), or, under `jax`, checked against the installed JAX
(`JSE311` when missing, with JAX's own note). The rules on values (`with
mesh:`, `.device_buffers`, array attributes, ...) are in `_values` and
`_arrays`, the order of `jax.distributed.initialize()` in `_order`. An import
of a removed name that nothing uses once the rewrites are made goes, as does
one the rewrites leave unused (`_unused`). A `from M import *` of a GDA-era
module is judged by the names the module uses and binds nowhere
(`_star_imports`).
"""

from __future__ import annotations

import ast
import functools
from typing import cast

from jax_sharding_ext.port import (
    _imports,
    _jaxnames,
    _mesh_env,
    _names,
    _order,
    _reports,
    _rules,
    _scope,
    _unused,
    _values,
)
from jax_sharding_ext.port._context import Context, is_jax
from jax_sharding_ext.port._imports import Note, Plan
from jax_sharding_ext.port._source import Edit

_SIMPLE = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.Pass, ast.Expr)


def _import_resolves(node: ast.Import | ast.ImportFrom) -> bool:
  """Whether this import surely runs on today's JAX once `--write` made its
  rewrites (only JAX's and this package's names, already imported, can be told)."""
  ours = (*_jaxnames.ROOTS, _rules.PKG)
  if isinstance(node, ast.Import):
    return all(a.name.split(".")[0] in ours
               and (_rules.fix_for(a.name) is not None or _jaxnames.has(a.name, loaded=True))
               for a in node.names)
  if node.level or not node.module or node.module.split(".")[0] not in ours:
    return False
  if node.module.split(".")[0] == _rules.PKG:
    return True
  if node.names[0].name == "*":
    return _jaxnames.has(node.module, loaded=True)
  return all(_rules.fix_for(f"{node.module}.{a.name}") is not None
             or _jaxnames.has(f"{node.module}.{a.name}", loaded=True) for a in node.names)


def dead_try(node: ast.Try) -> bool:
  """A `try` whose body only imports names today's JAX has: its `except
  ImportError` branches never run."""
  body = node.body
  imports = [s for s in body if isinstance(s, ast.Import | ast.ImportFrom)]
  return (bool(imports) and all(isinstance(s, _SIMPLE) for s in body)
          and all(_import_resolves(s) for s in imports))


class _Uses:
  """Judges the uses of imported names, counting what the rewrites do to each
  import (`_unused.Count`)."""

  def __init__(self, ctx: Context) -> None:
    self.ctx = ctx
    self.count = _unused.Count(ctx)
    self.missing_left: set[str] = set()  # symbols JAX lacks that stay as written

  def judge(self, node: ast.expr, parts: list[str], scope: _scope.Scope) -> None:
    ctx = self.ctx
    for binding in ctx.bindings(parts[0], scope):
      symbol, moved = ctx.effective(binding, parts[1:])
      if id(node) in ctx.consumed:  # a call rule rewrote it
        self.count.use(binding, node, parts[0], symbol, True, ctx.consumed[id(node)])
        continue
      renamed = None
      root = symbol.partition(".")[0]
      if root == _rules.PKG:
        self._package_use(node, symbol)
      elif root in _jaxnames.ROOTS and (not moved or len(parts) > 1) and not _current(symbol):
        base_len = symbol.count(".") + 1 - (len(parts) - 1)
        renamed = self._removed_use(node, symbol, base_len, scope)
      self.count.use(binding, node, parts[0], symbol, renamed is not None, renamed)
      obj, _, option = symbol.rpartition(".")
      if obj in _reports.CONFIG_OBJECTS:
        _values.option(ctx, node, option, "read")

  def _package_use(self, node: ast.expr, symbol: str) -> None:
    """A use of this package: a name it does not have."""
    parts = symbol.split(".")
    if len(parts) >= 3 and ".".join(parts[:2]) in _rules.package_modules():
      module, name = ".".join(parts[:2]), parts[2]
    elif len(parts) >= 2 and not parts[1].startswith("_"):  # private modules: its own code
      module, name = _rules.PKG, parts[1]
    else:
      return
    if name not in _names.provided(module):
      self.ctx.note(node, "JSE307", _reports.JSE307_MISSING.format(
          shown=self.ctx.shown(node), module=module, name=name))

  def _removed_use(self, node: ast.expr, symbol: str, base_len: int,
                   scope: _scope.Scope) -> Note | None:
    """Judges a JAX symbol no import rewrite reaches; the note that renames it, if any."""
    if _current(symbol):
      return None
    ctx = self.ctx
    if _mesh_env.environment(ctx, node, symbol, scope):
      return ctx.notes[-1]
    rename = _rules.rename_for(symbol)
    found = _reports.report_for(symbol)
    mesh_read = _mesh_env.read(symbol)
    if mesh_read is not None:
      rename = ("JSE308", *mesh_read)
    if (found is not None and found[0].rpartition(".")[2] in _reports.ARRAY_TYPES
        and id(node) in ctx.walk.annotated):  # an annotation claims no more than `jax.Array`
      rename = (found[1].code, found[0], "jax.Array")
    rename_len = len(rename[1].split(".")) if rename else 0
    report_len = len(found[0].removesuffix(".*").split(".")) if found else 0
    if rename and rename_len >= report_len and rename_len >= base_len:
      return self._rename(node, symbol, rename, base_len, scope)
    if found is not None:
      ctx.note(node, found[1].code, _reports.render(found[0], found[1], ctx.shown(node)))
    else:
      note = _imports.missing_note(node, symbol, ctx.shown(node))
      if note is not None:
        ctx.notes.append(note)
    if found is None or found[1].gone:
      if not _jaxnames.has(symbol):
        self.missing_left.add(symbol)
    return None

  def _rename(self, node: ast.expr, symbol: str, rename: tuple[str, str, str],
              base_len: int, scope: _scope.Scope) -> Note | None:
    ctx = self.ctx
    code, prefix, new = rename
    target = new + symbol[len(prefix):]
    # The chain node that spells `prefix`, and the text that replaces it.
    sub: ast.expr = node
    for _ in range(len(symbol.split(".")) - len(prefix.split("."))):
      sub = sub.value  # type: ignore[attr-defined]
    old_parent, _, old_last = prefix.rpartition(".")
    new_parent, _, new_last = new.rpartition(".")
    shown = ctx.shown(node)
    if old_parent == new_parent and isinstance(sub, ast.Attribute):
      end = ctx.text.end(sub)
      edits = [Edit(end - len(sub.attr), end, new_last)]
      spelled: tuple[str, tuple[str, ...]] | None = ("", ())
    else:
      spelled = ctx.spell(new, scope)
      edits = [] if spelled is None else [Edit(ctx.text.start(sub), ctx.text.end(sub),
                                                spelled[0])]
    message = _rename_message(code, shown, prefix, symbol, target)
    if spelled is None:
      ctx.note(node, code, message)
      return None
    ctx.note(node, code, message, edits, spelled[1])
    return ctx.notes[-1]


@functools.cache
def _current(symbol: str) -> bool:
  """A JAX symbol of today's JAX that no rule renames or reports: its uses are
  left as they are (asked once per symbol, not once per use)."""
  return (symbol.split(".")[-2:] != ["thread_resources", "env"]
          and _rules.rename_for(symbol) is None and _reports.report_for(symbol) is None
          and _mesh_env.read(symbol) is None and _jaxnames.has(symbol))


def _rename_message(code: str, shown: str, prefix: str, symbol: str, target: str) -> str:
  if code == "JSE308":
    return _reports.JSE308_READ.format(shown=shown, new=target)
  if code == "JSE305":
    return _reports.JSE305.format(shown=shown, new=target)
  if code == "JSE203":
    name = symbol.split(".")[len(prefix.split("."))]
    return _reports.JSE203.format(shown=shown, name=name, what=_reports.MHU_WHAT.get(
        name, "does not treat a GDA as one global array"), new=target)
  message = _reports.JSE306.format(shown=shown, old=prefix, new=target)
  return message.removeprefix(f"`{shown}`: ") if shown == prefix else message


def _plan(stmt: _scope.ImportStmt, ctx: Context, drops: _unused.Drops | None = None) -> Plan:
  node, key = stmt.node, id(stmt.node)
  drop = drops.names.get(key, frozenset()) if drops else frozenset()
  unused = drops.left_unused.get(key, frozenset()) if drops else frozenset()
  if isinstance(node, ast.Import):
    gone = drops.gone.get(key, frozenset()) if drops else frozenset()
    return _imports.plan_import(node, drop, unused, gone)
  return _imports.plan_import_from(node, ctx.text.line(node.lineno), drop, unused)


def analyze(tree: ast.Module, ctx: Context) -> None:
  """Fills `ctx.notes` and `ctx.plans` (the import statements that change)."""
  walk = ctx.walk
  plans = {id(s.node): _plan(s, ctx) for s in walk.imports}
  for stmt in walk.imports:
    plan = plans[id(stmt.node)]
    for alias in stmt.node.names:
      local = alias.asname or alias.name
      if local in plan.redirects:
        ctx.redirects[id(alias)] = plan.redirects[local]
  _values.judge_calls(ctx)
  uses = _Uses(ctx)
  imported = walk.imported
  for node, parts, scope in walk.uses:
    if parts[0] in imported:  # a name no import binds reaches no JAX symbol
      uses.judge(node, parts, scope)
  _values.judge_values(ctx)
  _order.judge(ctx)
  drops = _unused.drops(ctx, uses.count, uses.missing_left)
  dropping = drops.statements()
  for stmt in walk.imports:
    if id(stmt.node) in dropping:
      plans[id(stmt.node)] = _plan(stmt, ctx, drops)
      ctx.waits[id(stmt.node)] = drops.waits.get(id(stmt.node), [])
  fixed_stars = _star_imports(ctx)
  for stmt in walk.imports:
    plan = plans[id(stmt.node)]
    if id(stmt.node) not in fixed_stars:
      ctx.notes.extend(plan.notes)
    if plan.changed:
      ctx.plans[id(stmt.node)] = plan


def _free_names(ctx: Context) -> dict[str, ast.expr]:
  """The names the module uses and binds nowhere (a star import's, or
  builtins), each with its first use."""
  out: dict[str, ast.expr] = {}
  for node, parts, scope in ctx.walk.uses:
    if parts[0] not in out and not ctx.bindings(parts[0], scope):
      out[parts[0]] = node
  return out


def _star_imports(ctx: Context) -> set[int]:
  """`from M import *` of a GDA-era JAX module: the names the module uses
  unbound that M provided and that moved. With the module still in JAX,
  `--write` adds their imports after the statement; with it gone, the
  statement imports them instead (or, where this package replaces the module
  whole, `*` from this package's module). A name M provided that has no
  same-meaning replacement is reported at its use. Returns the star
  statements fixed here (their plain module finding is left out)."""
  stars = [s.node for s in ctx.walk.imports
           if isinstance(s.node, ast.ImportFrom) and s.node.names[0].name == "*"
           and s.node.module and not s.node.level and is_jax(s.node.module)]
  if not stars:
    return set()
  free = _free_names(ctx)
  fixed = set()
  for node in stars:
    module = cast(str, node.module)
    moved: dict[str, list[str]] = {}  # target module -> import clauses
    names, whys = [], []
    for name, use in free.items():
      symbol = f"{module}.{name}"
      fix = _rules.fix_for(symbol)
      # Only names the module surely had: the ones this package provides for it
      # (a class JAX exports elsewhere may be the name of something else here).
      if fix is not None and fix.code.startswith("JSE1"):
        new = fix.new_name or name
        moved.setdefault(fix.targets[0], []).append(new if new == name else f"{new} as {name}")
        names.append(f"`{name}`")
        whys += [fix.why] if fix.why not in whys else []
      elif symbol in _reports.REPORTS:
        report = _reports.REPORTS[symbol]
        ctx.note(use, report.code, _reports.render(symbol, report, ctx.shown(use)))
    replacement = _rules.replaced_module(module)
    gone = not _jaxnames.has(module)
    start, end = ctx.text.start(node), ctx.text.end(node)
    if gone and replacement is not None:
      at = start + ctx.text.text[start:end].index(module, len("from"))
      edits = [Edit(at, at + len(module), replacement)]
      lines = [f"from {replacement} import *"]
    elif moved:
      lines = [f"from {m} import {', '.join(clauses)}" for m, clauses in moved.items()]
      if gone:  # the statement would fail: it becomes the imports
        edits = [Edit(start, end, _joined(ctx, node, lines))]
      else:
        edits = [_after_line(ctx, node, lines)]
        lines = [f"from {module} import *", *lines]
    else:
      continue
    if not names:  # a whole module this package replaces, none of its names used
      names, whys = ["its names"], [_rules.module_why(module)]
    ctx.note(node, "JSE108", _reports.JSE108.format(
        module=module, names=", ".join(names), why="; ".join(whys),
        new="; ".join(f"`{line}`" for line in lines)), edits)
    fixed.add(id(node))
  return fixed


def _indent(ctx: Context, node: ast.stmt) -> str:
  line = ctx.text.line(node.lineno)
  return line[:len(line) - len(line.lstrip())]


def _joined(ctx: Context, node: ast.stmt, lines: list[str]) -> str:
  """`lines` as statements at `node`'s indentation (the first one unindented)."""
  return (ctx.text.newline + _indent(ctx, node)).join(lines)


def _after_line(ctx: Context, node: ast.stmt, lines: list[str]) -> Edit:
  """Insert `lines`, at `node`'s indentation, after the line `node` ends on
  (after its comment)."""
  at, nl = ctx.text.line_end(cast(int, node.end_lineno)), ctx.text.newline
  lead = nl if not ctx.text.text[:at].endswith(("\n", "\r")) else ""
  return Edit(at, at, lead + "".join(_indent(ctx, node) + line + nl for line in lines))


def import_notes(ctx: Context) -> list[Note]:
  return [n for p in ctx.plans.values() for n in p.notes]
