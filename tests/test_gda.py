"""GlobalDeviceArray: constructors, attributes, zero-copy views, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, Shard, get_shard_indices


def _ptrs(arrays):
  return [a.unsafe_buffer_pointer() for a in arrays]


def _global(shape, dtype=np.int32):
  return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


def test_from_callback_docstring_example(mesh_2d):
  data = _global((8, 2))
  calls = []

  def cb(index):
    calls.append(index)
    return data[index]

  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x", "y"), cb)
  assert len(calls) == 8
  assert gda.shape == (8, 2)
  np.testing.assert_array_equal(gda.local_shards[0].data, [[0], [2]])
  assert gda.local_shards[0].data.shape == (2, 1)
  assert gda.local_shards[0].index == (slice(0, 2, None), slice(0, 1, None))
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_from_callback_called_per_device_even_when_replicated(mesh_2d):
  data = _global((8, 4))
  calls = []
  gda = GlobalDeviceArray.from_callback(
      (8, 4), mesh_2d, [], lambda i: calls.append(i) or data[i])
  assert calls == [(slice(None), slice(None))] * 8
  assert gda.is_fully_replicated
  assert [s.replica_id for s in gda.local_shards] == list(range(8))
  for s in gda.local_shards:
    np.testing.assert_array_equal(s.data, data)


def test_from_batched_callback(mesh_2d):
  data = _global((8, 2))
  seen = []

  def cb(indices):
    seen.append(list(indices))
    return [data[i] for i in indices]

  gda = GlobalDeviceArray.from_batched_callback((8, 2), mesh_2d, P("x"), cb)
  assert len(seen) == 1 and len(seen[0]) == len(mesh_2d.local_devices)
  assert gda.local_data(0).shape == (2, 2)
  np.testing.assert_array_equal(np.asarray(gda), data)


@pytest.mark.parametrize("spec", [P(("x", "y")), P("y"), P()])
def test_from_batched_callback_with_devices(mesh_2d, spec):
  data = _global((8, 2))
  entries = []

  def cb(cb_inp):
    entries.extend(cb_inp)
    dbs = []
    for index, devices in cb_inp:
      dbs.extend(jax.device_put(data[index], d) for d in devices)
    return dbs

  gda = GlobalDeviceArray.from_batched_callback_with_devices((8, 2), mesh_2d, spec, cb)
  indices = get_shard_indices((8, 2), mesh_2d, spec)
  # One entry per distinct index, listing the devices that hold it.
  assert len({tuple((s.start, s.stop) for s in i) for i, _ in entries}) == len(entries)
  assert sum(len(devs) for _, devs in entries) == 8
  for index, devs in entries:
    assert all(indices[d] == index for d in devs)
  np.testing.assert_array_equal(np.asarray(gda), data)
  assert [s.device for s in gda.local_shards] == list(mesh_2d.local_devices)


def test_constructor_and_zero_copy_views(mesh_2d):
  data = _global((8, 4))
  idx = get_shard_indices((8, 4), mesh_2d, ["x", "y"])
  bufs = [jax.device_put(data[idx[d]], d) for d in mesh_2d.local_devices]
  gda = GlobalDeviceArray((8, 4), mesh_2d, ["x", "y"], bufs)
  assert _ptrs(bufs) == _ptrs([s.data for s in gda.local_shards])
  arr = gda.to_jax_array()
  assert isinstance(arr, jax.Array)
  assert _ptrs(bufs) == _ptrs([s.data for s in arr.addressable_shards])
  back = GlobalDeviceArray.from_jax_array(arr)
  assert back.mesh_axes == arr.sharding.spec
  assert _ptrs(bufs) == _ptrs([back.local_data(i) for i in range(8)])
  np.testing.assert_array_equal(np.asarray(back), data)


def test_from_jax_array_rejects_non_named_sharding(devices):
  arr = jnp.arange(4)
  with pytest.raises(ValueError, match="NamedSharding"):
    GlobalDeviceArray.from_jax_array(arr)
  with pytest.raises(TypeError, match="jax.Array"):
    GlobalDeviceArray.from_jax_array(np.arange(4))


def test_attributes(mesh_2d):
  data = _global((8, 2))
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, [("x", "y")], lambda i: data[i])
  assert gda.shape == (8, 2) and gda.ndim == 2 and gda.size == 16
  assert gda.dtype == np.int32
  assert gda.mesh is mesh_2d
  assert gda.mesh_axes == [("x", "y")]
  assert gda.sharding == NamedSharding(mesh_2d, P(("x", "y")))
  assert not gda.is_fully_replicated and gda.is_fully_addressable
  assert gda.addressable_shards == gda.local_shards
  assert gda.addressable_data(3) is not None
  assert gda.global_shards == gda.local_shards  # one process: all local
  assert all(isinstance(s, Shard) for s in gda.global_shards)
  for i, s in enumerate(gda.local_shards):
    np.testing.assert_array_equal(gda.local_data(i), data[s.index])
  np.testing.assert_array_equal(gda.local_data(-1), data[gda.local_shards[-1].index])
  assert gda.block_until_ready() is gda


def test_str_repr_eq(mesh_2d):
  gda = GlobalDeviceArray.from_callback(
      (8, 2), mesh_2d, [("x", "y")], lambda i: _global((8, 2))[i])
  assert str(gda) == "GlobalDeviceArray(shape=(8, 2), dtype=int32)"
  assert repr(gda) == ("GlobalDeviceArray(shape=(8, 2), dtype=int32, "
                       "global_mesh_shape={'x': 4, 'y': 2}, mesh_axes=[('x', 'y')])")
  with pytest.raises(NotImplementedError, match="intentionally unimplemented"):
    gda == gda  # noqa: B015
  html = gda._repr_html_()
  assert html.count("<tr>") == 1 + 8 and "0:1" in html


def test_repr_html_marks_replicas(mesh_2d):
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, ["x"], lambda i: _global((8, 2))[i])
  html = gda._repr_html_()
  assert html.count("class='jse-shard'") == 4  # replicas share a box
  assert "data-devices='0,1'" in html and "data-index='0:2,0:2'" in html


def test_delete(mesh_2d):
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, ["x"], lambda i: _global((8, 2))[i])
  assert not gda.is_deleted()
  gda.delete()
  assert gda.is_deleted()
  for use in (lambda: gda.local_data(0), lambda: gda.local_shards, lambda: np.asarray(gda),
              gda.to_jax_array, lambda: jax.jit(lambda x: x)(gda), lambda: jnp.sin(gda),
              gda.block_until_ready):
    with pytest.raises(RuntimeError, match="deleted or donated"):
      use()


def test_local_data_out_of_range(mesh_2d):
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, ["x"], lambda i: _global((8, 2))[i])
  with pytest.raises(IndexError, match=r"local_data\(8\).*8 local shards"):
    gda.local_data(8)
  with pytest.raises(IndexError, match=r"local_data\(-9\)"):
    gda.local_data(-9)


class TestBadInput:

  def test_callback_wrong_shape(self, mesh_2d):
    with pytest.raises(ValueError, match=r"returned shape \(8, 2\).*have shape \(2, 1\)"):
      GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x", "y"), lambda i: _global((8, 2)))

  def test_callback_inconsistent_dtype(self, mesh_2d):
    data = _global((8, 2))

    def cb(index):
      return data[index].astype(np.float32 if index[0].start == 4 else np.int32)

    with pytest.raises(ValueError, match="same dtype"):
      GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x"), cb)

  @pytest.mark.parametrize("dtype", [object, "<U1", "S1", "datetime64[s]"])
  def test_callback_non_numeric(self, mesh_2d, dtype):
    """JAX refuses arrays of strings, objects and dates (stock
    `make_array_from_callback`: a TypeError); so does a GDA, naming the
    callback, rather than an XLA error."""
    with pytest.raises(TypeError, match=r"`data_callback` returned dtype .*; return numeric"):
      GlobalDeviceArray.from_callback(
          (8,), mesh_2d, P("x"), lambda i: np.zeros(2).astype(dtype))

  def test_callback_not_callable(self, mesh_2d):
    with pytest.raises(TypeError, match="data_callback"):
      GlobalDeviceArray.from_callback((8,), mesh_2d, P("x"), np.arange(8))

  def test_batched_wrong_count(self, mesh_2d):
    with pytest.raises(ValueError, match="8 indices.*returned 3"):
      GlobalDeviceArray.from_batched_callback(
          (8,), mesh_2d, P("x"), lambda idx: [np.zeros(2)] * 3)

  def test_wrong_number_of_buffers(self, mesh_2d):
    bufs = [jax.device_put(np.zeros((2, 1)), d) for d in mesh_2d.local_devices[:3]]
    with pytest.raises(ValueError, match="expects 8 local shards, but got 3 buffers"):
      GlobalDeviceArray((8, 2), mesh_2d, P("x", "y"), bufs)

  def test_buffers_wrong_order(self, mesh_2d):
    devs = list(mesh_2d.local_devices)
    bufs = [jax.device_put(np.zeros((2, 1), np.float32), d) for d in devs[::-1]]
    with pytest.raises(ValueError, match="device order doesn.t match"):
      GlobalDeviceArray((8, 2), mesh_2d, P("x", "y"), bufs)

  def test_buffers_wrong_shape(self, mesh_2d):
    bufs = [jax.device_put(np.zeros((4, 1), np.float32), d) for d in mesh_2d.local_devices]
    with pytest.raises(ValueError, match=r"shape \(2, 1\)"):
      GlobalDeviceArray((8, 2), mesh_2d, P("x", "y"), bufs)

  def test_buffers_mismatched_dtypes(self, mesh_2d):
    bufs = [jax.device_put(np.zeros((2, 1), np.float32 if k else np.int32), d)
            for k, d in enumerate(mesh_2d.local_devices)]
    with pytest.raises(ValueError, match="matching dtypes, .* in `device_buffers`"):
      GlobalDeviceArray((8, 2), mesh_2d, P("x", "y"), bufs)

  def test_buffers_not_arrays(self, mesh_2d):
    with pytest.raises(TypeError, match=r"device_buffers\[0\]"):
      GlobalDeviceArray((8, 2), mesh_2d, P("x", "y"), [np.zeros((2, 1))] * 8)

  def test_multi_device_buffer(self, mesh_2d):
    sharded = jax.device_put(np.zeros((8, 2)), NamedSharding(mesh_2d, P("x")))
    with pytest.raises(ValueError, match="exactly one device"):
      GlobalDeviceArray((8, 2), mesh_2d, P("x", "y"), [sharded] * 8)

  def test_bad_mesh_axes_in_constructors(self, mesh_2d):
    with pytest.raises(ValueError, match="not in the mesh"):
      GlobalDeviceArray.from_callback((8,), mesh_2d, ["z"], lambda i: np.zeros(2))
    with pytest.raises(ValueError, match="not divisible"):
      GlobalDeviceArray.from_callback((6,), mesh_2d, ["x"], lambda i: np.zeros(2))


def test_copy_and_deepcopy(mesh_2d):
  import copy
  data = _global((8, 2))
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, ["x"], lambda i: data[i])
  for dup in (copy.copy(gda), copy.deepcopy({"w": gda})["w"]):
    assert type(dup) is GlobalDeviceArray
    assert dup.sharding == gda.sharding and dup.mesh_axes == ["x"]
    np.testing.assert_array_equal(np.asarray(dup), data)
  deep = copy.deepcopy(gda)
  assert not set(_ptrs([s.data for s in deep.local_shards])) & set(
      _ptrs([s.data for s in gda.local_shards]))
  gda.delete()
  np.testing.assert_array_equal(np.asarray(deep), data)  # independent buffers


@pytest.mark.parametrize("mesh_axes", [P("x", None), ["x", None], ("x", None, None), P(None, "y")],
                         ids=str)
def test_trailing_nones_survive_to_jax_array_and_back(mesh_2d, mesh_axes):
  """The sharding keeps the `None`s the user wrote, as
  `jax.device_put(x, NamedSharding(mesh, P('x', None)))` keeps them (JAX
  treats `P('x')` and `P('x', None)` as different specs), so `mesh_axes`
  survive `to_jax_array()` -> `from_jax_array()`."""
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, mesh_axes, lambda i: data[i])
  expected = P(*list(mesh_axes)[:2])
  stock = jax.device_put(data, NamedSharding(mesh_2d, expected))
  assert gda.sharding == stock.sharding
  back = GlobalDeviceArray.from_jax_array(gda.to_jax_array())
  assert back.mesh_axes == expected and back.sharding == stock.sharding
  np.testing.assert_array_equal(np.asarray(back), data)


# ---------------------------------------------------------------------------
# Meshes no array can live on: a clear error from every entry point.
# ---------------------------------------------------------------------------

_ENTRIES = ("from_callback", "from_batched_callback", "from_batched_callback_with_devices",
            "constructor", "get_shard_indices", "get_shard_indices_replica_ids",
            "get_shard_shape")


def _call(entry, shape, mesh, spec):
  import jax_sharding_ext as jse
  data = _global(shape)
  if entry == "constructor":
    return GlobalDeviceArray(shape, mesh, spec, [jax.device_put(data, jax.devices()[0])])
  if entry == "from_callback":
    return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i])
  if entry == "from_batched_callback":
    return GlobalDeviceArray.from_batched_callback(shape, mesh, spec,
                                                   lambda ix: [data[i] for i in ix])
  if entry == "from_batched_callback_with_devices":
    return GlobalDeviceArray.from_batched_callback_with_devices(
        shape, mesh, spec, lambda es: [jax.device_put(data[i], d) for i, ds in es for d in ds])
  return getattr(jse, entry)(shape, mesh, spec)


@pytest.mark.parametrize("entry", _ENTRIES)
@pytest.mark.parametrize("spec", [P("x"), P()], ids=str)
def test_a_mesh_listing_a_device_twice_is_refused(devices, entry, spec):
  """Stock `jax.make_array_from_callback` refuses a split over it (with a
  bare XLA error), `jax.device_put` and `jax.jit` any use. The GDA was built:
  the two shards meant for the device shared one buffer, and half the
  array's value was uninitialised memory."""
  mesh = Mesh(np.array([devices[5], devices[5]]), ("x",))
  with pytest.raises(ValueError, match=r"`global_mesh` lists device .*5.* more than once"):
    _call(entry, (4, 2), mesh, spec)


@pytest.mark.parametrize("entry", _ENTRIES)
@pytest.mark.parametrize("shape", [(0, 2), (2, 0)])
def test_a_mesh_with_no_devices_is_refused(entry, shape):
  """Stock raises `ZeroDivisionError` for the same mesh (and aborts the
  process for a replicated array); so did the GDA, or an `IndexError`."""
  mesh = Mesh(np.empty(shape, dtype=object), ("x", "y"))
  for spec in (P("x"), P()):
    with pytest.raises(ValueError, match="`global_mesh` has no devices"):
      _call(entry, (4,), mesh, spec)


@pytest.mark.parametrize("entry", _ENTRIES)
def test_a_mesh_naming_an_axis_twice_is_refused(devices, entry):
  """Stock `jax.make_array_from_callback` fails with a bare XLA
  `INVALID_ARGUMENT` (so did the GDA); `Mesh` accepts the names."""
  mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("x", "x"))
  for spec in (P("x"), P()):
    with pytest.raises(ValueError, match="`global_mesh` has the axis name 'x' more than once"):
      _call(entry, (4,), mesh, spec)


@pytest.mark.parametrize("entry", _ENTRIES)
@pytest.mark.parametrize("items", [[0, 1], ["cpu:0", "cpu:1"], "mixed"], ids=str)
def test_a_mesh_of_device_ids_or_names_is_a_type_error(devices, entry, items):
  """Stock raises `AttributeError: 'numpy.int64' object has no attribute
  'process_index'` (so did the GDA; its shard math keyed results by the ids)."""
  arr = np.array([devices[0], 1], dtype=object) if items == "mixed" else np.array(items)
  mesh = Mesh(arr, ("x",))
  with pytest.raises(TypeError, match=r"`global_mesh` holds .* where a device belongs"):
    _call(entry, (4,), mesh, P("x"))


# ---------------------------------------------------------------------------
# Callback results and buffers that are other arrays.
# ---------------------------------------------------------------------------


def _callback(entry, shape, mesh, spec, value):
  if entry == "from_callback":
    return GlobalDeviceArray.from_callback(shape, mesh, spec, value)
  return GlobalDeviceArray.from_batched_callback(shape, mesh, spec,
                                                 lambda ix: [value(i) for i in ix])


@pytest.mark.parametrize("entry", ["from_callback", "from_batched_callback"])
@pytest.mark.parametrize("source", ["same_mesh", "replicated", "other_devices", "gda"])
def test_callback_arrays_over_several_devices_build_stocks_array(mesh_2d, devices, entry,
                                                                 source):
  """Stock `jax.make_array_from_callback` builds these (it puts a
  multi-device value on its device first); the GDA raised jaxlib's
  `device_put expects an array with exactly one shard`, or for a GDA result
  `The C++ jax jit execution path, only accepts DeviceArray`."""
  data = _global((8, 2))
  other = Mesh(np.array(devices[:2]), ("o",))
  x = {"same_mesh": lambda: jax.device_put(data, NamedSharding(mesh_2d, P("x", "y"))),
       "replicated": lambda: jax.device_put(data, NamedSharding(mesh_2d, P())),
       "other_devices": lambda: jax.device_put(data, NamedSharding(other, P("o"))),
       "gda": lambda: GlobalDeviceArray.from_callback((8, 2), other, P(), lambda i: data[i]),
       }[source]()
  stock = jax.make_array_from_callback((8, 2), NamedSharding(mesh_2d, P("x")),
                                       lambda i: jnp.asarray(x)[i])
  gda = _callback(entry, (8, 2), mesh_2d, P("x"), lambda i: x[i])
  assert gda.sharding == stock.sharding
  np.testing.assert_array_equal(np.asarray(gda), np.asarray(stock))
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_a_multi_device_result_after_a_single_device_one_builds_too(mesh_2d):
  """Stock looks only at the first value (and fails on this with a bare XLA
  error); every value is put on its device, whatever comes first."""
  data = _global((8, 2))
  spread = jax.device_put(data, NamedSharding(mesh_2d, P("x")))
  gda = GlobalDeviceArray.from_callback(
      (8, 2), mesh_2d, P("x"), lambda i: data[i] if i[0].start == 0 else spread[i])
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_callback_arrays_over_several_devices_move_as_device_to_device(mesh_2d, devices):
  """Placing a value that spans devices is an explicit device_to_device
  transfer (stock's `jax.device_put`): judged by the guard before anything
  moves, one ledger record of the bytes written. A fully replicated value
  with a copy on the device moves nothing: that copy becomes the shard."""
  import jax_sharding_ext as jse
  data = _global((8, 2))
  other = Mesh(np.array(devices[:2]), ("o",))
  elsewhere = {k: jax.device_put(data[k * 2:k * 2 + 2], NamedSharding(other, P("o")))
               for k in range(4)}

  def cb(i):
    return elsewhere[i[0].start // 2]
  with jse.transfer_ledger() as ledger:
    gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x"), cb)
  np.testing.assert_array_equal(np.asarray(gda), data)
  (record,) = ledger.records
  assert (record.direction, record.explicit, record.nbytes) == (
      "device_to_device", True, 8 * data[:2].nbytes)
  assert record.dst == tuple(mesh_2d.local_devices)
  assert set(record.src) == set(devices[:2])
  with jax.transfer_guard_device_to_device("disallow_explicit"), pytest.raises(
      jax.errors.JaxRuntimeError, match="device-to-device"):
    GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x"), cb)

  replicated = jax.device_put(data, NamedSharding(mesh_2d, P()))
  with jse.transfer_ledger() as ledger, jax.transfer_guard("disallow_explicit"):
    gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P(), lambda i: replicated[i])
  assert ledger.records == []
  assert _ptrs(gda._device_buffers) == _ptrs([s.data for s in replicated.addressable_shards])


@pytest.mark.parametrize("entry", ["from_callback", "from_batched_callback"])
def test_a_deleted_array_from_the_callback_is_refused(mesh_2d, entry):
  """Stock `jax.make_array_from_callback` returns a deleted replicated result
  itself (a deleted array); the GDA refuses it, naming the callback."""
  data = _global((8, 2))
  gone = jax.device_put(data, NamedSharding(mesh_2d, P()))
  gone.delete()
  with pytest.raises(RuntimeError, match="`data_callback` returned a deleted or donated"):
    _callback(entry, (8, 2), mesh_2d, P(), lambda i: gone)


def test_a_gda_over_one_device_is_a_constructor_buffer(mesh_2d):
  """A GDA is a `jax.Array`: stock `make_array_from_single_device_arrays`
  takes the same buffers as `jax.Array`s; the GDA's constructor raised
  stock's `Unsupported type for elements in arrays`."""
  data = _global((8, 2))
  idx = get_shard_indices((8, 2), mesh_2d, P("x"))
  bufs = [GlobalDeviceArray.from_jax_array(jax.device_put(
      data[idx[d]], NamedSharding(Mesh(np.array([d]), ("one",)), P())))
      for d in mesh_2d.local_devices]
  for gda in (GlobalDeviceArray((8, 2), mesh_2d, P("x"), bufs),
              GlobalDeviceArray.from_batched_callback_with_devices(
                  (8, 2), mesh_2d, P("x"), lambda entries: bufs)):
    np.testing.assert_array_equal(np.asarray(gda), data)
    assert _ptrs(gda._device_buffers) == _ptrs(b.to_jax_array() for b in bufs)


def test_with_devices_errors_name_the_callback(mesh_2d):
  data = _global((8, 2))
  with pytest.raises(TypeError, match=r"`data_callback` of `from_batched_callback_with_"
                                      r"devices` must return .*`device_buffers\[0\]`"):
    GlobalDeviceArray.from_batched_callback_with_devices(
        (8, 2), mesh_2d, P("x"), lambda entries: [data[i] for i, ds in entries for _ in ds])


def test_shard_data_follows_python_indexing(mesh_2d):
  """`local_data(i)` indexes the local shards as a list does (the GDA era's
  `_local_shards[i].data`), a bool and a numpy integer included, as stock
  `jax.Array.addressable_data` takes them; errors name the method."""
  data = _global((8, 2))
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x", "y"), lambda i: data[i])
  stock = jax.device_put(data, gda.sharding)
  for i in (True, False, np.int64(3), -1):
    for got in (gda.local_data(i), gda.addressable_data(i)):
      assert got.devices() == stock.addressable_data(i).devices()
      np.testing.assert_array_equal(np.asarray(got), np.asarray(stock.addressable_data(i)))
  for method in ("local_data", "addressable_data"):
    with pytest.raises(IndexError, match=rf"`{method}\(8\)` is out of range"):
      getattr(gda, method)(8)
    for bad in (1.0, None, "0", slice(0, 2)):
      with pytest.raises(TypeError, match=f"`{method}`"):
        getattr(gda, method)(bad)
