"""The `jax_parallel_functions_output_gda` flag, in JAX's own config system."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext
from jax_sharding_ext import GlobalDeviceArray, parallel_functions_output_gda


def _gda(mesh, spec=None):
  spec = P("x", "y") if spec is None else spec
  data = np.arange(64, dtype=np.float32).reshape(8, 8)
  return GlobalDeviceArray.from_callback((8, 8), mesh, spec, lambda i: data[i]), data


def test_default_off(mesh_2d):
  gda, _ = _gda(mesh_2d)
  assert jax.config.jax_parallel_functions_output_gda is False
  assert type(jax.jit(lambda x: x + 1)(gda)) is not GlobalDeviceArray


def test_config_update_turns_outputs_into_gdas(mesh_2d):
  gda, data = _gda(mesh_2d)
  jax.config.update("jax_parallel_functions_output_gda", True)
  out = jax.jit(lambda x: (x + 1, x.sum(), x.T))(gda)
  assert all(type(o) is GlobalDeviceArray for o in out)
  assert out[0].mesh_axes == P("x", "y") and out[0].mesh is mesh_2d
  assert out[1].shape == ()  # 0-d outputs with a NamedSharding too
  np.testing.assert_array_equal(np.asarray(out[0]), data + 1)
  # A GDA output is a normal GDA: it goes straight back into jit.
  again = jax.jit(lambda x: x * 2)(out[0])
  assert type(again) is GlobalDeviceArray
  np.testing.assert_array_equal(np.asarray(again), (data + 1) * 2)


def test_context_manager(mesh_2d):
  gda, _ = _gda(mesh_2d)
  f = jax.jit(lambda x: x - 1)
  with parallel_functions_output_gda(True):
    assert type(f(gda)) is GlobalDeviceArray
  assert type(f(gda)) is not GlobalDeviceArray


@pytest.mark.parametrize("arg_kind", ["gda", "jax_array"])
def test_flipping_never_returns_a_stale_type(mesh_2d, arg_kind):
  gda, data = _gda(mesh_2d)
  x = gda if arg_kind == "gda" else gda.to_jax_array()
  f = jax.jit(lambda x: x * 3)
  for flag in (False, True, False, True, True, False):
    jax.config.update("jax_parallel_functions_output_gda", flag)
    for _ in range(3):  # repeated calls hit jit's C++ and Python caches
      out = f(x)
      assert (type(out) is GlobalDeviceArray) == flag
      np.testing.assert_array_equal(np.asarray(out), data * 3)


def test_single_device_and_device_put_outputs_stay_jax_arrays(mesh_2d):
  jax.config.update("jax_parallel_functions_output_gda", True)
  out = jax.jit(lambda: jnp.ones(3))()
  assert type(out) is not GlobalDeviceArray
  gda, _ = _gda(mesh_2d)
  moved = jax.device_put(gda, NamedSharding(mesh_2d, P("x")))
  assert type(moved) is not GlobalDeviceArray


def test_no_effect_after_uninstall(mesh_2d, fresh_registry):
  arr = jax.device_put(np.ones((8, 8)), NamedSharding(mesh_2d, P("x")))
  jax.config.update("jax_parallel_functions_output_gda", True)
  jax_sharding_ext.uninstall()
  assert type(jax.jit(lambda x: x + 2)(arr)) is not GlobalDeviceArray
  jax_sharding_ext.install()
  assert type(jax.jit(lambda x: x + 2)(arr)) is GlobalDeviceArray


_CHILD = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    import jax_sharding_ext
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    arr = jax.device_put(np.ones((8, 8)), NamedSharding(mesh, P("x", "y")))
    out = jax.jit(lambda x: x + 1)(arr)
    print(type(out).__name__, jax.config.jax_parallel_functions_output_gda)
""")


def _run_child(env):
  code = _CHILD
  env = {**os.environ, **env}
  res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=120)
  assert res.returncode == 0, res.stderr
  return res.stdout.strip()


def test_environment_variable():
  assert _run_child({"JAX_PARALLEL_FUNCTIONS_OUTPUT_GDA": "true"}) == "GlobalDeviceArray True"
  assert _run_child({"JAX_PARALLEL_FUNCTIONS_OUTPUT_GDA": "0"}) == "ArrayImpl False"


_ABSL_CHILD = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    from absl import app
    import jax, numpy as np
    {before}
    import jax_sharding_ext
    {after}
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def main(argv):
      mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
      arr = jax.device_put(np.ones((8, 8)), NamedSharding(mesh, P("x", "y")))
      print(type(jax.jit(lambda x: x + 1)(arr)).__name__)

    app.run(main)
""")


@pytest.mark.parametrize("when", ["before", "after"])
def test_absl_flag(when):
  # `config_with_absl()` may run before or after this package defines its flag.
  call = "jax.config.config_with_absl()"
  code = _ABSL_CHILD.format(before=call if when == "before" else "",
                            after=call if when == "after" else "")
  for argv, expected in ((["--jax_parallel_functions_output_gda"], "GlobalDeviceArray"),
                         (["--nojax_parallel_functions_output_gda"], "ArrayImpl")):
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == expected


def test_eager_operations_stay_jax_arrays(mesh_2d):
  # As with the GDA-era flag, only the user's jit/pjit calls return GDAs: eager
  # arithmetic and jax.numpy calls (which JAX runs as its own jits) do not.
  gda, data = _gda(mesh_2d)
  x = gda.to_jax_array()
  jax.config.update("jax_parallel_functions_output_gda", True)
  for out in (x + 1, x[0], jnp.sum(x), jnp.sin(gda), jnp.add(gda, 1), jnp.sum(x) > 0):
    assert type(out) is not GlobalDeviceArray
  assert float(jnp.sum(x)) == data.sum()
  assert type(jax.jit(jnp.sin)(gda)) is GlobalDeviceArray  # the user's own jit
  assert type(jax.jit(lambda v: v + 1).lower(x).compile()(x)) is GlobalDeviceArray


EAGER = {
    "x + 1": lambda x: x + 1, "x[0]": lambda x: x[0], "x.sum()": lambda x: x.sum(),
    "jnp.sin": jnp.sin, "jnp.sum": lambda x: jnp.sum(x, axis=0), "jnp.dot": lambda x: x @ x,
    "jax.nn.relu": jax.nn.relu, "jax.nn.gelu": jax.nn.gelu, "jax.nn.sigmoid": jax.nn.sigmoid,
    "jax.nn.softmax": jax.nn.softmax, "jax.lax.sin": jax.lax.sin,
    "jnp.where": lambda x: jnp.where(x > 3, x, 0.0), "x.at[0].set": lambda x: x.at[0].set(1.0),
    "jax.tree.map": lambda x: jax.tree.map(lambda t: t * 0.5, x),
}


@pytest.mark.parametrize("name", list(EAGER))
def test_the_flag_is_a_property_of_the_users_jit(mesh_2d, name):
  """Under the user's `jax.jit`, every function follows the flag, whoever
  defined it (`jax.jit(jax.nn.relu)`, a `custom_jvp` in JAX;
  `jax.jit(jax.lax.sin)`, a plain function of JAX's); called eagerly, the
  same function gives a `jax.Array` (JAX runs it as a jit of its own)."""
  fn = EAGER[name]
  gda, _ = _gda(mesh_2d)
  x = gda.to_jax_array()
  jax.config.update("jax_parallel_functions_output_gda", True)
  assert type(fn(x)) is not GlobalDeviceArray
  assert type(fn(gda)) is not GlobalDeviceArray
  out = jax.jit(fn)(x)
  assert type(out) is GlobalDeviceArray, type(out)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(fn(x)))
  jax.config.update("jax_parallel_functions_output_gda", False)
  assert type(jax.jit(fn)(x)) is not GlobalDeviceArray


@pytest.mark.parametrize("when_called", [False, True], ids=["called-off", "called-on"])
@pytest.mark.parametrize("when_compiled", [False, True], ids=["compiled-off", "compiled-on"])
def test_a_compiled_follows_the_flag_it_was_compiled_under(mesh_2d, when_compiled, when_called):
  """As in the GDA era, an AOT `Compiled` keeps the output type chosen when
  it was compiled, whatever the flag is at its calls (its first included)."""
  gda, data = _gda(mesh_2d)
  with parallel_functions_output_gda(when_compiled):
    compiled = jax.jit(lambda v: v * 3).lower(gda).compile()
  for _ in range(2):
    with parallel_functions_output_gda(when_called):
      out = compiled(gda)
    assert (type(out) is GlobalDeviceArray) is when_compiled
    np.testing.assert_array_equal(np.asarray(out), 3 * data)


def test_a_compiled_made_under_the_flag_returns_jax_arrays_after_uninstall(
    mesh_2d, fresh_registry):
  """Uninstalled, no GDA comes out of anything: a `Compiled` made (and
  called) under the flag returns plain `jax.Array`s, which JAX then takes
  (a GDA would be refused as uninstalled); installed again, GDAs."""
  arr = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh_2d, P("x", "y")))
  with parallel_functions_output_gda(True):
    compiled = jax.jit(lambda v: v * 3).lower(arr).compile()
    assert type(compiled(arr)) is GlobalDeviceArray
  jax_sharding_ext.uninstall()
  for _ in range(2):
    out = compiled(arr)
    assert type(out) is not GlobalDeviceArray, type(out)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v + 1)(out)),
                                  np.asarray(arr) * 3 + 1)
  jax_sharding_ext.install()
  assert type(compiled(arr)) is GlobalDeviceArray


def test_jax_array_option_is_there_for_gda_era_branches():
  """Code of JAX 0.3.18-0.4.x branches on `jax.config.jax_array` (flax,
  praxis, t5x `get_local_data`, orbax); it reads False by default, so such
  code takes its GDA branch, and can be set like any JAX option."""
  assert jax.config.jax_array is False
  try:
    jax.config.update("jax_array", True)
    assert jax.config.jax_array is True
  finally:
    jax.config.update("jax_array", False)
  code = "import jax, jax_sharding_ext; print(jax.config.jax_array)"
  for env, expected in (({"JAX_ARRAY": "1"}, "True"), ({"JAX_ARRAY": "0"}, "False")):
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == expected
  absl = ("from absl import app\nimport jax, jax_sharding_ext\njax.config.config_with_absl()\n"
          "app.run(lambda argv: print(jax.config.jax_array))")
  res = subprocess.run([sys.executable, "-c", absl, "--jax_array"], capture_output=True,
                       text=True, timeout=120)
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip() == "True"
