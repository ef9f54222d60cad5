"""Fuzzer: `install()` / `uninstall()` racing calls on other threads.

A race (`strategies.InstallRace`) starts worker threads that each repeat a
few uses of a GDA (a new `jax.jit`, a warm one, `jax.numpy`, `jax.grad`,
legacy `pjit`, the output flag, an ordered print under multi-device jit and
inside `shard_map`, `sharded_callback`, `jax.device_put` in a ledger, a
fetch, a checkpoint save and restore; and, with a plain `jax.Array`, a
warm jit called under the output flag, an AOT `Compiled` made under the
flag, and one compiled under the flag by the call) while the main thread
uninstalls and reinstalls the package at drawn intervals.

The model: each call either runs as installed (the right value) or raises
the documented error of an uninstalled package (a `RuntimeError` that says
to call `jax_sharding_ext.install()`; for an ordered print, stock's
`ValueError` for ordered effects on several devices). A call on plain
arrays under the flag returns a GDA when the package was installed all
through the call and a `jax.Array` when it was uninstalled all through
(uninstalled, no GDA comes out of anything: not of a cached executable, nor
of a `Compiled` made under the flag). Once the race is over, the package
uninstalled gives no GDA from any of them, and installed again, every use
works again. Races run in the suite's child process, so a crash or a hang
is a failure naming the race.
"""

from __future__ import annotations

import tempfile
import threading
import time

import pytest
from _fuzz import budget, isolated
from hypothesis import given
from strategies import InstallRace, install_races

pytestmark = pytest.mark.fuzz

_UNINSTALLED = "jax_sharding_ext.install()"  # every "uninstalled" error says what to do
_STOCK_ORDERED = "not supported for more than 1 device"


def _uses(tmp: str):
  """`{name: (call, expected host value or None)}` over one 8-device GDA."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import jax_sharding_ext as jse
  from jax_sharding_ext import GlobalDeviceArray, pjit, serialization

  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  g = GlobalDeviceArray.from_callback((8, 2), mesh, P("x", "y"), lambda i: data[i])
  plain = jax.device_put(data, NamedSharding(mesh, P("x", "y")))
  warm = jax.jit(lambda v: v * 3)
  warm_flag = jax.jit(lambda v: v * 5)
  with jse.parallel_functions_output_gda(True):
    aot_flag = jax.jit(lambda v: v * 7).lower(plain).compile()
  counter = iter(range(1, 10**9))
  saves = iter(range(10**9))

  def new_jit():
    k = next(counter)
    return jax.jit(lambda v: v * 2 + k)(g), data * 2 + k

  def ordered_print():
    k = next(counter)

    def f(v):
      jax.debug.print("step {k} {s}", k=k, s=v.sum(), ordered=True)
      return v + k
    return jax.jit(f)(g), data + k

  def in_shard_map():
    k = next(counter)

    def body(v):
      jax.debug.print("shard {s}", s=v.sum(), ordered=True)
      return v * k
    f = jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))
    return jax.jit(f)(g), data * k

  def callback_per_shard():
    seen = []

    @jax.jit
    def f(v):
      jse.sharded_callback(lambda d, i, dev: seen.append(d.sum()), v)
      return v + 2
    out = f(g)
    jse.effects_barrier()
    assert sorted(seen) == sorted(float(data[i].sum()) for i in
                                  (s.index for s in g.addressable_shards)), seen
    return out, data + 2

  def ledger():
    with jse.transfer_ledger() as led:
      out = jax.device_put(g, NamedSharding(mesh, P("y")))
    assert [r.direction for r in led.records] == ["device_to_device"], led.records
    return out, data

  def output_flag():
    with jse.parallel_functions_output_gda(True):
      out = jax.jit(lambda v: v - 1)(g)
    return out, data - 1

  def ordered_plain(v):
    jax.debug.print("warm {s}", s=v.sum(), ordered=True)
    return v + 4
  warm_ordered = jax.jit(ordered_plain)

  def flag_warm_jit():
    with jse.parallel_functions_output_gda(True):
      return warm_flag(plain), data * 5

  def flag_aot_compile():
    k = next(counter)
    with jse.parallel_functions_output_gda(True):
      compiled = jax.jit(lambda v: v * 2 - k).lower(plain).compile()
    return compiled(plain), data * 2 - k

  def checkpoint():
    path = f"{tmp}/ckpt_{next(saves)}"
    spec = serialization.get_tensorstore_spec(path)
    serialization.run_serialization([g], [spec])
    out, = serialization.run_deserialization([mesh], [P("x", "y")], [spec])
    return out, data

  return {
      "new_jit": new_jit,
      "warm_jit": lambda: (warm(g), data * 3),
      "jnp": lambda: (jnp.sin(g), np.sin(data)),
      "grad": lambda: (jax.grad(lambda v: (v ** 2).sum())(g), 2 * data),
      "pjit": lambda: (pjit(lambda v: v + 1)(g), data + 1),
      "output_flag": output_flag,
      "ordered_print": ordered_print,
      "device_put": lambda: (jax.device_put(g, NamedSharding(mesh, P("x"))), data),
      "fetch": lambda: (np.asarray(g), data),
      "checkpoint": checkpoint,
      "shard_map_print": in_shard_map,
      "sharded_callback": callback_per_shard,
      "ledger": ledger,
      "flag_warm_jit": flag_warm_jit,
      "flag_aot": lambda: (aot_flag(plain), data * 7),
      "flag_aot_compile": flag_aot_compile,
      "warm_ordered_print": lambda: (warm_ordered(plain), data + 4),
  }


_ORDERED = ("ordered_print", "shard_map_print", "warm_ordered_print")
"""Uses whose ordered effects stock refuses on several devices."""

_FLAG_USES = ("flag_warm_jit", "flag_aot", "flag_aot_compile")
"""Uses on plain `jax.Array`s under the output flag: a GDA exactly when installed."""


def _kind_of_output(name: str, out, installed: bool | None) -> str | None:
  """What is wrong with the type of `name`'s output (None: nothing) when the
  package was installed all through the call (`installed`), uninstalled all
  through, or swapped during it (None)."""
  from jax_sharding_ext import GlobalDeviceArray
  if name not in _FLAG_USES or installed is None:
    return None
  if installed != isinstance(out, GlobalDeviceArray):
    return (f"{name}: a {type(out).__name__} while the package was "
            f"{'installed' if installed else 'uninstalled'} all through the call")
  return None


def run_install_race(race: InstallRace) -> dict:
  """Run `race` and check the model (module docstring); return the outcomes."""
  import jax
  import numpy as np

  import jax_sharding_ext as jse
  outcomes: dict[str, int] = {}
  bad: list[str] = []
  with tempfile.TemporaryDirectory() as tmp:
    uses = _uses(tmp)
    stop = threading.Event()
    swaps = [0]  # odd while a swap runs

    def worker(names):
      i = 0
      while not stop.is_set():
        name = names[i % len(names)]
        i += 1
        before = swaps[0]
        installed = jse.is_installed()
        try:
          out, expected = uses[name]()
          steady = before == swaps[0] and before % 2 == 0
          wrong = _kind_of_output(name, out, installed if steady else None)
          if wrong:
            bad.append(wrong)
          np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
          kind = "ran"
        except RuntimeError as e:
          if _UNINSTALLED not in str(e):
            bad.append(f"{name}: {e!r}"[:600])
          kind = "uninstalled"
        except ValueError as e:
          if not (name in _ORDERED and _STOCK_ORDERED in str(e)):
            bad.append(f"{name}: {e!r}"[:600])
          kind = "stock"
        except Exception as e:
          bad.append(f"{name}: {e!r}"[:600])
          kind = "bad"
        outcomes[f"{name} {kind}"] = outcomes.get(f"{name} {kind}", 0) + 1

    threads = [threading.Thread(target=worker, args=(names,)) for names in race.workers]
    for t in threads:
      t.start()
    try:
      for pause in race.pauses:
        time.sleep(pause)
        swaps[0] += 1
        if jse.is_installed():
          jse.uninstall()
        else:
          jse.install()
        swaps[0] += 1
    finally:
      jse.install()
      time.sleep(0.05)
      stop.set()
      for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker never returned"
    jax.effects_barrier()
    assert not bad, f"{len(bad)} calls failed otherwise than the model allows:\n" + \
        "\n".join(bad[:5])
    for name, use in uses.items():  # installed again: every use works (and is warm)
      out, expected = use()
      np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, err_msg=name)
    jse.uninstall()  # uninstalled: no GDA from anything warmed or compiled while installed,
    try:  # and stock's refusal of an ordered effect on several devices
      for name in _FLAG_USES:
        out, _ = uses[name]()
        wrong = _kind_of_output(name, out, False)
        assert not wrong, wrong + " (after the race)"
      try:
        uses["warm_ordered_print"]()
        raise AssertionError("a warm jit ran its ordered print on 8 devices after uninstall()")
      except ValueError as e:
        assert _STOCK_ORDERED in str(e), e
    finally:
      jse.install()
    for name in _FLAG_USES:  # and installed, the flag's GDAs again
      out, _ = uses[name]()
      wrong = _kind_of_output(name, out, True)
      assert not wrong, wrong + " (installed after the race)"
  return outcomes


@given(install_races())
@budget(4)
def test_calls_racing_install_run_installed_or_raise_the_documented_error(race):
  """Each call runs as installed or raises the documented 'uninstalled' error."""
  isolated("test_fuzz_install:run_install_race", race, timeout=180)
