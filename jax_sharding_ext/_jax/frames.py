"""Questions JAX answers only inside its own Python frames, found by code
object: are we inside a host callback, tracing a pmap body, inside an AOT
executable's call, or compiling which jitted function? And the one question
about the user's frames: where is the user's call that made a transfer?

Touches the code objects of `jax._src.callback.emit_python_callback`'s
nested functions, `core.shaped_abstractify` and `core.typeof`,
`jax._src.pmap._cached_shard_map`'s `_fun`, `pxla.MeshExecutable.call` and
`jax._src.pjit._cpp_pjit`'s `cache_miss`.
Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: a renamed function. Each lookup sets a
`HAS_*` flag; when one turns False the feature degrades as documented next
to it, and `tests/test_compat.py` fails naming the JAX function that moved.
"""

from __future__ import annotations

# --- host callbacks and pmap, found by code object ----------------------------
# Two questions with no public answer, both answered from code objects (no
# table exists for either):
#
# * Is this thread inside a host callback? Every host callback (debug
#   callbacks and prints, `io_callback`, `pure_callback`) runs the
#   `_wrapped_callback` closures of `callback.emit_python_callback`, whose
#   frames are then on the stack. `effects_barrier()` needs to know: there it
#   must not wait for the computation that is running it.
# * Was an equation traced inside `jax.pmap`? pmap is `jit(shard_map(_fun))`
#   (`pmap._cached_shard_map`, jax 0.10.2 and 0.12.x), so its body looks like
#   any `shard_map` when lowered; the equation's trace-time traceback
#   (`ctx.traceback.raw_frames()`) contains pmap's `_fun` frame.
# If a JAX release renames these, the `HAS_*` flags below turn False and
# `tests/test_compat.py` names the function that moved.
# ---------------------------------------------------------------------------
import os
import sys
import types
from typing import Any, NamedTuple

import jax
import jaxlib
from jax._src import callback as _callback
from jax._src import core as _core
from jax._src import dtypes as _dtypes
from jax._src import pjit as _pjit
from jax._src import pmap as _pmap
from jax._src.interpreters import pxla as _pxla

from jax_sharding_ext._jax.tracebacks import PACKAGE_DIR


def code_of(owner: Any, name: str) -> Any:
  """The code object of `owner.name` (a function or method), or None."""
  return getattr(getattr(owner, name, None), "__code__", None)


def find_frame(codes: frozenset, frame: Any, max_depth: int | None = None) -> Any:
  """The first of `frame` and its callers (at most `max_depth` of them) that
  runs one of `codes`, or None. Every frame read of this sub-package walks
  the stack here."""
  depth = 0
  while frame is not None and (max_depth is None or depth < max_depth):
    if frame.f_code in codes:
      return frame
    frame = frame.f_back
    depth += 1
  return None


def _nested_codes(fn: Any, name: str) -> frozenset:
  """Code objects named `name` defined (at any depth) inside function `fn`.

  A decorated `fn` (e.g. `util.cache()`'s `memoized_fun`, as
  `pmap._cached_shard_map` is) is searched through the functions its
  closure holds.
  """
  found = set()
  todo = [getattr(fn, "__code__", None)]
  for cell in getattr(fn, "__closure__", None) or ():
    try:
      held = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    if isinstance(held, types.FunctionType):
      todo.append(held.__code__)
  while todo:
    code = todo.pop()
    if code is None:
      continue
    for c in code.co_consts:
      if isinstance(c, types.CodeType):
        if c.co_name == name:
          found.add(c)
        todo.append(c)
  return frozenset(found)


_HOST_CALLBACK_CODES = _nested_codes(getattr(_callback, "emit_python_callback", None),
                                     "_wrapped_callback")
HAS_HOST_CALLBACK_FRAMES = bool(_HOST_CALLBACK_CODES)
"""True when `callback.emit_python_callback`'s `_wrapped_callback` closures were found."""

def _pmap_body_codes() -> frozenset:
  """The code objects on the stack while `jax.pmap` traces its body.

  jax 0.9.0 and later: `_cached_shard_map`'s `_fun`, which calls the body.
  jax 0.8.x (`jax_pmap_shmap_merge`, on by default): the `_handle_reshapes`
  transformation (`lu.transformation2`, a partial over its generator) that
  calls the body inside `_cached_shard_map`'s shard_map.
  """
  codes = _nested_codes(getattr(_pmap, "_cached_shard_map", None), "_fun")
  if codes:
    return codes
  reshapes = getattr(_pmap, "_handle_reshapes", None)
  gen = next(iter(getattr(reshapes, "args", ())), None)
  code = getattr(gen, "__code__", None)
  return frozenset() if code is None else frozenset([code])


_PMAP_BODY_CODES = _pmap_body_codes()
HAS_PMAP_BODY_CODE = bool(_PMAP_BODY_CODES)
"""True when the frame that calls `jax.pmap`'s body (`_pmap_body_codes`) was found."""


def in_host_callback() -> bool:
  """True when the calling thread is running a JAX host callback."""
  return find_frame(_HOST_CALLBACK_CODES, sys._getframe(1)) is not None


def traced_inside_pmap(ctx) -> bool:
  """True when the equation lowered with `ctx` was traced inside `jax.pmap`."""
  tb = getattr(ctx, "traceback", None)
  if tb is None or not _PMAP_BODY_CODES:
    return False
  codes, _ = tb.raw_frames()
  return any(c in _PMAP_BODY_CODES for c in codes)


# --- abstractification that does not know a type ------------------------------
# `core.shaped_abstractify` and `core.typeof` read `x.__jax_array__` only after
# `pytype_aval_mappings` failed to know `type(x)`, and then raise stock's
# ValueError about `__jax_array__`. For a GDA that means the package was
# uninstalled when the table was read, even if a racing `install()` has
# finished since: the GDA's `__jax_array__` then raises the package's
# "uninstalled" error instead (`_array/gda.py`).

# In jax 0.8.x `core.typeof` delegates to `core.get_aval`, which then
# reads `__jax_array__` itself; before jax 0.10.2 `dtypes.canonicalize_value`
# is Python and reads it too (later it is C++, and the canonicalisation entry
# raises the package's error itself, `tables.CanonicalizeEdit`).

_ABSTRACTIFY_CODES = frozenset(c for c in (code_of(_core, "shaped_abstractify"),
                                           code_of(_core, "typeof")) if c is not None)
HAS_ABSTRACTIFY_CODES = len(_ABSTRACTIFY_CODES) == 2
"""True when `core.shaped_abstractify` and `core.typeof` were found."""
_ABSTRACTIFY_CODES |= frozenset(c for c in (code_of(_core, "get_aval"),
                                            code_of(_dtypes, "canonicalize_value"))
                                if c is not None)


def asked_by_abstractification(depth: int = 2) -> bool:
  """True when the caller `depth` frames up is JAX abstractifying a value
  whose type its tables did not know."""
  return sys._getframe(depth).f_code in _ABSTRACTIFY_CODES


# --- output flag: which jit is being compiled --------------------------------
# The GDA-era `jax_parallel_functions_output_gda` flag turned the outputs of
# the user's pjit calls into GDAs, never the results of eager operations. In
# today's JAX every eager operation is a jit too: `x + 1` compiles a jitted
# primitive (`dispatch.apply_primitive`) and most `jax.numpy` functions are
# jitted internally. A result handler is built while its executable is
# compiled, inside the `cache_miss` closure of `pjit._cpp_pjit(fun, ...)`
# (jax 0.10.2 and 0.12.x), whose `fun` is the function being jitted; reading
# it from that frame tells a user's jit from one of JAX's own. Compile time
# only, never per call. Without such a frame (AOT `.lower().compile()`), the
# caller compiled the user's function directly.

_CACHE_MISS_CODES = _nested_codes(getattr(_pjit, "_cpp_pjit", None), "cache_miss")
HAS_CACHE_MISS_FRAME = bool(_CACHE_MISS_CODES)
"""True when `pjit._cpp_pjit`'s `cache_miss` closure (the jit being compiled) was found."""


def jitted_function_being_compiled() -> Any:
  """The Python function of the innermost `jax.jit` cache miss on this thread.

  None when no `jax.jit` call is being dispatched (e.g. AOT compilation).
  """
  frame = find_frame(_CACHE_MISS_CODES, sys._getframe(1))
  return None if frame is None else frame.f_locals.get("fun")


# Which jits are JAX's own? JAX applies `jax.jit` to its own functions in
# three ways, none of them the user's call of a jit: as a decorator on a
# module-level function (`jnp.sin`, `jax.nn.sigmoid`, `lax_numpy._reduce_sum`:
# the module attribute is then the jit, not the function it wraps), on a
# private module-level function at run time, and on functions defined inside
# other functions (`dispatch.apply_primitive`'s `prim_fun`, behind every eager
# `x + 1`). A function JAX defines and exports undecorated (`jax.lax.sin`,
# `jax.nn.gelu`, the `custom_jvp` object `jax.nn.relu`) is jitted only by
# whoever calls `jax.jit` on it: the user.

_JAX_MODULE_PREFIXES = ("jax.", "jaxlib.")


def is_jax_own_jit(fun: Any) -> bool:
  """True when `fun` (the function a jit cache miss compiles) is jitted by
  JAX itself rather than by the user (see above)."""
  if fun is None or hasattr(fun, "lower"):  # a jit of a jit object: the user's
    return False
  module = getattr(fun, "__module__", None) or ""
  if not (module == "jax" or module.startswith(_JAX_MODULE_PREFIXES)):
    return False
  qualname = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or ""
  parts = qualname.split(".")
  if "<locals>" in parts or "<lambda>" in parts or any(p.startswith("_") for p in parts):
    return True
  owner: Any = sys.modules.get(module)
  for part in parts:
    owner = getattr(owner, part, None)
  return owner is not fun  # the module exports a jit of it (or nothing)


# --- AOT calls ----------------------------------------------------------------
# A compiled executable (`jax.jit(...).lower(...).compile()`, also legacy
# `pjit(...).lower(...).compile()`) checks its arguments' shardings in
# `pxla.MeshExecutable.call` (`check_array_xla_sharding_layout_match`), but
# only those of `ArrayImpl` arguments: any other type is resharded silently by
# its shard-arg handler. A GDA's handler runs inside that frame on the AOT
# path and never on the `jax.jit` path (which calls `unsafe_call` directly and
# resolves committed shardings itself), so finding the frame tells the
# handler to apply stock's check instead of resharding. Rare path only: the
# handler looks only when an argument would move.
# ---------------------------------------------------------------------------

_AOT_CALL_CODES = frozenset(
    c for c in [code_of(getattr(_pxla, "MeshExecutable", None), "call")] if c is not None)

HAS_AOT_CALL_FRAME = bool(_AOT_CALL_CODES)
"""True when `pxla.MeshExecutable.call` (the AOT argument check) was found."""


def in_aot_call(max_depth: int = 16) -> bool:
  """True when called (from a shard-arg handler) inside an AOT executable call."""
  return find_frame(_AOT_CALL_CODES, sys._getframe(1), max_depth) is not None


# --- the user's call site -------------------------------------------------------
# Transfer-guard messages, "log" records and ledger records name the user's
# line: the innermost frame outside this package, `jax` and `jaxlib`. Only
# the file name, line and function name are kept, never the frame (a ledger
# record may live long; a frame would keep every local of the call alive).
# They are turned into text (`Cell In[3], line 5`, a relative path) only
# when read (`site_text`).
# ---------------------------------------------------------------------------


class CallSite(NamedTuple):
  """Where a call is: its file name, line number and function name."""

  filename: str
  lineno: int
  function: str


NOT_USER_CODE = tuple(d + os.sep for d in (
    PACKAGE_DIR, os.path.dirname(jax.__file__), os.path.dirname(jaxlib.__file__)))
"""Frames in these directories (this package, `jax`, `jaxlib`) are not the user's."""


def ipython_shell() -> Any:
  """The running IPython shell, if IPython is already imported and running
  (IPython is never imported here)."""
  ipython = sys.modules.get("IPython")
  get = getattr(ipython, "get_ipython", None)
  return get() if get is not None else None


def site_text(site: CallSite | None) -> str:
  """`site` for people: `Cell In[3], line 5` for a notebook cell (as
  IPython's own tracebacks say), else `path:line` with the path relative to
  the working directory when it is inside it."""
  if site is None:
    return "<unknown>:0"
  filename, lineno = site.filename, site.lineno
  cells = getattr(getattr(ipython_shell(), "compile", None), "_filename_map", None)
  if cells and filename in cells:
    return f"Cell In[{cells[filename]}], line {lineno}"
  try:
    rel = os.path.relpath(filename)
  except ValueError:  # another drive (Windows)
    rel = filename
  return f"{filename if rel.startswith('..') else rel}:{lineno}"


def user_call_site(skip: tuple[str, ...] = NOT_USER_CODE) -> CallSite | None:
  """The innermost caller whose file is not under a prefix in `skip`, or None.

  Costs a walk of the few frames between the caller and the user's line
  (~0.2 us for a `np.asarray(gda)`); no text is built.
  """
  f: types.FrameType | None = sys._getframe(1)
  while f is not None and f.f_code.co_filename.startswith(skip):
    f = f.f_back
  if f is None:
    return None
  code = f.f_code
  # `CallSite(...)` without its generated Python `__new__` (a third of the cost).
  return _new_tuple(CallSite, (code.co_filename, f.f_lineno, code.co_name))


_new_tuple = tuple.__new__
