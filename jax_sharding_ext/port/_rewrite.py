"""Rewriting one planned import statement with libcst, keeping its formatting.

Only the import statements `--write` changes go through libcst, each parsed
on its own: the lines it spans when nothing else shares them (comments kept),
else just its own text. An import whose names all move to one module only
changes its module, so its parentheses, commas and comments stay. One that
splits becomes one statement per module, each keeping its names' own
formatting; a line comment stays on the first of them (a `# pylint:` /
`# noqa` / `# type:` / `# pytype:` pragma is repeated on each, since it
applies to every name).
"""

from __future__ import annotations

from typing import Any

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
  new = node.with_changes(module=_module_node(module), relative=())
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


def _renamed(alias: cst.ImportAlias, new: str | None) -> cst.ImportAlias:
  """`alias` importing `new` instead, under the local name it had."""
  if new is None:
    return alias
  old = cst.Module([]).code_for_node(alias.name)
  asname = alias.asname or cst.AsName(name=cst.Name(old.rpartition(".")[2]))
  return alias.with_changes(name=_module_node(new), asname=asname)


def _statements(node: cst.Import | cst.ImportFrom, plan: Plan) -> list[cst.BaseSmallStatement]:
  out: list[cst.BaseSmallStatement] = []
  names = list(node.names)  # type: ignore[arg-type]
  for module, entries in plan.groups:
    if isinstance(node, cst.ImportFrom):
      aliases = [_renamed(names[i], new) for i, new in entries]
      out.append(_from_group(node, module, aliases))  # type: ignore[arg-type]
    elif module is None:
      aliases = [names[i] if new is None else names[i].with_changes(name=_module_node(new))
                 for i, new in entries]
      out.append(node.with_changes(names=_without_last_comma(aliases)))
    else:
      aliases = []
      for i, new in entries:
        short = cst.Module([]).code_for_node(names[i].name).rpartition(".")[2]
        alias = names[i].with_changes(name=cst.Name(short), comma=cst.MaybeSentinel.DEFAULT)
        aliases.append(_renamed(alias, new))
      out.append(cst.ImportFrom(module=_module_node(module), names=_without_last_comma(aliases)))
  return [s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in out]


def rewrite_lines(lines: str, indent: str, plan: Plan, only_statement: bool,
                  newline: str = "\n") -> str:
  """The lines of one import statement alone on them (from the start of its
  first line, line breaks and comments included), rewritten by `plan`.
  `only_statement`: nothing else is in its block, so removing it leaves `pass`."""
  wrapped = f"if 1:{newline}{lines}" if indent else lines
  if not wrapped.endswith(("\n", "\r")):
    wrapped += newline
  module = cst.parse_module(wrapped)
  first_stmt: Any = module.body[0]
  block: Any = first_stmt.body if indent else module
  line: Any = block.body[0]
  new = _statements(line.body[0], plan)
  if not new:
    comment = line.trailing_whitespace.comment
    if not only_statement:
      return ""
    new_lines = [cst.SimpleStatementLine(
        body=[cst.Pass()], leading_lines=line.leading_lines,
        trailing_whitespace=line.trailing_whitespace if comment else cst.TrailingWhitespace())]
  else:
    comment = line.trailing_whitespace.comment
    pragma = comment is not None and comment.value.startswith(_PRAGMAS)
    new_lines = [line.with_changes(body=[new[0]])]
    for stmt in new[1:]:
      trailing = line.trailing_whitespace if pragma else cst.TrailingWhitespace()
      new_lines.append(cst.SimpleStatementLine(body=[stmt], trailing_whitespace=trailing))
  block = block.with_changes(body=new_lines)
  if indent:
    first: Any = module.body[0]
    module = module.with_changes(body=[first.with_changes(body=block)])
    code = module.code
    return code[code.index("\n", 0) + 1:] if code.startswith("if 1:") else code
  code = block.code
  return code if lines.endswith(("\n", "\r")) else code.rstrip("\r\n")


def rewrite_statement(text: str, plan: Plan) -> str:
  """One import statement's own text (it shares its line with others),
  rewritten by `plan`; several statements are joined with `; `."""
  line: Any = cst.parse_statement(text)
  new = _statements(line.body[0], plan)
  if not new:
    return "pass"
  return "; ".join(cst.Module([]).code_for_node(s) for s in new)
