"""Every use of stock `jax.experimental.array_serialization`: the functions
the package's checkpoints are built on (the coroutines that write and read
one array, the spec of a path, the manager it subclasses), and the private
names the GDA-era checkpoint format needs.

Touches: `serialization.async_serialize` / `async_deserialize` /
`get_tensorstore_spec` / `TS_CONTEXT` / `AsyncManager` /
`GlobalAsyncCheckpointManager`, `tensorstore_impl.estimate_read_memory_footprint`,
`serialization._CHECKPOINT_SUCCESS`, `serialization._LimitInFlightBytes`,
`tensorstore_impl._spec_has_metadata`, `tensorstore_impl._get_tensorstore_metadata`,
`tensorstore_impl._TS_CHUNK_LAYOUT`, `tensorstore_impl._transfer_shard_to_host`,
and overrides `AsyncManager._add_futures`
(`ExtraCommitFutures`). Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).
Imported only by `jax_sharding_ext.serialization` and its `_checkpoint/`
helpers (tensorstore is an optional extra).

What breaks first when JAX changes: one of these names moving, or the
signatures of `async_serialize(arr, spec, commit_future=None)` and
`async_deserialize(sharding, spec, global_shape, dtype, byte_limiter=None)`;
the import of `jax_sharding_ext.serialization` then fails naming the name,
or the checkpoint tests fail naming the call.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental.array_serialization import serialization as _stock
from jax.experimental.array_serialization import tensorstore_impl as _ts_impl

from jax_sharding_ext._jax import UnsupportedJaxVersionError

async_serialize = _stock.async_serialize
"""Write this process's shards of one `jax.Array`: `(arr, spec, commit_future=None)`."""
async_deserialize = _stock.async_deserialize
"""Read one array: `(sharding, spec, global_shape, dtype, byte_limiter=None)`."""
get_tensorstore_spec = _stock.get_tensorstore_spec
TS_CONTEXT = _stock.TS_CONTEXT
AsyncManager = _stock.AsyncManager
StockCheckpointManager = _stock.GlobalAsyncCheckpointManager
"""The manager `serialization.GlobalAsyncCheckpointManager` extends."""
estimate_read_memory_footprint = _ts_impl.estimate_read_memory_footprint

try:
  CHECKPOINT_SUCCESS = _stock._CHECKPOINT_SUCCESS
  """The file name of the commit marker stock writes."""
  LimitInFlightBytes = _stock._LimitInFlightBytes
  """Stock's byte limiter for concurrent reads (the GDA era's `byte_limiter`)."""
  spec_has_metadata = _ts_impl._spec_has_metadata
  """Whether a tensorstore spec already carries zarr metadata."""
  tensorstore_metadata = _ts_impl._get_tensorstore_metadata
  """Stock's zarr metadata for an array (`(arr, driver=...)`)."""
  TS_CHUNK_LAYOUT = _ts_impl._TS_CHUNK_LAYOUT
  """Stock's chunk layout for tensorstore writes."""
  _transfer_shard_to_host = _ts_impl._transfer_shard_to_host
  _stock.AsyncManager._add_futures  # noqa: B018  (overridden below; must exist)
except AttributeError as e:  # pragma: no cover - only on an unsupported JAX
  raise UnsupportedJaxVersionError(
      f"jax_sharding_ext.serialization could not find {e.name!r} in "
      f"jax.experimental.array_serialization of jax {jax.__version__}. This JAX "
      "release moved it; please report the version.") from e


class ExtraCommitFutures:
  """Mixin for stock's `GlobalAsyncCheckpointManager`: one more step in the
  background commit of each process, after its writes are committed and
  before the processes' barrier (after which process 0 runs the
  `on_commit_callback`).

  Stock's `serialize` hands the writes' commit futures to
  `AsyncManager._add_futures`; its background thread (`_thread_func`) calls
  `result()` on each, in order, then waits at the barrier. A manager that
  sets `_jse_extra_commit` (a function of those futures returning one more
  object with `result()`) gets that object appended to the list. No public
  hook exists for this.
  """

  _jse_extra_commit = None

  def _add_futures(self, futures):
    extra = self._jse_extra_commit
    super()._add_futures(list(futures) + ([] if extra is None else [extra(futures)]))


async def host_copy_error(device: jax.Device) -> Exception | None:
  """The error stock's copy of a shard to the host (the first step of its
  write of each shard) raises on `device` under this thread's transfer
  guard, tried on a one-byte array; None when the copy is allowed."""
  with jax.transfer_guard("allow"):
    probe = jax.device_put(np.zeros((1,), np.uint8), device)
  try:
    await _transfer_shard_to_host(probe.addressable_shards[0])
  except Exception as e:  # the guard's refusal, whatever its type
    return e
  return None
