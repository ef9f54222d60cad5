"""install()/uninstall(): idempotent, exactly reversible, no device side effects."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import jax
import numpy as np
import pytest
from jax._src import core, dispatch, effects, traceback_util
from jax._src.interpreters import mlir, pxla
from jax.experimental import multihost_utils as stock_multihost
from jax.sharding import PartitionSpec as P

import jax_sharding_ext
from jax_sharding_ext import GlobalDeviceArray

_DICT_TABLES = {
    "pytype_aval_mappings": core.pytype_aval_mappings,
    "shard_arg_handlers": pxla.shard_arg_handlers,
    "global_result_handlers": pxla.global_result_handlers,
    "mlir constant handlers": mlir._constant_handlers,
    "mlir lowerings": mlir._lowerings,
    "mlir platform lowerings": mlir._platform_specific_lowerings,
}
_EFFECT_SETS = [n for n in dir(effects) if isinstance(getattr(effects, n), effects.EffectTypeSet)]


def _snapshot():
  snap = {}
  for name, table in _DICT_TABLES.items():
    if name == "mlir platform lowerings":
      snap[name] = {p: dict(t) for p, t in table.items()}
    else:
      snap[name] = dict(table)
  for name in _EFFECT_SETS:
    snap[name] = set(getattr(effects, name)._effect_types)
  # Wrapped (no table exists) so `jax.device_put(gda)` keeps the sharding.
  snap["dispatch functions"] = {"_batched_device_put_impl": dispatch._batched_device_put_impl}
  # Replaced (no table exists) so `effects_barrier()` sees every thread's tokens.
  snap["dispatch objects"] = {"runtime_tokens": dispatch.runtime_tokens}
  # Wrapped (no table exists) so a `Compiled` keeps the output flag it was compiled under.
  snap["pxla methods"] = {"load": pxla.UnloadedMeshExecutable.__dict__["load"]}
  # Primitive sets the ordered-effect lowerings join, and JAX's traceback filter.
  snap["prim_requires_devices_during_lowering"] = set(
      dispatch.prim_requires_devices_during_lowering)
  snap["uncacheable_primitives"] = set(mlir._uncacheable_primitives)
  snap["traceback exclusions"] = {"_exclude_paths": tuple(traceback_util._exclude_paths)}
  # Eager rules of stock multihost_utils' primitives (they test for ArrayImpl).
  snap["primitive rules"] = {p.name: p.impl for p in (
      stock_multihost.host_local_array_to_global_array_p,
      stock_multihost.global_array_to_host_local_array_p)}
  return snap


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for name in a:
    if isinstance(a[name], set):
      assert a[name] == b[name], name
      continue
    assert a[name].keys() == b[name].keys(), name
    for k in a[name]:
      if isinstance(a[name][k], dict):
        assert a[name][k].keys() == b[name][k].keys(), (name, k)
        assert all(a[name][k][j] is b[name][k][j] for j in a[name][k]), (name, k)
      elif isinstance(a[name][k], tuple):
        assert a[name][k] == b[name][k], (name, k)
      else:
        assert a[name][k] is b[name][k], (name, k)


def test_uninstall_restores_every_table_exactly(fresh_registry):
  jax_sharding_ext.uninstall()
  assert not jax_sharding_ext.is_installed()
  before = _snapshot()
  jax_sharding_ext.install()
  installed = _snapshot()
  assert GlobalDeviceArray in installed["pytype_aval_mappings"]
  assert GlobalDeviceArray in installed["shard_arg_handlers"]
  assert installed["global_result_handlers"][core.ShapedArray] is not (
      before["global_result_handlers"][core.ShapedArray])
  jax_sharding_ext.install()  # idempotent
  _assert_same(installed, _snapshot())
  jax_sharding_ext.uninstall()
  _assert_same(before, _snapshot())
  jax_sharding_ext.uninstall()  # idempotent too
  _assert_same(before, _snapshot())


def test_uninstalled_gda_is_rejected_like_any_unknown_type(mesh_2d, fresh_registry):
  data = np.arange(16.0).reshape(8, 2)
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x"), lambda i: data[i])
  f = jax.jit(lambda x: x + 1)
  np.testing.assert_array_equal(f(gda), data + 1)
  jax_sharding_ext.uninstall()
  # The error the user sees says why and what to do: not stock's generic
  # "Error interpreting argument" TypeError of `jax.jit`, nor its ValueError
  # about `__jax_array__`.
  for call in (lambda: f(gda), lambda: jax.numpy.sum(gda), lambda: jax.device_put(gda)):
    with pytest.raises(RuntimeError, match="jax_sharding_ext is uninstalled") as e:
      call()
    assert "jax_sharding_ext.install()" in str(e.value)
  jax_sharding_ext.install()
  np.testing.assert_array_equal(f(gda), data + 1)


def test_uninstall_refuses_to_clobber_a_foreign_entry_and_changes_nothing(fresh_registry):
  """Another extension replaced one of the package's entries: `uninstall()`
  raises and leaves every table as it was (the entries it had already put
  back are applied again), still installed; once the entry is the package's
  again, it uninstalls completely."""
  installed = _snapshot()
  mine = pxla.shard_arg_handlers[GlobalDeviceArray]
  pxla.shard_arg_handlers[GlobalDeviceArray] = foreign = lambda *a: None
  try:
    with pytest.raises(RuntimeError, match="replaced by someone else"):
      jax_sharding_ext.uninstall()
    assert pxla.shard_arg_handlers[GlobalDeviceArray] is foreign  # not clobbered
    assert jax_sharding_ext.is_installed()
  finally:
    pxla.shard_arg_handlers[GlobalDeviceArray] = mine
  _assert_same(installed, _snapshot())
  jax_sharding_ext.uninstall()
  assert GlobalDeviceArray not in pxla.shard_arg_handlers


def test_import_initialises_no_backend():
  code = textwrap.dedent("""
      import jax_sharding_ext
      from jax._src import xla_bridge
      assert jax_sharding_ext.is_installed()
      print(sorted(xla_bridge._backends))
  """)
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip() == "[]"


def test_toggling_while_another_thread_lowers_ordered_effects():
  """`install()` / `uninstall()` while another thread traces, lowers and runs
  multi-device ordered-effect jits: each call runs fully installed (it
  prints) or fully uninstalled (stock's ValueError for ordered effects on
  more than one device), never against half-swapped tables (XLA's INTERNAL
  "Side-effect HLO must have sharding")."""
  worker = pathlib.Path(__file__).parent / "_toggle_race_worker.py"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  res = subprocess.run([sys.executable, str(worker), "3"], capture_output=True, text=True,
                       timeout=180, env=env)
  assert res.returncode == 0, res.stderr[-3000:]
  summary = json.loads(res.stdout.splitlines()[-1])
  assert summary["bad"] == [], summary
  assert summary["ok"] > 0 and summary["toggles"] > 0, summary  # both states were really seen


def test_uninstall_inside_a_host_callback_is_refused_at_once(mesh_2d, fresh_registry):
  """A swap waits for the computations in flight; from inside one (a host
  callback) it would wait for itself: refused at once, nothing changed."""
  seen = []

  def callback(v):
    try:
      jax_sharding_ext.uninstall()
    except RuntimeError as e:
      seen.append(str(e))

  x = jax.device_put(np.arange(8.0), jax.sharding.NamedSharding(mesh_2d, P("x")))
  jax.jit(lambda v: jax.debug.callback(callback, v.sum(), ordered=True) or v)(x)
  jax_sharding_ext.effects_barrier()
  assert len(seen) == 1 and "inside a JAX lowering or a host callback" in seen[0], seen
  assert jax_sharding_ext.is_installed()



def test_uninstall_while_a_host_callback_compiles_on_a_helper_thread(fresh_registry):
  """A swap holds new lowerings back while it waits for the computations in
  flight, but only for a moment: a host callback that compiles on a thread
  pool (the computation waits for that lowering, which waits for the swap)
  finishes, and the swap follows it, both within seconds. Holding them back
  for as long as the swap waits stalled both until the swap gave up (60 s)."""
  import concurrent.futures
  import threading
  import time

  def callback(v):
    time.sleep(0.3)  # the swap starts waiting meanwhile
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      pool.submit(lambda: jax.jit(lambda y: y + 1)(np.ones(3, np.float32))).result()
    return v

  f = jax.jit(lambda v: jax.pure_callback(callback, jax.ShapeDtypeStruct((), np.float32), v))
  x = jax.device_put(np.float32(1.0), jax.devices()[0])
  out, errors = [], []

  def swap():
    time.sleep(0.1)
    try:
      jax_sharding_ext.uninstall()
      jax_sharding_ext.install()
    except Exception as e:  # reported below
      errors.append(e)

  start = time.monotonic()
  t = threading.Thread(target=swap)
  t.start()
  out.append(float(jax.block_until_ready(f(x))))
  t.join(timeout=30)
  assert not t.is_alive() and not errors, errors
  assert out == [1.0] and time.monotonic() - start < 10
  assert jax_sharding_ext.is_installed()


def test_a_call_lowered_installed_and_run_uninstalled_raises_the_uninstalled_error(
    mesh_2d, fresh_registry):
  """`uninstall()` waits for a lowering in flight, then swaps while that
  call compiles: the call then runs against the uninstalled tables and gets
  the package's error, not jit's generic "not a valid JAX type"."""
  import time

  from jax.extend.core import Primitive
  data = np.arange(16.0, dtype=np.float32).reshape(8, 2)
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x", "y"), lambda i: data[i])
  lowering = threading.Event()
  slow = Primitive("slow_to_lower")
  slow.def_abstract_eval(lambda aval: aval)

  def rule(ctx, x):
    lowering.set()
    time.sleep(0.3)
    return [x]
  mlir.register_lowering(slow, rule)
  box: dict = {}

  def call():
    try:
      box["out"] = jax.jit(lambda v: slow.bind(v) * 2)(gda)
    except Exception as e:
      box["err"] = e
  t = threading.Thread(target=call)
  t.start()
  lowering.wait(30)
  jax_sharding_ext.uninstall()
  t.join(60)
  assert isinstance(box.get("err"), RuntimeError), box
  assert "jax_sharding_ext is uninstalled" in str(box["err"])


@pytest.mark.parametrize("inside", ["jit", "nested jit"])
def test_a_sharded_callback_traced_installed_and_lowered_uninstalled_gets_the_uninstalled_error(
    mesh_2d, fresh_registry, inside):
  """A call racing `uninstall()` between its trace and its lowering: the
  staged `sharded_callback` gets the error it gets when staged uninstalled,
  not stock's refusal of its ordered effect on several devices (which names
  an effect the user never used)."""
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x", "y"),
                                        lambda i: np.ones((8, 2), np.float32)[i])

  def body(v):
    jax_sharding_ext.sharded_callback(lambda data, index, device: None, v,
                                      sharding=gda.sharding)
    return v + 1
  f = body if inside == "jit" else (lambda v: jax.jit(body)(v) * 1)
  traced = jax.jit(f).trace(gda)
  jax_sharding_ext.uninstall()
  with pytest.raises(RuntimeError, match=r"`sharded_callback` needs jax_sharding_ext installed"):
    traced.lower()
  jax_sharding_ext.install()
  np.testing.assert_array_equal(np.asarray(traced.lower().compile()(gda)), 2.0)


def test_abstractification_that_missed_the_table_gets_the_uninstalled_error(mesh_2d):
  """JAX reads `__jax_array__` only after its aval table did not know the
  type: the table was read while uninstalled, even if a racing `install()`
  finished since. That is the package's "uninstalled" error, not stock's
  ValueError about `__jax_array__`."""
  gda = GlobalDeviceArray.from_callback((8, 2), mesh_2d, P("x"), lambda i: np.ones((2, 2)))
  entry = core.pytype_aval_mappings.pop(GlobalDeviceArray)
  try:
    for read in (core.shaped_abstractify, core.typeof):
      with pytest.raises(RuntimeError, match="jax_sharding_ext is uninstalled"):
        read(gda)
  finally:
    core.pytype_aval_mappings[GlobalDeviceArray] = entry
  assert jax.numpy.asarray(gda).shape == (8, 2)  # `__jax_array__` elsewhere still works
