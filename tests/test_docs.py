"""The documentation site's pages: their Python blocks run as a reader pastes
them, and the porting page lists every code the tool has.

The site itself is built by `make docs` (part of `make test`), which fails on
any Sphinx warning and on a public name without an API entry.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

DOCS = pathlib.Path(__file__).parent.parent / "docs"
# Only ```python fences run; other examples are ```{code-block} python.
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


_RUNNER = """\
import json, pathlib
spec = json.loads(pathlib.Path("pages.json").read_text())
for name, blocks in spec["pages"].items():
  print("== page", name, flush=True)
  namespace = {"__name__": "__main__"}
  exec(compile(spec["prelude"], "getting_started.md", "exec"), namespace)
  exec(compile("\\n".join(blocks), name, "exec"), namespace)
"""


def _blocks(page: pathlib.Path) -> list[str]:
  return _BLOCK.findall(page.read_text())


def test_every_page_runs_after_getting_started_with_warnings_as_errors(tmp_path):
  """The pages say their snippets continue the Getting started example: run
  that example, then each page's blocks in order, in a fresh namespace per
  page (one process, on 8 virtual CPU devices, as the example sets them)."""
  prelude = _blocks(DOCS / "getting_started.md")
  assert prelude[0].startswith('import os\nos.environ["XLA_FLAGS"]'), prelude[0]
  pages = {p.name: _blocks(p) for p in sorted(DOCS.glob("*.md"))
           if p.name != "getting_started.md" and _blocks(p)}
  # The capability pages open with runnable examples.
  assert {"gda.md", "output_flag.md", "ordered_effects.md", "transfers.md",
          "donation_pjit.md", "multihost.md", "checkpoints.md"} <= set(pages)
  (tmp_path / "pages.json").write_text(json.dumps({"prelude": "\n".join(prelude),
                                                  "pages": pages}))
  script = tmp_path / "pages.py"
  script.write_text(_RUNNER)
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  res = subprocess.run([sys.executable, "-W", "error", str(script)], capture_output=True,
                       text=True, timeout=300, env=env, cwd=tmp_path)
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
  assert "Warning" not in res.stderr, res.stderr
  assert res.stdout.count("== page") == len(pages)


def test_porting_page_lists_every_code_of_the_tool():
  res = subprocess.run([sys.executable, "-m", "jax_sharding_ext.port", "--codes"],
                       capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr
  codes = re.findall(r"^(JSE\d+)\s", res.stdout, re.M)
  assert len(codes) > 20, res.stdout
  page = (DOCS / "porting.md").read_text()
  listed = re.findall(r"^\| (JSE\d+) \|", page, re.M)
  assert listed == codes, "docs/porting.md's table of codes differs from `--codes`"
