"""`jax_sharding_ext.serialization` keeps checkpoints safe and its errors plain:

- a refused save leaves its path exactly as it was: every check that can
  refuse it runs before the first commit marker or byte is written;
- one writer per path: a save to a path another save is still writing is
  refused, so one writer's commit never removes another's marker;
- an error is raised at the caller's line, with no event-loop exception
  chained to it and no asyncio frames (in a script, inside a running event
  loop, and in IPython).
"""

import asyncio
import os
import pathlib
import re
import subprocess
import sys
import threading
import traceback

import jax
import numpy as np
import pytest
from jax.experimental.array_serialization import serialization as stock
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, serialization

PKG = os.path.dirname(jse.__file__)
ASYNCIO = os.path.dirname(asyncio.__file__)


def _gda(mesh, spec, shape=(8, 4), dtype=np.float32, offset=0):
  data = np.arange(np.prod(shape), dtype=dtype).reshape(shape) + offset
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def _spec(path):
  return serialization.get_tensorstore_spec(str(path))


def _snapshot(root: pathlib.Path) -> dict:
  """Every file's bytes and every directory under `root`."""
  return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else "<dir>")
          for p in sorted(root.rglob("*"))}


# -- a refused save leaves the path exactly as it was ---------------------------------


def _deleted(mesh):
  gda, _ = _gda(mesh, P("x"))
  arr = gda.to_jax_array() + 0
  arr.delete()
  return arr


# name: (arrays, specs) for the committed checkpoint at `w`; the error it raises.
REFUSED = {
    "typed PRNG key array": (
        lambda mesh, w: ([jax.random.split(jax.random.key(0), 8)], [_spec(w)]),
        TypeError, r"arrays\[0\] is a typed PRNG key array .*jax.random.key_data"),
    "wrong number of specs": (
        lambda mesh, w: ([_gda(mesh, P("x"))[0]] * 2, [_spec(w)]),
        ValueError, "got 2 arrays but 1 tensorstore_specs"),
    "not an array": (
        lambda mesh, w: ([np.ones((8, 4), np.float32)], [_spec(w)]),
        TypeError, r"arrays\[0\] must be a GlobalDeviceArray or a jax.Array, got ndarray"),
    "deleted array": (
        lambda mesh, w: ([_deleted(mesh)], [_spec(w)]),
        RuntimeError, "deleted or donated"),
    "unknown tensorstore driver": (
        lambda mesh, w: ([_gda(mesh, P("x", "y"))[0]],
                         [{"driver": "zarr9", "kvstore": {"driver": "file", "path": str(w)}}]),
        ValueError, r"tensorstore_specs\[0\] is not a tensorstore spec .*zarr9"),
    "spec without a driver": (
        lambda mesh, w: ([_gda(mesh, P("x", "y"))[0]],
                         [{"kvstore": {"driver": "file", "path": str(w)}}]),
        ValueError, r"tensorstore_specs\[0\] is not a tensorstore spec .*'driver'"),
    "spec metadata of another shape": (
        lambda mesh, w: ([_gda(mesh, P("x", "y"))[0]],
                         [dict(_spec(w), metadata={"shape": [3]})]),
        ValueError, r"metadata shape \(3,\), but the array has shape \(8, 4\)"),
    "one path twice": (
        lambda mesh, w: ([_gda(mesh, P("x", "y"))[0]] * 2, [_spec(w), _spec(f"{w}/")]),
        ValueError, r"tensorstore_specs\[0\] and tensorstore_specs\[1\] both name"),
    "stored array of another shape": (
        lambda mesh, w: ([_gda(mesh, P("x"), shape=(4, 4))[0]], [_spec(w)]),
        ValueError, r"cannot write to .*Expected \"shape\" of \[4,4\].*nothing was written"),
    "stored array of another sharding": (
        lambda mesh, w: ([_gda(mesh, P("x"))[0]], [_spec(w)]),
        ValueError, r"cannot write to .*Expected \"chunks\".*nothing was written"),
    "stored array of another dtype": (
        lambda mesh, w: ([_gda(mesh, P("x", "y"), dtype=np.int32)[0]], [_spec(w)]),
        ValueError, r"cannot write to .*dtype.*nothing was written"),
    "a file at the path": (
        lambda mesh, w: ([_gda(mesh, P("x", "y"))[0]], [_spec(w / ".zarray")]),
        ValueError, r"tensorstore_specs\[0\]: cannot write to .*\.zarray' is a file, and a "
                    "checkpoint array is a directory; nothing was written"),
    "a file above the path": (
        lambda mesh, w: ([_gda(mesh, P("x", "y"))[0]], [_spec(w / "0.0" / "new")]),
        ValueError, r"cannot write to .*/w/0\.0/new': .*/w/0\.0' is a file"),
}


def _run_serialization(arrays, specs):
  serialization.run_serialization(arrays, specs)


def _manager_serialize(arrays, specs):
  manager = serialization.GlobalAsyncCheckpointManager()
  try:
    manager.serialize(arrays, specs, on_commit_callback=lambda: None)
  finally:
    manager.wait_until_finished()  # nothing was started: returns at once


def _async_serialize(arrays, specs):
  for arr, spec in zip(arrays, specs, strict=True):
    asyncio.run(serialization.async_serialize(arr, spec))


# `async_serialize` takes one array and one spec.
_ONE_ARRAY = [c for c in REFUSED if c not in ("wrong number of specs", "one path twice")]


@pytest.mark.parametrize("save,case", [
    *((_run_serialization, c) for c in REFUSED), *((_manager_serialize, c) for c in REFUSED),
    *((_async_serialize, c) for c in _ONE_ARRAY)],
    ids=[f"{s}-{c}" for s, cases in (("run_serialization", REFUSED),
                                     ("manager.serialize", REFUSED),
                                     ("async_serialize", _ONE_ARRAY)) for c in cases])
def test_a_refused_save_leaves_a_committed_checkpoint_exactly_as_it_was(
    mesh_2d, tmp_path, case, save):
  """Every check that can refuse a save runs before the commit marker or any
  byte is written: a committed checkpoint at the path keeps every file's bytes
  (no marker appears) and restores as before."""
  old, data = _gda(mesh_2d, P("x", "y"))
  w = tmp_path / "w"
  serialization.run_serialization([old], [_spec(w)])
  before = _snapshot(tmp_path)
  assert before and serialization.COMMIT_MARKER not in "".join(before)
  build, error, message = REFUSED[case]
  arrays, specs = build(mesh_2d, w)
  with pytest.raises(error, match=message):
    save(arrays, specs)
  assert _snapshot(tmp_path) == before
  out, = serialization.run_deserialization([mesh_2d], [P("y")], [_spec(w)])
  np.testing.assert_array_equal(np.asarray(out), data)


def test_a_typed_prng_key_array_is_a_type_error_as_in_stock(tmp_path):
  """Stock `array_serialization.run_serialization` raises a TypeError for a
  typed PRNG key `jax.Array`; the package raises a TypeError too, naming the
  argument and `jax.random.key_data`, before it writes anything (no marker).
  The key data saves and restores."""
  keys = jax.random.split(jax.random.key(0), 8)
  with pytest.raises(TypeError):
    stock.run_serialization([keys], [_spec(tmp_path / "stock")])
  with pytest.raises(TypeError, match=r"arrays\[0\] is a typed PRNG key array \(dtype "
                                      r"key<fry>\).*jax.random.wrap_key_data"):
    serialization.run_serialization([keys], [_spec(tmp_path / "ours")])
  assert not (tmp_path / "ours").exists()
  serialization.run_serialization([jax.random.key_data(keys)], [_spec(tmp_path / "ours")])
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
  data, = serialization.run_deserialization([mesh], [P()], [_spec(tmp_path / "ours")])
  back = jax.random.wrap_key_data(data.to_jax_array())
  np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(keys))


def test_a_refused_save_changes_neither_a_new_path_nor_the_callers_specs(mesh_2d, tmp_path):
  keys = jax.random.split(jax.random.key(0), 8)
  spec = _spec(tmp_path / "w")
  want = dict(spec)
  with pytest.raises(TypeError, match="typed PRNG key array"):
    serialization.run_serialization([keys], [spec])
  assert spec == want and list(tmp_path.iterdir()) == []


# -- one writer per path -------------------------------------------------------------


def test_a_second_writer_to_a_path_being_written_is_refused(mesh_2d, tmp_path):
  """Two managers, or a manager and `run_serialization`, saving to one path:
  the second is refused (RuntimeError) before it writes anything, so the
  first one's commit cannot remove the marker while the second still writes.
  The path is free again once the first manager's `wait_until_finished()` has
  returned. (Stock's manager has no such check.)"""
  first, data = _gda(mesh_2d, P("x", "y"))
  second, data2 = _gda(mesh_2d, P("x", "y"), offset=100)
  ckpt = tmp_path / "ckpt" / "w"
  committing, release = threading.Event(), threading.Event()

  def on_commit():
    committing.set()
    release.wait(60)
  manager_a = serialization.GlobalAsyncCheckpointManager()
  manager_b = serialization.GlobalAsyncCheckpointManager()
  manager_a.serialize([first], [_spec(ckpt)], on_commit_callback=on_commit)
  try:
    # A's writes are done but its commit is still running: it holds the path.
    assert committing.wait(60)
    before = _snapshot(tmp_path)
    with pytest.raises(RuntimeError, match=r"serialize`: tensorstore_specs\[0\]: '.*/ckpt/w' "
                                           r"is being written by a GlobalAsyncCheckpointManager "
                                           r"checkpoint .*wait_until_finished\(\)"):
      manager_b.serialize([second], [_spec(ckpt)], on_commit_callback=lambda: None)
    with pytest.raises(RuntimeError, match=r"run_serialization`: tensorstore_specs\[0\]: .* "
                                           "is being written by a GlobalAsyncCheckpointManager"):
      serialization.run_serialization([second], [_spec(f"{ckpt}/")])
    assert _snapshot(tmp_path) == before  # the refused saves wrote nothing
    manager_b.wait_until_finished()  # B has nothing in flight
  finally:
    release.set()
  manager_a.wait_until_finished()
  assert not (ckpt / serialization.COMMIT_MARKER).exists()
  out, = serialization.run_deserialization([mesh_2d], [P("x")], [_spec(ckpt)])
  np.testing.assert_array_equal(np.asarray(out), data)

  # A has finished: B may write the path now, and A may write it again after B.
  manager_b.serialize([second], [_spec(ckpt)], on_commit_callback=lambda: None)
  manager_b.wait_until_finished()
  out, = serialization.run_deserialization([mesh_2d], [P("x")], [_spec(ckpt)])
  np.testing.assert_array_equal(np.asarray(out), data2)
  manager_a.serialize([first], [_spec(ckpt)], on_commit_callback=lambda: None)
  manager_a.serialize([first], [_spec(ckpt)], on_commit_callback=lambda: None)  # waits first
  manager_a.wait_until_finished()
  serialization.run_serialization([second], [_spec(ckpt)])


def test_a_manager_holds_its_paths_until_it_is_waited_for_even_after_a_failure(
    mesh_2d, tmp_path):
  """A failed checkpoint keeps its marker (it is partial); its path is free
  for another writer once the failing manager's `wait_until_finished()` has
  raised the error, and a refused save releases nothing it did not hold."""
  gda, data = _gda(mesh_2d, P("x", "y"))
  ckpt = tmp_path / "w"
  ckpt.mkdir()
  (ckpt / "0.0").mkdir()  # where the first chunk goes: the write fails
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([gda], [_spec(ckpt)], on_commit_callback=lambda: None)
  for _ in range(2):  # a refused save releases nothing it did not hold
    with pytest.raises(RuntimeError, match="is being written by a GlobalAsyncCheckpointManager"):
      serialization.run_serialization([gda], [_spec(ckpt)])
  with pytest.raises(ValueError, match="Is a directory"):
    manager.wait_until_finished()
  assert (ckpt / serialization.COMMIT_MARKER).exists()
  (ckpt / "0.0").rmdir()
  serialization.run_serialization([gda], [_spec(ckpt)])
  out, = serialization.run_deserialization([mesh_2d], [P("x")], [_spec(ckpt)])
  np.testing.assert_array_equal(np.asarray(out), data)


# -- errors: the caller's line, nothing chained, no asyncio frames ----------------------


def _loop_error(err: BaseException) -> bool:
  """Whether the event-loop probe's RuntimeError is anywhere in `err`'s chain."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if isinstance(err, RuntimeError) and "event loop" in str(err):
      return True
    for e in (err.__cause__, err.__context__):
      if e is not None and _loop_error(e):
        return True
    err = None
  return False


BAD_CALLS = {
    "rank mismatch": lambda mesh, spec, tmp: serialization.run_deserialization(
        [mesh], [P("x")], [spec], [(8,)]),
    "missing checkpoint": lambda mesh, spec, tmp: serialization.run_deserialization(
        [mesh], [P("x")], [_spec(tmp / "missing")]),
    "unknown mesh axis": lambda mesh, spec, tmp: serialization.run_deserialization(
        [mesh], [P("z")], [spec]),
    "manager.deserialize": lambda mesh, spec, tmp: (
        serialization.GlobalAsyncCheckpointManager().deserialize([mesh], [P()], [spec], [(2,)])),
    "stored array of another shape": lambda mesh, spec, tmp: serialization.run_serialization(
        [_gda(mesh, P("x"), shape=(4, 4))[0]], [spec]),
    "manager: another shape": lambda mesh, spec, tmp: (
        serialization.GlobalAsyncCheckpointManager().serialize(
            [_gda(mesh, P("x"), shape=(4, 4))[0]], [spec], on_commit_callback=lambda: None)),
}


@pytest.mark.parametrize("in_loop", [False, True], ids=["script", "inside an event loop"])
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_user_errors_chain_no_event_loop_error_and_end_at_the_callers_line(
    mesh_2d, tmp_path, case, in_loop):
  """As for JAX's own API functions (`jax.jit` etc. with a plain `jax.Array`):
  an error from bad input is raised with the caller's line as the last frame,
  no package or asyncio frames, and no internal exception chained to it."""
  gda, _ = _gda(mesh_2d, P("x", "y"))
  spec = _spec(tmp_path / "w")
  serialization.run_serialization([gda], [spec])
  spec = _spec(tmp_path / "w")

  def call():
    BAD_CALLS[case](mesh_2d, spec, tmp_path)

  async def cell():
    call()

  with pytest.raises(ValueError) as info:
    asyncio.run(cell()) if in_loop else call()
  err = info.value
  assert not _loop_error(err), (err.__cause__, err.__context__)
  assert err.__cause__ is None or isinstance(err.__cause__, jax.errors.SimplifiedTraceback)
  frames = traceback.extract_tb(err.__traceback__)
  # The caller's line is the last frame, right below `call` (nothing between).
  assert [(f.filename, f.name) for f in frames[-2:]] == [
      (__file__, "call"), (__file__, "<lambda>")], frames
  assert not [f for f in frames if f.filename.startswith(PKG)], frames
  if not in_loop:
    assert not [f for f in frames if f.filename.startswith(ASYNCIO)], frames


_SCRIPT = """
import asyncio, os, sys, tempfile
import jax, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from jax_sharding_ext import serialization

mode = sys.argv[1]
path = os.path.join(tempfile.mkdtemp(), "w")
mesh = Mesh(np.array(jax.devices()), ("d",))
serialization.run_serialization([jax.numpy.arange(8.0)], [serialization.get_tensorstore_spec(path)])
spec = serialization.get_tensorstore_spec(path)

def restore():
  serialization.run_deserialization([mesh], [P()], [spec], [(8, 2)])  # USER LINE

async def cell():
  restore()

if mode == "script":
  restore()
elif mode == "loop":
  asyncio.run(cell())
else:  # IPython, inside a running event loop as in a Jupyter kernel
  from IPython.core.interactiveshell import InteractiveShell
  shell = InteractiveShell.instance(colors="nocolor")
  shell.user_ns["restore"] = restore
  async def kernel():
    shell.run_cell("restore()")
  asyncio.run(kernel())
"""


@pytest.mark.parametrize("mode", ["script", "loop", "ipython"])
def test_a_script_shows_the_users_line_and_the_error_only(tmp_path, mode):
  """The printed traceback of a bad restore has no "During handling of the
  above exception" (no event-loop error chained) and no asyncio frames; it
  ends with the user's line and the ValueError, as JAX's filtering prints
  errors from its own API functions. IPython shows no asyncio frame either."""
  script = tmp_path / "user_script.py"
  script.write_text(_SCRIPT)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("JAX_TRACEBACK_FILTERING", None)
  proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                        env=env, timeout=300, cwd=str(tmp_path))
  out = proc.stdout + proc.stderr
  assert "ValueError: `async_deserialize` of" in out, out
  assert "global_shape (8, 2) has rank 2, but the stored array has rank 1" in out, out
  assert "During handling of the above exception" not in out, out
  assert "The above exception was the direct cause" not in out, out
  assert "no running event loop" not in out, out
  if mode != "loop":  # there the user's own `asyncio.run(cell())` is on the stack
    assert "asyncio" not in out, out
  if mode == "ipython":
    # IPython hides the package's frames (JAX marks them `__tracebackhide__`)
    # but always shows the frame that raised: at most that one is the package's.
    assert "serialization.run_deserialization(" in out and "USER LINE" in out, out
    assert "skipping hidden" in out and out.count("jax_sharding_ext/") <= 1, out
    return
  assert proc.returncode == 1, out
  lines = proc.stderr.splitlines()
  err_at = next(i for i, line in enumerate(lines) if line.startswith("ValueError: "))
  file_lines = [i for i, line in enumerate(lines[:err_at]) if line.startswith("  File ")]
  last = file_lines[-1]
  assert lines[last].startswith(f'  File "{script}", line '), lines[last:err_at + 1]
  body = [line for line in lines[last + 1:err_at] if line.strip().strip("^~ ")]
  assert body == ["    serialization.run_deserialization([mesh], [P()], [spec], [(8, 2)])"
                  "  # USER LINE"], lines[last:err_at + 1]


def test_filtering_off_still_shows_every_frame(tmp_path):
  """`JAX_TRACEBACK_FILTERING=off` keeps the package's frames, down to the one
  that raised (the coroutine's frames are kept, not cut off)."""
  script = tmp_path / "user_script.py"
  script.write_text(_SCRIPT)
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_TRACEBACK_FILTERING="off")
  proc = subprocess.run([sys.executable, str(script), "script"], capture_output=True,
                        text=True, env=env, timeout=300, cwd=str(tmp_path))
  assert proc.returncode == 1, proc.stderr
  assert "in run_deserialization" in proc.stderr, proc.stderr
  assert re.search(r'reading\.py", line \d+, in read\n', proc.stderr), proc.stderr
  assert "During handling of the above exception" not in proc.stderr, proc.stderr
  assert "ValueError: `async_deserialize`" in proc.stderr, proc.stderr


def test_stock_interchange_survives_the_checks(mesh_2d, tmp_path):
  """A checkpoint written by stock is overwritten in place by a save of the
  same shape, dtype and sharding with `metadata="stock"` (the checks open it
  and accept it). A default save (gzip) is refused, naming that option, and
  leaves it exactly as it was."""
  data = np.arange(32, dtype=np.float32).reshape(8, 4)
  arr = jax.device_put(data, NamedSharding(mesh_2d, P("x", "y")))
  stock.run_serialization([arr], [_spec(tmp_path / "a")])
  before = _snapshot(tmp_path)
  gda, data2 = _gda(mesh_2d, P("x", "y"), offset=7)
  with pytest.raises(ValueError, match="written with metadata='stock'; pass that to "
                                       "overwrite it in place"):
    serialization.run_serialization([gda], [_spec(tmp_path / "a")])
  assert _snapshot(tmp_path) == before
  serialization.run_serialization([gda], [_spec(tmp_path / "a")], metadata="stock")
  out, = stock.run_deserialization([NamedSharding(mesh_2d, P())], [_spec(tmp_path / "a")])
  np.testing.assert_array_equal(np.asarray(out), data2)
