"""The public surface: `__all__` matches the exports; internals stay internal."""

import __future__

import dataclasses
import importlib
import inspect
import pathlib
import pickle
import re
import subprocess
import sys
import types
import typing

import numpy as np
import pytest

import jax_sharding_ext

PKG = pathlib.Path(jax_sharding_ext.__file__).parent


def test_all_matches_public_names():
  module = type(jax_sharding_ext)

  def is_public(name):
    value = getattr(jax_sharding_ext, name)
    if name.startswith("_"):
      return False
    # Public submodules (multihost_utils), not imported modules such as `jax`.
    return (not isinstance(value, module)
            or value.__name__ == f"jax_sharding_ext.{name}")
  # Modules needing an optional extra stay out of `__all__` (so that
  # `from jax_sharding_ext import *` works without it); they are attributes
  # only once imported.
  optional = {"serialization", "orbax_support", "port"}
  public = {n for n in dir(jax_sharding_ext) if is_public(n)} - optional
  assert set(jax_sharding_ext.__all__) == public
  assert not optional & set(jax_sharding_ext.__all__)
  for name in jax_sharding_ext.__all__:
    assert getattr(jax_sharding_ext, name) is not None


def test_only_the_jax_home_touches_jax_src():
  pattern = re.compile(r"(^|[^.\w])jax\._src|from jax\._src|import jax\._src")
  home = PKG / "_jax"
  offenders = [p.name for p in PKG.rglob("*.py")
               if home not in p.parents and pattern.search(p.read_text())]
  assert offenders == []
  assert pattern.search((home / "tables.py").read_text())  # the home is where it looks


def test_version_is_the_installed_distributions():
  """`__version__` is what pip installed (the wheel's metadata reads it from
  `_version.py`), and `__version_info__` its parts."""
  from importlib import metadata
  assert jax_sharding_ext.__version__ == metadata.version("jax-sharding-ext")
  assert re.fullmatch(r"\d+\.\d+\.\d+", jax_sharding_ext.__version__)
  assert jax_sharding_ext.__version_info__ == tuple(
      int(p) for p in jax_sharding_ext.__version__.split("."))


@pytest.mark.parametrize("module, blocked", [
    ("serialization", ["tensorstore"]),
    ("orbax_support", ["orbax", "orbax.checkpoint"]),
])
def test_optional_module_without_its_extra_names_the_extra(module, blocked):
  code = (f"import sys; {'; '.join(f'sys.modules[{b!r}] = None' for b in blocked)}\n"
          "import jax_sharding_ext\n"
          f"try:\n  from jax_sharding_ext import {module}\n"
          "except ImportError as e:\n  print('IMPORTERROR', e)\n")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=PKG.parent)
  assert "IMPORTERROR" in res.stdout and "jax-sharding-ext[checkpoint]" in res.stdout, (
      res.stdout, res.stderr)


# -- each public module's namespace ----------------------------------------------------

# The public modules whose namespace this package curates (the porting
# assistant, `port`, has its own owner and tests).
CURATED = ["jax_sharding_ext", "jax_sharding_ext.global_device_array",
           "jax_sharding_ext.multihost_utils", "jax_sharding_ext.serialization",
           "jax_sharding_ext.orbax_support", "jax_sharding_ext.port"]


def _visible(module) -> set[str]:
  """Names a user sees in `dir(module)` and might take for API: not
  underscored, not a `__future__` flag or a `typing` construct used in
  annotations (`Any`), not an imported module (`jax`, `np`) other than a
  public submodule of the package."""
  def foreign_module(v):
    return isinstance(v, types.ModuleType) and not v.__name__.startswith(f"{module.__name__}.")
  return {n for n, v in vars(module).items()
          if not n.startswith("_") and not foreign_module(v)
          and not isinstance(v, __future__._Feature) and v is not typing.Any}


@pytest.mark.parametrize("name", CURATED)
def test_a_public_module_shows_exactly_its_all(name):
  module = importlib.import_module(name)
  optional = {"serialization", "orbax_support", "port"}  # attributes once imported
  assert _visible(module) - optional == set(module.__all__)
  assert len(module.__all__) == len(set(module.__all__))
  helpers = {"layout", "is_spec_leaf", "normalize_mesh_axes", "index_key", "canonical_shape",
             "canonical_mesh_axes", "to_partition_spec", "checked_dtype", "GdaShape"}
  assert not helpers & set(dir(module))


def _public_classes() -> list[tuple[str, str, type]]:
  out = []
  for name in CURATED:
    module = importlib.import_module(name)
    out += [(name, n, getattr(module, n)) for n in module.__all__
            if inspect.isclass(getattr(module, n))
            and getattr(module, n).__module__.startswith("jax_sharding_ext")]
  return out


@pytest.mark.parametrize("module, name, cls", _public_classes(),
                         ids=[f"{m}.{n}" for m, n, _ in _public_classes()])
def test_a_public_class_shows_its_public_path(module, name, cls):
  """`type(x)`, `repr` of the class and pickle name the module users import
  it from, which exports it under that name."""
  assert not any(part.startswith("_") for part in cls.__module__.split("."))
  assert cls.__qualname__ == name
  assert getattr(importlib.import_module(cls.__module__), name) is cls
  assert repr(cls) == f"<class '{cls.__module__}.{name}'>"
  assert pickle.loads(pickle.dumps(cls)) is cls


def test_gda_type_is_shown_at_the_top_level(mesh_2d):
  gda = jax_sharding_ext.GlobalDeviceArray.from_callback(
      (8, 2), mesh_2d, jax_sharding_ext.PartitionSpec("x"), lambda i: np.zeros((8, 2))[i])
  assert repr(type(gda)) == "<class 'jax_sharding_ext.GlobalDeviceArray'>"
  assert type(gda) is jax_sharding_ext.global_device_array.GlobalDeviceArray


def test_public_objects_round_trip_through_pickle(mesh_2d):
  """A GDA (by value), its shards, the transfer records and ledger and
  `FROM_GDA` pickle and load as what they were."""
  P = jax_sharding_ext.PartitionSpec
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  with jax_sharding_ext.transfer_ledger() as ledger:
    gda = jax_sharding_ext.GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x", "y"),
                                                           lambda i: data[i])
  back = pickle.loads(pickle.dumps(gda))
  assert type(back) is jax_sharding_ext.GlobalDeviceArray and back.mesh_axes == P("x", "y")
  np.testing.assert_array_equal(np.asarray(back), data)
  # A `Shard` pickles as its fields do: a `jax.Device` does not pickle (in
  # stock JAX either), its data (a single-device `jax.Array`) does.
  shard = dataclasses.replace(gda.local_shards[3], device=3)
  shard_back = pickle.loads(pickle.dumps(shard))
  assert type(shard_back) is jax_sharding_ext.Shard
  assert (shard_back.device, shard_back.index, shard_back.replica_id) == (
      shard.device, shard.index, shard.replica_id)
  np.testing.assert_array_equal(np.asarray(shard_back.data), np.asarray(shard.data))
  # A record names devices too; with them as ids it and its ledger pickle.
  record = dataclasses.replace(ledger.records[0], dst=tuple(d.id for d in ledger.records[0].dst))
  assert pickle.loads(pickle.dumps(record)) == record
  ledger.records[:] = [record]
  ledger_back = pickle.loads(pickle.dumps(ledger))
  assert type(ledger_back) is jax_sharding_ext.TransferLedger
  assert ledger_back.records == [record] and ledger_back.totals() == ledger.totals()
  assert pickle.loads(pickle.dumps(jax_sharding_ext.FROM_GDA)) is jax_sharding_ext.FROM_GDA


def test_an_open_ledger_pickles_as_a_closed_one():
  with jax_sharding_ext.transfer_ledger() as ledger:
    back = pickle.loads(pickle.dumps(ledger))
  with back:  # it can be opened: the thread's stack of open ledgers stayed behind
    pass
  assert back.records == []


def test_pickles_naming_the_private_path_still_load():
  """Pickles written before the classes showed their public path name the
  private module, which still defines them."""
  shard = jax_sharding_ext.Shard(None, (slice(0, 2),), 0)
  text = pickle.dumps(shard, protocol=0)
  assert b"cjax_sharding_ext\nShard\n" in text  # the public path, today
  old = text.replace(b"cjax_sharding_ext\nShard\n", b"cjax_sharding_ext._array.records\nShard\n")
  assert pickle.loads(old) == shard


# -- what help(), dir() and reprs show --------------------------------------------------

_PRIVATE_PATH = re.compile(r"jax_sharding_ext(\.\w+)*\._\w+|\b_(FromCallbacks|Placement|ShardAccess"
                           r"|ArraySurface)\b")


def _help(obj) -> str:
  import pydoc
  return pydoc.render_doc(obj, renderer=pydoc.plaintext)


@pytest.mark.parametrize("name", CURATED[:-1])
def test_dir_of_a_public_module_shows_its_public_names(name):
  """`dir()` (and so tab completion and `help()`'s listings) shows `__all__`,
  the public submodules once imported and dunder names; no imported module or
  private helper. The GDA-era modules also show the private names GDA-era
  code read from them."""
  module = importlib.import_module(name)
  legacy = {"jax_sharding_ext.global_device_array": {
                "_hashed_index", "_get_indices", "_get_shard_indices_replica_ids_uncached"},
            "jax_sharding_ext.serialization": {
                "_get_metadata", "_spec_has_metadata", "_CHECKPOINT_SUCCESS",
                "_LimitInFlightBytes", "_GDA_METADATA"}}.get(name, set())
  shown = set(dir(module))
  assert set(module.__all__) <= shown
  private = {n for n in shown if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))}
  assert private == legacy
  submodules = {n for n in shown - set(module.__all__) if not n.startswith("_")}
  assert all(getattr(module, n).__name__ == f"{name}.{n}" for n in submodules), submodules
  for n in legacy:  # still there for the code that reads them
    assert hasattr(module, n)


def test_gda_shows_no_private_class_in_help_mro_or_reprs(mesh_2d):
  """The GDA's parts (kept in modules of their own) are not its bases: its
  method resolution order is the class and `jax.Array`, and `help()` has no
  private path, no "inherited from" a private class and no private
  annotations."""
  import jax
  gda_type = jax_sharding_ext.GlobalDeviceArray
  assert gda_type.__mro__ == (gda_type, jax.Array, object)
  text = _help(gda_type)
  assert not _PRIVATE_PATH.search(text), _PRIVATE_PATH.search(text)
  assert "inherited from" not in text.replace("inherited from jax.", "")
  assert "_host_fetched" not in text and "_arr:" not in text
  gda = gda_type.from_callback((8, 2), mesh_2d, jax_sharding_ext.PartitionSpec("x"),
                               lambda i: np.zeros((8, 2))[i])
  for member in (gda.local_data, gda_type.from_callback, gda_type.shape.fget):
    assert "GlobalDeviceArray." in repr(member) and not _PRIVATE_PATH.search(repr(member))
  # The parts' members behave as the class's own: operators unwrap a GDA operand.
  np.testing.assert_array_equal(np.asarray(gda + gda), np.zeros((8, 2)))


def test_help_of_the_package_and_its_functions_shows_public_paths():
  """`help(jax_sharding_ext)` lists no private module among its classes,
  functions, data and submodules, and a public function's `help()` names the
  module users import it from. (The PACKAGE CONTENTS section is pydoc's
  listing of the package's directory, where the private sub-packages live.)"""
  text = _help(jax_sharding_ext)
  listed = text.split("CLASSES", 1)[1]
  assert not _PRIVATE_PATH.search(listed), _PRIVATE_PATH.search(listed)
  for name in CURATED[:-1]:
    module = importlib.import_module(name)
    for export in module.__all__:
      fn = getattr(module, export)
      if inspect.isfunction(fn) and fn.__module__.startswith("jax_sharding_ext"):
        assert not any(p.startswith("_") for p in fn.__module__.split(".")), (name, export)
        assert getattr(importlib.import_module(fn.__module__), export) is fn
        assert pickle.loads(pickle.dumps(fn)) is fn
        assert not _PRIVATE_PATH.search(_help(fn).splitlines()[2]), export


def test_from_gda_shows_and_pickles_its_public_path():
  sentinel = jax_sharding_ext.FROM_GDA
  assert repr(type(sentinel)) == "<class 'jax_sharding_ext.FromGdaType'>"
  assert type(sentinel) is jax_sharding_ext.FromGdaType
  assert jax_sharding_ext.FromGdaType() is sentinel
  assert type(sentinel).__mro__ == (jax_sharding_ext.FromGdaType, object)
  text = pickle.dumps(sentinel, protocol=0)
  assert b"cjax_sharding_ext\nFROM_GDA\n" in text  # the global, not the class
  # A pickle written when it stored its private class and no arguments.
  assert pickle.loads(b"cjax_sharding_ext._array.records\nFromGda\n(tR.") is sentinel


def test_the_release_names_its_documentation():
  """The installed distribution links its documentation (the wheel's
  metadata), and the site is built for that address and shows the release
  on every page."""
  import runpy
  from importlib import metadata
  urls = dict(u.split(", ", 1) for u in metadata.metadata("jax-sharding-ext").get_all("Project-URL"))
  assert urls["Documentation"].startswith("https://")
  conf = runpy.run_path(str(PKG.parent / "docs" / "conf.py"))  # what Sphinx executes
  assert conf["html_baseurl"] == urls["Documentation"]
  assert conf["release"] == jax_sharding_ext.__version__
  assert jax_sharding_ext.__version__ in conf["html_title"]
