"""What a value can be: a `Mesh`, a jitted function, the output of one, ... (`ast`).

`Kinds(ctx).of(expr, scope)` is the set of kinds every value that can reach
`expr` has, following the code: a name's assignments that reach it through
branches and loops (`_flow`; `x is not None` tests narrow), a function's
parameters by their annotation (`Optional[...]` too), `with v as name`, the
`return`s of the project's own functions (in this file or, through its
imports, in another file of the project: `_project`), `self.x` by every
assignment of an attribute `x` in the file and the class's properties (when
the class itself defines or assigns `x`), conditional expressions, tuple
unpacking, subscripts of a jit's output. Calls of JAX's and this package's
callables are known by the object they are in the installed JAX (the `Mesh`
class, `jax.jit`, legacy and stock `pjit`, `jax.pmap`, `jax.device_put`, a
JAX function annotated to return a `Mesh`, `functools.partial` of any of
them); a call of Python's standard library gives no `Mesh`; one of another
library is `LIBRARY_OUT`. A call that nothing says anything of, of a function
named like a mesh maker (`get_mesh()`, `createDeviceMesh()`), is
`Outside(name)`: it may give a `Mesh`. Anything else is `UNKNOWN`: a rule
that needs every value to be a `Mesh` then makes no change.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import sys
import weakref
from typing import Any

from jax_sharding_ext.port import _blocks, _flow, _jaxnames, _moves, _rules, _scope

MESH = "Mesh"
JIT = "jax.jit"             # a callable that makes a jitted function (`jax.jit`, `pjit`)
JITTED = "jitted function"
JIT_OUT = "jit output"      # a `jax.Array` (a GDA with the output flag on), or a pytree of them
PMAP = "jax.pmap"
PMAPPED = "pmapped function"
ARRAY = "array"             # a `jax.Array` whatever the output flag says
ARRAY_MAKER = "jax.device_put"
MESH_MAKER = "Mesh class"
PARTIAL = "functools.partial"
LIBRARY = "another library's callable"
LIBRARY_OUT = "what another library's callable returned"
STDLIB = "a callable of Python's standard library"  # it makes no `Mesh`
NONE = "None"
OTHER = "other"
UNKNOWN = "unknown"
UNKNOWNS = frozenset({UNKNOWN, LIBRARY_OUT})  # values nothing in the run says anything of

_CALLED = {MESH_MAKER: MESH, JIT: JITTED, PMAP: PMAPPED, JITTED: JIT_OUT, PMAPPED: ARRAY,
           ARRAY_MAKER: ARRAY, LIBRARY: LIBRARY_OUT, STDLIB: OTHER}
_LEAVES = frozenset({JIT_OUT, ARRAY})  # kinds whose parts (subscripts, unpacked) are the same
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


@dataclasses.dataclass(frozen=True)
class Outside:
  """What a function named like a mesh maker returned (`get_mesh()`) where the
  files of the run do not say what that is: it may be a `Mesh`."""
  name: str


def _names_a_mesh(name: str) -> bool:
  """`get_mesh`, `createDeviceMesh`, `Mesh`: one of its words is "mesh"."""
  return any(w.lower() == "mesh" for w in _WORDS.findall(name))


@dataclasses.dataclass(frozen=True, eq=False)
class Fn:
  """A function of the project: calling it gives what its `return`s give."""
  ctx: Any
  node: ast.FunctionDef | ast.AsyncFunctionDef


@functools.cache
def _mesh_class() -> Any:
  return _jaxnames.value("jax.sharding.Mesh")


def _resolve(symbol: str) -> Any:
  """The object a dotted name of JAX (where JAX moved it) or this package is, or None."""
  root = symbol.partition(".")[0]
  if root == _rules.PKG:
    obj: Any = sys.modules.get(_rules.PKG)
    for part in symbol.split(".")[1:]:
      obj = getattr(obj, part, None)
    return obj
  if root in _jaxnames.ROOTS:
    moved = _moves.home(symbol) if not _jaxnames.has(symbol) else None
    return _jaxnames.value(moved[1] + symbol[len(moved[0]):] if moved else symbol)
  return None


@functools.cache
def is_mesh_class(symbol: str) -> bool:
  return _resolve(symbol) is _mesh_class() is not None


@functools.cache
def symbol_kind(symbol: str) -> str:
  """The kind of the callable a dotted name is in the installed JAX (or this package)."""
  if symbol == "functools.partial":
    return PARTIAL
  obj = _resolve(symbol)
  if obj is None:
    return UNKNOWN
  if obj is _mesh_class():
    return MESH_MAKER
  for kind, names in ((JIT, ("jax.jit", "jax.experimental.pjit.pjit")), (PMAP, ("jax.pmap",)),
                      (ARRAY_MAKER, ("jax.device_put",))):
    if any(obj is _jaxnames.value(n) for n in names):
      return kind
  if obj is getattr(sys.modules.get(_rules.PKG), "pjit", None):
    return JIT
  return MESH_MAKER if _returns_mesh(obj) else UNKNOWN


def _returns_mesh(obj: Any) -> bool:
  """A JAX callable annotated to return a `Mesh`."""
  if not callable(obj) or isinstance(obj, type):
    return False
  try:
    annotation = inspect.signature(obj).return_annotation
  except (TypeError, ValueError):
    return False
  if isinstance(annotation, str):
    return annotation.rpartition(".")[2] == "Mesh"
  return annotation is _mesh_class()


class Kinds:
  def __init__(self, ctx: Any) -> None:
    # A proxy: the context holds its `Kinds`, and a cycle would keep a whole
    # module's tree alive until Python's cycle collector runs.
    self.ctx = weakref.proxy(ctx)
    self.busy: set[Any] = set()
    self._attrs: dict[str, list[tuple[ast.expr, _scope.Scope, ast.stmt]]] | None = None

  # -- expressions --------------------------------------------------------------

  def of(self, node: ast.expr, scope: _scope.Scope) -> frozenset:
    key = id(node)
    if key in self.busy:  # a value defined by itself (`x = f(x)`): nothing known
      return frozenset({UNKNOWN})
    self.busy.add(key)
    try:
      return self._of(node, scope)
    finally:
      self.busy.discard(key)

  def _of(self, node: ast.expr, scope: _scope.Scope) -> frozenset:
    if isinstance(node, ast.Name):
      return self.name(node.id, scope, node)
    if isinstance(node, ast.Call):
      return self.call(node, scope)
    if isinstance(node, ast.IfExp):
      return self.of(node.body, scope) | self.of(node.orelse, scope)
    if isinstance(node, ast.NamedExpr):
      return self.of(node.value, scope)
    if isinstance(node, ast.Subscript):
      inner = self.of(node.value, scope)
      return inner if inner <= _LEAVES else frozenset({UNKNOWN})
    if isinstance(node, ast.Constant):
      return frozenset({NONE if node.value is None else OTHER})
    if isinstance(node, ast.Attribute):
      return self.attribute(node, scope)
    return frozenset({UNKNOWN})

  def callee(self, func: ast.expr, scope: _scope.Scope) -> frozenset:
    """The kinds of what a call calls (imported names by what they are)."""
    parts = _scope.chain(func)
    if parts is None or not any(b.stmt is not None for b in scope.lookup(parts[0])):
      return self.of(func, scope)
    symbols = self.ctx.symbols(func, scope)
    known = frozenset(symbol_kind(s) for s in symbols) - {UNKNOWN}
    if known:
      return known
    found = self._project_def(parts, scope)
    if found == {UNKNOWN} and symbols and all(
        s.partition(".")[0] not in (*_jaxnames.ROOTS, _rules.PKG) for s in symbols):
      standard = all(s.partition(".")[0] in sys.stdlib_module_names for s in symbols)
      return frozenset({STDLIB if standard else LIBRARY})
    return found

  def call(self, node: ast.Call, scope: _scope.Scope) -> frozenset:
    out: set = set()
    callees = self.callee(node.func, scope)
    for kind in callees:
      if kind == PARTIAL:  # `partial(f, ...)` calls as `f` does
        out |= self.callee(node.args[0], scope) if node.args else {UNKNOWN}
      elif isinstance(kind, Fn):
        out |= kinds_of(kind.ctx).returns(kind.node)
      else:
        out.add(_CALLED.get(kind, UNKNOWN))
    parts = _scope.chain(node.func)
    if (out and out <= {UNKNOWN, LIBRARY_OUT} and OTHER not in callees  # not a class's
        and parts and _names_a_mesh(parts[-1])
        and not any(s.partition(".")[0] in (*_jaxnames.ROOTS, _rules.PKG)
                    for s in self.ctx.symbols(node.func, scope))):
      return frozenset({Outside(".".join(parts))})
    return frozenset(out)

  def attribute(self, node: ast.Attribute, scope: _scope.Scope) -> frozenset:
    """`self.x` in a method: by the class's own definitions of `x`."""
    owner = _method_class(scope)
    if (owner is None or not isinstance(node.value, ast.Name)
        or node.value.id != _first_param(scope.node)):
      return frozenset({UNKNOWN})
    cls_scope, cls = owner
    out: set = set()
    own = False  # the class itself defines or assigns it (else a base class may)
    for s in cls.body:
      if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == node.attr:
        decorators = {d.id for d in s.decorator_list if isinstance(d, ast.Name)}
        out |= self.returns(s) if "property" in decorators else {Fn(self.ctx, s)}
        own = True
      elif isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.attr
                                             for t in s.targets):
        out |= self.of(s.value, cls_scope)
        own = True
    for value, where, _stmt in self._attribute_values().get(node.attr, []):
      out |= self.of(value, where)
      own = own or where.parent is cls_scope
    return frozenset(out) if own and out else frozenset({UNKNOWN})

  def _attribute_values(self) -> dict[str, list[tuple[ast.expr, _scope.Scope, ast.stmt]]]:
    """Every `<anything>.x = value` of the file, by `x` (with its scope)."""
    if self._attrs is None:
      self._attrs = {}
      scopes = [self.ctx.walk.module, *self.ctx.walk.scopes.values()]
      for scope in scopes:
        body = _blocks.body_of(scope)
        for s in (n for n in _blocks.own(ast.Module(body=body or [], type_ignores=[]))
                  if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None):
          targets = s.targets if isinstance(s, ast.Assign) else [s.target]
          for t in targets:
            if isinstance(t, ast.Attribute):
              self._attrs.setdefault(t.attr, []).append((s.value, scope, s))  # type: ignore[arg-type]
            elif isinstance(t, ast.Tuple | ast.List) and any(
                isinstance(e, ast.Attribute) for e in t.elts):
              for e in t.elts:
                if isinstance(e, ast.Attribute):
                  unknown = ast.Name(id="<unpacked>", ctx=ast.Load())
                  self._attrs.setdefault(e.attr, []).append((unknown, scope, s))
    return self._attrs

  # -- names --------------------------------------------------------------------

  def name(self, name: str, scope: _scope.Scope, at: ast.AST) -> frozenset:
    if name == "<unpacked>":
      return frozenset({UNKNOWN})
    owner = scope
    if scope.kind != "module" and name in scope.global_names:
      owner = scope.module()
    elif name not in scope.names:
      binder = _binder(scope, name)
      if binder is None:
        return frozenset({UNKNOWN})  # a builtin, or a star import's
      return self._defs(self._everywhere(binder, name), binder)
    body = _blocks.body_of(owner)
    stmt = _blocks.enclosing(body, at) if body is not None and owner is scope else None
    if body is None:
      return frozenset({UNKNOWN})
    if stmt is None:
      return self._defs(self._everywhere(owner, name), owner)
    entry = self._entry(owner, name)
    defs = _flow.reaching(body, name, stmt, entry, owner.walrus)
    if defs is None:
      defs = self._everywhere(owner, name)
    elif owner.kind == "module":
      defs |= self._global_writes(name)
    kinds = self._defs(defs, owner)
    if NONE in kinds and self._not_none(body, name, stmt, entry, owner, defs):
      kinds = (kinds - {NONE}) or frozenset({UNKNOWN})
    return kinds

  def _not_none(self, body: list[ast.stmt], name: str, stmt: ast.stmt, entry: frozenset,
                scope: _scope.Scope, defs: frozenset) -> bool:
    """`name` is not None at `stmt`: it runs in the body of an `if` that tested
    `name is not None` (or after an `if name is None:` that never falls
    through), and no binding of `name` came in between."""
    for block, i in _blocks.path_to(body, stmt) or []:
      guard = block[i]
      if (isinstance(guard, ast.If) and _blocks.tests_not_none(guard.test, name)
          and any(s is stmt or _blocks.contains(s, stmt) for s in guard.body)):
        if _flow.reaching(body, name, guard, entry, scope.walrus) == defs:
          return True
      for before in block[:i]:
        if (isinstance(before, ast.If) and not before.orelse and _blocks.terminates(before.body)
            and _blocks.tests_is_none(before.test, name)
            and _flow.reaching(body, name, before, entry, scope.walrus) == defs):
          return True
    return False

  def _entry(self, scope: _scope.Scope, name: str) -> frozenset:
    node = scope.node
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
      a = node.args
      for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
        if arg is not None and arg.arg == name:
          return frozenset({_flow.Def("param", arg)})
    return frozenset({_flow.UNBOUND})

  def _everywhere(self, scope: _scope.Scope, name: str) -> frozenset:
    body = _blocks.body_of(scope)
    if body is None:
      return frozenset({_flow.Def("other")})
    defs = _flow.bindings(body, name, scope.walrus) | (self._entry(scope, name) - {_flow.UNBOUND})
    if scope.kind == "module":
      defs |= self._global_writes(name)
    return defs

  def _global_writes(self, name: str) -> frozenset:
    out: set = set()
    for scope in self.ctx.walk.scopes.values():
      body = _blocks.body_of(scope)
      if name in scope.global_names and body is not None:
        out |= _flow.bindings(body, name, scope.walrus)
    return frozenset(out)

  def _defs(self, defs: frozenset, scope: _scope.Scope) -> frozenset:
    out: set = set()
    for d in defs:
      out |= self._def(d, scope)
    return frozenset(out) or frozenset({UNKNOWN})

  def _def(self, d: _flow.Def, scope: _scope.Scope) -> frozenset:
    if d.kind == "unbound":
      return frozenset() if scope.kind == "function" else frozenset({UNKNOWN})
    if d.kind in ("value", "enter") and d.value is not None:
      value: ast.expr = d.value
      for i in d.path:  # unpacking a tuple written out: its element
        if isinstance(value, ast.Tuple | ast.List) and i is not None and i < len(value.elts):
          value = value.elts[i]
        else:
          inner = self.of(value, scope)
          return inner if inner <= _LEAVES else frozenset({UNKNOWN})
      found = self.of(value, scope)
      if d.kind == "enter":  # `Mesh.__enter__` returns the mesh itself
        return frozenset(k if k == MESH else UNKNOWN for k in found)
      return found
    if d.kind == "param":
      return self.annotation(getattr(d.node, "annotation", None), scope.parent or scope)
    if d.kind == "function":
      return self._function(d.node, scope)  # type: ignore[arg-type]
    if d.kind == "import":
      alias = d.node
      stmt = next((i.node for i in self.ctx.walk.imports if alias in i.node.names), None)
      if isinstance(stmt, ast.ImportFrom) and isinstance(alias, ast.alias):
        return self._lookup(stmt.module or "", stmt.level, alias.name)
      return frozenset({UNKNOWN})
    return frozenset({OTHER if d.kind == "class" else UNKNOWN})

  def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef,
                scope: _scope.Scope) -> frozenset:
    kinds: frozenset = frozenset({Fn(self.ctx, node)})
    for deco in reversed(node.decorator_list):  # applied bottom up
      # `@jax.jit`, or a call that makes the decorator (`@partial(jax.jit, ...)`).
      wrapper = self.of(deco, scope) if isinstance(deco, ast.Call) else self.callee(deco, scope)
      if wrapper and wrapper <= {JIT, PMAP}:
        kinds = frozenset(_CALLED[k] for k in wrapper)
      else:
        kinds = frozenset({UNKNOWN})
    return kinds

  def annotation(self, node: ast.expr | None, scope: _scope.Scope) -> frozenset:
    """`Mesh` (through any import), `Optional[...]` / `... | None` of what it holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      try:
        node = ast.parse(node.value, mode="eval").body
      except SyntaxError:
        return frozenset({UNKNOWN})
    if node is None:
      return frozenset({UNKNOWN})
    if isinstance(node, ast.Constant) and node.value is None:
      return frozenset({NONE})
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
      return self.annotation(node.left, scope) | self.annotation(node.right, scope)
    if isinstance(node, ast.Subscript):
      generic = {s.rpartition(".")[2] for s in self.ctx.symbols(node.value, scope)}
      inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
      if "Optional" in generic and len(inner) == 1:
        return self.annotation(inner[0], scope) | {NONE}
      if "Union" in generic:
        return frozenset().union(*(self.annotation(e, scope) for e in inner))
    if any(is_mesh_class(s) for s in self.ctx.symbols(node, scope)):
      return frozenset({MESH})
    return frozenset({UNKNOWN})

  # -- functions ------------------------------------------------------------------

  def returns(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset:
    """What calling the function gives: its return annotation when it names a
    `Mesh`, else what every `return` gives (and None when it may fall off its end)."""
    scope = self.ctx.walk.scopes.get(id(node))
    key = (id(self.ctx), id(node))
    project = getattr(self.ctx, "project", None)
    busy = project.visiting if project is not None else self.busy
    if scope is None or key in busy:
      return frozenset({UNKNOWN})
    if self.annotation(node.returns, scope.parent or scope) == {MESH}:
      return frozenset({MESH})
    busy.add(key)
    try:
      out: set = set()
      for n in _blocks.own(node):
        if isinstance(n, ast.Yield | ast.YieldFrom | ast.Await):
          return frozenset({OTHER})
        if isinstance(n, ast.Return):
          out |= self.of(n.value, scope) if n.value is not None else {NONE}
      if not _blocks.terminates(node.body):
        out.add(NONE)
      return frozenset(out)
    finally:
      busy.discard(key)

  def _project_def(self, parts: list[str], scope: _scope.Scope) -> frozenset:
    """A function of another file of the project, reached through an import."""
    out: set = set()
    for b in scope.lookup(parts[0]):
      stmt, alias = b.stmt, b.alias
      if isinstance(stmt, ast.ImportFrom) and alias is not None and len(parts) == 1:
        out |= self._lookup(stmt.module or "", stmt.level, alias.name)  # `from m import f`
      elif isinstance(stmt, ast.ImportFrom) and alias is not None:  # `from p import m`; `m.f`
        module = ".".join(p for p in (stmt.module, alias.name, *parts[1:-1]) if p)
        out |= self._lookup(module, stmt.level, parts[-1])
      elif isinstance(stmt, ast.Import) and alias is not None and len(parts) > 1:
        base = alias.name if alias.asname else ".".join(parts[:-1])
        if alias.asname:
          base = ".".join([base, *parts[1:-1]])
        out |= self._lookup(base, 0, parts[-1])
      else:
        out.add(UNKNOWN)
    return frozenset(out) or frozenset({UNKNOWN})

  def _lookup(self, module: str, level: int, name: str) -> frozenset:
    """The kinds of the top-level function `name` of the project's `module`."""
    project = getattr(self.ctx, "project", None)
    path = project.resolve(self.ctx.path, module, level) if project is not None else None
    other = project.context(path) if project is not None and path is not None else None
    if other is None:
      return frozenset({UNKNOWN})
    for s in reversed(other.tree.body):
      if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == name:
        return kinds_of(other)._function(s, other.walk.module)
    return frozenset({UNKNOWN})


def _binder(scope: _scope.Scope, name: str) -> _scope.Scope | None:
  """The enclosing scope whose binding of `name` a nested scope reads."""
  s = scope.parent
  while s is not None:
    if s.kind != "class" and name in s.names:
      return s
    s = s.parent
  return None


def _method_class(scope: _scope.Scope) -> tuple[_scope.Scope, ast.ClassDef] | None:
  parent = scope.parent
  if scope.kind == "function" and parent is not None and isinstance(parent.node, ast.ClassDef):
    return parent, parent.node
  return None


def _first_param(node: ast.AST | None) -> str | None:
  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
    params = [*node.args.posonlyargs, *node.args.args]
    return params[0].arg if params else None
  return None


def kinds_of(ctx: Any) -> Kinds:
  """The one `Kinds` of a context."""
  found = getattr(ctx, "_kinds", None)
  if found is None:
    found = ctx._kinds = Kinds(ctx)
  return found
