"""Notebooks (`.ipynb`): their code cells as one module, and back.

The code cells run in one namespace, so they are checked as one module (an
import in the first cell serves the last). IPython lines (`%magic`, `!shell`,
`name?`) are held out as `pass` placeholders and put back as they were. The
Python that IPython runs under a magic is checked as Python: the code of a
`%time` / `%timeit` line (the magic put back in front of it), and the body of
a `%%time` / `%%timeit` / `%%capture` cell (its first line held out). A cell
run by another cell magic (`%%bash`) is left out whole, as is a cell that
does not parse (reported). Findings name the cell: `nb.ipynb:cell 3`.

Writing back changes only the `source` of the cells whose code changed, in
place in the file's own text: every other byte (other cells, outputs, the
file's JSON layout and escapes) stays as it was. A changed `source` is
written as the file wrote it (a list of lines or one string, its indentation,
escapes of non-ASCII characters or not).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import warnings
from collections.abc import Iterator
from typing import Any

_MAGIC = re.compile(r"^(\s*)(%|!|\?)|^\s*\w[\w.]*\?\??\s*$|^\s*[\w.]+\s*=\s*[!%]")
_CELL = "# <jax-sharding-ext-port cell {}>"
_CELL_LINE = re.compile(r"^# <jax-sharding-ext-port cell (\d+)>$", re.M)
_HELD = "pass  # <jax-sharding-ext-port held {}>"
_HELD_LINE = re.compile(r"^([ \t]*)pass  # <jax-sharding-ext-port held (\d+)>$", re.M)
# A line magic whose argument is a Python statement, and its options.
_CODE_MAGIC = re.compile(r"^(\s*)(%(?:time|timeit)(?:\s+-[A-Za-z](?:\s*[\d.]+)?)*\s+)(\S.*)$")
_PREFIXED = "{}  # <jax-sharding-ext-port magic {}>"
_PREFIXED_LINE = re.compile(r"^([ \t]*)(.*)  # <jax-sharding-ext-port magic (\d+)>$", re.M)
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture"})


@dataclasses.dataclass
class Notebook:
  raw: bytes
  data: Any
  indent: int | None
  trailing_newline: bool
  cells: dict[int, str]  # cell number (from 1, code cells counted with the others) -> source
  held: list[str]        # the IPython lines taken out
  broken: dict[int, SyntaxError]


def _source(cell: dict) -> str:
  src = cell.get("source", "")
  return "".join(src) if isinstance(src, list) else str(src)


def load(raw: bytes, path: str) -> Notebook:
  """Raises ValueError when `raw` is not a notebook."""
  try:
    data = json.loads(raw)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"not a notebook (JSON: {e})") from None
  if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
    raise ValueError("not a notebook (no `cells` list)")
  text = raw.decode("utf-8", "replace")
  second = text.split("\n", 2)[1] if text.count("\n") >= 2 else ""
  indent = len(second) - len(second.lstrip(" ")) if second.startswith(" ") else None
  nb = Notebook(raw, data, indent, text.endswith("\n"), {}, [], {})
  for number, cell in enumerate(data["cells"], 1):
    if not isinstance(cell, dict) or cell.get("cell_type") != "code":
      continue
    source = _source(cell)
    lines = source.split("\n")
    if source.lstrip().startswith("%%"):
      magic = source.lstrip()[2:].split(None, 1)
      if not magic or magic[0] not in _PYTHON_CELL_MAGICS or lines[0].startswith((" ", "\t")):
        continue
      nb.held.append(lines[0])  # the magic's line; its body is Python
      lines[0] = _HELD.format(len(nb.held) - 1)
    masked = "\n".join(_hold(nb, line) for line in lines)
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. invalid escape sequences: Python runs them
        ast.parse(masked, f"{path}:cell {number}")
    except SyntaxError as e:
      nb.broken[number] = e
      continue
    except (RecursionError, MemoryError, ValueError) as e:
      nb.broken[number] = SyntaxError(str(e) or type(e).__name__)
      continue
    nb.cells[number] = masked
  return nb


def _hold(nb: Notebook, line: str) -> str:
  if _HELD_LINE.match(line):
    return line
  code = _CODE_MAGIC.match(line)
  if code is not None:  # `%time x = f()`: the statement, the magic remembered
    nb.held.append(code.group(2))
    return code.group(1) + _PREFIXED.format(code.group(3), len(nb.held) - 1)
  m = _MAGIC.match(line)
  if m is None:
    return line
  nb.held.append(line)
  indent = line[:len(line) - len(line.lstrip())]
  return indent + _HELD.format(len(nb.held) - 1)


def module_text(nb: Notebook) -> tuple[str, dict[int, int]]:
  """The code cells as one module, and the first line of each cell in it."""
  lines: list[str] = []
  first: dict[int, int] = {}
  for number, source in nb.cells.items():
    lines.append(_CELL.format(number))
    first[number] = len(lines) + 1
    lines += source.split("\n")
  return "\n".join(lines) + "\n", first


def cell_starts(text: str) -> dict[int, int]:
  """The first line of each cell in a `module_text` (or its rewrite)."""
  starts = {}
  for m in _CELL_LINE.finditer(text):
    starts[int(m.group(1))] = text.count("\n", 0, m.start()) + 2
  return starts


def locate(starts: dict[int, int], line: int) -> tuple[int, int]:
  """(cell number, line in that cell) of a line of `module_text`."""
  number = max((n for n, start in starts.items() if start <= line), key=lambda n: starts[n])
  return number, line - starts[number] + 1


def column(nb: Notebook, line_text: str, col: int) -> int:
  """The column in the cell of column `col` of a `module_text` line: past the
  magic of a `%time` line that was held out in front of its code."""
  m = _PREFIXED_LINE.match(line_text)
  if m is None or col <= len(m.group(1)):
    return col
  return col + len(nb.held[int(m.group(3))])


def cell_line(nb: Notebook, line: str) -> str:
  """A line of a `module_text` as its cell has it (IPython lines put back)."""
  line = _HELD_LINE.sub(lambda m: nb.held[int(m.group(2))], line)
  return _PREFIXED_LINE.sub(lambda m: m.group(1) + nb.held[int(m.group(3))] + m.group(2), line)


def code_lines(nb: Notebook, text: str) -> list[str]:
  """The lines of the code cells in a `module_text`, as the cells have them."""
  return [cell_line(nb, line) for line in text.split("\n") if not _CELL_LINE.match(line)]


def dump(nb: Notebook, text: str) -> bytes:
  """The notebook with its code cells replaced by those in `text` (a rewritten
  `module_text`): only the changed cells' `source` values are rewritten."""
  text = _HELD_LINE.sub(lambda m: nb.held[int(m.group(2))], text)
  text = _PREFIXED_LINE.sub(lambda m: m.group(1) + nb.held[int(m.group(3))] + m.group(2), text)
  pieces = _CELL_LINE.split(text)
  changed: dict[int, str] = {}
  for i in range(1, len(pieces), 2):
    number, source = int(pieces[i]), pieces[i + 1]
    source = source[1:] if source.startswith("\n") else source
    source = source[:-1] if source.endswith("\n") else source
    if _source(nb.data["cells"][number - 1]) != source:
      changed[number] = source
  raw = nb.raw.decode("utf-8")
  try:
    spans = dict(_source_spans(raw))
  except (ValueError, IndexError, KeyError):
    spans = {}
  if not changed.keys() <= spans.keys():  # a layout this reader does not follow
    return _reserialized(nb, changed)
  ascii_only = _escapes_non_ascii(raw)
  out, pos = [], 0
  for number in sorted(changed):
    start, end = spans[number]
    out += [raw[pos:start], _render(raw, start, end, changed[number], ascii_only)]
    pos = end
  out.append(raw[pos:])
  return "".join(out).encode("utf-8")


def _reserialized(nb: Notebook, changed: dict[int, str]) -> bytes:
  for number, source in changed.items():
    cell = nb.data["cells"][number - 1]
    cell["source"] = (source.splitlines(keepends=True) if isinstance(cell.get("source"), list)
                      else source)
  out = json.dumps(nb.data, indent=nb.indent, ensure_ascii=False)
  return (out + "\n" if nb.trailing_newline else out).encode("utf-8")


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(raw: str, i: int) -> int:
  """The index of the first character at or after `i` that is not white space."""
  found = _WS.match(raw, i)
  return found.end() if found is not None else i


def _members(raw: str, i: int) -> Iterator[tuple[str, int, int]]:
  """(key, value start, value end) of the JSON object starting at `raw[i]`."""
  if raw[i] != "{":
    raise ValueError("not an object")
  i = _skip(raw, i + 1)
  if raw[i] == "}":
    return
  while True:
    key, i = json.decoder.scanstring(raw, i + 1)  # type: ignore[attr-defined]
    i = _skip(raw, i)
    start = _skip(raw, i + 1)  # past the `:`
    end = _DECODER.raw_decode(raw, start)[1]
    yield key, start, end
    i = _skip(raw, end)
    if raw[i] == "}":
      return
    i = _skip(raw, i + 1)  # past the `,`


def _elements(raw: str, i: int) -> Iterator[tuple[int, int]]:
  """(start, end) of each element of the JSON array starting at `raw[i]`."""
  if raw[i] != "[":
    raise ValueError("not an array")
  i = _skip(raw, i + 1)
  while raw[i] != "]":
    end = _DECODER.raw_decode(raw, i)[1]
    yield i, end
    i = _skip(raw, end)
    if raw[i] == ",":
      i = _skip(raw, i + 1)


def _source_spans(raw: str) -> Iterator[tuple[int, tuple[int, int]]]:
  """(cell number, the span of its `source` value) in the notebook's text."""
  start = _skip(raw, 0)
  for key, value, _ in _members(raw, start):
    if key == "cells":
      for number, (cell, _end) in enumerate(_elements(raw, value), 1):
        for k, s, e in _members(raw, cell):
          if k == "source":
            yield number, (s, e)


def _escapes_non_ascii(raw: str) -> bool:
  """Whether the file writes characters past ASCII as `\\u` escapes."""
  return raw.isascii() and re.search(r"(?<!\\)\\u(?!00[0-7])[0-9a-fA-F]{4}", raw) is not None


def _render(raw: str, start: int, end: int, source: str, ascii_only: bool) -> str:
  """`source` as JSON in the place of `raw[start:end]`, written as that was."""
  if raw[start] != "[":
    return json.dumps(source, ensure_ascii=ascii_only)
  lines = [json.dumps(line, ensure_ascii=ascii_only) for line in source.splitlines(True)]
  inner = raw[start + 1:end - 1]
  lead = inner[:len(inner) - len(inner.lstrip())]  # an empty list (no code, so never
  tail = inner[len(inner.rstrip()):]                # changed) has neither
  if not lines:
    return "[]"
  return "[" + lead + ("," + lead).join(lines) + tail + "]"
