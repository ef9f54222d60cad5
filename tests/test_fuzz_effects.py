"""Fuzzer: ordered effects in random programs, against the 1-device run.

A program (`strategies.EffectsProgram`) is a jitted function of one array
built from ordered `jax.debug.callback`s of the value's sum,
`sharded_callback`s of the value, updates of the value, `lax.cond`,
`lax.scan`, `lax.while_loop`, `lax.fori_loop` and `jax.checkpoint`, nested.
It runs on a mesh of 8 or 4 devices (1-D or 2-D, devices in order or not)
with its input sharded, called once or twice on each of one to three
threads, which dispatch and return without waiting; the main thread then
calls `effects_barrier()`.

The model is the same program on one device (stock JAX, where ordered
effects are native): when `effects_barrier()` returns, every effect every
thread dispatched has run; per thread, the ordered callbacks ran once per
program point with the global value, in the 1-device run's order, call after
call; each `sharded_callback` ran once per device of the mesh with that
device's index (stock's `devices_indices_map`) and the value there
(`value[index]`), and per device in program order.

Each program runs in the suite's child process.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest
from _fuzz import budget, isolated
from hypothesis import given
from strategies import EffectsProgram, MeshSpec, effects_programs

pytestmark = pytest.mark.fuzz


def _function(p: EffectsProgram, mesh_spec: MeshSpec, spec: tuple, events: list):
  """The program as a jitted function on `mesh_spec`, appending to `events`:
  `("cb", tag, sum)` and `("shard", tag, device, index, data)`."""
  import jax
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jax_sharding_ext as jse
  sharding = NamedSharding(mesh_spec.build(), P(*spec))
  lock = threading.Lock()

  def on_sum(tag, total):
    if p.slow:
      time.sleep(0.002)
    with lock:
      events.append(("cb", tag, int(total)))

  def on_shard(tag, data, index, device):
    if p.slow:
      time.sleep(0.002)
    with lock:
      events.append(("shard", tag, device, index, np.array(data)))

  def run(stmts, v, top):
    for s in stmts:
      kind = s[0]
      if kind == "callback":
        jax.debug.callback(functools.partial(on_sum, s[1]), v.sum(), ordered=True)
      elif kind == "sharded":  # the jit argument's own sharding is known; others are given
        jse.sharded_callback(functools.partial(on_shard, s[1]), v,
                             sharding=None if top == "argument" else sharding)
      elif kind == "update":
        v, top = v * 2 + s[1], "value"
      elif kind == "cond":
        v = lax.cond(v.sum() > 0, lambda w, s=s: run(s[1], w, "value"),
                     lambda w, s=s: run(s[2], w, "value"), v)
      elif kind == "scan":
        v = lax.scan(lambda c, _, s=s: (run(s[2], c, "value"), None), v, None, length=s[1])[0]
      elif kind == "while":
        v = lax.while_loop(lambda c, s=s: c[1] < s[1],
                           lambda c, s=s: (run(s[2], c[0], "value"), c[1] + 1), (v, 0))[0]
      elif kind == "fori":
        v = lax.fori_loop(0, s[1], lambda i, c, s=s: run(s[2], c, "value"), v)
      else:
        v = jax.checkpoint(lambda w, s=s: run(s[1], w, "value"))(v)
      if kind != "update" and kind not in ("callback", "sharded"):
        top = "value"
    return v
  return jax.jit(lambda v: run(p.body, v, "argument")), sharding


def _data(p: EffectsProgram, thread: int, call: int):
  import numpy as np
  n = int(np.prod(p.shape))
  return (np.arange(n, dtype=np.int32) % 7 - 3 + 10 * thread + call).reshape(p.shape)


def _model(p: EffectsProgram, thread: int) -> tuple[list, Any]:
  """The events and outputs of the 1-device run, call after call."""
  import jax
  one = MeshSpec((1,), ("x",), (p.mesh.device_ids[0],))
  events: list = []
  f, sharding = _function(p, one, (), events)
  outs = []
  for call in range(p.calls):
    outs.append(f(jax.device_put(_data(p, thread, call), sharding)))
  jax.effects_barrier()
  return events, [jax.device_get(o) for o in outs]


def _check(p: EffectsProgram, thread: int, got: list, want: list, outs, want_outs) -> str | None:
  """Why the events `got` of one thread break the model (None: they keep it)."""
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  for o, w in zip(outs, want_outs, strict=True):
    if not np.array_equal(np.asarray(o), w):
      return f"thread {thread}: the output differs from the 1-device run's"
  cbs = [e[1:] for e in got if e[0] == "cb"]
  want_cbs = [e[1:] for e in want if e[0] == "cb"]
  if cbs != want_cbs:
    return f"thread {thread}: ordered callbacks {cbs}, the 1-device run {want_cbs}"
  points = [(e[1], e[4]) for e in want if e[0] == "shard"]  # (tag, global value) per point
  mesh = p.mesh.build()
  indices = NamedSharding(mesh, P(*p.spec)).devices_indices_map(p.shape)
  for device in mesh.devices.flat:
    mine = [e for e in got if e[0] == "shard" and e[2] == device]
    if [e[1] for e in mine] != [tag for tag, _ in points]:
      return (f"thread {thread}: device {device.id} ran sharded callbacks "
              f"{[e[1] for e in mine]}, the program's order is {[t for t, _ in points]}")
    for (_, tag, _, index, data), (_, value) in zip(mine, points, strict=True):
      if _bounds(index, p.shape) != _bounds(indices[device], p.shape):
        return (f"thread {thread}: sharded callback {tag} on device {device.id} got the index "
                f"{index}; its shard is {indices[device]}")
      if not np.array_equal(data, value[index]):
        return (f"thread {thread}: sharded callback {tag} on device {device.id} got data "
                f"{data.ravel()[:6]}, the value there is {value[index].ravel()[:6]}")
  return None


def _bounds(index, shape) -> tuple:
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def run_effects_program(p: EffectsProgram) -> int:
  """The model of the module docstring; returns the number of events."""
  import jax

  import jax_sharding_ext as jse
  models = [_model(p, t) for t in range(p.threads)]
  events: list[list] = [[] for _ in range(p.threads)]
  outs: list[list] = [[] for _ in range(p.threads)]
  fns = [_function(p, p.mesh, p.spec, events[t]) for t in range(p.threads)]
  errors: list = []

  def dispatch(t):  # returns without waiting for the effects
    try:
      f, sharding = fns[t]
      for call in range(p.calls):
        outs[t].append(f(jax.device_put(_data(p, t, call), sharding)))
    except Exception as e:  # reported below
      errors.append(e)

  threads = [threading.Thread(target=dispatch, args=(t,)) for t in range(p.threads)]
  for th in threads:
    th.start()
  for th in threads:
    th.join()
  jse.effects_barrier()
  done = [list(e) for e in events]  # what had run when the barrier returned
  assert not errors, f"a call raised: {errors[0]!r}"
  problems = []
  devices = len(p.mesh.device_ids)
  for t in range(p.threads):
    want, want_outs = models[t]
    expected = sum(1 if e[0] == "cb" else devices for e in want)
    if len(done[t]) != expected:
      problems.append(f"thread {t}: {len(done[t])} of its {expected} effects had run when "
                      "effects_barrier() returned")
      continue
    why = _check(p, t, done[t], want, [jax.device_get(o) for o in outs[t]], want_outs)
    if why:
      problems.append(why)
  assert not problems, "\n".join(problems)
  return sum(map(len, done))


@given(effects_programs())
@budget(8)
def test_ordered_effects_run_in_the_order_of_the_one_device_run(program):
  """Ordered callbacks in the 1-device run's order per thread, sharded
  callbacks once per device with its own index and data, all run when
  `effects_barrier()` returns."""
  isolated("test_fuzz_effects:run_effects_program", program)
