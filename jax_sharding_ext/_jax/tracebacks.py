"""JAX's traceback filtering (`jax._src.traceback_util`).

Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the module-level `_exclude_paths` list
or `api_boundary`'s location.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------
# Traceback filtering (`jax._src.traceback_util`, stable since jax 0.2). An
# error from bad input should show the user's line and the message, not the
# package's frames: public entry points are JAX API boundaries, and the
# package's directory is one of JAX's excluded paths while installed, so JAX
# filters (or, under IPython, hides) those frames exactly as it does its own,
# obeying `jax_traceback_filtering`.
# ---------------------------------------------------------------------------
import os as _tb_os

from jax._src import traceback_util as _tb_util

from jax_sharding_ext._edit import Edit

api_boundary = _tb_util.api_boundary
"""Decorator: `fun` is an API boundary below which frames are filtered."""

# The package directory: the parent of this `_jax/` sub-package.
PACKAGE_DIR = _tb_os.path.dirname(_tb_os.path.dirname(_tb_os.path.abspath(__file__)))


class TracebackExclusionEdit(Edit):
  """Adds the package's directory to JAX's traceback exclusions; undoable."""

  name = "traceback exclusion paths"

  def __init__(self, path: str = PACKAGE_DIR):
    self.path = path
    self.position: int | None = None  # where it was before the last revert

  def _apply(self) -> None:
    paths = _tb_util._exclude_paths
    # Back where it was (libraries imported meanwhile may have appended
    # their own paths after it), else at the end.
    at = self.position if self.position is not None else len(paths)
    paths.insert(min(at, len(paths)), self.path)

  def _revert(self) -> None:
    # The last occurrence is ours (added after any earlier one).
    paths = _tb_util._exclude_paths
    self.position = len(paths) - 1 - paths[::-1].index(self.path)
    del paths[self.position]


EDITS = [TracebackExclusionEdit()]
