"""The texts, reprs and private helpers that GDA-era tests (JAX's own of
0.3.21 to 0.4.1 among them) match on: the old texts survive as the start of
today's messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from jax_sharding_ext import FROM_GDA, GlobalDeviceArray, parallel_functions_output_gda, pjit
from jax_sharding_ext import PartitionSpec as P

# Entering a mesh with `with mesh:` is the GDA-era spelling; JAX 0.10 deprecates it.
with_mesh_deprecated = pytest.mark.filterwarnings(
    "ignore:.*context manager has been deprecated:DeprecationWarning")


def _gda(mesh, shape, spec, dtype=np.float32):
  data = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def test_repr_spells_partition_spec_as_before(mesh_2d):
  gda, _ = _gda(mesh_2d, (16, 4), P(("x", "y"), None), dtype=np.int32)
  assert str(gda) == "GlobalDeviceArray(shape=(16, 4), dtype=int32)"
  assert repr(gda) == ("GlobalDeviceArray(shape=(16, 4), dtype=int32, "
                       "global_mesh_shape={'x': 4, 'y': 2}, "
                       "mesh_axes=PartitionSpec(('x', 'y'), None))")
  listed, _ = _gda(mesh_2d, (16, 4), ["x"])
  assert repr(listed).endswith("mesh_axes=['x'])")  # other spellings print as given


def test_check_if_deleted_and_value(mesh_2d):
  gda, data = _gda(mesh_2d, (8, 4), P("y", "x"))
  np.testing.assert_array_equal(gda._value, data)
  assert gda._check_if_deleted() is None
  gda.delete()
  with pytest.raises(RuntimeError, match="^GlobalDeviceArray has been deleted."):
    gda._check_if_deleted()


def test_compiled_executable_refuses_a_gda_of_another_sharding(mesh_2d):
  gda, _ = _gda(mesh_2d, (8, 4), P("x", "y"))
  other = NamedSharding(mesh_2d, P("y"))
  compiled = jax.jit(jnp.negative, in_shardings=other).lower(
      jax.ShapeDtypeStruct((8, 4), jnp.float32)).compile()
  with pytest.raises(ValueError, match="^GDA sharding does not match the input sharding."):
    compiled(gda)


@with_mesh_deprecated
def test_from_gda_for_a_non_gda_input(mesh_2d):
  gda, data = _gda(mesh_2d, (8, 4), P("x", None))
  with parallel_functions_output_gda(True), mesh_2d:
    double = pjit(lambda v: v + v, in_axis_resources=FROM_GDA, out_axis_resources=P("x"))
    assert type(double(gda)) is GlobalDeviceArray
    with pytest.raises(ValueError, match=(
        "^For a non-GDA input, the corresponding resource in in_axis_resources cannot be "
        "`pjit.FROM_GDA`.")):
      double(data)


def test_ordered_effects_in_pmap_keep_the_old_text():
  """An ordered effect under `jax.pmap`: the old "Ordered effects not
  supported in `pmap`." starts stock's current error."""
  def f(x):
    jax.debug.print("{}", x, ordered=True)
    return x * 2
  with pytest.raises(ValueError, match="^Ordered effects not supported in `pmap`.") as e:
    jax.pmap(f)(np.arange(jax.device_count(), dtype=np.float32))
  assert "not supported for more than 1 device" in str(e.value)


def _compilations(caplog, fn) -> int:
  with jax.log_compiles(), caplog.at_level("WARNING"):
    caplog.clear()
    fn()
  return sum("Compiling" in r.getMessage() for r in caplog.records)


@with_mesh_deprecated
def test_a_replicated_gda_output_fed_back_compiles_like_stock(mesh_factory, caplog):
  """GDA-era tests expect no recompilation when a fully replicated pjit
  output comes back in. A GDA compiles no more than stock's `jax.jit` does
  for its own `jax.Array` output (JAX 0.10 compiles once more for a
  committed input after a host one, for both), and never again after that.
  `P(None)` is fully replicated; its GDA's `mesh_axes` read `P()`
  (`PartitionSpec` is no longer a tuple, so not `()`)."""
  mesh = mesh_factory((1, 2), ("x", "y"))
  host = np.arange(12, dtype=np.float32).reshape(6, 2)
  with parallel_functions_output_gda(True), mesh:
    ident = pjit(lambda v: v, in_axis_resources=P(None), out_axis_resources=P(None))
    out = ident(host)
    assert out.mesh_axes == P() and out.is_fully_replicated
    ours = _compilations(caplog, lambda: ident(out))
    assert _compilations(caplog, lambda: ident(out)) == 0
    np.testing.assert_array_equal(np.asarray(ident(out)), host)
  replicated = NamedSharding(mesh, P())
  stock = jax.jit(lambda v: v, in_shardings=replicated, out_shardings=replicated)
  stock_out = stock(host)
  assert ours == _compilations(caplog, lambda: stock(stock_out))
