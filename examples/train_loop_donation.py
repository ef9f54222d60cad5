"""A small sharded training loop whose GlobalDeviceArray state is donated.

Linear regression with momentum SGD on 8 CPU devices (a 4 x 2 mesh: "data"
splits the batch, "model" splits the weight columns). The training state
(weights, bias and their momenta) lives in GlobalDeviceArrays and is donated to
every step with the legacy `pjit(..., donate_argnums=0)`, so XLA writes the
new state into the old state's memory: live device memory stays flat across
steps instead of holding two copies of the state at every step boundary.

Run: `python examples/train_loop_donation.py`
"""

import os
import re

# The device count must be set before JAX starts its CPU backend.
_flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                os.environ.get("XLA_FLAGS", "")).split()
os.environ["XLA_FLAGS"] = " ".join(["--xla_force_host_platform_device_count=8", *_flags])
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jax_sharding_ext import (  # noqa: E402
  FROM_GDA,
  GlobalDeviceArray,
  Mesh,
  parallel_functions_output_gda,
  pjit,
)
from jax_sharding_ext import PartitionSpec as P  # noqa: E402

FEATURES, OUTPUTS, BATCH, STEPS = 1024, 512, 256, 12
LR, MOMENTUM = 0.01, 0.8


def live_mib() -> float:
  """Device memory held by live arrays (GDAs are views: counted once)."""
  return sum(a.nbytes for a in jax.live_arrays()) / 2 ** 20


def main() -> None:
  print(f"jax {jax.__version__}, {jax.device_count()} devices")
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
  rng = np.random.default_rng(0)
  true_w = rng.normal(size=(FEATURES, OUTPUTS)).astype(np.float32) / np.sqrt(FEATURES)

  def gda(value, spec):
    return GlobalDeviceArray.from_callback(value.shape, mesh, spec, lambda i: value[i])

  zeros_w = np.zeros((FEATURES, OUTPUTS), np.float32)
  zeros_b = np.zeros((OUTPUTS,), np.float32)
  state = {"w": gda(zeros_w, P(None, "model")), "b": gda(zeros_b, P("model")),
           "mw": gda(zeros_w, P(None, "model")), "mb": gda(zeros_b, P("model"))}
  state_specs = {"w": P(None, "model"), "b": P("model"),
                 "mw": P(None, "model"), "mb": P("model")}

  def batch(step):
    x = np.random.default_rng(step).normal(size=(BATCH, FEATURES)).astype(np.float32)
    return gda(x, P("data")), gda(x @ true_w, P("data", "model"))

  def train_step(state, x, y):
    def loss_fn(w, b):
      return jnp.mean(jnp.sum((x @ w + b - y) ** 2, axis=-1))

    loss, (gw, gb) = jax.value_and_grad(loss_fn, argnums=(0, 1))(state["w"], state["b"])
    mw = MOMENTUM * state["mw"] + gw
    mb = MOMENTUM * state["mb"] + gb
    new = {"w": state["w"] - LR * mw, "b": state["b"] - LR * mb, "mw": mw, "mb": mb}
    return new, loss

  # The GDA-era spelling: specs per argument, the state keeps its own sharding
  # (FROM_GDA), the state is donated, outputs come back as GDAs.
  step_fn = pjit(train_step, in_axis_resources=(FROM_GDA, FROM_GDA, FROM_GDA),
                 out_axis_resources=(state_specs, None), donate_argnums=0)

  state_mib = sum(v.nbytes for v in state.values()) / 2 ** 20
  print(f"state: {state_mib:.2f} MiB in {len(state)} GlobalDeviceArrays on mesh "
        f"{dict(mesh.shape)}; donated to every step")
  readings, losses = [], []
  # `with mesh:` works too (JAX 0.10.2 deprecates it in favour of jax.set_mesh).
  with jax.set_mesh(mesh), parallel_functions_output_gda(True):
    for step in range(STEPS):
      x, y = batch(step)
      old = state
      state, loss = step_fn(state, x, y)
      assert all(v.is_deleted() for v in old.values()), "state was not donated"
      assert all(type(v) is GlobalDeviceArray for v in state.values())
      del old, x, y
      readings.append(live_mib())
      losses.append(float(np.asarray(loss)))
      print(f"step {step:2d}  loss {losses[-1]:9.3f}  "
            f"live device memory {readings[-1]:6.2f} MiB")

  spread = max(readings[1:]) - min(readings[1:])
  print(f"live memory across steps 1..{STEPS - 1}: min {min(readings[1:]):.2f} MiB, "
        f"max {max(readings[1:]):.2f} MiB (spread {spread:.2f} MiB)")
  assert spread < 0.01, "live memory grew across steps"
  assert losses[-1] < 0.5 * losses[0], "the model did not learn"
  print("live memory stayed flat: the donated state was reused in place")


if __name__ == "__main__":
  main()
