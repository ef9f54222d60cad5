"""`thread_resources.env` reads the legacy mesh only: its reads become `current_mesh()`.

GDA-era code asked JAX's `thread_resources.env` (`maps.`, `pxla.`, JAX's
private mesh module alike) for the mesh of the enclosing `with mesh:`. Once
`--write` turns `with mesh:` into `with jax.set_mesh(mesh):` it reads an
empty mesh. `jax_sharding_ext.current_mesh()` reads both:

- `<...>.thread_resources.env.physical_mesh` becomes `jax_sharding_ext.current_mesh()`;
- `<...>.thread_resources.env.shape` becomes `jax_sharding_ext.current_mesh().shape`
  (the environment's shape was its mesh's, plus `xmap`'s loops, which are gone);
- `env = <...>.thread_resources.env` whose every use in its function is
  `env.physical_mesh...` or `env.shape` becomes `env = jax_sharding_ext.current_mesh()`,
  with `env.physical_mesh` written `env`.

Anything else read of the environment is reported.
"""

from __future__ import annotations

import ast

from jax_sharding_ext.port import _blocks, _reports, _rules, _scope
from jax_sharding_ext.port._context import Context

READER = f"{_rules.PKG}.current_mesh()"
_MESH_PARTS = ("physical_mesh", "shape")


def read(symbol: str) -> tuple[str, str] | None:
  """(the prefix of `symbol` that reads the legacy mesh, what replaces it)."""
  parts = symbol.split(".")
  if parts[0] != "jax" or "thread_resources" not in parts:
    return None
  i = parts.index("thread_resources")
  if parts[i + 1:i + 2] != ["env"] or len(parts) < i + 3 or parts[i + 2] not in _MESH_PARTS:
    return None
  end = i + 3 if parts[i + 2] == "physical_mesh" else i + 2
  return ".".join(parts[:end]), READER


def environment(ctx: Context, node: ast.expr, symbol: str, scope: _scope.Scope) -> bool:
  """`env = <...>.thread_resources.env` used only for its mesh: rewritten; True if so."""
  parts = symbol.split(".")
  if parts[0] != "jax" or parts[-2:] != ["thread_resources", "env"]:
    return False
  body = _blocks.body_of(scope)
  stmt = _blocks.enclosing(body, node) if body is not None else None
  if (not isinstance(stmt, ast.Assign) or stmt.value is not node or len(stmt.targets) != 1
      or not isinstance(stmt.targets[0], ast.Name) or scope.kind != "function"):
    return False
  name = stmt.targets[0].id
  if len(scope.names.get(name, [])) != 1:
    return False
  uses = [(n, p) for n, p, s in ctx.walk.uses_of(name) if s.lookup(name) is scope.names[name]]
  if not uses or any(len(p) < 2 or p[1] not in _MESH_PARTS for _, p in uses):
    return False
  spelled = ctx.spell(READER, scope)
  if spelled is None:
    return False
  edits = [ctx.replace(node, spelled[0])]
  for use, parts in uses:
    if parts[1] == "physical_mesh":
      sub: ast.expr = use
      for _ in range(len(parts) - 2):
        sub = sub.value  # type: ignore[attr-defined]
      edits.append(ctx.replace(sub, name))
  ctx.note(node, "JSE308", _reports.JSE308_READ.format(
      shown=ctx.shown(node), new=f"{name} = {READER}") + f"; `{name}.physical_mesh` is "
      f"then `{name}`", edits, spelled[1])
  return True
