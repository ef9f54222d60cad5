"""What the rules share for one module: the text, the walk, symbols, spelling, notes.

`Context.symbols(node, scope)` resolves a name or attribute chain through the
imports it reaches (as `--write` will have rewritten them); `spell(target,
scope)` writes a dotted name so that it works at that place, asking for the
import it needs (added once, after the module's first top-level JAX import);
`note(...)` records a finding and, when fixable, the edits that make it.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from jax_sharding_ext.port import _jaxnames, _rules, _scope
from jax_sharding_ext.port._imports import Note, Plan
from jax_sharding_ext.port._source import Edit, Text, shown

_ANCHOR_ROOTS = ("jax", "jaxlib", _rules.PKG)


@dataclasses.dataclass
class Fixed(Note):
  """A note with the edits that fix it (all of them or none)."""
  edits: list[Edit] = dataclasses.field(default_factory=list)
  needs: tuple[str, ...] = ()  # modules to import at the top for these edits


class Context:
  def __init__(self, tree: ast.Module, text: Text, walk: _scope.Walk, path: str = "<source>",
               project: Any = None) -> None:
    self.tree = tree
    self.text = text
    self.walk = walk
    self.path = path  # the file's path (the rules that read other files start from it)
    self.project = project  # a `_project.Project`, or None
    self.notes: list[Note] = []
    self.plans: dict[int, Plan] = {}  # id(import statement) -> its plan
    self.redirects: dict[int, tuple[str, str]] = {}  # id(alias) -> (old, new)
    self.consumed: dict[int, Note | None] = {}  # id(node) a call rule judged -> its rewrite
    self.waits: dict[int, list[Note]] = {}  # id(import statement) -> rewrites made with it
    self._imports_package: dict[str, bool] = {}
    self._bindings: dict[tuple[str, int], list[_scope.Binding]] = {}  # the walk's scopes live on

  # -- symbols ---------------------------------------------------------------

  def bindings(self, name: str, scope: _scope.Scope) -> list[_scope.Binding]:
    """The import bindings `name` reaches here (one per distinct dotted name)."""
    key = (name, id(scope))
    found = self._bindings.get(key)
    if found is None:
      seen, found = set(), []
      for b in scope.lookup(name):
        if b.qualified is not None and b.qualified not in seen:
          seen.add(b.qualified)
          found.append(b)
      self._bindings[key] = found
    return found

  def effective(self, binding: _scope.Binding, rest: list[str]) -> tuple[str, bool]:
    """The symbol a chain reaches through `binding` once `--write` rewrote the
    import, and whether the import moves it."""
    symbol = ".".join([binding.qualified, *rest])  # type: ignore[list-item]
    if binding.alias is not None and id(binding.alias) in self.redirects:
      old, new = self.redirects[id(binding.alias)]
      if symbol == old or symbol.startswith(old + "."):
        return new + symbol[len(old):], True
    return symbol, False

  def symbols(self, node: ast.expr, scope: _scope.Scope) -> list[str]:
    parts = _scope.chain(node)
    if parts is None:
      return []
    return [self.effective(b, parts[1:])[0] for b in self.bindings(parts[0], scope)]

  def imports_package(self, module: str = _rules.PKG) -> bool:
    """Whether the module imports `module` (or a module inside it) anywhere."""
    found = self._imports_package.get(module)
    if found is None:
      found = self._imports_package[module] = self._find_package_import(module)
    return found

  def _find_package_import(self, module: str) -> bool:
    return any(b.qualified is not None and (b.qualified == module
                                            or b.qualified.startswith(module + "."))
               for s in self._import_bindings() for b in s)

  def _import_bindings(self):
    for stmt in self.walk.imports:
      if isinstance(stmt.node, ast.Import):
        yield [_scope.Binding(a.name) for a in stmt.node.names]
      elif stmt.node.module and not stmt.node.level:
        yield [_scope.Binding(f"{stmt.node.module}.{a.name}") for a in stmt.node.names]

  # -- spelling ----------------------------------------------------------------

  def spell(self, target: str, scope: _scope.Scope) -> tuple[str, tuple[str, ...]] | None:
    """(`target` as code can write it in `scope`, the imports to add), or None
    when its top-level name means something else there."""
    root, _, rest = target.partition(".")
    module = _rules.import_for(target)
    found = self.walk.module.names.get(root) is None and not scope.lookup(root)
    if found:
      return target, (module,)
    for name, bindings in self.walk.module.names.items():
      if bindings and all(b.qualified == root and b.alias is not None for b in bindings):
        if scope.lookup(name) is bindings:
          needs = (module,) if module != root and not self._imported(module) else ()
          return f"{name}.{rest}" if rest else name, needs
    return None

  def _imported(self, module: str) -> bool:
    return any(isinstance(s.node, ast.Import) and s.scope is self.walk.module
               and any(a.name == module for a in s.node.names) for s in self.walk.imports)

  # -- notes -------------------------------------------------------------------

  def shown(self, node: ast.AST) -> str:
    return shown(self.text.segment(node))

  def note(self, node: ast.AST, code: str, message: str, edits: list[Edit] | None = None,
           needs: tuple[str, ...] = ()) -> None:
    if edits is None:
      self.notes.append(Note(node, code, message))
    else:
      self.notes.append(Fixed(node, code, message + _rules.WRITE, True, edits=edits,
                              needs=needs))

  def replace(self, node: ast.AST, new: str) -> Edit:
    return Edit(self.text.start(node), self.text.end(node), new)

  def anchor(self) -> int:
    """Where added imports go: after the first top-level statement that imports
    JAX (or a library built on it), else after the docstring and `__future__`."""
    body = self.tree.body
    for stmt in body:
      if any(isinstance(n, ast.Import | ast.ImportFrom) and _is_anchor(n)
             for n in _shallow(stmt)):
        return self.text.line_end(stmt.end_lineno)  # type: ignore[arg-type]
    last = None
    for stmt in body:
      if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
          and last is None) or (isinstance(stmt, ast.ImportFrom)
                                and stmt.module == "__future__"):
        last = stmt
      else:
        break
    return 0 if last is None else self.text.line_end(last.end_lineno)  # type: ignore[arg-type]

  def insertion(self, modules: set[str]) -> Edit | None:
    if not modules:
      return None
    at = self.anchor()
    nl = self.text.newline
    lead = nl if at and not self.text.text[:at].endswith(("\n", "\r")) else ""
    return Edit(at, at, lead + "".join(f"import {m}{nl}" for m in sorted(modules)))


def _shallow(stmt: ast.stmt):
  """`stmt` and the statements directly in its blocks (a `try` / `if` around imports)."""
  yield stmt
  for name in ("body", "orelse", "finalbody"):
    for s in getattr(stmt, name, None) or []:
      if isinstance(s, ast.stmt):
        yield s
  for h in getattr(stmt, "handlers", None) or []:
    yield from h.body


def _is_anchor(node: ast.Import | ast.ImportFrom) -> bool:
  if isinstance(node, ast.ImportFrom):
    return not node.level and (node.module or "").split(".")[0] in _ANCHOR_ROOTS
  return any(a.name.split(".")[0] in _ANCHOR_ROOTS for a in node.names)


def is_jax(symbol: str) -> bool:
  return symbol.split(".")[0] in _jaxnames.ROOTS
