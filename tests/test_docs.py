"""The documentation site's pages, as a reader with only the package meets them.

- Every page's `python` blocks run as pasted, in order, into a fresh Python:
  one process per page, warnings as errors, no `XLA_FLAGS` or
  `JAX_PLATFORMS` from the environment, in an empty directory. A page that
  needs 8 devices sets `XLA_FLAGS` in its first block, before JAX starts,
  with a comment saying why.
- A comment after an expression that starts like a value (a bracket, quote,
  number, `True`, `False`, `None`) is exactly that value's `repr`, optionally
  followed by `: why`; any other comment is prose.
- No page states a measured figure by hand: each is a substitution drawn from
  the benchmark results (`docs/_ext/bench_figures.py`), shown once.
- The porting page lists every code of the tool.

The site itself is built by `make docs` (part of `make test`), which fails on
any Sphinx warning, a public name without an API entry, and a broken
internal link, anchor or image.
"""

import collections
import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).parent.parent / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import bench_figures  # noqa: E402
import local_links  # noqa: E402

# Only ```python fences run; other examples are ```{code-block} python.
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_FENCE = re.compile(r"^(```+|:::+).*?^\1", re.S | re.M)

def _pages() -> list[pathlib.Path]:
  return sorted(p for p in DOCS.rglob("*.md")
                if p.relative_to(DOCS).parts[0] not in ("examples", "_generated", "_ext"))


def _blocks(page: pathlib.Path) -> list[tuple[int, str]]:
  """`(line of the block's first code line, code)` of each python block."""
  text = page.read_text()
  return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


RUNNABLE = [p for p in _pages() if _blocks(p)]

_RUNNER = r'''
import ast, io, json, re, sys, tokenize

with open(sys.argv[1]) as f:
  spec = json.load(f)
VALUE = re.compile(r"""^([(\[{'"\d-]|True\b|False\b|None\b)""")


def shown(comment):
  """The value a comment shows, or None for prose."""
  if not VALUE.match(comment):
    return None
  for candidate in (comment, comment.split(": ", 1)[0]):
    try:
      ast.parse(candidate, mode="eval")
      return candidate
    except SyntaxError:
      pass
  return comment


def shows(value, text, where):
  if repr(value) != text and not _same_but_spec_repr(repr(value), text):
    raise AssertionError(f"{where}: the comment shows {text}, but the value is {value!r}")
  return value


def _same_but_spec_repr(got, text):
  # Pages show a `PartitionSpec` as JAX 0.10 and later print it, `P('x',)`;
  # older releases print `PartitionSpec('x',)`.
  from jax.sharding import PartitionSpec
  if not repr(PartitionSpec()).startswith("PartitionSpec("):
    return False
  return got.replace("PartitionSpec(", "P(") == text.replace("PartitionSpec(", "P(")


class Checked(ast.NodeTransformer):
  """Each expression statement with a value comment checks its value."""

  def __init__(self, comments, filename):
    self.comments, self.filename = comments, filename

  def visit_Expr(self, node):
    text = shown(self.comments.get(node.end_lineno, ""))
    if text is None:
      return node
    where = ast.Constant(f"{self.filename}:{node.end_lineno}")
    node.value = ast.Call(ast.Name("__shows__", ast.Load()),
                          [node.value, ast.Constant(text), where], [])
    return node

  def visit_FunctionDef(self, node):  # a function body runs later, maybe traced
    return node

  visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef


namespace = {"__name__": "__main__", "__shows__": shows}
for filename, line, code in spec["blocks"]:
  print(f"== {filename}:{line}", flush=True)
  tree = ast.parse(code, filename)
  comments = {t.start[0]: t.string[1:].strip()
              for t in tokenize.generate_tokens(io.StringIO(code).readline)
              if t.type == tokenize.COMMENT}
  ast.increment_lineno(tree, line - 1)
  comments = {k + line - 1: v for k, v in comments.items()}
  tree = ast.fix_missing_locations(Checked(comments, filename).visit(tree))
  exec(compile(tree, filename, "exec"), namespace)
'''


def _run(blocks: list[tuple[str, int, str]], work: pathlib.Path) -> subprocess.CompletedProcess:
  """Run `(file, line, code)` blocks in order in one fresh Python, in `work`."""
  work.mkdir()
  (work / "blocks.json").write_text(json.dumps({"blocks": blocks}))
  (work / "runner.py").write_text(_RUNNER)
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  return subprocess.run([sys.executable, "-W", "error", "runner.py", "blocks.json"],
                        capture_output=True, text=True, timeout=300, env=env, cwd=work)


def _run_page(page: pathlib.Path, tmp: pathlib.Path) -> subprocess.CompletedProcess:
  name = str(page.relative_to(DOCS))
  blocks = [(name, line, code) for line, code in _blocks(page)]
  return _run(blocks, tmp / name.replace("/", "_"))


def test_every_page_runs_as_pasted_in_a_fresh_python(tmp_path):
  """Each page in its own process, two at a time; every failure is reported."""
  assert {"index.md", "getting_started.md", "gda.md", "output_flag.md", "ordered_effects.md",
          "transfers.md", "donation_pjit.md", "multihost.md", "checkpoints.md"} <= {
              str(p.relative_to(DOCS)) for p in RUNNABLE}
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(RUNNABLE, pool.map(lambda p: _run_page(p, tmp_path), RUNNABLE),
                       strict=True))
  failures = []
  for page, res in results.items():
    if res.returncode != 0 or "Warning" in res.stderr:
      failures.append(f"--- {page.relative_to(DOCS)} (exit {res.returncode})\n"
                      f"{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
  assert not failures, "\n".join(failures)


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(DOCS)))
def test_a_page_that_needs_devices_sets_them_first_and_says_why(page):
  blocks = [code for _, code in _blocks(page)]
  setting = [i for i, code in enumerate(blocks) if "XLA_FLAGS" in code]
  assert setting in ([], [0]), f"only the first block may set XLA_FLAGS (blocks {setting})"
  if setting:
    first = blocks[0]
    assert first.index("XLA_FLAGS") < first.find("import jax") or "import jax" not in first
    comment = first.splitlines()[0].partition("#")[2]
    assert comment.strip(), "the first line says why the page sets XLA_FLAGS, in a comment"


def test_the_runner_checks_value_comments(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("```python\nx = (1, 2)\nx   # (1, 2): ok\nx[0]   # the first\n```\n\n"
                  "```python\nlen(x)   # 3\n```\n")
  res = _run([("page.md", line, code) for line, code in _blocks(page)], tmp_path / "work")
  assert res.returncode != 0
  assert "page.md:8: the comment shows 3, but the value is 2" in res.stderr, res.stderr


# A measured figure in prose: a ratio, a time, a share or a throughput.
_FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|\b\d+(?:\.\d+)?\s?(?:us|µs|ms|s|seconds?|minutes?)\b"
                     r"|\b\d+(?:\.\d+)?\s?%|\b[GM]B/s\b")
_SUBSTITUTION = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_INCLUDE = re.compile(r"^```\{include\}\s+(\S+)", re.M)


def _prose(page: pathlib.Path) -> str:
  """A page's text as a reader sees it, included files too, without code."""
  text = page.read_text()
  for target in _INCLUDE.findall(text):
    if "_generated" not in target:
      text += "\n" + (page.parent / target).read_text()
  text = _FENCE.sub("", text)
  return re.sub(r"`[^`\n]*`", "", text)


def test_no_page_states_a_measured_figure_by_hand():
  found = {}
  for page in _pages():
    name = str(page.relative_to(DOCS))
    hits = _FIGURE.findall(_SUBSTITUTION.sub("", _prose(page)))
    if hits:
      found[name] = hits
  assert not found, f"figures written by hand (make them substitutions on speed.md): {found}"


def test_every_figure_is_drawn_from_the_results_and_shown_once():
  figures = bench_figures.figures(bench_figures.load())
  used = collections.Counter(m for p in _pages() for m in _SUBSTITUTION.findall(_prose(p)))
  assert set(used) == set(figures), (set(used) ^ set(figures))
  assert [k for k, n in used.items() if n > 1] == [], used


def test_targets_stay_on_the_development_page():
  for page in _pages():
    if page.name != "development.md":
      text = _prose(page)
      assert "MISSED" not in text and "targets.md" not in text, page
  bench_figures.write_pages(bench_figures.load(), DOCS / "_generated")
  results = (DOCS / "_generated" / "results.md").read_text()
  assert "MISSED" not in results and "target" not in results.lower()


def test_the_link_check_finds_missing_pages_anchors_and_images(tmp_path):
  """`make docs` runs this check on the built site (docs/_ext/local_links.py)."""
  (tmp_path / "api").mkdir()
  (tmp_path / "api" / "b.html").write_text('<h1 id="top">b</h1><a href="../a.html#here">a</a>')
  (tmp_path / "a.html").write_text(
      '<p id="here"></p><a href="api/b.html#top">ok</a> <a href="https://example.org/x">out</a>'
      ' <a href="#here">self</a> <a href="api/b.html#gone">anchor</a>'
      ' <a href="c.html">page</a> <img src="_images/p.png"> <a href="../x.html">outside</a>')
  assert sorted(local_links.broken_links(tmp_path)) == [
      ("a.html", "../x.html", "points outside the site"),
      ("a.html", "_images/p.png", "no such file in the build"),
      ("a.html", "api/b.html#gone", "no such anchor in the page"),
      ("a.html", "c.html", "no such file in the build")]


def test_porting_page_lists_every_code_of_the_tool():
  res = subprocess.run([sys.executable, "-m", "jax_sharding_ext.port", "--codes"],
                       capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr
  codes = re.findall(r"^(JSE\d+)\s", res.stdout, re.M)
  assert len(codes) > 20, res.stdout
  page = (DOCS / "porting.md").read_text()
  listed = re.findall(r"^\| (JSE\d+) \|", page, re.M)
  assert listed == codes, "docs/porting.md's table of codes differs from `--codes`"
