"""Fuzzer: the `multihost_utils` helpers across 2 real processes.

A case (`strategies.MhCase`) is one call of a helper on every process:
`assert_equal`, `process_allgather` or `broadcast_one_to_all` on a random
pytree (dicts, lists, tuples, None; numpy, `jax.Array`, GDA and scalar leaves
of several dtypes and shapes) that some process changed on its own (a value,
a dtype, a shape, the structure, a leaf that is not an array), or
`host_local_array_to_global_array` / `global_array_to_host_local_array` with
meshes, specs and leaves that may not fit.

The model: equal trees pass `assert_equal`; differing ones make every process
raise the same `AssertionError`, naming a path where they differ and showing
both values at the first differing element (or both dtypes and shapes);
`process_allgather` / `broadcast_one_to_all` give every process the gathered
/ source's values when the processes agree on structure, shapes and dtypes,
and otherwise every process raises the same `ValueError` naming the path;
bad input is a `ValueError` / `TypeError` that names the argument or the
leaf, or exactly what stock does for the same input with each GDA as its
`jax.Array`, when that is a `ValueError` / `TypeError`. Never a hang, a crash
or a bare XLA error.

Multi-process runs are expensive, so hypothesis draws a batch of cases in
this process and the whole batch runs in one 2-process run
(`_fuzz_multihost_worker.py`): each worker runs every case on its own tree,
judges its own result by the model and reports per case; this process checks
that the processes agree. A case that crashes or hangs the workers is a
failure naming it, and the batch goes on from the next case in a new run.
Failing cases are reported smallest first; under `make fuzz` the smallest is
saved as a test (`check_cases` on it). There is no shrinking (each step
would be a run of its own): the strategies draw small trees.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _fuzz import FUZZ, LOG, budget, save_found
from hypothesis import given
from strategies import (
  MH_LOCAL_DEVICES,
  MH_MESHES,
  MH_PROCESSES,
  MH_SPECS,
  MhCase,
  MhChange,
  MhLeaf,
  mh_cases,
)

pytestmark = pytest.mark.fuzz

_CONTAINERS = ("list", "tuple", "dict")
_COLLECTIVES = ("assert_equal", "process_allgather", "broadcast_one_to_all")


# ---------------------------------------------------------------------------
# A case as each process's data: the common tree with its own changes.
# ---------------------------------------------------------------------------


def _edit(node: Any, change: MhChange) -> Any:
  kind, arg = change.kind, change.arg
  if isinstance(node, MhLeaf):
    if kind == "value":
      return dataclasses.replace(node, bump=int(arg))
    if kind == "dtype":
      return dataclasses.replace(
          node, dtype=arg, kind="numpy_scalar" if node.kind == "python" else node.kind)
    if kind == "shape":
      return dataclasses.replace(
          node, shape=tuple(arg),
          kind="numpy" if node.kind in ("python", "numpy_scalar") else node.kind)
    if kind == "none_leaf":
      return ("none",)
    if kind == "not_array":
      return MhLeaf("str", node.dtype, (), node.seed)
    return node
  if not (isinstance(node, tuple) and node[0] in _CONTAINERS):
    return node
  children = node[1]
  if kind == "extra_key" and node[0] == "dict":
    return ("dict", (*children, ("zz", MhLeaf("numpy", "float32", (1,)))))
  if kind == "list_tuple":
    if node[0] == "dict":
      return ("list", tuple(c for _, c in children))
    return ("tuple" if node[0] == "list" else "list", children)
  if kind == "drop" and children:
    return (node[0], children[:-1])
  return node


def _at(node: Any, path: tuple[int, ...], change: MhChange) -> Any:
  if not path:
    return _edit(node, change)
  if not (isinstance(node, tuple) and node[0] in _CONTAINERS) or path[0] >= len(node[1]):
    return node  # an earlier change moved it
  i, children = path[0], node[1]
  if node[0] == "dict":
    new = (children[i][0], _at(children[i][1], path[1:], change))
  else:
    new = _at(children[i], path[1:], change)
  return (node[0], (*children[:i], new, *children[i + 1:]))


def process_tree(case: MhCase, p: int) -> Any:
  """The tree (as data) that process `p` passes."""
  tree = case.tree
  for change in case.changes:
    if change.process == p:
      tree = _at(tree, change.path, change)
  return tree


def _dtype(name: str) -> np.dtype:
  import ml_dtypes
  return np.dtype(getattr(ml_dtypes, name, name))


def leaf_value(leaf: MhLeaf, p: int) -> np.ndarray:
  """The numpy value of `leaf` on process `p`."""
  dt = _dtype(leaf.dtype)
  rng = np.random.default_rng([leaf.seed, p if leaf.per_process else 0, 7])
  raw = rng.integers(0, 5, size=leaf.shape)
  if dt == np.bool_:
    value = raw % 2 == 1
  elif dt.kind == "c":
    value = (raw + 1j * rng.integers(0, 5, size=leaf.shape)).astype(dt)
  else:
    value = raw.astype(dt)
  if leaf.bump >= 0 and value.size:
    flat = value.reshape(-1).copy()
    k = leaf.bump % flat.size
    flat[k] = not flat[k] if dt == np.bool_ else flat[k] + dt.type(1)
    value = flat.reshape(leaf.shape)
  return np.asarray(value)  # an array for shape () too (numpy's ufuncs give scalars)


# ---------------------------------------------------------------------------
# The model: what each process holds as host values, and how trees differ.
# ---------------------------------------------------------------------------


class _Bad:
  """A leaf the helper must refuse."""

  def __init__(self, why: str):
    self.why = why


class _Global:
  """A leaf whose value is global (the same on every process, not gathered)."""

  def __init__(self, value: np.ndarray):
    self.value = value


def host_view(node: Any, p: int, op: str) -> Any:
  """What `op` sees of `node` on process `p`: containers, None, numpy values,
  `_Global` values, `_Bad` leaves."""
  if isinstance(node, MhLeaf):
    if node.kind in ("str", "object"):
      return _Bad(node.kind)
    if node.kind == "gda_sharded":
      if op == "process_allgather":
        value = leaf_value(node, 0)
        return _Global(value.astype(_canonical(value.dtype)))
      return _Bad("a GDA sharded across processes")
    if node.kind == "gda_replicated" and op == "broadcast_one_to_all":
      return _Bad("a GDA spanning processes")
    value = leaf_value(node, p)
    if node.kind == "python":
      value = np.asarray(value.item())  # what numpy makes of the Python scalar
    if node.kind in ("jax", "gda", "gda_replicated"):
      value = value.astype(_canonical(value.dtype))  # on a device: JAX's dtype
    if node.kind == "gda" and op == "process_allgather":
      return _Global(value)  # a GDA on this process's devices: its value, not gathered
    return value
  if node == ("none",):
    return None
  kind, children = node
  if kind == "dict":
    return {k: host_view(c, p, op) for k, c in children}
  items = [host_view(c, p, op) for c in children]
  return items if kind == "list" else tuple(items)


def _keystr(path: tuple) -> str:
  return "".join(f"[{k!r}]" for k in path)


def _bad_paths(view: Any, path: tuple = ()) -> list[tuple]:
  if isinstance(view, _Bad):
    return [path]
  if isinstance(view, dict):
    return [q for k, c in view.items() for q in _bad_paths(c, (*path, k))]
  if isinstance(view, list | tuple):
    return [q for i, c in enumerate(view) for q in _bad_paths(c, (*path, i))]
  return []


def _equal_values(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  eq = a == b
  if a.dtype.kind in "fcV":  # NaN equals NaN: processes that agree on a NaN agree
    with np.errstate(invalid="ignore"):
      eq = eq | (np.isnan(a) & np.isnan(b))
  return np.asarray(eq)


def _canonical(dtype: np.dtype) -> np.dtype:
  import jax
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


@dataclasses.dataclass
class Diff:
  path: tuple
  kind: str  # "structure", "meta" (dtype or shape) or "value"
  details: tuple[str, ...] = ()  # strings the message must show


def diffs(a: Any, b: Any, values: bool, canonical: bool, path: tuple = ()) -> list[Diff]:
  """Where `b` differs from `a` (trees of `host_view`s)."""
  kinds = [type(x).__name__ if not isinstance(x, np.ndarray) else "array" for x in (a, b)]
  if kinds[0] != kinds[1]:
    return [Diff(path, "structure")]
  if isinstance(a, dict):
    if sorted(a) != sorted(b):
      return [Diff(path, "structure")]
    return [d for k in sorted(a) for d in diffs(a[k], b[k], values, canonical, (*path, k))]
  if isinstance(a, list | tuple):
    if len(a) != len(b):
      return [Diff(path, "structure")]
    return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in diffs(x, y, values, canonical, (*path, i))]
  if isinstance(a, _Global):
    a, b = a.value, b.value
  if isinstance(a, np.ndarray):
    da, db = (_canonical(x.dtype) if canonical else x.dtype for x in (a, b))
    if da != db or a.shape != b.shape:
      return [Diff(path, "meta", (str(da), str(db), str(a.shape), str(b.shape)))]
    if values:
      eq = _equal_values(a, b)
      if not eq.all():
        k = int(np.argmin(eq.reshape(-1)))
        idx = np.unravel_index(k, a.shape)
        index = str(tuple(int(i) for i in idx)) if a.ndim else ""
        return [Diff(path, "value", (index, str(a[idx]), str(b[idx])))]
  return []


def _named(message: str, path: tuple) -> bool:
  return (_keystr(path) in message) if path else "in_tree" in message


def expect_collective(case: MhCase, n: int, p: int) -> tuple[str, Any]:
  """What process `p` must get from a collective helper: ("pass",),
  ("bad", paths), ("mismatch", diffs) or ("value", expected)."""
  op = case.op
  views = [host_view(process_tree(case, q), q, op) for q in range(n)]
  bad = sorted({p for v in views for p in _bad_paths(v)}, key=repr)
  found = [d for q in range(1, n) for d in diffs(views[0], views[q], op == "assert_equal",
                                                 op != "assert_equal")]
  if bad:
    return ("bad", bad)
  if found:
    return ("mismatch", found)
  if op == "assert_equal":
    return ("pass", None)
  if op == "broadcast_one_to_all":
    source = 0 if case.option is None else case.option
    return ("value", _map(lambda x: x.astype(_canonical(x.dtype)), views[source]))
  tiled = bool(case.option)

  def gathered(*xs):
    if isinstance(xs[p], _Global):  # a global value, or this process's own GDA
      return xs[p].value.astype(_canonical(xs[p].value.dtype))
    xs = [x.astype(_canonical(x.dtype)) for x in xs]
    return np.concatenate(xs) if tiled and xs[0].ndim else np.stack(xs)
  return ("value", _map(gathered, *views))


def _map(fn, *trees):
  t = trees[0]
  if isinstance(t, dict):
    return {k: _map(fn, *(x[k] for x in trees)) for k in t}
  if isinstance(t, list | tuple):
    out = [_map(fn, *xs) for xs in zip(*trees, strict=True)]
    return out if isinstance(t, list) else tuple(out)
  if t is None:
    return None
  return fn(*trees)


def _same_tree(got: Any, want: Any, path: tuple = ()) -> list[str]:
  if isinstance(want, dict | list | tuple) or want is None:
    if type(got) is not type(want) or (isinstance(want, dict) and sorted(got) != sorted(want)) \
        or (want is not None and len(got) != len(want)):
      return [f"{_keystr(path) or 'the tree'}: got {type(got).__name__} {got!r:.200}, "
              f"want {type(want).__name__}"]
    if want is None:
      return []
    keys = sorted(want) if isinstance(want, dict) else range(len(want))
    return [e for k in keys for e in _same_tree(got[k], want[k], (*path, k))]
  if not isinstance(got, np.ndarray):
    return [f"{_keystr(path)}: got {type(got).__name__}, want a numpy array"]
  if got.shape != want.shape or got.dtype != want.dtype:
    return [f"{_keystr(path)}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"]
  if not _equal_values(got, want).all():
    return [f"{_keystr(path)}: got {got!r:.300}, want {want!r:.300}"]
  return []


# ---------------------------------------------------------------------------
# The worker side (`_fuzz_multihost_worker.py`): build, call, judge locally.
# ---------------------------------------------------------------------------

_MESH_CACHE: dict = {}


def _mesh(name: str) -> Any:
  import jax
  from jax.sharding import Mesh
  devices = np.array(jax.devices())  # process-major: process p's devices are a block
  if name == "rows":
    return Mesh(devices.reshape(MH_PROCESSES, -1), ("x", "y"))
  if name == "cols":
    return Mesh(devices.reshape(-1, 2), ("x", "y"))
  if name == "flat":
    return Mesh(devices, ("x",))
  if name == "interleaved":
    return Mesh(devices.reshape(MH_PROCESSES, -1).T.reshape(-1), ("x",))
  if name == "local_only":
    return Mesh(np.array(jax.local_devices()), ("x",))
  if name == "none":
    return None
  if name == "device_list":
    return list(jax.devices())
  raise ValueError(name)


def _spec(entry: Any) -> Any:
  from jax.sharding import PartitionSpec as P
  if entry == "none":
    return None
  if isinstance(entry, str):
    kind, value = entry.split(":")
    return value if kind == "str" else int(value)
  return P(*entry)


def build(node: Any, p: int) -> Any:
  """The real pytree process `p` passes for `node`."""
  import jax
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import GlobalDeviceArray as GDA
  if isinstance(node, MhLeaf):
    if node.kind == "str":
      return "leaf"
    if node.kind == "object":
      return object()
    value = leaf_value(node, p)
    if node.kind == "numpy":
      return value
    if node.kind == "python":
      return value.item()
    if node.kind == "numpy_scalar":
      return value[()]
    if node.kind == "jax":
      return jax.device_put(value, jax.local_devices()[0])
    if node.kind == "gda":
      mesh = Mesh(np.array(jax.local_devices()), ("l",))
      spec = P("l") if value.ndim and value.shape[0] % MH_LOCAL_DEVICES == 0 else P()
      return GDA.from_callback(value.shape, mesh, spec, lambda i: value[i])
    mesh = Mesh(np.array(jax.devices()), ("g",))
    spec = P("g") if node.kind == "gda_sharded" else P()
    return GDA.from_callback(value.shape, mesh, spec, lambda i: value[i])
  if node == ("none",):
    return None
  kind, children = node
  if kind == "dict":
    return {k: build(c, p) for k, c in children}
  items = [build(c, p) for c in children]
  return items if kind == "list" else tuple(items)


def _outcome(fn, *args) -> tuple[dict, Any]:
  try:
    out = fn(*args)
  except Exception as e:  # the outcome under judgement
    return {"outcome": "raise", "type": type(e).__name__,
            "module": type(e).__module__, "message": str(e)}, e
  return {"outcome": "ok"}, out


def _judge_collective(case: MhCase, record: dict, out: Any, p: int, n: int) -> list[str]:
  kind, want = expect_collective(case, n, p)
  raised, message, etype = record["outcome"] == "raise", record.get("message", ""), \
      record.get("type")
  if kind in ("pass", "value"):
    if raised:
      return [f"raised {etype}: {message[:600]}; want {kind}"]
    return _same_tree(out, want) if kind == "value" else []
  if not raised:
    return [f"returned; want {kind} {want}"]
  if kind == "bad":
    if etype not in ("ValueError", "TypeError"):
      return [f"raised {etype}: {message[:600]}; want ValueError/TypeError naming {want}"]
    if not any(_named(message, p) for p in want):
      return [f"{etype} names none of {[_keystr(p) for p in want]}: {message[:600]}"]
    return []
  want_type = "AssertionError" if case.op == "assert_equal" else "ValueError"
  if etype != want_type:
    return [f"raised {etype}: {message[:600]}; want {want_type} naming one of "
            f"{[_keystr(d.path) or 'in_tree' for d in want]}"]
  if case.op == "assert_equal" and not message.startswith(case.message):
    return [f"the message does not start with {case.message!r}: {message[:300]}"]
  named = [d for d in want if _named(message, d.path)]
  if not named:
    return [f"names none of {[_keystr(d.path) or 'in_tree' for d in want]}: {message[:600]}"]
  if not any(all(s in message for s in d.details) for d in named):
    return [f"does not show {[d.details for d in named]}: {message[:800]}"]
  return []


_ARGUMENTS = ("pspecs", "global_mesh", "local_inputs", "global_inputs")


def _conversion(case: MhCase, p: int) -> tuple[dict, list[str]]:
  import jax
  from jax.experimental import multihost_utils as stock
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jax_sharding_ext import GlobalDeviceArray as GDA
  from jax_sharding_ext import multihost_utils as mu
  tree = build(process_tree(case, p), p)
  if case.op == "global_array_to_host_local_array":
    rows = _mesh("rows")

    def globalise(x):
      if not isinstance(x, jax.Array):
        return x
      # This package's conversion: stock's fails for an array sharded over
      # several local devices ("exactly one shard").
      return mu.host_local_array_to_global_array(x, rows, P("x") if x.ndim else P())
    tree = jax.tree.map(globalise, tree)
  mesh, pspecs = _mesh(case.mesh), _spec(case.pspecs)
  views = jax.tree.map(lambda x: x.to_jax_array() if isinstance(x, GDA) else x, tree)
  record, out = _outcome(getattr(mu, case.op), tree, mesh, pspecs)
  srecord, sout = _outcome(getattr(stock, case.op), views, mesh, pspecs)
  stock_clear = isinstance(sout, ValueError | TypeError)
  record["stock"] = srecord
  problems = []
  etype, message = record.get("type"), record.get("message", "")
  if record["outcome"] == "raise":
    same_as_stock = (srecord["outcome"] == "raise" and srecord["type"] == etype
                     and srecord["message"] == message)
    # Stock's NotImplementedError (resharding an array that spans processes)
    # is clear: taken when it is stock's own.
    clear = (isinstance(out, ValueError | TypeError) and not etype.endswith("RuntimeError")
             or isinstance(out, NotImplementedError) and same_as_stock)
    names = any(a in message for a in _ARGUMENTS) or re.search(r"\[('\w+'|\d+)\]", message)
    if not clear:
      problems.append(f"raised {record['module']}.{etype}: {message[:600]} (stock: "
                      f"{srecord.get('type')}: {srecord.get('message', '')[:300]})")
    elif not (names or same_as_stock):
      problems.append(f"{etype} names no argument and is not stock's: {message[:600]} "
                      f"(stock: {srecord.get('type')}: {srecord.get('message', '')[:300]})")
    return record, problems
  if srecord["outcome"] == "raise":
    # Ours may return where stock fails on its own: `None` specs (replicated,
    # as in GDA-era pjit), a device array of another sharding (resharded),
    # or where stock raises no ValueError / TypeError (a Python scalar).
    lenient = (case.pspecs == "none" or "exactly one shard" in srecord["message"]
               or not stock_clear)
    if not lenient:
      problems.append(f"returned where stock raised {srecord['type']}: "
                      f"{srecord['message'][:400]}")
    elif case.op == "host_local_array_to_global_array":  # it must round-trip
      back = jax.tree.leaves(mu.global_array_to_host_local_array(out, mesh, pspecs))
      for i, (b, x) in enumerate(zip(back, jax.tree.leaves(tree), strict=True)):
        if not np.array_equal(np.asarray(b), np.asarray(x).astype(np.asarray(b).dtype)):
          problems.append(f"leaf {i} does not come back: {np.asarray(b)!r:.200} for "
                          f"{np.asarray(x)!r:.200}")
    return record, problems
  got, want = jax.tree.leaves(out), jax.tree.leaves(sout)
  inputs = jax.tree.leaves(tree)
  kinds = [isinstance(x, GDA) for x in inputs]
  if len(got) != len(want):
    return record, [f"{len(got)} leaves, stock {len(want)}"]
  for i, (g, w) in enumerate(zip(got, want, strict=True)):
    if isinstance(g, GDA) != kinds[i]:
      problems.append(f"leaf {i}: {type(g).__name__} for a {'GDA' if kinds[i] else 'non-GDA'}")
    # Stock gives a Python scalar's array a 64-bit dtype with x64 off (its
    # data is 32-bit); this package the canonical dtype, as for numpy.
    if g.shape != w.shape or g.dtype != _canonical(w.dtype):
      problems.append(f"leaf {i}: {g.dtype}{g.shape}, stock {w.dtype}{w.shape}")
      continue
    if not (isinstance(g.sharding, NamedSharding) and g.sharding.is_equivalent_to(w.sharding,
                                                                                    g.ndim)):
      problems.append(f"leaf {i}: sharding {g.sharding}, stock {w.sharding}")
    if case.op == "global_array_to_host_local_array" and not isinstance(inputs[i], jax.Array):
      # A host value is the global value: this process gets its part (stock
      # slices it by the global shape, which is wrong where the local mesh
      # is smaller: for a size-0 dimension it returns shards of another shape).
      part = _local_part(np.asarray(inputs[i]), mesh, pspecs)
      if not np.array_equal(np.asarray(g), part.astype(g.dtype)):
        problems.append(f"leaf {i}: {np.asarray(g)!r:.200}, this process's part of the "
                        f"global value is {part!r:.200}")
      continue
    by_device = {s.device: np.asarray(s.data) for s in w.addressable_shards}
    for s in g.addressable_shards:
      if not np.array_equal(np.asarray(s.data), by_device.get(s.device)):
        problems.append(f"leaf {i}: the shard on {s.device} differs from stock's")
  return record, problems


def _local_part(value: np.ndarray, mesh: Any, spec: Any) -> np.ndarray:
  """The block of the global `value` this process's devices hold (a
  contiguous block: the conversion needs the local devices to form one)."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  indices = NamedSharding(mesh, spec if spec is not None else P()).addressable_devices_indices_map(
      value.shape).values()
  block = tuple(slice(min(ix[d].indices(n)[0] for ix in indices),
                      max(ix[d].indices(n)[1] for ix in indices))
                for d, n in enumerate(value.shape))
  return value[block]


def run_case(case: MhCase, p: int, n: int) -> dict:
  """Run `case` on process `p` of `n`; its outcome and what the model finds wrong."""
  try:
    return _run_case(case, p, n)
  except Exception:  # the harness itself failed on this case: report it
    import traceback
    return {"outcome": "harness", "problems": [traceback.format_exc()[-2000:]]}


def _run_case(case: MhCase, p: int, n: int) -> dict:
  from jax_sharding_ext import multihost_utils as mu
  if case.op in _COLLECTIVES:
    tree = build(process_tree(case, p), p)
    if case.op == "assert_equal":
      record, out = _outcome(mu.assert_equal, tree, case.message)
    elif case.op == "process_allgather":
      record, out = _outcome(mu.process_allgather, tree, bool(case.option))
    else:
      source = None if case.option is None else p == case.option
      record, out = _outcome(mu.broadcast_one_to_all, tree, source)
    record["problems"] = _judge_collective(case, record, out, p, n)
  else:
    record, problems = _conversion(case, p)
    record["problems"] = problems
  return record


# ---------------------------------------------------------------------------
# The runner side: a batch in one 2-process run, resumed after a crash.
# ---------------------------------------------------------------------------

_WORKER = Path(__file__).resolve().parent / "_fuzz_multihost_worker.py"
_LINE = re.compile(r"MH(START|RESULT|DONE) (.*)$")


def _parse(stdout: str) -> tuple[dict[int, dict], set[int], int | None]:
  results, done, started = {}, set(), None
  for line in stdout.splitlines():
    m = _LINE.search(line)
    if not m:
      continue
    if m[1] == "START":
      started = int(m[2])
    elif m[1] == "DONE":
      done.add(int(m[2]))
    else:
      try:
        record = json.loads(m[2])
      except json.JSONDecodeError:
        continue
      results[record["i"]] = record
  return results, done, started


def run_cases(cases: list[MhCase] | tuple[MhCase, ...]) -> list[tuple[MhCase, list[str]]]:
  """Run `cases` on 2 processes; each case with the problems found (none: it
  behaved as the model says)."""
  from _multihost import run_workers
  cases = list(cases)
  problems: dict[int, list[str]] = {i: [] for i in range(len(cases))}
  records: dict[int, list[dict | None]] = {i: [None] * MH_PROCESSES for i in range(len(cases))}
  with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(repr(tuple(cases)))
  try:
    first = 0
    while first < len(cases):
      run = run_workers(_WORKER, MH_PROCESSES, MH_LOCAL_DEVICES, args=(f.name, first),
                        timeout=90 + 5 * (len(cases) - first))
      logs = [_read(f"{f.name}.{p}.log") for p in range(MH_PROCESSES)]
      parsed = [_parse(log) for log in logs]
      for p, (results, _, _) in enumerate(parsed):
        for i, record in results.items():
          records[i][p] = record
      done = set.intersection(*(d for _, d, _ in parsed))
      if run.ok:
        break
      stuck = min(set(range(first, len(cases))) - done)
      tails = [log[log.rfind(f"MHSTART {stuck}\n"):] for log in logs]
      why = "hung (the watchdog ended it)" if any("Timeout (0:" in t for t in tails) else (
          run.summary())
      problems[stuck].append(f"the workers failed in this case: {why}\n" + "\n".join(
          f"[process={p}] rc={run.returncodes[p]}\n{t[-2000:]}\n{run.outputs[p][1][-1500:]}"
          for p, t in enumerate(tails)))
      first = stuck + 1
  finally:
    for name in (f.name, *(f"{f.name}.{p}.log" for p in range(MH_PROCESSES))):
      if os.path.exists(name):
        os.unlink(name)
  for i, case in enumerate(cases):
    if problems[i]:
      continue
    got = records[i]
    for p, record in enumerate(got):
      if record is None:
        problems[i].append(f"process {p} reported nothing")
      else:
        problems[i] += [f"process {p}: {e}" for e in record["problems"]]
    if problems[i]:
      continue
    kinds = {(r["outcome"], r.get("type")) for r in got if r}
    if len(kinds) > 1:
      problems[i].append(f"the processes disagree: {[(r['outcome'], r.get('type'), r.get('message', '')[:300]) for r in got if r]}")
    elif case.op in _COLLECTIVES and len({r.get("message") for r in got if r}) > 1:
      problems[i].append("the processes raised different messages: "
                         + " | ".join(r.get("message", "")[:400] for r in got if r))
  return [(case, problems[i]) for i, case in enumerate(cases)]


def _read(path: str) -> str:
  try:
    with open(path, errors="replace") as f:
      return f.read()
  except FileNotFoundError:
    return ""


def check_cases(cases: tuple[MhCase, ...]) -> None:
  """Raise `AssertionError` describing every case that breaks the model
  (the target of a saved example)."""
  failing = [(c, e) for c, e in run_cases(cases) if e]
  if failing:
    raise AssertionError(_report(failing))


def _report(failing) -> str:
  return "\n\n".join(f"{case!r}\n  " + "\n  ".join(problems) for case, problems in failing)


# ---------------------------------------------------------------------------
# The property.
# ---------------------------------------------------------------------------

BATCH = 80


def sweep() -> list[MhCase]:
  """Cases a batch of random ones reaches rarely: each conversion with a GDA
  leaf over every mesh and spec (the conversion of a GDA spanning processes
  with `None` specs onto this process's devices was one in 1,600), and
  collectives on trees that differ between processes only where their
  descriptions keep their length (a shape's dimensions swapped, float32 for
  float64, one element)."""
  leaf = MhLeaf("gda", "float32", (8, 4))
  cases = [MhCase(op, ("dict", (("a", leaf),)), mesh=mesh, pspecs=spec)
           for op in ("host_local_array_to_global_array", "global_array_to_host_local_array")
           for mesh in MH_MESHES for spec in MH_SPECS]
  tree = ("dict", (("a", MhLeaf("numpy", "float32", (2, 3))),
                   ("b", MhLeaf("jax", "float32", (4,)))))
  for op in ("assert_equal", "process_allgather", "broadcast_one_to_all"):
    for change in (MhChange(1, "shape", (0,), (3, 2)), MhChange(1, "dtype", (0,), "float64"),
                   MhChange(1, "dtype", (1,), "float64"), MhChange(0, "value", (1,), 2)):
      if op != "assert_equal" and change.kind == "value":
        continue  # the others take differing values
      cases.append(MhCase(op, tree, (change,)))
  return cases


def _draw(n: int) -> list[MhCase]:
  batch: list[MhCase] = []

  @budget(n)
  @given(mh_cases())
  def collect(case):
    batch.append(case)
  collect()
  return batch


def test_multihost_helpers_agree_or_every_process_raises_clearly():
  """Each helper, on trees some process changed and on bad meshes, specs and
  leaves, on 2 processes: equal trees pass and agreeing ones give the
  gathered / broadcast values; otherwise every process raises the same
  clear error naming the path or argument (or stock's own ValueError /
  TypeError); never a hang, a crash or a bare XLA error."""
  batch = _draw(BATCH) + sweep()
  failing = sorted(((c, e) for c, e in run_cases(batch) if e), key=lambda ce: len(repr(ce[0])))
  if not failing:
    return
  if FUZZ:  # the smallest failing case; the batch up to it for `verify_found`
    first = failing[0][0]
    upto = next(i for i, c in enumerate(batch) if c is first)
    save_found("test_fuzz_multihost:check_cases", (first,), before=[],
               context=tuple(batch[:upto + 1]))
  if LOG:
    with open(LOG, "a") as f:
      for case, problems in failing:
        f.write(f"{case!r}\t{problems[0].splitlines()[0][:300]}\n")
  pytest.fail(f"{len(failing)} of {len(batch)} cases break the model:\n\n" + _report(failing),
              pytrace=False)
