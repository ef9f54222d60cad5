"""Finding GDA-era code in one module (libcst).

One pass collects the import statements and every use of an imported name
(the outermost attribute chain, resolved through imports and aliases by
libcst's `QualifiedNameProvider`), the calls, the `with` items and the names
bound to a `Mesh(...)`. The imports are planned first (`_imports`): a name
bound by an import that `--write` points at this package is *redirected*, and
its uses are judged by what they reach after the rewrite, so the findings
left after `--write` are exactly the `JSE2xx` / `JSE3xx` ones of before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import (
  MetadataWrapper,
  PositionProvider,
  QualifiedNameProvider,
  QualifiedNameSource,
)

from jax_sharding_ext.port import _imports, _names, _reports, _rules
from jax_sharding_ext.port._finding import Finding
from jax_sharding_ext.port._imports import Note

_ROOTS = ("jax", "jaxlib", _rules.PKG)
_MESH_CLASSES = frozenset({"jax.sharding.Mesh", f"{_rules.PKG}.Mesh", "jax.experimental.maps.Mesh",
                           "jax.interpreters.pxla.Mesh"})
_MESH_NAME = re.compile(r"(^|_)mesh$", re.IGNORECASE)
_MESH_FACTORY = re.compile(r"^(create|make)_(\w+_)?mesh$")  # jax.make_mesh, create_global_mesh
_WSC = frozenset({"jax.lax.with_sharding_constraint",
                  "jax.experimental.pjit.with_sharding_constraint"})


def _base_name(node: cst.BaseExpression) -> str | None:
  while isinstance(node, cst.Attribute):
    node = node.value
  return node.value if isinstance(node, cst.Name) else None


class _Collector(cst.CSTVisitor):
  """Imports, uses of imported names, calls, `with` items, `name = f(...)`."""
  METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

  def __init__(self, symbols) -> None:
    super().__init__()
    self.symbols = symbols
    self.imports: list[cst.Import | cst.ImportFrom] = []
    self.uses: list[cst.Name | cst.Attribute] = []
    self.calls: list[cst.Call] = []
    self.with_items: list[cst.WithItem] = []
    self.assigned_calls: list[tuple[str, cst.Call]] = []

  def visit_Import(self, node: cst.Import) -> bool:
    self.imports.append(node)
    return False

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    self.imports.append(node)
    return False

  def _use(self, node: cst.Name | cst.Attribute) -> bool:
    if self.symbols(node):
      self.uses.append(node)
      return False  # the inner parts of the chain are prefixes of this one
    return True

  def visit_Attribute(self, node: cst.Attribute) -> bool:
    return self._use(node)

  def visit_Name(self, node: cst.Name) -> bool:
    return self._use(node)

  def visit_Call(self, node: cst.Call) -> None:
    self.calls.append(node)

  def visit_WithItem(self, node: cst.WithItem) -> None:
    self.with_items.append(node)

  def visit_Assign(self, node: cst.Assign) -> None:
    if isinstance(node.value, cst.Call):
      for target in node.targets:
        if isinstance(target.target, cst.Name):
          self.assigned_calls.append((target.target.value, node.value))


class _Judge:
  """Turns what the collector saw into notes, knowing the import plans."""

  def __init__(self, qnames: Mapping, redirects: dict[str, tuple[str, str]]) -> None:
    self.qnames = qnames
    self.redirects = redirects
    self.notes: list[Note] = []
    self._code = cst.Module([]).code_for_node

  def symbols(self, node: cst.CSTNode) -> list[str]:
    """The imported names `node` reaches, as `a.b.c` (JAX's and this package's)."""
    names = self.qnames.get(node, ())
    names = names() if callable(names) else names  # libcst resolves them lazily
    return sorted(n.name for n in names
                  if n.source is QualifiedNameSource.IMPORT and n.name.split(".")[0] in _ROOTS)

  def shown(self, node: cst.CSTNode) -> str:
    """`node` as written, on one line; an expression longer than 60 characters is
    cut (a dotted name never is)."""
    text = " ".join(self._code(node).split())
    if len(text) <= 60 or isinstance(node, cst.Name | cst.Attribute):
      return text
    return text[:57] + "..."

  def effective(self, symbol: str, base: str | None) -> tuple[str, bool]:
    """The symbol as the code reaches it after `--write`, and whether it moved."""
    if base in self.redirects:
      old, new = self.redirects[base]
      if symbol == old or symbol.startswith(old + "."):
        return new + symbol[len(old):], True
    return symbol, False

  def effective_symbols(self, node: cst.BaseExpression) -> list[str]:
    base = _base_name(node)
    return [self.effective(s, base)[0] for s in self.symbols(node)]

  def add(self, node: cst.CSTNode, code: str, message: str) -> None:
    self.notes.append(Note(node, code, message))

  def judge_use(self, node: cst.Name | cst.Attribute) -> None:
    base = _base_name(node)
    for symbol in self.symbols(node):
      target, moved = self.effective(symbol, base)
      if target.split(".")[0] == _rules.PKG:
        self._package_use(node, target)
      elif not moved:
        self._removed_use(node, target)
      obj, _, option = target.rpartition(".")
      if obj in _reports.CONFIG_OBJECTS:
        self._option(node, option, "read")

  def _package_use(self, node: cst.CSTNode, symbol: str) -> None:
    """A use of this package: a name it does not have."""
    parts = symbol.split(".")
    if len(parts) >= 3 and ".".join(parts[:2]) in _rules.package_modules():
      module, name = ".".join(parts[:2]), parts[2]
    elif len(parts) >= 2:
      module, name = _rules.PKG, parts[1]
    else:
      return
    if name not in _names.provided(module):
      self.add(node, "JSE307", _reports.JSE307_MISSING.format(
          shown=self.shown(node), module=module, name=name))

  def _removed_use(self, node: cst.CSTNode, symbol: str) -> None:
    """A GDA-era or removed name where no import rewrite reaches: the longest
    match wins, a report over a fix of the same length."""
    parts = symbol.split(".")
    found = _reports.report_for(symbol)
    report_len = len(found[0].removesuffix(".*").split(".")) if found else 0
    for n in range(len(parts), report_len, -1):
      fix = _rules.fix_for(".".join(parts[:n]))
      if fix is not None and fix.gone and _rules.replaced_module(".".join(parts[:n])) is None:
        name = parts[n - 1]
        self.add(node, "JSE306", _reports.JSE306.format(
            shown=self.shown(node), why=fix.why, name=name,
            import_=_imports.import_text(fix.targets[0], name, None)))
        return
    if found is not None:
      self.add(node, found[1].code, _reports.render(found[0], found[1], self.shown(node)))

  def _option(self, node: cst.CSTNode, option: str, how: str) -> None:
    """A config option this package defines, or one JAX removed, read or set."""
    if option in _reports.OPTIONS:
      code, template = ("JSE202", _reports.JSE202) if how == "update" else (
          "JSE201", _reports.JSE201)
      self.add(node, code, template.format(
          shown=self.shown(node), option=option, why=_reports.OPTIONS[option]))
    elif option in _reports.REMOVED_OPTIONS:
      code, template = _reports.REMOVED_OPTIONS[option]
      self.add(node, code, template.format(shown=self.shown(node)))

  def judge_call(self, call: cst.Call) -> None:
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    first = positional[0].value if positional else None
    option = first.evaluated_value if isinstance(first, cst.SimpleString) else None
    for func in self.effective_symbols(call.func):
      obj, _, method = func.rpartition(".")
      if obj in _reports.CONFIG_OBJECTS and method in ("update", "read") and option:
        self._option(call, option, method)
      if func in _WSC and "axis_resources" in keywords:
        self.add(call, "JSE310", _reports.JSE310.format(shown=self.shown(call.func)))

  def is_mesh_call(self, node: cst.BaseExpression) -> bool:
    """A call of a `Mesh` class (through any import), or of a `make_..._mesh` /
    `create_..._mesh` function (`jax.make_mesh`, a test's `create_global_mesh`)."""
    if not isinstance(node, cst.Call):
      return False
    func = node.func
    name = func.value if isinstance(func, cst.Name) else (
        func.attr.value if isinstance(func, cst.Attribute) else "")
    return bool(_MESH_FACTORY.match(name)) or any(
        s in _MESH_CLASSES for s in self.effective_symbols(func))

  def judge_with(self, item: cst.WithItem, mesh_names: set[str]) -> None:
    expr = item.item
    if isinstance(expr, cst.Name | cst.Attribute):
      last = expr.value if isinstance(expr, cst.Name) else expr.attr.value
      is_mesh = bool(_MESH_NAME.search(last)) or get_full_name_for_node(expr) in mesh_names
    else:
      is_mesh = self.is_mesh_call(expr)
    if is_mesh:
      self.add(expr, "JSE204", _reports.JSE204.format(shown=self.shown(expr)))


def analyze(wrapper: MetadataWrapper, path: str) -> tuple[list[Finding], dict[int, _imports.Plan]]:
  """The findings of one module, and the rewrite plans of its imports keyed by
  `id(statement)` (only those that change)."""
  qnames = wrapper.resolve(QualifiedNameProvider)
  judge = _Judge(qnames, {})
  collector = _Collector(judge.symbols)
  wrapper.visit(collector)
  plans = {id(node): (_imports.plan_import(node) if isinstance(node, cst.Import)
                      else _imports.plan_import_from(node)) for node in collector.imports}
  for plan in plans.values():
    judge.redirects.update(plan.redirects)
    judge.notes.extend(plan.notes)
  for use in collector.uses:
    judge.judge_use(use)
  for call in collector.calls:
    judge.judge_call(call)
  mesh_names = {name for name, call in collector.assigned_calls if judge.is_mesh_call(call)}
  for item in collector.with_items:
    judge.judge_with(item, mesh_names)
  positions = wrapper.resolve(PositionProvider)
  findings = set()
  for note in judge.notes:
    start = positions[note.node].start
    findings.add(Finding(path, start.line, start.column + 1, note.code, note.message))
  return sorted(findings), {k: v for k, v in plans.items() if v.groups}
