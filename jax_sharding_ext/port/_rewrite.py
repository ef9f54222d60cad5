"""Rewriting the imports `_analyze` planned (libcst), keeping everything else as written.

An import whose names all move to one module only changes its module, so its
parentheses, commas and comments stay. One that splits becomes one statement
per module, each keeping its names' own formatting; a line comment stays on
the first of them (a `# pylint:` / `# noqa` / `# type:` / `# pytype:` pragma
is repeated on each, since it applies to every name).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from jax_sharding_ext.port._imports import Plan

_PRAGMAS = ("# pylint:", "# noqa", "# type:", "# pytype:")


def _module_node(dotted: str) -> cst.Attribute | cst.Name:
  node: cst.Attribute | cst.Name = cst.Name(dotted.split(".")[0])
  for part in dotted.split(".")[1:]:
    node = cst.Attribute(value=node, attr=cst.Name(part))
  return node


def _without_last_comma(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
  return [*aliases[:-1], aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]


def _from_group(node: cst.ImportFrom, module: str, aliases: list[cst.ImportAlias]
                ) -> cst.ImportFrom:
  """`node` importing `aliases` from `module`, ending as `node` ends: inside
  parentheses with its line break before the `)`, the last name's comment kept."""
  new = node.with_changes(module=_module_node(module))
  last = aliases[-1]
  if last is node.names[-1]:  # type: ignore[index]
    return new.with_changes(names=aliases)
  if node.rpar is None:
    return new.with_changes(names=_without_last_comma(aliases))
  orig_last = node.names[-1]  # type: ignore[index]
  own = last.comma.whitespace_after if isinstance(last.comma, cst.Comma) else None
  if not isinstance(own, cst.ParenthesizedWhitespace):
    return new.with_changes(names=_without_last_comma(aliases))
  if isinstance(orig_last.comma, cst.Comma):  # `a,\n)`: keep the comma, end its line there
    closing = orig_last.comma.whitespace_after
    if isinstance(closing, cst.ParenthesizedWhitespace):
      own = own.with_changes(indent=closing.indent, last_line=closing.last_line)
    return new.with_changes(names=[*aliases[:-1], last.with_changes(
        comma=last.comma.with_changes(whitespace_after=own))])  # type: ignore[union-attr]
  closing = node.rpar.whitespace_before  # `a\n)`: no comma, the line ends before `)`
  if isinstance(closing, cst.ParenthesizedWhitespace):
    own = own.with_changes(indent=closing.indent, last_line=closing.last_line)
    return new.with_changes(names=_without_last_comma(aliases),
                            rpar=node.rpar.with_changes(whitespace_before=own))
  return new.with_changes(names=_without_last_comma(aliases))


def _statements(node: cst.Import | cst.ImportFrom, plan: Plan) -> list[cst.BaseSmallStatement]:
  out: list[cst.BaseSmallStatement] = []
  for module, aliases in plan.groups:
    if isinstance(node, cst.ImportFrom):
      out.append(_from_group(node, module, aliases))  # type: ignore[arg-type]
    elif module is None:
      out.append(node.with_changes(names=_without_last_comma(aliases)))
    else:
      out.append(cst.ImportFrom(module=_module_node(module), names=_without_last_comma(aliases)))
  return [s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in out]


class Rewriter(cst.CSTTransformer):
  """Replaces each planned import statement by its rewrite."""

  def __init__(self, plans: dict[int, Plan]) -> None:
    super().__init__()
    self.plans = plans

  def _expand(self, body: Sequence[cst.BaseSmallStatement]) -> list[cst.BaseSmallStatement] | None:
    new: list[cst.BaseSmallStatement] = []
    changed = False
    for stmt in body:
      plan = self.plans.get(id(stmt))
      if plan is None:
        new.append(stmt)
      else:
        new.extend(_statements(stmt, plan))  # type: ignore[arg-type]
        changed = True
    return new if changed else None

  def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                updated_node: cst.SimpleStatementLine):
    new = self._expand(original_node.body)
    if new is None:
      return updated_node
    if len(original_node.body) > 1 or len(new) == 1:
      return updated_node.with_changes(body=new)
    comment = updated_node.trailing_whitespace.comment
    pragma = comment is not None and comment.value.startswith(_PRAGMAS)
    lines = [updated_node.with_changes(body=[new[0]])]
    for stmt in new[1:]:
      trailing = updated_node.trailing_whitespace if pragma else cst.TrailingWhitespace()
      lines.append(cst.SimpleStatementLine(body=[stmt], trailing_whitespace=trailing))
    return cst.FlattenSentinel(lines)

  def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite,
                                 updated_node: cst.SimpleStatementSuite):
    new = self._expand(original_node.body)
    return updated_node if new is None else updated_node.with_changes(body=new)
