"""Legacy `pjit` over stock `jax.jit`: what is known before the call
(`spec`: a frozen `PjitSpec`), what each call resolves (`resolve`: pure
functions of the spec, the context mesh and the arguments), and the function
users call with its cache of `jax.jit`s (`api`).
"""
