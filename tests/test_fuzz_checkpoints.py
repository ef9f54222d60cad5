"""Fuzzer: a damaged checkpoint restores exactly or raises.

For every format the package writes or reads (zarr with the GDA-era
metadata, the default of `serialization`; `metadata="stock"`; zarr3 with
each kind of codec chain; orbax through `orbax_support`), a small
checkpoint of GDAs (one or two arrays, a few steps) is saved by one of the
save calls, through an absolute path, a relative path under a working
directory changed between steps (`os.chdir`), or a `latest -> step_N`
symbolic link re-pointed between steps. Then one file of it is damaged:
deleted, truncated, a byte flipped, swapped with another step's or another
array's file of the same name, overwritten by another step's, edited field by
field (JSON metadata and the package's records), or a commit marker left as
by a writer that died; a second damage may hit a chunk too. Or the
checkpoint is copied file by file in name order (as rsync and object-store
tools copy) and the copy cut short at every point, the file at the cut half
written or not.

The model: a restore returns the saved values exactly (shape, dtype and every
bit), or raises; never other values, never zeros for missing data. An
undamaged step restores exactly, and so does a copy that is complete.
Coordinated forgeries (a record edited to agree with an edited metadata
file; a record swapped together with its chunks, which is a whole array
replaced by another) are not damage: at most one file that is not a chunk is
damaged per example, and when it is replaced by another step's or array's,
no chunk is.

Bad input to the checkpoint functions (specs, paths, shapes, dtypes,
meshes, mesh axes, orbax restore args) gives a clear `ValueError` /
`TypeError` naming the argument, or what stock `array_serialization` does
for the same input on a `jax.Array`; never a crash, a hang, or a bare
tensorstore or XLA error.

Every example runs in the suite's child process: damaged files reach
tensorstore's decoders, and a crash there is a failure naming the example.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import pathlib
import random
import re
import shutil
import tempfile
from typing import Any

import _stock
import pytest
from _fuzz import budget, isolated
from hypothesis import given
from strategies import (
  CHECKPOINT_FILE_DAMAGE,
  CHECKPOINT_ORBAX_CALLS,
  CHECKPOINT_SAVE_CALLS,
  CheckpointCall,
  CheckpointDamage,
  CutCheckpointCopy,
  DamagedCheckpoint,
  EditedCheckpoint,
  MeshSpec,
  SavedArray,
  checkpoint_calls,
  checkpoint_family,
  cut_checkpoint_copies,
  damaged_checkpoints,
  edited_checkpoints,
)

pytestmark = pytest.mark.fuzz

# ---------------------------------------------------------------------------
# The child side: save, damage, restore, judge.
# ---------------------------------------------------------------------------

_NAMES = ("params", "opt_state")


@contextlib.contextmanager
def _kept_cwd():
  cwd = os.getcwd()
  try:
    yield
  finally:
    os.chdir(cwd)


def _host_values(a: SavedArray, values: str, seed: int):
  import jax.numpy as jnp
  import numpy as np
  rng = np.random.default_rng(seed)
  dtype = jnp.dtype(a.dtype)
  if values == "zeros":
    return np.zeros(a.shape, dtype)
  if a.dtype == "bool":
    out = rng.random(a.shape) < 0.5
  elif np.issubdtype(dtype, np.integer):
    info = np.iinfo(dtype)
    out = rng.integers(max(info.min, -1000), min(info.max, 1000), a.shape, endpoint=True)
  else:
    out = rng.standard_normal(a.shape) * 100
  out = np.asarray(out).astype(dtype)
  if values == "partly_zero" and out.ndim:
    out[: out.shape[0] // 2] = 0
  return out


def _gda(a: SavedArray, host):
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import GlobalDeviceArray
  return GlobalDeviceArray.from_callback(a.shape, a.mesh.build(), P(*a.spec),
                                         lambda index: host[index])


def _zarr3_metadata(fmt: str, a: SavedArray) -> dict | None:
  """The zarr3 metadata of `fmt` for `a` (None: let the save choose stock's)."""
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  if fmt == "zarr3":
    return None
  chunk = list(NamedSharding(a.mesh.build(), P(*a.spec)).shard_shape(a.shape)) or []
  chunk = [max(1, c) for c in chunk]
  big = {"name": "bytes", "configuration": {"endian": "big"}}
  little = {"name": "bytes", "configuration": {"endian": "little"}}
  codecs: list = {
      "zarr3_gzip": [little, {"name": "gzip", "configuration": {"level": 5}}],
      "zarr3_crc32c": [little, {"name": "crc32c"}],
      "zarr3_transpose_zstd": [
          {"name": "transpose", "configuration": {"order": list(range(len(a.shape)))[::-1]}},
          little, {"name": "zstd", "configuration": {"level": 3, "checksum": False}}],
      "zarr3_big_blosc": [big, {"name": "blosc", "configuration": {
          "cname": "lz4", "clevel": 5, "shuffle": "shuffle"}}],
  }.get(fmt, [])
  if fmt == "zarr3_sharded":
    inner = [c // 2 if c % 2 == 0 else c for c in chunk]
    codecs = [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": inner, "codecs": [little, {"name": "zstd"}],
        "index_codecs": [little, {"name": "crc32c"}], "index_location": "end"}}]
  return {"shape": list(a.shape), "data_type": jnp.dtype(a.dtype).name,
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
          "codecs": codecs, "fill_value": False if a.dtype == "bool" else 0}


class Book:
  """Where a checkpoint's steps live and how each is spelled and restored."""

  def __init__(self, ex: Any, root: pathlib.Path):
    self.ex, self.root = ex, root
    self.family = checkpoint_family(ex.format)
    self.names = _NAMES[:len(ex.arrays)]
    self.values: dict[tuple[int, int], Any] = {}

  # -- where things are -----------------------------------------------------

  def step_dir(self, step: int) -> pathlib.Path:
    """The real directory of a step (everything of that step is under it)."""
    return self.root / f"step_{step}"

  def array_dir(self, step: int, i: int) -> pathlib.Path:
    """The real directory of array `i` of a step (serialization), or the
    step's orbax checkpoint."""
    if self.family == "orbax":
      return self.orbax_dir(step)
    return self.step_dir(step) / "ckpt" / self.names[i]

  def orbax_dir(self, step: int) -> pathlib.Path:
    if self.ex.save == "manager":
      return self.root / "manager" / str(step) / "default"
    return self.step_dir(step) / "ckpt"

  def call(self, fn):
    """`fn()`, a synchronous call of the package, made as the example's user
    makes it: in a notebook cell (inside a running event loop), or not."""
    if not getattr(self.ex, "notebook", False):
      return fn()

    async def cell():
      return fn()
    return asyncio.run(cell())

  def enter(self, step: int) -> None:
    """Make the spelling of `step` mean that step (chdir / re-point `latest`)."""
    place = getattr(self.ex, "place", "absolute")
    self.step_dir(step).mkdir(parents=True, exist_ok=True)
    if place == "relative":
      os.chdir(self.step_dir(step))
    elif place == "latest":
      link = self.root / "latest"
      tmp = self.root / "latest.tmp"
      if os.path.lexists(tmp):
        os.remove(tmp)
      os.symlink(f"step_{step}", tmp)
      os.replace(tmp, link)

  def path_text(self, step: int, i: int) -> str:
    """The path of array `i` of `step` as the saves and restores spell it
    (after `enter(step)`)."""
    place = getattr(self.ex, "place", "absolute")
    if place == "relative":
      return f"ckpt/{self.names[i]}"
    if place == "latest":
      return str(self.root / "latest" / "ckpt" / self.names[i])
    return str(self.array_dir(step, i))

  def spec(self, path: str, i: int) -> dict:
    fmt = self.ex.format
    driver = "zarr" if fmt in ("gda", "stock") else "zarr3"
    spec: dict = {"driver": driver, "kvstore": {"driver": "file", "path": path}}
    metadata = _zarr3_metadata(fmt, self.ex.arrays[i]) if driver == "zarr3" else None
    if metadata is not None:
      spec["metadata"] = metadata
    return spec

  # -- saving ----------------------------------------------------------------

  def save_all(self) -> None:
    for step in range(self.ex.steps):
      hosts = [_host_values(a, self.ex.values, self.ex.seed + 7919 * step + 31 * i)
               for i, a in enumerate(self.ex.arrays)]
      for i, h in enumerate(hosts):
        self.values[step, i] = h
      gdas = [_gda(a, h) for a, h in zip(self.ex.arrays, hosts, strict=True)]
      self.enter(step)
      if self.family == "orbax":
        self._save_orbax(step, gdas)
      else:
        self._save_serialization(step, gdas)

  def _save_serialization(self, step: int, gdas: list) -> None:
    from jax_sharding_ext import serialization
    specs = [self.spec(self.path_text(step, i), i) for i in range(len(gdas))]
    kw = {"metadata": "stock"} if self.ex.format == "stock" else {}
    how = self.ex.save
    if how == "run":
      self.call(lambda: serialization.run_serialization(gdas, specs, **kw))
    elif how == "manager":
      manager = serialization.GlobalAsyncCheckpointManager()
      self.call(lambda: manager.serialize(gdas, specs, on_commit_callback=lambda: None, **kw))
      self.call(manager.wait_until_finished)
    elif how == "async":
      for g, s in zip(gdas, specs, strict=True):
        asyncio.run(serialization.async_serialize(g, s, **kw))
    else:
      async def go():
        futures: list = []
        for g, s in zip(gdas, specs, strict=True):
          await serialization.async_serialize(g, s, futures, **kw)
        for f in futures:  # as GDA-era callers waited for the commit futures
          f.result()
      asyncio.run(go())

  def _orbax_text(self, step: int) -> str:
    place = getattr(self.ex, "place", "absolute")
    if self.ex.save == "manager":
      return "manager" if place == "relative" else str(self.root / "manager")
    if place == "relative":
      return "ckpt"
    if place == "latest":
      return str(self.root / "latest" / "ckpt")
    return str(self.orbax_dir(step))

  def _save_orbax(self, step: int, gdas: list) -> None:
    import orbax.checkpoint as ocp

    import jax_sharding_ext.orbax_support  # noqa: F401  (GDA leaves)
    state = dict(zip(self.names, gdas, strict=True))
    if self.ex.save == "manager":
      if getattr(self.ex, "place", "absolute") == "relative":
        os.chdir(self.root)
      with ocp.CheckpointManager(os.path.abspath(self._orbax_text(step))) as mngr:
        mngr.save(step, args=ocp.args.PyTreeSave(state))
        mngr.wait_until_finished()
      return
    path = os.path.abspath(self._orbax_text(step))
    if self.ex.save == "pytree":
      ocp.PyTreeCheckpointer().save(path, state)
    else:
      with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, state)
        ckptr.wait_until_finished()

  # -- restoring -------------------------------------------------------------

  def target(self, i: int):
    from jax.sharding import PartitionSpec as P
    a = self.ex.arrays[i]
    target = getattr(self.ex, "target", "saved")
    if target == "one_device":
      return MeshSpec((1,), ("x",), (a.mesh.device_ids[0],)).build(), P()
    return a.mesh.build(), (P(*a.spec) if target == "saved" else P())

  def restore(self, step: int, i: int, path: str | None = None):
    """Array `i` of `step` restored (from `path`, a copy, if given), as numpy."""
    import numpy as np
    if self.family == "orbax":
      return self._restore_orbax(step, path)[i]
    from jax.sharding import NamedSharding

    from jax_sharding_ext import serialization
    if path is None:
      self.enter(step)
      path = self.path_text(step, i)
    spec = self.spec(path, i)
    spec.pop("metadata", None)  # a restore reads what is stored
    mesh, axes = self.target(i)
    how = self.ex.restore
    if how == "run_mesh":
      out = self.call(lambda: serialization.run_deserialization([mesh], [axes], [spec])[0])
    elif how == "run_sharding":
      out = self.call(lambda: serialization.run_deserialization([NamedSharding(mesh, axes)],
                                                                [spec])[0])
    elif how == "async":
      out = asyncio.run(serialization.async_deserialize(mesh, axes, spec))
    else:
      out = self.call(lambda: serialization.GlobalAsyncCheckpointManager().deserialize(
          [mesh], [axes], [spec])[0])
    return np.asarray(out)

  def _restore_orbax(self, step: int, path: str | None) -> list:
    import numpy as np
    import orbax.checkpoint as ocp

    from jax_sharding_ext import orbax_support
    targets = []
    for i, a in enumerate(self.ex.arrays):
      mesh, axes = self.target(i)
      targets.append(_gda(dataclasses.replace(a, mesh=_mesh_spec_of(mesh), spec=tuple(axes)),
                          np.zeros(a.shape, self.values[step, i].dtype)))
    target = dict(zip(self.names, targets, strict=True))
    args = orbax_support.restore_args_for(target)
    if path is None:
      self.enter(step)
      if self.ex.save == "manager":
        if getattr(self.ex, "place", "absolute") == "relative":
          os.chdir(self.root)
        with ocp.CheckpointManager(os.path.abspath(self._orbax_text(step))) as mngr:
          out = mngr.restore(step, args=ocp.args.PyTreeRestore(item=target,
                                                               restore_args=args))
        return [np.asarray(out[n]) for n in self.names]
      path = os.path.abspath(self._orbax_text(step))
    if self.ex.save == "standard":
      with ocp.StandardCheckpointer() as ckptr:
        out = ckptr.restore(path, target)
    else:
      out = ocp.PyTreeCheckpointer().restore(
          path, args=ocp.args.PyTreeRestore(item=target, restore_args=args))
    return [np.asarray(out[n]) for n in self.names]


def _mesh_spec_of(mesh) -> MeshSpec:
  return MeshSpec(tuple(mesh.devices.shape), tuple(mesh.axis_names),
                  tuple(d.id for d in mesh.devices.flat))


# -- what a checkpoint directory holds -------------------------------------------------


def _files(d: pathlib.Path) -> list[str]:
  """Every file under `d`, as relative paths in name (byte) order."""
  if not d.is_dir():
    return []
  return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() or p.is_symlink())


def _is_chunk(family: str, name: str) -> bool:
  if family == "orbax":
    return name.startswith("d/") or "/d/" in name
  base = name.rsplit("/", 1)[-1]
  return base not in (".zarray", ".zattrs", "zarr.json") and "jax_sharding_ext" not in base


def _is_json(path: pathlib.Path) -> bool:
  try:
    json.loads(path.read_bytes())
  except (ValueError, UnicodeDecodeError):
    return False
  return True


# -- editing a JSON file field by field -------------------------------------------------

_VOCABULARY = (
    ("little", "big"), ("C", "F"), (".", "/"), ("default", "v2"), ("array", "group"),
    ("regular", "rectangular"),
    ("bytes", "transpose", "gzip", "zstd", "blosc", "crc32c", "sharding_indexed", "zlib", "bz2"),
    ("<f4", ">f4", "<i4", ">i4", "<f2", ">f2", "|u1", "|i1", "|b1", "bfloat16", "<u4"),
    ("float32", "int32", "uint32", "float16", "bfloat16", "uint8", "int8", "bool", "float64"),
    ("crc32", "tail8", "tail4", "tail16"), ("start", "end"),
    ("shuffle", "noshuffle", "bitshuffle"), ("lz4", "zstd", "blosclz"),
    ("jax.Array", "np.ndarray", "scalar", "string"),
)
"""Values of zarr, zarr3, orbax and the package's records that an edit swaps
for one another (a value of one group becomes another of its group)."""


def _nodes(doc: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
  out = [(path, doc)]
  if isinstance(doc, dict):
    for k in doc:
      out += _nodes(doc[k], (*path, k))
  elif isinstance(doc, list):
    for i, v in enumerate(doc):
      out += _nodes(v, (*path, i))
  return out


def _list_items(doc: Any, lst: list) -> list:
  """What an edit may insert into `lst` (a zarr3 codec chain gets codecs)."""
  if lst and all(isinstance(x, dict) and "name" in x for x in lst):
    rank = len(doc.get("shape", ())) if isinstance(doc, dict) else 0
    return [{"name": "transpose", "configuration": {"order": list(range(rank))[::-1]}},
            {"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"},
            copy.deepcopy(lst[0])]
  if all(isinstance(x, int) and not isinstance(x, bool) for x in lst):
    return [1]
  return [copy.deepcopy(lst[0])] if lst else [0]


_ADDED_FIELDS = (("order", "F"), ("dimension_separator", "/"), ("filters", []),
                 ("attributes", {"a": 1}), ("dimension_names", ["a"]))


def _edits(doc: Any) -> list[tuple[str, tuple, Any]]:
  """Every single-field edit of a JSON document: (op, path, value), op one
  of "set" (the field gets the value), "drop" (the field goes), "insert"
  (the value goes into the list at the path, at its start or end)."""
  out: list[tuple[str, tuple, Any]] = []
  for path, v in _nodes(doc):
    if path and isinstance(path[-1], str):
      out.append(("drop", path, None))
    if isinstance(v, bool):
      out.append(("set", path, not v))
    elif isinstance(v, int | float):
      out += [("set", path, n) for n in (v + 1, 0) if n != v]
    elif isinstance(v, str):
      group = next((g for g in _VOCABULARY if v in g), None)
      out += [("set", path, x) for x in group if x != v] if group else [("set", path, v + "x")]
    elif v is None:
      out.append(("set", path, 0))
    elif isinstance(v, list):
      for item in _list_items(doc, v):
        out += [("insert", (*path, 0), item), ("insert", (*path, len(v)), item)]
    elif isinstance(v, dict) and not path:
      out += [("set", (k,), x) for k, x in _ADDED_FIELDS if k not in v]
  return out


def _apply_edit(doc: Any, edit: tuple[str, tuple, Any]) -> Any:
  op, path, value = edit
  if not path:
    return copy.deepcopy(value)
  doc = copy.deepcopy(doc)
  parent = doc
  for k in path[:-1]:
    parent = parent[k]
  if op == "drop":
    del parent[path[-1]]
  elif op == "insert":
    parent.insert(path[-1], copy.deepcopy(value))
  else:
    parent[path[-1]] = copy.deepcopy(value)
  return doc


# -- damage ----------------------------------------------------------------------------


def _swap(a: pathlib.Path, b: pathlib.Path) -> None:
  tmp = a.with_name(a.name + ".swap")
  os.replace(a, tmp)
  os.replace(b, a)
  os.replace(tmp, b)


_SUBSTITUTIONS = ("swap_step", "swap_array", "copy_step")


def _damage(book: Book, d: CheckpointDamage, data_only: bool) -> str:
  """Apply `d`; return what was done, for the failure message ("" if nothing)."""
  ex = book.ex
  step, i = d.step % ex.steps, d.array % len(ex.arrays)
  where = book.array_dir(step, i)
  if d.kind == "uncommitted":
    if book.family == "orbax":
      return ""  # orbax's own commit protocol (a temporary directory renamed) has no marker
    from jax_sharding_ext import serialization
    (where / serialization.COMMIT_MARKER).write_bytes(b"")
    return f"left the commit marker in {where.relative_to(book.root)}"
  names = _files(where)
  if data_only:
    names = [n for n in names if _is_chunk(book.family, n)]
  if d.kind == "edit":
    names = [n for n in names if _is_json(where / n)]
  if not names:
    return ""
  name = names[d.file % len(names)]
  path = where / name
  shown = f"{path.relative_to(book.root)}"
  data = path.read_bytes()
  if d.kind == "delete":
    path.unlink()
    return f"deleted {shown}"
  if d.kind == "truncate":
    keep = d.at % max(1, len(data))
    path.write_bytes(data[:keep])
    return f"truncated {shown} to {keep} of {len(data)} bytes"
  if d.kind == "flip":
    if not data:
      return ""
    at, bit = (d.at // 8) % len(data), d.at % 8
    flipped = bytearray(data)
    flipped[at] ^= 1 << bit
    path.write_bytes(bytes(flipped))
    return f"flipped bit {bit} of byte {at} of {shown}"
  if d.kind in ("swap_step", "copy_step"):
    if ex.steps < 2:
      return ""
    other = (step + 1 + d.at % (ex.steps - 1)) % ex.steps
    there = book.array_dir(other, i) / name
    if not there.is_file():
      return ""
    if d.kind == "swap_step":
      _swap(path, there)
      return f"swapped {shown} with step {other}'s"
    shutil.copyfile(there, path)
    return f"overwrote {shown} with step {other}'s"
  if d.kind == "swap_array":
    if len(ex.arrays) < 2 or book.family == "orbax":
      return ""
    there = book.array_dir(step, 1 - i) / name
    if not there.is_file():
      return ""
    _swap(path, there)
    return f"swapped {shown} with {there.relative_to(book.root)}"
  assert d.kind == "edit", d.kind
  doc = json.loads(data)
  done = []
  for k in d.edits:
    options = _edits(doc)
    if not options:
      break
    edit = options[random.Random(k).randrange(len(options))]
    doc = _apply_edit(doc, edit)
    done.append(_shown_edit(edit))
  path.write_text(json.dumps(doc))
  return f"edited {shown}: " + "; ".join(done)


def _shown_edit(edit: tuple[str, tuple, Any]) -> str:
  op, path, value = edit
  return f"{op} {'/'.join(map(str, path))}" + ("" if op == "drop" else f" = {json.dumps(value)}")


# -- judging ---------------------------------------------------------------------------


def _same(got: Any, want: Any) -> bool:
  import numpy as np
  return (got.shape == want.shape and got.dtype == want.dtype
          and np.asarray(got).tobytes() == np.asarray(want).tobytes())


def _expected(book: Book, step: int, i: int):
  """What array `i` of `step` restores to on its target (the saved values)."""
  return book.values[step, i]


def _outcome(fn) -> tuple[str, Any]:
  try:
    return "ok", fn()
  except Exception as e:  # the model allows any error for damaged data
    return "raised", f"{type(e).__name__}: {str(e)[:200]}"


def _differences(got: Any, want: Any) -> str:
  import numpy as np
  if got.shape != want.shape or got.dtype != want.dtype:
    return f"shape/dtype {got.shape} {got.dtype}, saved {want.shape} {want.dtype}"
  g, w = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
  diff = [k for k in range(g.size) if g[k:k + 1].tobytes() != w[k:k + 1].tobytes()]
  zeros = all(not g[k] for k in diff)
  return (f"{len(diff)} of {g.size} values differ{' (restored as zeros)' if zeros else ''}; "
          f"first at flat index {diff[0]}: {g[diff[0]]!r}, saved {w[diff[0]]!r}")


def check_damaged_checkpoint(ex: DamagedCheckpoint) -> list[str]:
  """An undamaged step restores exactly; after the damage every step
  restores exactly or raises (an uncommitted one raises). Under a transfer
  guard a save or restore is refused (writing nothing) exactly where stock's
  of a `jax.Array` is. All of it the same in a notebook cell and under
  `jax.enable_x64` (64-bit arrays stay 64-bit). Returns what was damaged and
  how each restore ended."""
  import jax
  with jax.enable_x64(getattr(ex, "x64", False)):
    return _check_damaged_checkpoint(ex)


_STOCK_REFUSES: dict[tuple[str, str], bool] = {}


def _stock_refuses(guard: str, what: str) -> bool:
  """Whether stock `array_serialization` refuses a save / restore of a
  `jax.Array` under `guard` (which directions a save's and a restore's
  copies are, and whether explicit, is stock's to say, and differs between
  JAX releases)."""
  key = (guard, what)
  if key not in _STOCK_REFUSES:
    import jax
    import numpy as np
    from jax.experimental.array_serialization import serialization as stock
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = MeshSpec((8,), ("x",), tuple(range(8))).build()
    sharding = NamedSharding(mesh, P("x"))
    arr = jax.device_put(np.arange(8, dtype=np.float32), sharding)
    with tempfile.TemporaryDirectory(prefix="jse-fuzz-") as tmp:
      spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{tmp}/w"}}
      if what == "restore":
        stock.run_serialization([arr], [spec])
      with _guard(guard), _stock.settled():
        kind, _ = _outcome(lambda: stock.run_serialization([arr], [spec]) if what == "save"
                           else stock.run_deserialization([sharding], [spec]))
    _STOCK_REFUSES[key] = kind != "ok"
  return _STOCK_REFUSES[key]


def _guard(level: str):
  import jax
  direction, _, level = level.rpartition(":")
  return getattr(jax, f"transfer_guard_{direction}" if direction else "transfer_guard")(level)


def _check_guard(book: Book) -> None:
  """A save and a restore under the example's guard: refused (raising the
  guard's error, writing nothing) or done exactly, as the guard says."""
  import numpy as np

  from jax_sharding_ext import serialization
  ex = book.ex
  if ex.guard == "allow" or book.family != "serialization":
    return
  a, host = ex.arrays[0], book.values[0, 0]
  target = book.root / "guarded"
  spec = book.spec(str(target), 0)
  gda = _gda(a, host)
  for what, call, refused in (
      ("save", lambda: book.call(lambda: serialization.run_serialization([gda], [spec])),
       _stock_refuses(ex.guard, "save")),
      ("restore", lambda: book.restore(0, 0), _stock_refuses(ex.guard, "restore"))):
    with _guard(ex.guard):
      kind, got = _outcome(call)
    if refused and (kind == "ok" or "Disallowed" not in got):
      raise AssertionError(f"the {what} under the guard {ex.guard!r} was not refused by it: "
                           f"{'it ran' if kind == 'ok' else got}")
    if not refused and kind != "ok":
      raise AssertionError(f"the {what} under the guard {ex.guard!r} failed: {got}")
    if what == "restore" and kind == "ok" and not _same(got, host):
      raise AssertionError(f"restored under the guard {ex.guard!r}: {_differences(got, host)}")
  if _stock_refuses(ex.guard, "save"):
    written = [f for f in _files(target) if _is_chunk(book.family, f)]
    if written:
      raise AssertionError(f"the refused save wrote {written}")
  else:
    back = serialization.run_deserialization([a.mesh.build()], [()], [_readable(spec)])[0]
    if not _same(np.asarray(back), host):
      raise AssertionError(f"saved under the guard {ex.guard!r}: "
                           f"{_differences(np.asarray(back), host)}")


def _check_damaged_checkpoint(ex: DamagedCheckpoint) -> list[str]:
  with tempfile.TemporaryDirectory(prefix="jse-fuzz-") as tmp, _kept_cwd():
    book = Book(ex, pathlib.Path(tmp))
    book.save_all()
    _check_guard(book)
    if ex.check_first:
      for step in range(ex.steps):
        for i in range(len(ex.arrays)):
          kind, got = _outcome(lambda: book.restore(step, i))  # noqa: B023
          want = _expected(book, step, i)
          if kind != "ok" or not _same(got, want):
            raise AssertionError(
                f"step {step} array {book.names[i]}, undamaged, did not restore: "
                + (got if kind != "ok" else _differences(got, want)))
    done = []
    for n, d in enumerate(ex.damage):
      if n and d.kind in _SUBSTITUTIONS and any(
          x.startswith(("swapped", "overwrote")) and not _is_chunk(
              book.family, x.split(" ")[1]) for x in done):
        continue  # with the record or metadata replaced too, a forgery
      done.append(_damage(book, d, data_only=n > 0))
    done = [x for x in done if x]
    seen = []
    for step in range(ex.steps):
      for i in range(len(ex.arrays)):
        kind, got = _outcome(lambda: book.restore(step, i))  # noqa: B023
        seen.append("exact" if kind == "ok" else got)
        want = _expected(book, step, i)
        if kind == "ok" and not _same(got, want):
          raise AssertionError(
              f"after {done or ['no damage']}: step {step} array {book.names[i]} restored "
              f"other values than saved: {_differences(got, want)}")
        if kind == "ok" and any(x.startswith("left the commit marker") for x in done) \
            and _damaged_here(book, done, step, i):
          raise AssertionError(f"after {done}: step {step} array {book.names[i]} restored "
                               "although its commit marker is there")
    return done + seen


def _damaged_here(book: Book, done: list[str], step: int, i: int) -> bool:
  rel = str(book.array_dir(step, i).relative_to(book.root))
  return any(f"marker in {rel}" in x for x in done)


def check_every_edit(ex: EditedCheckpoint) -> int:
  """Each single-field edit of the file restores exactly or raises; the
  file put back, the step restores exactly. Returns the number of edits."""
  with tempfile.TemporaryDirectory(prefix="jse-fuzz-") as tmp, _kept_cwd():
    book = Book(ex, pathlib.Path(tmp))
    book.save_all()
    step, i = ex.step % ex.steps, ex.array % len(ex.arrays)
    where = book.array_dir(step, i)
    names = [n for n in _files(where) if _is_json(where / n)]
    path = where / names[ex.file % len(names)]
    original = path.read_bytes()
    arrays = range(len(ex.arrays)) if book.family == "orbax" else [i]
    edits = _edits(json.loads(original))
    for edit in [*edits, None]:
      if edit is not None:
        path.write_text(json.dumps(_apply_edit(json.loads(original), edit)))
      for j in arrays:
        kind, got = _outcome(lambda: book.restore(step, j))  # noqa: B023
        want = _expected(book, step, j)
        what = (f"{path.relative_to(book.root)} edited: {_shown_edit(edit)}"
                if edit is not None else f"{path.relative_to(book.root)} put back")
        if kind == "ok" and not _same(got, want):
          raise AssertionError(f"{what}: array {book.names[j]} restored other values than "
                               f"saved: {_differences(got, want)}")
        if edit is None and kind != "ok":
          raise AssertionError(f"{what}: array {book.names[j]} did not restore: {got}")
      path.write_bytes(original)
    return len(edits)


def check_cut_copy(ex: CutCheckpointCopy) -> None:
  """A copy of a committed step, made file by file in name order, restores
  exactly when complete and exactly or raises when cut short anywhere."""
  with tempfile.TemporaryDirectory(prefix="jse-fuzz-") as tmp, _kept_cwd():
    root = pathlib.Path(tmp)
    book = Book(ex, root)
    book.save_all()
    step = ex.step % ex.steps
    source = book.step_dir(step) if ex.save != "manager" or book.family != "orbax" \
        else root / "manager" / str(step)
    names = _files(source)
    for cut in range(len(names) + 1):
      for half in ((False, True) if ex.half_written and cut < len(names) else (False,)):
        dest = root / f"copy_{cut}_{int(half)}"
        for n in names[:cut]:
          (dest / n).parent.mkdir(parents=True, exist_ok=True)
          shutil.copyfile(source / n, dest / n)
        if half:
          data = (source / names[cut]).read_bytes()
          (dest / names[cut]).parent.mkdir(parents=True, exist_ok=True)
          (dest / names[cut]).write_bytes(data[:len(data) // 2])
        for i in range(len(ex.arrays)):
          copied = _copied_path(book, dest, source, step, i)
          kind, got = _outcome(lambda: book.restore(step, i, copied))  # noqa: B023
          want = _expected(book, step, i)
          what = (f"the copy of step {step} cut after {cut} of {len(names)} files "
                  f"{names[:cut][-1:] or ['(none)']}" + (f", {names[cut]} half written"
                                                         if half else ""))
          if kind == "ok" and not _same(got, want):
            raise AssertionError(f"{what}: array {book.names[i]} restored other values than "
                                 f"saved: {_differences(got, want)}")
          if cut == len(names) and kind != "ok":
            raise AssertionError(f"{what} (complete): array {book.names[i]} did not restore: "
                                 f"{got}")
        shutil.rmtree(dest, ignore_errors=True)


def _copied_path(book: Book, dest: pathlib.Path, source: pathlib.Path, step: int, i: int) -> str:
  real = book.array_dir(step, i)
  return str(dest / real.relative_to(source))


# -- bad input ---------------------------------------------------------------------------

_STATUS_CODES = ("INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "ALREADY_EXISTS",
                 "OUT_OF_RANGE", "UNIMPLEMENTED", "DATA_LOSS", "UNKNOWN", "INTERNAL",
                 "RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "ABORTED", "UNAVAILABLE",
                 "CANCELLED", "DEADLINE_EXCEEDED")


def _plain(x: Any) -> Any:
  """An example's plain value as the object it stands for."""
  import numpy as np
  if isinstance(x, tuple) and len(x) == 2 and x[0] == "np.int64":
    return np.int64(x[1])
  if isinstance(x, tuple) and len(x) == 2 and x[0] == "np.dtype":
    return np.dtype(x[1])
  if isinstance(x, tuple):
    return tuple(_plain(v) for v in x)
  if isinstance(x, list):
    return [_plain(v) for v in x]
  return x


def _spec_input(kind: str, d: pathlib.Path, a: SavedArray) -> Any:
  """The tensorstore spec `kind` (`CHECKPOINT_SPECS`) for the array directory `d`."""
  import tensorstore as ts
  good = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(d)}}
  kv = good["kvstore"]
  metadata = {"shape": list(a.shape), "chunks": [1] * len(a.shape), "dtype": "<f4",
              "compressor": {"id": "gzip"}}
  if kind == "missing":
    return dict(good, kvstore=dict(kv, path=str(d) + "_missing"))
  if kind == "path_is_a_file":
    (d.parent / "a_file").write_bytes(b"x")
    return dict(good, kvstore=dict(kv, path=str(d.parent / "a_file")))
  if kind == "path_under_a_file":
    (d.parent / "a_file").write_bytes(b"x")
    return dict(good, kvstore=dict(kv, path=str(d.parent / "a_file" / "w")))
  return {
      "good": good,
      "relative": dict(good, kvstore=dict(kv, path=os.path.relpath(d))),
      "url": dict(good, kvstore=f"file://{d}"),
      "trailing_slash": dict(good, kvstore=dict(kv, path=f"{d}/")),
      "spec_level_path": dict(good, kvstore=dict(kv, path=str(d.parent)), path=d.name),
      "cast": {"driver": "cast", "dtype": a.dtype, "base": good},
      "ts_spec": ts.Spec(good),
      "memory": dict(good, kvstore={"driver": "memory", "path": f"{d}/"}),
      "ocdbt": dict(good, kvstore={"driver": "ocdbt", "base": f"file://{d.parent}/ocdbt/"},
                    path=d.name),
      "zarr3": dict(good, driver="zarr3"),
      "empty_path": dict(good, kvstore=dict(kv, path="")),
      "nul_in_path": dict(good, kvstore=dict(kv, path=f"{d}\0x")),
      "no_kvstore": {"driver": "zarr"},
      "no_driver": {"kvstore": kv},
      "unknown_driver": dict(good, driver="zarr9"),
      "kvstore_int": dict(good, kvstore=5),
      "kvstore_unknown_driver": dict(good, kvstore=dict(kv, driver="nope")),
      "extra_member": dict(good, bogus=1),
      "metadata_wrong_shape": dict(good, metadata=dict(metadata, shape=[n + 1 for n in a.shape])),
      "metadata_zero_chunks": dict(good, metadata=dict(metadata, chunks=[0] * len(a.shape))),
      "metadata_bad_chunks": dict(good, metadata=dict(metadata, chunks=[1] * (len(a.shape) + 1))),
      "metadata_bad_dtype": dict(good, metadata=dict(metadata, dtype="<x9")),
      "metadata_bad_compressor": dict(good, metadata=dict(metadata, compressor={"id": "nope"})),
      "metadata_junk": dict(good, metadata=5),
      "base_dtype_mismatch": dict(good, dtype="int8"),
      "zarr3_bad_codecs": dict(good, driver="zarr3", metadata={"codecs": [{"name": "nope"}]}),
      "n5": dict(good, driver="n5"),
      "cast_bad_dtype": {"driver": "cast", "dtype": "nope", "base": good},
      "str": str(d),
      "none": None,
      "list": [str(d)],
  }[kind]


def _target_input(c: CheckpointCall) -> tuple[str, Any, Any]:
  """(the form, what goes first, the mesh axes) of a restore of `c`."""
  import jax
  from jax.sharding import NamedSharding, SingleDeviceSharding
  from jax.sharding import PartitionSpec as P
  mesh = c.array.mesh.build()
  axes = P(*c.array.spec) if c.mesh_axes == "saved" else _plain(c.mesh_axes)
  t = c.target
  if t == "mesh":
    return "mesh", mesh, axes
  if t == "named":
    try:
      return "sharding", NamedSharding(mesh, axes), None
    except Exception as e:  # a bad spec cannot make a NamedSharding: the mesh form says why
      del e
      return "mesh", mesh, axes
  if t == "single_device":
    return "sharding", SingleDeviceSharding(jax.devices()[c.array.mesh.device_ids[0]]), None
  if t == ("devices",):
    return "sharding", list(mesh.devices.flat), None
  if t == "mesh_of_one":
    return "mesh", MeshSpec((1,), ("x",), (c.array.mesh.device_ids[0],)).build(), axes
  return "sharding", t, None


def _attempt(fn) -> tuple[Any, BaseException | None]:
  try:
    return fn(), None
  except Exception as e:  # judged by the caller
    return None, e


def _bare(e: BaseException) -> bool:
  """Whether `e` is a tensorstore or XLA error as they raise it (a status, the
  spec appended, a parse error), with nothing of the caller's words."""
  import jax
  text = str(e)
  return (isinstance(e, jax.errors.JaxRuntimeError) or text.startswith(_STATUS_CODES)
          or "[tensorstore_spec=" in text or text.startswith(("Error parsing", "Error opening")))


def _unclear(e: BaseException) -> str | None:
  """Why `e` is not a clear error naming the argument (None when it is): a
  ValueError / TypeError, not tensorstore's or XLA's own, naming an argument
  or the function in backticks."""
  if not isinstance(e, ValueError | TypeError):
    return f"{type(e).__name__}, not a ValueError / TypeError"
  if _bare(e):
    return "a bare tensorstore / XLA error"
  if not re.search(r"`[\w.]+", str(e)):
    return "it names no argument"
  return None


def _resized(host: Any, shape: Any, dtype: Any):
  """`host` zero-padded or truncated to `shape`, cast to `dtype` (a restore's
  `global_shape` and `dtype`)."""
  import jax.numpy as jnp
  import numpy as np
  if shape is not None:
    out = np.zeros(shape, host.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(shape, host.shape, strict=True))
    out[common] = host[common]
    host = out
  return host if dtype is None else host.astype(jnp.dtype(dtype))


def check_checkpoint_call(c: CheckpointCall) -> str:
  """The call succeeds with the right values (a save restores exactly; a
  restore gives the saved values, padded, truncated or cast as asked), or
  raises a clear ValueError / TypeError naming the argument, or raises
  exactly what stock `array_serialization` raises for the same input on a
  `jax.Array` (not a bare tensorstore or XLA error). Returns how it ended."""
  import numpy as np
  from jax.experimental.array_serialization import serialization as stock
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import serialization
  with tempfile.TemporaryDirectory(prefix="jse-fuzz-") as tmp, _kept_cwd():
    root = pathlib.Path(tmp)
    os.chdir(root)
    host = _host_values(c.array, "random", 0)
    gda = _gda(c.array, host)
    arr = gda.to_jax_array()
    mine, theirs = root / "mine" / "w", root / "stock" / "w"
    for d in (mine, theirs):
      d.parent.mkdir()
    shape = (None if c.global_shape is None else c.array.shape if c.global_shape == "saved"
             else _plain(c.global_shape))
    dtype = _plain(c.dtype)
    if c.fn in CHECKPOINT_SAVE_CALLS:
      spec, stock_spec = _spec_input(c.spec, mine, c.array), _spec_input(c.spec, theirs, c.array)
      metadata = _plain(c.metadata)
      if c.fn == "async_serialize":
        call = lambda: asyncio.run(serialization.async_serialize(gda, spec, metadata=metadata))
      elif c.fn == "run_serialization":
        call = lambda: serialization.run_serialization([gda], [spec], metadata=metadata)
      else:
        def call():
          manager = serialization.GlobalAsyncCheckpointManager()
          manager.serialize([gda], [spec], on_commit_callback=lambda: None, metadata=metadata)
          manager.wait_until_finished()
      _, err = _attempt(call)
      _, stock_err = _attempt(lambda: asyncio.run(_stock_save(arr, copy.deepcopy(stock_spec))))
      if err is None:
        back, back_err = _attempt(lambda: np.asarray(serialization.run_deserialization(
            [NamedSharding(c.array.mesh.build(), P())], [_readable(spec)])[0]))
        if back_err is not None or not _same(back, host):
          raise AssertionError(f"saved, but does not restore exactly: {back_err or 'values'}")
        return "saved"
    else:
      written = _spec_input("good", mine, c.array)
      serialization.run_serialization([gda], [written])
      shutil.copytree(mine, theirs)
      spec, stock_spec = _spec_input(c.spec, mine, c.array), _spec_input(c.spec, theirs, c.array)
      if c.fn in CHECKPOINT_ORBAX_CALLS:  # a path: orbax's own
        got, err = _attempt(lambda: np.asarray(_orbax_restore(c, mine, shape, dtype)))
        stock_got, stock_err = _attempt(lambda: np.asarray(_orbax_restore(
            c, theirs, shape, dtype, stock_orbax=True)))
      else:
        got, err = _attempt(lambda: np.asarray(_restore_call(c, spec, shape, dtype)))
        stock_got, stock_err = _attempt(lambda: np.asarray(_stock_restore(c, stock_spec, shape,
                                                                          dtype, stock)))
      if err is None:
        want = stock_got if stock_err is None else _resized(host, shape, dtype)
        if not _same(got, want):
          whose = "stock's" if stock_err is None else "the saved ones"
          raise AssertionError(f"restored other values than {whose}: {_differences(got, want)}")
        return "restored"
    why = _unclear(err)
    if why is None:
      return f"refused: {type(err).__name__}"
    if stock_err is not None and type(stock_err) is type(err) and not _bare(err) \
        and str(stock_err).replace(str(theirs), str(mine)) == str(err):
      return f"refused as stock: {type(err).__name__}"
    raise AssertionError(f"raised {type(err).__name__}: {str(err)[:400]} ({why}); stock "
                         + (f"raised {type(stock_err).__name__}: {str(stock_err)[:300]}"
                            if stock_err is not None else "succeeded"))


async def _stock_save(arr, spec):
  from jax.experimental.array_serialization import tensorstore_impl
  await tensorstore_impl.async_serialize(arr, spec)


def _readable(spec: Any) -> Any:
  """A spec to read back what a save through `spec` wrote (its metadata dropped)."""
  if isinstance(spec, dict):
    spec = {k: v for k, v in spec.items() if k != "metadata"}
    if isinstance(spec.get("base"), dict):
      spec["base"] = _readable(spec["base"])
  return spec


def _restore_call(c: CheckpointCall, spec: Any, shape: Any, dtype: Any):
  from jax_sharding_ext import serialization
  form, first, axes = _target_input(c)
  mesh_form = form == "mesh"
  if c.fn == "async_deserialize":
    args = (first, axes, spec) if mesh_form else (first, spec)
    return asyncio.run(serialization.async_deserialize(*args, global_shape=shape, dtype=dtype))
  args = ([first], [axes], [spec]) if mesh_form else ([first], [spec])
  if c.fn == "run_deserialization":
    return serialization.run_deserialization(*args, global_shapes=[shape], dtypes=[dtype])[0]
  return serialization.GlobalAsyncCheckpointManager().deserialize(
      *args, global_shapes=[shape], dtypes=[dtype])[0]


def _stock_restore(c: CheckpointCall, spec: Any, shape: Any, dtype: Any, stock: Any):
  from jax.sharding import NamedSharding
  form, first, axes = _target_input(c)
  sharding = NamedSharding(first, axes) if form == "mesh" else first

  async def go():
    try:
      return await stock.async_deserialize(sharding, spec, shape, dtype)
    finally:  # stock's other reads of a failed restore, as `run_deserialization` waits
      await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}),
                           return_exceptions=True)
  return asyncio.run(go())


def _orbax_restore(c: CheckpointCall, where: pathlib.Path, shape: Any, dtype: Any,
                   stock_orbax: bool = False):
  """Save `c.array` with orbax, then restore it with the call's restore args
  (`gda_restore_args`, or `ArrayRestoreArgs(restore_type=GlobalDeviceArray,
  ...)`; with `stock_orbax`, `ArrayRestoreArgs(sharding=...)`)."""
  import jax
  import orbax.checkpoint as ocp
  from jax.sharding import NamedSharding

  from jax_sharding_ext import GlobalDeviceArray, orbax_support
  path = f"{where}_orbax"
  host = _host_values(c.array, "random", 0)
  if not os.path.exists(path):
    ocp.PyTreeCheckpointer().save(path, {"w": _gda(c.array, host)})
  form, first, axes = _target_input(c)
  kw = {"global_shape": shape, "dtype": dtype}
  if stock_orbax:
    sharding = NamedSharding(first, axes) if form == "mesh" else first
    args = ocp.ArrayRestoreArgs(restore_type=jax.Array, sharding=sharding, **kw)
  elif c.fn == "gda_restore_args":
    args = orbax_support.gda_restore_args(first, axes, **kw)
  else:
    args = ocp.ArrayRestoreArgs(restore_type=GlobalDeviceArray, mesh=first, mesh_axes=axes, **kw)
  out = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
      restore_args={"w": args}))
  return out["w"]


# ---------------------------------------------------------------------------
# The properties.
# ---------------------------------------------------------------------------


@given(damaged_checkpoints(kinds=CHECKPOINT_FILE_DAMAGE + ("edit",)))
@budget(35)
def test_a_damaged_checkpoint_restores_exactly_or_raises(example):
  isolated("test_fuzz_checkpoints:check_damaged_checkpoint", example)


@given(edited_checkpoints())
@budget(5)
def test_every_single_field_edit_of_a_checkpoint_restores_exactly_or_raises(example):
  isolated("test_fuzz_checkpoints:check_every_edit", example)


@given(damaged_checkpoints(places=("relative", "latest"), kinds=CHECKPOINT_FILE_DAMAGE + ("edit",)))
@budget(15)
def test_a_checkpoint_saved_through_moved_paths_restores_exactly_or_raises(example):
  isolated("test_fuzz_checkpoints:check_damaged_checkpoint", example)


@given(cut_checkpoint_copies())
@budget(8)
def test_a_copy_cut_short_restores_exactly_or_raises(example):
  isolated("test_fuzz_checkpoints:check_cut_copy", example)


@given(checkpoint_calls())
@budget(30)
def test_bad_checkpoint_arguments_get_a_clear_error_or_stocks_behaviour(example):
  isolated("test_fuzz_checkpoints:check_checkpoint_call", example)


# Random examples reach a zarr3 array's codec chain rarely within `make
# test`'s budget; these edit every field of it for a layout where a codec's
# configuration decides the values (the byte order, a transpose of square
# chunks), stored without compression and with a big-endian blosc chain.
_ZARR3_LAYOUTS = [
    EditedCheckpoint(fmt, (SavedArray(MeshSpec((2,), ("x",), (0, 1)), ("x",), (4, 2),
                                      "float32"),), 1, "run", file=-1)
    for fmt in ("zarr3", "zarr3_big_blosc")]


@pytest.mark.parametrize("example", _ZARR3_LAYOUTS, ids=[e.format for e in _ZARR3_LAYOUTS])
def test_every_edit_of_a_zarr3_codec_chain_restores_exactly_or_raises(example):
  isolated("test_fuzz_checkpoints:check_every_edit", example)
