"""GDAs over buffers that other arrays hold too, and GDAs used from many threads.

A GDA built over arrays the caller hands in (the constructor's
`device_buffers`, a data callback returning arrays already on their devices,
`from_batched_callback_with_devices`) shares their buffers: with the
caller's single-device arrays and with whatever array those are shards of.
So does the `jax.Array` stock's `jax.device_put` makes of a GDA for an
equivalent sharding on another `Mesh` object (no copy), and `jnp.asarray`'s.
One call that donates one of them and passes the other crashes stock jaxlib
on several devices (SIGSEGV), so each case runs in a subprocess; the package
must refuse it with its clear error, cold and warm.
"""

import subprocess
import sys
import textwrap
import threading

import _isolated
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import test_util as jtu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray

XY = P("x", "y")

_PROGRAM = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from jax_sharding_ext import GlobalDeviceArray as GDA

    how, donate, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "warm"
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    mk = lambda: GDA.from_callback((8, 8), mesh, P("x", "y"), lambda i: data[i])

    def adopt(g):
      shards = g.local_shards
      if how == "constructor":
        return GDA(g.shape, g.mesh, g.mesh_axes, [s.data for s in shards])
      if how == "device_buffers":
        return GDA(g.shape, g.mesh, g.mesh_axes, g._device_buffers)
      if how == "from_callback":
        by_index = {str(s.index): s.data for s in shards}
        return GDA.from_callback(g.shape, mesh, P("x", "y"), lambda i: by_index[str(i)])
      if how == "from_batched_callback":
        return GDA.from_batched_callback(g.shape, mesh, P("x", "y"),
                                         lambda idx: [s.data for s in shards])
      if how == "with_devices":
        return GDA.from_batched_callback_with_devices(
            g.shape, mesh, P("x", "y"), lambda entries: [s.data for s in shards])
      if how == "jax_array":  # a stock array over the GDA's shards
        return jax.make_array_from_single_device_arrays(
            g.shape, g.sharding, [s.data for s in shards])
      if how == "device_put_equivalent":  # stock reuses the buffers for an equivalent sharding
        other = Mesh(np.array(jax.devices()).reshape(4, 2, 1), ("x", "y", "z"))
        return jax.device_put(g, jax.sharding.NamedSharding(other, P("x", "y")))
      if how == "device_put_renamed":
        other = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
        return jax.device_put(g, jax.sharding.NamedSharding(other, P("a", "b")))
      if how == "jnp_asarray":
        return jax.numpy.asarray(g)
      if how == "built_twice":  # two GDAs over the same single-device arrays
        bufs = [jax.device_put(data[s.index], s.device) for s in shards]
        first = GDA(g.shape, g.mesh, g.mesh_axes, bufs)
        return first, GDA(g.shape, g.mesh, g.mesh_axes, bufs)
      raise ValueError(how)

    def aliasing_pair():
      g = mk()
      pair = adopt(g)
      return pair if isinstance(pair, tuple) else (g, pair)

    f = jax.jit(lambda a, b: (a + 1, b * 2), donate_argnums=donate)
    if warm:  # later calls with these signatures skip Python
      for _ in range(3):
        f(mk(), mk())
        f(aliasing_pair()[0], aliasing_pair()[1])  # the same kinds, no alias
    a, b = aliasing_pair()
    try:
      jax.block_until_ready(f(a, b))
      print("RAN")
    except RuntimeError as e:
      assert "Cannot donate" in str(e) and "views of the same device buffers" in str(e), e
      assert not a.is_deleted() and not b.is_deleted()
      np.testing.assert_array_equal(np.asarray(a), data)
      np.testing.assert_array_equal(np.asarray(b), data)
      print("REFUSED")
""")

ADOPTIONS = ["constructor", "device_buffers", "from_callback", "from_batched_callback",
             "with_devices", "jax_array", "built_twice", "device_put_equivalent",
             "device_put_renamed", "jnp_asarray"]


@pytest.mark.parametrize("warm", ["cold", "warm"])
@pytest.mark.parametrize("donate", [0, 1])
@pytest.mark.parametrize("how", ADOPTIONS)
def test_donating_next_to_an_array_over_the_same_buffers_never_crashes(how, donate, warm):
  """Stock jaxlib on 8 devices segfaults for these calls (for two plain
  `jax.Array`s too); with a GDA among them the call is refused before
  anything runs, whichever of the two is donated."""
  proc = subprocess.run([sys.executable, "-c", _PROGRAM, how, str(donate), warm],
                        capture_output=True, text=True, timeout=180)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == "REFUSED"


def warm_call_next_to_an_equivalent_placement(form: str) -> str:
  """Child side: a donating jit's cache is filled by a call with a shared GDA
  and an unrelated array of an equivalent sharding (another `Mesh` over the
  same devices), then called with a GDA and stock's array over its buffers.
  Returns "refused" or "ran"."""
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  other = NamedSharding(Mesh(mesh.devices, ("p", "q")), P("p", "q"))
  data = np.arange(16, dtype=np.float32).reshape(8, 2)

  def mk():
    return GlobalDeviceArray.from_callback((8, 2), mesh, XY, lambda i: data[i])

  if form == "argnames":
    f = jax.jit(lambda a, b: a + b, donate_argnames="a")
  elif form == "aot":
    f = jax.jit(lambda a, b: a + b, donate_argnums=0)
  else:
    f = jax.jit(lambda a, b: a + b, donate_argnums=0)
  first, view = mk(), None
  view = first.to_jax_array()  # a shared GDA: its buffers are held elsewhere
  unrelated = jax.device_put(np.ones((8, 2), np.float32), other)
  if form == "aot":
    f = f.lower(first, unrelated).compile()
  if form == "thread":
    t = threading.Thread(target=lambda: f(first, unrelated).block_until_ready())
    t.start()
    t.join()
  else:
    f(first, unrelated).block_until_ready()
  del view
  g = mk()
  y = jax.device_put(g, other)  # stock's array over g's very buffers
  try:
    f(g, y)
  except RuntimeError as e:
    assert "Cannot donate" in str(e), e
    assert not g.is_deleted() and not y.is_deleted()
    return "refused"
  return "ran"


@pytest.mark.parametrize("form", ["argnums", "argnames", "aot", "thread"])
def test_a_warm_call_is_judged_as_a_cold_one_for_equivalent_shardings(form):
  """An equivalent sharding is the same placement: the cache entry a call
  with arrays of an equivalent sharding filled does not let a GDA be donated
  next to stock's array over its buffers (that crashed jaxlib on 8 devices)."""
  assert _isolated.run("test_shared_buffers:warm_call_next_to_an_equivalent_placement",
                       form) == "refused"


def gda_next_to_stock_array_from_its_view(warm: str) -> str:
  """Child side: `f(donate(g), jax.device_put(g.to_jax_array(), <equivalent>))`,
  cold or warm, the view dropped or kept. Returns "refused" or "ran"."""
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  other = NamedSharding(Mesh(mesh.devices, ("p", "q")), P("p", "q"))
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  f = jax.jit(lambda a, b: a + b, donate_argnums=0)
  if warm == "warm":
    a = GlobalDeviceArray.from_callback((8, 2), mesh, XY, lambda i: data[i])
    f(a, jax.device_put(np.ones((8, 2), np.float32), other)).block_until_ready()
  g = GlobalDeviceArray.from_callback((8, 2), mesh, XY, lambda i: data[i])
  view = g.to_jax_array()
  y = jax.device_put(view, other)  # stock only: the package never sees this array
  if warm != "view kept":
    del view
  try:
    f(g, y)
  except RuntimeError as e:
    assert "Cannot donate" in str(e), e
    return "refused"
  return "ran"


@pytest.mark.parametrize("warm", ["cold", "warm", "view kept"])
def test_a_gda_is_refused_next_to_a_stock_array_made_from_its_view(warm):
  """Once a GDA has handed out a `jax.Array` over its buffers, stock can make
  more arrays over them unseen; donating the GDA next to one is refused."""
  assert _isolated.run("test_shared_buffers:gda_next_to_stock_array_from_its_view",
                       warm) == "refused"


def use_after_a_sharer_is_gone(case: str) -> str:
  """Child side: GDA `h` holds one buffer of GDA `g` (a callback returned it
  for both devices of a replicated spec); one of them is donated or deleted,
  then the other is used, warm. Returns what `is_deleted()` said and how the
  use ended."""
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  data = np.arange(4, dtype=np.float32)
  f = jax.jit(lambda a: a * 2 + 1, donate_argnums=0)
  g = GlobalDeviceArray.from_callback((4,), mesh, P(), lambda i: data[i])
  f(GlobalDeviceArray.from_callback((4,), mesh, P(), lambda i: data[i]))  # warm
  last = g.local_shards[1].data
  h = GlobalDeviceArray.from_callback((4,), mesh, P(), lambda i: last)
  gone, used = (h, g) if case.startswith("h") else (g, h)
  if case.endswith("used before"):  # its buffers were already looked at by jit's dispatch
    jax.block_until_ready(jax.jit(lambda a: a + 0)(used))
  if "donated" in case:
    f(gone)
  else:
    gone.delete()
  deleted = used.is_deleted()
  try:
    f(used)
  except RuntimeError as e:
    assert "deleted" in str(e), e
    return f"is_deleted={deleted}, refused"
  return f"is_deleted={deleted}, ran"


@pytest.mark.parametrize("case", ["h donated", "h deleted", "g donated", "g deleted",
                                  "h donated, used before", "g deleted, used before"])
def test_a_gda_whose_buffer_another_array_freed_is_deleted(case):
  """Donating or deleting an array frees its buffers under every array over
  them: a GDA with one of them says it is deleted and refuses to be used
  (stock jaxlib crashes on such an array on several devices)."""
  assert _isolated.run("test_shared_buffers:use_after_a_sharer_is_gone",
                       case) == "is_deleted=True, refused"


def _gda(mesh, data=None):
  data = np.arange(64, dtype=np.float32).reshape(8, 8) if data is None else data
  return GlobalDeviceArray.from_callback(data.shape, mesh, XY, lambda i: data[i]), data


def _ptrs(x):
  return sorted(s.data.unsafe_buffer_pointer() for s in x.addressable_shards)


def test_a_gda_over_handed_in_buffers_donates_like_a_jax_array(mesh_2d):
  """Alone in a call, such a GDA is donated as stock donates the same
  `jax.Array`: its buffers are reused and it is deleted, warm too."""
  f = jax.jit(lambda a, b: a + b, donate_argnums=0)
  for _ in range(3):
    src, data = _gda(mesh_2d)
    g = GlobalDeviceArray(src.shape, mesh_2d, XY, [jnp.copy(s.data) for s in src.local_shards])
    other = jnp.ones((8, 8), jnp.float32)
    ptrs = _ptrs(g)
    out = f(g, other)
    assert g.is_deleted()
    assert _ptrs(out) == ptrs
    np.testing.assert_array_equal(np.asarray(out), data + 1)


def test_adoption_without_a_copy_is_kept(mesh_2d):
  """The constructor and the callbacks adopt device arrays zero-copy, as in
  the GDA era and as stock `make_array_from_callback` does."""
  g, _ = _gda(mesh_2d)
  shards = g.local_shards
  by_index = {str(s.index): s.data for s in shards}
  built = [
      GlobalDeviceArray(g.shape, mesh_2d, XY, [s.data for s in shards]),
      GlobalDeviceArray.from_callback(g.shape, mesh_2d, XY, lambda i: by_index[str(i)]),
  ]
  for b in built:
    assert _ptrs(b) == _ptrs(g)


def test_donating_a_gda_that_cannot_alias_the_others_keeps_the_fast_path(mesh_2d):
  """A GDA over handed-in buffers only leaves jit's C++ fast path for calls
  that donate an argument with a buffer of its dtype and shard shape."""
  from jax_sharding_ext._jax import dispatch as jax_dispatch
  src, _ = _gda(mesh_2d)
  batch = GlobalDeviceArray(src.shape, mesh_2d, XY, [s.data for s in src.local_shards])
  f = jax.jit(lambda p, b: p + b.sum(), donate_argnums=0)
  params = jax.device_put(jnp.zeros((16,), jnp.int32), NamedSharding(mesh_2d, P("x")))
  for _ in range(3):
    params = f(params, batch)
  (_, key) = jax_dispatch.view_flatten(batch)
  assert key is jax_dispatch.KEYED  # its buffers may appear elsewhere in a call
  before = f._cache_size()
  with jtu.count_pjit_cpp_cache_miss() as misses:
    params = f(params, batch)
  assert misses() == 0 and f._cache_size() == before  # the fast path, no new entry
  np.testing.assert_array_equal(np.asarray(params), 4 * np.asarray(batch).sum())


# ---------------------------------------------------------------------------
# Threads. jaxlib builds an array's single-device arrays on first use, and not
# safely across threads: stock `addressable_shards` of a fresh `jax.Array`
# from 4 threads at once can corrupt the array for good. A GDA's conversions
# and shard access never fail and never corrupt it.
# ---------------------------------------------------------------------------

USES = {
    "to_jax_array": lambda g: g.to_jax_array(),
    "local_shards": lambda g: g.local_shards,
    "addressable_shards": lambda g: g.addressable_shards,
    "global_shards": lambda g: g.global_shards,
    "local_data": lambda g: g.local_data(3),
    "_device_buffers": lambda g: g._device_buffers,
    "np.asarray": np.asarray,
    "copy_to_host_async": lambda g: g.copy_to_host_async(),
    "iteration": lambda g: list(g),
    "item of a row": lambda g: g[1].tolist(),
    "on_device_size_in_bytes": lambda g: g.on_device_size_in_bytes(),
    "from_jax_array": lambda g: GlobalDeviceArray.from_jax_array(g.to_jax_array()),
}


@pytest.fixture
def fast_switching():
  old = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  yield
  sys.setswitchinterval(old)


@pytest.mark.parametrize("use", list(USES))
def test_many_threads_never_corrupt_a_gda(mesh_2d, use, fast_switching):
  fn = USES[use]
  errors = []
  data = np.arange(64, dtype=np.float32).reshape(8, 8)
  for _ in range(40):
    g, _ = _gda(mesh_2d, data)
    start = threading.Barrier(4)

    def work(g=g, start=start):
      start.wait()
      try:
        for _ in range(2):
          fn(g)
      except Exception as e:  # any failure fails the test below
        errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert errors == []
    np.testing.assert_array_equal(np.asarray(g), data)
    np.testing.assert_array_equal(np.asarray(g.to_jax_array()), data)
    assert sorted(s.device.id for s in g.local_shards) == list(range(8))


def test_reading_shards_while_another_thread_deletes(mesh_2d, fast_switching):
  """A reader racing `delete()` gets the shards (read before the delete) or
  the GDA's deleted error; never a KeyError or a TypeError from half-read
  state, nor a crash (jaxlib frees the per-shard cache as it deletes).
  Stock's array answers with its shards here."""
  outcomes = set()
  for _ in range(300):
    g, _ = _gda(mesh_2d)
    start = threading.Barrier(2)

    def read(g=g, start=start):
      start.wait()
      try:
        outcomes.add(len(g.local_shards))
      except RuntimeError as e:
        outcomes.add("deleted" if "has been deleted" in str(e) else repr(e))
      except Exception as e:  # any other failure fails the test below
        outcomes.add(repr(e))

    def delete(g=g, start=start):
      start.wait()
      g.delete()

    threads = [threading.Thread(target=delete), threading.Thread(target=read)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  assert outcomes <= {8, "deleted"}, outcomes


_SIBLINGS_PROGRAM = textwrap.dedent("""
    import os, sys, threading
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    sys.setswitchinterval(1e-6)
    import jax, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from jax_sharding_ext import GlobalDeviceArray as GDA

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    f = jax.jit(lambda a, b: a + b, donate_argnums=0)
    refused = 0
    for _ in range(30):
      g = GDA.from_callback((8, 8), mesh, P("x", "y"), lambda i: data[i])
      views, start = [], threading.Barrier(4)
      def work():
        start.wait()
        views.append(g.to_jax_array())
        views.append(GDA.from_jax_array(g.to_jax_array()).to_jax_array())
      threads = [threading.Thread(target=work) for _ in range(4)]
      [t.start() for t in threads]
      [t.join() for t in threads]
      for v in views:
        try:
          f(g, v)
        except RuntimeError as e:
          assert "Cannot donate" in str(e), e
          refused += 1
      assert not g.is_deleted()
    print("REFUSED", refused)
""")


def test_views_made_in_many_threads_are_all_known():
  """Views of one GDA made by several threads at once all join its family:
  donating the GDA next to any of them is refused (a lost one would crash
  stock jaxlib on 8 devices)."""
  proc = subprocess.run([sys.executable, "-c", _SIBLINGS_PROGRAM], capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == f"REFUSED {30 * 8}"
