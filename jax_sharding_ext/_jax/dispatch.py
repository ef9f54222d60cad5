"""jit's C++ dispatch pytree registry (`jax._src.tree_util.dispatch_registry`).

Checked against JAX 0.10.2 (Python 3.11) and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: the registry's name or its
`register_node` signature; `HAS_DISPATCH_REGISTRY` turns False and
GDA calls take jit's slower Python path (still correct).
"""

from __future__ import annotations

from typing import Any

from jax_sharding_ext._jax.tables import RegisterOnceEdit

# --- dispatch ---------------------------------------------------------------
# jit's C++ fast path (`PjitFunction`) accepts only `ArrayImpl`, numpy arrays
# and scalars as leaves; any other type drops every call to the Python
# `cache_miss` path (about 10x slower on one device). Its one extension point
# is `tree_util.dispatch_registry`, the pytree registry the C++ path flattens
# arguments (and rebuilds outputs) with, and nothing else does; JAX's own
# PRNG key arrays and `EArray` use it the same way. A type registered there as
# a node whose one child is its `ArrayImpl` reaches the fast path as that
# array, while `jax.tree_util`, tracing and the extension tables still see it
# as a leaf. A custom node (`register_node`: a Python flatten and unflatten
# function) rather than a dataclass node: C++ rebuilds a dataclass node by
# calling its class with keyword arguments (~0.4 us a GDA output, measured),
# a custom node by calling the unflatten function (~0.14 us). Present in jax
# 0.10.2 and 0.12.x; when missing, dispatch stays correct but takes the slow
# path.
# The registry has no unregister; `DispatchNodeEdit.revert` instead makes the
# flatten function return another node data, so cached C++ signatures stop
# matching and calls fall back to the Python path (where an uninstalled type
# is rejected).

try:
  from jax._src import tree_util as _tree_util
  _dispatch_registry = getattr(_tree_util, "dispatch_registry", None)
except ImportError:  # pragma: no cover
  _dispatch_registry = None

HAS_DISPATCH_REGISTRY = _dispatch_registry is not None


class DispatchOff:
  """Static field value of a dispatch node while the package is uninstalled."""

  __slots__ = ()

  def __repr__(self):
    return "<jax_sharding_ext uninstalled>"


DISPATCH_OFF = DispatchOff()


class DispatchNodeEdit(RegisterOnceEdit):
  """Let jit's C++ fast path unpack `typ` to its array (see above).

  `flatten(x)` returns `((array,), node_data)` and reads `typ._dispatch_off`:
  off, it must return that as node data. `unflatten(node_data, (array,))`
  rebuilds an output.
  """

  name = "tree_util.dispatch_registry"
  _registered: set[type] = set()

  def __init__(self, typ: type, flatten: Any, unflatten: Any):
    super().__init__(typ)
    self._flatten, self._unflatten = flatten, unflatten

  def _available(self) -> bool:
    return HAS_DISPATCH_REGISTRY

  def _register(self) -> None:
    _dispatch_registry.register_node(self.typ, self._flatten, self._unflatten)

  def _enable(self, on: bool) -> None:
    # Off, the flatten function returns DISPATCH_OFF, which no cached C++
    # signature has.
    self.typ._dispatch_off = None if on else DISPATCH_OFF


def dispatch_flatten(x: Any) -> tuple[list[Any], Any]:
  """Flatten `x` as jit's C++ dispatch does (for tests and benchmarks)."""
  return _dispatch_registry.flatten(x)
