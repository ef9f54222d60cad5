"""Shard math: GDA-era semantics, agreement with stock NamedSharding, bad input."""

import itertools

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import get_shard_indices, get_shard_indices_replica_ids, get_shard_shape


def test_gda_era_example_indices(mesh_2d):
  idx = get_shard_indices((8, 2), mesh_2d, P("x", "y"))
  devs = list(mesh_2d.devices.flat)
  assert list(idx) == devs
  assert idx[devs[0]] == (slice(0, 2), slice(0, 1))
  assert idx[devs[1]] == (slice(0, 2), slice(1, 2))
  assert idx[devs[7]] == (slice(6, 8), slice(1, 2))
  assert get_shard_shape((8, 2), mesh_2d, P("x", "y")) == (2, 1)


def test_unpartitioned_dims_are_slice_none(mesh_2d):
  idx = get_shard_indices((8, 6), mesh_2d, ["x"])
  for _d, (i0, i1) in idx.items():
    assert i1 == slice(None)
    assert i0.start is not None and i0.stop - i0.start == 2
  assert get_shard_shape((8, 6), mesh_2d, ["x"]) == (2, 6)


def test_fully_replicated_replica_ids(mesh_2d):
  for axes in ([], P(), (), [None, None]):
    out = get_shard_indices_replica_ids((4, 4), mesh_2d, axes)
    assert [i for i, _ in out.values()] == [(slice(None), slice(None))] * 8
    assert [r for _, r in out.values()] == list(range(8))
    assert get_shard_shape((4, 4), mesh_2d, axes) == (4, 4)


def test_tuple_axes_x_major(mesh_2d):
  out = get_shard_indices((16, 3), mesh_2d, [("x", "y")])
  starts = [i[0].start for i in out.values()]
  assert starts == [0, 2, 4, 6, 8, 10, 12, 14]  # flat order == x-major
  out = get_shard_indices((16,), mesh_2d, [("y", "x")])
  devs = list(mesh_2d.devices.flat)
  # ('y', 'x'): y is the major factor, so device (x=1, y=0) gets block 1.
  assert out[devs[2]][0] == slice(2, 4)
  assert out[devs[1]][0] == slice(8, 10)


def test_replica_ids_partial_replication(mesh_2d):
  out = get_shard_indices_replica_ids((8, 2), mesh_2d, P("x"))
  rids = [r for _, r in out.values()]
  assert rids == [0, 1] * 4
  out = get_shard_indices_replica_ids((8, 2), mesh_2d, P("y"))
  assert [r for _, r in out.values()] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_results_are_cached_and_lists_accepted(mesh_2d):
  a = get_shard_indices([8, 2], mesh_2d, ["x", "y"])
  b = get_shard_indices((8, 2), mesh_2d, ("x", "y"))
  assert a == b
  a[next(iter(a))] = "mutated"  # a fresh dict each call: the cache is safe
  assert get_shard_indices((8, 2), mesh_2d, ("x", "y")) == b


@pytest.mark.parametrize("axes, shape, match", [
    (["z"], (8,), "not in the mesh"),
    (["x", "x"], (8, 8), "each mesh axis may split at most one"),
    ([("x", "y"), "y"], (8, 8), "each mesh axis may split at most one"),
    (["x", None, "y"], (8, 8), "has 3 entries but the array has rank 2"),
    (["x"], (6,), "not divisible by 4"),
    ([("x", "y")], (12,), "not divisible by 8"),
])
def test_bad_mesh_axes_value_errors(mesh_2d, axes, shape, match):
  for fn in (get_shard_indices, get_shard_indices_replica_ids, get_shard_shape):
    with pytest.raises(ValueError, match=match):
      fn(shape, mesh_2d, axes)


@pytest.mark.parametrize("axes", ["x", 3, [3], [("x", 1)]])
def test_bad_mesh_axes_type_errors(mesh_2d, axes):
  with pytest.raises(TypeError, match="mesh_axes"):
    get_shard_indices((8, 8), mesh_2d, axes)


@pytest.mark.parametrize("axes,shape", [([()], ()), ((None, ()), (8,)), (["x", ()], (8,)),
                                         ([(), ()], (8, 2))])
def test_an_empty_tuple_of_axes_splits_nothing_as_in_a_partition_spec(mesh_2d, axes, shape):
  """`()` names no mesh axis: `None`, as `PartitionSpec` reads it (stock
  makes `P(())` `P(None)`), also beyond the rank, in a list or tuple."""
  from jax_sharding_ext import GlobalDeviceArray
  want = NamedSharding(mesh_2d, P(*[None if e == () else e for e in axes][:len(shape)]))
  assert get_shard_shape(shape, mesh_2d, axes) == want.shard_shape(shape)
  got = get_shard_indices(shape, mesh_2d, axes)
  assert [_norm(got[d], shape) for d in mesh_2d.devices.flat] == [
      _norm(want.devices_indices_map(shape)[d], shape) for d in mesh_2d.devices.flat]
  data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  gda = GlobalDeviceArray.from_callback(shape, mesh_2d, axes, lambda i: data[i])
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_bad_mesh_type():
  with pytest.raises(TypeError, match="global_mesh"):
    get_shard_indices((8,), "not a mesh", ["x"])


def _norm(index, shape):
  """(start, stop) per dimension, whether written as slice(None) or explicitly."""
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


@st.composite
def _cases(draw):
  n_dev = len(jax.devices())
  mesh_shape = draw(st.sampled_from(
      [s for r in (1, 2, 3) for s in itertools.product((1, 2, 4, 8), repeat=r)
       if int(np.prod(s)) <= n_dev]))
  names = ("a", "b", "c")[: len(mesh_shape)]
  rank = draw(st.integers(1, 3))
  free = list(names)
  spec = []
  for _ in range(draw(st.integers(0, rank))):
    kind = draw(st.sampled_from(["none", "one", "tuple"]))
    if kind == "none" or not free:
      spec.append(None)
    elif kind == "one" or len(free) < 2:
      spec.append(free.pop(draw(st.integers(0, len(free) - 1))))
    else:
      k = draw(st.integers(2, len(free)))
      picked = draw(st.permutations(free))[:k]
      free = [f for f in free if f not in picked]
      spec.append(tuple(picked))
  sizes = dict(zip(names, mesh_shape, strict=True))
  shape = []
  for d in range(rank):
    entry = spec[d] if d < len(spec) else None
    axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
    parts = int(np.prod([sizes[a] for a in axes])) if axes else 1
    shape.append(parts * draw(st.integers(1, 3)))
  form = draw(st.sampled_from(["pspec", "list", "tuple"]))
  mesh_axes = P(*spec) if form == "pspec" else list(spec) if form == "list" else tuple(spec)
  return mesh_shape, names, tuple(shape), mesh_axes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_agrees_with_stock_named_sharding_and_tiles(case):
  mesh_shape, names, shape, mesh_axes = case
  n = int(np.prod(mesh_shape))
  mesh = Mesh(np.array(jax.devices()[:n]).reshape(mesh_shape), names)
  ours = get_shard_indices_replica_ids(shape, mesh, mesh_axes)
  stock = NamedSharding(mesh, P(*mesh_axes)).devices_indices_map(shape)
  assert list(ours) == list(mesh.devices.flat)
  shard_shape = get_shard_shape(shape, mesh, mesh_axes)
  seen = {}
  for d, (index, rid) in ours.items():
    # Same region as stock JAX, up to how an unsplit dimension is written.
    assert _norm(index, shape) == _norm(stock[d], shape)
    assert tuple(len(range(*s.indices(m))) for s, m in zip(index, shape, strict=True)) == shard_shape
    for s in index:
      assert s.step is None
    key = tuple((s.start, s.stop) for s in index)
    assert rid == seen.get(key, 0)
    seen[key] = rid + 1
  # The distinct indices tile the global array exactly once.
  cover = np.zeros(shape, np.int32)
  for key in seen:
    cover[tuple(slice(a, b) for a, b in key)] += 1
  assert (cover == 1).all()
  assert all(c == n // len(seen) for c in seen.values())
