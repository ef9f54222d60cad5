"""Where a name the installed JAX lacks lives today: rules over JAX's moves, asked of JAX.

`home(symbol)` answers for a dotted JAX name that the installed JAX does not
have (`jax.experimental.sharding.Sharding`), by its first missing part:

- a name JAX renamed keeps its new name wherever it went (`RENAMED`:
  `MeshPspecSharding` is `NamedSharding`);
- a module JAX moved (`MOVED`): the name in the module(s) its names went
  to, when the installed JAX has it there (`jax.tree_map` is
  `jax.tree_util.tree_map`; `jax.experimental.sharding.X` is
  `jax.sharding.X`);
- a class is the same class wherever JAX exports it: a class of that name
  exported by the installed JAX's public modules (every such export is the
  same object) is its home (`jax.ShapedArray` and
  `jax.abstract_arrays.ShapedArray` are `jax.core.ShapedArray`,
  `jax.interpreters.pxla.Mesh` is `jax.sharding.Mesh`, a class of JAX's
  private modules is where JAX exports it now);
- JAX's own record of the removal (a module's `_deprecations` table) that
  names the same name elsewhere ("Use jax.extend.core.Primitive");
- a name of JAX's private modules (any module path with a part starting
  with `_`) that Python's standard library has with the same meaning
  (`PRIVATE_HELPERS`: the private `prod` is `math.prod`).

Otherwise there is no same-meaning name, and `removal_note(symbol)` gives
JAX's own note on it, if it kept one, for the report.
"""

from __future__ import annotations

import functools
import re
import sys
import types

from jax_sharding_ext.port import _jaxnames

MOVED: dict[str, tuple[str, ...]] = {
    "jax": ("jax.tree_util",),  # the `jax.tree_*` aliases of `jax.tree_util`'s functions
    "jax.experimental": ("jax.example_libraries",),  # `optimizers`, `stax`
    "jax.experimental.sharding": ("jax.sharding",),
    "jax.experimental.pjit": ("jax.lax",),  # `with_sharding_constraint`
    "jax.abstract_arrays": ("jax.core",),
    "jax.pxla": ("jax.interpreters.pxla",),
    "jax.xla": ("jax.interpreters.xla",),
    "jax.linear_util": ("jax.extend.linear_util",),
}
"""Modules whose names JAX moved to other modules (a name is taken there only
when the installed JAX has it there)."""

WHOLE = frozenset({"jax.experimental.sharding", "jax.pxla", "jax.xla", "jax.linear_util"})
"""Moved modules that live on whole under their new name (`from
jax.experimental import sharding` is `from jax import sharding`)."""

RENAMED: dict[str, str] = {
    "MeshPspecSharding": "NamedSharding",
    "tree_multimap": "tree_map",
}
"""Names JAX gave a new name, with the same meaning."""

PRIVATE_HELPERS: dict[str, str] = {"prod": "math.prod"}
"""Helpers of JAX's private modules that Python's standard library has."""

_USE = re.compile(r"\b[Uu]se `?((?:jax|jaxlib)(?:\.\w+)+)")


def _private(module: str) -> bool:
  return any(p.startswith("_") for p in module.split(".")[1:])


@functools.cache
def _class_homes() -> dict[str, list[tuple[str, type]] | None]:
  """Class name -> [(public home, the class)], from every public JAX module
  this process has imported (a module path with no part starting with `_`)
  and `jax.extend`'s (JAX's public home for classes its internals define);
  None where two homes hold different classes under one name. Deprecated
  exports are not homes: they live in a module's `_deprecations`, not in
  its namespace."""
  _jaxnames.has("jax.extend.core")  # imports `jax.extend` and its modules
  found: dict[str, list[tuple[str, type]] | None] = {}
  for module, mod in list(sys.modules.items()):
    if (not isinstance(mod, types.ModuleType) or module.split(".")[0] != "jax"
        or any(p.startswith("_") for p in module.split("."))):
      continue
    for name, value in list(vars(mod).items()):
      if (not isinstance(value, type) or name.startswith("_")
          or (value.__module__ or "").split(".")[0] not in _jaxnames.ROOTS):
        continue
      homes = found.setdefault(name, [])
      if homes is not None and homes and homes[0][1] is not value:
        found[name] = None
      elif homes is not None:
        homes.append((f"{module}.{name}", value))
  return found


def _class_home(module: str, name: str) -> str | None:
  """The public home of the class `name` once in `module`: the one in a module
  named like a part of `module` (a private `sharding_impls` -> `jax.sharding`),
  else the one with the fewest dots."""
  homes = _class_homes().get(name)
  if not homes:
    return None
  parts = [p.lstrip("_") for p in module.split(".")[1:]]

  def rank(home: str) -> tuple[bool, int, str]:
    where = home.split(".")[-2]
    return not any(p.startswith(where) for p in parts), home.count("."), home
  return min((h for h, _ in homes), key=rank)


def _deprecations(module: str) -> dict:
  mod = sys.modules.get(module)
  table = vars(mod).get("_deprecations") if mod is not None else None
  return table if isinstance(table, dict) else {}


def removal_note(symbol: str) -> str | None:
  """JAX's own note on a name it deprecated or removed, if it kept one."""
  module, _, name = symbol.rpartition(".")
  entry = _deprecations(module).get(name)
  if not entry or not isinstance(entry[0], str):
    return None
  return " ".join(entry[0].split())


def _from_note(module: str, name: str) -> str | None:
  note = removal_note(f"{module}.{name}")
  for target in _USE.findall(note or ""):
    target = target.rstrip(".")
    if target.rpartition(".")[2] == name and _usable(target):
      return target
  return None


def _usable(symbol: str) -> bool:
  """The installed JAX surely has `symbol`, and not as a deprecated name."""
  module, _, name = symbol.rpartition(".")
  return _jaxnames.has(symbol, loaded=True) and name not in _deprecations(module)


def _name_home(module: str, name: str) -> str | None:
  """Where `module.name` (which the installed JAX lacks) lives today. A
  private module's names go to their public home first."""
  new = RENAMED.get(name, name)
  same = f"{module}.{new}" if new != name and _usable(f"{module}.{new}") else None
  if same is not None and not _private(module):
    return same
  for target in MOVED.get(module, ()):
    if _usable(f"{target}.{new}"):
      return f"{target}.{new}"
  if _private(module) and name in PRIVATE_HELPERS:
    return PRIVATE_HELPERS[name]
  return _class_home(module, new) or same or _from_note(module, name)


def under_new_name(symbol: str) -> str:
  """`symbol` with a module JAX moved whole written under its new name (whether
  or not the name is there)."""
  for module in WHOLE:
    if symbol == module or symbol.startswith(module + "."):
      return MOVED[module][0] + symbol[len(module):]
  return symbol


def first_missing(symbol: str) -> int:
  """How many parts of `symbol` the installed JAX has (all: its length)."""
  parts = symbol.split(".")
  for n in range(2, len(parts) + 1):
    if not _jaxnames.has(".".join(parts[:n])):
      return n - 1
  return len(parts)


@functools.cache
def home(symbol: str) -> tuple[str, str] | None:
  """(the prefix of `symbol` to replace, what replaces it) when the installed
  JAX lacks `symbol` and has it under another name, else None."""
  parts = symbol.split(".")
  if parts[0] not in _jaxnames.ROOTS:
    return None
  have = first_missing(symbol)
  if have == len(parts):
    return None
  missing = ".".join(parts[:have + 1])
  if missing in WHOLE:  # the module under its new name, and a name moved again inside it
    target, rest = MOVED[missing][0], parts[have + 1:]
    if _jaxnames.has(".".join([target, *rest])):
      return missing, target
    inner = home(".".join([target, *rest]))
    if inner is None:
      return None
    used = len(inner[0].split(".")) - len(target.split("."))
    return ".".join(parts[:have + 1 + used]), inner[1]
  # The missing part itself, else (a module gone) the name after it.
  tries = [(missing, ".".join(parts[:have]), parts[have])]
  if have + 1 < len(parts):
    tries.append((".".join(parts[:have + 2]), missing, parts[have + 1]))
  if missing in MOVED:
    tries.reverse()
  for prefix, module, name in tries:
    found = _name_home(module, name)
    if found is not None and _settled(found, parts[len(prefix.split(".")):]):
      return prefix, found
  return None


def _settled(new: str, rest: list[str]) -> bool:
  """`new` with `rest` appended exists, or its first missing part has a home."""
  full = ".".join([new, *rest])
  if new.split(".")[0] not in _jaxnames.ROOTS or _jaxnames.has(full):
    return True
  return home(full) is not None
