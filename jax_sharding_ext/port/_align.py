"""Continuation lines aligned with an opening bracket move with it.

An edit that changes a line's length (`jax.tree_map(` becoming
`jax.tree_util.tree_map(`) moves every bracket after it on that line. A
bracket left open at the end of the line whose continuation lines were
aligned with its first argument (PEP 8's "aligned with opening delimiter")
keeps them aligned: each such line moves by as much as the bracket did. A
line that starts inside a string, a hanging indent and a line indented with
tabs are left as they are.
"""

from __future__ import annotations

import io
import tokenize

from jax_sharding_ext.port._source import Edit, Text

_OPEN = "([{"
_CLOSE = ")]}"


def _shifts(text: Text, edits: list[Edit]) -> dict[int, list[tuple[int, int]]]:
  """Per line (from 1): (column from which the line moves, by how much) of
  every one-line edit that changes its length."""
  out: dict[int, list[tuple[int, int]]] = {}
  starts = text.starts
  for e in edits:
    delta = len(e.new) - (e.end - e.start)
    if not delta or any(c in e.new for c in "\r\n"):
      continue
    line = _line_of(starts, e.start)
    line_end = starts[line] if line < len(starts) else len(text.text)
    if e.end > line_end or "\n" in text.text[e.start:e.end]:
      continue
    out.setdefault(line, []).append((e.end - starts[line - 1], delta))
  return out


def _line_of(starts: list[int], offset: int) -> int:
  lo, hi = 0, len(starts) - 1
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if starts[mid] <= offset:
      lo = mid
    else:
      hi = mid - 1
  return lo + 1


def _may_open(line: str, col: int) -> bool:
  """A cheap test: the rest of the line may leave a bracket open."""
  rest = line[col:]
  return sum(rest.count(c) for c in _OPEN) > sum(rest.count(c) for c in _CLOSE)


def realign(text: Text, edits: list[Edit]) -> list[Edit]:
  """The edits of leading white space that keep continuation lines aligned
  with the brackets `edits` move."""
  out: list[Edit] = []
  for line, shifts in _shifts(text, edits).items():
    if _may_open(text.line(line), min(c for c, _ in shifts)):
      out += _realign_line(text, line, shifts)
  return out


def _realign_line(text: Text, line: int, shifts: list[tuple[int, int]]) -> list[Edit]:
  start = text.starts[line - 1]
  reader = io.StringIO(text.text[start:]).readline
  opened: list[tuple[int, int | None, int]] = []  # (delta, visual indent, row it opened on)
  spans: list[tuple[int, int | None, int, int]] = []  # (delta, indent, first row, last row)
  first_col: dict[int, int] = {}
  covered: set[int] = set()
  waiting: tuple[int, int] | None = None  # a bracket of the first row waiting for its first token
  try:
    for tok in tokenize.generate_tokens(reader):
      (row, col), (end_row, _) = tok.start, tok.end
      covered.update(range(row + 1, end_row + 1))
      if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
        if tok.type == tokenize.NEWLINE and not opened:
          break
        continue
      if row > 1 and row not in first_col and row not in covered:
        first_col[row] = col
      if waiting is not None:
        opened.append((waiting[0], col if row == 1 else None, waiting[1]))
        waiting = None
      if tok.type == tokenize.OP and tok.string in _OPEN:
        if row == 1:
          waiting = (sum(d for c, d in shifts if c <= col), row)
        else:
          opened.append((0, None, row))
      elif tok.type == tokenize.OP and tok.string in _CLOSE:
        if not opened:
          break  # a bracket opened before this line closes: nothing of ours is open
        delta, indent, first = opened.pop()
        if first == 1 and row > 1:
          spans.append((delta, indent, 2, row))
        if not opened and row > 1:
          break
  except (tokenize.TokenError, SyntaxError, IndentationError):
    return []
  return _moves(text, line, spans, first_col)


def _moves(text: Text, line: int, spans: list[tuple[int, int | None, int, int]],
           first_col: dict[int, int]) -> list[Edit]:
  out = []
  for row, col in first_col.items():
    # The innermost bracket of the first line around this row that it is aligned with.
    around = [s for s in spans if s[2] <= row <= s[3] and s[1] is not None and col >= s[1]]
    if not around:
      continue
    delta = min(around, key=lambda s: s[3] - s[2])[0]
    lineno = line + row - 1
    indent = text.line(lineno)[:col]
    if not delta or indent.strip(" ") or col + delta < 0:
      continue
    begin = text.starts[lineno - 1]
    out.append(Edit(begin, begin + col, " " * (col + delta)))
  return out
