"""Which bindings of a name reach a statement: reaching definitions over one scope's body.

`reaching(body, name, target)` follows Python's control flow through one
function's (or the module's, or a class body's) statements: both branches
of an `if`, a loop's body run again or not at all, `break` / `continue`, a
`try` whose handlers may start after any statement of its body, `return` /
`raise` ending a path. Nested functions and classes are their own scopes and
are not entered. It returns every binding of `name` that can reach `target`
(`UNBOUND` standing for "not bound on this path"), or None when `target` is
not a statement of that body.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, eq=False)
class Def:
  """One binding of a name. `kind`: "value" (an assignment of `value`; `path`
  are the positions inside a tuple-unpacking target, None for a starred one),
  "enter" (`with value as name`), "param", "import", "function", "class",
  "other" (a `for` target, augmented assignment, `except ... as`, a `match`
  capture, ...), "unbound"."""
  kind: str
  node: ast.AST | None = None
  value: ast.expr | None = None
  path: tuple[int | None, ...] = ()


UNBOUND = Def("unbound")

_State = frozenset[Def] | None  # None: no path reaches here
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _union(*states: _State) -> _State:
  real = [s for s in states if s is not None]
  if not real:
    return None
  return frozenset().union(*real)


def walrus_names(body: list[ast.stmt]) -> frozenset[str]:
  """The names an assignment expression (`:=`) binds in this scope's body."""
  names: set[str] = set()
  stack: list[ast.AST] = list(body)
  while stack:
    node = stack.pop()
    if isinstance(node, ast.NamedExpr):
      names.add(node.target.id)
    if not isinstance(node, _SCOPES):
      stack.extend(ast.iter_child_nodes(node))
  return frozenset(names)


class _Run:
  def __init__(self, name: str, target: ast.stmt, walrus: bool) -> None:
    self.name = name
    self.target = target
    self.walrus = walrus
    self.found: _State = None
    self.seen_target = False
    self.loops: list[list[_State]] = []  # per loop: [breaks, continues]
    self.every: set[Def] | None = None  # with `bindings`: every binding made
    self._made: dict[tuple, Def] = {}

  def make(self, kind: str, node: ast.AST, value: ast.expr | None = None,
           path: tuple[int | None, ...] = ()) -> frozenset[Def]:
    """The one binding of `node` (a loop's second pass makes the same one)."""
    key = (kind, id(node), path)
    if key not in self._made:
      self._made[key] = Def(kind, node, value, path)
    return frozenset({self._made[key]})

  # -- bindings -----------------------------------------------------------------

  def bind(self, target: ast.expr, state: _State, make) -> _State:
    """`state` after assigning to `target`; `make(path)` makes the binding."""
    found = _target_path(target, self.name)
    if state is None or found is None:
      return state
    return make(found)

  def exprs(self, state: _State, *exprs: Any) -> _State:
    """`state` after evaluating `exprs` (only `:=` binds in an expression)."""
    if not self.walrus or state is None:
      return state
    for expr in exprs:
      for node in _walk_exprs(expr):
        if isinstance(node, ast.NamedExpr) and node.target.id == self.name:
          state = self.make("value", node, node.value)
    return state

  # -- statements ---------------------------------------------------------------

  def block(self, stmts: list[ast.stmt], state: _State, seen: list[_State] | None = None
            ) -> _State:
    for s in stmts:
      if s is self.target:
        self.seen_target = True
        self.found = _union(self.found, state)
      if seen is not None:
        seen.append(state)
      state = self.stmt(s, state)
      if self.every is not None and state:
        self.every.update(state)
    return state

  def stmt(self, s: ast.stmt, state: _State) -> _State:
    handler = getattr(self, "s_" + type(s).__name__, None)
    if handler is not None:
      return handler(s, state)
    return self.exprs(state, s)

  def s_Assign(self, s: ast.Assign, state: _State) -> _State:
    state = self.exprs(state, s.value)
    for t in s.targets:
      state = self.bind(t, state, lambda path: self.make("value", s, s.value, path))
    return state

  def s_AnnAssign(self, s: ast.AnnAssign, state: _State) -> _State:
    if s.value is None:
      return state
    state = self.exprs(state, s.value)
    return self.bind(s.target, state, lambda path: self.make("value", s, s.value, path))

  def s_AugAssign(self, s: ast.AugAssign, state: _State) -> _State:
    return self.bind(s.target, self.exprs(state, s.value), lambda path: self.make("other", s))

  def s_Delete(self, s: ast.Delete, state: _State) -> _State:
    if state is not None and any(isinstance(t, ast.Name) and t.id == self.name
                                 for t in s.targets):
      return frozenset()
    return state

  def _function(self, s: Any, state: _State) -> _State:
    state = self.exprs(state, *s.decorator_list)
    kind = "class" if isinstance(s, ast.ClassDef) else "function"
    if state is not None and s.name == self.name:
      return self.make(kind, s)
    return state

  s_FunctionDef = s_AsyncFunctionDef = s_ClassDef = _function

  def _import(self, s: ast.Import | ast.ImportFrom, state: _State) -> _State:
    for a in s.names:
      bound = a.asname or a.name.partition(".")[0]
      if state is not None and bound == self.name and a.name != "*":
        state = self.make("import", a)
    return state

  s_Import = s_ImportFrom = _import

  def s_Return(self, s: ast.Return | ast.Raise, state: _State) -> _State:
    self.exprs(state, *(getattr(s, f, None) for f in ("value", "exc", "cause")))
    return None

  s_Raise = s_Return

  def s_Break(self, s: ast.stmt, state: _State) -> _State:
    if self.loops:
      self.loops[-1][0] = _union(self.loops[-1][0], state)
    return None

  def s_Continue(self, s: ast.stmt, state: _State) -> _State:
    if self.loops:
      self.loops[-1][1] = _union(self.loops[-1][1], state)
    return None

  def s_If(self, s: ast.If, state: _State) -> _State:
    state = self.exprs(state, s.test)
    return _union(self.block(s.body, state), self.block(s.orelse, state))

  def _loop(self, s: Any, state: _State) -> _State:
    self.loops.append([None, None])
    head = state = self.exprs(state, getattr(s, "iter", None), getattr(s, "test", None))
    forever = isinstance(s, ast.While) and isinstance(s.test, ast.Constant) and bool(
        s.test.value)
    for _ in range(2):  # bindings only grow: the second pass sees the back edge
      entry = head
      if isinstance(s, ast.For | ast.AsyncFor):
        entry = self.bind(s.target, entry, lambda path: self.make("other", s))
      out = self.block(s.body, entry)
      head = _union(state, out, self.loops[-1][1])
      if isinstance(s, ast.While):
        head = self.exprs(head, s.test)
    breaks = self.loops.pop()[0]
    if forever:
      return breaks
    return _union(self.block(s.orelse, head), breaks)

  s_For = s_AsyncFor = s_While = _loop

  def _with(self, s: Any, state: _State) -> _State:
    for item in s.items:
      state = self.exprs(state, item.context_expr)
      if item.optional_vars is not None:
        state = self.bind(item.optional_vars, state,
                          lambda path, i=item: self.make("enter", s, i.context_expr, path))
    return self.block(s.body, state)

  s_With = s_AsyncWith = _with

  def _try(self, s: Any, state: _State) -> _State:
    seen: list[_State] = []
    out = self.block(s.body, state, seen)
    anywhere = _union(state, out, *seen)
    handled = []
    for h in s.handlers:
      entry = anywhere
      if h.name == self.name and entry is not None:
        entry = self.make("other", h)
      handled.append(self.block(h.body, entry))
    out = _union(self.block(s.orelse, out), *handled)
    if not s.finalbody:
      return out
    # The `finally` block also runs on the way out of an exception.
    self.block(s.finalbody, _union(out, anywhere))
    return self.block(s.finalbody, out)

  s_Try = s_TryStar = _try

  def s_Match(self, s: Any, state: _State) -> _State:
    state = self.exprs(state, s.subject)
    outs = [state]
    for case in s.cases:
      entry = state
      if entry is not None and any(self.name in (getattr(n, "name", None),
                                                 getattr(n, "rest", None))
                                   for n in ast.walk(case.pattern)):
        entry = self.make("other", case)
      outs.append(self.block(case.body, entry))
    return _union(*outs)


def _target_path(target: ast.expr, name: str,
                 path: tuple[int | None, ...] = ()) -> tuple[int | None, ...] | None:
  """The position of `name` inside an assignment target, or None."""
  if isinstance(target, ast.Name):
    return path if target.id == name else None
  if isinstance(target, ast.Starred):
    return _target_path(target.value, name, (*path[:-1], None) if path else (None,))
  if isinstance(target, ast.Tuple | ast.List):
    for i, elt in enumerate(target.elts):
      found = _target_path(elt, name, (*path, i))
      if found is not None:
        return found
  return None


def _walk_exprs(node: Any):
  if node is None:
    return
  stack = [node]
  while stack:
    n = stack.pop()
    yield n
    stack.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, _SCOPES))


def reaching(body: list[ast.stmt], name: str, target: ast.stmt,
             entry: frozenset[Def] = frozenset({UNBOUND}),
             walrus: frozenset[str] | set[str] | None = None) -> frozenset[Def] | None:
  """The bindings of `name` that reach `target` in `body`, which starts with
  `entry` bound; None when `target` is not among `body`'s statements. An
  empty set: `target` is never reached."""
  run = _Run(name, target, name in (walrus if walrus is not None else walrus_names(body)))
  run.block(body, entry)
  if not run.seen_target:
    return None
  return run.found or frozenset()


def bindings(body: list[ast.stmt], name: str, walrus: frozenset[str] | set[str] | None = None
             ) -> frozenset[Def]:
  """Every binding of `name` that runs somewhere in `body`'s scope (for a name
  read from a nested function, which may run at any time). `walrus`: the
  names `:=` binds in that scope, when known."""
  run = _Run(name, ast.Pass(), name in (walrus if walrus is not None else walrus_names(body)))
  run.every = set()
  run.block(body, frozenset())
  return frozenset(run.every)
