"""GlobalDeviceArray, shardable ordered effects, transfer guards and donation for stock JAX.

`import jax_sharding_ext` registers this package's handlers into JAX's
extension tables (`install()`); `uninstall()` restores them exactly. Nothing
here initialises a JAX backend.

Please don't use symbols from the private modules (`jax_sharding_ext._*`):
they are not part of the public API.

The examples in the docstrings (here and in the public modules) start from
the setup each page of the API reference shows once: 8 devices (on one CPU,
`XLA_FLAGS=--xla_force_host_platform_device_count=8` before JAX starts),
`import jax`, `import numpy as np`, `import jax_sharding_ext as jse`,
`from jax_sharding_ext import *`, `PartitionSpec as P`, and the names of the
example's own module.
"""

from jax.sharding import Mesh as Mesh
from jax.sharding import PartitionSpec as PartitionSpec

from jax_sharding_ext import global_device_array as global_device_array
from jax_sharding_ext import multihost_utils as multihost_utils
from jax_sharding_ext._array.gda import GlobalDeviceArray as GlobalDeviceArray
from jax_sharding_ext._array.records import FROM_GDA as FROM_GDA
from jax_sharding_ext._array.records import FromGdaType as FromGdaType
from jax_sharding_ext._array.records import Shard as Shard
from jax_sharding_ext._array.shard_math import get_shard_indices as get_shard_indices
from jax_sharding_ext._array.shard_math import (
  get_shard_indices_replica_ids as get_shard_indices_replica_ids,
)
from jax_sharding_ext._array.shard_math import get_shard_shape as get_shard_shape
from jax_sharding_ext._current_mesh import current_mesh as current_mesh
from jax_sharding_ext._dispatch.donation import donation_vector as donation_vector
from jax_sharding_ext._dispatch.donation import rebase_donate_argnums as rebase_donate_argnums
from jax_sharding_ext._dispatch.output import (
  parallel_functions_output_gda as parallel_functions_output_gda,
)
from jax_sharding_ext._effects.barrier import effects_barrier as effects_barrier
from jax_sharding_ext._effects.sharded_callback import sharded_callback as sharded_callback
from jax_sharding_ext._effects.user_effects import declare_effect as declare_effect
from jax_sharding_ext._effects.user_effects import mark_shardable as mark_shardable
from jax_sharding_ext._install import install as install
from jax_sharding_ext._install import is_installed as is_installed
from jax_sharding_ext._install import uninstall as uninstall
from jax_sharding_ext._pjit.api import pjit as pjit
from jax_sharding_ext._public import functions_shown_at as _functions_shown_at
from jax_sharding_ext._public import module_dir as _module_dir
from jax_sharding_ext._transfers.ledger import TransferLedger as TransferLedger
from jax_sharding_ext._transfers.ledger import TransferRecord as TransferRecord
from jax_sharding_ext._transfers.ledger import transfer_ledger as transfer_ledger
from jax_sharding_ext._version import __version__ as __version__
from jax_sharding_ext._version import __version_info__ as __version_info__
from jax_sharding_ext.multihost_utils import (
  global_array_to_host_local_array as global_array_to_host_local_array,
)
from jax_sharding_ext.multihost_utils import (
  host_local_array_to_global_array as host_local_array_to_global_array,
)
from jax_sharding_ext.multihost_utils import process_allgather as process_allgather

__all__ = [
  "FROM_GDA",
  "FromGdaType",
  "GlobalDeviceArray",
  "Mesh",
  "PartitionSpec",
  "Shard",
  "TransferLedger",
  "TransferRecord",
  "current_mesh",
  "declare_effect",
  "donation_vector",
  "effects_barrier",
  "get_shard_indices",
  "get_shard_indices_replica_ids",
  "get_shard_shape",
  "global_device_array",
  "global_array_to_host_local_array",
  "host_local_array_to_global_array",
  "install",
  "is_installed",
  "mark_shardable",
  "multihost_utils",
  "parallel_functions_output_gda",
  "pjit",
  "process_allgather",
  "rebase_donate_argnums",
  "sharded_callback",
  "transfer_ledger",
  "uninstall",
]

# `help()`, reprs and pickle show the functions here, where users import them;
# `dir()`, `help()` and tab completion list the public names, not the private
# sub-packages (which stay importable attributes).
_functions_shown_at(__name__)
__dir__ = _module_dir(__name__)
del _functions_shown_at, _module_dir

install()
