"""The child side of `test_fuzz_bad_input.py`: what a clear error is, and
the checks of construction and shard access (meshes, shapes and mesh axes;
data callback results; constructor buffers; shard indices).

Each `check_*` function runs one case and returns why it breaks the model
(None when it keeps it); `run_*` runs a batch and fails listing every
broken case.
"""

from __future__ import annotations

from strategies import SPEC_JUNK, AccessCase, BufferCase, CallbackCase, LayoutCase

_CLEAR = (ValueError, TypeError, IndexError, RuntimeError)
_INTERNAL = ("INVALID_ARGUMENT", "safe_zip", "out of bounds for size", "has no attribute",
             "incompatible function arguments", "list index out of range")
"""Texts of errors that escaped from inside JAX or Python, naming no user mistake."""


class UserError(Exception):
  """What a raising data callback raises."""


def describe(e: BaseException) -> str:
  """`e` in one line, for a failure message."""
  return f"{type(e).__name__}: {str(e)[:300]}"


def unclear(e: BaseException, words: tuple[str, ...] = (), types: tuple = _CLEAR) -> str | None:
  """Why `e` is not a clear error naming one of `words` (None when it is)."""
  import jax
  if not isinstance(e, types) or isinstance(e, jax.errors.JaxRuntimeError):
    return f"raised {describe(e)}, not a clear {'/'.join(t.__name__ for t in types)}"
  if any(m in str(e) for m in _INTERNAL):
    return f"raised an error that names no user mistake: {describe(e)}"
  if words and not any(w in str(e) for w in words):
    return f"raised {describe(e)}, which names none of {words}"
  return None


def attempt(fn):
  """`(fn(), None)`, or `(None, the exception it raised)`."""
  try:
    return fn(), None
  except Exception as e:  # judged by the caller
    return None, e


def data_for(shape, dtype="float32"):
  """Distinct small values of `dtype` in `shape`."""
  import numpy as np
  n = int(np.prod(shape)) if shape else 1
  return (np.arange(n) % 251).astype(dtype).reshape(shape)


def differs(got, want) -> str | None:
  """How the array `got` differs from `want` in dtype, shape or values."""
  import numpy as np
  g, w = np.asarray(got), np.asarray(want)
  if g.dtype != w.dtype or g.shape != w.shape:
    return f"built {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
  if not np.array_equal(g, w, equal_nan=True):
    return f"built the values {g.ravel()[:8]}, expected {w.ravel()[:8]}"
  return None


def run_batch(check, cases: tuple) -> None:
  failures = []
  for c in cases:
    why = check(c)
    if why is not None:
      failures.append(f"  {c!r}\n    -> {why}")
  assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)


def _bounds(idx, shape) -> tuple:
  return tuple(s.indices(n)[:2] for s, n in zip(idx, shape, strict=True))


# -- meshes, shapes, mesh axes ------------------------------------------------


def _layout_faults(c: LayoutCase, shape) -> list[tuple[tuple, tuple[str, ...]]]:
  """The mistakes in `c` by the model, each as (error types, words its
  message must name one of)."""
  import numpy as np
  out: list[tuple[tuple, tuple[str, ...]]] = []
  for f in c.mesh.faults:
    out.append(((TypeError,) if f in ("not_devices", "not_a_mesh") else (ValueError,),
                ("global_mesh",)))
  if not isinstance(shape, (tuple, list, np.ndarray)):
    return [*out, ((TypeError,), ("global_shape",))]
  dims = shape.tolist() if isinstance(shape, np.ndarray) else list(shape)
  for d in dims:
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
      out.append(((TypeError,), ("global_shape",)))
    elif d < 0:
      out.append(((ValueError,), ("global_shape",)))
  if c.spec_form == "str":
    return [*out, ((TypeError,), ("mesh_axes",))]
  if c.spec_form == "none":
    return out
  sizes = dict(zip(c.mesh.names, c.mesh.shape, strict=False))
  used: list[str] = []
  for dim, e in enumerate(c.spec):
    e = tuple(e[1]) if isinstance(e, tuple) and e[:1] == ("list",) else e
    if e in SPEC_JUNK or (isinstance(e, tuple) and not all(type(n) is str for n in e)):
      out.append(((TypeError,), ("mesh_axes",)))
      continue
    names = () if e is None else (e,) if type(e) is str else e
    if dim >= len(dims) and names:
      out.append(((ValueError,), ("mesh_axes",)))
    for n in names:
      if n not in sizes or n in used:
        out.append(((ValueError,), ("mesh_axes",)))
      used.append(n)
    if not out and dim < len(dims):
      parts = int(np.prod([sizes[n] for n in names]))
      if dims[dim] % parts:
        out.append(((ValueError,), ("global_shape", "divisible")))
  return out


def _stock_sharding(mesh, c):
  from jax.sharding import NamedSharding, PartitionSpec
  spec = c.decoded_spec()
  entries = [] if spec is None else [tuple(e) if isinstance(e, list) else e for e in spec]
  return NamedSharding(mesh, PartitionSpec(*entries[:len(c.shape)]))


def check_layout_case(c: LayoutCase) -> str | None:
  """A bad mesh, shape or mesh axes: a clear error naming it. Else: stock's
  layout (`NamedSharding.devices_indices_map`, `shard_shape`) in the GDA-era
  form, and stock's array from the data."""
  import jax
  import numpy as np

  from jax_sharding_ext import GlobalDeviceArray as GDA
  from jax_sharding_ext import (
      get_shard_indices,
      get_shard_indices_replica_ids,
      get_shard_shape,
  )
  try:
    mesh, spec = c.mesh.build(), c.decoded_spec()
  except ValueError:
    return None  # stock's `Mesh` or `PartitionSpec` refuses it: the package never sees it
  shape = c.decoded_shape()
  faults = _layout_faults(c, shape)
  shape_ok = not any(words == ("global_shape",) for _, words in faults)
  dims = tuple(int(d) for d in (shape.tolist() if isinstance(shape, np.ndarray) else shape)
               ) if shape_ok else ()
  data = data_for(dims) if shape_ok else np.zeros((1,) * len(c.shape), np.float32)

  def run():
    if c.entry == "get_shard_indices":
      return get_shard_indices(shape, mesh, spec)
    if c.entry == "get_shard_indices_replica_ids":
      return get_shard_indices_replica_ids(shape, mesh, spec)
    if c.entry == "get_shard_shape":
      return get_shard_shape(shape, mesh, spec)
    if c.entry == "from_callback":
      return GDA.from_callback(shape, mesh, spec, lambda i: data[i])
    if c.entry == "from_batched_callback":
      return GDA.from_batched_callback(shape, mesh, spec, lambda ix: [data[i] for i in ix])
    if c.entry == "with_devices":
      return GDA.from_batched_callback_with_devices(
          shape, mesh, spec,
          lambda entries: [jax.device_put(data[i], d) for i, ds in entries for d in ds])
    if faults:  # buffers for the devices there are
      bufs = [jax.device_put(data, d) for d in jax.devices()[:max(1, len(c.mesh.items))]]
    else:
      bufs = [jax.device_put(data[i], d)
              for d, i in _stock_sharding(mesh, c).addressable_devices_indices_map(dims).items()]
    return GDA(shape, mesh, spec, bufs)

  got, err = attempt(run)
  if faults:
    if err is None:
      wrong = differs(got, data) if isinstance(got, GDA) and shape_ok else None
      return (f"accepted it (model: {faults}), returning {got!r}"[:400]
              + (f"; and {wrong}" if wrong else ""))
    reasons = [unclear(err, words, types) for types, words in faults]
    return None if None in reasons else reasons[0]
  if err is not None:
    return f"refused valid input: {describe(err)}"
  stock = _stock_sharding(mesh, c)
  if c.entry == "get_shard_shape":
    want = stock.shard_shape(dims)
    return None if got == want else f"shard shape {got}, stock {want}"
  if c.entry.startswith("get_shard_indices"):
    want_map, flat = stock.devices_indices_map(dims), list(mesh.devices.flat)
    if list(got) != flat:
      return f"keys {list(got)} are not mesh.devices.flat"
    replicas: dict = {}
    for d in flat:
      idx = got[d][0] if c.entry.endswith("ids") else got[d]
      if _bounds(idx, dims) != _bounds(want_map[d], dims):
        return f"index {idx} on {d}, stock {want_map[d]}"
      if any(s != slice(None) and s.start is None for s in idx):
        return f"index {idx} is not in the GDA-era form"
      rid = replicas.setdefault(_bounds(idx, dims), 0)
      replicas[_bounds(idx, dims)] += 1
      if c.entry.endswith("ids") and got[d][1] != rid:
        return f"replica id {got[d][1]} on {d}, expected {rid}"
    return None
  want = jax.make_array_from_callback(dims, stock, lambda i: data[i])
  if not got.sharding.is_equivalent_to(stock, len(dims)):
    return f"sharding {got.sharding}, stock {stock}"
  return differs(got, want)


# -- data callback results ----------------------------------------------------

_MULTI = ("jax_sharded", "jax_replicated", "jax_whole", "gda_indexed")
_MEANS_DATA = ("data", "list", "jax_default", "jax_device", "jax_sharded", "jax_replicated",
               "gda_indexed")
"""Results that hold the data at their index (stock refuses some, e.g. a list,
or a multi-device array after a single-device one)."""
_REFUSED = {"typed_key": "typed PRNG keys (an extended dtype, which a GDA cannot hold)",
            "jax_deleted": "a deleted array (stock returns that array as its result)"}
"""Results the package refuses where stock may build an array."""


def _odd_result(kind: str, shard, device: int):
  """What an odd data callback returns where the data is `shard` (numpy)."""
  import jax
  import numpy as np
  one = shard.ravel()[0] if shard.size else shard.dtype.type(0)
  other = np.int32 if shard.dtype != np.int32 else np.float32
  values = {
      "data": lambda: shard, "list": shard.tolist, "py_scalar": one.item,
      "np_scalar": lambda: one, "none": lambda: None, "string": lambda: "ab",
      "bytes": lambda: b"ab", "dict": lambda: {"a": shard},
      "objects": lambda: np.full(shard.shape, object(), dtype=object),
      "wrong_shape": lambda: np.zeros((*shard.shape, 2), shard.dtype),
      "other_dtype": lambda: shard.astype(other),
      "float64": lambda: shard.astype(np.float64), "uint64": lambda: shard.astype(np.uint64),
      "jax_default": lambda: jax.device_put(shard),
      "jax_device": lambda: jax.device_put(shard, jax.devices()[device]),
  }
  if kind == "typed_key":
    return jax.random.key(int(one))
  if kind == "jax_deleted":
    x = jax.device_put(shard, jax.devices()[device])
    x.delete()
    return x
  if kind == "raise":
    raise UserError("the callback failed")
  return values[kind]()


def _plain(v):
  """`v`, a GDA as its `jax.Array` (what stock is given for the same input)."""
  from jax_sharding_ext import GlobalDeviceArray as GDA
  return v.to_jax_array() if isinstance(v, GDA) else v


def _stacked(values):
  """`values` as one numpy array (a batched callback may return one), if they stack."""
  import numpy as np
  try:
    return np.stack([np.asarray(v) for v in values])
  except (ValueError, TypeError, RuntimeError):
    return values


def check_callback_case(c: CallbackCase) -> str | None:
  """The array `jax.make_array_from_callback` builds from the same results (a
  GDA given as its `jax.Array`), or the data those results hold, or a clear
  error naming the callback; the callback's own exception unchanged."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec

  from jax_sharding_ext import GlobalDeviceArray as GDA
  mesh = c.mesh.build()
  sharding = NamedSharding(mesh, PartitionSpec(*c.spec))
  data = data_for(c.shape, c.dtype)
  index_map = sharding.devices_indices_map(c.shape)
  keys = list(dict.fromkeys(_bounds(index_map[d], c.shape) for d in mesh.devices.flat))
  odd = set(keys) if c.where < 0 else {keys[c.where % len(keys)]}
  whole = None
  if c.result in _MULTI:
    whole = jax.device_put(data, NamedSharding(mesh, PartitionSpec()) if c.result in (
        "jax_replicated", "jax_whole") else sharding)
    if c.result == "gda_indexed":
      whole = GDA.from_jax_array(whole)

  def value(idx):
    if _bounds(idx, c.shape) not in odd:
      return data[idx]
    if whole is not None:
      return whole if c.result == "jax_whole" else whole[idx]
    return _odd_result(c.result, data[idx], c.device)

  def batched(indices):
    out = [value(i) for i in indices]
    forms = {"list": lambda: out, "tuple": lambda: tuple(out), "short": lambda: out[:-1],
             "long": lambda: [*out, out[0]], "generator": lambda: iter(out),
             "none": lambda: None, "array": lambda: _stacked(out)}
    return forms[c.batch]()

  if c.entry == "from_callback":
    got, err = attempt(lambda: GDA.from_callback(c.shape, mesh, PartitionSpec(*c.spec), value))
  else:
    got, err = attempt(lambda: GDA.from_batched_callback(c.shape, mesh, list(c.spec), batched))
  if c.result == "raise":
    return None if type(err) is UserError else f"the callback's exception was replaced: {err!r}"
  whole_batch = c.batch in ("list", "tuple")
  stock, stock_err = attempt(lambda: jax.make_array_from_callback(
      c.shape, sharding, lambda i: _plain(value(i))))
  if c.result in _REFUSED and err is None:
    return f"built a GDA from {_REFUSED[c.result]}"
  if stock_err is None and whole_batch and c.result not in _REFUSED:
    if err is not None:
      return f"refused what stock builds: {describe(err)}"
    return differs(got, stock)
  if err is None:
    if whole_batch or c.batch == "array":
      if c.result == "list":  # a list has no dtype: JAX's for the values
        data = np.asarray(jax.numpy.asarray(data.tolist()))
      return differs(got, data) if c.result in _MEANS_DATA else (
          f"built a GDA where stock raises {describe(stock_err)}")
    return f"accepted a batch of kind {c.batch!r}"
  return unclear(err, ("data_callback",))


# -- constructor buffers, and what a with-devices callback returns ------------


def _buffers(c: BufferCase, mesh, sharding, data):
  """The buffers of `c`: the right ones with its fault."""
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from jax_sharding_ext import GlobalDeviceArray as GDA
  local = list(mesh.local_devices)
  index_map = sharding.devices_indices_map(data.shape)
  bufs: list = [jax.device_put(data[index_map[d]], d) for d in local]
  k, n = c.k % len(local), len(local)
  f = c.fault
  if f == "all_dtype":
    bufs = [b.astype(np.int32 if b.dtype != np.int32 else np.float32) for b in bufs]
  elif f == "missing":
    del bufs[k]
  elif f == "extra":
    bufs.append(bufs[k])
  elif f in ("swap", "reversed") and n > 1:
    if f == "reversed":
      bufs.reverse()
    else:
      bufs[k], bufs[(k + 1) % n] = bufs[(k + 1) % n], bufs[k]
  elif f == "grouped":  # per distinct index, as a with-devices callback may return them
    order = sorted(range(n), key=lambda i: list(dict.fromkeys(
        _bounds(index_map[d], data.shape) for d in local)).index(
            _bounds(index_map[local[i]], data.shape)))
    bufs = [bufs[i] for i in order]
  elif f == "wrong_shape":
    bufs[k] = jax.device_put(np.zeros((*bufs[k].shape, 2), data.dtype), local[k])
  elif f == "wrong_dtype" and n > 1:
    bufs[k] = bufs[k].astype(np.int32 if data.dtype != np.int32 else np.float32)
  elif f == "other_device":
    bufs[k] = jax.device_put(bufs[k], jax.devices()[c.device])
  elif f == "device_twice" and n > 1:
    bufs[k] = jax.device_put(bufs[k], local[(k + 1) % n])
  elif f == "deleted":
    bufs[k] = jax.device_put(np.asarray(bufs[k]), local[k])
    bufs[k].delete()
  elif f == "numpy":
    bufs[k] = np.asarray(bufs[k])
  elif f == "multi":
    bufs[k] = jax.device_put(np.asarray(bufs[k]), NamedSharding(mesh, PartitionSpec()))
  elif f == "generator":
    return iter(bufs)
  elif f == "not_a_list":
    return bufs[k]
  elif f == "scalar":
    bufs[k] = 3
  elif f == "gda_buffer":
    one = Mesh(np.array([local[k]]), ("one",))
    bufs[k] = GDA.from_jax_array(jax.device_put(np.asarray(bufs[k]),
                                                NamedSharding(one, PartitionSpec())))
  elif f == "uncommitted":
    bufs[k] = jax.device_put(np.asarray(bufs[k]))
  return tuple(bufs) if f == "tuple" else bufs


def check_buffer_case(c: BufferCase) -> str | None:
  """The array `jax.make_array_from_single_device_arrays` builds from the same
  buffers (for the constructor: only in `global_mesh.local_devices` order),
  or a clear error naming them."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  from jax_sharding_ext import GlobalDeviceArray as GDA
  mesh = c.mesh.build()
  sharding = NamedSharding(mesh, PartitionSpec(*c.spec))
  data = data_for(c.shape, c.dtype)
  bufs = _buffers(c, mesh, sharding, data)
  if c.via == "constructor":
    got, err = attempt(lambda: GDA(c.shape, mesh, PartitionSpec(*c.spec), bufs))
  else:
    got, err = attempt(lambda: GDA.from_batched_callback_with_devices(
        c.shape, mesh, PartitionSpec(*c.spec), lambda entries: bufs))
  if c.fault == "generator":  # a stock call would consume it
    stock, stock_err = None, TypeError("a generator")
  else:
    stock, stock_err = attempt(
        lambda: jax.make_array_from_single_device_arrays(c.shape, sharding,
                                                         [_plain(b) for b in bufs]))
  in_order = isinstance(bufs, (list, tuple)) and all(
      isinstance(b, jax.Array) and b.sharding.device_set == {d}
      for b, d in zip(bufs, mesh.local_devices, strict=False))
  if stock_err is None and (in_order or c.via == "with_devices"):
    if err is not None:
      return f"refused what stock builds: {describe(err)}"
    return differs(got, stock)
  if err is None:
    if stock_err is None:
      return "accepted buffers out of `global_mesh.local_devices` order"
    return f"accepted what stock refuses ({describe(stock_err)})"
  return unclear(err, ("device_buffers", "data_callback", "deleted", "buffers"))


# -- shard access by index ----------------------------------------------------


def check_access_case(c: AccessCase) -> str | None:
  """The shard that Python indexing of the local shards gives (device and
  values), or a clear error of the list's type naming the method."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  from jax_sharding_ext import GlobalDeviceArray as GDA
  mesh = c.mesh.build()
  data = data_for(c.shape)
  stock = jax.device_put(data, NamedSharding(mesh, PartitionSpec(*c.spec)))
  gda = GDA.from_callback(c.shape, mesh, PartitionSpec(*c.spec), lambda i: data[i])
  i = c.decoded_index()
  got, err = attempt(lambda: getattr(gda, c.method)(i))
  # Python indexing of the local shards; a slice is refused (one shard is
  # returned). Stock's `addressable_data` ignores the index of a fully
  # replicated array, whose shards all hold its value.
  shards = [s.data for s in stock.addressable_shards]
  want, want_err = attempt(lambda: shards[i]) if not isinstance(i, slice) else (
      None, TypeError("a slice"))
  if want_err is None:
    if err is not None:
      return f"raised {describe(err)} where Python indexing of the local shards succeeds"
    if got.devices() != want.devices():
      return f"a shard on {got.devices()}, expected the one on {want.devices()}"
    return differs(got, want) or (differs(got, stock.addressable_data(i))
                                   if c.method == "addressable_data" else None)
  if err is None:
    return f"returned a value for the index {i!r} ({describe(want_err)} for a list)"
  return unclear(err, (c.method,), (type(want_err),))


# -- batches ----------------------------------------------------------------


def run_layout_cases(cases: tuple) -> None:
  run_batch(check_layout_case, cases)


def run_callback_cases(cases: tuple) -> None:
  run_batch(check_callback_case, cases)


def run_buffer_cases(cases: tuple) -> None:
  run_batch(check_buffer_case, cases)


def run_access_cases(cases: tuple) -> None:
  run_batch(check_access_case, cases)
