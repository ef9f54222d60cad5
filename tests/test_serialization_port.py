"""JAX's own GDA-era `serialization_test.py`, ported.

From jax-ml/jax at tag `jax-v0.3.21`,
`jax/experimental/gda_serialization/serialization_test.py` (the same test at
0.3.18 to 0.3.20). Only the imports and the harness changed: pytest's
`tmp_path` for `create_tempdir`, `Mesh(...)` for `jtu.create_global_mesh`,
`NamedSharding` for the removed `MeshPspecSharding`,
`jax.make_array_from_callback` for `array.make_array_from_callback`, and
`assert_arrays_equal` for `assertArraysEqual` (values and canonical dtype).
Every expected value is the old one.

One deliberate difference: the old `run_deserialization` returned a
`jax.Array` when the `jax_array` flag was on and a GDA otherwise; this one
always returns a GDA (its `addressable_shards` are the `jax.Array`'s), so the
`*_jax_array` tests check for `GlobalDeviceArray` where they checked
`array.ArrayImpl`. They still write from a `jax.Array`.
"""

import math

import jax
import numpy as np
import pytest
import tensorstore as ts
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization


def create_global_mesh(shape, names):
  n = math.prod(shape)
  return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def assert_arrays_equal(x, y):
  x, y = np.asarray(x), np.asarray(y)
  assert x.shape == y.shape, (x.shape, y.shape)
  assert jax.dtypes.canonicalize_dtype(x.dtype) == jax.dtypes.canonicalize_dtype(y.dtype), (
      x.dtype, y.dtype)
  np.testing.assert_array_equal(x, y)


def make_array_from_callback(shape, sharding, cb):
  return jax.make_array_from_callback(shape, sharding, cb)


@pytest.fixture
def create_tempdir(tmp_path):
  def make(name):
    d = tmp_path / name
    d.mkdir()
    return d
  return make


def test_checkpointing_gda(create_tempdir):
  global_mesh = create_global_mesh((4, 2), ('x', 'y'))
  global_input_shape = (8, 2)
  mesh_axes = P('x', 'y')
  num = math.prod(global_input_shape)

  # First GDA
  global_input_data1 = np.arange(num).reshape(global_input_shape)
  def cb1(index):
    return global_input_data1[index]
  gda1 = GlobalDeviceArray.from_callback(global_input_shape, global_mesh,
                                         mesh_axes, cb1)
  ckpt_dir1 = create_tempdir('first')

  # Second GDA
  global_input_data2 = np.arange(num, num + num).reshape(global_input_shape)
  def cb2(index):
    return global_input_data2[index]
  gda2 = GlobalDeviceArray.from_callback(global_input_shape, global_mesh,
                                         mesh_axes, cb2)
  ckpt_dir2 = create_tempdir('second')

  # Third GDA
  def cb3(_):
    return np.array([])
  global_mesh1d = create_global_mesh((8,), ('x',))
  gda3 = GlobalDeviceArray.from_callback((0,), global_mesh1d, P(None), cb3)
  ckpt_dir3 = create_tempdir('third')

  ckpt_paths = [str(ckpt_dir1), str(ckpt_dir2), str(ckpt_dir3)]
  tspecs = jax.tree_util.tree_map(serialization.get_tensorstore_spec, ckpt_paths)

  serialization.run_serialization([gda1, gda2, gda3], tspecs)

  m1, m2, m3 = serialization.run_deserialization(
      [global_mesh, global_mesh, global_mesh1d],
      [mesh_axes, P('x'), P(None)],
      tspecs)

  assert_arrays_equal(np.asarray(m1.local_shards[0].data),
                      np.array([[0], [2]]))
  assert_arrays_equal(np.asarray(m1.local_shards[1].data),
                      np.array([[1], [3]]))
  assert m1.local_shards[0].data.shape == (2, 1)
  assert m1.dtype == np.int32

  assert_arrays_equal(np.asarray(m2.local_shards[0].data),
                      np.array([[16, 17], [18, 19]]))
  assert_arrays_equal(np.asarray(m2.local_shards[1].data),
                      np.array([[16, 17], [18, 19]]))
  assert m2.local_shards[0].data.shape == (2, 2)
  assert m2.dtype == np.int32

  for i, s in enumerate(m3.local_shards):
    assert s.index == (slice(None),)
    assert s.replica_id == i
    assert_arrays_equal(np.asarray(s.data), np.array([]))
  assert m3.dtype == np.float32


def test_checkpointing_jax_array(create_tempdir):
  global_mesh = create_global_mesh((4, 2), ('x', 'y'))
  inp_shape = (8, 2)
  pspec = P('x', 'y')
  num = math.prod(inp_shape)

  # First Array
  global_input_data1 = np.arange(num).reshape(inp_shape)
  a1 = make_array_from_callback(
      inp_shape, NamedSharding(global_mesh, pspec),
      lambda idx: global_input_data1[idx])
  ckpt_dir1 = create_tempdir('first')

  # Second Array
  global_input_data2 = np.arange(num, num + num).reshape(inp_shape)
  a2 = make_array_from_callback(
      inp_shape, NamedSharding(global_mesh, pspec),
      lambda idx: global_input_data2[idx])
  ckpt_dir2 = create_tempdir('second')

  # Third Array
  def cb3(_):
    return np.array([])
  global_mesh1d = create_global_mesh((8,), ('x',))
  a3 = make_array_from_callback(
      (0,), NamedSharding(global_mesh1d, P(None)), cb3)
  ckpt_dir3 = create_tempdir('third')

  ckpt_paths = [str(ckpt_dir1), str(ckpt_dir2), str(ckpt_dir3)]
  tspecs = jax.tree_util.tree_map(serialization.get_tensorstore_spec, ckpt_paths)

  serialization.run_serialization([a1, a2, a3], tspecs)

  m1, m2, m3 = serialization.run_deserialization(
      [global_mesh, global_mesh, global_mesh1d],
      [pspec, P('x'), P(None)],
      tspecs)

  assert isinstance(m1, GlobalDeviceArray)
  assert_arrays_equal(np.asarray(m1.addressable_shards[0].data),
                      np.array([[0], [2]]))
  assert_arrays_equal(np.asarray(m1.addressable_shards[1].data),
                      np.array([[1], [3]]))
  assert m1.addressable_shards[0].data.shape == (2, 1)
  assert m1.dtype == np.int32

  assert isinstance(m2, GlobalDeviceArray)
  assert_arrays_equal(np.asarray(m2.addressable_shards[0].data),
                      np.array([[16, 17], [18, 19]]))
  assert_arrays_equal(np.asarray(m2.addressable_shards[1].data),
                      np.array([[16, 17], [18, 19]]))
  assert m2.addressable_shards[0].data.shape == (2, 2)
  assert m2.dtype == np.int32

  assert isinstance(m3, GlobalDeviceArray)
  for i, s in enumerate(m3.addressable_shards):
    assert s.index == (slice(None),)
    assert s.replica_id == i
    assert_arrays_equal(np.asarray(s.data), np.array([]))
  assert m3.dtype == np.float32


BIGGER_EXPECTED = {
    0: np.array([[0], [2], [4]], dtype=np.float32),
    1: np.array([[1], [3], [5]], dtype=np.float32),
    2: np.array([[6], [8], [10]], dtype=np.float32),
    3: np.array([[7], [9], [11]], dtype=np.float32),
    4: np.array([[12], [14], [0]], dtype=np.float32),
    5: np.array([[13], [15], [0]], dtype=np.float32),
    6: np.array([[0], [0], [0]], dtype=np.float32),
    7: np.array([[0], [0], [0]], dtype=np.float32),
}


def test_checkpointing_with_bigger_shape_gda(create_tempdir):
  global_mesh = create_global_mesh((2, 2), ('x', 'y'))
  global_input_shape = (8, 2)
  num = math.prod(global_input_shape)

  # First GDA
  global_input_data1 = np.arange(num, dtype=np.int32).reshape(global_input_shape)
  def cb1(index):
    return global_input_data1[index]
  gda1 = GlobalDeviceArray.from_callback(global_input_shape, global_mesh,
                                         P('x', 'y'), cb1)
  ckpt_dir1 = create_tempdir('first')

  ckpt_paths = [str(ckpt_dir1)]
  tspecs = jax.tree_util.tree_map(serialization.get_tensorstore_spec, ckpt_paths)

  serialization.run_serialization([gda1], tspecs)

  m1, = serialization.run_deserialization(
      [create_global_mesh((4, 2), ('x', 'y'))],
      [P('x', 'y')],
      tspecs,
      [(12, 2)],
      [np.float32]
  )

  for l in m1.local_shards:
    assert_arrays_equal(np.asarray(l.data), BIGGER_EXPECTED[l.device.id])


def test_checkpointing_with_bigger_shape_jax_array(create_tempdir):
  global_mesh = create_global_mesh((2, 2), ('x', 'y'))
  global_input_shape = (8, 2)
  num = math.prod(global_input_shape)

  global_input_data1 = np.arange(num, dtype=np.int32).reshape(global_input_shape)
  def cb1(index):
    return global_input_data1[index]
  arr = make_array_from_callback(
      global_input_shape, NamedSharding(global_mesh, P('x', 'y')), cb1)
  ckpt_dir1 = create_tempdir('first')

  ckpt_paths = [str(ckpt_dir1)]
  tspecs = jax.tree_util.tree_map(serialization.get_tensorstore_spec, ckpt_paths)

  serialization.run_serialization([arr], tspecs)

  m1, = serialization.run_deserialization(
      [create_global_mesh((4, 2), ('x', 'y'))],
      [P('x', 'y')],
      tspecs,
      [(12, 2)],
      [np.float32]
  )

  for l in m1.addressable_shards:
    assert_arrays_equal(np.asarray(l.data), BIGGER_EXPECTED[l.device.id])


def test_checkpointing_scalar_gda(create_tempdir):
  global_mesh = create_global_mesh((2,), ('x'))
  global_input_shape = ()
  data = np.array(4)
  gda1 = GlobalDeviceArray.from_callback(global_input_shape, global_mesh,
                                         P(None), lambda idx: data[idx])
  ckpt_dir1 = create_tempdir('first')

  ckpt_paths = [str(ckpt_dir1)]
  tspecs = jax.tree_util.tree_map(serialization.get_tensorstore_spec, ckpt_paths)

  serialization.run_serialization([gda1], tspecs)

  m1, = serialization.run_deserialization(
      [create_global_mesh((2,), ('x'))],
      [P(None)],
      tspecs,
      [()],
      [np.float32]
  )

  for l in m1.local_shards:
    assert_arrays_equal(np.asarray(l.data), data.astype(np.float32))


def test_checkpointing_scalar_jax_array(create_tempdir):
  global_mesh = create_global_mesh((2,), ('x'))
  global_input_shape = ()
  data = np.array(4)
  s = NamedSharding(global_mesh, P(None))
  gda1 = make_array_from_callback(
      global_input_shape, s, lambda idx: data[idx])
  ckpt_dir1 = create_tempdir('first')

  ckpt_paths = [str(ckpt_dir1)]
  tspecs = jax.tree_util.tree_map(serialization.get_tensorstore_spec, ckpt_paths)

  serialization.run_serialization([gda1], tspecs)

  m1, = serialization.run_deserialization(
      [create_global_mesh((2,), ('x'))],
      [P(None)],
      tspecs,
      [()],
      [np.float32]
  )

  for l in m1.addressable_shards:
    assert_arrays_equal(np.asarray(l.data), data.astype(np.float32))


def test_deserialize_tensorstore_array_gda():
  global_mesh = create_global_mesh((2,), ('x'))
  data = np.arange(1024)
  tspec = ts.array(data).spec()
  m1, = serialization.run_deserialization(
      [global_mesh],
      [P(None)],
      [tspec]
  )
  for l in m1.local_shards:
    assert_arrays_equal(np.asarray(l.data), data)


def test_deserialize_tensorstore_array_jax_array():
  global_mesh = create_global_mesh((2,), ('x'))
  data = np.arange(1024)
  tspec = ts.array(data).spec()
  m1, = serialization.run_deserialization(
      [global_mesh],
      [P(None)],
      [tspec]
  )
  for l in m1.addressable_shards:
    assert_arrays_equal(np.asarray(l.data), data)


def test_spec_has_metadata():
  spec = {
      'a': {
          'b': 1,
          'c': 2,
      },
      'd': 3,
      'e': {
          'a': 2,
          'metadata': 3
      },
      'f': 4
  }
  assert serialization._spec_has_metadata(spec)
  assert serialization._spec_has_metadata({
      'driver': 'zarr',
      'kvstore': 'gfile',
      'metadata': {
          'chunks': 4,
          'shape': (32, 64)
      },
      'one_more': 'thing'
  })


def test_spec_has_no_metadata():
  spec = {
      'a': {
          'b': 1,
          'c': 2,
      },
      'd': 3,
      'e': {
          'a': 2,
      },
      'f': 4
  }
  assert not serialization._spec_has_metadata(spec)


def test_empty_spec_has_no_metadata():
  spec = {}
  assert not serialization._spec_has_metadata(spec)
