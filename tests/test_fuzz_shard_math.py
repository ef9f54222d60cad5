"""Fuzzer: shard math against stock, differentially.

A case (`strategies.ShardMathCase`) is a mesh (any shape up to rank 3, axes
of size 1 included, any subset of the devices in any order), mesh axes
(`None`, a name, or a tuple of names in any order, whose first name is the
major one; trailing `None`s, also beyond the rank; written as a
`PartitionSpec`, a list or a tuple) and a shape (dimensions of size 0
included, and sometimes one the axes do not divide).

The model is stock JAX: `NamedSharding(mesh, spec)` of the same mesh and
spec (trailing entries beyond the rank dropped). `get_shard_indices` gives
stock's `devices_indices_map` in the GDA-era form (keyed in
`mesh.devices.flat` order, `slice(None)` for an unsplit dimension, explicit
bounds for a split one), `get_shard_shape` stock's `shard_shape`,
`get_shard_indices_replica_ids` the replica ids of stock's
`addressable_shards`; a GDA of the case (from a data callback, a view of
stock's array, an output of `jax.jit` under the output flag, the
constructor over stock's shards) has stock's indices, replica ids and data
(of the same computation's `jax.Array`, for a `jax.jit` output)
in `local_shards` (in `mesh.local_devices` order) and `global_shards` (in
`mesh.devices.flat` order). Where stock refuses a shape the axes do not
divide, the package refuses it with a clear `ValueError`.

A batch of cases runs in the suite's child process.
"""

from __future__ import annotations

import pytest
from _bad_input import attempt, describe, run_batch, unclear
from _fuzz import budget, isolated
from hypothesis import given
from hypothesis import strategies as st
from strategies import ShardMathCase, shard_math_cases

pytestmark = pytest.mark.fuzz


def _bounds(index, shape) -> tuple:
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def _gda_era_form(index, spec) -> str | None:
  """Why `index` is not in the GDA-era form for mesh axes `spec`: a
  dimension that names mesh axes has explicit bounds (also over an axis of
  size 1), one that names none `slice(None)`."""
  for d, s in enumerate(index):
    entry = spec[d] if d < len(spec) else None
    named = entry is not None and entry != ()
    if s.step is not None:
      return f"dimension {d} has a step: {s}"
    if not named and s != slice(None):
      return f"dimension {d} names no mesh axis but reads {s}, not slice(None)"
    if named and (s.start is None or s.stop is None):
      return f"dimension {d} names mesh axes {entry!r} but reads {s}"
  return None


def _mesh_axes(c: ShardMathCase):
  from jax.sharding import PartitionSpec
  entries = list(c.spec)
  return {"P": lambda: PartitionSpec(*entries), "list": lambda: entries,
          "tuple": lambda: tuple(entries)}[c.form]()


def _gda(c: ShardMathCase, mesh, stock_arr, data):
  import jax

  import jax_sharding_ext as jse
  from jax_sharding_ext import GlobalDeviceArray as GDA
  axes = _mesh_axes(c)
  if c.source == "from_jax_array":
    return GDA.from_jax_array(stock_arr)
  if c.source == "jit_output":
    with jse.parallel_functions_output_gda(True):
      return jax.jit(lambda v: v * 1)(stock_arr)
  if c.source == "constructor":
    by_device = {s.device: s.data for s in stock_arr.addressable_shards}
    return GDA(c.shape, mesh, axes, [by_device[d] for d in mesh.local_devices])
  return GDA.from_callback(c.shape, mesh, axes, lambda index: data[index])


def check_shard_math_case(c: ShardMathCase) -> str | None:
  """The model of the module docstring for one case (None: it holds)."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec

  from jax_sharding_ext import (
    get_shard_indices,
    get_shard_indices_replica_ids,
    get_shard_shape,
  )
  mesh, shape = c.mesh.build(), c.shape
  sharding = NamedSharding(mesh, PartitionSpec(*c.spec[:len(shape)]))
  data = (np.arange(int(np.prod(shape))) % 251).astype(np.float32).reshape(shape)
  want, stock_err = attempt(lambda: sharding.devices_indices_map(shape))
  got, err = attempt(lambda: get_shard_indices_replica_ids(shape, mesh, _mesh_axes(c)))
  if stock_err is not None:
    if err is None:
      return f"gave {got} where stock refuses: {describe(stock_err)}"
    return unclear(err, ("divisible", "divide"), (ValueError,))
  if err is not None:
    return f"refused what stock lays out: {describe(err)}"
  flat = list(mesh.devices.flat)
  if list(got) != flat or list(get_shard_indices(shape, mesh, _mesh_axes(c))) != flat:
    return f"keyed {[d.id for d in got]}, not in mesh.devices.flat order {[d.id for d in flat]}"
  if get_shard_shape(shape, mesh, _mesh_axes(c)) != sharding.shard_shape(shape):
    return (f"shard shape {get_shard_shape(shape, mesh, _mesh_axes(c))}, stock "
            f"{sharding.shard_shape(shape)}")
  stock_arr = jax.device_put(data, sharding)
  stock_shards = {s.device: s for s in stock_arr.addressable_shards}
  for d in flat:
    index, rid = got[d]
    if _bounds(index, shape) != _bounds(want[d], shape):
      return f"index {index} on device {d.id}, stock {want[d]}"
    if get_shard_indices(shape, mesh, _mesh_axes(c))[d] != index:
      return f"get_shard_indices {get_shard_indices(shape, mesh, _mesh_axes(c))[d]} != {index}"
    why = _gda_era_form(index, c.spec)
    if why:
      return f"index {index} on device {d.id}: {why}"
    if rid != stock_shards[d].replica_id:
      return f"replica id {rid} on device {d.id}, stock {stock_shards[d].replica_id}"
  gda, err = attempt(lambda: _gda(c, mesh, stock_arr, data))
  if err is not None:
    return f"the GDA ({c.source}) was refused: {describe(err)}"
  if c.source == "jit_output":  # jit chooses its output's sharding (P() for a size 0)
    stock_shards = {s.device: s for s in jax.jit(lambda v: v * 1)(stock_arr).addressable_shards}
  return _check_shards(gda, mesh, shape, stock_shards, data)


def _check_shards(gda, mesh, shape, stock_shards, data) -> str | None:
  import numpy as np
  local = gda.local_shards
  if [s.device for s in local] != list(mesh.local_devices):
    return "local_shards are not in mesh.local_devices order"
  if [s.device for s in gda.addressable_shards] != [s.device for s in local]:
    return "addressable_shards differ from local_shards"
  if [s.device for s in gda.global_shards] != list(mesh.devices.flat):
    return "global_shards are not in mesh.devices.flat order"
  for where, shards in (("local_shards", local), ("global_shards", gda.global_shards)):
    for s in shards:
      stock = stock_shards[s.device]
      if _bounds(s.index, shape) != _bounds(stock.index, shape):
        return f"{where}: index {s.index} on device {s.device.id}, stock {stock.index}"
      if s.replica_id != stock.replica_id:
        return (f"{where}: replica id {s.replica_id} on device {s.device.id}, "
                f"stock {stock.replica_id}")
      if not np.array_equal(np.asarray(s.data), np.asarray(stock.data)):
        return f"{where}: the data on device {s.device.id} is not stock's"
      if not np.array_equal(np.asarray(s.data), data[s.index]):
        return f"{where}: the data on device {s.device.id} is not the array at {s.index}"
  for i in range(len(local)):
    if not np.array_equal(np.asarray(gda.local_data(i)), np.asarray(local[i].data)):
      return f"local_data({i}) is not local_shards[{i}].data"
  return None


def run_shard_math_cases(cases: tuple) -> None:
  run_batch(check_shard_math_case, cases)


@given(st.lists(shard_math_cases(), min_size=1, max_size=12).map(tuple))
@budget(7)
def test_shard_indices_replica_ids_and_data_are_stocks(cases):
  """Indices, shard shapes, replica ids and shard data equal stock's
  `NamedSharding` / `addressable_shards` of the same mesh and spec; where
  stock refuses an uneven shape, a clear `ValueError`."""
  isolated("test_fuzz_shard_math:run_shard_math_cases", cases)
