"""Errors from bad input show the user's line and the package's message, not
the package's frames: public entry points are JAX API boundaries and the
package's directory is one of JAX's traceback exclusions (JAX's own
filtering, so `jax_traceback_filtering` governs it)."""

import os
import traceback

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, multihost_utils
from jax_sharding_ext._jax import tracebacks as jax_tracebacks

PKG = os.path.dirname(jse.__file__)


def _frames(call):
  with pytest.raises(Exception) as info:
    call()
  return info.value, [f.filename for f in traceback.extract_tb(info.value.__traceback__)]


@pytest.mark.parametrize("call", [
    lambda m: GlobalDeviceArray.from_callback((8.0, 2), m, P("x"), lambda i: None),
    lambda m: GlobalDeviceArray.from_callback((8, 2), m, P("z"), lambda i: None),
    lambda m: GlobalDeviceArray((8, 2), m, P("x"), [1, 2]),
    lambda m: GlobalDeviceArray.from_jax_array(np.ones(3)),
    lambda m: jse.get_shard_indices((7, 2), m, P("x")),
    lambda m: jse.pjit(lambda x: x, in_axis_resources=(), out_axis_resources=None)(1.0),
    lambda m: multihost_utils.host_local_array_to_global_array(np.ones((3, 2)), m, P("x")),
    lambda m: jse.sharded_callback(print, [1, 2], sharding="junk"),
], ids=["float shape", "unknown axis", "bad buffers", "not an array", "indivisible",
        "pjit () specs", "indivisible local batch", "sharded_callback junk"])
def test_bad_input_shows_the_users_line_not_package_frames(mesh_2d, call):
  err, files = _frames(lambda: call(mesh_2d))
  assert isinstance(err, TypeError | ValueError), err
  assert files and files[-1] == __file__, files  # the user's line is the last frame
  assert not [f for f in files if f.startswith(PKG)], files
  assert any("JAX has removed its internal frames" in n for n in err.__notes__)


def test_filtering_off_keeps_every_frame(mesh_2d):
  prev = jax.config.jax_traceback_filtering
  jax.config.update("jax_traceback_filtering", "off")
  try:
    _, files = _frames(lambda: GlobalDeviceArray.from_callback((8.0, 2), mesh_2d, P("x"), id))
  finally:
    jax.config.update("jax_traceback_filtering", prev)
  assert [f for f in files if f.startswith(PKG)], files


def test_uninstall_removes_the_exclusion_exactly(fresh_registry):
  from jax._src import traceback_util

  assert jax_tracebacks.PACKAGE_DIR == PKG
  before = list(traceback_util._exclude_paths)
  assert before.count(jax_tracebacks.PACKAGE_DIR) == 1
  jse.uninstall()
  assert jax_tracebacks.PACKAGE_DIR not in traceback_util._exclude_paths
  assert traceback_util._exclude_paths == [p for p in before if p != jax_tracebacks.PACKAGE_DIR]
  jse.install()
  assert traceback_util._exclude_paths == before
