"""The donation vector of the running call.

Touches the code objects of `jax._src.pjit`'s jit implementation functions
(`_run_python_pjit`, ...), and `jax.stages.Compiled.__call__`. Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the names of the frame locals holding
`donated_invars` / the argument names; `HAS_CALL_DONATION_INFO` turns False
and `tests/test_compat.py` names the function that moved.
"""

from __future__ import annotations

import dataclasses

# ---------------------------------------------------------------------------
# Which arguments of the running call are donated (`jax.jit(...,
# donate_argnums=...)`, `donate_argnames`, legacy `pjit(donate_argnums=...)`).
#
# jax 0.10.2 and 0.12.x hand *every* jit argument to `shard_arg_handlers` with
# `ArrayCopySemantics.REUSE_INPUT` (`pxla.InputsHandler`), donated or not: the
# donation itself is applied afterwards by PjRt inside `execute_sharded`. So a
# handler cannot tell from its `copy_semantics` that an argument is donated,
# and PjRt's check for `f(donate(a), a)` ("Attempt to use a buffer that was
# previously donated in the same call") fails on some partitions and then
# crashes the process (measured: SIGSEGV with 8 CPU devices, jax 0.10.2).
#
# The donation vector of the running call is a local of the Python frames that
# dispatch it, which are on the stack whenever a GDA reaches its shard-arg
# handler (warm calls on jit's C++ fast path do not; `dispatch.view_flatten`
# sends the risky ones back to this Python path):
# * `pjit._pjit_call_impl_python(*args, donated_invars=...)` (top-level
#   `jax.jit` calls) and `pjit._pjit_call_impl` (`jit_p.bind`, e.g. under
#   `jax.debug_key_reuse`): `args` and `donated_invars` align one to one;
#   `pjit._run_python_pjit`'s `p.arg_names` names the non-constant ones.
# * `stages.Compiled.__call__` (AOT `jit(f).lower(...).compile()(...)`): the
#   public `Compiled.donate_argnums` (flat indices) over the flattened
#   `(args, kwargs)`.
# Arguments the function does not use are pruned before the executable runs
# (`MeshExecutable._kept_var_idx`, numbering the hoisted constants
# (`sharded_const_args` / `Compiled._params.const_args`) first); only the
# kept ones reach the executable, so only they can alias.
# No public API exposes this; a JAX that renames these functions makes
# `HAS_CALL_DONATION_INFO` False and the check is skipped (stock behaviour).
# ---------------------------------------------------------------------------
import inspect
import sys
from typing import Any

import jax
import jax.stages as _stages
from jax._src import api_util as _api_util
from jax._src import pjit as _pjit

from jax_sharding_ext._jax.frames import code_of, find_frame


def _codes(*codes: Any) -> frozenset:
  return frozenset(c for c in codes if c is not None)


_DN_JIT_IMPL_CODES = _codes(code_of(_pjit, "_pjit_call_impl_python"),
                            code_of(_pjit, "_pjit_call_impl"))
# The frame holding `p` (`p.arg_names`): `_run_python_pjit` since jax 0.9.0,
# `_python_pjit_helper` in jax 0.8.x.
_DN_RUN_PYTHON_PJIT_CODES = _codes(code_of(_pjit, "_run_python_pjit"),
                                   code_of(_pjit, "_python_pjit_helper"))
_DN_COMPILED_CALL_CODES = _codes(code_of(getattr(_stages, "Compiled", None), "__call__"))

HAS_CALL_DONATION_INFO = bool(_DN_JIT_IMPL_CODES)
"""True when the jit dispatch frames that carry the donation vector were found."""


def _jit_counts_negative_argnums() -> bool:
  """Whether this JAX's `jax.jit` counts a negative `donate_argnums` from the
  end of the function's positional parameters (jax 0.12: `resolve_argnums`
  does) or matches no argument with it (jax 0.10.2). Asked of
  `api_util.resolve_argnums` itself, with a function of two parameters."""
  def two(a, b):
    del a, b
  try:
    donate = _api_util.resolve_argnums(two, inspect.signature(two), -1, None, None, None)[0]
  except Exception:  # pragma: no cover - a JAX that resolves differently
    return False
  return tuple(donate) == (1,)


JIT_COUNTS_NEGATIVE_ARGNUMS = _jit_counts_negative_argnums()
"""True when `jax.jit(f, donate_argnums=-1)` donates the last argument."""


@dataclasses.dataclass(frozen=True)
class CallDonation:
  """The flat arguments of the running jit call and which of them are donated."""

  args: tuple
  donated: tuple
  names: tuple | None  # one per entry of `args` ('' when unknown), or None


def _dn_arg_names(frame: Any, n_args: int) -> tuple | None:
  frame = find_frame(_DN_RUN_PYTHON_PJIT_CODES, frame.f_back, 4)
  if frame is None:
    return None
  names = getattr(frame.f_locals.get("p"), "arg_names", None)
  if names is None or len(names) > n_args:
    return None
  return ("",) * (n_args - len(names)) + tuple(names)  # constants come first


def current_call_donation(max_depth: int = 24) -> CallDonation | None:
  """Donation info of the jit call being dispatched on this thread, or None.

  Meant to be called from inside a `shard_arg_handlers` entry.
  """
  frame = find_frame(_DN_JIT_IMPL_CODES | _DN_COMPILED_CALL_CODES, sys._getframe(1),
                     max_depth)
  if frame is None:
    return None
  loc = frame.f_locals
  if frame.f_code in _DN_JIT_IMPL_CODES:
    args, donated = loc.get("args"), loc.get("donated_invars")
    if args is None or donated is None or len(args) != len(donated):
      return None
    names = _dn_arg_names(frame, len(args))
    # The constants handed to the executable first: `sharded_const_args`
    # since jax 0.10.1, `computation.const_args` before.
    const_args = loc.get("sharded_const_args")
    if const_args is None:
      const_args = getattr(loc.get("computation"), "const_args", None)
    kept = _kept(getattr(loc.get("compiled"), "_kept_var_idx", None), const_args, len(args))
  else:
    compiled = loc.get("self")  # `stages.Compiled.__call__`
    args = jax.tree_util.tree_leaves((loc.get("args", ()), loc.get("kwargs", {})))
    try:
      donate = set(compiled.donate_argnums)
    except Exception:  # pragma: no cover - a Compiled without args_info
      return None
    donated, names = [i in donate for i in range(len(args))], None
    kept = _kept(getattr(getattr(compiled, "_executable", None), "_kept_var_idx", None),
                 getattr(getattr(compiled, "_params", None), "const_args", None), len(args))
  if kept is not None:  # only what the executable receives can alias
    args = [a for a, k in zip(args, kept, strict=True) if k]
    donated = [d for d, k in zip(donated, kept, strict=True) if k]
    names = None if names is None else tuple(n for n, k in zip(names, kept, strict=True) if k)
  return CallDonation(tuple(args), tuple(donated), names)


def _kept(kept_var_idx: Any, const_args: Any, n_args: int) -> list[bool] | None:
  """Which of the call's `n_args` arguments the executable receives.

  jit drops the arguments its function does not use (`keep_unused=False`)
  before handing the rest to `shard_arg_handlers`; `kept_var_idx` numbers the
  executable's parameters, the hoisted constants (`const_args`) first. None
  when either could not be read (then every argument counts).
  """
  if kept_var_idx is None or const_args is None:
    return None
  n_const = len(const_args)
  return [i + n_const in kept_var_idx for i in range(n_args)]
