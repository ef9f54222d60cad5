"""The public surface: `__all__` matches the exports; internals stay internal."""

import pathlib
import re

import jax_sharding_ext

PKG = pathlib.Path(jax_sharding_ext.__file__).parent


def test_all_matches_public_names():
  public = {n for n in dir(jax_sharding_ext)
            if not n.startswith("_") and not isinstance(getattr(jax_sharding_ext, n),
                                                        type(jax_sharding_ext))}
  assert set(jax_sharding_ext.__all__) == public
  for name in jax_sharding_ext.__all__:
    assert getattr(jax_sharding_ext, name) is not None


def test_only_compat_touches_jax_src():
  pattern = re.compile(r"(^|[^.\w])jax\._src|from jax\._src|import jax\._src")
  offenders = [p.name for p in PKG.rglob("*.py")
               if p.name != "_compat.py" and pattern.search(p.read_text())]
  assert offenders == []


def test_version():
  assert jax_sharding_ext.__version__ == ".".join(map(str, jax_sharding_ext.__version_info__))
