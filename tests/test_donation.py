"""Buffer donation of GlobalDeviceArrays (`donate_argnums`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import (
  FROM_GDA,
  GlobalDeviceArray,
  donation_vector,
  parallel_functions_output_gda,
  pjit,
  rebase_donate_argnums,
)

NOT_USABLE = "Some donated buffers were not usable"


XY = P("x", "y")


def _gda(mesh, spec=XY, shape=(8, 8)):
  data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def _ptrs(arr):
  """{device: buffer address} of every addressable shard."""
  return {s.device: s.data.unsafe_buffer_pointer() for s in arr.addressable_shards}


# ---------------------------------------------------------------------------
# Donation works exactly as for a jax.Array.
# ---------------------------------------------------------------------------


def _computed(mesh, spec):
  """An (8, 8) array produced on device (buffers owned by the runtime)."""
  make = jax.jit(lambda: jnp.arange(64, dtype=jnp.float32).reshape(8, 8),
                 out_shardings=NamedSharding(mesh, spec))
  return make()


@pytest.mark.parametrize("spec", [P("x", "y"), P("x"), P(), P(None, ("x", "y"))], ids=str)
def test_donated_gda_buffers_are_reused_like_a_jax_array(mesh_2d, spec):
  gda = GlobalDeviceArray.from_jax_array(_computed(mesh_2d, spec))
  arr = _computed(mesh_2d, spec)
  f = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)

  gda_in, arr_in = _ptrs(gda), _ptrs(arr)
  gda_out, arr_out = f(gda), f(arr)

  # Stock behaviour for jax.Array on CPU: the output lives in the input's memory.
  assert _ptrs(arr_out) == arr_in
  assert _ptrs(gda_out) == gda_in
  assert gda.is_deleted() and arr.is_deleted()
  np.testing.assert_array_equal(np.asarray(gda_out), np.arange(64).reshape(8, 8) * 2 + 1)


@pytest.mark.parametrize("spec", [P("x", "y"), P("x"), P()], ids=str)
def test_donating_a_from_callback_gda_matches_a_device_put_array(mesh_2d, spec):
  # Host data placed on devices may be aliased by XLA or not (replicated
  # shards can share host-backed memory); whatever stock JAX does for the same
  # placement of a jax.Array, a GDA does too.
  gda, data = _gda(mesh_2d, spec)
  arr = jax.device_put(data, NamedSharding(mesh_2d, spec))
  f = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)
  gda_in, arr_in = _ptrs(gda), _ptrs(arr)
  gda_out, arr_out = f(gda), f(arr)
  assert gda.is_deleted() and arr.is_deleted()
  if spec == P("x", "y"):  # every shard distinct: always reused
    assert _ptrs(gda_out) == gda_in and _ptrs(arr_out) == arr_in
  np.testing.assert_array_equal(np.asarray(gda_out), np.asarray(arr_out))


def test_donate_argnames(mesh_2d):
  a, data = _gda(mesh_2d)
  b, _ = _gda(mesh_2d)
  b_in = _ptrs(b)
  out = jax.jit(lambda a, b: a + b, donate_argnames="b")(a=a, b=b)
  assert b.is_deleted() and not a.is_deleted()
  assert _ptrs(out) == b_in
  np.testing.assert_array_equal(np.asarray(out), 2 * data)


def test_donated_gdas_inside_a_pytree(mesh_2d):
  w, data = _gda(mesh_2d)
  b, _ = _gda(mesh_2d)
  keep, _ = _gda(mesh_2d)
  w_in, b_in = _ptrs(w), _ptrs(b)
  f = jax.jit(lambda state, k: {"w": state["w"] - 1, "b": state["b"] + k},
              donate_argnums=0)
  out = f({"w": w, "b": b}, keep)
  assert w.is_deleted() and b.is_deleted() and not keep.is_deleted()
  assert _ptrs(out["w"]) == w_in and _ptrs(out["b"]) == b_in
  np.testing.assert_array_equal(np.asarray(out["b"]), 2 * data)


def test_without_donation_nothing_is_deleted(mesh_2d):
  gda, data = _gda(mesh_2d)
  out = jax.jit(lambda x: x * 2)(gda)
  assert not gda.is_deleted()
  assert not set(_ptrs(out).values()) & set(_ptrs(gda).values())
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_unusable_donation_warns_and_keeps_the_input_like_stock(mesh_2d):
  gda, data = _gda(mesh_2d)
  arr = jax.device_put(data, NamedSharding(mesh_2d, P("x", "y")))
  # With explicit output shardings JAX itself decides the aliasing and warns;
  # without them (multi-device) XLA decides silently.
  scalar = NamedSharding(mesh_2d, P())
  with pytest.warns(UserWarning, match=NOT_USABLE):
    out_gda = jax.jit(lambda x: x.sum(), donate_argnums=0, out_shardings=scalar)(gda)
  with pytest.warns(UserWarning, match=NOT_USABLE):
    jax.jit(lambda x: x.sum(), donate_argnums=0, out_shardings=scalar)(arr)
  # XLA could not alias the buffer, so nothing was donated: same as jax.Array.
  assert gda.is_deleted() == arr.is_deleted()
  assert float(out_gda) == data.sum()


def test_repeated_donated_steps_with_gda_outputs(mesh_2d):
  gda, data = _gda(mesh_2d)
  step = jax.jit(lambda x: x + 1, donate_argnums=0)
  ptrs = _ptrs(gda)
  with parallel_functions_output_gda(True):
    x = gda
    for _ in range(4):
      prev, x = x, step(x)
      assert type(x) is GlobalDeviceArray
      assert prev.is_deleted() and _ptrs(x) == ptrs
  np.testing.assert_array_equal(np.asarray(x), data + 4)


def test_pjit_donate_argnums(mesh_2d):
  gda, data = _gda(mesh_2d)
  other, _ = _gda(mesh_2d)
  ptrs = _ptrs(gda)
  f = pjit(lambda x, y: x * y, in_axis_resources=FROM_GDA, donate_argnums=0)
  out = f(gda, other)
  assert gda.is_deleted() and not other.is_deleted()
  assert _ptrs(out) == ptrs
  np.testing.assert_array_equal(np.asarray(out), data * data)


# ---------------------------------------------------------------------------
# Every use after donation raises a RuntimeError saying so.
# ---------------------------------------------------------------------------

USES = {
    "local_data": lambda g: g.local_data(0),
    "addressable_data": lambda g: g.addressable_data(-1),
    "local_shards": lambda g: g.local_shards,
    "global_shards": lambda g: g.global_shards,
    "np.asarray": np.asarray,
    "to_jax_array": lambda g: g.to_jax_array(),
    "jit argument": lambda g: jax.jit(lambda x: x + 1)(g),
    "donated again": lambda g: jax.jit(lambda x: x + 1, donate_argnums=0)(g),
    "jnp function": jnp.sin,
    "block_until_ready": lambda g: g.block_until_ready(),
    "jax.device_get": jax.device_get,
    "jax.device_put": lambda g: jax.device_put(g, g.sharding),
}


@pytest.mark.parametrize("use", list(USES), ids=list(USES))
def test_use_after_donation_raises(mesh_2d, use):
  gda, _ = _gda(mesh_2d)
  jax.jit(lambda x: x * 2, donate_argnums=0)(gda)
  assert gda.is_deleted()
  with pytest.raises(RuntimeError, match="deleted or donated") as e:
    USES[use](gda)
  assert "GlobalDeviceArray" in str(e.value)
  # Metadata stays readable, as for a deleted jax.Array.
  assert gda.shape == (8, 8) and gda.dtype == np.float32
  assert "GlobalDeviceArray(shape=(8, 8)" in repr(gda)


ABSTRACT_USES = {
    "jax.eval_shape": lambda x: jax.eval_shape(lambda v: v * 2, x),
    "jax.make_jaxpr": lambda x: str(jax.make_jaxpr(lambda v: v * 2)(x)),
    "jit(...).lower": lambda x: jax.jit(lambda v: v * 2).lower(x).as_text(),
    "jax.typeof": jax.typeof,
    "committed": lambda x: x.committed,
    "itemsize": lambda x: x.itemsize,
}


@pytest.mark.parametrize("use", list(ABSTRACT_USES), ids=list(ABSTRACT_USES))
def test_abstract_uses_of_a_donated_gda_work_as_for_a_jax_array(mesh_2d, use):
  """What needs only the shape, dtype and sharding works on a donated
  `jax.Array` (stock reads its aval without a buffer), and so on a donated
  GDA, with the same answer."""
  gda, _ = _gda(mesh_2d)
  arr = jax.device_put(np.zeros((8, 8), np.float32), gda.sharding)
  step = jax.jit(lambda x: x * 2, donate_argnums=0)
  step(gda), step(arr)
  assert gda.is_deleted() and arr.is_deleted()
  assert ABSTRACT_USES[use](gda) == ABSTRACT_USES[use](arr)


def test_use_after_delete_raises(mesh_2d):
  gda, _ = _gda(mesh_2d)
  gda.delete()
  with pytest.raises(RuntimeError, match="deleted or donated"):
    jax.jit(lambda x: x + 1, donate_argnums=0)(gda)
  with pytest.raises(RuntimeError, match="deleted or donated"):
    np.asarray(gda)


def test_shards_read_before_donation_are_invalidated(mesh_2d):
  gda, _ = _gda(mesh_2d)
  shards = gda.local_shards
  jax.jit(lambda x: x * 2, donate_argnums=0)(gda)
  assert all(s.data.is_deleted() for s in shards)
  with pytest.raises(RuntimeError, match="deleted"):
    np.asarray(shards[0].data)


# ---------------------------------------------------------------------------
# Donating an array that the same call also reads: RuntimeError, nothing runs.
# ---------------------------------------------------------------------------


def _same_twice(x):
  return (x, x)


DUPLICATES = {
    # name: (make the call's arguments from x, the jitted function)
    "both donated": (_same_twice, jax.jit(lambda a, b: (a + b, a - b),
                                          donate_argnums=(0, 1))),
    "one donated": (_same_twice, jax.jit(lambda a, b: a + b, donate_argnums=0)),
    "second donated": (_same_twice, jax.jit(lambda a, b: a + b, donate_argnums=1)),
    "inside one pytree": (lambda x: ((x, x),),
                          jax.jit(lambda t: (t[0] + 1, t[1] + 1), donate_argnums=0)),
    "gda and its jax.Array": (lambda x: (x, x.to_jax_array()),
                              jax.jit(lambda a, b: a + b, donate_argnums=0)),
    "two views of one array": (
        lambda x: (GlobalDeviceArray.from_jax_array(x.to_jax_array()), x),
        jax.jit(lambda a, b: a * b, donate_argnums=1)),
}


@pytest.mark.parametrize("case", list(DUPLICATES), ids=list(DUPLICATES))
def test_donating_an_array_twice_in_one_call_raises_before_running(mesh_2d, case):
  make_args, f = DUPLICATES[case]
  gda, data = _gda(mesh_2d)
  ptrs = _ptrs(gda)
  with pytest.raises(RuntimeError, match="Cannot donate") as e:
    f(*make_args(gda))
  msg = str(e.value)
  assert "only once per call" in msg and "jnp.copy" in msg
  assert "Nothing was executed or donated" in msg
  # Nothing was donated: the GDA is intact, in the same buffers.
  assert not gda.is_deleted()
  assert _ptrs(gda) == ptrs
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_duplicate_donation_names_the_arguments(mesh_2d):
  gda, _ = _gda(mesh_2d)
  f = jax.jit(lambda params, batch: params + batch, donate_argnames="params")
  with pytest.raises(RuntimeError, match="Cannot donate `params`.*as `batch`"):
    f(params=gda, batch=gda)


def test_duplicate_donation_never_runs_the_computation(mesh_2d):
  gda, _ = _gda(mesh_2d)
  ran = []

  def body(a, b):
    jax.debug.callback(lambda: ran.append(1))
    return a + b

  with pytest.raises(RuntimeError, match="Cannot donate"):
    jax.jit(body, donate_argnums=0)(gda, gda)
  jax.effects_barrier()
  assert ran == []
  out = jax.jit(body, donate_argnums=0)(gda, jnp.copy(gda))  # the documented fix
  jax.effects_barrier()
  assert ran == [1] and gda.is_deleted() and out.shape == (8, 8)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_duplicate_donation_through_aot_compiled_and_pjit(mesh_2d, warm):
  gda, data = _gda(mesh_2d)
  f = jax.jit(lambda a, b: a + b, donate_argnums=0)
  compiled = f.lower(gda, gda).compile()
  g = pjit(lambda a, b: a + b, in_axis_resources=FROM_GDA, donate_argnums=0)
  for _ in range(3 if warm else 0):
    compiled(_gda(mesh_2d)[0], _gda(mesh_2d)[0])
    g(_gda(mesh_2d)[0], _gda(mesh_2d)[0])
  with pytest.raises(RuntimeError, match="Cannot donate"):
    compiled(gda, gda)
  with pytest.raises(RuntimeError, match="Cannot donate"):
    g(gda, gda)
  assert not gda.is_deleted()
  np.testing.assert_array_equal(np.asarray(compiled(gda, jnp.copy(gda))), 2 * data)
  assert gda.is_deleted()


# The same on jit's warm C++ fast path, where no Python shard handler runs.

WARM_DUPLICATES = list(DUPLICATES)


def _fresh_like(args, mesh):
  def fresh(leaf):
    g, _ = _gda(mesh)
    return g if isinstance(leaf, GlobalDeviceArray) else g.to_jax_array()
  return jax.tree.map(fresh, args)


@pytest.mark.parametrize("case", WARM_DUPLICATES, ids=WARM_DUPLICATES)
def test_donating_twice_on_the_warm_fast_path_raises(mesh_2d, case):
  make_args, f = DUPLICATES[case]
  gda, data = _gda(mesh_2d)
  for _ in range(3):  # warm: later calls with this signature skip Python
    f(*_fresh_like(make_args(gda), mesh_2d))
  with pytest.raises(RuntimeError, match="Cannot donate"):
    f(*make_args(gda))
  assert not gda.is_deleted()
  np.testing.assert_array_equal(np.asarray(gda), data)


def test_reusing_a_donated_gda_on_the_warm_fast_path_raises(mesh_2d):
  donating = jax.jit(lambda x: x + 1, donate_argnums=0)
  plain = jax.jit(lambda x: x * 2)
  for _ in range(3):
    g, _ = _gda(mesh_2d)
    plain(g)
    donating(g)
  gda, _ = _gda(mesh_2d)
  donating(gda)
  with pytest.raises(RuntimeError, match="deleted or donated"):
    donating(gda)
  with pytest.raises(RuntimeError, match="deleted or donated"):
    plain(gda)


def test_compat_found_the_donation_frames():
  from jax_sharding_ext._jax import donation as jax_donation
  assert jax_donation.HAS_CALL_DONATION_INFO


def test_same_gda_twice_without_donation_is_fine(mesh_2d):
  gda, data = _gda(mesh_2d)
  out = jax.jit(lambda a, b: a + b)(gda, gda)
  np.testing.assert_array_equal(np.asarray(out), 2 * data)
  assert not gda.is_deleted()


# ---------------------------------------------------------------------------
# donation_vector / rebase_donate_argnums.
# ---------------------------------------------------------------------------


def test_donation_vector_one_bool_per_leaf(mesh_2d):
  gda, _ = _gda(mesh_2d)
  args = ((1.0, 2.0), gda, {"a": 3, "b": (4, 5)})
  assert donation_vector((0,), args, {}) == (True, True, False, False, False, False)
  assert donation_vector((1, 2), args, {"k": 1}) == (
      False, False, True, True, True, True, False)
  assert donation_vector(1, args, {}) == (False, False, True, False, False, False)
  assert donation_vector((), args, {"k": (1, 2)}) == (False,) * 8
  assert donation_vector((0,), (None, 1), {}) == (False,)  # None has no leaves
  assert donation_vector(np.int64(1), (1, 2), {}) == (False, True)


def test_negative_donate_argnums_agree_with_this_jaxs_jit(mesh_2d):
  """Stock `jax.jit(f, donate_argnums=-1)` donates nothing in jax 0.10.2 (it
  matches positions as given, as the GDA-era helper did) and the last
  argument in jax 0.12 (counted from the end of the signature); legacy
  `pjit` and `donation_vector` read it as this JAX's `jax.jit` does."""
  def run(make):
    a, b = _gda(mesh_2d)[0], _gda(mesh_2d)[0]
    make(lambda x, y: x + y)(a, b)
    return a.is_deleted(), b.is_deleted()
  stock = run(lambda f: jax.jit(f, donate_argnums=-1))
  assert stock in ((False, False), (False, True))
  assert run(lambda f: pjit(f, in_axis_resources=FROM_GDA, donate_argnums=-1)) == stock
  assert donation_vector(-1, (1, 2), {}) == stock
  assert donation_vector((-1, 0), (1, 2), {}) == (True, stock[1])


def test_numpy_integer_argnums_are_taken_as_in_jax_jit(mesh_2d):
  """`jax.jit` takes `donate_argnums=np.int64(0)` (any `operator.index`
  integer); legacy `pjit` too. A bool stays refused everywhere."""
  for num in (np.int64(0), np.int32(0), (np.int64(0),)):
    a, b = _gda(mesh_2d)[0], _gda(mesh_2d)[0]
    pjit(lambda x, y: x + y, in_axis_resources=FROM_GDA, donate_argnums=num)(a, b)
    assert a.is_deleted() and not b.is_deleted()
  for bad in (True, np.bool_(True), (np.bool_(False),)):
    with pytest.raises(TypeError, match="donate_argnums"):
      pjit(lambda x: x, donate_argnums=bad)


def test_an_unused_donated_argument_is_not_an_alias(mesh_2d):
  """jit prunes an argument its function does not use before running, so
  donating it next to an alias of it is harmless: stock runs
  `jax.jit(lambda a, b: b * 2, donate_argnums=0)(x, x)`, and nothing is
  donated. With a GDA view of `x` as `b`, cold, warm and AOT, the same."""
  f = jax.jit(lambda a, b: b * 2, donate_argnums=0)
  x = _gda(mesh_2d)[0].to_jax_array()
  data = np.asarray(x)
  stock = f(x, x)
  for _ in range(3):
    out = f(x, GlobalDeviceArray.from_jax_array(x))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(stock))
  compiled = f.lower(x, x).compile()
  np.testing.assert_array_equal(np.asarray(compiled(x, GlobalDeviceArray.from_jax_array(x))),
                                2 * data)
  assert not x.is_deleted()
  # Used, the same call is refused as before.
  g = jax.jit(lambda a, b: a + b, donate_argnums=0)
  with pytest.raises(RuntimeError, match="Cannot donate"):
    g(x, GlobalDeviceArray.from_jax_array(x))


def test_donation_vector_rejects_bad_argnums():
  with pytest.raises(TypeError, match="`donate_argnums` must be an int"):
    donation_vector("0", (1,), {})
  with pytest.raises(TypeError, match="must contain ints"):
    donation_vector((0.5,), (1,), {})


def test_rebase_donate_argnums_docstring_examples():
  assert rebase_donate_argnums((3, 4), (0, 1)) == (1, 2)  # the docstring's example
  assert rebase_donate_argnums((2, 0), ()) == (0, 2)
  assert rebase_donate_argnums((), (0, 1)) == ()
  assert rebase_donate_argnums((1, 1, 3), (2,)) == (1, 2)
  assert rebase_donate_argnums((0, 5), (1, 3, 7)) == (0, 3)
  assert rebase_donate_argnums(4, 0) == (3,)


def test_rebase_donate_argnums_overlap_raises():
  with pytest.raises(ValueError, match="cannot intersect") as e:
    rebase_donate_argnums((0, 2), (1, 2))
  assert "[2]" in str(e.value)
  with pytest.raises(ValueError, match="cannot intersect"):
    pjit(lambda x, y: x, static_argnums=1, donate_argnums=(0, 1))


def test_donated_jax_array_next_to_a_gda_over_its_buffers_on_the_warm_path(mesh_2d):
  """A cached call that donated a plain `jax.Array` of a GDA's shape, dtype
  and sharding never lets a later call with a sibling of that GDA skip the
  check: the donated array may be that sibling."""
  step = jax.jit(lambda state, b: state + b, donate_argnums=0)
  batch, data = _gda(mesh_2d)
  held = batch.to_jax_array()  # the batch's buffers stay shared
  for _ in range(3):
    step(jnp.copy(held), batch)
  with pytest.raises(RuntimeError, match="Cannot donate"):
    step(held, batch)
  assert not batch.is_deleted()
  np.testing.assert_array_equal(np.asarray(batch), data)
