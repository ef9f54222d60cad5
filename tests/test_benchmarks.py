"""The benchmarks that lean on the package's behaviour still run.

`make bench` is not part of `make test`, so a change of behaviour can break a
benchmark unseen until the next measurement (the checkpoint benchmark reads
a copy without its chunk record as another writer's checkpoint, which holds
only if the copy loses the package's mark too). This runs such benchmarks on
tiny inputs, in a fresh process as `make bench` does, and checks that every
variant produced a row. It measures nothing: speed is for `make bench`.
"""

import json
import pathlib
import subprocess
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"

_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_checkpoint
rows = bench_checkpoint.run(reps=1, mib=1, directory=sys.argv[2])
print("ROWS " + json.dumps(sorted({(r["benchmark"], r["variant"]) for r in rows})))
"""


def test_the_checkpoint_benchmark_runs(tmp_path):
  out = subprocess.run([sys.executable, "-c", _RUN, str(BENCHMARKS), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  (line,) = [x for x in out.stdout.splitlines() if x.startswith("ROWS ")]
  variants = {variant for _, variant in json.loads(line[5:])}
  assert {"serialization.run_deserialization (GDA)", "stock run_deserialization",
          "serialization, chunk record removed (unchecked)"} <= variants, variants
