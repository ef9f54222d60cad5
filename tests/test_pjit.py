"""The legacy `pjit` front door over stock `jax.jit`."""

import contextlib
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import (
  FROM_GDA,
  GlobalDeviceArray,
  parallel_functions_output_gda,
  pjit,
  rebase_donate_argnums,
)
from jax_sharding_ext._jax.donation import JIT_COUNTS_NEGATIVE_ARGNUMS

WITH_MESH_DEPRECATED = "`with mesh:` context manager has been deprecated"


@functools.cache
def _stock_deprecates_with_mesh() -> bool:
  """Whether this JAX warns at `with mesh:` (jax 0.10.1 and later do)."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with mesh:
      pass
  return any(WITH_MESH_DEPRECATED in str(w.message) for w in caught)


def stock_with_mesh_warning():
  """Expects JAX's own deprecation warning of `with mesh:` where this JAX has
  one (then it must come); elsewhere nothing (any warning fails the test)."""
  if _stock_deprecates_with_mesh():
    return pytest.warns(DeprecationWarning, match=WITH_MESH_DEPRECATED)
  return contextlib.nullcontext()


@contextlib.contextmanager
def legacy_mesh(mesh):
  """`with mesh:` as GDA-era code writes it, with JAX's warning where it has one."""
  with stock_with_mesh_warning():
    mesh.__enter__()
  try:
    yield mesh
  finally:
    mesh.__exit__(None, None, None)


XY = P("x", "y")


def _gda(mesh, spec=XY, shape=(8, 2), dtype=np.float32):
  data = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def test_gda_docstring_example_under_pjit(devices):
  # The GlobalDeviceArray docstring example, adapted only in imports.
  from jax_sharding_ext import GlobalDeviceArray, Mesh, pjit
  from jax_sharding_ext import PartitionSpec as P

  assert jax.device_count() == 8
  global_mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
  # Logical mesh is (hosts, devices)
  assert global_mesh.shape == {'x': 4, 'y': 2}
  global_input_shape = (8, 2)
  mesh_axes = P('x', 'y')

  # Dummy example data; in practice we wouldn't necessarily materialize global data
  # in a single process.
  global_input_data = np.arange(
      np.prod(global_input_shape)).reshape(global_input_shape)

  def get_local_data_slice(index):
    # index will be a tuple of slice objects, e.g. (slice(0, 16), slice(0, 4))
    # This method will be called per-local device from the GDA constructor.
    return global_input_data[index]

  gda = GlobalDeviceArray.from_callback(
      global_input_shape, global_mesh, mesh_axes, get_local_data_slice)
  assert gda.shape == (8, 2)
  np.testing.assert_array_equal(gda.local_shards[0].data, [[0], [2]])
  assert gda.local_shards[0].data.shape == (2, 1)
  assert gda.local_shards[0].index == (slice(0, 2, None), slice(0, 1, None))

  # GDAs can also be given as an input to pjit and you can get GDAs as output from pjit:
  # Allow pjit to output GDAs
  jax.config.update('jax_parallel_functions_output_gda', True)
  f = pjit(lambda x: x @ x.T, in_axis_resources=P('x', 'y'), out_axis_resources = P('x', 'y'))
  with stock_with_mesh_warning():  # JAX's, not ours
    with global_mesh:
      out = f(gda)
  # `out` can be passed to another pjit call, out.local_shards can be used to
  # export the data to non-jax systems (e.g. for checkpointing or logging), etc.

  expected = global_input_data @ global_input_data.T
  assert type(out) is GlobalDeviceArray
  assert out.shape == (8, 8) and out.mesh_axes == P('x', 'y')
  assert out.local_shards[0].data.shape == (2, 4)
  for s in out.local_shards:
    np.testing.assert_array_equal(s.data, expected[s.index])
  with legacy_mesh(global_mesh):
    out2 = f(out)
  assert type(out2) is GlobalDeviceArray
  np.testing.assert_array_equal(np.asarray(out2), expected @ expected.T)


# ---------------------------------------------------------------------------
# PartitionSpecs and the context mesh.
# ---------------------------------------------------------------------------


def test_partition_specs_resolve_against_the_with_mesh_block(mesh_2d):
  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  f = pjit(lambda x, y: (x @ x.T, y @ y.T), in_axis_resources=(None, P("x", "y")),
           out_axis_resources=(P("x", "y"), P(("x", "y"))))
  with legacy_mesh(mesh_2d):
    out1, out2 = f(data, data)
  assert out1.sharding == NamedSharding(mesh_2d, P("x", "y"))
  assert out2.sharding == NamedSharding(mesh_2d, P(("x", "y")))
  np.testing.assert_array_equal(out1, data @ data.T)
  np.testing.assert_array_equal(out2, data @ data.T)


def test_innermost_mesh_wins(mesh_2d, mesh_factory):
  small = mesh_factory((2,), ("x",))
  f = pjit(lambda x: x + 1, in_axis_resources=P("x"), out_axis_resources=P("x"))
  x = np.zeros(8, np.float32)
  with legacy_mesh(mesh_2d):
    assert f(x).sharding.mesh == mesh_2d
    with legacy_mesh(small):
      assert f(x).sharding.mesh == small
    assert f(x).sharding.mesh == mesh_2d


def test_jax_set_mesh_is_a_context_mesh_too(mesh_2d):
  f = pjit(lambda x: x * 2, in_shardings=P("x"), out_shardings=P(None, "y"))
  with jax.set_mesh(mesh_2d):
    out = f(np.ones((8, 4), np.float32))
  assert out.sharding == NamedSharding(mesh_2d, P(None, "y"))


@pytest.mark.parametrize("donate", [(), (0,)])
def test_an_array_computed_eagerly_under_set_mesh_is_placed_as_under_with_mesh(
    mesh_2d, donate):
  """Under the legacy `with mesh:` an eagerly computed array stayed on one
  device and pjit placed it as its spec said; under `jax.set_mesh` (what the
  porting assistant writes) it is committed and replicated over the mesh,
  which stock `jax.jit` refuses for another in sharding. Legacy pjit places
  it as before: the same program gives the same values either way."""
  f = pjit(lambda a, b: (a * 2, b + 1), in_axis_resources=(P("x"), P(None, "y")),
           out_axis_resources=(P("x"), P(None, "y")), donate_argnums=donate)
  results = []
  for context in (legacy_mesh, jax.set_mesh):
    with context(mesh_2d):
      a, b = jnp.arange(8.0), jnp.ones((4, 4))  # computed eagerly inside the block
      out = f(a, b)
    assert out[0].sharding == NamedSharding(mesh_2d, P("x"))
    assert out[1].sharding == NamedSharding(mesh_2d, P(None, "y"))
    results.append([np.asarray(o) for o in out])
  np.testing.assert_array_equal(results[0][0], results[1][0])
  np.testing.assert_array_equal(results[0][1], results[1][1])
  with jax.set_mesh(mesh_2d):
    a = jnp.arange(8.0)
    with pytest.raises(ValueError, match="does not match"):  # stock jit, for comparison
      jax.jit(lambda v: v, in_shardings=P("x"))(a)
    f(a, jnp.ones((4, 4)))
    assert not a.is_deleted()  # a copy was placed (and donated), as before


@pytest.mark.parametrize("where", ["in", "out"])
def test_partition_spec_without_a_mesh_is_a_clear_error(where):
  kw = ({"in_axis_resources": P("x")} if where == "in"
        else {"out_axis_resources": P("x")})
  f = pjit(lambda x: x, **kw)
  with pytest.raises(ValueError, match="no mesh is active") as e:
    f(np.ones(8))
  msg = str(e.value)
  assert "with mesh:" in msg and "NamedSharding(mesh, spec)" in msg
  assert f"`{where}_axis_resources`" in msg


def test_none_means_replicated_over_the_mesh(mesh_2d):
  f = pjit(lambda x: x * 2, in_axis_resources=None, out_axis_resources=None)
  with legacy_mesh(mesh_2d):
    out = f(np.arange(8.0))
  assert out.sharding.is_fully_replicated and out.sharding.mesh == mesh_2d
  # Without a mesh, None leaves are unspecified (stock pjit): jit's defaults.
  assert pjit(lambda x: x * 2, in_axis_resources=None)(np.arange(8.0)).shape == (8,)


def test_named_shardings_need_no_mesh(mesh_2d):
  s = NamedSharding(mesh_2d, P("x"))
  out = pjit(lambda x: x + 1, in_axis_resources=s, out_axis_resources=s)(np.zeros((8, 2)))
  assert out.sharding == s


# ---------------------------------------------------------------------------
# FROM_GDA.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [P("x", "y"), P("x"), P(None, "y"), P()], ids=str)
def test_from_gda_takes_the_arguments_own_sharding(mesh_2d, spec):
  gda, data = _gda(mesh_2d, spec)
  f = pjit(lambda x: x + 1, in_axis_resources=FROM_GDA)
  compiled = f.lower(gda).compile()
  assert compiled.input_shardings[0][0] == gda.sharding
  out = f(gda)  # no mesh needed: the sharding comes with the argument
  np.testing.assert_array_equal(out, data + 1)


def test_from_gda_accepts_a_jax_array_with_named_sharding(mesh_2d):
  arr = jax.device_put(np.ones((8, 2)), NamedSharding(mesh_2d, P("x")))
  f = pjit(lambda x: x * 3, in_axis_resources=FROM_GDA)
  assert f.lower(arr).compile().input_shardings[0][0] == arr.sharding
  np.testing.assert_array_equal(f(arr), 3 * np.ones((8, 2)))


@pytest.mark.parametrize("bad", [np.ones((8, 2)), 3.0, 7], ids=["numpy", "float", "int"])
def test_from_gda_on_a_non_gda_raises(mesh_2d, bad):
  gda, _ = _gda(mesh_2d)
  f = pjit(lambda x, y: x + y, in_axis_resources=(FROM_GDA, FROM_GDA))
  with pytest.raises(ValueError, match="non-GDA input") as e:
    f(gda, bad)
  assert "argument 1" in str(e.value) and "PartitionSpec" in str(e.value)


def test_from_gda_on_a_single_device_array_raises():
  arr = jax.device_put(np.ones(4), jax.devices()[0])
  assert isinstance(arr.sharding, SingleDeviceSharding)
  with pytest.raises(ValueError, match="not a `NamedSharding`"):
    pjit(lambda x: x, in_axis_resources=FROM_GDA)(arr)


def test_from_gda_mixed_with_specs(mesh_2d):
  gda, data = _gda(mesh_2d)
  with parallel_functions_output_gda(True):
    f = pjit(lambda x, y: (x @ x.T, y @ y.T), in_axis_resources=(FROM_GDA, P("x", "y")),
             out_axis_resources=(P("x", "y"), P(("x", "y"))))
    with legacy_mesh(mesh_2d):
      out1, out2 = f(gda, data)
  assert type(out1) is GlobalDeviceArray and type(out2) is GlobalDeviceArray
  assert out1.local_shards[0].data.shape == (2, 4)
  assert out2.local_shards[0].data.shape == (1, 8)
  for out in (out1, out2):
    for s in out.local_shards:
      np.testing.assert_array_equal(s.data, (data @ data.T)[s.index])


def test_from_gda_broadcasts_over_a_pytree(mesh_2d):
  a, data = _gda(mesh_2d, P("x", "y"))
  b, _ = _gda(mesh_2d, P("x"))
  c, _ = _gda(mesh_2d, P())
  f = pjit(lambda t: jax.tree.map(lambda v: v * 2, t), in_axis_resources=FROM_GDA)
  tree = {"a": a, "bc": (b, c)}
  shardings = f.lower(tree).compile().input_shardings[0][0]
  assert shardings == {"a": a.sharding, "bc": (b.sharding, c.sharding)}
  out = f(tree)
  np.testing.assert_array_equal(out["bc"][1], 2 * data)


def test_gda_partitioning_mismatch_is_the_old_pjit_error(mesh_2d):
  gda, _ = _gda(mesh_2d, P("x"))
  # A GDA is committed: a spec that disagrees is stock jit's committed-array
  # error (kept as the cause), reworded as the GDA-era pjit said it; the old
  # test (pjit_test.test_pjit_gda_wrong_resource_for_gda_input) matched this
  # literal text.
  f = pjit(lambda x: x, in_axis_resources=P("x", "y"))
  old = ("Got an input GDA to pjit with different partitioning than specified "
         "in the in_axis_resources argument to pjit. The partitioning must "
         "match, or use `jax.experimental.pjit.FROM_GDA` in `in_axis_resources`. "
         "Got GDA spec: PartitionSpec('x',) and pjit spec: PartitionSpec('x', 'y') "
         "for GDA: GlobalDeviceArray(shape=(8, 2), dtype=float32)")
  with legacy_mesh(mesh_2d), pytest.raises(ValueError) as info:
    f(gda)
  assert str(info.value).startswith(old)
  assert "does not match the sharding" in str(info.value.__cause__)
  with legacy_mesh(mesh_2d), pytest.raises(ValueError, match="different partitioning"):
    f.lower(gda)
  # P(None) and P() are the same sharding: no error.
  rep, _ = _gda(mesh_2d, P(None))
  with legacy_mesh(mesh_2d):
    assert pjit(lambda x: x, in_axis_resources=P())(rep).shape == (8, 2)


# ---------------------------------------------------------------------------
# Pytree prefixes, static arguments, spellings, validation.
# ---------------------------------------------------------------------------


def test_prefix_pytrees_of_specs(mesh_2d):
  params = {"w": np.ones((8, 4), np.float32), "b": np.ones((4,), np.float32)}
  batch = np.ones((8, 8), np.float32)
  f = pjit(lambda p, x: x @ p["w"] + p["b"],
           in_axis_resources=({"w": P("x"), "b": None}, P("x")),
           out_axis_resources=P("x"))
  with legacy_mesh(mesh_2d):
    lowered = f.lower(params, batch)
    out = f(params, batch)
  ins = lowered.compile().input_shardings[0]
  assert ins[0]["w"].spec == P("x") and ins[0]["b"].is_fully_replicated
  assert ins[1].spec == P("x")
  np.testing.assert_array_equal(out, np.full((8, 4), 9.0))


def test_a_spec_tree_that_is_not_a_prefix_is_a_value_error(mesh_2d):
  gda, _ = _gda(mesh_2d)
  f = pjit(lambda x, y: x, in_axis_resources=(FROM_GDA, P("x"), P("y")))
  with legacy_mesh(mesh_2d), pytest.raises(ValueError, match="pytree prefix"):
    f(gda, gda)


def test_specs_cover_non_static_arguments_only(mesh_2d):
  gda, data = _gda(mesh_2d)
  f = pjit(lambda n, x, scale: x * n * scale, in_axis_resources=(FROM_GDA, P()),
           static_argnums=0)
  with legacy_mesh(mesh_2d):
    out = f(3, gda, np.float32(2))
  np.testing.assert_array_equal(out, data * 6)
  g = pjit(lambda x, *, mode: x + (1 if mode == "a" else 2), in_axis_resources=FROM_GDA,
           static_argnames="mode")
  np.testing.assert_array_equal(g(gda, mode="b"), data + 2)


def test_modern_spellings_and_conflicts(mesh_2d):
  with pytest.raises(ValueError, match="both `in_axis_resources` and `in_shardings`"):
    pjit(lambda x: x, in_axis_resources=P("x"), in_shardings=P("x"))
  with pytest.raises(ValueError, match="both `out_axis_resources` and `out_shardings`"):
    pjit(lambda x: x, out_axis_resources=P("x"), out_shardings=P("x"))
  f = pjit(lambda x: x.T, in_shardings=FROM_GDA, out_shardings=P("y", "x"))
  gda, data = _gda(mesh_2d, shape=(8, 4))
  with legacy_mesh(mesh_2d):
    out = f(gda)
  assert out.sharding.spec == P("y", "x")
  np.testing.assert_array_equal(out, data.T)


def test_bad_specs_are_rejected_when_pjit_is_called():
  with pytest.raises(ValueError, match="`FROM_GDA` is only valid in `in_axis_resources`"):
    pjit(lambda x: x, out_axis_resources=FROM_GDA)
  with pytest.raises(TypeError, match=r"Use `PartitionSpec\('x'\)`"):
    pjit(lambda x: x, in_axis_resources=("x",))
  with pytest.raises(TypeError, match="needs a callable"):
    pjit(3)


def test_empty_spec_tuples_are_value_errors_not_assertions(mesh_2d):
  gda, _ = _gda(mesh_2d, P("x"))
  x = gda.to_jax_array()
  # Stock jit raises a bare AssertionError for `()` (api_util.flatten_axis_resources):
  for kw in ({"in_shardings": ()}, {"out_shardings": ()}):
    with pytest.raises(AssertionError):
      jax.jit(lambda v: v, **kw)(x)
  # ... and a ValueError naming the prefix rule for other wrong lengths; so here.
  with legacy_mesh(mesh_2d):
    with pytest.raises(ValueError, match=r"in_axis_resources specification must be a "
                       r"tree prefix.*length 0 for an args tuple of length 1"):
      pjit(lambda v: v, in_axis_resources=(), out_axis_resources=P("x"))(gda)
    with pytest.raises(ValueError, match=r"out_axis_resources specification must be a "
                       r"tree prefix of the outputs.*returned PyTreeDef\(\*\)"):
      pjit(lambda v: v, in_axis_resources=P("x"), out_axis_resources=())(gda)
    # `()` is right for no arguments / no outputs, as in stock.
    assert pjit(lambda: 1, in_axis_resources=())() == 1
    assert pjit(lambda v: (), in_axis_resources=P("x"), out_axis_resources=())(gda) == ()
    # The static arguments do not count.
    assert pjit(lambda n: n, in_axis_resources=(), static_argnums=0)(3) == 3


def test_static_and_donated_through_a_negative_index_is_a_value_error():
  # Stock jit refuses the positive overlap (as static/donate argnames).
  with pytest.raises(ValueError, match="cannot intersect"):
    jax.jit(lambda x, n: x * n, static_argnums=1, donate_argnums=1)
  with pytest.raises(ValueError, match="cannot intersect"):
    pjit(lambda x, n: x * n, static_argnums=-1, donate_argnums=1)
  # A negative donated position names an argument where this JAX's jit reads
  # it so (jax 0.12: from the end); elsewhere it donates nothing, so nothing
  # clashes with a static argument, and pjit runs what jit runs.
  if JIT_COUNTS_NEGATIVE_ARGNUMS:
    with pytest.raises(ValueError, match=r"`static_argnums` \[1\] and `donate_argnums` "
                       r"\[1\] cannot intersect"):
      pjit(lambda x, n: x * n, static_argnums=1, donate_argnums=-1)
    # With `*args` the count is known only at the call.
    f = pjit(lambda *a: a[0] * a[1], static_argnums=1, donate_argnums=-1)
    with pytest.raises(ValueError, match="cannot intersect"):
      f(np.ones(2), 3)
    np.testing.assert_array_equal(f(np.ones(2), 3, np.ones(1)), 3 * np.ones(2))
  else:
    x = jax.device_put(np.ones(2, np.float32))
    for static in (1, -1):
      try:
        want = jax.jit(lambda v, n: v * n, static_argnums=static, donate_argnums=-1)(x, 3)
      except ValueError as e:  # jax 0.8.x refuses the same number in both
        assert "cannot intersect" in str(e)
        with pytest.raises(ValueError, match="cannot intersect"):
          pjit(lambda v, n: v * n, static_argnums=static, donate_argnums=-1)(x, 3)
        continue
      out = pjit(lambda v, n: v * n, static_argnums=static, donate_argnums=-1)(x, 3)
      np.testing.assert_array_equal(out, want)
      assert not x.is_deleted()


@pytest.mark.parametrize("which", ["in_axis_resources", "out_axis_resources"])
def test_unknown_mesh_axis_is_the_old_resource_axis_error(mesh_2d, which):
  gda, _ = _gda(mesh_2d, P("x"))
  specs = {"in_axis_resources": P("x"), "out_axis_resources": P("x"), which: P(("x", "z"))}
  with legacy_mesh(mesh_2d), pytest.raises(
      ValueError, match=rf"^Resource axis: z of {which} is undefined\. .*\('x', 'y'\)"):
    pjit(lambda v: v, **specs)(gda)


@pytest.mark.parametrize("spec", [P("x"), FROM_GDA])
def test_gda_on_another_mesh_is_the_old_mesh_error(mesh_2d, mesh_factory, spec):
  gda, _ = _gda(mesh_2d, P("x"))
  other = mesh_factory((2, 2), ("x", "y"))
  f = pjit(lambda v: v, in_axis_resources=spec, out_axis_resources=P("x"))
  # The old pjit_test matched "Pjit's mesh and GDA's mesh should be equal."
  with legacy_mesh(other), pytest.raises(
      ValueError, match=r"^Pjit's mesh and GDA's mesh should be equal\. Got Pjit mesh"):
    f(gda)


def test_spec_errors_are_plain_value_errors(mesh_2d):
  # No private exception class leaks into user tracebacks.
  with pytest.raises(ValueError) as info:
    pjit(lambda v: v, in_axis_resources=FROM_GDA)(np.ones((8, 2)))
  assert type(info.value) is ValueError
  with pytest.raises(ValueError) as info:
    pjit(lambda v: v, in_axis_resources=P("x"))(np.ones((8, 2)))
  assert type(info.value) is ValueError and "no mesh is active" in str(info.value)


def test_with_sharding_constraint_on_a_gda(mesh_2d):
  # The porting table's row: `pjit.with_sharding_constraint` ->
  # `jax.lax.with_sharding_constraint`, which takes a GDA inside jit and pjit.
  gda, data = _gda(mesh_2d, P("x"))
  target = NamedSharding(mesh_2d, P("y"))
  out = jax.jit(lambda v: jax.lax.with_sharding_constraint(v * 2, target))(gda)
  assert out.sharding.is_equivalent_to(target, 2)
  np.testing.assert_array_equal(out, data * 2)
  gda, data = _gda(mesh_2d, P("x"), shape=(8, 4))
  with legacy_mesh(mesh_2d):
    out = pjit(lambda v: jax.lax.with_sharding_constraint(v + 1, P("y", "x")),
               in_axis_resources=FROM_GDA)(gda)
  assert out.sharding.is_equivalent_to(NamedSharding(mesh_2d, P("y", "x")), 2)
  np.testing.assert_array_equal(out, data + 1)


# ---------------------------------------------------------------------------
# Outputs and the output flag; caching; nesting.
# ---------------------------------------------------------------------------


def test_output_flag_every_named_sharding_output_is_a_gda(mesh_2d):
  gda, data = _gda(mesh_2d)
  f = pjit(lambda x: (x * 2, x.sum(), x[0, 0]), in_axis_resources=FROM_GDA,
           out_axis_resources=(P("x", "y"), None, None))
  with legacy_mesh(mesh_2d):
    off = f(gda)
    with parallel_functions_output_gda(True):
      on = f(gda)
  assert all(type(o) is not GlobalDeviceArray for o in off)
  assert all(type(o) is GlobalDeviceArray for o in on)
  assert on[1].shape == () and float(np.asarray(on[1])) == data.sum()
  np.testing.assert_array_equal(np.asarray(on[0]), data * 2)


def test_output_flag_leaves_single_device_outputs_alone():
  with parallel_functions_output_gda(True):
    out = pjit(lambda x: x + 1)(np.ones(3))
  assert type(out) is not GlobalDeviceArray
  assert isinstance(out.sharding, SingleDeviceSharding)


def test_steady_calls_do_not_retrace(mesh_2d):
  traces = []

  def body(x, y):
    traces.append(1)
    return x + y

  gda, _ = _gda(mesh_2d)
  f = pjit(body, in_axis_resources=(FROM_GDA, P("x")))
  g = pjit(body, in_axis_resources=P("x", "y"))
  with legacy_mesh(mesh_2d):
    for _ in range(3):
      f(gda, np.ones((8, 2), np.float32))
    assert len(traces) == 1
    for _ in range(3):
      g(gda, gda)
    assert len(traces) == 2


def test_nested_inside_jit(mesh_2d):
  gda, data = _gda(mesh_2d)
  inner = pjit(lambda x: x * 2, in_axis_resources=FROM_GDA)
  inner_spec = pjit(lambda x: x + 1, in_axis_resources=P("x"), out_axis_resources=P("x"))
  with legacy_mesh(mesh_2d):
    out = jax.jit(lambda x: inner_spec(inner(x)))(gda)
  np.testing.assert_array_equal(out, data * 2 + 1)


def test_grad_through_pjit(mesh_2d):
  gda, data = _gda(mesh_2d)
  f = pjit(lambda x: jnp.sum(x ** 2), in_axis_resources=FROM_GDA)
  np.testing.assert_allclose(jax.grad(f)(gda), 2 * data)


@pytest.mark.parametrize("name", ["donate_argnums", "static_argnums"])
@pytest.mark.parametrize("value", [(True,), True, (0, False)], ids=["(True,)", "True", "(0, False)"])
def test_bool_argnums_are_refused_as_by_rebase_donate_argnums(mesh_2d, name, value):
  """A bool is an int to Python: read as argument 1, `donate_argnums=(True,)`
  would donate the wrong argument. Legacy `pjit` refuses it with the same
  TypeError as `rebase_donate_argnums` (one parser for both), before tracing."""
  with pytest.raises(TypeError, match=f"`{name}` must"):
    pjit(lambda x, y: x + y, in_axis_resources=FROM_GDA, **{name: value})
  with pytest.raises(TypeError, match=f"`{name}` must"):
    rebase_donate_argnums(value if name == "donate_argnums" else (),
                          value if name == "static_argnums" else ())
  a, _ = _gda(mesh_2d)
  b, _ = _gda(mesh_2d)
  pjit(lambda x, y: x + y, in_axis_resources=FROM_GDA, donate_argnums=(0,))(a, b)
  assert a.is_deleted() and not b.is_deleted()


def test_trailing_nones_fit_values_of_lower_rank(mesh_2d):
  """GDA-era multi-host data loading (2022) wrote one spec for a whole batch,
  `P(('data', 'model'), None)`, also for its rank-1 leaves: the old pjit
  dropped trailing `None`s before the rank check (stock `jax.jit` raises
  "only valid for values of rank at least 2")."""
  spec = P(("x", "y"), None)
  with legacy_mesh(mesh_2d):
    f = pjit(lambda ids, x: (ids + 1, x * 2), in_axis_resources=(spec, spec),
             out_axis_resources=(spec, spec))
    ids, x = f(np.arange(8), np.ones((8, 2)))
  np.testing.assert_array_equal(ids, np.arange(8) + 1)
  np.testing.assert_array_equal(x, 2 * np.ones((8, 2)))
  assert ids.sharding.is_equivalent_to(NamedSharding(mesh_2d, P(("x", "y"))), 1)
  assert x.sharding.is_equivalent_to(NamedSharding(mesh_2d, spec), 2)


@pytest.mark.parametrize("container", [list, tuple])
@pytest.mark.parametrize("name", ["out_axis_resources", "out_shardings"])
def test_out_specs_in_the_outputs_own_container(mesh_2d, container, name):
  """A list of out specs for a function returning a list, a tuple for a
  tuple, as GDA-era pjit and today's `jax.jit(out_shardings=...)` accept."""
  x = np.arange(8.0)
  f = pjit(lambda a: container([a, a * 2]), in_axis_resources=P("x"),
           **{name: container([P("x"), P(None)])})
  with jax.set_mesh(mesh_2d):
    out = f(x)
  assert type(out) is container
  np.testing.assert_array_equal(out[1], 2 * x)
  assert out[0].sharding.spec == P("x") and out[1].sharding.is_fully_replicated


@pytest.mark.parametrize("name", ["out_axis_resources", "out_shardings"])
def test_an_out_spec_mismatch_names_the_parameter_written(mesh_2d, name):
  """Stock's error names `out_shardings` whatever the user wrote; for a
  list against a tuple it calls the prefix "pjit out_shardings"."""
  f = pjit(lambda a: (a, a), in_axis_resources=P("x"), **{name: [P("x"), P("x")]})
  with jax.set_mesh(mesh_2d), pytest.raises(ValueError) as e:
    f(np.arange(8.0))
  msg = str(e.value)
  assert f"pjit {name} specification must be a tree prefix" in msg
  other = "out_shardings" if name == "out_axis_resources" else "out_axis_resources"
  assert other not in msg
  g = pjit(lambda a: a, in_axis_resources=P("x"), **{name: ()})
  with jax.set_mesh(mesh_2d), pytest.raises(ValueError, match=f"{name}=()"):
    g(np.arange(8.0))
