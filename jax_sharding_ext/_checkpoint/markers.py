"""Commit markers, and one writer per path.

A save writes the key `COMMIT_MARKER` into each array's own directory (as
tensorstore resolves the spec: `locations.locate`) before its first byte,
and removes it once every process has committed; a restore through any
spelling of that directory refuses an array that still has it. Markers are
written where several processes may write keys at once
(`locations.SHARED_WRITE_DRIVERS`).

Every save also holds the paths it writes until it is done, and a second
save to a held path in this process is refused before it writes anything.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import tensorstore as ts

from jax_sharding_ext._checkpoint import locations
from jax_sharding_ext._checkpoint.checks import where
from jax_sharding_ext._checkpoint.metadata import TS_CONTEXT

COMMIT_MARKER = "jax_sharding_ext.uncommitted"
"""Key in an array's directory while its checkpoint is not yet committed."""

_MARKER_TEXT = b"written by jax_sharding_ext; not yet committed"


def marker_locations(specs: Sequence[Any]) -> list[locations.Location]:
  """The directories of `specs`' arrays that get a commit marker."""
  locs = (locations.locate(spec) for spec in specs)
  return [loc for loc in locs if loc is not None and loc.shared_writes]


async def marker_stores(specs: Sequence[Any]) -> list:
  """Where the "not yet committed" markers of `specs`' arrays go: a local
  directory as its path (plain file operations, a tenth of tensorstore's
  cost), any other kvstore opened (opening creates nothing)."""
  locs = marker_locations(specs)
  opened = iter(await asyncio.gather(*(ts.KvStore.open(loc.kvstore, context=TS_CONTEXT)
                                       for loc in locs if loc.local_dir is None)))
  return [loc.local_dir if loc.local_dir is not None else next(opened) for loc in locs]


async def mark(stores: Sequence[Any], present: bool) -> None:
  """Write (`present`) or remove the "not yet committed" marker in each store."""
  async def one(store):
    if isinstance(store, str):
      _mark_local(store, present)
    elif present:
      await store.write(COMMIT_MARKER, _MARKER_TEXT)
    else:
      await store.delete_range(ts.KvStore.KeyRange(COMMIT_MARKER, COMMIT_MARKER + "\0"))
  await asyncio.gather(*map(one, stores))


def write_local(path: str, data: bytes) -> None:
  """Write the file `path` whole or not at all (as tensorstore's file driver
  writes), creating its directory."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def _mark_local(directory: str, present: bool) -> None:
  marker = os.path.join(directory, COMMIT_MARKER)
  if present:
    write_local(marker, _MARKER_TEXT)
  else:
    try:
      os.remove(marker)
    except FileNotFoundError:
      pass


async def set_markers(specs: Sequence[Any], present: bool) -> None:
  await mark(await marker_stores(specs), present)


async def check_committed(spec: Any, at: str) -> None:
  """Refuse the array at `spec` (any spelling of its location) while its
  commit marker is there."""
  loc = locations.locate(spec)
  if loc is None or not loc.shared_writes:
    return
  if loc.local_dir is not None:
    uncommitted = os.path.lexists(os.path.join(loc.local_dir, COMMIT_MARKER))
  else:
    store = await ts.KvStore.open(loc.kvstore, context=TS_CONTEXT)
    uncommitted = (await store.read(COMMIT_MARKER)).state == "value"
  if uncommitted:
    raise ValueError(
        f"{at}: the checkpoint at '{loc.text}' was never committed (its "
        f"'{COMMIT_MARKER}' marker is still there): a process stopped or a write "
        "failed before every process had finished writing, so it may be partial. "
        "Restore an earlier checkpoint.")


# -- one writer per path ----------------------------------------------------------
#
# Every save (a `run_serialization` call, or a `GlobalAsyncCheckpointManager`
# checkpoint until its `wait_until_finished()` returns) holds the paths it
# writes. A second save to a held path is refused before it writes its marker:
# otherwise the first save's commit would remove the marker they share while
# the second still writes, and a crash then would leave a partial checkpoint
# that restores as complete. A writer that has been garbage collected holds
# nothing.

_writers_lock = threading.Lock()
_writers: dict[str, tuple[weakref.ref, str]] = {}  # path key -> (writer, what it is)
MANAGER_WRITER = ("a GlobalAsyncCheckpointManager checkpoint that has not been waited for; "
                  "call `wait_until_finished()` on that manager first")
RUN_WRITER = ("a `run_serialization` call that has not returned (in another thread); "
              "let it return first")


class SaveInProgress:
  """The writer of one `run_serialization` call (weakly referenced)."""


def hold_paths(fn: str, specs: Sequence[Any], writer: Any, what: str) -> list[str]:
  """Record `writer` (described by `what`: whom it is and how to wait for it)
  as the one writer of `specs`' paths, or raise if another live writer holds
  one of them."""
  keys = [locations.path_key(spec) for spec in specs]
  with _writers_lock:
    for i, key in enumerate(keys):
      held = _writers.get(key) if key is not None else None
      if held is not None and held[0]() is not None and held[0]() is not writer:
        raise RuntimeError(
            f"{where(fn, 'tensorstore_specs', i)}: '{locations.spec_path(specs[i])}' is "
            f"being written by {held[1]}, or write to another path. Nothing was written: "
            "two saves to one path at once would remove each other's commit marker and "
            "mix their chunks.")
    ref = weakref.ref(writer)
    held_keys = [key for key in keys if key is not None]
    for key in held_keys:
      _writers[key] = (ref, what)
  return held_keys


def release_paths(keys: Sequence[str], writer: Any) -> None:
  with _writers_lock:
    for key in keys:
      held = _writers.get(key)
      if held is not None and held[0]() in (writer, None):
        del _writers[key]
