"""Orbax checkpointing of pytrees with GlobalDeviceArray leaves
(`jax_sharding_ext.orbax_support`): PyTreeCheckpointer, CheckpointManager,
StandardCheckpointer, and stock orbax reading what we wrote."""

import subprocess
import sys
import textwrap

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint import checkpoint_utils, type_handlers

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, orbax_support


def _gda(mesh, spec, shape=(8, 8), offset=0.0):
  data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + offset
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def _restore_as_gda(directory, **kwargs):
  """Leaf `w` of the checkpoint in `directory`, asked for as a GDA with `kwargs`."""
  args = {"w": ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, **kwargs)}
  return ocp.PyTreeCheckpointer().restore(
      directory, args=ocp.args.PyTreeRestore(restore_args=args))["w"]


def _state(mesh):
  w, w_data = _gda(mesh, P("x", "y"))
  b = jax.device_put(np.arange(4, dtype=np.float32), NamedSharding(mesh, P("x")))
  return {"params": {"w": w, "b": b}, "step": np.array(7, np.int32)}, w_data


def test_registration_is_in_orbax_public_registry_and_idempotent():
  handler = type_handlers.get_type_handler(GlobalDeviceArray)
  assert isinstance(handler, orbax_support.GdaHandler)
  assert isinstance(handler, type_handlers.ArrayHandler)
  assert type_handlers.get_type_handler(jax.Array) is handler  # one batch, one metadata file
  assert type_handlers.get_type_handler(type(jax.numpy.zeros(2))) is handler
  orbax_support._register()
  assert type_handlers.get_type_handler(GlobalDeviceArray) is handler


def test_pytree_checkpointer_saves_shard_by_shard_and_restores_gdas(mesh_2d, tmp_path):
  state, w_data = _state(mesh_2d)
  with jse.transfer_ledger() as ledger:
    ocp.PyTreeCheckpointer().save(tmp_path / "c", state)
  # The save itself, shard by shard (explicit), not a whole-array (implicit) fetch.
  assert [(r.direction, r.explicit, r.nbytes) for r in ledger.records] == [
      ("device_to_host", True, state["params"]["w"].nbytes)]
  target = {"params": {"w": _gda(mesh_2d, P("y", None))[0], "b": state["params"]["b"]},
            "step": state["step"]}
  out = ocp.PyTreeCheckpointer().restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
      item=target, restore_args=orbax_support.restore_args_for(target)))
  w = out["params"]["w"]
  assert type(w) is GlobalDeviceArray and w.mesh_axes == P("y", None) and w.mesh == mesh_2d
  np.testing.assert_array_equal(np.asarray(w), w_data)
  for s in w.local_shards:
    np.testing.assert_array_equal(np.asarray(s.data), w_data[s.index])
  b = out["params"]["b"]
  assert type(b) is not GlobalDeviceArray and isinstance(b, jax.Array)
  np.testing.assert_array_equal(np.asarray(b), np.arange(4))
  assert int(out["step"]) == 7


def test_stock_restore_args_read_gda_leaves_as_jax_arrays(mesh_2d, tmp_path):
  state, w_data = _state(mesh_2d)
  ocp.PyTreeCheckpointer().save(tmp_path / "c", state)
  target = jax.tree.map(lambda x: x.to_jax_array() if isinstance(x, GlobalDeviceArray) else x,
                        state)
  out = ocp.PyTreeCheckpointer().restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
      item=target, restore_args=checkpoint_utils.construct_restore_args(target)))
  w = out["params"]["w"]
  assert type(w) is not GlobalDeviceArray and isinstance(w, jax.Array)
  np.testing.assert_array_equal(np.asarray(w), w_data)


def test_orbax_without_this_package_reads_the_gda_leaves(mesh_2d, tmp_path):
  state, w_data = _state(mesh_2d)
  ocp.PyTreeCheckpointer().save(tmp_path / "c", state)
  np.save(tmp_path / "want.npy", w_data)
  code = textwrap.dedent(f"""
      import os
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
      import jax, numpy as np, orbax.checkpoint as ocp
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
      args = ocp.ArrayRestoreArgs(sharding=NamedSharding(mesh, P("b")))
      out = ocp.PyTreeCheckpointer().restore(
          {str(tmp_path / 'c')!r},
          args=ocp.args.PyTreeRestore(restore_args={{"params": {{"w": args, "b": args}},
                                                     "step": ocp.RestoreArgs()}}))
      w = out["params"]["w"]
      assert type(w).__name__ == "ArrayImpl", type(w)
      np.testing.assert_array_equal(np.asarray(w), np.load({str(tmp_path / 'want.npy')!r}))
      assert "jax_sharding_ext" not in __import__("sys").modules
      print("STOCK OK")
  """)
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in __import__("os").environ.items()
                                         if k != "XLA_FLAGS"})
  assert "STOCK OK" in res.stdout, res.stderr[-3000:]


def test_checkpoint_manager_saves_steps_and_restores_gdas(mesh_2d, tmp_path):
  state, _ = _state(mesh_2d)
  options = ocp.CheckpointManagerOptions(max_to_keep=2)
  with ocp.CheckpointManager(tmp_path / "ckpts", options=options) as mngr:
    for step in range(3):
      w, _ = _gda(mesh_2d, P("x", "y"), offset=100.0 * step)
      state = {"params": {"w": w, "b": state["params"]["b"]}, "step": np.array(step, np.int32)}
      mngr.save(step, args=ocp.args.PyTreeSave(state))
    mngr.wait_until_finished()
    assert mngr.all_steps() == [1, 2] and mngr.latest_step() == 2
    target = {"params": {"w": _gda(mesh_2d, P(None, "x"))[0], "b": state["params"]["b"]},
              "step": np.array(0, np.int32)}
    out = mngr.restore(2, args=ocp.args.PyTreeRestore(
        item=target, restore_args=orbax_support.restore_args_for(target)))
  w = out["params"]["w"]
  assert type(w) is GlobalDeviceArray and w.mesh_axes == P(None, "x")
  np.testing.assert_array_equal(np.asarray(w), _gda(mesh_2d, P())[1] + 200.0)
  assert int(out["step"]) == 2


def test_gda_restore_args_pad_with_strict_false(mesh_2d, tmp_path):
  w, w_data = _gda(mesh_2d, P("x", "y"))
  ocp.PyTreeCheckpointer().save(tmp_path / "c", {"w": w})
  args = {"w": orbax_support.gda_restore_args(mesh_2d, P("x"), global_shape=(12, 8),
                                              strict=False)}
  out = ocp.PyTreeCheckpointer().restore(tmp_path / "c",
                                         args=ocp.args.PyTreeRestore(restore_args=args))
  want = np.zeros((12, 8), np.float32)
  want[:8] = w_data
  assert type(out["w"]) is GlobalDeviceArray and out["w"].shape == (12, 8)
  np.testing.assert_array_equal(np.asarray(out["w"]), want)


def test_standard_checkpointer(mesh_2d, tmp_path):
  """StandardSave takes GDA leaves as they are (a GDA is a `jax.Array`):
  shard by shard, nothing fetched whole (the ledger holds the save alone), and
  StandardRestore with GDAs in the target gives GDAs on the target's mesh
  and `mesh_axes`, trailing `None`s included; `jax.Array` leaves stay
  `jax.Array`s."""
  state, w_data = _state(mesh_2d)
  ckptr = ocp.StandardCheckpointer()
  with jse.transfer_ledger() as ledger:
    ckptr.save(tmp_path / "c", state)
    ckptr.wait_until_finished()
  assert [(r.direction, r.explicit, r.nbytes) for r in ledger.records] == [
      ("device_to_host", True, state["params"]["w"].nbytes)]
  target = {"params": {"w": _gda(mesh_2d, P("x", None))[0], "b": state["params"]["b"]},
            "step": state["step"]}
  out = ckptr.restore(tmp_path / "c", target)
  w, b = out["params"]["w"], out["params"]["b"]
  assert type(w) is GlobalDeviceArray and w.mesh_axes == P("x", None) and w.mesh == mesh_2d
  np.testing.assert_array_equal(np.asarray(w), w_data)
  assert type(b) is not GlobalDeviceArray and isinstance(b, jax.Array)
  # An abstract target (`jax.ShapeDtypeStruct`s) restores `jax.Array`s.
  out = ckptr.restore(tmp_path / "c", jax.tree.map(ocp.utils.to_shape_dtype_struct, state))
  assert type(out["params"]["w"]) is not GlobalDeviceArray
  np.testing.assert_array_equal(np.asarray(out["params"]["w"]), w_data)
  # The wrappers older code calls still work.
  views = orbax_support.as_jax_arrays(state)
  assert type(views["params"]["w"]) is not GlobalDeviceArray
  assert type(orbax_support.as_gdas(views)["params"]["w"]) is GlobalDeviceArray
  ckptr.close()


def test_restoring_as_gda_needs_a_named_sharding(mesh_2d, tmp_path):
  w, _ = _gda(mesh_2d, P("x"))
  ocp.PyTreeCheckpointer().save(tmp_path / "c", {"w": w})
  single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  args = {"w": ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, sharding=single)}
  with pytest.raises(ValueError, match="needs a NamedSharding"):
    ocp.PyTreeCheckpointer().restore(tmp_path / "c",
                                     args=ocp.args.PyTreeRestore(restore_args=args))


# Every `mesh_axes` spelling `GlobalDeviceArray.from_callback` takes.
MESH_AXES_SPELLINGS = [
    ["x", "y"], ("x", None), None, [("x", "y")], ["x", None, None], (), [], [None, "y"],
    (("y", "x"), None), P("x"), P(None, "y"),
]
SPELLING_IDS = ["list", "tuple-none", "None", "list-of-tuple", "trailing-nones", "empty-tuple",
                "empty-list", "list-none-first", "tuple-of-tuple", "P", "P-none-first"]


@pytest.mark.parametrize("mesh_axes", MESH_AXES_SPELLINGS, ids=SPELLING_IDS)
def test_every_from_callback_mesh_axes_spelling_restores(mesh_2d, tmp_path, mesh_axes):
  """`restore_args_for` and `gda_restore_args` (with and without `global_shape`)
  take every `mesh_axes` spelling `from_callback` takes, `None` being fully
  replicated, and restore GDAs with the `mesh_axes` as given and the sharding
  `from_callback` gives them."""
  want = GlobalDeviceArray.from_callback((8, 8), mesh_2d, mesh_axes,
                                         lambda i: np.arange(64, dtype=np.float32)
                                         .reshape(8, 8)[i])
  saved, data = _gda(mesh_2d, P("y", "x"))  # saved with another sharding
  ocp.PyTreeCheckpointer().save(tmp_path / "c", {"w": saved})
  for restore_args in (orbax_support.restore_args_for({"w": want}),
                       {"w": orbax_support.gda_restore_args(mesh_2d, mesh_axes)},
                       {"w": orbax_support.gda_restore_args(mesh_2d, mesh_axes,
                                                            global_shape=(8, 8))}):
    w = ocp.PyTreeCheckpointer().restore(
        tmp_path / "c", args=ocp.args.PyTreeRestore(restore_args=restore_args))["w"]
    assert type(w) is GlobalDeviceArray and w.mesh == mesh_2d
    assert type(w.mesh_axes) is type(want.mesh_axes) and w.mesh_axes == want.mesh_axes
    assert w.sharding == want.sharding
    np.testing.assert_array_equal(np.asarray(w), data)
    for s in w.local_shards:
      np.testing.assert_array_equal(np.asarray(s.data), data[s.index])


def _error_of(fn):
  try:
    fn()
  except (TypeError, ValueError) as e:
    return type(e), str(e)
  raise AssertionError("no error")


@pytest.mark.parametrize("mesh_axes", [
    "x", 5, [1], ["z"], ["x", "x"], [("x", "q")], [None, "y", "x"], ["x", None, "y"],
    ["y"],  # on a (7, 8) array: 7 rows do not split 2 ways
], ids=["str", "int", "int-entry", "unknown-axis", "repeated-axis", "unknown-in-tuple",
        "too-many", "too-many-with-none", "indivisible"])
def test_invalid_mesh_axes_get_from_callback_error(mesh_2d, tmp_path, mesh_axes):
  """An invalid `mesh_axes` spelling gets the error `from_callback` gives, from
  `gda_restore_args` (with `global_shape`, or without it: then on restore,
  checked against the saved shape before anything is read)."""
  shape = (8, 8) if mesh_axes != ["y"] else (7, 8)
  want = _error_of(lambda: GlobalDeviceArray.from_callback(
      shape, mesh_2d, mesh_axes, lambda i: np.zeros(shape, np.float32)[i]))
  assert _error_of(lambda: orbax_support.gda_restore_args(
      mesh_2d, mesh_axes, global_shape=shape)) == want
  ocp.PyTreeCheckpointer().save(tmp_path / "c", {"w": jax.numpy.zeros(shape)})

  def restore():
    args = {"w": orbax_support.gda_restore_args(mesh_2d, mesh_axes)}
    ocp.PyTreeCheckpointer().restore(tmp_path / "c",
                                     args=ocp.args.PyTreeRestore(restore_args=args))
  assert _error_of(restore) == want


def test_gda_restore_args_names_a_bad_mesh(mesh_2d):
  with pytest.raises(TypeError, match="`mesh` must be a `jax.sharding.Mesh`"):
    orbax_support.gda_restore_args(mesh_2d.devices, P("x"))


def test_restore_args_asking_for_a_gda_with_list_mesh_axes(mesh_2d, tmp_path):
  """`ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, ...)` takes the same
  spellings; `mesh_axes` that do not describe a given `sharding` are refused."""
  saved, data = _gda(mesh_2d, P("x", "y"))
  ocp.PyTreeCheckpointer().save(tmp_path / "c", {"w": saved})

  w = _restore_as_gda(tmp_path / "c", mesh=mesh_2d, mesh_axes=["y", None])
  assert type(w) is GlobalDeviceArray and w.mesh_axes == ["y", None]
  np.testing.assert_array_equal(np.asarray(w), data)
  w = _restore_as_gda(tmp_path / "c", sharding=NamedSharding(mesh_2d, P("y")), mesh_axes=["y", None])
  assert w.mesh_axes == ["y", None]
  assert w.sharding == _gda(mesh_2d, ["y", None])[0].sharding
  with pytest.raises(ValueError, match="which those mesh axes do not describe"):
    _restore_as_gda(tmp_path / "c", sharding=NamedSharding(mesh_2d, P("x")), mesh_axes=["y"])


@pytest.mark.parametrize("kwargs,error,message", [
    ({"mesh": "devices"}, TypeError, "`mesh` must be a `jax.sharding.Mesh`"),
    ({"global_shape": ("x", 8)}, TypeError, r"`global_shape` must be a tuple of ints"),
    ({"global_shape": (-8, 8)}, ValueError, r"`global_shape` \(-8, 8\) has a negative"),
    ({"shape": 8}, TypeError, r"`global_shape` must be a tuple of ints, got int 8"),
    ({"dtype": "V8"}, TypeError, r"`dtype` of the ArrayRestoreArgs is \|V8, which a JAX "
                                 "array cannot have"),
    ({"dtype": "float99"}, TypeError, r"`dtype` of the ArrayRestoreArgs is not a dtype"),
], ids=["mesh-not-a-mesh", "shape-of-str", "negative-shape", "shape-an-int", "void-dtype",
        "unknown-dtype"])
def test_a_gda_request_with_bad_args_is_refused_naming_the_argument(mesh_2d, tmp_path, kwargs,
                                                                     error, message):
  """`ArrayRestoreArgs(restore_type=GlobalDeviceArray, ...)` with a mesh that
  is not a `Mesh`, a shape that is not a shape or a dtype no JAX array has is
  refused before anything is read, naming the argument (orbax failed deep in
  its read, e.g. "'str' object cannot be interpreted as an integer")."""
  saved, _ = _gda(mesh_2d, P("x", "y"))
  ocp.PyTreeCheckpointer().save(tmp_path / "c", {"w": saved})
  args = dict({"mesh": mesh_2d, "mesh_axes": P("x")}, **kwargs)
  if kwargs.get("mesh") == "devices":
    args = {"mesh": list(mesh_2d.devices.flat), "global_shape": ("x",)}
  restore_args = {"w": ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, **args)}
  with pytest.raises(error, match=message):
    ocp.PyTreeCheckpointer().restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
        restore_args=restore_args))


def test_a_gda_request_without_mesh_axes_means_what_it_names(mesh_2d, tmp_path):
  """A mesh with no `mesh_axes` is fully replicated on it (`None`, as for
  `from_callback`), not the sharding it was saved with; a sharding alone
  gives its spec as `mesh_axes`, as `from_jax_array` does."""
  saved, data = _gda(mesh_2d, P("x", "y"))
  ocp.PyTreeCheckpointer().save(tmp_path / "c", {"w": saved})

  w = _restore_as_gda(tmp_path / "c", mesh=mesh_2d)
  want = GlobalDeviceArray.from_callback((8, 8), mesh_2d, None, lambda i: data[i])
  assert type(w) is GlobalDeviceArray and w.mesh_axes == want.mesh_axes
  assert w.sharding == want.sharding and w.is_fully_replicated
  np.testing.assert_array_equal(np.asarray(w), data)
  w = _restore_as_gda(tmp_path / "c", sharding=NamedSharding(mesh_2d, P("y")))
  assert type(w) is GlobalDeviceArray and w.mesh_axes == P("y")
  assert w.sharding == NamedSharding(mesh_2d, P("y"))
  np.testing.assert_array_equal(np.asarray(w), data)
