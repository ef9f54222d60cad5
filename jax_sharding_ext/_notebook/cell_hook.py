"""Jupyter: a cell's effects finish, and print, inside that cell.

A jitted `jax.debug.print` runs on a callback thread when the computation
gets there, often after the cell has returned, so its lines appear under a
later cell or not at all. Under IPython, `install()` registers a
`pre_run_cell` hook that notes the effects already pending, and a
`post_run_cell` hook that waits for the effects the cell dispatched and
flushes stdout / stderr before the cell ends. It does not wait for effects of
earlier cells (one may never finish: an interrupted cell leaves its
computation running, as stock does), nor after a cell that was interrupted;
interrupted while it waits, it stops waiting. Once nothing earlier is pending
either, it runs `effects_barrier()`, so a failed effect is reported in its
cell, once. The hooks are registered once, removed by `uninstall()`, skipped
while the config flag `jax_sharding_ext_cell_effects_barrier` is False, and
nothing at all outside IPython (IPython is never imported here).
"""

from __future__ import annotations

import sys

import jax

from jax_sharding_ext._edit import Edit
from jax_sharding_ext._effects import barrier
from jax_sharding_ext._jax import config as jax_config
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tokens as jax_tokens

FLAG_NAME = "jax_sharding_ext_cell_effects_barrier"

cell_effects_barrier = jax_config.define_bool_flag(
    FLAG_NAME,
    default=True,
    help=("Under IPython / Jupyter, wait at the end of every cell for the effects "
          "(e.g. jax.debug.print) the cell dispatched, so their output lands in "
          "that cell. Defined by jax_sharding_ext."),
)


_before: dict[int, object] | None = None
"""The effects' tokens pending when the running cell started (by id; the
tokens are kept so that no id is reused), or None outside a cell."""


def _start_of_cell(info=None) -> None:
  """IPython `pre_run_cell` hook."""
  del info
  global _before
  _before = {id(t): t for t in jax_tokens.all_pending_tokens()}


def _end_of_cell(result=None) -> None:
  """IPython `post_run_cell` hook."""
  global _before
  before, _before = _before, None
  if not cell_effects_barrier.value:
    return
  if isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
    _flush()  # interrupted: its computations may never finish; do not wait
    return
  pending = jax_tokens.all_pending_tokens()
  earlier = [t for t in pending if before is not None and id(t) in before]
  failure = None
  try:
    for token in pending:
      if before is None or id(token) not in before:  # this cell's
        try:
          token.block_until_ready()
        except jax.errors.JaxRuntimeError as e:
          failure = failure or e
    if all(map(jax_tokens.token_is_ready, earlier)):
      failure = None  # the barrier reports it, once, and starts over
      barrier.effects_barrier()
  except KeyboardInterrupt:
    print("jax_sharding_ext: stopped waiting for this cell's effects (interrupted); "
          "their output may appear under a later cell.", file=sys.stderr)
  except Exception as e:  # an effect of this cell failed
    failure = e
  if failure is not None:  # say so in this cell
    print(f"jax_sharding_ext: an effect dispatched by this cell failed: "
          f"{type(failure).__name__}: {failure}", file=sys.stderr)
  _flush()


def _flush() -> None:
  for stream in (sys.stdout, sys.stderr):
    stream.flush()


class IPythonHookEdit(Edit):
  """Registers `_start_of_cell` and `_end_of_cell` with the running IPython
  shell; undoable."""

  name = "IPython post_run_cell hook"

  def __init__(self):
    self.shell = None

  def _apply(self) -> None:
    shell = jax_frames.ipython_shell()
    if shell is not None:
      shell.events.register("pre_run_cell", _start_of_cell)
      shell.events.register("post_run_cell", _end_of_cell)
    self.shell = shell

  def _revert(self) -> None:
    if self.shell is not None:
      self.shell.events.unregister("pre_run_cell", _start_of_cell)
      self.shell.events.unregister("post_run_cell", _end_of_cell)
    self.shell = None


EDITS = [IPythonHookEdit()]
