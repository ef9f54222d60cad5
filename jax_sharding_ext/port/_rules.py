"""What the porting tool knows: GDA-era JAX names, and what each became.

A *symbol* is a dotted name as the code reaches it, e.g.
`jax.experimental.pjit.FROM_GDA` for `pjit_lib.FROM_GDA` after
`from jax.experimental import pjit as pjit_lib`.

- `fix_for(symbol)`: where this package provides a GDA-era symbol, the
  `JSE1xx` code and the modules an import of it can point to instead.
- `report_for(symbol)`: the `JSE2xx` / `JSE3xx` finding for a symbol that no
  import rewrite fixes (the longest matching key of `REPORTS` wins).

Replacements follow JAX's jax.Array migration guide
(https://docs.jax.dev/en/latest/jax_array_migration.html) and JAX's changelog.
"""

from __future__ import annotations

import dataclasses

from jax_sharding_ext.port import _names

PKG = "jax_sharding_ext"
GDA_MODULE = "jax.experimental.global_device_array"
SER_MODULE = "jax.experimental.gda_serialization.serialization"
MHU_MODULE = "jax.experimental.multihost_utils"
WRITE = " (--write fixes this)"


@dataclasses.dataclass(frozen=True)
class Fix:
  """An import that can point at this package (or, for one name, `jax.lax`)."""
  code: str
  targets: tuple[str, ...]  # modules providing the name, most preferred first
  why: str                  # what changed, for the message
  gone: bool = True         # False: the symbol still exists in today's JAX


@dataclasses.dataclass(frozen=True)
class Report:
  """A finding that no import rewrite fixes. `message` may use `{shown}`."""
  code: str
  message: str
  gone: bool = True  # False: the symbol exists today but means something else


# Whole modules this package replaces: (code, this package's module, why).
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

# Single names: symbol -> (code, target modules, why).
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


def fix_for(symbol: str) -> Fix | None:
  """The fix for importing `symbol`, if this package (or `jax.lax`) provides it."""
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
  return None


def replaced_module(symbol: str) -> str | None:
  """This package's module standing for a whole GDA-era module, or None."""
  return _MODULE_FIXES[symbol][1] if symbol in _MODULE_FIXES else None


def package_modules() -> frozenset[str]:
  """This package's modules that stand for whole GDA-era modules."""
  return frozenset(m for _c, m, _w, _g in _MODULE_FIXES.values())


def is_gone_module(symbol: str) -> bool:
  """True for a whole module this package replaces that today's JAX no longer has."""
  return symbol in _MODULE_FIXES and _MODULE_FIXES[symbol][3]
