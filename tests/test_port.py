"""The porting tool (`python -m jax_sharding_ext.port`): findings, `--write`, errors.

A GDA-era script is checked for its exact findings, rewritten, and run;
small snippets pin each finding code and the rewrite's formatting; the tables
are checked against today's JAX and this package, so a message never names a
replacement that does not exist.
"""

import ast
import importlib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

import jax_sharding_ext
from jax_sharding_ext import port
from jax_sharding_ext.port import _names, _reports, _rules
from jax_sharding_ext.port.__main__ import main

REPO = pathlib.Path(__file__).parent.parent
LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>JSE\d{3}) (?P<msg>.+)$")

# A GDA-era training script in the style of 2022 code (legacy pjit, FROM_GDA,
# `with mesh:`, the `jax_array` branch, multihost_utils through `jax`), and the
# (code, line) of every finding in it.
TRAIN = """\
import jax
import jax.experimental.multihost_utils
import numpy as np
from jax.experimental import PartitionSpec as P  # the spec class
from jax.experimental.maps import Mesh
from jax.experimental.pjit import pjit, FROM_GDA
from jax.experimental.global_device_array import GlobalDeviceArray

data = np.arange(16, dtype=np.float32).reshape(8, 2)
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
batch = GlobalDeviceArray.from_callback((8, 2), mesh, P("x", "y"), lambda i: data[i])
step = pjit(lambda x: x * 2, in_axis_resources=FROM_GDA, out_axis_resources=P("x", "y"))
with mesh:
  out = step(batch)
if jax.config.jax_array:
  out = out.addressable_data(0)
total = jax.experimental.multihost_utils.process_allgather(out)
sizes = jax.tree_map(np.size, total)
"""
TRAIN_FINDINGS = [("JSE110", 2), ("JSE104", 4), ("JSE104", 5), ("JSE103", 6), ("JSE103", 6), ("JSE101", 7),
                  ("JSE204", 13), ("JSE201", 15), ("JSE203", 17), ("JSE301", 18)]


@pytest.fixture
def cli(capsys):
  """Runs `main(args)`; returns (exit status, findings as (code, line), stdout, stderr)."""
  def run(*args):
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    found = [(m["code"], int(m["line"])) for m in map(LINE.match, out.splitlines()) if m]
    return status, found, out, err
  return run


def load(path, name):
  spec = importlib.util.spec_from_file_location(f"ported_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def replaced_imports(source):
  """(module, name) of every import from this package or `jax.lax` in `source`."""
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and node.module and (
        node.module.split(".")[0] == "jax_sharding_ext" or node.module == "jax.lax"):
      yield from ((node.module, a.name) for a in node.names)


def assert_imports_resolve(source):
  pairs = list(replaced_imports(source))
  for module, name in pairs:
    mod = importlib.import_module(module)
    assert name == "*" or hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), (module, name)
  return pairs


def assert_port_invariants(source, path="<source>"):
  """After `fix`: it compiles, its new imports resolve, the findings left are the
  ones of before that `--write` does not fix, each said once, and fixing again
  changes nothing. A fixable finding says so; no message is cut short."""
  before = port.check(source, path)
  assert all(f.message.endswith(_rules.WRITE) == f.fixable for f in before), before
  assert not any("...`" in f.message for f in before)  # code is never cut short
  fixed = port.fix(source)
  compile(fixed, path, "exec")
  assert_imports_resolve(fixed)
  after = port.check(fixed, path)
  assert not any(f.fixable for f in after)
  assert sorted((f.code, f.message) for f in after) == sorted(
      (f.code, f.message) for f in before if not f.fixable)
  assert len({(f.line, f.col, f.code) for f in after}) == len(after)
  assert port.fix(fixed) == fixed
  return fixed


# -- a whole GDA-era script ---------------------------------------------------------


def test_script_findings_write_diff_and_run(cli, tmp_path, mesh_2d):
  path = tmp_path / "train.py"
  path.write_text(TRAIN)
  status, found, out, err = cli(path)
  assert status == 1 and found == TRAIN_FINDINGS, out
  assert all(line.startswith(f"{path}:") for line in out.splitlines())
  assert all(line.endswith("(--write fixes this)") for line in out.splitlines())
  assert "10 findings (10 fixable with --write) in 1 file" in err

  status, _, out, err = cli("--diff", path)
  assert status == 1 and path.read_text() == TRAIN and "nothing written" in err
  changed = [ln for ln in out.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
  assert changed == [
      "-import jax.experimental.multihost_utils",
      "+import jax_sharding_ext",
      "-from jax.experimental import PartitionSpec as P  # the spec class",
      "-from jax.experimental.maps import Mesh",
      "-from jax.experimental.pjit import pjit, FROM_GDA",
      "-from jax.experimental.global_device_array import GlobalDeviceArray",
      "+from jax_sharding_ext import PartitionSpec as P  # the spec class",
      "+from jax_sharding_ext import Mesh",
      "+from jax_sharding_ext import pjit, FROM_GDA",
      "+from jax_sharding_ext import GlobalDeviceArray",
      "-with mesh:",
      "+with jax.set_mesh(mesh):",
      "-total = jax.experimental.multihost_utils.process_allgather(out)",
      "-sizes = jax.tree_map(np.size, total)",
      "+total = jax_sharding_ext.multihost_utils.process_allgather(out)",
      "+sizes = jax.tree_util.tree_map(np.size, total)",
  ]

  status, found, _, err = cli("--write", path)
  fixed = path.read_text()
  assert (status, found) == (0, []) and "fixed 10 findings in 1 file; 0 findings left" in err
  assert_port_invariants(TRAIN, str(path))
  status, _, _, err = cli("--write", path)  # idempotent
  assert path.read_text() == fixed and "fixed 0 findings in 0 files" in err

  # The rewritten script runs here (warnings are errors: no deprecated `with mesh:`).
  module = load(path, "train")
  assert module.sizes == 16 and np.array_equal(module.total.reshape(8, 2), module.data * 2)


# -- each finding, on small snippets -----------------------------------------------

CASES = {
    "gda class": ("from jax.experimental.global_device_array import GlobalDeviceArray, Shard\n",
                  [("JSE101", 1), ("JSE101", 1)]),
    "gda module names": ("from jax.experimental.global_device_array import Shape, _hashed_index\n",
                         [("JSE101", 1), ("JSE101", 1)]),
    "gda module": ("from jax.experimental import global_device_array as gda_lib\n"
                   "import jax.experimental.global_device_array as g2\n"
                   "x = gda_lib.get_shard_indices, g2._hashed_index, gda_lib._gone\n",
                   [("JSE102", 1), ("JSE102", 2), ("JSE307", 3)]),
    "gda through jax": ("import jax.experimental.global_device_array\n"
                        "jax.experimental.global_device_array.GlobalDeviceArray\n",
                        [("JSE307", 1), ("JSE306", 2)]),
    "legacy pjit": ("from jax.experimental.pjit import pjit, FROM_GDA\n"
                    "f = pjit(g, in_axis_resources=FROM_GDA, out_axis_resources=None)\n",
                    [("JSE103", 1), ("JSE103", 1)]),
    "pjit through its module": (
        "from jax.experimental import pjit as pjit_lib\n"
        "f = pjit_lib.pjit(g, in_axis_resources=pjit_lib.FROM_GDA)\n"
        "def h(pjit_lib):\n  return pjit_lib.FROM_GDA\n",
        [("JSE110", 1), ("JSE305", 2), ("JSE306", 2)]),
    "mesh and spec": ("from jax.experimental.maps import Mesh\nfrom jax.experimental import "
                      "PartitionSpec as P\nfrom jax.interpreters.pxla import Mesh as M2, "
                      "PartitionSpec as P2\nfrom jax.experimental.pjit import PartitionSpec\n",
                      [("JSE104", 1), ("JSE104", 2), ("JSE104", 3), ("JSE104", 3),
                       ("JSE104", 4)]),
    "multihost": ("from jax.experimental import multihost_utils\n"
                  "import jax.experimental.multihost_utils as mhu\n"
                  "from jax.experimental.multihost_utils import process_allgather, "
                  "sync_global_devices\n",
                  [("JSE105", 1), ("JSE105", 2), ("JSE105", 3)]),
    "multihost through jax": ("import jax\nimport jax.experimental.multihost_utils\n"
                              "jax.experimental.multihost_utils.process_allgather(x)\n"
                              "jax.experimental.multihost_utils.host_local_array_to_global_array("
                              "x, m, p)\njax.experimental.multihost_utils.sync_global_devices('a')\n"
                              "jax.experimental.multihost_utils.broadcast_one_to_all(x)\n"
                              "jax.experimental.multihost_utils.assert_equal(x)\n",
                              [("JSE203", 3), ("JSE203", 4), ("JSE203", 6), ("JSE203", 7)]),
    "serialization": ("from jax.experimental.gda_serialization import serialization\n"
                      "import jax.experimental.gda_serialization.serialization as ser\n"
                      "from jax.experimental.gda_serialization.serialization import "
                      "run_serialization, _gone\n",
                      [("JSE106", 1), ("JSE106", 2), ("JSE106", 3), ("JSE307", 3)]),
    "with_sharding_constraint": ("from jax.experimental.pjit import with_sharding_constraint\n"
                                 "with_sharding_constraint(x, P('x'))\n"
                                 "with_sharding_constraint(x, axis_resources=P('x'))\n",
                                 [("JSE107", 1), ("JSE310", 3)]),
    "jax_array": ("import jax\nfrom jax import config\nif jax.config.jax_array or "
                  "config.jax_array:\n  pass\njax.config.read('jax_array')\n",
                  [("JSE201", 3), ("JSE201", 3), ("JSE201", 5)]),
    "config module": ("from jax.config import config\nimport jax.config\nconfig.update("
                      "'jax_parallel_functions_output_gda', True)\nconfig.update('jax_array', "
                      "False)\nconfig.update('jax_enable_x64', True)\n",
                      [("JSE309", 1), ("JSE309", 2), ("JSE202", 3), ("JSE202", 4)]),
    "with mesh": ("import jax\nfrom jax.sharding import Mesh\nm = Mesh(d, ('x',))\n"
                  "with mesh:\n  pass\nwith self.global_mesh, open(f) as g:\n  pass\n"
                  "with m:\n  pass\nwith Mesh(d, ('x',)):\n  pass\nwith jax.make_mesh((8,), "
                  "('x',)):\n  pass\nwith jax.set_mesh(mesh), mesh_lock, jax.sharding.use_mesh("
                  "mesh):\n  pass\n",
                  [("JSE204", 4), ("JSE204", 6), ("JSE204", 8), ("JSE204", 10), ("JSE204", 12),
                   ("JSE311", 14)]),
    "tree aliases": ("import jax\nfrom jax import tree_multimap\njax.tree_map(f, x)\n"
                     "jax.tree_leaves(x)\njax.tree_util.tree_multimap(f, x)\njax.tree.map(f, x)\n"
                     "jax.tree_util.tree_map(f, x)\n",
                     [("JSE301", 2), ("JSE301", 3), ("JSE301", 4), ("JSE301", 5)]),
    "xmap": ("from jax.experimental.maps import xmap, Mesh\nimport jax.experimental.maps as maps\n"
             "maps.xmap(f, in_axes=['i'], out_axes=['i'])\nmaps.mesh(d, ('x',))\n",
             [("JSE302", 1), ("JSE104", 1), ("JSE307", 2), ("JSE302", 3), ("JSE308", 4)]),
    "array types": ("import jax\nimport jax.numpy as jnp\nfrom jax.interpreters import pxla\n"
                    "isinstance(x, (jnp.DeviceArray, pxla.ShardedDeviceArray, jax.Array))\n"
                    "k: jax.random.KeyArray\n",
                    [("JSE303", 4), ("JSE303", 4), ("JSE303", 5)]),
    "shaped array": ("import jax\njax.ShapedArray((2,), 'f4')\njax.core.ShapedArray((2,), 'f4')\n",
                     [("JSE304", 2)]),
    "removed helpers": ("import jax\njax.device_put_sharded(xs, ds)\njax.xla_computation(f)\n"
                        "d: jax.lib.xla_client.Device\nfrom jax.experimental import sharding\n"
                        "from jax.experimental.sharding import MeshPspecSharding\n",
                        [("JSE307", 2), ("JSE307", 3), ("JSE307", 4), ("JSE307", 5),
                         ("JSE307", 6)]),
    "tree imports": ("from jax import tree_map, tree_multimap as tm\nimport jax\n"
                     "jax.tree_util.tree_multimap(f, x)\n",
                     [("JSE301", 1), ("JSE301", 1), ("JSE301", 3)]),
    "module attributes": (
        "import jax\nfrom jax.experimental import maps, pjit, sharding\n"
        "m = maps.Mesh(d, ('x',))\ns = sharding.MeshPspecSharding(m, jax.experimental.PartitionSpec())\n"
        "f = pjit.pjit(g, in_axis_resources=pjit.FROM_GDA, out_axis_resources=pjit.PartitionSpec())\n"
        "y = pjit.with_sharding_constraint(x, axis_resources=pjit.PartitionSpec('x'))\n",
        [("JSE307", 2), ("JSE307", 2), ("JSE110", 2), ("JSE306", 3), ("JSE307", 4), ("JSE306", 4),
         ("JSE305", 5), ("JSE306", 5), ("JSE306", 5), ("JSE306", 6), ("JSE310", 6),
         ("JSE306", 6)]),
    "names the installed JAX lacks": (
        "import jax\nfrom jax import pxla\nfrom jax._src.util import prod\n"
        "from jax.interpreters.pxla import OutputType\nfrom jax._src import config as jax_config\n"
        "@jax_config.jax_array(True)\ndef test():\n  with jax.spmd_mode('allow_all'):\n    pass\n"
        "jax.sharding.OpShardingSharding\njax._src.sharding.MeshPspecSharding\n",
        [("JSE307", 2), ("JSE307", 3), ("JSE311", 4), ("JSE311", 6), ("JSE307", 8),
         ("JSE307", 10), ("JSE307", 11)]),
    "fallback branches": (
        "try:\n  from jax.sharding import NamedSharding\nexcept ImportError:\n"
        "  from jax.experimental.sharding import MeshPspecSharding as NamedSharding\n"
        "try:\n  from jax.experimental.maps import Mesh\nexcept ImportError:\n  Mesh = None\n"
        "try:\n  from jax.experimental.maps import xmap\nexcept ImportError:\n  xmap = None\n"
        "m = Mesh(d, ('x',))\nf = xmap(g)\nNamedSharding(m, P())\n",
        [("JSE104", 6), ("JSE302", 10), ("JSE302", 14)]),
    "array values": ("import jax\nbufs = x.device_buffers\nd = bufs[0].device()\n"
                     "b = f(x).device_buffer\nlocal = gda._device_buffers\n",
                     [("JSE312", 2), ("JSE313", 3), ("JSE312", 4), ("JSE205", 5)]),
    "a module's own members": ("import jax\nclass A:\n  def device(self):\n    return 0\n"
                               "  def device_buffers(self):\n    return []\n"
                               "A().device(), A().device_buffers\n", []),
    "mesh as decorator": ("import jax\nfrom jax_sharding_ext import pjit\n"
                          "mesh(pjit(f))(x)\n@global_mesh\ndef step():\n  pass\n",
                          [("JSE206", 3), ("JSE206", 4)]),
    "maps.mesh": ("from jax.experimental import maps\nwith maps.mesh(devices, ('x', 'y')):\n"
                  "  pass\n", [("JSE307", 1), ("JSE308", 2)]),
    "orbax restore of GDAs": (
        "import orbax.checkpoint as ocp\n"
        "from jax.experimental.global_device_array import GlobalDeviceArray\n"
        "args = ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, mesh=m, mesh_axes=a)\n",
        [("JSE207", 1), ("JSE101", 2)]),
    "orbax without GDAs": ("import orbax.checkpoint as ocp\nimport jax\n"
                           "ocp.ArrayRestoreArgs(sharding=s)\n", []),
    "options with the package imported": (
        "import jax\nimport jax_sharding_ext\n"
        "jax.config.update('jax_parallel_functions_output_gda', True)\n", []),
    "this package's private modules": ("from jax_sharding_ext._install import install\n"
                                       "install()\n", []),
    "a function named like a mesh": ("import jax\ndef _mesh(n):\n  return n\n_mesh(8)\n", []),
    "thread_resources": ("import jax\njax.experimental.maps.thread_resources.env.physical_mesh\n"
                         "from jax.interpreters import pxla\n"
                         "pxla.thread_resources.env.physical_mesh.empty\n",
                         [("JSE308", 2), ("JSE110", 3), ("JSE308", 4)]),
    "modern code": ("import jax\nfrom jax.sharding import Mesh, PartitionSpec as P\n"
                    "from jax.experimental import multihost_utils as _unused_if_ported, mesh_utils\n"
                    "with jax.set_mesh(Mesh(d, ('x',))):\n  y = jax.jit(f)(x)\n",
                    [("JSE105", 3)]),
    "star imports": ("from jax.experimental.global_device_array import *\n"
                     "from jax.experimental.maps import *\n"
                     "from jax.experimental.multihost_utils import *\n",
                     [("JSE108", 1), ("JSE307", 2)]),
    "a lock named mesh": ("import threading\nimport jax\nmesh = threading.Lock()\n"
                          "with mesh:\n  pass\n", []),
    "a name this package provides, from a private home": (
        "from jax._src.config import parallel_functions_output_gda\n", [("JSE109", 1)]),
    "GDA attributes of a jit output, the output flag never on": (
        "import jax\nf = jax.jit(g)\nout = f(x)\nout.local_shards, out.mesh_axes, y.mesh_axes\n",
        [("JSE208", 4), ("JSE208", 4)]),
    "GDA attributes of a jit output, the output flag on": (
        "import jax\nimport jax_sharding_ext\n"
        "jax.config.update('jax_parallel_functions_output_gda', True)\n"
        "out = jax.jit(g)(x)\nout.local_shards, out.mesh_axes\n", []),
    "GDA attributes of a pmap output": (
        "import jax\nimport jax_sharding_ext\n"
        "jax.config.update('jax_parallel_functions_output_gda', True)\n"
        "out = jax.pmap(g)(x)\nout.local_shards\n", [("JSE208", 5)]),
    "a ShardedDeviceArray's attributes": (
        "import jax\np = jax.pmap(f)(x)\n"
        "p.sharding_spec, p.indices, x.one_replica_buffer_indices, y.indices, p.to_py()\n",
        [("JSE314", 3)] * 4),
    "distributed initialize after a computation": (
        "import jax\nimport jax.numpy as jnp\nx = jnp.zeros(3)\njax.distributed.initialize()\n"
        "def main():\n  if jax.process_index() == 0:\n    pass\n  jax.distributed.initialize()\n",
        [("JSE209", 4), ("JSE209", 8)]),
    "distributed initialize first": (
        "import jax\nimport jax.numpy as jnp\njax.config.update('jax_enable_x64', True)\n"
        "step = jax.jit(lambda x: x)\njax.distributed.initialize()\nx = step(jnp.zeros(3))\n",
        []),
    "shadowed names": ("from jax.experimental.pjit import pjit\ndef f(pjit, jax):\n"
                       "  return pjit, jax.tree_map\nclass C:\n  jax = None\n",
                       [("JSE103", 1)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_snippet_findings(case):
  source, expected = CASES[case]
  found = [(f.code, f.line) for f in port.check(source)]
  assert sorted(found) == sorted(expected), port.check(source)
  assert_port_invariants(source)


def test_no_finding_without_gda_era_code():
  assert port.check("import jax\nprint(jax.devices())\n") == []
  assert port.check("import jax.numpy as jnp\nx = jnp.newaxis\n") == []  # a name that is None
  assert port.check(b"") == []


@pytest.mark.parametrize("before, after", [
    ("import jax.experimental.global_device_array as gda_lib, numpy as np  # why\n",
     "from jax_sharding_ext import global_device_array as gda_lib  # why\nimport numpy as np\n"),
    ("from jax.experimental.maps import Mesh as M, xmap  # pylint: disable=g-multiple-import\n"
     "xmap\n",
     "from jax_sharding_ext import Mesh as M  # pylint: disable=g-multiple-import\n"
     "from jax.experimental.maps import xmap  # pylint: disable=g-multiple-import\nxmap\n"),
    ("from jax.experimental import (\n    PartitionSpec as P,  # the spec\n    maps,\n)\n"
     "maps.xmap\n",
     "from jax_sharding_ext import (\n    PartitionSpec as P,  # the spec\n)\n"
     "from jax.experimental import (\n    maps,\n)\nmaps.xmap\n"),
    ("from jax.experimental.pjit import (\n    pjit,  # legacy\n    pjit_p  # primitive\n)\n"
     "pjit_p\n",
     "from jax_sharding_ext import (\n    pjit  # legacy\n)\n"
     "from jax.experimental.pjit import (\n    pjit_p  # primitive\n)\npjit_p\n"),
    ("from jax.experimental.pjit import pjit, with_sharding_constraint as wsc, FROM_GDA\n",
     "from jax_sharding_ext import pjit, FROM_GDA\n"
     "from jax.lax import with_sharding_constraint as wsc\n"),
    ("from jax.experimental.multihost_utils import sync_global_devices, process_allgather\n",
     "from jax_sharding_ext.multihost_utils import sync_global_devices, process_allgather\n"),
    ("from jax.experimental.multihost_utils import sync_global_devices\n",
     "from jax.experimental.multihost_utils import sync_global_devices\n"),
    ("from jax.experimental.global_device_array import GlobalDeviceArray, Shape\n",
     "from jax_sharding_ext.global_device_array import GlobalDeviceArray, Shape\n"),
    ("import os; from jax.experimental.maps import Mesh, xmap; import sys\nxmap\n",
     "import os; from jax_sharding_ext import Mesh; from jax.experimental.maps import xmap; "
     "import sys\nxmap\n"),
    # A removed name nothing uses: its import goes.
    ("import os; from jax.experimental.maps import Mesh, xmap; import sys\n",
     "import os; from jax_sharding_ext import Mesh; import sys\n"),
    ("def f():\n    # leading\n    from jax.experimental import multihost_utils, maps\n"
     "    return multihost_utils, maps\n",
     "def f():\n    # leading\n    from jax_sharding_ext import multihost_utils\n"
     "    from jax.experimental import maps\n    return multihost_utils, maps\n"),
    ("try:\n  from jax.experimental.gda_serialization.serialization import run_serialization\n"
     "except ImportError:\n  pass\n",
     "try:\n  from jax_sharding_ext.serialization import run_serialization\n"
     "except ImportError:\n  pass\n"),
    # A star import: the names the module uses from it that moved are imported
    # after it (the module is still in JAX), instead of it (it is gone), or the
    # star comes from this package's module that replaces it whole.
    ("from jax.experimental.pjit import *  # legacy\nf = pjit(g, FROM_GDA, P('x'))\n",
     "from jax.experimental.pjit import *  # legacy\n"
     "from jax_sharding_ext import pjit, FROM_GDA\nf = pjit(g, FROM_GDA, P('x'))\n"),
    ("if True:\n  from jax.experimental.multihost_utils import *\n"
     "  y = process_allgather(x); sync_global_devices('a')\n",
     "if True:\n  from jax.experimental.multihost_utils import *\n"
     "  from jax_sharding_ext.multihost_utils import process_allgather\n"
     "  y = process_allgather(x); sync_global_devices('a')\n"),
    ("from jax.experimental.maps import *\nm = Mesh(d, ('x',))\n",
     "from jax_sharding_ext import Mesh\nm = Mesh(d, ('x',))\n"),
    ("from jax.experimental.global_device_array import *\ng = GlobalDeviceArray\n",
     "from jax_sharding_ext.global_device_array import *\ng = GlobalDeviceArray\n"),
    # Only a value that may be a `Mesh` enters the mesh context.
    ("import jax, threading\nmesh = threading.Lock()\nwith mesh:\n  pass\n",
     "import jax, threading\nmesh = threading.Lock()\nwith mesh:\n  pass\n"),
    ("import jax\nfrom jax.sharding import Mesh\nmesh = Mesh(d, ('x',))\nwith mesh:\n  pass\n",
     "import jax\nfrom jax.sharding import Mesh\nmesh = Mesh(d, ('x',))\n"
     "with jax.set_mesh(mesh):\n  pass\n"),
])
def test_rewrite_keeps_formatting_names_and_comments(before, after):
  assert port.fix(before) == after
  assert port.fix(after) == after


def test_rewrite_keeps_line_endings_and_encoding():
  source = ("# -*- coding: latin-1 -*-\r\nfrom jax.experimental.maps import Mesh\r\n"
            "s = 'caf\xe9'\r\n").encode("latin-1")
  fixed = port.fix(source)
  assert fixed == source.replace(b"jax.experimental.maps", b"jax_sharding_ext")


def test_a_syntax_error_names_the_place():
  with pytest.raises(SyntaxError) as e:
    port.check("x = 1\ndef f(:\n  pass\n", "bad.py")
  assert (e.value.filename, e.value.lineno) == ("bad.py", 2)


# -- the command line --------------------------------------------------------------


def test_no_findings_exit_0(cli, tmp_path):
  (tmp_path / "ok.py").write_text("import jax\nfrom jax.sharding import Mesh\n")
  status, found, out, err = cli(tmp_path / "ok.py")
  assert (status, out) == (0, "") and "0 findings" in err


MAPS = "from jax.experimental.maps import Mesh\n"
PORTED = "from jax_sharding_ext import Mesh\n"


def unreadable(path):
  """Make `path` a regular file whose read fails (root reads any file mode, so
  then a link to one the kernel refuses to read)."""
  if os.geteuid() != 0:
    path.write_text("import jax\n")
    path.chmod(0)
  else:
    path.symlink_to("/proc/self/mem")  # a regular file; reading offset 0 is EIO


def test_bad_files_are_reported_and_the_others_handled(cli, tmp_path):
  fixable = tmp_path / "a.py"
  fixable.write_text(MAPS)
  (tmp_path / "bad.py").write_text("import jax\ndef f(:\n  pass\n")
  unreadable(tmp_path / "locked.py")
  status, found, out, err = cli("--write", tmp_path, tmp_path / "missing.py")
  assert status == 2 and found == [] and out == ""
  assert fixable.read_text() == PORTED  # the good file is fixed all the same
  assert f"{tmp_path / 'bad.py'}:2:7: does not parse: invalid syntax" in err
  assert re.search(rf"{re.escape(str(tmp_path / 'locked.py'))}: cannot read: \w", err), err
  assert f"{tmp_path / 'missing.py'}: no such file or directory" in err
  assert "fixed 1 finding in 1 file; 0 findings left" in err and "3 problems" in err


def test_findings_of_other_files_are_printed_past_a_bad_one(cli, tmp_path):
  unreadable(tmp_path / "a_locked.py")
  (tmp_path / "b.py").write_text(MAPS)
  status, found, _, err = cli(tmp_path)
  assert status == 2 and found == [("JSE104", 1)] and "cannot read" in err


def test_only_regular_files_are_read(cli, tmp_path):
  """A FIFO named *.py would block a plain open(); a dangling link has nothing to
  read. In a directory both are skipped; named, each is an error (exit 2)."""
  (tmp_path / "a.py").write_text(MAPS)
  os.mkfifo(tmp_path / "pipe.py")
  (tmp_path / "dangling.py").symlink_to(tmp_path / "nowhere.py")
  (tmp_path / "linked.py").symlink_to(tmp_path / "a.py")  # the same file: read once
  status, found, _, err = cli(tmp_path)
  assert (status, found) == (1, [("JSE104", 1)]) and "error" not in err
  status, found, _, err = cli(tmp_path / "pipe.py", tmp_path / "dangling.py")
  assert status == 2 and found == []
  assert f"{tmp_path / 'pipe.py'}: not a regular file; skipped" in err
  assert f"{tmp_path / 'dangling.py'}: no such file or directory" in err


def test_a_fifo_never_hangs_the_command(tmp_path):
  os.mkfifo(tmp_path / "pipe.py")
  res = subprocess.run([sys.executable, "-m", "jax_sharding_ext.port", str(tmp_path / "pipe.py"),
                        str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO)
  assert res.returncode == 2 and "not a regular file" in res.stderr, res.stderr


def test_usage_errors_exit_2(cli):
  assert cli()[0] == 2
  assert cli("--write", "--diff", "x.py")[0] == 2


def test_help_gives_exit_statuses_examples_and_the_version(cli, tmp_path, monkeypatch):
  """`--help` says what each exit status means and shows commands that work as
  written; `--version` / `-V` print the tool's version with JAX's and libcst's."""
  status, _, out, _ = cli("--help")
  assert status == 0
  statuses = out[out.index("exit status:"):]
  for code in ("0", "1", "2"):
    assert re.search(rf"^  {code}  \S", statuses, re.M), statuses
  examples = re.findall(r"^  jax-sharding-ext-port (.+)$", out, re.M)
  assert len(examples) >= 4 and all(len(line) <= 80 for line in out.splitlines()), out
  monkeypatch.chdir(tmp_path)
  for name in ("src", "notebooks"):
    (tmp_path / name).mkdir()
  (tmp_path / "src" / "a.py").write_text(MAPS)
  (tmp_path / "train.py").write_text("import jax\nx = jax.tree_map(abs, [1])\n")
  for example in examples:
    if "<" not in example:  # the stdin one: `test_stdin`
      assert cli(*example.split())[0] in (0, 1), example
  assert (tmp_path / "train.py").read_text() == "import jax\nx = jax.tree_util.tree_map(abs, [1])\n"
  for flag in ("--version", "-V"):
    status, _, out, _ = cli(flag)
    assert status == 0 and re.fullmatch(
        rf"jax-sharding-ext-port {re.escape(jax_sharding_ext.__version__)} \(JAX "
        rf"{re.escape(jax.__version__)}, libcst [\d.]+\)\n", out), out


def test_main_leaves_the_cycle_collector_as_it_was(cli, tmp_path):
  """The command line pauses Python's cycle collector while it handles a file
  and freezes what existed before; called from Python, it restores both."""
  import gc
  (tmp_path / "a.py").write_text(MAPS)
  # Python 3.12 starts with objects of its own frozen; they stay so.
  frozen = gc.get_freeze_count()
  assert gc.isenabled()
  assert cli("--write", tmp_path)[0] == 0
  assert gc.isenabled() and gc.get_freeze_count() == frozen
  gc.disable()
  try:
    cli(tmp_path)
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_diff_writes_nothing_and_write_applies_it(cli, tmp_path):
  path = tmp_path / "a.py"
  path.write_text("import jax\nfrom jax.experimental.maps import Mesh\njax.tree_map(f, x)\n")
  status, _, out, err = cli("--diff", path)
  assert status == 1 and "--write would fix 2 findings in 1 file; nothing written" in err
  assert path.read_text().count("jax.experimental.maps") == 1
  assert f"--- a/{path}" in out and f"+++ b/{path}" in out
  assert ("-from jax.experimental.maps import Mesh\n-jax.tree_map(f, x)\n"
          "+from jax_sharding_ext import Mesh\n+jax.tree_util.tree_map(f, x)\n") in out
  status, found, _, err = cli("--write", path)
  assert (status, found) == (0, []) and "fixed 2 findings in 1 file" in err
  assert path.read_text() == ("import jax\nfrom jax_sharding_ext import Mesh\n"
                              "jax.tree_util.tree_map(f, x)\n")
  status, _, out, _ = cli("--diff", path)
  assert status == 0 and "---" not in out  # nothing left to rewrite


def test_write_prints_what_is_left(cli, tmp_path):
  path = tmp_path / "a.py"
  path.write_text("from jax.experimental.maps import Mesh, xmap\nf = xmap(g)\n")
  status, found, out, err = cli("--write", path)
  assert status == 1 and found == [("JSE302", 2), ("JSE302", 3)]  # at their new places
  assert path.read_text() == (PORTED + "from jax.experimental.maps import xmap\n"
                              "f = xmap(g)\n")
  assert "fixed 1 finding in 1 file; 2 findings left" in err


def test_directories_are_searched_for_python_files_and_notebooks(cli, tmp_path):
  for rel in ("pkg/a.py", "pkg/sub/b.py", "pkg/.venv/c.py", "pkg/__pycache__/d.py",
              "pkg/notes.txt"):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text(MAPS)
  (tmp_path / "pkg" / "n.ipynb").write_text(notebook(["import jax", MAPS]))
  status, found, out, _ = cli(tmp_path / "pkg", tmp_path / "pkg" / "a.py")
  assert status == 1 and found == [("JSE104", 1)] * 3
  assert [ln.split(":")[0] for ln in out.splitlines()] == [
      str(tmp_path / "pkg" / "a.py"), str(tmp_path / "pkg" / "n.ipynb"),
      str(tmp_path / "pkg" / "sub" / "b.py")]


def test_files_without_jax_are_not_parsed(cli, tmp_path):
  path = tmp_path / "a.py"
  path.write_text("x = (\n")  # would not parse; it cannot use JAX either
  assert cli(path)[0] == 0


def _without_imports(source):
  return "".join(line for line in source.splitlines(keepends=True)
                 if not re.match(r"\s*(from|import) ", line))


@pytest.mark.parametrize("source", [
    *(CASES[case][0] for case in sorted(CASES)), TRAIN,
    *(_without_imports(CASES[case][0]) for case in sorted(CASES)), _without_imports(TRAIN),
    "# jax\ndef f(x):\n  return x.shape  # no rule judges this\n",
])
def test_a_module_no_rule_can_judge_is_not_parsed(source):
  """`could_find` says a module cannot have a finding only where none is found:
  the command line then skips it unparsed."""
  from jax_sharding_ext.port import _engine
  assert _engine.could_find(source) or port.check(source) == []


def test_a_file_that_names_nothing_gda_era_is_skipped_unparsed(cli, tmp_path):
  (tmp_path / "a.py").write_text("# about jax\ndef f(x):\n  return (x\n")  # does not parse
  (tmp_path / "b.py").write_text("# about jax\ndef g(x):\n  return x.device_buffers\n")
  status, found, _, err = cli(tmp_path)
  assert (status, found) == (1, [("JSE312", 3)]) and "does not parse" not in err, err


def test_any_depth_of_valid_python(cli, tmp_path):
  """Expressions as deep as Python itself compiles (a long `a + a + ...` chain
  nests one level per term) are checked and rewritten, including inside them."""
  path = tmp_path / "deep.py"
  terms = " + ".join(["x.device_buffers"] * 400)
  source = (f"import jax\ny = jax.tree_map(f, {terms})\nz = "
            + "(" * 90 + "jax.tree_leaves(t)" + ")" * 90 + "\n")
  compile(source, "deep", "exec")
  path.write_text(source)
  status, found, _, _ = cli(path)
  assert status == 1 and len(found) == 402
  status, found, _, err = cli("--write", path)
  assert (status, found) == (0, []) and "fixed 402 findings" in err
  text = path.read_text()
  assert text.count("[s.data for s in x.addressable_shards]") == 400
  assert "jax.tree_util.tree_map(f, " in text and "jax.tree_util.tree_leaves(t)" in text


def test_too_deep_for_python_is_an_error_not_a_crash(cli, tmp_path):
  path = tmp_path / "deep.py"
  source = "import jax\nx = " + " + ".join(["a"] * 100_000) + "\n"
  with pytest.raises((RecursionError, MemoryError, SyntaxError)):
    compile(source, "deep", "exec")  # Python cannot run it either
  path.write_text(source)
  status, _, _, err = cli(path)
  assert status == 2 and f"{path}:" in err and "does not parse" in err


def notebook(cells, code=True):
  return json.dumps({"cells": [{"cell_type": "code" if code else "markdown",
                                "execution_count": None, "metadata": {}, "outputs": [],
                                "source": c.splitlines(keepends=True)} for c in cells],
                     "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


def test_notebook_code_cells_are_checked_and_rewritten(cli, tmp_path):
  path = tmp_path / "n.ipynb"
  cells = ["!pip install jax\n%matplotlib inline\nimport jax\n" + MAPS,
           "%%writefile f.txt\njax.tree_map(f, x)",  # a cell magic's text: left alone
           "x = jax.tree_leaves(y)\ndisplay?",
           "def broken(:"]
  path.write_text(notebook(cells))
  status, found, out, err = cli(path)
  assert status == 2 and "cell 4:1:12: does not parse" in err
  assert [ln.split(": ")[0] for ln in out.splitlines()] == [
      f"{path}:cell 1:4:35", f"{path}:cell 3:1:5"]
  status, found, _, _ = cli("--write", path)
  sources = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
  assert sources == ["!pip install jax\n%matplotlib inline\nimport jax\n" + PORTED,
                     cells[1], "x = jax.tree_util.tree_leaves(y)\ndisplay?", cells[3]]
  assert path.read_text().startswith('{\n "cells": [\n  {\n')  # its JSON layout kept
  assert cli(path)[:2] == (2, [])


def test_python_under_ipython_magics_is_checked_and_rewritten(cli, tmp_path):
  """IPython runs the argument of `%time` / `%timeit` and the body of a
  `%%time` / `%%timeit` / `%%capture` cell as Python: it is checked, with
  the places in the cell, and rewritten with the magic kept. Another cell
  magic's body is not Python and is left alone."""
  path = tmp_path / "n.ipynb"
  cells = ["import jax\n%time y = jax.tree_map(f, x)",
           "%timeit -n 3 -r 2 jax.tree_leaves(y)  # bench",
           "%%time\nz = jax.tree_map(f, x)\n%time w = 1",
           "%%capture out\njax.tree_leaves(z)",
           "%%bash\necho jax.tree_map",
           "def g():\n    %time q = jax.tree_map(f, x)\n    return q"]
  path.write_text(notebook(cells))
  status, found, out, err = cli(path)
  assert status == 1 and "does not parse" not in err, err
  assert [ln.split(": ")[0] for ln in out.splitlines()] == [
      f"{path}:cell 1:2:11", f"{path}:cell 2:1:19", f"{path}:cell 3:2:5", f"{path}:cell 4:2:1",
      f"{path}:cell 6:2:15"]
  cli("--write", path)
  sources = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
  assert sources == [c.replace("jax.tree_", "jax.tree_util.tree_") for c in cells[:4]] + [
      cells[4], cells[5].replace("jax.tree_", "jax.tree_util.tree_")]
  assert cli(path)[:2] == (0, [])


def test_a_notebook_gets_the_package_import_in_the_cell_that_imports_jax(tmp_path):
  path = tmp_path / "n.ipynb"
  path.write_text(notebook(["import jax", "# a later cell\n"
                            "jax.config.update('jax_parallel_functions_output_gda', True)"]))
  assert main(["--write", str(path)]) == 0
  sources = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
  assert sources == ["import jax\nimport jax_sharding_ext", "# a later cell\n"
                     "jax.config.update('jax_parallel_functions_output_gda', True)"]


def run_stdin(*args, stdin):
  return subprocess.run([sys.executable, "-m", "jax_sharding_ext.port", *args], input=stdin,
                        capture_output=True, text=True, timeout=300, cwd=REPO)


def test_stdin(tmp_path):
  source = "import jax\n" + MAPS + "jax.tree_map(f, x)\n"
  res = run_stdin("-", stdin=source)
  assert res.returncode == 1 and res.stdout.startswith("-:2:35: JSE104 "), res.stdout
  assert len(res.stdout.splitlines()) == 2
  res = run_stdin("--write", "-", stdin=source)
  assert res.returncode == 0, res.stderr
  assert res.stdout == "import jax\n" + PORTED + "jax.tree_util.tree_map(f, x)\n"
  res = run_stdin("--write", "-", stdin=MAPS + "from jax.experimental.maps import xmap\nxmap\n")
  assert res.returncode == 1 and res.stdout.startswith(PORTED)
  assert "-:2:35: JSE302" in res.stderr  # what is left goes to stderr


def test_ignore_hides_codes_from_output_and_status(cli, tmp_path):
  path = tmp_path / "a.py"
  path.write_text("import jax\nif jax.config.jax_array:\n  pass\n")
  assert cli(path)[:2] == (1, [("JSE201", 2)])
  assert cli("--ignore", "jse2", path)[:2] == (0, [])


def test_codes_lists_every_code(cli):
  status, _, out, _ = cli("--codes")
  assert status == 0
  assert [ln.split()[0] for ln in out.splitlines()] == list(_reports.CODES)


def test_python_dash_m_entry_point(tmp_path):
  path = tmp_path / "a.py"
  path.write_text("from jax.experimental import PartitionSpec as P\n")
  res = subprocess.run([sys.executable, "-m", "jax_sharding_ext.port", str(path)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert res.returncode == 1, res.stderr
  assert res.stdout == (f"{path}:1:30: JSE104 `jax.experimental.PartitionSpec` was removed from "
                        "JAX (today `jax.sharding.PartitionSpec`, the same class as "
                        "`jax_sharding_ext.PartitionSpec`); use `from jax_sharding_ext import "
                        "PartitionSpec as P` (--write fixes this)\n")


def test_without_libcst_the_tool_names_the_extra(tmp_path):
  path = tmp_path / "a.py"
  path.write_text("from jax.experimental.maps import Mesh\n")
  code = ("import sys; sys.modules['libcst'] = None\n"
          "import jax_sharding_ext.port as port\n"
          "from jax_sharding_ext.port.__main__ import main\n"
          "try:\n  port.check('x = 1')\nexcept ImportError as e:\n  print('IMPORTERROR', e)\n"
          f"sys.exit(main(['--write', {str(path)!r}]))\n")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=REPO)
  assert res.returncode == 2, res.stderr
  assert "IMPORTERROR" in res.stdout and "pip install 'jax-sharding-ext[port]'" in res.stdout
  assert "pip install 'jax-sharding-ext[port]'" in res.stderr
  assert path.read_text() == "from jax.experimental.maps import Mesh\n"


def test_importing_the_package_does_not_import_libcst():
  code = ("import sys, jax_sharding_ext, jax_sharding_ext.port, jax_sharding_ext.port.__main__\n"
          "print('libcst' in sys.modules)\n")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=REPO)
  assert res.stdout.strip() == "False", res.stderr


# -- the tables against today's JAX and this package --------------------------------


def resolves(dotted):
  """Whether `a.b.c` names a module or attribute in this process's JAX."""
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    try:
      with warnings.catch_warnings():  # a deprecated module warns at import (JAX 0.8.x)
        warnings.simplefilter("ignore", DeprecationWarning)
        obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)
      for part in parts[i:]:
        if not hasattr(obj, part):
          return False
        obj = getattr(obj, part)
    return True
  return False


_WARNS_SCRIPT = """
import importlib, json, sys, warnings
out = {}
for dotted in sys.argv[1:]:
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
      try:
        obj = importlib.import_module(".".join(parts[:i]))
      except ImportError:
        continue
      for part in parts[i:]:
        obj = getattr(obj, part)
      break
  out[dotted] = any(issubclass(w.category, DeprecationWarning) for w in caught)
print(json.dumps(out))
"""


def _deprecated(names):
  """Which of `names` warn that JAX deprecated them, read first in a fresh
  Python (JAX warns once per process, at the first read or import)."""
  res = subprocess.run([sys.executable, "-c", _WARNS_SCRIPT, *names], capture_output=True,
                       text=True, timeout=120, check=True)
  return json.loads(res.stdout)


def test_removed_names_are_gone_and_changed_ones_are_there():
  kept = []
  for key, report in _reports.REPORTS.items():
    if not key.endswith(".*"):
      if report.gone and resolves(key):
        kept.append(key)
      else:
        assert resolves(key) == (not report.gone), key
  if kept:  # older JAX releases (0.8.x) still have some of them, deprecated
    assert _deprecated(kept) == dict.fromkeys(kept, True)
  for old in ("jax.numpy.DeviceArray", "jax.interpreters.xla.DeviceArray",
              "jax.interpreters.pxla.ShardedDeviceArray"):
    assert not resolves(old)
  for option in _reports.REMOVED_OPTIONS:
    assert not hasattr(jax.config, option)
  for option in _reports.OPTIONS:  # defined by this package
    assert hasattr(jax.config, option)


def test_every_rename_points_from_a_removed_name_to_one_that_exists():
  pytest.importorskip("tensorstore")  # `jax_sharding_ext.serialization` needs it
  for old, (code, new) in _rules.RENAMES.items():
    assert code in _reports.CODES, old
    assert resolves(new), (old, new)
    # Only the deprecated stock `pjit` is still there (it no longer takes GDA-era specs).
    assert resolves(old) == (old == "jax.experimental.pjit.pjit"), old


def test_every_fix_points_at_a_name_that_exists():
  symbols = [*_rules._MODULE_FIXES, *_rules._NAME_FIXES]
  symbols += [f"{_rules.GDA_MODULE}.{n}" for n in ("GlobalDeviceArray", "Shard", "Shape",
                                                   "MeshAxes", "_hashed_index")]
  symbols += [f"{_rules.SER_MODULE}.{n}" for n in ("run_serialization", "get_tensorstore_spec",
                                                   "GlobalAsyncCheckpointManager")]
  symbols += [f"{_rules.MHU_MODULE}.{n}" for n in ("process_allgather", "assert_equal")]
  pytest.importorskip("tensorstore")
  for symbol in symbols:
    fix = _rules.fix_for(symbol)
    assert fix is not None and fix.code in _reports.CODES, symbol
    assert resolves(symbol) == (not fix.gone), symbol
    name = symbol.rpartition(".")[2]
    for target in fix.targets:
      assert resolves(f"{target}.{name}"), (symbol, target)


def test_package_names_read_from_source_match_the_modules():
  pytest.importorskip("tensorstore")
  for module in ("jax_sharding_ext", "jax_sharding_ext.global_device_array",
                 "jax_sharding_ext.multihost_utils", "jax_sharding_ext.serialization"):
    mod = importlib.import_module(module)
    public = {n for n in getattr(mod, "__all__", dir(mod)) if not n.startswith("__")}
    assert public <= _names.provided(module), (module, public - _names.provided(module))
  assert {"serialization", "orbax_support", "port"} <= _names.provided("jax_sharding_ext")
  import jax.experimental.multihost_utils as stock
  mhu = jax_sharding_ext.multihost_utils
  differ = {n for n in mhu.__all__ if getattr(mhu, n) is not getattr(stock, n)}
  assert _names.own_functions("jax_sharding_ext.multihost_utils") == differ


def test_every_code_is_documented():
  used = {f.code for case in CASES.values() for f in port.check(case[0])}
  used |= {code for code, _ in TRAIN_FINDINGS}
  missing = set(_reports.CODES) - used
  assert missing == set(), f"codes no test produces: {sorted(missing)}"


# -- a `with` is rewritten only where every value that reaches it is a `Mesh` ----

WITH_HEAD = ("import contextlib\nfrom typing import Optional\nimport jax\nimport numpy as np\n"
             "from jax.sharding import Mesh\n"
             "def devices():\n  return np.asarray(jax.devices())\n")


@pytest.mark.parametrize("body, rewritten", [
    # A `Mesh` on one branch and something else on the other: reported, left.
    ("def f(flag):\n  if flag:\n    cm = Mesh(devices(), ('x',))\n  else:\n"
     "    cm = contextlib.nullcontext()\n  with cm:\n    pass\n", False),
    ("def f(flag):\n  cm = Mesh(devices(), ('x',)) if flag else contextlib.nullcontext()\n"
     "  with cm:\n    pass\n", False),
    # Both branches, a loop and a later reassignment all give a `Mesh`.
    ("def f(flag):\n  if flag:\n    m = Mesh(devices(), ('x',))\n  else:\n"
     "    m = jax.make_mesh((len(devices()),), ('x',))\n  with m:\n    pass\n", True),
    ("def f(n):\n  m = None\n  for i in range(n):\n    m = Mesh(devices(), ('x',))\n"
     "  with m:\n    pass\n", False),
    ("def f():\n  m = None\n  m = Mesh(devices(), ('x',))\n  with m:\n    pass\n", True),
    # A parameter: by its annotation only.
    ("def f(mesh: Mesh):\n  with mesh:\n    pass\n", True),
    ("def f(mesh: 'jax.sharding.Mesh'):\n  with mesh:\n    pass\n", True),
    ("def f(mesh):\n  with mesh:\n    pass\n", False),
    # `Optional[Mesh]`: a `Mesh` where a test made sure it is not None.
    ("def f(mesh: Optional[Mesh] = None, axes=None):\n"
     "  if mesh is not None and axes is not None:\n    with mesh:\n      pass\n", True),
    ("def f(mesh: 'Mesh | None'):\n  if mesh is None:\n    raise ValueError()\n"
     "  with mesh:\n    pass\n", True),
    ("def f(mesh: Optional[Mesh] = None):\n  with mesh:\n    pass\n", False),
    ("def f(mesh: Optional[Mesh]):\n  if mesh is not None:\n    mesh = g()\n"
     "    with mesh:\n      pass\n", False),
    # A method's assignment of `self.mesh` is the attribute's, not the class body's.
    ("class T:\n  def __init__(self, mesh: Mesh):\n    self.mesh = mesh\n"
     "  def run(self):\n    with self.mesh:\n      pass\n", True),
    # The project's own functions, by what every `return` gives.
    ("def make():\n  return Mesh(devices(), ('x',))\ndef f():\n  mesh = make()\n"
     "  with mesh:\n    pass\n", True),
    ("def make(flag):\n  if flag:\n    return Mesh(devices(), ('x',))\ndef f():\n"
     "  mesh = make(True)\n  with mesh:\n    pass\n", False),
    ("def make() -> Mesh:\n  return build()\ndef f():\n  with make():\n    pass\n", True),
    # `self.mesh`: every assignment of the attribute in the file.
    ("class T:\n  def __init__(self):\n    self.mesh = Mesh(devices(), ('x',))\n"
     "  def run(self):\n    with self.mesh:\n      pass\n", True),
    ("class T:\n  def __init__(self, m):\n    self.mesh = m\n"
     "  def run(self):\n    with self.mesh:\n      pass\n", False),
    ("class T(Base):\n  def run(self):\n    with self.mesh:\n      pass\n"
     "def other(o):\n  o.mesh = Mesh(devices(), ('x',))\n", False),  # a base class's
    # `with m as n:` keeps the name bound to the mesh (`Mesh.__enter__` returns it).
    ("def f():\n  with Mesh(devices(), ('x',)) as m:\n    with m:\n      pass\n", True),
])
def test_a_with_is_rewritten_only_where_every_value_is_a_mesh(body, rewritten):
  source = WITH_HEAD + body
  fixed = assert_port_invariants(source)
  assert ("jax.set_mesh(" in fixed) == rewritten, fixed
  found = [f for f in port.check(source) if f.code == "JSE204"]
  assert found and all(f.fixable == rewritten for f in found), found


def test_a_with_over_another_library_value_named_mesh_is_not_reported():
  source = "import threading\nimport jax\nmesh = threading.Lock()\nwith mesh:\n  pass\n"
  assert port.check(source) == [] and port.fix(source) == source


@pytest.mark.parametrize("body, reported", [
    # A function the files of the run do not define, named like a mesh maker:
    # what it returns may be a `Mesh`, whatever the `with` names.
    ("from myproject.config import get_mesh\nmesh = get_mesh()\nwith mesh:\n  pass\n", True),
    ("from myproject.config import get_mesh\nm = get_mesh()\nwith m:\n  pass\n", True),
    ("from myproject import config\nwith config.get_mesh(8):\n  pass\n", True),
    ("from .meshes import create_mesh\nwith create_mesh() as m:\n  pass\n", True),
    ("import myproject\nm = None\nif flag:\n  m = myproject.makeMesh()\nwith m:\n  pass\n",
     True),
    ("from myproject import Mesh\nwith Mesh(devices(), ('x',)):\n  pass\n", True),
    ("def f(make_mesh):\n  with make_mesh():\n    pass\n", True),
    # Another library's value named like a mesh.
    ("import somelib\nmesh = somelib.build(8)\nwith mesh:\n  pass\n", True),
    # Values that are surely no `Mesh`, or named like nothing of the sort.
    ("import threading\nmesh = threading.Lock()\nwith mesh:\n  pass\n", False),
    ("import contextlib\nwith contextlib.nullcontext():\n  pass\n", False),
    ("from myproject.config import get_config\nc = get_config()\nwith c:\n  pass\n", False),
    ("with open(__file__) as f:\n  pass\n", False),
    ("class Mesh:\n  pass\nwith Mesh():\n  pass\n", False),
    ("import somelib\nwith somelib.session():\n  pass\n", False),
])
def test_every_with_over_an_unknown_value_that_may_be_a_mesh_is_reported(body, reported):
  """Nothing in the files of the run says what `get_mesh()` of another
  project returns: `with` over it is reported (it may be a `Mesh`, and `with
  mesh:` is deprecated), never rewritten."""
  source = "import jax\nimport numpy as np\n" + body
  found = [f for f in port.check(source) if f.code == "JSE204"]
  assert bool(found) == reported, found
  assert not any(f.fixable for f in found), found
  assert all("nothing in the files of this run says what" in f.message for f in found)
  assert port.fix(source) == source


def test_a_mesh_from_outside_the_files_of_the_run_is_reported_from_the_command_line(cli, tmp_path):
  """The project's own `get_mesh`, in a file not given and not found: reported,
  naming where the value comes from; the file is left as written."""
  (tmp_path / "train.py").write_text(
      "import jax\nfrom myproject.partitioning import get_mesh\n"
      "def main(config):\n  mesh = get_mesh(config)\n  with mesh:\n    pass\n")
  status, found, out, _ = cli(tmp_path / "train.py")
  assert (status, found) == (1, [("JSE204", 5)]), out
  assert "comes from `get_mesh(...)`" in out and "--write fixes this" not in out
  before = (tmp_path / "train.py").read_text()
  assert cli("--write", tmp_path / "train.py")[0] == 1
  assert (tmp_path / "train.py").read_text() == before


def test_functions_of_other_files_of_the_project_are_followed(cli, tmp_path):
  """`mesh = get_mesh(config)` where `get_mesh` is the project's own function in
  another file (imported absolutely, relatively or as a module attribute)."""
  pkg = tmp_path / "proj"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "meshes.py").write_text(
      "import numpy as np\nimport jax\nfrom jax.experimental import maps\n"
      "def get_mesh(config):\n  return maps.Mesh(np.asarray(jax.devices()), config)\n"
      "def maybe_mesh(config):\n  return get_mesh(config) if config else None\n")
  (pkg / "train.py").write_text(
      "import jax\nfrom proj.meshes import get_mesh, maybe_mesh\nfrom . import meshes\n"
      "def main(config):\n  mesh = get_mesh(config)\n  with mesh:\n    pass\n"
      "  with meshes.get_mesh(config):\n    pass\n  other = maybe_mesh(config)\n"
      "  with other:\n    pass\n")
  status, found, out, _ = cli(pkg / "train.py")
  assert found == [("JSE204", 6), ("JSE204", 8), ("JSE204", 11)], out
  cli("--write", pkg)
  text = (pkg / "train.py").read_text()
  assert "with jax.set_mesh(mesh):" in text
  assert "with jax.set_mesh(meshes.get_mesh(config)):" in text
  assert "  with other:\n" in text  # `maybe_mesh` may return None


@pytest.mark.parametrize("init_files", [True, False])
def test_orbax_support_is_added_only_where_the_file_uses_todays_orbax(cli, tmp_path, init_files):
  """A copy of an old orbax (its own source importing `orbax.checkpoint`)
  imports that copy, not today's orbax: adding `jax_sharding_ext.orbax_support`
  there would import today's beside it. Code elsewhere that imports orbax,
  with no orbax among the files of the run, uses today's."""
  vendored = tmp_path / "third_party" / "orbax" / "checkpoint"
  vendored.mkdir(parents=True)
  if init_files:
    (vendored.parent / "__init__.py").write_text("")
    (vendored / "__init__.py").write_text("")
  gda_era = ("import jax\nfrom orbax.checkpoint import utils\n"
             "from jax.experimental.global_device_array import GlobalDeviceArray\n"
             "def restore(args):\n  return GlobalDeviceArray, args.mesh_axes\n")
  (vendored / "pytree_checkpoint_handler.py").write_text(gda_era)
  user = tmp_path / "train.py"
  user.write_text(gda_era.replace("from orbax.checkpoint import utils", "import orbax.checkpoint"))
  _, found, _, _ = cli(tmp_path / "third_party")
  assert found == [("JSE101", 3)]
  cli("--write", tmp_path / "third_party")
  assert "jax_sharding_ext.orbax_support" not in (vendored / "pytree_checkpoint_handler.py"
                                                 ).read_text()
  _, found, _, _ = cli(user)
  assert ("JSE207", 2) in found
  cli("--write", user)
  assert "import jax_sharding_ext.orbax_support\n" in user.read_text()


@pytest.mark.parametrize("checkpoints", [False, True])
def test_a_folder_named_orbax_is_not_taken_for_a_copy_of_orbax(cli, tmp_path, checkpoints):
  """A project's `orbax/` folder holding a user's notebook and script (and,
  maybe, saved checkpoints under `checkpoint/`) is no copy of orbax: its code
  imports today's orbax and gets the support module, as a copy of the same
  notebook in another folder does."""
  folder = tmp_path / "orbax"
  folder.mkdir()
  if checkpoints:
    (folder / "checkpoint" / "0").mkdir(parents=True)
    (folder / "checkpoint" / "0" / "state.json").write_text("{}")
  code = ("import jax\nimport orbax.checkpoint as ocp\n"
          "from jax.experimental.global_device_array import GlobalDeviceArray\n"
          "args = ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, mesh=m, mesh_axes=a)\n")
  (folder / "restore.ipynb").write_text(notebook([code]))
  (folder / "restore.py").write_text(code)
  elsewhere = tmp_path / "notebooks"
  elsewhere.mkdir()
  (elsewhere / "restore.ipynb").write_text(notebook([code]))
  _, found, out, _ = cli(tmp_path)
  assert out.count("JSE207") == 3, out
  cli("--write", tmp_path)
  for path in (folder / "restore.ipynb", folder / "restore.py", elsewhere / "restore.ipynb"):
    assert "import jax_sharding_ext.orbax_support" in path.read_text(), path


@pytest.mark.parametrize("before, after", [
    ("import jax\nx = jax.tree_map(f,\n                 a,\n                 b)\n",
     "import jax\nx = jax.tree_util.tree_map(f,\n                           a,\n"
     "                           b)\n"),
    # Only the bracket the rename moved; the outer one's lines stay.
    ("import jax\ny = foo(jax.tree_map(lambda q: q,\n                     z), c,\n        d)\n",
     "import jax\ny = foo(jax.tree_util.tree_map(lambda q: q,\n                               z), c,\n"
     "        d)\n"),
    # A rename that shortens the line; nested brackets and a comment move along,
    # the inside of a string does not.
    ("import jax\nw = jax.tree_util.tree_multimap(g,  # why\n                                [1,\n"
     "                                 2],\n                                \"\"\"a\n   b\"\"\")\n",
     "import jax\nw = jax.tree_util.tree_map(g,  # why\n                           [1,\n"
     "                            2],\n                           \"\"\"a\n   b\"\"\")\n"),
    # A hanging indent does not depend on the bracket's place.
    ("import jax\nz = jax.tree_map(\n    f, a)\n", "import jax\nz = jax.tree_util.tree_map(\n    f, a)\n"),
    ("import jax\ns = jax.tree_map(f, {'a': 1,\n                     'b': 2})\n",
     "import jax\ns = jax.tree_util.tree_map(f, {'a': 1,\n                               'b': 2})\n"),
])
def test_continuation_lines_stay_aligned_with_a_moved_bracket(before, after):
  assert port.fix(before) == after
  assert port.fix(after) == after


NOTE = re.compile(r"^(?P<place>.+?): note: --write (?:would make|made) this line (?P<now>\d+) "
                  r"characters long(?:, from (?P<was>\d+))?, past the file's (?P<limit>\d+) "
                  r"\((?P<source>[^)]*)\); wrap it$", re.M)
LONG = ("import jax\nimport jax.experimental.multihost_utils\n"
        "y = jax.experimental.multihost_utils.process_allgather(x)\n"  # shorter
        "zs = jax.tree_map(lambda leaf: leaf * 2, {'weights': w, 'bias': b})\n"  # 67 -> 77
        "ys = jax.tree_map(lambda leaf: leaf * 2, {'weights': w, 'bias': b, 'c': c})\n"  # 75 -> 85
        "# https://example.com/a/comment/with/a/long/address/that/no/linter/counts/at/all/xx\n")


@pytest.mark.parametrize("config, limit", [
    ({"pyproject.toml": "[tool.pyink]\nline-length = 80\n"}, 80),
    ({"pyproject.toml": "[tool.ruff]\nline-length = 78\n"}, 78),
    ({"setup.cfg": "[flake8]\nmax-line-length = 80\n"}, 80),
    ({".pylintrc": "[FORMAT]\nmax-line-length=80\n"}, 80),
    ({}, 75),  # the file's own: its longest line (the address in a comment does not count)
])
def test_lines_the_rewrite_makes_too_long_are_named(cli, tmp_path, config, limit):
  """The lines `--write` (and `--diff`) makes longer than the file's line
  length (configured, else its longest line) are named on stderr, at their
  place in the rewritten file; the exit status does not change."""
  project = tmp_path / "project"
  (project / "src").mkdir(parents=True)
  (project / ".git").mkdir()
  for name, text in config.items():
    (project / name).write_text(text)
  path = project / "src" / "train.py"
  path.write_text(LONG)
  status, _, _, err = cli("--diff", path)
  assert status == 1 and path.read_text() == LONG
  would = [m.groupdict() for m in NOTE.finditer(err)]
  status, found, _, err = cli("--write", path)
  assert (status, found) == (0, []), err
  notes = [m.groupdict() for m in NOTE.finditer(err)]
  lines = path.read_text().splitlines()
  expected = [i + 1 for i, line in enumerate(lines) if len(line) > limit and "tree_util" in line]
  assert [int(n["place"].rpartition(":")[2]) for n in notes] == expected and expected, err
  assert all(int(n["limit"]) == limit and int(n["now"]) == len(lines[int(n["place"].rpartition(
      ":")[2]) - 1]) and int(n["was"]) == int(n["now"]) - 10 for n in notes), notes
  assert would == notes
  assert f"{len(notes)} line" in err and "made longer than the file's line length" in err
  assert (config and str(project) in notes[0]["source"]) or notes[0]["source"] == (
      "the longest line it had")
  assert "note:" not in cli("--write", path)[3]  # nothing grows the second time


def test_lines_made_longer_in_a_notebook_name_their_cell(cli, tmp_path):
  (tmp_path / ".git").mkdir()
  (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 70\n")
  path = tmp_path / "n.ipynb"
  timed = "%time y = jax.tree_map(lambda leaf: leaf * 2, {'weights': weights})"
  second = "w = jax.tree_map(lambda leaf: leaf * 2, {'weights': weights})"
  path.write_text(notebook(["import jax\n", timed, f"z = 1\n{second}", "v = jax.tree_map(f, x)"]))
  _, _, _, err = cli("--write", path)
  places = [(m["place"], int(m["now"])) for m in NOTE.finditer(err)]
  assert places == [(f"{path}:cell 2:1", len(timed) + 10),
                    (f"{path}:cell 3:2", len(second) + 10)], err


def test_a_notebook_keeps_every_byte_outside_the_sources_it_changes(cli, tmp_path):
  """Unchanged cells (escapes, empty sources, outputs, the file's own layout)
  come back byte for byte; a changed cell's source is written as the file
  writes sources."""
  unchanged = ('{"cell_type": "code", "execution_count": 1, "metadata": {}, '
               '"outputs": [{"name": "stdout", "output_type": "stream", "text": ["caf\\u00e9\\/\\n"]}], '
               '"source": ["print(\\"caf\\u00e9\\")  # \\u0041"]}')
  empty = '{"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [], "source": []}'
  changed = ('{"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [], '
             '"source": [\n    "import jax\\n",\n    "y = jax.tree_map(f,\\n",\n'
             '    "                 x)"\n   ]}')
  raw = ('{\n "cells": [\n  ' + unchanged + ',\n  ' + empty + ',\n  ' + changed
         + '\n ],\n "metadata": {"kernelspec": {"name": "python3"}},\n "nbformat": 4,\n'
         ' "nbformat_minor": 5\n}\n')
  path = tmp_path / "n.ipynb"
  path.write_text(raw)
  json.loads(raw)  # a valid notebook
  assert cli("--write", path)[:2] == (0, [])
  new_source = ('[\n    "import jax\\n",\n    "y = jax.tree_util.tree_map(f,\\n",\n'
                '    "                           x)"\n   ]')
  old_source = changed[changed.index('"source": ') + len('"source": '):-1]
  assert path.read_text() == raw.replace(old_source, new_source)
  assert cli("--write", path)[:2] == (0, []) and path.read_text() == raw.replace(
      old_source, new_source)


# -- names with one meaning today: this package's, or where JAX moved them -------


def test_a_name_this_package_provides_is_imported_from_it_from_any_gda_era_home():
  source = ("from jax._src.config import parallel_functions_output_gda, jax_array\n"
            "from jax._src import config as jax_config\n"
            "with parallel_functions_output_gda(True), "
            "jax_config.parallel_functions_output_gda(False):\n  pass\njax_array\n")
  fixed = assert_port_invariants(source)
  assert fixed == ("from jax_sharding_ext import parallel_functions_output_gda\n"
                   "from jax._src.config import jax_array\n"
                   "import jax_sharding_ext\n"
                   "with parallel_functions_output_gda(True), "
                   "jax_sharding_ext.parallel_functions_output_gda(False):\n  pass\njax_array\n")


def _rewritten_name(source, old):
  """What `fix` writes for the name `old` spelled last in `source`."""
  fixed = assert_port_invariants(source)
  return fixed.rpartition("= ")[2].strip()


@pytest.mark.parametrize("old", [
    "jax.experimental.sharding.Sharding", "jax.experimental.sharding.NamedSharding",
    "jax.ShapedArray", "jax.abstract_arrays.ShapedArray", "jax.interpreters.pxla.Mesh",
    "jax.experimental.maps.Mesh", "jax.experimental.pjit.PartitionSpec",
    "jax.experimental.sharding.MeshPspecSharding", "jax.lib.xla_client.Device",
])
def test_a_name_whose_module_moved_is_written_where_the_installed_jax_has_it(old):
  """The rewrite names the same object in the installed JAX: its class's
  public home (a renamed class under its new name)."""
  module = old.rpartition(".")[0]
  source = f"import jax\nimport {module}\nx = {old}\n"
  new = _rewritten_name(source, old)
  assert new.startswith("jax.") and resolves(new), new
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    obj = eval(new, {"jax": importlib.import_module("jax")})
  name = old.rpartition(".")[2]
  assert obj.__name__ in (name, "NamedSharding" if name == "MeshPspecSharding" else name, "P")


def test_a_removed_array_class_is_jax_array_in_annotations_and_reported_elsewhere():
  source = ("import jax\nfrom jax.random import KeyArray\nimport jax.numpy as jnp\n"
            "def f(k: jax.random.KeyArray, x: 'jnp.DeviceArray') -> KeyArray:\n"
            "  y: jnp.DeviceArray = x\n  return isinstance(k, jax.random.KeyArray)\n")
  fixed = assert_port_invariants(source)
  assert fixed == ("import jax\nimport jax.numpy as jnp\n"
                   "def f(k: jax.Array, x: 'jnp.DeviceArray') -> jax.Array:\n"
                   "  y: jax.Array = x\n  return isinstance(k, jax.random.KeyArray)\n")
  left = port.check(fixed)
  assert [(f.code, f.line) for f in left] == [("JSE303", 5)], left


def test_imports_of_removed_names_nothing_uses_go():
  source = ("from jax.sharding import OpShardingSharding, Mesh\n"
            "from jax.experimental.maps import xmap\nfrom jax.interpreters import pxla\n"
            "from jax.interpreters.pxla import ShardingSpec\n"
            "__all__ = ['ShardingSpec']\nMesh\n")
  fixed = assert_port_invariants(source)
  assert fixed == ("from jax.sharding import Mesh\nfrom jax.interpreters import pxla\n"
                   "from jax.interpreters.pxla import ShardingSpec\n"
                   "__all__ = ['ShardingSpec']\nMesh\n")


@pytest.mark.parametrize("before, after", [
    # Every use of the module rewritten: the import goes; a user's own unused import stays.
    ("import jax\nfrom jax.experimental import pjit, mesh_utils\n"
     "f = pjit.pjit(g, in_axis_resources=pjit.FROM_GDA)\n",
     "import jax\nimport jax_sharding_ext\nfrom jax.experimental import mesh_utils\n"
     "f = jax_sharding_ext.pjit(g, in_axis_resources=jax_sharding_ext.FROM_GDA)\n"),
    ("import jax\nfrom jax.experimental import pjit\nf = pjit.pjit(g)\n",
     "import jax\nimport jax_sharding_ext\nf = jax_sharding_ext.pjit(g)\n"),
    # `import a.b.c` goes where `import a` stays, else becomes `import a`.
    ("import jax\nimport jax.experimental.multihost_utils\n"
     "y = jax.experimental.multihost_utils.process_allgather(x)\n",
     "import jax\nimport jax_sharding_ext\n"
     "y = jax_sharding_ext.multihost_utils.process_allgather(x)\n"),
    ("import jax.experimental.multihost_utils\n"
     "y = jax.experimental.multihost_utils.process_allgather(x)\nz = jax.numpy.ones(3)\n",
     "import jax\nimport jax_sharding_ext\n"
     "y = jax_sharding_ext.multihost_utils.process_allgather(x)\nz = jax.numpy.ones(3)\n"),
])
def test_imports_the_rewrite_leaves_unused_go(before, after):
  fixed = assert_port_invariants(before)
  assert fixed == after
  found = [f for f in port.check(before) if f.code == "JSE110"]
  assert found and all(f.fixable for f in found), found


@pytest.mark.parametrize("source", [
    # Still named after the rewrite: by a use no rewrite replaces (reported), in
    # `__all__`, in a string annotation.
    "from jax.experimental import pjit\nf = pjit.pjit(g)\np = pjit.pjit_p\n",
    "from jax.experimental import pjit\n__all__ = ['pjit']\nf = pjit.pjit(g)\n",
    "import jax.numpy as jnp\ny: jnp.DeviceArray = x\ndef f(v: 'jnp.DeviceArray'):\n  pass\n",
    "import jax\nimport jax.experimental.multihost_utils\n"
    "y = jax.experimental.multihost_utils.process_allgather(x)\n"
    "def f(m: 'jax.experimental.multihost_utils.Foo'):\n  pass\n",
    # A top-level package: a rewrite may spell a new name through it.
    "import jax as j\ny = j.tree_map(f, x)\n",
    # Unused before the rewrite: the user's own.
    "import jax\nfrom jax.experimental import pjit\nimport jax.experimental.multihost_utils\n",
    # Inside a `try` that falls back on ImportError.
    "try:\n  from jax.experimental import pjit\nexcept ImportError:\n  pjit = None\n"
    "f = pjit.pjit(g)\n",
])
def test_imports_still_named_after_the_rewrite_stay(source):
  fixed = assert_port_invariants(source)
  assert not [f for f in port.check(source) if f.code == "JSE110"]
  tree = ast.parse(source)
  for node in tree.body:
    if isinstance(node, ast.Import | ast.ImportFrom) and "jax.experimental" in ast.unparse(node):
      assert ast.unparse(node).split(" import ")[-1] in fixed, fixed


# -- the legacy mesh's readers ------------------------------------------------------


def test_current_mesh_reads_the_legacy_and_the_set_mesh_context(mesh_2d):
  """The reader `--write` points `thread_resources.env` at: the mesh of either
  context, inside `jit` too; an empty `Mesh` without one."""
  assert jax_sharding_ext.current_mesh().empty
  assert jax_sharding_ext.current_mesh().devices.shape == ()
  seen = []

  @jax.jit
  def f(x):
    seen.append(jax_sharding_ext.current_mesh())
    return x

  with jax.set_mesh(mesh_2d):
    assert jax_sharding_ext.current_mesh() == mesh_2d
    f(1.0)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # `with mesh:` is deprecated
    with mesh_2d:
      assert jax_sharding_ext.current_mesh() == mesh_2d
  assert seen == [mesh_2d]


def test_reads_of_the_legacy_mesh_become_current_mesh():
  source = ("import jax\nfrom jax.experimental import maps\nfrom jax.interpreters import pxla\n"
            "def defined():\n  env = jax.experimental.maps.thread_resources.env\n"
            "  return env.physical_mesh.devices.shape != (), env.shape\n"
            "def names():\n  return (pxla.thread_resources.env.physical_mesh.axis_names,\n"
            "          maps.thread_resources.env.shape)\n"
            "def loops():\n  env = pxla.thread_resources.env\n  return env.loops\n")
  fixed = assert_port_invariants(source)
  assert fixed == (
      "import jax\nimport jax_sharding_ext\nfrom jax.interpreters import pxla\n"
      "def defined():\n  env = jax_sharding_ext.current_mesh()\n"
      "  return env.devices.shape != (), env.shape\n"
      "def names():\n  return (jax_sharding_ext.current_mesh().axis_names,\n"
      "          jax_sharding_ext.current_mesh().shape)\n"
      "def loops():\n  env = pxla.thread_resources.env\n  return env.loops\n")
  assert [(f.code, f.line) for f in port.check(fixed)] == [("JSE308", 11)]


def test_a_defect_of_the_tool_on_one_file_leaves_it_and_the_run_goes_on(cli, tmp_path,
                                                                       monkeypatch):
  from jax_sharding_ext.port import _engine
  (tmp_path / "a.py").write_text(MAPS)
  (tmp_path / "b.py").write_text(MAPS + "x = 1\n")
  real = _engine.fix_text

  def broken(text, path="<source>", project=None, growth=None):
    if path.endswith("a.py"):
      raise KeyError("a defect")
    return real(text, path, project, growth)
  monkeypatch.setattr(_engine, "fix_text", broken)
  status, _, _, err = cli("--write", tmp_path)
  assert status == 2 and "a.py: internal error (KeyError: 'a defect')" in err, err
  assert (tmp_path / "a.py").read_text() == MAPS
  assert (tmp_path / "b.py").read_text() == PORTED + "x = 1\n"


def test_removed_options_and_moved_modules_of_jax():
  """JAX's config object is asked for its options; `jax.linear_util` and
  `jax.xla` moved whole; a class JAX's internals define is at its
  `jax.extend` home."""
  source = ("import jax\nimport jax.linear_util as lu\nfrom jax import core\n"
            "jax.config.jax_eager_pmap\nf = lu.wrap_init\np = core.Primitive\nd = jax.xla\n")
  found = {(f.code, f.line, f.fixable) for f in port.check(source)}
  assert ("JSE311", 4, False) in found
  fixed = assert_port_invariants(source)
  assert "from jax.extend import linear_util as lu\n" in fixed
  assert "p = jax.extend.core.Primitive\n" in fixed and "d = jax.interpreters.xla\n" in fixed
