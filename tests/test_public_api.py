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
