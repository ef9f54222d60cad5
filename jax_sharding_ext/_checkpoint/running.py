"""Running a checkpoint coroutine from any thread, also where this thread
already runs an event loop (a Jupyter notebook): `call` and `run`.

Work moved to a helper thread runs under the caller's thread-local JAX
settings (`jax_config.thread_settings`): its transfer guards, `enable_x64`,
dtype promotion, default device, meshes and the output flag, as if the
caller had run it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from jax_sharding_ext._jax import config as jax_config


def _loop_is_running() -> bool:
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return False
  return True


def call(fn: Callable[[], Any]) -> Any:
  """`fn()`, on a helper thread if this thread runs an event loop (where
  `asyncio.run`, used by stock and by us, refuses to start), under this
  thread's settings. `fn` never runs inside an `except` block, so its errors
  carry no chained exception of ours."""
  if not _loop_is_running():
    return fn()
  result: dict[str, Any] = {}
  settings = jax_config.thread_settings()

  def target():
    try:
      with jax_config.applied(settings):
        result["value"] = fn()
    except BaseException as e:  # re-raised in the caller's thread
      result["error"] = e
  t = threading.Thread(target=target, name="jax_sharding_ext.serialization")
  t.start()
  t.join()
  if "error" in result:
    raise result["error"]
  return result["value"]


def run(coro_fn: Callable[[], Any]) -> Any:
  """`asyncio.run(coro_fn())`, also where this thread already runs a loop.

  An error of the coroutine is caught inside it and raised here, so its
  traceback holds the caller's frames and the coroutine's, not asyncio's.
  The loop closes only once every task started in it has finished: after a
  failed write, stock's other writes are still running (its `gather` raised
  the first error at once), and tensorstore would complete them into a closed
  loop, an error nobody can catch.
  """
  async def caught():
    try:
      return await coro_fn(), None
    except Exception as e:  # raised again below, outside asyncio
      others = asyncio.all_tasks() - {asyncio.current_task()}
      await asyncio.gather(*others, return_exceptions=True)
      return None, e
  value, error = call(lambda: asyncio.run(caught()))
  if error is not None:
    raise error
  return value
