"""The compatibility layer: version gate and the branches taken here."""

import jax
import pytest

from jax_sharding_ext import _compat


def test_installed_jax_is_supported():
  _compat.check_version()
  print("jax", jax.__version__, "compat JAX_VERSION", _compat.JAX_VERSION)


@pytest.mark.parametrize("version", [(0, 4, 30), (0, 10, 1), (0, 13, 0), (1, 0, 0)])
def test_unsupported_versions_fail_clearly(version):
  with pytest.raises(_compat.UnsupportedJaxVersionError, match=r"supports jax >= 0\.10\.2") as e:
    _compat.check_version(version)
  assert ".".join(map(str, version)) in str(e.value)
  assert isinstance(e.value, ImportError)
