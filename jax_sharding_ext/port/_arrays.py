"""Attributes of arrays that today's `jax.Array` does not have.

- The removed array classes' own attributes (`ShardedDeviceArray.sharding_spec`,
  `.indices`, `.one_replica_buffer_indices`, `DeviceArray.to_py()`,
  `._npy_value`): reported with today's way to the same, wherever the module
  does not define such an attribute itself; `.indices`, a common name, only
  where the value is an array (the output of a `jax.jit` / `pjit` /
  `jax.pmap` call or of `jax.device_put`, or a part of one).
- The attributes only a `GlobalDeviceArray` has (this package's class, less
  today's `jax.Array`: `local_shards`, `local_data`, `mesh_axes`, `mesh`, ...)
  read on such an array where it is surely a `jax.Array`: the output of
  `jax.pmap` or `jax.device_put`, or of `jax.jit` / `pjit` in a program that
  never turns the output flag on (no file of the run mentions
  `parallel_functions_output_gda`). `.local_shards` and `.local_data(i)`
  become `.addressable_shards` and `.addressable_data(i)`, which both kinds
  have; the others are reported, naming the flag GDA-era code turned on.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys

import jax

from jax_sharding_ext.port import _jaxnames, _kinds, _reports, _rules, _scope
from jax_sharding_ext.port._context import Context
from jax_sharding_ext.port._source import Edit

REMOVED_SURFACE: dict[str, str] = {
    "sharding_spec": "its placement is `{value}.sharding`, each shard's place "
                     "`[s.index for s in {value}.addressable_shards]`",
    "indices": "`tuple(s.index for s in {value}.addressable_shards)` (slices into the "
               "global array, where a `pmap` output's were integers)",
    "one_replica_buffer_indices": "`[i for i, s in enumerate({value}.addressable_shards) "
                                  "if s.replica_id == 0]`",
    "to_py": "`np.asarray({value})`",
    "_npy_value": "`np.asarray({value})`",
}
"""Attributes of the removed `DeviceArray` / `ShardedDeviceArray` classes, and
today's way to the same."""

SAME_ON_BOTH = {"local_shards": "addressable_shards", "local_data": "addressable_data"}
"""GDA attributes whose `jax.Array` name a GDA has too, with the same meaning."""

_FLAG = b"output_gda"


@functools.cache
def gda_only() -> frozenset[str]:
  """The public attributes this package's `GlobalDeviceArray` has and today's
  `jax.Array` (JAX's own array classes) does not (constructors aside)."""
  gda = getattr(sys.modules.get(_rules.PKG), "GlobalDeviceArray", None)
  if gda is None:
    return frozenset(SAME_ON_BOTH)
  arrays = [jax.Array, *(c for c in jax.Array.__subclasses__()
                         if c.__module__.split(".")[0] in _jaxnames.ROOTS)]
  have = set().union(*(dir(c) for c in arrays))
  return frozenset(n for n in dir(gda) if not n.startswith("_") and n not in have
                   and not isinstance(inspect.getattr_static(gda, n), classmethod | staticmethod))


@functools.cache
def watched() -> frozenset[str]:
  """Every attribute name these rules look at (the scope walk collects them)."""
  return frozenset(REMOVED_SURFACE) | gda_only()


def _flag_may_be_on(ctx: Context) -> bool:
  found = getattr(ctx, "_flag_may_be_on", None)
  if found is None:
    found = (_FLAG.decode() in ctx.text.text.lower()
             or (ctx.project is not None and ctx.project.mentions(_FLAG)))
    ctx._flag_may_be_on = found  # type: ignore[attr-defined]
  return found


def attribute(ctx: Context, node: ast.Attribute, scope: _scope.Scope) -> bool:
  """Judges `node` if it is one of these rules' attributes; True when it was."""
  attr = node.attr
  if attr in REMOVED_SURFACE:
    if attr == "indices" and not _is_array(ctx, node.value, scope, (_kinds.JIT_OUT,
                                                                    _kinds.ARRAY)):
      return True
    value = ctx.shown(node.value)
    ctx.note(node, "JSE314", _reports.JSE314.format(
        shown=ctx.shown(node), attr=attr, new=REMOVED_SURFACE[attr].format(value=value)))
    return True
  if attr not in gda_only():
    return False
  kinds = _kinds.kinds_of(ctx).of(node.value, scope)
  if not kinds or not kinds <= {_kinds.JIT_OUT, _kinds.ARRAY}:
    return True
  if kinds == {_kinds.JIT_OUT} and _flag_may_be_on(ctx):
    return True
  shown, new = ctx.shown(node), SAME_ON_BOTH.get(attr)
  if new is not None:
    end = ctx.text.end(node)
    ctx.note(node, "JSE208", _reports.JSE208.format(
        shown=shown, attr=attr, fix=f"use `.{new}`, which a `GlobalDeviceArray` has too"),
        [Edit(end - len(attr), end, new)])
  else:
    ctx.note(node, "JSE208", _reports.JSE208.format(shown=shown, attr=attr, fix=(
        "turn the output flag on (`jax.config.update('jax_parallel_functions_output_gda', "
        "True)`, as GDA-era code did) or read the `jax.Array`'s own "
        "`.sharding` (`.sharding.spec`, `.sharding.mesh`)")))
  return True


def _is_array(ctx: Context, node: ast.expr, scope: _scope.Scope, kinds: tuple[str, ...]
              ) -> bool:
  found = _kinds.kinds_of(ctx).of(node, scope)
  return bool(found) and found <= set(kinds)
