"""Write `jax.inv`, the inventory of JAX's API documentation the site links into.

The documentation build needs no network, so intersphinx reads this
committed file instead of fetching `https://docs.jax.dev/en/latest/objects.inv`.
It is written from JAX's own documentation sources (the API reference pages
of a JAX checkout, `docs/*.rst`), not from the installed JAX's namespace:
only the sources say which page documents a name (most have a page of their
own under `_autosummary/`, a class of `jax.sharding` an anchor on that
module's page), and a link to a name JAX's site does not document would lead
nowhere. Each name is kept only if the installed JAX has it, and typed from
the installed object (class, function, method, attribute, module), so a
reference such as ``:class:`jax.sharding.Mesh``` resolves.

Run it again (with the package's venv) when JAX's documentation moves:

    python docs/_intersphinx/make_jax_inventory.py /path/to/jax-checkout
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import sys
import types
import warnings
import zlib

HERE = pathlib.Path(__file__).resolve().parent
INVENTORY = HERE / "jax.inv"
URL = "https://docs.jax.dev/en/latest/"

# The API reference pages whose names the site's pages use.
PAGES = ("jax", "jax.debug", "jax.distributed", "jax.experimental.multihost_utils",
         "jax.tree_util", "jax.random", "jax.lax", "jax.numpy", "jax.sharding",
         "jax.experimental")


def documented(docs: pathlib.Path) -> dict[str, str]:
  """`{name: uri}` of each object the pages document: an autosummary entry
  with a page of its own, an `auto*` directive's anchor, a module's anchor."""
  found: dict[str, str] = {}
  for page in PAGES:
    module, in_summary, own_pages = "jax", False, False
    for line in (docs / f"{page}.rst").read_text().splitlines():
      m = re.match(r"\.\. (currentmodule|automodule):: (\S+)", line)
      if m:
        module = m.group(2)
        if m.group(1) == "automodule":
          found[module] = f"{page}.html#module-{module}"
        continue
      if line.startswith(".. autosummary::"):
        in_summary, own_pages = True, False
        continue
      if in_summary:
        if re.match(r"\s+:toctree:\s*_autosummary", line):
          own_pages = True
          continue
        entry = re.match(r"\s+([\w.]+)\s*$", line)
        if entry or re.match(r"\s+:", line) or not line.strip():
          if entry and own_pages:
            name = _qualified(module, entry.group(1))
            found[name] = f"_autosummary/{name}.html#{name}"
          continue
        in_summary = False
      m = re.match(r"\.\. auto(?:class|function|data|exception):: (\S+)", line)
      if m:
        name = _qualified(module, m.group(1))
        found[name] = f"{page}.html#{name}"
  return found


def _qualified(module: str, name: str) -> str:
  return name if name.startswith("jax.") else f"{module}.{name}"


def resolve(name: str):
  """The installed JAX's object named `name`, or None (a deprecated name,
  which JAX still has, counts)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return _resolve(name)


def _resolve(name: str):
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for part in parts[i:]:
      owner = obj
      obj = getattr(obj, part, None)
      if obj is None:
        return None
      if inspect.isclass(owner):
        obj = inspect.getattr_static(owner, part)
    return obj
  return None


def role(name: str, obj) -> str:
  """The Python domain's object type of `obj`, for intersphinx's lookups."""
  if isinstance(obj, types.ModuleType):
    return "py:module"
  if inspect.isclass(obj):
    return "py:exception" if issubclass(obj, BaseException) else "py:class"
  owner = resolve(name.rpartition(".")[0])
  if inspect.isclass(owner):
    return "py:method" if callable(obj) and not isinstance(obj, property) else "py:attribute"
  return "py:function" if callable(obj) else "py:data"


def write(entries: dict[str, str], path: pathlib.Path = INVENTORY) -> None:
  """Sphinx's inventory format, version 2: a header, then zlib-compressed
  lines `name domain:role priority uri display-name`."""
  import jax
  lines = []
  for name, uri in sorted(entries.items()):
    obj = resolve(name)
    if obj is not None:
      short = uri[:-len(name)] + "$" if uri.endswith("#" + name) else uri
      lines.append(f"{name} {role(name, obj)} 1 {short} -\n")
  header = ("# Sphinx inventory version 2\n# Project: JAX\n"
            f"# Version: {jax.__version__}\n"
            "# The remainder of this file is compressed using zlib.\n")
  path.write_bytes(header.encode() + zlib.compress("".join(lines).encode()))


if __name__ == "__main__":
  write(documented(pathlib.Path(sys.argv[1]) / "docs"))
  print(f"wrote {INVENTORY}")
