"""The mutants `make mutate` puts into the code, one at a time.

Each is one plausible one-line bug in a risk area: the file, the exact
original snippet (found exactly once in the file, not a line number: the
code moves), its replacement, and what a user would see. `AREAS` lists, per
area, its fuzzers and its other tests (pytest paths or node ids).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mutant:
  id: str
  area: str
  file: str
  old: str
  new: str
  effect: str


@dataclasses.dataclass(frozen=True)
class Area:
  fuzzers: tuple[str, ...]
  tests: tuple[str, ...]


AREAS = {
    "sharing and donation": Area(
        ("tests/test_fuzz_sharing.py",),
        ("tests/test_donation.py", "tests/test_shared_buffers.py", "tests/test_dispatch.py")),
    "buffer watching": Area(
        ("tests/test_fuzz_sharing.py",),
        ("tests/test_shared_buffers.py", "tests/test_donation.py", "tests/test_dispatch.py")),
    "checkpoint integrity and locations": Area(
        ("tests/test_fuzz_checkpoints.py",),
        ("tests/test_serialization_integrity.py", "tests/test_serialization_locations.py",
         "tests/test_serialization_safety.py", "tests/test_serialization.py")),
    "thread settings": Area(
        ("tests/test_fuzz_thread_settings.py", "tests/test_fuzz_checkpoints.py"),
        ("tests/test_serialization.py",)),
    "shard math": Area(
        ("tests/test_fuzz_shard_math.py",),
        ("tests/test_shard_math.py", "tests/test_gda.py")),
    "install and uninstall": Area(
        ("tests/test_fuzz_install.py",),
        ("tests/test_install.py", "tests/test_output_flag.py")),
    "transfer guard": Area(
        ("tests/test_fuzz_transfers.py",),
        ("tests/test_transfer_guard.py",)),
    "transfer ledger": Area(
        ("tests/test_fuzz_transfers.py",),
        ("tests/test_transfer_guard.py", "tests/test_serialization_transfers.py")),
    "ordered effects": Area(
        ("tests/test_fuzz_effects.py",),
        ("tests/test_effects.py",)),
    "multi-host agreement": Area(
        ("tests/test_fuzz_multihost.py",),
        ("tests/test_multihost_utils.py", "tests/test_multiprocess.py")),
    "bad-input checks": Area(
        ("tests/test_fuzz_bad_input.py",),
        ("tests/test_gda.py", "tests/test_hardening.py", "tests/test_pjit.py",
         "tests/test_shard_math.py")),
    "porting assistant": Area(
        ("tests/test_fuzz_port.py",),
        ("tests/test_port.py", "tests/test_port_programs.py")),
}

_D = "jax_sharding_ext/"

MUTANTS = (
    # -- sharing and donation ------------------------------------------------------
    Mutant("donate-first-of-a-pair", "sharing and donation", _D + "_dispatch/donation.py",
           "    if j != i and (donated[i] or donated[j]):",
           "    if j != i and donated[i]:",
           "`f(donate(x), x)` with the same GDA passed first donated runs, and the process "
           "crashes on several devices."),
    Mutant("gda-never-shared", "sharing and donation", _D + "_dispatch/donation.py",
           "      arrays[i], may_share[i] = (x._arr, True), family.is_shared(x)",
           "      arrays[i], may_share[i] = (x._arr, True), False",
           "Donating a GDA next to its own `to_jax_array()` is not refused: the process "
           "crashes or reads freed memory."),
    Mutant("alias-group-needs-all-donated", "sharing and donation", _D + "_dispatch/donation.py",
           "    if len(group) < 2 or not any(donated[i] for i in group):",
           "    if len(group) < 2 or not all(donated[i] for i in group):",
           "A donated GDA next to an undonated array over its buffers is not refused."),
    Mutant("handed-out-not-marked", "sharing and donation", _D + "_array/family.py",
           "  sibling = jax_buffers.sibling(arr)\n  mark_shared(gda)\n",
           "  sibling = jax_buffers.sibling(arr)\n",
           "After `to_jax_array()` the GDA still counts as its buffers' only owner, so "
           "donating it next to that array runs."),
    Mutant("warm-call-trusts-one-donated-alias", "sharing and donation", _D + "_jax/dispatch.py",
           "    if n_like > 1 and n_donated:",
           "    if n_like > 1 and n_donated > 1:",
           "A warm call that donates a GDA next to an array over its buffers takes the fast "
           "path unchecked."),
    # -- buffer watching -------------------------------------------------------------
    Mutant("watch-skips-a-shard", "buffer watching", _D + "_jax/buffers.py",
           "  return () if arrays is None else tuple(arrays[1:])",
           "  return () if arrays is None else tuple(arrays[2:])",
           "A GDA whose second shard's buffer another array donated is passed to jit as live: "
           "a crash or stale data."),
    Mutant("watch-misses-the-last-shard", "buffer watching", _D + "_jax/dispatch.py",
           "    if not later or not any(map(_is_deleted, later)):",
           "    if not later or not any(map(_is_deleted, later[:-1])):",
           "A warm call of a GDA whose last shard was freed through another array runs on the "
           "freed buffer: a crash or stale data."),
    Mutant("shared-mark-keeps-stale-watch", "buffer watching", _D + "_jax/dispatch.py",
           "      view._shared = True\n      view._later = None\n",
           "      view._shared = True\n      view._later = ()\n",
           "A GDA marked shared never watches its shards: freeing one through another array "
           "goes unseen."),
    # -- checkpoint integrity and locations -------------------------------------------
    Mutant("crc32-chunks-unchecked", "checkpoint integrity and locations",
           _D + "_checkpoint/integrity.py",
           "    if got != want:\n      what = ",
           "    if got != want and check != CRC32:\n      what = ",
           "A zstd or uncompressed zarr3 chunk replaced by another step's restores as "
           "silently wrong data."),
    Mutant("zarr3-codecs-not-recorded", "checkpoint integrity and locations",
           _D + "_checkpoint/integrity.py",
           '"layout": grid.layout, **({} if grid.codecs is None else {"codecs": grid.codecs}),',
           '"layout": grid.layout,',
           "A zarr3 checkpoint whose transpose order or byte order was edited restores "
           "transposed or byte-swapped values."),
    Mutant("missing-chunk-file-passes", "checkpoint integrity and locations",
           _D + "_checkpoint/integrity.py",
           "      raise _damaged(at, loc, f\"its chunk '{key}' is missing\") from None",
           "      continue",
           "A deleted chunk of a local checkpoint restores as zeros."),
    Mutant("codec-config-dropped", "checkpoint integrity and locations",
           _D + "_checkpoint/integrity.py",
           '    out.append({"name": name} if on_bytes else {"name": name, "configuration": '
           'config})',
           '    out.append({"name": name})',
           "An edited zarr3 `bytes` endian or `transpose` order goes unnoticed: wrong values."),
    Mutant("marker-looked-up-as-a-directory", "checkpoint integrity and locations",
           _D + "_checkpoint/markers.py",
           "    uncommitted = os.path.lexists(os.path.join(loc.local_dir, COMMIT_MARKER))",
           "    uncommitted = os.path.isdir(os.path.join(loc.local_dir, COMMIT_MARKER))",
           "A checkpoint whose writer died before committing restores as complete."),
    # -- thread settings ---------------------------------------------------------------
    Mutant("helper-thread-without-settings", "thread settings", _D + "_checkpoint/running.py",
           "  settings = jax_config.thread_settings()",
           "  settings = jax_config.ThreadSettings((), ())",
           "In a notebook cell a checkpoint ignores the transfer guard and restores float64 "
           "as float32."),
    Mutant("mesh-contexts-not-carried", "thread settings", _D + "_jax/config.py",
           "  for value in (*_config.config_states.values(), *vars(_config).values(),\n"
           "                *vars(_mesh).values()):",
           "  for value in (*_config.config_states.values(),):",
           "Work on the package's helper thread runs without the caller's `jax.set_mesh`."),
    Mutant("guard-hook-not-called", "thread settings", _D + "_jax/config.py",
           "  if hook is not None:\n    hook(None if value is _UNSET else value)",
           "  if hook is None:\n    hook(None if value is _UNSET else value)",
           "The caller's transfer guard does not reach the helper thread's jaxlib state: a "
           "notebook's checkpoint is not refused."),
    # -- shard math ----------------------------------------------------------------------
    Mutant("replica-ids-per-first-dim-block", "shard math", _D + "_array/shard_math.py",
           "    key = index_key(index_t)",
           "    key = index_key(index_t[:1])",
           "Replica ids of a GDA split over a later dimension count wrongly: code that writes "
           "only replica 0 skips shards."),
    Mutant("minor-axis-as-major", "shard math", _D + "_array/shard_math.py",
           "      for n in a:\n        block = block * mesh.shape[n] + coord[n]",
           "      for n in reversed(a):\n        block = block * mesh.shape[n] + coord[n]",
           "A dimension split over two mesh axes puts each shard's data at another "
           "shard's index."),
    Mutant("tuple-entry-loses-minor-axes", "shard math", _D + "_array/shard_math.py",
           "  entries: list[Any] = [None if not a else a[0] if len(a) == 1 else a for a in axes]",
           "  entries: list[Any] = [None if not a else a[0] for a in axes]",
           "A GDA over `P(('x', 'y'))` gets the sharding `P('x')`: its shards are wrong."),
    # -- install and uninstall -----------------------------------------------------------
    Mutant("uninstall-keeps-executables", "install and uninstall", _D + "_install.py",
           "      for edit in reversed(EDITS):\n        edit.revert()\n"
           "    _drop_cached_executables()",
           "      for edit in reversed(EDITS):\n        edit.revert()",
           "After `uninstall()` a jit compiled with the flag on keeps returning GDAs, which "
           "JAX then refuses."),
    Mutant("compiled-ignores-uninstall", "install and uninstall", _D + "_dispatch/output.py",
           "  return GlobalDeviceArray._wrap(arr) if STATE.installed else arr",
           "  return GlobalDeviceArray._wrap(arr)",
           "An AOT `Compiled` made under the flag returns GDAs after `uninstall()`."),
    Mutant("compiled-handlers-chosen-at-first-call", "install and uninstall",
           _D + "_jax/tables.py",
           "        _ = executable.unsafe_call  # builds the result handlers now",
           "        pass  # the result handlers are built at the first call",
           "A `Compiled` made under the output flag and first called with it off returns "
           "`jax.Array`s for good."),
    # -- transfer guard -------------------------------------------------------------------
    Mutant("jit-reshard-not-judged", "transfer guard", _D + "_transfers/moves.py",
           "  act = action(level, explicit)\n  moves, recorded = [], []",
           "  act = action(level, explicit) if explicit else \"allow\"\n"
           "  moves, recorded = [], []",
           "A jit that reshards a GDA runs under `jax.transfer_guard(\"disallow\")`."),
    Mutant("log-explicit-allows-explicit", "transfer guard", _D + "_transfers/guard.py",
           '    "log_explicit": ("log", "log"),',
           '    "log_explicit": ("log", "allow"),',
           "Under \"log_explicit\" a GDA's `jax.device_put` is not logged."),
    Mutant("placement-judged-by-h2d-level", "transfer guard", _D + "_transfers/moves.py",
           "      level = jax_transfer.transfer_guard_level(direction)",
           "      level = jax_transfer.transfer_guard_level(H2D)",
           "`from_callback` with device data ignores the device_to_device guard."),
    Mutant("explicit-never-disallowed", "transfer guard", _D + "_transfers/guard.py",
           '      if m.action == "disallow":\n        raise',
           '      if m.action == "disallow" and not m.explicit:\n        raise',
           "Under \"disallow_explicit\" a GDA's `jax.device_put` and `device_get` run."),
    # -- transfer ledger ------------------------------------------------------------------
    Mutant("implicit-fetch-not-recorded", "transfer ledger", _D + "_transfers/moves.py",
           "    if ledger.OPEN:  # only the ledger needs to know",
           "    if ledger.OPEN and explicit:  # only the ledger needs to know",
           "`np.asarray(gda)` is missing from the transfer ledger."),
    Mutant("reshard-counts-one-shard", "transfer ledger", _D + "_transfers/moves.py",
           "      nbytes = math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize * len(dst)",
           "      nbytes = math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize",
           "The ledger reports a reshard's bytes as one shard's."),
    Mutant("outer-ledger-misses-records", "transfer ledger", _D + "_transfers/ledger.py",
           "  for ledger in stack:\n    ledger._pending.append(entry)",
           "  for ledger in stack[-1:]:\n    ledger._pending.append(entry)",
           "A transfer inside a nested ledger is missing from the outer one."),
    Mutant("placement-counts-one-replica", "transfer ledger", _D + "_transfers/moves.py",
           "sum(math.prod(np.shape(values[i])) for i in idx) * itemsize",
           "math.prod(np.shape(values[idx[0]])) * itemsize",
           "The ledger reports a replicated placement as one replica's bytes."),
    # -- ordered effects -------------------------------------------------------------------
    Mutant("barrier-waits-for-this-thread", "ordered effects", _D + "_effects/barrier.py",
           "    for token in jax_tokens.other_threads_pending_tokens():",
           "    for token in []:",
           "`effects_barrier()` returns before other threads' ordered prints have run."),
    Mutant("sharded-callback-column-major", "ordered effects", _D + "_effects/sharded_callback.py",
           "    for name in mesh.axis_names:\n      position = position",
           "    for name in reversed(mesh.axis_names):\n      position = position",
           "On a 2-D mesh `sharded_callback` gets another shard's index and device."),
    Mutant("sharded-callback-first-index", "ordered effects",
           _D + "_effects/sharded_callback.py",
           "    self.fn(data, index, device)",
           "    self.fn(data, self.shards[0][0], device)",
           "`sharded_callback` reports every shard at the first shard's index."),
    Mutant("auto-sharded-ordered-lowered-stock", "ordered effects", _D + "_effects/lowering.py",
           '      if not jax_effects.is_ordered_effect(effect) or kind in ("single", "other"):',
           '      if not jax_effects.is_ordered_effect(effect) or kind in ("single", "other", '
           '"auto"):',
           "An ordered `jax.debug.print` under a multi-device `jax.jit` raises stock's "
           "\"not supported for more than 1 device\" again."),
    # -- multi-host agreement ---------------------------------------------------------------
    Mutant("agreement-compares-lengths", "multi-host agreement", _D + "_multihost/agree.py",
           "  if len({bytes(row[:_FINGERPRINT_DESC]) for row in every}) == 1:",
           "  if len({bytes(row[:8]) for row in every}) == 1:",
           "Processes whose trees differ in a shape of the same length enter mismatched "
           "collectives and abort."),
    Mutant("gda-leaves-come-back-plain", "multi-host agreement", _D + "multihost_utils.py",
           "      treedef, [_as_gda(x) if g else x for x, g in zip(leaves, was_gda, strict=True)])",
           "      treedef, leaves)",
           "A GDA passed to `host_local_array_to_global_array` comes back as a `jax.Array`."),
    Mutant("difference-at-an-equal-element", "multi-host agreement", _D + "_multihost/agree.py",
           "  k = int(np.argmin(same.reshape(-1)))",
           "  k = int(np.argmax(same.reshape(-1)))",
           "`assert_equal` reports an element where the processes agree, not where they differ."),
    # -- bad-input checks ----------------------------------------------------------------------
    Mutant("bool-dimension-accepted", "bad-input checks", _D + "_array/shard_math.py",
           "      if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):",
           "      if not isinstance(d, (int, np.integer)):",
           "`from_callback((True, 2), ...)` builds a GDA of shape (1, 2) instead of raising."),
    Mutant("shard-index-off-by-one", "bad-input checks", _D + "_array/checks.py",
           "  if not -len(shards) <= k < len(shards):",
           "  if not -len(shards) <= k <= len(shards):",
           "`gda.local_data(len(local_shards))` raises a bare `IndexError` from a list."),
    Mutant("too-many-mesh-axes-accepted", "bad-input checks", _D + "_array/shard_math.py",
           "    if any(e is not None for e in axes[len(shape):]):",
           "    if any(e is not None for e in axes[len(shape) + 1:]):",
           "One mesh axis too many for the rank fails with an unclear `IndexError`."),
    Mutant("bool-argnums-accepted", "bad-input checks", _D + "_dispatch/donation.py",
           "  if isinstance(value, bool | np.bool_):",
           "  if isinstance(value, np.bool_):",
           "Legacy `pjit(donate_argnums=True)` donates argument 1."),
    # -- porting assistant -------------------------------------------------------------------
    Mutant("if-ignores-else-branch", "porting assistant", _D + "port/_flow.py",
           "    return _union(self.block(s.body, state), self.block(s.orelse, state))",
           "    return self.block(s.body, state)",
           "`--write` rewrites `with m:` to `jax.set_mesh(m)` where the else branch sets `m` to "
           "something else."),
    Mutant("loop-back-edge-ignored", "porting assistant", _D + "port/_flow.py",
           "    for _ in range(2):  # bindings only grow: the second pass sees the back edge",
           "    for _ in range(1):  # bindings only grow: the second pass sees the back edge",
           "A value assigned inside a loop is missed: `with m:` after the loop is rewritten "
           "though `m` may not be a mesh."),
    Mutant("except-sees-only-the-try-end", "porting assistant", _D + "port/_flow.py",
           "    anywhere = _union(state, out, *seen)",
           "    anywhere = out",
           "A handler's `with m:` is rewritten though `m` may still hold what it held before "
           "the `try`."),
    Mutant("realign-off-by-one", "porting assistant", _D + "port/_align.py",
           "    delta = len(e.new) - (e.end - e.start)",
           "    delta = len(e.new) - (e.end - e.start) + 1",
           "Continuation lines of a renamed call end up one column off their bracket."),
)
