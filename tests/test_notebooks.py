"""The example notebooks run top to bottom in a real Jupyter kernel
(nbclient + ipykernel), print in the right cells, and render in a real
browser (headless Chromium driven by playwright)."""

import copy
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest
from nbclient import NotebookClient

REPO = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((REPO / "examples").glob("*.ipynb"))
ARTIFACTS = REPO / "build" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _execute(path: pathlib.Path):
  nb = nbformat.read(path, as_version=4)
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  # The kernel is this interpreter (jupyter_client maps the native "python3"
  # kernel's `python` to sys.executable); it inherits os.environ, where the
  # test session's XLA_FLAGS must not leak (the first cell sets its own).
  client = NotebookClient(copy.deepcopy(nb), timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": str(path.parent)}})
  saved = dict(os.environ)
  os.environ.clear()
  os.environ.update(env)
  try:
    return nb, client.execute()
  finally:
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def executed():
  return {p.stem: _execute(p) for p in NOTEBOOKS}


def _stdout(cell) -> str:
  return "".join(o.get("text", "") for o in cell.outputs
                 if o.output_type == "stream" and o.name == "stdout")


def _html(cell) -> str:
  return "".join(o.data.get("text/html", "") for o in cell.outputs
                 if o.output_type in ("display_data", "execute_result"))


def test_there_are_three_notebooks_committed_with_outputs():
  assert {p.stem for p in NOTEBOOKS} >= {"gda_quickstart", "ordered_effects",
                                        "transfers_and_donation"}
  for p in NOTEBOOKS:
    nb = nbformat.read(p, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "xla_force_host_platform_device_count=8" in code[0].source, p.name
    assert all(c.execution_count for c in code), f"{p.name}: run `make notebooks`"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"], p.name


@pytest.mark.parametrize("name", [p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(executed, name):
  committed, ran = executed[name]
  for cell in ran.cells:
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    assert not errors, (name, cell.source, errors)
  # The committed outputs are the kinds of output the notebook makes now.
  for old, new in zip(committed.cells, ran.cells, strict=True):
    if old.cell_type == "code":
      assert ({o.output_type for o in old.outputs}
              == {o.output_type for o in new.outputs}), (name, old.source)


def test_ordered_prints_land_in_their_cell_in_program_order(executed):
  _, nb = executed["ordered_effects"]
  code = [c for c in nb.cells if c.cell_type == "code"]
  # No effects_barrier() in that cell: the end-of-cell hook waits for them.
  assert "effects_barrier" not in code[1].source
  lines = _stdout(code[1]).splitlines()
  want = []
  s = sum(range(64))
  for _ in range(2):
    want += [f"step: sum={float(s)}"] + [f"  scan {k}: max={63.0 * s / 2016 * 2 ** k}"
                                        for k in range(3)]
    want += [f"step: done, mean={(s / 64) * 8}"]
    s *= 8
  assert lines == want
  # shard_map: each device's two lines, in order, in this cell and no other.
  lines = _stdout(code[2]).splitlines()
  assert len(lines) == 16
  for i in range(4):
    for j in range(2):
      mine = [ln for ln in lines if ln.startswith(f"device ({i},{j})")]
      assert [m.split()[2] for m in mine] == ["first:", "second:"], lines
  assert "device (" not in _stdout(code[3])


def test_layout_pictures_in_the_quickstart(executed):
  _, nb = executed["gda_quickstart"]
  shows = [_html(c) for c in nb.cells if c.cell_type == "code" and "jse-gda" in _html(c)]
  counts = [h.count("class='jse-shard'") for h in shows]
  assert counts[:2] == [8, 4], counts  # P('x', 'y'); P('x') with replicas sharing a box
  assert "drawn as one row" in shows[3] and "dimensions 0 (rows) and 2 (columns)" in shows[4]


def test_ledger_sites_are_notebook_cells(executed):
  _, nb = executed["transfers_and_donation"]
  code = [c for c in nb.cells if c.cell_type == "code"]
  ledger = next(_html(c) for c in code if "jse-ledger" in _html(c))
  assert re.findall(r"Cell In\[\d+\], line \d+", ledger), ledger
  deleted = [_html(c) for c in code if c.source.strip() == "old"]
  assert "deleted" in deleted[0] and "jse-shard" not in deleted[0]


def test_ipython_hook_registers_once_obeys_the_flag_and_uninstalls():
  code = textwrap.dedent("""
      from IPython.core.interactiveshell import InteractiveShell
      shell = InteractiveShell.instance()
      import jax
      import jax_sharding_ext as jse
      from jax_sharding_ext._effects import barrier
      from jax_sharding_ext._notebook import cell_hook
      hooks = lambda: [f for f in shell.events.callbacks["post_run_cell"]
                       if f is cell_hook._end_of_cell]
      assert len(hooks()) == 1
      jse.install()
      assert len(hooks()) == 1
      calls = []
      barrier.effects_barrier = lambda: calls.append(1)
      shell.run_cell("1 + 1")
      assert calls == [1], calls
      jax.config.update("jax_sharding_ext_cell_effects_barrier", False)
      shell.run_cell("1 + 1")
      assert calls == [1], calls
      jse.uninstall()
      assert hooks() == []
      jse.install()
      assert len(hooks()) == 1
      print("HOOK OK")
  """)
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
  assert "HOOK OK" in res.stdout, res.stdout + res.stderr
  # Outside IPython nothing is registered and IPython is not imported.
  res = subprocess.run([sys.executable, "-c", "import jax_sharding_ext, sys; "
                        "print('IPython' in sys.modules)"], capture_output=True, text=True,
                       timeout=120)
  assert res.stdout.strip() == "False", res.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="needs the system Chromium: `make chromium`")
def test_quickstart_layout_in_a_real_browser(executed, tmp_path):
  from nbconvert import HTMLExporter
  from playwright.sync_api import sync_playwright

  _, nb = executed["gda_quickstart"]
  body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
  page_file = tmp_path / "quickstart.html"
  page_file.write_text(f"<!doctype html><html><body>{body}</body></html>")
  ARTIFACTS.mkdir(parents=True, exist_ok=True)
  errors = []
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"])
    try:
      page = browser.new_page(viewport={"width": 1000, "height": 1400})
      page.on("pageerror", lambda e: errors.append(str(e)))
      page.goto(page_file.as_uri())
      layout = page.locator(".jse-layout").first
      layout.scroll_into_view_if_needed()
      frame = layout.bounding_box()
      boxes = layout.locator(".jse-shard")
      assert boxes.count() == 8
      seen = set()
      for k in range(8):
        box = boxes.nth(k)
        assert box.is_visible()
        b = box.bounding_box()
        (r0, r1), (c0, c1) = (tuple(map(int, part.split(":")))
                              for part in box.get_attribute("data-index").split(","))
        # On screen at its place in the (8, 2) array, at its size (1 px slack).
        assert abs(b["y"] - frame["y"] - 1 - r0 / 8 * (frame["height"] - 2)) <= 1.5
        assert abs(b["x"] - frame["x"] - 1 - c0 / 2 * (frame["width"] - 2)) <= 1.5
        assert abs(b["height"] - (r1 - r0) / 8 * (frame["height"] - 2)) <= 1.5
        assert abs(b["width"] - (c1 - c0) / 2 * (frame["width"] - 2)) <= 1.5
        seen.add(box.get_attribute("data-devices"))
      assert seen == {str(d) for d in range(8)}
      layout.screenshot(path=str(ARTIFACTS / "gda_layout.png"))
      page.locator(".jse-gda").nth(4).screenshot(path=str(ARTIFACTS / "gda_view.png"))
      page.screenshot(path=str(ARTIFACTS / "gda_quickstart.png"), full_page=True)
    finally:
      browser.close()
  assert errors == []
  assert (ARTIFACTS / "gda_layout.png").stat().st_size > 1000


def test_a_bad_call_in_a_notebook_shows_the_cell_line_not_package_frames(tmp_path):
  setup = nbformat.read(NOTEBOOKS[0], as_version=4).cells[1].source
  nb = nbformat.v4.new_notebook(cells=[
      nbformat.v4.new_code_cell(setup),
      nbformat.v4.new_code_cell(
          'mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))\n'
          'GlobalDeviceArray.from_callback((8.0, 2), mesh, P("x"), lambda i: None)')])
  path = tmp_path / "bad.ipynb"
  nbformat.write(nb, path)
  saved = dict(os.environ)
  os.environ.pop("XLA_FLAGS", None)
  try:
    ran = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                         resources={"metadata": {"path": str(tmp_path)}}).execute()
  finally:
    os.environ.clear()
    os.environ.update(saved)
  error = next(o for o in ran.cells[1].outputs if o.output_type == "error")
  text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))
  assert error.ename == "TypeError" and "global_shape" in error.evalue
  assert "Cell In[2], line 2" in text, text
  # IPython hides the package's frames (JAX marks them `__tracebackhide__`)
  # but always shows the frame that raised: at most that one is the package's.
  assert "skipping hidden" in text and text.count("jax_sharding_ext/") <= 1, text


def test_after_an_interrupted_cell_later_cells_do_not_wait_for_it(tmp_path):
  """An interrupted cell leaves its computation running, as in stock Jupyter
  (here one that never ends). The end-of-cell wait covers each cell's own
  effects only: a later pure-Python cell ends at once, and a later cell's own
  unordered print still lands in it. Interrupted inside the wait, the hook
  stops with one line, not IPython's callback traceback."""
  setup = nbformat.read(NOTEBOOKS[0], as_version=4).cells[1].source
  cells = [
      setup,
      "import time\nimport jax.numpy as jnp\n"
      "from jax.sharding import NamedSharding, PartitionSpec as P\n"
      "@jax.jit\ndef runaway(x):\n"
      "  jax.debug.print('start', ordered=True)\n"
      "  n = jax.lax.while_loop(lambda c: c.min() >= 0, lambda c: c + 1.0, x)  # stalls at 2**24\n"
      "  jax.debug.print('end {n}', n=n, ordered=True)\n"
      "  return n\n"
      "four = NamedSharding(Mesh(np.array(jax.devices()[:4]), ('x',)), P('x'))  # asynchronous\n"
      "runaway(jax.device_put(np.zeros(4, np.float32), four)); print('dispatched')",
      "t = time.time(); print('pure Python')",
      "print(f'took {time.time() - t:.2f} s')",
      "v = jax.device_put(jnp.ones(8), jax.devices()[7])  # device 0 still runs the loop\n"
      "y = jax.jit(lambda v: (jax.debug.print('unordered {v}', v=v.sum()), v + 1)[1])(v)\n"
      "print('y', int(y.sum()))",
  ]
  nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
  saved = dict(os.environ)
  os.environ.pop("XLA_FLAGS", None)
  try:
    ran = NotebookClient(nb, kernel_name="python3", allow_errors=True,
                         interrupt_on_timeout=True,
                         timeout_func=lambda cell: 8 if "runaway(" in cell.source else 60,
                         resources={"metadata": {"path": str(tmp_path)}}).execute()
  finally:
    os.environ.clear()
    os.environ.update(saved)

  def text(cell, name):
    return "".join(o.get("text", "") for o in cell.outputs
                   if o.output_type == "stream" and o.name == name)

  interrupted = ran.cells[1]
  assert "start" in text(interrupted, "stdout") and "dispatched" in text(interrupted, "stdout")
  assert "stopped waiting for this cell's effects" in text(interrupted, "stderr")
  assert not any(o.output_type == "error" for o in interrupted.outputs)
  assert text(ran.cells[2], "stdout") == "pure Python\n"
  took = float(re.search(r"took ([\d.]+) s", text(ran.cells[3], "stdout")).group(1))
  assert took < 2.0, took
  assert "unordered 8" in text(ran.cells[4], "stdout") and "y 16" in text(ran.cells[4], "stdout")
