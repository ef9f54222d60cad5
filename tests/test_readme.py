"""The README's Python snippets run as written (on 8 virtual CPU devices)."""

import pathlib
import re

import test_docs

README = pathlib.Path(__file__).parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_first_code_block_is_the_two_commands():
  first = re.search(r"```\w*\n(.*?)```", README.read_text(), re.S).group(1)
  assert first.split("\n")[:-1] == ["make demo", "make test"]
  ci = (README.parent / ".ci" / "run").read_text()
  assert "make test" in ci


def test_readme_snippets_run_as_pasted_with_warnings_as_errors(tmp_path):
  """Every Python block, in order (later ones build on the names the first
  ones define), as a new user pastes them into one Python: the first block
  sets XLA_FLAGS itself. Any warning is an error, and a comment showing a
  value is exactly that value's repr (the documentation pages' runner)."""
  assert SNIPPETS[0].startswith("import os\nos.environ[\"XLA_FLAGS\"]")
  assert len(SNIPPETS) >= 5
  text = README.read_text()
  blocks = [("README.md", text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"```python\n(.*?)```", text, re.S)]
  res = test_docs._run(blocks, tmp_path / "readme")
  assert res.returncode == 0, res.stderr
  assert "Warning" not in res.stderr, res.stderr
