"""Stock JAX APIs accept a GlobalDeviceArray wherever they accept a jax.Array."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray

try:
  from jax import shard_map
except ImportError:  # older JAX spelling
  from jax.experimental.shard_map import shard_map


def _gda(mesh, spec, shape=(8, 8), dtype=np.float32):
  data = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def _ptrs(arr):
  return sorted(s.data.unsafe_buffer_pointer() for s in arr.addressable_shards)


def test_jit_follows_gda_sharding(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  out = jax.jit(lambda x: x * 2 + 1)(gda)
  assert isinstance(out, jax.Array)
  assert out.sharding == NamedSharding(mesh_2d, P("x", "y"))
  np.testing.assert_array_equal(out, data * 2 + 1)


def test_matching_sharding_hands_buffers_over_without_copy(mesh_2d):
  gda, _ = _gda(mesh_2d, P("x", "y"))
  # `jax.device_put` goes through the same shard-arg handler as a jit argument;
  # with the GDA's own sharding it must hand over the very same buffers.
  out = jax.device_put(gda, NamedSharding(mesh_2d, P("x", "y")))
  assert _ptrs(out) == _ptrs(gda.to_jax_array())
  resharded = jax.device_put(gda, NamedSharding(mesh_2d, P("y", "x")))
  assert not set(_ptrs(resharded)) & set(_ptrs(gda.to_jax_array()))


def test_jit_with_matching_in_and_out_shardings(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  f = jax.jit(lambda x: x.T @ x, in_shardings=NamedSharding(mesh_2d, P("x", "y")),
              out_shardings=NamedSharding(mesh_2d, P("x")))
  out = f(gda)
  assert out.sharding == NamedSharding(mesh_2d, P("x"))
  np.testing.assert_allclose(out, data.T @ data, rtol=1e-6)


def test_committed_gda_with_disagreeing_in_shardings(mesh_2d):
  gda, _ = _gda(mesh_2d, P("x", "y"))
  f = jax.jit(lambda x: x, in_shardings=NamedSharding(mesh_2d, P("x")))
  with pytest.raises(ValueError, match="does not match the sharding") as e:
    f(gda)
  assert repr(P("x")) in str(e.value) and repr(P("x", "y")) in str(e.value)
  with pytest.raises(ValueError) as stock:  # the same array as a `jax.Array`: the same text
    f(gda.to_jax_array())
  assert str(e.value) == str(stock.value)


def test_mixing_gda_and_jax_array(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  arr = jax.device_put(data, NamedSharding(mesh_2d, P("x", "y")))
  np.testing.assert_array_equal(jax.jit(jnp.add)(gda, arr), 2 * data)


def test_jax_numpy(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  np.testing.assert_allclose(jnp.sin(gda), np.sin(data), rtol=1e-6)
  np.testing.assert_allclose(jnp.add(gda, 1), data + 1)
  np.testing.assert_allclose(jnp.dot(gda, gda), data @ data, rtol=1e-6)
  assert float(jnp.sum(gda)) == data.sum()
  np.testing.assert_array_equal(jnp.asarray(gda), data)
  assert jnp.sin(gda).sharding == gda.sharding


def test_grad(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  g = jax.grad(lambda x: jnp.sum(x ** 2))(gda)
  np.testing.assert_allclose(g, 2 * data)
  g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(x))))(gda)
  np.testing.assert_allclose(g, np.cos(data), rtol=1e-5)


def test_vmap(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  np.testing.assert_allclose(jax.vmap(jnp.sum)(gda), data.sum(axis=1))
  np.testing.assert_allclose(jax.jit(jax.vmap(lambda r: r * 2, in_axes=1))(gda), (data * 2).T)


def test_device_put_reshards_and_returns_jax_array(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  out = jax.device_put(gda, NamedSharding(mesh_2d, P("x")))
  assert type(out) is not GlobalDeviceArray
  assert out.sharding == NamedSharding(mesh_2d, P("x"))
  np.testing.assert_array_equal(out, data)
  same = jax.device_put(gda, gda.sharding)
  np.testing.assert_array_equal(same, data)


def test_device_get(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  out = jax.device_get(gda)
  assert isinstance(out, np.ndarray)
  np.testing.assert_array_equal(out, data)
  tree = jax.device_get({"a": gda, "b": [gda]})
  np.testing.assert_array_equal(tree["b"][0], data)


def test_shard_map(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  f = shard_map(lambda b: b * 10 + jnp.sum(b), mesh=mesh_2d, in_specs=P("x", "y"),
                out_specs=P("x", "y"))
  expected = np.concatenate([
      np.concatenate([data[i:i + 2, j:j + 4] * 10 + data[i:i + 2, j:j + 4].sum()
                      for j in (0, 4)], axis=1) for i in (0, 2, 4, 6)])
  np.testing.assert_allclose(jax.jit(f)(gda), expected)
  np.testing.assert_allclose(f(gda), expected)


def test_closed_over_gda_is_a_constant(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  np.testing.assert_array_equal(jax.jit(lambda: jnp.add(gda, 1))(), data + 1)


def test_scalar_and_int_gda(mesh_2d):
  gda, data = _gda(mesh_2d, P(), shape=(), dtype=np.int32)
  assert gda.shape == () and gda.is_fully_replicated
  assert int(jax.jit(lambda x: x + 1)(gda)) == 1
  gda, data = _gda(mesh_2d, P("x"), shape=(8,), dtype=np.int32)
  np.testing.assert_array_equal(jax.jit(lambda x: x * x)(gda), data * data)


def test_eval_shape_and_typeof(mesh_2d):
  gda, _ = _gda(mesh_2d, P("x", "y"))
  out = jax.eval_shape(lambda x: x.sum(0), gda)
  assert out.shape == (8,) and out.dtype == np.float32
  assert jax.typeof(gda).shape == (8, 8)
