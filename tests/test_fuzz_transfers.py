"""Fuzzer: the transfer guard and the transfer ledger, every route x level x thread.

A program (`strategies.TransferProgram`) is a few steps on GDAs of one
layout. Each step makes one transfer by one route (the `from_callback`
family placing host data or another device's arrays, `jax.device_put`
resharding, onto one device, copying, of a pytree, `jax.jit` onto another
device order, `jax.device_get`, `np.asarray`, `__array__`, a numpy ufunc,
`copy_to_host_async`, a GDA closed over by a jit, a second fetch), or a
call that moves nothing (jit on the GDA's own sharding, the zero-copy
views, `device_put` onto the same sharding, a callback that places its data
itself), under a guard level set in one of the ways JAX offers (a context
manager on the thread making the transfer, for every direction, its
direction or another; one on the main thread while a new thread makes it;
the global option), with ledgers open on that thread and on the other one.

The model, written from the rules (jaxlib's level table, the classification
of each route, what the ledger counts), not from the implementation: the
level that applies is the thread-local one of the thread making the
transfer, else the global option; "disallow" refuses an implicit transfer,
"disallow_explicit" every one, raising `JaxRuntimeError` ("Disallowed
<direction> transfer"), recording and logging nothing, leaving the array
intact; "log" / "log_explicit" log one warning per transfer they cover;
a fetch from a CPU device is judged as stock judges the same `jax.Array`'s
fetch (on an accelerator, by the table). Every transfer that runs appends
one record per array to every ledger open on its thread (and none to
another thread's): direction, explicit, the bytes written into destination
buffers (every replica of a placement, every destination shard of a
reshard, the global value once for a fetch), shape, dtype, source and
destination devices, and the user's line. A step that moves nothing records
and logs nothing, whatever the guard (numpy reading a one-device CPU array's
buffer in place through Python 3.12's buffer protocol moves nothing).

Each program runs in the suite's child process.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from typing import Any

import pytest
from _fuzz import budget, isolated
from hypothesis import given
from strategies import TransferProgram, TransferStep, transfer_programs

pytestmark = pytest.mark.fuzz

H2D, D2D, D2H = "host_to_device", "device_to_device", "device_to_host"
_DIRECTIONS = (H2D, D2D, D2H)

_TABLE = {  # jaxlib's level table: (implicit, explicit) -> action
    "allow": ("allow", "allow"), "log": ("log", "allow"), "disallow": ("disallow", "allow"),
    "log_explicit": ("log", "log"), "disallow_explicit": ("disallow", "disallow")}


class _Logs(logging.Handler):
  def __init__(self):
    super().__init__(logging.WARNING)
    self.records: list[logging.LogRecord] = []

  def emit(self, record):
    self.records.append(record)


# ---------------------------------------------------------------------------
# The routes: each makes its arrays (under no guard), then `run()` is the
# step, and `expect` the transfers it makes: (direction, explicit, nbytes,
# src, dst) per array.
# ---------------------------------------------------------------------------


class _Route:
  """`stock`: for a fetch, a `jax.Array` of the same value and sharding,
  whose fetch stock judges (the model of the CPU rule)."""

  def __init__(self, run, expect, check, stock=None):
    self.run, self.expect, self.check, self.stock = run, expect, check, stock


def _devices(sharding, shape) -> tuple:
  return tuple(sharding.addressable_devices_indices_map(shape))


def _placement(sharding, shape) -> list:
  return [(d, tuple(s.indices(n)[:2] for s, n in zip(idx, shape, strict=True)))
          for d, idx in sharding.devices_indices_map(shape).items()]


def _moves(src, dst, shape) -> bool:
  """Whether going from `src` to `dst` copies, as stock decides: another
  device, another shard somewhere, or the devices in another order (a
  replicated array onto its devices reversed is copied too)."""
  return _placement(src, shape) != _placement(dst, shape)


def _shard_nbytes(sharding, shape, dtype) -> int:
  import numpy as np
  return math.prod(sharding.shard_shape(shape)) * np.dtype(dtype).itemsize


def _buffer_readable(x) -> bool:
  try:
    memoryview(x).release()
  except (TypeError, ValueError, BufferError, RuntimeError):
    return False
  return True


def _route(name: str, p: TransferProgram, step: TransferStep) -> _Route:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import GlobalDeviceArray as GDA
  mesh, shape, dtype = p.mesh.build(), p.shape, jnp.dtype(p.dtype)
  sharding = NamedSharding(mesh, P(*p.spec))
  data = (np.arange(math.prod(shape)) % 97).astype(dtype).reshape(shape)
  devs = _devices(sharding, shape)
  nbytes = data.nbytes
  per_device = _shard_nbytes(sharding, shape, dtype)

  def gda():
    return GDA.from_callback(shape, mesh, P(*p.spec), lambda i: data[i])

  def same(out, want=data):
    np.testing.assert_array_equal(np.asarray(jax.device_get(out)), want)

  placed = [(H2D, True, per_device * len(devs), (), devs)]
  fetched = [(D2H, True, nbytes, devs, ())]
  implicit_fetch = [(D2H, False, nbytes, devs, ())]
  # Where a GDA offers the buffer protocol (Python 3.12: a one-device CPU
  # array of a dtype the protocol has), numpy reads its buffer in place, as
  # for stock's `jax.Array`: nothing moves.
  by_numpy = [] if _buffer_readable(gda()) else implicit_fetch
  if name == "from_callback":
    return _Route(gda, placed, same)
  if name == "from_batched_callback":
    return _Route(lambda: GDA.from_batched_callback(shape, mesh, P(*p.spec),
                                                    lambda idx: [data[i] for i in idx]),
                  placed, same)
  if name == "callback_device_values":  # every shard's data put on the first device first
    first = devs[0]

    def key(index):
      return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
    on_first = {key(i): jax.device_put(data[i], first)
                for i in sharding.devices_indices_map(shape).values()}
    others = tuple(d for d in devs if d != first)
    expect = [(D2D, True, per_device * len(others), (first,) * len(others), others)] \
        if others else []
    return _Route(lambda: GDA.from_callback(
        shape, mesh, P(*p.spec), lambda i: on_first[key(i)]),
        expect, same)
  if name == "with_devices":  # the callback places its data itself: stock's to judge
    return _Route(lambda: GDA.from_batched_callback_with_devices(
        shape, mesh, P(*p.spec), lambda entries: [jax.device_put(data[i], d)
                                                  for i, ds in entries for d in ds]),
        None, same)
  g = gda()
  stock = jax.device_put(data, sharding)
  if name == "device_put_reshard":
    target = NamedSharding(mesh, P(*step.spec))
    try:
      target.shard_shape(shape)
    except ValueError:
      target = NamedSharding(mesh, P())
    expect = [(D2D, True, _shard_nbytes(target, shape, dtype) * len(_devices(target, shape)),
               devs, _devices(target, shape))] if _moves(sharding, target, shape) else []
    return _Route(lambda: jax.device_put(g, target), expect, same)
  if name == "device_put_device":
    dev = jax.devices()[-1]
    target = jax.sharding.SingleDeviceSharding(dev)
    expect = [(D2D, True, nbytes, devs, (dev,))] if _moves(sharding, target, shape) else []
    return _Route(lambda: jax.device_put(g, dev), expect, same)
  if name == "device_put_copy":
    return _Route(lambda: jax.device_put(g, g.sharding, may_alias=False),
                  [(D2D, True, per_device * len(devs), devs, devs)], same)
  if name == "device_put_pytree":
    g2 = gda()
    target = NamedSharding(mesh, P())
    one = [(D2D, True, nbytes * len(devs), devs, devs)] if _moves(sharding, target, shape) else []
    return _Route(lambda: jax.device_put({"a": g, "b": [g2]}, target), one * 2,
                  lambda out: [same(out["a"]), same(out["b"][0])])
  if name == "jit_device_order":  # a fresh jit onto the mesh's devices in reverse order
    flipped = Mesh(np.asarray(mesh.devices).reshape(-1)[::-1].reshape(mesh.devices.shape),
                   mesh.axis_names)
    target = NamedSharding(flipped, P(*p.spec))
    expect = [(D2D, False, per_device * len(devs), devs, _devices(target, shape))] \
        if _moves(sharding, target, shape) else []
    return _Route(lambda: jax.jit(lambda a: a * 2, in_shardings=target)(g), expect,
                  lambda out: same(out, data * 2))
  if name == "device_get":
    return _Route(lambda: jax.device_get(g), fetched, same, stock=stock)
  if name == "device_get_pytree":
    g2 = gda()
    return _Route(lambda: jax.device_get({"a": g, "b": g2}), fetched * 2,
                  lambda out: [same(out["a"]), same(out["b"])], stock=stock)
  if name == "np_asarray":
    return _Route(lambda: np.asarray(g), by_numpy, same, stock=stock)
  if name == "array_method":
    return _Route(lambda: g.__array__(), implicit_fetch, same, stock=stock)
  if name == "np_add":
    return _Route(lambda: np.add(g, 1), by_numpy, lambda out: same(out, data + 1),
                  stock=stock)
  if name == "copy_to_host_async":
    return _Route(lambda: (g.copy_to_host_async(), g)[1], implicit_fetch, same, stock=stock)
  if name == "jit_closure":  # the closed-over GDA becomes a constant
    return _Route(jax.jit(lambda: jnp.multiply(g, 2)), implicit_fetch,
                  lambda out: same(out, data * 2), stock=stock)
  if name == "fetch_again":  # its value is on the host already: nothing moves
    jax.device_get(g)
    return _Route(lambda: (np.asarray(g), jax.device_get(g)), [],
                  lambda out: [same(out[0]), same(out[1])])
  if name == "jit_same":
    return _Route(lambda: jax.jit(lambda a: a + 1)(g), [], lambda out: same(out, data + 1))
  if name == "views":
    return _Route(lambda: GDA.from_jax_array(g.to_jax_array()), [], same)
  assert name == "device_put_same", name
  return _Route(lambda: jax.device_put(g, g.sharding), [], same)


# ---------------------------------------------------------------------------
# Running a step, and the model.
# ---------------------------------------------------------------------------


def _level_here(step: TransferStep, direction: str) -> str:
  """The level that applies to a `direction` transfer made by the step."""
  scope = step.scope
  if scope == "cm_main" and step.thread != "main":
    return "allow"  # a new thread does not see the main thread's context manager
  if scope in ("cm_direction", "global_direction") and direction != _guarded_direction(step):
    return "allow"
  if scope == "cm_other_direction":
    return "allow"
  return step.level


def _guarded_direction(step: TransferStep) -> str:
  r = step.route
  if r.startswith(("device_get", "np_", "array", "copy_to", "jit_closure", "fetch")):
    return D2H
  if r in ("from_callback", "from_batched_callback", "with_devices"):
    return H2D
  return D2D


@contextlib.contextmanager
def _guard(step: TransferStep, on_thread: str):
  """The step's guard as it is set on `on_thread` ("main" or "thread")."""
  import jax
  scope, level, direction = step.scope, step.level, _guarded_direction(step)
  if scope.startswith("global"):
    if on_thread != "main":
      yield
      return
    name = "jax_transfer_guard" if scope == "global_all" else f"jax_transfer_guard_{direction}"
    jax.config.update(name, level)
    try:
      yield
    finally:
      for option in ("jax_transfer_guard", *(f"jax_transfer_guard_{d}" for d in _DIRECTIONS)):
        jax.config.update(option, None)
    return
  here = "main" if scope == "cm_main" else step.thread
  if on_thread != here:
    yield
    return
  if scope in ("cm_all", "cm_main"):
    cm = jax.transfer_guard(level)
  else:
    other = _DIRECTIONS[(_DIRECTIONS.index(direction) + 1) % 3]
    cm = getattr(jax, f"transfer_guard_{direction if scope == 'cm_direction' else other}")(level)
  with cm:
    yield


@contextlib.contextmanager
def _ledgers(n: int):
  import jax_sharding_ext as jse
  with contextlib.ExitStack() as stack:
    yield [stack.enter_context(jse.transfer_ledger()) for _ in range(n)]


@contextlib.contextmanager
def _elsewhere(step: TransferStep):
  """With `step.elsewhere`, a ledger open on a thread other than the step's
  while the step runs (the main thread's, or a thread of its own)."""
  if not step.elsewhere:
    yield []
    return
  if step.thread != "main":
    with _ledgers(1) as other:
      yield other
    return
  opened, done, other = threading.Event(), threading.Event(), []

  def hold():
    with _ledgers(1) as ledgers:
      other.extend(ledgers)
      opened.set()
      done.wait()
  t = threading.Thread(target=hold)
  t.start()
  opened.wait()
  try:
    yield other
  finally:
    done.set()
    t.join()


def _stock_fetch_allowed(route: _Route, step: TransferStep) -> bool:
  """Whether stock allows the same fetch of the GDA's `jax.Array`, here."""
  import jax
  import numpy as np
  arr = route.stock
  explicit = step.route.startswith("device_get")
  fetch = (lambda: jax.device_get(arr)) if explicit else (lambda: np.asarray(arr))
  try:
    fetch()
  except jax.errors.JaxRuntimeError:
    return False
  return True


def _expected_outcome(route: _Route, step: TransferStep, stock_allowed) -> tuple[str, int]:
  """("allow" / "log" / "disallow", the number of log lines)."""
  if route.expect is None:  # the callback's own `jax.device_put`s (explicit), stock's to judge
    act = _TABLE[_level_here(step, H2D)][True]
    return ("disallow" if act == "disallow" else "allow"), 0
  actions = []
  for direction, explicit, *_ in route.expect:
    act = _TABLE[_level_here(step, direction)][explicit]
    if direction == D2H and not step.gpu and act != "allow":
      act = "allow" if stock_allowed() else "disallow"  # stock's CPU rule
    actions.append(act)
  if "disallow" in actions:
    return "disallow", 0
  return ("log" if "log" in actions else "allow"), actions.count("log")


def run_step(p: TransferProgram, step: TransferStep, here_file: str) -> str:
  """Run one step as the model says and return what happened."""
  import jax

  from jax_sharding_ext._transfers import moves
  route = _route(step.route, p, step)
  logs = _Logs()
  logger = logging.getLogger("jax_sharding_ext")
  logger.addHandler(logs)
  result: dict[str, Any] = {}
  if step.gpu:
    saved = moves._fetch_always_allowed
    moves._fetch_always_allowed = lambda arr: False
  try:
    def make(on_thread: str):
      with _guard(step, on_thread), _ledgers(step.ledgers) as mine:
        try:
          result["out"] = route.run()
        except jax.errors.JaxRuntimeError as e:
          result["error"] = e
        if route.stock is not None and not step.gpu:
          result["stock"] = _stock_fetch_allowed(route, step)
      result["mine"] = mine

    with _guard(step, "main"), _elsewhere(step) as other:
      if step.thread == "main":
        make("main")
      else:
        t = threading.Thread(target=make, args=("thread",))
        t.start()
        t.join()
    result["other"] = other
  finally:
    logger.removeHandler(logs)
    if step.gpu:
      moves._fetch_always_allowed = saved
  return _judge(p, route, step, result, logs.records, here_file)


def _judge(p: TransferProgram, route: _Route, step: TransferStep, result: dict, logs: list,
           here_file: str) -> str:
  import jax.numpy as jnp
  expect = route.expect or []
  outcome, n_logs = _expected_outcome(route, step, lambda: result.get("stock", True))
  name = step.route
  mine = result["mine"]
  elsewhere = [r for ledger in result["other"] for r in ledger.records]
  if elsewhere:
    return f"{name}: a ledger on another thread recorded {elsewhere}"
  if outcome == "disallow":
    err = result.get("error")
    if err is None:
      return f"{name}: ran, but the guard ({step.level}, {step.scope}) disallows it"
    if route.expect is not None and "Disallowed" not in str(err):
      return f"{name}: raised {err!r:.300}, not the guard's error"
    if any(ledger.records for ledger in mine):
      return f"{name}: a refused transfer was recorded: {mine[0].records}"
    if logs:
      return f"{name}: a refused transfer was logged: {[r.getMessage() for r in logs]}"
    return "disallowed"
  if "error" in result:
    return f"{name}: raised {result['error']!r:.300} where the guard allows it"
  try:
    route.check(result["out"])
  except AssertionError as e:
    return f"{name}: wrong value: {str(e)[:300]}"
  if route.expect is not None and (step.gpu or not any(d == "device_to_host" for d, *_ in expect)):
    if len(logs) != n_logs:
      return f"{name}: {len(logs)} log lines, expected {n_logs}: {[r.getMessage() for r in logs]}"
  if route.expect is None:
    want: list = []
  else:
    want = [(d, e, n, tuple(s), tuple(t)) for d, e, n, s, t in expect]
  for k, ledger in enumerate(mine):
    got = [(r.direction, r.explicit, r.nbytes, tuple(r.src), tuple(r.dst))
           for r in ledger.records]
    if got != want:
      return f"{name}: ledger {k} recorded {got}, expected {want}"
    for r in ledger.records:
      if r.shape != tuple(p.shape) or r.dtype != jnp.dtype(p.dtype):
        return f"{name}: a record of shape {r.shape} and dtype {r.dtype}"
      if here_file not in r.site:
        return f"{name}: the record's site {r.site} is not the user's line"
  if len(mine) == 2 and any(a is not b for a, b in zip(mine[0].records, mine[1].records,
                                                       strict=True)):
    return f"{name}: nested ledgers hold different records"
  return outcome


def run_transfer_program(p: TransferProgram) -> list[str]:
  """Every step of `p` as the model says (module docstring); what each did."""
  import os
  here = os.path.basename(__file__)
  outcomes, failures = [], []
  for step in p.steps:
    why = run_step(p, step, here)
    outcomes.append(why)
    if why not in ("allow", "log", "disallow", "disallowed"):
      failures.append(f"{step!r}\n    -> {why}")
  assert not failures, "\n".join(failures)
  return outcomes


@given(transfer_programs())
@budget(15)
def test_every_transfer_is_guarded_and_recorded_as_the_model_says(program):
  """Each step is refused, logged or allowed as jaxlib's level table says
  for the level that applies on its thread (a fetch from CPU as stock's),
  and records exactly the model's transfers in the ledgers of its thread."""
  isolated("test_fuzz_transfers:run_transfer_program", program)
