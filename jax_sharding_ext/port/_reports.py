"""The findings' texts, and the symbols no rewrite replaces with the same meaning.

`REPORTS` maps a symbol to its finding; a key also covers the symbol's
members (`jax.experimental.maps` covers `jax.experimental.maps.foo`), and a key
ending in `.*` covers only members (the module itself still exists). The
longest matching key wins. `BY_NAME` covers names wherever JAX kept them
(the removed array classes `jax.numpy.DeviceArray`, `pxla.ShardedDeviceArray`,
`jax.random.KeyArray`; the legacy mesh's `thread_resources`), public and
private modules alike.
"""

from __future__ import annotations

import dataclasses

from jax_sharding_ext.port import _jaxnames
from jax_sharding_ext.port._rules import Report

_SDA = ("use `jax.Array` (a ShardedDeviceArray is `isinstance(x, jax.Array) and "
        "x.is_fully_addressable and len(x.sharding.device_set) > 1`)")
ARRAY_TYPES = {
    "DeviceArray": Report("JSE303", "`{shown}`: `DeviceArray` was removed from JAX; use `jax.Array`"),
    "_DeviceArray": Report("JSE303", "`{shown}`: `DeviceArray` was removed from JAX; use `jax.Array`"),
    "ShardedDeviceArray": Report("JSE303", "`{shown}`: `ShardedDeviceArray` was removed from JAX; "
                                 + _SDA),
    "KeyArray": Report("JSE303", "`{shown}`: `KeyArray` was removed from JAX; in an annotation "
                       "use `jax.Array`; to test for a key array, "
                       "`jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)`"),
}
"""The removed array classes: in an annotation `--write` makes them `jax.Array`
(an annotation claims no more than that); elsewhere (`isinstance`) they are
reported, as `jax.Array` is a wider class."""

_MAPS_GONE = ("module `jax.experimental.maps` was removed from JAX (`Mesh` is `jax.sharding.Mesh`, "
              "`mesh(devices, names)` is `jax.set_mesh(jax.sharding.Mesh(devices, names))`, "
              "`xmap` is `jax.shard_map`)")
THREAD_RESOURCES = (
    "`{shown}` reads the mesh of a legacy `with mesh:` only, and is empty under "
    "`with jax.set_mesh(mesh):` (what --write makes of `with mesh:`); read the mesh with "
    "`jax_sharding_ext.current_mesh()`, which sees both (inside `jit` too; an empty `Mesh` "
    "without one)")


def _removed(old: str, new: str, code: str = "JSE307") -> Report:
  return Report(code, f"`{old}` was removed from JAX; use {new}")


REPORTS: dict[str, Report] = {
    # -- JSE3xx: gone from today's JAX, no same-meaning replacement.
    "jax.experimental.maps.xmap": _removed(
        "jax.experimental.maps.xmap", "`jax.shard_map` (per-device code over a `Mesh` with "
        "`in_specs` / `out_specs` PartitionSpecs)", "JSE302"),
    "jax.experimental.maps": Report("JSE307", _MAPS_GONE),
    "jax.experimental.pjit.*": Report(
        "JSE307", "`{shown}`: only a deprecated `pjit` is left in `jax.experimental.pjit`; "
        "this name was removed from JAX"),
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
    "jax.abstract_arrays": _removed("jax.abstract_arrays", "`jax.core`"),
    "jax.spmd_mode": _removed(
        "jax.spmd_mode", "nothing: eager operations take arrays that span processes without "
        "it (drop the `with jax.spmd_mode(...)` item)"),
    "jax.sharding.OpShardingSharding": _removed(
        "jax.sharding.OpShardingSharding", "`jax.sharding.NamedSharding` (a mesh and a "
        "`PartitionSpec`)"),
    "jax.sharding.PmapSharding": _removed(
        "jax.sharding.PmapSharding", "`jax.sharding.NamedSharding` over a 1-axis `Mesh`"),
    "jax.sharding.PositionalSharding": _removed(
        "jax.sharding.PositionalSharding", "`jax.sharding.NamedSharding` (a `Mesh` of the "
        "devices and a `PartitionSpec`)"),
    "jax.experimental.maps.mesh": _removed(
        "jax.experimental.maps.mesh", "`jax.set_mesh(jax.sharding.Mesh(devices, axis_names))`",
        "JSE308"),
}

BY_NAME = {**ARRAY_TYPES, "thread_resources": Report("JSE308", THREAD_RESOURCES)}
"""Reports by the name's last part, in whichever JAX module (`gone` is asked of
the installed JAX)."""

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

JSE108 = "`from {module} import *`: this module uses {names} from it ({why}); use {new}"
JSE201 = ("`{shown}`: `{option}` is an option of this package, not of stock JAX ({why}); "
          "`import jax_sharding_ext` defines it")
JSE202 = ("`{shown}`: `{option}` is an option of this package, not of stock JAX ({why}); "
          "`import jax_sharding_ext` before this line")
JSE203 = ("`{shown}` is stock `multihost_utils.{name}`, which {what}; use `{new}`")
MHU_WHAT = {
    "process_allgather": "for a global array returns each process's value stacked on a new "
                         "leading axis, not the global value a GDA-era call returned",
    "host_local_array_to_global_array": "fails on a `GlobalDeviceArray` (an XLA error) where "
                                        "the GDA-era call returned one",
    "global_array_to_host_local_array": "fails on a `GlobalDeviceArray` (an XLA error) where "
                                        "the GDA-era call returned one",
    "assert_equal": "for a replicated array spanning processes compares nothing (each "
                    "process checks its own replica)",
    "broadcast_one_to_all": "does not take a `GlobalDeviceArray` as one host's value",
}
JSE204 = ("`with {shown}:` enters the legacy mesh context (deprecated), which "
          "`jax.sharding.get_abstract_mesh()` and today's flax do not see; write "
          "`with {new}:`, which legacy pjit and `with_sharding_constraint` read as well")
JSE204_MAYBE = (
    "`with {shown}:` enters the legacy mesh context (deprecated) where the value is a `Mesh`; "
    "not every value that can reach it is surely one (`jax.set_mesh` refuses anything else), "
    "so --write leaves it: where it is a `Mesh`, write `with {new}:`")
JSE204_UNKNOWN = (
    "`with {shown}:`: nothing in the files of this run says what `{value}` is{made}; where it "
    "is a `Mesh`, this enters the legacy mesh context, deprecated on today's JAX (and unseen "
    "by `jax.sharding.get_abstract_mesh()` and today's flax): write `with {new}:` there "
    "(--write leaves it, as `jax.set_mesh` refuses anything but a `Mesh`)")
JSE205 = ("`{shown}`: `_device_buffers` is a `GlobalDeviceArray`'s (its local single-device "
          "arrays, in local-device order), not a `jax.Array`'s; for either kind, "
          "`[s.data for s in {value}.addressable_shards]`")
JSE206 = ("`{shown}` runs `{arg}` under the legacy `with {mesh}:` (deprecated; invisible to "
          "`jax.sharding.get_abstract_mesh()` and today's flax), and `jax.set_mesh` is no "
          "decorator; call `{arg}` inside `with jax.set_mesh({mesh}):` instead")
JSE206_DECORATOR = (
    "`@{mesh}` runs the function under the legacy `with {mesh}:` (deprecated; invisible to "
    "`jax.sharding.get_abstract_mesh()` and today's flax), and `jax.set_mesh` is no "
    "decorator; drop `@{mesh}` and run the function's body inside "
    "`with jax.set_mesh({mesh}):`")
JSE207 = ("GDA-era orbax code: without `jax_sharding_ext.orbax_support` imported, orbax "
          "restores `jax.Array`s where it restored GDAs; add `import {module}`")
JSE208 = ("`{shown}`: `.{attr}` is a `GlobalDeviceArray`'s; here the value is a `jax.Array` "
          "(the output of `jax.jit` / `pjit` is a `GlobalDeviceArray` only with the output flag "
          "on, which nothing in this code turns on; `jax.pmap` and `jax.device_put` give "
          "`jax.Array`s), which has no `.{attr}`: {fix}")
JSE209 = ("`{shown}(...)` runs after a JAX computation (`{first}(...)` runs first), which "
          "starts JAX's backend; today's JAX then refuses to initialize (`RuntimeError`): "
          "call `{shown}(...)` before any JAX computation, right after the imports")
JSE305 = ("`{shown}` is stock `jax.experimental.pjit.pjit`, deprecated and no longer taking "
          "`in_axis_resources` / `out_axis_resources` / `FROM_GDA`; use this package's "
          "legacy `{new}`")
JSE306 = "`{shown}`: `{old}` was removed from JAX; use `{new}`"
JSE307_MISSING = ("`{shown}` was removed from JAX, and this package's `{module}` has no "
                  "`{name}`")
JSE308_CALL = ("`{shown}`: `jax.experimental.maps.mesh` was removed from JAX; use `{new}`")
JSE308_READ = ("`{shown}` reads the mesh of a legacy `with mesh:` only, and is empty under "
               "`with jax.set_mesh(mesh):` (what --write makes of `with mesh:`); use `{new}`, "
               "which reads both")
JSE314 = ("`{shown}`: `.{attr}` was an attribute of the removed `DeviceArray` / "
          "`ShardedDeviceArray`; a `jax.Array` has none (`AttributeError`): {new}")
JSE309 = ("module `jax.config` was removed from JAX; `from jax import config` is the same "
          "object (or use `jax.config`)")
JSE310 = ("`{shown}(..., axis_resources=...)`: the keyword is `shardings` in today's "
          "`jax.lax.with_sharding_constraint`")
JSE311 = "`{shown}`: the installed JAX ({version}) has no `{missing}`"
JSE311_NO_HOME = {
    "private": ("; it was JAX's private API and no public name of today's JAX has its "
                "meaning: use the public API (https://docs.jax.dev/en/latest/jax.html) or "
                "write what it did"),
    "public": ("; JAX removed it and no name of today's JAX has its meaning: JAX's changelog "
               "(https://docs.jax.dev/en/latest/changelog.html) says what to use instead"),
}
JSE312 = ("`{shown}`: `.{attr}` was removed from JAX arrays; use `{new}`")
JSE313 = ("`{shown}`: `jax.Array` has no `device()` method any more; use `{new}` (the "
          "device of a single-device array)")

# One line per code, for `--codes` and the README.
CODES = {
    "JSE101": "a name of `jax.experimental.global_device_array`: import it from this package",
    "JSE102": "the module `jax.experimental.global_device_array`: import this package's",
    "JSE103": "legacy `pjit` / `FROM_GDA`: import them from this package",
    "JSE104": "`Mesh` / `PartitionSpec` from a removed location: import them from this package",
    "JSE105": "`multihost_utils` (or one of its GDA-taking functions): import this package's",
    "JSE106": "`gda_serialization.serialization`: import this package's `serialization`",
    "JSE107": "`with_sharding_constraint` from `jax.experimental.pjit`: import it from `jax.lax`",
    "JSE108": "`from <GDA-era module> import *`: import the names it no longer provides",
    "JSE109": "a name JAX removed that this package provides "
              "(`parallel_functions_output_gda`, ...): import it from this package",
    "JSE110": "an import that --write's rewrites leave unused (`from jax.experimental import "
              "pjit` once `pjit.pjit` is this package's): removed",
    "JSE201": "reads `jax_array` / `jax_parallel_functions_output_gda`: import this package",
    "JSE202": "sets an option this package defines: import this package first",
    "JSE203": "stock `multihost_utils` reached through a module: this package's",
    "JSE204": "`with mesh:`: `with jax.set_mesh(mesh):`",
    "JSE205": "`x._device_buffers`: a GDA's only; `[s.data for s in x.addressable_shards]`",
    "JSE206": "a `Mesh` used as a decorator: call the function inside `with jax.set_mesh(mesh):`",
    "JSE207": "GDA-era orbax code: import `jax_sharding_ext.orbax_support`",
    "JSE208": "a `GlobalDeviceArray` attribute of a `jax.Array` (a jit output with the output "
              "flag never on): `.addressable_shards` / `.addressable_data(i)`, or the flag",
    "JSE209": "`jax.distributed.initialize()` after a JAX computation: call it first",
    "JSE301": "`jax.tree_map` and the other `jax.tree_*` aliases: `jax.tree_util.tree_*`",
    "JSE302": "`xmap` (and its config options): use `jax.shard_map`",
    "JSE303": "`DeviceArray` / `ShardedDeviceArray` / `KeyArray`: use `jax.Array`",
    "JSE304": "`ShapedArray` from `jax`: use `jax.ShapeDtypeStruct` or `jax.core.ShapedArray`",
    "JSE305": "stock `pjit` reached through its module: this package's legacy `pjit`",
    "JSE306": "a GDA-era name reached through a module: `Mesh`, `PartitionSpec`, `FROM_GDA`, "
              "`with_sharding_constraint`, the GDA and serialization modules' names",
    "JSE307": "a module or name removed from JAX, with its replacement",
    "JSE308": "`maps.mesh` / `thread_resources`: `jax.set_mesh` / "
              "`jax.sharding.get_abstract_mesh`",
    "JSE309": "`jax.config` imported as a module: `from jax import config`",
    "JSE310": "`with_sharding_constraint(axis_resources=...)`: the keyword is `shardings`",
    "JSE311": "a name the installed JAX does not have",
    "JSE312": "`.device_buffers` / `.device_buffer`: `addressable_shards` / `addressable_data(0)`",
    "JSE313": "`x.device()`: `x.device`",
    "JSE314": "`.sharding_spec` / `.indices` / `.to_py()` ... of the removed array classes: "
              "today's spelling",
}


def render(key: str, report: Report, shown: str) -> str:
  """The message of `report` for code shown as `shown`; a leading "`shown`: " is
  dropped when the code spells exactly what the message names."""
  message = report.message
  if message.startswith("`{shown}`: ") and shown == key:
    message = message[len("`{shown}`: "):]
  return message.format(shown=shown)


def report_for(symbol: str) -> tuple[str, Report] | None:
  """(the matched key, its report) for `symbol`, or None. Longest key wins; a
  name of JAX's private modules is judged as its public namesake was."""
  found = _report_for(symbol)
  if found is not None:
    return found
  module, _, name = symbol.rpartition(".")
  if any(p.startswith("_") for p in module.split(".")[1:]):
    public = [k for k in REPORTS if k.rpartition(".")[2] == name]
    if len(public) == 1:
      return public[0], REPORTS[public[0]]
  return None


def _report_for(symbol: str) -> tuple[str, Report] | None:
  parts = symbol.split(".")
  for n in range(len(parts), 0, -1):
    prefix = ".".join(parts[:n])
    if n > 1 and parts[0] in _jaxnames.ROOTS and parts[n - 1] in BY_NAME:
      gone = not _jaxnames.has(prefix)
      return prefix, dataclasses.replace(BY_NAME[parts[n - 1]], gone=gone)
    if prefix in REPORTS:
      return prefix, REPORTS[prefix]
    if n < len(parts) and prefix + ".*" in REPORTS:
      return prefix + ".*", REPORTS[prefix + ".*"]
  return None
