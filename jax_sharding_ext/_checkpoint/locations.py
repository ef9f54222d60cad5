"""Where a tensorstore spec stores its array, as tensorstore itself resolves it.

One array location can be spelled many ways: a dict kvstore with a `path`,
a URL string kvstore (`"file:///ckpt/a/"`, `"gs://bucket/a"`), a spec-level
`path` under a kvstore of the parent directory, `file://` or a plain path,
with or without a trailing slash, and a 'cast' spec around any of these.
`ts.Spec(spec).kvstore` resolves every spelling to the kvstore of the array's
own directory (its path ends in "/"), so everything here starts from that:
commit markers and chunk records go into that directory, and two specs name
the same location exactly when their resolved kvstores are the same.

On the local file system a path is resolved at each save and restore: a
relative path against the working directory of that moment, symbolic links
as they point then (`pinned` spells the directory that way for the whole
save or restore). Nothing resolved is remembered between calls, so a
`latest -> step_N` link re-pointed, or an `os.chdir`, between two saves
sends the second one's data, marker and records to the new directory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from typing import Any

import tensorstore as ts

# Kvstore drivers where several processes may write keys of one directory at
# once (each its own key): markers and chunk records are written only there.
# (An 'ocdbt' database, for example, needs a coordinator for that.)
SHARED_WRITE_DRIVERS = frozenset({"file", "gcs", "s3", "memory"})


@dataclasses.dataclass(frozen=True)
class Location:
  """The directory holding one array.

  Attributes:
    kvstore: the resolved kvstore spec of the directory (its path ends in "/").
    key: what identifies the directory: its URL, or for a local directory
      `file://` and its real absolute path (symbolic links resolved), so
      every spelling of one directory has one key.
    local_dir: the directory on the local file system (the 'file' driver),
      else None.
    shared_writes: whether keys may be written there by several processes
      at once (see `SHARED_WRITE_DRIVERS`).
    text: the location for people (no trailing slash).
  """

  kvstore: Any
  key: str
  local_dir: str | None
  shared_writes: bool
  text: str


def stored(spec: Any) -> Any:
  """The spec of the stored array under `spec`: a 'cast' spec (as GDA-era
  orbax wrote and read through) stores its 'base'."""
  while isinstance(spec, Mapping) and spec.get("driver") == "cast" and "base" in spec:
    spec = spec["base"]
  return spec


def parsed(spec: Any) -> ts.Spec | None:
  """`spec` parsed by tensorstore, or None if tensorstore refuses it."""
  if isinstance(spec, ts.Spec):
    return spec
  try:
    return ts.Spec(spec)
  except (TypeError, ValueError):
    return None


def locate(spec: Any) -> Location | None:
  """The directory of the array `spec` (a dict or `ts.Spec`) names, as
  tensorstore resolves it now; None when it names none (no kvstore, or a
  spec tensorstore refuses).

  Only the stored array's driver, kvstore and spec-level path decide it, so
  for a dict spec tensorstore's parse of just those is remembered (a save or
  restore asks several times). What the parse names on the local file
  system is not: a relative path or a symbolic link on the way is resolved
  at each call, against the working directory and the links as they are
  then.
  """
  base = stored(spec)
  if isinstance(base, Mapping):
    try:
      key = json.dumps([base.get("driver"), base.get("kvstore"), base.get("path")],
                       sort_keys=True)
    except (TypeError, ValueError):  # e.g. a `ts.KvStore.Spec` inside: parse it all
      key = None
    if key is not None:
      return _resolve(_kvstore_named(key))
  s = parsed(spec)
  return _resolve(None if s is None else s.kvstore)


@functools.lru_cache(maxsize=4096)
def _kvstore_named(key: str) -> ts.KvStore.Spec | None:
  driver, kvstore, path = json.loads(key)
  named = {"driver": driver, "kvstore": kvstore}
  if path is not None:
    named["path"] = path
  s = parsed(named)
  return None if s is None else s.kvstore


def _resolve(kv: ts.KvStore.Spec | None) -> Location | None:
  if kv is None:
    return None
  driver = kv.to_json().get("driver")
  if driver == "file":
    try:
      local = os.path.realpath(kv.path)
    except FileNotFoundError:  # a relative path, and the working directory was removed
      raise ValueError(
          f"The checkpoint path '{kv.path.rstrip('/')}' is relative, and the working "
          "directory it is relative to no longer exists. Give an absolute path, or "
          "`os.chdir()` to an existing directory first.") from None
    return Location(kv, "file://" + local + "/", local, True, kv.path.rstrip("/") or "/")
  try:
    url = kv.url
  except ValueError:  # a driver without a URL form
    url = repr(sorted(kv.to_json().items()))
  return Location(kv, url, None, driver in SHARED_WRITE_DRIVERS, url.rstrip("/"))


def pinned(spec: Any) -> Any:
  """`spec` with the stored array's local directory spelled as the absolute
  path it resolves to now (working directory and symbolic links as they are
  at this call), for one save or restore: tensorstore's reads and writes, the
  commit marker and the chunk records then all meet that directory, even if
  the working directory changes or a link is re-pointed while the save
  commits in the background. A dict is copied (down to the stored array);
  anything else, and a spec of another kvstore, is returned as given."""
  if not isinstance(spec, Mapping):
    return spec
  if spec.get("driver") == "cast" and isinstance(spec.get("base"), Mapping):
    return dict(spec, base=pinned(spec["base"]))
  loc = locate(spec)
  if loc is None or loc.local_dir is None:
    return spec
  kvstore = loc.kvstore.to_json()
  kvstore["path"] = loc.local_dir.rstrip("/") + "/"
  out = dict(spec, kvstore=kvstore)
  out.pop("path", None)  # a spec-level path is part of the directory now
  return out


def reason(e: BaseException) -> str:
  """tensorstore's error text without the spec it appends (long, and ours)."""
  return str(e).split(" [tensorstore_spec=")[0]


def spec_path(spec: Any) -> str:
  """A readable location of `spec`'s array for error messages."""
  loc = locate(spec)
  if loc is not None:
    return loc.text
  kv = stored(spec).get("kvstore") if isinstance(stored(spec), Mapping) else None
  if isinstance(kv, Mapping):
    return str(kv.get("path", "")).rstrip("/")
  if isinstance(kv, str):
    return kv.rstrip("/")
  return repr(stored(spec))


def path_key(spec: Any) -> str | None:
  """What identifies the location `spec` writes to, or None if it names none."""
  loc = locate(spec)
  return None if loc is None else loc.key


def new_local_path(spec: Any) -> bool:
  """True when `spec` stores on the local file system where nothing exists yet."""
  loc = locate(spec)
  return loc is not None and loc.local_dir is not None and not os.path.lexists(loc.local_dir)
