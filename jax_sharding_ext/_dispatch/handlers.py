"""`GlobalDeviceArray`'s entries in JAX's extension tables, each registered
right under its definition.

* `pytype_aval_mappings`: its aval is the wrapped array's aval, sharding
  included, so a jitted computation follows the GDA's sharding;
* `shard_arg_handlers`: refuses a call that donates an array it also reads
  (`donation.check_donated_args`), then hands the buffers over as JAX's own
  `jax.Array` handler does, resharding where it must (`_transfers`);
* canonicalisation: the identity, as for `jax.Array`;
* MLIR constant handlers: a GDA closed over by a jitted function is fetched
  and embedded like a `jax.Array`;
* jit's C++ dispatch registry: warm calls unpack a GDA to its private array
  (and a cache entry an alias could hurt stays off that fast path);
* `jax.device_put(gda)` with no target keeps it where it is, and a reshard
  across processes is stock's reshard of its `jax.Array`.

The output flag's result handler is in `output.py`.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import Sharding

from jax_sharding_ext._array import family
from jax_sharding_ext._array.gda import GlobalDeviceArray, rebuild
from jax_sharding_ext._dispatch import donation
from jax_sharding_ext._jax import buffers as jax_buffers
from jax_sharding_ext._jax import dispatch as jax_dispatch
from jax_sharding_ext._jax import tables as jax_tables
from jax_sharding_ext._transfers import moves

EDITS: list = []


def aval(x: GlobalDeviceArray):
  # Read without a live buffer, as stock reads a deleted array's: abstract
  # uses (`jax.eval_shape`, `make_jaxpr`, `.lower`) work on a donated GDA;
  # passing its data refuses it (`shard_arg`).
  return jax_tables.array_aval(x._arr)


EDITS.append(jax_tables.TableEdit("pytype_aval_mappings", jax_tables.pytype_aval_mappings,
                                  GlobalDeviceArray, aval))


def shard_arg(xs, shardings, layouts, copy_semantics):
  arrays = [g._checked_array("pass it to a JAX computation") for g in xs]
  donation.check_donated_args(xs)  # f(donate(x), x): refuse before anything runs
  return moves.shard_arrays(arrays, shardings, layouts, copy_semantics)


EDITS.append(jax_tables.TableEdit("shard_arg_handlers", jax_tables.shard_arg_handlers,
                                  GlobalDeviceArray, shard_arg))
EDITS.append(jax_tables.CanonicalizeEdit(GlobalDeviceArray))


def constant(x: GlobalDeviceArray, aval):
  # Embedding fetches the value to the host: an implicit transfer.
  return moves.embed_constant(x, aval)


EDITS.append(jax_tables.TableEdit("mlir constant handlers", jax_tables.constant_handlers,
                                  GlobalDeviceArray, constant))
EDITS.append(jax_dispatch.DispatchNodeEdit(GlobalDeviceArray, rebuild))
EDITS.append(jax_dispatch.FastPathVerdictEdit())


def device_put_args(xs: list, devices: list) -> tuple[list, list, Any]:
  """What stock's `jax.device_put` gets for GDA values, and what to do after.

  * `jax.device_put(gda)` with no target keeps a committed array where it is,
    as for a `jax.Array` (stock returns it unchanged, or copies it in place);
  * a target or a GDA spanning other processes: stock reshards there only its
    own array class, so it gets the GDA's `jax.Array` (a sibling, no copy) and
    reshards it exactly as it reshards that array (jaxlib judges the transfer
    as it judges that array's); the reshard is recorded in the open ledgers;
  * a target equivalent to the GDA's sharding (another `Mesh` object over the
    same devices): stock makes its result over the GDA's very buffers, so the
    GDA is marked shared, and donating one next to the other is refused
    (`family.py`).
  """
  records, placed = [], []
  for i, (x, d) in enumerate(zip(xs, devices, strict=True)):
    if type(x) is not GlobalDeviceArray:
      continue
    arr = x._checked_array("pass it to `jax.device_put`")
    if d is None:
      devices[i] = arr.sharding
    elif isinstance(d, Sharding) and not (arr.is_fully_addressable and d.is_fully_addressable):
      xs[i] = x.to_jax_array()
      records.append(moves.across_processes(arr, d))
    elif isinstance(d, Sharding) and d.is_equivalent_to(arr.sharding, arr.ndim):
      placed.append((i, x))
  if not records and not placed:
    return xs, devices, None

  def done(out: Any) -> None:
    moves.record(records)
    for i, gda in placed:
      if out[i] is not gda and jax_buffers.shares_buffers(out[i], gda._arr):
        family.mark_shared(gda)
  return xs, devices, done


EDITS.append(jax_tables.DevicePutEdit(GlobalDeviceArray, device_put_args))

# Stock `multihost_utils.host_local_array_to_global_array` /
# `global_array_to_host_local_array` handle their own array class only; a GDA
# goes in as its `jax.Array` (no copy) and comes out as that array would.
EDITS.extend(jax_tables.PrimitiveImplEdit(p, GlobalDeviceArray, GlobalDeviceArray.to_jax_array)
             for p in jax_tables.multihost_primitives())
