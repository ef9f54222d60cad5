"""Processes agree on a pytree before a collective, and compare its values.

`assert_equal`, `process_allgather` and `broadcast_one_to_all` of
`multihost_utils` run collectives whose shapes come from the caller's
pytree; processes that pass different trees would enter mismatched
collectives and abort. So each process first describes its tree as lines
(path, what is there) in preorder; the processes exchange a fixed-size
fingerprint of that description (its length and digest) with stock
`process_allgather`, and only when the fingerprints differ, the
descriptions themselves (padded to the longest, whose length every process
now knows). Every collective here has the same shape on every process, and
every process takes the same branches, so all raise together, naming the
path where the trees first differ.

`check_equal` then compares values the same way: one digest per leaf, and
only the leaves whose digests differ are gathered and reported.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils as _stock

from jax_sharding_ext._array.gda import GlobalDeviceArray


def _is_gda(x: Any) -> bool:
  return isinstance(x, GlobalDeviceArray)


_DIGEST_SIZE = 32
_FINGERPRINT_DESC = 8 + _DIGEST_SIZE  # length and digest of the description


def _digest(data: bytes) -> bytes:
  return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).digest()


def _padded(n: int) -> int:
  """A gather's size: few distinct sizes, so few compilations."""
  if n <= 1 << 20:
    return max(128, 1 << (n - 1).bit_length())
  return -(-n // (1 << 20)) * (1 << 20)


def _gather_bytes(data: bytes, size: int | None = None) -> np.ndarray:
  """Every process's `data` as a (processes, size) uint8 array. `size` (by
  default `len(data)`) must be the same on every process."""
  size = len(data) if size is None else size
  buf = np.zeros(_padded(size), np.uint8)
  buf[:len(data)] = np.frombuffer(data, np.uint8)
  return np.asarray(_stock.process_allgather(buf, tiled=False))


Line = tuple[str, str]
"""A node of a described tree: its path (`in_tree` for the root) and what is
there; a refused leaf's text starts with `!`."""


def _describe(tree: Any, fn: str, leaf: Any) -> tuple[list[Line], list[Exception], list]:
  """`tree` as preorder lines, the refusals of its leaves (exceptions, not
  raised yet) and the `(path, value)`s that `leaf(x, where)` returned."""
  lines: list[Line] = []
  errors: list[Exception] = []
  values: list = []

  def walk(node, path):
    where = jax.tree_util.keystr(path) or "in_tree"
    if node is None:
      lines.append((where, "None"))
      return
    children, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and not children[0][0]:
      try:
        text, value = leaf(node, where)
      except (TypeError, ValueError) as e:
        errors.append(e)
        lines.append((where, f"!{type(e).__name__}: {e}"))
        return
      lines.append((where, text))
      if value is not None:
        values.append((where, value))
      return
    lines.append((where, _node_text(node, treedef, [k for k, _ in children])))
    for key, child in children:
      walk(child, (*path, *key))
  walk(tree, ())
  return lines, errors, values


def _node_text(node: Any, treedef: Any, keys: list) -> str:
  if type(node) is dict:
    return f"a dict with keys {[k.key for (k,) in keys]}"
  if type(node) in (list, tuple):
    return f"a {type(node).__name__} of {len(keys)}"
  return f"a {type(node).__qualname__} node, {treedef}"


def _agree(lines: list[Line], errors: list[Exception], extra: bytes, mismatch) -> np.ndarray:
  """Gather every process's fingerprint (with `extra`, the same size on
  every process); return them when all descriptions agree, else raise on
  every process: `mismatch(where)` for a difference, or the refusal of the
  first process that refused a leaf."""
  desc = json.dumps(lines).encode()
  every = _gather_bytes(len(desc).to_bytes(8, "little") + _digest(desc) + extra)
  if len({bytes(row[:_FINGERPRINT_DESC]) for row in every}) == 1:
    if errors:
      raise errors[0]  # the same refusal on every process
    return every
  lengths = [int.from_bytes(bytes(row[:8]), "little") for row in every]
  gathered = _gather_bytes(desc, max(lengths))
  per_process = [[tuple(line) for line in json.loads(bytes(row[:n]))]
                 for row, n in zip(gathered, lengths, strict=True)]
  for k, described in enumerate(per_process):
    refused = next((text for _, text in described if text.startswith("!")), None)
    if refused is not None:
      name, _, why = refused[1:].partition(": ")
      raise (TypeError if name == "TypeError" else ValueError)(
          f"process {k} refused its input: {why}")
  raise mismatch(_first_difference(per_process))


def _processes(ks: list[int]) -> str:
  return f"process {ks[0]}" if len(ks) == 1 else f"processes {', '.join(map(str, ks))}"


def _grouped(texts: list[str], verb: str = "has") -> str:
  """`process 0 has A; processes 1, 2 have B` from one text per process."""
  order: dict[str, list[int]] = {}
  for k, text in enumerate(texts):
    order.setdefault(text, []).append(k)
  return "; ".join(f"{_processes(ks)} {verb if len(ks) == 1 else 'have'} {text}"
                   for text, ks in order.items())


def _first_difference(per_process: list[list[Line]]) -> str:
  """Where the descriptions first differ, and what each process has there.
  Preorder keeps them aligned up to there: equal nodes have equal keys."""
  for i in range(max(map(len, per_process))):
    here = [d[i] if i < len(d) else None for d in per_process]
    if len(set(here)) > 1:
      where = next(line[0] for line in here if line is not None)
      return f"at {where}: " + _grouped([line[1] if line else "nothing" for line in here])
  return "in order"  # unreachable: differing descriptions differ somewhere


def _is_array_dtype(dtype: Any) -> bool:
  return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))


def _not_an_array(fn: str, x: Any, where: str) -> TypeError:
  if isinstance(x, jax.Array):
    what, fix = (f"an array of dtype {x.dtype}",
                 "For PRNG keys, pass `jax.random.key_data(key)`.")
  else:
    what, fix = (f"a {type(x).__name__} ({x!r:.60})",
                 "Convert it to a numpy array, or leave it out of the tree.")
  return TypeError(
      f"`{fn}` takes arrays and scalars of numbers or booleans, but the leaf {where} is "
      f"{what}. {fix}")


def _spanning(fn: str, x: Any, where: str) -> ValueError:
  kind = "GlobalDeviceArray" if _is_gda(x) else "jax.Array"
  spec = x.mesh_axes if _is_gda(x) else getattr(x.sharding, "spec", x.sharding)
  if fn == "broadcast_one_to_all":
    return ValueError(
        f"`broadcast_one_to_all` takes host-local values, but the leaf {where} is a {kind} "
        f"of shape {x.shape} that spans processes: it is already global, so there is "
        "nothing to broadcast. Use `process_allgather` for its value on every process, or "
        "pass a host-local value (e.g. `np.asarray(gda.local_data(0))`).")
  return ValueError(
      f"`assert_equal` got a {kind} of shape {x.shape} sharded as {spec} across "
      f"processes at {where}: each process holds a different part of it, so there is no "
      "per-process value to compare. Compare `process_allgather(x)` (its global value, "
      "the same everywhere), or a fully replicated array.")


def _assert_equal_leaf(x: Any, where: str) -> tuple[str, np.ndarray | None]:
  """A leaf's description and this process's value to compare (or None)."""
  if isinstance(x, jax.Array) and not _is_array_dtype(x.dtype):
    raise _not_an_array("assert_equal", x, where)
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if not x.is_fully_replicated:
      raise _spanning("assert_equal", x, where)
    if not isinstance(x, GlobalDeviceArray):  # stock: each process checks its replica
      return f"an array of dtype {x.dtype} and shape {x.shape} (global: not compared)", None
    value = np.asarray(jax.device_get(x.local_data(0)))  # this process's replica
  elif isinstance(x, jax.Array):
    value = np.asarray(jax.device_get(x))
  else:
    try:
      value = np.asarray(x)
    except Exception:
      raise _not_an_array("assert_equal", x, where) from None
    if not _is_array_dtype(value.dtype):
      raise _not_an_array("assert_equal", x, where)
  return f"an array of dtype {value.dtype} and shape {value.shape}", value


def _value_difference(where: str, per_process: list[np.ndarray]) -> str | None:
  """Where processes' values of one leaf differ, or None if they are equal."""
  first = per_process[0]
  same = np.ones(first.shape, bool)
  for other in per_process[1:]:
    eq = first == other
    if jnp.issubdtype(first.dtype, jnp.inexact):
      with np.errstate(invalid="ignore"):
        eq = eq | (np.isnan(first) & np.isnan(other))
    same &= eq
  if same.all():
    return None
  head = f"{where} ({first.dtype}, shape {first.shape})"
  if first.ndim == 0:
    return f"{head}: " + _grouped([str(v[()]) for v in per_process]) + "."
  k = int(np.argmin(same.reshape(-1)))
  idx = tuple(int(i) for i in np.unravel_index(k, first.shape))
  text = (f"{head}, in {int(same.size - same.sum())} of {same.size} elements; the first at "
          f"index {idx}: " + _grouped([str(v[idx]) for v in per_process]) + ".")
  if first.size <= 16:
    text += " Whole values: " + _grouped(
        [np.array2string(v, separator=", ").replace("\n", "") for v in per_process]) + "."
  return text


def _layout_leaf(fn: str):
  """The description of a leaf whose layout (not value) must agree before
  `fn`'s collective."""
  def leaf(x: Any, where: str) -> tuple[str, None]:
    if isinstance(x, jax.Array):
      if not _is_array_dtype(x.dtype):
        raise _not_an_array(fn, x, where)
      if fn == "broadcast_one_to_all" and _is_gda(x) and not x.is_fully_addressable:
        raise _spanning(fn, x, where)
      how = ("global" if not x.is_fully_addressable
             else "this process's own GDA" if _is_gda(x) else "host-local")
      return f"an array of dtype {_canonical(x.dtype)} and shape {x.shape} ({how})", None
    try:
      value = np.asarray(x)  # numpy as it is; a scalar is cheap to convert
    except Exception:
      raise _not_an_array(fn, x, where) from None
    if not _is_array_dtype(value.dtype):
      raise _not_an_array(fn, x, where)
    return (f"an array of dtype {_canonical(value.dtype)} and shape {value.shape} "
            "(host-local)"), None
  return leaf


def _canonical(dtype: Any) -> np.dtype:
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def agree_on_layout(in_tree: Any, fn: str) -> None:
  """Raise on every process unless all pass `in_tree` with the same
  structure, shapes and dtypes (what `fn`'s collective needs). A leaf that
  is not an array is refused in one process too, as it would be in many."""
  if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(in_tree)):
    return  # traced: stock's own error
  lines, errors, _ = _describe(in_tree, fn, _layout_leaf(fn))
  if jax.process_count() == 1:
    if errors:
      raise errors[0]
    return
  _agree(lines, errors, b"", lambda where: ValueError(
      f"`{fn}` needs `in_tree` with the same structure, shapes and dtypes on every "
      f"process, but the processes' trees differ {where}."))


def check_equal(in_tree: Any, fail_message: str) -> None:
  """`multihost_utils.assert_equal`: raise the same `AssertionError` on
  every process unless all hold equal values in equal trees."""
  for x in jax.tree_util.tree_leaves(in_tree):
    if isinstance(x, jax.core.Tracer):
      np.asarray(x)  # JAX's own error for a traced value, before any collective
  prefix = f"{fail_message}. " if fail_message else ""
  lines, errors, values = _describe(in_tree, "assert_equal", _assert_equal_leaf)
  if jax.process_count() == 1:
    if errors:
      raise errors[0]
    return
  digests = [_digest(np.ascontiguousarray(v).tobytes()) for _, v in values]
  every = _agree(lines, errors, _digest(b"".join(digests)),
                 lambda where: AssertionError(f"{prefix}`assert_equal`: the processes' "
                                              f"trees differ {where}."))
  if len({bytes(row[_FINGERPRINT_DESC:]) for row in every}) == 1:
    return
  # Some values differ: find the leaves whose digests differ, then gather
  # only those leaves (the same ones on every process) and compare them.
  per_leaf = _gather_bytes(b"".join(digests))
  n = _DIGEST_SIZE
  differing = [j for j in range(len(values))
               if len({bytes(row[j * n:(j + 1) * n]) for row in per_leaf}) > 1]
  payload = b"".join(np.ascontiguousarray(values[j][1]).tobytes() for j in differing)
  gathered = _gather_bytes(payload)
  reports, offset = [], 0
  for j in differing:
    where, value = values[j]
    size = value.nbytes
    per_process = [np.frombuffer(bytes(row[offset:offset + size]), value.dtype)
                   .reshape(value.shape) for row in gathered]
    offset += size
    report = _value_difference(where, per_process)
    if report:
      reports.append((where, report))
  if not reports:
    return  # only NaN payloads or signed zeros differ
  message = f"{prefix}`assert_equal`: the processes' values differ at {reports[0][1]}"
  if len(reports) > 1:
    message += f" The values at {', '.join(w for w, _ in reports[1:])} differ too."
  raise AssertionError(message)
