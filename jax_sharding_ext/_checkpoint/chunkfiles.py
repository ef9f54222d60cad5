"""The chunk files of an array's directory: read, checked against a crc32,
and remembered once checked.

A local directory is read with plain file operations (each file mapped, its
pages read in at once, and its crc32 computed without a copy); another
kvstore through tensorstore. A chunk whose bytes were checked is remembered
with the state of its file (inode, size, modification and change times) or
its kvstore generation, and not read again while that is unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import mmap
import os
from collections.abc import Callable
from typing import Any

import tensorstore as ts

from jax_sharding_ext._checkpoint import locations
from jax_sharding_ext._checkpoint.metadata import TS_CONTEXT

try:  # the same CRC-32 as zlib's, about 6x as fast (ISA-L, in the [checkpoint] extra)
  from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the extra installs it
  from zlib import crc32

# (location key, chunk key) -> (file state or kvstore generation, crc32): chunks
# whose stored bytes were checked (or written here) in that state.
checked: dict[tuple[str, str], tuple[Any, int]] = {}
CHECKED_LIMIT = 1 << 16


def _remember(loc: locations.Location, key: str, state: Any, crc: int) -> None:
  if len(checked) >= CHECKED_LIMIT:
    checked.clear()
  checked[loc.key, key] = (state, crc)


def file_state(st: os.stat_result) -> tuple:
  return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_INLINE_BYTES = 256 << 10
# Map the file with its pages read in at once (Linux): with a fast crc32 the
# copy a read() makes would cost more than the crc itself.
_MAP = ({"flags": mmap.MAP_SHARED | mmap.MAP_POPULATE, "prot": mmap.PROT_READ}
        if hasattr(mmap, "MAP_POPULATE") else {"access": mmap.ACCESS_READ})


def _crc_of_file(path: str) -> tuple[tuple, int]:
  """(the file's state, the crc32 of its bytes), a large file read without
  a copy."""
  with open(path, "rb") as f:
    state = file_state(os.fstat(f.fileno()))
    if state[1] <= _INLINE_BYTES:  # mapping costs more than a copy here
      return state, crc32(f.read())
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


class Directory:
  """An array's directory: a local one by plain file operations, another
  kvstore through tensorstore (opened once, when first needed)."""

  def __init__(self, loc: locations.Location):
    self.loc = loc
    self._store: ts.KvStore | None = None

  async def store(self) -> ts.KvStore:
    store = self._store
    if store is None:
      store = self._store = await ts.KvStore.open(self.loc.kvstore, context=TS_CONTEXT)
    return store

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
    """Write `key` (a record: written before the checkpoint is committed, so
    a write cut short leaves an uncommitted checkpoint, refused anyway)."""
    if self.loc.local_dir is not None:
      with open(os.path.join(self.loc.local_dir, key), "wb") as f:
        f.write(value)
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
        if known is not None and checked.get((self.loc.key, key)) == (file_state(st), known):
          return known
        # A small file costs less here than the trip to a worker thread.
        small = st.st_size <= _INLINE_BYTES
        state, crc = _crc_of_file(path) if small else await _in_thread(_crc_of_file, path)
      except FileNotFoundError:
        return None
    else:
      store = await self.store()
      seen = checked.get((self.loc.key, key))
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


def directory_of(spec: Any) -> Directory | None:
  loc = locations.locate(spec)
  return Directory(loc) if loc is not None and loc.shared_writes else None


