"""Checkpoint directories laid out exactly as orbax-checkpoint 0.2.7 (June
2023, with JAX 0.4.13) and 0.4.1 (September 2023, with JAX 0.4.16) wrote
them, for a pytree `{"params": {"b": jax.Array, "w": jax.Array}, "step":
np.ndarray}`. Written here with tensorstore and msgpack from the format's
facts (file names, JSON contents, tensorstore specs), since those orbax
versions cannot be installed next to today's:

- parameter names join the key path with "." (`params.w`); the `checkpoint`
  file is msgpack of the tree with each saved leaf replaced by the string
  `PLACEHOLDER://<name>`;
- a `jax.Array` leaf is a zarr array written by JAX's `async_serialize` under
  a 'cast' spec: metadata `_get_metadata(value)` without its 'dtype' (zstd,
  chunks of the shard shape, the shape) and the dtype in the base spec; a
  numpy leaf the same with one chunk of its whole shape;
- 0.2.7 (`use_ocdbt=False`): one directory per parameter, `<dir>/params.w/`;
- 0.4.1 (`use_ocdbt=True` by default since 0.4.0): one OCDBT database in the
  checkpoint directory (`manifest.ocdbt`, `d/`) with keys `params.w/...`
  (written with `max_inline_value_bytes` 1024 and `max_decoded_node_bytes`
  1e8), and a `_sharding` JSON file written by tensorstore's json driver:
  one member per `jax.Array` parameter, named by the parameter name, whose
  value is the JSON text `{"sharding_type": "NamedSharding", "shape": [mesh
  shape], "axis_names": [...], "partition_spec": [...]}`;
- 0.4.1's `StandardCheckpointer` (`write_tree_metadata=True`) adds
  `_METADATA`: `{"tree_metadata": {"('params', 'w')": {"key_metadata":
  [{"key": "params", "key_type": 2}, ...], "value_metadata": {"value_type":
  "jax.Array", "skip_deserialize": false}}, ...}}` (key_type 2: a dict key,
  1: a sequence index; value types "jax.Array", "np.ndarray");
- a `CheckpointManager` with one checkpointer keeps each step in
  `<dir>/<step>/default/`.
"""

from __future__ import annotations

import json
import os

import msgpack
import numpy as np
import tensorstore as ts

OCDBT_WRITE_CONFIG = {"max_inline_value_bytes": 1024, "max_decoded_node_bytes": 100000000}


def state(offset=0):
  """The tree saved, as numpy data: (tree of values, {name: (mesh axes or None)})."""
  w = np.arange(64, dtype=np.float32).reshape(8, 8) + 0.5 + offset
  b = np.arange(8, dtype=np.float32) * 2 + offset
  step = np.array(7 + offset, np.int32)
  return ({"params": {"b": b, "w": w}, "step": step},
          {"params.b": ("x",), "params.w": ("x", "y"), "step": None})


def _shard_shape(shape, mesh, axes):
  sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
  return [n // sizes[a] if a is not None else n
          for n, a in zip(shape, list(axes) + [None] * (len(shape) - len(axes)), strict=True)]


def _write_param(directory, name, value, axes, mesh, ocdbt, context):
  chunks = list(value.shape) if axes is None else _shard_shape(value.shape, mesh, axes)
  if ocdbt:
    kvstore = {"driver": "ocdbt", "base": f"file://{directory}", "path": name,
               "config": OCDBT_WRITE_CONFIG}
  else:
    kvstore = {"driver": "file", "path": f"{directory}/{name}"}
  dtype = np.dtype(value.dtype).name
  spec = {"driver": "cast", "dtype": dtype,
          "base": {"driver": "zarr", "kvstore": kvstore, "dtype": dtype,
                   "metadata": {"compressor": {"id": "zstd"}, "shape": list(value.shape),
                                "chunks": [max(1, c) for c in chunks]}}}
  t = ts.open(spec, create=True, open=True, context=context).result()
  t.write(value).result()


def _sharding_json(mesh, axes):
  return json.dumps({"sharding_type": "NamedSharding", "shape": list(mesh.devices.shape),
                     "axis_names": list(mesh.axis_names), "partition_spec": list(axes)})


def write_pytree(directory, version, mesh, standard=False, offset=0):
  """Write the tree (`state(offset)`, its arrays sharded over `mesh`, a 4x2
  mesh ("x", "y")) as `PyTreeCheckpointer().save(directory, tree)` of orbax
  `version` ("0.2.7" or "0.4.1") did (`standard`: 0.4.1's
  `StandardCheckpointer`). Returns the numpy values and mesh axes."""
  values, axes = state(offset)
  ocdbt = version == "0.4.1"
  os.makedirs(directory)
  context = ts.Context()
  flat = {"params.b": values["params"]["b"], "params.w": values["params"]["w"],
          "step": values["step"]}
  for name, value in flat.items():
    _write_param(str(directory), name, value, axes[name], mesh, ocdbt, context)
    if ocdbt and axes[name] is not None:  # a jax.Array leaf: its sharding, by process 0
      t = ts.open({"driver": "json", "kvstore": {"driver": "file",
                                                  "path": f"{directory}/_sharding"},
                   "json_pointer": "/" + name}, open=True, context=context).result()
      t.write(_sharding_json(mesh, axes[name])).result()
  placeholders = {"params": {"b": "PLACEHOLDER://params.b", "w": "PLACEHOLDER://params.w"},
                  "step": "PLACEHOLDER://step"}
  with open(os.path.join(directory, "checkpoint"), "wb") as f:
    f.write(msgpack.packb(placeholders))
  if standard:
    def leaf(keys, value_type):
      return {"key_metadata": [{"key": k, "key_type": 2} for k in keys],
              "value_metadata": {"value_type": value_type, "skip_deserialize": False}}
    tree = {str(("params", "b")): leaf(("params", "b"), "jax.Array"),
            str(("params", "w")): leaf(("params", "w"), "jax.Array"),
            str(("step",)): leaf(("step",), "np.ndarray")}
    with open(os.path.join(directory, "_METADATA"), "w") as f:
      f.write(json.dumps({"tree_metadata": tree}))
  return values, axes


def write_manager(directory, version, mesh, steps=(1, 2)):
  """`CheckpointManager(directory, PyTreeCheckpointer())` of orbax
  `version` after saving `steps` (step k saved `state(k)`)."""
  out = {}
  for step in steps:
    values, axes = write_pytree(os.path.join(directory, str(step), "default"), version, mesh,
                                offset=step)
    out[step] = values
  return out, axes
