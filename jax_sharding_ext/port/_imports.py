"""Import statements: their findings, and what `--write` makes of each (planned on `ast`).

For each `import` / `from ... import` statement, `plan_import` returns the
findings of its names and, when some of them move, the statements that
replace it: one per target module, in the order the names came, each keeping
the names as the code spells them (aliases too; a renamed name keeps its
local name with `as`); the names that stay keep the original module. A name
listed in `drop` (an import of a removed module that nothing uses once the
rewrites are done) is left out; a plain `import a.b.c` listed there becomes
`import a`.
"""

from __future__ import annotations

import ast
import dataclasses

from jax_sharding_ext.port import _jaxnames, _moves, _names, _reports, _rules


@dataclasses.dataclass
class Note:
  """A finding before it has a path: the node it points at (or an explicit
  (line, byte column)), code, message, and whether `--write` fixes it."""
  node: ast.AST | None
  code: str
  message: str
  fixable: bool = False
  pos: tuple[int, int] | None = None


@dataclasses.dataclass
class Plan:
  """The outcome for one import statement."""
  notes: list[Note] = dataclasses.field(default_factory=list)
  # (module, or None for a plain `import`, [(index of the name in the statement,
  # its new name or None)]) per replacement statement.
  groups: list[tuple[str | None, list[tuple[int, str | None]]]] = dataclasses.field(
      default_factory=list)
  changed: bool = False  # no groups and changed: the statement goes
  # local name -> (GDA-era symbol it was bound to, the symbol it is bound to after --write)
  redirects: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def import_text(module: str, name: str, asname: str | None) -> str:
  alias = f" as {asname}" if asname and asname != name else ""
  return f"from {module} import {name}{alias}"


def module_pos(node: ast.ImportFrom, line: str) -> tuple[int, int]:
  """(line, byte column) of the module name of `from M import ...`."""
  col = node.col_offset + len("from")
  raw = line.encode("utf-8")
  while col < len(raw) and raw[col:col + 1] in (b" ", b"\t", b"\\"):
    col += 1
  return node.lineno, col


def _missing(symbol: str) -> str | None:
  """The first prefix of `symbol` the installed JAX lacks, or None."""
  parts = symbol.split(".")
  if parts[0] not in _jaxnames.ROOTS:
    return None
  have = _moves.first_missing(symbol)
  return ".".join(parts[:have + 1]) if have < len(parts) else None


def missing_note(node: ast.AST | None, symbol: str, shown: str) -> Note | None:
  """JSE311 for a name the installed JAX lacks, with JAX's own note on its
  removal when JAX kept one."""
  missing = _missing(symbol)
  if missing is None:
    return None
  moved = _moves.under_new_name(symbol)
  if moved != symbol:  # its module lives on under another name, without it
    found = _reports.report_for(moved)
    if found is not None:
      return Note(node, found[1].code, _reports.render(found[0], found[1], shown))
    missing = _missing(moved) or moved
  message = _reports.JSE311.format(shown=shown, version=_jaxnames.version(), missing=missing)
  name = missing.rpartition(".")[2]
  if name in _reports.OPTIONS:  # the state object of an option this package defines
    return Note(node, "JSE311", f"{message}; `{name}` is an option this package defines: "
                f"read it as `jax.config.{name}`, set it with `jax.config.update({name!r}, "
                "...)` once `jax_sharding_ext` is imported")
  note = _moves.removal_note(missing)
  if note:
    return Note(node, "JSE311", f"{message} (JAX: {note})")
  private = any(p.startswith("_") for p in missing.split(".")[1:])
  return Note(node, "JSE311", message + _reports.JSE311_NO_HOME[
      "private" if private else "public"])


def report_note(node: ast.AST | None, symbol: str, shown: str) -> Note | None:
  """The finding for a name no rewrite fixes, or None."""
  module, _, name = symbol.rpartition(".")
  package_module = _rules.replaced_module(module)
  if package_module is not None and _rules.is_gone_module(module):
    return Note(node, "JSE307", _reports.JSE307_MISSING.format(
        shown=shown, module=package_module, name=name))
  found = _reports.report_for(symbol)
  if found is not None:
    return Note(node, found[1].code, _reports.render(found[0], found[1], shown))
  return missing_note(node, symbol, shown)


def _choose_targets(fixes: list[_rules.Fix]) -> list[str]:
  """One target module per name of a statement: the first that all the names
  have in common (so that they stay in one import), else each name's own first."""
  common = [t for t in fixes[0].targets if all(t in f.targets for f in fixes)]
  return [common[0] if common else f.targets[0] for f in fixes]


def _fix_note(alias: ast.alias, fix: _rules.Fix, target: str, name: str) -> Note:
  new = fix.new_name or name
  asname = alias.asname or (name if new != name else None)
  text = import_text(target, new, asname)
  return Note(alias, fix.code, f"{fix.why}; use `{text}`{_rules.WRITE}", fixable=True)


def _drop_note(alias: ast.alias, note: Note | None, shown: str) -> Note:
  why = note.message if note is not None else f"`{shown}` is not in the installed JAX"
  return Note(alias, note.code if note is not None else "JSE311",
              f"{why}; nothing uses it once the rewrites are made, so --write removes "
              f"this import{_rules.WRITE}", fixable=True)


def _unused_note(alias: ast.alias, shown: str, becomes: str | None = None) -> Note:
  end = f"this line becomes `import {becomes}`" if becomes else "--write removes this import"
  return Note(alias, "JSE110", f"`{shown}`: --write rewrites every use of this import, which "
              f"leaves it unused; {end}{_rules.WRITE}", fixable=True)


def plan_import_from(node: ast.ImportFrom, line: str, drop: frozenset[str] = frozenset(),
                     unused: frozenset[str] = frozenset()) -> Plan:
  """`drop`: the local names to leave out; `unused`: those of them the rewrite
  left unused (the others are removed names nothing uses)."""
  plan = Plan()
  if node.level or not node.module:
    return plan
  module = node.module
  if node.names[0].name == "*":
    note = report_note(None, module, module)
    if note is not None:
      note.pos = module_pos(node, line)
      plan.notes.append(note)
    return plan
  fixes, kept = [], []
  for i, alias in enumerate(node.names):
    symbol = f"{module}.{alias.name}"
    fix = _rules.fix_for(symbol)
    note = report_note(alias, symbol, symbol) if fix is None else None
    if (alias.asname or alias.name) in drop:
      plan.notes.append(_unused_note(alias, symbol) if (alias.asname or alias.name) in unused
                        else _drop_note(alias, note, symbol))
      plan.changed = True
    elif fix is None:
      kept.append(i)
      plan.notes.extend([note] if note is not None else [])
    else:
      fixes.append((i, fix))
  if not fixes and not plan.changed:
    return plan
  by_module: dict[str, list[tuple[int, str | None]]] = {}
  targets = _choose_targets([f for _i, f in fixes]) if fixes else []
  for (i, fix), target in zip(fixes, targets, strict=True):
    alias = node.names[i]
    plan.notes.append(_fix_note(alias, fix, target, alias.name))
    new = fix.new_name or alias.name
    plan.redirects[alias.asname or alias.name] = (f"{module}.{alias.name}", f"{target}.{new}")
    by_module.setdefault(target, []).append((i, fix.new_name))
  kept = _ride_along(node, module, kept, by_module, plan)
  if kept:
    by_module[module] = [(i, None) for i in kept]
  for entries in by_module.values():
    entries.sort()
  plan.groups = sorted(by_module.items(), key=lambda g: g[1][0][0])
  plan.changed = True
  return plan


def _ride_along(node: ast.ImportFrom, module: str, kept: list[int],
                by_module: dict[str, list[tuple[int, str | None]]], plan: Plan) -> list[int]:
  """Where this package's module replaces `module` whole and some names already
  move to it, the others it also has (stock's own objects, such as
  `sync_global_devices`) move with them rather than split the import."""
  package_module = _rules.replaced_module(module)
  if package_module not in by_module:
    return kept
  stay = []
  for i in kept:
    alias = node.names[i]
    if alias.name in _names.provided(package_module):
      by_module[package_module].append((i, None))
      plan.redirects[alias.asname or alias.name] = (f"{module}.{alias.name}",
                                                   f"{package_module}.{alias.name}")
    else:
      stay.append(i)
  return stay


def plan_import(node: ast.Import, drop: frozenset[str] = frozenset(),
                unused: frozenset[str] = frozenset(), gone: frozenset[str] = frozenset()
                ) -> Plan:
  """`drop`: the dotted names of plain `import a.b.c` statements to make `import a`,
  and the local names of `import a.b as c` to remove; `unused`: those of them
  the rewrite left unused; `gone`: plain `import a.b.c` the rewrite left
  unused to remove (another import binds `a`)."""
  plan = Plan()
  groups: dict[str | None, list[tuple[int, str | None]]] = {}
  for i, alias in enumerate(node.names):
    symbol = alias.name
    fix = _rules.fix_for(symbol) if alias.asname is not None else None
    if fix is None:
      note = _bare_import_note(alias, symbol)
      if alias.asname is not None and alias.asname in drop:
        plan.notes.append(_unused_note(alias, symbol) if alias.asname in unused
                          else _drop_note(alias, note, symbol))
        plan.changed = True
        continue
      if alias.asname is None and symbol in gone:
        plan.notes.append(_unused_note(alias, symbol))
        plan.changed = True
        continue
      if alias.asname is None and symbol in drop:
        root = symbol.partition(".")[0]
        if symbol in unused:
          plan.notes.append(_unused_note(alias, symbol, root))
        else:
          plan.notes.append(Note(alias, note.code if note else "JSE311", (
              f"{note.message if note else f'`{symbol}` is not in the installed JAX'}; "
              f"--write rewrites its uses and this line to `import {root}`{_rules.WRITE}"),
              fixable=True))
        groups.setdefault(None, []).append((i, root))
        plan.changed = True
        continue
      groups.setdefault(None, []).append((i, None))
      plan.notes.extend([note] if note is not None else [])
      continue
    target, name = fix.targets[0], symbol.rpartition(".")[2]
    plan.notes.append(_fix_note(alias, fix, target, name))
    new = fix.new_name or name
    plan.redirects[alias.asname] = (symbol, f"{target}.{new}")  # type: ignore[index]
    groups.setdefault(target, []).append((i, fix.new_name))
    plan.changed = True
  if plan.changed:
    plan.groups = list(groups.items())
  return plan


def _bare_import_note(alias: ast.alias, symbol: str) -> Note | None:
  """`import a.b.c` binds `a`; its uses are judged one by one."""
  if symbol == "jax.config":
    return Note(alias, "JSE309", _reports.JSE309)
  return report_note(alias, symbol, symbol)
