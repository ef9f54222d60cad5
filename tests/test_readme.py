"""The README's Python snippets run as written (on 8 virtual CPU devices)."""

import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_first_code_block_is_the_two_commands():
  first = re.search(r"```\w*\n(.*?)```", README.read_text(), re.S).group(1)
  assert first.split("\n")[:-1] == ["make demo", "make test"]
  ci = (README.parent / ".ci" / "run").read_text()
  assert "make test" in ci


def test_readme_snippets_run_as_pasted_with_warnings_as_errors(tmp_path):
  """Every Python block, in order (later ones build on the names the first
  ones define), as a new user pastes them into one script: the first block
  sets XLA_FLAGS itself. Any warning is an error."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  assert SNIPPETS[0].startswith("import os\nos.environ[\"XLA_FLAGS\"]")
  assert len(SNIPPETS) >= 5
  script = tmp_path / "readme.py"
  script.write_text("\n".join(SNIPPETS))
  res = subprocess.run([sys.executable, "-W", "error", str(script)], capture_output=True,
                       text=True, timeout=180, env=env, cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  assert "Warning" not in res.stderr, res.stderr
