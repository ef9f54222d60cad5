"""The rules on values rather than names: calls, `with` items, decorators, attributes.

- `jax.config.update("jax_array", ...)` / reads of the options this package
  defines: the package import is added when the module has none.
- `with mesh:` becomes `with jax.set_mesh(mesh):` (`with mesh as m:` becomes
  `with jax.set_mesh(m := mesh):`, as `jax.set_mesh` enters to None) where
  every value that can reach `mesh` is a `Mesh` (`_kinds`). It is reported,
  and left, where only some may be, and where a value may be one that
  nothing in the files of the run says anything of: it is named like a mesh
  (`mesh`, `self.global_mesh`), or a function they do not define that is
  named like a mesh maker made it (`get_mesh()` of another package). A value
  of Python's standard library (`threading.Lock()`) is no `Mesh`.
  A `maps.mesh(devices, names)` call becomes
  `jax.set_mesh(jax.sharding.Mesh(devices, names))`.
- `with_sharding_constraint(..., axis_resources=...)`: the keyword is `shardings`.
- `x.device_buffers` becomes `[s.data for s in x.addressable_shards]`,
  `x.device_buffer` `x.addressable_data(0)`, `x.device()` `x.device` (unless
  the module defines such a member itself); `x._device_buffers` and a `Mesh`
  used as a decorator are reported; the other attributes of removed and GDA
  arrays are `_arrays`'.
- GDA-era code using today's orbax gets `import jax_sharding_ext.orbax_support`
  (not code that imports a copy of orbax the project holds: a folder with
  orbax's own `checkpoint` package, whatever its name says).
"""

from __future__ import annotations

import ast
import os
import re
from typing import cast

from jax_sharding_ext.port import _arrays, _kinds, _reports, _rules, _scope
from jax_sharding_ext.port._context import Context
from jax_sharding_ext.port._source import Edit
from jax_sharding_ext.port._source import shown as _shown_text

WATCHED = frozenset({"device_buffers", "device_buffer", "_device_buffers"})
_MESH_NAME = re.compile(r"(^|_)mesh$", re.IGNORECASE)
_WSC = frozenset({"jax.lax.with_sharding_constraint",
                  "jax.experimental.pjit.with_sharding_constraint"})
_MAPS_MESH = "jax.experimental.maps.mesh"
# The calls `_imported_call` judges, by symbol.
_CALLS = frozenset({*(f"{o}.{m}" for o in _reports.CONFIG_OBJECTS for m in ("update", "read")),
                    *_WSC, _MAPS_MESH})
_GDA_CLASSES = frozenset({f"{_rules.PKG}.GlobalDeviceArray",
                          f"{_rules.PKG}.global_device_array.GlobalDeviceArray",
                          f"{_rules.GDA_MODULE}.GlobalDeviceArray"})


def option(ctx: Context, node: ast.AST, name: str, how: str) -> None:
  """A config option this package defines, or one JAX removed, read or set."""
  if name in _reports.OPTIONS:
    if ctx.imports_package():
      return
    code, template = ("JSE202", _reports.JSE202) if how == "update" else (
        "JSE201", _reports.JSE201)
    ctx.note(node, code, template.format(shown=ctx.shown(node), option=name,
                                         why=_reports.OPTIONS[name]),
             [], (_rules.PKG,))
  elif name in _reports.REMOVED_OPTIONS:
    code, template = _reports.REMOVED_OPTIONS[name]
    ctx.note(node, code, template.format(shown=ctx.shown(node)))


def _call(ctx: Context, call: ast.Call, scope: _scope.Scope) -> None:
  root = call.func
  while isinstance(root, ast.Attribute):
    root = root.value
  if isinstance(root, ast.Name) and root.id in ctx.walk.imported:  # else no JAX symbol
    _imported_call(ctx, call, scope)
  func = call.func
  if (isinstance(func, ast.Attribute) and func.attr == "device" and not call.args
      and not call.keywords and "device" not in ctx.walk.defined
      and not _imported_base(ctx, func, scope)):
    new = ctx.shown(func)
    ctx.note(call, "JSE313", _reports.JSE313.format(shown=ctx.shown(call), new=new),
             [Edit(ctx.text.end(func), ctx.text.end(call), "")])
  if (len(call.args) == 1 and not call.keywords and _mesh_value(ctx, func, scope)):
    mesh = ctx.shown(func)
    ctx.note(call, "JSE206", _reports.JSE206.format(
        shown=ctx.shown(call), arg=ctx.shown(call.args[0]), mesh=mesh))


def _imported_call(ctx: Context, call: ast.Call, scope: _scope.Scope) -> None:
  """A call of something an import binds: a config option read or set,
  `with_sharding_constraint(axis_resources=...)`, `maps.mesh(...)`."""
  for symbol in ctx.symbols(call.func, scope):
    if symbol not in _CALLS:
      continue
    obj, _, method = symbol.rpartition(".")
    if obj in _reports.CONFIG_OBJECTS:
      positional = [a for a in call.args if not isinstance(a, ast.Starred)]
      first = positional[0] if positional else None
      if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value:
        option(ctx, call, first.value, method)
    if symbol in _WSC:
      for kw in call.keywords:
        if kw.arg == "axis_resources":
          start = ctx.text.start(kw)
          ctx.note(call, "JSE310", _reports.JSE310.format(shown=ctx.shown(call.func)),
                   [Edit(start, start + len("axis_resources"), "shardings")])
    if symbol == _MAPS_MESH:
      _maps_mesh(ctx, call, scope)


def _imported_base(ctx: Context, node: ast.expr, scope: _scope.Scope) -> bool:
  parts = _scope.chain(node)
  return parts is not None and bool(ctx.bindings(parts[0], scope))


def _maps_mesh(ctx: Context, call: ast.Call, scope: _scope.Scope) -> None:
  """`maps.mesh(devices, names)`: `jax.set_mesh(jax.sharding.Mesh(devices, names))`."""
  ctx.consumed[id(call.func)] = None
  set_mesh, mesh = ctx.spell("jax.set_mesh", scope), ctx.spell("jax.sharding.Mesh", scope)
  args = ", ".join(ctx.shown(a) for a in [*call.args, *call.keywords])
  new = f"jax.set_mesh(jax.sharding.Mesh({args}))"
  message = _reports.JSE308_CALL.format(shown=ctx.shown(call), new=new)
  if set_mesh is None or mesh is None:
    ctx.note(call, "JSE308", message)
    return
  end = ctx.text.end(call)
  ctx.note(call, "JSE308", message, [
      Edit(ctx.text.start(call.func), ctx.text.end(call.func), f"{set_mesh[0]}({mesh[0]}"),
      Edit(end, end, ")")], set_mesh[1] + mesh[1])
  ctx.consumed[id(call.func)] = ctx.notes[-1]


def _mesh_value(ctx: Context, func: ast.expr, scope: _scope.Scope) -> bool:
  """A value named like a mesh that may hold one (not an imported function such
  as `maps.mesh`, nor a value known to be something else)."""
  last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
  if not _MESH_NAME.search(last):
    return False
  parts = _scope.chain(func)
  if parts is None or any(b.stmt is not None for b in scope.lookup(parts[0])):
    return False
  kinds = _kinds.kinds_of(ctx).of(func, scope)
  return kinds in ({_kinds.MESH}, {_kinds.UNKNOWN}) or (
      bool(kinds) and all(isinstance(k, _kinds.Outside) for k in kinds))


def _with(ctx: Context, item: ast.withitem, scope: _scope.Scope) -> None:
  """`with m:` becomes `with jax.set_mesh(m):` when every value that can reach
  `m` is a `Mesh`; where only some may be, or nothing is known of it, it may be
  reported (`_may_be_a_mesh`)."""
  expr = item.context_expr
  kinds = _kinds.kinds_of(ctx).of(expr, scope)
  if kinds != {_kinds.MESH}:
    _may_be_a_mesh(ctx, item, kinds)
    return
  shown = ctx.shown(expr)
  spelled = ctx.spell("jax.set_mesh", scope)
  target = item.optional_vars
  whole = _with_text(ctx, item)
  if target is None:
    new = f"jax.set_mesh({shown})"
  elif isinstance(target, ast.Name):
    new = f"jax.set_mesh({target.id} := {shown})"
  else:
    new = None
  if new is None or spelled is None:
    ctx.note(expr, "JSE204", _reports.JSE204.format(
        shown=whole, new=new or f"jax.set_mesh({shown})"))
    return
  start, end = ctx.text.start(expr), ctx.text.end(expr)
  if target is None:
    edits = [Edit(start, start, f"{spelled[0]}("), Edit(end, end, ")")]
  else:
    edits = [Edit(start, start, f"{spelled[0]}({cast(ast.Name, target).id} := "),
             Edit(end, ctx.text.end(target), ")")]
  ctx.note(expr, "JSE204", _reports.JSE204.format(
      shown=whole, new=new), edits, spelled[1])


def _may_be_a_mesh(ctx: Context, item: ast.withitem, kinds: frozenset) -> None:
  """Reports a `with` over a value that is a `Mesh` on some paths only, or of which
  nothing is known while its name (or that of the function that made it) says mesh."""
  expr = item.context_expr
  new = f"jax.set_mesh({ctx.shown(expr)})"
  if _kinds.MESH in kinds:
    ctx.note(expr, "JSE204", _reports.JSE204_MAYBE.format(shown=_with_text(ctx, item), new=new))
    return
  outside = sorted(k.name for k in kinds if isinstance(k, _kinds.Outside))
  if any(k in _kinds.UNKNOWNS or isinstance(k, _kinds.Outside) for k in kinds) and (
      outside or _named_mesh(expr)):
    made = (f" (its value comes from `{outside[0]}(...)`, which they do not say either)"
            if outside else "")
    ctx.note(expr, "JSE204", _reports.JSE204_UNKNOWN.format(
        shown=_with_text(ctx, item), value=ctx.shown(expr), made=made, new=new))


def _with_text(ctx: Context, item: ast.withitem) -> str:
  if item.optional_vars is None:
    return ctx.shown(item.context_expr)
  return _shown_text(ctx.text.text[ctx.text.start(item.context_expr):
                                   ctx.text.end(item.optional_vars)])


def _named_mesh(expr: ast.expr) -> bool:
  """A value whose name says it is a mesh (`mesh`, `self.global_mesh`): reported
  when nothing else is known of it, never rewritten on its name alone."""
  parts = _scope.chain(expr)
  return parts is not None and bool(_MESH_NAME.search(parts[-1]))


def _attribute(ctx: Context, node: ast.Attribute) -> None:
  value, shown = ctx.shown(node.value), ctx.shown(node)
  start, value_end, end = ctx.text.start(node), ctx.text.end(node.value), ctx.text.end(node)
  if node.attr == "device_buffers":
    new = f"[s.data for s in {value}.addressable_shards]"
    ctx.note(node, "JSE312", _reports.JSE312.format(shown=shown, attr=node.attr, new=new), [
        Edit(start, start, "[s.data for s in "), Edit(value_end, end, ".addressable_shards]")])
  elif node.attr == "device_buffer":
    new = f"{value}.addressable_data(0)"
    ctx.note(node, "JSE312", _reports.JSE312.format(shown=shown, attr=node.attr, new=new),
             [Edit(value_end, end, ".addressable_data(0)")])
  else:
    ctx.note(node, "JSE205", _reports.JSE205.format(shown=shown, value=value))


def _orbax(ctx: Context) -> None:
  """GDA-era orbax code: a module importing today's orbax that reaches a GDA or
  passes `mesh_axes=`, without `jax_sharding_ext.orbax_support` imported. An
  orbax the project holds itself (a copy of an old orbax, or orbax's own
  source) is not today's: the support module would import today's beside it."""
  module = f"{_rules.PKG}.orbax_support"
  orbax = [s for s in ctx.walk.imports if _imports_orbax(s.node)]
  if not orbax or ctx.imports_package(module) or _internal(ctx):
    return
  found = ctx.project.resolve(ctx.path, "orbax") if ctx.project is not None else None
  if found is not None and _orbax_copy(found):
    return
  gda = any(sym in _GDA_CLASSES for n, _p, s in ctx.walk.uses for sym in ctx.symbols(n, s))
  mesh_axes = any(kw.arg == "mesh_axes" for call, _s in ctx.walk.calls for kw in call.keywords)
  if gda or mesh_axes:
    ctx.note(orbax[0].node, "JSE207", _reports.JSE207.format(module=module), [], (module,))


def _orbax_copy(found: str) -> bool:
  """Whether what `import orbax` finds in the project is a copy of orbax: a
  folder that holds orbax's own `checkpoint` package (Python files in
  `checkpoint/`, or `checkpoint.py`). A folder is not judged by its name: one
  named `orbax` that holds a user's notebooks, or saved checkpoints under
  `checkpoint/`, is not orbax."""
  directory = os.path.dirname(found) if os.path.basename(found) == "__init__.py" else found
  sub = os.path.join(directory, "checkpoint")
  if os.path.isfile(sub + ".py"):
    return True
  try:
    return os.path.isdir(sub) and any(n.endswith(".py") for n in os.listdir(sub))
  except OSError:
    return False


def _internal(ctx: Context) -> bool:
  """This package's own code (it imports the package's private modules)."""
  return any(isinstance(s.node, ast.ImportFrom) and (s.node.module or "").startswith(
      f"{_rules.PKG}._") for s in ctx.walk.imports)


def _imports_orbax(node: ast.Import | ast.ImportFrom) -> bool:
  if isinstance(node, ast.ImportFrom):
    return not node.level and (node.module or "").split(".")[0] == "orbax"
  return any(a.name.split(".")[0] == "orbax" for a in node.names)


def judge_calls(ctx: Context) -> None:
  for call, scope in ctx.walk.calls:
    _call(ctx, call, scope)


def judge_values(ctx: Context) -> None:
  for item, scope in ctx.walk.withs:
    _with(ctx, item, scope)
  for deco, scope in ctx.walk.decorators:
    if isinstance(deco, ast.Name | ast.Attribute) and _mesh_value(ctx, deco, scope):
      mesh = ctx.shown(deco)
      ctx.note(deco, "JSE206", _reports.JSE206_DECORATOR.format(mesh=mesh))
  for node, scope in ctx.walk.attrs:
    if node.attr in ctx.walk.defined:
      continue
    if node.attr in WATCHED:
      _attribute(ctx, node)
    else:
      _arrays.attribute(ctx, node, scope)
  _orbax(ctx)
