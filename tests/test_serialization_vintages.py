"""`jax_sharding_ext.serialization` takes GDA-era code of every vintage and
writes what that code wrote:

- both calling conventions of the deserialization functions, the
  `(mesh, mesh_axes, ...)` one of JAX 0.3.17 to 0.3.21 and the
  `(sharding, ...)` one of JAX 0.3.22 to 0.4.x, by position and by every
  keyword of either; a mixture of the two is a TypeError naming both;
- by default the metadata of the GDA-era module (zarr, gzip, one chunk per
  shard, and `_get_metadata(arr)['dtype']`); with `metadata="stock"` stock
  `array_serialization`'s; checkpoints of either kind, and stock's, restore.
"""

import asyncio
import copy
import inspect
import json
import pydoc
import shutil
import typing

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from jax.experimental.array_serialization import serialization as stock
from jax.experimental.array_serialization import tensorstore_impl as stock_impl
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization
from jax_sharding_ext._checkpoint import args as _checkpoint_args


def _gda(mesh, spec, shape=(8, 4), dtype=np.float32, offset=0):
  data = (np.arange(np.prod(shape)) + offset).astype(dtype).reshape(shape)
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def _spec(tmp_path, name):
  return serialization.get_tensorstore_spec(str(tmp_path / name))


def _zarray(tmp_path, name):
  return json.loads((tmp_path / name / ".zarray").read_text())


# -- the two calling conventions ------------------------------------------------------


def _bare(sig):
  return str(sig.replace(parameters=[p.replace(annotation=p.empty)
                                     for p in sig.parameters.values()]))


def test_the_two_forms_are_the_old_signatures():
  """As written in jax/experimental/gda_serialization/serialization.py at
  jax-v0.3.21 (mesh form) and jax-v0.4.1 (sharding form; the same at
  jax-v0.3.22); the manager's forms also take stock's `concurrent_gb`."""
  forms = {f.fn: f for f in (_checkpoint_args.ASYNC_DESERIALIZE,
                             _checkpoint_args.RUN_DESERIALIZATION,
                             _checkpoint_args.MANAGER_DESERIALIZE)}
  assert _bare(forms["async_deserialize"].mesh) == (
      "(mesh, mesh_axes, tensorstore_spec, global_shape=None, dtype=None, byte_limiter=None)")
  assert _bare(forms["async_deserialize"].sharding) == (
      "(in_sharding, tensorstore_spec, global_shape=None, dtype=None, byte_limiter=None)")
  assert _bare(forms["run_deserialization"].mesh) == (
      "(global_meshes, mesh_axes, tensorstore_specs, global_shapes=None, dtypes=None, "
      "concurrent_gb=32)")
  assert _bare(forms["run_deserialization"].sharding) == (
      "(shardings, tensorstore_specs, global_shapes=None, dtypes=None, concurrent_gb=32)")
  assert _bare(forms["GlobalAsyncCheckpointManager.deserialize"].mesh) == (
      "(global_meshes, mesh_axes, tensorstore_specs, global_shapes=None, dtypes=None, "
      "concurrent_gb=32)")
  assert _bare(forms["GlobalAsyncCheckpointManager.deserialize"].sharding) == (
      "(shardings, tensorstore_specs, global_shapes=None, dtypes=None, concurrent_gb=32)")


def _without_self(sig):
  return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "self"])


def _untyped(sig):
  return _bare(sig.replace(return_annotation=inspect.Signature.empty))


@pytest.mark.parametrize("fn, forms", [
    (serialization.async_deserialize, _checkpoint_args.ASYNC_DESERIALIZE),
    (serialization.run_deserialization, _checkpoint_args.RUN_DESERIALIZATION),
    (serialization.GlobalAsyncCheckpointManager.deserialize,
     _checkpoint_args.MANAGER_DESERIALIZE)], ids=lambda x: getattr(x, "__name__", ""))
def test_each_form_is_a_typed_overload_that_help_shows(fn, forms):
  """Type checkers and IDEs see one `typing.overload` per form, with the
  parameter names, defaults and types the call is bound by;
  `inspect.signature` and `help()` show the sharding form's real parameters
  (not `*args, **kwargs`), and the docstring both forms."""
  mesh_form, sharding_form = (_without_self(inspect.signature(o))
                              for o in typing.get_overloads(fn))
  assert _untyped(mesh_form) == _bare(forms.mesh)
  assert _untyped(sharding_form) == _bare(forms.sharding)
  for form in (mesh_form, sharding_form):
    assert all(p.annotation is not p.empty for p in form.parameters.values()), form
    assert form.return_annotation is not form.empty
  assert "Mesh" in str(mesh_form.parameters[forms.names(_checkpoint_args.MESH)[0]].annotation)
  shown = inspect.signature(fn)
  assert _without_self(shown) == sharding_form
  text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
  assert str(_without_self(shown).parameters[forms.names(_checkpoint_args.SHARDING)[0]]) in text
  assert "mesh_axes" in text and "*args" not in text


@pytest.fixture
def written(mesh_2d, tmp_path):
  gda, data = _gda(mesh_2d, P("x", "y"), dtype=np.int32)
  serialization.run_serialization([gda], [_spec(tmp_path, "g")])
  return lambda: _spec(tmp_path, "g"), data


def _async_calls(mesh, spec, limiter):
  s = NamedSharding(mesh, P("y"))
  big = ((12, 4), np.float32)
  return {  # name: (args, kwargs, whether global_shape / dtype are the big ones)
      "mesh positional": ((mesh, P("y"), spec()), {}, False),
      "mesh positional, all": ((mesh, P("y"), spec(), *big, limiter), {}, True),
      "mesh keywords": ((), dict(mesh=mesh, mesh_axes=P("y"), tensorstore_spec=spec(),
                                 global_shape=big[0], dtype=big[1], byte_limiter=limiter), True),
      "mesh mixed": ((mesh,), dict(mesh_axes=P("y"), tensorstore_spec=spec(),
                                   global_shape=big[0]), True),
      "sharding positional": ((s, spec()), {}, False),
      "sharding positional, all": ((s, spec(), *big, limiter), {}, True),
      "sharding keywords": ((), dict(in_sharding=s, tensorstore_spec=spec(),
                                     global_shape=big[0], dtype=big[1],
                                     byte_limiter=limiter), True),
      "sharding mixed": ((s,), dict(tensorstore_spec=spec(), dtype=big[1]), False),
  }


def _check_restored(out, data, mesh, padded):
  assert type(out) is GlobalDeviceArray and out.mesh == mesh and out.mesh_axes == P("y")
  want = data
  if padded is True:
    want = np.zeros((12, 4), np.float32)
    want[:8] = data
  np.testing.assert_array_equal(np.asarray(out), want)
  for shard in out.local_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), want[shard.index])


@pytest.mark.parametrize("name", ["mesh positional", "mesh positional, all", "mesh keywords",
                                  "mesh mixed", "sharding positional",
                                  "sharding positional, all", "sharding keywords",
                                  "sharding mixed"])
def test_async_deserialize_takes_both_forms(mesh_2d, written, name):
  spec, data = written
  limiter = serialization._LimitInFlightBytes(10**9)
  args, kwargs, padded = _async_calls(mesh_2d, spec, limiter)[name]
  out = asyncio.run(serialization.async_deserialize(*args, **kwargs))
  _check_restored(out, data, mesh_2d, padded)
  if "mixed" in name and "sharding" in name:
    assert out.dtype == np.float32


def _many_calls(mesh, spec):
  s = NamedSharding(mesh, P("y"))
  return {
      "mesh positional": (([mesh], [P("y")], [spec()]), {}),
      "mesh positional, all": (([mesh], [P("y")], [spec()], [None], [None], 1), {}),
      "mesh keywords": ((), dict(global_meshes=[mesh], mesh_axes=[P("y")],
                                 tensorstore_specs=[spec()], global_shapes=None, dtypes=None)),
      "mesh tuples": (((mesh,), (P("y"),), (spec(),)), {}),
      "mesh generators": (((m for m in [mesh]), (a for a in [P("y")]), (s for s in [spec()])),
                          {}),
      "sharding positional": (([s], [spec()]), {}),
      "sharding positional, all": (([s], [spec()], [None], [None], 1), {}),
      "sharding keywords": ((), dict(shardings=[s], tensorstore_specs=[spec()],
                                     global_shapes=None, dtypes=None, concurrent_gb=1)),
      "sharding generator": (((x for x in [s]), [spec()]), {}),
  }


@pytest.mark.parametrize("name", ["mesh positional", "mesh positional, all", "mesh keywords",
                                  "mesh tuples", "mesh generators", "sharding positional",
                                  "sharding positional, all", "sharding keywords",
                                  "sharding generator"])
@pytest.mark.parametrize("via", ["run_deserialization", "manager.deserialize"])
def test_run_deserialization_and_the_manager_take_both_forms(mesh_2d, written, name, via):
  spec, data = written
  args, kwargs = _many_calls(mesh_2d, spec)[name]
  if via == "run_deserialization":
    out, = serialization.run_deserialization(*args, **kwargs)
  else:
    out, = serialization.GlobalAsyncCheckpointManager().deserialize(*args, **kwargs)
  _check_restored(out, data, mesh_2d, padded=False)


@pytest.mark.parametrize("mesh_shape, names, spec", [
    ((8,), ("d",), P("d")), ((2, 4), ("a", "b"), P("b", "a")), ((4, 2), ("x", "y"), P()),
    ((2, 2, 2), ("p", "q", "r"), P(("p", "q"), "r")), ((4, 2), ("x", "y"), P("y", None)),
])
def test_a_named_sharding_gives_a_gda_with_its_spec_as_mesh_axes(
    mesh_factory, written, mesh_shape, names, spec):
  path, data = written
  mesh = mesh_factory(mesh_shape, names)
  out, = serialization.run_deserialization([NamedSharding(mesh, spec)], [path()])
  assert type(out) is GlobalDeviceArray and out.mesh == mesh and out.mesh_axes == spec
  assert out.sharding == NamedSharding(mesh, spec)
  for shard in out.local_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index])


def test_another_sharding_gives_a_jax_array(mesh_2d, written):
  """What JAX 0.4.1 returned with `jax_array` on (with it off it raised a
  ValueError): a GDA cannot have such a sharding."""
  path, data = written
  dev = jax.devices()[3]
  arr = asyncio.run(serialization.async_deserialize(SingleDeviceSharding(dev), path(), (4, 4)))
  assert type(arr) is not GlobalDeviceArray and isinstance(arr, jax.Array)
  assert arr.sharding == SingleDeviceSharding(dev)
  np.testing.assert_array_equal(np.asarray(arr), data[:4])
  named, single = serialization.run_deserialization(
      [NamedSharding(mesh_2d, P("x")), SingleDeviceSharding(dev)], [path(), path()])
  assert type(named) is GlobalDeviceArray and named.mesh_axes == P("x")
  assert type(single) is not GlobalDeviceArray
  np.testing.assert_array_equal(np.asarray(single), data)


def test_empty_sequences_in_either_form(mesh_2d):
  assert serialization.run_deserialization([], [], []) == []
  assert serialization.run_deserialization([], []) == []
  assert serialization.run_deserialization(shardings=[], tensorstore_specs=[]) == []
  assert serialization.GlobalAsyncCheckpointManager().deserialize([], [], []) == []


ASYNC_FORMS = (r"`async_deserialize` takes \(mesh, mesh_axes, tensorstore_spec, .*\) as in "
               r"JAX 0.3.17 to 0.3.21, or \(in_sharding, tensorstore_spec, .*\) as in JAX 0.3.22 "
               r"to 0.4.x; ")
RUN_FORMS = (r"`run_deserialization` takes \(global_meshes, mesh_axes, tensorstore_specs, .*\) "
             r"as in JAX 0.3.17 to 0.3.21, or \(shardings, tensorstore_specs, .*\) as in JAX "
             r"0.3.22 to 0.4.x; ")


def _bad_calls(mesh, spec):
  def s():  # built when called: the names are collected without a mesh
    return NamedSharding(mesh, P("x"))

  a = serialization.async_deserialize
  r = serialization.run_deserialization
  return {
      "sharding with positional mesh_axes": (
          lambda: a(s(), P("x"), spec),
          ASYNC_FORMS + r"tensorstore_spec is P(artitionSpec)?\('x',\), which looks like mesh "
          r"axes. A Sharding carries its mesh axes"),
      "sharding with keyword mesh_axes": (
          lambda: a(s(), spec, mesh_axes=P("x")), ASYNC_FORMS + r"with a Sharding first: got an "
          r"unexpected keyword argument 'mesh_axes'. A Sharding carries its mesh axes"),
      "mesh with a sharding for mesh_axes": (
          lambda: a(mesh, s(), spec), ASYNC_FORMS + "mesh_axes is a Sharding, which already says "
          "where the array goes. Pass the sharding alone"),
      "mesh with in_sharding": (
          lambda: a(mesh, P("x"), spec, in_sharding=s()), ASYNC_FORMS + "with a Mesh first: got an "
          "unexpected keyword argument 'in_sharding'. A Mesh goes with mesh_axes"),
      "a sharding as `mesh`": (
          lambda: a(mesh=s(), tensorstore_spec=spec), ASYNC_FORMS + "`mesh` is a Sharding. Pass "
          "it as `in_sharding`"),
      "a mesh as `in_sharding`": (
          lambda: a(in_sharding=mesh, mesh_axes=P(), tensorstore_spec=spec),
          ASYNC_FORMS + "`in_sharding` is a Mesh. Pass it as `mesh`"),
      "both first keywords": (
          lambda: a(mesh=mesh, in_sharding=s(), tensorstore_spec=spec),
          ASYNC_FORMS + "got both `mesh` and `in_sharding`"),
      "neither": (lambda: a(tensorstore_spec=spec), ASYNC_FORMS + "got neither"),
      "neither a mesh nor a sharding": (
          lambda: a(P("x"), spec), ASYNC_FORMS + r"the first argument is a P(artitionSpec)?, "
          "neither a jax.sharding.Mesh nor a jax.sharding.Sharding"),
      "not a spec": (lambda: a(s(), 3), r"`async_deserialize`: tensorstore_spec must be a "
                                      r"tensorstore spec \(a dict"),
      "meshes with shardings": (
          lambda: r([mesh, s()], [P(), P()], [spec, spec]),
          RUN_FORMS + "the first argument mixes meshes and shardings"),
      "shardings with mesh_axes": (
          lambda: r([s()], [P("x")], [spec]), RUN_FORMS + r"tensorstore_specs\[0\] is "
          r"P(artitionSpec)?\('x',\), which looks like mesh axes"),
      "meshes with shardings for mesh_axes": (
          lambda: r([mesh], [s()], [spec]), RUN_FORMS + r"mesh_axes\[0\] is a Sharding"),
      "shardings with a mesh_axes keyword": (
          lambda: r([s()], [spec], mesh_axes=[P("x")]), RUN_FORMS + "with a Sharding first: got "
          "an unexpected keyword argument 'mesh_axes'"),
      "one sharding, not a list": (
          lambda: r(s(), [spec]), RUN_FORMS + "the first argument must be a sequence"),
      "one spec, not a list": (
          lambda: r([s()], spec), r"`run_deserialization`: tensorstore_specs must be a sequence "
                                r"of tensorstore specs"),
      "neither, in a list": (
          lambda: r(["mesh"], [P("x")], [spec]), r"`run_deserialization`: global_meshes\[0\] "
          r"must be a jax.sharding.Mesh \(the mesh, mesh_axes form\) or shardings\[0\] a "
          r"jax.sharding.Sharding"),
      "manager, mixed": (
          lambda: serialization.GlobalAsyncCheckpointManager().deserialize(
              [s()], [P("x")], [spec]),
          r"`GlobalAsyncCheckpointManager.deserialize` takes \(global_meshes, .*, or "
          r"\(shardings, .*; tensorstore_specs\[0\] is P(artitionSpec)?\('x',\)"),
  }


@pytest.mark.parametrize("name", list(_bad_calls(None, None)))
def test_a_mixture_of_the_two_forms_is_a_type_error_naming_both(mesh_2d, written, name):
  fn, match = _bad_calls(mesh_2d, written[0]())[name]
  with pytest.raises(TypeError, match=match):
    out = fn()
    if asyncio.iscoroutine(out):
      asyncio.run(out)


def test_the_old_checks_hold_in_the_sharding_form(mesh_2d, written, tmp_path):
  spec, _ = written
  s = NamedSharding(mesh_2d, P("x"))
  with pytest.raises(ValueError, match=r"got 1 tensorstore_specs but 2 shardings"):
    serialization.run_deserialization([s, s], [spec()])
  with pytest.raises(TypeError, match=r"dtypes\[0\] is not a dtype: 'float99'"):
    serialization.run_deserialization([s], [spec()], None, ["float99"])
  with pytest.raises(ValueError, match=r"global_shape \(8,\) has rank 1, but the stored"):
    serialization.run_deserialization([s], [spec()], [(8,)])
  with pytest.raises(ValueError, match=f"no checkpoint at '{tmp_path}/missing'"):
    serialization.run_deserialization([s], [_spec(tmp_path, "missing")])
  with pytest.raises(ValueError, match=r"Dimension 0 of `global_shape` \(6, 4\) has size 6, "
                                       "which is not divisible by 4"):
    serialization.run_deserialization([NamedSharding(mesh_2d, P("x", "y"))], [spec()],
                                      [(6, 4)])


def test_the_commit_check_sees_through_a_cast_spec(mesh_2d, written):
  """GDA-era orbax read through a 'cast' spec around the array's own spec; a
  checkpoint that still has its commit marker is refused that way too."""
  spec, _ = written
  cast = {"driver": "cast", "dtype": "float32", "base": spec()}
  out = asyncio.run(serialization.async_deserialize(NamedSharding(mesh_2d, P()), cast))
  assert out.dtype == np.float32
  marker = spec()["kvstore"]["path"] + "/" + serialization.COMMIT_MARKER
  with open(marker, "wb") as f:
    f.write(b"")
  with pytest.raises(ValueError, match="was never committed"):
    asyncio.run(serialization.async_deserialize(NamedSharding(mesh_2d, P()), cast))


# -- the metadata written --------------------------------------------------------------


def _old_zarray(shape, chunks, dtype):
  """The `.zarray` tensorstore writes for the metadata of the GDA-era
  `_get_metadata` (jax-v0.3.21): gzip, chunks of the shard shape, dtype."""
  return {"chunks": list(chunks), "compressor": {"id": "gzip", "level": 1},
          "dimension_separator": ".", "dtype": dtype, "fill_value": None, "filters": None,
          "order": "C", "shape": list(shape), "zarr_format": 2}


def _save_run(arr, spec, **kw):
  serialization.run_serialization([arr], [spec], **kw)


def _save_async(arr, spec, **kw):
  asyncio.run(serialization.async_serialize(arr, spec, **kw))


def _save_manager(arr, spec, **kw):
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([arr], [spec], on_commit_callback=lambda: None, **kw)
  manager.wait_until_finished()


SAVES = {"run_serialization": _save_run, "async_serialize": _save_async,
         "manager.serialize": _save_manager}

# name: (shape, mesh axes, dtype, the old metadata's chunks and zarr dtype)
ARRAYS = {
    "float32 over both axes": ((8, 4), P("x", "y"), np.float32, (2, 2), "<f4"),
    "int32 over x": ((8, 4), P("x"), np.int32, (2, 4), "<i4"),
    "bfloat16 replicated": ((8, 4), P(), jnp.bfloat16, (8, 4), "bfloat16"),
    "rank 3": ((4, 6, 8), P(None, "y", "x"), np.float16, (4, 3, 2), "<f2"),
    "scalar": ((), P(), np.int32, (), "<i4"),
    "zero-size": ((0, 4), P(None, "y"), np.float32, (1, 2), "<f4"),
    "bool": ((8,), P("x"), np.bool_, (2,), "|b1"),
    "float8": ((8,), P("x"), ml_dtypes.float8_e4m3fn, (2,), "float8_e4m3fn"),
}


@pytest.mark.parametrize("save", list(SAVES))
@pytest.mark.parametrize("case", list(ARRAYS))
def test_the_default_writes_exactly_the_old_metadata(mesh_2d, tmp_path, case, save):
  shape, axes, dtype, chunks, zdtype = ARRAYS[case]
  gda, data = _gda(mesh_2d, axes, shape, dtype)
  got = serialization._get_metadata(gda)
  assert set(got) == {"compressor", "shape", "chunks", "dtype"}
  assert got["shape"] == shape and got["dtype"] == zdtype
  assert got["compressor"] == {"id": "gzip"} and isinstance(got["chunks"], np.ndarray)
  assert tuple(got["chunks"].tolist()) == chunks
  assert serialization._get_metadata(gda.to_jax_array())["dtype"] == zdtype
  spec = _spec(tmp_path, "a")
  SAVES[save](gda, spec)
  assert _zarray(tmp_path, "a") == _old_zarray(shape, chunks, zdtype)
  assert spec == _spec(tmp_path, "a")  # the caller's spec is left as it was
  out, = serialization.run_deserialization([NamedSharding(mesh_2d, axes)], [_spec(tmp_path, "a")])
  np.testing.assert_array_equal(np.asarray(out), data)


def test_get_metadata_del_dtype_as_t5x_and_orbax_did(mesh_2d, tmp_path):
  """t5x's `_get_parameter_infos` and orbax's `ArrayHandler` (2022) took the
  old metadata, deleted its 'dtype' and put the dtype in the spec instead."""
  gda, data = _gda(mesh_2d, P("x", "y"))
  metadata = serialization._get_metadata(gda)
  del metadata["dtype"]
  assert "dtype" in serialization._get_metadata(gda)  # a new dict each time
  spec = {"driver": "zarr", "dtype": jnp.dtype(gda.dtype).name, "metadata": metadata,
          "kvstore": {"driver": "file", "path": str(tmp_path / "w")}}
  asyncio.run(serialization.async_serialize(gda, spec))
  assert _zarray(tmp_path, "w") == _old_zarray((8, 4), (2, 2), "<f4")
  out = asyncio.run(serialization.async_deserialize(mesh_2d, P("y"), _spec(tmp_path, "w")))
  np.testing.assert_array_equal(np.asarray(out), data)
  with pytest.raises(TypeError, match="_get_metadata` takes a GlobalDeviceArray or a concrete "
                                      "jax.Array, got ndarray"):
    serialization._get_metadata(data)


@pytest.mark.parametrize("save", list(SAVES))
def test_a_spec_saved_once_means_the_same_the_next_time(mesh_2d, tmp_path, save):
  """A save never writes into the caller's spec, so one spec dict saved with
  the default metadata and then with `metadata="stock"` writes zstd the second
  time (the first save's gzip metadata filled into the dict used to win
  silently). Stock `array_serialization` does fill its metadata into the
  caller's spec; it has no metadata choice for that to override."""
  gda, data = _gda(mesh_2d, P("x", "y"))
  stock_spec = stock.get_tensorstore_spec(str(tmp_path / "stock"))
  asyncio.run(stock.async_serialize(gda.to_jax_array(), stock_spec))
  assert "metadata" in stock_spec  # stock's own behaviour
  spec = _spec(tmp_path, "a")
  want = copy.deepcopy(spec)
  SAVES[save](gda, spec)
  assert spec == want and _zarray(tmp_path, "a")["compressor"]["id"] == "gzip"
  shutil.rmtree(tmp_path / "a")
  SAVES[save](gda, spec, metadata="stock")
  assert spec == want and _zarray(tmp_path, "a")["compressor"]["id"] == "zstd"
  out, = serialization.run_deserialization([mesh_2d], [P("y")], [spec])
  np.testing.assert_array_equal(np.asarray(out), data)
  # Overwriting the zstd array in place with the default gzip is refused.
  with pytest.raises(ValueError, match="compressor"):
    SAVES[save](gda, spec)
  assert spec == want


@pytest.mark.parametrize("save", list(SAVES))
def test_metadata_stock_writes_what_stock_writes(mesh_2d, tmp_path, save):
  gda, data = _gda(mesh_2d, P("x", "y"))
  SAVES[save](gda, _spec(tmp_path, "ours"), metadata="stock")
  stock.run_serialization([gda.to_jax_array()], [stock.get_tensorstore_spec(
      str(tmp_path / "stock"))])
  ours = _zarray(tmp_path, "ours")
  assert ours == _zarray(tmp_path, "stock")
  assert ours["compressor"]["id"] == "zstd" and ours["chunks"] == [2, 2]
  out, = serialization.run_deserialization([mesh_2d], [P()], [_spec(tmp_path, "ours")])
  np.testing.assert_array_equal(np.asarray(out), data)


def test_metadata_in_the_spec_is_used_as_given(mesh_2d, tmp_path):
  gda, data = _gda(mesh_2d, P("x", "y"))
  for choice in ("gda_serialization", "stock"):
    spec = dict(_spec(tmp_path, choice),
                metadata={"shape": [8, 4], "chunks": [4, 4], "compressor": None})
    serialization.run_serialization([gda], [spec], metadata=choice)
    got = _zarray(tmp_path, choice)
    assert got["chunks"] == [4, 4] and got["compressor"] is None
    out, = serialization.run_deserialization([mesh_2d], [P("x")], [_spec(tmp_path, choice)])
    np.testing.assert_array_equal(np.asarray(out), data)


def _write(how, arr, tmp_path, name):
  if how == "stock array_serialization":
    stock.run_serialization([arr.to_jax_array()], [stock.get_tensorstore_spec(
        str(tmp_path / name))])
  else:
    serialization.run_serialization([arr], [_spec(tmp_path, name)], metadata=how)


@pytest.mark.parametrize("how", ["gda_serialization", "stock", "stock array_serialization"])
def test_every_kind_of_checkpoint_restores_every_way(mesh_2d, mesh_1d, tmp_path, how):
  gda, data = _gda(mesh_2d, P("x", "y"))
  _write(how, gda, tmp_path, "c")
  path = lambda: _spec(tmp_path, "c")
  s = NamedSharding(mesh_1d, P("x"))
  outs = [
      *serialization.run_deserialization([mesh_1d], [P("x")], [path()]),
      *serialization.run_deserialization([s], [path()]),
      asyncio.run(serialization.async_deserialize(mesh_1d, P("x"), path())),
      asyncio.run(serialization.async_deserialize(s, path())),
      *serialization.GlobalAsyncCheckpointManager().deserialize([s], [path()]),
  ]
  for out in outs:
    assert type(out) is GlobalDeviceArray and out.mesh_axes == P("x")
    np.testing.assert_array_equal(np.asarray(out), data)
  arr, = stock.run_deserialization([s], [stock.get_tensorstore_spec(str(tmp_path / "c"))])
  np.testing.assert_array_equal(np.asarray(arr), data)


def test_a_stock_zarr3_checkpoint_restores(mesh_2d, tmp_path):
  """Stock's own default format today (zarr3), through its own spec."""
  gda, data = _gda(mesh_2d, P("x", "y"))
  spec = stock_impl.get_tensorstore_spec(str(tmp_path / "z3"), ocdbt=False)
  asyncio.run(stock_impl.async_serialize(gda.to_jax_array(), spec))
  spec = stock_impl.get_tensorstore_spec(str(tmp_path / "z3"), ocdbt=False)
  assert spec["driver"] == "zarr3"
  out, = serialization.run_deserialization([NamedSharding(mesh_2d, P("y"))], [spec])
  assert type(out) is GlobalDeviceArray
  np.testing.assert_array_equal(np.asarray(out), data)


@pytest.mark.parametrize("save", list(SAVES))
def test_a_bad_metadata_choice_is_refused_before_anything_is_written(mesh_2d, tmp_path, save):
  gda, _ = _gda(mesh_2d, P("x"))
  with pytest.raises(ValueError, match=r"metadata must be 'gda_serialization' \(the default: "
                                       r"gzip, .*\) or 'stock' .*got 'zstd'"):
    SAVES[save](gda, _spec(tmp_path, "a"), metadata="zstd")
  with pytest.raises(TypeError, match="metadata must be .* got dict. To give the metadata "
                                      "itself, put it under the tensorstore spec's 'metadata'"):
    SAVES[save](gda, _spec(tmp_path, "a"), metadata={"compressor": None})
  assert list(tmp_path.iterdir()) == []


def test_the_old_metadata_opens_without_zstd(mesh_2d, tmp_path):
  """Readers before tensorstore 0.1.35 had no zstd: what the package writes by
  default needs only gzip, which every zarr reader has (here: numpy's zlib,
  with the chunk layout of the `.zarray`)."""
  import zlib
  gda, data = _gda(mesh_2d, P("x", "y"))
  serialization.run_serialization([gda], [_spec(tmp_path, "g")])
  meta = _zarray(tmp_path, "g")
  rows, cols = meta["chunks"]
  for i in range(4):
    for j in range(2):
      raw = zlib.decompress((tmp_path / "g" / f"{i}.{j}").read_bytes(), wbits=31)
      chunk = np.frombuffer(raw, dtype=meta["dtype"]).reshape(rows, cols)
      np.testing.assert_array_equal(chunk, data[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols])
  t = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "g")}},
              open=True).result()
  np.testing.assert_array_equal(t.read().result(), data)
