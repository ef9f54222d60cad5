"""`declare_effect` / `mark_shardable`: your own effect types in JAX's
effect-type sets (ordered, shardable, ...), undone by `uninstall()`.
"""

from __future__ import annotations

import threading
from typing import Any

from jax_sharding_ext._edit import Edit
from jax_sharding_ext._jax import effects as jax_effects
from jax_sharding_ext._jax import tracebacks as jax_tracebacks

_lock = threading.RLock()

# ---------------------------------------------------------------------------
# declare_effect / mark_shardable
# ---------------------------------------------------------------------------


class _UserEffectEdits(Edit):
  """The effect-table memberships asked for by `declare_effect` / `mark_shardable`.

  One edit standing for all of them, so that `uninstall()` removes user
  effects from JAX's tables too and `install()` puts them back.
  """

  name = "declared effects"

  def __init__(self):
    self.edits: list[jax_effects.EffectTypeSetEdit] = []

  def add(self, edit: jax_effects.EffectTypeSetEdit) -> None:
    with _lock:
      self.edits.append(edit)
      if self.applied:
        edit.apply()

  def _apply(self) -> None:
    with _lock:
      for edit in self.edits:
        edit.apply()

  def _check_revert(self) -> None:
    with _lock:
      for edit in self.edits:
        edit.check_revert()

  def _revert(self) -> None:
    with _lock:
      for edit in reversed(self.edits):
        edit.revert()


_user_edits = _UserEffectEdits()
EDITS = [_user_edits]
_declared: dict[str, tuple[type, dict[str, bool]]] = {}
_shardable_marked: set[type] = set()

_OPTION_SETS = (
    ("ordered", "ordered_effects"),
    ("shardable", "shardable_ordered_effects"),
    ("lowerable", "lowerable_effects"),
    ("control_flow", "control_flow_allowed_effects"),
    ("custom_derivatives", "custom_derivatives_allowed_effects"),
    ("remat", "remat_allowed_effects"),
)


def _effect_eq(self, other):
  return type(self) is type(other)


def _effect_hash(self):
  return hash(type(self))


def _effect_str(self):
  return type(self).__name__


def _checked_options(name: Any, options: dict[str, Any]) -> dict[str, bool]:
  """`declare_effect`'s arguments, checked: `name` an identifier, each
  option a bool, `shardable` only with `ordered`."""
  if not isinstance(name, str):
    raise TypeError(
        f"`declare_effect(name, ...)` needs the effect's name as a string, got "
        f"{type(name).__name__} {name!r}. Example: `declare_effect('MyLogEffect', ordered=True)`.")
  if not name.isidentifier():
    raise ValueError(
        f"`declare_effect` names the effect class, so {name!r} must be a Python "
        "identifier. Example: `declare_effect('MyLogEffect', ordered=True)`.")
  for key, value in options.items():
    if not isinstance(value, bool):
      raise TypeError(
          f"`declare_effect({name!r}, {key}=...)` must be True or False, got {value!r}.")
  if options["shardable"] and not options["ordered"]:
    raise ValueError(
        f"`declare_effect({name!r}, shardable=True, ordered=False)`: only an "
        "ordered effect can be shardable (shardable relaxes the single-device "
        "rule for ordered effects; unordered effects already run on any number "
        "of devices). Pass `ordered=True`, or drop `shardable=True`.")
  return options


@jax_tracebacks.api_boundary
def declare_effect(name: str, *, ordered: bool, shardable: bool = False,
                   lowerable: bool = True, control_flow: bool = True,
                   custom_derivatives: bool = True, remat: bool = True) -> type:
  """Create an effect type named `name` and add it to JAX's effect tables.

  The type joins `ordered_effects` (if `ordered`), `shardable_ordered_effects`
  (if `shardable`), `lowerable_effects`, `control_flow_allowed_effects`,
  `custom_derivatives_allowed_effects`, `remat_allowed_effects` (each if its
  flag is set), and always `partial_eval_kept_effects` where this JAX has it
  (that keeps an equation with the effect through dead-code elimination).
  All instances of the returned type are equal, so they share one token:
  effects of this type are ordered among themselves, not against other types.

  Args:
    name: the class name (a Python identifier).
    ordered: thread a token through computations so effects keep program order.
    shardable: allow the ordered effect in computations over several devices
      (program order per device; unordered across devices at one point).
      Requires `ordered=True`.
    lowerable: the effect may appear in a lowered computation.
    control_flow: allowed inside `lax.scan`, `while_loop`, `cond`.
    custom_derivatives: allowed inside `custom_jvp` / `custom_vjp` functions.
    remat: allowed inside `jax.checkpoint`.

  Returns:
    The effect type (a subclass of JAX's `Effect`, public as
    `jax.extend.core.Effect` since JAX 0.10). Declaring the
    same name again with the same options returns the same type.

  Raises:
    TypeError: `name` is not a string, or an option is not a bool.
    ValueError: `name` is not an identifier, `shardable=True` without
      `ordered=True`, or `name` was declared before with other options.

  Example:
    >>> AuditEffect = declare_effect("AuditEffect", ordered=True, shardable=True)
    >>> AuditEffect.__name__, AuditEffect() == AuditEffect()
    ('AuditEffect', True)
    >>> declare_effect("AuditEffect", ordered=True, shardable=True) is AuditEffect
    True
    >>> declare_effect("AuditEffect", ordered=False)
    Traceback (most recent call last):
    ValueError: Effect 'AuditEffect' was already declared with different options: ...

    A primitive whose abstract evaluation returns `{AuditEffect()}` as its
    effects then runs in program order under `jax.jit` over several devices.
  """
  options = _checked_options(name, dict(
      ordered=ordered, shardable=shardable, lowerable=lowerable, control_flow=control_flow,
      custom_derivatives=custom_derivatives, remat=remat))
  with _lock:
    if name in _declared:
      typ, previous = _declared[name]
      if previous == options:
        return typ
      diff = ", ".join(f"{k}={previous[k]} (now {options[k]})"
                       for k in options if previous[k] != options[k])
      raise ValueError(
          f"Effect {name!r} was already declared with different options: {diff}. "
          "Declare it with the same options, or use a new name.")
    typ = type(name, (jax_effects.Effect,), {
        "__module__": "jax_sharding_ext",
        "__qualname__": name,
        "__doc__": f"Effect declared by `jax_sharding_ext.declare_effect({name!r}, ...)`.",
        "__eq__": _effect_eq,
        "__hash__": _effect_hash,
        "__str__": _effect_str,
        "__repr__": _effect_str,
    })
    for option, set_name in _OPTION_SETS:
      if options[option]:
        _user_edits.add(jax_effects.EffectTypeSetEdit(set_name, typ))
    _user_edits.add(jax_effects.EffectTypeSetEdit("partial_eval_kept_effects", typ))
    _declared[name] = (typ, options)
  return typ


def _is_ordered_type(effect_type: type) -> bool:
  for typ, options in _declared.values():
    if typ is effect_type:
      return options["ordered"]
  return any(issubclass(effect_type, t) for t in jax_effects.effect_types_in("ordered_effects"))


@jax_tracebacks.api_boundary
def mark_shardable(effect_type: type) -> type:
  """Declare the existing ordered effect type `effect_type` shardable.

  Effects of that type are then allowed in computations over several devices:
  program order is kept per device; across devices at one program point there
  is no order. The primitive carrying the effect must give its side-effecting
  op a sharding in its lowering (as `io_callback` does), or XLA rejects it.
  Undone by `uninstall()`, redone by `install()`.

  Args:
    effect_type: a subclass of JAX's `Effect` (`jax.extend.core.Effect`)
      that is ordered (in `ordered_effects`).

  Returns:
    `effect_type`.

  Raises:
    TypeError: `effect_type` is not an effect class.
    ValueError: `effect_type` is not ordered.

  Example:
    >>> MetricsEffect = declare_effect("MetricsEffect", ordered=True)   # one device only
    >>> mark_shardable(MetricsEffect) is MetricsEffect
    True
    >>> mark_shardable(declare_effect("CacheEffect", ordered=False))
    Traceback (most recent call last):
    ValueError: `mark_shardable(CacheEffect)`: the effect is not ordered, ...
  """
  if not (isinstance(effect_type, type) and issubclass(effect_type, jax_effects.Effect)):
    raise TypeError(
        f"`mark_shardable(effect_type)` needs an effect class (a subclass of "
        f"`jax.extend.core.Effect`), got {effect_type!r}. Pass the class, not an "
        "instance: `mark_shardable(type(my_effect))`.")
  if not _is_ordered_type(effect_type):
    raise ValueError(
        f"`mark_shardable({effect_type.__name__})`: the effect is not ordered, and "
        "only ordered effects can be shardable (unordered effects already run on "
        "any number of devices). Declare it with "
        f"`declare_effect({effect_type.__name__!r}, ordered=True, shardable=True)`.")
  with _lock:
    if effect_type not in _shardable_marked:
      _shardable_marked.add(effect_type)
      _user_edits.add(jax_effects.EffectTypeSetEdit("shardable_ordered_effects", effect_type))
  return effect_type
