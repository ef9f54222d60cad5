"""The porting tool (`python -m jax_sharding_ext.port`): findings, `--write`, errors.

A GDA-era script is checked for its exact findings, rewritten, and run;
small snippets pin each finding code and the rewrite's formatting; the tables
are checked against today's JAX and this package, so a message never names a
replacement that does not exist.
"""

import ast
import importlib
import importlib.util
import pathlib
import re
import subprocess
import sys
import warnings

import jax
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
TRAIN_FINDINGS = [("JSE104", 4), ("JSE104", 5), ("JSE103", 6), ("JSE103", 6), ("JSE101", 7),
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
    assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), (module, name)
  return pairs


def assert_port_invariants(source, path="<source>"):
  """After `fix`: it compiles, its new imports resolve, the findings left are the
  JSE2xx / JSE3xx ones of before, and fixing again changes nothing."""
  before = port.check(source, path)
  fixed = port.fix(source)
  compile(fixed, path, "exec")
  assert_imports_resolve(fixed)
  after = port.check(fixed, path)
  assert not any(f.fixable for f in after)
  assert sorted((f.code, f.message) for f in after) == sorted(
      (f.code, f.message) for f in before if not f.fixable)
  assert port.fix(fixed) == fixed
  return fixed


# -- a whole GDA-era script ---------------------------------------------------------


def test_script_findings_write_diff_and_run(cli, tmp_path, mesh_2d):
  path = tmp_path / "train.py"
  path.write_text(TRAIN)
  status, found, out, _ = cli(path)
  assert status == 1 and found == TRAIN_FINDINGS, out
  assert all(line.startswith(f"{path}:") for line in out.splitlines())

  status, _, out, err = cli("--diff", path)
  assert status == 1 and path.read_text() == TRAIN and "nothing written" in err
  changed = [ln for ln in out.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
  assert changed == [
      "-from jax.experimental import PartitionSpec as P  # the spec class",
      "-from jax.experimental.maps import Mesh",
      "-from jax.experimental.pjit import pjit, FROM_GDA",
      "-from jax.experimental.global_device_array import GlobalDeviceArray",
      "+from jax_sharding_ext import PartitionSpec as P  # the spec class",
      "+from jax_sharding_ext import Mesh",
      "+from jax_sharding_ext import pjit, FROM_GDA",
      "+from jax_sharding_ext import GlobalDeviceArray",
  ]

  status, found, _, err = cli("--write", path)
  fixed = path.read_text()
  assert status == 1 and "fixed 5 imports" in err
  assert found == [(c, n) for c, n in TRAIN_FINDINGS if not c.startswith("JSE1")]
  assert_port_invariants(TRAIN, str(path))
  status, _, _, err = cli("--write", path)  # idempotent
  assert path.read_text() == fixed and "fixed 0 imports in 0 files" in err

  # The rewritten script runs on this package up to what the tool left:
  # `jax.tree_map` (JSE301) is gone from JAX.
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # `with mesh:` (JSE204)
    with pytest.raises(AttributeError, match="tree_map"):
      load(path, "train")
  module = sys.modules.get("ported_train")
  assert module is None or not hasattr(module, "sizes")


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
                        [("JSE306", 1), ("JSE306", 2)]),
    "legacy pjit": ("from jax.experimental.pjit import pjit, FROM_GDA\n"
                    "f = pjit(g, in_axis_resources=FROM_GDA, out_axis_resources=None)\n",
                    [("JSE103", 1), ("JSE103", 1)]),
    "pjit through its module": (
        "from jax.experimental import pjit as pjit_lib\n"
        "f = pjit_lib.pjit(g, in_axis_resources=pjit_lib.FROM_GDA)\n"
        "def h(pjit_lib):\n  return pjit_lib.FROM_GDA\n",
        [("JSE305", 2), ("JSE306", 2)]),
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
                              [("JSE203", 3), ("JSE203", 4), ("JSE203", 7)]),
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
                  [("JSE204", 4), ("JSE204", 6), ("JSE204", 8), ("JSE204", 10), ("JSE204", 12)]),
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
    "thread_resources": ("import jax\njax.experimental.maps.thread_resources.env.physical_mesh\n",
                         [("JSE308", 2)]),
    "modern code": ("import jax\nfrom jax.sharding import Mesh, PartitionSpec as P\n"
                    "from jax.experimental import multihost_utils as _unused_if_ported, mesh_utils\n"
                    "with jax.set_mesh(Mesh(d, ('x',))):\n  y = jax.jit(f)(x)\n",
                    [("JSE105", 3)]),
    "star imports": ("from jax.experimental.global_device_array import *\n"
                     "from jax.experimental.maps import *\n"
                     "from jax.experimental.multihost_utils import *\n",
                     [("JSE307", 1), ("JSE307", 2)]),
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
  assert port.check(b"") == []


@pytest.mark.parametrize("before, after", [
    ("import jax.experimental.global_device_array as gda_lib, numpy as np  # why\n",
     "from jax_sharding_ext import global_device_array as gda_lib  # why\nimport numpy as np\n"),
    ("from jax.experimental.maps import Mesh as M, xmap  # pylint: disable=g-multiple-import\n",
     "from jax_sharding_ext import Mesh as M  # pylint: disable=g-multiple-import\n"
     "from jax.experimental.maps import xmap  # pylint: disable=g-multiple-import\n"),
    ("from jax.experimental import (\n    PartitionSpec as P,  # the spec\n    maps,\n)\n",
     "from jax_sharding_ext import (\n    PartitionSpec as P,  # the spec\n)\n"
     "from jax.experimental import (\n    maps,\n)\n"),
    ("from jax.experimental.pjit import (\n    pjit,  # legacy\n    pjit_p  # primitive\n)\n",
     "from jax_sharding_ext import (\n    pjit  # legacy\n)\n"
     "from jax.experimental.pjit import (\n    pjit_p  # primitive\n)\n"),
    ("from jax.experimental.pjit import pjit, with_sharding_constraint as wsc, FROM_GDA\n",
     "from jax_sharding_ext import pjit, FROM_GDA\n"
     "from jax.lax import with_sharding_constraint as wsc\n"),
    ("from jax.experimental.multihost_utils import sync_global_devices, process_allgather\n",
     "from jax_sharding_ext.multihost_utils import sync_global_devices, process_allgather\n"),
    ("from jax.experimental.multihost_utils import sync_global_devices\n",
     "from jax.experimental.multihost_utils import sync_global_devices\n"),
    ("from jax.experimental.global_device_array import GlobalDeviceArray, Shape\n",
     "from jax_sharding_ext.global_device_array import GlobalDeviceArray, Shape\n"),
    ("import os; from jax.experimental.maps import Mesh, xmap; import sys\n",
     "import os; from jax_sharding_ext import Mesh; from jax.experimental.maps import xmap; "
     "import sys\n"),
    ("def f():\n    # leading\n    from jax.experimental import multihost_utils, maps\n"
     "    return multihost_utils, maps\n",
     "def f():\n    # leading\n    from jax_sharding_ext import multihost_utils\n"
     "    from jax.experimental import maps\n    return multihost_utils, maps\n"),
    ("try:\n  from jax.experimental.gda_serialization.serialization import run_serialization\n"
     "except ImportError:\n  pass\n",
     "try:\n  from jax_sharding_ext.serialization import run_serialization\n"
     "except ImportError:\n  pass\n"),
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


def test_missing_path_exit_2_nothing_written(cli, tmp_path):
  fixable = tmp_path / "a.py"
  fixable.write_text("from jax.experimental.maps import Mesh\n")
  status, _, out, err = cli("--write", fixable, tmp_path / "missing.py")
  assert status == 2 and out == ""
  assert "missing.py: no such file or directory; nothing written" in err
  assert fixable.read_text() == "from jax.experimental.maps import Mesh\n"


def test_unreadable_file_exit_2(cli, tmp_path, monkeypatch):
  path = tmp_path / "a.py"
  path.write_text("import jax\n")
  real = pathlib.Path.read_bytes

  def refuse(self):
    if self.name == "a.py":
      raise PermissionError(13, "Permission denied")
    return real(self)
  monkeypatch.setattr(pathlib.Path, "read_bytes", refuse)
  status, _, _, err = cli(path)
  assert status == 2 and f"{path}: cannot read: Permission denied" in err


def test_syntax_error_exit_2_nothing_written(cli, tmp_path):
  fixable = tmp_path / "a.py"
  fixable.write_text("from jax.experimental.maps import Mesh\n")
  (tmp_path / "bad.py").write_text("import jax\ndef f(:\n  pass\n")
  status, _, out, err = cli("--write", tmp_path)
  assert status == 2 and out == ""
  assert f"{tmp_path / 'bad.py'}:2:" in err and "does not parse" in err and "nothing written" in err
  assert fixable.read_text() == "from jax.experimental.maps import Mesh\n"


def test_usage_errors_exit_2(cli):
  assert cli()[0] == 2
  assert cli("--write", "--diff", "x.py")[0] == 2


def test_diff_writes_nothing_and_write_applies_it(cli, tmp_path):
  path = tmp_path / "a.py"
  path.write_text("import jax\nfrom jax.experimental.maps import Mesh\njax.tree_map(f, x)\n")
  status, _, out, err = cli("--diff", path)
  assert status == 1 and "nothing written" in err
  assert path.read_text().count("jax.experimental.maps") == 1
  assert f"--- a/{path}" in out and f"+++ b/{path}" in out
  assert "-from jax.experimental.maps import Mesh\n+from jax_sharding_ext import Mesh\n" in out
  status, found, _, err = cli("--write", path)
  assert status == 1 and found == [("JSE301", 3)] and "fixed 1 import in 1 file" in err
  assert path.read_text() == "import jax\nfrom jax_sharding_ext import Mesh\njax.tree_map(f, x)\n"
  status, _, out, _ = cli("--diff", path)
  assert "---" not in out  # nothing left to rewrite


def test_write_when_only_imports_needed_exits_0(cli, tmp_path):
  path = tmp_path / "a.py"
  path.write_text("from jax.experimental.pjit import pjit, FROM_GDA\n")
  assert cli("--write", path)[:2] == (0, [])
  assert cli(path)[:2] == (0, [])


def test_directories_are_searched_for_python_files(cli, tmp_path):
  for rel in ("pkg/a.py", "pkg/sub/b.py", "pkg/.venv/c.py", "pkg/__pycache__/d.py",
              "pkg/notes.txt"):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("from jax.experimental.maps import Mesh\n")
  status, found, out, _ = cli(tmp_path / "pkg", tmp_path / "pkg" / "a.py")
  assert status == 1 and found == [("JSE104", 1), ("JSE104", 1)]
  assert [ln.split(":")[0] for ln in out.splitlines()] == [
      str(tmp_path / "pkg" / "a.py"), str(tmp_path / "pkg" / "sub" / "b.py")]


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


def test_removed_names_are_gone_and_changed_ones_are_there():
  for key, report in _reports.REPORTS.items():
    if not key.endswith(".*"):
      assert resolves(key) == (not report.gone), key
  for old in ("jax.numpy.DeviceArray", "jax.interpreters.xla.DeviceArray",
              "jax.interpreters.pxla.ShardedDeviceArray"):
    assert not resolves(old)
  for option in _reports.REMOVED_OPTIONS:
    assert not hasattr(jax.config, option)
  for option in _reports.OPTIONS:  # defined by this package
    assert hasattr(jax.config, option)


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
