"""The public surface: `__all__` matches the exports; internals stay internal."""

import pathlib
import re
import subprocess
import sys

import pytest

import jax_sharding_ext

PKG = pathlib.Path(jax_sharding_ext.__file__).parent


def test_all_matches_public_names():
  module = type(jax_sharding_ext)

  def is_public(name):
    value = getattr(jax_sharding_ext, name)
    if name.startswith("_"):
      return False
    # Public submodules (multihost_utils), not imported modules such as `jax`.
    return (not isinstance(value, module)
            or value.__name__ == f"jax_sharding_ext.{name}")
  # Modules needing an optional extra stay out of `__all__` (so that
  # `from jax_sharding_ext import *` works without it); they are attributes
  # only once imported.
  optional = {"serialization", "orbax_support", "port"}
  public = {n for n in dir(jax_sharding_ext) if is_public(n)} - optional
  assert set(jax_sharding_ext.__all__) == public
  assert not optional & set(jax_sharding_ext.__all__)
  for name in jax_sharding_ext.__all__:
    assert getattr(jax_sharding_ext, name) is not None


def test_only_the_jax_home_touches_jax_src():
  pattern = re.compile(r"(^|[^.\w])jax\._src|from jax\._src|import jax\._src")
  home = PKG / "_jax"
  offenders = [p.name for p in PKG.rglob("*.py")
               if home not in p.parents and pattern.search(p.read_text())]
  assert offenders == []
  assert pattern.search((home / "tables.py").read_text())  # the home is where it looks


def test_version_is_the_installed_distributions():
  """`__version__` is what pip installed (the wheel's metadata reads it from
  `_version.py`), and `__version_info__` its parts."""
  from importlib import metadata
  assert jax_sharding_ext.__version__ == metadata.version("jax-sharding-ext")
  assert re.fullmatch(r"\d+\.\d+\.\d+", jax_sharding_ext.__version__)
  assert jax_sharding_ext.__version_info__ == tuple(
      int(p) for p in jax_sharding_ext.__version__.split("."))


@pytest.mark.parametrize("module, blocked", [
    ("serialization", ["tensorstore"]),
    ("orbax_support", ["orbax", "orbax.checkpoint"]),
])
def test_optional_module_without_its_extra_names_the_extra(module, blocked):
  code = (f"import sys; {'; '.join(f'sys.modules[{b!r}] = None' for b in blocked)}\n"
          "import jax_sharding_ext\n"
          f"try:\n  from jax_sharding_ext import {module}\n"
          "except ImportError as e:\n  print('IMPORTERROR', e)\n")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=PKG.parent)
  assert "IMPORTERROR" in res.stdout and "jax-sharding-ext[checkpoint]" in res.stdout, (
      res.stdout, res.stderr)
