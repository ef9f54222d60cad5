"""`transfer_ledger()`: see what this package's arrays moved, and how much.

A ledger is a context manager. While it is open, every transfer a
`GlobalDeviceArray` makes on the same thread (classified in `guard.py`)
appends one `TransferRecord` per user-level operation: one for
`np.asarray(gda)`, one per array leaf of a `jax.device_put` /
`jax.device_get` pytree, one per direction for a `from_callback`.

Mechanism:

* Ledgers are per thread, like `jax.transfer_guard`: each thread has its own
  stack of open ledgers, and a record goes to every ledger on the stack of the
  thread that made the transfer (so an inner ledger's records are seen by the
  outer ledgers too). A ledger opened on one thread never sees another
  thread's transfers.
* With no ledger open anywhere, a transfer pays one truth test of the module
  global `OPEN` per transfer and builds nothing.
* A transfer the guard blocked, or that failed, records nothing.
* A record keeps where the user's call is (file, line) as found on the
  stack, and turns it into text (`train.py:42`, `Cell In[3], line 5`) when
  `site` is first read: recording never builds text, so an open ledger adds a
  few microseconds per transfer, whatever the number of shards.

What a record's `nbytes` counts is the bytes written into destination
buffers: every replica of a replicated placement, every destination shard of
a reshard, the global value (once) for a fetch to the host.
"""

from __future__ import annotations

import dataclasses
import html
import threading
from typing import Any

import numpy as np

from jax_sharding_ext._jax import frames as jax_frames
from jax_sharding_ext._jax import transfer as jax_transfer
from jax_sharding_ext._jax.frames import CallSite
from jax_sharding_ext._public import public

_DIRECTIONS = jax_transfer.TRANSFER_DIRECTIONS

OPEN: list[TransferLedger] = []
"""Every ledger open on any thread (list appends and removals are atomic);
empty means nothing needs recording."""

_local = threading.local()


def __getattr__(name: str) -> Any:
  if name == "open_count":  # the number of ledgers open on any thread
    return len(OPEN)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


site_text = jax_frames.site_text


class _SiteField:
  """`TransferRecord.site`: a `str` as given, or a `CallSite` that becomes its
  text when first read (then kept). A data descriptor, so the frozen
  dataclass's `__init__`, `__eq__`, `__hash__`, `__repr__` and
  `dataclasses.asdict` / `replace` all see the text."""

  def __get__(self, record, owner=None):
    if record is None:
      raise AttributeError("site")  # no class-level default: the field is required
    stored = record.__dict__["site"]
    if type(stored) is str:
      return stored
    text = record.__dict__["site"] = site_text(stored)
    return text

  def __set__(self, record, value) -> None:
    record.__dict__["site"] = value


@public("jax_sharding_ext")
@dataclasses.dataclass(frozen=True)
class TransferRecord:
  """One transfer of a `GlobalDeviceArray`.

  Attributes:
    direction: "host_to_device", "device_to_device" or "device_to_host".
    explicit: True for `from_callback` and friends, `jax.device_put`,
      `jax.device_get`; False for `np.asarray(gda)` and for a reshard made
      while passing the array to a computation.
    nbytes: bytes written into destination buffers, all shards together (each
      replica counts).
    shape: the global shape of the array.
    dtype: its dtype.
    src: the source devices, in sharding order; `()` for the host.
    dst: the destination devices, in sharding order; `()` for the host.
    site: where the user's call that made the transfer is (the first frame
      outside `jax_sharding_ext`, `jax` and `jaxlib`): `"path:line"`, the
      path relative to the working directory when inside it, or in a
      notebook `"Cell In[n], line k"`. The text is built when first read
      (so a path is relative to the working directory at that time).

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> with jse.transfer_ledger() as ledger:
    ...   gda = jse.GlobalDeviceArray.from_callback(
    ...       (8,), mesh, P('x'), lambda index: np.arange(8, dtype=np.float32)[index])
    >>> record, = ledger.records
    >>> record.direction, record.explicit, record.nbytes, record.shape
    ('host_to_device', True, 32, (8,))
    >>> record.src, len(record.dst)   # from the host to 8 devices
    ((), 8)
  """

  direction: str
  explicit: bool
  nbytes: int
  shape: tuple[int, ...]
  dtype: np.dtype
  src: tuple[Any, ...]
  dst: tuple[Any, ...]
  site: str = _SiteField()  # type: ignore[assignment]


class _Totals(dict):
  """`{direction: (count, nbytes)}`; a direction with no transfer reads (0, 0)."""

  def __missing__(self, key):
    if key in _DIRECTIONS:
      return (0, 0)
    raise KeyError(key)


@public("jax_sharding_ext")
class TransferLedger:
  """The records of the transfers made while this ledger was open.

  Create it with `jax_sharding_ext.transfer_ledger()` and open it with
  `with`; it stays readable after the block (`records`). A ledger opens once.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> gda = jse.GlobalDeviceArray.from_callback((8,), mesh, P('x'),
    ...                                           lambda index: np.zeros(8)[index])
    >>> with jse.transfer_ledger() as ledger:
    ...   value = np.asarray(gda)
    >>> ledger
    TransferLedger(1 records; device_to_host: 1 (32 bytes))
    >>> [(r.direction, r.explicit) for r in ledger.records]
    [('device_to_host', False)]
  """

  __slots__ = ("_records", "_pending", "_stack", "__weakref__")

  def __init__(self):
    self._records: list[TransferRecord] = []
    self._pending: list[list] = []  # transfers not yet read as records (`add`)
    self._stack: list[TransferLedger] | None = None

  @property
  def records(self) -> list[TransferRecord]:
    """Every `TransferRecord` made while the ledger was open, in the order made.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> with jse.transfer_ledger() as outer:
      ...   with jse.transfer_ledger() as inner:
      ...     gda = jse.GlobalDeviceArray.from_callback(
      ...         (8,), mesh, P('x'), lambda index: np.zeros(8, np.float32)[index])
      >>> [r.direction for r in inner.records]
      ['host_to_device']
      >>> outer.records[0] is inner.records[0]   # the outer ledger sees the same record
      True
    """
    pending = self._pending
    if pending:
      self._pending = []
      self._records.extend(map(_record, pending))
    return self._records

  def __enter__(self) -> TransferLedger:
    if self._stack is not None:
      raise RuntimeError("This transfer ledger is already open; create a new one with "
                         "`jax_sharding_ext.transfer_ledger()`.")
    stack = _thread_stack()
    stack.append(self)
    self._stack = stack
    OPEN.append(self)
    return self

  def __getstate__(self) -> dict:
    # A pickled ledger is a closed one with the same records (the stack of
    # open ledgers belongs to the thread that opened it).
    return {"_records": self.records, "_pending": [], "_stack": None}

  def __setstate__(self, state: dict) -> None:
    # (a ledger pickled by an earlier release stored `records`)
    self._records = state.get("_records", state.get("records", []))
    self._pending, self._stack = [], None

  def __exit__(self, *exc) -> None:
    stack, self._stack = self._stack, None
    if stack is None:
      return
    if stack[-1] is self:
      stack.pop()
    else:  # tolerate out-of-order exits
      for i in range(len(stack) - 1, -1, -1):
        if stack[i] is self:
          del stack[i]
          break
    OPEN.remove(self)

  def totals(self) -> dict[str, tuple[int, int]]:
    """Return `{direction: (count, nbytes)}` over `records`.

    Only directions that occurred are keys (in the order host_to_device,
    device_to_device, device_to_host); looking up one that did not occur gives
    `(0, 0)`.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> with jse.transfer_ledger() as ledger:
      ...   gda = jse.GlobalDeviceArray.from_callback(
      ...       (8,), mesh, P(), lambda index: np.zeros(8, np.float32)[index])
      ...   value = np.asarray(gda)
      >>> ledger.totals()   # a replicated placement writes every replica
      {'host_to_device': (1, 256), 'device_to_host': (1, 32)}
      >>> ledger.totals()['device_to_device']
      (0, 0)
    """
    out = _Totals()
    for d in _DIRECTIONS:
      n = b = 0
      for r in self.records:
        if r.direction == d:
          n += 1
          b += r.nbytes
      if n:
        out[d] = (n, b)
    return out

  def summary(self) -> str:
    """Return a printable table: count and bytes per direction and kind.

    Example:
      >>> mesh = Mesh(np.array(jax.devices()), ('x',))
      >>> with jse.transfer_ledger() as ledger:
      ...   gda = jse.GlobalDeviceArray.from_callback(
      ...       (8,), mesh, P('x'), lambda index: np.zeros(8, np.float32)[index])
      ...   value = np.asarray(gda)
      >>> print(ledger.summary())
      direction       kind      count  bytes
      --------------------------------------
      host_to_device  explicit      1   32 B
      device_to_host  implicit      1   32 B
      --------------------------------------
      total                         2   64 B
    """
    rows = []
    for d in _DIRECTIONS:
      for explicit in (True, False):
        recs = [r for r in self.records if r.direction == d and r.explicit == explicit]
        if recs:
          rows.append((d, "explicit" if explicit else "implicit", str(len(recs)),
                       _format_bytes(sum(r.nbytes for r in recs))))
    rows.append(("total", "", str(len(self.records)),
                 _format_bytes(sum(r.nbytes for r in self.records))))
    header = ("direction", "kind", "count", "bytes")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]

    def fmt(row):
      return (f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  "
              f"{row[2]:>{widths[2]}}  {row[3]:>{widths[3]}}").rstrip()

    rule = "-" * len(fmt(tuple("-" * w for w in widths)))
    return "\n".join([fmt(header), rule, *map(fmt, rows[:-1]), rule, fmt(rows[-1])])

  def _repr_html_(self) -> str:
    """Notebook view: one row per (direction, kind, site), then the totals."""
    groups: dict[tuple, list[int]] = {}
    for r in self.records:
      g = groups.setdefault((r.direction, r.explicit, r.site), [0, 0])
      g[0] += 1
      g[1] += r.nbytes
    order = {d: i for i, d in enumerate(_DIRECTIONS)}
    rows = "".join(
        f"<tr><td>{d.replace('_', ' ')}</td><td>{'explicit' if e else 'implicit'}</td>"
        f"<td style='text-align:right'>{n}</td>"
        f"<td style='text-align:right'>{html.escape(_format_bytes(b))}</td>"
        f"<td><code>{html.escape(site)}</code></td></tr>"
        for (d, e, site), (n, b) in sorted(groups.items(),
                                           key=lambda kv: (order[kv[0][0]], not kv[0][1])))
    total = (f"<tr><th colspan='2'>total</th><th style='text-align:right'>"
             f"{len(self.records)}</th><th style='text-align:right'>"
             f"{html.escape(_format_bytes(sum(r.nbytes for r in self.records)))}</th><th></th>"
             "</tr>")
    return ("<div class='jse-ledger'><table><thead><tr><th>direction</th><th>kind</th>"
            "<th>count</th><th>bytes</th><th>site</th></tr></thead><tbody>"
            f"{rows}{total}</tbody></table><p style='font-size:smaller'>Bytes are those "
            "written into destination buffers: each replica of a replicated placement "
            "counts, a fetch to the host counts the global value once.</p></div>")

  def __repr__(self) -> str:
    totals = ", ".join(f"{d}: {n} ({b} bytes)" for d, (n, b) in self.totals().items())
    return f"TransferLedger({len(self.records)} records{'; ' + totals if totals else ''})"


def transfer_ledger() -> TransferLedger:
  """Record every transfer of this package's arrays on this thread.

  Use it as a context manager; the ledger stays readable after the block.
  Ledgers nest (an inner ledger's records also go to the outer ones) and are
  per thread: a transfer is recorded by the ledgers open on the thread that
  made it. With no ledger open, recording costs one check per transfer.

  Returns:
    A `TransferLedger` with `records` (a list of `TransferRecord`),
    `totals()` and `summary()`.

  Example:
    >>> mesh = Mesh(np.array(jax.devices()), ('x',))
    >>> data = np.arange(16, dtype=np.float32)
    >>> with transfer_ledger() as ledger:
    ...   gda = GlobalDeviceArray.from_callback((16,), mesh, P('x'),
    ...                                         lambda index: data[index])
    ...   host = np.asarray(gda)
    >>> ledger.totals()
    {'host_to_device': (1, 64), 'device_to_host': (1, 64)}
    >>> ledger.records[1].site   # the line of the user's call
    '<doctest ...>:4'
  """
  return TransferLedger()


def _thread_stack() -> list[TransferLedger]:
  try:
    return _local.stack
  except AttributeError:
    stack = _local.stack = []
    return stack


def open_ledgers() -> list[TransferLedger]:
  """The ledgers open on this thread (empty when none)."""
  return getattr(_local, "stack", None) or []


_new = object.__new__
_set = object.__setattr__
_FIELDS = ("direction", "explicit", "nbytes", "shape", "dtype", "src", "dst", "site")


def add(direction: str, explicit: bool, nbytes: int, shape: tuple[int, ...], dtype: np.dtype,
        src: Any, dst: Any, site: CallSite | None) -> None:
  """Record one transfer in every ledger open on this thread.

  `src` and `dst` are tuples of devices, or a `Sharding` whose addressable
  devices (for `shape`) they are. The record is built when a ledger's
  `records` is first read after it (`_record`): a transfer only appends one
  list, shared by the ledgers, so that nested ledgers read the same
  `TransferRecord` object.
  """
  stack = getattr(_local, "stack", None)
  if not stack:
    return
  entry = [direction, explicit, nbytes, shape, dtype, src, dst, site]
  for ledger in stack:
    ledger._pending.append(entry)


def _record(entry: list) -> TransferRecord:
  """The `TransferRecord` of an `add` entry (built once; the entry keeps it).

  Built as the frozen dataclass's `__init__` would (same `__dict__`), without
  its eight frozen attribute sets.
  """
  if len(entry) > len(_FIELDS):
    return entry[-1]
  for i in (5, 6):  # src, dst
    if type(entry[i]) is not tuple:
      entry[i] = jax_transfer.addressable_devices(entry[i], entry[3])
  record = _new(TransferRecord)
  _set(record, "__dict__", dict(zip(_FIELDS, entry, strict=True)))
  entry.append(record)
  return record


def _format_bytes(n: int) -> str:
  if n < 1024:
    return f"{n} B"
  value = float(n)
  for unit in ("KiB", "MiB", "GiB", "TiB"):
    value /= 1024
    if value < 1024 or unit == "TiB":
      return f"{value:.1f} {unit} ({n})"
  raise AssertionError("unreachable")
