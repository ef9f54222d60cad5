"""A GDA has every member `jax.Array` declares, and each agrees with the
same `jax.Array` (its zero-copy `to_jax_array()` view).

The members are read from the installed JAX's own declaration of
`jax.Array` (`jax/_src/basearray.pyi`), so a member a later JAX adds fails
`test_every_declared_member_has_a_check` until it is forwarded and checked
here. Where the GDA keeps its GDA-era behaviour (`==`, the constructor) the
difference is named in `GDA_ERA`.
"""

import ast
import operator
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, parallel_functions_output_gda

_PYI = os.path.join(os.path.dirname(jax.__file__), "_src", "basearray.pyi")


def _declared() -> list[str]:
  with open(_PYI) as f:
    tree = ast.parse(f.read())
  cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Array")
  names = []
  for node in cls.body:
    if isinstance(node, ast.FunctionDef):
      names.append(node.name)
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      names.append(node.target.id)
  return sorted(set(names))


DECLARED = _declared()
DATA = np.arange(64, dtype=np.float32).reshape(8, 8)

GDA_ERA = {
    "__init__": "GlobalDeviceArray(global_shape, global_mesh, mesh_axes, device_buffers)",
    "__eq__": "GDA equality raises NotImplementedError, as in the GDA era",
    "__ne__": "GDA equality raises NotImplementedError, as in the GDA era",
}


def _call(name, *args, **kwargs):
  return lambda x: getattr(x, name)(*args, **kwargs)


def _attr(name):
  return lambda x: getattr(x, name)


def _binary(name):
  return lambda x: getattr(operator, name)(x, 3.0)


# Each check reads one member on an 8-device array of DATA sharded
# P("x", "y") (or as named): the GDA's result must equal the view's.
CHECKS = {
    "aval": _attr("aval"),
    "dtype": _attr("dtype"),
    "__numpy_dtype__": _attr("__numpy_dtype__"),
    "ndim": _attr("ndim"),
    "size": _attr("size"),
    "itemsize": _attr("itemsize"),
    "shape": _attr("shape"),
    "nbytes": _attr("nbytes"),
    "imag": _attr("imag"),
    "real": _attr("real"),
    "T": _attr("T"),
    "mT": _attr("mT"),
    "weak_type": _attr("weak_type"),
    "sharding": _attr("sharding"),
    "committed": _attr("committed"),
    "device": _attr("device"),
    "is_fully_addressable": _attr("is_fully_addressable"),
    "is_fully_replicated": _attr("is_fully_replicated"),
    "__array_namespace__": _call("__array_namespace__"),
    "__getitem__": lambda x: x[2:5, 1],
    "__setitem__": lambda x: x.__setitem__(0, 1.0),
    "__len__": len,
    "__iter__": lambda x: list(x),
    "__reversed__": lambda x: list(reversed(x)),
    "__round__": round,
    "__lt__": _binary("lt"), "__le__": _binary("le"), "__gt__": _binary("gt"),
    "__ge__": _binary("ge"),
    "__neg__": operator.neg, "__pos__": operator.pos, "__abs__": abs,
    "__invert__": lambda x: ~x.astype(jnp.int32),
    "__add__": _binary("add"), "__sub__": _binary("sub"), "__mul__": _binary("mul"),
    "__matmul__": lambda x: x @ x, "__truediv__": _binary("truediv"),
    "__floordiv__": _binary("floordiv"), "__mod__": _binary("mod"),
    "__divmod__": lambda x: divmod(x, 3.0), "__pow__": _binary("pow"),
    "__lshift__": lambda x: x.astype(jnp.int32) << 1,
    "__rshift__": lambda x: x.astype(jnp.int32) >> 1,
    "__and__": lambda x: x.astype(jnp.int32) & 5, "__xor__": lambda x: x.astype(jnp.int32) ^ 5,
    "__or__": lambda x: x.astype(jnp.int32) | 5,
    "__radd__": lambda x: 3.0 + x, "__rsub__": lambda x: 3.0 - x, "__rmul__": lambda x: 3.0 * x,
    "__rmatmul__": lambda x: DATA @ x, "__rtruediv__": lambda x: 3.0 / (x + 1),
    "__rfloordiv__": lambda x: 3.0 // (x + 1), "__rmod__": lambda x: 3.0 % (x + 1),
    "__rdivmod__": lambda x: divmod(3.0, x + 1), "__rpow__": lambda x: 2.0 ** x,
    "__rlshift__": lambda x: 1 << (x.astype(jnp.int32) % 8),
    "__rrshift__": lambda x: 256 >> (x.astype(jnp.int32) % 8),
    "__rand__": lambda x: 5 & x.astype(jnp.int32), "__rxor__": lambda x: 5 ^ x.astype(jnp.int32),
    "__ror__": lambda x: 5 | x.astype(jnp.int32),
    "__bool__": lambda x: bool(x[1, 1]),
    "__complex__": lambda x: complex(x[1, 1]),
    "__int__": lambda x: int(x[1, 1]),
    "__float__": lambda x: float(x[1, 1]),
    "__index__": lambda x: operator.index(x.astype(jnp.int32)[1, 1]),
    "__array__": np.asarray,
    "all": _call("all"), "any": _call("any"), "argmax": _call("argmax"),
    "argmin": _call("argmin"), "argpartition": _call("argpartition", 2),
    "argsort": _call("argsort"), "astype": _call("astype", jnp.int32),
    "byteswap": _call("byteswap"),
    "choose": lambda x: (x.astype(jnp.int32) % 2).choose([jnp.zeros(8), jnp.ones(8)]),
    "clip": _call("clip", 3, 40), "compress": _call("compress", np.arange(8) % 2 == 0, axis=0),
    "conj": _call("conj"), "conjugate": _call("conjugate"), "copy": _call("copy"),
    "cumprod": _call("cumprod", axis=0), "cumsum": _call("cumsum"),
    "diagonal": _call("diagonal"), "dot": _call("dot", DATA), "flatten": _call("flatten"),
    "item": _call("item", 9), "max": _call("max"), "mean": _call("mean"), "min": _call("min"),
    "nonzero": _call("nonzero"), "prod": _call("prod", axis=1), "ptp": _call("ptp"),
    "ravel": _call("ravel"), "repeat": _call("repeat", 2, axis=0),
    "reshape": _call("reshape", 4, 16), "round": _call("round"),
    "searchsorted": lambda x: x.ravel().searchsorted(jnp.array([3.5, 20.0])),
    "sort": _call("sort", axis=0), "squeeze": lambda x: x[None].squeeze(0),
    "std": _call("std"), "sum": _call("sum"), "swapaxes": _call("swapaxes", 0, 1),
    "take": _call("take", jnp.array([1, 5])), "tobytes": _call("tobytes"),
    "tolist": _call("tolist"), "trace": _call("trace"), "transpose": _call("transpose"),
    "var": _call("var"), "view": _call("view", jnp.int32),
    "at": lambda x: x.at[1, 2].set(-1.0),
    "addressable_data": lambda x: x.addressable_data(3),
    "addressable_shards": lambda x: _shards(x.addressable_shards),
    "global_shards": lambda x: _shards(x.global_shards),
    "block_until_ready": lambda x: x.block_until_ready() is x,
    "copy_to_host_async": _call("copy_to_host_async"),
    "devices": _call("devices"), "platform": _call("platform"),
    "is_deleted": _call("is_deleted"),
    "on_device_size_in_bytes": _call("on_device_size_in_bytes"),
    "traceback": lambda x: type(x.traceback),
    "unsafe_buffer_pointer": _call("unsafe_buffer_pointer"),  # several devices: raises
    "to_device": lambda x: x.to_device(jax.devices()[1]),
    "_rewrap_with_aval_and_sharding": lambda x: x._rewrap_with_aval_and_sharding(
        x.aval, NamedSharding(x.sharding.mesh, P("x", "y"))),
    "__dlpack__": lambda x: jnp.from_dlpack(x[0].to_device(jax.devices()[0])),
    "__buffer__": lambda x: bytes(memoryview(x.addressable_data(0))),
    "__release_buffer__": lambda x: bytes(memoryview(x.addressable_data(0))),
    "delete": None,  # test_delete_and_use_after_delete
}


def _shards(shards):
  return sorted((s.device.id, str(s.index), s.replica_id, np.asarray(s.data).tolist())
                for s in shards)


def _outcome(fn, x):
  try:
    return "value", fn(x)
  except Exception as e:  # compared with the view's outcome below
    return "error", type(e)


def _same(ours, stock, where):
  kind, a = ours
  stock_kind, b = stock
  assert kind == stock_kind, (where, ours, stock)
  if kind == "error":
    assert issubclass(a, b) or issubclass(b, a), (where, a, b)
    return
  if isinstance(b, jax.Array):
    assert isinstance(a, jax.Array) and not isinstance(a, GlobalDeviceArray), (where, type(a))
    assert (a.dtype, a.shape, a.weak_type) == (b.dtype, b.shape, b.weak_type), where
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)
  elif isinstance(b, (tuple, list)) and b and isinstance(b[0], jax.Array):
    assert type(a) is type(b) and len(a) == len(b), where
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
      _same(("value", u), ("value", v), f"{where}[{i}]")
  elif isinstance(b, np.ndarray):
    np.testing.assert_array_equal(a, b, err_msg=where)
  else:
    assert a == b, (where, a, b)


def test_every_declared_member_has_a_check():
  """A member a later JAX declares on `jax.Array` fails here until checked."""
  unchecked = [n for n in DECLARED if n not in CHECKS and n not in GDA_ERA]
  assert not unchecked, f"check these members of jax.Array on a GDA: {unchecked}"


@pytest.mark.parametrize("name", [n for n in DECLARED if CHECKS.get(n)])
def test_member_agrees_with_the_same_jax_array(mesh_2d, name):
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh_2d, P("x", "y"), lambda i: DATA[i])
  view = g.to_jax_array()
  # Exactly what this JAX's arrays have (read on the classes: some members
  # warn when read).
  assert hasattr(type(g), name) == hasattr(type(view), name), name
  _same(_outcome(CHECKS[name], g), _outcome(CHECKS[name], view), name)


@pytest.mark.parametrize("name", ["unsafe_buffer_pointer", "__dlpack__", "platform",
                                  "on_device_size_in_bytes", "__array__", "__iter__"])
def test_single_device_members_agree(mesh_factory, name):
  mesh = mesh_factory((1, 1), ("x", "y"))
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh, P("x", "y"), lambda i: DATA[i])
  fn = {"__dlpack__": jnp.from_dlpack}.get(name, CHECKS[name])
  _same(_outcome(fn, g), _outcome(fn, g.to_jax_array()), name)


@pytest.mark.parametrize("name", ["delete", "is_deleted", "aval", "weak_type", "traceback",
                                  "sharding", "platform", "is_ready", "block_until_ready",
                                  "on_device_size_in_bytes", "unsafe_buffer_pointer"])
def test_members_of_a_deleted_gda(mesh_2d, name):
  """Deleted, a GDA answers what stock answers without a buffer (`aval`,
  `sharding`, ...), and raises a RuntimeError for the rest; where stock's
  deleted array crashes the process (`platform()`, jax 0.10.2), the GDA
  raises instead."""
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh_2d, P("x", "y"), lambda i: DATA[i])
  g.delete()
  assert g.is_deleted()
  fn = CHECKS.get(name) or _call(name)
  if name in ("aval", "weak_type", "traceback", "sharding", "is_deleted", "delete"):
    fn(g)  # answered
  else:
    with pytest.raises(RuntimeError, match="deleted"):
      fn(g)


@pytest.mark.parametrize("op", [
    lambda x: jnp.asarray(x), lambda x: jnp.array(x, copy=False), lambda x: x.astype(x.dtype),
    lambda x: x[...], lambda x: x.reshape(x.shape), lambda x: x.to_device(x.sharding),
    lambda x: x.T if x.ndim < 2 else x.T.T, lambda x: x.real,
    lambda x: jax.device_put(x), lambda x: jax.device_put(x, x.sharding)])
def test_the_private_array_is_never_handed_out(mesh_2d, op):
  """Where stock returns the array itself (`x.astype(x.dtype) is x`), the
  GDA returns itself; `jnp.asarray` (which must give a `jax.Array`) gives a
  view over its buffers. Its private array never comes out, so no other code
  can build that array's per-shard cache from another thread."""
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh_2d, P("x", "y"), lambda i: DATA[i])
  x = g.to_jax_array()
  ours, stock = op(g), op(x)
  assert ours is not g._arr
  if stock is x:
    assert ours is g or (type(ours) is type(x) and _ptrs(ours) == _ptrs(x)), op
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(stock))


@pytest.mark.parametrize("copy", [None, True, False])
@pytest.mark.parametrize("dtype", [None, np.float64])
def test_np_asarray_copy_and_dtype_as_for_the_same_jax_array(mesh_2d, copy, dtype):
  """`np.asarray(x, dtype, copy=...)`: the value is fetched once and kept on
  the host; `copy=False` returns that copy (a ValueError only where `dtype`
  needs another), `copy=True` a new writable one, as stock does."""
  def outcome(a):
    try:
      first, second = (np.asarray(a, dtype=dtype, copy=copy) for _ in range(2))
    except ValueError:
      return "ValueError"
    np.testing.assert_array_equal(first, DATA.astype(dtype or DATA.dtype))
    return first is second, np.shares_memory(first, second), first.flags.writeable

  g = GlobalDeviceArray.from_callback(DATA.shape, mesh_2d, P("x", "y"), lambda i: DATA[i])
  assert outcome(g) == outcome(jax.device_put(DATA, g.sharding))


def _ptrs(x):
  return sorted(s.data.unsafe_buffer_pointer() for s in x.addressable_shards)


def test_is_ready(mesh_2d):
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh_2d, P("x", "y"), lambda i: DATA[i])
  g.block_until_ready()
  assert g.is_ready() is True is g.to_jax_array().is_ready()


def test_a_weakly_typed_gda_promotes_like_the_same_jax_array(mesh_2d):
  """JAX's promotion reads `x.aval.weak_type`: a weak 0-d jit output (the
  output flag makes it a GDA) promotes with bfloat16 to bfloat16, as the
  same `jax.Array` does."""
  s = NamedSharding(mesh_2d, P())
  with parallel_functions_output_gda(True):
    g = jax.jit(lambda: 2.0, out_shardings=s)()
  assert isinstance(g, GlobalDeviceArray)
  x = g.to_jax_array()
  assert g.weak_type is x.weak_type is True
  assert g.aval == x.aval
  bf16 = jnp.bfloat16(1)
  assert jnp.result_type(g, jnp.bfloat16) == jnp.result_type(x, jnp.bfloat16) == jnp.bfloat16
  assert (jnp.zeros_like(g) + bf16).dtype == (jnp.zeros_like(x) + bf16).dtype == jnp.bfloat16
  assert (g + bf16).dtype == (x + bf16).dtype == jnp.bfloat16
  assert jax.jit(lambda a: a + bf16)(g).dtype == jnp.bfloat16


def test_device_buffers_are_the_local_shards_data(mesh_2d):
  """The GDA-era attribute real code read: one single-device array per
  local device, in `mesh.local_devices` order."""
  g = GlobalDeviceArray.from_callback(DATA.shape, mesh_2d, P("x", "y"), lambda i: DATA[i])
  bufs = g._device_buffers
  assert [next(iter(b.devices())) for b in bufs] == list(mesh_2d.local_devices)
  for b, s in zip(bufs, g.local_shards, strict=True):
    np.testing.assert_array_equal(b, DATA[s.index])
    assert b.unsafe_buffer_pointer() == s.data.unsafe_buffer_pointer()
