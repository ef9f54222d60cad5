"""Peak live device memory of a donated training-style loop: GDA vs jax.Array.

For each of four variants (GlobalDeviceArray or jax.Array state, with or
without `donate_argnums`) this runs 50 steps of `state = step(state)` on a
64 MiB float32 state sharded over 8 CPU devices, and samples the live bytes
(sum of `nbytes` over `jax.live_arrays()`) every step, right after the step
returns, while both the input and the output could be alive. Without
donation the old state is still alive at that point (about 2x the state);
with donation it has been handed to the output (about 1x).

Run: `.venv/bin/python benchmarks/bench_donation.py [--steps 50] [--mib 64]`.
Targets: GDA+donation <= 1.05x jax.Array+donation, and about half of the
no-donation peak.
"""

import argparse
import gc
import time

import _common  # before jax: sets XLA_FLAGS (8 CPU devices)
import jax
import jax.numpy as jnp
import numpy as np
from _targets import Target, at_most, ratio
from jax.sharding import NamedSharding

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, Mesh
from jax_sharding_ext import PartitionSpec as P

MIB = 2 ** 20


def live_bytes() -> int:
  return sum(a.nbytes for a in jax.live_arrays())


def make_state(mesh, mib: int, kind: str):
  rows = mib * MIB // (4 * 1024)
  sharding = NamedSharding(mesh, P("x"))
  # Computed on device (as a real model's parameters are), 4 bytes per element.
  arr = jax.jit(lambda: jnp.full((rows, 1024), 1.0, jnp.float32), out_shardings=sharding)()
  return GlobalDeviceArray.from_jax_array(arr) if kind == "GDA" else arr


def _run_variant(mesh, kind: str, donate: bool, steps: int, mib: int) -> dict:
  gc.collect()
  baseline = live_bytes()
  step = jax.jit(lambda s: s + 1.0, donate_argnums=0 if donate else None)
  with jse.parallel_functions_output_gda(kind == "GDA"):
    state = make_state(mesh, mib, kind)
    state_bytes = state.nbytes
    step(state if not donate else make_state(mesh, mib, kind)).block_until_ready()  # compile
    gc.collect()
    peak = live_bytes()
    t0 = time.perf_counter()
    for _ in range(steps):
      new = step(state)
      new.block_until_ready()
      peak = max(peak, live_bytes())  # input and output both referenced here
      state = new
      peak = max(peak, live_bytes())
    dt = (time.perf_counter() - t0) / steps
    assert type(state) is (GlobalDeviceArray if kind == "GDA" else type(new))
    value = float(np.asarray(state)[0, 0])
  del state, new
  gc.collect()
  return {"kind": kind, "donate": donate, "peak": peak - baseline, "state": state_bytes,
          "ms": dt * 1e3, "ok": value == 1.0 + steps}


def run(steps: int = 50, mib: int = 64) -> list[dict]:
  """Peak live bytes of the four variants; rows in MiB, ratio vs jax.Array+donation."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
  print(f"\ndonation: {mib} MiB float32 state sharded P('x') over {mesh.size} devices; "
        f"{steps} steps of `s + 1`")

  results = {}
  for kind in ("jax.Array", "GDA"):
    for donate in (True, False):
      r = _run_variant(mesh, kind, donate, steps, mib)
      results[kind, donate] = r
      print(f"  {kind:9s} donate={str(donate):5s}  peak live {r['peak'] / MIB:7.1f} MiB "
            f"({r['peak'] / r['state']:.2f}x state)  {r['ms']:6.2f} ms/step  "
            f"result {'correct' if r['ok'] else 'WRONG'}")
      if not r["ok"]:
        raise RuntimeError(f"{kind} donate={donate}: wrong result after {steps} steps")

  # Not a timing: `median` is the peak over the sampled steps (one run each).
  peaks = {f"{kind}, donate={donate}": r["peak"] for (kind, donate), r in results.items()}
  rows = _common.report(f"donation: peak live bytes, {mib} MiB state, {steps} steps", peaks,
                        "jax.Array, donate=True", unit=MIB, unit_name="MiB")

  gda_d, arr_d = results["GDA", True]["peak"], results["jax.Array", True]["peak"]
  gda_n, arr_n = results["GDA", False]["peak"], results["jax.Array", False]["peak"]
  r1, r2, r3 = gda_d / arr_d, gda_d / gda_n, arr_d / arr_n
  print(f"  GDA+donation / jax.Array+donation peak: {r1:.3f}  (target <= 1.05: "
        f"{'ok' if r1 <= 1.05 else 'MISSED'})")
  print(f"  GDA+donation / GDA no-donation peak:    {r2:.3f}  (target about 0.5: "
        f"{'ok' if abs(r2 - 0.5) <= 0.05 else 'MISSED'})")
  print(f"  jax.Array+donation / no-donation peak:  {r3:.3f}  (stock reference)")
  return rows


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=50)
  ap.add_argument("--mib", type=int, default=64)
  args = ap.parse_args()
  _common.print_environment()
  run(steps=args.steps, mib=args.mib)


def targets() -> list[Target]:
  title = "donation: peak live bytes"
  return [
      at_most("peak live bytes: GDA+donation / jax.Array+donation",
              ratio(title, "GDA, donate=True", "jax.Array, donate=True"), 1.05, "{:.3f}x"),
      Target("peak live bytes: GDA+donation / GDA without donation", "about 0.5x (0.45-0.55)",
             ratio(title, "GDA, donate=True", "GDA, donate=False"), "{:.3f}x",
             lambda v: abs(v - 0.5) <= 0.05),
  ]


if __name__ == "__main__":
  main()
