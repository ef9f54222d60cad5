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


_CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import check
def row(variant, median, ratio, unit="us", base="jax.Array"):
  return {"benchmark": "b", "variant": variant, "median": median, "unit": unit,
          "ratio": ratio, "base": base}
baseline = [row("jax.Array", 10.0, 1.0), row("gda", 11.0, 1.1), row("tiny", 0.5, 5.0),
            row("entries", 0.0, float("nan"), unit="entries", base="-"),
            row("throughput", 2.0, 1.0, unit="GB/s")]
def drifts(now):
  return {x["variant"]: round(x["drift"], 3) for x in check.compare(baseline, now)}
print("RESULT " + json.dumps({
    "worse": drifts([row("gda", 13.0, 1.3), row("tiny", 0.6, 9.0)]),
    "slightly": drifts([row("gda", 11.5, 1.15)]),
    "better": drifts([row("gda", 10.0, 1.0)]),
    "grew": drifts([row("entries", 3.0, float("nan"), unit="entries", base="-")]),
    "slower": drifts([row("throughput", 1.5, 0.75, unit="GB/s")]),
}))
def point(leaves, ratio):
  return {**row("GlobalDeviceArray", 10.0 * ratio, ratio),
          "benchmark": f"scaling: jit dispatch, {leaves} leaves, flag on, donated"}
baseline = [point(1, 1.2), point(10, 1.5)]
print("CURVE " + json.dumps({
    "point moved": drifts([point(1, 1.45), point(10, 1.5)]),
    "worst moved": drifts([point(1, 1.2), point(10, 1.8)]),
}))
"""


def test_bench_check_judges_ratios_against_the_baseline():
  """`make bench-check` compares each side-by-side ratio with the committed
  one: a higher time ratio or a lower throughput ratio is worse, a count
  that must not grow fails when it grows, and a ratio of medians under 3 us
  is not compared (it is noise)."""
  out = subprocess.run([sys.executable, "-c", _CHECK, str(BENCHMARKS)], capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
  got = json.loads(line[7:])
  assert got["worse"] == {"gda": round(1.3 / 1.1 - 1, 3)}  # 18% worse; "tiny" not compared
  # The dispatch curve counts by its worst point.
  (line,) = [x for x in out.stdout.splitlines() if x.startswith("CURVE ")]
  assert json.loads(line[6:]) == {"point moved": {"GlobalDeviceArray": 0.0},
                                  "worst moved": {"GlobalDeviceArray": 0.2}}
  assert 0 < got["slightly"]["gda"] < 0.10
  assert got["better"]["gda"] < 0
  assert got["grew"]["entries"] == float("inf")
  assert round(got["slower"]["throughput"], 3) == round(1 / 0.75 - 1, 3)
