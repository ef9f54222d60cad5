"""Jupyter and IPython: the GDA's layout picture (`html`), treescope's view
of a GDA (`treescope`), the end-of-cell effects barrier (`cell_hook`), and
how a user's line is named in a notebook (`ipython`). IPython and treescope
are never imported here; each is used only when it is already running.
"""
