"""Shared helpers for the benchmarks: device setup, environment, timing.

Each benchmark script runs stock JAX and jax_sharding_ext side by side in one
process, interleaving the variants call by call so machine noise hits both
alike, and reports medians and ratios.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()


def cpu_model() -> str:
  """The CPU model name from /proc/cpuinfo, or `platform.processor()`."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def environment() -> dict[str, str]:
  import jax
  import jaxlib

  import jax_sharding_ext
  devs = jax.devices()
  return {
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "jax_sharding_ext": jax_sharding_ext.__version__,
      "python": platform.python_version(),
      "machine": f"{platform.machine()}, {os.cpu_count()} cores, {cpu_model()}",
      "devices": f"{len(devs)} x {devs[0].device_kind}",
      "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
  }


def print_environment() -> None:
  for k, v in environment().items():
    print(f"# {k}: {v}")


def interleaved(fns: dict, n: int = 2000, warmup: int = 100,
                teardown: Callable[[Any], None] | None = None) -> dict[str, float]:
  """Median seconds per call of each zero-argument callable, interleaved.

  `teardown`, if given, is called with each call's return value after the
  clock stops (e.g. to free a large result before the next call). Without it
  the result is dropped inside the timed region, as a caller would drop it.
  """
  for f in fns.values():
    for _ in range(warmup):
      if teardown is None:
        f()
      else:
        teardown(f())
  names = list(fns)
  times: dict[str, list[float]] = {k: [] for k in names}
  clock = time.perf_counter
  for i in range(n):
    for k in names if i % 2 == 0 else reversed(names):
      f = fns[k]
      if teardown is None:
        t0 = clock()
        f()
        times[k].append(clock() - t0)
      else:
        t0 = clock()
        out = f()
        times[k].append(clock() - t0)
        teardown(out)
        del out
  return {k: statistics.median(v) for k, v in times.items()}


def report(title: str, medians: dict[str, float], base: str, unit: float = 1e-6,
           unit_name: str = "us") -> list[dict]:
  """Print one line per variant with its ratio to `base`; return rows."""
  rows = []
  print(f"\n{title}")
  for k, v in medians.items():
    ratio = v / medians[base]
    print(f"  {k:<40} {v / unit:10.2f} {unit_name}  {ratio:6.2f}x vs {base}")
    rows.append({"benchmark": title, "variant": k, "median": v / unit, "unit": unit_name,
                 "ratio": ratio, "base": base})
  return rows
