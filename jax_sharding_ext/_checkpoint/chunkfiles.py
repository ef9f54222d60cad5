"""The chunk files of an array's directory: fingerprinted (a crc32 of the
bytes, or the checksum a codec ends each chunk with), and remembered once
checked.

A local directory is read with plain file operations (for a crc32 each file
is mapped, its pages read in at once, and its crc32 computed without a copy;
for a tail only its last bytes are read); another kvstore through
tensorstore. A chunk checked is remembered with the state of its file
(inode, size, modification and change times) or its kvstore generation, and
not read again while that is unchanged.

During a save, `Landing` takes the crc32 of each local chunk file as it
lands (tensorstore writes a chunk to `<key>.__lock` and renames it into
place, so a file under its key is whole), while tensorstore still compresses
and writes the others; the record then uses it if the file's state is still
the one read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorstore as ts

from jax_sharding_ext._checkpoint import locations
from jax_sharding_ext._checkpoint.metadata import TS_CONTEXT

try:  # the same CRC-32 as zlib's, about 6x as fast (ISA-L, in the [checkpoint] extra)
  from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the extra installs it
  from zlib import crc32

CRC32 = "crc32"
"""A chunk's fingerprint is the crc32 of its bytes ("tail<n>": its last n bytes)."""

# (location key, chunk key) -> (file state or kvstore generation, kind, fingerprint):
# chunks whose stored bytes were checked (or written here) in that state.
checked: dict[tuple[str, str], tuple[Any, str, int]] = {}
CHECKED_LIMIT = 1 << 16


def _remember(loc: locations.Location, key: str, state: Any, check: str, fp: int) -> None:
  if len(checked) >= CHECKED_LIMIT:
    checked.clear()
  checked[loc.key, key] = (state, check, fp)


def _tail(data: bytes, n: int) -> int:
  """The last `n` bytes as a number (-1 for a file shorter than that)."""
  return int.from_bytes(data[-n:], "little") if len(data) >= n else -1


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


def _tail_of_file(path: str, n: int) -> tuple[tuple, int]:
  """(the file's state, its last `n` bytes as a number)."""
  with open(path, "rb") as f:
    state = file_state(os.fstat(f.fileno()))
    if state[1] < n:
      return state, -1
    f.seek(-n, os.SEEK_END)
    return state, _tail(f.read(n), n)


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_watch_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pools_lock = threading.Lock()


def _crc_pool() -> concurrent.futures.ThreadPoolExecutor:
  """The worker threads for crc32 and file reads (they release the GIL). One
  pool for the process: each save or restore runs its own event loop, and a
  loop's default pool is started and stopped with it."""
  global _pool
  with _pools_lock:
    if _pool is None:
      _pool = concurrent.futures.ThreadPoolExecutor(
          max_workers=min(8, os.cpu_count() or 2), thread_name_prefix="jax_sharding_ext.crc32")
    return _pool


async def _in_thread(fn: Callable, *args: Any) -> Any:
  """`fn(*args)` on a worker thread of `_crc_pool()`."""
  return await asyncio.get_running_loop().run_in_executor(_crc_pool(), fn, *args)


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
    """Write `key` whole or not at all (as tensorstore writes a key),
    creating the directory."""
    if self.loc.local_dir is not None:
      path = os.path.join(self.loc.local_dir, key)
      os.makedirs(self.loc.local_dir, exist_ok=True)
      tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
      with open(tmp, "wb") as f:
        f.write(value)
      os.replace(tmp, path)
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

  async def fingerprint(self, key: str, check: str, known: int | None = None,
                        landed: concurrent.futures.Future | None = None) -> int | None:
    """Chunk `key`'s fingerprint of kind `check` (None if it is missing).
    With `known`, a chunk checked before and unchanged since is not read
    again; with `landed` (from `Landing.finish()`: a local file's state and
    crc32, taken as it landed), neither is a file still in that state."""
    tail = 0 if check == CRC32 else int(check[4:])
    cached = checked.get((self.loc.key, key))
    state: Any
    if self.loc.local_dir is not None:
      path = os.path.join(self.loc.local_dir, key)
      try:
        st = os.stat(path)
        if known is not None and cached == (file_state(st), check, known):
          return known
        taken = None if landed is None or tail else await asyncio.wrap_future(landed)
        if taken is not None and taken[0] == file_state(st):
          state, fp = taken
        elif tail:
          state, fp = _tail_of_file(path, tail)
        elif st.st_size <= _INLINE_BYTES:  # costs less here than a trip to a thread
          state, fp = _crc_of_file(path)
        else:
          state, fp = await _in_thread(_crc_of_file, path)
      except FileNotFoundError:
        return None
    else:
      store = await self.store()
      if known is not None and cached is not None and cached[1:] == (check, known):
        r = await store.read(key, if_not_equal=cached[0])
        if r.state == "unspecified":
          return known
      else:
        r = await store.read(key)
      if r.state != "value":
        return None
      value = r.value
      if tail:
        fp = _tail(value, tail)
      else:
        fp = crc32(value) if len(value) <= _INLINE_BYTES else await _in_thread(crc32, value)
      state = r.stamp.generation
    _remember(self.loc, key, state, check, fp)
    return fp

  async def exists(self, key: str) -> bool:
    if self.loc.local_dir is not None:
      return os.path.lexists(os.path.join(self.loc.local_dir, key))
    r = await (await self.store()).read(key, byte_range=slice(0, 0))
    return r.state == "value"


class Landing:
  """The crc32 of chunk files as they land in local directories during a
  save, taken while tensorstore writes the rest.

  `watched` are (directory, key) pairs of chunks the save writes once, whole
  (a chunk written again is renamed over with a new inode: its state then
  differs from the one read, and the record reads it again). A file already
  there when the watch starts is taken only once its state changes. A helper
  thread polls the keys not landed yet, backing off so that polling costs at
  most about 5% of a core, and hands each landed file to the crc32 workers;
  it stops when every key has landed or `finish()` is called. The helper
  threads outlive the save (starting a thread costs more than a poll).
  """

  _POLL_S = 0.002

  def __init__(self, watched: Sequence[tuple[str, str]]):
    self._pending = {(d, k): _state_of(os.path.join(d, k)) for d, k in watched}
    self._landed: dict[tuple[str, str], concurrent.futures.Future] = {}
    self._stop = threading.Event()
    self._watching: concurrent.futures.Future | None = None
    if self._pending:
      try:
        self._watching = _watchers().submit(self._watch)
      except RuntimeError:  # the interpreter is exiting: the record reads every chunk
        self._watching = None

  def _watch(self) -> None:
    while self._pending and not self._stop.is_set():
      t0 = time.perf_counter()
      for (d, k), before in list(self._pending.items()):
        if self._stop.is_set():
          return
        path = os.path.join(d, k)
        if _state_of(path) not in (None, before):
          try:
            self._landed[d, k] = _crc_pool().submit(_landed_crc, path)
          except RuntimeError:  # the interpreter is exiting
            return
          del self._pending[d, k]
      self._stop.wait(max(self._POLL_S, 20 * (time.perf_counter() - t0)))

  def finish(self) -> dict[tuple[str, str], concurrent.futures.Future]:
    """Stop watching; (directory, key) -> the future (file state, crc32) of
    each file taken (its result None if it could not be read)."""
    self._stop.set()
    if self._watching is not None and not self._watching.cancel():
      self._watching.result()
    return dict(self._landed)


def _landed_crc(path: str) -> tuple[tuple, int] | None:
  try:
    return _crc_of_file(path)
  except (OSError, ValueError):  # gone, cut short or unreadable: the record reads it
    return None


def _watchers() -> concurrent.futures.ThreadPoolExecutor:
  """The threads `Landing` polls on: one per save running at a time (a watch
  waiting for a thread starts late, and so takes fewer files early)."""
  global _watch_pool
  with _pools_lock:
    if _watch_pool is None:
      _watch_pool = concurrent.futures.ThreadPoolExecutor(
          max_workers=4, thread_name_prefix="jax_sharding_ext.landing")
    return _watch_pool


def _state_of(path: str) -> tuple | None:
  try:
    return file_state(os.stat(path))
  except OSError:
    return None


def directory_of(spec: Any) -> Directory | None:
  loc = locations.locate(spec)
  return Directory(loc) if loc is not None and loc.shared_writes else None


