"""How a save runs: check the targets and that the transfer guard allows the
copies to the host, mark them uncommitted, write every array with stock
`array_serialization`, record the chunks written (`integrity`), and commit."""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from jax_sharding_ext._checkpoint import (
    checks,
    chunkfiles,
    integrity,
    locations,
    markers,
    running,
)
from jax_sharding_ext._jax import checkpoint as jax_checkpoint
from jax_sharding_ext._jax import transfer as jax_transfer
from jax_sharding_ext._transfers.guard import D2D, D2H

_REFUSING = frozenset({"disallow", "disallow_explicit"})


async def check_host_copy(fn: str, arrs: Sequence[jax.Array]) -> None:
  """Raise before anything is written if the transfer guard refuses the
  copies of the shards to the host that stock's writes make (exactly as it
  would refuse them: the first step of stock's write is tried on a one-byte
  array). Stock would raise at its first shard, with its other shards and
  arrays part written, and every earlier checkpoint at those paths damaged."""
  if not any(jax_transfer.transfer_guard_level(d) in _REFUSING for d in (D2H, D2D)):
    return
  shards = next((a.addressable_shards for a in arrs if a.addressable_shards), None)
  if shards is None:
    return
  error = await jax_checkpoint.host_copy_error(shards[0].device)
  if error is not None:
    # jaxlib's error first (its type and prefix, as for a guarded transfer).
    raise type(error)(
        f"{error}. {fn} refused this before writing anything: what is stored at the target "
        "paths is unchanged. A save copies each shard from its device to the host; allow "
        "that around the save with `with jax.transfer_guard(\"allow\"):`.") from None


async def prepare(fn: str, arrs: Sequence[jax.Array], specs: Sequence[dict],
                  choice: str) -> tuple[list, list[bool]]:
  """Check the targets and the transfer guard (refusing leaves the targets
  intact), then mark them uncommitted; return the opened marker stores, and
  for each spec whether nothing was stored there before."""
  fresh = [locations.new_local_path(s) for s in specs]
  stores, _, _ = await asyncio.gather(markers.marker_stores(specs),
                                      checks.check_targets(fn, specs, choice),
                                      check_host_copy(fn, arrs))
  await markers.mark(stores, True)
  await integrity.start_records(specs)
  return stores, fresh


async def save(fn: str, arrs: Sequence[jax.Array], specs: Sequence[dict], choice: str, *,
               commit: bool) -> None:
  """`prepare`, write every array (stock's `run_serialization`, as a
  coroutine) and record its chunks, then, with `commit`, mark the targets
  committed."""
  stores, fresh = await prepare(fn, arrs, specs, choice)
  regions = [integrity.written_regions(a) for a in arrs]
  await write_and_record(regions, [jax_checkpoint.async_serialize(a, s)
                                   for a, s in zip(arrs, specs, strict=True)], specs, fresh)
  if commit:
    await markers.mark(stores, False)


async def write_and_record(regions: Sequence[Sequence[integrity.Region]], writes: Sequence[Any],
                           specs: Sequence[dict], fresh: Sequence[bool]) -> list:
  """Await `writes` (stock's writes of the arrays at `specs`, which write
  `regions`), then record their chunks (`integrity.write_records`); return
  the writes' results.

  The crc32 of each chunk file is taken as the file lands (`watch_writes`),
  while tensorstore still compresses and writes the others: the pass over
  every chunk written after the writes is then left with the last ones only.
  """
  landing = watch_writes(regions, specs)
  try:
    out = await asyncio.gather(*writes)
  finally:
    landed = landing.finish()
  await integrity.write_records(regions, specs, fresh, landed)
  return out


def watch_writes(regions: Sequence[Sequence[integrity.Region]],
                 specs: Sequence[dict]) -> chunkfiles.Landing:
  """Start taking the crc32 of the chunk files of `specs` that this save
  writes once, whole (inside one written region), as they land: for local
  directories, where the spec gives the chunk grid and chunks are
  fingerprinted by crc32 (a codec's tail costs nothing to read)."""
  watched: list[tuple[str, str]] = []
  for spec_regions, spec in zip(regions, specs, strict=True):
    directory = chunkfiles.directory_of(spec)
    try:
      known = integrity.grid_of_new(spec)
    except (TypeError, ValueError, KeyError):  # the write itself reports what is wrong
      continue
    if (directory is None or directory.loc.local_dir is None or known is None
        or known[0] is None or known[0].check != chunkfiles.CRC32):
      continue
    grid = known[0]
    keys = collections.Counter(grid.key(c) for r in spec_regions for c in _cells_inside(grid, r))
    # A chunk inside two regions (overlapping ones) may be written twice.
    watched += [(directory.loc.local_dir, k) for k, n in keys.items() if n == 1]
  return chunkfiles.Landing(watched)


def _cells_inside(grid: integrity.Grid, region: integrity.Region) -> Iterator[tuple[int, ...]]:
  """The chunks (grid positions) that lie wholly inside `region` (as
  `Grid.inside`; a chunk at the array's end ends there)."""
  spans = [range(-(-lo // c), -(-n // c) if hi >= n else hi // c)
           for (lo, hi), c, n in zip(region, grid.chunk, grid.shape, strict=True)]
  return itertools.product(*spans)


class RecordsAfter:
  """A commit future that first waits for `futures` (the commit futures of
  the writes of `arrs`), then records their chunks (`integrity`): `result()`
  blocks, `await` waits; the records are written once. The arrays may be
  donated meanwhile (their regions are taken now)."""

  def __init__(self, futures: Sequence[Any], arrs: Sequence[jax.Array], specs: Sequence[dict],
               fresh: Sequence[bool] | None = None):
    self._futures, self._specs, self._fresh = list(futures), list(specs), fresh
    self._regions = [integrity.written_regions(a) for a in arrs]
    self._lock = threading.Lock()
    self._done = False

  def result(self, timeout: float | None = None) -> None:
    with self._lock:
      if not self._done:
        for f in self._futures:
          f.result()
        running.run(lambda: integrity.write_records(self._regions, self._specs, self._fresh))
        self._done = True

  def done(self) -> bool:
    return self._done

  def __await__(self):
    return self._wait().__await__()

  async def _wait(self) -> None:
    for f in self._futures:
      await f
    if not self._done:
      await integrity.write_records(self._regions, self._specs, self._fresh)
      self._done = True
