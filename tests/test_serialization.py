"""`jax_sharding_ext.serialization`: the old API surface, interchange with
stock `array_serialization`, restoring onto other meshes, the manager's
commit semantics, partial checkpoints and bad input. What each restored shard
holds is in test_serialization_shards.py."""

import asyncio
import inspect
import os
import pathlib
import sys
import threading
import tomllib

import _stock
import jax
import numpy as np
import pytest
import tensorstore as ts
from jax.experimental.array_serialization import serialization as stock
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization

REPO = pathlib.Path(__file__).parent.parent

# The public functions of jax/experimental/gda_serialization/serialization.py
# whose signatures were the same from jax-v0.3.17 to jax-v0.4.1, as written
# there; the write functions and `serialize` also take a keyword-only
# `metadata`. The two forms of the deserialization functions are checked in
# test_serialization_vintages.py.
OLD_SIGNATURES = {
    "create_async_array_from_callback": "(global_shape, inp_sharding, data_callback)",
    "create_async_gda_from_callback": "(global_shape, global_mesh, mesh_axes, data_callback)",
    "get_tensorstore_spec": "(ckpt_path)",
    "async_serialize": "(arr_inp, tensorstore_spec, commit_future=None, *, "
                       "metadata='gda_serialization')",
    "run_serialization": "(arrays, tensorstore_specs, *, metadata='gda_serialization')",
    "estimate_read_memory_footprint": "(t)",
}
OLD_METHODS = {
    "check_for_errors": "(self)",
    "wait_until_finished": "(self)",
}


def _bare(sig: inspect.Signature) -> str:
  """A signature without annotations, as the old untyped code reads."""
  return str(sig.replace(
      parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
      return_annotation=sig.empty))


def test_old_public_names_and_signatures():
  for name, sig in OLD_SIGNATURES.items():
    assert _bare(inspect.signature(getattr(serialization, name))) == sig, name
  for name in ("create_async_array_from_callback", "create_async_gda_from_callback",
               "async_serialize", "async_deserialize"):
    assert inspect.iscoroutinefunction(getattr(serialization, name)), name
  for cls in (serialization.GlobalAsyncCheckpointManagerBase,
              serialization.GlobalAsyncCheckpointManager):
    for name, sig in OLD_METHODS.items():
      assert _bare(inspect.signature(getattr(cls, name))) == sig, (cls, name)
  assert _bare(inspect.signature(serialization.GlobalAsyncCheckpointManager.serialize)) == (
      "(self, arrays, tensorstore_specs, *, on_commit_callback, metadata='gda_serialization')")
  assert _bare(inspect.signature(serialization.AsyncManager)) == "(timeout_secs=300)"
  assert _bare(inspect.signature(serialization.GlobalAsyncCheckpointManager)) == (
      "(timeout_secs=300)")
  assert issubclass(serialization.GlobalAsyncCheckpointManager,
                    serialization.GlobalAsyncCheckpointManagerBase)
  assert issubclass(serialization.GlobalAsyncCheckpointManager, serialization.AsyncManager)
  assert isinstance(serialization.TS_CONTEXT, ts.Context)
  assert serialization._spec_has_metadata({"metadata": {}})
  assert set(serialization.__all__) >= set(OLD_SIGNATURES) | {
      "async_deserialize", "run_deserialization"}


def test_get_tensorstore_spec_matches_the_old_specs():
  assert serialization.get_tensorstore_spec("/ckpt/a") == {
      "driver": "zarr", "kvstore": {"driver": "file", "path": "/ckpt/a"}}
  assert serialization.get_tensorstore_spec("gs://bucket/dir/a") == {
      "driver": "zarr", "kvstore": {"driver": "gcs", "bucket": "bucket", "path": "dir/a"}}
  with pytest.raises(ValueError, match="should contain the bucket name"):
    serialization.get_tensorstore_spec("gs://bucket")


@pytest.mark.parametrize("spec, has", [
    ({"driver": "zarr", "kvstore": {"driver": "file", "path": "/c/w"},
      "metadata": {"shape": [8, 4], "chunks": [2, 2]}}, True),
    ({"driver": "cast", "dtype": "float32",
      "base": {"driver": "zarr", "metadata": {"shape": [8]}}}, True),
    ({"base": {"base": {"metadata": None}}}, True),
    ({"driver": "cast", "dtype": "float32",
      "base": {"driver": "zarr", "kvstore": {"driver": "file", "path": "/c/metadata"}}}, False),
    (serialization.get_tensorstore_spec("/c/w"), False),
    ({}, False),
], ids=["top level", "in the base of a cast", "deeply nested, None", "only as a value",
        "a fresh spec", "empty"])
def test_spec_has_metadata_finds_the_key_in_any_nested_dict(spec, has):
  """A spec carries metadata when a 'metadata' key sits in it or in any dict
  within it, whatever its value; the word as a value does not count."""
  assert serialization._spec_has_metadata(spec) is has


def test_base_install_keeps_four_runtime_dependencies():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  names = [d.split(">")[0].split("<")[0].split("=")[0] for d in project["dependencies"]]
  assert names == ["jax", "jaxlib", "numpy", "typing-extensions"]
  checkpoint = " ".join(project["optional-dependencies"]["checkpoint"])
  assert "tensorstore" in checkpoint and "orbax-checkpoint" in checkpoint
  assert "jax_sharding_ext.serialization" not in sys.modules or "tensorstore" in sys.modules


def _gda(mesh, spec, shape=(8, 4), dtype=np.float32):
  data = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def _spec(tmp_path, name):
  return serialization.get_tensorstore_spec(str(tmp_path / name))


def test_a_gda_checkpoint_restores_with_stock_as_a_jax_array(mesh_2d, tmp_path):
  gda, data = _gda(mesh_2d, P("x", "y"))
  serialization.run_serialization([gda], [_spec(tmp_path, "g")])
  out, = stock.run_deserialization([NamedSharding(mesh_2d, P("y"))], [_spec(tmp_path, "g")])
  assert type(out) is not GlobalDeviceArray and isinstance(out, jax.Array)
  np.testing.assert_array_equal(np.asarray(out), data)


def test_a_stock_checkpoint_restores_as_a_gda(mesh_2d, tmp_path):
  data = np.arange(32, dtype=np.float32).reshape(8, 4)
  arr = jax.device_put(data, NamedSharding(mesh_2d, P("x")))
  stock.run_serialization([arr], [_spec(tmp_path, "a")])
  out, = serialization.run_deserialization([mesh_2d], [P("x", "y")], [_spec(tmp_path, "a")])
  assert type(out) is GlobalDeviceArray and out.mesh_axes == P("x", "y")
  np.testing.assert_array_equal(np.asarray(out), data)


@pytest.mark.parametrize("mesh_shape, names, spec", [
    ((8,), ("d",), P("d")), ((2, 4), ("a", "b"), P("b", "a")), ((4, 2), ("x", "y"), P(None)),
    ((2, 2, 2), ("p", "q", "r"), P(("p", "q"), "r")), ((4, 2), ("x", "y"), P("y", None)),
])
def test_restore_onto_another_mesh_and_mesh_axes(mesh_2d, mesh_factory, tmp_path,
                                                 mesh_shape, names, spec):
  gda, data = _gda(mesh_2d, P("x", "y"))
  serialization.run_serialization([gda], [_spec(tmp_path, "g")])
  mesh = mesh_factory(mesh_shape, names)
  out, = serialization.run_deserialization([mesh], [spec], [_spec(tmp_path, "g")])
  assert out.mesh == mesh and out.mesh_axes == spec
  np.testing.assert_array_equal(np.asarray(out), data)
  for s in out.local_shards:
    np.testing.assert_array_equal(np.asarray(s.data), data[s.index])


def test_global_shape_pads_truncates_and_dtype_casts(mesh_2d, tmp_path):
  gda, data = _gda(mesh_2d, P("x", "y"), dtype=np.int32)
  serialization.run_serialization([gda], [_spec(tmp_path, "g")])
  small, big = serialization.run_deserialization(
      [mesh_2d, mesh_2d], [P("x"), P("x", "y")], [_spec(tmp_path, "g")] * 2,
      [(4, 2), (12, 6)], [None, np.float32])
  np.testing.assert_array_equal(np.asarray(small), data[:4, :2])
  assert small.dtype == np.int32 and big.dtype == np.float32
  want = np.zeros((12, 6), np.float32)
  want[:8, :4] = data
  np.testing.assert_array_equal(np.asarray(big), want)


def test_create_async_gda_from_callback(mesh_2d):
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  seen = []

  async def cb(index):
    seen.append(index)
    await asyncio.sleep(0)
    return data[index]
  gda = asyncio.run(serialization.create_async_gda_from_callback(
      (8, 2), mesh_2d, P("x", "y"), cb))
  assert type(gda) is GlobalDeviceArray and gda.mesh_axes == P("x", "y")
  assert len(seen) == 8
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_estimate_read_memory_footprint():
  t = ts.open({"driver": "zarr", "kvstore": {"driver": "memory"},
               "metadata": {"shape": [100, 10], "chunks": [30, 10], "dtype": "<f4"}},
              create=True).result()
  assert serialization.estimate_read_memory_footprint(t) == 120 * 10 * 4  # whole chunks
  assert serialization.estimate_read_memory_footprint(ts.array(np.zeros((5, 3)))) == 5 * 3 * 8


def test_run_functions_work_inside_a_running_event_loop(mesh_2d, tmp_path):
  # A Jupyter cell runs inside an event loop, where asyncio.run() refuses.
  gda, data = _gda(mesh_2d, P("x"))

  async def cell():
    serialization.run_serialization([gda], [_spec(tmp_path, "g")])
    manager = serialization.GlobalAsyncCheckpointManager()
    manager.serialize([gda], [_spec(tmp_path, "m")], on_commit_callback=lambda: None)
    manager.wait_until_finished()
    return serialization.run_deserialization([mesh_2d] * 2, [P("y")] * 2,
                                             [_spec(tmp_path, "g"), _spec(tmp_path, "m")])
  for out in asyncio.run(cell()):
    np.testing.assert_array_equal(np.asarray(out), data)


@pytest.mark.parametrize("in_loop", [False, True], ids=["script", "inside an event loop"])
def test_the_transfer_guard_judges_checkpoint_calls_inside_an_event_loop_too(
    in_loop, mesh_2d, tmp_path):
  """Inside a running event loop (a notebook cell) the synchronous calls run
  their work on a helper thread; the caller's guard still judges them, as
  stock's judges the same calls on a `jax.Array` (a restore places host data
  explicitly: refused under "disallow_explicit"; whether a save's copies to
  the host are refused differs between JAX releases)."""
  gda, _ = _gda(mesh_2d, P("x"))
  arr, sharding = gda.to_jax_array(), NamedSharding(mesh_2d, P("x"))
  serialization.run_serialization([gda], [_spec(tmp_path, "saved")])
  manager = serialization.GlobalAsyncCheckpointManager()
  stock_manager = stock.GlobalAsyncCheckpointManager()
  calls = {  # name: (call, stock's call on a jax.Array, the path a save writes)
      "run_serialization": (
          lambda: serialization.run_serialization([gda], [_spec(tmp_path, "a")]),
          lambda: stock.run_serialization([arr], [_spec(tmp_path, "stock_a")]), "a"),
      "manager.serialize": (
          lambda: manager.serialize([gda], [_spec(tmp_path, "b")], on_commit_callback=lambda: None),
          lambda: stock_manager.serialize([arr], [_spec(tmp_path, "stock_b")],
                                          on_commit_callback=lambda: None), "b"),
      "run_deserialization": (
          lambda: serialization.run_deserialization([mesh_2d], [P("x")], [_spec(tmp_path, "saved")]),
          lambda: stock.run_deserialization([sharding], [_spec(tmp_path, "saved")]), None),
      "manager.deserialize": (
          lambda: manager.deserialize([sharding], [_spec(tmp_path, "saved")]),
          lambda: stock_manager.deserialize([sharding], [_spec(tmp_path, "saved")]), None),
  }

  def guarded(call):
    with jax.transfer_guard("disallow_explicit"):
      call()

  async def cell(call):
    guarded(call)

  refused = []
  for name, (call, stock_call, written) in calls.items():
    try:
      with _stock.settled():
        guarded(stock_call)
      stock_refused = False
    except jax.errors.JaxRuntimeError:
      stock_refused = True
    if stock_refused:
      refused.append(name)
      with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed"):
        asyncio.run(cell(call)) if in_loop else guarded(call)
      assert written is None or not (tmp_path / written).exists(), name
    else:
      asyncio.run(cell(call)) if in_loop else guarded(call)
  manager.wait_until_finished()
  stock_manager.wait_until_finished()
  assert {"run_deserialization", "manager.deserialize"} <= set(refused), refused


def test_a_float64_checkpoint_restores_as_float64_under_enable_x64_inside_an_event_loop(
    mesh_2d, tmp_path):
  """`jax.enable_x64` on the calling thread reaches the helper thread that
  restores inside an event loop: float64 stays float64, as outside a loop."""
  data = np.arange(16, dtype=np.float64).reshape(8, 2) / 3
  with jax.enable_x64(True):
    gda = GlobalDeviceArray.from_callback(data.shape, mesh_2d, P("x"), lambda i: data[i])
    serialization.run_serialization([gda], [_spec(tmp_path, "w")])

  async def cell():
    with jax.enable_x64(True):
      return (serialization.run_deserialization([mesh_2d], [P("x")], [_spec(tmp_path, "w")])[0],
              serialization.GlobalAsyncCheckpointManager().deserialize(
                  [NamedSharding(mesh_2d, P("x"))], [_spec(tmp_path, "w")])[0])
  for out in asyncio.run(cell()):
    assert out.dtype == np.float64, out.dtype
    with jax.enable_x64(True):
      np.testing.assert_array_equal(np.asarray(out), data)


# -- the manager ------------------------------------------------------------------


def test_manager_path_forms_save_with_markers_and_restore_gdas(mesh_2d, tmp_path):
  """Stock's `serialize_with_paths` / `deserialize_with_paths` go through the
  GDA-era manager: the callback may be left out, the save is committed (no
  marker left, chunk record written) and the restore gives GDAs; a
  tensorstore transaction, which markers and records cannot join, is refused
  before anything is written."""
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x", "y"), lambda i: data[i])
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize_with_paths([gda], [str(tmp_path / "w")])
  manager.wait_until_finished()
  assert not (tmp_path / "w" / serialization.COMMIT_MARKER).exists()
  assert (tmp_path / "w" / "jax_sharding_ext.chunks.0").exists()
  out, = manager.deserialize_with_paths([NamedSharding(mesh_2d, P("y"))], [str(tmp_path / "w")])
  assert isinstance(out, GlobalDeviceArray) and out.mesh_axes == P("y")
  np.testing.assert_array_equal(np.asarray(out), data)
  with pytest.raises(TypeError, match="does not take a tensorstore `transaction`"):
    manager.serialize_with_paths([gda], [str(tmp_path / "v")], transaction=ts.Transaction())
  assert not (tmp_path / "v").exists()


def test_manager_single_process_commits_in_the_background_exactly_once(mesh_2d, tmp_path):
  assert jax.process_count() == 1  # and jax.distributed was never initialised
  gda, data = _gda(mesh_2d, P("x", "y"))
  tmp, final = tmp_path / "tmp", tmp_path / "final"
  release, calls = threading.Event(), []

  def on_commit():
    release.wait(60)
    calls.append(threading.current_thread().name)
    os.rename(tmp, final)

  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([gda], [serialization.get_tensorstore_spec(str(tmp / "w"))],
                    on_commit_callback=on_commit)
  # serialize returned while the commit is still pending in the background.
  assert calls == [] and not final.exists()
  manager.check_for_errors()  # non-blocking, nothing failed
  gda.delete()  # the data was copied out: the training step may donate it
  release.set()
  manager.wait_until_finished()
  manager.wait_until_finished()
  assert len(calls) == 1 and calls[0] != threading.current_thread().name
  assert not (final / "w" / serialization.COMMIT_MARKER).exists()
  out, = manager.deserialize([mesh_2d], [P("x")],
                             [serialization.get_tensorstore_spec(str(final / "w"))])
  np.testing.assert_array_equal(np.asarray(out), data)


def test_a_failed_write_is_raised_and_its_checkpoint_refused(mesh_2d, tmp_path):
  spec = lambda: _spec(tmp_path, "g")  # a fresh dict each time: specs are filled in
  old, _ = _gda(mesh_2d, P("x", "y"))
  serialization.run_serialization([old], [spec()])
  # A directory where the first chunk goes: every check passes, the write fails
  # after the marker and the other chunks are written (a partial overwrite).
  (tmp_path / "g" / "0.0").unlink()
  (tmp_path / "g" / "0.0").mkdir()
  new, _ = _gda(mesh_2d, P("x", "y"))
  calls = []
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([new], [spec()], on_commit_callback=lambda: calls.append(1))
  with pytest.raises(ValueError, match="Is a directory"):
    manager.wait_until_finished()
  assert calls == []  # never committed
  manager.wait_until_finished()  # raised once, not again
  with pytest.raises(ValueError, match="was never committed .* may be partial"):
    serialization.run_deserialization([mesh_2d], [P("x")], [spec()])


def test_an_error_in_the_commit_callback_is_raised(mesh_2d, tmp_path):
  gda, _ = _gda(mesh_2d, P("x"))
  manager = serialization.GlobalAsyncCheckpointManager()

  def boom():
    raise OSError("rename failed")
  manager.serialize([gda], [_spec(tmp_path, "g")], on_commit_callback=boom)
  with pytest.raises(OSError, match="rename failed"):
    manager.wait_until_finished()


# -- bad input: a clear error, and nothing written ------------------------------------


def test_bad_input_is_a_clear_error_and_writes_nothing(mesh_2d, tmp_path):
  gda, _ = _gda(mesh_2d, P("x"))
  specs = [_spec(tmp_path, "a"), _spec(tmp_path, "b")]
  with pytest.raises(TypeError, match=r"arrays\[1\] must be a GlobalDeviceArray or a "
                                      r"jax.Array, got ndarray"):
    serialization.run_serialization([gda, np.ones(3)], specs)
  with pytest.raises(TypeError, match=r"arrays\[0\] must be .* got float"):
    serialization.GlobalAsyncCheckpointManager().serialize(
        [1.0], specs[:1], on_commit_callback=lambda: None)
  with pytest.raises(ValueError, match="got 2 arrays but 1 tensorstore_specs"):
    serialization.run_serialization([gda, gda], specs[:1])
  with pytest.raises(TypeError, match="wrap a single array in a list"):
    serialization.run_serialization(gda, specs[:1])
  with pytest.raises(TypeError, match="on_commit_callback must be callable"):
    serialization.GlobalAsyncCheckpointManager().serialize([gda], specs[:1],
                                                           on_commit_callback=None)
  assert list(tmp_path.iterdir()) == []  # nothing written

  serialization.run_serialization([gda], specs[:1])
  with pytest.raises(ValueError, match=f"no checkpoint at '{tmp_path}/missing'"):
    serialization.run_deserialization([mesh_2d], [P("x")], [_spec(tmp_path, "missing")])
  with pytest.raises(ValueError, match=r"global_shape \(8,\) has rank 1, but the stored "
                                       r"array has rank 2"):
    serialization.run_deserialization([mesh_2d], [P("x")], specs[:1], [(8,)])
  with pytest.raises(TypeError, match=r"dtypes\[0\] is not a dtype: 'float99'"):
    serialization.run_deserialization([mesh_2d], [P("x")], specs[:1], None, ["float99"])
  with pytest.raises(ValueError, match="got 1 tensorstore_specs but 2 mesh_axes"):
    serialization.run_deserialization([mesh_2d], [P("x"), P()], specs[:1])
  with pytest.raises(TypeError, match=r"global_meshes\[0\] must be a jax.sharding.Mesh"):
    serialization.run_deserialization(["mesh"], [P("x")], specs[:1])
  with pytest.raises(ValueError, match="mesh axis 'z'"):
    serialization.run_deserialization([mesh_2d], [P("z")], specs[:1])


@pytest.mark.parametrize("dtype", ["U3", "O", "V8", [("a", "<f4")]])
def test_a_restore_dtype_no_jax_array_has_is_a_type_error_naming_it(mesh_2d, tmp_path, dtype):
  """Numpy understands these dtypes, JAX arrays cannot have them: the restore
  refuses them by name before reading (stock fails inside the read with
  JAX's or numpy's own error, naming no argument)."""
  gda, _ = _gda(mesh_2d, P("x"))
  spec = _spec(tmp_path, "a")
  serialization.run_serialization([gda], [spec])
  with pytest.raises(TypeError, match=r"dtypes\[0\] is .*, which a JAX array cannot have; "
                                      "give a numeric or bool dtype"):
    serialization.run_deserialization([mesh_2d], [P("x")], [spec], None, [dtype])
  with pytest.raises(TypeError, match=r"dtype is .*, which a JAX array cannot have"):
    asyncio.run(serialization.async_deserialize(mesh_2d, P("x"), spec, dtype=dtype))
