"""`jax.distributed.initialize()` after a JAX computation: today's JAX refuses it.

JAX starts its backend at the first computation; `jax.distributed.initialize()`
must come before that (today it raises `RuntimeError` after; GDA-era JAX let
some of these through). In each body of code (the module, so a notebook's
cells in order, and each function), a call of `jax.distributed.initialize`
is reported when a statement that runs before it on its way there surely
starts the backend: it calls the devices' functions of `jax`
(`jax.devices()`, `jax.device_count()`, `jax.process_index()`, ...,
`jax.device_put`), a function of JAX's array modules (`jax.numpy`,
`jax.random`, `jax.lax`, `jax.nn`, `jax.scipy`), or a jitted function.
"""

from __future__ import annotations

import ast

from jax_sharding_ext.port import _blocks, _kinds, _reports, _scope
from jax_sharding_ext.port._context import Context

_ARRAY_MODULES = ("jax.numpy.", "jax.random.", "jax.lax.", "jax.nn.", "jax.scipy.")
_DEVICE_PREFIXES = ("device", "devices", "local_device", "process_")
_INITIALIZE = "jax.distributed.initialize"


def _computes(symbol: str) -> bool:
  if symbol.startswith(_ARRAY_MODULES):
    return True
  module, _, name = symbol.rpartition(".")
  return module == "jax" and name.startswith(_DEVICE_PREFIXES)


def _first_computation(ctx: Context, stmts: list[ast.stmt], scope: _scope.Scope
                       ) -> ast.Call | None:
  kinds = _kinds.kinds_of(ctx)
  for stmt in stmts:
    stack: list[ast.AST] = [stmt]
    while stack:
      node = stack.pop()
      if isinstance(node, _blocks.SCOPES):
        continue
      if isinstance(node, ast.Call):
        if any(_computes(s) for s in ctx.symbols(node.func, scope)):
          return node
        if (isinstance(node.func, ast.Name | ast.Attribute) and _scope.chain(node.func)
            and kinds.callee(node.func, scope) & {_kinds.JITTED, _kinds.PMAPPED}):
          return node
      stack.extend(reversed(list(ast.iter_child_nodes(node))))
  return None


def judge(ctx: Context) -> None:
  last = _INITIALIZE.rpartition(".")[2]
  for call, scope in ctx.walk.calls:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != last or _INITIALIZE not in ctx.symbols(func, scope):
      continue
    body = _blocks.body_of(scope)
    stmt = _blocks.enclosing(body, call) if body is not None else None
    path = _blocks.path_to(body, stmt) if body is not None and stmt is not None else None
    if path is None:
      continue
    before = [s for block, i in path for s in block[:i]]
    found = _first_computation(ctx, before, scope)
    if found is not None:
      ctx.note(call, "JSE209", _reports.JSE209.format(
          shown=ctx.shown(call.func), first=ctx.shown(found.func)))
