"""The namespace of JAX's `jax.experimental.global_device_array` module.

GDA-era code imported the whole module (`from jax.experimental import
global_device_array as gda_lib`) and used more than the class. This module
offers every public name the module had in JAX 0.3.17 to 0.4.1, and the
private helpers real code called, with their old meaning; change the import
to `from jax_sharding_ext import global_device_array as gda_lib`:

- `GlobalDeviceArray`, `Shard` and the shard math (`get_shard_indices`,
  `get_shard_indices_replica_ids`, `get_shard_shape`): the package's own,
  the same objects as at the top level.
- `PartitionSpec`: the old module imported it, and code took it from there
  (`gda_lib.PartitionSpec`); stock's class.
- The type aliases of its annotations: `Shape`, `Index`, `MeshAxes` (today
  a `PartitionSpec`; lists and tuples of axis names work too), `Device`
  (`jax.Device`), `DeviceArray` (a shard's single-device buffer type, today
  `jax.Array`) and `ArrayLike` (what a data callback returns).
- `_hashed_index`: a hash of a shard index equal for every replica; data
  loaders used it to load each distinct shard once.
- `_get_indices` and `_get_shard_indices_replica_ids_uncached`: the old
  uncached spellings of the shard math, which code called directly.
"""

from __future__ import annotations

from collections.abc import Mapping as _Mapping
from typing import Any as _Any
from typing import Union as _Union

import jax
import numpy as np
from jax.sharding import PartitionSpec

from jax_sharding_ext import _public
from jax_sharding_ext._array import shard_math as _shard_math
from jax_sharding_ext._array.gda import GlobalDeviceArray
from jax_sharding_ext._array.records import Shard
from jax_sharding_ext._array.shard_math import (
  Index,
  Shape,
  get_shard_indices,
  get_shard_indices_replica_ids,
  get_shard_shape,
)

MeshAxes = PartitionSpec
"""The old alias: a `PartitionSpec` (lists and tuples of axis names work too)."""

Device = jax.Device
DeviceArray = jax.Array
"""The single-device buffer type of a shard: a `jax.Array` today."""

ArrayLike = _Union[np.ndarray, jax.Array]  # noqa: UP007 - the old alias, kept as it was


def _hashed_index(index: Index) -> int:
  """A hash of a shard index that is the same for every replica of the shard.

  Index slices are hashed by their `(start, stop)`, as the old module did;
  data loaders use it to load each distinct shard once.
  """
  return hash(_shard_math.index_key(index))


def _get_indices(global_shape: Shape, global_mesh: jax.sharding.Mesh,
                 mesh_axes: _Any) -> tuple[Index, ...]:
  """The index of every device's shard, in `global_mesh.devices.flat` order."""
  return _shard_math.layout(global_shape, global_mesh, mesh_axes).indices


def _get_shard_indices_replica_ids_uncached(
    global_shape: Shape, global_mesh: jax.sharding.Mesh,
    mesh_axes: _Any) -> _Mapping[_Any, tuple[Index, int]]:
  """`get_shard_indices_replica_ids` (the old module's uncached spelling)."""
  return get_shard_indices_replica_ids(global_shape, global_mesh, mesh_axes)


__all__ = [
  "ArrayLike",
  "Device",
  "DeviceArray",
  "GlobalDeviceArray",
  "Index",
  "MeshAxes",
  "PartitionSpec",
  "Shape",
  "Shard",
  "get_shard_indices",
  "get_shard_indices_replica_ids",
  "get_shard_shape",
]

# `dir()`, `help()` and tab completion list the public names (and the GDA-era
# private ones old code reads), not the modules and helpers used here.
__dir__ = _public.module_dir(__name__, "_hashed_index", "_get_indices", "_get_shard_indices_replica_ids_uncached")
