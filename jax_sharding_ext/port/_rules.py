"""What the porting tool knows: GDA-era JAX names, and what each became.

A *symbol* is a dotted name as the code reaches it, e.g.
`jax.experimental.pjit.FROM_GDA` for `pjit_lib.FROM_GDA` after
`from jax.experimental import pjit as pjit_lib`.

- `fix_for(symbol)`: the import that replaces `from M import N` (or
  `import M as X`) for a GDA-era symbol `M.N`, pointing at this package or at
  today's JAX.
- `rename_for(symbol)`: the symbol that replaces a GDA-era one wherever the
  code reaches it through a module attribute (`maps.Mesh` becomes
  `jax.sharding.Mesh`).
- `_reports.report_for(symbol)`: the finding for a symbol nothing replaces
  with the same meaning.

The replacements come from rules, in this order: this package's modules
that stand for whole GDA-era modules (`global_device_array`,
`serialization`, `multihost_utils`) and its legacy `pjit`; a name the
installed JAX lacks that this package provides (`FROM_GDA`,
`parallel_functions_output_gda`, `Mesh` imported by name); then where JAX
moved the name (`_moves`: module moves, renamed classes, a class's public
home in the installed JAX).
"""

from __future__ import annotations

import dataclasses
import sys

from jax_sharding_ext.port import _jaxnames, _moves, _names

PKG = "jax_sharding_ext"
GDA_MODULE = "jax.experimental.global_device_array"
SER_MODULE = "jax.experimental.gda_serialization.serialization"
MHU_MODULE = "jax.experimental.multihost_utils"
WRITE = " (--write fixes this)"


@dataclasses.dataclass(frozen=True)
class Fix:
  """An import that can point elsewhere: the modules that provide the name (most
  preferred first), and the name there when it changed."""
  code: str
  targets: tuple[str, ...]
  why: str                  # what changed, for the message
  gone: bool = True         # False: the symbol still exists in today's JAX
  new_name: str | None = None


@dataclasses.dataclass(frozen=True)
class Report:
  """A finding that no rewrite fixes. `message` may use `{shown}`."""
  code: str
  message: str
  gone: bool = True  # False: the symbol exists today but means something else


# Whole modules this package replaces: (code, this package's module, why, gone).
_MODULE_FIXES = {
    GDA_MODULE: ("JSE102", f"{PKG}.global_device_array",
                 "module `jax.experimental.global_device_array` was removed from JAX", True),
    SER_MODULE: ("JSE106", f"{PKG}.serialization",
                 "`jax.experimental.gda_serialization` was removed from JAX (this package's "
                 "`serialization` needs `pip install 'jax-sharding-ext[checkpoint]'`)", True),
    MHU_MODULE: ("JSE105", f"{PKG}.multihost_utils",
                 "stock `multihost_utils` does not treat a GDA as one global array "
                 "(its `process_allgather` stacks per-process values)", False),
}

# Single names imported from their GDA-era module: symbol -> (code, targets, why, gone).
_NAME_FIXES = {
    "jax.experimental.pjit.pjit": (
        "JSE103", (PKG,), "stock `jax.experimental.pjit.pjit` no longer takes "
        "`in_axis_resources` / `out_axis_resources` / `FROM_GDA`", False),
    "jax.experimental.pjit.FROM_GDA": (
        "JSE103", (PKG,), "`jax.experimental.pjit.FROM_GDA` was removed from JAX", True),
    "jax.experimental.pjit.with_sharding_constraint": (
        "JSE107", ("jax.lax",), "`jax.experimental.pjit.with_sharding_constraint` moved", True),
}
# Package names that replace GDA-era JAX symbols reached through a module
# attribute (the legacy `pjit` is still in JAX, as a deprecated stub).
RENAMES: dict[str, tuple[str, str]] = {
    "jax.config.config": ("JSE309", "jax.config"),
    "jax.experimental.pjit.pjit": ("JSE305", f"{PKG}.pjit"),
    "jax.experimental.pjit.FROM_GDA": ("JSE306", f"{PKG}.FROM_GDA"),
    GDA_MODULE: ("JSE306", f"{PKG}.global_device_array"),
    SER_MODULE: ("JSE306", f"{PKG}.serialization"),
}
# The GDA-era modules of sharding code: a name moved out of one is JSE306.
_GDA_ERA = ("jax.experimental.maps", "jax.experimental.pjit", "jax.interpreters.pxla",
            "jax.experimental")
# Modules whose attributes need the module imported by name (not imported by
# `import jax_sharding_ext`).
_OWN_IMPORT = (f"{PKG}.serialization", f"{PKG}.orbax_support")


def fix_for(symbol: str) -> Fix | None:
  """The fix for importing `symbol` by name, if this package or today's JAX has it."""
  if symbol in _MODULE_FIXES:
    code, target, why, gone = _MODULE_FIXES[symbol]
    return Fix(code, (target.rpartition(".")[0],), why, gone)
  if symbol in _NAME_FIXES:
    code, targets, why, gone = _NAME_FIXES[symbol]
    return Fix(code, targets, why, gone)
  module, _, name = symbol.rpartition(".")
  if module == GDA_MODULE and name in _names.provided(f"{PKG}.global_device_array"):
    top = (PKG,) if name in _names.provided(PKG) else ()
    return Fix("JSE101", (*top, f"{PKG}.global_device_array"),
               f"`{symbol}` was removed from JAX")
  if module == SER_MODULE and name in _names.provided(f"{PKG}.serialization"):
    return Fix("JSE106", (f"{PKG}.serialization",), _MODULE_FIXES[SER_MODULE][2])
  if module == MHU_MODULE and name in _names.own_functions(f"{PKG}.multihost_utils"):
    return Fix("JSE105", (f"{PKG}.multihost_utils",),
               f"stock `{name}` does not treat a GDA as one global array", False)
  if symbol in RENAMES:
    code, new = RENAMES[symbol]
    new_module, _, new_name = new.rpartition(".")
    return Fix(code, (new_module,), f"`{symbol}` was removed from JAX (today `{new}`)",
               new_name=None if new_name == name else new_name)
  if module in _MODULE_FIXES or not _gone(symbol):
    return None
  moved = _moves.home(symbol)
  if moved is None:
    if name in _names.public(PKG):
      return Fix("JSE109", (PKG,), f"`{symbol}` was removed from JAX; this package has "
                 f"`{name}`")
    return None
  new = moved[1] + symbol[len(moved[0]):]
  new_module, _, new_name = new.rpartition(".")
  if new_name == name and _jaxnames.value(new) is _ours(name):  # JAX's class, ours too
    return Fix("JSE104", (PKG, new_module), f"`{symbol}` was removed from JAX (today "
               f"`{new}`, the same class as `{PKG}.{name}`)")
  return Fix(_move_code(moved[0], new), (new_module,),
             f"`{symbol}` was removed from JAX (today `{new}`)",
             new_name=None if new_name == name else new_name)


def _gone(symbol: str) -> bool:
  return symbol.split(".")[0] in _jaxnames.ROOTS and not _jaxnames.has(symbol)


def _ours(name: str) -> object:
  """This package's top-level `name` (the package is imported: the tool is in it)."""
  return getattr(sys.modules.get(PKG), name, None) if name in _names.public(PKG) else None


def _move_code(prefix: str, new: str) -> str:
  """The code of a name JAX moved, by what it is."""
  if new.startswith("jax.tree_util."):
    return "JSE301"
  if new.rpartition(".")[2] == "ShapedArray":
    return "JSE304"
  gda_era = prefix.rpartition(".")[0] in _GDA_ERA and prefix not in _moves.WHOLE
  return "JSE306" if gda_era else "JSE307"


def rename_for(symbol: str) -> tuple[str, str, str] | None:
  """(code, the matched prefix of `symbol`, what replaces that prefix) for a
  symbol reached through a module attribute, or None."""
  found = _package_rename(symbol)
  if found is not None or not _gone(symbol) or any(
      symbol.startswith(m + ".") for m in _MODULE_FIXES):
    return found
  moved = _moves.home(symbol)
  if moved is None:
    return _provided_rename(symbol)
  return _move_code(moved[0], moved[1]), moved[0], moved[1]


def _provided_rename(symbol: str) -> tuple[str, str, str] | None:
  """The first missing part of `symbol`, when this package provides that name."""
  parts = symbol.split(".")
  prefix = ".".join(parts[:_moves.first_missing(symbol) + 1])
  name = prefix.rpartition(".")[2]
  if name in _names.public(PKG):
    return "JSE109", prefix, f"{PKG}.{name}"
  return None


def _package_rename(symbol: str) -> tuple[str, str, str] | None:
  parts = symbol.split(".")
  for n in range(len(parts), 1, -1):
    prefix = ".".join(parts[:n])
    if prefix in RENAMES:
      code, new = RENAMES[prefix]
      if prefix in (GDA_MODULE, SER_MODULE):
        module = new
        if n == len(parts) or parts[n] not in _names.provided(module):
          return None
      return code, prefix, new
    if prefix == MHU_MODULE and n < len(parts) and parts[n] in _names.own_functions(
        f"{PKG}.multihost_utils"):
      return "JSE203", prefix, f"{PKG}.multihost_utils"
  return None


def import_for(symbol: str) -> str:
  """The module to import so that `symbol` can be reached from its top-level name."""
  for module in _OWN_IMPORT:
    if symbol == module or symbol.startswith(module + "."):
      return module
  return symbol.partition(".")[0]


def replaced_module(symbol: str) -> str | None:
  """This package's module standing for a whole GDA-era module, or None."""
  return _MODULE_FIXES[symbol][1] if symbol in _MODULE_FIXES else None


def package_modules() -> frozenset[str]:
  """This package's modules that stand for whole GDA-era modules."""
  return frozenset(m for _c, m, _w, _g in _MODULE_FIXES.values())


def module_why(symbol: str) -> str:
  """Why this package replaces the whole module `symbol`."""
  return _MODULE_FIXES[symbol][2]


def is_gone_module(symbol: str) -> bool:
  """True for a whole module this package replaces that today's JAX no longer has."""
  return symbol in _MODULE_FIXES and _MODULE_FIXES[symbol][3]
