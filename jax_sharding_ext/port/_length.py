"""The lines `--write` makes longer than the file keeps its lines, for the report.

A rename can make a line longer (`jax.tree_map(` becomes
`jax.tree_util.tree_map(`); the tool does not wrap lines (a formatter does
that as the project wants it), it says which lines grew past the file's
line length. That length is, in this order:

1. the project's configured one, from the nearest directory up from the
   file (up to the repository's root, the directory with `.git`) holding a
   configuration file that sets one: `pyproject.toml` (`[tool.ruff]` /
   `[tool.black]` / `[tool.pyink]` `line-length`, `[tool.yapf]`
   `column_limit`, `[tool.pylint.format]` `max-line-length`), `ruff.toml` /
   `.ruff.toml` (`line-length`), `setup.cfg`, `tox.ini`, `.flake8`
   (`[flake8]` / `[pycodestyle]` `max-line-length`, `[yapf]`
   `column_limit`), `.pylintrc` / `pylintrc` (`[FORMAT]` `max-line-length`),
   `.style.yapf` (`[style]` `column_limit`);
2. else the file's own: its longest line as given, not counting lines that
   linters exempt (a URL, a `# noqa` / `# pylint: disable=line-too-long`).

A line is reported when the rewrite made it longer than it was and it is now
longer than that length (a line the rewrite added, when it is longer).
Lengths count characters, as linters do.
"""

from __future__ import annotations

import bisect
import configparser
import dataclasses
import os
import re
import tomllib
from collections.abc import Callable
from typing import Any

from jax_sharding_ext.port._source import _NEWLINE, Edit, Text

_EXEMPT = re.compile(r"https?://|#\s*noqa|line-too-long")
_TOML: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (("pyproject.toml", (("tool", "ruff", "line-length"), ("tool", "black", "line-length"),
                             ("tool", "pyink", "line-length"), ("tool", "yapf", "column_limit"),
                             ("tool", "pylint", "format", "max-line-length"))),
         ("ruff.toml", (("line-length",),)), (".ruff.toml", (("line-length",),)))
_INI: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (("setup.cfg", (("flake8", "max-line-length"), ("pycodestyle", "max-line-length"),
                       ("yapf", "column_limit"))),
        ("tox.ini", (("flake8", "max-line-length"), ("pycodestyle", "max-line-length"))),
        (".flake8", (("flake8", "max-line-length"),)),
        (".pylintrc", (("FORMAT", "max-line-length"),)),
        ("pylintrc", (("FORMAT", "max-line-length"),)),
        (".style.yapf", (("style", "column_limit"),)))


@dataclasses.dataclass(frozen=True)
class Limit:
  length: int
  source: str  # where it comes from, for the report


_configured: dict[str, Limit | None] = {}  # directory -> its configured length (one run)


def limit(path: str | None, lines: list[str]) -> Limit | None:
  """The line length of the file at `path` whose lines are `lines`."""
  if path is not None and path != "-" and not path.startswith("<"):
    found = _configured_for(os.path.dirname(os.path.abspath(path)))
    if found is not None:
      return found
  lengths = [len(line) for line in lines if not _EXEMPT.search(line)]
  return Limit(max(lengths), "the longest line it had") if lengths else None


def _configured_for(directory: str) -> Limit | None:
  if directory not in _configured:
    found = _read_dir(directory)
    if found is None and not os.path.isdir(os.path.join(directory, ".git")):
      parent = os.path.dirname(directory)
      found = _configured_for(parent) if parent != directory else None
    _configured[directory] = found
  return _configured[directory]


def _read_dir(directory: str) -> Limit | None:
  for name, keys in _TOML:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      try:
        with open(path, "rb") as f:
          data: Any = tomllib.load(f)
      except (OSError, tomllib.TOMLDecodeError):
        continue
      for key in keys:
        value = _dig(data, key)
        if isinstance(value, int) and value > 0:
          return Limit(value, f"{'.'.join(key[:-1]) or name} {key[-1]} in {_shown(path)}")
  for name, keys in _INI:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      parser = configparser.ConfigParser(interpolation=None, strict=False)
      try:
        parser.read(path, encoding="utf-8")
      except (configparser.Error, OSError, UnicodeDecodeError):
        continue
      for section, option in keys:
        value = parser.get(section, option, fallback="").strip()
        if value.isdigit() and int(value) > 0:
          return Limit(int(value), f"[{section}] {option} in {_shown(path)}")
  return None


def _shown(path: str) -> str:
  """`path` relative to the working directory when it is inside it."""
  try:
    relative = os.path.relpath(path)
  except ValueError:  # another drive
    return path
  return path if relative.startswith(os.pardir) else relative


def _dig(data: Any, key: tuple[str, ...]) -> Any:
  for part in key:
    data = data.get(part) if isinstance(data, dict) else None
  return data


class Growth:
  """The lines of the current text that the rewrite touched, each with the
  length of the line it came from in the text as given (None: added)."""

  def __init__(self, length: Callable[[str], int] = len) -> None:
    self.length = length  # a line's length as the file has it
    self.origin: dict[int, int | None] = {}  # line (from 0) of the current text -> length

  def rewrite(self, old: Text, edits: list[Edit], new: Text) -> None:
    """Follows one round of `edits` (sorted, not overlapping) from `old` to `new`."""
    shifts, total = [], 0  # (old offset an edit ends at, the shift past it)
    for e in edits:
      total += len(e.new) - (e.end - e.start)
      shifts.append((e.end, total))
    ends = [end for end, _ in shifts]

    def moved(offset: int) -> int:  # an offset of `old` no edit touches, in `new`
      i = bisect.bisect_right(ends, offset)
      return offset + (shifts[i - 1][1] if i else 0)

    origin: dict[int, int | None] = {}
    for line, length in self.origin.items():  # lines an earlier round touched
      start = old.starts[line]
      origin[_line_of(new.starts, moved(start))] = length
    before = 0
    for e in edits:
      first = _line_of(old.starts, e.start)
      span = len(_NEWLINE.findall(old.text, e.start, e.end))
      at = e.start + before
      before += len(e.new) - (e.end - e.start)
      new_first, new_last = _line_of(new.starts, at), _line_of(new.starts, at + len(e.new))
      whole = (e.start == old.starts[first] and (not e.new or e.new.endswith(("\n", "\r")))
               and (e.end == len(old.text) or old.starts[_line_of(old.starts, e.end)] == e.end))
      if whole:  # whole lines replaced (or added, or removed): the next line is not touched
        new_last -= 1
      for k, line in enumerate(range(new_first, new_last + 1)):
        if line in origin:
          continue
        if whole and k >= span:
          origin[line] = None  # a line the rewrite added
        else:
          source = first + min(k, span - 1 if whole else span)
          origin[line] = self.origin.get(source, self.length(old.line(source + 1)))
    self.origin = origin

  def grown(self, text: Text, limit: int) -> list[tuple[int, int, int | None]]:
    """(line from 1, its length, the length it had) of every touched line now
    longer than `limit` and than it was."""
    out = []
    for line, was in sorted(self.origin.items()):
      now = self.length(text.line(line + 1))
      if now > limit and (was is None or now > was):
        out.append((line + 1, now, was))
    return out


def _line_of(starts: list[int], offset: int) -> int:
  """The line (from 0) holding `offset`."""
  return bisect.bisect_right(starts, offset) - 1
