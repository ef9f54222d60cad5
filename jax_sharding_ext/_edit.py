"""The install protocol: one reversible change to JAX (`Edit`) and the one
state that says whether the package is installed (`STATE`).

Every change this package makes to JAX (an entry in a table keyed by type, a
member of an effect-type set, a wrapped lowering rule, the runtime token set,
a traceback exclusion, an IPython hook) is an `Edit`. Each capability builds
its edits next to the handlers they register, as JAX registers a handler
right under its definition, and lists them in its module's `EDITS`;
`_install.py` applies them in order and reverts them in reverse order.

Some registrations cannot be undone (JAX's C++ canonicalisation registry and
jit's dispatch pytree registry have no removal). Their handlers stay
registered and consult `STATE.installed`, so after `uninstall()` they act as
stock JAX does for an unknown type.
"""

from __future__ import annotations


class Edit:
  """One reversible change to JAX.

  `apply()` and `revert()` are idempotent: this base class owns "applied";
  subclasses implement `_apply` and `_revert`. A `_revert` that finds the
  entry it installed replaced by someone else raises `RuntimeError` (see
  `replaced_error`) rather than clobber it; `_check_revert` says so
  beforehand, so that `uninstall()` can refuse before it changes anything.
  """

  name = "edit"
  applied = False

  def apply(self) -> None:
    if not self.applied:
      self._apply()
      self.applied = True

  def revert(self) -> None:
    if self.applied:
      self._revert()
      self.applied = False

  def check_revert(self) -> None:
    """Raise what `revert()` would raise for an entry someone else replaced,
    without changing anything."""
    if self.applied:
      self._check_revert()

  def _check_revert(self) -> None:
    pass

  def _apply(self) -> None:
    raise NotImplementedError

  def _revert(self) -> None:
    raise NotImplementedError

  def __repr__(self) -> str:
    return f"<{type(self).__name__} {self.name} applied={self.applied}>"


def replaced_error(what: str) -> RuntimeError:
  """The error of a revert that finds its entry replaced by another extension."""
  return RuntimeError(
      f"Cannot uninstall jax_sharding_ext: {what} was replaced by someone else "
      "after jax_sharding_ext installed it. Uninstall the other extension first.")


def uninstalled_error(value: str) -> RuntimeError:
  """The error of handing `value` (a description) to JAX while uninstalled."""
  return RuntimeError(
      f"{value} cannot be passed to JAX: jax_sharding_ext is uninstalled, so JAX "
      "no longer knows `GlobalDeviceArray`. Call `jax_sharding_ext.install()` to "
      "use GDAs again, or pass `gda.to_jax_array()`.")


class InstallState:
  """Whether `jax_sharding_ext` is installed: the one answer every handler reads."""

  __slots__ = ("installed",)

  def __init__(self):
    self.installed = False

  def __repr__(self) -> str:
    return f"<jax_sharding_ext {'installed' if self.installed else 'uninstalled'}>"


STATE = InstallState()
