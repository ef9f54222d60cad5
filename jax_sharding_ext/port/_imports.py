"""Import statements: their findings, and the rewrite of those this package replaces.

For each `import` / `from ... import` statement, `plan_import` returns the
findings of its names and, when some of them move to this package, the
statements that replace it: one per target module, in the order the names
came, each keeping the names as the code spells them (aliases too); the names
that stay keep the original module.
"""

from __future__ import annotations

import dataclasses

import libcst as cst
from libcst.helpers import get_full_name_for_node

from jax_sharding_ext.port import _names, _reports, _rules


@dataclasses.dataclass
class Note:
  """A finding before it has a path: the node it points at, code and message."""
  node: cst.CSTNode
  code: str
  message: str


@dataclasses.dataclass
class Plan:
  """The outcome for one import statement."""
  notes: list[Note] = dataclasses.field(default_factory=list)
  # (module or None for a plain `import`, aliases) per replacement statement;
  # empty when the statement stays as it is.
  groups: list[tuple[str | None, list[cst.ImportAlias]]] = dataclasses.field(default_factory=list)
  # local name -> (GDA-era symbol it was bound to, this package's symbol)
  redirects: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def import_text(module: str, name: str, asname: str | None) -> str:
  alias = f" as {asname}" if asname and asname != name else ""
  return f"from {module} import {name}{alias}"


def _asname(alias: cst.ImportAlias) -> str | None:
  return alias.asname.name.value if alias.asname is not None else None  # type: ignore[union-attr]


def report_note(node: cst.CSTNode, symbol: str, shown: str) -> Note | None:
  """The finding for a name no import rewrite fixes, or None."""
  module, _, name = symbol.rpartition(".")
  package_module = _rules.replaced_module(module)
  if package_module is not None and _rules.is_gone_module(module):
    return Note(node, "JSE307", _reports.JSE307_MISSING.format(
        shown=shown, module=package_module, name=name))
  found = _reports.report_for(symbol)
  if found is None:
    return None
  return Note(node, found[1].code, _reports.render(found[0], found[1], shown))


def _choose_targets(fixes: list[_rules.Fix]) -> list[str]:
  """One target module per name of a statement: the first that all the names
  have in common (so that they stay in one import), else each name's own first."""
  common = [t for t in fixes[0].targets if all(t in f.targets for f in fixes)]
  return [common[0] if common else f.targets[0] for f in fixes]


def _fix_note(alias: cst.ImportAlias, fix: _rules.Fix, target: str, name: str) -> Note:
  text = import_text(target, name, _asname(alias))
  return Note(alias, fix.code, f"{fix.why}; use `{text}`{_rules.WRITE}")


def plan_import_from(node: cst.ImportFrom) -> Plan:
  plan = Plan()
  if node.relative or node.module is None:
    return plan
  module = get_full_name_for_node(node.module) or ""
  if module == "jax.config":
    plan.notes.append(Note(node.module, "JSE309", _reports.JSE309))
    return plan
  if isinstance(node.names, cst.ImportStar):
    note = report_note(node.module, module, module)
    plan.notes.extend([note] if note is not None else [])
    return plan
  fixes, kept = [], []
  for alias in node.names:
    symbol = f"{module}.{get_full_name_for_node(alias.name)}"
    fix = _rules.fix_for(symbol)
    if fix is None:
      kept.append(alias)
      note = report_note(alias, symbol, symbol)
      plan.notes.extend([note] if note is not None else [])
    else:
      fixes.append((alias, fix))
  if not fixes:
    return plan
  by_module: dict[str, list[cst.ImportAlias]] = {}
  for (alias, fix), target in zip(fixes, _choose_targets([f for _a, f in fixes]),
                                 strict=True):
    name = get_full_name_for_node(alias.name) or ""
    plan.notes.append(_fix_note(alias, fix, target, name))
    plan.redirects[_asname(alias) or name] = (f"{module}.{name}", f"{target}.{name}")
    by_module.setdefault(target, []).append(alias)
  kept = _ride_along(module, kept, by_module, plan)
  if kept:
    by_module[module] = kept
  order = {id(a): i for i, a in enumerate(node.names)}
  for aliases in by_module.values():
    aliases.sort(key=lambda a: order[id(a)])
  plan.groups = sorted(by_module.items(), key=lambda g: order[id(g[1][0])])
  return plan


def _ride_along(module: str, kept: list[cst.ImportAlias],
                by_module: dict[str, list[cst.ImportAlias]], plan: Plan) -> list[cst.ImportAlias]:
  """Where this package's module replaces `module` whole and some names already
  move to it, the others it also has (stock's own objects, such as
  `sync_global_devices`) move with them rather than split the import."""
  package_module = _rules.replaced_module(module)
  if package_module not in by_module:
    return kept
  stay = []
  for alias in kept:
    name = get_full_name_for_node(alias.name) or ""
    if name in _names.provided(package_module):
      by_module[package_module].append(alias)
      plan.redirects[_asname(alias) or name] = (f"{module}.{name}", f"{package_module}.{name}")
    else:
      stay.append(alias)
  return stay


def plan_import(node: cst.Import) -> Plan:
  plan = Plan()
  groups: dict[str | None, list[cst.ImportAlias]] = {}
  for alias in node.names:
    symbol = get_full_name_for_node(alias.name) or ""
    fix = _rules.fix_for(symbol) if alias.asname is not None else None
    if fix is None:
      groups.setdefault(None, []).append(alias)
      note = _bare_import_note(alias, symbol)
      if note is not None:
        plan.notes.append(note)
      continue
    target, name = fix.targets[0], symbol.rpartition(".")[2]
    plan.notes.append(_fix_note(alias, fix, target, name))
    plan.redirects[_asname(alias) or name] = (symbol, f"{target}.{name}")
    groups.setdefault(target, []).append(
        alias.with_changes(name=cst.Name(name), comma=cst.MaybeSentinel.DEFAULT))
  if any(m is not None for m in groups):
    plan.groups = list(groups.items())
  return plan


def _bare_import_note(alias: cst.ImportAlias, symbol: str) -> Note | None:
  """`import a.b.c` binds `a`: uses through it stay out of reach of a rewrite."""
  if symbol == "jax.config":
    return Note(alias, "JSE309", _reports.JSE309)
  package_module = _rules.replaced_module(symbol)
  if package_module is not None and _rules.is_gone_module(symbol):
    parent, _, name = package_module.rpartition(".")
    why = _rules.fix_for(symbol).why  # type: ignore[union-attr]
    return Note(alias, "JSE306", _reports.JSE306.format(
        shown=f"import {symbol}", why=why, import_=import_text(parent, name, None), name=name))
  return report_note(alias, symbol, symbol)
