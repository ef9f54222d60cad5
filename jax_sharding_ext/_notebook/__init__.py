"""Jupyter and IPython: the GDA's layout picture (`html`), treescope's view
of a GDA (`treescope`) and the end-of-cell effects barrier (`cell_hook`).
IPython and treescope are never imported here; each is used only when it is
already running. How a user's line is named in a notebook is read with the
user's frames (`_jax/frames.py`).
"""
