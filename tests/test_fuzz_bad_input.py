"""Fuzzer: bad (and odd but legal) input at every public entry point of the array side.

Meshes (no devices, a device listed twice, an axis name twice, integers or
strings where devices belong), shapes (negative, floats, bools, numpy
scalars, not a sequence, very long), mesh axes (unknown or repeated names,
too many entries, wrong types, nested wrongly, each spelling), data callback
results (wrong shape or dtype, scalars, lists, None, strings, `jax.Array`s
on other or several devices, deleted, raising), constructor buffers (wrong
count, order, shape, dtype, devices, deleted, not arrays), shard access by
index, and legacy `pjit` specs and argnums. (Meshes over another process's
devices are not drawn: one process cannot make them; the multi-process
tests build GDAs over such meshes.)

The model: the same input given to stock JAX for a `jax.Array`
(`jax.make_array_from_callback`, `jax.make_array_from_single_device_arrays`,
`NamedSharding.devices_indices_map`, `jax.Array.addressable_data`, `jax.jit`
with `in_shardings`) decides. Where stock succeeds the package succeeds with
the same values and dtype; otherwise it succeeds with the values the input
means, or raises a clear error: a `ValueError` / `TypeError` / `IndexError` /
`RuntimeError` (not jaxlib's bare `JaxRuntimeError`) that names the argument
at fault. Input the package refuses by its own rules (a bad mesh, a bool in
a shape, buffers out of device order) must get that clear error. A user's
exception from a callback comes through unchanged.

An example is a batch of cases run in the suite's child process: a crash or
a hang is a failure naming the batch, and each failing case of a batch is
listed with what went wrong. The checks of construction and shard access
are in `_bad_input.py`; the legacy `pjit` one is here.
"""

from __future__ import annotations

import contextlib

import pytest
from _bad_input import attempt, data_for, describe, differs, run_batch, unclear
from _fuzz import budget, isolated
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
  PjitCase,
  access_cases,
  buffer_cases,
  callback_cases,
  layout_cases,
  pjit_cases,
)

pytestmark = pytest.mark.fuzz

# ---------------------------------------------------------------------------
# Legacy pjit (the child side).
# ---------------------------------------------------------------------------


def _pjit_leaf(leaf, c: PjitCase, sharding, b_sharding, is_b=False):
  """A `PjitCase` spec leaf as (pjit's form, `jax.jit`'s form)."""
  from jax.sharding import NamedSharding, PartitionSpec

  import jax_sharding_ext as jse
  spec = PartitionSpec(*sharding.spec)
  if leaf == "P":  # without a mesh, both get the bare spec
    return spec, (sharding if c.in_mesh else spec)
  if leaf == "None":
    return None, (NamedSharding(sharding.mesh, PartitionSpec()) if c.in_mesh else None)
  if leaf == "S":
    return sharding, sharding
  if leaf == "unknown_axis":  # `jax.jit` gets the leaf's name: it raises too
    return PartitionSpec("zz"), leaf
  if leaf == "FROM_GDA":
    return jse.FROM_GDA, (b_sharding if is_b else sharding)
  return leaf, leaf


def _pjit_specs(res, c: PjitCase, sharding, b_sharding, top=True):
  """(pjit's form, `jax.jit`'s form) of a `PjitCase` spec tree."""
  if isinstance(res, (tuple, list)):
    pairs = [_pjit_specs(r, c, sharding, b_sharding, False) if not isinstance(r, str)
             else _pjit_leaf(r, c, sharding, b_sharding, top and i == 1)
             for i, r in enumerate(res)]
    return type(res)(p for p, _ in pairs), type(res)(s for _, s in pairs)
  if isinstance(res, dict):
    pairs = {k: _pjit_leaf(v, c, sharding, b_sharding) for k, v in res.items()}
    return {k: p for k, (p, _) in pairs.items()}, {k: s for k, (_, s) in pairs.items()}
  return _pjit_leaf(res, c, sharding, b_sharding)


def check_pjit_case(c: PjitCase) -> str | None:
  """What `jax.jit` with the same shardings and argnums returns (values,
  dtypes, containers, donation), or where it raises, the values of `f`, or
  a clear error (naming the parameter at fault where `jax.jit` runs)."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

  from jax_sharding_ext import GlobalDeviceArray as GDA
  from jax_sharding_ext import pjit
  mesh = c.mesh.build()
  sharding = NamedSharding(mesh, PartitionSpec(*c.spec))
  data = data_for(c.shape)
  b_data = data + 1

  def b_value():
    dev = jax.devices()[0]
    return {"gda": lambda: GDA.from_jax_array(jax.device_put(b_data, sharding)),
            "array": lambda: jax.device_put(b_data, sharding),
            "single": lambda: jax.device_put(b_data, dev),
            "numpy": lambda: b_data, "scalar": lambda: 3}[c.b]()

  b_sharding = {"gda": sharding, "array": sharding,
                "single": SingleDeviceSharding(jax.devices()[0])}.get(c.b)
  kw, stock_kw = {}, {}
  for name, res, old in (("in_shardings", c.in_res, "in_axis_resources"),
                         ("out_shardings", c.out_res, "out_axis_resources")):
    if res != "unspecified":
      kw[old], stock_kw[name] = _pjit_specs(res, c, sharding, b_sharding)
  for name, v in (("static_argnums", c.static), ("donate_argnums", c.donate)):
    kw[name] = stock_kw[name] = v

  def f(a, b):
    return a * 2 + b, a

  a, b = GDA.from_callback(c.shape, mesh, PartitionSpec(*c.spec), lambda i: data[i]), b_value()
  a_stock, b_stock = jax.device_put(data, sharding), b_value()
  with mesh if c.in_mesh else contextlib.nullcontext():
    got, err = attempt(lambda: pjit(f, **kw)(a, b))
  stock, stock_err = attempt(lambda: jax.jit(f, **stock_kw)(a_stock, b_stock))
  b_host = 3 if c.b == "scalar" else b_data
  want = (data * 2 + b_host, data)
  # The package refuses a bool as an argnum (`True` would name argument 1).
  bool_argnums = any(isinstance(v, bool) for v in (c.static, c.donate))
  if err is None:
    if bool_argnums:
      return f"accepted a bool argnum (static_argnums={c.static!r}, donate_argnums={c.donate!r})"
    if stock_err is None and jax.tree.structure(got) != jax.tree.structure(stock):
      return f"returned {jax.tree.structure(got)}, `jax.jit` {jax.tree.structure(stock)}"
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(stock) if stock_err is None else
                    [np.asarray(w, np.asarray(g).dtype) for g, w in zip(
                        jax.tree.leaves(got), want, strict=True)], strict=True):
      why = differs(g, w)
      if why:
        return why
    if stock_err is None and a.is_deleted() != a_stock.is_deleted():
      return f"the GDA deleted: {a.is_deleted()}, stock's array: {a_stock.is_deleted()}"
    return None
  if stock_err is None and "FROM_GDA" not in repr((c.in_res, c.out_res)) and not bool_argnums:
    return f"refused what `jax.jit` runs: {describe(err)}"
  return unclear(err, ("in_axis_resources", "out_axis_resources", "argnums", "FROM_GDA")
                  if stock_err is None else ())


def run_pjit_cases(cases: tuple) -> None:
  run_batch(check_pjit_case, cases)


# ---------------------------------------------------------------------------
# The properties: batches of cases, each batch in the child.
# ---------------------------------------------------------------------------


def _batches(cases, size: int):
  return st.lists(cases, min_size=1, max_size=size).map(tuple)


@given(_batches(layout_cases(), 24))
@budget(40)
def test_bad_meshes_shapes_and_mesh_axes_get_a_clear_error_or_stocks_layout(cases):
  """Every constructor and shard-math function: stock's layout and values
  for valid input; a clear error naming the argument for a bad mesh, shape
  or mesh axes."""
  isolated("_bad_input:run_layout_cases", cases)


def _one_fault_at_a_time() -> tuple:
  """Each shape fault, alone, on a valid mesh and mesh axes, at every entry
  point (random cases mostly carry several faults, and the first one found
  hides the others)."""
  from strategies import LAYOUT_ENTRIES, SHAPE_FAULTS, LayoutCase, MeshInput
  mesh = MeshInput((2,), ("x",), (0, 1))
  values = {"negative": -4, "float": 4.5, "integral_float": 4.0, "np_float": ("np.float32", 4.0),
            "bool": True, "np_bool": ("np.bool_", True), "none": None, "str": "4",
            "np_int": ("np.int64", 4), "not_divisible": 3, "long": 4, "zero": 0}
  cases = []
  for fault in SHAPE_FAULTS:
    shape = (values[fault], 2) + ((1,) * 24 if fault == "long" else ())
    cases += [LayoutCase(entry, mesh, shape, "tuple", ("x",), "P") for entry in LAYOUT_ENTRIES]
  return tuple(cases)


def test_each_shape_fault_alone_gets_a_clear_error_or_stocks_layout():
  """The model of the fuzzer below, one shape fault at a time."""
  isolated("_bad_input:run_layout_cases", _one_fault_at_a_time())


@given(_batches(callback_cases(), 16))
@budget(40)
def test_odd_callback_results_build_stocks_array_or_get_a_clear_error(cases):
  """Whatever a data callback returns: stock's array where
  `jax.make_array_from_callback` builds one, else a clear error naming
  `data_callback` (the callback's own exception unchanged)."""
  isolated("_bad_input:run_callback_cases", cases)


@given(_batches(buffer_cases(), 16))
@budget(30)
def test_bad_device_buffers_get_a_clear_error_or_stocks_array(cases):
  """Buffers `jax.make_array_from_single_device_arrays` takes (in
  `global_mesh.local_devices` order for the constructor) build its array;
  anything else gets a clear error naming `device_buffers`."""
  isolated("_bad_input:run_buffer_cases", cases)


@given(_batches(access_cases(), 16))
@budget(20)
def test_shard_access_by_index_matches_stock(cases):
  """`local_data(i)` and `addressable_data(i)` index the local shards as a
  list does (as stock's `addressable_data` of a sharded array), or raise a
  clear error of the list's type naming the method."""
  isolated("_bad_input:run_access_cases", cases)


@given(_batches(pjit_cases(), 6))
@budget(20)
def test_legacy_pjit_arguments_run_as_jit_or_get_a_clear_error(cases):
  """Legacy `pjit` runs what `jax.jit` with the same shardings and argnums
  runs (same values, same donation), and more (`FROM_GDA`, a list of in
  specs); what it refuses gets a clear error."""
  isolated("test_fuzz_bad_input:run_pjit_cases", cases)
