"""treescope support: `treescope.render_array_sharding(gda)` and treescope's
automatic array rendering accept a `GlobalDeviceArray`.

treescope asks an object for `__treescope_ndarray_adapter__()` before its
type registry; `GlobalDeviceArray` defines it to return the adapter here,
which hands treescope the GDA's zero-copy `jax.Array` and lets treescope's
own `jax.Array` adapter do the rest. Nothing is registered and treescope is
imported only when treescope itself asks (so it is already imported).
"""

from __future__ import annotations

import functools
from typing import Any


def _view(x: Any) -> Any:
  """A GDA (anything with `to_jax_array`, so this module needs no import of
  `_array/gda.py`, which imports it) as its `jax.Array`; anything else as is."""
  return x.to_jax_array() if hasattr(type(x), "to_jax_array") else x


@functools.cache
def adapter() -> Any:
  """treescope's `jax.Array` adapter, for GDAs."""
  import jax
  from treescope import ndarray_adapters, type_registries

  type_registries.update_registries_for_imports()  # treescope's jax support
  base = type_registries.NDARRAY_ADAPTER_REGISTRY[jax.Array]

  class GdaAdapter(ndarray_adapters.NDArrayAdapter):
    def get_axis_info_for_array_data(self, array):
      return base.get_axis_info_for_array_data(_view(array))

    def get_array_data_with_truncation(self, array, mask, edge_items_per_axis):
      return base.get_array_data_with_truncation(_view(array), _view(mask),
                                                 edge_items_per_axis)

    def get_array_summary(self, array, fast):
      return base.get_array_summary(_view(array), fast)

    def get_numpy_dtype(self, array):
      return base.get_numpy_dtype(_view(array))

    def get_sharding_info_for_array_data(self, array):
      return base.get_sharding_info_for_array_data(_view(array))

    def should_autovisualize(self, array):
      return not array.is_deleted() and base.should_autovisualize(_view(array))

  return GdaAdapter()
