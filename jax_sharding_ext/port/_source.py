"""Source text: decoding as Python does, `ast` positions as string offsets, edits.

`ast` gives a node's place as (line, column in UTF-8 bytes); `Text` turns
that into an offset in the decoded string, so a rewrite splices the exact
characters a node spans and leaves every other character as it was.
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import io
import re
import tokenize

_NEWLINE = re.compile(r"\r\n|\r|\n")


def decode(source: bytes) -> tuple[str, str, bool]:
  """(text, encoding, had a BOM) of a module's bytes, as Python reads them
  (PEP 263 cookie, BOM, else UTF-8). Raises SyntaxError for an unknown
  encoding or bytes that do not decode."""
  encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
  bom = encoding == "utf-8-sig"
  try:
    text = source.decode(encoding)
  except (UnicodeDecodeError, LookupError) as e:
    raise SyntaxError(f"cannot decode as {encoding}: {e}") from None
  return text, encoding, bom


def encode(text: str, encoding: str, bom: bool) -> bytes:
  data = text.encode("utf-8" if bom else encoding)
  return codecs.BOM_UTF8 + data if bom else data


@dataclasses.dataclass(frozen=True)
class Edit:
  """Replace `text[start:end]` by `new` (`start == end`: an insertion)."""
  start: int
  end: int
  new: str


class Text:
  """A module's text with the offsets of its lines."""

  def __init__(self, text: str) -> None:
    self.text = text
    self.starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]
    found = _NEWLINE.search(text)
    self.newline = found.group() if found else "\n"
    self._ascii = text.isascii()

  def line(self, lineno: int) -> str:
    """Line `lineno` (from 1) without its line break."""
    start = self.starts[lineno - 1]
    end = self.starts[lineno] if lineno < len(self.starts) else len(self.text)
    return self.text[start:end].rstrip("\r\n")

  def column(self, lineno: int, col_bytes: int) -> int:
    """The character column of a UTF-8 byte column on line `lineno`."""
    if self._ascii:
      return col_bytes
    line = self.line(lineno)
    if line.isascii():
      return col_bytes
    return len(line.encode("utf-8")[:col_bytes].decode("utf-8", "replace"))

  def offset(self, lineno: int, col_bytes: int) -> int:
    return self.starts[lineno - 1] + self.column(lineno, col_bytes)

  def start(self, node: ast.AST) -> int:
    return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

  def end(self, node: ast.AST) -> int:
    return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

  def segment(self, node: ast.AST) -> str:
    return self.text[self.start(node):self.end(node)]

  def line_end(self, lineno: int) -> int:
    """The offset just past line `lineno`'s line break."""
    return self.starts[lineno] if lineno < len(self.starts) else len(self.text)


def apply(text: str, groups: list[list[Edit]]) -> str:
  """`text` with the groups of edits applied (`choose`)."""
  return splice(text, choose(groups))


def choose(groups: list[list[Edit]]) -> list[Edit]:
  """The edits of the groups that apply together, sorted: a group is all or
  nothing, and of two groups whose edits touch the same characters the later
  one waits (for the next round). Identical edits of several groups apply once."""
  return choose_all(groups)[0]


def choose_all(groups: list[list[Edit]]) -> tuple[list[Edit], bool]:
  """`choose`'s edits, and whether every group is among them (none waits)."""
  rejected: set[int] = set()
  while True:
    owners: dict[Edit, int] = {}
    for gi, group in enumerate(groups):
      if gi not in rejected:
        for e in group:
          owners.setdefault(e, gi)
    edits = sorted(owners, key=lambda e: (e.start, e.end))
    clash = _first_clash(edits, owners)
    if clash is None:
      break
    rejected.add(clash)
  return edits, not rejected


def splice(text: str, edits: list[Edit]) -> str:
  """`text` with `edits` (sorted, none overlapping) made."""
  out, pos = [], 0
  for e in sorted(edits, key=lambda e: (e.start, e.end)):
    out += [text[pos:e.start], e.new]
    pos = e.end
  out.append(text[pos:])
  return "".join(out)


def _first_clash(edits: list[Edit], owners: dict[Edit, int]) -> int | None:
  """The later group of the first two overlapping edits (sorted by place), or None."""
  last: Edit | None = None
  for e in edits:
    if last is not None and _overlap(last, e):
      return max(owners[last], owners[e])
    if last is None or e.end >= last.end:
      last = e
  return None


def _overlap(a: Edit, b: Edit) -> bool:
  """Two edits touch the same characters (two different insertions at one
  point too: their order would be arbitrary)."""
  if a.start == a.end and b.start == b.end:
    return a.start == b.start
  if a.start == a.end:
    return b.start < a.start < b.end
  if b.start == b.end:
    return a.start < b.start < a.end
  return a.start < b.end and b.start < a.end


def shown(text: str) -> str:
  """Code on one line: runs of white space become one space."""
  return " ".join(text.split())
