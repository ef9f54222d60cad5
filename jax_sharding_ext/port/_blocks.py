"""Where statements are: the statement holding a node, the blocks down to it, whether
a block always ends in `return` / `raise`, and tests that a name is (not) None.

Only the statements of one scope are looked at: nested functions and classes
are their own scopes and are not entered.
"""

from __future__ import annotations

import ast

from jax_sharding_ext.port import _scope

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _blocks(s: ast.stmt) -> list[list[ast.stmt]]:
  """The statement lists directly inside a compound statement."""
  out = [getattr(s, f, None) or [] for f in ("body", "orelse", "finalbody")]
  out += [h.body for h in getattr(s, "handlers", None) or []]
  out += [c.body for c in getattr(s, "cases", None) or []]
  return [b for b in out if b and isinstance(b[0], ast.stmt)]


def enclosing(stmts: list[ast.stmt], node: ast.AST) -> ast.stmt | None:
  """The innermost statement of `stmts` (and the blocks inside them, not
  nested scopes) that contains `node`."""
  pos = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
  for s in stmts:
    if (s.lineno, s.col_offset) <= pos <= (s.end_lineno, s.end_col_offset):
      if not isinstance(s, SCOPES):
        for block in _blocks(s):
          inner = enclosing(block, node)
          if inner is not None:
            return inner
      return s
  return None


def path_to(body: list[ast.stmt], target: ast.stmt) -> list[tuple[list[ast.stmt], int]] | None:
  """The blocks from `body` down to `target`, with the place in each of the
  statement that holds (or is) `target`."""
  for i, s in enumerate(body):
    if s is target:
      return [(body, i)]
    if isinstance(s, SCOPES):
      continue
    for block in _blocks(s):
      inner = path_to(block, target)
      if inner is not None:
        return [(body, i), *inner]
  return None


def contains(outer: ast.stmt, inner: ast.stmt) -> bool:
  return path_to([outer], inner) is not None


def body_of(scope: _scope.Scope) -> list[ast.stmt] | None:
  node = scope.node
  if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
    return node.body
  return None


def terminates(stmts: list[ast.stmt]) -> bool:
  """Whether running `stmts` surely ends in `return` / `raise` (never falls off the end)."""
  if not stmts:
    return False
  last = stmts[-1]
  if isinstance(last, ast.Return | ast.Raise):
    return True
  if isinstance(last, ast.If):
    return terminates(last.body) and terminates(last.orelse)
  if isinstance(last, ast.With | ast.AsyncWith):
    return terminates(last.body)
  if isinstance(last, ast.Try):
    return terminates(last.finalbody) or (
        terminates(last.body + last.orelse) if last.orelse else terminates(last.body)) and all(
            terminates(h.body) for h in last.handlers)
  return False


def own(node: ast.AST):
  """The nodes of a function's own body (not inside functions and classes in it)."""
  stack = list(ast.iter_child_nodes(node))
  while stack:
    n = stack.pop()
    yield n
    if not isinstance(n, SCOPES):
      stack.extend(ast.iter_child_nodes(n))


def _conjuncts(test: ast.expr) -> list[ast.expr]:
  if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
    return [c for v in test.values for c in _conjuncts(v)]
  return [test]


def _compares(test: ast.expr, name: str, op: type) -> bool:
  return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], op)
          and isinstance(test.left, ast.Name) and test.left.id == name
          and isinstance(test.comparators[0], ast.Constant)
          and test.comparators[0].value is None)


def tests_not_none(test: ast.expr, name: str) -> bool:
  return any(_compares(c, name, ast.IsNot) for c in _conjuncts(test))


def tests_is_none(test: ast.expr, name: str) -> bool:
  return (_compares(test, name, ast.Is) or isinstance(test, ast.BoolOp)
          and isinstance(test.op, ast.Or) and any(_compares(v, name, ast.Is) for v in test.values))
