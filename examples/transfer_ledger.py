"""Transfer guards and the transfer ledger for GlobalDeviceArrays, on 8 CPU devices.

Run: .venv/bin/python examples/transfer_ledger.py
"""

import os

# Eight virtual CPU devices; must be set before JAX starts its CPU backend.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import logging
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, Mesh
from jax_sharding_ext import PartitionSpec as P


def main():
  logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
  print(f"jax {jax.__version__}, {jax.device_count()} devices")
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  data = np.arange(16, dtype=np.float32).reshape(8, 2)

  # 1. The ledger: what moved, in which direction, how many bytes, from where.
  with jse.transfer_ledger() as ledger:
    gda = GlobalDeviceArray.from_callback((8, 2), mesh, P("x", "y"), lambda i: data[i])
    replicated = GlobalDeviceArray.from_callback((8, 2), mesh, P(), lambda i: data[i])
    resharded = jax.device_put(gda, NamedSharding(mesh, P("x")))
    host = jax.device_get(gda)
    np.asarray(replicated)
  print(ledger.summary())
  for rec in ledger.records:
    print(f"  {rec.direction:<17} explicit={rec.explicit!s:<5} {rec.nbytes:>4} bytes  "
          f"at line {rec.site.rpartition(':')[2]}")
  assert ledger.totals()["host_to_device"] == (2, data.nbytes + 8 * data.nbytes)
  assert np.array_equal(host, data) and resharded.shape == (8, 2)

  # 2. The guard: jax.transfer_guard governs GDA transfers as it does jax.Array's.
  #    Explicit transfers pass "disallow"; an implicit reshard does not.
  other_order = Mesh(np.array(jax.devices()[::-1]).reshape(4, 2), ("x", "y"))
  with jax.transfer_guard("disallow"):
    jax.device_put(gda, NamedSharding(mesh, P("y")))  # explicit: allowed
    try:
      jax.jit(lambda a: a + 1, in_shardings=NamedSharding(other_order, P("x", "y")))(gda)
    except RuntimeError as e:
      print("blocked:", str(e).split(". ")[0])
  print("still usable:", np.asarray(gda).sum())

  # 3. "log_explicit" logs every transfer (logger `jax_sharding_ext`) with the call site.
  with jax.transfer_guard("log_explicit"):
    jax.device_put(gda, NamedSharding(mesh, P(None, "y")))


if __name__ == "__main__":
  main()
