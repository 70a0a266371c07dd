"""Known values: the device arrays whose value the host already read, so no read repeats.

Why this module exists: a host-heavy function written for floats (a line search, a scalar
recurrence, a convergence test) reads a value once and then does free host arithmetic with it
(``gamma * c``, ``abs(d) < eps``, ``max(a, b)``). With GPUScalars each of those builds a new
expression, and reading it would read the device again: more syncs than the float path. So a
value read once is *known*: the 0-d array it came from is registered here with its host value,
and a pending expression whose leaves are all known is evaluated on the host, with no sync and
the float path's numbers (`gpuscalar.scalar._host_value`). A read that must go to the device
brings the expression's unknown leaves back in the same transfer, so they are known too, as the
float path would have read them first.

A value is only ever registered for an array that nothing writes: the arrays GPUScalars hold
are gpuscalar's own (``gs.GPUScalar(a)`` copies ``a``; results are new arrays), so a registered
value cannot go stale. The few buffers gpuscalar itself rewrites and hands out as GPUScalars (an
optimizer's step counter, a captured step's static outputs) are marked live (`mark_live`) and
never registered: each GPUScalar over one caches its own read only. An entry lives as long as
its array (dead ones are purged in batches of `_PURGE_AT`), so the registry is bounded by the
live scalars. Thread-safe: dicts and a list, each operation atomic under the GIL; a lookup only
trusts an entry whose reference still gives its array.

Imports nothing of gpuscalar's (a leaf module, like the ledger).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

__all__ = ["UNREAD", "remember", "value_of", "known_values", "unread_positions", "mark_live",
           "python_value", "forget_all", "size", "expect", "arrive", "INCOMING"]


class _Unread:
    """The value of a GPUScalar's host cache before any read (a sentinel, never a number)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unread>"


#: What `value_of` returns for an array whose value the host does not know.
UNREAD: Any = _Unread()

#: id(array) -> (a weak reference to the array, its host value)
_KNOWN: dict[int, tuple[weakref.ref, Any]] = {}
#: id(array) -> a weak reference to an array that is rewritten in place (never registered)
_LIVE: dict[int, weakref.ref] = {}
#: Weak references whose array died: their entries are purged now and then (`_purge`). The
#: callback is this list's ``append`` (a C call: a read pays nothing for it); a dead entry is
#: harmless meanwhile, since a lookup checks that the reference still gives its array.
_DEAD: list[weakref.ref] = []
_ON_DEATH = _DEAD.append
_PURGE_AT = 256


def _purge() -> None:
    """Drop the entries whose array died (called when enough references died)."""
    _DEAD.clear()
    for key, (reference, _) in _KNOWN.copy().items():  # (a copy: threads may add entries)
        if reference() is None:
            _KNOWN.pop(key, None)
    for key, reference in _LIVE.copy().items():
        if reference() is None:
            _LIVE.pop(key, None)
    for key, (reference, _) in INCOMING.copy().items():
        if reference() is None:
            INCOMING.pop(key, None)


def mark_live(array: Any) -> None:
    """``array`` is rewritten in place (a counter, a graph's static output): never register a
    value for it."""
    key = id(array)
    _KNOWN.pop(key, None)
    _LIVE[key] = weakref.ref(array, _ON_DEATH)


def remember(array: Any, value: Any) -> None:
    """Register the host ``value`` of the 0-d device ``array`` (which nothing will write)."""
    key = id(array)
    if _LIVE and key in _LIVE and _LIVE[key]() is array:
        return
    try:
        _KNOWN[key] = (weakref.ref(array, _ON_DEATH), value)
    except TypeError:  # an array type without weak references: not remembered (only a cost)
        return
    if len(_DEAD) > _PURGE_AT:
        _purge()


def value_of(array: Any) -> Any:
    """The host value registered for ``array``, or `UNREAD`."""
    entry = _KNOWN_GET(id(array))
    if entry is None or entry[0]() is not array:
        return UNREAD
    return entry[1]


_KNOWN_GET = _KNOWN.get  # (bound once: `_KNOWN` is only ever cleared, never replaced)
_GENERIC = np.generic


def known_values(leaves: list[Any]) -> list[Any] | None:
    """The host values of ``leaves`` (an expression's leaves and constants; the constants as
    they are), or None at the first leaf whose value is not registered. (`value_of` written
    out: this runs for every leaf of every read.)"""
    values: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, _GENERIC):
            values.append(leaf)
            continue
        entry = _KNOWN_GET(id(leaf))
        if entry is None or entry[0]() is not leaf:
            return None
        values.append(entry[1])
    return values


def unread_positions(leaves: list[Any]) -> list[int]:
    """The positions in ``leaves`` (an expression's leaves and constants) of the device leaves
    whose value is not registered, each array once: what a read must bring back. (`value_of`
    written out: this runs for every leaf of every pending read.)"""
    found: list[int] = []
    seen: set[int] | None = None  # the unregistered arrays met (made at the first one)
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, _GENERIC):  # a constant: in the expression itself
            continue
        key = id(leaf)
        entry = _KNOWN_GET(key)
        if entry is not None and entry[0]() is leaf:
            continue
        if seen is None:
            seen = {key}
        elif key in seen:
            continue
        else:
            seen.add(key)
        found.append(position)
    return found


#: id(array) -> (a weak reference to a host array something is still writing, the function
#: that waits for it): a non-blocking collective's receive buffer (gpuscalar.distributed). The
#: host executors' data accessor (``Backend.host_data``) calls `arrive` first, so the first use
#: of such an array, a read or an evaluation, waits for the data; empty, it costs one check.
INCOMING: dict[int, tuple[weakref.ref, Any]] = {}


def expect(array: Any, wait: Any) -> None:
    """``array`` (host data) is being written asynchronously; ``wait()`` waits for it."""
    INCOMING[id(array)] = (weakref.ref(array, _ON_DEATH), wait)


def arrive(array: Any) -> None:
    """Wait for ``array`` if it is still being written (see `INCOMING`). The entry is dropped
    only once the wait returned, so a second thread using the array meanwhile waits too (the
    wait function must allow that: `gpuscalar.devices.host.mpi`'s is locked)."""
    entry = INCOMING.get(id(array))
    if entry is not None and entry[0]() is array:
        entry[1]()
        INCOMING.pop(id(array), None)


#: dtype kind -> the Python type a value of that kind is read as (what ``item()`` gives)
_PYTHON_TYPES: dict[str, type] = {"b": bool, "i": int, "u": int, "f": float, "c": complex}


def python_value(value: Any) -> Any:
    """A NumPy scalar or 0-d array *already on the host* as the Python number ``item()`` gives
    (for values computed or unpacked on the host; device data is read by `gpuscalar.sync`)."""
    return _PYTHON_TYPES[value.dtype.kind](value)


def forget_all() -> None:
    """Drop every registered value (tests; values are never stale, so nothing else needs it)."""
    _KNOWN.clear()


def size() -> int:
    """How many arrays have a registered value now."""
    return len(_KNOWN)
