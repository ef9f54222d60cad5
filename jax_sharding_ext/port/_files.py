"""Which files the tool reads, and reading them without blocking.

A directory is searched for `*.py` and `*.ipynb` files (hidden directories,
`__pycache__`, `node_modules` and `site-packages` skipped; symbolic links to
directories not followed). Only regular files are read: a FIFO, a socket or a
device named `*.py` is skipped in a search and refused when named, and a file
is opened without blocking, so none of them can hang the tool. A dangling
symbolic link in a search is skipped; named, it is an unreadable file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence

_SKIP_DIRS = ("__pycache__", "node_modules", "site-packages")
SUFFIXES = (".py", ".ipynb")


class Unreadable(Exception):
  """A file that cannot be read: the message says why."""


def paths(args: Sequence[str]) -> Iterator[tuple[str, str, bool]]:
  """(path as shown, path, named on the command line) of every file to read,
  each once, in a stable order; `-` is stdin."""
  seen: set[str] = set()
  for arg in args:
    if arg == "-":
      yield "-", "-", True
      continue
    if os.path.isdir(arg):
      found = _search(arg)
    else:
      found = iter([(arg, True)])
    for path, named in found:
      key = os.path.realpath(path)
      if key not in seen:
        seen.add(key)
        yield path, path, named


def _search(top: str) -> Iterator[tuple[str, bool]]:
  for root, dirs, names in os.walk(top):
    dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
    for name in sorted(names):
      if not name.endswith(SUFFIXES):
        continue
      path = os.path.join(root, name)
      try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
      except OSError:  # a dangling symbolic link, a file gone since the listing
        continue
      if regular:
        yield path, False


def read(path: str) -> bytes:
  """The bytes of a regular file; `Unreadable` for anything else."""
  try:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
  except FileNotFoundError:
    raise Unreadable("no such file or directory") from None
  except OSError as e:
    raise Unreadable(f"cannot read: {e.strerror or e}") from None
  try:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      raise Unreadable("not a regular file; skipped")
    with os.fdopen(fd, "rb", closefd=False) as f:
      return f.read()
  except OSError as e:
    raise Unreadable(f"cannot read: {e.strerror or e}") from None
  finally:
    os.close(fd)
