"""The API reference's examples run as a reader sees them, and every public name has one.

- Each page of the API reference (`docs/api/`) shows one setup block (a
  `python` block: 8 virtual CPU devices and the imports its examples start
  from). Every `>>>` example the page shows (in the docstrings its autodoc
  directives pull in, and in the entries written on the page itself) runs
  exactly as shown: one fresh Python per page, warnings as errors, no
  `XLA_FLAGS` from the environment; the setup block runs first, and each
  entry's examples then run in a namespace holding only what the setup
  defined (no hidden doctest globals, nothing from an earlier entry). Output
  is compared with `...` standing for any text, whitespace normalised.
- Every public docstring with an example is shown on a page.
- Every public name has an example, and so does each public member this
  package defines on a public class. What a class inherits from JAX or orbax
  unchanged, and the `jax.Array` members a GDA forwards as they are, have an
  entry in the API reference instead; a dataclass's fields are entries of
  its docstring's `Attributes:` section.
"""

import dataclasses
import doctest
import importlib
import inspect
import json
import os
import pathlib
import pkgutil
import re
import subprocess
import sys
import textwrap
import types

import pytest
from _jax_warnings import STOCK_WARNINGS_IGNORED

import jax_sharding_ext
from jax_sharding_ext._jax import tables as jax_tables

API_PAGES = pathlib.Path(__file__).parent.parent / "docs" / "api"
PAGES = sorted(p for p in API_PAGES.glob("*.md") if p.stem != "index")

# The package and every module a user imports (the public submodules).
PUBLIC_MODULES = ["jax_sharding_ext"] + sorted(
    f"jax_sharding_ext.{m.name}" for m in pkgutil.iter_modules(jax_sharding_ext.__path__)
    if not m.name.startswith("_"))

_PARSER = doctest.DocTestParser()


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


def _doc(obj) -> str:
  """The docstring autodoc shows for `obj` (its own, not an inherited one)."""
  obj = getattr(obj, "__func__", obj)
  doc = obj.__doc__ if isinstance(obj, (types.ModuleType, type, property)) else (
      getattr(obj, "__doc__", None))
  return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def _has_example(text: str) -> bool:
  return any(isinstance(e, doctest.Example) for e in _PARSER.parse(text))


# -- what each API page shows ------------------------------------------------------

_DIRECTIVE = re.compile(r"^(\s*)\.\. (?:py:)?(auto)?(\w+):: ([\w.]+)(.*)$")
_OPTION = re.compile(r"^\s+:([\w-]+):(.*)$")
_SETUP = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@dataclasses.dataclass
class Entry:
  """One entry of a page: what the reader sees under one name."""
  name: str
  text: str  # the docstring autodoc pulls in, or the body written on the page
  line: int  # of its directive on the page
  obj: object = None


def _body(lines: list[str], i: int, indent: str) -> list[str]:
  """The lines of the directive at `i`: indented deeper, or blank."""
  body = []
  for line in lines[i + 1:]:
    if line.strip() and not line.startswith((indent + " ", indent + "\t")):
      break
    body.append(line)
  return body


def _own_text(body: list[str]) -> str:
  """A directive's own content: its options and nested directives left out."""
  text = textwrap.dedent("\n".join(body))
  out, skip = [], None
  for line in text.splitlines():
    if skip is not None:
      if line.strip() and not line.startswith(skip + " "):
        skip = None
      else:
        continue
    m = _DIRECTIVE.match(line)
    if m:
      skip = m.group(1)
      continue
    if not _OPTION.match(line) or out:
      out.append(line)
  return "\n".join(out)


def page_entries(page: pathlib.Path) -> list[Entry]:
  """Every entry `page` shows, in page order, with the text the reader sees."""
  module = "jax_sharding_ext" if page.stem == "jax_sharding_ext" else f"jax_sharding_ext.{page.stem}"
  lines = page.read_text().splitlines()
  entries, current_class = [], None
  for i, line in enumerate(lines):
    m = _DIRECTIVE.match(line)
    if not m:
      continue
    indent, auto, kind, target, _ = m.groups()
    if kind == "currentmodule":
      module = target
      continue
    if not target.startswith("jax_sharding_ext"):
      target = f"{current_class}.{target}" if indent and current_class else f"{module}.{target}"
    if kind in ("class", "exception") and not indent:
      current_class = target
    body = _body(lines, i, indent)
    if not auto:
      entries.append(Entry(target, _own_text(body), i + 1))
      continue
    obj = _resolve(target)
    entries.append(Entry(target, _doc(obj), i + 1, obj))
    if kind == "class":
      options = {}
      for opt in body:
        o = _OPTION.match(opt)
        if not o:
          break
        options[o.group(1)] = o.group(2).strip()
      entries += [Entry(f"{target}.{name}", _doc(raw), i + 1, raw)
                  for name, raw in _listed_members(obj, options)]
  return entries


def _listed_members(cls, options: dict[str, str]) -> list[tuple[str, object]]:
  """The members an `autoclass` shows: those listed, or every documented one
  (inherited ones too with `:inherited-members:`, except from the class
  named there), and the special members listed."""
  listed = []
  if "special-members" in options:
    listed += [(n.strip(), inspect.getattr_static(cls, n.strip()))
               for n in options["special-members"].split(",")]
  if "members" not in options:
    return listed
  if options["members"]:
    return listed + [(n.strip(), inspect.getattr_static(cls, n.strip()))
                     for n in options["members"].split(",")]
  skipped = options.get("inherited-members")
  for name, raw in _members(cls).items():
    owner = next(k for k in cls.__mro__ if name in k.__dict__)
    inherited = owner is not cls
    if _doc(raw) and (not inherited or ("inherited-members" in options
                                        and owner.__name__ != skipped)):
      listed.append((name, raw))
  return listed


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


def _setup(page: pathlib.Path) -> list[str]:
  return _SETUP.findall(page.read_text())


ENTRIES = {page: page_entries(page) for page in PAGES}


# -- running a page's examples as shown ------------------------------------------------

_RUNNER = r'''
import doctest, json, os, sys, tempfile

with open(sys.argv[1]) as f:
  spec = json.load(f)
namespace = {"__name__": "__main__"}
exec(compile(spec["setup"], spec["page"] + " (setup block)", "exec"), namespace)
parser = doctest.DocTestParser()


class SpecReprChecker(doctest.OutputChecker):
  # The examples show a `PartitionSpec` as JAX 0.10 and later print it,
  # `P('x',)`; older releases print `PartitionSpec('x',)`.
  def check_output(self, want, got, optionflags):
    from jax.sharding import PartitionSpec
    if repr(PartitionSpec()).startswith("PartitionSpec("):
      want, got = (t.replace("PartitionSpec(", "P(") for t in (want, got))
    return super().check_output(want, got, optionflags)


runner = doctest.DocTestRunner(checker=SpecReprChecker(),
                               optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
failed, ran = [], 0
work = tempfile.mkdtemp()
for i, (name, text) in enumerate(spec["entries"]):
  test = parser.get_doctest(text, dict(namespace), name, spec["page"], 0)
  if not test.examples:
    continue
  os.makedirs(os.path.join(work, str(i)))
  os.chdir(os.path.join(work, str(i)))  # an example that writes files writes them here
  out = []
  result = runner.run(test, out=out.append, clear_globs=True)
  ran += 1
  if result.failed:
    failed.append("".join(out))
print(json.dumps({"ran": ran, "failed": failed}))
'''


# Stock names some supported JAX releases lack (`ProcessFailureError` before
# JAX 0.10.1): an example that uses one runs where the module has it.
_ABSENT = [n for n in jax_tables.OPTIONAL_MULTIHOST_NAMES
           if not hasattr(jax_sharding_ext.multihost_utils, n)]


def _runs_here(entry: Entry) -> bool:
  return not any(re.search(rf"\b{n}\b", entry.text) for n in _ABSENT)


def _run_page(page: pathlib.Path, tmp: pathlib.Path) -> dict:
  (setup,) = _setup(page)
  spec = {"page": f"docs/api/{page.name}", "setup": setup,
          "entries": [(e.name, e.text) for e in ENTRIES[page] if _runs_here(e)]}
  (tmp / "spec.json").write_text(json.dumps(spec))
  (tmp / "runner.py").write_text(_RUNNER)
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  res = subprocess.run([sys.executable, "-W", "error", *STOCK_WARNINGS_IGNORED, "runner.py",
                        "spec.json"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
  assert res.returncode == 0, res.stderr[-4000:]
  return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_api_page_shows_one_setup_block_first(page):
  """The one `python` block of the page comes before any entry with an
  example; a page whose examples need 8 devices sets them in its first line,
  and says why."""
  blocks = _setup(page)
  assert len(blocks) == 1, f"{page.name}: {len(blocks)} setup blocks"
  text = page.read_text()
  setup_line = text.count("\n", 0, text.index("```python")) + 1
  assert all(e.line > setup_line for e in ENTRIES[page] if _has_example(e.text))
  if "jax.devices()" in "".join(e.text for e in ENTRIES[page]):
    assert blocks[0].startswith("import os  #"), blocks[0]
    assert "xla_force_host_platform_device_count=8" in blocks[0].splitlines()[1]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_api_page_examples_run_as_shown(page, tmp_path):
  result = _run_page(page, tmp_path)
  assert result["ran"] == sum(_has_example(e.text) and _runs_here(e) for e in ENTRIES[page])
  assert not result["failed"], "\n".join(result["failed"])


def test_the_runner_gives_an_entry_nothing_but_the_setup(tmp_path):
  """An example that uses a name of an earlier entry, or one the setup does
  not define, fails as it would for a reader."""
  page = tmp_path / "page.md"
  page.write_text("```python\nimport math\n```\n\n```{eval-rst}\n"
                  ".. py:function:: one()\n\n   >>> x = math.pi\n\n"
                  ".. py:function:: two()\n\n   >>> round(x)\n   3\n\n"
                  ".. py:function:: three()\n\n   >>> np.pi\n   3.14...\n```\n")
  ENTRIES[page] = page_entries(page)
  try:
    result = _run_page(page, tmp_path)
  finally:
    del ENTRIES[page]
  assert result["ran"] == 3
  assert [("NameError: name 'x'" in f, "NameError: name 'np'" in f)
          for f in result["failed"]] == [(True, False), (False, True)]


def test_every_public_example_is_shown_on_an_api_page():
  shown = {e.text for entries in ENTRIES.values() for e in entries}
  missing = []
  objects = [(m, importlib.import_module(m)) for m in PUBLIC_MODULES] + [
      (name, obj) for _, name, obj in _public_names()]
  for name, obj in objects:
    if (isinstance(obj, types.ModuleType) or _ours(obj)) and _has_example(_doc(obj)):
      if _doc(obj) not in shown:
        missing.append(name)
  assert not missing, f"examples no API page shows: {missing}"


def test_the_api_pages_have_examples():
  assert sum(_has_example(e.text) for entries in ENTRIES.values() for e in entries) >= 95


# -- every public name has an example --------------------------------------------------


def _field_documented(cls, field: str) -> bool:
  """A dataclass field is named in its class docstring's `Attributes:`."""
  section = (cls.__doc__ or "").partition("Attributes:")[2]
  return re.search(rf"^\s+{field}:", section, re.M) is not None


def _missing() -> dict[str, str]:
  """Each public name or member without what it needs, and what that is."""
  entries = {e.name: e for page_entries_ in ENTRIES.values() for e in page_entries_}
  missing = {}
  for module, name, obj in _public_names():
    if isinstance(obj, types.ModuleType):
      continue  # a public module: its own page, whose entries have the examples
    member = name.count(".") > module.count(".") + 1
    entry = entries.get(name) or _entry_elsewhere(name, obj, entries)
    if _ours(obj) and not _forwarded(obj):
      if not _has_example(_doc(obj)):
        missing[name] = "no `>>>` example in its docstring"
    elif entry is None:
      missing[name] = "no entry in the API reference (docs/api/)"
    elif not member and not _has_example(entry.text):
      missing[name] = "no `>>>` example in its API entry"
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
      for f in dataclasses.fields(obj):
        if not _field_documented(obj, f.name):
          missing[f"{name}.{f.name}"] = "a field missing from its class's `Attributes:`"
  return missing


def _entry_elsewhere(name: str, obj, entries: dict[str, Entry]) -> Entry | None:
  """A name that another module also exports, documented once under that module."""
  short = name.rpartition(".")[2]
  return next((e for n, e in entries.items()
               if n.endswith(f".{short}") and _resolve(n) is obj), None)


def test_every_public_name_has_an_example():
  missing = _missing()
  assert not missing, "\n".join(f"{k}: {v}" for k, v in sorted(missing.items()))
