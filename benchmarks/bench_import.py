"""Import time: `import jax` vs `import jax; import jax_sharding_ext`.

Each sample is the wall time of a fresh `python -c ...` subprocess (same
interpreter and environment as this script), so nothing is cached in-process;
the two commands are interleaved (`_common.interleaved`) and medians reported.
The difference includes everything `import jax_sharding_ext` does on top of
`import jax` (its own modules, the `jax._src` modules it pulls in that `import
jax` does not, `install()`).

Target: the package adds less than 10% to `import jax` wall time.

To see what is slow: `.venv/bin/python -X importtime -c "import jax;
import jax_sharding_ext" 2>&1 | sort -t'|' -k2 -n | tail`.

Run: `.venv/bin/python benchmarks/bench_import.py [--runs 21]`
"""

import argparse
import subprocess
import sys

import _common
from _targets import Target, at_most

JAX = "import jax"
EXT = "import jax; import jax_sharding_ext"


def _python(code: str):
  cmd = [sys.executable, "-c", code]
  return lambda: subprocess.run(cmd, check=True)


def run(runs: int = 21, warmup: int = 2) -> list[dict]:
  print(f"\nimport time: {runs} interleaved fresh subprocesses per command")
  res = _common.interleaved({JAX: _python(JAX), EXT: _python(EXT)}, n=runs, warmup=warmup)
  rows = _common.report("import time (fresh subprocess)", res, JAX, unit=1e-3,
                        unit_name="ms")
  added = res[EXT] / res[JAX] - 1
  print(f"  import jax_sharding_ext adds {(res[EXT] - res[JAX]) * 1e3:.0f} ms = "
        f"{added * 100:.1f}% to import jax  (target < 10%: {'ok' if added < 0.10 else 'MISSED'})")
  return rows


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--runs", type=int, default=21, help="subprocesses per command")
  args = ap.parse_args()
  _common.print_environment()
  run(runs=args.runs)


def targets() -> list[Target]:
  return [at_most("import time added by `import jax_sharding_ext` to `import jax`",
                  lambda r: 100 * (r.median("import time", "import jax; import jax_sharding_ext")
                                   / r.median("import time", "import jax") - 1),
                  10, "{:.1f}%")]


if __name__ == "__main__":
  main()
