"""Chunk records: a checkpoint this package writes restores exactly or raises.

A zarr array is one file (kvstore key) per chunk. tensorstore reads a missing
chunk as the fill value (zeros), and its zstd chunks carry no checksum, so
without help a deleted chunk, or one flipped byte in a zstd chunk, restores
as silently wrong data (gzip chunks end with a CRC that tensorstore checks).

So every save of this package stores every chunk (also one equal to the fill
value: `store_data_equal_to_fill_value`) and, once this process's writes are
committed and before the checkpoint is, writes a record into the array's
directory, one key per process, `jax_sharding_ext.chunks.<process index>`:
a small JSON object with the array's shape, dtype and chunk shape, the
number of processes, and each chunk file this process wrote, with the crc32
of its stored bytes where the codec checks nothing itself (zstd, no
compression), or `null` where it does (gzip, zlib, bz2, zarr3 crc32c).
tensorstore and every other zarr reader ignore these keys.

A restore of an array that has records checks, for each chunk this process
reads: that a record names it, that it is stored, and that its bytes match
the recorded crc32 (read concurrently with the restore itself); and that the
array's shape, dtype and chunk shape are the recorded ones. A chunk whose
bytes were checked is not read again while its file is unchanged (same
inode, size, modification and change times, or the same kvstore
generation): tensorstore serves an unchanged chunk from its cache then too.
An array without records (written by stock `array_serialization`, by the
GDA-era module, which may leave out chunks equal to the fill value, or by
an earlier version of this package) restores as before, unchecked.

Records are written where markers are (`locations.SHARED_WRITE_DRIVERS`); a
chunk written by several processes (only with a chunking the spec gives
that cuts across processes' shards) is recorded without a crc32.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import json
import mmap
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import tensorstore as ts

from jax_sharding_ext._checkpoint import locations, markers
from jax_sharding_ext._checkpoint.metadata import TS_CONTEXT

try:  # the same CRC-32 as zlib's, about 6x as fast (ISA-L, in the [checkpoint] extra)
  from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the extra installs it
  from zlib import crc32

RECORD_PREFIX = "jax_sharding_ext.chunks."
"""Key prefix of the chunk records in an array's directory (then the process index)."""
_FORMAT = 1
_SELF_CHECKING_V2 = frozenset({"gzip", "zlib", "bz2"})  # zarr v2 compressors with a checksum
_SELF_CHECKING_V3 = frozenset({"gzip", "crc32c"})

Region = Sequence[tuple[int, int]]  # (start, stop) per dimension


@dataclasses.dataclass(frozen=True)
class Grid:
  """How a stored array is cut into chunk files."""

  shape: tuple[int, ...]
  chunk: tuple[int, ...]
  key: Callable[[tuple[int, ...]], str]
  checksummed: bool  # the codec checks nothing itself: the record holds a crc32

  def cells(self, regions: Sequence[Region]) -> list[tuple[int, ...]]:
    """The chunks (grid positions) that meet any of `regions`, in order."""
    out: set[tuple[int, ...]] = set()
    for region in regions:
      spans = [range(lo // c, -(-hi // c)) for (lo, hi), c in zip(region, self.chunk, strict=True)]
      out.update(itertools.product(*spans))
    return sorted(out)

  def inside(self, cell: tuple[int, ...], region: Region) -> bool:
    """Whether the chunk at `cell` lies inside `region` (within the array)."""
    return all(lo <= i * c and min((i + 1) * c, n) <= hi
               for i, c, n, (lo, hi) in zip(cell, self.chunk, self.shape, region, strict=True))


def _zarr_v2_key(sep: str) -> Callable[[tuple[int, ...]], str]:
  return lambda cell: sep.join(map(str, cell)) if cell else "0"


def _zarr3_key(encoding: dict) -> Callable[[tuple[int, ...]], str]:
  config = encoding.get("configuration") or {}
  if encoding.get("name") == "v2":
    return _zarr_v2_key(config.get("separator", "."))
  sep = config.get("separator", "/")
  return lambda cell: "c" + "".join(f"{sep}{i}" for i in cell)


def _zarr3_checksummed(codecs: Sequence[Any]) -> bool:
  for codec in codecs:
    name = codec.get("name") if isinstance(codec, dict) else codec
    config = codec.get("configuration") or {} if isinstance(codec, dict) else {}
    if name in _SELF_CHECKING_V3 or (name == "zstd" and config.get("checksum")):
      return False
  return True


def grid_of(t: ts.TensorStore) -> Grid | None:
  """The chunk grid of the stored array `t` (a 'cast' is seen through), or
  None for a driver other than zarr and zarr3."""
  while getattr(t, "base", None) is not None:
    t = t.base
  spec = t.spec().to_json()
  metadata, shape = spec.get("metadata") or {}, tuple(t.shape)
  if spec.get("driver") == "zarr" and "chunks" in metadata:
    compressor = (metadata.get("compressor") or {}).get("id")
    return Grid(shape, tuple(metadata["chunks"]),
                _zarr_v2_key(metadata.get("dimension_separator", ".")),
                compressor not in _SELF_CHECKING_V2)
  grid = metadata.get("chunk_grid") or {}
  if spec.get("driver") == "zarr3" and grid.get("name") == "regular":
    return Grid(shape, tuple(grid["configuration"]["chunk_shape"]),
                _zarr3_key(metadata.get("chunk_key_encoding") or {"name": "default"}),
                _zarr3_checksummed(metadata.get("codecs") or ()))
  return None


def _dtype_of(t: ts.TensorStore) -> str:
  while getattr(t, "base", None) is not None:
    t = t.base
  return t.dtype.name


def region_of(index: Sequence[slice], shape: Sequence[int]) -> list[tuple[int, int]]:
  """The (start, stop) per dimension of a shard index of an array of `shape`."""
  return [s.indices(n)[:2] for s, n in zip(index, shape, strict=True)]


# -- reading and checking chunk files ---------------------------------------------------

# (location key, chunk key) -> (file state or kvstore generation, crc32): chunks
# whose stored bytes were checked (or written here) in that state.
_checked: dict[tuple[str, str], tuple[Any, int]] = {}
_CHECKED_LIMIT = 1 << 16


def _remember(loc: locations.Location, key: str, state: Any, crc: int) -> None:
  if len(_checked) >= _CHECKED_LIMIT:
    _checked.clear()
  _checked[loc.key, key] = (state, crc)


def _file_state(st: os.stat_result) -> tuple:
  return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_INLINE_BYTES = 256 << 10
# Map the file with its pages read in at once (Linux): with a fast crc32 the
# copy a read() makes would cost more than the crc itself.
_MAP = ({"flags": mmap.MAP_SHARED | mmap.MAP_POPULATE, "prot": mmap.PROT_READ}
        if hasattr(mmap, "MAP_POPULATE") else {"access": mmap.ACCESS_READ})


def _crc_of_file(path: str) -> tuple[tuple, int]:
  """(the file's state, the crc32 of its bytes), read without a copy."""
  with open(path, "rb") as f:
    state = _file_state(os.fstat(f.fileno()))
    if state[1] == 0:
      return state, crc32(b"")
    with mmap.mmap(f.fileno(), 0, **_MAP) as m:
      return state, crc32(m)


_pool: concurrent.futures.ThreadPoolExecutor | None = None


async def _in_thread(fn: Callable, *args: Any) -> Any:
  """`fn(*args)` on a worker thread (the crc32 and file reads release the GIL).
  One pool for the process: each save or restore runs its own event loop,
  and a loop's default pool is started and stopped with it."""
  global _pool
  if _pool is None:
    _pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=min(8, os.cpu_count() or 2), thread_name_prefix="jax_sharding_ext.crc32")
  return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)


class _Directory:
  """An array's directory: a local one by plain file operations, another
  kvstore through tensorstore (opened once, when first needed)."""

  def __init__(self, loc: locations.Location):
    self.loc = loc
    self._store = None

  async def store(self) -> ts.KvStore:
    if self._store is None:
      self._store = await ts.KvStore.open(self.loc.kvstore, context=TS_CONTEXT)
    return self._store

  async def get(self, key: str) -> bytes | None:
    if self.loc.local_dir is not None:
      try:
        with open(os.path.join(self.loc.local_dir, key), "rb") as f:
          return f.read()
      except FileNotFoundError:
        return None
    r = await (await self.store()).read(key)
    return r.value if r.state == "value" else None

  async def put(self, key: str, value: bytes) -> None:
    if self.loc.local_dir is not None:
      markers.write_local(os.path.join(self.loc.local_dir, key), value)
    else:
      await (await self.store()).write(key, value)

  async def delete(self, key: str) -> None:
    if self.loc.local_dir is not None:
      try:
        os.remove(os.path.join(self.loc.local_dir, key))
      except FileNotFoundError:
        pass
    else:
      await (await self.store()).delete_range(ts.KvStore.KeyRange(key, key + "\0"))

  async def any_with_prefix(self, prefix: str) -> bool:
    if self.loc.local_dir is not None:
      try:
        return any(n.startswith(prefix) for n in os.listdir(self.loc.local_dir))
      except FileNotFoundError:
        return False
    found = await (await self.store()).list(ts.KvStore.KeyRange(prefix, prefix + "\x7f"))
    return bool(found)

  async def crc(self, key: str, known: int | None = None) -> int | None:
    """The crc32 of chunk `key`'s stored bytes (None if it is missing). With
    `known`, a chunk checked before and unchanged since is not read again."""
    if self.loc.local_dir is not None:
      path = os.path.join(self.loc.local_dir, key)
      try:
        st = os.stat(path)
        if known is not None and _checked.get((self.loc.key, key)) == (_file_state(st), known):
          return known
        # A small file costs less here than the trip to a worker thread.
        small = st.st_size <= _INLINE_BYTES
        state, crc = _crc_of_file(path) if small else await _in_thread(_crc_of_file, path)
      except FileNotFoundError:
        return None
    else:
      store = await self.store()
      seen = _checked.get((self.loc.key, key))
      if known is not None and seen is not None and seen[1] == known:
        r = await store.read(key, if_not_equal=seen[0])
        if r.state == "unspecified":
          return known
      else:
        r = await store.read(key)
      if r.state != "value":
        return None
      value = r.value
      crc = crc32(value) if len(value) <= _INLINE_BYTES else await _in_thread(crc32, value)
      state = r.stamp.generation
    _remember(self.loc, key, state, crc)
    return crc

  async def exists(self, key: str) -> bool:
    if self.loc.local_dir is not None:
      return os.path.lexists(os.path.join(self.loc.local_dir, key))
    r = await (await self.store()).read(key, byte_range=slice(0, 0))
    return r.state == "value"


def _directory(spec: Any) -> _Directory | None:
  loc = locations.locate(spec)
  return _Directory(loc) if loc is not None and loc.shared_writes else None


# -- writing the records ---------------------------------------------------------------


def written_regions(arr: jax.Array) -> list[list[tuple[int, int]]]:
  """The regions of `arr` this process writes (its shards of replica 0, as
  stock writes them). Taken when the save starts: the array may be donated
  before its writes are committed."""
  return [region_of(s.index, arr.shape) for s in arr.addressable_shards if s.replica_id == 0]


async def write_records(regions: Sequence[Sequence[Region]], specs: Sequence[Any]) -> None:
  """Record the chunks this process wrote of each array (`regions`, from
  `written_regions`; the writes are committed), for the restore to check."""
  await asyncio.gather(*(_write_record(r, s) for r, s in zip(regions, specs, strict=True)))


async def _write_record(regions: Sequence[Region], spec: Any) -> None:
  directory = _directory(spec)
  if directory is None:
    return
  t = await ts.open(ts.Spec(spec), open=True, context=TS_CONTEXT)
  grid = grid_of(t)
  if grid is None:
    return
  alone = jax.process_count() == 1
  cells = grid.cells(regions)
  keys = [grid.key(c) for c in cells]
  summed = [grid.checksummed and (alone or any(grid.inside(c, r) for r in regions))
            for c in cells]
  crcs = await asyncio.gather(*(directory.crc(k) if s else _none() for k, s in zip(keys, summed,
                                                                                    strict=True)))
  for key, crc, s in zip(keys, crcs, summed, strict=True):
    if s and crc is None:
      raise RuntimeError(f"The chunk '{key}' just written to '{directory.loc.text}' is not "
                         "there; the checkpoint was not committed.")
  record = {"format": _FORMAT, "written_by": "jax_sharding_ext",
            "process": jax.process_index(), "processes": jax.process_count(),
            "shape": list(grid.shape), "dtype": _dtype_of(t), "chunk_shape": list(grid.chunk),
            "checksum": "crc32" if grid.checksummed else None,
            "chunks": dict(zip(keys, crcs, strict=True))}
  await directory.put(RECORD_PREFIX + str(jax.process_index()),
                      json.dumps(record, separators=(",", ":")).encode())


async def forget_records(specs: Sequence[Any]) -> None:
  """Remove this process's records of `specs`' arrays before they are written
  again (a record of the old chunks would not match the new ones)."""
  async def one(spec):
    directory = _directory(spec)
    if directory is not None:
      await directory.delete(RECORD_PREFIX + str(jax.process_index()))
  await asyncio.gather(*map(one, specs))


async def _none() -> None:
  return None


# -- checking a restore ----------------------------------------------------------------


def _damaged(at: str, loc: locations.Location, what: str) -> ValueError:
  return ValueError(
      f"{at}: the checkpoint at '{loc.text}' is damaged: {what}. jax_sharding_ext stores "
      "every chunk of a checkpoint and records them when it writes it, so data was lost "
      "or changed since; restore an earlier checkpoint.")


async def _records(directory: _Directory, at: str) -> dict | None:
  """The records of the array (merged), or None when it has none."""
  first = await directory.get(RECORD_PREFIX + "0")
  if first is None:
    if await directory.any_with_prefix(RECORD_PREFIX):
      raise _damaged(at, directory.loc, f"its chunk record '{RECORD_PREFIX}0' is missing")
    return None
  records = [first]
  try:
    n = _parsed(first)["processes"]
    records += await asyncio.gather(*(directory.get(RECORD_PREFIX + str(i))
                                      for i in range(1, n)))
    parsed = [_parsed(r) for r in records if r is not None]
  except (ValueError, KeyError, TypeError) as e:
    raise _damaged(at, directory.loc, f"a chunk record cannot be read ({e!r})") from None
  if len(parsed) != n:
    missing = [RECORD_PREFIX + str(i) for i, r in enumerate(records) if r is None]
    raise _damaged(at, directory.loc, f"its chunk records {missing} are missing")
  if any(p[f] != parsed[0][f] for p in parsed for f in _SAME_IN_EVERY_RECORD):
    raise _damaged(at, directory.loc, "its chunk records do not belong to one save")
  merged = dict(parsed[0], chunks={})
  for p in parsed:
    for key, crc in p["chunks"].items():
      if merged["chunks"].get(key) is None:
        merged["chunks"][key] = crc
  return merged


_SAME_IN_EVERY_RECORD = ("format", "processes", "shape", "dtype", "chunk_shape")


def _parsed(record: bytes) -> dict:
  """A record as written by `_write_record`, or a ValueError / KeyError / TypeError."""
  out = json.loads(record)
  if out["format"] != _FORMAT:
    raise ValueError(f"format {out['format']!r} is not {_FORMAT} (a newer jax_sharding_ext "
                     "may read it)")
  if not (isinstance(out["processes"], int) and out["processes"] > 0
          and isinstance(out["chunks"], dict)
          and all(c is None or isinstance(c, int) for c in out["chunks"].values())):
    raise ValueError("unexpected contents")
  missing = [f for f in _SAME_IN_EVERY_RECORD if f not in out]
  if missing:
    raise KeyError(missing[0])
  return out


async def check_read(spec: Any, t: ts.TensorStore, sharding: jax.sharding.Sharding,
                     shape: Sequence[int], at: str) -> None:
  """Raise if the chunks this process reads of the array at `spec` (opened as
  `t`, read onto `sharding` with global shape `shape`) differ from what was
  recorded when it was written. Does nothing for an array without records."""
  directory = _directory(spec)
  if directory is None:
    return
  record = await _records(directory, at)
  if record is None:
    return
  grid = grid_of(t)
  stored = (list(grid.shape), _dtype_of(t), list(grid.chunk)) if grid else None
  if stored != (record["shape"], record["dtype"], record["chunk_shape"]):
    raise _damaged(at, directory.loc, f"its metadata (shape, dtype, chunk shape {stored}) "
                   "differs from the recorded "
                   f"{(record['shape'], record['dtype'], record['chunk_shape'])}")
  regions = []
  for index in sharding.addressable_devices_indices_map(tuple(shape)).values():
    region = [(max(0, lo), min(hi, n))
              for (lo, hi), n in zip(region_of(index, shape), grid.shape, strict=True)]
    if all(lo < hi for lo, hi in region) or not region:
      regions.append(region)
  chunks = record["chunks"]

  async def one(key: str) -> None:
    if key not in chunks:
      raise _damaged(at, directory.loc, f"no chunk record names its chunk '{key}'")
    want = chunks[key]
    if want is None:
      if not await directory.exists(key):
        raise _damaged(at, directory.loc, f"its chunk '{key}' is missing")
      return
    got = await directory.crc(key, want)
    if got is None:
      raise _damaged(at, directory.loc, f"its chunk '{key}' is missing")
    if got != want:
      raise _damaged(at, directory.loc, f"its chunk '{key}' has crc32 {got:08x}, but "
                     f"{want:08x} was recorded when it was written")
  await asyncio.gather(*(one(grid.key(c)) for c in grid.cells(regions)))

