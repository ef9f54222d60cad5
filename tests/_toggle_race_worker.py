"""Worker: one thread dispatches multi-device ordered-effect jits (each a new
function, so each is traced and lowered) while the main thread uninstalls and
reinstalls the package. Prints a JSON summary: calls that ran, calls that got stock's
multi-device ordered-effect ValueError, and any other failure. Argument: seconds to run."""

import json
import os
import sys
import threading
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse

mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.device_put(np.arange(8.0), NamedSharding(mesh, P("x")))
stop = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 2)
outcomes = {"ok": 0, "stock": 0}
bad = []
def dispatch():
  i = 0
  while time.monotonic() < stop:
    i += 1
    def f(v, i=i):  # a new function each time: traced and lowered anew
      jax.debug.print("{}", v.sum() + i, ordered=True)
      return v * 2
    try:
      jax.jit(f)(x).block_until_ready()
      outcomes["ok"] += 1
    except ValueError as e:
      if "not supported for more than 1 device" in str(e):
        outcomes["stock"] += 1
      else:
        bad.append(repr(e)[:300])
    except Exception as e:
      bad.append(repr(e)[:300])
t = threading.Thread(target=dispatch)
t.start()
n = 0
while time.monotonic() < stop:
  jse.uninstall()
  time.sleep(0.002)
  jse.install()
  time.sleep(0.002)
  n += 1
t.join()
jax.effects_barrier()
print(json.dumps({"toggles": n, **outcomes, "bad": bad[:3]}))
