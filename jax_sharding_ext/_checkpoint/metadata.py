"""The metadata of a new checkpoint array: the GDA-era module's
(`gda_metadata`, the default) or stock `array_serialization`'s
(`metadata="stock"`).

Needs tensorstore (imported by `serialization` first, with the error naming
the extra).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jax_sharding_ext._jax import checkpoint as jax_checkpoint

TS_CONTEXT = jax_checkpoint.TS_CONTEXT
spec_has_metadata = jax_checkpoint.spec_has_metadata

GDA_METADATA = "gda_serialization"
STOCK_METADATA = "stock"


def gda_metadata(arr: Any) -> dict:
  """The zarr metadata `jax.experimental.gda_serialization` wrote for `arr`.

  As its `_get_metadata` returned it (JAX 0.3.17 to 0.4.x): gzip
  compression, one chunk per shard (the shape of the first addressable shard,
  at least 1 in every dimension, as a numpy array), the global `shape` and the
  zarr `dtype` ('bfloat16' and the other extension types by name, as
  tensorstore spells them). A new dict each call: callers may edit it.
  """
  if not isinstance(arr, jax.Array) or isinstance(arr, jax.core.Tracer):
    raise TypeError(
        "`serialization._get_metadata` takes a GlobalDeviceArray or a concrete jax.Array, "
        f"got {type(arr).__name__}.")
  dtype = np.dtype(arr.dtype)
  return {
      "compressor": {"id": "gzip"},
      "shape": arr.shape,
      "chunks": np.array(np.maximum(1, arr.addressable_data(0).shape)),
      "dtype": dtype.name if dtype.kind == "V" else dtype.str,
  }


def checked_metadata_choice(fn: str, metadata: Any) -> str:
  if isinstance(metadata, str) and metadata in (GDA_METADATA, STOCK_METADATA):
    return metadata
  choices = (f"'{GDA_METADATA}' (the default: gzip, one chunk per shard, as the GDA-era "
             f"module wrote) or '{STOCK_METADATA}' (stock `array_serialization`'s)")
  if isinstance(metadata, str):
    raise ValueError(f"`{fn}`: metadata must be {choices}, got {metadata!r}.")
  raise TypeError(f"`{fn}`: metadata must be {choices}, got {type(metadata).__name__}. "
                  "To give the metadata itself, put it under the tensorstore spec's "
                  "'metadata' key.")


def new_metadata(arr: jax.Array, driver: Any, choice: str) -> dict:
  """The metadata a save adds to a spec without any: the GDA-era module's for
  the zarr driver (the one driver it wrote), stock's otherwise."""
  if choice == GDA_METADATA and driver == "zarr":
    return gda_metadata(arr)
  return jax_checkpoint.tensorstore_metadata(arr, driver=driver)

