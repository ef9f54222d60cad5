"""The running IPython shell, and user-facing call sites (`Cell In[3], line 5`).

A leaf module (it imports nothing of the package): the transfer ledger uses
`site_text` for its records and guard messages, `cell_hook` uses `shell()`
for its end-of-cell hook. IPython is never imported here.
"""

from __future__ import annotations

import os
import sys


def shell():
  """The running IPython shell, if IPython is already imported and running."""
  ipython = sys.modules.get("IPython")
  get = getattr(ipython, "get_ipython", None)
  return get() if get is not None else None


def site_text(filename: str, lineno: int) -> str:
  """Where a user's line is, for people: `Cell In[3], line 5` for a notebook
  cell (as IPython's own tracebacks say), else `path:line` with the path
  relative to the working directory when it is inside it."""
  ipy = shell()
  cells = getattr(getattr(ipy, "compile", None), "_filename_map", None)
  if cells and filename in cells:
    return f"Cell In[{cells[filename]}], line {lineno}"
  try:
    rel = os.path.relpath(filename)
  except ValueError:  # another drive (Windows)
    rel = filename
  return f"{filename if rel.startswith('..') else rel}:{lineno}"
