"""Transfer guards for every GlobalDeviceArray transfer, and the transfer ledger.

Table-driven like JAX's `tests/transfer_guard_test.py`: each row of
`_ROWS` is one user-level transfer of a GDA, named, with its direction and
whether it is explicit. Every row runs under every guard level, set three
ways (the direction's context manager, `jax.transfer_guard`, the global
config option), and the outcome must follow jaxlib's level table:

  level              implicit   explicit
  allow              allow      allow
  log                log        allow
  disallow           raise      allow
  log_explicit       log        log
  disallow_explicit  raise      raise

Fetching a GDA from CPU devices is always allowed, so device_to_host
rows run with `moves._fetch_always_allowed` patched to act as an
accelerator; the CPU rule itself has its own tests. host_to_device and
device_to_device rows move real data between the 8 CPU devices.
"""

import dataclasses
import inspect
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import transfer as jax_transfer
from jax_sharding_ext._transfers import ledger as ledger_module
from jax_sharding_ext._transfers import moves

GDA = jse.GlobalDeviceArray
HERE = os.path.relpath(__file__)  # sites read relative to the working directory
LEVELS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")
DIRECTIONS = ("host_to_device", "device_to_device", "device_to_host")
GUARD_OPTIONS = ("jax_transfer_guard", "jax_transfer_guard_host_to_device",
                 "jax_transfer_guard_device_to_device", "jax_transfer_guard_device_to_host")
# jaxlib's level table, written out independently of the implementation.
EXPECTED = {
    ("allow", False): "allow", ("allow", True): "allow",
    ("log", False): "log", ("log", True): "allow",
    ("disallow", False): "disallow", ("disallow", True): "allow",
    ("log_explicit", False): "log", ("log_explicit", True): "log",
    ("disallow_explicit", False): "disallow", ("disallow_explicit", True): "disallow",
}
DATA = np.arange(16, dtype=np.float32).reshape(8, 2)
XY = P("x", "y")


@pytest.fixture(autouse=True)
def _clean_guard_state():
  """Every test starts and ends with no global guard option and no open ledger."""
  for name in GUARD_OPTIONS:
    jax.config.update(name, None)
  yield
  for name in GUARD_OPTIONS:
    jax.config.update(name, None)
  assert ledger_module.open_count == 0
  assert ledger_module.open_ledgers() == []


@pytest.fixture
def accelerator_fetch(monkeypatch):
  """Make device_to_host fetches subject to the guard, as on a GPU/TPU."""
  monkeypatch.setattr(moves, "_fetch_always_allowed", lambda arr: False)


@pytest.fixture
def guard_logs(caplog):
  caplog.set_level(logging.WARNING, logger="jax_sharding_ext")
  return lambda: [r for r in caplog.records if r.name == "jax_sharding_ext"]


def _gda(mesh, spec=XY, data=DATA):
  return GDA.from_callback(data.shape, mesh, spec, lambda idx: data[idx])


def _jit_to(sharding):
  """A fresh `jax.jit(f, in_shardings=sharding)` around a fresh function.

  Fresh each time on purpose: in stock JAX 0.10.2, the second call of a jit
  whose `in_shardings` reorders the argument's devices takes the C++ fast
  path, which skips the reshard and crashes (a `jax.Array` argument too), so
  every call here must be a first call.
  """
  return jax.jit(lambda a: a * 2, in_shardings=sharding)


def _reversed(mesh):
  return Mesh(np.asarray(mesh.devices).reshape(-1)[::-1].reshape(mesh.devices.shape),
              mesh.axis_names)


# ---------------------------------------------------------------------------
# The table. Each row: name, direction, explicit, setup(mesh) -> (run, check,
# count). `setup` runs with the guard at "allow"; `run()` is the transfer (run
# under the guard); `check(result)` asserts the value; `count` is the number of
# GDA transfers `run()` makes (one record / log line each).
# ---------------------------------------------------------------------------


def _h2d_from_callback(mesh):
  return (lambda: _gda(mesh)), lambda g: np.testing.assert_array_equal(np.asarray(g), DATA), 1


def _h2d_from_callback_replicated(mesh):
  return (lambda: _gda(mesh, P())), lambda g: np.testing.assert_array_equal(np.asarray(g), DATA), 1


def _h2d_from_batched_callback(mesh):
  def run():
    return GDA.from_batched_callback((8, 2), mesh, P("x"), lambda idxs: [DATA[i] for i in idxs])
  return run, lambda g: np.testing.assert_array_equal(np.asarray(g), DATA), 1


def _d2d_device_put_reshard(mesh):
  g = _gda(mesh)
  target = NamedSharding(mesh, P("x"))

  def check(out):
    assert out.sharding == target
    np.testing.assert_array_equal(np.asarray(out), DATA)
  return (lambda: jax.device_put(g, target)), check, 1


def _d2d_device_put_device(mesh):
  g = _gda(mesh)
  dev = mesh.devices.flat[3]

  def check(out):
    assert out.devices() == {dev}
    np.testing.assert_array_equal(np.asarray(out), DATA)
  return (lambda: jax.device_put(g, dev)), check, 1


def _d2d_device_put_copy(mesh):
  g = _gda(mesh)
  return ((lambda: jax.device_put(g, g.sharding, may_alias=False)),
          lambda out: np.testing.assert_array_equal(np.asarray(out), DATA), 1)


def _d2d_device_put_pytree(mesh):
  g1, g2 = _gda(mesh), _gda(mesh, P("y"))
  target = NamedSharding(mesh, P(None, "y"))

  def check(out):
    for o in out["a"], out["b"][0]:
      assert o.sharding == target
      np.testing.assert_array_equal(np.asarray(o), DATA)
  return (lambda: jax.device_put({"a": g1, "b": [g2]}, target)), check, 2


def _d2d_from_callback_device_values(mesh):
  dev0 = mesh.devices.flat[0]
  on_dev0 = jax.device_put(DATA, dev0)

  def run():  # every shard comes from device 0; 7 of 8 move to their device
    return GDA.from_callback((8, 2), mesh, P(), lambda idx: on_dev0)
  return run, lambda g: np.testing.assert_array_equal(np.asarray(g), DATA), 1


def _d2d_jit_device_order(mesh):
  g = _gda(mesh)
  f = _jit_to(NamedSharding(_reversed(mesh), P("x", "y")))  # called once per row
  return (lambda: f(g)), lambda out: np.testing.assert_array_equal(np.asarray(out), DATA * 2), 1


def _d2h_device_get(mesh):
  g = _gda(mesh)
  return (lambda: jax.device_get(g)), lambda out: np.testing.assert_array_equal(out, DATA), 1


def _d2h_device_get_pytree(mesh):
  g1, g2 = _gda(mesh), _gda(mesh, P())

  def check(out):
    np.testing.assert_array_equal(out["a"], DATA)
    np.testing.assert_array_equal(out["b"], DATA)
  return (lambda: jax.device_get({"a": g1, "b": g2})), check, 2


def _d2h_np_asarray(mesh):
  g = _gda(mesh)
  return (lambda: np.asarray(g)), lambda out: np.testing.assert_array_equal(out, DATA), 1


def _d2h_array_method(mesh):
  g = _gda(mesh, P("x"))
  return (lambda: g.__array__()), lambda out: np.testing.assert_array_equal(out, DATA), 1


def _d2h_np_add(mesh):
  g = _gda(mesh)
  return (lambda: np.add(g, 1)), lambda out: np.testing.assert_array_equal(out, DATA + 1), 1


def _d2h_copy_to_host_async(mesh):
  g = _gda(mesh)

  def run():
    g.copy_to_host_async()
    return g
  return run, lambda out: np.testing.assert_array_equal(np.asarray(out), DATA), 1


def _d2h_jit_closure(mesh):
  g = _gda(mesh)
  f = jax.jit(lambda: jax.numpy.multiply(g, 2))  # the closed-over GDA becomes a constant
  return f, lambda out: np.testing.assert_array_equal(np.asarray(out), DATA * 2), 1


_ROWS = [
    # (name, direction, explicit, setup)
    ("h2d_from_callback", "host_to_device", True, _h2d_from_callback),
    ("h2d_from_callback_replicated", "host_to_device", True, _h2d_from_callback_replicated),
    ("h2d_from_batched_callback", "host_to_device", True, _h2d_from_batched_callback),
    ("d2d_device_put_reshard", "device_to_device", True, _d2d_device_put_reshard),
    ("d2d_device_put_device", "device_to_device", True, _d2d_device_put_device),
    ("d2d_device_put_copy", "device_to_device", True, _d2d_device_put_copy),
    ("d2d_device_put_pytree", "device_to_device", True, _d2d_device_put_pytree),
    ("d2d_from_callback_device_values", "device_to_device", True,
     _d2d_from_callback_device_values),
    ("d2d_jit_device_order", "device_to_device", False, _d2d_jit_device_order),
    ("d2h_device_get", "device_to_host", True, _d2h_device_get),
    ("d2h_device_get_pytree", "device_to_host", True, _d2h_device_get_pytree),
    ("d2h_np_asarray", "device_to_host", False, _d2h_np_asarray),
    ("d2h_array_method", "device_to_host", False, _d2h_array_method),
    ("d2h_np_add", "device_to_host", False, _d2h_np_add),
    ("d2h_copy_to_host_async", "device_to_host", False, _d2h_copy_to_host_async),
    ("d2h_jit_closure", "device_to_host", False, _d2h_jit_closure),
]
# No GDA operation makes an implicit host_to_device transfer: the only host
# data a GDA takes in comes through the (explicit) `from_callback` family.


class _GlobalOption:
  """Set the level with `jax.config.update` (the global option)."""

  def __init__(self, name, level):
    self.name, self.level = name, level

  def __enter__(self):
    jax.config.update(self.name, self.level)

  def __exit__(self, *exc):
    jax.config.update(self.name, None)


_SCOPES = {
    "direction_cm": lambda direction, level: getattr(jax, f"transfer_guard_{direction}")(level),
    "all_cm": lambda direction, level: jax.transfer_guard(level),
    "global_option": lambda direction, level: _GlobalOption("jax_transfer_guard", level),
    "global_direction_option": lambda direction, level: _GlobalOption(
        f"jax_transfer_guard_{direction}", level),
}


def _expect(name, outcome, run, check, count, direction, explicit, logs):
  """Run one row under an active guard and assert `outcome`, naming the row."""
  with jse.transfer_ledger() as ledger:
    if outcome == "disallow":
      with pytest.raises(jax.errors.JaxRuntimeError,
                         match=f"Disallowed {direction.replace('_', '-')} transfer"):
        run()
      result = None
    else:
      try:
        result = run()
      except Exception as e:  # re-raise naming the row, as JAX's test helpers do
        raise AssertionError(f"expected {name} to be allowed ({outcome})") from e
  lines = logs()
  if outcome == "disallow":
    assert ledger.records == [], f"{name}: a blocked transfer was recorded"
    assert lines == [], f"{name}: a blocked transfer was logged"
    return None
  assert len(ledger.records) == count, (name, ledger.records)
  assert all(r.direction == direction and r.explicit == explicit for r in ledger.records)
  if outcome == "log":
    assert len(lines) == count, (name, [r.getMessage() for r in lines])
    kind = "explicit" if explicit else "implicit"
    for rec in lines:
      assert rec.levelno == logging.WARNING
      assert f"{direction.replace('_', '-')} transfer ({kind})" in rec.getMessage()
      # The record points at the user's call: the row's thunk in this file.
      assert rec.pathname == __file__, (name, rec.pathname)
  else:
    assert lines == [], (name, [r.getMessage() for r in lines])
  return result


@pytest.mark.parametrize("scope", list(_SCOPES))
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name,direction,explicit,setup", _ROWS, ids=[r[0] for r in _ROWS])
def test_guard_table(name, direction, explicit, setup, level, scope, mesh_2d, guard_logs,
                     accelerator_fetch):
  run, check, count = setup(mesh_2d)
  outcome = EXPECTED[(level, explicit)]
  with _SCOPES[scope](direction, level):
    result = _expect(name, outcome, run, check, count, direction, explicit, guard_logs)
  if result is not None:
    check(result)


@pytest.mark.parametrize("name,direction,explicit,setup", _ROWS, ids=[r[0] for r in _ROWS])
def test_other_directions_do_not_apply(name, direction, explicit, setup, mesh_2d, guard_logs,
                                       accelerator_fetch):
  """Disallowing the two other directions leaves the row's transfer alone."""
  run, check, count = setup(mesh_2d)
  others = [d for d in DIRECTIONS if d != direction]
  with getattr(jax, f"transfer_guard_{others[0]}")("disallow_explicit"):
    with getattr(jax, f"transfer_guard_{others[1]}")("disallow_explicit"):
      result = _expect(name, "allow", run, check, count, direction, explicit, guard_logs)
  check(result)


def test_disallowed_leaves_arrays_intact(mesh_2d, accelerator_fetch):
  g = _gda(mesh_2d)
  ops = {"device_put": lambda: jax.device_put(g, NamedSharding(mesh_2d, P("x"))),
         "jit_reorder": lambda: _jit_to(NamedSharding(_reversed(mesh_2d), P("x", "y")))(g),
         "device_get": lambda: jax.device_get(g),
         "np_asarray": lambda: np.asarray(g),
         "copy_to_host_async": g.copy_to_host_async}
  for name, op in ops.items():
    with jax.transfer_guard("disallow_explicit"), pytest.raises(
        RuntimeError, match="Nothing was transferred"):
      op()
    assert not g.is_deleted(), name
    assert not g._host_fetched, name
  # Still usable: every path works once allowed, and the value is unchanged.
  np.testing.assert_array_equal(np.asarray(jax.device_put(g, NamedSharding(mesh_2d, P("x")))),
                                DATA)
  with jse.transfer_ledger() as ledger:
    np.testing.assert_array_equal(np.asarray(g), DATA)
  assert len(ledger.records) == 1  # the first real fetch, not an earlier blocked one


@pytest.mark.parametrize("level", ["log", "log_explicit"])
def test_logged_once_by_this_package_not_again_by_jaxlib(level, mesh_2d, guard_logs, capfd):
  """jaxlib would judge the inner steps itself (differently); it stays quiet."""
  g = _gda(mesh_2d)
  rev = NamedSharding(_reversed(mesh_2d), P("x", "y"))
  capfd.readouterr()
  with jax.transfer_guard(level):
    _gda(mesh_2d)  # explicit host_to_device (jaxlib alone would call it implicit)
    jax.device_put(g, NamedSharding(mesh_2d, P("x")))  # jaxlib: host_to_device on CPU
    _jit_to(rev)(g)  # implicit device_to_device
  err = capfd.readouterr().err
  assert "transfer:" not in err, err  # no "guard_lib.cc] ... transfer: ..." lines
  expected = 3 if level == "log_explicit" else 1
  assert len(guard_logs()) == expected, [r.getMessage() for r in guard_logs()]


def test_from_callback_disallowed_creates_nothing(mesh_2d, devices):
  calls = []

  def cb(idx):
    calls.append(idx)
    return DATA[idx]
  with jax.transfer_guard_host_to_device("disallow_explicit"):
    with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed host-to-device") as e:
      GDA.from_callback((8, 2), mesh_2d, P("x", "y"), cb)
  assert "disallow_explicit" in str(e.value)
  assert isinstance(e.value, RuntimeError)
  assert len(calls) == 8  # the callback ran; the data never left the host


def test_error_names_the_call_site_and_fix(mesh_2d):
  g = _gda(mesh_2d)
  f = _jit_to(NamedSharding(_reversed(mesh_2d), P("x", "y")))
  with jax.transfer_guard("disallow"):
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(RuntimeError) as e:
      f(g)
  msg = str(e.value)
  assert msg.startswith("INVALID_ARGUMENT: Disallowed device-to-device transfer:")
  assert f"{HERE}:{line}" in msg
  assert "(8, 2)" in msg and "float32" in msg and "'disallow'" in msg
  assert "jax.device_put(x, sharding)" in msg


# ---------------------------------------------------------------------------
# Things that are not transfers, and the CPU rule.
# ---------------------------------------------------------------------------


def _ptrs(x):
  return [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]


def test_non_transfers_pass_every_guard(mesh_2d, accelerator_fetch):
  g = _gda(mesh_2d)
  arr = g.to_jax_array()
  with jse.transfer_ledger() as ledger, jax.transfer_guard("disallow_explicit"):
    back = GDA.from_jax_array(arr).to_jax_array()  # zero-copy both ways
    assert _ptrs(back) == _ptrs(arr)
    out = jax.jit(lambda a: a + 1)(g)  # matching sharding: buffers handed over
    assert jax.device_put(g, g.sharding) is g  # stock returns a committed input as is
    assert jax.numpy.sum(g).shape == ()
    buffers = [s.data for s in g.local_shards]
    g2 = GDA(g.shape, g.mesh, g.mesh_axes, buffers)
    with pytest.raises(jax.errors.JaxRuntimeError):  # the callback's own device_put
      GDA.from_batched_callback_with_devices(
          (8, 2), mesh_2d, P("x", "y"),
          lambda entries: [jax.device_put(DATA[i], d) for i, ds in entries for d in ds])
  assert ledger.records == []
  np.testing.assert_array_equal(np.asarray(out), DATA + 1)
  np.testing.assert_array_equal(np.asarray(g2), DATA)


def test_from_batched_callback_with_devices_records_nothing(mesh_2d):
  with jse.transfer_ledger() as ledger:
    g = GDA.from_batched_callback_with_devices(
        (8, 2), mesh_2d, P("x"),
        lambda entries: [jax.device_put(DATA[i], d) for i, ds in entries for d in ds])
  assert ledger.records == []
  np.testing.assert_array_equal(np.asarray(g), DATA)


FETCHES = {
    "np.asarray": np.asarray,
    "jax.device_get": jax.device_get,
    "copy_to_host_async": lambda x: x.copy_to_host_async(),
}


@pytest.mark.parametrize("fetch", list(FETCHES))
@pytest.mark.parametrize("level", LEVELS)
def test_fetch_from_cpu_is_judged_as_stock_judges_the_same_jax_array(level, fetch, mesh_2d):
  """Stock's CPU rule, version for version: jax 0.10.2 allows every fetch
  from CPU devices at every level; jax 0.12 guards a sharded one (its
  batched host copy) and still allows one buffer (one device, or a fully
  replicated array). A GDA's fetch is allowed
  or refused exactly as the same `jax.Array`'s, and an allowed one is in
  the ledger."""
  def outcome(x):
    try:
      with jax.transfer_guard(level):
        FETCHES[fetch](x)
    except jax.errors.JaxRuntimeError as e:
      assert "Disallowed device-to-host" in str(e), e
      return "refused"
    return "allowed"

  one_device = NamedSharding(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("x", "y")),
                             P("x"))
  for sharding in (NamedSharding(mesh_2d, P("x")), NamedSharding(mesh_2d, P()), one_device):
    def make(sharding=sharding):
      return jse.GlobalDeviceArray.from_callback(DATA.shape, sharding.mesh, sharding.spec,
                                                 lambda i: DATA[i])
    gda, stock = make(), make().to_jax_array()
    with jse.transfer_ledger() as ledger:
      ours = outcome(gda)
    assert ours == outcome(stock), (level, fetch, sharding)
    # (On Python 3.12 `np.asarray` of a one-device CPU array reads its buffer
    # in place, through the buffer protocol: nothing moves, nothing is recorded.)
    in_place = fetch == "np.asarray" and sharding is one_device and sys.version_info >= (3, 12)
    assert len(ledger.records) == (ours == "allowed" and not in_place)


def test_stock_sharded_cpu_fetch_matches_compat_flag(mesh_2d):
  """Version-aware on purpose: stock JAX's own behaviour differs here.

  jax 0.10.2 exempts every CPU fetch from the guard; jax 0.12's batched host
  copy guards a multi-device CPU `jax.Array` (single-device ones stay exempt).
  `jax_transfer.JAXLIB_GUARDS_CPU_FETCH` must say which: `_transfers` applies
  the same rule to a GDA (see above).
  """
  sharded = _gda(mesh_2d).to_jax_array()
  single = jax.device_put(DATA, jax.devices()[0])
  with jax.transfer_guard("disallow"):
    np.testing.assert_array_equal(np.asarray(single), DATA)
    if jax_transfer.JAXLIB_GUARDS_CPU_FETCH:
      with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed device-to-host"):
        np.asarray(sharded)
    else:
      np.testing.assert_array_equal(np.asarray(sharded), DATA)


def test_fetched_value_is_not_fetched_again(mesh_2d, accelerator_fetch):
  """As stock: once on the host, later reads are not transfers."""
  g = _gda(mesh_2d)
  np.asarray(g)
  with jse.transfer_ledger() as ledger, jax.transfer_guard("disallow_explicit"):
    np.testing.assert_array_equal(np.asarray(g), DATA)
    np.testing.assert_array_equal(jax.device_get(g), DATA)
  assert ledger.records == []


def test_device_get_after_copy_to_host_async_is_one_transfer(mesh_2d, accelerator_fetch,
                                                             guard_logs):
  g = _gda(mesh_2d)
  with jse.transfer_ledger() as ledger, jax.transfer_guard("log_explicit"):
    jax.device_get(g)
  assert len(ledger.records) == 1 and len(guard_logs()) == 1


# ---------------------------------------------------------------------------
# Scoping: nesting, threads, flags.
# ---------------------------------------------------------------------------


def test_nesting(mesh_2d, accelerator_fetch):
  a, b = _gda(mesh_2d), _gda(mesh_2d)
  with jax.transfer_guard("disallow"):
    with jax.transfer_guard("allow"):
      np.asarray(a)
    with pytest.raises(RuntimeError):
      np.asarray(b)
  with jax.transfer_guard_device_to_host("disallow"):
    with jax.transfer_guard("allow"):
      np.asarray(b)


def test_new_thread_sees_global_option_not_thread_local(mesh_2d):
  """As jaxlib: a new thread uses the global option, not the spawner's scope."""
  g = _gda(mesh_2d)
  rev = NamedSharding(_reversed(mesh_2d), P("x", "y"))
  outcomes = {}

  def worker(key):
    try:
      _jit_to(rev)(g)
      outcomes[key] = "allowed"
    except RuntimeError:
      outcomes[key] = "disallowed"

  def in_thread(key):
    t = threading.Thread(target=worker, args=(key,))
    t.start()
    t.join()

  with jax.transfer_guard("disallow"):
    in_thread("thread_under_local_disallow")
    worker("main_under_local_disallow")
  jax.config.update("jax_transfer_guard_device_to_device", "disallow")
  with jax.transfer_guard("allow"):
    in_thread("thread_under_global_disallow")
    worker("main_local_allow_over_global")
  assert outcomes == {
      "thread_under_local_disallow": "allowed",
      "main_under_local_disallow": "disallowed",
      "thread_under_global_disallow": "disallowed",
      "main_local_allow_over_global": "allowed",
  }


def test_environment_flag_governs_gda(tmp_path):
  """`JAX_TRANSFER_GUARD` (the env form of `--jax_transfer_guard`) applies to GDAs.

  (Stock JAX 0.10.2 reads no env var for the per-direction options, so
  `JAX_TRANSFER_GUARD_DEVICE_TO_DEVICE` governs neither a jax.Array nor a GDA.)
  """
  script = tmp_path / "flag.py"
  script.write_text(textwrap.dedent("""
      import numpy as np, jax
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      import jax_sharding_ext as jse
      mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
      rev = Mesh(np.array(jax.devices()[::-1]).reshape(4, 2), ("x", "y"))
      g = jse.GlobalDeviceArray.from_callback((8, 2), mesh, P("x"), lambda i: np.zeros((8, 2))[i])
      jax.device_put(g, NamedSharding(mesh, P("y")))  # explicit: allowed
      for x in (g, g.to_jax_array()):
        try:
          jax.jit(lambda a: a, in_shardings=NamedSharding(rev, P("x")))(x)
        except RuntimeError as e:
          print(type(x).__name__, "blocked:", str(e).split(":")[:2])
  """))
  env = dict(os.environ, JAX_TRANSFER_GUARD="disallow", JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env=env)
  assert res.returncode == 0, res.stderr
  expected = ['INVALID_ARGUMENT', ' Disallowed device-to-device transfer']
  assert res.stdout.splitlines() == [
      f"{name} blocked: {expected}" for name in ("GlobalDeviceArray", "ArrayImpl")], res.stdout


@pytest.mark.parametrize("level", LEVELS)
def test_same_outcome_as_stock_jax_array(level, mesh_2d):
  """Where stock JAX on CPU classifies the same way, a GDA and a jax.Array agree."""
  rev = NamedSharding(_reversed(mesh_2d), P("x", "y"))

  def outcome(x, op):
    try:
      with jax.transfer_guard_device_to_device(level):
        op(x)
      return "allowed"
    except jax.errors.JaxRuntimeError:
      return "disallowed"

  ops = {"implicit_jit_reorder": lambda x: _jit_to(rev)(x),
         "explicit_copy": lambda x: jax.device_put(x, x.sharding, may_alias=False)}
  for name, op in ops.items():
    g = _gda(mesh_2d)
    assert outcome(g, op) == outcome(g.to_jax_array(), op), name


# ---------------------------------------------------------------------------
# The ledger.
# ---------------------------------------------------------------------------


def _shard_bytes(arr):
  return sum(s.data.nbytes for s in arr.addressable_shards)


@pytest.mark.parametrize("spec", [P("x", "y"), P("x"), P(), P(None, "y")],
                         ids=["sharded", "x_only", "replicated", "y_only"])
def test_ledger_placement_bytes_match_device_buffers(spec, mesh_2d):
  with jse.transfer_ledger() as ledger:
    g = _gda(mesh_2d, spec)
  (rec,) = ledger.records
  assert rec.nbytes == _shard_bytes(g.to_jax_array())  # every replica counts
  # `_gda` (this file) is the user's code that called `from_callback`.
  site = f"{HERE}:{inspect.getsourcelines(_gda)[1] + 1}"
  assert rec == ledger_module.TransferRecord(
      direction="host_to_device", explicit=True, nbytes=rec.nbytes, shape=(8, 2),
      dtype=np.dtype(np.float32), src=(), dst=tuple(mesh_2d.devices.flat), site=site)


def test_ledger_site_is_the_users_line(mesh_2d):
  g = _gda(mesh_2d)
  with jse.transfer_ledger() as ledger:
    line = inspect.currentframe().f_lineno + 1
    jax.device_put(g, NamedSharding(mesh_2d, P("y")))
    np.asarray(g)
  assert [r.site for r in ledger.records] == [f"{HERE}:{line}", f"{HERE}:{line + 1}"]


def test_ledger_site_text_is_built_when_read_and_kept(mesh_2d, monkeypatch, tmp_path):
  # Recording keeps the call site; the text is built on first read, once.
  g, g2 = _gda(mesh_2d), _gda(mesh_2d)
  built = []
  real = ledger_module.site_text
  monkeypatch.setattr(ledger_module, "site_text",
                      lambda site: built.append(site.lineno) or real(site))
  with jse.transfer_ledger() as ledger:
    line = inspect.currentframe().f_lineno + 1
    np.asarray(g), jax.device_get(g2)
  assert built == []
  first, second = ledger.records
  assert first.site == f"{HERE}:{line}" and built == [line]
  assert first.site == f"{HERE}:{line}" and built == [line]  # kept, not rebuilt
  # The dataclass surface sees the text: equality, hashing, repr, asdict, replace, pickle.
  same = dataclasses.replace(second, explicit=False, nbytes=first.nbytes)
  assert same == first and hash(same) == hash(first)
  assert f"site='{HERE}:{line}'" in repr(second)
  with pytest.raises(dataclasses.FrozenInstanceError):
    first.site = "elsewhere.py:1"
  g3 = _gda(mesh_2d)
  with jse.transfer_ledger() as later:
    line = inspect.currentframe().f_lineno + 1
    np.asarray(g3)
  (rec,) = later.records
  # A path reads relative to the working directory of the first read; from
  # outside it, in full.
  monkeypatch.chdir(tmp_path)
  assert rec.site == f"{__file__}:{line}"


def test_ledger_site_without_a_user_frame_and_in_a_notebook_cell(mesh_2d, monkeypatch):
  site = jax_frames.CallSite("/tmp/ipykernel_1/123.py", 4, "<module>")
  record = ledger_module.TransferRecord("device_to_host", False, 4, (1,), np.dtype(np.float32),
                                  (), (), site)

  class Shell:  # what `ipython_shell()` reads of a running IPython
    class compile:
      _filename_map = {"/tmp/ipykernel_1/123.py": 3}

  monkeypatch.setattr(jax_frames, "ipython_shell", lambda: Shell)
  kept = pickle.loads(pickle.dumps(record))  # before its first read: the site travels
  assert record.site == "Cell In[3], line 4" and kept == record
  assert ledger_module.TransferRecord("device_to_host", False, 4, (1,), np.dtype(np.float32),
                                (), (), None).site == "<unknown>:0"


def test_ledger_reshard_and_fetch_bytes(mesh_2d):
  g = _gda(mesh_2d)
  dev = mesh_2d.devices.flat[5]
  with jse.transfer_ledger() as ledger:
    r1 = jax.device_put(g, NamedSharding(mesh_2d, P(None, "y")))
    r2 = jax.device_put(g, dev)
    host = jax.device_get(g)
  assert [r.nbytes for r in ledger.records] == [_shard_bytes(r1), r2.nbytes, host.nbytes]
  assert [r.direction for r in ledger.records] == [
      "device_to_device", "device_to_device", "device_to_host"]
  assert ledger.records[1].src == tuple(mesh_2d.devices.flat)
  assert ledger.records[1].dst == (dev,)
  assert ledger.records[2].dst == ()
  assert all(r.explicit for r in ledger.records)


def test_ledger_placement_of_mixed_host_and_device_values(mesh_2d):
  # Host values are host_to_device, device values elsewhere device_to_device,
  # one already on its device moves nothing; each direction is one record.
  devs = list(mesh_2d.devices.flat)
  on_dev0 = jax.device_put(DATA, devs[0])
  values = {d: (DATA if i % 2 else on_dev0) for i, d in enumerate(devs)}
  with jse.transfer_ledger() as ledger, jax.transfer_guard_host_to_device("log"):
    g = GDA.from_batched_callback((8, 2), mesh_2d, P(),
                                  lambda idxs: [values[d] for d in devs])
  np.testing.assert_array_equal(np.asarray(g), DATA)
  h2d, d2d = ledger.records
  assert (h2d.direction, h2d.dst, h2d.nbytes) == ("host_to_device", tuple(devs[1::2]),
                                                  4 * DATA.nbytes)
  assert (d2d.direction, d2d.src, d2d.dst, d2d.nbytes) == (
      "device_to_device", (devs[0],) * 3, tuple(devs[2::2]), 3 * DATA.nbytes)
  with jax.transfer_guard_device_to_device("disallow_explicit"), pytest.raises(
      jax.errors.JaxRuntimeError, match="device-to-device"):
    GDA.from_batched_callback((8, 2), mesh_2d, P(), lambda idxs: [values[d] for d in devs])


def test_ledger_one_record_per_pytree_leaf(mesh_2d):
  g1, g2 = _gda(mesh_2d), _gda(mesh_2d, P())
  plain = jax.device_put(DATA, mesh_2d.devices.flat[0])
  target = NamedSharding(mesh_2d, P("y"))
  with jse.transfer_ledger() as ledger:
    out = jax.device_put([g1, plain, {"k": g2}], target)
    host = jax.device_get({"a": g1, "b": plain, "c": g2})
  # The plain jax.Array is stock JAX's business: not in this package's ledger.
  assert [(r.direction, r.nbytes) for r in ledger.records] == [
      ("device_to_device", _shard_bytes(out[0])), ("device_to_device", _shard_bytes(out[2]["k"])),
      ("device_to_host", host["a"].nbytes), ("device_to_host", host["c"].nbytes)]


def test_ledger_totals_and_summary(mesh_2d):
  with jse.transfer_ledger() as ledger:
    assert ledger.totals() == {}
    g = _gda(mesh_2d, P())
    np.asarray(g)
    jax.device_put(g, NamedSharding(mesh_2d, P("x")))
  totals = ledger.totals()
  assert totals == {"host_to_device": (1, 512), "device_to_device": (1, 128),
                    "device_to_host": (1, 64)}
  assert list(totals) == list(DIRECTIONS)
  text = ledger.summary()
  assert "host_to_device" in text and "512 B" in text and "total" in text
  assert text.splitlines()[-1].split()[:2] == ["total", "3"]
  with jse.transfer_ledger() as empty:
    pass
  assert empty.totals() == {} and empty.totals()["device_to_host"] == (0, 0)
  assert "total" in empty.summary()
  with pytest.raises(KeyError):
    empty.totals()["sideways"]
  with pytest.raises(dataclasses.FrozenInstanceError):
    ledger.records[0].nbytes = 0


def test_ledgers_nest(mesh_2d):
  with jse.transfer_ledger() as outer:
    a = _gda(mesh_2d)
    with jse.transfer_ledger() as inner:
      np.asarray(a)
    b = _gda(mesh_2d)
  assert [r.direction for r in inner.records] == ["device_to_host"]
  assert [r.direction for r in outer.records] == ["host_to_device", "device_to_host",
                                                  "host_to_device"]
  assert outer.records[1] is inner.records[0]
  assert b is not None


def test_ledgers_are_per_thread(mesh_2d):
  gdas = [_gda(mesh_2d) for _ in range(2)]
  seen = {}

  def worker():
    with jse.transfer_ledger() as mine:
      np.asarray(gdas[1])
    seen["worker"] = mine.records

  with jse.transfer_ledger() as main:
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    np.asarray(gdas[0])
  assert len(seen["worker"]) == 1 and len(main.records) == 1
  assert seen["worker"][0] is not main.records[0]


def test_blocked_transfer_records_nothing_and_ledger_closes_on_error(mesh_2d):
  g = _gda(mesh_2d)
  with pytest.raises(jax.errors.JaxRuntimeError):
    with jse.transfer_ledger() as ledger, jax.transfer_guard("disallow_explicit"):
      jax.device_put(g, NamedSharding(mesh_2d, P("x")))
  assert ledger.records == []
  assert ledger_module.open_count == 0 and ledger_module.open_ledgers() == []
  with pytest.raises(RuntimeError, match="already open"):
    with ledger:
      with ledger:
        pass


def test_public_exports(mesh_2d):
  g = _gda(mesh_2d)
  with jse.transfer_ledger() as ledger:
    np.asarray(g)
  assert len(ledger.records) == 1 and type(ledger.records[0]) is jse.TransferRecord
  assert {"transfer_ledger", "TransferRecord"} <= set(jse.__all__)


def test_guard_level_reader_matches_jax_config():
  for direction in DIRECTIONS:
    for level in LEVELS:
      with getattr(jax, f"transfer_guard_{direction}")(level):
        assert jax_transfer.transfer_guard_level(direction) == level
    assert jax_transfer.transfer_guard_level(direction) == "allow"


@pytest.mark.parametrize("level", ["disallow", "disallow_explicit", "log"])
@pytest.mark.parametrize("where", ["jit", "shard_map"])
def test_effect_tokens_are_not_user_transfers(level, where, mesh_2d, guard_logs, capfd):
  """A guarded loop with ordered prints works from its first step: JAX's
  ordering tokens (an empty token placed on every device before the first
  call) are JAX's bookkeeping, not the user's data, so no guard level
  refuses or logs them and no ledger records them."""
  from jax import shard_map
  jax.clear_caches()
  x = jax.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh_2d, P("x", "y")))
  printed = []

  def body(v):
    jax.debug.callback(lambda s: printed.append(float(s)), v.sum(), ordered=True)
    return v + 1

  if where == "shard_map":
    fn = jax.jit(shard_map(body, mesh=mesh_2d, in_specs=P("x", "y"), out_specs=P("x", "y")))
  else:
    fn = jax.jit(body)
  capfd.readouterr()
  with jse.transfer_ledger() as ledger, jax.transfer_guard(level):
    for _ in range(3):
      x = fn(x)
    jse.effects_barrier()
  assert len(printed) == (3 if where == "jit" else 24)
  assert ledger.records == []
  assert guard_logs() == []
  err = capfd.readouterr().err
  assert "transfer:" not in err, err  # jaxlib's "log" lines
