"""GDA arguments take jit's C++ fast path, as jax.Array arguments do."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import test_util as jtu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext
from jax_sharding_ext import GlobalDeviceArray
from jax_sharding_ext._jax import dispatch as jax_dispatch


def _gda(mesh, spec=None):
  spec = P("x", "y") if spec is None else spec
  data = np.arange(64, dtype=np.float32).reshape(8, 8)
  return GlobalDeviceArray.from_callback((8, 8), mesh, spec, lambda i: data[i]), data


def _misses(f, *args, calls=5):
  f(*args)  # warm up: the first call always takes the Python path
  with jtu.count_pjit_cpp_cache_miss() as count:
    for _ in range(calls):
      out = f(*args)
  return count(), out


@pytest.mark.parametrize("flag", [False, True])
def test_gda_args_hit_the_cpp_fast_path(mesh_2d, flag):
  assert jax_dispatch.HAS_DISPATCH_REGISTRY
  jax.config.update("jax_parallel_functions_output_gda", flag)
  gda, data = _gda(mesh_2d)
  other, _ = _gda(mesh_2d)
  f = jax.jit(lambda x, y: (x + y, x.sum()))
  misses, out = _misses(f, gda, other)
  assert misses == 0, (
      "warm calls with GDAs no longer hit jit's C++ fast path: check "
      "`_jax/dispatch.view_flatten` (its sole-owner refcount) against this JAX/Python")
  # Outputs rebuilt by the C++ path are the same as the Python path's.
  assert all((type(o) is GlobalDeviceArray) == flag for o in out)
  if flag:
    assert out[0].mesh_axes == P("x", "y") and out[0].mesh == mesh_2d
  np.testing.assert_array_equal(np.asarray(out[0]), 2 * data)


def test_gda_stays_a_leaf_outside_dispatch(mesh_2d):
  gda, _ = _gda(mesh_2d)
  state = {"w": gda, "b": [gda]}
  leaves = jax.tree_util.tree_leaves(state)
  assert all(type(leaf) is GlobalDeviceArray for leaf in leaves)
  assert jax.tree.map(lambda x: x.mesh_axes, state) == {"w": P("x", "y"), "b": [P("x", "y")]}
  leaves, _ = jax_dispatch.dispatch_flatten(gda)
  assert len(leaves) == 1 and type(leaves[0]) is not GlobalDeviceArray
  assert _ptrs(leaves[0]) == _ptrs(gda.to_jax_array())  # the GDA's own buffers


def test_traced_function_sees_a_tracer(mesh_2d):
  gda, _ = _gda(mesh_2d)
  seen = []
  jax.jit(lambda x: seen.append(type(x)) or x)(gda)
  assert len(seen) == 1 and issubclass(seen[0], jax.core.Tracer)


def test_deleted_gda_on_warm_fast_path_gets_our_error(mesh_2d):
  gda, _ = _gda(mesh_2d)
  f = jax.jit(jnp.sin)
  f(gda)
  f(gda)
  gda.delete()
  with pytest.raises(RuntimeError, match="deleted or donated"):
    f(gda)


def test_uninstall_leaves_no_warm_fast_path(mesh_2d, fresh_registry):
  gda, data = _gda(mesh_2d)
  f = jax.jit(lambda x: x * 2)
  np.testing.assert_array_equal(f(gda), 2 * data)
  f(gda)
  jax_sharding_ext.uninstall()
  with pytest.raises(RuntimeError, match="uninstalled"):
    f(gda)
  jax_sharding_ext.install()
  misses, out = _misses(f, gda)
  assert misses == 0
  np.testing.assert_array_equal(out, 2 * data)


def test_flag_outputs_after_uninstall_are_plain_arrays(mesh_2d, fresh_registry):
  arr = jax.device_put(np.ones((8, 8)), NamedSharding(mesh_2d, P("x")))
  f = jax.jit(lambda x: x + 1)
  jax.config.update("jax_parallel_functions_output_gda", True)
  assert type(f(arr)) is GlobalDeviceArray
  jax_sharding_ext.uninstall()
  # The cached executable was built with the GDA result handler; it is dropped.
  assert type(f(arr)) is not GlobalDeviceArray


def _ptrs(x):
  return [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]


def test_shared_buffers_keep_the_fast_path_when_nothing_is_donated(mesh_2d):
  """A GDA whose buffers the program also holds (the array it was made from,
  an array `to_jax_array()` returned, the same GDA twice) dispatches like a
  sole-owner GDA when the function donates nothing, with one cache entry."""
  gda, data = _gda(mesh_2d)
  f = jax.jit(lambda x, y: x + y)
  for args in ((gda, gda), (gda, gda.to_jax_array())):
    misses, out = _misses(f, *args)
    assert misses == 0
    np.testing.assert_array_equal(np.asarray(out), 2 * data)
  x = jax.device_put(data, NamedSharding(mesh_2d, P("x", "y")))
  held = GlobalDeviceArray.from_jax_array(x)  # `x` stays alive
  kept = held.to_jax_array()
  g = jax.jit(lambda v: v * 2)
  misses, out = _misses(g, held)
  assert misses == 0 and kept is not None
  size = g._cache_size()
  for _ in range(500):
    g(held)
  assert g._cache_size() == size
  np.testing.assert_array_equal(np.asarray(g(held)), 2 * data)


@pytest.mark.parametrize("flag", [False, True], ids=["jax.Array state", "GDA state"])
def test_shared_buffers_keep_the_fast_path_next_to_donated_state(mesh_2d, flag):
  """A donating step whose batch GDA shares its buffers with a live
  `jax.Array` stays on the fast path: the donated state cannot be one of
  those (a GDA state has its own buffers; a `jax.Array` state has another
  shape than the batch)."""
  x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh_2d, P("x", "y")))
  batch = GlobalDeviceArray.from_jax_array(x)
  step = jax.jit(lambda state, b: state + b.sum(), donate_argnums=0)
  jax.config.update("jax_parallel_functions_output_gda", flag)
  state = step(step(_gda(mesh_2d)[0], batch), batch)  # warm for `state`'s type
  size = step._cache_size()
  with jtu.count_pjit_cpp_cache_miss() as count:
    for _ in range(20):
      state = step(state, batch)
  assert count() == 0 and step._cache_size() == size
  assert (type(state) is GlobalDeviceArray) == flag
  np.testing.assert_array_equal(np.asarray(state), _gda(mesh_2d)[1] + 22 * 32)


def test_a_donated_gda_with_shared_buffers(mesh_2d):
  """Donating a GDA whose buffers a live `jax.Array` shares stays on the fast
  path when no other argument has its shape, dtype and sharding (so none
  can be that array), and is refused when one is that array."""
  sharding = NamedSharding(mesh_2d, P("x", "y"))
  step = jax.jit(lambda state, b: state + b.sum(), donate_argnums=0)
  batch = jax.device_put(np.ones((8, 4), np.float32), sharding)

  def fresh_held():
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), sharding)
    return GlobalDeviceArray.from_jax_array(x), x

  for _ in range(2):
    g, x = fresh_held()
    step(g, batch)
  with jtu.count_pjit_cpp_cache_miss() as count:
    for _ in range(10):
      g, x = fresh_held()
      out = step(g, batch)
      assert x.is_deleted()  # donated: one array, two names
  assert count() == 0 and step._cache_size() == 1
  np.testing.assert_array_equal(np.asarray(out), np.arange(64).reshape(8, 8) + 32)

  same = jax.jit(lambda state, b: state + b, donate_argnums=0)
  for _ in range(3):
    same(fresh_held()[0], jax.device_put(np.ones((8, 8), np.float32), sharding))
  g, x = fresh_held()
  with pytest.raises(RuntimeError, match="Cannot donate"):
    same(g, x)
  assert not g.is_deleted()
  expected = 2 * np.asarray(x)
  np.testing.assert_array_equal(np.asarray(same(g, jnp.copy(x))), expected)


def test_donated_loop_keeps_the_fast_path(mesh_2d):
  step = jax.jit(lambda x: x + 1, donate_argnums=0)
  twice = jax.jit(lambda a, b: a * b)
  with jax_sharding_ext.parallel_functions_output_gda(True):
    x, data = _gda(mesh_2d)
    x = step(step(x))
    with jtu.count_pjit_cpp_cache_miss() as misses:
      for _ in range(20):
        x = step(x)
    assert misses() == 0  # every call took jit's C++ fast path
    # A non-donating call may pass one array twice; it is checked on the
    # Python path (`test_dispatch.test_possible_aliases_take_the_python_path`).
    np.testing.assert_array_equal(np.asarray(twice(x, x)), (data + 22) ** 2)
  np.testing.assert_array_equal(np.asarray(x), data + 22)
