"""Porting GDA-era code: what needs this package, what needs a change, and the imports done.

`python -m jax_sharding_ext.port PATH...` (or `jax-sharding-ext-port`) reads
Python files and prints one finding per line, `path:line:col: CODE message`:

- `JSE1xx`: an import of a GDA-era name this package provides
  (`GlobalDeviceArray`, legacy `pjit`, `FROM_GDA`, `Mesh`, `PartitionSpec`,
  `multihost_utils`, `serialization`, the `global_device_array` module, ...).
  `--write` rewrites these imports in place (`--diff` shows the diff).
- `JSE2xx`: a use whose meaning changed (`jax.config.jax_array`,
  `with mesh:`, stock `multihost_utils` reached through the `jax` module, ...).
- `JSE3xx`: a JAX API removed with no replacement here (`jax.tree_map`,
  `xmap`, `ShardedDeviceArray`, ...); the message names the modern one.

`check(source)` and `fix(source)` do the same for one module's source. They
need libcst (`pip install 'jax-sharding-ext[port]'`), imported only when
called: importing this package never imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from jax_sharding_ext.port._finding import Finding

if TYPE_CHECKING:
  from types import ModuleType

__all__ = ["LIBCST_MISSING", "Finding", "check", "fix"]

LIBCST_MISSING = ("the porting tool needs libcst: pip install 'jax-sharding-ext[port]'")


def _load_engine() -> ModuleType:
  """The libcst-based implementation, or an ImportError naming the extra."""
  try:
    importlib.import_module("libcst")
  except ImportError as e:
    raise ImportError(LIBCST_MISSING) from e
  return importlib.import_module("jax_sharding_ext.port._engine")


def check(source: str | bytes, path: str = "<source>") -> list[Finding]:
  """The findings of one module's source, sorted by position.

  Raises `SyntaxError` when the source does not parse.
  """
  return _load_engine().check(source, path)


def fix(source: str | bytes) -> str | bytes:
  """`source` with its `JSE1xx` imports rewritten (same type as given).

  Everything else is kept as written; fixing the result again changes nothing.
  Raises `SyntaxError` when the source does not parse.
  """
  return _load_engine().fix(source)
