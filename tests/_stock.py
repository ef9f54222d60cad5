"""Calling stock `array_serialization` where a call is refused part way.

Stock's synchronous calls end in `asyncio.run`, which cancels the writes and
reads still running when one fails (a transfer guard's refusal, say) and
closes its loop; tensorstore then completes a cancelled read from its own
thread into that closed loop, an error nobody can catch ("Event loop is
closed", reported as unraisable, at some later moment). The package's own
calls wait for every task instead. Tests that take stock's judgement of
such a call run it under `settled`, which lets stock's tasks finish the
same way; what stock refuses and why is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

_run = asyncio.run


def _run_settled(coro: Any, **kwargs: Any) -> Any:
  async def main():
    try:
      return await coro
    finally:
      await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}),
                           return_exceptions=True)
  return _run(main(), **kwargs)


@contextlib.contextmanager
def settled() -> Iterator[None]:
  """Within the block, `asyncio.run` waits for every task its coroutine
  started before it closes the loop (on this thread's calls only: JAX's
  serialization calls it from the caller's thread)."""
  asyncio.run = _run_settled
  try:
    yield
  finally:
    asyncio.run = _run
