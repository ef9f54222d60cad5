"""JAX config flags and thread state that have no public constructor or reader.

Touches: `jax._src.config` (`bool_state`, `config_states`, absl flags),
`jax._src.lib.guard_lib` (the explicit device_put thread state),
`jax._src.xla_bridge` (`_backends`), `jax._src.mesh` (the `with mesh:`
stack). Checked against JAX 0.10.2 (Python 3.11) and 0.12.0.1 (Python 3.12), and on JAX 0.8.3 and 0.9.2 (Python 3.11)
and 0.11.2 (Python 3.12).

What breaks first when JAX changes: `config.bool_state`'s keywords (flag
definition at import), or the name of the thread-state field
`explicit_device_put`.
"""

from __future__ import annotations

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
