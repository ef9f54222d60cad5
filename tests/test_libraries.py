"""Today's JAX libraries take `GlobalDeviceArray` leaves as they are, with the
output flag on, and give the same results as the same program on plain
`jax.Array` leaves: a flax linen `TrainState` trained with optax `adamw` under
a donating `jax.jit`, a flax nnx model trained with `nnx.Optimizer`, flax
serialization, orbax checkpointing (`StandardCheckpointer`,
`PyTreeCheckpointer`, `CheckpointManager`), chex assertions and equinox's
filtered transformations. GDA leaves come from `from_callback`, from
`from_jax_array` over a `jax.Array` that stays alive, and from jitted outputs
with the flag on; results are compared bit for bit where the computation is
deterministic. Only orbax needs this package's side: importing
`jax_sharding_ext.orbax_support` lets a restore into a GDA target give GDAs."""

import chex
import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx, serialization
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint import checkpoint_utils

import jax_sharding_ext as jse
import jax_sharding_ext.orbax_support  # restores GDAs where the target has them
from jax_sharding_ext import GlobalDeviceArray

FLAG = "jax_parallel_functions_output_gda"


def _gda(mesh, spec, data):
  return GlobalDeviceArray.from_callback(data.shape, mesh, spec, lambda idx: data[idx])


def _arr(mesh, spec, data):
  return jax.device_put(data, NamedSharding(mesh, spec))


def _host(tree):
  """`tree` with every leaf fetched to a numpy array."""
  return jax.tree.map(np.asarray, tree)


def _leaves_are_gdas(tree):
  leaves = jax.tree.leaves(tree)
  return bool(leaves) and all(type(x) is GlobalDeviceArray for x in leaves)


def _no_gda(tree):
  return not any(isinstance(x, GlobalDeviceArray) for x in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------
# flax linen + optax: a TrainState trained under a donating jax.jit.
# ---------------------------------------------------------------------------


class _Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(16)(x))
    return nn.Dense(2)(x)


_LINEN_SPECS = {"Dense_0": {"kernel": P("x", None), "bias": P()},
                "Dense_1": {"kernel": P("x", "y"), "bias": P()}}
_STEPS = 32


def _linen_setup():
  """Host params of `_Mlp` (nested dict of numpy arrays) and host batches."""
  params = _host(_Mlp().init(jax.random.key(0), jnp.zeros((1, 8)))["params"])
  rng = np.random.default_rng(0)
  xs = rng.standard_normal((_STEPS, 16, 8)).astype(np.float32)
  ys = np.tanh(xs @ rng.standard_normal((8, 2)).astype(np.float32))
  return params, xs, ys


def _linen_step(state, x, y):
  def loss_fn(params):
    return jnp.mean((state.apply_fn({"params": params}, x) - y) ** 2)
  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), loss


def _train_linen(mesh, params, xs, ys, put):
  """Train `_Mlp` from `params` (leaves already placed); return the losses,
  the final state, and for every step which array leaves of the donated
  input state were deleted (`{path: bool}`)."""
  state = train_state.TrainState.create(apply_fn=_Mlp().apply, params=params,
                                        tx=optax.adamw(1e-2, weight_decay=1e-3))
  step = jax.jit(_linen_step, donate_argnums=0)
  losses, deleted = [], []
  for x, y in zip(xs, ys, strict=True):
    prev = state
    state, loss = step(state, put(mesh, P("x", None), x), put(mesh, P("x", None), y))
    losses.append(np.asarray(loss))
    deleted.append({jax.tree_util.keystr(path): leaf.is_deleted()
                    for path, leaf in jax.tree_util.tree_leaves_with_path(prev)
                    if isinstance(leaf, jax.Array)})
  return np.stack(losses), state, deleted


@pytest.fixture(scope="module")
def linen_reference(devices):
  """The program on plain `jax.Array`s with the output flag off (stock JAX),
  on a mesh equal to `mesh_2d`: losses, final host params, donated leaves."""
  mesh = Mesh(np.array(devices).reshape(4, 2), ("x", "y"))
  params, xs, ys = _linen_setup()
  placed = jax.tree.map(lambda spec, v: _arr(mesh, spec, v), _LINEN_SPECS, params)
  with jse.parallel_functions_output_gda(False):
    losses, state, deleted = _train_linen(mesh, placed, xs, ys, _arr)
  assert _no_gda(state)
  # XLA aliases every donated kernel (params, mu, nu) to an output; whether a
  # small replicated bias is aliased is XLA's choice.
  assert all(d for step in deleted for path, d in step.items() if "kernel" in path)
  return losses, _host(state.params), deleted


def test_linen_train_state_with_adamw_and_donation_matches_jax_arrays(mesh_2d,
                                                                    linen_reference):
  """A flax `TrainState` whose params are GDAs trains with optax `adamw` under
  `jax.jit(step, donate_argnums=0)` with the output flag on exactly as with
  `jax.Array` params: the same loss at every step and the same final params,
  bit for bit; the params and optimizer state come back as GDAs, and the
  donated inputs are deleted, the same leaves at every step as for
  `jax.Array`s."""
  want_losses, want_params, want_deleted = linen_reference
  params, xs, ys = _linen_setup()
  gdas = jax.tree.map(lambda spec, v: _gda(mesh_2d, spec, v), _LINEN_SPECS, params)
  jax.config.update(FLAG, True)
  losses, state, deleted = _train_linen(mesh_2d, gdas, xs, ys, _gda)
  assert deleted == want_deleted
  assert _leaves_are_gdas(state.params) and _leaves_are_gdas(state.opt_state)
  np.testing.assert_array_equal(losses, want_losses)
  jax.tree.map(np.testing.assert_array_equal, _host(state.params), want_params)
  assert losses[-1] < losses[0]


def test_linen_training_on_gdas_over_kept_jax_arrays_matches_jax_arrays(mesh_2d,
                                                                      linen_reference):
  """A GDA made by `from_jax_array(x)` while `x` stays alive trains like the
  `jax.Array` itself: same losses and final params bit for bit. Donating the
  GDA donates the buffers it shares with `x`: `x` is deleted exactly when the
  GDA is."""
  want_losses, want_params, want_deleted = linen_reference
  params, xs, ys = _linen_setup()
  kept = jax.tree.map(lambda spec, v: _arr(mesh_2d, spec, v), _LINEN_SPECS, params)
  gdas = jax.tree.map(GlobalDeviceArray.from_jax_array, kept)
  with jse.parallel_functions_output_gda(True):
    losses, state, deleted = _train_linen(mesh_2d, gdas, xs, ys, _arr)
  assert deleted == want_deleted and _leaves_are_gdas(state.params)
  assert jax.tree.map(lambda x: x.is_deleted(), kept) == jax.tree.map(
      lambda g: g.is_deleted(), gdas)
  np.testing.assert_array_equal(losses, want_losses)
  jax.tree.map(np.testing.assert_array_equal, _host(state.params), want_params)


# ---------------------------------------------------------------------------
# flax nnx: a model whose parameters are GDAs, trained with nnx.Optimizer.
# ---------------------------------------------------------------------------


def _train_nnx(to_device, steps=5):
  """Train an `nnx.Linear` whose params are replaced by `to_device(spec,
  value)`, as are the batches; return the losses, the model and its
  optimizer."""
  model = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
  specs = {"kernel": P("x", "y"), "bias": P()}
  placed = jax.tree_util.tree_map_with_path(
      lambda path, v: to_device(specs[path[0].key], np.asarray(v)), nnx.state(model, nnx.Param))
  nnx.update(model, placed)
  # The model holds the very objects given, unwrapped.
  assert all(a is b for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                                    jax.tree.leaves(placed), strict=True))
  optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, x, y):
    def loss_fn(model):
      return jnp.mean((model(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  rng = np.random.default_rng(1)
  losses = []
  for _ in range(steps):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.standard_normal((16, 4)).astype(np.float32)
    losses.append(np.asarray(train_step(model, optimizer, to_device(P("x", None), x),
                                        to_device(P("x", None), y))))
  return np.stack(losses), model, optimizer


def test_nnx_model_with_gda_params_trains_like_jax_arrays(mesh_2d):
  """An nnx model whose `nnx.Param`s hold GDAs (set with `nnx.update`) trains
  with `nnx.Optimizer` under `nnx.jit` exactly as with `jax.Array` params:
  same losses and final params bit for bit, and with the output flag on the
  updated params are GDAs."""
  want_losses, want_model, want_opt = _train_nnx(lambda s, v: _arr(mesh_2d, s, v))
  assert _no_gda(nnx.state(want_model)) and _no_gda(nnx.state(want_opt))
  jax.config.update(FLAG, True)
  seen = []

  def to_gda(spec, value):
    seen.append(g := _gda(mesh_2d, spec, value))
    return g

  losses, model, optimizer = _train_nnx(to_gda)
  assert len(seen) == 2 + 2 * 5
  params = nnx.state(model, nnx.Param)
  assert _leaves_are_gdas(params) and _leaves_are_gdas(nnx.state(optimizer, nnx.OptState))
  np.testing.assert_array_equal(losses, want_losses)
  jax.tree.map(np.testing.assert_array_equal, _host(params),
               _host(nnx.state(want_model, nnx.Param)))


# ---------------------------------------------------------------------------
# flax.serialization
# ---------------------------------------------------------------------------


def _small_state(mesh, offset=0.0):
  w = np.arange(64, dtype=np.float32).reshape(8, 8) / 7 + offset
  b = np.arange(4, dtype=np.float32) - offset
  return {"params": {"w": _gda(mesh, P("x", "y"), w), "b": _gda(mesh, P(), b)},
          "step": np.array(3, np.int32)}, {"w": w, "b": b}


def test_flax_serialization_round_trips_gda_state(mesh_2d):
  """`flax.serialization.to_state_dict` keeps GDA leaves as they are;
  `to_bytes` writes their values, and `from_bytes` with a GDA target (or a
  `TrainState` target holding GDAs) reads back the saved values, exactly as
  for a `jax.Array` target."""
  jax.config.update(FLAG, True)
  state, data = _small_state(mesh_2d)
  sd = serialization.to_state_dict(state)
  assert sd["params"]["w"] is state["params"]["w"]
  blob = serialization.to_bytes(state)
  arr_state = {"params": {k: v.to_jax_array() for k, v in state["params"].items()},
               "step": state["step"]}
  assert serialization.to_bytes(arr_state) == blob  # the same bytes as for jax.Arrays

  target, _ = _small_state(mesh_2d, offset=100.0)
  out = serialization.from_bytes(target, blob)
  arr_target = {"params": {k: v.to_jax_array() for k, v in target["params"].items()},
                "step": target["step"]}
  arr_out = serialization.from_bytes(arr_target, blob)
  assert jax.tree.structure(out) == jax.tree.structure(arr_out)
  assert jax.tree.map(type, out) == jax.tree.map(type, arr_out)  # numpy, as for jax.Arrays
  jax.tree.map(np.testing.assert_array_equal, out, arr_out)
  np.testing.assert_array_equal(out["params"]["w"], data["w"])
  np.testing.assert_array_equal(out["params"]["b"], data["b"])
  assert int(out["step"]) == 3

  # A TrainState (a flax struct) holding GDA params and jitted GDA outputs.
  ts = train_state.TrainState.create(apply_fn=None, params=state["params"],
                                     tx=optax.sgd(0.1))
  ts = jax.jit(lambda s: s.replace(params=jax.tree.map(lambda p: p * 2, s.params)))(ts)
  assert _leaves_are_gdas(ts.params)
  sd = serialization.to_state_dict(ts)
  assert sd["params"]["w"] is ts.params["w"]
  restored = serialization.from_state_dict(ts, sd)
  assert restored.params["w"] is ts.params["w"]
  blank = ts.replace(params=_small_state(mesh_2d, offset=5.0)[0]["params"])
  back = serialization.from_bytes(blank, serialization.to_bytes(ts))
  np.testing.assert_array_equal(back.params["w"], 2 * data["w"])
  np.testing.assert_array_equal(back.params["b"], 2 * data["b"])


# ---------------------------------------------------------------------------
# orbax
# ---------------------------------------------------------------------------


def _assert_saves_recorded(ledger, states) -> None:
  """One device_to_host record per GDA leaf saved, with its bytes (each shard
  of replica 0 once: nothing is fetched whole)."""
  gdas = [x for s in states for x in jax.tree.leaves(s) if isinstance(x, GlobalDeviceArray)]
  assert sorted((r.direction, r.explicit, r.nbytes) for r in ledger.records) == sorted(
      ("device_to_host", True, g.nbytes) for g in gdas)


def test_orbax_checkpointers_save_and_restore_gda_leaves(mesh_2d, tmp_path):
  """Orbax takes GDA leaves as they are: `StandardCheckpointer` saves them
  shard by shard (the ledger records each leaf's save once, device_to_host,
  its replica-0 shards' bytes: nothing is fetched whole), and restoring into a GDA target gives GDAs on the target's mesh and
  `mesh_axes` holding the saved values; `PyTreeCheckpointer` and a
  `CheckpointManager` (several steps, restore the latest) do the same."""
  jax.config.update(FLAG, True)
  state, data = _small_state(mesh_2d)
  state["params"]["w"] = jax.jit(lambda w: w + 1)(state["params"]["w"])  # a jit output GDA
  assert type(state["params"]["w"]) is GlobalDeviceArray
  want_w = data["w"] + 1

  ckptr = ocp.StandardCheckpointer()
  with jse.transfer_ledger() as ledger:
    ckptr.save(tmp_path / "std", state)
    ckptr.wait_until_finished()
  _assert_saves_recorded(ledger, [state])
  target, _ = _small_state(mesh_2d, offset=50.0)
  target["params"]["w"] = _gda(mesh_2d, P(None, "x"), np.zeros((8, 8), np.float32))
  out = ckptr.restore(tmp_path / "std", target)
  ckptr.close()
  for name, want in (("w", want_w), ("b", data["b"])):
    got, tgt = out["params"][name], target["params"][name]
    assert type(got) is GlobalDeviceArray
    assert got.mesh == tgt.mesh and got.mesh_axes == tgt.mesh_axes
    np.testing.assert_array_equal(np.asarray(got), want)
  assert out["params"]["w"].mesh_axes == P(None, "x")
  assert int(out["step"]) == 3

  with jse.transfer_ledger() as ledger:
    ocp.PyTreeCheckpointer().save(tmp_path / "tree", state)
  _assert_saves_recorded(ledger, [state])
  out = ocp.PyTreeCheckpointer().restore(tmp_path / "tree", args=ocp.args.PyTreeRestore(
      item=target, restore_args=checkpoint_utils.construct_restore_args(target)))
  w = out["params"]["w"]
  assert type(w) is GlobalDeviceArray and w.mesh_axes == P(None, "x")
  np.testing.assert_array_equal(np.asarray(w), want_w)

  options = ocp.CheckpointManagerOptions(max_to_keep=2)
  with ocp.CheckpointManager(tmp_path / "mngr", options=options) as mngr:
    saved = []
    with jse.transfer_ledger() as ledger:
      for step in range(3):
        state = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s))(state)
        assert _leaves_are_gdas(state)
        mngr.save(step, args=ocp.args.StandardSave(state))
        saved.append(state)
      mngr.wait_until_finished()
    _assert_saves_recorded(ledger, saved)
    assert mngr.all_steps() == [1, 2]
    out = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(target))
  w = out["params"]["w"]
  assert type(w) is GlobalDeviceArray and w.mesh_axes == P(None, "x") and w.mesh == mesh_2d
  np.testing.assert_array_equal(np.asarray(w), want_w + 3)
  np.testing.assert_array_equal(np.asarray(out["params"]["b"]), data["b"] + 3)
  assert int(out["step"]) == 6


# ---------------------------------------------------------------------------
# chex
# ---------------------------------------------------------------------------


def test_chex_assertions_inspect_gdas(mesh_2d):
  """chex's tree and array assertions read GDAs like `jax.Array`s: each passes
  on the right expectation and raises `AssertionError` on a wrong one."""
  jax.config.update(FLAG, True)
  state, data = _small_state(mesh_2d)
  doubled = jax.jit(lambda t: jax.tree.map(lambda x: x * 2, t))(state["params"])
  assert _leaves_are_gdas(doubled)
  arrays = {k: _arr(mesh_2d, P(), 2 * v) for k, v in data.items()}

  chex.assert_trees_all_close(doubled, arrays)
  chex.assert_trees_all_close(state["params"], data)
  with pytest.raises(AssertionError, match="differ in leaves"):
    chex.assert_trees_all_close(doubled, state["params"])
  with pytest.raises(AssertionError, match="differ in leaves 'w'"):
    chex.assert_trees_all_close(doubled, {"w": arrays["w"] + 1e-3, "b": arrays["b"]})

  chex.assert_shape(doubled["w"], (8, 8))
  chex.assert_shape([doubled["w"], doubled["b"]], [(8, 8), (4,)])
  with pytest.raises(AssertionError, match=r"has shape \(8, 8\) but expected \(8, 4\)"):
    chex.assert_shape(doubled["w"], (8, 4))

  chex.assert_type(doubled["w"], jnp.float32)
  with pytest.raises(AssertionError, match="has type float32 but expected int32"):
    chex.assert_type(doubled["w"], jnp.int32)

  chex.assert_tree_all_finite(doubled)
  bad = _gda(mesh_2d, P("x"), np.array([0, 1, np.inf, 3, 4, 5, 6, np.nan], np.float32))
  with pytest.raises(AssertionError, match="'bad': 'Nonfinite', 'ok': 'Finite'"):
    chex.assert_tree_all_finite({"ok": doubled["w"], "bad": bad})


# ---------------------------------------------------------------------------
# equinox
# ---------------------------------------------------------------------------


class _Linear(eqx.Module):
  w: jax.Array
  b: jax.Array

  def __call__(self, x):
    return x @ self.w + self.b


def test_equinox_filters_treat_gdas_as_arrays(mesh_2d):
  """equinox treats a GDA as an array: `is_array` is true, `filter_jit` passes
  GDA leaves as traced arguments (two GDAs with different values give
  different results from one trace), `partition` / `combine` keep the very
  GDA objects, and `filter_grad` of a Module with GDA fields gives the same
  gradients as with `jax.Array` fields."""
  jax.config.update(FLAG, True)
  a = _gda(mesh_2d, P("x", "y"), np.ones((8, 8), np.float32))
  b = _gda(mesh_2d, P("x", "y"), np.full((8, 8), 3, np.float32))
  assert eqx.is_array(a) and eqx.is_array_like(a)

  traces = []

  @eqx.filter_jit
  def f(x, scale):
    traces.append(None)
    return x * scale

  fa, fb = f(a, 2.0), f(b, 2.0)
  assert len(traces) == 1
  np.testing.assert_array_equal(np.asarray(fa), 2 * np.ones((8, 8)))
  np.testing.assert_array_equal(np.asarray(fb), 6 * np.ones((8, 8)))
  assert type(fa) is GlobalDeviceArray and fa.mesh_axes == P("x", "y")

  tree = {"a": a, "b": b, "fn": jnp.sin, "n": 3}
  dynamic, static = eqx.partition(tree, eqx.is_array)
  assert dynamic["a"] is a and dynamic["b"] is b and dynamic["fn"] is None
  assert static["a"] is None and static["n"] == 3
  again = eqx.combine(dynamic, static)
  assert again["a"] is a and again["b"] is b and again["fn"] is jnp.sin

  rng = np.random.default_rng(2)
  w = rng.standard_normal((8, 4)).astype(np.float32)
  bias = rng.standard_normal((4,)).astype(np.float32)
  x = rng.standard_normal((16, 8)).astype(np.float32)

  def loss(model, x):
    return jnp.mean(model(x) ** 2)

  grad = eqx.filter_jit(eqx.filter_grad(loss))
  gda_model = _Linear(_gda(mesh_2d, P("x", None), w), _gda(mesh_2d, P(), bias))
  gda_grads = grad(gda_model, x)
  eager_grads = eqx.filter_grad(loss)(gda_model, x)
  assert _leaves_are_gdas(gda_grads)
  with jse.parallel_functions_output_gda(False):
    arr_model = _Linear(_arr(mesh_2d, P("x", None), w), _arr(mesh_2d, P(), bias))
    arr_grads = grad(arr_model, x)
  assert _no_gda(arr_grads)
  assert gda_grads.w.sharding.is_equivalent_to(arr_grads.w.sharding, 2)
  for got in (gda_grads, eager_grads):
    jax.tree.map(np.testing.assert_array_equal, _host(got), _host(arr_grads))
