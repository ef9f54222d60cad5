"""The mesh code runs under, whichever way it was entered.

GDA-era code asked `maps.thread_resources.env.physical_mesh` for the mesh of
the enclosing `with mesh:`. That reads the legacy mesh context only: under
`jax.set_mesh(mesh)` (what today's JAX and flax use, and what the porting
assistant makes of `with mesh:`) it is empty. `current_mesh()` sees both.
"""

from __future__ import annotations

import functools

import numpy as np
from jax.sharding import Mesh

from jax_sharding_ext._jax import config as jax_config


@functools.cache
def _empty_mesh() -> Mesh:
  return Mesh(np.empty((), dtype=object), ())


def current_mesh() -> Mesh:
  """Return the mesh of the enclosing `with mesh:` or `with jax.set_mesh(mesh):`.

  The innermost legacy `with mesh:` on this thread wins over `jax.set_mesh`'s
  mesh. Works inside `jax.jit` (while tracing) as outside. Without either it
  returns an empty `Mesh` (`.empty` is True, `.shape` is empty), as
  `thread_resources.env.physical_mesh` did, so GDA-era checks such as
  `current_mesh().devices.shape != ()` keep their meaning.

  Example:
    >>> import jax, jax_sharding_ext, numpy as np
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    >>> with jax.set_mesh(mesh):
    ...   assert jax_sharding_ext.current_mesh() == mesh
    >>> jax_sharding_ext.current_mesh().empty
    True
  """
  mesh = jax_config.context_mesh()
  return _empty_mesh() if mesh is None else mesh
