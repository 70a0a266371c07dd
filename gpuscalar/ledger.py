"""The ledger: what gpuscalar counts and marks while work is issued, at the bottom of the package.

Why this module exists: the backends count every device operation they issue, the CUDA pieces
mark a captured step's body and count replays, and `gpuscalar.sync` records host reads: all of
them write into the same per-context counters. Keeping the counters and marks here, in a module
that imports nothing of gpuscalar's, lets every layer above write to them without an import
circle (the backends below `sync`, which reads through them).

State lives in `contextvars` (per thread and per asyncio task, restored on exit), except the
counters that see every thread (`listen_everywhere`, what `gpuscalar profile` and the pytest
plugin use: a thread started inside their block is seen too) and two process-wide totals (graph
replays, recordings under way), kept under locks.

How a counter that sees every thread stays cheap for everyone: the process-wide counters live in
one list, `_all_threads`, which is also the *default* value of the context variable of active
counters. In a context with no counter of its own, ``_active_counters.get()`` (one C call, what
`counting` is) returns that list: empty, so false, while nobody listens anywhere; non-empty as
soon as a process-wide counter is active, in every thread at once, with no per-thread set-up.
A context with counters of its own holds a tuple of those only; `counters_here` adds the
process-wide ones. So "is anybody counting here?" stays a single C call on every hot path.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SyncRecord",
    "SyncSite",
    "SyncCounter",
    "counting",
    "counters_here",
    "own_counters",
    "listen_in_this_context",
    "listen_everywhere",
    "note_device_op",
    "one_device_op",
    "inside_device_op",
    "graph_body",
    "in_graph_body",
    "loop_body",
    "in_loop_body",
    "note_graph_replay",
    "graph_replays",
    "note_recording",
    "recordings_under_way",
]


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """One device→host transfer: why, and the first caller frame outside gpuscalar."""

    reason: str
    filename: str
    lineno: int
    function: str

    @property
    def site(self) -> str:
        """``file:line`` of the user's code that caused the sync."""
        return f"{self.filename}:{self.lineno}"


@dataclass(frozen=True, slots=True)
class SyncSite:
    """All the syncs of one reason made at one line of user code (a row of a report)."""

    filename: str
    lineno: int
    function: str
    reason: str
    count: int

    @property
    def site(self) -> str:
        """``file:line`` of the user's code that caused the syncs."""
        return f"{self.filename}:{self.lineno}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``file``, ``line``, ``function``, ``reason``, ``count``."""
        return {
            "file": self.filename,
            "line": self.lineno,
            "function": self.function,
            "reason": self.reason,
            "count": self.count,
        }


@dataclass(slots=True)
class SyncCounter:
    """Counts syncs (with their records) and device operations issued while it is active.

    ``include_cupy`` says whether the syncs CuPy declares itself are recorded too (reason
    ``"cupy"``); see `count_syncs`.
    """

    records: list[SyncRecord] = field(default_factory=list)
    device_ops: int = 0
    include_cupy: bool = False

    @property
    def count(self) -> int:
        """Number of syncs recorded."""
        return len(self.records)

    def sites(self) -> list[SyncSite]:
        """Syncs grouped by (file, line, function, reason), most frequent first."""
        tally = Counter((r.filename, r.lineno, r.function, r.reason) for r in self.records)
        rows = [SyncSite(f, ln, fn, reason, n) for (f, ln, fn, reason), n in tally.items()]
        rows.sort(key=lambda s: (-s.count, s.filename, s.lineno, s.reason))
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: ``count``, ``device_ops``, ``sites`` and every record."""
        return {
            "count": self.count,
            "device_ops": self.device_ops,
            "sites": [s.to_dict() for s in self.sites()],
            "records": [
                {
                    "reason": r.reason,
                    "filename": r.filename,
                    "lineno": r.lineno,
                    "function": r.function,
                }
                for r in self.records
            ],
        }

    def report(self, limit: int | None = None) -> str:
        """A text table of the syncs by call site, most frequent first.

        Paths under the current directory are shown relative to it. ``limit`` keeps only the
        first ``limit`` rows (the rest are summarized in one line).
        """
        if limit is not None and limit < 0:
            raise ValueError(f"report(limit=...) must be >= 0 or None, got {limit}")
        sites = self.sites()
        noun = "sync" if self.count == 1 else "syncs"
        ops = "device op" if self.device_ops == 1 else "device ops"
        lines = [f"gpuscalar: {self.count} {noun}, {self.device_ops} {ops}"]
        if not sites:
            return lines[0]
        shown = sites if limit is None else sites[:limit]
        table = [("count", "site", "function", "reason")]
        table += [
            (str(s.count), _short_path(s.filename) + f":{s.lineno}", s.function, s.reason)
            for s in shown
        ]
        widths = [max(len(row[i]) for row in table) for i in range(4)]
        for row in table:
            cells = [row[0].rjust(widths[0])] + [
                c.ljust(w) for c, w in zip(row[1:], widths[1:], strict=True)
            ]
            lines.append("  " + "  ".join(cells).rstrip())
        hidden = sites[len(shown) :]
        if hidden:
            lines.append(f"  ... {len(hidden)} more sites, {sum(s.count for s in hidden)} syncs")
        return "\n".join(lines)


def _short_path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if relative.startswith(os.pardir) else relative


class _AllThreads(list[SyncCounter]):
    """The counters that see every thread: mutated in place under `_all_threads_lock`, read
    without it (``tuple(...)`` is one atomic copy). A list subclass whose truth test is still
    C's (see the module docstring); it compares equal to the tuple of its counters, the form a
    context's own value has (``_active_counters.get() == ()``: nobody counts here)."""

    __slots__ = ()
    __hash__ = None

    def __eq__(self, other: object) -> bool:
        if type(other) is tuple:
            return tuple(self) == other
        return list.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other


_all_threads = _AllThreads()
_all_threads_lock = threading.Lock()
#: The counters active in this context (a tuple, innermost last), or, where none is,
#: `_all_threads` itself: see the module docstring.
_active_counters: ContextVar[Sequence[SyncCounter]] = ContextVar(
    "gpuscalar_sync_counters", default=_all_threads
)
#: Truthy while any counter sees this context: one of its own, or one that sees every thread
#: (a C call; hot paths inline it).
counting = _active_counters.get


def own_counters() -> tuple[SyncCounter, ...]:
    """The counters of this context only (`count_syncs` blocks), innermost last."""
    counters = _active_counters.get()
    return () if counters is _all_threads else tuple(counters)


def counters_here() -> tuple[SyncCounter, ...]:
    """Every counter that sees this context: its own, then those that see every thread."""
    counters = _active_counters.get()
    if counters is _all_threads:
        return tuple(counters)
    if _all_threads:
        return (*counters, *_all_threads)
    return tuple(counters)


@contextlib.contextmanager
def listen_in_this_context(counter: SyncCounter) -> Iterator[SyncCounter]:
    """Make ``counter`` active in this context (thread / asyncio task) for the block."""
    token = _active_counters.set((*own_counters(), counter))
    try:
        yield counter
    finally:
        _active_counters.reset(token)


@contextlib.contextmanager
def listen_everywhere(counter: SyncCounter) -> Iterator[SyncCounter]:
    """Make ``counter`` see every thread of the process for the block (threads started inside
    it and threads already running), registered under a lock."""
    with _all_threads_lock:
        _all_threads.append(counter)
    try:
        yield counter
    finally:
        with _all_threads_lock:
            for i, active in enumerate(_all_threads):
                if active is counter:  # by identity: two empty counters compare equal
                    del _all_threads[i]
                    break
#: How many `one_device_op` blocks enclose the current code (their inner ops are not counted).
_op_depth: ContextVar[int] = ContextVar("gpuscalar_device_op_depth", default=0)


def note_device_op() -> None:
    """Count one device operation in every counter that sees this context (called by
    `Backend.call`), unless it runs inside another counted operation (`one_device_op`)."""
    counters = _active_counters.get()
    if not counters or _op_depth.get():
        return
    if counters is not _all_threads:
        for counter in counters:
            counter.device_ops += 1
    if _all_threads:
        with _all_threads_lock:  # (+= is a read and a write: other threads count too)
            for counter in _all_threads:
                counter.device_ops += 1


class one_device_op:  # noqa: N801 - used like a function: ``with one_device_op():``
    """Everything inside the block is ONE device operation: counted once on entry (when
    ``count``), and the operations issued inside are not counted again.

    What makes device-op counts match a GPU's launches: a NumPy function that calls other NumPy
    functions (the strict device), a fused expression evaluated with several ufuncs on the
    host, or a captured step replayed as one graph launch.
    """

    __slots__ = ("count", "_token")

    def __init__(self, count: bool = True) -> None:
        self.count = count

    def __enter__(self) -> None:
        if self.count:
            note_device_op()
        self._token = _op_depth.set(_op_depth.get() + 1)

    def __exit__(self, *exc: object) -> None:
        _op_depth.reset(self._token)


def inside_device_op() -> bool:
    """Whether the caller runs inside a counted device operation (`one_device_op`)."""
    return _op_depth.get() > 0


# ---- graph bodies: code that runs without the host ----------------------------------------------

_in_graph_body: ContextVar[bool] = ContextVar("gpuscalar_in_graph_body", default=False)
_replays_lock = threading.Lock()
_replays = 0


@contextlib.contextmanager
def graph_body() -> Iterator[None]:
    """Mark the block as the body of a captured step: being recorded into a CUDA graph (CuPy),
    or re-run as a replay (NumPy, the strict device). No host-to-device copy can happen there:
    CuPy refuses one while its stream captures, and a recorded copy would read host memory that
    is gone by the time the graph replays. Code that would upload must take a device-only path
    (values passed as kernel arguments, which the graph keeps), and the strict device refuses
    uploads here as CuPy does, so CPU tests see the GPU's rule."""
    token = _in_graph_body.set(True)
    try:
        yield
    finally:
        _in_graph_body.reset(token)


def in_graph_body() -> bool:
    """Whether the caller runs inside `graph_body` (a step being recorded or replayed)."""
    return _in_graph_body.get()


# ---- loop bodies: evaluations not cached on scalars ----------------------------------------------

_in_loop_body: ContextVar[bool] = ContextVar("gpuscalar_in_loop_body", default=False)


@contextlib.contextmanager
def loop_body() -> Iterator[None]:
    """Mark the block as a body recorded once and run many times: a `gs.while_loop`/`gs.cond`
    body (or predicate), or a `gs.capture` step. A pending GPUScalar evaluated there is a
    recipe evaluated where it is used, from its inputs' current values at each iteration (what
    recording gives on a GPU): the result is not cached on the scalar (`scalar._materialize`),
    which stays pending. `gs.capture` refuses to start there."""
    token = _in_loop_body.set(True)
    try:
        yield
    finally:
        _in_loop_body.reset(token)


def in_loop_body() -> bool:
    """Whether the caller runs inside `loop_body` (a device loop's or branch's body)."""
    return _in_loop_body.get()


def note_graph_replay() -> None:
    """Count one replay of a captured step (called by `CapturedStep.__call__`)."""
    global _replays
    with _replays_lock:
        _replays += 1


def graph_replays() -> int:
    """Replays of captured steps in this process so far. A replay on a GPU rewrites device
    buffers without running any Python, so a Python-side cache of what a device buffer holds
    (an optimizer's table of gradient addresses) is stale once this number has moved."""
    return _replays


# ---- graph recordings under way (gs.capture on CuPy) --------------------------------------------

_recordings_lock = threading.Lock()
_recordings = 0


def note_recording(change: int) -> int:
    """Count a CUDA graph recording starting (``+1``) or ending (``-1``) anywhere in the
    process; returns how many are under way now. While one is, resources a graph may read (a
    cuBLAS handle's workspace, a captured step's pool) must not be freed."""
    global _recordings
    with _recordings_lock:
        _recordings += change
        return _recordings


def recordings_under_way() -> int:
    """How many CUDA graph recordings are under way in this process."""
    return _recordings
