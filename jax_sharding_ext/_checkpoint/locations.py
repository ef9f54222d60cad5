"""Where a tensorstore spec stores its array, as tensorstore itself resolves it.

One array location can be spelled many ways: a dict kvstore with a `path`,
a URL string kvstore (`"file:///ckpt/a/"`, `"gs://bucket/a"`), a spec-level
`path` under a kvstore of the parent directory, `file://` or a plain path,
with or without a trailing slash, and a 'cast' spec around any of these.
`ts.Spec(spec).kvstore` resolves every spelling to the kvstore of the array's
own directory (its path ends in "/"), so everything here starts from that:
commit markers and chunk records go into that directory, and two specs name
the same location exactly when their resolved kvstores are the same.
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
  tensorstore resolves it; None when it names none (no kvstore, or a spec
  tensorstore refuses).

  Only the stored array's driver, kvstore and spec-level path decide it, so
  for a dict spec those are resolved once (tensorstore parses just them) and
  remembered: a save or restore asks several times.
  """
  base = stored(spec)
  if isinstance(base, Mapping):
    try:
      key = json.dumps([base.get("driver"), base.get("kvstore"), base.get("path")],
                       sort_keys=True)
    except (TypeError, ValueError):  # e.g. a `ts.KvStore.Spec` inside: parse it all
      key = None
    if key is not None:
      return _locate_named(key)
  return _resolve(parsed(spec))


@functools.lru_cache(maxsize=4096)
def _locate_named(key: str) -> Location | None:
  driver, kvstore, path = json.loads(key)
  named = {"driver": driver, "kvstore": kvstore}
  if path is not None:
    named["path"] = path
  return _resolve(parsed(named))


def _resolve(s: ts.Spec | None) -> Location | None:
  kv = None if s is None else s.kvstore
  if kv is None:
    return None
  driver = kv.to_json().get("driver")
  if driver == "file":
    local = os.path.realpath(kv.path)
    return Location(kv, "file://" + local + "/", local, True, kv.path.rstrip("/") or "/")
  try:
    url = kv.url
  except ValueError:  # a driver without a URL form
    url = repr(sorted(kv.to_json().items()))
  return Location(kv, url, None, driver in SHARED_WRITE_DRIVERS, url.rstrip("/"))


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
