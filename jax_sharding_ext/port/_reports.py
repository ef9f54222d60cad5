"""The findings no import rewrite fixes: `JSE2xx` (meaning changed) and `JSE3xx` (removed).

`REPORTS` maps a symbol to its finding; a key also covers the symbol's
members (`jax.experimental.maps` covers `jax.experimental.maps.foo`), and a key
ending in `.*` covers only members (the module itself still exists). The
longest matching key wins. `ARRAY_TYPES` covers the removed array classes
wherever JAX kept them (`jax.numpy.DeviceArray`, `pxla.ShardedDeviceArray`,
private modules alike).
"""

from __future__ import annotations

from jax_sharding_ext.port._rules import Report

_SDA = ("use `jax.Array` (a ShardedDeviceArray is `isinstance(x, jax.Array) and "
        "x.is_fully_addressable and len(x.sharding.device_set) > 1`)")
ARRAY_TYPES = {
    "DeviceArray": Report("JSE303", "`{shown}`: `DeviceArray` was removed from JAX; use `jax.Array`"),
    "_DeviceArray": Report("JSE303", "`{shown}`: `DeviceArray` was removed from JAX; use `jax.Array`"),
    "ShardedDeviceArray": Report("JSE303", "`{shown}`: `ShardedDeviceArray` was removed from JAX; "
                                 + _SDA),
}

_MHU = ("`{shown}` is stock `multihost_utils`, and no import rewrite reaches a call through the "
        "`jax` module: ")
_MAPS_GONE = ("module `jax.experimental.maps` was removed from JAX (`Mesh` is `jax.sharding.Mesh`, "
              "`mesh(devices, names)` is `jax.set_mesh(jax.sharding.Mesh(devices, names))`, "
              "`xmap` is `jax.shard_map`)")


def _removed(old: str, new: str, code: str = "JSE307") -> Report:
  return Report(code, f"`{old}` was removed from JAX; use {new}")


def _tree(name: str, new: str) -> Report:
  return _removed(f"jax.{name}", f"`jax.tree.{new}` (or `jax.tree_util.tree_{new}`)", "JSE301")


REPORTS: dict[str, Report] = {
    # -- JSE2xx: still runs on today's JAX (or with this package), meaning changed.
    **{f"jax.experimental.multihost_utils.{name}": Report(
        "JSE203", _MHU + what + "; `from jax_sharding_ext import multihost_utils` and call "
        f"`multihost_utils.{name}`", gone=False) for name, what in (
            ("process_allgather", "for a global array it returns each process's value stacked on "
             "a new leading axis, not the global value a GDA-era call returned"),
            ("host_local_array_to_global_array", "it fails on a `GlobalDeviceArray` (an XLA "
             "error) where the GDA-era call returned one"),
            ("global_array_to_host_local_array", "it fails on a `GlobalDeviceArray` (an XLA "
             "error) where the GDA-era call returned one"),
            ("assert_equal", "for a replicated array spanning processes it compares nothing "
             "(each process checks its own replica)"))},
    # -- JSE3xx: gone from today's JAX.
    **{f"jax.{old}": _tree(old, new) for old, new in (
        ("tree_map", "map"), ("tree_multimap", "map"), ("tree_flatten", "flatten"),
        ("tree_leaves", "leaves"), ("tree_unflatten", "unflatten"),
        ("tree_structure", "structure"), ("tree_transpose", "transpose"),
        ("tree_reduce", "reduce"), ("tree_all", "all"))},
    "jax.tree_util.tree_multimap": _removed(
        "jax.tree_util.tree_multimap", "`jax.tree.map` (or `jax.tree_util.tree_map`)", "JSE301"),
    "jax.experimental.maps.xmap": _removed(
        "jax.experimental.maps.xmap", "`jax.shard_map` (per-device code over a `Mesh` with "
        "`in_specs` / `out_specs` PartitionSpecs)", "JSE302"),
    "jax.random.KeyArray": _removed("jax.random.KeyArray", "`jax.Array`", "JSE303"),
    "jax.ShapedArray": _removed(
        "jax.ShapedArray", "`jax.ShapeDtypeStruct` (or `jax.core.ShapedArray`)", "JSE304"),
    "jax.abstract_arrays.ShapedArray": _removed(
        "jax.abstract_arrays.ShapedArray", "`jax.ShapeDtypeStruct` (or `jax.core.ShapedArray`)",
        "JSE304"),
    "jax.experimental.pjit.pjit": Report(
        "JSE305", "`{shown}` is stock `jax.experimental.pjit.pjit`, deprecated and no longer "
        "taking `in_axis_resources` / `out_axis_resources` / `FROM_GDA`; use this package's "
        "legacy pjit (`from jax_sharding_ext import pjit`) or "
        "`jax.jit(f, in_shardings=..., out_shardings=...)`", gone=False),
    **{old: Report("JSE306", f"`{{shown}}`: `{old}` was removed from JAX; use `{new}`")
       for old, new in (
           ("jax.experimental.maps.Mesh", "jax.sharding.Mesh"),
           ("jax.interpreters.pxla.Mesh", "jax.sharding.Mesh"),
           ("jax.experimental.PartitionSpec", "jax.sharding.PartitionSpec"),
           ("jax.experimental.pjit.PartitionSpec", "jax.sharding.PartitionSpec"),
           ("jax.interpreters.pxla.PartitionSpec", "jax.sharding.PartitionSpec"),
           ("jax.experimental.pjit.with_sharding_constraint",
            "jax.lax.with_sharding_constraint"))},
    "jax.experimental.maps": Report("JSE307", _MAPS_GONE),
    "jax.experimental.pjit.*": Report(
        "JSE307", "`{shown}`: only a deprecated `pjit` is left in `jax.experimental.pjit`; "
        "this name was removed from JAX"),
    "jax.experimental.sharding": _removed(
        "jax.experimental.sharding", "`jax.sharding` (`MeshPspecSharding` is "
        "`jax.sharding.NamedSharding`)"),
    "jax.experimental.sharding.MeshPspecSharding": _removed(
        "jax.experimental.sharding.MeshPspecSharding", "`jax.sharding.NamedSharding`"),
    "jax.sharding.MeshPspecSharding": _removed(
        "jax.sharding.MeshPspecSharding", "`jax.sharding.NamedSharding`"),
    "jax.experimental.gda_serialization": _removed(
        "jax.experimental.gda_serialization",
        "`from jax_sharding_ext import serialization` (the old `serialization` module)"),
    "jax.experimental.global_device_array": _removed(
        "jax.experimental.global_device_array",
        "`from jax_sharding_ext import global_device_array`"),
    "jax.experimental.host_callback": _removed(
        "jax.experimental.host_callback", "`jax.debug.callback`, `jax.pure_callback` or "
        "`jax.experimental.io_callback`"),
    "jax.device_put_sharded": _removed(
        "jax.device_put_sharded", "`jax.make_array_from_single_device_arrays` or "
        "`jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))`"),
    "jax.device_put_replicated": _removed(
        "jax.device_put_replicated", "`jax.device_put(x, jax.sharding.NamedSharding(mesh, "
        "jax.sharding.PartitionSpec()))`"),
    "jax.xla_computation": _removed(
        "jax.xla_computation", "`jax.jit(f).lower(*args)` (`.as_text()`, `.compiler_ir()`)"),
    "jax.lib.xla_client": _removed("jax.lib.xla_client", "the public `jax` API"),
    "jax.lib.xla_bridge": _removed(
        "jax.lib.xla_bridge", "the public `jax` API (`jax.devices()`, `jax.process_index()`)"),
    "jax.lib.xla_client.Device": _removed("jax.lib.xla_client.Device", "`jax.Device`"),
    "jax.abstract_arrays": _removed("jax.abstract_arrays", "`jax.core`"),
    "jax.experimental.maps.mesh": _removed(
        "jax.experimental.maps.mesh", "`jax.set_mesh(jax.sharding.Mesh(devices, axis_names))`",
        "JSE308"),
    "jax.experimental.maps.thread_resources": _removed(
        "jax.experimental.maps.thread_resources",
        "`jax.sharding.get_abstract_mesh()` (the mesh of the enclosing `jax.set_mesh`; "
        "`.empty` when there is none)", "JSE308"),
}

# Options this package defines on `jax.config` (read: JSE201; set: JSE202).
OPTIONS = {
    "jax_array": "False by default, so GDA-era code takes its GDA branch",
    "jax_parallel_functions_output_gda": (
        "True: jit / pjit outputs with a NamedSharding come back as GDAs"),
}
CONFIG_OBJECTS = ("jax.config", "jax.config.config")
# Options JAX removed: option -> (code, message).
REMOVED_OPTIONS = {
    option: ("JSE302", f"`{{shown}}`: the `{option}` option was removed from JAX with `xmap`; "
             "use `jax.shard_map`")
    for option in ("experimental_xmap_spmd_lowering", "experimental_xmap_spmd_lowering_manual")
}

JSE201 = ("`{shown}`: `{option}` is an option of this package, not of stock JAX ({why}); it "
          "exists once `jax_sharding_ext` is imported")
JSE202 = ("`{shown}`: `{option}` is an option of this package, not of stock JAX ({why}); "
          "`import jax_sharding_ext` before this line")
JSE204 = ("`with {shown}:` is deprecated (a DeprecationWarning); write "
          "`with jax.set_mesh({shown}):`, which legacy pjit and `with_sharding_constraint` read "
          "as well")
JSE306 = ("`{shown}`: {why}, and no import rewrite reaches a name used through its module: "
          "write `{import_}` and use `{name}`")
JSE307_MISSING = ("`{shown}` was removed from JAX, and this package's `{module}` has no "
                  "`{name}`")
JSE309 = ("module `jax.config` was removed from JAX; `from jax import config` is the same "
          "object (or use `jax.config`)")
JSE310 = ("`{shown}(..., axis_resources=...)`: the keyword is `shardings` in today's "
          "`jax.lax.with_sharding_constraint`")

# One line per code, for `--codes` and the README.
CODES = {
    "JSE101": "a name of `jax.experimental.global_device_array`: import it from this package",
    "JSE102": "the module `jax.experimental.global_device_array`: import this package's",
    "JSE103": "legacy `pjit` / `FROM_GDA`: import them from this package",
    "JSE104": "`Mesh` / `PartitionSpec` from a removed location: import them from this package",
    "JSE105": "`multihost_utils` (or one of its GDA-taking functions): import this package's",
    "JSE106": "`gda_serialization.serialization`: import this package's `serialization`",
    "JSE107": "`with_sharding_constraint` from `jax.experimental.pjit`: import it from `jax.lax`",
    "JSE201": "reads `jax_array` / `jax_parallel_functions_output_gda`: options this package "
              "defines",
    "JSE202": "sets an option this package defines: import `jax_sharding_ext` first",
    "JSE203": "stock `multihost_utils` reached through the `jax` module: GDA-era meaning lost",
    "JSE204": "`with mesh:`: deprecated, write `with jax.set_mesh(mesh):`",
    "JSE301": "`jax.tree_map` and the other `jax.tree_*` aliases: use `jax.tree.*`",
    "JSE302": "`xmap` (and its config options): use `jax.shard_map`",
    "JSE303": "`DeviceArray` / `ShardedDeviceArray` / `KeyArray`: use `jax.Array`",
    "JSE304": "`ShapedArray` from `jax`: use `jax.ShapeDtypeStruct` or `jax.core.ShapedArray`",
    "JSE305": "stock `pjit` reached through its module: use this package's `pjit` or `jax.jit`",
    "JSE306": "a GDA-era name reached through a module: no import rewrite reaches it",
    "JSE307": "a module or name removed from JAX, with its replacement",
    "JSE308": "`maps.mesh` / `maps.thread_resources`: use `jax.set_mesh` / "
              "`jax.sharding.get_abstract_mesh`",
    "JSE309": "`jax.config` imported as a module: use `from jax import config`",
    "JSE310": "`with_sharding_constraint(axis_resources=...)`: the keyword is `shardings`",
}


def render(key: str, report: Report, shown: str) -> str:
  """The message of `report` for code shown as `shown`; a leading "`shown`: " is
  dropped when the code spells exactly what the message names."""
  message = report.message
  if message.startswith("`{shown}`: ") and shown == key:
    message = message[len("`{shown}`: "):]
  return message.format(shown=shown)


def report_for(symbol: str) -> tuple[str, Report] | None:
  """(the matched key, its report) for `symbol`, or None. Longest key wins."""
  parts = symbol.split(".")
  for n in range(len(parts), 0, -1):
    prefix = ".".join(parts[:n])
    if n > 1 and parts[0] in ("jax", "jaxlib") and parts[n - 1] in ARRAY_TYPES:
      return prefix, ARRAY_TYPES[parts[n - 1]]
    if prefix in REPORTS:
      return prefix, REPORTS[prefix]
    if n < len(parts) and prefix + ".*" in REPORTS:
      return prefix + ".*", REPORTS[prefix + ".*"]
  return None
