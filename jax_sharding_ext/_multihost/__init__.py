"""What `multihost_utils` adds to stock's functions: the checks of the
conversions' arguments (`checks`), and the agreement of processes on a
pytree before a collective, with the comparison of its values (`agree`).

The public functions, and the zero-copy conversion of GDA leaves at stock's
boundary, are in `jax_sharding_ext/multihost_utils.py`.
"""
