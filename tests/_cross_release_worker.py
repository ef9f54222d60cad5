"""One side of the cross-release checkpoint test (`test_cross_release.py`).

Run with the Python of one venv (one JAX release), or imported by the test
in its own process::

  python _cross_release_worker.py write DIR   # checkpoints and a pickle into DIR
  python _cross_release_worker.py read DIR    # restores them and checks every value

`write` saves each case of `CASES` with `serialization.run_serialization` in
both metadata formats (the GDA-era one, and stock's with `metadata="stock"`)
and through the GDA-era checkpoint manager, an orbax checkpoint of the same
GDAs, and a pickle of all of them; it records the JAX release that wrote
them. `read` restores each one as a GDA on the same mesh and spec and checks
type, shape, dtype, `mesh_axes`, weak type and every byte against the values
`expected` computes here (no random numbers: the same on every release).
Prints one JSON line (`{"jax": ..., "checked": N}`) and exits 0, or raises.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import re
import sys

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_sharding_ext as jse
from jax_sharding_ext import GlobalDeviceArray, orbax_support, serialization

N_DEVICES = 8

# (name, shape, dtype, mesh shape, mesh_axes): dtypes of every kind a
# checkpoint stores, sharded, replicated, partly replicated and uneven.
CASES = [
    ("f32_xy", (8, 4), np.float32, (4, 2), P("x", "y")),
    ("bf16_x", (8, 6), ml_dtypes.bfloat16, (4, 2), P("x")),
    ("f16_y", (4, 8), np.float16, (4, 2), P(None, "y")),
    ("i8_xy_swapped", (2, 8), np.int8, (4, 2), P("y", "x")),
    ("i32_replicated", (5, 3), np.int32, (4, 2), P()),
    ("u32_joint", (16,), np.uint32, (4, 2), P(("x", "y"))),
    ("bool_x", (8, 2), np.bool_, (8,), P("x")),
    ("c64_x", (8,), np.complex64, (8,), P("x")),
    ("i32_mesh_2x4", (2, 8), np.int32, (2, 4), P("x", "y")),
    ("scalar", (), np.float32, (8,), P()),
]


def expected(name: str, shape: tuple, dtype) -> np.ndarray:
  """The value of case `name`: distinct per element and per case, and with
  negative, fractional and large values where the dtype has them."""
  n = int(np.prod(shape, dtype=np.int64))
  salt = sum(map(ord, name))
  base = np.arange(n, dtype=np.int64) * 7919 + salt
  dt = np.dtype(dtype)
  if dt == np.bool_:
    values = (base % 3) == 1
  elif dt.kind == "c":
    values = (base % 97 - 48) / 8 + 1j * (base % 13 - 6) / 4
  elif dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16):
    values = (base % 211 - 105) / 16
  elif dt.kind == "u":
    values = base * 2654435761 % (2 ** 32)
  else:
    info = np.iinfo(dt)
    values = base % (int(info.max) - int(info.min) + 1) + int(info.min)
  return np.asarray(values).astype(dt).reshape(shape)


def _mesh(shape):
  names = ("x", "y")[:len(shape)]
  return Mesh(np.array(jax.devices()[:N_DEVICES]).reshape(shape), names)


def _gda(name, shape, dtype, mesh_shape, mesh_axes):
  data = expected(name, shape, dtype)
  return GlobalDeviceArray.from_callback(shape, _mesh(mesh_shape), mesh_axes,
                                         lambda index: data[index])


def _spec(root: pathlib.Path, fmt: str, name: str):
  return serialization.get_tensorstore_spec(str(root / fmt / name))


def write(root: pathlib.Path) -> int:
  gdas = {name: _gda(name, *rest) for name, *rest in CASES}
  names = list(gdas)
  serialization.run_serialization([gdas[n] for n in names],
                                  [_spec(root, "gda", n) for n in names])
  serialization.run_serialization([gdas[n] for n in names],
                                  [_spec(root, "stock", n) for n in names], metadata="stock")
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([gdas[n] for n in names], [_spec(root, "manager", n) for n in names],
                    on_commit_callback=lambda: None)
  manager.wait_until_finished()
  ocp.PyTreeCheckpointer().save(root / "orbax", gdas)
  (root / "gdas.pkl").write_bytes(pickle.dumps(gdas))
  (root / "writer.json").write_text(json.dumps({"jax": jax.__version__}))
  return len(CASES) * 5


def _check(what: str, got, name, shape, dtype, mesh_shape, mesh_axes) -> None:
  want = expected(name, shape, dtype)
  where = f"{what} {name}"
  assert type(got) is GlobalDeviceArray, (where, type(got))
  assert got.shape == want.shape and got.dtype == want.dtype, (where, got.shape, got.dtype)
  assert got.mesh_axes == mesh_axes and dict(got.mesh.shape) == dict(_mesh(mesh_shape).shape), (
      where, got.mesh_axes, got.mesh)
  assert not got.aval.weak_type, where
  host = np.asarray(got)
  assert host.tobytes() == want.tobytes(), (where, host, want)
  for shard in got.local_shards:
    assert np.asarray(shard.data).tobytes() == want[shard.index].tobytes(), (where, shard.index)


def read(root: pathlib.Path) -> int:
  checked = 0
  for fmt in ("gda", "stock", "manager"):
    meshes = [_mesh(c[3]) for c in CASES]
    axes = [c[4] for c in CASES]
    out = serialization.run_deserialization(meshes, axes, [_spec(root, fmt, c[0]) for c in CASES])
    for got, case in zip(out, CASES, strict=True):
      _check(fmt, got, *case)
      checked += 1
  target = {name: _gda(name, *rest) for name, *rest in CASES}
  restored = ocp.PyTreeCheckpointer().restore(root / "orbax", args=ocp.args.PyTreeRestore(
      item=target, restore_args=orbax_support.restore_args_for(target)))
  for case in CASES:
    _check("orbax", restored[case[0]], *case)
    checked += 1
  unpickled = pickle.loads((root / "gdas.pkl").read_bytes())
  for case in CASES:
    _check("pickle", unpickled[case[0]], *case)
    checked += 1
  return checked


def main() -> None:
  # Before the first JAX operation starts the CPU backend (importing JAX is harmless).
  os.environ["JAX_PLATFORMS"] = "cpu"
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                 os.environ.get("XLA_FLAGS", "")).split()
  os.environ["XLA_FLAGS"] = " ".join(
      [f"--xla_force_host_platform_device_count={N_DEVICES}", *flags])
  mode, root = sys.argv[1], pathlib.Path(sys.argv[2])
  assert jse.is_installed()
  checked = write(root) if mode == "write" else read(root)
  print(json.dumps({"jax": jax.__version__, "mode": mode, "checked": checked}))


if __name__ == "__main__":
  main()
