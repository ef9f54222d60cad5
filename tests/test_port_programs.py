"""GDA-era programs run on 8 devices after `python -m jax_sharding_ext.port --write` alone.

Each program below was written for this test in the style of late-2022
training and checkpoint code (legacy `pjit` with `FROM_GDA`, `with mesh:`,
`jax.experimental.maps` / `PartitionSpec` / `global_device_array` /
`gda_serialization` / `multihost_utils` imports and module attributes,
`jax.config` as a module, the `jax.tree_*` aliases, the output flag,
`.device_buffers`, `.device()`, orbax restore args asking for GDAs, a
notebook; a project whose mesh comes from another of its files, a `with`
over a value that is a `Mesh` on one branch only, reads of the legacy mesh,
names JAX moved, unused imports of removed names, GDA attributes of a jit
output with the output flag off, a copy of an old orbax, a notebook that
initialises the distributed runtime late). The test runs the command line as
a user would (a subprocess), then the rewritten program in a fresh process
on 8 virtual CPU devices with DeprecationWarnings as errors, and checks what
it computed. The unported programs do not even import on today's JAX.
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


def _contents(path):
  if path.is_dir():
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
  return path.read_bytes()


def write_once(path, cwd):
  """`--write` on `path` (a file or a directory); returns (its output lines,
  stderr). A second `--write` changes nothing."""
  res = port("--write", path, cwd=cwd)
  assert res.returncode in (0, 1), res.stderr
  first = _contents(path)
  again = port("--write", path, cwd=cwd)
  assert _contents(path) == first and "in 0 files" in again.stderr, again.stderr
  return res.stdout.splitlines(), res.stderr


def test_training_program_runs_after_write(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(TRAIN)
  unported = run(script)
  assert unported.returncode != 0 and "jax.config" in unported.stderr, unported.stderr

  left, err = write_once(script, tmp_path)
  # The one finding left is a report (the GDA-only private attribute); it runs.
  assert [ln.split(": ", 1)[1].split()[0] for ln in left] == ["JSE205"], left
  assert "fixed 20 findings in 1 file; 1 finding left" in err
  text = script.read_text()
  for old in ("jax.config import", "jax.tree_map(", "with mesh:", "axis_resources=P",
              ".device_buffers", ".device()", "maps.", "pjit_lib."):
    assert old not in text, old
  # The imports whose every use the rewrite replaced go with them
  # (`pjit_lib`, `jax.experimental.multihost_utils`); `jax` stays bound.
  assert "jax.experimental" not in text and "import jax\n" in text
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


# -- a project of two files: values followed across files, reads of the mesh -----

MESHES = '''\
"""The project's mesh helpers (a module of its own)."""
import numpy as np
import jax
from jax.experimental import maps


def get_mesh(config):
  devices = np.asarray(jax.devices()).reshape(config["shape"])
  return maps.Mesh(devices, config["axes"])
'''

PROJECT_TRAIN = '''\
"""Training code of a project whose mesh comes from another of its files."""
import contextlib
import sys
import numpy as np
import jax
import jax.numpy as jnp
from jax.experimental import maps
from jax.experimental import PartitionSpec as P
from jax.experimental.pjit import pjit, with_sharding_constraint
from jax.experimental.sharding import Sharding
from jax.sharding import OpShardingSharding
from jax.abstract_arrays import ShapedArray
from jax.random import KeyArray
from jax._src.config import parallel_functions_output_gda
from meshes import get_mesh

CONFIG = {"shape": (4, 2), "axes": ("data", "model")}


def global_mesh_defined():
  maps_env = maps.thread_resources.env
  return maps_env.physical_mesh.devices.shape != ()


def constrain(x):
  if global_mesh_defined():
    return with_sharding_constraint(x, P("data", None))
  return x


def init(key: KeyArray) -> jnp.ndarray:
  return jax.random.normal(key, (16, 4))


def run(use_mesh):
  mesh = get_mesh(CONFIG)
  if use_mesh:
    context_manager = mesh
  else:
    context_manager = contextlib.nullcontext()
  with context_manager:
    inside = global_mesh_defined()
  step = pjit(lambda x: constrain(x) * 2, in_axis_resources=P("data", None),
              out_axis_resources=P("data", None))
  x = init(jax.random.PRNGKey(0))
  with mesh, parallel_functions_output_gda(True):
    defined = global_mesh_defined()
    out = step(x)
  aval = ShapedArray(out.shape, out.dtype)
  return inside, defined, type(out).__name__, isinstance(out.sharding, Sharding), aval.shape


if __name__ == "__main__":
  print("RESULT", run(use_mesh=False), global_mesh_defined())
'''


def test_a_project_runs_after_write(tmp_path):
  """The mesh comes from the project's other file; a `with` over a value that
  is a `Mesh` on one branch only is left (its common branch runs); reads of
  the legacy mesh see `jax.set_mesh`'s; names JAX moved are where it has them;
  an import of a removed name nothing uses goes."""
  (tmp_path / "meshes.py").write_text(MESHES)
  script = tmp_path / "train.py"
  script.write_text(PROJECT_TRAIN)
  left, err = write_once(tmp_path, tmp_path)
  text = script.read_text()
  line = text.splitlines().index("  with context_manager:") + 1  # a `Mesh` on one branch only
  assert [ln.split(" ", 2)[:2] for ln in left] == [[f"{script}:{line}:8:", "JSE204"]], left
  assert "with jax.set_mesh(mesh), parallel_functions_output_gda(True):" in text
  assert "OpShardingSharding" not in text and "maps." not in text
  assert "def init(key: jax.Array) -> jnp.ndarray:" in text
  out = result(run(script))
  assert out == "(False, True, 'GlobalDeviceArray', True, (16, 4)) False", out


# -- the output flag never turned on: a jit output is a `jax.Array` ---------------

FLAG_OFF = '''\
"""A snippet that reads GDA attributes of a pjit output, the output flag off."""
import numpy as np
import jax
from jax.experimental.maps import Mesh
from jax.experimental import PartitionSpec as P
from jax.experimental.pjit import pjit


def describe(x):  # a ShardedDeviceArray's attributes: reported, not called here
  return x.sharding_spec


def shard_indices(x):
  return jax.pmap(lambda v: v)(x).indices


mesh = Mesh(np.asarray(jax.devices()), ("x",))
f = pjit(lambda x: x * 2, in_axis_resources=P("x"), out_axis_resources=P("x"))
with mesh:
  out = f(np.arange(16.0))
shards = out.local_shards
print("RESULT", len(shards), out.local_data(0).shape, type(out).__name__)
'''


def test_gda_attributes_of_a_jit_output_with_the_flag_off_run_after_write(tmp_path):
  script = tmp_path / "snippet.py"
  script.write_text(FLAG_OFF)
  left, _ = write_once(script, tmp_path)
  assert sorted(ln.split(": ")[1].split()[0] for ln in left) == ["JSE314", "JSE314"], left
  assert "out.addressable_shards" in script.read_text()
  assert result(run(script)) == "8 (2,) ArrayImpl"


# -- a copy of an old orbax in the project ------------------------------------------

VENDORED_ORBAX = '''\
"""A copy of an old orbax, as a project vendors it (its API, not today's)."""
import jax


class ArrayRestoreArgs:
  def __init__(self, restore_type=None, mesh=None, mesh_axes=None):
    self.restore_type, self.mesh, self.mesh_axes = restore_type, mesh, mesh_axes


def restore(value, args):
  return args.restore_type.from_callback(value.shape, args.mesh, args.mesh_axes,
                                         lambda index: value[index])
'''

VENDORED_USER = '''\
"""Restoring a GDA through the project's own copy of orbax."""
import numpy as np
import jax
import orbax.checkpoint as ocp
from jax.experimental.maps import Mesh
from jax.experimental import PartitionSpec as P
from jax.experimental.global_device_array import GlobalDeviceArray

mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("x", "y"))
args = ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, mesh=mesh, mesh_axes=P("x", "y"))
gda = ocp.restore(np.arange(16.0).reshape(8, 2), args)
print("RESULT", type(gda).__name__, len(gda.local_shards))
'''


def test_code_using_a_vendored_orbax_runs_after_write(tmp_path):
  """`jax_sharding_ext.orbax_support` would import today's orbax, which the
  copy shadows here: `--write` does not add it."""
  (tmp_path / "orbax" / "checkpoint").mkdir(parents=True)
  (tmp_path / "orbax" / "__init__.py").write_text("")
  (tmp_path / "orbax" / "checkpoint" / "__init__.py").write_text(VENDORED_ORBAX)
  script = tmp_path / "restore.py"
  script.write_text(VENDORED_USER)
  write_once(tmp_path, tmp_path)
  assert "orbax_support" not in script.read_text()
  assert result(run(script)) == "GlobalDeviceArray 8"


# -- a notebook that initialised the distributed runtime late ----------------------

LATE_INIT_CELLS = [
    "import socket\nimport numpy as np\nimport jax\n"
    "from jax.experimental import PartitionSpec as P\nfrom jax.experimental.maps import Mesh",
    "# Devices: caf\u00e9 \u2014 an unchanged cell keeps its bytes\nprint(jax.devices()[:1])",
    "s = socket.socket(); s.bind(('localhost', 0)); port = s.getsockname()[1]; s.close()\n"
    "jax.distributed.initialize(f'localhost:{port}', 1, 0)",
    "mesh = Mesh(np.asarray(jax.devices()), ('x',))\n"
    "x = jax.tree_map(lambda a: a * 2,\n                 np.arange(8.0))\n"
    "print('RESULT', jax.process_count(), x.sum())",
]


def test_a_notebook_initializing_late_is_reported_where_to_move_it(tmp_path):
  """Today's JAX refuses `jax.distributed.initialize()` after a computation:
  `--write` reports the call (moving code is the author's choice); made where
  the report says, the notebook runs. Cells `--write` does not change keep
  their bytes."""
  cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": c.splitlines(keepends=True)} for c in LATE_INIT_CELLS]
  raw = json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                   indent=1) + "\n"  # escapes non-ASCII characters, as json writes
  path = tmp_path / "late.ipynb"
  path.write_text(raw)
  left, _ = write_once(path, tmp_path)
  assert [ln.split(": ")[0] for ln in left] == [f"{path}:cell 3:2:1"], left
  assert "JSE209" in left[0] and "jax.devices(...)" in left[0]
  data = path.read_text()
  unchanged = json.dumps(cells[1], indent=1).replace("\n", "\n  ")
  assert unchanged in raw and unchanged in data
  sources = ["".join(c["source"]) for c in json.loads(data)["cells"]]
  assert "jax.tree_util.tree_map(lambda a: a * 2,\n                           np.arange" in sources[3]
  script = tmp_path / "late.py"
  script.write_text("\n".join(sources) + "\n")
  assert "must be called before any JAX" in run(script).stderr
  script.write_text("\n".join([sources[0], sources[2], sources[1], sources[3]]) + "\n")
  assert result(run(script)) == f"1 {2 * sum(range(8))}.0"
