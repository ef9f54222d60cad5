"""Imports that `--write` removes: of removed names nothing uses, and those its rewrites leave unused.

`Count` records, for every use of an imported name, whether a rewrite
replaces it and whether the replacement still names the import (`maps.X`
becoming `jax.sharding.X` no longer names `maps`; a rename of the last part
only, `shd.Old` becoming `shd.New`, still does). `drops` then decides, per
import statement (one inside a `try` that catches `ImportError` is left alone):

- an import of a name the installed JAX lacks (and nothing replaces) whose
  uses are all rewritten, or that nothing uses, goes; `import a.b.c` of such
  a module becomes `import a`;
- an import of a name JAX still has (`from jax.experimental import pjit`,
  `import jax.experimental.multihost_utils`) goes when it had uses and every
  one of them is replaced by a spelling that no longer names it: the rewrite
  left it unused. An import nothing used before the rewrite is the user's own
  and stays. `import a.b.c` is judged by the uses that reach `a.b.c`; it goes
  where another import of the same scope still binds `a`, else it becomes
  `import a`. An import that binds a top-level package (`import jax as j`)
  stays: a rewrite may spell a new name through it.

A name the module lists in `__all__` is used. The rewrites of the uses of an
import that goes are made in the same round as its removal (`waits`), so a
rewrite that has to wait for a later round keeps the import until then.
"""

from __future__ import annotations

import ast
import dataclasses
import re

from jax_sharding_ext.port import _jaxnames, _rules
from jax_sharding_ext.port._context import Context, is_jax
from jax_sharding_ext.port._imports import Note

_IDENTIFIER = re.compile(r"[^\W\d]\w*")


class Count:
  """Per import alias: its uses, how many a rewrite replaces, and how many of
  those no longer name the import; per use of a plain `import a...`, the
  symbol it reaches and whether its rewrite drops the name."""

  def __init__(self, ctx: Context) -> None:
    self.ctx = ctx
    self.total: dict[int, int] = {}
    self.rewritten: dict[int, int] = {}
    self.away: dict[int, int] = {}
    self.notes: dict[int, list[Note]] = {}
    self.chains: list[tuple[str, bool, Note | None]] = []
    self._chains = any(isinstance(s.node, ast.Import) and any(
        a.asname is None and "." in a.name for a in s.node.names) for s in ctx.walk.imports)

  def use(self, binding, node: ast.expr, local: str, symbol: str, rewritten: bool,
          note: Note | None) -> None:
    key = id(binding.alias)
    self.total[key] = self.total.get(key, 0) + 1
    away = False
    if rewritten:
      self.rewritten[key] = self.rewritten.get(key, 0) + 1
      if note is not None:
        self.notes.setdefault(key, []).append(note)
        away = _replaces_name(self.ctx, node, local, note)
    if away:
      self.away[key] = self.away.get(key, 0) + 1
    if (self._chains and isinstance(binding.stmt, ast.Import) and binding.alias is not None
        and binding.alias.asname is None):
      self.chains.append((symbol, away, note))

  def module_left_unused(self, dotted: str) -> list[Note] | None:
    """For `import a.b.c`: the rewrites of the uses that reach `a.b.c` when there
    were some and none still names it, else None."""
    found = [(away, note) for symbol, away, note in self.chains
             if symbol == dotted or symbol.startswith(dotted + ".")]
    if not found or not all(away for away, _ in found):
      return None
    return [note for _, note in found if note is not None]


def _replaces_name(ctx: Context, node: ast.expr, local: str, note: Note) -> bool:
  """Whether `note`'s edits replace the name `local` that starts `node` by a
  spelling that does not start with it."""
  start = ctx.text.start(node)
  for e in getattr(note, "edits", ()):
    if e.start <= start < e.end:
      found = _IDENTIFIER.match(e.new)
      return found is None or found.group() != local
  return False


@dataclasses.dataclass
class Drops:
  """Per import statement (by id): `names` to leave out (local names; for a plain
  `import a.b.c`, its dotted name, which becomes `import a`), `left_unused`
  (of those, the ones the rewrite left unused), `gone` (plain `import a.b.c`
  to leave out whole), and `waits` (the notes whose edits go with it)."""
  names: dict[int, frozenset[str]] = dataclasses.field(default_factory=dict)
  left_unused: dict[int, frozenset[str]] = dataclasses.field(default_factory=dict)
  gone: dict[int, frozenset[str]] = dataclasses.field(default_factory=dict)
  waits: dict[int, list[Note]] = dataclasses.field(default_factory=dict)

  def add(self, table: dict[int, frozenset[str]], node: ast.AST, name: str) -> None:
    table[id(node)] = table.get(id(node), frozenset()) | {name}

  def wait(self, node: ast.AST, notes: list[Note]) -> None:
    self.waits.setdefault(id(node), []).extend(notes)

  def statements(self) -> set[int]:
    return set(self.names) | set(self.gone)


def drops(ctx: Context, count: Count, missing_left: set[str]) -> Drops:
  out = Drops()
  exported = _exported(ctx.tree)
  plain: list = []  # (statement, alias) of `import a.b.c` its rewrite left unused
  for stmt in ctx.walk.imports:
    if stmt.guarded:
      continue
    node = stmt.node
    for alias in node.names:
      if isinstance(node, ast.Import) and alias.asname is None:
        if not is_jax(alias.name):
          continue
        if not _jaxnames.is_module(alias.name):
          if not any(s == alias.name or s.startswith(alias.name + ".") for s in missing_left):
            out.add(out.names, node, alias.name)
        elif ("." in alias.name and alias.name.split(".")[0] not in exported
              and not _in_annotation_strings(ctx, alias.name)):
          notes = count.module_left_unused(alias.name)
          if notes is not None:
            plain.append((stmt, alias, notes))
        continue
      if isinstance(node, ast.ImportFrom) and (node.level or not node.module
                                               or alias.name == "*"):
        continue
      symbol = alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
      key, local = id(alias), alias.asname or alias.name
      if not is_jax(symbol) or _rules.fix_for(symbol) is not None or local in exported:
        continue
      if _in_annotation_strings(ctx, local):  # `x: 'jnp.ndarray'` names it too
        continue
      total = count.total.get(key, 0)
      if not _jaxnames.has(symbol):
        if count.rewritten.get(key, 0) == total:
          out.add(out.names, node, local)
          out.wait(node, count.notes.get(key, []))
      elif total and count.away.get(key, 0) == total and "." in symbol:
        out.add(out.names, node, local)
        out.add(out.left_unused, node, local)
        out.wait(node, count.notes.get(key, []))
  _plain_imports(ctx, out, plain)
  return out


def _in_annotation_strings(ctx: Context, name: str) -> bool:
  strings = ctx.walk.annotation_strings
  return bool(strings) and any(
      re.search(rf"(?<![\w.]){re.escape(name)}\b", s) for s in strings)


def _plain_imports(ctx: Context, out: Drops, plain: list) -> None:
  """`import a.b.c` left unused goes where another import of its scope still
  binds `a`, else becomes `import a`."""
  candidates = {id(alias) for _, alias, _ in plain}
  binding_root: dict[tuple[int, str], int] = {}  # (scope, root) -> imports that keep binding it
  for stmt in ctx.walk.imports:
    if isinstance(stmt.node, ast.Import):
      for alias in stmt.node.names:
        if alias.asname is None and id(alias) not in candidates:
          root = (id(stmt.scope), alias.name.split(".")[0])
          binding_root[root] = binding_root.get(root, 0) + 1
  for stmt, alias, notes in plain:
    root = (id(stmt.scope), alias.name.split(".")[0])
    if binding_root.get(root):
      out.add(out.gone, stmt.node, alias.name)
    else:
      out.add(out.names, stmt.node, alias.name)
      binding_root[root] = 1
    out.add(out.left_unused, stmt.node, alias.name)
    out.wait(stmt.node, notes)


def _exported(tree: ast.Module) -> frozenset[str]:
  """The names a module's `__all__` lists (strings written out)."""
  names: set[str] = set()
  for stmt in tree.body:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else (
        [stmt.target] if isinstance(stmt, ast.AugAssign | ast.AnnAssign) else [])
    value = getattr(stmt, "value", None)
    if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and value is not None:
      names.update(n.value for n in ast.walk(value)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str))
  return frozenset(names)
