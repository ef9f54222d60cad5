"""A checkpoint's commit marker lives in the array's own directory however the
tensorstore spec spells it, and any spelling of that directory refuses an
uncommitted checkpoint. The directory is resolved at each save and restore:
a relative path against the working directory of that moment, symbolic
links as they point then.

tensorstore resolves every spelling below to the same kvstore
(`ts.Spec(spec).kvstore`, the directory `<root>/a/`): a dict kvstore with a
`path`, a URL string kvstore, a spec-level `path` under the parent
directory, with and without trailing slashes, and a 'cast' spec around any
of them. A marker left in place stands for a writer that died.
"""

import asyncio
import os

import numpy as np
import pytest
import tensorstore as ts
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization

MARKER = serialization.COMMIT_MARKER


def _spellings(root) -> dict:
  """Every spelling of the directory `<root>/a` (name: a function giving a fresh spec)."""
  r = str(root)
  return {
      "dict kvstore path": lambda: {"driver": "zarr",
                                    "kvstore": {"driver": "file", "path": f"{r}/a"}},
      "dict kvstore path/": lambda: {"driver": "zarr",
                                     "kvstore": {"driver": "file", "path": f"{r}/a/"}},
      "url kvstore": lambda: {"driver": "zarr", "kvstore": f"file://{r}/a"},
      "url kvstore/": lambda: {"driver": "zarr", "kvstore": f"file://{r}/a/"},
      "spec path": lambda: {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{r}/"},
                            "path": "a"},
      "spec path/, parent without /": lambda: {
          "driver": "zarr", "kvstore": {"driver": "file", "path": r}, "path": "a/"},
      "spec path, url parent": lambda: {"driver": "zarr", "kvstore": f"file://{r}/",
                                        "path": "a"},
      "get_tensorstore_spec": lambda: serialization.get_tensorstore_spec(f"{r}/a"),
  }


SPELLINGS = list(_spellings("/root"))


def _cast(spec):
  return {"driver": "cast", "dtype": "float32", "base": spec}


def _gda(mesh, offset=0):
  data = np.arange(32, dtype=np.float32).reshape(8, 4) + offset
  return GlobalDeviceArray.from_callback((8, 4), mesh, P("x", "y"), lambda i: data[i]), data


def _restore(mesh, spec):
  return serialization.run_deserialization([NamedSharding(mesh, P("x"))], [spec])[0]


def test_tensorstore_resolves_every_spelling_to_one_directory(tmp_path):
  """The premise: tensorstore itself puts every spelling's array in `<root>/a/`."""
  for name, spec in _spellings(tmp_path).items():
    kv = ts.Spec(spec()).kvstore
    assert kv.url == f"file://{tmp_path}/a/", (name, kv.url)
    assert ts.Spec(_cast(spec())).kvstore.url == kv.url, name


@pytest.mark.parametrize("write", SPELLINGS)
def test_a_failed_save_through_any_spelling_is_refused_through_every_spelling(
    mesh_2d, tmp_path, write):
  """A save whose write fails leaves its marker in `<root>/a` (never in the
  parent, never missing); every spelling, also inside a 'cast' spec, then
  refuses the checkpoint. A committed save through the same spelling leaves no
  marker and restores through every spelling."""
  spellings = _spellings(tmp_path)
  old, old_data = _gda(mesh_2d)
  serialization.run_serialization([old], [spellings[write]()])
  assert not os.path.lexists(tmp_path / "a" / MARKER)
  for name, spec in spellings.items():
    np.testing.assert_array_equal(np.asarray(_restore(mesh_2d, spec())), old_data, err_msg=name)
    out = asyncio.run(serialization.async_deserialize(NamedSharding(mesh_2d, P()),
                                                      _cast(spec())))
    np.testing.assert_array_equal(np.asarray(out), old_data, err_msg=name)
  # A directory where one chunk goes: the write fails after the marker is written.
  (tmp_path / "a" / "1.0").unlink()
  (tmp_path / "a" / "1.0").mkdir()
  new, _ = _gda(mesh_2d, offset=100)
  with pytest.raises(ValueError, match="Is a directory"):
    serialization.run_serialization([new], [spellings[write]()])
  assert os.path.exists(tmp_path / "a" / MARKER)
  assert not os.path.lexists(tmp_path / MARKER)
  for spec in spellings.values():
    with pytest.raises(ValueError, match="was never committed"):
      _restore(mesh_2d, spec())
    with pytest.raises(ValueError, match="was never committed"):
      asyncio.run(serialization.async_deserialize(NamedSharding(mesh_2d, P()), _cast(spec())))


@pytest.mark.parametrize("write", SPELLINGS)
def test_the_manager_marks_the_arrays_own_directory(mesh_2d, tmp_path, write):
  """The manager's marker goes where tensorstore writes the array too: a
  marker left behind by a writer that died is refused through every spelling,
  and the manager's commit removes the one it wrote."""
  spellings = _spellings(tmp_path)
  gda, data = _gda(mesh_2d)
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([gda], [spellings[write]()], on_commit_callback=lambda: None)
  manager.wait_until_finished()
  assert not os.path.lexists(tmp_path / "a" / MARKER) and not os.path.lexists(tmp_path / MARKER)
  (tmp_path / "a" / MARKER).write_bytes(b"")  # a writer that died
  for spec in spellings.values():
    with pytest.raises(ValueError, match="was never committed"):
      manager.deserialize([NamedSharding(mesh_2d, P())], [spec()])
  (tmp_path / "a" / MARKER).unlink()
  for name, spec in spellings.items():
    out, = manager.deserialize([NamedSharding(mesh_2d, P())], [spec()])
    np.testing.assert_array_equal(np.asarray(out), data, err_msg=name)


def test_arrays_under_one_parent_kvstore_are_different_paths(mesh_2d, tmp_path):
  """Two arrays given by a spec-level `path` under one parent kvstore are two
  locations (each gets its own marker and restores as its own array)."""
  a, a_data = _gda(mesh_2d)
  b, b_data = _gda(mesh_2d, offset=50)
  parent = {"driver": "file", "path": str(tmp_path)}
  specs = [{"driver": "zarr", "kvstore": dict(parent), "path": "a"},
           {"driver": "zarr", "kvstore": dict(parent), "path": "b"}]
  serialization.run_serialization([a, b], specs)
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([a, b], [{"driver": "zarr", "kvstore": f"file://{tmp_path}/", "path": "c"},
                             {"driver": "zarr", "kvstore": f"file://{tmp_path}/", "path": "d"}],
                    on_commit_callback=lambda: None)
  manager.wait_until_finished()
  for name, want in (("a", a_data), ("b", b_data), ("c", a_data), ("d", b_data)):
    out = _restore(mesh_2d, serialization.get_tensorstore_spec(str(tmp_path / name)))
    np.testing.assert_array_equal(np.asarray(out), want, err_msg=name)
  (tmp_path / "a" / MARKER).write_bytes(b"")
  with pytest.raises(ValueError, match="was never committed"):
    _restore(mesh_2d, specs[0])
  np.testing.assert_array_equal(np.asarray(_restore(mesh_2d, specs[1])), b_data)


@pytest.mark.parametrize("second", SPELLINGS)
def test_two_spellings_of_one_location_are_one_path(mesh_2d, tmp_path, second):
  """Two specs that resolve to one directory are refused as one path, in one
  save and between two writers, before anything is written."""
  spellings = _spellings(tmp_path)
  gda, _ = _gda(mesh_2d)
  with pytest.raises(ValueError, match=r"tensorstore_specs\[0\] and tensorstore_specs\[1\] "
                                       "both name"):
    serialization.run_serialization([gda, gda], [spellings["url kvstore"](), spellings[second]()])
  assert not os.path.lexists(tmp_path / "a")
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([gda], [spellings["spec path"]()], on_commit_callback=lambda: None)
  try:
    with pytest.raises(RuntimeError, match="is being written by a GlobalAsyncCheckpointManager"):
      serialization.run_serialization([gda], [spellings[second]()])
  finally:
    manager.wait_until_finished()


# -- resolved at each save and restore ------------------------------------------------

RECORD = "jax_sharding_ext.chunks.0"


def _relative(name="w"):
  return {"driver": "zarr", "kvstore": {"driver": "file", "path": f"ckpt/{name}"}}


def _restore_exact_or_missing(mesh, spec, want, missing=None):
  if missing is None:
    np.testing.assert_array_equal(np.asarray(_restore(mesh, spec)), want)
  else:
    with pytest.raises(ValueError, match=f"is damaged: its chunk '{missing}' is missing"):
      _restore(mesh, spec)


@pytest.mark.parametrize("save", ["run_serialization", "manager"])
def test_a_relative_path_is_resolved_against_the_working_directory_of_each_save(
    mesh_2d, tmp_path, monkeypatch, save):
  """One relative spec saved from two working directories makes two
  checkpoints, each with its own record and commit: the second save's
  record does not overwrite the first's, and a chunk lost from the second
  is an error, not zeros."""
  first, first_data = _gda(mesh_2d)
  second, second_data = _gda(mesh_2d, offset=100)
  for where, gda in (("a", first), ("b", second)):
    (tmp_path / where).mkdir()
    monkeypatch.chdir(tmp_path / where)
    if save == "manager":
      manager = serialization.GlobalAsyncCheckpointManager()
      manager.serialize([gda], [_relative()], on_commit_callback=lambda: None)
      manager.wait_until_finished()
    else:
      serialization.run_serialization([gda], [_relative()])
    assert (tmp_path / where / "ckpt" / "w" / RECORD).exists()
    assert not os.path.lexists(tmp_path / where / "ckpt" / "w" / MARKER)
  (tmp_path / "b" / "ckpt" / "w" / "1.0").unlink()
  _restore_exact_or_missing(mesh_2d, _relative(), second_data, missing="1.0")
  monkeypatch.chdir(tmp_path / "a")
  _restore_exact_or_missing(mesh_2d, _relative(), first_data)


def test_a_latest_link_re_pointed_between_saves_sends_each_save_to_its_step(
    mesh_2d, tmp_path):
  """`latest -> step_N`, re-pointed before each save: each step gets its own
  data, record and commit; a restore through `latest` reads the step it
  points to then, and a chunk lost from a step is an error there."""
  latest = tmp_path / "latest"
  spec = lambda: serialization.get_tensorstore_spec(str(latest / "w"))
  data = {}
  for step in range(3):
    (tmp_path / f"step_{step}").mkdir()
    if os.path.lexists(latest):
      latest.unlink()
    latest.symlink_to(f"step_{step}")
    gda, data[step] = _gda(mesh_2d, offset=100 * step)
    serialization.run_serialization([gda], [spec()])
    assert (tmp_path / f"step_{step}" / "w" / RECORD).exists()
  (tmp_path / "step_1" / "w" / "2.1").unlink()
  for step in (2, 0, 1):
    latest.unlink()
    latest.symlink_to(f"step_{step}")
    _restore_exact_or_missing(mesh_2d, spec(), data[step], missing="2.1" if step == 1 else None)


def test_a_background_commit_writes_where_the_path_pointed_at_the_save(mesh_2d, tmp_path,
                                                                         monkeypatch):
  """The manager commits in the background; a working directory changed or a
  link re-pointed meanwhile does not move the rest of its writes, its record
  or its commit: the checkpoint is whole where its path pointed at
  `serialize`."""
  for d in ("a", "b", "step_0", "step_1"):
    (tmp_path / d).mkdir()
  (tmp_path / "latest").symlink_to("step_0")
  gda, data = _gda(mesh_2d)
  monkeypatch.chdir(tmp_path / "a")
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([gda, gda], [_relative(), serialization.get_tensorstore_spec(
      str(tmp_path / "latest" / "w"))], on_commit_callback=lambda: None)
  monkeypatch.chdir(tmp_path / "b")
  (tmp_path / "latest").unlink()
  (tmp_path / "latest").symlink_to("step_1")
  manager.wait_until_finished()
  for d in (tmp_path / "a" / "ckpt" / "w", tmp_path / "step_0" / "w"):
    assert (d / RECORD).exists() and not os.path.lexists(d / MARKER)
    out = _restore(mesh_2d, serialization.get_tensorstore_spec(str(d)))
    np.testing.assert_array_equal(np.asarray(out), data)
  assert not os.path.lexists(tmp_path / "b" / "ckpt") and not os.listdir(tmp_path / "step_1")
