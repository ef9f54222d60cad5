"""Hypothesis strategies shared by the suite's fuzzers (`test_fuzz_*.py`).

One module, so every property draws meshes, shapes, specs and its other
ingredients the same way. An example that runs in the child process
(`_isolated.py`) is a frozen dataclass or a tuple of plain values, whose
`repr` is Python that rebuilds it with `from strategies import *`: that is how
`make fuzz` saves a shrunk failure as a test (`_fuzz.save_found`).

Sections: the basics (devices, meshes, shapes, dtypes, specs), then one per
fuzzer.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

N_DEVICES = 8

# ---------------------------------------------------------------------------
# The basics.
# ---------------------------------------------------------------------------

DTYPES = ("float32", "int32", "bfloat16", "float16", "int8", "uint8", "bool", "complex64")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """A mesh as data: device ids in `device_ids` order reshaped to `shape`."""

  shape: tuple[int, ...]
  names: tuple[str, ...]
  device_ids: tuple[int, ...]

  def build(self):
    import jax
    import numpy as np
    from jax.sharding import Mesh
    by_id = {d.id: d for d in jax.devices()}
    return Mesh(np.array([by_id[i] for i in self.device_ids]).reshape(self.shape), self.names)


def _factorisations(n: int, rank: int) -> list[tuple[int, ...]]:
  if rank == 1:
    return [(n,)]
  return [(d, *rest) for d in range(1, n + 1) if n % d == 0
          for rest in _factorisations(n // d, rank - 1)]


@st.composite
def meshes(draw, max_devices: int = N_DEVICES, max_rank: int = 3) -> MeshSpec:
  """A valid mesh over a subset of the devices, in any device order."""
  n = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= max_devices]))
  rank = draw(st.integers(1, max_rank))
  shape = draw(st.sampled_from(_factorisations(n, rank)))
  names = tuple("xyzw"[:rank])
  ids = draw(st.permutations(range(N_DEVICES)))[:n]
  if draw(st.booleans()):  # usually devices in order, as users build meshes
    ids = sorted(ids)
  return MeshSpec(shape, names, tuple(ids))


@st.composite
def specs(draw, mesh: MeshSpec, rank: int) -> tuple:
  """A `PartitionSpec` (as a tuple of entries) over `mesh` for an array of `rank`.

  Each mesh axis is used at most once; an entry is None, an axis name or a
  tuple of names.
  """
  free = list(mesh.names)
  entries: list = []
  for _ in range(draw(st.integers(0, rank))):
    kind = draw(st.sampled_from(("none", "one", "many")))
    if kind == "none" or not free:
      entries.append(None)
    elif kind == "one":
      entries.append(free.pop(draw(st.integers(0, len(free) - 1))))
    else:
      k = draw(st.integers(1, len(free)))
      picked = tuple(free[:k])
      del free[:k]
      entries.append(picked)
  return tuple(entries)


def divisible_shape(mesh: MeshSpec, spec: tuple, extra: tuple[int, ...]) -> tuple[int, ...]:
  """A shape whose dimension `i` is `extra[i]` times the mesh size along `spec[i]`."""
  size = dict(zip(mesh.names, mesh.shape, strict=True))
  out = []
  for i, k in enumerate(extra):
    entry = spec[i] if i < len(spec) else None
    names = () if entry is None else (entry,) if isinstance(entry, str) else entry
    n = 1
    for a in names:
      n *= size[a]
    out.append(n * k)
  return tuple(out)


@st.composite
def sharded_arrays(draw, mesh: MeshSpec | None = None, max_rank: int = 3,
                   dtypes: tuple[str, ...] = ("float32", "int32")) -> tuple:
  """`(mesh, spec, shape, dtype)` of an array the spec divides evenly."""
  mesh = mesh if mesh is not None else draw(meshes())
  rank = draw(st.integers(0, max_rank))
  spec = draw(specs(mesh, rank))
  extra = tuple(draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank)))
  return mesh, spec, divisible_shape(mesh, spec, extra), draw(st.sampled_from(dtypes))
