"""Porting GDA-era code in one command: `python -m jax_sharding_ext.port --write PATH...`.

`python -m jax_sharding_ext.port PATH...` (or `jax-sharding-ext-port`) reads
Python files, notebooks (`.ipynb`, their code cells) or `-` (stdin) and
prints one finding per line, `path:line:col: CODE message`:

- `JSE1xx`: an import of a GDA-era name this package provides
  (`GlobalDeviceArray`, legacy `pjit`, `FROM_GDA`, `Mesh`, `PartitionSpec`,
  `multihost_utils`, `serialization`, the `global_device_array` module,
  `parallel_functions_output_gda`, ...).
- `JSE2xx`: a use whose meaning changed (`jax.config.jax_array`,
  `with mesh:`, stock `multihost_utils` reached through a module, a GDA's
  attributes of a `jax.Array`, `jax.distributed.initialize()` after a
  computation, ...).
- `JSE3xx`: a JAX API removed or moved (`jax.tree_map`, `xmap`,
  `ShardedDeviceArray` and its attributes, `thread_resources`, a name the
  installed JAX does not have, ...).

`--write` makes every change that has one meaning (the message of such a
finding ends with "(--write fixes this)"), in place, and prints what is left;
`--diff` shows the diff. What is left names the exact change to make. The
files of one run are one project: a rule that follows a value into another
file (a function that makes the mesh) reads it there.

`check(source)` and `fix(source)` do the same for one module's source. They
need libcst (`pip install 'jax-sharding-ext[port]'`), imported only when
called: importing this package never imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import types

from jax_sharding_ext.port._finding import Finding

__all__ = ["LIBCST_MISSING", "Finding", "check", "fix"]

LIBCST_MISSING = ("the porting tool needs libcst: pip install 'jax-sharding-ext[port]'")


def _load_engine(rewrite: bool = True) -> types.ModuleType:
  """The implementation, or an ImportError naming the extra. libcst itself is
  imported only to rewrite (`rewrite`); checking asks only that it is there."""
  try:
    if rewrite:
      importlib.import_module("libcst")
    elif importlib.util.find_spec("libcst") is None:
      raise ImportError("no module named 'libcst'")
  except (ImportError, ValueError) as e:
    raise ImportError(LIBCST_MISSING) from e
  return importlib.import_module("jax_sharding_ext.port._engine")


def check(source: str | bytes, path: str = "<source>") -> list[Finding]:
  """The findings of one module's source, sorted by position.

  `path` is the name the findings give the source. Raises `SyntaxError` when
  the source does not parse.

  Example:
    >>> source = "import jax\\nleaves = jax.tree_map(abs, [-1, 2])\\n"
    >>> for finding in check(source, "train.py"):
    ...   print(finding)
    train.py:2:10: JSE301 `jax.tree_map` was removed from JAX; use `jax.tree_util.tree_map` (--write fixes this)
  """
  engine = _load_engine(rewrite=False)
  if isinstance(source, bytes):
    source = importlib.import_module("jax_sharding_ext.port._source").decode(source)[0]
  return engine.check_text(source, path)


def fix(source: str | bytes) -> str | bytes:
  """`source` with every fixable finding fixed (same type as given).

  Everything else is kept as written; fixing the result again changes nothing.
  Raises `SyntaxError` when the source does not parse.

  Example:
    >>> source = ("from jax.experimental.global_device_array import GlobalDeviceArray\\n"
    ...           "import jax\\n"
    ...           "leaves = jax.tree_map(abs, [-1, 2])\\n")
    >>> print(fix(source), end="")
    from jax_sharding_ext import GlobalDeviceArray
    import jax
    leaves = jax.tree_util.tree_map(abs, [-1, 2])
    >>> fix(fix(source)) == fix(source)
    True
  """
  engine = _load_engine()
  if isinstance(source, bytes):
    text_mod = importlib.import_module("jax_sharding_ext.port._source")
    text, encoding, bom = text_mod.decode(source)
    return text_mod.encode(engine.fix_text(text)[0], encoding, bom)
  return engine.fix_text(source)[0]
