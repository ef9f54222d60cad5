"""Every touch of `jax._src` in jax_sharding_ext, split by the JAX subsystem
it reaches into. Nothing outside this sub-package imports `jax._src` (a ruff
ban enforces it). Importing any module here first runs the version gate
below, so an unsupported JAX fails at import with a message naming the
version found and the versions supported.

Modules (each docstring names the JAX modules it touches and what breaks
first when JAX changes):

- `tables`: the extension tables keyed by Python type (avals, shard args,
  result handlers, canonicalisation, MLIR constants), reversible edits of
  them, host-to-device placement and `jax.device_put` with no target.
- `config`: config flags, the explicit device_put thread state, the mesh of
  `with mesh:`, the backends initialised so far.
- `transfer`: the transfer-guard state (levels, suspension) and stock's
  decision whether a shard argument moves.
- `effects`: effect-type sets, the debug primitives' lowerings, sharding
  annotations of lowering contexts.
- `tokens`: the runtime tokens that order effects across calls, and the
  tracked token set installed in their place.
- `frames`: the questions JAX answers only in its own Python frames (inside a
  host callback? tracing a pmap body? an AOT call? which jit is compiling?),
  and the user's call site and its text.
- `donation`: the donation vector of the running call and the mesh of
  `with mesh:`.
- `dispatch`: jit's C++ dispatch pytree registry, and the node data (read
  from reference counts) that decides which warm calls keep its fast path.
- `buffers`: a second array object over the same buffers (`clone`),
  jaxlib's per-shard cache built under one lock, buffer addresses.
- `readers`: JAX's lowering and effectful execution, made to take the shared
  side of the lock `install()` / `uninstall()` swap the tables under.
- `checkpoint`: private names of `jax.experimental.array_serialization`
  (imported only by `serialization` and `_checkpoint/`: tensorstore is optional).
- `tracebacks`: JAX's traceback filtering (API boundaries, excluded paths).

Supported: JAX 0.8.x to 0.10.x (Python 3.11 and newer), 0.11.x and 0.12.x
(Python 3.12 and newer); tested on 0.8.3, 0.9.2, 0.10.2, 0.11.2 and 0.12.x. A difference
between releases is handled next to the code it selects, by a version check
(`JAX_VERSION`) or feature detection, with a comment naming the release.
"""

from __future__ import annotations

import jax

MIN_JAX = (0, 8, 3)
MAX_JAX_EXCLUSIVE = (0, 13, 0)
NEWEST_SUPPORTED = "0.12.x"
"""The newest JAX release line this version of the package was tested with."""
JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__[:3])


class UnsupportedJaxVersionError(ImportError):
  """The installed JAX is outside the range this package was built against."""


def _dotted(version: tuple[int, ...]) -> str:
  return ".".join(map(str, version))


def check_version(version: tuple[int, ...] = JAX_VERSION) -> None:
  """Raise `UnsupportedJaxVersionError` unless `version` is supported."""
  version = tuple(version)
  if MIN_JAX <= version < MAX_JAX_EXCLUSIVE:
    return
  supported = (f"jax_sharding_ext supports jax >= {_dotted(MIN_JAX)} and "
               f"< {_dotted(MAX_JAX_EXCLUSIVE)} (the newest supported release is "
               f"{NEWEST_SUPPORTED}), but jax {_dotted(version)} is installed.")
  if version < MIN_JAX:
    raise UnsupportedJaxVersionError(
        f"{supported} Upgrade JAX, e.g. `pip install 'jax>={_dotted(MIN_JAX)},"
        f"<{_dotted(MAX_JAX_EXCLUSIVE[:2])}' 'jaxlib>={_dotted(MIN_JAX)},"
        f"<{_dotted(MAX_JAX_EXCLUSIVE[:2])}'`.")
  raise UnsupportedJaxVersionError(
      f"{supported} This JAX is newer than this version of jax_sharding_ext knows: "
      "upgrade jax_sharding_ext if a newer one supports it, or install a supported "
      f"JAX (`pip install 'jax<{_dotted(MAX_JAX_EXCLUSIVE[:2])}' "
      f"'jaxlib<{_dotted(MAX_JAX_EXCLUSIVE[:2])}'`). If no release supports jax "
      f"{_dotted(version)} yet, please report it in an issue of jax_sharding_ext "
      "naming that version: each JAX release is added by teaching "
      "`jax_sharding_ext/_jax/` what moved.")


check_version()
