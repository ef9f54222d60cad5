"""One process of the kill-mid-save test in `test_multiprocess.py` (started by
`_multihost.run_workers`): 4 processes of 2 CPU devices each save one GDA of
the 8 devices with `GlobalAsyncCheckpointManager`, to a URL kvstore spec
(`{"driver": "zarr", "kvstore": "file://<root>/a/"}`); process K is killed
(SIGKILL) in the middle of the save: after the commit marker is written,
before any of its chunks is. argv after the boot arguments: ROOT K.

The other processes must never commit: their background commit waits at a
barrier that process K never reaches (or the runtime declares K dead first),
so `wait_until_finished` raises and the worker exits non-zero.
"""

from _worker_boot import boot, main_guard

W = boot()

import os  # noqa: E402
import signal  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils as mu  # noqa: E402
from jax.experimental.array_serialization import tensorstore_impl  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jax_sharding_ext import GlobalDeviceArray, serialization  # noqa: E402

SHAPE = (16, 4)


def main():
  root, victim = W.args[0], int(W.args[1])
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
  data = np.arange(64, dtype=np.float32).reshape(SHAPE) + 1
  gda = GlobalDeviceArray.from_callback(SHAPE, mesh, P("x"), lambda i: data[i])
  spec = {"driver": "zarr", "kvstore": f"file://{root}/a/"}
  mu.sync_global_devices("jse kill-mid-save: ready")
  if W.process_id == victim:
    async def killed(*args, **kwargs):  # the marker is in place; no chunk of ours is written
      W.log("killed in the middle of the save")
      os.kill(os.getpid(), signal.SIGKILL)
    tensorstore_impl.async_serialize = killed
  manager = serialization.GlobalAsyncCheckpointManager(timeout_secs=30)
  manager.serialize([gda], [spec], on_commit_callback=lambda: W.log("COMMITTED"))
  W.log("serialize returned; waiting for the commit")
  manager.wait_until_finished()
  raise AssertionError("the save committed although a process was killed in the middle")


if __name__ == "__main__":
  main_guard(main)
