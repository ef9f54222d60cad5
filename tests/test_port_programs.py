"""GDA-era programs run on 8 devices after `python -m jax_sharding_ext.port --write` alone.

Each program below was written for this test in the style of late-2022
training and checkpoint code (legacy `pjit` with `FROM_GDA`, `with mesh:`,
`jax.experimental.maps` / `PartitionSpec` / `global_device_array` /
`gda_serialization` / `multihost_utils` imports and module attributes,
`jax.config` as a module, the `jax.tree_*` aliases, the output flag,
`.device_buffers`, `.device()`, orbax restore args asking for GDAs, a
notebook). The test runs the command line as a user would (a subprocess),
then the rewritten program in a fresh process on 8 virtual CPU devices with
DeprecationWarnings as errors, and checks what it computed. The unported
program does not even import on today's JAX.
"""

import json
import os
import re
import subprocess
import sys

import pytest

TRAIN = '''\
"""A partitioned training loop as GDA-era code wrote it."""
import numpy as np
import jax
import jax.numpy as jnp
from jax.config import config
from jax.experimental import maps
from jax.experimental import pjit as pjit_lib
from jax.experimental import PartitionSpec as P
from jax.experimental.pjit import pjit, FROM_GDA
from jax.experimental.global_device_array import GlobalDeviceArray
from jax.experimental import global_device_array as gda_lib
import jax.experimental.multihost_utils

config.update("jax_parallel_functions_output_gda", True)


def make_mesh():
  devices = np.asarray(jax.devices()).reshape(4, 2)
  return maps.Mesh(devices, ("data", "model"))


def init_params(rng):
  return {"w": jax.random.normal(rng, (16, 8)), "b": jnp.zeros((8,))}


def loss_fn(params, batch):
  h = batch @ params["w"] + params["b"]
  h = pjit_lib.with_sharding_constraint(h, axis_resources=P("data", None))
  return jnp.mean(h ** 2)


def train_step(params, batch):
  loss, grads = jax.value_and_grad(loss_fn)(params, batch)
  params = jax.tree_map(lambda p, g: p - 0.1 * g, params, grads)
  return params, loss


def main():
  mesh = make_mesh()
  data = np.arange(64 * 16, dtype=np.float32).reshape(64, 16) / 1000
  batch = GlobalDeviceArray.from_callback((64, 16), mesh, P("data", None),
                                          lambda index: data[index])
  assert gda_lib.get_shard_shape((64, 16), mesh, P("data", None)) == (16, 16)
  param_spec = {"w": P(None, "model"), "b": P("model")}
  with mesh:
    params = pjit(init_params, in_axis_resources=None,
                  out_axis_resources=param_spec)(jax.random.PRNGKey(0))
    step = pjit(train_step, in_axis_resources=(param_spec, FROM_GDA),
                out_axis_resources=(param_spec, None), donate_argnums=0)
    losses = []
    for _ in range(3):
      params, loss = step(params, batch)
      losses.append(float(loss))
  assert isinstance(params["w"], GlobalDeviceArray), type(params["w"])
  assert params["w"].mesh_axes == P(None, "model")
  buffers = params["w"].device_buffers
  assert [b.device() for b in buffers] == list(mesh.local_devices)
  if not config.jax_array:  # the GDA branch of code written for both
    assert len(params["w"]._device_buffers) == 8
  host_w = jax.experimental.multihost_utils.process_allgather(params["w"])
  leaves = jax.tree_leaves(params)
  print("RESULT", losses, host_w.shape, len(leaves))


if __name__ == "__main__":
  main()
'''

CHECKPOINT = '''\
"""Checkpoint code as GDA-era programs wrote it."""
import os
import sys
import numpy as np
import jax
import orbax.checkpoint
from jax import tree_multimap
from jax.experimental.maps import Mesh
from jax.experimental.pjit import PartitionSpec
from jax.experimental import global_device_array
from jax.experimental.gda_serialization import serialization
from jax.experimental import multihost_utils
from jax.experimental.sharding import MeshPspecSharding

jax.config.update("jax_parallel_functions_output_gda", True)


def main(ckpt_dir):
  mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4), ("x", "y"))
  spec = PartitionSpec("x", "y")
  data = np.arange(8 * 8, dtype=np.float32).reshape(8, 8)
  gda = global_device_array.GlobalDeviceArray.from_callback(
      (8, 8), mesh, spec, lambda index: data[index])
  assert MeshPspecSharding(mesh, spec) == gda.sharding

  specs = [serialization.get_tensorstore_spec(os.path.join(ckpt_dir, "w"))]
  serialization.run_serialization([gda], specs)
  restored, = serialization.run_deserialization([mesh], [PartitionSpec("y")], specs)
  assert isinstance(restored, global_device_array.GlobalDeviceArray)

  checkpointer = orbax.checkpoint.PyTreeCheckpointer()
  checkpointer.save(os.path.join(ckpt_dir, "orbax"), {"w": gda})
  restore_args = {"w": orbax.checkpoint.ArrayRestoreArgs(
      restore_type=global_device_array.GlobalDeviceArray, mesh=mesh, mesh_axes=spec)}
  state = checkpointer.restore(os.path.join(ckpt_dir, "orbax"), restore_args=restore_args)
  assert isinstance(state["w"], global_device_array.GlobalDeviceArray), type(state["w"])
  assert state["w"].mesh_axes == spec

  doubled = tree_multimap(lambda a, b: a + b, {"w": restored}, state)
  gathered = multihost_utils.process_allgather(restored)
  multihost_utils.sync_global_devices("done")
  print("RESULT", gathered.shape, float(gathered.sum()), float(doubled["w"].sum()))


if __name__ == "__main__":
  main(sys.argv[1])
'''

# A notebook's code cells (IPython lines included); the cells share one namespace.
CELLS = [
    "%load_ext autoreload\nimport numpy as np\nimport jax\n"
    "from jax.experimental import maps, PartitionSpec\n"
    "from jax.experimental.pjit import pjit",
    "mesh = maps.Mesh(np.asarray(jax.devices()).reshape(8), ('x',))\n"
    "f = pjit(lambda x: x * 2, in_axis_resources=PartitionSpec('x'),\n"
    "         out_axis_resources=PartitionSpec('x'))",
    "with mesh:\n  y = f(np.arange(16.0))\n"
    "print('RESULT', jax.tree_map(lambda a: a.sum(), {'y': y})['y'].item(),\n"
    "      len(y.device_buffers))",
]


def _env():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  return env


def port(*args, cwd):
  return subprocess.run([sys.executable, "-m", "jax_sharding_ext.port", *map(str, args)],
                        capture_output=True, text=True, timeout=300, cwd=cwd, env=_env())


def run(script, *args):
  return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", str(script),
                         *map(str, args)], capture_output=True, text=True, timeout=300,
                        cwd=script.parent, env=_env())


def result(res):
  assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
  found = re.findall(r"^RESULT (.*)$", res.stdout, re.M)
  assert len(found) == 1, res.stdout
  return found[0]


def write_once(path, cwd):
  """`--write` on `path`; returns (its output lines, stderr). A second `--write`
  changes nothing."""
  res = port("--write", path, cwd=cwd)
  assert res.returncode in (0, 1), res.stderr
  first = path.read_bytes()
  again = port("--write", path, cwd=cwd)
  assert path.read_bytes() == first and "in 0 files" in again.stderr, again.stderr
  return res.stdout.splitlines(), res.stderr


def test_training_program_runs_after_write(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(TRAIN)
  unported = run(script)
  assert unported.returncode != 0 and "jax.config" in unported.stderr, unported.stderr

  left, err = write_once(script, tmp_path)
  # The one finding left is a report (the GDA-only private attribute); it runs.
  assert [ln.split(": ", 1)[1].split()[0] for ln in left] == ["JSE205"], left
  assert "fixed 18 findings in 1 file; 1 finding left" in err
  text = script.read_text()
  for old in ("jax.config import", "jax.tree_map(", "with mesh:", "axis_resources=P",
              ".device_buffers", ".device()", "maps.", "pjit_lib."):
    assert old not in text, old
  # What still exists in today's JAX stays, unused or not.
  assert [ln for ln in text.splitlines() if "jax.experimental" in ln] == [
      "from jax.experimental import pjit as pjit_lib", "import jax.experimental.multihost_utils"]
  assert "with jax.set_mesh(mesh):" in text and "import jax_sharding_ext\n" in text
  assert '"""A partitioned training loop as GDA-era code wrote it."""\n' in text

  out = result(run(script))
  values = [float(v) for v in re.findall(r"[\d.]+", out.split("]")[0])]
  assert len(values) == 3 and values == sorted(values, reverse=True), out
  # process_allgather of a GDA is its global value (stock would stack it).
  assert out.endswith("(16, 8) 2"), out


def test_checkpoint_program_runs_after_write(tmp_path):
  pytest.importorskip("orbax.checkpoint")
  pytest.importorskip("tensorstore")
  script = tmp_path / "ckpt.py"
  script.write_text(CHECKPOINT)
  left, err = write_once(script, tmp_path)
  assert left == [] and "0 findings left" in err, (left, err)
  text = script.read_text()
  assert "import jax_sharding_ext.orbax_support\n" in text
  assert "from jax.sharding import NamedSharding as MeshPspecSharding\n" in text
  assert "from jax.tree_util import tree_map as tree_multimap\n" in text
  (tmp_path / "ckpt").mkdir()
  out = result(run(script, tmp_path / "ckpt"))
  total = float(sum(range(64)))
  assert out == f"(8, 8) {total} {2 * total}", out


def test_notebook_runs_after_write(tmp_path):
  nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# GDA-era"]}]
        + [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": cell.splitlines(keepends=True)} for cell in CELLS],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
  path = tmp_path / "gda.ipynb"
  path.write_text(json.dumps(nb, indent=1) + "\n")
  left, err = write_once(path, tmp_path)
  assert left == [], left
  cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
  sources = ["".join(c["source"]) for c in cells]
  assert sources[0].startswith("%load_ext autoreload\n")  # IPython lines kept as they were
  assert "with jax.set_mesh(mesh):" in sources[2]
  # The code cells, IPython lines left out, run as one program.
  script = tmp_path / "cells.py"
  script.write_text("\n".join(line for s in sources for line in s.splitlines()
                              if not line.startswith("%")) + "\n")
  assert result(run(script)) == f"{2 * sum(range(16))}.0 8"
