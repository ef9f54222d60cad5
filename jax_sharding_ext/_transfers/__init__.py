"""Every transfer of a GDA's data: where it happens (`moves`), how JAX's
transfer guard judges it (`guard`), and the transfer ledger that records it
(`ledger`).

This capability registers nothing in JAX: its functions are called by the
GDA's methods and by its table handlers (`_dispatch/handlers.py`).
"""
