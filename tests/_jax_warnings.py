"""Warnings JAX raises from its own code about its own names, which a test
running a Python with `-W error` passes on (pyproject's `filterwarnings`
lists the same ones for the test process itself)."""

STOCK_WARNINGS_IGNORED = (
    # JAX 0.8.x's own multihost_utils reads its deprecated `jax.sharding.PmapSharding`.
    "-W", "ignore:jax.sharding.PmapSharding is deprecated:DeprecationWarning",
)
"""`python` command-line options: put them after `-W error`."""
