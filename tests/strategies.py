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


# ---------------------------------------------------------------------------
# Sharing and donation (`test_fuzz_sharing.py`).
# ---------------------------------------------------------------------------

SHARING_SOURCES = ("gda", "array", "jit_gda")
"""Fresh arrays: a GDA from host data, a `jax.Array`, a GDA output of `jax.jit`."""

SHARING_ROUTES = {
    # route: (the kind of value it makes from a GDA, from a jax.Array)
    "to_jax_array": ("array", "array"),  # a jax.Array is passed on as itself
    "from_jax_array": ("gda", "gda"),
    "jnp_asarray": ("array", "array"),
    "device_put_same": ("array", "array"),
    "device_put_equivalent": ("array", "array"),  # another Mesh, the same devices
    "device_put": ("array", "array"),
    "reshape_itself": ("gda", "array"),
    "astype_itself": ("gda", "array"),
    "pickle": ("gda", "array"),
    "copy": ("array", "array"),
    "gda_over_shards": ("gda", "gda"),
    "stock_over_shards": ("array", "array"),
    "callback_arrays": ("gda", "gda"),
    "batched_callback_arrays": ("gda", "gda"),
    "callback_with_devices": ("gda", "gda"),
}
"""Every route from one array to another that may share its buffers."""

_ROUTE_DRAW = tuple(sorted(SHARING_ROUTES)) + (
    "to_jax_array", "device_put_equivalent", "from_jax_array", "jnp_asarray")
"""Routes as drawn: the conversions users chain most, twice as often."""

CALL_FORMS = ("argnums", "argnames", "pjit", "aot", "shard_map")
WARMTH = ("cold", "warm", "warm_thread")
"""Cold, or after a first call (on this thread or another) with independent
arrays of the same kinds, which fills jit's cache."""


@dataclasses.dataclass(frozen=True)
class SharingProgram:
  """Arrays made and derived, then donating calls (`test_fuzz_sharing.py`).

  `derived`: `(route, i)`, a new value made from value `i` (sources first).
  `calls`: per call, its arguments, each `("leaf", i)`, `("tuple", i, j)` or
  `("dict", i)`; a call's outputs join the values after it. `donate`: per
  argument position, for every call. `keep`: the values no call passes stay
  alive. `output_gda`: the output flag during the calls.
  """

  mesh: MeshSpec
  spec: tuple
  shape: tuple[int, ...]
  dtype: str
  sources: tuple[str, ...]
  derived: tuple[tuple[str, int], ...]
  calls: tuple[tuple[tuple, ...], ...]
  donate: tuple[bool, ...]
  form: str
  warm: str
  output_gda: bool = False
  keep: bool = True


@st.composite
def sharing_programs(draw) -> SharingProgram:
  mesh = draw(meshes(max_rank=2).filter(lambda m: len(m.device_ids) != 4))
  rank = draw(st.integers(1, 2))
  spec = draw(specs(mesh, rank))
  shape = divisible_shape(mesh, spec, tuple(draw(st.lists(st.integers(1, 2), min_size=rank,
                                                          max_size=rank))))
  sources = tuple(draw(st.lists(st.sampled_from(SHARING_SOURCES), min_size=1, max_size=2)))
  kinds = ["array" if s == "array" else "gda" for s in sources]
  derived = []
  for _ in range(draw(st.integers(0, 4))):
    route = draw(st.sampled_from(_ROUTE_DRAW))
    i = draw(st.one_of(st.just(len(kinds) - 1), st.integers(0, len(kinds) - 1)))  # often a chain
    derived.append((route, i))
    kinds.append(SHARING_ROUTES[route][kinds[i] == "array"])
  if "gda" not in kinds:  # a call of jax.Arrays only is stock's
    derived.append(("from_jax_array", 0))
    kinds.append("gda")
  # Each argument's structure is the same at every call (an AOT `Compiled`
  # takes only its own); later calls often pass earlier arguments again.
  structure = draw(st.lists(st.sampled_from(("leaf", "leaf", "leaf", "tuple", "dict")),
                            min_size=1, max_size=3))
  # Values made from one another are drawn together often: that is where
  # buffers are shared.
  family = {i: {i} for i in range(len(kinds))}
  for n, (_, i) in enumerate(derived, start=len(sources)):
    family[i] |= family[n]
    for j in family[i]:
      family[j] = family[i]
  pool, calls, last = len(kinds), [], []
  for k in range(draw(st.integers(1, 3))):
    anywhere = st.integers(0, pool - 1)
    first = draw(st.one_of(st.sampled_from(last), anywhere) if last else anywhere)
    pick = st.one_of(st.sampled_from(sorted(family.get(first, {first}))), anywhere)
    args = []
    for kind in structure:
      idx = [first if not args and not j else draw(pick) for j in range(1 + (kind == "tuple"))]
      args.append((kind, *idx))
    if k == 0 and not any(kinds[i] == "gda" for _, *idx in args for i in idx):
      args[0] = (args[0][0], kinds.index("gda"), *args[0][2:])
    calls.append(tuple(args))
    last = [i for _, *idx in args for i in idx]
    pool += len(last)
  n_args = len(structure)
  donate = tuple(draw(st.lists(st.booleans(), min_size=n_args, max_size=n_args)))
  return SharingProgram(mesh, spec, shape, draw(st.sampled_from(("float32", "int32"))),
                        sources, tuple(derived), tuple(calls), donate,
                        draw(st.sampled_from(CALL_FORMS)), draw(st.sampled_from(WARMTH)),
                        draw(st.booleans()), draw(st.booleans()))


# ---------------------------------------------------------------------------
# Install and uninstall racing other threads (`test_fuzz_install.py`).
# ---------------------------------------------------------------------------

RACING_USES = ("new_jit", "warm_jit", "jnp", "grad", "pjit", "output_flag", "ordered_print",
               "device_put", "fetch", "checkpoint", "shard_map_print", "sharded_callback",
               "ledger")
"""The uses of a GDA a worker thread repeats while the package is swapped."""


@dataclasses.dataclass(frozen=True)
class InstallRace:
  """Worker threads (each a tuple of `RACING_USES` it cycles through) and the
  main thread's pauses (seconds) before each `uninstall()` / `install()`."""

  workers: tuple[tuple[str, ...], ...]
  pauses: tuple[float, ...]


@st.composite
def install_races(draw) -> InstallRace:
  use = st.sampled_from(RACING_USES)
  workers = draw(st.lists(st.lists(use, min_size=1, max_size=3).map(tuple),
                          min_size=1, max_size=3))
  pauses = draw(st.lists(st.sampled_from((0.0, 0.0005, 0.002, 0.01, 0.05)),
                         min_size=2, max_size=40))
  return InstallRace(tuple(workers), tuple(pauses))


# ---------------------------------------------------------------------------
# Multihost (`test_fuzz_multihost.py`): pytrees that processes pass to the
# `multihost_utils` helpers, each process's own, and bad arguments.
# ---------------------------------------------------------------------------

MH_PROCESSES = 2
MH_LOCAL_DEVICES = 4
MH_DTYPES = ("float32", "int32", "bool", "int8", "bfloat16", "complex64", "float64", "uint8")
MH_LEAF_KINDS = ("numpy", "jax", "gda", "gda_replicated", "python", "numpy_scalar")
"""Leaves with a value per process: numpy, a `jax.Array` on this process's
devices, a GDA on them, a GDA replicated over every process's devices (each
process fills its own replicas), a Python scalar, a numpy scalar."""

MH_BAD_LEAF_KINDS = ("str", "object", "gda_sharded")
"""Leaves the helpers refuse (a GDA sharded across processes has no
per-process value)."""

MH_MESHES = ("rows", "flat", "cols", "interleaved", "local_only", "none", "device_list")
"""Meshes by name (`test_fuzz_multihost._mesh`): 'rows' (2, 4) and 'cols'
(4, 2) with each process's devices a block, 'flat' (8,), 'interleaved' (8,)
alternating processes (not contiguous), 'local_only' this process's devices,
and two non-meshes."""

MH_SPECS = ((), ("x",), ("x", "y"), (None, "y"), ("y",), (("x", "y"),), (None,),
            ("z",), ("x", "x"), ("x", None, None, "y"), "str:x", "int:3", "none")
"""`PartitionSpec` entries, or a non-spec: 'str:x' the string 'x', 'int:3',
'none' (None, replicated for this package)."""


@dataclasses.dataclass(frozen=True)
class MhLeaf:
  """A leaf as data; its value on process p is drawn from `(seed, p)` when
  `per_process`, else from `seed` alone."""

  kind: str
  dtype: str
  shape: tuple[int, ...]
  seed: int = 0
  per_process: bool = False
  bump: int = -1
  """A flat index (modulo the size) whose element is changed, or -1."""


@dataclasses.dataclass(frozen=True)
class MhChange:
  """What one process changes in the common tree before its call: at `path`
  (child positions from the root), `kind` is 'value' (element `arg`),
  'dtype' (to `arg`), 'shape' (to `arg`), 'extra_key', 'list_tuple',
  'none_leaf', 'drop' (the node's last child) or 'not_array'."""

  process: int
  kind: str
  path: tuple[int, ...]
  arg: object = None


@dataclasses.dataclass(frozen=True)
class MhCase:
  """One call of a `multihost_utils` helper on every process.

  `tree`: nested `("dict", ((key, node), ...))`, `("list", nodes)`,
  `("tuple", nodes)`, `("none",)` or an `MhLeaf`. `changes`: per-process
  perturbations. `mesh` / `pspecs` (one entry of `MH_SPECS` for the whole
  tree) for the conversions; `option`: `tiled` for `process_allgather`, the
  source process for `broadcast_one_to_all`.
  """

  op: str
  tree: object
  changes: tuple[MhChange, ...] = ()
  mesh: str = "rows"
  pspecs: object = ()
  option: object = None
  message: str = "mh"


MH_OPS = ("assert_equal", "process_allgather", "broadcast_one_to_all",
          "host_local_array_to_global_array", "global_array_to_host_local_array")


@st.composite
def mh_leaves(draw, kinds=MH_LEAF_KINDS, per_process=True) -> MhLeaf:
  kind = draw(st.sampled_from(kinds))
  dtype = draw(st.sampled_from(MH_DTYPES))
  if kind == "python":
    dtype = draw(st.sampled_from(("int64", "float64", "bool", "complex128")))
  rank = 0 if kind in ("python", "numpy_scalar") else draw(st.integers(0, 3))
  dims = st.sampled_from((0, 1, 2, 3, 4, 8)) if kind == "numpy" else st.sampled_from((1, 2, 4, 8))
  shape = tuple(draw(st.lists(dims, min_size=rank, max_size=rank)))
  if kind in ("gda_sharded",) and (not shape or shape[0] % (MH_PROCESSES * MH_LOCAL_DEVICES)):
    shape = (MH_PROCESSES * MH_LOCAL_DEVICES, *shape[1:])
  if draw(st.integers(0, 9)) == 0 and kind == "numpy":  # a big array: a difference deep inside
    shape = (draw(st.sampled_from((1000, 4096))),)
  pp = per_process and kind != "gda_sharded" and draw(st.booleans())
  return MhLeaf(kind, dtype, shape, draw(st.integers(0, 3)), pp)


def _mh_tree(leaf, max_leaves: int = 6):
  def extend(children):
    return st.one_of(
        st.lists(children, max_size=3).map(lambda xs: ("list", tuple(xs))),
        st.lists(children, max_size=3).map(lambda xs: ("tuple", tuple(xs))),
        st.dictionaries(st.sampled_from("abcde"), children, max_size=3).map(
            lambda d: ("dict", tuple(sorted(d.items())))))
  return st.recursive(st.one_of(leaf, st.just(("none",))), extend, max_leaves=max_leaves)


def mh_nodes(tree, path=()):
  """Every `(path, node)` of `tree`, the root first."""
  yield path, tree
  if isinstance(tree, tuple) and tree[0] in ("list", "tuple", "dict"):
    for i, child in enumerate(tree[1]):
      yield from mh_nodes(child[1] if tree[0] == "dict" else child, (*path, i))


_MH_CHANGES = ("value", "dtype", "shape", "extra_key", "list_tuple", "none_leaf", "drop",
               "not_array")


@st.composite
def mh_changes(draw, tree, kinds=_MH_CHANGES, max_changes: int = 2) -> tuple:
  nodes = list(mh_nodes(tree))
  out = []
  for _ in range(draw(st.integers(0, max_changes))):
    kind = draw(st.sampled_from(kinds))
    if kind in ("value", "dtype", "shape", "none_leaf", "not_array"):
      fit = [p for p, n in nodes if isinstance(n, MhLeaf) and n.kind != "gda_sharded"
             and (kind != "value" or 0 not in n.shape)]
    elif kind == "extra_key":
      fit = [p for p, n in nodes if isinstance(n, tuple) and n[0] == "dict"]
    else:
      fit = [p for p, n in nodes if isinstance(n, tuple) and n[0] in ("list", "tuple", "dict")
             and (kind != "drop" or n[1])]
    if not fit:
      continue
    path = draw(st.sampled_from(fit))
    arg = None
    if kind == "value":
      arg = draw(st.integers(0, 10 ** 6))
    elif kind == "dtype":
      arg = draw(st.sampled_from(MH_DTYPES))
    elif kind == "shape":
      arg = tuple(draw(st.lists(st.sampled_from((1, 2, 3, 4)), max_size=3)))
    out.append(MhChange(draw(st.integers(0, MH_PROCESSES - 1)), kind, path, arg))
  return tuple(out)


@st.composite
def mh_cases(draw) -> MhCase:
  """A call of one helper: equal or perturbed trees for the collectives, bad
  (or fitting) meshes, specs and leaves for the conversions."""
  op = draw(st.sampled_from(MH_OPS))
  if op in ("assert_equal", "process_allgather", "broadcast_one_to_all"):
    kinds = MH_LEAF_KINDS + (MH_BAD_LEAF_KINDS if draw(st.integers(0, 4)) == 0 else ())
    if op == "process_allgather":  # a global leaf's value is global: the same everywhere
      kinds = tuple(k for k in kinds if k != "gda_replicated")
    tree = draw(_mh_tree(mh_leaves(kinds, per_process=op != "assert_equal")))
    change_kinds = _MH_CHANGES if op == "assert_equal" else tuple(
        k for k in _MH_CHANGES if k != "value")
    changes = draw(mh_changes(tree, change_kinds))
    option = (draw(st.booleans()) if op == "process_allgather"
              else draw(st.sampled_from((None, 0, 1))) if op == "broadcast_one_to_all" else None)
    return MhCase(op, tree, changes, option=option)
  leaf_kinds = ("numpy", "jax", "gda", "python") + (
      ("str", "object") if draw(st.integers(0, 4)) == 0 else ())
  tree = draw(_mh_tree(mh_leaves(leaf_kinds, per_process=True), max_leaves=3))
  return MhCase(op, tree, mesh=draw(st.sampled_from(MH_MESHES)),
                pspecs=draw(st.sampled_from(MH_SPECS)))
