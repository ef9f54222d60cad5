"""Ordered shardable effects: prints, callbacks, declared effects, sharded_callback.

Output printed by callbacks is read at the file-descriptor level (`capfd`)
after a barrier. Across devices at one program point the order is
unspecified, so per-device checks group events by device first.
"""

import ast
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext._jax import effects as jax_effects
from jax_sharding_ext._jax import frames as jax_frames

STOCK_ERROR = "ordered effects are not supported for more than 1 device"


def _put(mesh, spec, shape=(8, 8)):
  data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  return jax.device_put(data, NamedSharding(mesh, spec)), data


def _lines(capfd):
  jse.effects_barrier()
  return [line for line in capfd.readouterr().out.splitlines() if line]


def _two_prints(x):
  jax.debug.print("first {s}", s=x.sum(), ordered=True)
  jax.debug.print("second {s}", s=(x * 2).sum(), ordered=True)
  return x + 1


# ---------------------------------------------------------------------------
# jax.debug.print / jax.debug.callback under multi-device jit
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 8])
def test_ordered_print_jit_runs_once_per_program_point(mesh_factory, capfd, n):
  mesh = mesh_factory((n,), ("x",))
  x, data = _put(mesh, P("x"))
  f = jax.jit(_two_prints)
  for _ in range(3):
    out = f(x)
  np.testing.assert_array_equal(np.asarray(out), data + 1)
  s = data.sum()
  assert _lines(capfd) == [f"first {s}", f"second {2 * s}"] * 3


def test_ordered_prints_on_a_2d_mesh(mesh_2d, capfd):
  x, data = _put(mesh_2d, P("x", "y"))
  out = jax.jit(_two_prints)(x)
  assert out.sharding.is_equivalent_to(x.sharding, 2)
  assert _lines(capfd) == ["first 2016.0", "second 4032.0"]


def test_ordered_callback_jit_sees_global_value(mesh_2d):
  x, data = _put(mesh_2d, P("x", "y"))
  seen = []

  @jax.jit
  def f(x):
    jax.debug.callback(lambda v: seen.append(("a", np.asarray(v))), x, ordered=True)
    jax.debug.callback(lambda v: seen.append(("b", np.asarray(v))), x * 3, ordered=True)
    return x

  f(x)
  f(x)
  jse.effects_barrier()
  assert [tag for tag, _ in seen] == ["a", "b", "a", "b"]
  for tag, value in seen:
    np.testing.assert_array_equal(value, data if tag == "a" else data * 3)


def test_ordered_effects_order_across_calls_and_functions(mesh_1d, capfd):
  x, _ = _put(mesh_1d, P("x"))
  f = jax.jit(lambda x, i: jax.debug.print("f {i}", i=i, ordered=True) or x)
  g = jax.jit(lambda x, i: jax.debug.print("g {i}", i=i, ordered=True) or x)
  for i in range(4):
    f(x, i)
    g(x, i)
  assert _lines(capfd) == [line for i in range(4) for line in (f"f {i}", f"g {i}")]


def test_unordered_print_unchanged(mesh_2d, capfd):
  x, _ = _put(mesh_2d, P("x", "y"))
  jax.jit(lambda x: jax.debug.print("u {s}", s=x.sum()) or x)(x)
  assert _lines(capfd) == ["u 2016.0"]


def test_io_callback_still_works(mesh_2d):
  x, data = _put(mesh_2d, P("x", "y"))
  seen = []
  jax.jit(lambda x: io_callback(lambda v: seen.append(float(v)), None, x.sum(), ordered=True))(x)
  jse.effects_barrier()
  assert seen == [data.sum()]


def test_partitioned_ordered_callback_raises_clear_error(mesh_2d):
  x, _ = _put(mesh_2d, P("x", "y"))
  f = jax.jit(lambda x: jax.debug.callback(print, x, ordered=True, partitioned=True))
  with pytest.raises(ValueError, match="partitioned=False.*sharded_callback"):
    f(x)


# ---------------------------------------------------------------------------
# Inside shard_map: once per device, local value, program order per device
# ---------------------------------------------------------------------------


def test_shard_map_print_per_device_program_order(mesh_2d, capfd):
  x, data = _put(mesh_2d, P("x", "y"))

  def body(v, call):
    i, j = jax.lax.axis_index("x"), jax.lax.axis_index("y")
    for k in range(3):
      jax.debug.print("dev {i} {j} call {c} step {k} sum {s}", i=i, j=j, c=call, k=k,
                      s=v.sum() * (k + 1), ordered=True)
    return v

  f = jax.jit(jax.shard_map(body, mesh=mesh_2d, in_specs=(P("x", "y"), P()),
                            out_specs=P("x", "y")))
  for call in range(3):
    f(x, call)
  per_device: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
  for line in _lines(capfd):
    _, i, j, _, c, _, k, _, s = line.split()
    per_device.setdefault((int(i), int(j)), []).append((int(c), int(k), float(s)))
  assert len(per_device) == 8
  for (i, j), events in per_device.items():
    local = data[2 * i:2 * i + 2, 4 * j:4 * j + 4].sum()
    assert events == [(c, k, local * (k + 1)) for c in range(3) for k in range(3)]


def test_shard_map_callback_gets_local_values(mesh_2d):
  x, data = _put(mesh_2d, P("x", "y"))
  seen = []

  def body(v):
    pos = (jax.lax.axis_index("x"), jax.lax.axis_index("y"))
    jax.debug.callback(lambda p, a: seen.append((tuple(map(int, p)), np.asarray(a))), pos, v,
                       ordered=True)
    return v

  jax.jit(jax.shard_map(body, mesh=mesh_2d, in_specs=P("x", "y"), out_specs=P("x", "y")))(x)
  jse.effects_barrier()
  assert sorted(p for p, _ in seen) == [(i, j) for i in range(4) for j in range(2)]
  for (i, j), local in seen:
    np.testing.assert_array_equal(local, data[2 * i:2 * i + 2, 4 * j:4 * j + 4])


def test_shard_map_partial_auto_ordered_raises_clear_error(mesh_2d):
  x, _ = _put(mesh_2d, P("x", "y"))

  def body(v):
    jax.debug.print("{s}", s=v.sum(), ordered=True)
    return v

  f = jax.jit(jax.shard_map(body, mesh=mesh_2d, in_specs=P("x"), out_specs=P("x"),
                            axis_names={"x"}))
  with pytest.raises(ValueError, match="drop `axis_names=`"):
    f(x)


def test_nested_shard_map_ordered_raises_clear_error(fresh_registry, mesh_2d, capfd):
  x, _ = _put(mesh_2d, P("x", "y"))

  def inner(v, ordered):
    jax.debug.print("inner {s}", s=v.sum(), ordered=ordered)
    return v

  def outer(v, ordered):
    return jax.shard_map(lambda w: inner(w, ordered), in_specs=P(None, "y"),
                         out_specs=P(None, "y"), axis_names={"y"})(v)

  def make(ordered):
    return jax.jit(jax.shard_map(lambda v: outer(v, ordered), mesh=mesh_2d, in_specs=P("x"),
                                 out_specs=P("x"), axis_names={"x"}))

  with pytest.raises(ValueError, match="nested in another `shard_map`"):
    make(True)(x)

  def unordered():
    try:
      make(False)(x)
      jse.effects_barrier()
    except Exception as e:  # stock JAX 0.8.x / 0.9.x fail to lower it (Shardy)
      return type(e)
    return len(_lines(capfd))

  # Unordered: stock JAX, unchanged (it runs, one line per device, where stock runs it).
  jse.uninstall()
  stock = unordered()
  jse.install()
  assert unordered() == stock
  assert stock == 8 or isinstance(stock, type)


# ---------------------------------------------------------------------------
# Control flow, remat, custom derivatives (8 devices; 1 device is stock JAX)
# ---------------------------------------------------------------------------


def _scan_fn(x):
  def step(c, k):
    jax.debug.print("scan {k} {s}", k=k, s=c.sum(), ordered=True)
    return c + 1, None
  return jax.lax.scan(step, x, jnp.arange(3))[0]


def _while_fn(x):
  def body(c):
    jax.debug.print("while {i}", i=c[1], ordered=True)
    return c[0] * 2, c[1] + 1
  return jax.lax.while_loop(lambda c: c[1] < 3, body, (x, 0))[0]


def _cond_fn(x):
  return jax.lax.cond(
      x.sum() > 0,
      lambda v: (jax.debug.print("cond true {s}", s=v.sum(), ordered=True), v + 1)[1],
      lambda v: (jax.debug.print("cond false", ordered=True), v - 1)[1], x)


def _remat_grad_fn(x):
  @jax.checkpoint
  def inner(v):
    jax.debug.print("remat {s}", s=v.sum(), ordered=True)
    return jnp.sin(v).sum()
  return jax.grad(inner)(x)


@jax.custom_vjp
def _cvjp(v):
  jax.debug.print("primal {s}", s=v.sum(), ordered=True)
  return v * 3


def _cvjp_fwd(v):
  jax.debug.print("fwd {s}", s=v.sum(), ordered=True)
  return v * 3, None


def _cvjp_bwd(_, g):
  jax.debug.print("bwd {s}", s=g.sum(), ordered=True)
  return (g * 3,)


_cvjp.defvjp(_cvjp_fwd, _cvjp_bwd)


def _custom_vjp_fn(x):
  return jax.grad(lambda v: _cvjp(v).sum())(x) + _cvjp(x)


@pytest.mark.parametrize("fn", [_scan_fn, _while_fn, _cond_fn, _remat_grad_fn, _custom_vjp_fn],
                         ids=["scan", "while_loop", "cond", "checkpoint", "custom_vjp"])
def test_control_flow_matches_single_device(mesh_factory, capfd, fn):
  one, data = _put(mesh_factory((1,), ("x",)), P("x"))
  many, _ = _put(mesh_factory((8,), ("x",)), P("x"))
  f = jax.jit(fn)
  expected_out = f(one)
  expected = _lines(capfd)
  assert expected  # the prints ran on one device (stock JAX path)
  for _ in range(2):
    out = f(many)
  np.testing.assert_allclose(np.asarray(out), np.asarray(expected_out), rtol=1e-6)
  assert _lines(capfd) == expected * 2


def test_scan_inside_shard_map_per_device_order(mesh_1d):
  x, data = _put(mesh_1d, P("x"), shape=(8,))
  seen = []

  def body(v):
    dev = jax.lax.axis_index("x")
    def step(c, k):
      jax.debug.callback(lambda d, kk, cc: seen.append((int(d), int(kk), float(cc))), dev, k,
                         c.sum(), ordered=True)
      return c * 2, None
    return jax.lax.scan(step, v, jnp.arange(4))[0]

  jax.jit(jax.shard_map(body, mesh=mesh_1d, in_specs=P("x"), out_specs=P("x")))(x)
  jse.effects_barrier()
  for d in range(8):
    assert [(k, c) for dd, k, c in seen if dd == d] == [(k, data[d] * 2**k) for k in range(4)]


# ---------------------------------------------------------------------------
# sharded_callback
# ---------------------------------------------------------------------------


def _collector():
  seen = {}
  lock = threading.Lock()

  def fn(data, index, device):
    assert isinstance(data, np.ndarray)
    with lock:
      assert device not in seen, f"called twice on {device}"
      seen[device] = (index, data)
  return seen, fn


def _assert_matches_shards(seen, arr):
  expected = {s.device: (s.index, np.asarray(s.data)) for s in arr.addressable_shards}
  assert seen.keys() == expected.keys()
  for device, (index, data) in expected.items():
    assert seen[device][0] == index
    np.testing.assert_array_equal(seen[device][1], data)


SPECS = [P("x", "y"), P("x"), P()]
SPEC_IDS = ["xy", "x", "replicated"]


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_sharded_callback_jit_argument(mesh_2d, spec):
  x, _ = _put(mesh_2d, spec)
  seen, fn = _collector()
  jax.jit(lambda v: jse.sharded_callback(fn, v))(x)
  jse.effects_barrier()
  _assert_matches_shards(seen, x)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_sharded_callback_eager(mesh_2d, spec):
  x, _ = _put(mesh_2d, spec)
  seen, fn = _collector()
  assert jse.sharded_callback(fn, x) is None
  _assert_matches_shards(seen, x)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_sharded_callback_gda_eager_and_jit(mesh_2d, spec):
  x, _ = _put(mesh_2d, spec)
  gda = jse.GlobalDeviceArray.from_jax_array(x)
  seen, fn = _collector()
  jse.sharded_callback(fn, gda)
  _assert_matches_shards(seen, x)
  seen, fn = _collector()
  jax.jit(lambda v: jse.sharded_callback(fn, v))(gda)
  jse.effects_barrier()
  _assert_matches_shards(seen, x)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_sharded_callback_with_sharding_constraint(mesh_2d, spec):
  x, data = _put(mesh_2d, P("x", "y"))
  target = NamedSharding(mesh_2d, spec)
  seen, fn = _collector()

  @jax.jit
  def f(v):
    jse.sharded_callback(fn, jax.lax.with_sharding_constraint(v * 2, target))
    return v

  f(x)
  jse.effects_barrier()
  _assert_matches_shards(seen, jax.device_put(data * 2, target))


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_sharded_callback_explicit_sharding_on_intermediate(mesh_2d, spec):
  x, data = _put(mesh_2d, P("x", "y"))
  target = NamedSharding(mesh_2d, spec)
  seen, fn = _collector()
  jax.jit(lambda v: jse.sharded_callback(fn, jnp.sin(v), sharding=target))(x)
  jse.effects_barrier()
  expected = jax.device_put(np.sin(data), target)
  assert seen.keys() == {s.device for s in expected.addressable_shards}
  for s in expected.addressable_shards:
    assert seen[s.device][0] == s.index
    np.testing.assert_allclose(seen[s.device][1], np.asarray(s.data), rtol=1e-6)


def test_sharded_callback_permuted_mesh(devices):
  mesh = jax.sharding.Mesh(np.array(devices[::-1]).reshape(2, 4), ("a", "b"))
  x, _ = _put(mesh, P("b", "a"))
  seen, fn = _collector()
  jax.jit(lambda v: jse.sharded_callback(fn, v))(x)
  jse.effects_barrier()
  _assert_matches_shards(seen, x)


def test_sharded_callback_explicit_sharding_mode(devices, capfd):
  mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("x", "y"),
                           axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  seen, fn = _collector()
  with jax.set_mesh(mesh):
    x = jax.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8), P("x", "y"))

    @jax.jit
    def f(v):
      jax.debug.print("sum {s}", s=v.sum(), ordered=True)
      jse.sharded_callback(fn, v * 2)  # an intermediate: its type carries the sharding
      return v

    f(x)
  assert _lines(capfd) == ["sum 2016.0"]
  _assert_matches_shards(seen, x * 2)


def test_sharded_callback_single_device():
  x = jnp.arange(4.0)
  seen, fn = _collector()
  jax.jit(lambda v: jse.sharded_callback(fn, v))(x)
  jse.effects_barrier()
  _assert_matches_shards(seen, x)


def test_sharded_callback_program_order_per_device(mesh_2d):
  x, _ = _put(mesh_2d, P("x", "y"))
  events = []
  lock = threading.Lock()

  def record(*event):
    with lock:
      events.append(event)

  @jax.jit
  def f(v, call):
    jax.debug.callback(lambda c: record("print", 0, int(c), "before"), call, ordered=True)
    jse.sharded_callback(lambda d, i, dev: record("shard", dev.id, None, "a"), v)
    jse.sharded_callback(lambda d, i, dev: record("shard", dev.id, None, "b"), v * 2,
                         sharding=x.sharding)
    jax.debug.callback(lambda c: record("print", 0, int(c), "after"), call, ordered=True)
    return v

  for call in range(3):
    f(x, call)
  jse.effects_barrier()
  first = mesh_2d.devices.flat[0].id  # where the MAXIMAL prints run
  for dev in mesh_2d.devices.flat:
    mine = [(kind, tag) for kind, d, _, tag in events if d == dev.id]
    per_call = [("shard", "a"), ("shard", "b")]
    if dev.id == first:
      per_call = [("print", "before"), *per_call, ("print", "after")]
    assert mine == per_call * 3, dev
  assert [c for kind, _, c, tag in events if kind == "print" and tag == "before"] == [0, 1, 2]


@pytest.mark.parametrize("ordered", [True, False])
def test_sharded_callback_data_kept_after_the_call_stays_that_shards_value(mesh_1d, ordered):
  """`fn` gets each shard as a numpy array of its own: one kept past the call
  still holds that call's values after later calls overwrote the shards, and
  it is read-only (as `numpy.asarray` of a `jax.Array` is)."""
  x, _ = _put(mesh_1d, P("x"))
  kept = []
  lock = threading.Lock()

  def keep(data, index, device):
    with lock:
      kept.append((device.id, index, data))

  f = jax.jit(lambda v: (jse.sharded_callback(keep, v, ordered=ordered), v + 1)[1])
  values = [x]
  for _ in range(3):
    values.append(f(values[-1]))
  jse.effects_barrier()
  assert len(kept) == 3 * 8
  by_device: dict = {}
  for device_id, index, data in kept:
    assert type(data) is np.ndarray and not data.flags.writeable
    by_device.setdefault(device_id, []).append((index, data))
  for shard in x.addressable_shards:
    seen = by_device[shard.device.id]
    if ordered:  # program order per device: call k saw values[k]
      for k, (index, data) in enumerate(seen):
        assert index == shard.index
        np.testing.assert_array_equal(data, np.asarray(values[k])[shard.index])
    else:
      got = sorted(float(data.sum()) for _, data in seen)
      assert got == sorted(float(np.asarray(values[k])[shard.index].sum()) for k in range(3))


def test_sharded_callback_unordered(mesh_1d):
  x, _ = _put(mesh_1d, P("x"))
  seen, fn = _collector()
  jax.jit(lambda v: jse.sharded_callback(fn, v, ordered=False))(x)
  jse.effects_barrier()
  _assert_matches_shards(seen, x)


def test_sharded_callback_unknown_sharding_asks_for_sharding(mesh_2d):
  x, _ = _put(mesh_2d, P("x", "y"))
  with pytest.raises(ValueError, match=r"Pass `sharding=NamedSharding\(mesh, spec\)`"):
    jax.jit(lambda v: jse.sharded_callback(print, v * 2))(x)
  with pytest.raises(ValueError, match="sharding="):
    jse.sharded_callback(print, np.zeros(4))


def test_sharded_callback_numpy_with_sharding(mesh_1d):
  seen, fn = _collector()
  target = NamedSharding(mesh_1d, P("x"))
  jse.sharded_callback(fn, np.arange(8.0), sharding=target)
  _assert_matches_shards(seen, jax.device_put(np.arange(8.0), target))


def test_sharded_callback_bad_input(mesh_1d, devices):
  x, _ = _put(mesh_1d, P("x"))
  with pytest.raises(TypeError, match="callable `fn"):
    jse.sharded_callback("not callable", x)
  with pytest.raises(TypeError, match="ordered"):
    jse.sharded_callback(print, x, ordered="yes")
  with pytest.raises(TypeError, match="NamedSharding"):
    jse.sharded_callback(print, x, sharding=P("x"))
  with pytest.raises(ValueError, match="does not fit"):
    jse.sharded_callback(print, np.zeros(3), sharding=NamedSharding(mesh_1d, P("x")))
  too_long = NamedSharding(mesh_1d, P("x", None, None))
  with pytest.raises(ValueError, match="3 PartitionSpec entries but the value has rank 2"):
    jse.sharded_callback(print, x, sharding=too_long)
  with pytest.raises(ValueError, match="3 PartitionSpec entries"):
    jax.jit(lambda v: jse.sharded_callback(print, v, sharding=too_long))(x)
  other = SingleDeviceSharding(devices[3])
  with pytest.raises(ValueError, match="computation runs on devices"):
    jax.jit(lambda v: jse.sharded_callback(print, v, sharding=other))(x)


def test_sharded_callback_inside_shard_map_raises(mesh_1d):
  x, _ = _put(mesh_1d, P("x"))
  f = jax.jit(jax.shard_map(lambda v: jse.sharded_callback(print, v) or v, mesh=mesh_1d,
                            in_specs=P("x"), out_specs=P("x")))
  with pytest.raises(ValueError, match="inside `shard_map`"):
    f(x)


def test_sharded_callback_gspmd_partitioner(mesh_2d):
  jax.config.update("jax_use_shardy_partitioner", False)
  try:
    for spec in SPECS:
      x, _ = _put(mesh_2d, spec)
      seen, fn = _collector()
      jax.jit(lambda v, fn=fn: jse.sharded_callback(fn, v))(x)
      jse.effects_barrier()
      _assert_matches_shards(seen, x)
  finally:
    jax.config.update("jax_use_shardy_partitioner", True)


# ---------------------------------------------------------------------------
# declare_effect / mark_shardable
# ---------------------------------------------------------------------------


def _memberships(effect_type):
  return {name for name in jax_effects.EFFECT_TYPE_SET_NAMES
          if effect_type in jax_effects.effect_types_in(name)}


ALL_SETS = set(jax_effects.EFFECT_TYPE_SET_NAMES)


def test_declare_effect_lands_in_exactly_the_right_tables(fresh_registry):
  shardable = jse.declare_effect("JseTestShardableEffect", ordered=True, shardable=True)
  plain = jse.declare_effect("JseTestPlainEffect", ordered=False, control_flow=False,
                             remat=False)
  assert shardable.__name__ == "JseTestShardableEffect"
  assert issubclass(shardable, jax_effects.Effect)  # public as jax.extend.core.Effect (JAX 0.9+)
  assert shardable() == shardable() and hash(shardable()) == hash(shardable())
  assert _memberships(shardable) == ALL_SETS
  assert _memberships(plain) == {"lowerable_effects", "custom_derivatives_allowed_effects",
                                 "partial_eval_kept_effects"}
  jse.uninstall()
  assert _memberships(shardable) == _memberships(plain) == set()
  jse.install()
  assert _memberships(shardable) == ALL_SETS


def test_declare_effect_same_name(fresh_registry):
  a = jse.declare_effect("JseTestRedeclared", ordered=True)
  assert jse.declare_effect("JseTestRedeclared", ordered=True) is a
  with pytest.raises(ValueError, match="shardable=False \\(now True\\)"):
    jse.declare_effect("JseTestRedeclared", ordered=True, shardable=True)


def test_declare_effect_bad_input():
  with pytest.raises(TypeError, match="name as a string"):
    jse.declare_effect(3, ordered=True)
  with pytest.raises(ValueError, match="identifier"):
    jse.declare_effect("not a name", ordered=True)
  with pytest.raises(ValueError, match="only an ordered effect can be shardable"):
    jse.declare_effect("JseTestBadShardable", ordered=False, shardable=True)
  with pytest.raises(TypeError, match="remat"):
    jse.declare_effect("JseTestBadRemat", ordered=True, remat=1)
  with pytest.raises(TypeError):
    jse.declare_effect("JseTestNoOrdered")  # `ordered` is required


def test_mark_shardable(fresh_registry):
  effect = jse.declare_effect("JseTestMarkLater", ordered=True)
  assert "shardable_ordered_effects" not in _memberships(effect)
  assert jse.mark_shardable(effect) is effect
  assert "shardable_ordered_effects" in _memberships(effect)
  jse.uninstall()
  assert _memberships(effect) == set()
  jse.install()
  assert "shardable_ordered_effects" in _memberships(effect)


def test_mark_shardable_bad_input():
  unordered = jse.declare_effect("JseTestUnorderedMark", ordered=False)
  with pytest.raises(ValueError, match="not ordered"):
    jse.mark_shardable(unordered)
  with pytest.raises(TypeError, match="effect class"):
    jse.mark_shardable(unordered())
  with pytest.raises(TypeError, match="effect class"):
    jse.mark_shardable(int)


def _effect_primitive(name, effect_type, events):
  """A primitive carrying `effect_type` whose lowering logs (tag, value) in order."""
  prim = Primitive(name)
  prim.multiple_results = True
  prim.def_effectful_abstract_eval(lambda *avals, tag: ([], {effect_type()}))

  def lowering(ctx, x, *, tag):
    effect = effect_type()
    sharding = (jax_effects.callback_op_sharding(ctx)
                if jax_effects.axis_context_kind(ctx) in ("auto", "manual") else None)

    def callback(value):
      events.append((tag, float(np.asarray(value))))
      return ()

    token = ctx.tokens_in.get(effect)
    _, token, _ = mlir.emit_python_callback(
        ctx, callback, token, [x], ctx.avals_in, ctx.avals_out, has_side_effect=True,
        returns_token=True, sharding=sharding)
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({effect: token})))
    return []

  mlir.register_lowering(prim, lowering)
  return prim


def test_declared_effect_primitive_survives_dce_and_runs_in_order():
  effect = jse.declare_effect("JseTestLogEffect", ordered=True)
  events = []
  prim = _effect_primitive("jse_test_log", effect, events)

  @jax.jit
  def f(x):
    prim.bind(x.sum(), tag="a")  # result unused: only the effect keeps it
    def step(c, _):
      prim.bind(c, tag="loop")
      return c + 1, None
    jax.lax.scan(step, x.sum(), None, length=2)
    prim.bind(x.max(), tag="b")
    return x * 2

  assert "jse_test_log" in str(jax.make_jaxpr(f)(jnp.ones(3)))
  for i in range(3):
    f(jnp.full(3, float(i)))
  jse.effects_barrier()
  assert events == [e for i in range(3) for e in
                    [("a", 3.0 * i), ("loop", 3.0 * i), ("loop", 3.0 * i + 1), ("b", float(i))]]


def test_declared_shardable_effect_multi_device(mesh_2d):
  x, data = _put(mesh_2d, P("x", "y"))
  ordered_only = jse.declare_effect("JseTestOrderedOnly", ordered=True)
  shardable = jse.declare_effect("JseTestShardableLog", ordered=True, shardable=True)
  prim_ordered = _effect_primitive("jse_test_ordered_only", ordered_only, [])
  with pytest.raises(ValueError, match=STOCK_ERROR):
    jax.jit(lambda v: prim_ordered.bind(v.sum(), tag="x") or v)(x)
  events = []
  prim = _effect_primitive("jse_test_shardable_log", shardable, events)
  f = jax.jit(lambda v: [prim.bind(v.sum(), tag="a"), prim.bind(v.max(), tag="b")] and v)
  f(x)
  f(x)
  jse.effects_barrier()
  assert events == [("a", data.sum()), ("b", data.max())] * 2


# ---------------------------------------------------------------------------
# effects_barrier, uninstall / install, import
# ---------------------------------------------------------------------------


def _sleeps_then_records(done, item, seconds):
  """A host callback that sleeps `seconds`, then appends `item` to `done`."""
  def callback(_):
    time.sleep(seconds)
    done.append(item)
  return callback


def test_effects_barrier_waits_for_current_thread(mesh_1d):
  x, _ = _put(mesh_1d, P("x"))
  done = []
  slow = _sleeps_then_records(done, 1, 0.2)
  jax.jit(lambda v: jax.debug.callback(slow, v.sum(), ordered=True) or v)(x)
  jse.effects_barrier()
  assert done == [1]


def test_effects_barrier_waits_for_other_threads(mesh_1d):
  x, _ = _put(mesh_1d, P("x"))
  done = []
  slow = _sleeps_then_records(done, "ordered", 0.3)
  slow_unordered = _sleeps_then_records(done, "unordered", 0.3)
  f = jax.jit(lambda v: jax.debug.callback(slow, v.sum(), ordered=True) or v)
  g = jax.jit(lambda v: jax.debug.callback(slow_unordered, v.sum()) or v)
  f(x), g(x)  # compile here, and wait, so the thread only dispatches
  jse.effects_barrier()
  done.clear()
  worker = threading.Thread(target=lambda: (f(x), g(x)))
  worker.start()
  worker.join()
  jse.effects_barrier()
  assert sorted(done) == ["ordered", "unordered"]


def test_next_call_waits_for_the_previous_calls_ordered_effects(mesh_1d):
  # Program order across calls: the second call's ordered callback runs after
  # the first call's, even when the first one is slow. Stock's token set
  # orders them the same way for io_callback(ordered=True).
  x, _ = _put(mesh_1d, P("x"))
  done = []

  def first(v):
    time.sleep(0.2)
    done.append(("first", float(v)))

  def second(v):
    done.append(("second", float(v)))

  f = jax.jit(lambda v: (jax.debug.callback(first, v.sum(), ordered=True), v * 2)[1])
  g = jax.jit(lambda v: (jax.debug.callback(second, v.sum(), ordered=True), v * 3)[1])
  for _ in range(3):
    g(f(x))
  jse.effects_barrier()
  total = float(np.asarray(x).sum())
  assert done == [("first", total), ("second", 2 * total)] * 3


_FAILED_EFFECT_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
import jax_sharding_ext as jse
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
x = jax.device_put(np.arange(8.0), NamedSharding(mesh, P("x")))
ran = []

def bad(*_):
  raise RuntimeError("boom")

def step(name, fn):
  try:
    fn()
    ran.append((name, "ok"))
  except jax.errors.JaxRuntimeError as e:
    ran.append((name, "boom" if "boom" in str(e) else repr(e)))

failing = {
    "debug": jax.jit(lambda a: (jax.debug.callback(bad, a, ordered=True), a)[1]),
    "sharded": jax.jit(lambda a: (jse.sharded_callback(bad, a), a)[1]),
    "io": jax.jit(lambda a: (io_callback(bad, None, a, ordered=True), a)[1]),
}
record = lambda tag: lambda *_: ran.append((tag, "ran"))
for kind, f in failing.items():
  step(kind + " call", lambda: f(x))
  step(kind + " barrier", jax.effects_barrier)
  step(kind + " barrier again", jse.effects_barrier)
  for where, v in (("8 devices", x), ("1 device", jnp.ones(3))):
    step(kind + " after " + where, lambda: (
        jax.jit(lambda a: (jax.debug.callback(record(where), a, ordered=True), a)[1])(v),
        jax.jit(lambda a: (io_callback(record(where + " io"), None, a, ordered=True),
                           a)[1])(v),
        jax.effects_barrier()))
# Known to have failed before the next ordered call: that call doesn't inherit
# the failure (it runs); the next barrier still reports it, once.
f = jax.jit(lambda a: (jax.debug.callback(bad, a, ordered=True), a + 1)[1])
out = f(x)
step("wait", out.block_until_ready)
step("no barrier: after", lambda: jax.jit(
    lambda a: (jax.debug.callback(record("no barrier"), a, ordered=True), a)[1])(x))
step("no barrier: barrier", jax.effects_barrier)
step("no barrier: barrier again", jax.effects_barrier)
step("unreported call", lambda: f(x))
print(ran)
"""


def test_failed_ordered_callback_reported_once_then_effects_recover():
  # A subprocess: before the fix, the failed tokens broke every later ordered
  # effect of the process, which would leak into the other tests.
  proc = subprocess.run([sys.executable, "-c", _FAILED_EFFECT_SCRIPT],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  ran = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
  for kind in ("debug", "sharded", "io"):
    i = next(i for i, (name, _) in enumerate(ran) if name == kind + " call")
    # Raised once: at the call, or (the call fails asynchronously) at the
    # next barrier; then the barriers and every ordered effect work again.
    assert sorted(r for _, r in ran[i:i + 2]) == ["boom", "ok"], ran
    assert ran[i + 1][0] == kind + " barrier", ran
    assert ran[i + 2] == (kind + " barrier again", "ok"), ran
    for j, where in ((i + 3, "8 devices"), (i + 6, "1 device")):
      # Two effect kinds (debug, io): no order between them.
      assert sorted(ran[j:j + 2]) == [(where, "ran"), (where + " io", "ran")], ran
      assert ran[j + 2] == (f"{kind} after {where}", "ok"), ran
  assert ran[-6] == ("wait", "boom"), ran
  assert sorted(ran[-5:-3]) == [("no barrier", "ran"), ("no barrier: after", "ok")], ran
  assert ran[-3:-1] == [("no barrier: barrier", "boom"), ("no barrier: barrier again", "ok")], ran
  # A failure no barrier reported is raised once at exit, not once per hook.
  assert proc.stderr.count("Exception ignored in atexit callback") == 1, proc.stderr[-3000:]


def test_uninstall_restores_stock_behaviour(fresh_registry, mesh_2d, capfd):
  # The tables themselves are compared entry by entry in
  # `test_install.test_uninstall_restores_every_table_exactly`.
  x, _ = _put(mesh_2d, P("x", "y"))
  jax.jit(_two_prints)(x)
  assert _lines(capfd) == ["first 2016.0", "second 4032.0"]
  for _ in range(2):
    jse.uninstall()
    with pytest.raises(ValueError, match=STOCK_ERROR):
      jax.jit(_two_prints)(x)
    with pytest.raises(RuntimeError, match="install"):
      jax.jit(lambda v: jse.sharded_callback(print, v))(x)
    jse.install()
    jse.install()  # idempotent
    jax.jit(_two_prints)(x)
    jse.effects_barrier()
    assert _lines(capfd) == ["first 2016.0", "second 4032.0"]


def test_import_initialises_no_backend():
  code = ("import jax_sharding_ext, jax_sharding_ext._jax.config as c; "
          "assert not c.initialized_backends(), c.initialized_backends()")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------------------
# Hardening: a barrier inside a callback, pmap, junk arguments.
# ---------------------------------------------------------------------------

_BARRIER_IN_CALLBACK_SCRIPT = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_sharding_ext as jse

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
x = jax.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("x", "y")))
calls = []

def cb(*args):
  jse.effects_barrier()  # must return: it cannot wait for its own computation
  calls.append(1)

def io(v):
  cb()
  return v

kind = sys.argv[1]
if kind == "debug":
  f = jax.jit(lambda v: (jax.debug.callback(cb, v), v)[1])
elif kind == "ordered":
  f = jax.jit(lambda v: (jax.debug.callback(cb, v, ordered=True), v)[1])
elif kind == "print":
  f = jax.jit(lambda v: (jax.debug.print("{}", jax.pure_callback(
      lambda a: (cb(), a)[1], jax.ShapeDtypeStruct((), np.float32), v.sum())), v)[1])
elif kind in ("io", "io_ordered"):
  f = jax.jit(lambda v: io_callback(io, jax.ShapeDtypeStruct(v.shape, v.dtype), v,
                                    ordered=kind == "io_ordered"))
elif kind == "sharded":
  f = jax.jit(lambda v: (jse.sharded_callback(cb, v), v)[1])
elif kind == "sharded_eager":
  f = lambda v: (jse.sharded_callback(cb, v), v)[1]
f(x)
f(x)
jse.effects_barrier()
print("CALLS", len(calls))
"""


_STOCK_ORDERED_IO_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
x = jax.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("x", "y")))
jax.jit(lambda v: io_callback(lambda a: a, jax.ShapeDtypeStruct(v.shape, v.dtype), v,
                              ordered=True))(x)
jax.effects_barrier()
"""


@pytest.mark.parametrize("kind", ["debug", "ordered", "print", "io", "io_ordered", "sharded",
                                  "sharded_eager"])
def test_effects_barrier_inside_a_callback_returns(kind):
  """Stock `jax.effects_barrier()` returns inside a host callback; so does
  ours: it must not wait for the computation running the callback."""
  proc = subprocess.run([sys.executable, "-c", _BARRIER_IN_CALLBACK_SCRIPT, kind],
                        capture_output=True, text=True, timeout=120)
  if kind == "io_ordered" and proc.returncode != 0 and "HasReplicatedSharding" in proc.stderr:
    stock = subprocess.run([sys.executable, "-c", _STOCK_ORDERED_IO_SCRIPT],
                           capture_output=True, text=True, timeout=120)
    if stock.returncode != 0:  # XLA's RET_CHECK on JAX 0.8.x / 0.9.x: nothing to compare
      assert "HasReplicatedSharding" in stock.stderr, stock.stderr[-2000:]
      pytest.skip("stock JAX cannot run an ordered io_callback over 8 devices on this "
                  "release (XLA refuses its replicated sharding)")
  assert proc.returncode == 0, proc.stderr[-2000:]
  calls = int(proc.stdout.split("CALLS")[-1])
  assert calls == {"sharded": 16, "sharded_eager": 16}.get(kind, 2)


def test_host_callback_and_pmap_code_objects_are_found():
  assert jax_frames.HAS_HOST_CALLBACK_FRAMES, (
      "jax._src.callback.emit_python_callback no longer defines `_wrapped_callback`: "
      "update `jax_frames.in_host_callback` for this JAX")
  assert jax_frames.HAS_PMAP_BODY_CODE, (
      "jax._src.pmap._cached_shard_map no longer defines `_fun`: update "
      "`jax_frames.traced_inside_pmap` for this JAX")


@pytest.mark.parametrize("wrap", ["pmap", "jit(pmap)"])
@pytest.mark.parametrize("ordered_kind", ["print", "callback"])
def test_pmap_keeps_stocks_rejection_of_ordered_effects(wrap, ordered_kind):
  """Stock raises "The following ordered effects are not supported for more
  than 1 device" for an ordered print in `jax.pmap`; the package does not
  widen that."""
  def body(x):
    if ordered_kind == "print":
      jax.debug.print("v {}", x, ordered=True)
    else:
      jax.debug.callback(lambda v: None, x, ordered=True)
    return x + 1
  f = jax.pmap(body, axis_name="i")
  if wrap == "jit(pmap)":
    f = jax.jit(f)
  with pytest.raises(ValueError, match=STOCK_ERROR) as e:
    f(jnp.arange(8.0))
  assert "shard_map" in str(e.value)


def test_ordered_print_in_shard_map_still_works_next_to_pmap(mesh_factory, capfd):
  mesh = mesh_factory((8,), ("i",))
  f = jax.jit(jax.shard_map(lambda x: (jax.debug.print("s {}", x, ordered=True), x)[1],
                            mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  f(jnp.arange(8.0))
  assert sorted(_lines(capfd)) == sorted(f"s [{i}.]" for i in range(8))


def test_sharded_callback_host_data_and_junk(mesh_2d):
  """A list with `sharding=` is host data, like numpy; None and other junk
  are a TypeError naming `x` (was AttributeError / a device_put error)."""
  s = NamedSharding(mesh_2d, P("x"))
  seen = []
  jse.sharded_callback(lambda d, i, dev: seen.append((d.tolist(), i)), [1.0] * 8, sharding=s)
  jse.effects_barrier()
  assert sorted(seen)[0] == ([1.0, 1.0], (slice(0, 2),)) and len(seen) == 8
  for junk in (None, object(), {"a": 1}, "text"):
    with pytest.raises(TypeError, match="for `x`"):
      jse.sharded_callback(lambda *a: None, junk, sharding=s)
  with pytest.raises(TypeError, match="numeric"):
    jse.sharded_callback(lambda *a: None, ["a"] * 8, sharding=s)
  with pytest.raises(ValueError, match="sharding="):
    jse.sharded_callback(lambda *a: None, np.ones(8))


def _raised(fn, kind):
  with pytest.raises(kind) as e:
    fn()
  assert not isinstance(e.value, jax.errors.TracerArrayConversionError)
  return str(e.value)


def test_sharded_callback_list_of_arrays_eager_and_jit(mesh_1d):
  """A list (or tuple) of arrays is one array, as `jnp.asarray([y, y])` and
  `np.asarray([y, y])` stack a plain `jax.Array` list, eagerly and inside
  `jit` alike: a `sharding=` that does not fit the stacked shape is the same
  ValueError naming `sharded_callback` and `x` in both (never a
  TracerArrayConversionError), one that fits visits the stacked array's
  shards in both, and a list that does not stack is a TypeError in both."""
  y, data = _put(mesh_1d, P("x"), shape=(8,))
  bad = NamedSharding(mesh_1d, P("x"))  # 8 ways along the stacked axis of size 2
  eager = _raised(lambda: jse.sharded_callback(print, [y, y], sharding=bad), ValueError)
  traced = _raised(lambda: jax.jit(
      lambda v: jse.sharded_callback(print, [v, v], sharding=bad))(y), ValueError)
  assert traced == eager
  assert "`sharded_callback(..., sharding=" in eager and "shape (2, 8)" in eager
  assert "`x` is a list, taken as one array" in eager
  too_long = NamedSharding(mesh_1d, P(None, None, "x"))
  eager = _raised(lambda: jse.sharded_callback(print, (y, y), sharding=too_long), ValueError)
  traced = _raised(lambda: jax.jit(
      lambda v: jse.sharded_callback(print, (v, v), sharding=too_long))(y), ValueError)
  assert traced == eager and "`x` is a tuple" in eager

  fits = NamedSharding(mesh_1d, P(None, "x"))
  want = jax.device_put(np.stack([data, data * 2]), fits)
  seen, fn = _collector()
  jse.sharded_callback(fn, [y, y * 2], sharding=fits)
  _assert_matches_shards(seen, want)
  seen, fn = _collector()
  jax.jit(lambda v: jse.sharded_callback(fn, [v, v * 2], sharding=fits))(y)
  jse.effects_barrier()
  _assert_matches_shards(seen, want)

  for msg in (_raised(lambda: jse.sharded_callback(print, [y, y[:3]], sharding=fits),
                      TypeError),
              _raised(lambda: jax.jit(
                  lambda v: jse.sharded_callback(print, [v, v[:3]], sharding=fits))(y),
                  TypeError)):
    assert "`sharded_callback(fn, x)` takes a list `x` as one array" in msg
