"""Chunk records: a checkpoint this package writes restores exactly or raises.

A zarr array is one file (kvstore key) per chunk. tensorstore reads a missing
chunk as the fill value (zeros); a gzip chunk's own CRC catches a changed
byte but not a whole chunk replaced by another valid one (an older step's,
another array's), and a zstd chunk carries no checksum at all. Without help
each of these restores as silently wrong data.

So every save of this package stores every chunk (also one equal to the fill
value: `store_data_equal_to_fill_value`) and, once this process's writes are
committed and before the checkpoint is, writes a record into the array's
directory, one key per process, `jax_sharding_ext.chunks.<process index>`:
a small JSON object with the array's shape, dtype, chunk shape and layout
(how a chunk's bytes become values: zarr's `order` and byte order under
`layout`; for zarr3, under `codecs`, its codecs up to the one that makes
bytes of the array, with their configuration (`transpose` orders, the
`bytes` codec's endian, a sharding codec's inner chunks and codecs), then
the names of the codecs after it), the number of processes, and a
fingerprint of each chunk file this process wrote (`checksum` names its
kind):

* "tail<n>": where the codec ends each chunk with a checksum of the chunk's
  contents (gzip: CRC-32 and length, 8 bytes; zlib: Adler-32, 4; zarr3
  crc32c, or zstd with its checksum, 4), those last n bytes. tensorstore
  checks them against the contents on every read, so equal tails mean equal
  data, and only n bytes of each chunk are read to check it;
* "crc32": elsewhere (zstd without its checksum, no compression, bz2,
  zarr3 sharding), the crc32 of the chunk file's bytes.

Before its first chunk, a save also puts its mark, `.jax_sharding_ext`, into
the directory, and leaves it there. The mark's name sorts before every chunk
key and the metadata (zarr's '.zarray', zarr3's 'zarr.json' and 'c/...'), so
a copy made in name order (rsync, object-store tools) that holds any of them
holds the mark too; the records sort after the chunks and may be missing
from such a copy cut short. A directory with the mark and without records
was written by this package and is damaged (a copy cut short, a record lost,
a save that did not finish), not another writer's checkpoint.

tensorstore and every other zarr reader ignore these keys.

A restore of an array that has records checks, for each chunk this process
reads: that a record names it, that it is stored, and that its fingerprint
is the recorded one (read concurrently with the restore itself); and that
the array's shape, dtype, chunk shape and layout are the recorded ones. A
chunk checked before is not read again while its file is unchanged (same
inode, size, modification and change times, or the same kvstore
generation): tensorstore serves an unchanged chunk from its cache then too.
An array without records and without the mark (written by stock
`array_serialization`, by the GDA-era module, which may leave out chunks
equal to the fill value, or by jax_sharding_ext 0.1.0 and its records since
lost) restores as before, unchecked. A zarr3 record of jax_sharding_ext
0.1.0 has no `codecs`: its layout is not checked (and 0.1.0, which ignores
`codecs`, still reads the records written now).

Records are written where markers are (`locations.SHARED_WRITE_DRIVERS`); a
chunk written by several processes (only with a chunking the spec gives
that cuts across processes' shards) is recorded without a fingerprint (its
presence is checked).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import tensorstore as ts

from jax_sharding_ext._checkpoint import locations
from jax_sharding_ext._checkpoint.chunkfiles import (
  CHECKED_LIMIT,
  CRC32,
  Directory,
  checked,
  directory_of,
  file_state,
)
from jax_sharding_ext._checkpoint.metadata import TS_CONTEXT

RECORD_PREFIX = "jax_sharding_ext.chunks."
"""Key prefix of the chunk records in an array's directory (then the process index)."""
OWN_MARK = ".jax_sharding_ext"
"""Key of the mark of an array this package writes: put before its first
chunk and kept, sorting before every chunk key and the metadata, so that a
copy in name order cut short is known for a damaged checkpoint of this
package, not another writer's."""
_MARK_TEXT = json.dumps({"written_by": "jax_sharding_ext",
                         "records": RECORD_PREFIX + "<process index>"}).encode()
_RECORDED_DRIVERS = frozenset({"zarr", "zarr3"})
_FORMAT = 1
# Codecs that end each chunk with a checksum of its contents: its length in bytes.
_TAIL_V2 = {"gzip": 8, "zlib": 4}
_TAIL_V3 = {"gzip": 8, "crc32c": 4}

Region = Sequence[tuple[int, int]]  # (start, stop) per dimension


@dataclasses.dataclass(frozen=True)
class Grid:
  """How a stored array is cut into chunk files."""

  shape: tuple[int, ...]
  chunk: tuple[int, ...]
  key: Callable[[tuple[int, ...]], str]
  check: str  # the kind of fingerprint recorded per chunk: CRC32 or "tail<n>"
  layout: dict  # how values are laid out in a chunk (zarr v2 `order`, byte order)
  codecs: list | None = None  # zarr3: the codecs that lay values out (`_zarr3_codecs`)

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


def _zarr3_check(codecs: Sequence[Any]) -> str:
  """The fingerprint of a zarr3 chunk: the checksum the last codec appends, if any."""
  if not codecs:
    return CRC32
  names = [c.get("name") if isinstance(c, dict) else c for c in codecs]
  last = codecs[-1]
  config = (last.get("configuration") or {}) if isinstance(last, dict) else {}
  if "sharding_indexed" in names:  # a file holds many chunks and an index
    return CRC32
  if names[-1] in _TAIL_V3:
    return f"tail{_TAIL_V3[names[-1]]}"
  if names[-1] == "zstd" and config.get("checksum"):
    return "tail4"
  return CRC32


def grid_of(t: ts.TensorStore) -> tuple[Grid | None, str]:
  """The chunk grid of the stored array `t` (a 'cast' is seen through; None
  for a driver other than zarr and zarr3) and its dtype name."""
  while getattr(t, "base", None) is not None:
    t = cast(ts.TensorStore, t.base)
  spec = t.spec().to_json()
  return _grid(spec.get("driver"), spec.get("metadata") or {}, tuple(t.shape)), t.dtype.name


def _grid(driver: Any, metadata: dict, shape: tuple[int, ...]) -> Grid | None:
  if driver == "zarr" and "chunks" in metadata:
    compressor = (metadata.get("compressor") or {}).get("id")
    tail = _TAIL_V2.get(str(compressor))
    return Grid(shape, tuple(int(c) for c in metadata["chunks"]),
                _zarr_v2_key(metadata.get("dimension_separator", ".")),
                f"tail{tail}" if tail else CRC32,
                {"order": metadata.get("order", "C"), "byte_order": _byte_order(metadata)})
  grid = metadata.get("chunk_grid") or {}
  if driver == "zarr3" and grid.get("name") == "regular":
    codecs = metadata.get("codecs") or ()
    return Grid(shape, tuple(grid["configuration"]["chunk_shape"]),
                _zarr3_key(metadata.get("chunk_key_encoding") or {"name": "default"}),
                _zarr3_check(codecs), {}, _zarr3_codecs(codecs))
  return None


# zarr3 codecs that turn an array into bytes; codecs before one act on the
# array (transpose), codecs after it on bytes (compression, checksums).
_ARRAY_TO_BYTES = frozenset({"bytes", "sharding_indexed"})


def _zarr3_codecs(codecs: Sequence[Any]) -> list[dict]:
  """How a zarr3 chunk's bytes become values (tensorstore's normalized
  codecs): every codec up to the one that makes bytes of the array, with its
  configuration (a `transpose` order, the `bytes` codec's endian, a sharding
  codec's inner chunk shape and codecs), then the names of the byte codecs
  after it (a compression level changes no value)."""
  out: list[dict] = []
  on_bytes = False
  for codec in codecs:
    name, config = ((codec.get("name"), codec.get("configuration") or {})
                    if isinstance(codec, dict) else (codec, {}))
    out.append({"name": name} if on_bytes else {"name": name, "configuration": config})
    on_bytes = on_bytes or name in _ARRAY_TO_BYTES
  return out


def _byte_order(metadata: dict) -> str:
  """The byte order of a zarr v2 array's values ('<' unless its dtype says '>')."""
  dtype = metadata.get("dtype")
  return ">" if isinstance(dtype, str) and dtype.startswith(">") else "<"


def grid_of_new(spec: Any) -> tuple[Grid | None, str] | None:
  """What `grid_of` would give for the array just created from `spec` at a
  path where nothing was stored (its metadata is the spec's, with
  tensorstore's defaults), without opening it; None where the spec leaves
  something to what is stored."""
  base = locations.stored(spec)
  if not isinstance(base, dict) or "key_encoding" in base or base.get("driver") == "zarr3":
    return None  # (zarr3: the layout is tensorstore's normalized codecs, read back)
  metadata, parsed = base.get("metadata") or {}, locations.parsed(base)
  if parsed is None or parsed.dtype is None or "shape" not in metadata:
    return None
  grid = _grid(base.get("driver"), metadata, tuple(int(n) for n in metadata["shape"]))
  return (grid, parsed.dtype.name) if grid is not None else None


def region_of(index: Any, shape: Sequence[int]) -> list[tuple[int, int]]:
  """The (start, stop) per dimension of a shard index of an array of `shape`."""
  return [s.indices(n)[:2] for s, n in zip(index, shape, strict=True)]


# -- writing the records ---------------------------------------------------------------


def written_regions(arr: jax.Array) -> list[list[tuple[int, int]]]:
  """The regions of `arr` this process writes (its shards of replica 0, as
  stock writes them). Taken when the save starts: the array may be donated
  before its writes are committed."""
  if arr.is_fully_addressable:  # every distinct shard is this process's (no Shard objects)
    indices = arr.sharding.addressable_devices_indices_map(arr.shape).values()
    return [list(r) for r in dict.fromkeys(tuple(region_of(i, arr.shape)) for i in indices)]
  return [region_of(s.index, arr.shape) for s in arr.addressable_shards if s.replica_id == 0]


async def write_records(regions: Sequence[Sequence[Region]], specs: Sequence[Any],
                        fresh: Sequence[bool] | None = None,
                        landed: dict | None = None) -> None:
  """Record the chunks this process wrote of each array (`regions`, from
  `written_regions`; the writes are committed), for the restore to check.
  `fresh[i]`: nothing was stored at `specs[i]` before this save. `landed`:
  the crc32 of chunk files taken as they landed (`Landing.finish()`)."""
  fresh = [False] * len(specs) if fresh is None else fresh
  await asyncio.gather(*(_write_record(r, s, f, landed or {})
                         for r, s, f in zip(regions, specs, fresh, strict=True)))


async def _write_record(regions: Sequence[Region], spec: Any, fresh: bool,
                        landed: dict) -> None:
  directory = directory_of(spec)
  if directory is None:
    return
  known = grid_of_new(spec) if fresh else None
  if known is None:  # open the array to see what is stored
    known = grid_of(await ts.open(ts.Spec(spec), open=True, context=TS_CONTEXT))
  grid, dtype = known
  if grid is None:
    return
  alone = jax.process_count() == 1
  cells = grid.cells(regions)
  keys = [grid.key(c) for c in cells]
  # A chunk this process alone wrote holds what it wrote: fingerprint it.
  own = [alone or any(grid.inside(c, r) for r in regions) for c in cells]
  local_dir = directory.loc.local_dir
  prints = await asyncio.gather(*(
      directory.fingerprint(k, grid.check, landed=landed.get((local_dir, k))) if o else _none()
      for k, o in zip(keys, own, strict=True)))
  for key, fp, o in zip(keys, prints, own, strict=True):
    if o and fp is None:
      raise RuntimeError(f"The chunk '{key}' just written to '{directory.loc.text}' is not "
                         "there; the checkpoint was not committed.")
  record = {"format": _FORMAT, "written_by": "jax_sharding_ext",
            "process": jax.process_index(), "processes": jax.process_count(),
            "shape": list(grid.shape), "dtype": dtype, "chunk_shape": list(grid.chunk),
            "layout": grid.layout, **({} if grid.codecs is None else {"codecs": grid.codecs}),
            "checksum": grid.check,
            "chunks": dict(zip(keys, prints, strict=True))}
  await directory.put(RECORD_PREFIX + str(jax.process_index()),
                      json.dumps(record, separators=(",", ":")).encode())


async def start_records(specs: Sequence[Any]) -> None:
  """Before the first chunk of `specs`' arrays is written: remove this
  process's records of them (a record of the old chunks would not match the
  new ones) and put the package's mark (`OWN_MARK`) into their
  directories."""
  async def one(spec):
    directory = directory_of(spec)
    if directory is None:
      return
    await directory.delete(RECORD_PREFIX + str(jax.process_index()))
    base = locations.stored(spec)
    if isinstance(base, dict) and base.get("driver") in _RECORDED_DRIVERS:
      await directory.put(OWN_MARK, _MARK_TEXT)
  await asyncio.gather(*map(one, specs))


async def _none() -> None:
  return None


# -- checking a restore ----------------------------------------------------------------


def _damaged(at: str, loc: locations.Location, what: str) -> ValueError:
  return ValueError(
      f"{at}: the checkpoint at '{loc.text}' is damaged: {what}. jax_sharding_ext stores "
      "every chunk of a checkpoint and records them when it writes it, so data was lost "
      "or changed since; restore an earlier checkpoint.")


# location key -> (file states of its records, the records merged): local
# records read before and unchanged since are not read again.
_records_seen: dict[str, tuple[tuple, dict]] = {}


def _local_states(loc: locations.Location, n: int) -> tuple | None:
  local_dir = cast(str, loc.local_dir)  # called for local directories only
  try:
    return tuple(file_state(os.stat(os.path.join(local_dir, RECORD_PREFIX + str(i))))
                 for i in range(n))
  except FileNotFoundError:
    return None


async def _records(directory: Directory, at: str) -> dict | None:
  """The records of the array (merged), or None when it has none."""
  loc = directory.loc
  seen = _records_seen.get(loc.key) if loc.local_dir is not None else None
  if seen is not None and _local_states(loc, len(seen[0])) == seen[0]:
    return seen[1]
  merged = await _read_records(directory, at)
  if merged is not None and loc.local_dir is not None:
    # Remembered with the files' states taken between two equal reads, so a
    # record changed at any point is read again next time.
    states = _local_states(loc, merged["processes"])
    if states is not None and await _read_records(directory, at) == merged:
      if len(_records_seen) >= CHECKED_LIMIT:
        _records_seen.clear()
      _records_seen[loc.key] = (states, merged)
  return merged


async def _read_records(directory: Directory, at: str) -> dict | None:
  first = await directory.get(RECORD_PREFIX + "0")
  if first is None:
    if await directory.exists(OWN_MARK):
      raise _damaged(at, directory.loc, f"its chunk record '{RECORD_PREFIX}0' is missing, "
                     f"though its '{OWN_MARK}' mark says jax_sharding_ext wrote it (a copy "
                     "cut short, a record lost, or a save that did not finish)")
    if await directory.any_with_prefix(RECORD_PREFIX):
      raise _damaged(at, directory.loc, f"its chunk record '{RECORD_PREFIX}0' is missing")
    return None
  records: list[bytes | None] = [first]
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
  if any(p.get(f) != parsed[0].get(f) for p in parsed
         for f in (*_SAME_IN_EVERY_RECORD, "codecs")):
    raise _damaged(at, directory.loc, "its chunk records do not belong to one save")
  merged = dict(parsed[0], chunks={})
  for p in parsed:
    for key, crc in p["chunks"].items():
      if merged["chunks"].get(key) is None:
        merged["chunks"][key] = crc
  return merged


_SAME_IN_EVERY_RECORD = ("format", "processes", "shape", "dtype", "chunk_shape", "layout",
                         "checksum")


def _parsed(record: bytes) -> dict:
  """A record as written by `_write_record`, or a ValueError / KeyError / TypeError."""
  out = json.loads(record)
  if out["format"] != _FORMAT:
    raise ValueError(f"format {out['format']!r} is not {_FORMAT} (a newer jax_sharding_ext "
                     "may read it)")
  if not (isinstance(out["processes"], int) and out["processes"] > 0
          and isinstance(out["chunks"], dict) and _valid_check(out.get("checksum"))
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
  directory = directory_of(spec)
  if directory is None:
    return
  record = await _records(directory, at)
  if record is None:
    return
  found, dtype = grid_of(t)
  # A zarr3 record of jax_sharding_ext 0.1.0 has no `codecs`: not checked then.
  codecs = found.codecs if found is not None and "codecs" in record else None
  stored = (list(found.shape), dtype, list(found.chunk), found.layout, codecs) if found else None
  recorded = (record["shape"], record["dtype"], record["chunk_shape"], record["layout"],
              record.get("codecs"))
  if found is None or stored != recorded:
    raise _damaged(at, directory.loc, f"its metadata (shape, dtype, chunk shape, layout "
                   f"{stored}) differs from the recorded {recorded}")
  check = record["checksum"]
  regions = []
  for index in sharding.addressable_devices_indices_map(tuple(shape)).values():
    region = [(max(0, lo), min(hi, n))
              for (lo, hi), n in zip(region_of(index, shape), found.shape, strict=True)]
    if all(lo < hi for lo, hi in region) or not region:
      regions.append(region)
  chunks = record["chunks"]
  keys = [found.key(c) for c in found.cells(regions)]
  for key in keys:
    if key not in chunks:
      raise _damaged(at, directory.loc, f"no chunk record names its chunk '{key}'")
  if directory.loc.local_dir is not None:  # stat every chunk here, read only changed ones
    keys = _unchecked_local(directory.loc, keys, chunks, check, at)

  async def one(key: str) -> None:
    want = chunks[key]
    if want is None:
      if not await directory.exists(key):
        raise _damaged(at, directory.loc, f"its chunk '{key}' is missing")
      return
    got = await directory.fingerprint(key, check, want)
    if got is None:
      raise _damaged(at, directory.loc, f"its chunk '{key}' is missing")
    if got != want:
      what = "crc32" if check == CRC32 else f"last {check[4:]} bytes (the codec's checksum)"
      raise _damaged(at, directory.loc, f"its chunk '{key}' has {what} {got:x}, but {want:x} "
                     "was recorded when it was written: it was changed or replaced")
  await asyncio.gather(*map(one, keys))


def _valid_check(check: Any) -> bool:
  return check == CRC32 or (isinstance(check, str) and check.startswith("tail")
                            and check[4:].isdigit() and 0 < int(check[4:]) <= 16)


def _unchecked_local(loc: locations.Location, keys: Sequence[str], chunks: dict, check: str,
                     at: str) -> list[str]:
  """The chunk files of a local directory among `keys` that need their bytes
  checked (a fingerprint recorded, and changed since last checked); a
  missing one raises."""
  out = []
  local_dir = cast(str, loc.local_dir)  # called for local directories only
  for key in keys:
    try:
      st = os.stat(os.path.join(local_dir, key))
    except FileNotFoundError:
      raise _damaged(at, loc, f"its chunk '{key}' is missing") from None
    want = chunks[key]
    if want is not None and checked.get((loc.key, key)) != (file_state(st), check, want):
      out.append(key)
  return out

