"""Jupyter: a cell's effects finish, and print, inside that cell.

A jitted `jax.debug.print` runs on a callback thread when the computation
gets there, often after the cell has returned, so its lines appear under a
later cell or not at all. Under IPython, `install()` registers a
`post_run_cell` hook that waits for every effect dispatched so far
(`effects_barrier()`) and flushes stdout / stderr before the cell ends. It is
registered once, removed by `uninstall()`, skipped while the config flag
`jax_sharding_ext_cell_effects_barrier` is False, and nothing at all outside
IPython (IPython is never imported here).
"""

from __future__ import annotations

import sys

from jax_sharding_ext._edit import Edit
from jax_sharding_ext._effects import barrier
from jax_sharding_ext._jax import config as jax_config
from jax_sharding_ext._jax import frames as jax_frames

FLAG_NAME = "jax_sharding_ext_cell_effects_barrier"

cell_effects_barrier = jax_config.define_bool_flag(
    FLAG_NAME,
    default=True,
    help=("Under IPython / Jupyter, wait at the end of every cell for the effects "
          "(e.g. jax.debug.print) the cell dispatched, so their output lands in "
          "that cell. Defined by jax_sharding_ext."),
)


def _end_of_cell(result=None) -> None:
  """IPython `post_run_cell` hook."""
  del result
  if not cell_effects_barrier.value:
    return
  try:
    barrier.effects_barrier()
  except Exception as e:  # an effect of this cell failed: say so in this cell
    print(f"jax_sharding_ext: an effect dispatched by this cell failed: "
          f"{type(e).__name__}: {e}", file=sys.stderr)
  for stream in (sys.stdout, sys.stderr):
    stream.flush()


class IPythonHookEdit(Edit):
  """Registers `_end_of_cell` with the running IPython shell; undoable."""

  name = "IPython post_run_cell hook"

  def __init__(self):
    self.shell = None

  def _apply(self) -> None:
    shell = jax_frames.ipython_shell()
    if shell is not None:
      shell.events.register("post_run_cell", _end_of_cell)
    self.shell = shell

  def _revert(self) -> None:
    if self.shell is not None:
      self.shell.events.unregister("post_run_cell", _end_of_cell)
    self.shell = None


EDITS = [IPythonHookEdit()]
