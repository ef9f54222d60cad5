"""Whether the installed JAX has a dotted name (`jax.interpreters.pxla.Mesh`).

Asked of the JAX this process runs: modules, classes and JAX's config
object (whose options are all defined once JAX and this package are
imported) are asked for their attributes (deprecated names answer through a
module's `__getattr__`, removed ones raise `AttributeError` there); a
submodule not imported yet exists when its file does, and is imported to
look inside it (as the code that names it would); when that import fails (a
dependency of its own is missing), what is inside it is not known. Other
objects are not asked, so a name past one is taken as present. The answer is
False only when the name is surely missing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
import warnings
from typing import Any

ROOTS = ("jax", "jaxlib")
_UNKNOWN = object()
_MISSING = object()


def _attr(obj: Any, name: str) -> Any:
  """`obj.name` (`jnp.newaxis` is None), `_MISSING` when it is surely missing,
  `_UNKNOWN` when asking failed."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      return getattr(obj, name)
    except AttributeError:
      return _MISSING
    except Exception:  # a module's `__getattr__` may raise anything
      return _UNKNOWN


def _import(dotted: str) -> types.ModuleType | None:
  """The submodule `dotted` (a file of JAX's), or None when its import fails."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      return importlib.import_module(dotted)
    except Exception:  # its own dependencies, or anything its import runs
      return None


def _submodule_exists(package: types.ModuleType, dotted: str) -> bool:
  if not hasattr(package, "__path__"):
    return False
  try:
    return importlib.util.find_spec(dotted) is not None
  except (ImportError, ValueError):
    return False


@functools.cache
def has(dotted: str, loaded: bool = False) -> bool:
  """False when the installed JAX surely lacks `dotted`, else True. With
  `loaded`, also False for a name inside a submodule whose import fails."""
  parts = dotted.split(".")
  if parts[0] not in ROOTS:
    return True
  try:
    obj: Any = importlib.import_module(parts[0])
  except ImportError:
    return True
  for i in range(1, len(parts)):
    name = ".".join(parts[:i + 1])
    if isinstance(obj, types.ModuleType):
      value = _attr(obj, parts[i])
      if value is _MISSING:
        value = sys.modules.get(name, _MISSING)
      if value is _MISSING:
        if not _submodule_exists(obj, name):
          return False
        value = _import(name)
        if value is None:  # its contents cannot be known here
          return not loaded
    elif isinstance(obj, type) or obj is _config():
      value = _attr(obj, parts[i])
      if value is _MISSING:
        return False
    else:
      return True
    if value is _UNKNOWN:
      return True
    obj = value
  return True


def value(dotted: str) -> Any:
  """The object `dotted` names in the installed JAX (importing what it is in),
  or None."""
  module, _, name = dotted.rpartition(".")
  if not has(dotted, loaded=True):
    return None
  parent = sys.modules.get(module) or _import(module)
  found = _attr(parent, name) if parent is not None else None
  return None if found is _UNKNOWN or found is _MISSING else found


@functools.cache
def is_module(dotted: str) -> bool:
  """False when `import dotted` surely fails in this JAX (`jax.config` is an
  attribute of `jax`, not a module), else True."""
  parts = dotted.split(".")
  if parts[0] not in ROOTS or dotted in sys.modules:
    return True
  parent = sys.modules.get(".".join(parts[:-1]))
  if parent is None:
    return has(dotted)  # a parent that was not imported: its file decides
  return _submodule_exists(parent, dotted)


def _config() -> Any:
  return getattr(sys.modules.get("jax"), "config", None)


def version() -> str:
  return str(getattr(sys.modules.get("jax"), "__version__", "?"))
