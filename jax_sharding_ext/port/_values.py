"""The rules on values rather than names: calls, `with` items, decorators, attributes.

- `jax.config.update("jax_array", ...)` / reads of the options this package
  defines: the package import is added when the module has none.
- `with mesh:` becomes `with jax.set_mesh(mesh):` (`with mesh as m:` becomes
  `with jax.set_mesh(m := mesh):`, as `jax.set_mesh` enters to None); a
  `maps.mesh(devices, names)` call becomes
  `jax.set_mesh(jax.sharding.Mesh(devices, names))`.
- `with_sharding_constraint(..., axis_resources=...)`: the keyword is `shardings`.
- `x.device_buffers` becomes `[s.data for s in x.addressable_shards]`,
  `x.device_buffer` `x.addressable_data(0)`, `x.device()` `x.device` (unless
  the module defines such a member itself); `x._device_buffers` and a `Mesh`
  used as a decorator are reported.
- GDA-era orbax code gets `import jax_sharding_ext.orbax_support`.
"""

from __future__ import annotations

import ast
import re
from typing import cast

from jax_sharding_ext.port import _reports, _rules, _scope
from jax_sharding_ext.port._context import Context
from jax_sharding_ext.port._source import Edit
from jax_sharding_ext.port._source import shown as _shown_text

WATCHED = frozenset({"device_buffers", "device_buffer", "_device_buffers"})
_MESH_CLASSES = frozenset({"jax.sharding.Mesh", f"{_rules.PKG}.Mesh", "jax.experimental.maps.Mesh",
                           "jax.interpreters.pxla.Mesh"})
_MESH_NAME = re.compile(r"(^|_)mesh$", re.IGNORECASE)
_MESH_VALUE = re.compile(r"^_*(global_|physical_|device_)?mesh$", re.IGNORECASE)
_MESH_FACTORY = re.compile(r"^(create|make)_(\w+_)?mesh$")  # jax.make_mesh, create_global_mesh
_WSC = frozenset({"jax.lax.with_sharding_constraint",
                  "jax.experimental.pjit.with_sharding_constraint"})
_MAPS_MESH = "jax.experimental.maps.mesh"
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
  positional = [a for a in call.args if not isinstance(a, ast.Starred)]
  first = positional[0] if positional else None
  name = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
  for symbol in ctx.symbols(call.func, scope):
    obj, _, method = symbol.rpartition(".")
    if obj in _reports.CONFIG_OBJECTS and method in ("update", "read") and name:
      option(ctx, call, name, method)
    if symbol in _WSC:
      for kw in call.keywords:
        if kw.arg == "axis_resources":
          start = ctx.text.start(kw)
          ctx.note(call, "JSE310", _reports.JSE310.format(shown=ctx.shown(call.func)),
                   [Edit(start, start + len("axis_resources"), "shardings")])
    if symbol == _MAPS_MESH:
      _maps_mesh(ctx, call, scope)
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


def _imported_base(ctx: Context, node: ast.expr, scope: _scope.Scope) -> bool:
  parts = _scope.chain(node)
  return parts is not None and bool(ctx.bindings(parts[0], scope))


def _maps_mesh(ctx: Context, call: ast.Call, scope: _scope.Scope) -> None:
  """`maps.mesh(devices, names)`: `jax.set_mesh(jax.sharding.Mesh(devices, names))`."""
  ctx.consumed.add(id(call.func))
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


def _mesh_value(ctx: Context, func: ast.expr, scope: _scope.Scope) -> bool:
  """A name that holds a `Mesh` (not an imported function such as `maps.mesh`)."""
  parts = _scope.chain(func)
  if parts is None or ctx.bindings(parts[0], scope):
    return False
  text = ".".join(parts)
  named = (bool(_MESH_VALUE.match(parts[-1])) and parts[-1] not in ctx.walk.functions
           and text not in _mesh_names(ctx)[1])
  return named or text in _mesh_names(ctx)[0]


def _mesh_names(ctx: Context) -> tuple[set[str], set[str]]:
  """(the names assigned a `Mesh` call somewhere in the module, the names
  assigned only calls of other imported callables, such as
  `threading.Lock()`: not a `Mesh`, whatever the name says)."""
  cached = getattr(ctx, "_mesh_names", None)
  if cached is None:
    module = ctx.walk.module
    meshes = {name for name, call in ctx.walk.mesh_assigned if is_mesh_call(ctx, call, module)}
    others = {name for name, call in ctx.walk.mesh_assigned
              if name not in meshes and ctx.symbols(call.func, module)}
    cached = ctx._mesh_names = (meshes, others)  # type: ignore[attr-defined]
  return cached


def is_mesh_call(ctx: Context, node: ast.expr, scope: _scope.Scope) -> bool:
  """A call of a `Mesh` class (through any import), or of a `make_..._mesh` /
  `create_..._mesh` function (`jax.make_mesh`, a test's `create_global_mesh`)."""
  if not isinstance(node, ast.Call):
    return False
  func = node.func
  name = func.id if isinstance(func, ast.Name) else (
      func.attr if isinstance(func, ast.Attribute) else "")
  if name == "create_device_mesh":  # mesh_utils: an array of devices, not a Mesh
    return False
  return bool(_MESH_FACTORY.match(name)) or any(
      s in _MESH_CLASSES for s in ctx.symbols(func, scope))


def _with(ctx: Context, item: ast.withitem, scope: _scope.Scope) -> None:
  expr = item.context_expr
  if isinstance(expr, ast.Name | ast.Attribute) and _scope.chain(expr):
    last = expr.id if isinstance(expr, ast.Name) else expr.attr
    text = ".".join(_scope.chain(expr) or [])
    meshes, others = _mesh_names(ctx)
    is_mesh = (bool(_MESH_NAME.search(last)) and text not in others) or text in meshes
    if is_mesh and ctx.bindings(_scope.chain(expr)[0], scope):  # type: ignore[index]
      is_mesh = False  # an imported name (`maps.mesh`, `jax.sharding.set_mesh`), not a value
  else:
    is_mesh = is_mesh_call(ctx, expr, scope)
  if not is_mesh:
    return
  shown = ctx.shown(expr)
  spelled = ctx.spell("jax.set_mesh", scope)
  target = item.optional_vars
  whole = shown if target is None else _shown_text(
      ctx.text.text[ctx.text.start(expr):ctx.text.end(target)])
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


def _attribute(ctx: Context, node: ast.Attribute) -> None:
  if node.attr in ctx.walk.defined:
    return
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
  """GDA-era orbax code: a module importing orbax that reaches a GDA or passes
  `mesh_axes=`, without `jax_sharding_ext.orbax_support` imported."""
  module = f"{_rules.PKG}.orbax_support"
  orbax = [s for s in ctx.walk.imports if _imports_orbax(s.node)]
  if not orbax or ctx.imports_package(module) or _internal(ctx):
    return
  gda = any(sym in _GDA_CLASSES for n, _p, s in ctx.walk.uses for sym in ctx.symbols(n, s))
  mesh_axes = any(kw.arg == "mesh_axes" for call, _s in ctx.walk.calls for kw in call.keywords)
  if gda or mesh_axes:
    ctx.note(orbax[0].node, "JSE207", _reports.JSE207.format(module=module), [], (module,))


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
  for node, _ in ctx.walk.attrs:
    _attribute(ctx, node)
  _orbax(ctx)
