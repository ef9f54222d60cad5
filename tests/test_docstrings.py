"""The docstrings' examples run as written, and every public name has one.

- Each `>>>` example in the docstring of a public module, of a public name
  (an `__all__` entry of the package or of a public module) or of a public
  member of a public class runs as a doctest, on the suite's 8 virtual CPU
  devices, with warnings as errors.
- Every public name and member this package defines (a function, a class,
  each public member of a public class, a sentinel) has such an example.
  What it re-exports or inherits from JAX or orbax unchanged, a constant, a
  type alias, and the `jax.Array` members a GDA forwards as they are, have an
  entry in the API reference (`docs/api/`) instead; a dataclass's fields are
  entries of its docstring's `Attributes:` section.

An example starts from the names a reader has after the imports the API
reference shows: `jax`, `numpy as np`, `jax_sharding_ext as jse`, `Mesh`,
`PartitionSpec as P`, and the public names of its module; anything else it
uses (a mesh, an array, a directory), it makes itself. Its output is
compared with `...` standing for any text, whitespace normalised.
"""

import dataclasses
import doctest
import importlib
import inspect
import pathlib
import pkgutil
import re
import types

import jax
import numpy as np
import pytest

import jax_sharding_ext

API_PAGES = pathlib.Path(__file__).parent.parent / "docs" / "api"

# The package and every module a user imports (the public submodules).
PUBLIC_MODULES = ["jax_sharding_ext"] + sorted(
    f"jax_sharding_ext.{m.name}" for m in pkgutil.iter_modules(jax_sharding_ext.__path__)
    if not m.name.startswith("_"))


_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# The examples show a `PartitionSpec` as JAX 0.10 and later print it,
# `P('x',)`; older releases print `PartitionSpec('x',)`.
_SPEC_REPR_IS_LONG = repr(jax.sharding.PartitionSpec()).startswith("PartitionSpec(")


class _SpecReprChecker(doctest.OutputChecker):
  """Reads `PartitionSpec(` as `P(` on a JAX that prints the long form."""

  def check_output(self, want, got, optionflags):
    if _SPEC_REPR_IS_LONG:
      want, got = (t.replace("PartitionSpec(", "P(") for t in (want, got))
    return super().check_output(want, got, optionflags)
_FINDER = doctest.DocTestFinder(recurse=False, exclude_empty=True)


def _ours(obj) -> bool:
  """Defined by this package (a function, class, property or an instance of
  one of its classes), not re-exported from JAX or another library."""
  obj = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
  if isinstance(obj, types.ModuleType):
    return False
  return str(getattr(obj, "__module__", "") or "").startswith("jax_sharding_ext")


def _forwarded(obj) -> bool:
  """A `jax.Array` member a GDA forwards to its view as it is."""
  return (inspect.getdoc(obj) or "").startswith("`jax.Array.")


def _members(cls) -> dict[str, object]:
  """Each public member of `cls` (the object its defining class holds),
  without a dataclass's fields (its docstring's `Attributes:` has those)."""
  fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
  out = {}
  for name in dir(cls):
    if name.startswith("_") or name in fields:
      continue
    owner = next(k for k in cls.__mro__ if name in k.__dict__)
    out[name] = owner.__dict__[name]
  return out


def _public_names() -> list[tuple[str, str, object]]:
  """`(module, qualified name, object)` of every public name and member."""
  found = []
  for module_name in PUBLIC_MODULES:
    module = importlib.import_module(module_name)
    for name in module.__all__:
      obj = getattr(module, name)
      found.append((module_name, f"{module_name}.{name}", obj))
      if inspect.isclass(obj) and _ours(obj):
        found += [(module_name, f"{module_name}.{name}.{m}", raw)
                  for m, raw in _members(obj).items()]
  return found


def _collect() -> tuple[list[tuple[str, doctest.DocTest]], set[int]]:
  """`(public name, doctest)` of every public docstring with an example, and
  the ids of the objects they belong to."""
  found, seen, with_example = [], set(), set()
  modules = {m: importlib.import_module(m) for m in PUBLIC_MODULES}
  objects = [(m, m, modules[m]) for m in PUBLIC_MODULES] + _public_names()
  for module_name, name, obj in objects:
    if id(obj) in seen or not (obj is modules.get(name) or _ours(obj)):
      continue
    seen.add(id(obj))
    module = modules[module_name]
    names = {"jax": jax, "np": np, "jse": jax_sharding_ext,
             "Mesh": jax.sharding.Mesh, "P": jax.sharding.PartitionSpec,
             **{n: getattr(module, n) for n in module.__all__}}
    for test in _FINDER.find(obj, name, module=False, globs=names):
      if test.examples:
        found.append((name, test))
        with_example.add(id(obj))
  return found, with_example


TESTS, _WITH_EXAMPLE = _collect()


# -- the API reference's entries ------------------------------------------------------

_DIRECTIVE = re.compile(r"^(\s*)\.\. (?:py:)?(auto)?(\w+):: ([\w.]+)", re.M)
_OPTION = re.compile(r"^\s+:([\w-]+):(.*)$")


def _api_entries() -> set[str]:
  """The qualified names the API pages give an entry: each `auto...::` and
  `py:...::` directive, and the members an `autoclass` lists (every member
  with a docstring for a bare `:members:`, inherited ones too with
  `:inherited-members:`)."""
  entries = set()
  for page in API_PAGES.glob("*.md"):
    module = "jax_sharding_ext" if page.stem in ("jax_sharding_ext", "index") else (
        f"jax_sharding_ext.{page.stem}")
    lines = page.read_text().splitlines()
    current_class = None
    for i, line in enumerate(lines):
      m = _DIRECTIVE.match(line)
      if not m:
        continue
      indent, auto, kind, target = m.groups()
      if kind == "currentmodule":
        module = target
        continue
      if not target.startswith("jax_sharding_ext"):
        target = f"{current_class}.{target}" if indent and current_class else (
            f"{module}.{target}")
      entries.add(target)
      if kind in ("class", "exception") and not indent:
        current_class = target
      if auto and kind == "class":
        options = {}
        for opt in lines[i + 1:]:
          o = _OPTION.match(opt)
          if not o:
            break
          options[o.group(1)] = o.group(2).strip()
        entries |= _listed_members(target, options)
  return entries


def _listed_members(target: str, options: dict[str, str]) -> set[str]:
  if "members" not in options:
    return set()
  module_name, _, name = target.rpartition(".")
  cls = getattr(importlib.import_module(module_name), name)
  if options["members"]:
    return {f"{target}.{m.strip()}" for m in options["members"].split(",")}
  inherited = "inherited-members" in options
  return {f"{target}.{m}" for m, raw in _members(cls).items()
          if inspect.getdoc(raw) and (inherited or m in cls.__dict__)}


def _field_documented(cls, field: str) -> bool:
  """A dataclass field is named in its class docstring's `Attributes:`."""
  section = (cls.__doc__ or "").partition("Attributes:")[2]
  return re.search(rf"^\s+{field}:", section, re.M) is not None


def _missing() -> dict[str, str]:
  """Each public name or member without what it needs, and what that is."""
  entries = _api_entries()
  missing = {}
  for _, name, obj in _public_names():
    if _ours(obj) and not _forwarded(obj):
      if id(obj) not in _WITH_EXAMPLE:
        missing[name] = "no `>>>` example in its docstring"
    elif name not in entries and not _entry_elsewhere(name, obj, entries):
      missing[name] = "no entry in the API reference (docs/api/)"
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
      for f in dataclasses.fields(obj):
        if not _field_documented(obj, f.name):
          missing[f"{name}.{f.name}"] = "a field missing from its class's `Attributes:`"
  return missing


def _entry_elsewhere(name: str, obj, entries: set[str]) -> bool:
  """A name that another module also exports, documented once under that module."""
  short = name.rpartition(".")[2]
  return any(e.endswith(f".{short}") and _resolve(e) is obj for e in entries)


def _resolve(qualified: str):
  parts = qualified.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for p in parts[i:]:
      obj = inspect.getattr_static(obj, p, None) if inspect.isclass(obj) else getattr(
          obj, p, None)
    return obj
  return None


def test_the_docstrings_have_examples():
  assert len(TESTS) >= 80, [name for name, _ in TESTS]


def test_every_public_name_and_member_has_an_example_or_an_api_entry():
  missing = _missing()
  assert not missing, "\n".join(f"{k}: {v}" for k, v in sorted(missing.items()))


@pytest.mark.parametrize("test", [pytest.param(t, id=n) for n, t in TESTS])
def test_docstring_example_runs(test, fresh_registry, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
  runner = doctest.DocTestRunner(checker=_SpecReprChecker(), optionflags=_FLAGS)
  out: list[str] = []
  result = runner.run(test, out=out.append, clear_globs=True)
  assert result.failed == 0, "".join(out)
