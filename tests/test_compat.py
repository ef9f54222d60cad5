"""The compatibility layer: version gate and the branches taken here."""

import jax
import pytest

from jax_sharding_ext import _jax


def test_the_version_gate_reads_the_installed_jax():
  assert _jax.JAX_VERSION == tuple(int(p) for p in jax.__version__.split(".")[:3])
  assert _jax.MIN_JAX <= _jax.JAX_VERSION < _jax.MAX_JAX_EXCLUSIVE


@pytest.mark.parametrize("version", [(0, 4, 30), (0, 7, 2), (0, 8, 2), (0, 13, 0), (1, 0, 0)])
def test_unsupported_versions_fail_clearly(version):
  with pytest.raises(_jax.UnsupportedJaxVersionError, match=r"supports jax >= 0\.8\.3") as e:
    _jax.check_version(version)
  message = str(e.value)
  assert ".".join(map(str, version)) in message
  assert "the newest supported release is 0.12.x" in message
  assert isinstance(e.value, ImportError)
  if version > _jax.MIN_JAX:  # newer than this package knows: how to get it supported
    assert "please report it" in message and "upgrade jax_sharding_ext" in message
  else:
    assert "pip install 'jax>=0.8.3,<0.13'" in message


@pytest.mark.parametrize("version", [(0, 8, 3), (0, 9, 2), (0, 10, 2), (0, 12, 0)])
def test_supported_versions_pass_the_gate(version):
  _jax.check_version(version)


# Guards for the mechanisms that read JAX's own Python frames or private
# registries (`_jax/frames.py`, `_jax/donation.py`, `_jax/dispatch.py`): when
# a JAX release moves one, this names what moved instead of a feature test
# failing somewhere downstream.
FRAGILE = [
    ("frames", "HAS_HOST_CALLBACK_FRAMES",
     "jax._src.callback.emit_python_callback's nested callback functions (effects_barrier "
     "inside a host callback)"),
    ("frames", "HAS_PMAP_BODY_CODE",
     "the frame of jax._src.pmap that calls pmap's body (pmap keeps rejecting ordered effects)"),
    ("frames", "HAS_AOT_CALL_FRAME",
     "pxla.MeshExecutable.call (AOT executables refuse a GDA of another sharding)"),
    ("frames", "HAS_CACHE_MISS_FRAME",
     "jax._src.pjit._cpp_pjit's `cache_miss` (which jit the output flag applies to)"),
    ("frames", "HAS_ABSTRACTIFY_CODES",
     "jax._src.core.shaped_abstractify and typeof (a GDA met by abstractification while "
     "uninstalled gets the package's error)"),
    ("readers", "HAS_READERS",
     "pxla.lower_sharding_computation and pxla.ExecuteReplicated.__call__ (install() / "
     "uninstall() wait for other threads' lowerings)"),
    ("donation", "HAS_CALL_DONATION_INFO",
     "jax._src.pjit's jit implementation frames holding `donated_invars` (donation of GDAs)"),
    ("dispatch", "HAS_DISPATCH_REGISTRY",
     "jax._src.tree_util.dispatch_registry (GDA calls on jit's C++ fast path)"),
]


@pytest.mark.parametrize("module, name, what", FRAGILE, ids=[n for _, n, _ in FRAGILE])
def test_fragile_mechanisms_still_find_their_jax_hooks(module, name, what):
  import importlib
  value = getattr(importlib.import_module(f"jax_sharding_ext._jax.{module}"), name)
  assert value, f"jax {jax.__version__} moved {what}; update jax_sharding_ext/_jax/{module}.py"
