"""One pass over a module's `ast`: scopes, what imports bind, and what the rules read.

The walk is iterative (a stack, not recursion), so valid Python of any depth
is handled. Names follow Python's scoping: a name bound anywhere in a
function is local to it, class bodies are skipped by the functions inside
them, a comprehension has its own scope. An `except ImportError:` branch
whose `try` imports only what today's JAX (after `--write`) has is never run,
and is not looked at: `dead_try(node)` decides.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable

_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclasses.dataclass(eq=False)
class Binding:
  """A name bound in a scope: by an import (`qualified` is the dotted name it
  stands for, `alias` its `ast.alias`) or by anything else (`qualified` None)."""
  qualified: str | None
  alias: ast.alias | None = None
  stmt: ast.Import | ast.ImportFrom | None = None


@dataclasses.dataclass(eq=False)
class Scope:
  kind: str  # "module", "function" (also lambdas, comprehensions) or "class"
  parent: Scope | None
  names: dict[str, list[Binding]] = dataclasses.field(default_factory=dict)
  global_names: set[str] = dataclasses.field(default_factory=set)
  node: ast.AST | None = None  # the module, def, lambda, class or comprehension
  walrus: set[str] = dataclasses.field(default_factory=set)  # names `:=` binds here

  def bind(self, name: str, binding: Binding) -> None:
    self.names.setdefault(name, []).append(binding)

  def module(self) -> Scope:
    s = self
    while s.parent is not None:
      s = s.parent
    return s

  def lookup(self, name: str) -> list[Binding]:
    """The bindings `name` refers to here (empty: a builtin or unbound)."""
    s: Scope | None = self
    if self.kind != "module" and name in self.global_names:
      s = self.module()
    first = True
    while s is not None:
      if s.kind != "class" or first:
        if name in s.names:
          return s.names[name]
      first = False
      s = s.parent
    return []

  def in_function(self) -> bool:
    s: Scope | None = self
    while s is not None:
      if s.kind == "function":
        return True
      s = s.parent
    return False


@dataclasses.dataclass(eq=False)
class ImportStmt:
  node: ast.Import | ast.ImportFrom
  scope: Scope
  guarded: bool  # inside a `try` whose handlers catch ImportError


@dataclasses.dataclass(eq=False)
class Walk:
  """What one module contains, for the rules."""
  module: Scope
  imports: list[ImportStmt] = dataclasses.field(default_factory=list)
  uses: list[tuple[ast.expr, list[str], Scope]] = dataclasses.field(default_factory=list)
  calls: list[tuple[ast.Call, Scope]] = dataclasses.field(default_factory=list)
  withs: list[tuple[ast.withitem, Scope]] = dataclasses.field(default_factory=list)
  decorators: list[tuple[ast.expr, Scope]] = dataclasses.field(default_factory=list)
  attrs: list[tuple[ast.Attribute, Scope]] = dataclasses.field(default_factory=list)
  with_stmts: dict[int, ast.With | ast.AsyncWith] = dataclasses.field(default_factory=dict)
  annotated: set[int] = dataclasses.field(default_factory=set)  # ids inside annotations
  annotation_strings: list[str] = dataclasses.field(default_factory=list)  # `x: 'jnp.ndarray'`
  scopes: dict[int, Scope] = dataclasses.field(default_factory=dict)  # id(def) -> its scope
  defined: set[str] = dataclasses.field(default_factory=set)  # def names, stored attributes
  functions: set[str] = dataclasses.field(default_factory=set)  # names of `def`s
  bodies: list[list[ast.stmt]] = dataclasses.field(default_factory=list)
  imported: set[str] = dataclasses.field(default_factory=set)  # names an import binds (any scope)
  _by_name: dict[str, list] | None = dataclasses.field(default=None, repr=False)
  _holder: dict[int, list[ast.stmt]] | None = dataclasses.field(default=None, repr=False)

  def uses_of(self, name: str) -> list[tuple[ast.expr, list[str], Scope]]:
    """The uses whose chain starts at `name`, in order."""
    if self._by_name is None:
      self._by_name = {}
      for use in self.uses:
        self._by_name.setdefault(use[1][0], []).append(use)
    return self._by_name.get(name, [])

  def body_of(self, stmt: ast.stmt) -> list[ast.stmt]:
    """The statement list that holds `stmt`."""
    if self._holder is None:
      self._holder = {id(s): b for b in self.bodies for s in b}
    return self._holder[id(stmt)]


def chain(node: ast.expr) -> list[str] | None:
  """`a.b.c` as ["a", "b", "c"]; None when the chain does not start at a name."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  parts.append(node.id)
  return parts[::-1]


def handles_import_error(handler: ast.ExceptHandler) -> bool:
  kinds = handler.type
  names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
  return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


# Fields that never hold a node any rule looks at: a name's load / store
# context, an operator, and strings.
_LEAF_FIELDS = frozenset({"ctx", "op", "ops", "type_comment", "kind"})
_CONSTANT = ast.Constant  # a leaf no rule visits (an annotation's strings are read apart)
_BODY_FIELDS = ("body", "orelse", "finalbody")


_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(the fields of a node class that may hold child nodes, its statement-list fields)."""
  found = _FIELDS.get(cls)
  if found is None:
    fields = getattr(cls, "_fields", ())
    found = _FIELDS[cls] = (tuple(f for f in fields if f not in _LEAF_FIELDS),
                            tuple(f for f in _BODY_FIELDS if f in fields))
  return found


class _Walker:
  def __init__(self, dead_try: Callable[[ast.Try], bool], watched_attrs: frozenset[str]):
    self.dead_try = dead_try
    self.watched = watched_attrs
    self.walk = Walk(Scope("module", None))
    self.stack: list[tuple[ast.AST, Scope, bool]] = []

  def push(self, nodes, scope: Scope, guarded: bool = False) -> None:
    self.stack.extend((n, scope, guarded) for n in reversed(list(nodes)) if n is not None)

  def run(self, tree: ast.Module) -> Walk:
    self.walk.module.node = tree
    self.walk.bodies.append(tree.body)
    self.push(tree.body, self.walk.module)
    stack, visits = self.stack, _VISITS
    while stack:
      node, scope, guarded = stack.pop()
      visit = visits.get(node.__class__) or _visit_of(node.__class__)
      visit(self, node, scope, guarded)
    return self.walk

  def generic(self, node: ast.AST, scope: Scope, guarded: bool) -> None:
    """Every child node, in source order (what `ast.iter_child_nodes` gives, less
    the nodes of `_LEAF_FIELDS`, which no rule visits)."""
    fields, bodies = _FIELDS.get(node.__class__) or _fields(node.__class__)
    for name in bodies:
      body = getattr(node, name, None)
      if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
        self.walk.bodies.append(body)
    children: list[ast.AST] = []
    for name in fields:
      value = getattr(node, name, None)
      if value.__class__ is list:
        children += [c for c in value if isinstance(c, ast.AST) and c.__class__ is not _CONSTANT]
      elif isinstance(value, ast.AST) and value.__class__ is not _CONSTANT:
        children.append(value)
    if children:
      children.reverse()
      self.stack += [(c, scope, guarded) for c in children]

  # -- bindings ---------------------------------------------------------------

  def visit_Import(self, node: ast.Import, scope: Scope, guarded: bool) -> None:
    self.walk.imports.append(ImportStmt(node, scope, guarded))
    for a in node.names:
      if a.asname:
        scope.bind(a.asname, Binding(a.name, a, node))
        self.walk.imported.add(a.asname)
      else:
        top = a.name.partition(".")[0]
        scope.bind(top, Binding(top, a, node))
        self.walk.imported.add(top)

  def visit_ImportFrom(self, node: ast.ImportFrom, scope: Scope, guarded: bool) -> None:
    self.walk.imports.append(ImportStmt(node, scope, guarded))
    for a in node.names:
      if a.name == "*":
        continue
      qualified = None if node.level or not node.module else f"{node.module}.{a.name}"
      scope.bind(a.asname or a.name, Binding(qualified, a, node))
      self.walk.imported.add(a.asname or a.name)

  def visit_Global(self, node: ast.Global, scope: Scope, guarded: bool) -> None:
    scope.global_names.update(node.names)

  def _function(self, node, scope: Scope, guarded: bool) -> None:
    args = node.args
    inner = Scope("function", scope, node=node)
    self.walk.scopes[id(node)] = inner
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
      if a is not None:
        inner.bind(a.arg, Binding(None))
    outer = [*args.defaults, *args.kw_defaults]
    if not isinstance(node, ast.Lambda):
      scope.bind(node.name, Binding(None))
      self.walk.defined.add(node.name)
      self.walk.functions.add(node.name)
      self.walk.decorators.extend((d, scope) for d in node.decorator_list)
      outer += [*node.decorator_list, node.returns]
      annotations = [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                            args.vararg, args.kwarg] if a is not None]
      self._annotations([*annotations, node.returns])
      outer += annotations
      self.walk.bodies.append(node.body)
      self.push(node.body, inner, False)
    else:
      self.push([node.body], inner, False)
    self.push(outer, scope, guarded)

  visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

  def visit_ClassDef(self, node: ast.ClassDef, scope: Scope, guarded: bool) -> None:
    scope.bind(node.name, Binding(None))
    inner = Scope("class", scope, node=node)
    self.walk.scopes[id(node)] = inner
    self.walk.decorators.extend((d, scope) for d in node.decorator_list)
    self.walk.bodies.append(node.body)
    self.push(node.body, inner, False)
    self.push([*node.decorator_list, *node.bases, *node.keywords], scope, guarded)

  def _comprehension(self, node, scope: Scope, guarded: bool) -> None:
    inner = Scope("function", scope, node=node)
    gens = node.generators
    parts: list[ast.AST] = [gens[0].target, *gens[0].ifs]
    for g in gens[1:]:
      parts += [g.iter, g.target, *g.ifs]
    parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    self.push(parts, inner, guarded)
    self.push([gens[0].iter], scope, guarded)

  visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

  def visit_ExceptHandler(self, node: ast.ExceptHandler, scope: Scope, guarded: bool) -> None:
    if node.name:
      scope.bind(node.name, Binding(None))
    self.generic(node, scope, guarded)

  def visit_Try(self, node: ast.Try, scope: Scope, guarded: bool) -> None:
    catches = any(handles_import_error(h) for h in node.handlers)
    dead = catches and self.dead_try(node)
    live = [h for h in node.handlers if not (dead and handles_import_error(h))]
    self.walk.bodies += [b for b in (node.body, node.orelse, node.finalbody) if b]
    self.push([*node.finalbody], scope, guarded)
    self.push([*node.orelse], scope, guarded)
    self.push(live, scope, guarded)
    self.push(node.body, scope, guarded or catches)

  visit_TryStar = visit_Try

  def _match_name(self, node, scope: Scope, guarded: bool) -> None:
    for name in (getattr(node, "name", None), getattr(node, "rest", None)):
      if name:
        scope.bind(name, Binding(None))
    self.generic(node, scope, guarded)

  visit_MatchAs = visit_MatchStar = visit_MatchMapping = _match_name

  def _annotations(self, nodes) -> None:
    for annotation in nodes:
      if annotation is not None:
        for n in ast.walk(annotation):
          self.walk.annotated.add(id(n))
          if isinstance(n, ast.Constant) and isinstance(n.value, str):
            self.walk.annotation_strings.append(n.value)

  def visit_AnnAssign(self, node: ast.AnnAssign, scope: Scope, guarded: bool) -> None:
    self._annotations([node.annotation])
    self.generic(node, scope, guarded)

  # -- uses ----------------------------------------------------------------------

  def visit_NamedExpr(self, node: ast.NamedExpr, scope: Scope, guarded: bool) -> None:
    owner = scope  # in a comprehension `:=` binds in the scope around it
    while owner.parent is not None and isinstance(owner.node, _COMPREHENSIONS):
      owner = owner.parent
    owner.walrus.add(node.target.id)
    self.generic(node, scope, guarded)

  def visit_Name(self, node: ast.Name, scope: Scope, guarded: bool) -> None:
    if isinstance(node.ctx, ast.Load):
      self.walk.uses.append((node, [node.id], scope))
    else:
      scope.bind(node.id, Binding(None))

  def visit_Attribute(self, node: ast.Attribute, scope: Scope, guarded: bool) -> None:
    if not isinstance(node.ctx, ast.Load):
      self.walk.defined.add(node.attr)
      self.push([node.value], scope, guarded)
      return
    parts = []
    inner: ast.expr = node
    while inner.__class__ is ast.Attribute:
      attr = inner.attr
      if attr in self.watched:
        self.walk.attrs.append((inner, scope))
      parts.append(attr)
      inner = inner.value
    if inner.__class__ is ast.Name:
      parts.append(inner.id)
      parts.reverse()
      self.walk.uses.append((node, parts, scope))
    elif inner.__class__ is not _CONSTANT:
      self.stack.append((inner, scope, guarded))

  def visit_Call(self, node: ast.Call, scope: Scope, guarded: bool) -> None:
    self.walk.calls.append((node, scope))
    self.generic(node, scope, guarded)

  def visit_With(self, node: ast.With | ast.AsyncWith, scope: Scope, guarded: bool) -> None:
    for item in node.items:
      self.walk.with_stmts[id(item)] = node
    self.generic(node, scope, guarded)

  visit_AsyncWith = visit_With

  def visit_withitem(self, node: ast.withitem, scope: Scope, guarded: bool) -> None:
    self.walk.withs.append((node, scope))
    self.generic(node, scope, guarded)


_VISITS: dict[type, Callable] = {}  # node class -> the `_Walker` method that visits it


def _visit_of(cls: type) -> Callable:
  visit = _VISITS[cls] = getattr(_Walker, "visit_" + cls.__name__, _Walker.generic)
  return visit


def walk(tree: ast.Module, dead_try: Callable[[ast.Try], bool],
         watched_attrs: frozenset[str]) -> Walk:
  """Scopes, imports, uses of names (outermost attribute chains), calls, `with`
  items and statements, decorators, annotations and the attributes named in
  `watched_attrs`."""
  return _Walker(dead_try, watched_attrs).run(tree)
