"""The code base a run looks at: which file an import names, and what other files say.

A rule that needs another file of the same project asks the `Project`:
`resolve(importer, module, level)` finds the file an import statement
names, as Python would from the importer's place (a relative import from
its package; an absolute one by its dotted name among the files of the run,
from the importer's directory or its top-level package's, or the package
the importer itself is part of, namespace packages included); `context(path)` parses that file on first use (a file is read only
when a rule asks, and kept); `mentions(word)` says whether any file of the
run contains a text, read once. A run on one module's source (`check`,
`fix`, stdin) has a project of that file alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from jax_sharding_ext.port import _files


def package_parts(path: str) -> tuple[str, list[str]]:
  """(the directory holding the top-level package of `path`, the dotted parts
  of its module name), following `__init__.py` files up from it."""
  directory, name = os.path.split(os.path.abspath(path))
  parts = [] if name == "__init__.py" else [os.path.splitext(name)[0]]
  while os.path.isfile(os.path.join(directory, "__init__.py")):
    directory, package = os.path.split(directory)
    parts.insert(0, package)
  return directory, parts


def module_name(path: str) -> str:
  return ".".join(package_parts(path)[1])


class Project:
  def __init__(self, paths: Iterable[str], load: Callable[[str], Any]) -> None:
    self.paths = [p for p in paths if p != "-"]
    self._load = load
    self._contexts: dict[str, Any] = {}
    self._by_name: dict[str, str] | None = None
    self._mentions: dict[bytes, bool] = {}
    self._resolved: dict[tuple[str, str, int], str | None] = {}
    self.visiting: set[Any] = set()  # the functions whose returns are being followed

  def _names(self) -> dict[str, str]:
    if self._by_name is None:
      self._by_name = {}
      for path in self.paths:
        if path.endswith(".py"):
          self._by_name.setdefault(module_name(path), os.path.abspath(path))
    return self._by_name

  def resolve(self, importer: str | None, module: str, level: int = 0) -> str | None:
    """The file (or namespace package directory) of `module` imported from
    `importer` (a path), or None."""
    if importer is None or importer == "-" or importer.startswith("<"):
      return None
    key = (importer, module, level)
    if key not in self._resolved:
      self._resolved[key] = self._resolve(importer, module, level)
    return self._resolved[key]

  def _resolve(self, importer: str, module: str, level: int) -> str | None:
    root, parts = package_parts(importer)
    if level:
      package = parts[:-1] if not importer.endswith("__init__.py") else parts
      if level - 1 > len(package):
        return None
      base = os.path.join(root, *package[:len(package) - (level - 1)])
      return _file(base, module.split(".") if module else [])
    dotted = module.split(".")
    found = self._names().get(module)
    if found is not None:
      return found
    here = os.path.dirname(os.path.abspath(importer))
    for base in (here, root):
      found = _file(base, dotted)
      if found is not None:
        return found
    for base in _ancestors(here):  # a package holding the importer (a copy of a library)
      target = os.path.join(base, *dotted)
      if here == target or here.startswith(target + os.sep):
        return _file(base, dotted)
    return None

  def context(self, path: str) -> Any:
    """The analysis context of another file (None when it cannot be read or parsed)."""
    if path not in self._contexts:
      self._contexts[path] = self._load(path)
    return self._contexts[path]

  def mentions(self, word: bytes) -> bool:
    """Whether some file of the run contains `word` (lower case, bytes)."""
    if word not in self._mentions:
      found = False
      for path in self.paths:
        try:
          found = word in _files.read(path).lower()
        except _files.Unreadable:
          continue
        if found:
          break
      self._mentions[word] = found
    return self._mentions[word]


def _ancestors(directory: str):
  while True:
    parent = os.path.dirname(directory)
    if parent == directory:
      return
    yield parent
    directory = parent


def _file(base: str, parts: list[str]) -> str | None:
  if not parts:
    return None
  target = os.path.join(base, *parts)
  for candidate in (target + ".py", os.path.join(target, "__init__.py")):
    if os.path.isfile(candidate):
      return candidate
  return target if os.path.isdir(target) else None
