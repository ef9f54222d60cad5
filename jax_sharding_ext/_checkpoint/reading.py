"""How a restore runs: open the stored array, refuse an uncommitted one,
read this process's shards with stock `array_serialization` onto the
sharding asked for, and give a GDA for a mesh or a `NamedSharding`."""

from __future__ import annotations

import asyncio
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.shard_math import canonical_shape, layout
from jax_sharding_ext._checkpoint import args as _args
from jax_sharding_ext._checkpoint import checks, integrity, locations, markers, running
from jax_sharding_ext._jax import checkpoint as jax_checkpoint


async def read(spec: Any, global_shape: Any, dtype: Any, byte_limiter: Any,
               target: Mesh | jax.sharding.Sharding, mesh_axes: Any) -> jax.Array:
  """Read the array at `spec` onto `target`: a mesh (with `mesh_axes`) or a
  `NamedSharding` give a GDA, another `Sharding` a `jax.Array`."""
  at = f"`async_deserialize` of '{locations.spec_path(spec)}'"
  spec = locations.pinned(spec)  # one directory for the whole restore
  dtype = checks.checked_dtype(dtype, f"{at}: dtype")
  t = await checks.open_existing(spec, at)
  await markers.check_committed(spec, at)
  shape = t.shape if global_shape is None else canonical_shape(global_shape)
  if len(shape) != t.rank:
    raise ValueError(f"{at}: global_shape {tuple(shape)} has rank {len(shape)}, but "
                     f"the stored array has rank {t.rank} (shape {t.shape}).")
  sharding: jax.sharding.Sharding
  if isinstance(target, Mesh):
    sharding = NamedSharding(target, layout(shape, target, mesh_axes).spec)
  else:
    sharding = target
    if isinstance(target, NamedSharding):
      mesh_axes = target.spec
      layout(shape, target.mesh, mesh_axes)  # the checks and messages of the mesh form
  # The chunks are checked while they are read; a failed check discards the read.
  before = asyncio.all_tasks()
  arr: Any
  checked: Any
  arr, checked = await asyncio.gather(
      jax_checkpoint.async_deserialize(sharding, spec, tuple(shape), dtype,
                                       byte_limiter=byte_limiter),
      integrity.check_read(spec, t, sharding, shape, at), return_exceptions=True)
  if isinstance(checked, BaseException) or isinstance(arr, BaseException):
    # Stock's other reads of this array may still run (its `gather` raised the
    # first error): let them finish, not complete into a closed event loop.
    await asyncio.gather(*(asyncio.all_tasks() - before), return_exceptions=True)
  if isinstance(checked, BaseException):
    if isinstance(arr, jax.Array):
      arr.delete()
    raise checked
  if isinstance(arr, BaseException):
    raise _read_error(arr, at, spec) from None
  if not isinstance(sharding, NamedSharding):
    return arr
  return GlobalDeviceArray._wrap(arr, mesh_axes)


def _read_error(e: BaseException, at: str, spec: Any) -> BaseException:
  """A tensorstore read error that means damaged data, said so; others as raised."""
  reason = locations.reason(e)
  if isinstance(e, ValueError) and (reason.startswith("DATA_LOSS") or (
      reason.startswith("FAILED_PRECONDITION") and "Error reading" in reason)):
    return ValueError(f"{at}: the checkpoint at '{locations.spec_path(spec)}' is damaged: "
                      f"{reason}. Restore an earlier checkpoint.")
  return e


async def read_one(kind: str, a: dict) -> jax.Array:
  """`async_deserialize` with its arguments bound (`args.bind`)."""
  if kind == _args.MESH:
    target, mesh_axes = a["mesh"], a["mesh_axes"]
  else:
    target, mesh_axes = a["in_sharding"], None
  return await read(a["tensorstore_spec"], a["global_shape"], a["dtype"], a["byte_limiter"],
                    target, mesh_axes)


def read_many(forms: _args.Forms, kind: str, a: dict) -> list:
  """`run_deserialization` (or the manager's `deserialize`) with its
  arguments bound (`args.bind`)."""
  specs = a["tensorstore_specs"]
  if kind == _args.MESH:
    targets, axes, shapes, dts = checks.same_length(
        forms.fn, len(specs), global_meshes=a["global_meshes"], mesh_axes=a["mesh_axes"],
        global_shapes=a["global_shapes"], dtypes=a["dtypes"])
  else:
    targets, shapes, dts = checks.same_length(
        forms.fn, len(specs), shardings=a["shardings"], global_shapes=a["global_shapes"],
        dtypes=a["dtypes"])
    axes = [None] * len(specs)
  for i, d in enumerate(dts):
    checks.checked_dtype(d, checks.where(forms.fn, "dtypes", i))

  async def read_all():
    limiter = jax_checkpoint.LimitInFlightBytes(a["concurrent_gb"] * 10**9)
    return await asyncio.gather(*(
        read(spec, shape, dtype, limiter, target, mesh_axes)
        for spec, shape, dtype, target, mesh_axes
        in zip(specs, shapes, dts, targets, axes, strict=True)))
  return running.run(read_all)
