"""Sphinx configuration of the jax_sharding_ext documentation.

`make docs` builds it into build/docs with warnings as errors; without make,
`python -m sphinx -W --keep-going -b html docs build/docs` does the same
(after `pip install '.[docs]'`). The example notebooks of examples/ are
copied into docs/examples/ (gitignored) when the build starts and executed
there by myst-nb, so the site shows what they print with the package as it
is. Nothing is fetched from the network: intersphinx reads JAX's inventory
from the committed `_intersphinx/jax.inv` (`_ext/jax_links.py` also links
the JAX names pages write as code), and the theme's assets ship with it.
Every page shows the release it documents (`html_title`).

The build also fails when a public name (an entry of `__all__` of the package
or of one of its public modules) or a public member of one of its classes
has no entry in the API reference, and when
a link, anchor or image inside the built site is broken (`_ext/local_links.py`).
The benchmark figures and tables come from `benchmarks/results.json`, the
data `make bench` saves (`_ext/bench_figures.py`).
"""

import dataclasses
import importlib
import inspect
import os
import pathlib
import re
import shutil
import sys
import tomllib
import warnings

from sphinx.deprecation import RemovedInSphinx10Warning
from sphinx.util import logging

DOCS = pathlib.Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(DOCS / "_ext"))

# Anything the build runs in this process stays on the CPU; the notebooks set
# their own device count in their first cell.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import bench_figures  # noqa: E402
import sphinx_autodoc_typehints  # noqa: E402

import jax_sharding_ext  # noqa: E402

project = "jax_sharding_ext"
author = "the jax_sharding_ext authors"
project_copyright = "the jax_sharding_ext authors"
release = version = jax_sharding_ext.__version__
# Where the site is published: the wheel's "Documentation" link (pyproject).
with open(REPO / "pyproject.toml", "rb") as _f:
  html_baseurl = tomllib.load(_f)["project"]["urls"]["Documentation"]

# On Python 3.11 the newest sphinx-autodoc-typehints (3.6) still calls a Sphinx
# API that Sphinx 10 removes; that is its own deprecation notice, not ours.
warnings.filterwarnings("ignore", category=RemovedInSphinx10Warning,
                        module="sphinx_autodoc_typehints")

extensions = [
  "myst_nb",
  "sphinx.ext.autodoc",
  "sphinx.ext.napoleon",
  "sphinx_autodoc_typehints",
  "sphinx.ext.intersphinx",
  "jax_links",
  "local_links",
]

# JAX's API documentation, from a committed inventory (no network at build).
intersphinx_mapping = {
  "jax": ("https://docs.jax.dev/en/latest/", str(DOCS / "_intersphinx" / "jax.inv")),
}

# No `sphinx.ext.viewcode`: the installed package is its own source, and a
# source view of re-exported stock JAX objects and of generated members would
# show the wrong code or link nowhere.

exclude_patterns = ["_build", "**.ipynb_checkpoints", "_ext", "_generated", "_intersphinx"]

# -- MyST and the notebooks ---------------------------------------------------

myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
myst_heading_anchors = 3

# -- Benchmark figures ----------------------------------------------------------

# Every measured figure the pages show is a substitution (`{{ dispatch }}`)
# drawn from the saved results of the last `make bench`, and the benchmark
# pages include tables written from the same data.
_RESULTS = bench_figures.load()
myst_substitutions = bench_figures.figures(_RESULTS)
bench_figures.write_pages(_RESULTS, DOCS / "_generated")

# `make docs DOCS_EXECUTE=off` skips running the notebooks (their committed
# outputs are shown); the default runs every one on every build.
nb_execution_mode = "force"
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

EXAMPLES = DOCS / "examples"


def _copy_notebooks() -> None:
  """Mirror examples/*.ipynb into docs/examples/ (rewriting only what changed,
  so an unchanged notebook keeps its timestamp)."""
  EXAMPLES.mkdir(exist_ok=True)
  wanted = {p.name: p for p in (REPO / "examples").glob("*.ipynb")}
  for old in EXAMPLES.iterdir():
    if old.name not in wanted:
      old.unlink() if old.is_file() else shutil.rmtree(old)
  for name, src in wanted.items():
    dst = EXAMPLES / name
    if not dst.exists() or dst.read_bytes() != src.read_bytes():
      shutil.copyfile(src, dst)


_copy_notebooks()

# -- API reference --------------------------------------------------------------

autodoc_default_options = {"member-order": "bysource"}
autodoc_inherit_docstrings = False  # a GDA's members say what the GDA does, not jax.Array
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
typehints_document_rtype = True
# The members `GlobalDeviceArray` takes from its parts (`_public.assembled`)
# are annotated in modules that import the class for type checkers only.
autodoc_type_aliases = {"GlobalDeviceArray": "jax_sharding_ext.GlobalDeviceArray"}
# Docstrings write code as `name` (Markdown style): show it as code.
default_role = "literal"
add_module_names = False  # each page names its module

PUBLIC_MODULES = (
  "jax_sharding_ext",
  "jax_sharding_ext.global_device_array",
  "jax_sharding_ext.multihost_utils",
  "jax_sharding_ext.serialization",
  "jax_sharding_ext.orbax_support",
  "jax_sharding_ext.port",
)


# The modules whose classes' members are checked too (the porting assistant's
# `Finding` is documented by its owner as a whole).
MEMBERS_CHECKED = PUBLIC_MODULES[:-1]


def _check_every_public_name_is_documented(app, env) -> None:
  """Warn (an error under -W) for each `__all__` entry without an API entry,
  and for each public member (fields included) of a public class of this
  package without one, under the class's public path."""
  documented = set(env.get_domain("py").objects)
  log = logging.getLogger(__name__)
  for module in PUBLIC_MODULES:
    mod = importlib.import_module(module)
    for name in mod.__all__:
      if f"{module}.{name}" not in documented:
        log.warning("public name %s.%s has no entry in the API reference (docs/api/)",
                    module, name)
      cls = getattr(mod, name)
      if (module in MEMBERS_CHECKED and inspect.isclass(cls)
          and cls.__module__.startswith("jax_sharding_ext")):
        where = f"{cls.__module__}.{cls.__qualname__}"
        for member in sorted(set(_public_members(cls))):
          if f"{where}.{member}" not in documented:
            log.warning("public member %s.%s has no entry in the API reference (docs/api/)",
                        where, member)


def _public_members(cls) -> list[str]:
  fields = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
  return [n for n in dir(cls) if not n.startswith("_")] + fields


# Docstrings are written with Markdown's code spans, where "`GlobalDeviceArray`s"
# is a plural; reST ends a code span only before a space or punctuation, so an
# escaped space (which renders as nothing) goes between the span and the letter.
# Spans are matched left to right as whole tokens (roles and ``literals``
# included), so a closing backtick is never taken for an opening one.
_SPAN = re.compile(r"(:[\w:+-]+:)?(`+)[^`\n]*?\2")


def _close_span(match: re.Match) -> str:
  text, rest = match.group(0), match.string[match.end():match.end() + 1]
  plain = match.group(1) is None and len(match.group(2)) == 1
  return text + "\\ " if plain and (rest.isalnum() or rest == "_") else text


def _markdown_plurals(app, what, name, obj, options, lines) -> None:
  lines[:] = [_SPAN.sub(_close_span, line) for line in lines]


def _signature(app, what, name, obj, options, signature, return_annotation):
  """sphinx-autodoc-typehints' signature, without the `cls` it shows for a
  classmethod whose function is wrapped (JAX's `api_boundary` keeps
  `__wrapped__`, and the extension reads the unwrapped, unbound function).
  Autodoc takes the first handler's answer, so this one runs first."""
  result = sphinx_autodoc_typehints.process_signature(
      app, what, name, obj, options, signature, return_annotation)
  if (result and result[0] and what == "method" and inspect.ismethod(obj)
      and isinstance(obj.__self__, type) and result[0].startswith("(cls")):
    result = ("(" + result[0][len("(cls"):].lstrip(", "), result[1])
  return result


def setup(app):
  # Before sphinx-autodoc-typehints adds its type roles to the docstring.
  app.connect("autodoc-process-docstring", _markdown_plurals, priority=100)
  app.connect("autodoc-process-signature", _signature, priority=400)
  app.connect("env-check-consistency", _check_every_public_name_is_documented)


# -- HTML -------------------------------------------------------------------------

html_theme = "sphinx_book_theme"
html_title = f"jax_sharding_ext {release}"  # every page shows the release it documents
html_theme_options = {
  "show_toc_level": 2,
  "use_download_button": True,
}
html_last_updated_fmt = None
