"""JAX config flags and thread state that have no public constructor or reader.

Touches: `jax._src.config` (`bool_state`, `config_states`, absl flags, the
thread-local values of every option and context), `jax._src.lib.guard_lib`
(the explicit device_put thread state), `jax._src.xla_bridge` (`_backends`),
`jax._src.mesh` (the `with mesh:` stack; `jax.set_mesh`'s contexts since
jax 0.12). Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: `config.bool_state`'s keywords (flag
definition at import), the name of the thread-state field
`explicit_device_put`, or the thread-local API of `config_ext.Config`
(`get_local` / `swap_local` / `set_local`, checked at import).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from jax._src import config as _config
from jax._src import mesh as _mesh
from jax._src import xla_bridge as _xb
from jax._src.lib import guard_lib as _guard_lib

# ---------------------------------------------------------------------------
# Config flags: `config.bool_state` since jax 0.4.31 (ce0d9e9b9f).
# ---------------------------------------------------------------------------


def define_bool_flag(name: str, default: bool, help: str, *,
                     include_in_jit_key: bool = False,
                     include_in_trace_context: bool = False) -> Any:
  """Define a JAX config flag (env var, absl flag, `jax.config.update`).

  Idempotent: a flag that JAX (or an earlier import of this package) already
  defined is returned as is, since JAX cannot undefine one.
  """
  existing = _config.config_states.get(name)
  if existing is not None:
    return existing
  state = _config.bool_state(name=name, default=default, help=help,
                             include_in_jit_key=include_in_jit_key,
                             include_in_trace_context=include_in_trace_context)
  # `config_with_absl()` defines absl flags for the options that exist when it
  # runs; one defined later has to be added to absl by hand.
  if getattr(_config.config, "use_absl", False):
    _config.config.absl_flags.DEFINE_bool(name, state.value, help)
  return state


# ---------------------------------------------------------------------------
# Transfer-guard thread state: set by `jax.device_put` / `jax.device_get`
# (`config.explicit_device_put_scope` / `explicit_device_get_scope`).
# ---------------------------------------------------------------------------

def in_explicit_device_put() -> bool:
  """True inside `jax.device_put(...)` on this thread."""
  return bool(_guard_lib.thread_local_state().explicit_device_put)


# ---------------------------------------------------------------------------
# Backends (tests check that importing this package initialises none).
# ---------------------------------------------------------------------------


def initialized_backends() -> dict[str, Any]:
  return dict(_xb._backends)


# ---------------------------------------------------------------------------
# The mesh of `with mesh:` (legacy pjit): `Mesh.__enter__` pushes onto
# `mesh.thread_resources` (deprecated public alias
# `jax.interpreters.pxla.thread_resources`, which warns); `jax.set_mesh`
# sets `mesh.get_concrete_mesh()` (public `jax.sharding.get_mesh()`, which
# refuses to run under a trace, hence the internal spelling).
# ---------------------------------------------------------------------------


def context_mesh() -> Any:
  """The mesh of the innermost `with mesh:` on this thread, else `jax.set_mesh`'s.

  Returns None when neither is active.
  """
  mesh = _mesh.thread_resources.env.physical_mesh
  if not mesh.empty:
    return mesh
  mesh = _mesh.get_concrete_mesh()
  return None if mesh is None or mesh.empty else mesh


# ---------------------------------------------------------------------------
# Thread-local settings, carried to the threads this package runs work on.
# Every JAX option (`config_states`: `enable_x64`, `numpy_dtype_promotion`,
# `default_device`, the transfer guards, this package's output flag, ...) and
# every context JAX keeps beside them (`config_ext.Config` objects of
# `jax._src.config` and `jax._src.mesh`: `jax.set_mesh`'s meshes, which
# moved from the first to the second in jax 0.12, `compute_on`, ...; not the
# tracing state of `jax._src.core`, which belongs to a trace) holds a
# value per thread over its global one: `get_local()` reads it
# (`config_ext.unset` when the thread set none), `swap_local` / `set_local`
# set it, as JAX's own context managers do. Some options also mirror it into
# jaxlib's thread state (`_update_thread_local_hook`: the transfer guards,
# which jaxlib judges in C++). `with mesh:` keeps its own stack in
# `mesh.thread_resources`. A new thread starts with none of them, so work
# handed to a helper thread would run under the global settings only.
# ---------------------------------------------------------------------------

_UNSET = _config.config_ext.unset

if not all(hasattr(_config.config_ext.Config, m)
           for m in ("get_local", "swap_local", "set_local")):  # pragma: no cover
  from jax_sharding_ext._jax import UnsupportedJaxVersionError
  raise UnsupportedJaxVersionError(
      "jax_sharding_ext carries JAX's thread-local settings to its helper threads with "
      "`config_ext.Config.get_local` / `swap_local` / `set_local`, which this JAX does not "
      "have; please report the version.")


def _thread_configs() -> list[Any]:
  """Every option and context with a per-thread value, each once (options
  defined after import, like this package's own, included)."""
  found: dict[int, Any] = {}
  for value in (*_config.config_states.values(), *vars(_config).values(),
                *vars(_mesh).values()):
    if isinstance(value, _config.UserConfig):
      value = value._obj
    if isinstance(value, _config.config_ext.Config):
      found.setdefault(id(value), value)
  return list(found.values())


class ThreadSettings:
  """One thread's local JAX settings (see `thread_settings`)."""

  __slots__ = ("values", "mesh_stack")

  def __init__(self, values: tuple[tuple[Any, Any], ...], mesh_stack: tuple[Any, ...]):
    self.values = values
    self.mesh_stack = mesh_stack


def thread_settings() -> ThreadSettings:
  """The calling thread's local JAX settings: what `applied` gives another thread."""
  values = tuple((c, v) for c in _thread_configs() if (v := c.get_local()) is not _UNSET)
  return ThreadSettings(values, tuple(_mesh.thread_resources.stack))


def _set_local(config: Any, value: Any) -> Any:
  prev = config.swap_local(value)
  hook = getattr(config, "_update_thread_local_hook", None)
  if hook is not None:
    hook(None if value is _UNSET else value)
  return prev


@contextlib.contextmanager
def applied(settings: ThreadSettings) -> Iterator[None]:
  """Run the block on this thread under `settings` (taken on another thread
  by `thread_settings`), as if that thread ran it; then put this thread's
  own settings back."""
  resources = _mesh.thread_resources
  stack, env = resources.stack, resources.env
  done: list[tuple[Any, Any]] = []
  try:
    for config, value in settings.values:
      done.append((config, _set_local(config, value)))
    resources.stack = list(settings.mesh_stack)
    resources.env = resources.stack[-1]
    yield
  finally:
    resources.stack, resources.env = stack, env
    for config, prev in reversed(done):
      _set_local(config, prev)
