"""The machinery behind the public `serialization` module: the GDA-era
metadata, checks, commit markers and event-loop running (`metadata`), and
the two calling conventions of the old deserialization functions (`args`).
Needs tensorstore, an optional extra; `serialization` imports it first and
names the extra when it is missing.
"""
