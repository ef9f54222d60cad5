"""Fuzzer: the caller's thread-local JAX settings on the package's own threads.

A case (`strategies.ThreadSettingsCase`) makes a few settings on the calling
thread (a transfer guard for every direction or one, `jax.enable_x64`,
`jax.numpy_dtype_promotion`, `jax.default_device`, `jax.set_mesh`, `with
mesh:`, the package's output flag), each as a context manager or, for the
options that have one, through `jax.config.update`, and then makes one
checkpoint call: `run_serialization`, `run_deserialization` (both forms),
the async manager's `serialize` / `deserialize`, or `async_serialize` /
`async_deserialize` awaited. The call is made twice: inside a running event
loop (a notebook cell, `asyncio.run`), where the synchronous calls run their
work on a helper thread, and outside one.

The model: the work runs as if the caller had run it. Every setting reads
the same on the thread that does the work (the tensorstore reads and writes,
probed where the package hands them to stock) as on the calling thread; and
the call ends the same inside a loop as outside (both refused by the guard,
or both done with the same array type, dtype and values, or the same values
written).

Each case runs in the suite's child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import warnings
from typing import Any

import pytest
from _fuzz import budget, isolated
from hypothesis import given
from strategies import MeshSpec, ThreadSettingsCase, thread_settings_cases

pytestmark = pytest.mark.fuzz

_DIRECTIONS = ("host_to_device", "device_to_device", "device_to_host")


def _mesh_text(mesh: Any) -> str:
  if mesh is None or getattr(mesh, "empty", False):
    return "none"
  ids = [getattr(d, "id", d) for d in getattr(mesh, "devices", ()).flat] \
      if hasattr(mesh, "devices") else []
  return f"{dict(mesh.shape)} {ids}"


def read_settings() -> dict[str, str]:
  """Every setting the model covers, as the calling thread sees it."""
  import jax

  from jax_sharding_ext._jax import config as jax_config
  from jax_sharding_ext._jax import transfer as jax_transfer
  out = {f"guard {d}": jax_transfer.transfer_guard_level(d) for d in _DIRECTIONS}
  out["x64"] = str(jax.config.jax_enable_x64)
  out["promotion"] = str(jax.config.jax_numpy_dtype_promotion)
  out["default_device"] = str(jax.config.jax_default_device)
  out["abstract_mesh"] = str(jax.sharding.get_abstract_mesh())
  out["mesh"] = _mesh_text(jax_config.context_mesh())
  out["output_gda"] = str(jax.config.jax_parallel_functions_output_gda)
  return out


# ---------------------------------------------------------------------------
# Making the settings.
# ---------------------------------------------------------------------------

_OPTION = {"guard": "jax_transfer_guard", "x64": "jax_enable_x64",
           "promotion": "jax_numpy_dtype_promotion", "default_device": "jax_default_device",
           "output_gda": "jax_parallel_functions_output_gda"}


def _value(kind: str, value: Any) -> Any:
  import jax
  if kind == "default_device":
    return jax.devices()[value]
  if kind in ("set_mesh", "with_mesh"):
    return value.build()
  return value


def _option(kind: str) -> str:
  return _OPTION.get(kind) or f"jax_transfer_{kind}"


@contextlib.contextmanager
def _setting(kind: str, value: Any, scope: str):
  import jax

  import jax_sharding_ext as jse
  value = _value(kind, value)
  if scope == "global":
    name = _option(kind)
    before = getattr(jax.config, name) if kind != "guard" else None
    jax.config.update(name, value)
    try:
      yield
    finally:
      if kind == "guard":
        for option in ("jax_transfer_guard", *(f"jax_transfer_guard_{d}" for d in _DIRECTIONS)):
          jax.config.update(option, None)
      else:
        jax.config.update(name, before)
    return
  if kind.startswith("guard"):
    cm = getattr(jax, kind.replace("guard", "transfer_guard"))(value)
  elif kind == "x64":
    cm = jax.enable_x64(value)
  elif kind == "promotion":
    cm = jax.numpy_dtype_promotion(value)
  elif kind == "default_device":
    cm = jax.default_device(value)
  elif kind == "set_mesh":
    cm = jax.set_mesh(value)
  elif kind == "with_mesh":
    cm = value
  else:
    cm = jse.parallel_functions_output_gda(value)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # `with mesh:` is deprecated
    with cm:
      yield


@contextlib.contextmanager
def _settings(case: ThreadSettingsCase):
  with contextlib.ExitStack() as stack:
    for kind, value, scope in case.settings:
      stack.enter_context(_setting(kind, value, scope))
    yield


# ---------------------------------------------------------------------------
# Probing the thread that does the work.
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _probed(seen: list):
  """Record `read_settings()` wherever a read or write is handed to stock."""
  from jax.experimental.array_serialization import tensorstore_impl

  from jax_sharding_ext._jax import checkpoint as jax_checkpoint
  patched = [(tensorstore_impl, "async_serialize"), (jax_checkpoint, "async_serialize"),
             (jax_checkpoint, "async_deserialize")]
  originals = [getattr(m, n) for m, n in patched]

  def probe(fn):
    async def probed(*args, **kwargs):
      seen.append((threading.current_thread().name, read_settings()))
      return await fn(*args, **kwargs)
    return probed
  for (module, name), fn in zip(patched, originals, strict=True):
    setattr(module, name, probe(fn))
  try:
    yield
  finally:
    for (module, name), fn in zip(patched, originals, strict=True):
      setattr(module, name, fn)


# ---------------------------------------------------------------------------
# The calls.
# ---------------------------------------------------------------------------


def _host(case: ThreadSettingsCase):
  import jax.numpy as jnp
  import numpy as np
  return (np.arange(int(np.prod(case.shape)), dtype=np.float64).reshape(case.shape) * 1.25 + 1
          ).astype(jnp.dtype(case.dtype))


def _wide(dtype: str) -> bool:
  return dtype in ("float64", "int64")


def _gda(case: ThreadSettingsCase):
  import jax
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import GlobalDeviceArray
  host = _host(case)
  with jax.enable_x64(_wide(case.dtype)):
    return GlobalDeviceArray.from_callback(case.shape, case.mesh.build(), P(*case.spec),
                                           lambda i: host[i])


def _spec(path: str) -> dict:
  from jax_sharding_ext import serialization
  return serialization.get_tensorstore_spec(path)


def _call(case: ThreadSettingsCase, source: str, target: str, gda: Any):
  """`case.entry` as a function of no arguments (a coroutine function for the
  `async_` entries): returns what the entry returns (a save: None)."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import serialization
  mesh, axes = case.mesh.build(), P(*case.spec)

  def manager_serialize():
    manager = serialization.GlobalAsyncCheckpointManager()
    manager.serialize([gda], [_spec(target)], on_commit_callback=lambda: None)
    manager.wait_until_finished()

  async def async_serialize():
    await serialization.async_serialize(gda, _spec(target))

  async def async_deserialize():
    return await serialization.async_deserialize(mesh, axes, _spec(source))

  return {
      "run_serialization": lambda: serialization.run_serialization([gda], [_spec(target)]),
      "manager_serialize": manager_serialize,
      "async_serialize": async_serialize,
      "run_deserialization_mesh": lambda: serialization.run_deserialization(
          [mesh], [axes], [_spec(source)])[0],
      "run_deserialization_sharding": lambda: serialization.run_deserialization(
          [NamedSharding(mesh, axes)], [_spec(source)])[0],
      "manager_deserialize": lambda: serialization.GlobalAsyncCheckpointManager().deserialize(
          [NamedSharding(mesh, axes)], [_spec(source)])[0],
      "async_deserialize": async_deserialize,
  }[case.entry]


def _outcome(case: ThreadSettingsCase, out: Any, target: str) -> tuple:
  """What a call gave: the restored array's type, dtype and bytes, or (a
  save) the bytes that were written."""
  import jax
  import numpy as np

  from jax_sharding_ext import GlobalDeviceArray, serialization
  if case.entry.endswith("serialize") or case.entry == "run_serialization":
    try:
      with jax.enable_x64(_wide(case.dtype)):
        back = serialization.run_deserialization([case.mesh.build()], [()], [_spec(target)])[0]
    except Exception as e:  # nothing (complete) was written
      return ("saved nothing", type(e).__name__)
    return ("saved", str(back.dtype), np.asarray(back).tobytes())
  return ("restored", type(out).__name__, isinstance(out, GlobalDeviceArray), str(out.dtype),
          np.asarray(out).tobytes())


def _run(case: ThreadSettingsCase, source: str, target: str, in_loop: bool) -> tuple:
  """The call under the settings, inside a running event loop or not: (its
  outcome, the caller's settings, the settings seen where the work ran)."""
  gda = _gda(case)
  call = _call(case, source, target, gda)
  awaited = asyncio.iscoroutinefunction(call)
  seen: list = []
  caller: dict = {}

  async def cell():  # the settings are made inside the loop, as in a notebook cell
    with _settings(case):
      caller.update(read_settings())
      return await call() if awaited else call()

  def plain():
    with _settings(case):
      caller.update(read_settings())
      return asyncio.run(call()) if awaited else call()

  with _probed(seen):
    try:
      out = asyncio.run(cell()) if in_loop else plain()
    except Exception as e:  # the guard (or a setting) refused the call
      return ("raised", type(e).__name__), caller, seen
  return _outcome(case, out, target), caller, seen


def check_thread_settings(case: ThreadSettingsCase) -> tuple:
  """The model of the module docstring; returns the outcome."""
  from jax_sharding_ext import serialization
  with tempfile.TemporaryDirectory(prefix="jse-fuzz-") as tmp:
    source = f"{tmp}/source"
    serialization.run_serialization([_gda(case)], [_spec(source)])
    results = {}
    for in_loop in (True, False):
      outcome, caller, seen = _run(case, source, f"{tmp}/{'in' if in_loop else 'out'}", in_loop)
      for thread, settings in seen:
        wrong = {k: (v, caller[k]) for k, v in settings.items() if caller[k] != v}
        assert not wrong, (
            f"{case.entry} {'inside' if in_loop else 'outside'} an event loop: on thread "
            f"{thread!r} these settings differ from the caller's (there, caller): {wrong}")
      results[in_loop] = outcome
    assert results[True] == results[False], (
        f"{case.entry} ends otherwise inside an event loop than outside: "
        f"{_short(results[True])} vs {_short(results[False])}")
    return _short(results[False])


def _short(outcome: tuple) -> tuple:
  return tuple(x if not isinstance(x, bytes) else f"<{len(x)} bytes {hash(x)}>"
               for x in outcome)


@given(thread_settings_cases())
@budget(12)
def test_checkpoint_calls_run_under_the_callers_thread_settings(case):
  """Work on the package's threads sees every setting the caller made, and a
  call ends the same inside an event loop as outside one."""
  isolated("test_fuzz_thread_settings:check_thread_settings", case)


def test_every_setting_kind_is_read(devices):
  """The probe reads every kind the strategy draws (a new kind needs a reading)."""
  import jax
  mesh = MeshSpec((8,), ("x",), tuple(range(8)))
  base = read_settings()
  for kind, value in (("guard", "disallow"), ("guard_device_to_host", "log"), ("x64", True),
                      ("promotion", "strict"), ("default_device", 3), ("set_mesh", mesh),
                      ("with_mesh", mesh), ("output_gda", True)):
    with _setting(kind, value, "local"):
      changed = read_settings()
    assert changed != base, kind
  del jax
