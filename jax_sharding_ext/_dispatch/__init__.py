"""How JAX takes a `GlobalDeviceArray`: its entries in JAX's extension tables
(`handlers`), buffer donation and its checks (`donation`), and the
`jax_parallel_functions_output_gda` flag with its result handler (`output`).

jit's C++ fast-path key, which reads reference counts, is in
`_jax/dispatch.py`.
"""
