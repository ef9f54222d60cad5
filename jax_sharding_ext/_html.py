"""`GlobalDeviceArray._repr_html_`: the shard layout as an HTML table."""

from __future__ import annotations

import html

import numpy as np


def _fmt_index(index) -> str:
  parts = []
  for s in index:
    parts.append(":" if s.start is None and s.stop is None else f"{s.start}:{s.stop}")
  return "[" + ", ".join(parts) + "]" if parts else "[]"


def gda_html(gda) -> str:
  """One row per device of the mesh: its mesh position, slice and replica id."""
  if gda.is_deleted():
    return f"<div><p><code>{html.escape(repr(gda))}</code></p><p>deleted</p></div>"
  mesh = gda.mesh
  names = list(mesh.axis_names)
  rows = []
  for pos, shard in zip(_positions(mesh), gda.global_shards, strict=True):
    style = "" if shard.replica_id == 0 else ' style="color:#888"'
    where = "local" if shard.data is not None else "other process"
    rows.append(
        f"<tr{style}><td>{html.escape(str(shard.device))}</td>"
        f"<td>{html.escape(', '.join(f'{n}={p}' for n, p in zip(names, pos, strict=True)))}</td>"
        f"<td><code>{html.escape(_fmt_index(shard.index))}</code></td>"
        f"<td>{shard.replica_id}{' (replica)' if shard.replica_id else ''}</td>"
        f"<td>{where}</td></tr>")
  head = html.escape(repr(gda))
  return (f"<div><p><code>{head}</code></p>"
          "<table><thead><tr><th>device</th><th>mesh position</th><th>slice</th>"
          "<th>replica id</th><th>data</th></tr></thead><tbody>"
          + "".join(rows) + "</tbody></table></div>")


def _positions(mesh):
  return list(np.ndindex(*mesh.devices.shape))
