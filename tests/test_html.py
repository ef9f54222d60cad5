"""The GDA's HTML view: a picture of the layout (boxes at their true position
and size, with `data-index` / `data-devices`), then the exact table."""

import html.parser
import re

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray


class _Boxes(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.boxes, self.layout, self.tags = [], None, []

  def handle_starttag(self, tag, attrs):
    a = dict(attrs)
    self.tags.append(tag)
    style = dict(kv.split(":", 1) for kv in a.get("style", "").split(";") if ":" in kv)
    px = {k: float(v[:-2]) for k, v in style.items() if v.endswith("px")}
    if a.get("class") == "jse-layout":
      self.layout = px
    if a.get("class") == "jse-shard":
      self.boxes.append({"index": a["data-index"], "devices": a["data-devices"], **px})


def _parse(gda):
  p = _Boxes()
  p.feed(gda._repr_html_())
  return p


def _gda(mesh, shape, spec):
  data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i])


def _expected(gda):
  """{data-index: data-devices} from the GDA's own shards."""
  out = {}
  for s in gda.global_shards:
    key = ",".join(f"{sl.start or 0}:{n if sl.stop is None else sl.stop}"
                   for sl, n in zip(s.index, gda.shape, strict=True))
    out.setdefault(key, []).append(s.device.id)
  return {k: ",".join(map(str, sorted(v))) for k, v in out.items()}


@pytest.mark.parametrize("shape, spec", [
    ((8, 2), P("x", "y")), ((8, 2), P("x")), ((8, 2), P(None, "y")), ((8, 2), P()),
    ((16,), P(("x", "y"))), ((8, 4, 8), P("y", None, "x")), ((), P()),
    ((0, 4), P(None, "y")),
])
def test_one_box_per_shard_with_its_devices(mesh_2d, shape, spec):
  gda = _gda(mesh_2d, shape, spec)
  boxes = _parse(gda).boxes
  assert {b["index"]: b["devices"] for b in boxes} == _expected(gda)
  assert len(boxes) == len(_expected(gda))
  assert "<script" not in gda._repr_html_() and "http" not in gda._repr_html_()


def test_boxes_sit_at_their_true_position_and_size(mesh_2d):
  gda = _gda(mesh_2d, (8, 4), P("x", "y"))
  p = _parse(gda)
  width, height = p.layout["width"], p.layout["height"]
  assert (width, height) == (480, 960) or width / height == pytest.approx(4 / 8)
  for b in p.boxes:
    (r0, r1), (c0, c1) = (map(int, part.split(":")) for part in b["index"].split(","))
    assert b["top"] == pytest.approx(r0 / 8 * height, abs=0.01)
    assert b["left"] == pytest.approx(c0 / 4 * width, abs=0.01)
    assert b["height"] == pytest.approx((r1 - r0) / 8 * height, abs=0.01)
    assert b["width"] == pytest.approx((c1 - c0) / 4 * width, abs=0.01)
  # The boxes tile the picture exactly.
  assert sum(b["width"] * b["height"] for b in p.boxes) == pytest.approx(width * height)


def test_rank_above_two_names_the_dimensions_drawn(mesh_2d):
  gda = _gda(mesh_2d, (8, 4, 8), P("y", None, "x"))
  text = gda._repr_html_()
  assert "dimensions 0 (rows) and 2 (columns) of shape (8, 4, 8)" in text


def test_shards_that_differ_only_in_dimensions_not_drawn_share_a_box(devices):
  """Sharded along three dimensions, pairs of shards sit at one drawn
  position: they share a box (both indices, all devices), so every device
  shows and no box hides another."""
  mesh = Mesh(np.array(devices).reshape(2, 2, 2), ("a", "b", "c"))
  gda = _gda(mesh, (4, 4, 4), P("a", "b", "c"))
  p = _parse(gda)
  assert len(p.boxes) == 4
  shown = sorted(int(d) for b in p.boxes for d in b["devices"].split(","))
  assert shown == list(range(8))
  expected = _expected(gda)
  for b in p.boxes:
    keys = b["index"].split(";")
    assert len(keys) == 2 and sorted(
        int(d) for k in keys for d in expected[k].split(",")) == sorted(
        int(d) for d in b["devices"].split(","))
  assert all(_overlap(a, c) == 0 for i, a in enumerate(p.boxes) for c in p.boxes[i + 1:])
  assert "shards that differ only there share a box" in gda._repr_html_()


def test_table_lists_every_shard_with_process_and_replica(mesh_2d):
  gda = _gda(mesh_2d, (8, 2), P("x"))
  text = gda._repr_html_()
  rows = re.findall(r"<tr><td><code>([^<]*)</code></td><td>[^<]*</td><td>(\d+)</td>"
                    r"<td>(\d+)</td></tr>", text)
  assert len(rows) == 8
  assert sorted(int(r) for _, _, r in rows) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_512_shards_render(devices):
  mesh = Mesh(np.array(devices), ("x",))
  gda = _gda(mesh, (512, 8), P("x"))  # 8 boxes of 64 rows
  assert len(_parse(gda).boxes) == 8
  # Many shards: from_callback over 8 devices cannot give 512, so build the
  # picture of a 512-way sharding through a fake GDA with the same surface.
  from jax_sharding_ext._notebook import html as _html

  class Fake:
    shape = (512, 4)
    mesh_axes = P("x")

    class mesh:
      shape = {"x": 512}

    def is_deleted(self):
      return False

    @property
    def global_shards(self):
      dev = jax.devices()[0]
      return [type("S", (), {"index": (slice(i, i + 1), slice(None)), "device": dev,
                              "replica_id": 0})() for i in range(512)]
  text = _html.gda_html(Fake())
  p = _Boxes()
  p.feed(text)
  assert len(p.boxes) == 512 and p.layout["height"] == 480
  assert all(b["height"] == pytest.approx(480 / 512, abs=0.01) for b in p.boxes)
  # The table: the first 32 and the last 8 shards, and how many are left out.
  rows = re.findall(r"<tr><td><code>([^<]*)</code>", text)
  assert rows[0] == "0:1,0:4" and rows[-1] == "511:512,0:4" and len(rows) == 40
  assert "... 472 more shards ..." in text


def test_a_scalar_is_one_small_box_with_its_value(mesh_2d, monkeypatch):
  """A jitted loss (0-d, with the output flag on) shows its value, as a
  `jax.Array`'s repr does; where the transfer guard refuses the fetch (on an
  accelerator: CPU fetches of one buffer are always allowed), the caption
  says so instead of failing the display."""
  from jax_sharding_ext._transfers import moves
  gda = _gda(mesh_2d, (), P())
  p = _parse(gda)
  assert len(p.boxes) == 1 and p.layout["width"] == 192 and p.layout["height"] == 48
  assert "a scalar, value 0.0;" in gda._repr_html_()
  monkeypatch.setattr(moves, "_fetch_always_allowed", lambda arr: False)  # as on a GPU
  fresh = _gda(mesh_2d, (), P())
  with jax.transfer_guard_device_to_host("disallow"):
    text = fresh._repr_html_()
  assert "a scalar, value not shown (JaxRuntimeError: INVALID_ARGUMENT: Disallowed " in text


def test_a_deleted_or_donated_gda_displays_as_deleted(mesh_2d):
  gda = _gda(mesh_2d, (8, 2), P("x"))
  f = jax.jit(lambda x: x + 1, donate_argnums=0)
  f(gda)
  assert gda.is_deleted()
  text = gda._repr_html_()
  assert "deleted" in text and "jse-shard" not in text


def _overlap(a, b):
  w = min(a["left"] + a["width"], b["left"] + b["width"]) - max(a["left"], b["left"])
  h = min(a["top"] + a["height"], b["top"] + b["height"]) - max(a["top"], b["top"])
  return max(w, 0) * max(h, 0)


def _assert_side_by_side(p, shape, along):
  """The boxes of `p` (a picture of an array of `shape` with one zero-size
  dimension) tile the picture along dimension `along`, the non-zero one: each
  spans the picture across the zero-size one, sits at its index's start and
  has its index's extent, and no two overlap."""
  width, height = p.layout["width"], p.layout["height"]
  n = shape[along]
  for b in p.boxes:
    start, stop = map(int, b["index"].split(",")[along].split(":"))
    if along == 1:  # laid out across, in one row
      assert (b["top"], b["height"]) == (0, pytest.approx(height, abs=0.01))
      assert b["left"] == pytest.approx(start / n * width, abs=0.01)
      assert b["width"] == pytest.approx((stop - start) / n * width, abs=0.01)
    else:  # laid out down, in one column
      assert (b["left"], b["width"]) == (0, pytest.approx(width, abs=0.01))
      assert b["top"] == pytest.approx(start / n * height, abs=0.01)
      assert b["height"] == pytest.approx((stop - start) / n * height, abs=0.01)
  for i, a in enumerate(p.boxes):
    for b in p.boxes[i + 1:]:
      assert _overlap(a, b) == pytest.approx(0, abs=1e-6), (a, b)
  assert sum(b["width"] * b["height"] for b in p.boxes) == pytest.approx(width * height)


@pytest.mark.parametrize("shape, along", [((0, 4), 1), ((4, 0), 0)])
def test_zero_size_dimension_draws_boxes_side_by_side(mesh_2d, shape, along):
  """A zero-size dimension is drawn as if it had size 1: the boxes of distinct
  indices (which differ only along the non-zero dimension) sit side by side
  along it, each at its own place, none overlapping."""
  gda = _gda(mesh_2d, shape, P("x", "y"))
  p = _parse(gda)
  assert {b["index"]: b["devices"] for b in p.boxes} == _expected(gda)
  assert len(p.boxes) == (2 if along == 1 else 4)
  _assert_side_by_side(p, shape, along)


def test_zero_size_dimension_with_many_shards(devices):
  """512 devices, shape (0, 32) split 16 x 32: 32 boxes across, one per column
  index, each 1/32 of the picture's width."""
  from jax_sharding_ext._notebook import html as _html

  class Fake:
    shape = (0, 32)
    mesh_axes = P("a", "b")

    class mesh:
      shape = {"a": 16, "b": 32}

    def is_deleted(self):
      return False

    @property
    def global_shards(self):
      dev = jax.devices()[0]
      return [type("S", (), {"index": (slice(0, 0), slice(j, j + 1)), "device": dev,
                              "replica_id": i})()
              for i in range(16) for j in range(32)]
  p = _Boxes()
  p.feed(_html.gda_html(Fake()))
  assert len(p.boxes) == 32
  _assert_side_by_side(p, Fake.shape, 1)
  assert all(b["width"] == pytest.approx(480 / 32, abs=0.01) for b in p.boxes)
