"""The README's Python snippets run as written (on 8 virtual CPU devices)."""

import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
PRELUDE = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
"""


def test_first_code_block_is_the_two_commands():
  first = re.search(r"```\w*\n(.*?)```", README.read_text(), re.S).group(1)
  assert first.split("\n")[:-1] == ["make demo", "make test"]
  ci = (README.parent / ".ci" / "run").read_text()
  assert "make test" in ci


def test_readme_snippets_run_in_order():
  # Later snippets build on the names the first one defines (mesh, gda, data).
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  code = PRELUDE + "\n".join(SNIPPETS)
  assert len(SNIPPETS) >= 4
  res = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120, env=env)
  assert res.returncode == 0, res.stderr
