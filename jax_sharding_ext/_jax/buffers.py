"""The device buffers behind a `jax.Array`: a second array object over the
same buffers, jaxlib's per-array cache of single-device arrays, and buffer
addresses.

Touches: `ArrayImpl.clone` (a C++ method outside `jax.Array`'s declared
surface), `ArrayImpl._arrays` (jaxlib's per-array cache of its single-device
arrays), `ArrayImpl._rewrap_with_aval_and_sharding` (the same buffers under
another aval). Checked against JAX
0.8.3, 0.9.2 and 0.10.2 (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).

What breaks first when JAX changes: `clone` renamed (then `sibling` falls
back to assembling the array from its single-device arrays, as
`jax.make_array_from_single_device_arrays` does), or `_arrays` renamed (the
import-time check below fails naming it).
"""

from __future__ import annotations

import threading
from typing import Any

from jax_sharding_ext._jax import UnsupportedJaxVersionError
from jax_sharding_ext._jax.tables import ArrayImpl

# ---------------------------------------------------------------------------
# jaxlib builds an array's single-device arrays (`_arrays`, what
# `addressable_shards`, `addressable_data`, `np.asarray`, `copy_to_host_async`
# and iteration read) lazily, on first access, and caches them on the array.
# Building that cache is not thread-safe (jax 0.10.2 and 0.12.x): two threads
# reading `_arrays` of a fresh multi-device array at once can leave the cache
# with shards missing or repeated, for good, and every later fetch then
# reads wrong values (measured on stock `jax.Array`s: 4 threads reading
# `addressable_shards` of fresh 8-device arrays corrupted 7 of 300). Once
# built, reading it from any number of threads is safe. So every read of a
# GDA's private array that may build the cache goes through `ready()`, which
# builds it under one lock; the GDA's private array is never handed out, so
# nothing else builds it.
# ---------------------------------------------------------------------------

if not hasattr(ArrayImpl, "_arrays"):  # pragma: no cover - only on an unsupported JAX
  raise UnsupportedJaxVersionError(
      "jax_sharding_ext needs `jax.Array`'s per-shard cache (`ArrayImpl._arrays`), "
      "which this jaxlib does not have; please report the version.")

_cache_lock = threading.Lock()


def ready(arr: Any) -> Any:
  """`arr`, with jaxlib's per-shard cache built (under the lock, once).

  Call it before any use of `arr` that reads its single-device arrays, when
  another thread could be reading them too.
  """
  with _cache_lock:
    _ = arr._arrays  # builds the cache if it is not built yet
  return arr


def delete(arr: Any) -> None:
  """`arr.delete()`, never while this package reads or builds `arr`'s
  per-shard cache on another thread (jaxlib frees the cache with the
  buffers; the two at once can crash the process)."""
  with _cache_lock:
    arr.delete()


def single_device_arrays(arr: Any) -> list[Any]:
  """`arr`'s single-device arrays, in its sharding's addressable device order."""
  with _cache_lock:
    return list(arr._arrays)


def later_shards(arr: Any) -> tuple[Any, ...]:
  """`arr`'s single-device arrays after the first, to watch with `later_deleted`.

  Another array over one of `arr`'s buffers, donated or deleted, frees that
  buffer under `arr` too, and jaxlib's `arr.is_deleted()` reads only the
  first shard's buffer (jax 0.10.2 and 0.12.x); a computation given such an
  array crashes the process on several devices. The arrays returned are
  jaxlib's per-shard cache, which `arr` holds anyway, and each one's
  `is_deleted()` reads its buffer's state at the time: a caller may keep the
  tuple for as long as it keeps `arr`. Empty on one device (where
  `arr.is_deleted()` sees everything) and for a deleted `arr`.
  """
  if arr.sharding.num_devices == 1:
    return ()  # without building the per-shard cache (several us)
  with _cache_lock:
    arrays = arr._arrays  # None once `arr` is deleted
  return () if arrays is None else tuple(arrays[1:])


def watched_shards(view: Any) -> tuple[Any, ...]:
  """The shards of a keyed view's private array (`view._arr`) to watch for a
  buffer freed through another array: `later_shards`, read once per shared
  view and kept in `view._later` (None until read); `()` for a view no array
  outside it holds (`_jax.dispatch.mark_keyed`)."""
  later = view._later
  if later is None:
    later = view._later = later_shards(view._arr)
  return later


def view_freed(view: Any) -> bool:
  """Whether a view's private array is deleted, or (for a shared view, whose
  buffers arrays outside it hold) one of its buffers."""
  if view._arr.is_deleted():
    return True
  if view._node is None:  # its buffers' only owner
    return False
  return later_deleted(watched_shards(view))


def later_deleted(later: tuple[Any, ...]) -> bool:
  """Whether one of `later_shards(arr)` is deleted (`arr.is_deleted()` aside)."""
  return any(map(_is_deleted, later))


_is_deleted = ArrayImpl.is_deleted
_HAS_CLONE = hasattr(ArrayImpl, "clone")


def sibling(arr: Any) -> Any:
  """A new `jax.Array` object over the very buffers of `arr` (no copy).

  The two share their device buffers, so deleting or donating either deletes
  both, as for two references to one array. `ArrayImpl.clone` makes it in
  C++ without building `arr`'s per-shard cache (about 3 us on 8 devices,
  where building the cache first costs about 30 us); it refuses an array
  spanning other processes ("Cannot copy array to non-addressable device"),
  which is assembled from this process's single-device arrays instead, as
  `jax.make_array_from_single_device_arrays` assembles one.
  """
  if _HAS_CLONE:
    try:
      return arr.clone()
    except RuntimeError:
      if arr.is_fully_addressable:
        raise
  return ArrayImpl(arr.aval, arr.sharding, single_device_arrays(arr),
                   committed=arr._committed, _skip_checks=True)


def addresses(arr: Any, *, owned: bool) -> frozenset[tuple[int, int]] | None:
  """`(device id, buffer address)` of each of `arr`'s addressable shards.

  Two arrays share a device buffer exactly when these sets intersect. `owned`
  says that `arr` is a private array of this package (a GDA's): a user's
  array is read through a sibling, so that its own per-shard cache is never
  built here. None when this platform cannot tell buffer addresses.
  """
  if not owned:
    arr = sibling(arr)
  try:
    return frozenset((a.sharding._device_assignment[0].id, a.unsafe_buffer_pointer())
                     for a in single_device_arrays(arr))
  except Exception:  # e.g. a platform without buffer addresses
    return None


def shares_buffers(arr: Any, own: Any) -> bool:
  """Whether the user's array `arr` holds one of the device buffers of
  `own` (a private array of this package); False where this platform cannot
  tell buffer addresses."""
  mine, theirs = addresses(own, owned=True), addresses(arr, owned=False)
  return mine is not None and theirs is not None and not mine.isdisjoint(theirs)


def weakly_typed(arr: Any) -> Any:
  """A `jax.Array` over `arr`'s buffers with a weakly typed aval (no copy)."""
  aval = arr.aval.update(weak_type=True)
  if hasattr(arr, "_rewrap_with_aval_and_sharding"):
    return arr._rewrap_with_aval_and_sharding(aval, arr.sharding)
  # jax 0.8.x has no rewrap: the array is assembled from its single-device arrays.
  return ArrayImpl(aval, arr.sharding, single_device_arrays(arr), committed=arr._committed,
                   _skip_checks=True)
