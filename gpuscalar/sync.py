"""Synchronization accounting: the ONE place where a device value is copied to the host.

Why this module exists: a device→host read stalls the GPU pipeline, and users cannot see where it
happens. Every host read in gpuscalar goes through `to_host`, which (1) applies the active
`sync_guard` *before* any transfer, (2) records the read with the user's call site in every
active `count_syncs()` counter, and (3) only then copies the value. On the NumPy backend the copy
costs nothing but is counted the same way, which is what makes sync-count tests meaningful on a
machine without a GPU.

State (guard mode, active counters) lives in `contextvars`, so it is per thread and per asyncio
task, nests, and is restored on exit — never process-global. Modelled on CuPy's syncdetect.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "SyncMode",
    "SyncRecord",
    "SyncCounter",
    "SyncError",
    "SyncWarning",
    "count_syncs",
    "sync_guard",
    "total_syncs",
    "to_host",
    "note_device_op",
    "caller_site",
]

SyncMode = Literal["allow", "warn", "error"]
_MODES = ("allow", "warn", "error")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class SyncError(RuntimeError):
    """Raised by a sync under ``sync_guard("error")``, before anything is transferred."""


class SyncWarning(UserWarning):
    """Issued by a sync under ``sync_guard("warn")``; points at the user's call site."""


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """One device→host transfer: why, and the first caller frame outside gpuscalar."""

    reason: str
    filename: str
    lineno: int
    function: str

    @property
    def site(self) -> str:
        return f"{self.filename}:{self.lineno}"


@dataclass(slots=True)
class SyncCounter:
    """Counts syncs (with their records) and device operations issued while it is active."""

    records: list[SyncRecord] = field(default_factory=list)
    device_ops: int = 0

    @property
    def count(self) -> int:
        return len(self.records)


_guard_mode: ContextVar[str] = ContextVar("gpuscalar_sync_guard", default="allow")
_active_counters: ContextVar[tuple[SyncCounter, ...]] = ContextVar(
    "gpuscalar_sync_counters", default=()
)
#: Truthy while any counter is active in this context (a C call; the hot path inlines it).
counting = _active_counters.get
_total_lock = threading.Lock()
_total = 0


def caller_site() -> tuple[str, int, str]:
    """(filename, lineno, function) of the first frame outside the gpuscalar package."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0, "<unknown>")
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


@contextlib.contextmanager
def count_syncs() -> Iterator[SyncCounter]:
    """Count the syncs and device ops made inside the block. Nests: outer counters see all."""
    counter = SyncCounter()
    token = _active_counters.set(_active_counters.get() + (counter,))
    try:
        yield counter
    finally:
        _active_counters.reset(token)


@contextlib.contextmanager
def sync_guard(mode: SyncMode) -> Iterator[None]:
    """Within the block, syncs are allowed, warned about, or raise `SyncError`. Nests."""
    if mode not in _MODES:
        raise ValueError(f"sync_guard mode must be one of {_MODES}, got {mode!r}")
    token = _guard_mode.set(mode)
    try:
        yield
    finally:
        _guard_mode.reset(token)


def total_syncs() -> int:
    """Syncs made through gpuscalar by this process so far, all threads together."""
    return _total


def note_device_op() -> None:
    """Count one device operation in every active counter (called by `Backend.call`)."""
    for counter in _active_counters.get():
        counter.device_ops += 1


def to_host(backend: Backend, array: Any, reason: str) -> Any:
    """Copy the 0-d ``array`` to the host as a Python scalar: the one counted sync.

    The guard is checked before the transfer, so under ``sync_guard("error")`` nothing moves.
    """
    global _total
    filename, lineno, function = caller_site()
    mode = _guard_mode.get()
    if mode != "allow":
        message = (
            f"device->host sync ({reason}) at {filename}:{lineno} in {function}() "
            f"under sync_guard({mode!r})"
        )
        if mode == "error":
            raise SyncError(message)
        warnings.warn_explicit(message, SyncWarning, filename, lineno)
    record = SyncRecord(reason, filename, lineno, function)
    for counter in _active_counters.get():
        counter.records.append(record)
    with _total_lock:
        _total += 1
    return backend.read_scalar(array)
