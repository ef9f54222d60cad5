"""Which `jax.Array` objects share device buffers: a GDA's *family*.

A GDA keeps a private `jax.Array` (`gda._arr`) that it never hands out:
`to_jax_array()` returns a *sibling*, a second `jax.Array` object over the
same buffers, and `from_jax_array(x)` wraps a sibling of `x`. Siblings share
deletion and donation (deleting one deletes all), so to the user they are
one array; to the donation check and jit's fast-path key they are a family,
the set of objects whose buffers are the same. Knowing the family is what
lets a call with a GDA whose buffers the program also holds elsewhere keep
jit's C++ fast path.

A GDA built over arrays the caller handed in (the constructor's
`device_buffers`, a data callback that returns arrays already on their
devices) shares their buffers with arrays the package never sees: the
caller's single-device arrays, and whatever array they are shards of. Its
family is *untracked*: it counts as shared for as long as it lives, its
members may alias arrays of another shape or sharding, and the donation check
compares buffer addresses (`_jax/buffers.py`) instead of families.
"""

from __future__ import annotations

import threading
import weakref as _weakref
from typing import Any

from jax_sharding_ext._jax import buffers as jax_buffers


class _Family:
  """The live `jax.Array` objects (weakly held) over one set of buffers.

  `untracked`: arrays outside the family may share the buffers too.
  """

  __slots__ = ("members", "untracked")

  def __init__(self, untracked: bool = False):
    self.members: list[_weakref.ref] = []
    self.untracked = untracked

  def others_alive(self, arr: Any) -> bool:
    if self.untracked:
      return True
    for ref in self.members:
      m = ref()
      if m is not None and m is not arr:
        return True
    return False


class _Member(_weakref.ref):
  """A weak reference to a family member, keyed in `_family_of` by its id."""

  __slots__ = ("key", "family")
  key: int
  family: _Family


_family_of: dict[int, _Member] = {}
"""`id(array)` -> the weak reference to it, for family members."""

_lock = threading.Lock()
"""Held while a family gains a member, so that no thread's member is lost."""


def _forget(ref: _Member, table: dict = _family_of) -> None:
  """Weak-reference callback: drop a dead array's entry (the table is bound
  as a default, so it is there even at interpreter shutdown)."""
  if table.get(ref.key) is ref:
    del table[ref.key]


def _join(arr: Any, family: _Family) -> None:
  key = id(arr)
  ref = _Member(arr, _forget)
  ref.key, ref.family = key, family
  if family.members:
    family.members[:] = [m for m in family.members if m() is not None]
  family.members.append(ref)
  _family_of[key] = ref


def family_of(arr: Any) -> _Family | None:
  ref = _family_of.get(id(arr))
  if ref is None or ref() is not arr:
    return None
  return ref.family


def buffers_id(arr: Any) -> int:
  """The same number for every `jax.Array` object over the same buffers."""
  family = family_of(arr)
  return id(arr) if family is None else id(family)


def sibling_of(gda: Any, arr: Any) -> Any:
  """A new `jax.Array` over `arr`'s buffers, recorded in `gda`'s family.

  `arr` is the GDA's private array (for `to_jax_array`) or the array a GDA is
  made from (for `from_jax_array`); either way both end up in one family.
  """
  sibling = jax_buffers.sibling(arr)
  with _lock:  # two threads converting one GDA join one family
    family = family_of(arr)
    if family is None:
      family = _Family(untracked=gda_untracked(gda))
      _join(arr, family)
    _join(sibling, family)
    gda._family = family
  return sibling


def adopt(gda: Any, arr: Any) -> None:
  """Record in `gda`'s family `arr`, an array stock made over `gda`'s buffers
  (a zero-copy `jax.device_put` onto an equivalent sharding)."""
  with _lock:
    family = gda._family
    if family is None or family is UNTRACKED:
      family = family_of(gda._arr)
      if family is None:
        family = _Family(untracked=gda._family is UNTRACKED)
        _join(gda._arr, family)
      gda._family = family
    _join(arr, family)


UNTRACKED = _Family(untracked=True)
"""The family of a GDA known only to share its buffers with arrays the package
does not track: it lists no members (none are known), so marking costs one
attribute write."""


def mark_untracked(gda: Any) -> None:
  """Record that `gda`'s buffers may also be held by arrays the package does
  not track (see the module docstring)."""
  family = gda._family
  if family is None:
    gda._family = UNTRACKED
  else:
    family.untracked = True


def gda_untracked(gda: Any) -> bool:
  """True when arrays the package does not track may hold `gda`'s buffers."""
  family = gda._family
  return family is not None and family.untracked


def is_untracked(arr: Any) -> bool:
  """True when `arr` (a sibling of a GDA's array) belongs to an untracked family."""
  family = family_of(arr)
  return family is not None and family.untracked
