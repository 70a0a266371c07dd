"""The bounded caches of `gpuscalar.lazy`, and the one setting that bounds them all.

Why this module exists: kernels, dispatch plans and structure plans are cached by structure, and
a program that keeps making new structures (new dtypes, ufuncs, expression shapes) must not grow
without bound (DESIGN: bounded tables). Every such cache is a `BoundedCache` (least recently used
evicted first) or, for what is derived from a structure alone and cheap to make again, a plain
dict registered in `DERIVED` (emptied when it outgrows the bound); `set_cache_size` bounds them
all at once, and the structure-key table (`gpuscalar.lazy.keytable`) is swept past twice the
bound. Below `gpuscalar.lazy.expr` (which re-exports these names): imports only the key table.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from . import keytable

__all__ = ["BoundedCache", "DEFAULT_CACHE_SIZE", "DERIVED", "cache_size", "derived", "keep",
           "set_cache_size"]

#: Default bound of each cache of gpuscalar.lazy: structure plans (`expr`), `fusion`'s compiled
#: kernels, CuPy dispatch plans and loop pins.
DEFAULT_CACHE_SIZE = 1024
_cache_size = DEFAULT_CACHE_SIZE
_MISSING = object()
#: Every `BoundedCache` alive, trimmed together when the bound changes.
_CACHES: weakref.WeakSet[BoundedCache] = weakref.WeakSet()
#: Plain dicts of what is derived from a structure alone (`expr`'s leaf readers), emptied when
#: they hold more than the bound.
DERIVED: list[dict[Any, Any]] = []


def derived(table: dict[Any, Any]) -> dict[Any, Any]:
    """Register ``table`` (structure key -> what that structure alone determines, made again
    the same from any tree of it): bounded by `set_cache_size` and emptied at each sweep of the
    key table (its keys would otherwise count as references there). Returns it; fill it with
    `keep`."""
    DERIVED.append(table)
    keytable.FORGOTTEN_AT_SWEEP.append(table)
    return table


def keep(table: dict[Any, Any], key: Any, value: Any) -> None:
    """Store ``value`` in the `derived` ``table``, emptying it first when it is full."""
    if len(table) >= _cache_size:
        table.clear()
    table[key] = value


class BoundedCache:
    """A least-recently-used map holding at most `cache_size` entries, safe under threads.

    Why: kernels and dispatch plans are cached by structure, and a program that keeps making
    new structures (new dtypes, ufuncs, expression shapes) must not grow without bound. An
    evicted entry only costs a rebuild (the same kernel source, so CuPy's own compile cache
    answers). A hit is a lock-free dict read plus a move to the end (one C call each); a miss
    builds the value under the cache's lock, so threads meeting a structure for the first time
    together build it once and all get the same object.
    """

    __slots__ = ("_data", "_lock", "__weakref__")

    def __init__(self) -> None:
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.RLock()
        _CACHES.add(self)

    def get(self, key: Any, make: Callable[..., Any], *args: Any) -> Any:
        """The value for ``key``; ``make(*args)`` builds it (once) when it is not cached."""
        data = self._data  # (`hit`, written out: this is every plan lookup)
        value = data.get(key, _MISSING)
        if value is _MISSING:
            return self._miss(key, make, args)
        try:
            data.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile: the value is still right
            pass
        return value

    def hit(self, key: Any, default: Any = None) -> Any:
        """The value for ``key`` if cached (now the most recently used), else ``default``: for
        a hot caller whose `get` would pack many arguments for a miss that seldom happens."""
        data = self._data
        value = data.get(key, _MISSING)
        if value is _MISSING:
            return default
        try:
            data.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile: the value is still right
            pass
        return value

    def _miss(self, key: Any, make: Callable[..., Any], args: tuple) -> Any:
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                value = make(*args)
                self._data[key] = value
                self.trim()
            return value

    def trim(self) -> None:
        """Evict the least recently used entries past `cache_size`."""
        with self._lock:
            while len(self._data) > _cache_size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def values(self) -> list[Any]:
        return list(self._data.values())

    def keys(self) -> list[Any]:
        return list(self._data)

    def __getitem__(self, key: Any) -> Any:
        """The value for ``key`` (now the most recently used); KeyError if not cached."""
        data = self._data  # (`hit`, written out, as in `get`)
        value = data.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        try:
            data.move_to_end(key)
        except KeyError:
            pass
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            self.trim()

    def update(self, items: Any) -> None:
        """Store every (key, value) of a mapping (least recently used dropped past the bound):
        with `keys`, `__getitem__` and `clear`, what `CupyBackend.seam_cache` needs to empty a
        cache of device objects under a test seam and restore it after."""
        for key in list(items.keys()):
            self[key] = items[key]

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Any) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._data))


def cache_size() -> int:
    """The bound on each cache of gpuscalar.lazy: structure plans, compiled fused kernels, CuPy
    dispatch plans and loop pins (each at most this many entries; `DEFAULT_CACHE_SIZE` unless
    set)."""
    return _cache_size


def set_cache_size(size: int) -> int:
    """Bound each cache of gpuscalar.lazy to ``size`` entries (least recently used evicted
    first; an evicted kernel or plan is rebuilt when next needed, with the same result: a plan
    is a tree walk, a kernel CuPy's own compile cache answers). Returns the previous bound. A
    dispatch plan holds its kernel, so at most twice ``size`` kernels stay alive. A structure
    plan costs ~160 bytes per op node (tracemalloc, CPython 3.11); process-wide."""
    global _cache_size
    if type(size) is not int:
        raise TypeError(f"set_cache_size: the bound must be an int, got {type(size).__name__}")
    if size < 1:
        raise ValueError(f"set_cache_size: the bound must be >= 1, got {size}")
    previous, _cache_size = _cache_size, size
    keytable.bound_keys(2 * size)  # the key table: swept past 2 keys per cached entry
    for cache in list(_CACHES):
        cache.trim()
    for derived in DERIVED:
        if len(derived) > size:
            derived.clear()
    return previous
