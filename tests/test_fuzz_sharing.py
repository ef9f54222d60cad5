"""Fuzzer: arrays that share device buffers, called with donation.

A program (`strategies.SharingProgram`) makes fresh arrays, derives more
through every route that can share buffers (views, conversions, `device_put`
onto equal and equivalent shardings of other meshes, shard reassembly,
pickling, methods that return the array itself), then calls a function that
donates some of its arguments, through one call form (`jax.jit` with
`donate_argnums` / `donate_argnames`, legacy `pjit`, AOT `Compiled`,
`shard_map` inside), cold or after a first call with independent arrays of
the same kinds (on this thread or another one), and calls it again after.

The model: a call is refused (`RuntimeError` "Cannot donate", nothing run,
nothing deleted) exactly when a donated argument's device buffer is also
reachable from another argument and a GlobalDeviceArray is one of the two;
otherwise it does what the same call does on fresh `jax.Array` copies (the
same values, or the same kind of error), and a later call with a donated
input raises `RuntimeError`. Buffers are compared by address, the ground
truth. Two plain `jax.Array`s sharing a donated buffer with no GDA involved
are stock JAX's concern (stock crashes on them too), so such programs are
not run.

Every program runs in the suite's child process: a crash is a failure that
names the program.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
from _fuzz import budget, isolated
from hypothesis import given
from strategies import (
  CALL_FORMS,
  SHARING_ROUTES,
  WARMTH,
  MeshSpec,
  SharingProgram,
  sharing_programs,
)

pytestmark = pytest.mark.fuzz


# ---------------------------------------------------------------------------
# The child side: build the program's arrays, judge the call by the model.
# ---------------------------------------------------------------------------


def _equivalent_sharding(sharding):
  """The same placement on another `Mesh` object: its axes renamed."""
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  mesh = sharding.mesh
  names = tuple(f"{n}_2" for n in mesh.axis_names)
  rename = dict(zip(mesh.axis_names, names, strict=True))
  spec = [None if e is None else rename[e] if isinstance(e, str)
          else tuple(rename[a] for a in e) for e in sharding.spec]
  del jax
  return NamedSharding(Mesh(mesh.devices, names), PartitionSpec(*spec))


_PLUS_ZERO: list = []


def _plus_zero():
  if not _PLUS_ZERO:
    import jax
    _PLUS_ZERO.append(jax.jit(lambda a: a + 0))
  return _PLUS_ZERO[0]


def _route(route: str, v: Any, base) -> Any:
  """The value made from `v` by `route`. `base`: the program's NamedSharding,
  the placement of every value (stock may give a one-device result a
  `SingleDeviceSharding`)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding

  from jax_sharding_ext import GlobalDeviceArray as GDA
  if not isinstance(v.sharding, NamedSharding):
    v = jax.device_put(v, base)
  gda, s = isinstance(v, GDA), v.sharding
  if route == "to_jax_array":
    return v.to_jax_array() if gda else v
  if route == "from_jax_array":
    return GDA.from_jax_array(v)
  if route == "jnp_asarray":
    return jnp.asarray(v)
  if route == "device_put_same":
    return jax.device_put(v, s)
  if route == "device_put_equivalent":
    return jax.device_put(v, _equivalent_sharding(s))
  if route == "device_put":
    return jax.device_put(v)
  if route == "reshape_itself":
    return v.reshape(v.shape)
  if route == "astype_itself":
    return v.astype(v.dtype)
  if route == "pickle":
    return pickle.loads(pickle.dumps(v))
  if route == "copy":
    return jnp.copy(v)
  shards = [sh.data for sh in (v.local_shards if gda else v.addressable_shards)]
  if route == "gda_over_shards":
    return GDA(v.shape, s.mesh, s.spec, shards)
  if route == "stock_over_shards":
    return jax.make_array_from_single_device_arrays(v.shape, s, shards)
  if route == "callback_arrays":  # the shard of v at each index (some maybe on another device)
    def key(idx):
      return tuple(sl.indices(n) for sl, n in zip(idx, v.shape, strict=True))
    by_index = {key(sh.index): sh.data
                for sh in (v.local_shards if gda else v.addressable_shards)}
    return GDA.from_callback(v.shape, s.mesh, s.spec, lambda idx: by_index[key(idx)])
  if route == "batched_callback_arrays":
    return GDA.from_batched_callback(v.shape, s.mesh, s.spec, lambda indices: shards)
  if route == "callback_with_devices":
    return GDA.from_batched_callback_with_devices(v.shape, s.mesh, s.spec,
                                                  lambda entries: shards)
  raise ValueError(route)


def _build(p: SharingProgram, host) -> list:
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  import jax_sharding_ext as jse
  from jax_sharding_ext import GlobalDeviceArray as GDA
  mesh = p.mesh.build()
  sharding = NamedSharding(mesh, PartitionSpec(*p.spec))
  values: list = []
  for src in p.sources:
    # A copy per source: on CPU, arrays placed from one numpy array may keep
    # its memory, so independent sources would share buffer addresses.
    host = host.copy()
    if src == "gda":
      values.append(GDA.from_callback(host.shape, mesh, PartitionSpec(*p.spec),
                                      lambda idx, host=host: host[idx]))
    elif src == "array":
      values.append(jax.device_put(host, sharding))
    elif src == "jit_gda":  # an output of jit with the output flag on
      with jse.parallel_functions_output_gda(True):
        values.append(_plus_zero()(jax.device_put(host, sharding)))
    else:
      raise ValueError(src)
  for route, i in p.derived:
    values.append(_route(route, values[i], sharding))
  return values


def _args(call_args: tuple, leaf_values: list) -> tuple:
  """A call's arguments: each entry of `call_args` is a value or a small pytree."""
  it = iter(leaf_values)
  out = []
  for kind, *_ in call_args:
    if kind == "leaf":
      out.append(next(it))
    elif kind == "tuple":
      out.append((next(it), next(it)))
    else:
      out.append({"w": next(it)})
  return tuple(out)


def _leaf_indices(call_args: tuple) -> list[int]:
  return [i for _, *idx in call_args for i in idx]


def _addresses(leaf) -> frozenset:
  """Ground truth: (device id, buffer address) of each of the leaf's shards."""
  from jax_sharding_ext import GlobalDeviceArray as GDA
  from jax_sharding_ext._jax import buffers
  if isinstance(leaf, GDA):
    return buffers.addresses(leaf._arr, owned=True)
  return buffers.addresses(leaf, owned=False)


def _freed(leaf) -> bool:
  """Ground truth: a buffer of the leaf's was freed (by it, or by donating or
  deleting another array over that buffer): its own single-device arrays
  say so, each reading its buffer's state."""
  from jax_sharding_ext import GlobalDeviceArray as GDA
  from jax_sharding_ext._jax import buffers
  arr = leaf._arr if isinstance(leaf, GDA) else leaf
  return arr.is_deleted() or any(a.is_deleted() for a in buffers.single_device_arrays(arr))


def _check_deleted_as_freed(pool: list) -> None:
  """Every GDA still held says it is deleted exactly when a buffer of its was freed."""
  from jax_sharding_ext import GlobalDeviceArray as GDA
  for i, v in enumerate(pool):
    if isinstance(v, GDA) and v.is_deleted() != _freed(v):
      raise AssertionError(f"value {i}: is_deleted() is {v.is_deleted()}, but "
                           f"{'a buffer of it was' if _freed(v) else 'no buffer of it was'} "
                           "freed")


def _function(p: SharingProgram):
  """A fresh function of `p`'s form; every output can alias an input."""
  import jax
  from jax.sharding import PartitionSpec

  from jax_sharding_ext import pjit
  n = len(p.donate)
  donate = tuple(i for i, d in enumerate(p.donate) if d)

  def body(*args):
    return jax.tree.map(lambda v: v * 2 + 1, args)

  def named(a, b=None, c=None):
    return body(*(a, b, c)[:n])

  if p.form == "argnums":
    return jax.jit(body, donate_argnums=donate)
  if p.form == "argnames":
    return jax.jit(named, donate_argnames=tuple("abc"[i] for i in donate))
  if p.form == "pjit":
    return pjit(body, donate_argnums=donate)
  if p.form == "shard_map":
    mesh = p.mesh.build()
    spec = PartitionSpec(*p.spec)
    specs = (spec,) * n  # each a prefix of its argument's pytree
    inner = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs)
    return jax.jit(lambda *a: inner(*a), donate_argnums=donate)
  if p.form == "aot":
    return _AotOnFirstCall(jax.jit(body, donate_argnums=donate))
  raise ValueError(p.form)


class _AotOnFirstCall:
  """`jit(f).lower(args).compile()` at the first call, the `Compiled` after."""

  def __init__(self, jitted):
    self.jitted, self.compiled = jitted, None

  def __call__(self, *args):
    if self.compiled is None:
      self.compiled = self.jitted.lower(*args).compile()
    return self.compiled(*args)


def _call(f, args, on_thread: bool):
  if not on_thread:
    return f(*args)
  box: dict = {}

  def run():
    try:
      box["out"] = f(*args)
    except BaseException as e:  # handed to the caller
      box["err"] = e
  t = threading.Thread(target=run)
  t.start()
  t.join()
  if "err" in box:
    raise box["err"]
  return box["out"]


def _judge(leaves: list, donated_leaf: list) -> str:
  """What the model expects of a call: "deleted" (a donated GDA is passed),
  "alias" (a donated buffer is shared, a GDA one of the two), "stock" (only
  plain `jax.Array`s are at fault: stock's concern) or "run"."""
  from jax_sharding_ext import GlobalDeviceArray as GDA
  if any(_freed(leaf) for leaf in leaves):
    return ("deleted" if any(_freed(leaf) and isinstance(leaf, GDA) for leaf in leaves)
            else "stock")
  where = [_addresses(leaf) for leaf in leaves]
  alias = stock_only = False
  for i, d in enumerate(donated_leaf):
    for j in range(len(leaves)):
      if d and j != i and where[i] & where[j]:
        if isinstance(leaves[i], GDA) or isinstance(leaves[j], GDA):
          alias = True
        else:
          stock_only = True
  return "alias" if alias else "stock" if stock_only else "run"


def run_sharing_program(p: SharingProgram) -> list[str]:
  """Run `p` and check the model (see the module docstring) at every call;
  return each call's outcome."""
  import jax
  import numpy as np

  import jax_sharding_ext as jse
  from jax_sharding_ext import GlobalDeviceArray as GDA
  host = (np.arange(int(np.prod(p.shape)), dtype=p.dtype).reshape(p.shape) % 97)
  pool = _build(p, host)
  # Every route keeps the value. (Fetching it here would keep a host view of
  # the buffers on CPU, which stops XLA from reusing a donated one.)
  hosts = [host] * len(pool)
  if not p.keep:  # the values no call passes die now
    used = {i for call_args in p.calls for i in _leaf_indices(call_args)}
    pool = [v if i in used else None for i, v in enumerate(pool)]
  f, reference = _function(p), _function(p)
  if p.warm != "cold":  # a first call with independent arrays of the same kinds
    idx = _leaf_indices(p.calls[0])
    copies = [_build(p, host) for _ in idx]  # all alive, as in the real call
    try:
      _call(f, _args(p.calls[0], [c[i] for c, i in zip(copies, idx, strict=True)]),
            on_thread=p.warm == "warm_thread")
    except Exception:
      pass
    del copies
  outcomes = []
  for call_args in p.calls:
    idx = _leaf_indices(call_args)
    if max(idx) >= len(pool) or any(pool[i] is None for i in idx):
      break  # an output of a call that did not run
    leaves = [pool[i] for i in idx]
    if not any(isinstance(leaf, GDA) for leaf in leaves):
      break  # a call of plain jax.Arrays is stock's
    donated_leaf = [d for (_, *ix), d in zip(call_args, p.donate, strict=True) for _ in ix]
    verdict = _judge(leaves, donated_leaf)
    if verdict == "stock":
      break
    was_deleted = [leaf.is_deleted() for leaf in leaves]
    fresh = [jax.device_put(hosts[i], leaf.sharding) if leaf.committed
             else jax.device_put(hosts[i]) for i, leaf in zip(idx, leaves, strict=True)]
    for x, leaf in zip(fresh, leaves, strict=True):
      if _host_view_held(leaf, pool):  # fetched as the leaf's buffers were: on CPU,
        np.asarray(x)                  # JAX 0.11.x keeps a host view, and donates nothing
    try:
      expected = jax.tree.leaves(reference(*_args(call_args, fresh)))
      expected_error = None
    except Exception as e:
      expected, expected_error = None, type(e)
    try:
      with jse.parallel_functions_output_gda(p.output_gda):
        out = jax.tree.leaves(f(*_args(call_args, leaves)))
      error = None
    except Exception as e:
      out, error = None, e
    outcomes.append(verdict)
    if verdict in ("alias", "deleted"):
      want = "Cannot donate" if verdict == "alias" else "deleted"
      assert isinstance(error, RuntimeError) and want in str(error), (
          f"call {len(outcomes)}: expected the package's error ({want!r}), got {error!r}")
      for i, leaf, gone in zip(idx, leaves, was_deleted, strict=True):
        if not gone:
          assert not leaf.is_deleted(), "a refused call deleted an argument"
          np.testing.assert_array_equal(np.asarray(leaf), hosts[i])
      break  # its outputs do not exist
    if expected_error is not None:
      assert isinstance(error, expected_error), (
          f"call {len(outcomes)}: on fresh copies it raises {expected_error.__name__}; "
          f"here: {error!r}")
      break
    assert error is None, f"call {len(outcomes)} shares no donated buffer, but raised {error!r}"
    assert out is not None and expected is not None
    for o, e in zip(out, expected, strict=True):
      np.testing.assert_array_equal(np.asarray(o), np.asarray(e))
    deleted = [leaf.is_deleted() for leaf in leaves]
    assert deleted == [x.is_deleted() for x in fresh], (
        f"call {len(outcomes)}: deleted after the call: {deleted}; the fresh copies: "
        f"{[x.is_deleted() for x in fresh]}")
    _check_deleted_as_freed(pool)
    pool.extend(out)
    hosts.extend(np.asarray(e) for e in expected)
  return outcomes


def _host_view_held(leaf, pool) -> bool:
  """Whether an array over one of `leaf`'s buffers holds its fetched value."""
  from jax_sharding_ext import GlobalDeviceArray as GDA
  mine = _addresses(leaf) or frozenset()
  for x in pool:
    arr = x._arr if isinstance(x, GDA) else x
    if (arr is not None and not arr.is_deleted()
        and getattr(arr, "_npy_value", None) is not None and mine & (_addresses(x) or set())):
      return True
  return False


@given(sharing_programs())
@budget(60)
def test_donation_is_refused_exactly_when_a_donated_buffer_is_shared(program):
  """Refused exactly when a donated buffer is reachable from another argument
  (a GDA one of the two) or already donated; otherwise the result of fresh
  copies."""
  isolated("test_fuzz_sharing:run_sharing_program", program)


# ---------------------------------------------------------------------------
# The sweep: every route, every warmth, each call form in turn.
# ---------------------------------------------------------------------------
# Random programs reach a given route, warmth and pairing about once in a
# hundred, so a short budget can miss a defect on one route. The sweep runs
# the same model on the smallest program of each: a GDA and one value made
# from it (or from its `to_jax_array()`, then passed on), called together
# with the GDA donated, cold and warm, on 2 devices.

_CHAINS = ([(route,) for route in sorted(SHARING_ROUTES)]
           + [("to_jax_array", route) for route in sorted(SHARING_ROUTES)
              if SHARING_ROUTES[route][1] == "array" and route != "to_jax_array"])


def _sweep() -> list:
  cases = []
  for n, (chain, warm) in enumerate((c, w) for c in _CHAINS for w in WARMTH):
    form = CALL_FORMS[n % len(CALL_FORMS)]
    program = SharingProgram(
        mesh=MeshSpec((2,), ("x",), (0, 1)), spec=("x",), shape=(4,), dtype="float32",
        sources=("gda",), derived=tuple((route, i) for i, route in enumerate(chain)),
        calls=((("leaf", 0), ("leaf", len(chain))),), donate=(True, False), form=form,
        warm=warm)
    cases.append(pytest.param(program, id=f"{'+'.join(chain)}-{warm}-{form}"))
  return cases


@pytest.mark.parametrize("program", _sweep())
def test_each_route_and_warmth_donating_the_gda_next_to_what_it_made(program):
  """The model of the fuzzer above, on each route's smallest program."""
  isolated("test_fuzz_sharing:run_sharing_program", program)


# A callback route over a replicated layout adopts one buffer of the GDA (the
# last device's copy is every index's value), so donating what it made frees
# that one buffer under the GDA, which must then say it is deleted.
_ONE_BUFFER = [
    SharingProgram(mesh=MeshSpec((2,), ("x",), (0, 1)), spec=(), shape=(4,), dtype="float32",
                   sources=("gda",), derived=((route, 0),), calls=((("leaf", 1),), *then),
                   donate=(True,), form="argnums", warm="cold")
    for route in ("callback_arrays", "batched_callback_arrays", "callback_with_devices")
    # then the GDA itself: a warm call (jit's C++ cache has the entry of the first) that
    # must see the freed buffer
    for then in ((), ((("leaf", 0),),))]


@pytest.mark.parametrize("program", _ONE_BUFFER,
                         ids=[f"{p.derived[0][0]}-{len(p.calls)}-calls" for p in _ONE_BUFFER])
def test_a_gda_says_it_is_deleted_when_one_of_its_buffers_was_donated_elsewhere(program):
  """The model above on programs that free one of the GDA's buffers, not its first."""
  isolated("test_fuzz_sharing:run_sharing_program", program)
