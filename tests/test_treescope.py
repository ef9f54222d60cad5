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
