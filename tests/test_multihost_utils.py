"""`jax_sharding_ext.multihost_utils` in one process (8 devices).

The multi-process behaviour (2 and 4 real processes) is in
`test_multiprocess.py`; here: the surface matches stock's, leaves come back
as the kind they went in, GDA-era semantics, and clear errors. The tests at
the end run real processes through the same harness: `_multihost_worker.py`
(2 processes) and `_assert_equal_worker.py` (2 and 4), whose scenarios give
each process its own tree.
"""

import inspect
import json
import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _multihost import run_workers
from jax.experimental import multihost_utils as stock
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext
from jax_sharding_ext import GlobalDeviceArray, multihost_utils

# Names stock's module imports rather than defines.
_IMPORTED = {"annotations", "partial", "lru_cache", "Any", "tree_flatten",
             "tree_unflatten", "P", "safe_zip"}


def _stock_public_names():
  return {n for n, v in vars(stock).items()
          if not n.startswith("_") and not isinstance(v, types.ModuleType)
          and n not in _IMPORTED}


def _gda(mesh, spec, shape=(8, 2), scale=1):
  data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * scale
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


# Stock's API: the functions of JAX's API reference for the module, the GDA
# era's preemption check and the fault-tolerance pair.
# `ProcessFailureError` is stock's from JAX 0.10.1 on: the API where stock has it.
_STOCK_API = {"broadcast_one_to_all", "sync_global_devices", "process_allgather", "assert_equal",
              "host_local_array_to_global_array", "global_array_to_host_local_array",
              "reached_preemption_sync_point", "live_devices",
              *(["ProcessFailureError"] if hasattr(stock, "ProcessFailureError") else [])}


def test_stocks_api_with_the_same_signatures_and_its_internals_as_stocks_objects():
  """`__all__` is stock's API, each with stock's signature (or stock's own
  object); every other public name of stock (the primitives and rules behind
  its conversions) is not API, but reading it here gives stock's object."""
  assert set(multihost_utils.__all__) == _STOCK_API
  # A stock name this JAX lacks is absent here too, not an import error.
  assert hasattr(multihost_utils, "ProcessFailureError") == hasattr(stock, "ProcessFailureError")
  for name in _STOCK_API:
    ours, theirs = getattr(multihost_utils, name), getattr(stock, name)
    if inspect.isfunction(theirs):
      assert inspect.signature(ours) == inspect.signature(theirs), name
    else:
      assert ours is theirs, name
  internals = _stock_public_names() - _STOCK_API
  assert internals and all(getattr(multihost_utils, n) is getattr(stock, n) for n in internals)
  assert not internals & set(dir(multihost_utils))
  with pytest.raises(AttributeError, match="no attribute 'nothing'"):
    multihost_utils.nothing  # noqa: B018


def test_top_level_exports_and_porting_import():
  from jax_sharding_ext import multihost_utils as mu  # the porting-table line
  assert mu is multihost_utils
  for name in ("host_local_array_to_global_array", "global_array_to_host_local_array",
               "process_allgather"):
    assert getattr(jax_sharding_ext, name) is getattr(multihost_utils, name)


def test_host_local_to_global_and_back_keep_each_leaf_kind(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  tree = {"gda": gda, "arr": jnp.asarray(data), "np": data}
  out = multihost_utils.host_local_array_to_global_array(tree, mesh_2d, P("x", "y"))
  assert type(out["gda"]) is GlobalDeviceArray
  # numpy / jax.Array in: what stock returns for them.
  want = stock.host_local_array_to_global_array(
      {"arr": jnp.asarray(data), "np": data}, mesh_2d, P("x", "y"))
  for k in ("arr", "np"):
    assert type(out[k]) is type(want[k]) and not isinstance(out[k], GlobalDeviceArray)
  for leaf in out.values():
    assert leaf.sharding.is_equivalent_to(NamedSharding(mesh_2d, P("x", "y")), 2)
    np.testing.assert_array_equal(np.asarray(leaf), data)
  back = multihost_utils.global_array_to_host_local_array(out, mesh_2d, P("x", "y"))
  assert type(back["gda"]) is GlobalDeviceArray
  assert back["gda"].mesh_axes == P("x", "y")
  assert not any(isinstance(back[k], GlobalDeviceArray) for k in ("arr", "np"))
  for leaf in back.values():
    np.testing.assert_array_equal(np.asarray(leaf), data)


def test_conversion_is_zero_copy_when_the_layout_matches(mesh_2d):
  gda, _ = _gda(mesh_2d, P("x", "y"))
  out = multihost_utils.host_local_array_to_global_array(gda, mesh_2d, P("x", "y"))
  before = [s.data.unsafe_buffer_pointer() for s in gda.local_shards]
  assert [s.data.unsafe_buffer_pointer() for s in out.local_shards] == before
  back = multihost_utils.global_array_to_host_local_array(out, mesh_2d, P("x", "y"))
  assert [s.data.unsafe_buffer_pointer() for s in back.local_shards] == before


def test_a_gda_of_another_sharding_is_resharded_not_a_runtime_error(mesh_2d):
  # Stock fails inside batched_device_put for a multi-device jax.Array whose
  # sharding differs from the target (INVALID_ARGUMENT "exactly one shard").
  gda, data = _gda(mesh_2d, P("x"))
  with pytest.raises(Exception, match="exactly one shard"):
    stock.host_local_array_to_global_array(gda.to_jax_array(), mesh_2d, P("x", "y"))
  for leaf in (gda, gda.to_jax_array()):
    out = multihost_utils.host_local_array_to_global_array(leaf, mesh_2d, P("x", "y"))
    assert out.sharding.is_equivalent_to(NamedSharding(mesh_2d, P("x", "y")), 2)
    np.testing.assert_array_equal(np.asarray(out), data)


@pytest.mark.parametrize("fn", ["host_local_array_to_global_array",
                                "global_array_to_host_local_array"])
@pytest.mark.parametrize("spec", [P("x", "y"), P("x"), P()])
def test_stocks_own_conversions_take_a_gda_as_its_jax_array(mesh_2d, fn, spec):
  """Code that still calls stock `jax.experimental.multihost_utils` with a
  GDA gets what stock gives for the same `jax.Array` (stock's eager rules
  recognise only their own array class: a bare XLA error before)."""
  data = np.arange(32, dtype=np.float32).reshape(8, 4)
  gda = GlobalDeviceArray.from_callback(data.shape, mesh_2d, spec, lambda i: data[i])
  ours = getattr(stock, fn)(gda, mesh_2d, spec)
  want = getattr(stock, fn)(gda.to_jax_array(), mesh_2d, spec)
  assert type(ours) is type(want) and ours.sharding == want.sharding
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))


def test_gda_era_calling_patterns(mesh_2d):
  # One spec for a whole batch dict; a tuple of specs with a None subtree.
  batch = {"x": np.ones((8, 4), np.float32), "y": np.arange(8, dtype=np.int32)}
  out = multihost_utils.host_local_array_to_global_array(batch, mesh_2d, P("x"))
  assert {k: v.shape for k, v in out.items()} == {"x": (8, 4), "y": (8,)}
  out = multihost_utils.host_local_array_to_global_array(
      (batch["x"], None), mesh_2d, (P(("x", "y")), None))
  assert out[1] is None and out[0].sharding.spec == P(("x", "y"))
  out = multihost_utils.host_local_array_to_global_array(batch["x"], mesh_2d, P(None))
  assert out.sharding.is_fully_replicated


def test_none_pspec_means_replicated_as_in_gda_era_pjit(mesh_2d):
  # Stock rejects `None` ("`None` is not a valid input to the pspecs
  # argument"); GDA-era code (pjit axis resources) used it for replicated,
  # and paxml wraps stock to map it to P(). Here it is P().
  x = np.arange(16, dtype=np.float32).reshape(8, 2)
  with pytest.raises(ValueError, match="`None` is not a valid input to the pspecs"):
    stock.host_local_array_to_global_array(x, mesh_2d, None)
  for pspecs in (None, (None,), {"w": None}):
    tree = jax.tree.unflatten(jax.tree.structure(pspecs, is_leaf=lambda s: s is None), [x])
    out = multihost_utils.host_local_array_to_global_array(tree, mesh_2d, pspecs)
    g = jax.tree.leaves(out)[0]
    assert g.sharding.is_equivalent_to(NamedSharding(mesh_2d, P()), 2), g.sharding
    back = multihost_utils.global_array_to_host_local_array(out, mesh_2d, pspecs)
    np.testing.assert_array_equal(jax.tree.leaves(back)[0], x)


@pytest.mark.parametrize("leaf", ["name", object(), np.array(["a", "b"])],
                         ids=["str", "object", "numpy strings"])
@pytest.mark.parametrize("fn", ["host_local_array_to_global_array",
                                "global_array_to_host_local_array"])
def test_a_leaf_that_is_not_an_array_is_a_type_error_naming_it(mesh_2d, fn, leaf):
  """Stock refuses it too, naming no leaf: a TypeError (a bare XLA
  INVALID_ARGUMENT error on jax 0.8.x), and with a `None` spec its
  ValueError for `None` first. Here a TypeError names the leaf, with or
  without `None`."""
  tree = {"w": np.ones((8, 2), np.float32), "d": leaf}
  with pytest.raises((TypeError, jax.errors.JaxRuntimeError)):
    getattr(stock, fn)(tree, mesh_2d, P())
  for pspecs in (P(), None, {"w": P("x"), "d": None}):
    with pytest.raises(TypeError, match=rf"`{fn}`: the input \['d'\] .* is not an array of "
                       "numbers"):
      getattr(multihost_utils, fn)(tree, mesh_2d, pspecs)


@pytest.mark.parametrize("shape,spec,dim", [((3, 2), P("x"), 0), ((4, 3), P("x", "y"), 1),
                                            ((6, 2), P(("x", "y")), 0)])
def test_a_local_batch_that_cannot_be_globalised_is_a_clear_value_error(
    mesh_2d, shape, spec, dim):
  tree = {"batch": {"image": np.ones(shape, np.float32)}}
  with pytest.raises(ValueError, match=(
      rf"local input \[.batch.\]\[.image.\] of shape \({shape[0]}, {shape[1]}\) cannot "
      rf"be globalised .* its dimension {dim} .* Give every process a local batch")):
    multihost_utils.host_local_array_to_global_array(tree, mesh_2d, {"batch": spec})


@pytest.mark.parametrize("fn", ["host_local_array_to_global_array",
                                "global_array_to_host_local_array"])
@pytest.mark.parametrize("mesh,pspecs,exc,stock_exc,match", [
    # Stock: AttributeError, or pybind's "incompatible function arguments".
    ("none", P("x"), TypeError, (AttributeError, TypeError),
     r"`global_mesh` must be a `jax.sharding.Mesh`, got a NoneType"),
    ("devices", P("x"), TypeError, AttributeError,
     r"`global_mesh` must be a `jax.sharding.Mesh`, got a list"),
    # Stock: AttributeError, or (JAX 0.8.x) pybind's "incompatible function arguments".
    ("mesh", "x", TypeError, (AttributeError, TypeError),
     r"`pspecs` must be a `PartitionSpec` .* got a str \('x'\)"),
    ("mesh", {"w": 3}, TypeError, (AttributeError, TypeError),
     r"`pspecs`\['w'\] must be a `PartitionSpec` .* got a int \(3\)"),
    # A spec is shown as this JAX's `repr` shows it (`P(...)`, or `PartitionSpec(...)`).
    ("mesh", P("x", "x"), ValueError, Exception,
     rf"`pspecs`\['w'\] {re.escape(repr(P('x', 'x')))} uses the mesh axes \['x'\] more than once"),
    ("mesh", P("z"), ValueError, ValueError,
     rf"`pspecs`\['w'\] {re.escape(repr(P('z')))} names the mesh axes \['z'\], but "
     r"`global_mesh` has the axes"),
    ("mesh", P(None, None, "y"), ValueError, IndexError,
     rf"the pspec {re.escape(repr(P(None, None, 'y')))} partitions dimension 2, but the input "
     r"\['w'\] of shape \(8, 2\) has rank 2"),
])
def test_conversions_name_the_argument_that_is_wrong(mesh_2d, fn, mesh, pspecs, exc, stock_exc,
                                                     match):
  """A `global_mesh` that is no `Mesh`, a spec that is no `PartitionSpec`,
  uses an axis twice, names an axis the mesh lacks or partitions a dimension
  beyond the rank: a TypeError / ValueError naming the argument. Stock
  raises a bare AttributeError, IndexError or an exception of its own class
  for most of these."""
  mesh = {"none": None, "devices": list(mesh_2d.devices.flat), "mesh": mesh_2d}[mesh]
  tree = {"w": np.arange(16, dtype=np.float32).reshape(8, 2)}  # numpy: both convert it
  pspecs = pspecs if isinstance(pspecs, dict) else (
      {"w": pspecs} if isinstance(pspecs, P) else pspecs)
  with pytest.raises(exc, match=match):
    getattr(multihost_utils, fn)(tree, mesh, pspecs)
  with pytest.raises(stock_exc):
    getattr(stock, fn)(tree, mesh, pspecs)


def test_a_global_input_that_cannot_be_split_is_a_clear_value_error(mesh_2d):
  """A global input whose dimension does not divide over the mesh: a
  ValueError naming it (stock: a bare AssertionError in its shape math). An
  array that is already host-local is returned as it is, as stock does."""
  tree = {"batch": {"ids": np.ones((6, 2), np.float32)}}
  with pytest.raises(AssertionError):
    stock.global_array_to_host_local_array(tree, mesh_2d, P("x"))
  with pytest.raises(ValueError, match=(
      r"the global input \['batch'\]\['ids'\] of shape \(6, 2\) cannot be split with pspec "
      rf"{re.escape(repr(P('x')))}: its dimension 0 \(6\) must divide evenly over the 4 devices "
      r"along 'x'")):
    multihost_utils.global_array_to_host_local_array(tree, mesh_2d, P("x"))
  local = {"step": jnp.int32(3)}  # host-local already: no spec is read off it
  assert multihost_utils.global_array_to_host_local_array(local, mesh_2d, P("x")) == local


def test_host_local_python_scalars_are_their_numpy_values(mesh_2d):
  """Stock fails on a Python scalar leaf (AttributeError: no `dtype` /
  `shape`; JAX 0.8.x and 0.9.x convert it); here it is its numpy value in
  JAX's dtype, as `jnp.asarray` takes it."""
  try:
    stock.host_local_array_to_global_array({"lr": 0.5}, mesh_2d, P())
  except AttributeError:
    pass
  out = multihost_utils.host_local_array_to_global_array(
      {"lr": 0.5, "step": 3, "on": True}, mesh_2d, P())
  assert {k: (v.dtype, v.shape, v.item()) for k, v in out.items()} == {
      "lr": (np.float32, (), 0.5), "step": (np.int32, (), 3), "on": (np.bool_, (), True)}
  assert all(v.sharding.is_fully_replicated for v in out.values())


def test_global_to_host_local_python_scalars_get_jaxs_dtype(mesh_2d):
  """A Python scalar leaf comes back with JAX's dtype, as its numpy value
  does (stock gives it a 64-bit aval over 32-bit data with x64 off)."""
  for value, want in ((2.5, np.float32), (3, np.int32), (1 + 2j, np.complex64)):
    assert stock.global_array_to_host_local_array(value, mesh_2d, P()).dtype != want
    out = multihost_utils.global_array_to_host_local_array(value, mesh_2d, P())
    assert out.dtype == want and out.item() == value


def test_process_allgather_gives_a_gdas_global_value(mesh_2d):
  gda, data = _gda(mesh_2d, P("x", "y"))
  for tiled in (False, True):
    out = multihost_utils.process_allgather({"g": gda, "n": data}, tiled=tiled)
    assert type(out["g"]) is np.ndarray
    np.testing.assert_array_equal(out["g"], data)  # tiled does not apply to a GDA
    want = stock.process_allgather(data, tiled=tiled)  # host values: stock's stacking
    np.testing.assert_array_equal(out["n"], want)
    assert out["n"].shape == want.shape


def test_process_allgather_records_the_fetch_in_the_ledger(mesh_2d):
  gda, _ = _gda(mesh_2d, P("x", "y"))
  with jax_sharding_ext.transfer_ledger() as ledger:
    multihost_utils.process_allgather(gda)
  assert ledger.records and all(r.direction == "device_to_host" for r in ledger.records)


def test_broadcast_and_assert_equal_in_one_process(mesh_2d):
  gda, data = _gda(mesh_2d, P("x"))
  out = multihost_utils.broadcast_one_to_all({"g": gda, "n": np.int32(7)})
  assert type(out["g"]) is np.ndarray and out["n"] == 7
  np.testing.assert_array_equal(out["g"], data)
  assert bool(multihost_utils.broadcast_one_to_all(jnp.array(True))) is True
  multihost_utils.assert_equal({"g": gda, "t": multihost_utils.broadcast_one_to_all(
      np.int32(1234))}, "configs differ")
  multihost_utils.sync_global_devices("single process")


@pytest.mark.parametrize("fn", ["assert_equal", "process_allgather", "broadcast_one_to_all"])
def test_a_leaf_that_is_no_array_is_refused_in_one_process_too(fn):
  """A string or an object leaf is a TypeError naming it, in one process as
  on many (stock takes it in one process, where nothing is gathered, and
  fails inside `device_put` on several)."""
  for leaf, kind in (("float32", "str"), (object(), "object")):
    with pytest.raises(TypeError, match=(
        rf"`{fn}` takes arrays and scalars of numbers or booleans, but the leaf "
        rf"\['cfg'\]\[1\] is a {kind} ")):
      getattr(multihost_utils, fn)({"cfg": [np.ones(2), leaf]})


def test_assert_equal_under_jit_is_jaxs_tracer_error():
  """Traced values cannot be compared across processes: JAX's own error,
  raised before any collective, as stock's."""
  for mod in (multihost_utils, stock):
    with pytest.raises(jax.errors.TracerArrayConversionError):
      jax.jit(lambda x, mod=mod: mod.assert_equal(x) or x)(jnp.ones(2))


def test_conversions_trace_under_jit_vmap_and_grad_as_stocks_do(mesh_2d):
  """Stock `host_local_array_to_global_array` and
  `global_array_to_host_local_array` trace under `jax.jit` (and `vmap`,
  `grad`) on a plain `jax.Array`: the primitive binds on the traced value.
  Ours give the same results, for numpy, `jax.Array` and GDA arguments; the
  resharding of a concrete local array is not applied to a traced one."""
  spec = P("x", "y")
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  placed = jax.device_put(data, NamedSharding(mesh_2d, spec))
  for x in (data, jnp.asarray(data), placed, GlobalDeviceArray.from_jax_array(placed)):
    for fn in (
        lambda mod, a: mod.host_local_array_to_global_array({"a": a}, mesh_2d, spec)["a"] * 2,
        lambda mod, a: mod.global_array_to_host_local_array(a, mesh_2d, spec) + 1):
      got, want = (jax.jit(lambda a, fn=fn, mod=mod: fn(mod, a))(x)
                   for mod in (multihost_utils, stock))
      assert type(got) is type(want) and got.shape == want.shape
      assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding,
                                                                        want.sharding)
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  ltg_sum = lambda mod, a: mod.host_local_array_to_global_array(a, mesh_2d, spec).sum()
  for transform, arg in ((jax.vmap, np.stack([data, data + 1])), (jax.grad, data)):
    got, want = (transform(lambda a, mod=mod: ltg_sum(mod, a))(arg)
                 for mod in (multihost_utils, stock))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_traced_local_batch_that_cannot_be_globalised_is_the_same_value_error(mesh_2d):
  # Shapes are static, so the check still applies under jit: stock fails in
  # its shape math with a bare AssertionError.
  with pytest.raises(AssertionError):
    jax.jit(lambda a: stock.host_local_array_to_global_array(a, mesh_2d, P("x")))(
        jnp.ones((3, 2)))
  with pytest.raises(ValueError, match=r"local input local_inputs of shape \(3, 2\) cannot "
                     r"be globalised .* its dimension 0 .* Give every process a local batch"):
    jax.jit(lambda a: multihost_utils.host_local_array_to_global_array(a, mesh_2d, P("x")))(
        jnp.ones((3, 2)))


@pytest.mark.multiprocess
def test_assert_equal_compares_a_replicated_gda_across_two_processes():
  """Two processes, each with a GDA replicated over all 8 devices (4 its
  own): equal values pass on both; values a host filled differently (its own
  seed, `from_callback` or per-host constructor buffers) raise
  `AssertionError` with the message on both. Stock compares nothing for a
  global `jax.Array` (each process checks its own replica against itself), so
  this is stricter than stock. A GDA sharded across processes is still a
  `ValueError`."""
  run = run_workers(Path(__file__).parent / "_multihost_worker.py", 2, 4,
                    args=("assert_equal",))
  if not run.ok:
    pytest.fail(run.report(), pytrace=False)
  for i in range(2):
    out = run.stdout(i)
    assert f"[worker {i}] assert_equal ok" in out, run.report()
    for message in ("params differ", "last host differs", "buffers differ"):
      assert f"[worker {i}] assert_equal raised {message!r}" in out, run.report()


# ---------------------------------------------------------------------------
# Across real processes: `assert_equal` names what differs and never lets the
# processes enter mismatched collectives; `process_allgather` and
# `broadcast_one_to_all` check that the processes' trees agree first. One run
# of `_assert_equal_worker.py` per process count plays every scenario; each
# test reads its scenarios' lines from every process.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[2, 4], ids=["2-processes", "4-processes"])
def scenarios(request):
  n = request.param
  run = run_workers(Path(__file__).parent / "_assert_equal_worker.py", n, 8 // n, timeout=180)
  if not run.ok:
    pytest.fail(run.report(), pytrace=False)
  per_process = []
  for i in range(n):
    found = {}
    for line in run.stdout(i).splitlines():
      if line.startswith("SCENARIO "):
        _, name, record = line.split(" ", 2)
        found[name] = json.loads(record)
    per_process.append(found)
  return n, per_process


def _raised_everywhere(scenarios, name, exc_type):
  """The message every process raised in scenario `name` (the same on all)."""
  n, per_process = scenarios
  records = [found[name] for found in per_process]
  assert all(r["outcome"] == "raise" and r["type"] == exc_type for r in records), records
  messages = {r["message"] for r in records}
  assert len(messages) == 1, messages
  return messages.pop()


@pytest.mark.multiprocess
def test_assert_equal_passes_equal_trees_of_every_leaf_kind(scenarios):
  """Numpy, `jax.Array`, Python and numpy scalars, None, an empty array and
  a GDA replicated over every process, the same everywhere: passes."""
  _, per_process = scenarios
  assert all(found["equal"] == {"outcome": "ok", "value": None} for found in per_process)


@pytest.mark.multiprocess
def test_assert_equal_names_the_leaf_and_the_first_differing_element(scenarios):
  """A value deep in a big array: the message names the leaf's path and
  shows the first differing index, each process's element there and how
  many differ (stock dumped both whole trees, numpy-summarised with `...`,
  so the differing value was invisible, and named no leaf)."""
  n, _ = scenarios
  msg = _raised_everywhere(scenarios, "deep_float", "AssertionError")
  others = "process 0 has" if n == 2 else f"processes {', '.join(map(str, range(n - 1)))} have"
  assert msg == (
      "weights differ. `assert_equal`: the processes' values differ at ['weights']['w'] "
      f"(float32, shape (4096,)), in 1 of 4096 elements; the first at index (3000,): "
      f"{others} 3000.0; process {n - 1} has -1.0."), msg
  assert "..." not in msg


@pytest.mark.multiprocess
@pytest.mark.parametrize("name,path,shown", [
    ("int", "['table']", ["in 2 of 12 elements", "index (0, 2)", " 2;", "has 3.",
                          "[[ 0,  1,  3,  3], [ 4,  5,  6,  8]"]),
    ("bool", "['mask']", ["index (2,)", "True;", "has False"]),
    ("python_scalar", "['lr']", ["(float64, shape ())", "0.1", "has 0.2"]),
    ("zero_d", "in_tree", ["(float32, shape ())", "process 0 has 1.0", "0.0"]),
    ("float64", "['t']", ["1.0;", "has 1.000000000001"]),
    ("gda", "['params']['w']", ["in 6 of 6 elements", "0.0", "has 1.0"]),
])
def test_assert_equal_shows_each_processs_value(scenarios, name, path, shown):
  """Ints, bools, Python and 0-d scalars, a replicated GDA: the path and
  every process's value. Leaves of 64-bit dtypes compare at full precision
  (stock gathered them through 32-bit device arrays, so 1.0 and
  1.000000000001 passed)."""
  msg = _raised_everywhere(scenarios, name, "AssertionError")
  assert f"differ at {path} (" in msg, msg
  for text in shown:
    assert text in msg, (text, msg)


@pytest.mark.multiprocess
def test_assert_equal_shows_every_processs_scalar(scenarios):
  n, _ = scenarios
  msg = _raised_everywhere(scenarios, "scalar", "AssertionError")
  assert msg.endswith("(int32, shape ()): " + "; ".join(
      f"process {i} has {i}" for i in range(n)) + "."), msg


@pytest.mark.multiprocess
@pytest.mark.parametrize("name,path,theirs,last", [
    # Stock read the int32 bytes as float32 (and the reverse) and printed those.
    ("dtype", "['x']", "an array of dtype float32 and shape (4,)",
     "an array of dtype int32 and shape (4,)"),
    # Stock: SIGABRT inside gloo's all-gather ("Received data size doesn't
    # match expected size") on one process, a bare JaxRuntimeError on the other.
    ("shape", "['x']", "an array of dtype float32 and shape (4,)",
     "an array of dtype float32 and shape (5,)"),
    ("empty_shape", "['x']", "an array of dtype float64 and shape (0, 3)",
     "an array of dtype float64 and shape (0, 4)"),
    # Stock: one process passed, the other read the extra leaf from garbage,
    # then the processes aborted in mismatched collectives.
    ("extra_key", "in_tree", "a dict with keys ['a']", "a dict with keys ['a', 'b']"),
    # Stock compared only the values: a list and a tuple passed.
    ("list_tuple", "['xs']", "a list of 1", "a tuple of 1"),
    ("none_leaf", "['opt']", "None", "an array of dtype float64 and shape (2,)"),
])
def test_assert_equal_names_where_structure_dtype_or_shape_differ(
    scenarios, name, path, theirs, last):
  """Every process raises the same AssertionError naming the path and what
  each process has there, and no process enters a mismatched collective."""
  n, _ = scenarios
  msg = _raised_everywhere(scenarios, name, "AssertionError")
  assert f"trees differ at {path}: " in msg, msg
  assert f"{'process 0 has' if n == 2 else 'have'} {theirs}" in msg, msg
  assert f"process {n - 1} has {last}" in msg, msg


@pytest.mark.multiprocess
def test_assert_equal_takes_nan_everywhere_as_equal(scenarios):
  """NaN at the same place on every process passes (stock's `==` failed it
  on every process, naming no difference)."""
  _, per_process = scenarios
  assert all(found["nan_everywhere"]["outcome"] == "ok" for found in per_process)


@pytest.mark.multiprocess
def test_assert_equal_refuses_bad_leaves_on_every_process(scenarios):
  """A leaf that is not an array on one process only, and a GDA sharded
  across processes: every process raises, naming the leaf (a refusal on
  one process alone would leave the others waiting in the gather)."""
  n, _ = scenarios
  msg = _raised_everywhere(scenarios, "not_array_on_one", "TypeError")
  assert msg.startswith(f"process {n - 1} refused its input: `assert_equal` takes arrays"), msg
  assert "the leaf ['name'] is a str ('run')" in msg, msg
  msg = _raised_everywhere(scenarios, "sharded_gda", "ValueError")
  assert msg.startswith("`assert_equal` got a GlobalDeviceArray of shape (16,) sharded as "
                        f"{P('g')!r} across processes at ['w']"), msg
  assert "process_allgather" in msg, msg


@pytest.mark.multiprocess
def test_assert_equal_on_a_global_jax_array_keeps_stocks_rule_or_names_it(scenarios):
  """A fully replicated global `jax.Array` is not compared (stock: each
  process checks its replica against itself), even when the replicas
  differ; one sharded across processes is the GDA's ValueError naming the
  leaf (stock compared its first shard with the global value: a broadcasting
  error, or for some shapes a wrong comparison)."""
  _, per_process = scenarios
  assert all(found["replicated_array"]["outcome"] == "ok" for found in per_process)
  msg = _raised_everywhere(scenarios, "sharded_array", "ValueError")
  assert msg.startswith(f"`assert_equal` got a jax.Array of shape (16,) sharded as {P('g')!r} "
                        "across processes at ['w']"), msg


@pytest.mark.multiprocess
@pytest.mark.parametrize("name,text", [
    ("allgather_shape", "`process_allgather` needs `in_tree` with the same structure, shapes "
                        "and dtypes on every process, but the processes' trees differ at "
                        "['batch']: "),
    ("allgather_structure", "`process_allgather` needs `in_tree` with the same structure, "
                            "shapes and dtypes on every process, but the processes' trees "
                            "differ at in_tree: "),
    ("broadcast_dtype", "`broadcast_one_to_all` needs `in_tree` with the same structure, "
                        "shapes and dtypes on every process, but the processes' trees differ "
                        "at ['seed']: "),
])
def test_gathers_refuse_trees_that_differ_between_processes(scenarios, name, text):
  """`process_allgather` and `broadcast_one_to_all` on trees whose shapes,
  structure or dtypes differ between processes: every process raises the
  same ValueError naming the path (stock aborted the processes inside the
  gather, or mixed the bytes of different dtypes)."""
  msg = _raised_everywhere(scenarios, name, "ValueError")
  assert msg.startswith(text), msg


@pytest.mark.multiprocess
def test_gathers_of_agreeing_trees_work_as_stock(scenarios):
  n, per_process = scenarios
  for found in per_process:
    assert found["allgather_ok"] == {"outcome": "ok", "value": [[i, i] for i in range(n)]}
    assert found["broadcast_ok"] == {"outcome": "ok", "value": 10}


@pytest.mark.multiprocess
def test_a_mesh_that_splits_a_processs_devices_names_global_mesh(scenarios):
  """A mesh whose order interleaves the processes' devices: a ValueError
  naming `global_mesh` and how to order it (stock's names neither)."""
  msg = _raised_everywhere(scenarios, "interleaved_mesh", "ValueError")
  assert msg.startswith("`host_local_array_to_global_array`: `global_mesh` {'x': 8} does not "
                        "give this process's devices a contiguous block"), msg
  assert "Order the devices" in msg, msg
