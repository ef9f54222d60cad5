"""Fuzzer: the porting assistant on generated GDA-era modules and notebooks.

A snippet (`strategies.PortSnippet`) mixes aliased imports, imports of
removed names nothing uses, values entered by `with` that are a `Mesh` on
every path or not (branches, `if` expressions, loops, `try`), renames whose
call spans lines, annotations of removed classes and lines no rule touches,
with `\\n` or `\\r\\n` line endings, as a module or as a notebook.

The model: `--write`'s output compiles, a second `--write` changes nothing,
every line (and notebook cell) no rule touches keeps its bytes, a call that
a rename made longer keeps its continuation lines aligned, and a `with` is
rewritten to `jax.set_mesh` exactly when every value that can reach it is a
`Mesh` (one that may be something else is left as written).
"""

from __future__ import annotations

import json

import pytest
from _fuzz import budget
from hypothesis import given
from strategies import PortSnippet, port_snippets

from jax_sharding_ext.port import _engine, _notebook

pytestmark = pytest.mark.fuzz


def _fix_module(text: str) -> str:
  fixed = _engine.fix_text(text)[0]
  compile(fixed, "<fixed>", "exec")
  assert _engine.fix_text(fixed)[0] == fixed, "a second --write changed the module"
  return fixed


def _in_order(haystack: str, needles: list[str]) -> None:
  at = 0
  for needle in needles:
    found = haystack.find(needle, at)
    assert found >= 0, f"a line no rule touches lost its bytes: {needle!r}"
    at = found + len(needle)


def _check_withs(snippet: PortSnippet, fixed: str) -> None:
  for name in snippet.meshes:
    assert f"with jax.set_mesh({name}):" in fixed, f"`with {name}:` (always a Mesh) was left"
  for name in snippet.others:
    assert f"  with {name}:" in fixed and f"set_mesh({name})" not in fixed, (
        f"`with {name}:` (not always a Mesh) was rewritten")


def _check_alignment(fixed: str) -> None:
  """A call a rename made longer keeps its next line aligned with its bracket."""
  lines = fixed.splitlines()
  for line, following in zip(lines, lines[1:], strict=False):
    if "tree_util.tree_map(" in line and line.rstrip().endswith(","):
      column = line.index("tree_util.tree_map(") + len("tree_util.tree_map(")
      indent = len(following) - len(following.lstrip(" "))
      assert indent == column, f"continuation not aligned: {line!r} / {following!r}"


def _notebook_of(snippet: PortSnippet) -> bytes:
  cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": text.splitlines(keepends=True)} for _, text in snippet.parts]
  return (json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                     indent=1) + "\n").encode("utf-8")


def _cell_spans(raw: str) -> list[str]:
  return [raw[s:e] for _, (s, e) in _notebook._source_spans(raw)]


@given(port_snippets())
@budget(120)
def test_write_is_idempotent_keeps_untouched_bytes_and_rewrites_only_meshes(snippet):
  """`--write` compiles, is idempotent, keeps every untouched line's bytes, and
  rewrites a `with` exactly when every value reaching it is a `Mesh`."""
  if not snippet.notebook:
    text = snippet.text()
    fixed = _fix_module(text)
    nl = snippet.newline
    _in_order(fixed, [t.replace("\n", nl) + nl for kind, t in snippet.parts if kind == "keep"])
    _check_withs(snippet, fixed)
    _check_alignment(fixed)
    return
  raw = _notebook_of(snippet)
  nb = _notebook.load(raw, "n.ipynb")
  module, _ = _notebook.module_text(nb)
  fixed = _fix_module(module)
  out = _notebook.dump(nb, fixed) if fixed != module else raw
  again = _notebook.load(out, "n.ipynb")
  assert _fix_module(_notebook.module_text(again)[0]) == _notebook.module_text(again)[0]
  before, after = _cell_spans(raw.decode()), _cell_spans(out.decode())
  for (kind, _), old, new in zip(snippet.parts, before, after, strict=True):
    if kind == "keep":
      assert new == old, "an untouched cell changed"
  cells = "\n".join("".join(c["source"]) for c in json.loads(out)["cells"])
  _check_withs(snippet, cells)
  _check_alignment(cells)
