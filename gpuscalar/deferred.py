"""Deferred reads: see a running loop without stalling it (`read`, `MetricLog`).

Why this module exists: once a loop is sync-free, the syncs left are the ones people add to
*watch* it (``print(f"{loss:.3f}")``, a progress bar's postfix, a metrics logger): each drains
the device's queue. Two answers, on every backend:

- `read` reads any number of values with ONE transfer (one counted sync), not one each; values
  the host already knows (`gpuscalar.known`, a scalar's cached read) cost nothing.
- `MetricLog` keeps a ring of rows on the device. ``record(**values)`` writes a row with one
  kernel (no sync, no host-to-device copy: Python numbers are kernel arguments), inside
  `gs.capture` steps and `gs.while_loop`/`gs.cond` bodies too, since a device counter picks the
  row. The rows reach the host late, by asynchronous copies on a GPU;
  ``ready()`` hands over the rows that have arrived, never waiting; ``flush()`` waits for the
  rest (one counted sync). A row overwritten before the host drained it is counted
  (``dropped``) and reported with a `DroppedRowsWarning`, never lost silently.

The ring's layout is the same on every backend: one int64 buffer holding the row counter (the
first 16 bytes) and ``capacity`` rows of 16-byte slots, the row's step number first, then one
slot per column (each column keeps its dtype). On NumPy and the strict device the ring lives in
host data: ``record`` is one counted device op (as its launch on a GPU), ``ready()`` reads the
rows at once with no sync (a GPU's ``ready()`` costs none either: it polls copies already made;
the strict device counts it as a GPU would), and ``flush()`` is one counted sync. Rows are
parsed here, from a snapshot of the whole buffer, for both.

The ring itself is the device's: its "metrics" executor (`Rings`, `Ring`: the CuPy wing's
`gpuscalar.devices.cupy.metrics`, the host wing's `gpuscalar.devices.host.metrics` for NumPy and
the strict device); this module holds the front (the checks, the layout, the rows, ``comm=``).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from . import ledger, sync
from .backend import Backend
from .devices import backend_of, default_backend
from .known import UNREAD, python_value, remember, unread_positions, value_of
from .lazy import expr, fusion
from .reads import known_result
from .scalar import GPUScalar

__all__ = ["read", "MetricLog", "DroppedRowsWarning", "RowLayout"]

_PYTHON_NUMBERS = (bool, int, float, complex)
#: dtype of each Python number type, as NumPy gives it (`np.asarray(2.5)`)
_NATURAL = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64),
            complex: np.dtype(np.complex128)}
_KINDS = "biufc"
_SLOT = fusion.PACK_SLOT


def _where(index: int | str) -> str:
    return f"argument {index}" if isinstance(index, int) else f"{index}="


def _check_place(place: tuple | None, backend: Backend, device: object, index: int | str,
                 value: Any, what: str) -> tuple:
    """The placement of the first device value; a later one elsewhere is an error naming
    both (a `TypeError` across backends, a `ValueError` across devices)."""
    if place is None:
        return backend, device, index, value
    first_backend, first_device, first_index, first = place
    if backend is not first_backend or device != first_device:
        kind = TypeError if backend is not first_backend else ValueError
        raise kind(
            f"{what}: {_where(index)} is {sync.describe(value)} on {backend.name} device "
            f"{device!r}, but {_where(first_index)} is {sync.describe(first)} on "
            f"{first_backend.name} device {first_device!r}; one call reads one device"
        )
    return place


# ---- gs.read ---------------------------------------------------------------------------------


def read(*values: Any) -> tuple[Any, ...]:
    """The Python numbers of ``values`` (GPUScalars, pending or not, 0-d device arrays, Python
    and NumPy numbers), with ONE transfer (one counted sync) however many need the device.

    Values the host knows already (a scalar read before, a value computed from known ones)
    cost nothing; when all are known, nothing is synced. The others are packed by one device
    op (pending scalars computed in it) and come back in one buffer; afterwards every scalar
    read is known, as after ``float(s)``. A 0-d array passed in is read, not remembered (it is
    yours: you may write it later). All device values must be on one backend and device.
    """
    results: list[Any] = list(values)
    entries: list[Any] = []  # a 0-d array or a pending node, each once
    waiting: list[list[tuple[int, GPUScalar | None]]] = []  # (position, its scalar) per entry
    seen: dict[int, int] = {}
    place: tuple | None = None
    for index, value in enumerate(values):
        kind = type(value)
        if kind in _PYTHON_NUMBERS:
            continue
        if isinstance(value, np.generic):
            results[index] = python_value(_number_dtype_checked(value, index))
            continue
        owner: GPUScalar | None = None
        if isinstance(value, GPUScalar):
            place = _check_place(place, value._backend, value._device, index, value, "gs.read")
            host = value._host
            if host is not UNREAD:
                results[index] = host
                continue
            owner, node = value, value._node
            item: Any = value._array if node is None else node
            host = value_of(item) if node is None else known_result(node)
            if host is not UNREAD:
                value._host = results[index] = host
                continue
        else:
            backend = backend_of(value)
            if backend is None or isinstance(value, (str, bytes)):
                raise TypeError(f"gs.read: argument {index} is {sync.describe(value)}; it reads "
                                "GPUScalars, 0-d device arrays and numbers")
            if value.ndim != 0:
                raise ValueError(f"gs.read: argument {index} is {sync.describe(value)}; it reads "
                                 "0-d arrays (reduce first, e.g. gs.sum(x))")
            _number_dtype_checked(value, index)
            place = _check_place(place, backend, backend.device_of(value), index, value,
                                 "gs.read")
            host = value_of(value)
            if host is not UNREAD:
                results[index] = host
                continue
            item = value
        entry = seen.get(id(item))
        if entry is None:
            entry = seen[id(item)] = len(entries)
            entries.append(item)
            waiting.append([])
        waiting[entry].append((index, owner))
    if entries:
        assert place is not None
        _read_entries(place[0], place[1], entries, waiting, results)
    return tuple(results)


def _number_dtype_checked(value: Any, index: int) -> Any:
    if value.dtype.kind not in _KINDS:
        raise TypeError(f"gs.read: argument {index} has dtype {value.dtype}; it reads bool, "
                        "integer, floating and complex values")
    return value


def _read_entries(backend: Backend, device: object, entries: list[Any],
                  waiting: list[list[tuple[int, GPUScalar | None]]], results: list[Any]) -> None:
    """One transfer for every entry (and the unknown leaves of the pending ones)."""
    packed_entries: list[tuple[Any, tuple[int, ...]]] = []
    dtypes: list[np.dtype] = []
    extra_leaves: list[Any] = []
    for item in entries:
        if type(item) is expr.Node:
            leaves = expr.leaves_of(item)
            extras = tuple(unread_positions(leaves))
            packed_entries.append((item, extras))
            dtypes.append(item.op.dtype)
            extra_leaves += [leaves[i] for i in extras]
        else:
            packed_entries.append((item, ()))
            dtypes.append(item.dtype)
    dtypes += [leaf.dtype for leaf in extra_leaves]
    sync.admit("read")  # the guard first: a refused read launches nothing
    host = sync.to_host(backend, fusion.pack_values(backend, device, packed_entries), None)
    unpacked = fusion.unpack(np.asarray(host).view(np.uint8), dtypes)
    for item, value, owners in zip(entries, unpacked, waiting, strict=False):
        for position, owner in owners:
            results[position] = value
            if owner is not None:
                owner._host = value
                if owner._array is item:  # gpuscalar's own array: never written, so known
                    remember(item, value)
    for leaf, value in zip(extra_leaves, unpacked[len(entries):], strict=True):
        remember(leaf, value)  # a pending scalar's leaf: a GPUScalar's array


# ---- gs.MetricLog ----------------------------------------------------------------------------


class DroppedRowsWarning(RuntimeWarning):
    """Rows of a `MetricLog` were overwritten on the device before the host drained them."""


#: The reserved key of a row: its step number (the device counter when it was recorded).
STEP = "step"


class RowLayout:
    """A log's columns (names and dtypes, fixed by its first record), its capacity and the
    byte layout of its ring; checks a record's values against them (`items`)."""

    __slots__ = ("names", "dtypes", "capacity", "row_bytes", "nbytes", "row_dtype")

    def __init__(self, names: tuple[str, ...], dtypes: tuple[np.dtype, ...],
                 capacity: int) -> None:
        self.names, self.dtypes, self.capacity = names, dtypes, capacity
        self.row_bytes = _SLOT * (1 + len(names))
        self.nbytes = _SLOT + capacity * self.row_bytes  # the counter's slot, then the rows
        self.row_dtype = np.dtype({
            "names": [STEP, *(f"c{k}" for k in range(len(names)))],
            "formats": [np.int64, *dtypes],
            "offsets": [0, *(_SLOT * (k + 1) for k in range(len(names)))],
            "itemsize": self.row_bytes})

    def mismatch(self, values: dict[str, Any]) -> ValueError:
        missing = [n for n in self.names if n not in values]
        extra = [n for n in values if n not in self.names]
        return ValueError(
            f"gs.MetricLog.record: the columns are {list(self.names)} (fixed by the first "
            f"record); got {list(values)}" + (f", missing {missing}" if missing else "")
            + (f", unknown {extra}" if extra else ""))

    def check_cast(self, column: int, dtype: np.dtype) -> None:
        """A value of ``dtype`` may be stored in ``column`` (NumPy's ``same_kind`` cast)."""
        wanted = self.dtypes[column]
        if not np.can_cast(dtype, wanted, "same_kind"):
            raise TypeError(
                f"gs.MetricLog.record: column {self.names[column]!r} holds {wanted} (fixed by "
                f"the first record); a value of dtype {dtype} cannot be stored in it "
                "(same_kind casting)")

    def items(self, values: dict[str, Any], backend: Backend, device: object
              ) -> list[tuple[str, Any, np.dtype]]:
        """Each column's value, checked, as ``(kind, payload, dtype)``: ``"value"`` (a number,
        passed as a kernel argument), ``"leaf"`` (a 0-d device array) or ``"node"`` (a pending
        scalar's expression, computed where the row is written)."""
        names = self.names
        if len(values) != len(names) or any(name not in values for name in names):
            raise self.mismatch(values)
        found = []
        for column, name in enumerate(names):
            kind, payload, dtype = classify(values[name], name, (backend, device))
            self.check_cast(column, dtype)
            found.append((kind, payload, dtype))
        return found

    def rows(self, snapshot: np.ndarray, start: int) -> tuple[list[dict[str, Any]], int, int]:
        """The rows of a snapshot of the ring from step ``start`` on: (rows, the first step
        they hold, the counter), the steps between ``start`` and that first one overwritten."""
        data = np.asarray(snapshot).view(np.uint8)
        count = int(data[:8].view(np.int64)[0])
        first = min(max(start, count - self.capacity), max(start, count))
        if first >= count:  # no row since ``start``: no table to view
            return [], first, count
        table = data[_SLOT:self.nbytes].view(self.row_dtype)
        rows = []
        names = self.names
        for step in range(first, count):
            record = table[step % self.capacity]
            stored = int(record[0])
            if stored != step:
                raise RuntimeError(f"gs.MetricLog: row {step} of the ring holds step {stored}; "
                                   "was the log recorded on several streams at once?")
            row: dict[str, Any] = {STEP: step}
            for column, name in enumerate(names):
                row[name] = python_value(record[column + 1])
            rows.append(row)
        return rows, first, count


def classify(value: Any, name: str, place: tuple) -> tuple[str, Any, np.dtype]:
    """What a recorded value is (see `RowLayout.items`), on ``place[:2]`` (backend, device;
    None: any) or a `TypeError`/`ValueError` saying why not."""
    kind = type(value)
    if kind in _PYTHON_NUMBERS:
        return "value", value, _NATURAL[kind]
    if isinstance(value, np.generic):
        dtype = value.dtype
        where = None
    elif isinstance(value, GPUScalar):
        dtype, where = value.dtype, (value._backend, value._device)
    else:
        backend = backend_of(value)
        if backend is None or isinstance(value, (str, bytes)):
            raise TypeError(f"gs.MetricLog.record: {name}= is {sync.describe(value)}; a row "
                            "holds GPUScalars, 0-d device arrays and numbers")
        if value.ndim != 0:
            raise ValueError(f"gs.MetricLog.record: {name}= is {sync.describe(value)}; a row "
                             "holds 0-d values (reduce first, e.g. gs.mean(x))")
        dtype, where = value.dtype, (backend, backend.device_of(value))
    if dtype.kind not in _KINDS:
        raise TypeError(f"gs.MetricLog.record: {name}= has dtype {dtype}; a row holds bool, "
                        "integer, floating and complex values")
    if where is None:
        return "value", value, dtype
    if place[0] is not None and (where[0] is not place[0] or where[1] != place[1]):
        error = TypeError if where[0] is not place[0] else ValueError
        raise error(f"gs.MetricLog.record: {name}= is {sync.describe(value)} on {where[0].name} "
                    f"device {where[1]!r}, but the log lives on {place[0].name} device "
                    f"{place[1]!r}")
    if isinstance(value, GPUScalar):
        node = value._node
        return ("leaf", value._array, dtype) if node is None else ("node", node, dtype)
    return "leaf", value, dtype


class Ring(Protocol):
    """A `MetricLog`'s ring on one device (the device's `Rings` makes it at the first record):
    ``nbytes`` of int64 words laid out by its `RowLayout`, the row counter first."""

    def record(self, values: dict[str, Any]) -> None:
        """Write one row (the values checked by `RowLayout.items`): one counted device op, no
        sync, no host-to-device copy; allowed in captured steps and loop bodies."""

    def poll(self) -> list[np.ndarray]:
        """Snapshots of the ring that have reached the host (never waits, no sync)."""

    def drain(self) -> list[np.ndarray]:
        """Every snapshot under way and a last one: one counted sync."""

    def compute(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(xp, state, *args)`` on the ring's int64 buffer, as an array of the ring's
        device: one counted device op (``xp``: NumPy on host data, else the device's)."""

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy of an array of the ring's device: host data read in place, or one
        counted sync (reason ``"flush"``)."""

    def close(self) -> None:
        """Wait for copies still under way and let the buffers go."""


class Rings(Protocol):
    """A device's ``"metrics"`` executor (`gpuscalar.backend.Backend.executor`)."""

    def default_device(self) -> object:
        """Where a log with no device value and no ``like=`` lives (the current device)."""

    def ring(self, device: object, layout: RowLayout) -> Ring:
        """A new ring of ``layout`` on ``device``, its counter zero (one counted device op)."""


class MetricLog:
    """A ring of ``capacity`` rows on the device: ``record(**values)`` every step with no sync,
    rows read late with ``ready()`` (never waits) and ``flush()`` (one sync).

    ``record(loss=s, lr=t)`` appends one row: GPUScalars (pending ones computed where the row is
    written), 0-d device arrays and Python numbers (kernel arguments, no upload; inside a
    captured step they are baked in, as any Python number there). The first record fixes the
    columns and their dtypes (a Python float is float64, a GPUScalar keeps its dtype) and places
    the log (on ``like``'s device, else the first device value's, else the default backend);
    later records give the same names. It works inside `gs.capture` steps and
    `gs.while_loop`/`gs.cond` bodies: a device counter picks the row, so each replay fills the
    next. ``ready()`` returns the rows (dicts with their ``step``) that have reached the host,
    in order, each once; ``flush()`` waits for the rest. Rows overwritten before the host
    drained them are counted in ``dropped`` and reported with a `DroppedRowsWarning`.

    ``comm`` (the user's own ``mpi4py`` or NCCL communicator, as
    `gpuscalar.distributed.all_reduce` takes; anything else is a TypeError naming it): every
    process keeps its own log, and ``flush()`` is a collective returning the rows reduced
    across the processes: each column by its op in ``ops`` (a mapping column name -> ``"mean"``,
    ``"sum"``, ``"max"``, ``"min"`` or ``"prod"``; ``"mean"`` for a column not named), with the
    result dtypes of `all_reduce` (a mean of integers is a float). ONE collective per flush
    for all columns, whatever their ops and dtypes: every process's ring is gathered (an
    ``all_reduce`` sum of int64 words where each process fills its own slot and the others add
    zeros: exact, bit for bit), then each process reduces the gathered rows in rank order
    itself, so every process returns the same rows, equal to one process's reduction of all
    processes' rows. The collective carries ``size * (16 + capacity * 16 * (1 + columns))``
    bytes, so size the log to the steps between flushes. Every process records the same
    columns (dtypes, capacity) and the same number of rows between flushes, and calls
    ``flush()`` at the same points (as any collective); different row counts are a
    RuntimeError on every process alike. With ``comm`` rows are reduced at flush only:
    ``ready()`` returns no rows and never communicates (it cannot: the processes poll at
    different times); for a live local view keep a second log without ``comm``. Accounting of
    a flush with ``comm``: one device op gathers, then `all_reduce`'s (MPI on host data: its
    one counted sync, the rows read in it; NCCL: no sync there, then one counted read).
    """

    def __init__(self, capacity: int = 1024, *, like: Any = None, comm: Any = None,
                 ops: Any = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"gs.MetricLog: capacity must be an int, got "
                            f"{type(capacity).__name__}")
        if not 1 <= capacity <= 1 << 24:
            raise ValueError(f"gs.MetricLog: capacity must be between 1 and {1 << 24}, got "
                             f"{capacity}")
        self.capacity = int(capacity)
        self._place: tuple | None = None
        if like is not None:
            if isinstance(like, GPUScalar):
                self._place = (like.backend, like.device)
            else:
                backend = backend_of(like)
                if backend is None:
                    raise TypeError(f"gs.MetricLog: like= must be an array or GPUScalar, got "
                                    f"{sync.describe(like)}")
                self._place = (backend, backend.device_of(like))
        self._comm, self._ops = _comm_and_ops(comm, ops)
        self._lock = threading.RLock()
        self._ring: Any = None
        self._layout: RowLayout | None = None
        self._next = 0  # the first step not delivered yet
        self._dropped = 0
        self._latest: dict[str, Any] | None = None

    # ---- recording: no sync, no upload ----

    def record(self, **values: Any) -> None:
        """Append one row on the device (one launch; no sync, no host-to-device copy)."""
        ring = self._ring
        if ring is None:
            ring = self._first_record(values)
        ring.record(values)

    def _first_record(self, values: dict[str, Any]) -> Any:
        with self._lock:
            if self._ring is not None:
                return self._ring
            if not values:
                raise TypeError("gs.MetricLog.record: give at least one value (loss=s, ...)")
            if STEP in values:
                raise ValueError(f"gs.MetricLog.record: {STEP!r} is the row's own step number; "
                                 "name the column otherwise")
            if ledger.in_graph_body():
                raise RuntimeError(
                    "gs.MetricLog: the first record() makes the ring on the device, which a "
                    "captured step or loop body cannot do; record once before (gs.capture's "
                    "warm-up does, with warmup >= 1)")
            place = self._place
            classified = {}
            for name, value in values.items():
                found = classify(value, name, place or (None, None))
                classified[name] = found
                if place is None and found[0] != "value":
                    if isinstance(value, GPUScalar):
                        place = (value.backend, value.device)
                    else:
                        backend = backend_of(value)
                        assert backend is not None
                        place = (backend, backend.device_of(value))
            if place is None:
                backend = default_backend()
                place = (backend, _rings(backend).default_device())
            for name, value in values.items():  # every value on that device
                classify(value, name, place)
            layout = RowLayout(tuple(values), tuple(found[2] for found in classified.values()),
                               self.capacity)
            self._ring = _rings(place[0]).ring(place[1], layout)
            self._layout, self._place = layout, place
            return self._ring

    # ---- reading: late, without waiting ----

    def ready(self) -> list[dict[str, Any]]:
        """The rows that have reached the host since the last call, in order, each once: polls
        the copies under way (never waits, no sync) and starts the next one."""
        self._on_host("ready")
        with self._lock:
            if self._ring is None or self._comm is not None:  # (with comm: at flush only)
                return []
            return self._deliver(self._ring.poll())

    def flush(self) -> list[dict[str, Any]]:
        """Every row not delivered yet: waits for the device (one counted sync). With
        ``comm``: a collective, the rows reduced across the processes (see the class)."""
        self._on_host("flush")
        with self._lock:
            if self._comm is not None:
                return self._flush_across()
            if self._ring is None:
                return []
            return self._deliver(self._ring.drain())

    def _flush_across(self) -> list[dict[str, Any]]:
        """`flush` with a communicator: ONE collective gathering every process's ring."""
        from . import distributed  # noqa: PLC0415 - only with a comm

        ring, layout = self._ring, self._layout
        if ring is None or isinstance(ring, _Closed) or layout is None:
            raise RuntimeError("gs.MetricLog.flush(): with comm= every process must have "
                               "recorded before flushing (and not closed its log): the flush "
                               "is a collective")
        ops = [self._ops.get(name, "mean") for name in layout.names]
        for name, op, dtype in zip(layout.names, ops, layout.dtypes, strict=True):
            if dtype.kind == "c" and op in ("max", "min"):
                raise TypeError(f"gs.MetricLog: ops[{name!r}] is {op!r} but the column holds "
                                f"{dtype} values, which are not ordered")
        unknown = sorted(set(self._ops) - set(layout.names))
        if unknown:
            raise ValueError(f"gs.MetricLog: ops= names {unknown}, which are not columns "
                             f"(the columns are {list(layout.names)})")
        rank, size = _rank_and_size(self._comm)
        backend, device = self._place[0], self._place[1]  # type: ignore[index]
        with backend.device_context(device):
            mine = ring.compute(_gather_slot, rank, size)  # one device op: this ring in its slot
            gathered = distributed.all_reduce(mine, "sum", comm=self._comm)
            host = ring.to_host(gathered)
        words = layout.nbytes // 8
        snapshots = [host[r * words:(r + 1) * words] for r in range(size)]
        parsed = [layout.rows(snapshot, self._next) for snapshot in snapshots]
        counts = [count for _, _, count in parsed]
        if len(set(counts)) != 1:
            raise RuntimeError(f"gs.MetricLog.flush(): the processes recorded different "
                               f"numbers of rows (their counters, by rank: {counts}); each "
                               "must record the same rows between flushes")
        self._deliver([snapshots[rank]])  # this process's cursor, drops and their warning
        rows = _reduce_rows(layout.names, layout.dtypes, ops, [found for found, _, _ in parsed])
        if rows:
            self._latest = rows[-1]
        return rows

    def _on_host(self, what: str) -> None:
        if ledger.in_graph_body() or ledger.in_loop_body():
            raise RuntimeError(
                f"gs.MetricLog.{what}() runs on the host, between steps: not inside a captured "
                "step or a gs.while_loop/gs.cond body (record() works there)")

    def _deliver(self, snapshots: list[np.ndarray]) -> list[dict[str, Any]]:
        layout = self._layout
        assert layout is not None
        rows: list[dict[str, Any]] = []
        lost: list[tuple[int, int]] = []
        for snapshot in snapshots:
            found, first, count = layout.rows(snapshot, self._next)
            if first > self._next:
                lost.append((self._next, first))
            rows += found
            self._next = max(self._next, count)
        if lost:
            dropped = sum(end - start for start, end in lost)
            self._dropped += dropped
            spans = ", ".join(f"{a}..{b - 1}" if b - a > 1 else f"{a}" for a, b in lost)
            warnings.warn(
                f"gs.MetricLog: {dropped} row(s) (step {spans}) were overwritten on the device "
                f"before the host drained them (capacity {layout.capacity}); call ready() "
                "more often or make the log larger", DroppedRowsWarning, stacklevel=3)
        if rows:
            self._latest = rows[-1]
        return rows

    # ---- what the host knows ----

    @property
    def dropped(self) -> int:
        """Rows overwritten on the device before the host drained them, so far."""
        return self._dropped

    @property
    def latest(self) -> dict[str, Any] | None:
        """The last row `ready` or `flush` returned (None before any): no device access."""
        return self._latest

    @property
    def columns(self) -> dict[str, np.dtype] | None:
        """Column names and dtypes (None before the first record)."""
        layout = self._layout
        return None if layout is None else dict(zip(layout.names, layout.dtypes, strict=True))

    @property
    def delivered(self) -> int:
        """How many steps the host has seen (delivered or dropped): the next row's step."""
        return self._next

    def close(self) -> None:
        """Wait for copies still under way and let the buffers go (also done when the log is
        collected). The log cannot record afterwards."""
        with self._lock:
            ring, self._ring = self._ring, _Closed()
            if ring is not None and not isinstance(ring, _Closed):
                ring.close()

    def __repr__(self) -> str:
        where = "unplaced" if self._place is None else (
            f"{self._place[0].name} device {self._place[1]!r}")
        columns = "no columns yet" if self._layout is None else ", ".join(self._layout.names)
        return (f"<gpuscalar MetricLog: {columns}; capacity {self.capacity}, {where}, "
                f"{self._next} step(s) seen, {self._dropped} dropped>")


class _Closed:
    """What a closed log holds instead of its ring."""

    def _refuse(self, *args: Any) -> Any:
        raise RuntimeError("gs.MetricLog: this log was closed")

    record = poll = drain = compute = to_host = _refuse

    def close(self) -> None:
        pass


def _rings(backend: Backend) -> Rings:
    """``backend``'s "metrics" executor, or a TypeError naming the backend."""
    try:
        return backend.executor("metrics")
    except LookupError:
        raise TypeError(f"gs.MetricLog: no ring for the {backend.name} backend") from None


# ---- gs.MetricLog(comm=): one collective per flush ----------------------------------------


def _comm_and_ops(comm: Any, ops: Any) -> tuple[Any, dict[str, str]]:
    """``comm`` and ``ops`` of a `MetricLog`, checked (no device work, nothing sent)."""
    if comm is None:
        if ops is not None:
            raise ValueError("gs.MetricLog: ops= reduces columns across processes; it needs "
                             "comm=")
        return None, {}
    from .reduce import checked_comm  # noqa: PLC0415 - only with a comm

    checked_comm(comm, "MetricLog")
    from .distributed import OPS  # noqa: PLC0415

    found = dict(ops.items()) if hasattr(ops, "items") else {} if ops is None else None
    if found is None:
        raise TypeError(f"gs.MetricLog: ops= must be a mapping of column names to ops, got "
                        f"{sync.describe(ops)}")
    for name, op in found.items():
        if not isinstance(op, str) or op not in OPS:
            raise ValueError(f"gs.MetricLog: ops[{name!r}] is {sync.describe(op)}; expected "
                             f"one of {', '.join(repr(o) for o in OPS)}")
    return comm, found


def _rank_and_size(comm: Any) -> tuple[int, int]:
    """This process's rank and the number of processes of the user's communicator (mpi4py's
    ``Get_rank``/``Get_size``, NCCL's ``rank_id``/``size``, nccl4py's ``rank``/``nranks``; a
    ``cupyx.distributed`` backend's communicator)."""
    if hasattr(comm, "Get_rank"):
        return int(comm.Get_rank()), int(comm.Get_size())
    if isinstance(getattr(type(comm), "nranks", None), property):  # nccl4py
        return int(comm.rank), int(comm.nranks)
    inner = comm if hasattr(comm, "rank_id") else getattr(comm, "_comm", comm)
    return int(inner.rank_id()), int(inner.size())


def _gather_slot(xp: Any, state: Any, rank: int, size: int) -> Any:
    """``size`` rings' worth of int64 zeros, this process's ring (``state``) in slot ``rank``
    (``xp``: NumPy on host data, CuPy on the device)."""
    words = state.view(xp.int64)
    return xp.concatenate([xp.zeros(rank * words.size, xp.int64), words,
                           xp.zeros((size - 1 - rank) * words.size, xp.int64)])


def _reduce_rows(names: tuple[str, ...], dtypes: tuple[np.dtype, ...], ops: list[str],
                 per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of every process reduced column by column, in rank order (the same on every
    process): NumPy's reduction over the ranks, with `all_reduce`'s result dtypes."""
    from .distributed import result_dtype  # noqa: PLC0415

    reducers: dict[str, Callable[..., Any]] = {"sum": np.sum, "mean": np.mean, "max": np.max,
                                               "min": np.min, "prod": np.prod}
    rows: list[dict[str, Any]] = []
    for index, first in enumerate(per_rank[0]):
        row: dict[str, Any] = {STEP: first[STEP]}
        for name, dtype, op in zip(names, dtypes, ops, strict=True):
            values = np.asarray([found[index][name] for found in per_rank], dtype=dtype)
            keep = {"dtype": result_dtype(dtype, op)} if op in ("sum", "prod") else {}
            row[name] = python_value(np.asarray(reducers[op](values, **keep)))
        rows.append(row)
    return rows
