"""The child side of `_isolated.py`: run examples sent over a pipe.

argv: READ_FD WRITE_FD. Each request is `(target, example)`; the answer is
`("ok", result)` or `("error", traceback text)`.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import re
import signal
import sys
import traceback

N_DEVICES = int(os.environ.get("JSE_TEST_DEVICES", "8"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                os.environ.get("XLA_FLAGS", "")).split()
os.environ["XLA_FLAGS"] = " ".join(
    [f"--xla_force_host_platform_device_count={N_DEVICES}", *_flags])

import jax  # noqa: E402
from _isolated import _recv, _send  # noqa: E402

import jax_sharding_ext  # noqa: E402


def _reset() -> None:
  """Put back what an example may have changed globally."""
  jax_sharding_ext.install()
  jax.config.update("jax_parallel_functions_output_gda", False)
  jax.config.update("jax_transfer_guard", "allow")


def main() -> None:
  read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  jax.devices()  # start the backend before the first example
  _send(write_fd, "ready")
  while True:
    try:
      target, example = _recv(read_fd)
    except EOFError:
      return
    module, _, name = target.partition(":")
    try:
      result = getattr(importlib.import_module(module), name)(example)
      answer = ("ok", result)
    except BaseException:
      answer = ("error", traceback.format_exc())
    try:
      _reset()
    except BaseException:
      answer = ("error", "resetting the child after the example failed:\n"
                + traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    _send(write_fd, answer)


if __name__ == "__main__":
  main()
