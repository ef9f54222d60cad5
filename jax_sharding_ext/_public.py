"""Public classes show the path users import them from, and only public names.

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

`functions_shown_at(name)` does for the functions a public module exports
what `public` does for classes (as `jax.jit` shows module `jax`): `help()`,
reprs and pickle name the public module, not the private one that defines
them.

`module_dir(name, *legacy)` is a public module's `__dir__` (PEP 562): what
`dir()`, `help()` and tab completion list is the module's `__all__`, its
public submodules once imported, its dunder names and the GDA-era private
names old code reads (`legacy`), not the modules and helpers it imports.

`assembled(*parts)` builds a public class from private parts kept in modules
of their own (one responsibility each) without making them its bases: their
members become the class's own, so its method resolution order, `help()`
("inherited from ..."), the API reference and bound methods' reprs show the
public class alone, and an attribute is found in the class's own dictionary.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T", bound=type)


def public(module: str) -> Callable[[_T], _T]:
  """Return a class decorator that shows the class as `module.<its name>`."""
  def mark(cls: _T) -> _T:
    cls.__module__ = module
    return cls
  return mark


def functions_shown_at(name: str) -> None:
  """Show each function in the `__all__` of the module `name` that a private
  module defines, under its own name, as defined in `name`."""
  module = sys.modules[name]
  for export in module.__all__:
    fn = getattr(module, export)
    if (isinstance(fn, types.FunctionType) and fn.__name__ == export
        and fn.__module__.startswith("jax_sharding_ext.")
        and any(part.startswith("_") for part in fn.__module__.split("."))):
      fn.__module__ = name


def module_dir(name: str, *legacy: str) -> Callable[[], list[str]]:
  """Return the `__dir__` of the module `name`, listing its public names."""
  shown = frozenset(legacy)

  def __dir__() -> list[str]:
    namespace = vars(sys.modules[name])
    exported = set(namespace.get("__all__", ()))
    return sorted(n for n, v in namespace.items()
                  if n in exported or n in shown or (n.startswith("__") and n.endswith("__"))
                  or (isinstance(v, types.ModuleType) and v.__name__ == f"{name}.{n}"
                      and not n.startswith("_")))
  return __dir__


# What a class body defines about the class itself, not a member to take over.
_NOT_MEMBERS = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                          "__slots__", "__annotations__", "__firstlineno__",
                          "__static_attributes__"})


def assembled(*parts: type) -> Callable[[_T], _T]:
  """Return a class decorator that gives the class every member of `parts`.

  The result is what inheriting from `parts` (in this order, before the
  class's own bases) would look up, without the parts in the class's bases:
  the class's own definitions come first, then each part's in order. Each
  part is a plain class (no bases, no instance state of its own: empty
  `__slots__`); its functions take the class's module and qualified name
  (put this decorator above `public`).
  """
  for part in parts:
    if part.__bases__ != (object,) or part.__dict__.get("__slots__", None) != ():
      raise TypeError(f"{part.__qualname__} must be a plain class with `__slots__ = ()`")

  def assemble(cls: _T) -> _T:
    for part in parts:
      for name, member in part.__dict__.items():
        if name not in _NOT_MEMBERS and name not in cls.__dict__:
          _rename(member, cls.__module__, f"{cls.__qualname__}.{name}")
          setattr(cls, name, member)
    return cls
  return assemble


def _rename(member: Any, module: str, qualname: str) -> None:
  """Give `member`'s functions `module` and `qualname` (as reprs, `help` and
  the API reference show them)."""
  if isinstance(member, (classmethod, staticmethod)):
    member = member.__func__
  if isinstance(member, property):
    for fn in (member.fget, member.fset, member.fdel):
      _rename(fn, module, qualname)
  elif isinstance(member, types.FunctionType):
    for fn in (member, getattr(member, "__wrapped__", None)):
      if isinstance(fn, types.FunctionType):
        fn.__module__, fn.__qualname__ = module, qualname
