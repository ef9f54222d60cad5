"""How a save runs: check the targets, mark them uncommitted, write every
array with stock `array_serialization`, and commit."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from jax.experimental.array_serialization import serialization as _stock

from jax_sharding_ext._checkpoint import checks, markers


async def prepare(fn: str, specs: Sequence[dict], choice: str) -> list:
  """Check the targets (refusing leaves them intact), then mark them
  uncommitted; return the opened marker stores."""
  stores, _ = await asyncio.gather(markers.marker_stores(specs),
                                   checks.check_targets(fn, specs, choice))
  await markers.mark(stores, True)
  return stores


async def save(fn: str, arrs: Sequence, specs: Sequence[dict], choice: str, *,
               commit: bool) -> None:
  """`prepare`, write every array (stock's `run_serialization`, as a
  coroutine), then, with `commit`, mark the targets committed."""
  stores = await prepare(fn, specs, choice)
  await asyncio.gather(*(_stock.async_serialize(a, s) for a, s in zip(arrs, specs, strict=True)))
  if commit:
    await markers.mark(stores, False)
