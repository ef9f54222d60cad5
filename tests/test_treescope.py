"""treescope accepts a GlobalDeviceArray (optional extra `[notebook]`): its
sharding picture, its array picture and its automatic rendering, exactly as
for the GDA's `jax.Array`."""

import re

import numpy as np
import pytest
import treescope
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray

# treescope 0.1.10 uses numpy's chararray, deprecated in numpy 2.5 (the
# Python 3.12 venv); its warning is treescope's, not ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The chararray class is deprecated:DeprecationWarning")


def _same(a: str, b: str) -> bool:
  # treescope gives every rendering fresh element ids.
  def norm(h):
    return re.sub(r"treescope_out_[0-9a-f]+", "treescope_out_ID", h)
  return norm(a) == norm(b)


@pytest.fixture
def gda(mesh_2d):
  data = np.arange(32, dtype=np.float32).reshape(8, 4)
  return GlobalDeviceArray.from_callback((8, 4), mesh_2d, P("x", "y"), lambda i: data[i])


def test_render_array_sharding(gda):
  ours = treescope.render_to_html(treescope.render_array_sharding(gda), compressed=False)
  stock = treescope.render_to_html(treescope.render_array_sharding(gda.to_jax_array()), compressed=False)
  assert _same(ours, stock)


def test_render_array(gda):
  ours = treescope.render_to_html(treescope.render_array(gda), compressed=False)
  stock = treescope.render_to_html(treescope.render_array(gda.to_jax_array()), compressed=False)
  assert _same(ours, stock)


def test_automatic_rendering(gda):
  with treescope.active_autovisualizer.set_scoped(treescope.ArrayAutovisualizer()):
    ours = treescope.render_to_html({"w": gda}, roundtrip_mode=False, compressed=False)
    stock = treescope.render_to_html({"w": gda.to_jax_array()}, roundtrip_mode=False, compressed=False)
  assert "GlobalDeviceArray" in ours
  # The same array picture as for the jax.Array (the one-line summary differs).
  pictures = [re.findall(r"arrayviz|<svg|<canvas", h) for h in (ours, stock)]
  assert pictures[0] and pictures[0] == pictures[1]


def test_no_registration_and_no_import_before_treescope_asks():
  import subprocess
  import sys
  res = subprocess.run([sys.executable, "-c", "import jax_sharding_ext, sys; "
                        "print('treescope' in sys.modules)"], capture_output=True, text=True,
                       timeout=120)
  assert res.stdout.strip() == "False", res.stderr


@pytest.mark.parametrize("shape", [(8, 1), (8, 124), (8, 125), (512, 8), (8192, 8)])
def test_every_size_renders_as_its_jax_array_does(mesh_2d, shape):
  """treescope summarises arrays of 1,000 elements or more from the array's
  `aval` (and draws them with the array picture); a GDA has one, so text and
  HTML renderings work at every size and show the same array picture as the
  GDA's `jax.Array`."""
  data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  g = GlobalDeviceArray.from_callback(shape, mesh_2d, P("x"), lambda i: data[i])
  x = g.to_jax_array()
  with treescope.active_autovisualizer.set_scoped(treescope.ArrayAutovisualizer()):
    text = treescope.render_to_text(g)
    html = treescope.render_to_html(g, compressed=False)
    stock_html = treescope.render_to_html(x, compressed=False)
  assert f"{shape[0]}, {shape[1]}" in text
  pictures = [re.findall(r"arrayviz|<svg|<canvas", h) for h in (html, stock_html)]
  assert pictures[0] == pictures[1]


def test_automatic_rendering_in_a_notebook(tmp_path):
  """treescope's automatic rendering of a notebook cell's value (a pytree of
  GDAs, as a train state is) and `treescope.display`, in a real Jupyter
  kernel, for small and large GDAs. (A GDA alone draws the package's own
  layout picture, its `_repr_html_`.)"""
  import os

  import nbformat
  from nbclient import NotebookClient
  nb = nbformat.v4.new_notebook(cells=[
      nbformat.v4.new_code_cell(
          'import os\nos.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"\n'
          "import jax, numpy as np, treescope\n"
          "from jax_sharding_ext import GlobalDeviceArray, Mesh, PartitionSpec as P\n"
          "treescope.basic_interactive_setup(autovisualize_arrays=True)\n"
          'mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))\n'
          "def gda(n):\n"
          "  data = np.arange(n, dtype=np.float32).reshape(-1, 8)\n"
          '  return GlobalDeviceArray.from_callback(data.shape, mesh, P("x", "y"), '
          "lambda i: data[i])"),
      nbformat.v4.new_code_cell('{"w": gda(64), "b": [gda(32)]}'),
      nbformat.v4.new_code_cell('{"w": gda(4096)}'),
      nbformat.v4.new_code_cell("treescope.display(gda(65536))"),
  ])
  saved = dict(os.environ)
  os.environ.pop("XLA_FLAGS", None)
  try:
    ran = NotebookClient(nb, timeout=300, kernel_name="python3",
                         resources={"metadata": {"path": str(tmp_path)}}).execute()
  finally:
    os.environ.clear()
    os.environ.update(saved)
  for cell in ran.cells[1:]:
    assert not [o for o in cell.outputs if o.output_type == "error"], cell.outputs
    # A failing display formatter prints its traceback to stderr.
    stderr = "".join(o.get("text", "") for o in cell.outputs
                     if o.output_type == "stream" and o.name == "stderr")
    assert "Error" not in stderr, stderr
    html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
    assert "treescope-container" in html
