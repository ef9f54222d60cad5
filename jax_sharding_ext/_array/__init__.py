"""The `GlobalDeviceArray` type: the class (`gda`), its construction from
data callbacks (`construct`) and checks (`checks`), the `jax.Array` surface
it forwards to its view (`surface`), the GDA-era shard math (`shard_math`),
its small records (`records`: `Shard`, `FROM_GDA`, the shape tuple), and
which `jax.Array` objects share its buffers (`family`).

How JAX takes a GDA (table handlers, donation, the output flag) is in
`_dispatch/`; where its data moves, in `_transfers/`.
"""
