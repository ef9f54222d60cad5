"""`GlobalDeviceArray._repr_html_`: a picture of the shard layout, then the table.

The array is drawn as a 2-D grid (rank 1 as one row; rank > 2 by its two
most-sharded dimensions, named in the caption): one box per shard at its true
position and proportional size, labelled with its device ids (replicas share
one box), one colour per device set; shards that differ only in dimensions
not drawn share a box too (the caption says so), so no device is hidden. A
zero-size dimension is drawn as if it had size 1, so boxes of distinct
indices still sit side by side. Each box carries `data-index` (`start:stop`
per dimension, comma separated; the indices of a shared box separated by
`;`) and `data-devices` (device ids, comma separated) for tools and tests. Below it,
the exact table: index, device, process and replica id of every shard (the
first 32 and the last 8 of more than 64). A scalar is one small box, and its
caption gives its value (fetched as `np.asarray` fetches it). Plain
HTML and inline CSS: no script, no network; boxes have their own light
background and dark text, so the picture reads in light and dark themes.
"""

from __future__ import annotations

import colorsys
import html
from collections.abc import Sequence

import numpy as np

_WIDTH = 480  # px of the picture's long side
_MIN_SIDE = 48  # px of its short side, however thin the array


def _bounds(index: tuple, shape: Sequence[int]) -> list[tuple[int, int]]:
  return [(s.start or 0, n if s.stop is None else s.stop)
          for s, n in zip(index, shape, strict=True)]


def _index_text(bounds: list[tuple[int, int]]) -> str:
  return ",".join(f"{a}:{b}" for a, b in bounds)


def _colour(i: int, n: int) -> str:
  r, g, b = colorsys.hls_to_rgb((i * 0.618034) % 1.0, 0.80, 0.55 if n > 1 else 0.0)
  return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _span(bounds: list[tuple[int, int]], shape: Sequence[int], dim: int | None
          ) -> tuple[int, int]:
  """Where a box lies along drawn dimension `dim`, in that dimension's units.

  A zero-size dimension is drawn as if it had size 1 and every box spanned
  it (its indices are all `0:0`), so boxes of distinct indices, which then
  differ along the other dimension, sit side by side and do not overlap.
  """
  if dim is None or shape[dim] == 0:
    return 0, 1
  return bounds[dim]


def _shown_dims(shape: Sequence[int], shard_shape: Sequence[int]) -> list[int]:
  """The (at most two) dimensions to draw, in order: the most-sharded ones."""
  if len(shape) <= 2:
    return list(range(len(shape)))
  parts = [(n // s if s else 1) for n, s in zip(shape, shard_shape, strict=True)]
  ranked = sorted(range(len(shape)), key=lambda d: (-parts[d], d))
  return sorted(ranked[:2])


_TABLE_HEAD, _TABLE_TAIL = 32, 8  # rows shown of a table of more than 64 shards


def _table(gda) -> str:
  rows = []
  shards = gda.global_shards
  shown = (shards if len(shards) <= 2 * _TABLE_HEAD
           else [*shards[:_TABLE_HEAD], None, *shards[-_TABLE_TAIL:]])
  for s in shown:
    if s is None:
      rows.append(f"<tr><td colspan='4'>... {len(shards) - _TABLE_HEAD - _TABLE_TAIL} "
                  "more shards ...</td></tr>")
      continue
    rows.append(
        f"<tr><td><code>{_index_text(_bounds(s.index, gda.shape)) or '()'}</code></td>"
        f"<td>{html.escape(str(s.device))}</td><td>{s.device.process_index}</td>"
        f"<td>{s.replica_id}</td></tr>")
  return ("<style>.jse-table td, .jse-table th {padding: 1px 10px; text-align: left "
          "!important}</style>"
          "<table class='jse-table' style='border-collapse:collapse;margin-top:6px'>"
          "<thead><tr><th>index</th><th>device</th><th>process</th><th>replica id</th>"
          "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _scalar_text(gda) -> str:
  """The value of a 0-d GDA, fetched as `np.asarray` fetches it (the repr of
  a `jax.Array` shows its value too), or why it is not shown."""
  try:
    return str(np.asarray(gda))
  except Exception as e:  # the transfer guard, or a value on other processes
    return f"not shown ({type(e).__name__}: {str(e).split('. ')[0]})"


def gda_html(gda) -> str:
  """The layout picture and table of `gda` (or a note that it is deleted)."""
  head = f"<p><code>{html.escape(repr(gda))}</code></p>"
  if gda.is_deleted():
    return (f"<div class='jse-gda'>{head}<p><b>deleted</b>: this GlobalDeviceArray was "
            "deleted or donated; its buffers are gone.</p></div>")
  shape = tuple(gda.shape)
  shards = gda.global_shards
  # One box per distinct index: replicas share it.
  boxes: dict[str, list] = {}
  for s in shards:
    bounds = _bounds(s.index, shape)
    boxes.setdefault(_index_text(bounds), [bounds, []])[1].append(s.device.id)

  shard_shape = [b - a for a, b in next(iter(boxes.values()))[0]] if boxes else []
  dims = _shown_dims(shape, shard_shape)
  rows_dim = dims[0] if len(dims) == 2 else None
  cols_dim = dims[-1] if dims else None
  n_rows = max(shape[rows_dim], 1) if rows_dim is not None else 1  # size 0 is drawn as 1
  n_cols = max(shape[cols_dim], 1) if cols_dim is not None else 1
  if not shape:  # a scalar: one small box
    width, height = 4 * _MIN_SIDE, _MIN_SIDE
  elif n_cols >= n_rows:
    width, height = _WIDTH, max(_MIN_SIDE, round(_WIDTH * n_rows / n_cols))
  else:
    width, height = max(_MIN_SIDE, round(_WIDTH * n_cols / n_rows)), _WIDTH
  font = 12 if len(boxes) <= 64 else 9

  # Shards at one drawn position (they differ only in dimensions not drawn)
  # share a box.
  drawn: dict[tuple, list] = {}
  for key, (bounds, devices) in boxes.items():
    at = (_span(bounds, shape, rows_dim), _span(bounds, shape, cols_dim))
    drawn.setdefault(at, []).append((key, devices))
  stacked = any(len(v) > 1 for v in drawn.values())
  parts = []
  for i, (((r0, r1), (c0, c1)), members) in enumerate(drawn.items()):
    top, left = r0 / n_rows * height, c0 / n_cols * width
    h, w = max(r1 - r0, 0) / n_rows * height, max(c1 - c0, 0) / n_cols * width
    devices = sorted(d for _, ds in members for d in ds)
    ids = ",".join(map(str, devices))
    label = ("dev " if len(devices) == 1 else "devs ") + ids.replace(",", ", ")
    title = "; ".join(f"index [{key}] on {'dev' if len(ds) == 1 else 'devs'} "
                      f"{', '.join(map(str, sorted(ds)))}" for key, ds in members)
    parts.append(
        f"<div class='jse-shard' data-index='{';'.join(k for k, _ in members)}' "
        f"data-devices='{ids}' title='{html.escape(title)}' style='position:absolute;"
        f"box-sizing:border-box;left:{left:.2f}px;top:{top:.2f}px;width:{w:.2f}px;"
        f"height:{h:.2f}px;background:{_colour(i, len(drawn))};color:#111;"
        f"border:1px solid #333;overflow:hidden;font:{font}px/1.2 monospace;"
        f"display:flex;align-items:center;justify-content:center;text-align:center'>"
        f"{html.escape(label)}</div>")

  if len(shape) > 2:
    caption = (f"dimensions {dims[0]} (rows) and {dims[1]} (columns) of shape {shape}; "
               "the others are not drawn" + (
                   " (shards that differ only there share a box)" if stacked else ""))
  elif len(shape) == 2:
    caption = f"shape {shape}: dimension 0 down, dimension 1 across"
  elif len(shape) == 1:
    caption = f"shape {shape}, drawn as one row"
  else:
    caption = f"a scalar, value {_scalar_text(gda)}"
  caption += (f"; {len(boxes)} shard{'s' if len(boxes) != 1 else ''}"
              f" on {len(shards)} device{'s' if len(shards) != 1 else ''}"
              f", mesh {dict(gda.mesh.shape)}, mesh_axes {gda.mesh_axes}")
  picture = (f"<div class='jse-layout' style='position:relative;width:{width}px;"
             f"height:{height}px;border:1px solid #333'>" + "".join(parts) + "</div>")
  return (f"<div class='jse-gda'>{head}{picture}<p style='font-size:smaller'>"
          f"{html.escape(caption)}</p>{_table(gda)}</div>")
