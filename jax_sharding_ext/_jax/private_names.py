"""Names inside JAX's private `jax._src` package that GDA-era code imported,
for the porting assistant (`jax_sharding_ext.port`), which rewrites or
reports them. Data only: nothing here is imported from JAX.

Checked against JAX 0.10.2 and 0.12.0.1 (none of them exists there any more,
except `thread_resources`).
"""

from __future__ import annotations

MESH_PSPEC_SHARDING = (
    "jax._src.sharding.MeshPspecSharding",
    "jax._src.sharding_impls.MeshPspecSharding",
)
"""Where GDA-era code found `MeshPspecSharding` (today `NamedSharding`)."""

UTIL_PROD = "jax._src.util.prod"
"""The private `prod` helper (today `math.prod`)."""

THREAD_RESOURCES = "jax._src.mesh.thread_resources"
"""The mesh of `with mesh:`, which `jax.set_mesh` does not set."""
