"""Checkpoints that orbax-checkpoint 0.2.7 (June 2023) and 0.4.1 (September
2023) wrote restore through `orbax_support` with today's orbax, by every
route they restored before, as GDAs where asked for.

The directories are laid out as those versions wrote them
(`_orbax_vintages.py`: per-parameter zarr directories in 0.2.7; one OCDBT
database plus a `_sharding` file, whose members today's orbax looks up under
other names, in 0.4.1; `_METADATA` from 0.4.1's StandardCheckpointer; a
CheckpointManager's `<step>/default/`).
"""

import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _orbax_vintages import write_manager, write_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, orbax_support

VERSIONS = ["0.2.7", "0.4.1"]


def _gda(mesh, value, axes):
  return GlobalDeviceArray.from_callback(value.shape, mesh, axes, lambda i: value[i])


def _item(mesh, values):
  return {"params": {"b": _gda(mesh, values["params"]["b"], P("x")),
                     "w": _gda(mesh, values["params"]["w"], P(None, "x"))},
          "step": np.array(0, np.int32)}


def _gda_args(mesh):
  """Per-leaf restore args as 2023 code wrote them, in every `mesh_axes` spelling."""
  return {"params": {"b": orbax_support.gda_restore_args(mesh, ["x"]),
                     "w": orbax_support.gda_restore_args(mesh, P("x", "y"))},
          "step": ocp.RestoreArgs()}


def _check(out, values, w_axes=None, b_axes=None):
  """The restored tree: GDAs with the mesh axes as given (default: `_gda_args`')."""
  w_axes = P("x", "y") if w_axes is None else w_axes
  b_axes = ["x"] if b_axes is None else b_axes
  w, b = out["params"]["w"], out["params"]["b"]
  assert type(w) is GlobalDeviceArray and type(b) is GlobalDeviceArray
  assert w.mesh_axes == w_axes and b.mesh_axes == b_axes
  np.testing.assert_array_equal(np.asarray(w), values["params"]["w"])
  np.testing.assert_array_equal(np.asarray(b), values["params"]["b"])
  for s in w.local_shards:
    np.testing.assert_array_equal(np.asarray(s.data), values["params"]["w"][s.index])
  assert int(out["step"]) == int(values["step"])


def _legacy(fn):
  """A call through orbax's pre-`args` keyword API, which today's orbax
  accepts with a deprecation warning."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return fn()


@pytest.mark.parametrize("version", VERSIONS)
def test_pytree_restore_with_gda_restore_args_and_no_item(mesh_2d, tmp_path, version):
  """The route that broke for 0.4.1: per-leaf `gda_restore_args(mesh, axes)`
  without `global_shape` and no item (the saved shape is read from the
  array, not from the `_sharding` file)."""
  values, _ = write_pytree(tmp_path / "c", version, mesh_2d)
  ckptr = ocp.PyTreeCheckpointer()
  _check(_legacy(lambda: ckptr.restore(tmp_path / "c", restore_args=_gda_args(mesh_2d))),
         values)
  _check(ckptr.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
      restore_args=_gda_args(mesh_2d))), values)


@pytest.mark.parametrize("version", VERSIONS)
def test_pytree_restore_with_an_item(mesh_2d, tmp_path, version):
  values, _ = write_pytree(tmp_path / "c", version, mesh_2d)
  item = _item(mesh_2d, values)
  ckptr = ocp.PyTreeCheckpointer()
  out = _legacy(lambda: ckptr.restore(tmp_path / "c", item=item,
                                      restore_args=orbax_support.restore_args_for(item)))
  _check(out, values, w_axes=P(None, "x"), b_axes=P("x"))
  out = ckptr.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
      item=item, restore_args=orbax_support.restore_args_for(item)))
  _check(out, values, w_axes=P(None, "x"), b_axes=P("x"))
  # With a global_shape in the args (zero-padded, as orbax's strict=False allows).
  args = _gda_args(mesh_2d)
  args["params"]["w"] = orbax_support.gda_restore_args(mesh_2d, P("x"), global_shape=(12, 8),
                                                       strict=False)
  out = ckptr.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(restore_args=args))
  want = np.zeros((12, 8), np.float32)
  want[:8] = values["params"]["w"]
  np.testing.assert_array_equal(np.asarray(out["params"]["w"]), want)


@pytest.mark.parametrize("version", VERSIONS)
def test_stock_restore_args_give_jax_arrays(mesh_2d, tmp_path, version):
  values, _ = write_pytree(tmp_path / "c", version, mesh_2d)
  sharding = NamedSharding(mesh_2d, P("y"))
  args = {"params": {"b": ocp.ArrayRestoreArgs(sharding=sharding),
                     "w": ocp.ArrayRestoreArgs(sharding=sharding)}, "step": ocp.RestoreArgs()}
  out = ocp.PyTreeCheckpointer().restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
      restore_args=args))
  w = out["params"]["w"]
  assert type(w) is not GlobalDeviceArray and isinstance(w, jax.Array)
  np.testing.assert_array_equal(np.asarray(w), values["params"]["w"])


@pytest.mark.parametrize("layout", ["0.4.1 StandardCheckpointer", "0.4.1", "0.2.7"])
def test_standard_checkpointer_restores_into_a_target_with_gdas(mesh_2d, tmp_path, layout):
  version = layout.split()[0]
  values, _ = write_pytree(tmp_path / "c", version, mesh_2d, standard="Standard" in layout)
  out = ocp.StandardCheckpointer().restore(tmp_path / "c", _item(mesh_2d, values))
  _check(out, values, w_axes=P(None, "x"), b_axes=P("x"))


@pytest.mark.parametrize("version", VERSIONS)
def test_checkpoint_manager_restores_a_step(mesh_2d, tmp_path, version):
  steps, _ = write_manager(tmp_path / "m", version, mesh_2d)
  with ocp.CheckpointManager(tmp_path / "m") as mngr:
    assert mngr.all_steps() == [1, 2] and mngr.latest_step() == 2
    out = mngr.restore(2, args=ocp.args.PyTreeRestore(restore_args=_gda_args(mesh_2d)))
    _check(out, steps[2])
    item = _item(mesh_2d, steps[1])
    out = mngr.restore(1, args=ocp.args.PyTreeRestore(
        item=item, restore_args=orbax_support.restore_args_for(item)))
    _check(out, steps[1], w_axes=P(None, "x"), b_axes=P("x"))
