"""What the porting tool knows: GDA-era JAX names, and what each became.

A *symbol* is a dotted name as the code reaches it, e.g.
`jax.experimental.pjit.FROM_GDA` for `pjit_lib.FROM_GDA` after
`from jax.experimental import pjit as pjit_lib`.

- `fix_for(symbol)`: the import that replaces `from M import N` (or
  `import M as X`) for a GDA-era symbol `M.N`, pointing at this package or at
  today's JAX.
- `rename_for(symbol)`: the symbol that replaces a GDA-era one wherever the
  code reaches it through a module attribute (`maps.Mesh` becomes
  `jax.sharding.Mesh`); the longest matching prefix wins.
- `_reports.report_for(symbol)`: the finding for a symbol nothing replaces
  with the same meaning.

Replacements follow JAX's jax.Array migration guide
(https://docs.jax.dev/en/latest/jax_array_migration.html) and JAX's changelog.
"""

from __future__ import annotations

import dataclasses

from jax_sharding_ext._jax import private_names
from jax_sharding_ext.port import _names

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
for _old in ("jax.experimental.PartitionSpec", "jax.experimental.pjit.PartitionSpec",
             "jax.interpreters.pxla.PartitionSpec", "jax.experimental.maps.Mesh",
             "jax.interpreters.pxla.Mesh"):
  _name = _old.rpartition(".")[2]
  _NAME_FIXES[_old] = ("JSE104", (PKG,), f"`{_old}` was removed from JAX (today "
                       f"`jax.sharding.{_name}`, the same class as `{PKG}.{_name}`)", True)

_TREE = ("tree_map", "tree_flatten", "tree_leaves", "tree_unflatten", "tree_structure",
         "tree_transpose", "tree_reduce", "tree_all")

# Removed or moved names and the same-meaning name today: symbol -> (code, new symbol).
# A key also stands for its members (`jax.experimental.sharding.X`).
RENAMES: dict[str, tuple[str, str]] = {
    **{f"jax.{old}": ("JSE301", f"jax.tree_util.{old}") for old in _TREE},
    "jax.tree_multimap": ("JSE301", "jax.tree_util.tree_map"),
    "jax.tree_util.tree_multimap": ("JSE301", "jax.tree_util.tree_map"),
    "jax.config.config": ("JSE309", "jax.config"),
    "jax.experimental.maps.Mesh": ("JSE306", "jax.sharding.Mesh"),
    "jax.interpreters.pxla.Mesh": ("JSE306", "jax.sharding.Mesh"),
    "jax.experimental.PartitionSpec": ("JSE306", "jax.sharding.PartitionSpec"),
    "jax.experimental.pjit.PartitionSpec": ("JSE306", "jax.sharding.PartitionSpec"),
    "jax.interpreters.pxla.PartitionSpec": ("JSE306", "jax.sharding.PartitionSpec"),
    "jax.experimental.pjit.with_sharding_constraint": (
        "JSE306", "jax.lax.with_sharding_constraint"),
    "jax.experimental.pjit.pjit": ("JSE305", f"{PKG}.pjit"),
    "jax.experimental.pjit.FROM_GDA": ("JSE306", f"{PKG}.FROM_GDA"),
    "jax.experimental.sharding": ("JSE307", "jax.sharding"),
    "jax.experimental.sharding.MeshPspecSharding": ("JSE307", "jax.sharding.NamedSharding"),
    "jax.sharding.MeshPspecSharding": ("JSE307", "jax.sharding.NamedSharding"),
    **{old: ("JSE307", "jax.sharding.NamedSharding") for old in private_names.MESH_PSPEC_SHARDING},
    "jax.pxla": ("JSE307", "jax.interpreters.pxla"),
    private_names.UTIL_PROD: ("JSE307", "math.prod"),
    GDA_MODULE: ("JSE306", f"{PKG}.global_device_array"),
    SER_MODULE: ("JSE306", f"{PKG}.serialization"),
}
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
  return None


def rename_for(symbol: str) -> tuple[str, str, str] | None:
  """(code, the matched prefix of `symbol`, what replaces that prefix) for a
  symbol reached through a module attribute, or None."""
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
