"""Test setup: 8 virtual CPU devices, set before any JAX backend starts.

XLA reads `--xla_force_host_platform_device_count` when the CPU backend is
initialised, so it must be in `XLA_FLAGS` before the first JAX operation;
importing `jax` earlier is harmless, calling `jax.devices()` is not. The
user's other XLA flags are kept.
"""

import os
import re

N_DEVICES = int(os.environ.get("JSE_TEST_DEVICES", "8"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                os.environ.get("XLA_FLAGS", "")).split()
os.environ["XLA_FLAGS"] = " ".join(
    [f"--xla_force_host_platform_device_count={N_DEVICES}", *_flags])

import _fuzz  # noqa: E402  (the hypothesis profiles: "ci", and "fuzz" for make fuzz)
import _isolated  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import jax_sharding_ext  # noqa: E402  (installs the handlers)


def pytest_sessionfinish(session, exitstatus):
  _isolated.close()  # the child that ran risky examples
  _fuzz.verify_found()  # each failure `make fuzz` saved fails on its own, or is saved with its past


@pytest.fixture(scope="session")
def devices():
  devs = jax.devices()
  assert len(devs) >= N_DEVICES, (
      f"Tests need {N_DEVICES} devices but JAX sees {len(devs)}; the CPU "
      "backend was initialised before conftest.py set XLA_FLAGS.")
  return devs[:N_DEVICES]


@pytest.fixture
def mesh_2d(devices):
  return Mesh(np.array(devices).reshape(4, 2), ("x", "y"))


@pytest.fixture
def mesh_1d(devices):
  return Mesh(np.array(devices), ("x",))


@pytest.fixture
def mesh_factory(devices):
  def make(shape, names):
    n = int(np.prod(shape))
    return Mesh(np.array(devices[:n]).reshape(shape), names)
  return make


@pytest.fixture
def fresh_registry():
  """Run a test that uninstalls/installs, leaving the package installed."""
  yield
  jax_sharding_ext.install()


@pytest.fixture(autouse=True)
def _output_flag_off():
  """Every test starts with the output flag at its default (off)."""
  jax.config.update("jax_parallel_functions_output_gda", False)
  yield
  jax.config.update("jax_parallel_functions_output_gda", False)
