"""The `jax_parallel_functions_output_gda` flag and the result handler behind it.

With the flag on, every output of the user's `jax.jit` / `pjit` calls whose
sharding is a `NamedSharding` comes back as a `GlobalDeviceArray` (0-d
included). As with the old flag, eager operations stay `jax.Array`: `x + 1`,
`jnp.sum(x)` (JAX runs them as jits of its own functions, told apart when the
executable is compiled), and so
do outputs on a single device without a mesh and the result of
`jax.device_put`.

Which jits are the user's is decided per call of a jit (`jax_frames.is_jax_own_jit`):
a function JAX defines follows the flag when the user jits it
(`jax.jit(jax.nn.relu)`, `jax.jit(jax.lax.sin)`), as do JAX's functions
called inside the user's jitted function (they are part of its program).

The flag is part of JAX's jit cache key and trace context
(`include_in_jit_key`, `include_in_trace_context`): the result handler is
chosen when an executable is compiled, so flipping the flag has to select a
different executable from every cache (the C++ dispatch cache and the Python
lowering/compilation caches), or a cached one would keep returning the old
type. An AOT `Compiled` (`jit(f).lower(x).compile()`) keeps the flag it was
compiled under, as in the GDA era, while the package is installed: after
`uninstall()` no GDA comes out of anything, so its outputs are `jax.Array`s
then (`uninstall()` cannot reach a `Compiled` the user holds).
"""

from __future__ import annotations

from jax.sharding import NamedSharding

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._edit import STATE
from jax_sharding_ext._jax import config as jax_config
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tables as jax_tables

FLAG_NAME = "jax_parallel_functions_output_gda"

parallel_functions_output_gda = jax_config.define_bool_flag(
    FLAG_NAME,
    default=False,
    help=(
        "If True, outputs of jax.jit / pjit with a NamedSharding are returned "
        "as jax_sharding_ext.GlobalDeviceArray instead of jax.Array. Default "
        "False. Defined by jax_sharding_ext (stock JAX removed this GDA-era "
        "flag); it has no effect after jax_sharding_ext.uninstall()."),
    include_in_jit_key=True,
    include_in_trace_context=True,
)
"""Context manager and state of the flag: `with parallel_functions_output_gda(True):`."""

jax_array = jax_config.define_bool_flag(
    "jax_array",
    default=False,
    help=(
        "GDA-era switch between GlobalDeviceArray and jax.Array code paths. "
        "Code written for JAX 0.3.18-0.4.x reads `jax.config.jax_array` and "
        "takes its GlobalDeviceArray branch when it is False (the default "
        "here, as in those releases), its jax.Array branch when True. Defined "
        "by jax_sharding_ext (stock JAX removed it); nothing in JAX or this "
        "package reads it."),
)
"""The GDA-era `jax_array` option: read only by the user's own code."""


def _wrap_output(arr):
  return GlobalDeviceArray._wrap(arr) if STATE.installed else arr


def result_handler(aval, sharding, committed):
  """Wraps whatever `ShapedArray` result handler was there before `install()`
  (JAX's own, normally): GDAs with the flag on, its own outputs otherwise."""
  handler = _EDIT.prev(aval, sharding, committed)
  if (parallel_functions_output_gda.value
      and isinstance(sharding, NamedSharding)
      and not sharding.mesh.empty
      and jax_tables.is_plain_dtype(aval.dtype)
      and not jax_config.in_explicit_device_put()
      and not jax_frames.is_jax_own_jit(jax_frames.jitted_function_being_compiled())):
    return handler.wrap(_wrap_output)
  return handler


_EDIT = jax_tables.TableEdit("global_result_handlers", jax_tables.global_result_handlers,
                             jax_tables.ShapedArray, result_handler)
# A `Compiled` follows the flag as it was when it was compiled, as in the GDA
# era: its result handlers are chosen then, not at its first call.
EDITS = [_EDIT, jax_tables.EagerResultHandlersEdit()]
