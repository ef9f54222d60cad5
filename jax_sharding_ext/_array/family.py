"""Which GDAs share their device buffers with arrays outside them.

A GDA keeps a private `jax.Array` (`gda._arr`) that it never hands out. While
no other array holds its buffers, no other argument of a call can alias them,
and jit's C++ fast path needs no check (`_jax/dispatch.py`).

A GDA's buffers become *shared* as soon as a `jax.Array` over them exists
outside the GDA: one it hands out (`to_jax_array()`, `jnp.asarray(gda)`,
`local_shards`' data, DLPack), one it was made from (`from_jax_array`, the
constructor's `device_buffers`, a data callback returning arrays already on
their devices), or one stock made over them (`jax.device_put` onto an
equivalent sharding). From then on stock JAX can make more arrays over the
same buffers without the package seeing it (`jax.device_put` of that array
onto an equivalent sharding of another `Mesh`, `make_array_from_single_device_arrays`
of its shards, ...), so a shared GDA stays shared for as long as it lives:
the donation check compares buffer addresses (`_jax/buffers.py`) of its calls'
arrays, and a warm call reuses a cached executable only if no alias could
hurt it.
"""

from __future__ import annotations

from typing import Any

from jax_sharding_ext._jax import buffers as jax_buffers
from jax_sharding_ext._jax import dispatch as jax_dispatch


def mark_shared(gda: Any) -> None:
  """Record that arrays outside `gda` may hold its buffers (for good).

  From then on jit's dispatch keys it (`_jax/dispatch.py`) and watches each
  of its buffers for deletion by those arrays, reading `gda._later` (the
  private array's later shards, read on first use).
  """
  jax_dispatch.mark_keyed(gda, shared=True)


def is_shared(gda: Any) -> bool:
  """Whether arrays outside `gda` may hold its buffers."""
  return gda._node is not None and gda._shared


def handed_out(gda: Any, arr: Any) -> Any:
  """A new `jax.Array` over `arr`'s buffers, `gda` marked shared.

  `arr` is the GDA's private array (for `to_jax_array`) or the array a GDA is
  made from (for `from_jax_array`).
  """
  sibling = jax_buffers.sibling(arr)
  mark_shared(gda)
  return sibling
