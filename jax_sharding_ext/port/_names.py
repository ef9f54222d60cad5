"""The names this package's modules provide, read from their source.

The porting tool decides which GDA-era imports it can point at this package
by the names the package really has. It reads them from the modules' source
with `ast` instead of importing them: `serialization` needs an optional extra,
and the tool runs before any JAX program is set up.
"""

from __future__ import annotations

import ast
import functools
import pathlib

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent


def _bound_names(tree: ast.Module) -> tuple[frozenset[str], frozenset[str]]:
  """(every module-level name, the names defined by `def` / `class` there)."""
  names: set[str] = set()
  defined: set[str] = set()
  body = list(tree.body)
  for node in body:
    if isinstance(node, ast.If):  # a name some JAX releases lack, bound when present
      body += node.body + node.orelse
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      names.add(node.name)
      defined.add(node.name)
    elif isinstance(node, ast.Assign):
      names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      names.add(node.target.id)
    elif isinstance(node, ast.Import):
      names.update(a.asname or a.name.partition(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      names.update(a.asname or a.name for a in node.names if a.name != "*")
  return frozenset(names), frozenset(defined)


@functools.cache
def _read(module: str) -> tuple[frozenset[str], frozenset[str]]:
  if module != "jax_sharding_ext":
    path = _PACKAGE_DIR / (module.removeprefix("jax_sharding_ext.").replace(".", "/") + ".py")
    return _bound_names(ast.parse(path.read_text(encoding="utf-8"), str(path)))
  # The package: what `__init__` binds, and its public modules (importable by name
  # even where `__init__` does not import them, as `serialization`).
  path = _PACKAGE_DIR / "__init__.py"
  names, defined = _bound_names(ast.parse(path.read_text(encoding="utf-8"), str(path)))
  modules = {p.stem if p.is_file() else p.name for p in _PACKAGE_DIR.iterdir()
             if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").is_file())}
  return names | modules, defined


def provided(module: str) -> frozenset[str]:
  """The module-level names of `module` (`jax_sharding_ext` or one of its modules)."""
  return _read(module)[0]


def own_functions(module: str) -> frozenset[str]:
  """The public names `module` defines itself (not re-bound from stock JAX)."""
  return frozenset(n for n in _read(module)[1] if not n.startswith("_"))


def public(module: str) -> frozenset[str]:
  """The public module-level names of `module` (not starting with `_`)."""
  return frozenset(n for n in _read(module)[0] if not n.startswith("_"))
