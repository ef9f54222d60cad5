"""Fuzzer: the porting assistant on generated GDA-era modules and notebooks.

A snippet (`strategies.PortSnippet`) mixes aliased imports, imports of
removed names nothing uses, imports the rewrite leaves unused and the user's
own unused ones, values entered by `with` that are a `Mesh` on every path or
not (branches, `if` expressions, loops, `try`), some made by functions
outside the files of the run, renames whose call spans lines or makes the
longest line longer, annotations of removed classes, orbax restore code and
lines no rule touches, with `\\n` or `\\r\\n` line endings, as a module or as a
notebook, written in a folder named `orbax`, in another, or in a copy of
orbax, or not written at all.

The model: `--write`'s output compiles, the findings it says are left are
those of its output, a second `--write` changes nothing,
every line (and notebook cell) no rule touches keeps its bytes, a call that
a rename made longer keeps its continuation lines aligned, a `with` is
rewritten to `jax.set_mesh` exactly when every value that can reach it is a
`Mesh` and reported where a value may come from a function outside the run,
no import the code used is left unused while the user's own unused imports
stay, orbax code gets the support module unless it lives in a copy of
orbax, and every line the rewrite made longer than the file's longest line
is named.
"""

from __future__ import annotations

import ast
import json
import os
import tempfile

import pytest
from _fuzz import budget
from hypothesis import given
from strategies import PortSnippet, port_snippets

from jax_sharding_ext.port import _engine, _length, _notebook
from jax_sharding_ext.port._source import Text

pytestmark = pytest.mark.fuzz
_SUPPORT = "import jax_sharding_ext.orbax_support"


class _Fixed:
  """One `--write` of a module's text, as the command line makes it: the text,
  the findings of the text as given, and the lines it made too long."""

  def __init__(self, text: str, path: str = "<source>", length=len, lines=None) -> None:
    growth = _length.Growth(length)
    project = _engine.project_of([path])
    self.text, self.before, left = _engine.fix_text(text, path, project, growth)
    compile(self.text, "<fixed>", "exec")
    assert left == _engine.check_text(self.text, path, _engine.project_of([path])), (
        "the findings said to be left are not those of the rewritten module")
    assert _engine.fix_text(self.text, path, _engine.project_of([path]))[0] == self.text, (
        "a second --write changed the module")
    self.limit = _length.limit(None, lines if lines is not None else text.splitlines())
    self.grown = {line for line, _, _ in growth.grown(Text(self.text), self.limit.length)}


def _in_order(haystack: str, needles: list[str]) -> None:
  at = 0
  for needle in needles:
    found = haystack.find(needle, at)
    assert found >= 0, f"a line no rule touches lost its bytes: {needle!r}"
    at = found + len(needle)


def _check_withs(snippet: PortSnippet, fixed: _Fixed, code: str) -> None:
  for name in snippet.meshes:
    assert f"with jax.set_mesh({name}):" in code, f"`with {name}:` (always a Mesh) was left"
  for name in snippet.others:
    assert f"  with {name}:" in code and f"set_mesh({name})" not in code, (
        f"`with {name}:` (not always a Mesh) was rewritten")
  for name in snippet.outside:
    assert any(f.code == "JSE204" and not f.fixable and f"`with {name}:`" in f.message
               for f in fixed.before), f"`with {name}:` (maybe a Mesh made outside) not reported"


def _check_alignment(fixed: str) -> None:
  """A call a rename made longer keeps its next line aligned with its bracket."""
  lines = fixed.splitlines()
  for line, following in zip(lines, lines[1:], strict=False):
    if "tree_util.tree_map(" in line and line.rstrip().endswith(","):
      column = line.index("tree_util.tree_map(") + len("tree_util.tree_map(")
      indent = len(following) - len(following.lstrip(" "))
      assert indent == column, f"continuation not aligned: {line!r} / {following!r}"


def _loaded_names(tree: ast.AST) -> set[str]:
  return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _check_imports(snippet: PortSnippet, before: str, fixed: str) -> None:
  """No import the code used is left unused; the user's own unused ones stay."""
  old, new = ast.parse(before), ast.parse(fixed)
  used_before, used_after = _loaded_names(old), _loaded_names(new)
  chains_after = ast.unparse(new)
  for node in new.body:
    if isinstance(node, ast.ImportFrom | ast.Import):
      for alias in node.names:
        local = alias.asname or alias.name
        if isinstance(node, ast.Import) and alias.asname is None and "." in alias.name:
          assert alias.name + "." in chains_after or alias.name + "." not in ast.unparse(old), (
              f"`import {alias.name}` left unused by the rewrite")
        elif local in used_before:
          assert local in used_after, f"`{ast.unparse(node)}` left unused by the rewrite"
  for line in snippet.unused:
    assert line in fixed, f"the user's own unused import went: {line!r}"


def _check_lengths(fixed: _Fixed, length=len, code=lambda line: True) -> None:
  """Every line the rewrite made longer than the file's longest line is named, and
  only such lines (`code`: the lines of the file's code, not a notebook's markers)."""
  lines = Text(fixed.text)
  too_long = {i for i in range(1, len(lines.starts) + 1)
              if code(lines.line(i)) and length(lines.line(i)) > fixed.limit.length}
  assert fixed.grown == too_long, (
      f"lines past the file's {fixed.limit.length}: {sorted(too_long)}; named as made too "
      f"long: {sorted(fixed.grown)}")


def _write_where(snippet: PortSnippet, directory: str, data: bytes) -> str:
  """The module's file in `snippet.folder` under `directory` (a copy of orbax
  gets its own files around it)."""
  folder = os.path.join(directory, *snippet.folder.split("/"))
  os.makedirs(folder)
  if snippet.folder.endswith("checkpoint"):
    for d in (folder, os.path.dirname(folder)):
      with open(os.path.join(d, "__init__.py"), "w") as f:
        f.write("")
  path = os.path.join(folder, "restore.ipynb" if snippet.notebook else "restore.py")
  with open(path, "wb") as f:
    f.write(data)
  return path


def _check_orbax(snippet: PortSnippet, code: str) -> None:
  copy = snippet.folder is not None and snippet.folder.endswith("orbax/checkpoint")
  wanted = snippet.restores_with_orbax and not copy
  assert (_SUPPORT in code) == wanted, (
      f"orbax support {'missing' if wanted else 'added'} in folder {snippet.folder!r}")


def _notebook_of(snippet: PortSnippet) -> bytes:
  cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": text.splitlines(keepends=True)} for _, text in snippet.parts]
  return (json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                     indent=1) + "\n").encode("utf-8")


def _cell_spans(raw: str) -> list[str]:
  return [raw[s:e] for _, (s, e) in _notebook._source_spans(raw)]


def _port_module(snippet: PortSnippet, path: str) -> None:
  text = snippet.text()
  fixed = _Fixed(text, path)
  nl = snippet.newline
  _in_order(fixed.text, [t.replace("\n", nl) + nl for kind, t in snippet.parts if kind == "keep"])
  _check_orbax(snippet, fixed.text)
  _check_withs(snippet, fixed, fixed.text)
  _check_imports(snippet, text, fixed.text)
  _check_alignment(fixed.text)
  _check_lengths(fixed)


def _port_notebook(snippet: PortSnippet, raw: bytes, path: str) -> None:
  nb = _notebook.load(raw, path)
  module, _ = _notebook.module_text(nb)

  def length(line: str) -> int:
    return len(_notebook.cell_line(nb, line))
  fixed = _Fixed(module, path, length, _notebook.code_lines(nb, module))
  out = _notebook.dump(nb, fixed.text) if fixed.text != module else raw
  again = _notebook.load(out, path)
  assert _Fixed(_notebook.module_text(again)[0], path).text == _notebook.module_text(again)[0]
  before, after = _cell_spans(raw.decode()), _cell_spans(out.decode())
  for (kind, _), old, new in zip(snippet.parts, before, after, strict=True):
    if kind == "keep":
      assert new == old, "an untouched cell changed"
  cells = "\n".join("".join(c["source"]) for c in json.loads(out)["cells"])
  _check_orbax(snippet, cells)
  _check_withs(snippet, fixed, cells)
  _check_imports(snippet, module, fixed.text)
  _check_alignment(cells)
  _check_lengths(fixed, length, lambda line: not _notebook._CELL_LINE.match(line))


@given(port_snippets())
@budget(120)
def test_write_is_idempotent_keeps_untouched_bytes_and_rewrites_only_meshes(snippet):
  """`--write` compiles, is idempotent, keeps every untouched line's bytes,
  rewrites a `with` exactly when every value reaching it is a `Mesh` and
  reports one that may be made outside the run, leaves no import unused that
  the code used, judges a copy of orbax by what its folder holds, and names
  every line it made too long."""
  raw = _notebook_of(snippet) if snippet.notebook else snippet.text().encode("utf-8")
  with tempfile.TemporaryDirectory(prefix="fuzz_port_") as directory:
    path = "n.ipynb" if snippet.notebook else "<source>"
    if snippet.folder is not None:
      path = _write_where(snippet, directory, raw)
    if snippet.notebook:
      _port_notebook(snippet, raw, path)
    else:
      _port_module(snippet, path)
