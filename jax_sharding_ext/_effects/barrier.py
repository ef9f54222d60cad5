"""`effects_barrier()`: wait for the effects every thread has dispatched.

`jax.effects_barrier()` waits only for the calling thread's runtime tokens
(`dispatch.runtime_tokens` is a `threading.local`). On `install()` it is
replaced by a tracked token set (`_jax/tokens.py`) that also records each
thread's state, so `effects_barrier()` can wait for every thread's pending
ordered effects too. `uninstall()` puts the original back.
"""

from __future__ import annotations

import jax

from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import tokens as jax_tokens

EDITS = [jax_tokens.RuntimeTokensEdit()]


def effects_barrier() -> None:
  """Wait until every effect already dispatched, on every device, has run.

  `jax.effects_barrier()` waits for the effects dispatched by the calling
  thread (and raises if one of them failed). This also waits for those
  dispatched by every other thread; their failures are left for those
  threads' own barriers.

  A failure is reported once: the barrier that raises it also forgets it, and
  later ordered effects start afresh (after an asynchronous failure on
  several devices, stock JAX raises it at every barrier and fails every later
  computation with the same ordered effect).

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> @jax.jit
    ... def step(x):
    ...   jax.debug.print("total {t}", t=x.sum(), ordered=True)   # on 8 devices
    ...   return x + 1
    >>> x = jax.device_put(np.arange(8.0), jax.sharding.NamedSharding(mesh, P('x')))
    >>> y = step(x); effects_barrier()   # the print has run when it returns
    total 28.0
  """
  if jax_frames.in_host_callback():
    # Called from inside a host callback: the computation running it cannot
    # finish first, so wait only for what stock's barrier waits for there
    # (this thread's own effects: none).
    jax.effects_barrier()
    return
  try:
    jax.effects_barrier()
  finally:  # this thread's failure is raised after the wait, not instead
    for token in jax_tokens.other_threads_pending_tokens():
      try:
        token.block_until_ready()
      except jax.errors.JaxRuntimeError:
        pass  # reported to the thread that dispatched it
