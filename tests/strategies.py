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
  if draw(st.integers(0, 9)) == 9 and kind == "numpy":  # a big array: a difference deep inside
    shape = (draw(st.sampled_from((1000, 4096))),)
  pp = per_process and kind != "gda_sharded" and draw(st.booleans())
  return MhLeaf(kind, dtype, shape, draw(st.integers(0, 3)), pp)


def _mh_tree(leaf, max_leaves: int = 6):
  """Mostly leaves and non-empty containers; sometimes None or an empty one."""
  def extend(children):
    return st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ("list", tuple(xs))),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ("tuple", tuple(xs))),
        st.dictionaries(st.sampled_from("abcde"), children, min_size=1, max_size=3).map(
            lambda d: ("dict", tuple(sorted(d.items())))))
  rare = st.sampled_from((("none",), ("list", ()), ("tuple", ()), ("dict", ())))
  return st.recursive(st.one_of(leaf, leaf, leaf, rare), extend, max_leaves=max_leaves)


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
  for _ in range(draw(st.sampled_from((1, 1, 0, max_changes)))):  # a quarter unchanged
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
  op = draw(st.sampled_from(MH_OPS[:1] * 3 + MH_OPS))  # assert_equal half the time
  if op in ("assert_equal", "process_allgather", "broadcast_one_to_all"):
    kinds = MH_LEAF_KINDS + (MH_BAD_LEAF_KINDS if draw(st.integers(0, 4)) == 4 else ())
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
      ("str", "object") if draw(st.integers(0, 4)) == 4 else ())
  tree = draw(_mh_tree(mh_leaves(leaf_kinds, per_process=True), max_leaves=3))
  return MhCase(op, tree, mesh=draw(st.sampled_from(MH_MESHES)),
                pspecs=draw(st.sampled_from(MH_SPECS)))


# ---------------------------------------------------------------------------
# Bad input (`test_fuzz_bad_input.py`): meshes, shapes, mesh axes, callback
# results, device buffers, shard indices and pjit arguments, good and bad.
# ---------------------------------------------------------------------------

MESH_FAULTS = ("empty", "device_twice", "axis_name_twice", "int_items", "str_items",
               "mixed_items", "rank", "not_a_mesh")
"""What can be wrong with a mesh (`rank`: fewer or more names than dimensions,
which stock's `Mesh` itself refuses)."""

NOT_A_MESH = ("devices", "abstract", "sharding", "none")
"""What is passed where a `Mesh` belongs (`MeshInput.form`)."""


@dataclasses.dataclass(frozen=True)
class MeshInput:
  """A mesh as data, bad ones included: `items` reshaped to `shape`, named
  `names`. An item is a device id, or `("int", n)` / `("str", s)`: that value
  where a device belongs."""

  shape: tuple[int, ...]
  names: tuple[str, ...]
  items: tuple
  form: str = "mesh"

  def build(self):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    if self.form != "mesh":  # what users pass by mistake where a `Mesh` belongs
      mesh = MeshInput(self.shape, self.names, self.items).build()
      return {"devices": lambda: mesh.devices, "abstract": lambda: mesh.abstract_mesh,
              "sharding": lambda: NamedSharding(mesh, PartitionSpec()),
              "none": lambda: None}[self.form]()
    by_id = {d.id: d for d in jax.devices()}
    values = [by_id[i] if type(i) is int else i[1] for i in self.items]
    kinds = {type(v) for v in values}
    if kinds in ({int}, {str}):  # as users write them: `np.array([0, 1, 2, 3])`
      arr = np.array(values)
    else:
      arr = np.empty(len(values), dtype=object)
      arr[:] = values
    return Mesh(arr.reshape(self.shape), self.names)

  @property
  def faults(self) -> tuple[str, ...]:
    """The mistakes in it: "not_a_mesh", "empty", "not_devices", "device_twice",
    "axis_name_twice"."""
    out = [] if self.form == "mesh" else ["not_a_mesh"]
    if not self.items:
      out.append("empty")
    if any(type(i) is not int for i in self.items):
      out.append("not_devices")
    ids = [i for i in self.items if type(i) is int]
    if len(set(ids)) != len(ids):
      out.append("device_twice")
    if len(set(self.names)) != len(self.names):
      out.append("axis_name_twice")
    return tuple(out)


@st.composite
def bad_meshes(draw) -> MeshInput:
  """A mesh with one of `MESH_FAULTS`, or (a quarter of the time) a valid one."""
  m = draw(meshes())
  shape, names, items = m.shape, m.names, m.device_ids
  fault = draw(st.sampled_from(("none", "none", "none", *MESH_FAULTS)))
  n = len(items)
  if fault == "empty":
    shape = draw(st.sampled_from(((0,), (0, 2), (2, 0))))
    names, items = tuple("xy"[:len(shape)]), ()
  elif fault == "device_twice":
    if n == 1 or draw(st.booleans()):  # often the simplest: one axis over a device twice
      shape, names, items = (2,), ("x",), (items[0],) * 2
    else:
      i, j = draw(st.permutations(range(n)))[:2]
      items = tuple(items[i] if k == j else v for k, v in enumerate(items))
  elif fault == "axis_name_twice":
    if len(names) == 1 or draw(st.booleans()):  # often both axes split
      shape, names = ((2, n // 2) if n >= 4 else (n, 1)), ("x", "x")
    else:
      i, j = draw(st.permutations(range(len(names))))[:2]
      names = tuple(names[i] if k == j else v for k, v in enumerate(names))
  elif fault in ("int_items", "str_items"):
    items = tuple(("int", i) if fault == "int_items" else ("str", f"cpu:{i}") for i in items)
  elif fault == "mixed_items":
    k = draw(st.integers(0, n - 1))
    items = tuple(("int", v) if j == k else v for j, v in enumerate(items))
  elif fault == "rank":
    names = names[:-1] if len(names) > 1 and draw(st.booleans()) else (*names, "w")
  elif fault == "not_a_mesh":
    return MeshInput(shape, names, items, draw(st.sampled_from(NOT_A_MESH)))
  return MeshInput(shape, names, items)


SPEC_JUNK = (1, 2.5, b"x", True)
"""Mesh axes entries of the wrong type."""

SHAPE_FORMS = ("tuple", "tuple", "tuple", "list", "ndarray", "int", "str", "none")


@dataclasses.dataclass(frozen=True)
class LayoutCase:
  """One call of a constructor or shard-math function with a maybe-bad mesh,
  shape and mesh axes.

  `shape`: its entries, a numpy scalar as `("np.int64", 8)`; `shape_form`:
  how it is passed ("tuple", "list", "ndarray", or instead a bare "int",
  "str" or "none"). `spec`: mesh axes entries (`("list", names)` a list of
  names); `spec_form`: "P", "tuple", "list", "none" (`mesh_axes=None`) or
  "str" (a bare axis name).
  """

  entry: str
  mesh: MeshInput
  shape: tuple
  shape_form: str
  spec: tuple
  spec_form: str

  def decoded_shape(self):
    import numpy as np
    dims = [getattr(np, d[0][3:])(d[1]) if isinstance(d, tuple) else d for d in self.shape]
    return {"tuple": tuple(dims), "list": dims, "ndarray": np.array(dims), "int": 8,
            "str": "88", "none": None}[self.shape_form]

  def decoded_spec(self):
    from jax.sharding import PartitionSpec
    entries = [list(e[1]) if isinstance(e, tuple) and e[:1] == ("list",) else e
               for e in self.spec]
    return {"P": lambda: PartitionSpec(*entries), "tuple": lambda: tuple(entries),
            "list": lambda: entries, "none": lambda: None,
            "str": lambda: self.mesh.names[0] if self.mesh.names else "x"}[self.spec_form]()


LAYOUT_ENTRIES = ("from_callback", "from_batched_callback", "with_devices", "constructor",
                  "get_shard_indices", "get_shard_indices_replica_ids", "get_shard_shape")
SHAPE_FAULTS = ("negative", "float", "integral_float", "np_float", "bool", "np_bool", "none",
                "str", "np_int", "not_divisible", "long", "zero")


@st.composite
def layout_cases(draw) -> LayoutCase:
  mesh = draw(bad_meshes())
  valid = MeshSpec(mesh.shape, mesh.names, tuple(range(len(mesh.items))))
  rank = draw(st.integers(1 if mesh.faults else 0, 3))  # a bad mesh: usually split over
  fits = len(mesh.shape) == len(mesh.names)  # else stock's `Mesh` refuses it
  spec: list = list(draw(specs(valid, rank))) if fits else []
  extra = tuple(draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank)))
  shape = list(divisible_shape(valid, tuple(spec), extra) if fits else extra)
  if draw(st.integers(0, 2)) == 0:  # a spec fault
    names = [*mesh.names, "zz"]
    entry = draw(st.one_of(
        st.sampled_from((*names, *SPEC_JUNK, None, ())),
        st.lists(st.sampled_from(names), min_size=1, max_size=3).map(tuple),
        st.lists(st.sampled_from(names), min_size=1, max_size=2).map(lambda v: ("list", tuple(v))),
        st.sampled_from(names).map(lambda n: ((n,),)),
        st.sampled_from(names).map(lambda n: (n, 1))))
    spec.insert(draw(st.integers(0, len(spec))), entry)
  if shape and draw(st.integers(0, 2)) == 0:  # a shape fault
    k = draw(st.integers(0, len(shape) - 1))
    fault = draw(st.sampled_from(SHAPE_FAULTS))
    d = shape[k]
    shape[k] = {"negative": -d or -1, "float": d + 0.5, "integral_float": float(d),
                "np_float": ("np.float32", float(d)), "bool": True, "np_bool": ("np.bool_", True),
                "none": None, "str": str(d), "np_int": ("np.int64", d), "not_divisible": d + 1,
                "long": d, "zero": 0}[fault]
    if fault == "long":
      shape += [1] * draw(st.integers(20, 40))
  return LayoutCase(draw(st.sampled_from(LAYOUT_ENTRIES)), mesh, tuple(shape),
                    draw(st.sampled_from(SHAPE_FORMS)) if draw(st.booleans()) else "tuple",
                    tuple(spec), draw(st.sampled_from(("P", "P", "tuple", "list", "none", "str"))))


CALLBACK_RESULTS = (
    "data", "list", "py_scalar", "np_scalar", "none", "string", "bytes", "dict", "objects",
    "wrong_shape", "other_dtype", "float64", "uint64", "jax_default", "jax_device",
    "jax_sharded", "jax_replicated", "jax_whole", "gda_indexed", "jax_deleted", "typed_key",
    "raise")
"""What a data callback returns for the shards it is odd for (`CallbackCase`)."""

BATCH_FORMS = ("list", "list", "list", "tuple", "short", "long", "generator", "none", "array")


@dataclasses.dataclass(frozen=True)
class CallbackCase:
  """`from_callback` / `from_batched_callback` whose callback returns
  `result` for one distinct index (`where`, counted in mesh order) or for
  all (`where=-1`), and the data there for the others. `device`: the device
  of a "jax_device" / "jax_deleted" result; `batch`: how the batched callback
  returns its values."""

  entry: str
  mesh: MeshSpec
  spec: tuple
  shape: tuple[int, ...]
  dtype: str
  result: str
  where: int
  device: int
  batch: str = "list"


@st.composite
def callback_cases(draw) -> CallbackCase:
  mesh, spec, shape, dtype = draw(sharded_arrays(dtypes=("float32", "int32", "float16", "int8",
                                                         "bool")))
  entry = draw(st.sampled_from(("from_callback", "from_batched_callback")))
  return CallbackCase(entry, mesh, spec, shape, dtype, draw(st.sampled_from(CALLBACK_RESULTS)),
                      draw(st.integers(-1, 3)), draw(st.integers(0, 7)),
                      draw(st.sampled_from(BATCH_FORMS)) if entry != "from_callback" else "list")


BUFFER_FAULTS = ("none", "none", "tuple", "all_dtype", "missing", "extra", "swap", "reversed",
                 "grouped", "wrong_shape", "wrong_dtype", "other_device", "device_twice",
                 "deleted", "numpy", "multi", "generator", "not_a_list", "scalar",
                 "gda_buffer", "uncommitted")


@dataclasses.dataclass(frozen=True)
class BufferCase:
  """The constructor's `device_buffers`, or what a
  `from_batched_callback_with_devices` callback returns (`via`), with one
  fault at buffer `k` (or for the whole list); `device`: the device of an
  "other_device" buffer."""

  via: str
  mesh: MeshSpec
  spec: tuple
  shape: tuple[int, ...]
  dtype: str
  fault: str
  k: int
  device: int


@st.composite
def buffer_cases(draw) -> BufferCase:
  mesh, spec, shape, dtype = draw(sharded_arrays())
  return BufferCase(draw(st.sampled_from(("constructor", "with_devices"))), mesh, spec, shape,
                    dtype, draw(st.sampled_from(BUFFER_FAULTS)), draw(st.integers(0, 7)),
                    draw(st.integers(0, 7)))


SHARD_INDICES = (0, 1, -1, 3, 7, 8, -8, -9, 100, True, False, 1.0, None, "0",
                 ("np.int64", 2), ("np.int64", -1), ("slice", 0, 2))
"""Indices given to `local_data` / `addressable_data` (plain, see `AccessCase`)."""


@dataclasses.dataclass(frozen=True)
class AccessCase:
  """`gda.<method>(index)`; `index` a plain value, `("np.int64", n)` or
  `("slice", start, stop)`."""

  mesh: MeshSpec
  spec: tuple
  shape: tuple[int, ...]
  method: str
  index: object

  def decoded_index(self):
    import numpy as np
    i = self.index
    if isinstance(i, tuple):
      return np.int64(i[1]) if i[0] == "np.int64" else slice(i[1], i[2])
    return i


@st.composite
def access_cases(draw) -> AccessCase:
  mesh, spec, shape, _ = draw(sharded_arrays())
  return AccessCase(mesh, spec, shape, draw(st.sampled_from(("local_data", "addressable_data"))),
                    draw(st.sampled_from(SHARD_INDICES)))


PJIT_IN = ("unspecified", "FROM_GDA", ("FROM_GDA", "FROM_GDA"), ("FROM_GDA", "P"), ("P", "P"),
           ("P", "None"), ("S", "None"), ("P",), ("P", "P", "P"), "P", ["P", "None"],
           {"a": "P"}, "x", 1, (("P", "None"),), (), ("unknown_axis", "P"))
PJIT_OUT = ("unspecified", "P", ("P", "P"), ("P", "None"), ["P", "P"], ("P",), "FROM_GDA", "x",
            ("P", "None", "None"), "None", ("S", "P"), "unknown_axis")
PJIT_ARGNUMS = (0, 1, -1, 5, (1, 1), (0, 1), True, 1.5, "1", ())
PJIT_B = ("gda", "array", "single", "numpy", "scalar")


@dataclasses.dataclass(frozen=True)
class PjitCase:
  """Legacy `pjit(f, in_res, out_res, static, donate)(gda, b)` inside `with
  mesh:` of the GDA's mesh (or none: `in_mesh`), for `f(a, b) = (a * 2 + b,
  a)`. Spec leaves: "P" (the GDA's spec), "S" (its `NamedSharding`), "None",
  "FROM_GDA", "unknown_axis", or junk; `b` one of `PJIT_B`."""

  mesh: MeshSpec
  spec: tuple
  shape: tuple[int, ...]
  in_res: object
  out_res: object
  static: object
  donate: object
  b: str
  in_mesh: bool = True


@st.composite
def pjit_cases(draw) -> PjitCase:
  mesh, spec, shape, _ = draw(sharded_arrays(max_rank=2))
  argnums = st.one_of(st.none(), st.none(), st.sampled_from(PJIT_ARGNUMS))  # mostly none
  return PjitCase(mesh, spec, shape, draw(st.sampled_from(PJIT_IN)),
                  draw(st.sampled_from(PJIT_OUT)), draw(argnums), draw(argnums),
                  draw(st.sampled_from(PJIT_B)), draw(st.integers(0, 3)) > 0)


# ---------------------------------------------------------------------------
# Damaged checkpoints and bad checkpoint arguments (`test_fuzz_checkpoints.py`).
# ---------------------------------------------------------------------------

CHECKPOINT_FORMATS = ("gda", "stock", "zarr3", "zarr3_gzip", "zarr3_crc32c",
                      "zarr3_transpose_zstd", "zarr3_big_blosc", "zarr3_sharded", "orbax")
"""What a checkpoint is written as: zarr with the GDA-era metadata (gzip, the
default of `serialization`) or stock's (`metadata="stock"`, zstd); zarr3
with stock's metadata (no compression) or with a codec chain in the spec;
orbax's `jax.Array` handler (OCDBT) through `orbax_support`."""

CHECKPOINT_DTYPES = ("float32", "int32", "bfloat16", "uint8", "bool", "float16", "int8")

CHECKPOINT_SAVES = {"serialization": ("run", "manager", "async", "async_futures"),
         "orbax": ("pytree", "standard", "manager")}
"""How a step is saved: `run_serialization`, the manager's `serialize`,
`async_serialize` awaited, `async_serialize` with a commit-future list; orbax's
PyTreeCheckpointer, StandardCheckpointer, CheckpointManager."""

CHECKPOINT_RESTORES = ("run_mesh", "run_sharding", "async", "manager")
CHECKPOINT_TARGETS = ("saved", "replicated", "one_device")
"""Where a restore puts the array: the saved mesh and mesh axes, replicated on
that mesh, or on one device."""

CHECKPOINT_PLACES = ("absolute", "relative", "latest")
"""How a step's path is spelled: absolute; relative to a working directory
changed before each step's save and restore; through `latest`, a symbolic
link re-pointed to the step before its save and restore."""

CHECKPOINT_VALUES = ("random", "random", "zeros", "partly_zero")


@dataclasses.dataclass(frozen=True)
class SavedArray:
  """One array of a checkpoint: its mesh, mesh axes, global shape and dtype."""

  mesh: MeshSpec
  spec: tuple
  shape: tuple[int, ...]
  dtype: str


@dataclasses.dataclass(frozen=True)
class CheckpointDamage:
  """One damage to a saved checkpoint.

  `kind`: one of `CHECKPOINT_FILE_DAMAGE` or "edit". `step` and `array` pick the
  directory (mod the number of steps, arrays); `file` a file of it in name
  order (mod their number; for "edit" among the JSON files, for a second
  damage among the chunks); `at` the bit to flip (bit `at % 8` of byte
  `at // 8`), the length to truncate to, or the other step (all mod their
  range); `edits` seeds, each picking one of the single-field edits the file
  then allows.
  """

  kind: str
  step: int = 0
  array: int = 0
  file: int = 0
  at: int = 0
  edits: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class DamagedCheckpoint:
  """A checkpoint saved step by step, damaged, then restored (see the module)."""

  format: str
  arrays: tuple[SavedArray, ...]
  steps: int
  save: str
  place: str
  damage: tuple[CheckpointDamage, ...]
  restore: str = "run_mesh"
  target: str = "saved"
  values: str = "random"
  check_first: bool = True
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class EditedCheckpoint:
  """A checkpoint saved step by step; one JSON file of one step (metadata, a
  record: `file` among them in name order) edited in every single-field way
  (`_edits`), one edit at a time, restoring after each."""

  format: str
  arrays: tuple[SavedArray, ...]
  steps: int
  save: str
  step: int = 0
  array: int = 0
  file: int = 0
  restore: str = "run_mesh"
  target: str = "saved"
  values: str = "random"
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class CutCheckpointCopy:
  """A checkpoint saved step by step; one step copied file by file in name
  order and the copy cut short at every point (the file at the cut half
  written when `half_written`)."""

  format: str
  arrays: tuple[SavedArray, ...]
  steps: int
  save: str
  step: int = 0
  half_written: bool = False
  restore: str = "run_mesh"
  values: str = "random"
  seed: int = 0


def checkpoint_family(fmt: str) -> str:
  return "orbax" if fmt == "orbax" else "serialization"


@st.composite
def _saved_arrays(draw) -> tuple[SavedArray, ...]:
  n = draw(st.integers(1, 2))
  out = []
  for _ in range(n):
    mesh, spec, shape, dtype = draw(sharded_arrays(max_rank=3, dtypes=CHECKPOINT_DTYPES))
    out.append(SavedArray(mesh, spec, shape, dtype))
  return tuple(out)


CHECKPOINT_FILE_DAMAGE = ("delete", "truncate", "flip", "swap_step", "swap_array", "copy_step",
               "uncommitted")
CHECKPOINT_CHUNK_DAMAGE = ("delete", "truncate", "flip", "swap_step", "swap_array", "copy_step")


@st.composite
def checkpoint_damages(draw, kinds: tuple[str, ...]) -> CheckpointDamage:
  kind = draw(st.sampled_from(kinds))
  edits = tuple(draw(st.lists(st.integers(0, 255), min_size=1, max_size=4))) \
      if kind == "edit" else ()
  return CheckpointDamage(kind, draw(st.integers(0, 3)), draw(st.integers(0, 1)),
                draw(st.integers(0, 63)), draw(st.integers(0, 1023)), edits)


@st.composite
def damaged_checkpoints(draw, places: tuple[str, ...] = ("absolute",),
                        kinds: tuple[str, ...] = CHECKPOINT_FILE_DAMAGE) -> DamagedCheckpoint:
  """A checkpoint and its damage: one of `kinds`, then maybe a chunk's;
  `places`: how its steps' paths may be spelled."""
  fmt = draw(st.sampled_from(CHECKPOINT_FORMATS))
  family = checkpoint_family(fmt)
  arrays = draw(_saved_arrays())
  first = draw(checkpoint_damages(kinds))
  more = tuple(draw(st.lists(checkpoint_damages(CHECKPOINT_CHUNK_DAMAGE), max_size=1)))
  return DamagedCheckpoint(
      fmt, arrays, draw(st.integers(1, 3)), draw(st.sampled_from(CHECKPOINT_SAVES[family])),
      draw(st.sampled_from(places)), (first, *more), draw(st.sampled_from(CHECKPOINT_RESTORES)),
      draw(st.sampled_from(CHECKPOINT_TARGETS)), draw(st.sampled_from(CHECKPOINT_VALUES)),
      draw(st.booleans()), draw(st.integers(0, 2**16)))


@st.composite
def edited_checkpoints(draw) -> EditedCheckpoint:
  fmt = draw(st.sampled_from(CHECKPOINT_FORMATS))
  return EditedCheckpoint(
      fmt, draw(_saved_arrays()), draw(st.integers(1, 2)),
      draw(st.sampled_from(CHECKPOINT_SAVES[checkpoint_family(fmt)])), draw(st.integers(0, 1)),
      draw(st.integers(0, 1)), draw(st.integers(0, 7)), draw(st.sampled_from(CHECKPOINT_RESTORES)),
      draw(st.sampled_from(CHECKPOINT_TARGETS)), draw(st.sampled_from(CHECKPOINT_VALUES)),
      draw(st.integers(0, 2**16)))


@st.composite
def cut_checkpoint_copies(draw) -> CutCheckpointCopy:
  fmt = draw(st.sampled_from(CHECKPOINT_FORMATS))
  steps = draw(st.integers(1, 2))
  return CutCheckpointCopy(
      fmt, draw(_saved_arrays()), steps,
      draw(st.sampled_from(CHECKPOINT_SAVES[checkpoint_family(fmt)])),
      draw(st.integers(0, steps - 1)), draw(st.booleans()),
      draw(st.sampled_from(CHECKPOINT_RESTORES)), draw(st.sampled_from(CHECKPOINT_VALUES)),
      draw(st.integers(0, 2**16)))


CHECKPOINT_SAVE_CALLS = ("async_serialize", "run_serialization", "manager.serialize")
CHECKPOINT_ORBAX_CALLS = ("orbax.restore", "gda_restore_args")
CHECKPOINT_CALLS = (*CHECKPOINT_SAVE_CALLS, "async_deserialize", "run_deserialization",
                    "manager.deserialize", *CHECKPOINT_ORBAX_CALLS)

CHECKPOINT_SPECS = (
    "good", "relative", "url", "trailing_slash", "spec_level_path", "cast", "ts_spec",
    "memory", "ocdbt", "zarr3", "missing", "empty_path", "nul_in_path", "path_is_a_file",
    "path_under_a_file", "no_kvstore", "no_driver", "unknown_driver", "kvstore_int",
    "kvstore_unknown_driver", "extra_member", "metadata_wrong_shape", "metadata_zero_chunks",
    "metadata_bad_chunks", "metadata_bad_dtype", "metadata_bad_compressor", "metadata_junk",
    "base_dtype_mismatch", "zarr3_bad_codecs", "n5", "cast_bad_dtype", "str", "none", "list")
"""How the tensorstore spec of a call is spelled or spoiled (`_spec_input`);
"missing": a path where nothing is stored."""

CHECKPOINT_TARGET_INPUTS = ("mesh", "named", "single_device", "mesh_of_one", None, 5,
                            "the mesh", ("devices",))
"""What a restore is asked to place the array onto: the saved mesh (the mesh
form), a `NamedSharding`, a `SingleDeviceSharding`, a mesh of one device, or
junk (a string, a number, a list of devices)."""

_CHECKPOINT_ARG_JUNK = (None, 5, -1, 1.5, True, "x", "", (), ("x",), ("nope",), ("x", "x"),
                        (("x", "x"),), [None, None, None, None], ("np.int64", 4), {"a": 1})
"""Plain values to put where an argument goes; ("np.int64", n) is a numpy integer."""


@dataclasses.dataclass(frozen=True)
class CheckpointCall:
  """One call of a checkpoint function, some arguments bad (or odd but legal).

  `array` is saved (for a restore: first, with a good spec); `spec` one of
  `CHECKPOINT_SPECS`; `target` one of `CHECKPOINT_TARGET_INPUTS`; `mesh_axes` "saved" (the
  array's) or a value; `global_shape` "saved", None or a value; `dtype`
  None or a value; `metadata` the save's `metadata=`.
  """

  fn: str
  array: SavedArray
  spec: str = "good"
  target: object = "mesh"
  mesh_axes: object = "saved"
  global_shape: object = None
  dtype: object = None
  metadata: object = "gda_serialization"


@st.composite
def checkpoint_calls(draw) -> CheckpointCall:
  fn = draw(st.sampled_from(CHECKPOINT_CALLS))
  mesh, spec, shape, dtype = draw(sharded_arrays(max_rank=2, dtypes=("float32", "int32")))
  a = SavedArray(mesh, spec, shape, dtype)
  rank = len(shape)
  shapes = st.one_of(
      st.sampled_from(("saved", None)),
      st.lists(st.integers(0, 9), min_size=rank, max_size=rank).map(tuple),
      st.lists(st.integers(-2, 9), min_size=0, max_size=rank + 1).map(tuple),
      st.sampled_from(_CHECKPOINT_ARG_JUNK))
  dtypes = st.sampled_from((None, "float32", "int8", "bfloat16", "bool", "uint16", "complex64",
                            "nope", 5, "V8", "U3", "O", ("np.dtype", "<f4"), [("a", "<f4")]))
  axes = st.one_of(st.just("saved"), st.sampled_from(_CHECKPOINT_ARG_JUNK),
                   st.lists(st.sampled_from((None, "x", "y", "z", ("x", "y"))), max_size=3)
                   .map(tuple))
  if fn in CHECKPOINT_SAVE_CALLS:
    fields: tuple[str, ...] = ("spec", "metadata")
  elif fn in CHECKPOINT_ORBAX_CALLS:
    fields = ("target", "mesh_axes", "global_shape", "dtype")
  else:
    fields = ("spec", "target", "mesh_axes", "global_shape", "dtype")
  bad = draw(st.sets(st.sampled_from(fields), min_size=1, max_size=2))
  return CheckpointCall(
      fn, a,
      draw(st.sampled_from(CHECKPOINT_SPECS)) if "spec" in bad else "good",
      draw(st.sampled_from(CHECKPOINT_TARGET_INPUTS)) if "target" in bad else "mesh",
      draw(axes) if "mesh_axes" in bad else "saved",
      draw(shapes) if "global_shape" in bad else None,
      draw(dtypes) if "dtype" in bad else None,
      draw(st.sampled_from(("stock", "nope", None, 5, {"compressor": {"id": "gzip"}})))
      if "metadata" in bad else "gda_serialization")


# ---------------------------------------------------------------------------
# Porting (`test_fuzz_port.py`): GDA-era modules and notebooks for the porting
# assistant, with which `with` items surely see a `Mesh`, which may see one
# made outside the files of the run, which lines no rule touches, which
# imports the rewrite leaves unused, and in which folder the code lives.
# ---------------------------------------------------------------------------

_PORT_MESH_IMPORTS = (  # (import line, how it spells the Mesh class)
    ("from jax.experimental.maps import Mesh as {a}", "{a}"),
    ("from jax.experimental import maps as {a}", "{a}.Mesh"),
    ("import jax.experimental.maps as {a}", "{a}.Mesh"),
    ("from jax.sharding import Mesh as {a}", "{a}"),
    ("from jax.interpreters.pxla import Mesh as {a}", "{a}"),
)
_PORT_UNUSED = ("from jax.sharding import OpShardingSharding",
                "from jax.experimental.maps import xmap as {a}_xmap",
                "from jax.interpreters.pxla import ShardingSpec, Replicated")
_PORT_MESHES = ("{mesh}(np.asarray(jax.devices()), ('x',))",
                "jax.make_mesh((len(jax.devices()),), ('x',))", "make_mesh()")
_PORT_OTHERS = ("contextlib.nullcontext()", "threading.Lock()", "None", "maybe_mesh(flag)",
                "flag", "open(__file__)")
# Made by functions the files of the run do not define, named like mesh makers.
_PORT_OUTSIDE = ("get_mesh()", "partitioning.create_mesh(flag)", "partitioning.makeMesh()")
_PORT_KEEP = ("# caf\u00e9 \u2014 a comment\tthat stays", "", "s = 'a\\tb  \\u00e9'  ",
              "t = (1,\n     2)", "def helper(x):\n  return x  # stays", "u = r'\\d+'")
_PORT_CONSTRUCTS = (
    "x = jax.tree_map(lambda a: a,\n                 [1, 2])",
    "y = jax.tree_util.tree_multimap(lambda a, b: a,\n                                [1], [2])",
    "def init(key: jax.random.KeyArray) -> 'jax.random.KeyArray':\n  return key",
    "def shape_of(v):\n  return jax.ShapedArray(v.shape, v.dtype)",
    # A rename that makes the module's longest line longer still.
    "zs = jax.tree_map(lambda leaf: leaf * 2.0, {'weights': weights, 'bias': bias, "
    "'scale': scale, 'offset': offset})",
)
# Uses of an import that the rewrite replaces whole, leaving it unused.
_PORT_PJIT_USE = "f = {p}.pjit(lambda v: v, in_axis_resources={p}.FROM_GDA, out_axis_resources=None)"
_PORT_MHU_USE = "total = jax.experimental.multihost_utils.process_allgather(np.zeros(3))"
_PORT_ORBAX = ("def restore(m, axes):\n  import orbax.checkpoint as ocp\n"
               "  return ocp.ArrayRestoreArgs(mesh=m, mesh_axes=axes)")
PORT_FOLDERS = ("orbax", "notebooks", "third_party/orbax/checkpoint")
"""Where the module lives: a user's folder named `orbax`, another folder, and a
copy of orbax (its `checkpoint` package), which alone is not today's orbax."""


@dataclasses.dataclass(frozen=True)
class PortSnippet:
  """A GDA-era module as data. `parts` are its chunks in order, each
  `(kind, text)`: a "keep" chunk holds nothing GDA-era and comes back byte
  for byte; the others hold what the assistant judges. `meshes` / `others`:
  the names a `with` enters whose every value is a `Mesh` / some value is
  not; `outside`: those of `others` that a function outside the files of the
  run may have made (reported). `unused`: import lines nothing uses, which
  stay. `folder` (one of `PORT_FOLDERS`, or None for no file) is where the
  module is written. `newline` is the module's line ending; with `notebook`,
  each chunk is a code cell."""

  parts: tuple[tuple[str, str], ...]
  meshes: tuple[str, ...]
  others: tuple[str, ...]
  newline: str = "\n"
  notebook: bool = False
  outside: tuple[str, ...] = ()
  unused: tuple[str, ...] = ()
  folder: str | None = None

  def text(self) -> str:
    return self.newline.join(t.replace("\n", self.newline) for _, t in self.parts) + self.newline

  @property
  def restores_with_orbax(self) -> bool:
    return any(kind == "orbax" for kind, _ in self.parts)


def _port_with(draw, k: int, mesh: str) -> tuple[str, str]:
  """A function entering `m{k}`, made on one or more paths; (its text, which
  of "mesh" / "outside" / "other" the values make it)."""
  shape = draw(st.sampled_from(("straight", "branches", "ifexp", "loop", "try")))
  count = 1 if shape == "straight" else 2
  values = draw(st.lists(st.one_of(st.sampled_from(_PORT_MESHES).map(lambda v: ("mesh", v)),
                                   st.sampled_from(_PORT_OTHERS).map(lambda v: ("other", v)),
                                   st.sampled_from(_PORT_OUTSIDE).map(lambda v: ("outside", v))),
                         min_size=count, max_size=count))
  a, b = (v.format(mesh=mesh) for _, v in (values * 2)[:2])
  name = f"m{k}"
  assign = {"straight": f"  {name} = {a}",
            "branches": f"  if flag:\n    {name} = {a}\n  else:\n    {name} = {b}",
            "ifexp": f"  {name} = {a} if flag else {b}",
            "loop": f"  {name} = {a}\n  for _ in items:\n    {name} = {b}",
            "try": f"  try:\n    {name} = {a}\n  except ValueError:\n    {name} = {b}"}[shape]
  kinds = {kind for kind, _ in values}
  kind = "mesh" if kinds == {"mesh"} else "outside" if "outside" in kinds else "other"
  return f"def run{k}(flag, items):\n{assign}\n  with {name}:\n    pass", kind


@st.composite
def port_snippets(draw) -> PortSnippet:
  """A module: imports (aliased, some of removed names nothing uses, some a
  rewrite leaves unused, some the user's own unused), helper functions
  returning a `Mesh` (or maybe None), functions entering values made on one
  or more paths (straight, both branches of an `if`, an `if` expression, a
  loop, a `try`) by a `Mesh`, by something else, or by a function outside
  the files of the run, renames whose call spans lines or makes the longest
  line longer, annotations of removed classes, orbax restore code, and lines
  no rule touches, shuffled; written in a folder or not."""
  alias = draw(st.sampled_from(("maps", "M", "mesh_lib", "legacy")))
  line, spelled = draw(st.sampled_from(_PORT_MESH_IMPORTS))
  mesh = spelled.format(a=alias)
  pjit = draw(st.sampled_from(("pjit", "pjit_lib", "pj")))
  head = ["import contextlib\nimport threading\nimport numpy as np\nimport jax",
          line.format(a=alias), "from myproject import partitioning",
          "from myproject.meshes import get_mesh", f"from jax.experimental import pjit as {pjit}",
          "import jax.experimental.multihost_utils"]
  head += [u.format(a=alias) for u in draw(st.lists(st.sampled_from(_PORT_UNUSED),
                                                       max_size=2, unique=True))]
  parts: list[tuple[str, str]] = [("head", "\n".join(head))]
  parts.append(("helpers", f"def make_mesh():\n  return {mesh}(np.asarray(jax.devices()), "
                f"('x',))\ndef maybe_mesh(flag):\n  if flag:\n    return make_mesh()"))
  body: list[tuple[str, str]] = []
  found: dict[str, list[str]] = {"mesh": [], "other": [], "outside": []}
  for k in range(draw(st.integers(1, 4))):
    text, kind = _port_with(draw, k, mesh)
    body.append(("with", text))
    found[kind].append(f"m{k}")
  unused = []
  for use, imported in ((_PORT_PJIT_USE.format(p=pjit), head[4]), (_PORT_MHU_USE, head[5])):
    if draw(st.booleans()):
      body.append(("construct", use))
    else:
      unused.append(imported)
  body += [("construct", c) for c in draw(st.lists(st.sampled_from(_PORT_CONSTRUCTS),
                                                     max_size=3, unique=True))]
  if draw(st.booleans()):
    body.append(("orbax", _PORT_ORBAX))
  body += [("keep", c) for c in draw(st.lists(st.sampled_from(_PORT_KEEP), max_size=4))]
  parts += draw(st.permutations(body))
  return PortSnippet(tuple(parts), tuple(found["mesh"]), (*found["other"], *found["outside"]),
                     draw(st.sampled_from(("\n", "\r\n"))), draw(st.booleans()),
                     outside=tuple(found["outside"]), unused=tuple(unused),
                     folder=draw(st.sampled_from((None, *PORT_FOLDERS))))
