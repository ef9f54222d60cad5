"""Public classes show the path users import them from.

A class defined in a private module would print (`type(gda)`, `repr` of the
class, type errors, `help`), appear in tracebacks and pickle by reference
under that private path (`jax_sharding_ext._array.gda.GlobalDeviceArray`).
`public(module)` sets the class's `__module__` to the public module that
exports it under the same name, as JAX shows `jax.sharding.NamedSharding`
for a class defined in one of its private modules:

- pickle stores the public path, which resolves as long as that module
  exports the name (tests round-trip every public class); pickles written
  before keep loading, since the private module still defines the class;
- the decorator goes above `@dataclasses.dataclass`, so the methods the
  dataclass generates keep their defining module's globals, where their
  annotations resolve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T", bound=type)


def public(module: str) -> Callable[[_T], _T]:
  """Return a class decorator that shows the class as `module.<its name>`."""
  def mark(cls: _T) -> _T:
    cls.__module__ = module
    return cls
  return mark
