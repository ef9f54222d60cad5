"""`python -m jax_sharding_ext.port PATH...` and the `jax-sharding-ext-port` console script."""

import sys

from jax_sharding_ext.port._cli import main

__all__ = ["main"]

if __name__ == "__main__":
  sys.exit(main())
