"""The documentation site's pages, as a reader with only the package meets them.

- Every page's `python` blocks run as pasted, in order, into a fresh Python:
  one process per page, warnings as errors, no `XLA_FLAGS` or
  `JAX_PLATFORMS` from the environment, in an empty directory. A page that
  needs 8 devices sets `XLA_FLAGS` in its first block, before JAX starts,
  with a comment saying why.
- A comment after an expression that starts like a value (a bracket, quote,
  number, `True`, `False`, `None`, or a call such as `P('x',)`) is exactly
  that value's `repr`, optionally followed by `: why`; any other comment is
  prose.
- Python shown but not run (`{code-block} python`) is captioned as a sketch.
- No page states a measured figure by hand: each is a substitution drawn from
  the benchmark results (`docs/_ext/bench_figures.py`), shown once.
- The porting page lists every code of the tool.
- JAX's names link to JAX's API documentation: the committed inventory
  (`docs/_intersphinx/jax.inv`) names only what the installed JAX has, and
  inline code naming one of them becomes a link (`docs/_ext/jax_links.py`).

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
import jax_links  # noqa: E402
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
VALUE = re.compile(r"""^([(\[{'"\d-]|True\b|False\b|None\b|[A-Za-z_][\w.]*\()""")


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


_CODE_BLOCK = re.compile(r"^```\{code-block\} python\n((?::\w+:.*\n)*)", re.M)


def test_python_no_test_runs_is_marked_as_a_sketch():
  """A `python` block runs as pasted (the test above runs it); Python shown
  otherwise (`{code-block} python`) says in its caption that it is a sketch."""
  for page in _pages():
    for options in _CODE_BLOCK.findall(page.read_text()):
      assert re.search(r"^:caption: A sketch, not runnable", options, re.M), (
          f"{page.relative_to(DOCS)}: a `code-block` of Python without a sketch caption")


def test_the_runner_checks_value_comments(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("```python\nx = (1, 2)\nx   # (1, 2): ok\nx[0]   # the first\n```\n\n"
                  "```python\nlen(x)   # 3\n```\n")
  res = _run([("page.md", line, code) for line, code in _blocks(page)], tmp_path / "work")
  assert res.returncode != 0
  assert "page.md:8: the comment shows 3, but the value is 2" in res.stderr, res.stderr
  # A value written as a call is a value too: it must be exactly the repr.
  page.write_text("```python\nfrom fractions import Fraction\n"
                  "Fraction(1, 2)   # Fraction(1, 2): as written\n"
                  "Fraction(2, 4)   # Fraction(2, 4)\n```\n")
  res = _run([("page.md", line, code) for line, code in _blocks(page)], tmp_path / "work2")
  assert res.returncode != 0
  assert "page.md:4: the comment shows Fraction(2, 4), but the value is Fraction(1, 2)" in (
      res.stderr), res.stderr


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


def _rows_of(table: "bench_figures.Table", rows: list[dict]) -> list[dict]:
  key = "case" if table.curve else "benchmark"
  return [r for r in rows if r.get("curve") == table.curve and r["variant"] in table.variants
          and re.match(table.title, r[key]) and table.x in (None, r.get("x"))]


def _row_value(figure: "bench_figures.Figure", row: dict, rows: list[dict]) -> float:
  if figure.of == "median":
    return row["median"]
  base_variant = figure.base or row["base"]
  (base,) = [r["median"] for r in rows
             if r["benchmark"] == row["benchmark"] and r["variant"] == base_variant]
  return row["median"] / base if figure.of == "ratio" else row["median"] - base


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@pytest.mark.parametrize("name", sorted(bench_figures.FIGURES))
def test_each_figure_spans_every_row_of_its_tables(name):
  """A figure's text, read back, is the lowest and highest value of every
  row of the tables it names (as each is shown), so it holds for each of
  them: a summary never leaves out a row of its own table."""
  results = bench_figures.load()
  figure = bench_figures.FIGURES[name]
  rows = [r for table in figure.tables for r in _rows_of(table, results["rows"])]
  assert rows, f"{name}: no row in the results"
  shown = [float(_NUMBER.findall(figure.fmt(_row_value(figure, r, results["rows"])))[0])
           for r in rows]
  text = bench_figures.figures(results)[name]
  numbers = [float(n) for n in _NUMBER.findall(text.replace("–", " "))]
  assert (numbers[0], numbers[-1]) == (min(shown), max(shown)), (text, shown)


def test_a_figure_of_a_curve_covers_every_point_of_it():
  """Figures that sum up a scaling curve (not one named point of it) cover,
  together, every point of each variant they read: every case, every x."""
  results = bench_figures.load()
  read: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
  for figure in bench_figures.FIGURES.values():
    for table in figure.tables:
      if table.curve and table.x is None:
        for r in _rows_of(table, results["rows"]):
          read[table.curve, r["variant"]].add(id(r))
  assert read
  for (curve, variant), covered in read.items():
    points = {id(r) for r in results["rows"]
              if r.get("curve") == curve and r["variant"] == variant}
    missing = [(r["case"], r["x"]) for r in results["rows"] if id(r) in points - covered]
    assert not missing, f"curve {curve!r}, {variant!r}: points no figure covers: {missing}"


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


# -- links into JAX's API documentation -------------------------------------------------


def _jax_inventory() -> dict[str, tuple[str, str]]:
  """`{name: (type, url)}` of the committed inventory of JAX's API docs."""
  from sphinx.util.inventory import InventoryFile
  data = (DOCS / "_intersphinx" / "jax.inv").read_bytes()
  inventory = InventoryFile.loads(data, uri="https://docs.jax.dev/en/latest/")
  inventory = getattr(inventory, "data", inventory)
  return {name: (kind, item.uri) for kind, objects in inventory.items()
          for name, item in objects.items()}


def test_the_jax_inventory_names_what_the_installed_jax_has():
  """Every name the site may link to JAX's documentation exists in the
  installed JAX (every supported release as new as the one the inventory
  was written with; an older one lacks the names JAX added since), at an
  address on JAX's site that follows its layout (a page per name, or a
  module page's anchor)."""
  sys.path.insert(0, str(DOCS / "_intersphinx"))
  import jax
  import make_jax_inventory
  inventory = _jax_inventory()
  header = (DOCS / "_intersphinx" / "jax.inv").read_bytes().split(b"\n", 3)[2].decode()
  written_with = tuple(int(p) for p in header.removeprefix("# Version: ").split(".")[:3])
  older = tuple(jax.__version_info__[:3]) < written_with
  for name in ("jax.jit", "jax.Array", "jax.Array.sum", "jax.sharding.Mesh",
               "jax.experimental.multihost_utils.process_allgather", "jax.numpy"):
    assert name in inventory, name
  for name, (kind, url) in inventory.items():
    assert older or make_jax_inventory.resolve(name) is not None, name
    assert kind.startswith("py:"), (name, kind)
    assert url.startswith("https://docs.jax.dev/en/latest/"), (name, url)
    assert url.endswith((f"#{name}", f"#module-{name}")), (name, url)


def test_inline_code_naming_a_jax_object_links_to_its_documentation():
  from docutils import nodes
  names = {"jax.jit": "https://docs.jax.dev/en/latest/_autosummary/jax.jit.html#jax.jit"}
  para = nodes.paragraph("", "", nodes.literal("", "jax.jit"), nodes.Text(" and "),
                         nodes.literal("", "jax.jit()"), nodes.literal("", "jax.tree_map"))
  title = nodes.title("", "", nodes.literal("", "jax.jit"))
  doc = nodes.section("", title, para)
  assert jax_links.link_literals(doc, names) == 2
  links = list(doc.findall(nodes.reference))
  assert [(r["refuri"], r.astext()) for r in links] == [(names["jax.jit"], "jax.jit"),
                                                        (names["jax.jit"], "jax.jit()")]
  assert not list(title.findall(nodes.reference))  # a heading keeps its code as it is
  assert jax_links.link_literals(doc, names) == 0  # a link is not linked again
