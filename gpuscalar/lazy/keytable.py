"""THE table of structure keys behind `gpuscalar.lazy.expr`'s nodes, and how it stays bounded.

Why this module exists: a node's key is an int interned from its structure (op id, child keys),
so equal keys mean equal structure and every cache of kernels and plans is one dict lookup. A
program whose expressions take new shapes with the data (a running total of data-dependent
terms: ~0.75 new keys a step) would grow this table forever (~`expr.KEY_BYTES_PER_SHAPE` a
shape), so the keys nothing refers to any more are dropped (`sweep`), and a dropped structure
met again is interned anew under a new key.

Why that is safe: keys are never reused (a counter, not a slot), so a key means one structure
for the life of the process, and no cache keyed by a stale key can find another structure's
kernel or plan. A key is dropped only when nothing but this table refers to its int object: no
node (a node holds the very object it was built with), no cache entry (kernels, plans, pending
kinds, churn families hold it in their keys), no parent structure (parents are newer, swept
first, and hold their children's key objects), no local variable of any thread. The sweep
reads that from the object's reference count, calibrated by a probe swept the same way, so it
needs no bookkeeping on the hot path (`make_node` stays one dict lookup on a hit).

Threads: everything here runs under `TABLE_LOCK`, as interning always did. A key's lookup
entries (structure -> key, and its op's child keys -> key) are removed *before* its count is
read, so no thread can pick the key up in between (a thread that misses waits for the lock and
then finds it again, or a new key); a thread that already holds it is counted and keeps it.
CPython's reference counts are exact under the GIL (this package's interpreters).
"""

from __future__ import annotations

import itertools
import sys
import threading
from typing import Any

__all__ = ["TABLE_LOCK", "KEYS", "KEY_STRUCTURE", "OPS_BY_ID", "FORGOTTEN_AT_SWEEP", "intern",
           "sweep", "bound_keys"]

#: Taken on the miss path of every interning table (never on a hit): the lookup is repeated
#: under it, so one id or key is handed out per identity however many threads miss together.
#: Re-entrant: interning a key may intern its leaf kinds.
TABLE_LOCK = threading.RLock()
#: Every interned `expr.Op`, by id (ops are few and never dropped).
OPS_BY_ID: list[Any] = []
#: structure -> key. A node's structure is (op id, child keys...); a leaf's is ("leaf", dtype)
#: and a Python number's ("const", dtype).
KEYS: dict[tuple, int] = {}
#: key -> structure (for plans, names and debugging), oldest first.
KEY_STRUCTURE: dict[int, tuple] = {}
_next_key = itertools.count()
#: Caches of what is derived from a structure alone, emptied at the start of each sweep (their
#: keys would otherwise count as references): made again from any tree of the structure, the
#: same (`expr`'s leaf readers).
FORGOTTEN_AT_SWEEP: list[dict[int, Any]] = []
#: The table is swept when it reaches this many keys; then at twice what a sweep leaves.
_floor = 2 * 1024  # (`caches.set_cache_size` sets it: twice the bound of its caches)
_sweep_at = _floor


def bound_keys(floor: int) -> None:
    """Never sweep a table of fewer than ``floor`` keys (set from `caches.set_cache_size`)."""
    global _floor, _sweep_at
    with TABLE_LOCK:
        _floor = floor
        _sweep_at = max(floor, min(_sweep_at, 2 * max(len(KEY_STRUCTURE), floor)))


def intern(structure: tuple) -> int:
    """The key of ``structure`` (thread-safe: one key per structure at a time)."""
    key = KEYS.get(structure)
    if key is None:
        with TABLE_LOCK:
            key = KEYS.get(structure)
            if key is None:
                if len(KEY_STRUCTURE) >= _sweep_at:
                    sweep()
                key = next(_next_key)
                KEY_STRUCTURE[key] = structure  # describable before the key is published
                KEYS[structure] = key
    return key


def sweep() -> int:
    """Drop every key nothing outside this table refers to (see the module's docstring);
    returns how many were dropped. The next sweep comes at twice what this one leaves."""
    global _sweep_at
    with TABLE_LOCK:
        for derived in FORGOTTEN_AT_SWEEP:
            derived.clear()
        # The probe: a key nobody holds, swept first, gives a dead key's count in this loop.
        KEY_STRUCTURE[object()] = ()  # type: ignore[index]
        dead = -1
        dropped = 0
        for key in reversed(list(KEY_STRUCTURE)):  # newest first: parents before children
            if dead < 0:
                dead = sys.getrefcount(key)
                del KEY_STRUCTURE[key]
                continue
            structure = KEY_STRUCTURE[key]
            head = structure[0]
            op_keys = None if type(head) is str else OPS_BY_ID[head].keys
            children = structure[1:]
            looked_up = KEYS.get(structure) is key
            if looked_up:
                del KEYS[structure]
            by_op = op_keys is not None and op_keys.get(children) is key
            if by_op:
                del op_keys[children]  # type: ignore[union-attr]
            if sys.getrefcount(key) > dead:  # still referred to: keep it, findable again
                if looked_up:
                    KEYS[structure] = key
                if by_op:
                    op_keys[children] = key  # type: ignore[index]
                continue
            del KEY_STRUCTURE[key]
            dropped += 1
        _sweep_at = max(_floor, 2 * len(KEY_STRUCTURE))
        return dropped
