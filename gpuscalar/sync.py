"""Synchronization accounting: the ONE place where a device value is copied to the host.

Why this module exists: a device→host read stalls the GPU pipeline, and users cannot see where it
happens. Every host read in gpuscalar goes through `to_host`, which (1) applies the active
`sync_guard` *before* any transfer, (2) records the read with the user's call site in every
counter that listens, and (3) only then copies the value. A caller with work to do between (1-2)
and (3) (a pending expression's evaluation, which a refused read must not launch) makes steps
(1-2) itself first, `admit`, and then calls `to_host` without a reason. On the NumPy backend
the copy costs nothing but is counted the same way, which is what makes sync-count tests
meaningful on a machine without a GPU.

Guard modes and `count_syncs()` counters live in `contextvars`, so they are per thread and per
asyncio task, nest, and are restored on exit. Modelled on CuPy's syncdetect.

Who listens, and where:

- ``count_syncs()`` sees the block's own context (thread / asyncio task): a thread started
  inside the block is *not* seen; ``count_syncs(all_threads=True)`` sees every thread of the
  process while the block runs (the threads it starts and those already running). The second
  kind is one process-wide registry of counters (`gpuscalar.ledger.listen_everywhere`, a list
  changed under a lock); `gpuscalar profile` and the pytest plugin use it, so a worker thread's
  syncs are counted and attributed to the worker's line. Every kind of counter records the same
  sync, read in any thread, once.
- The user's line is the first frame outside gpuscalar, NumPy and CuPy: a read that NumPy's
  Python code makes for you (``np.mean([s])`` calling ``s.__array__``) names your call.
- Nobody listening costs almost nothing: with no counter that sees the calling context and the
  guard at ``"allow"``, `to_host` walks no frame and builds no record; it only bumps the process
  total (an `itertools.count`, atomic without a lock) and reads.

``count_syncs(include_cupy=True)`` also sees the syncs the array library makes itself, which it
declares through `declare_library_sync`: the strict device (`gpuscalar.strict`) does so for
every implicit host read, with no CuPy needed; CuPy calls
``cupy._core.syncdetect._declare_synchronize()`` (looked up at call time) before every
device→host copy (``ndarray.get``, and so ``item``, ``float``, ``bool``, ``repr``, ``asnumpy``,
``nonzero``, boolean-mask indexing, ``Device.synchronize``). While any such counter is active,
anywhere in the process, that function is wrapped (installed once, reference-counted under a
lock; where CuPy is installed but not imported yet, the wrapper goes in the moment CuPy's
syncdetect module is imported, so counting never imports CuPy itself). A declaration is recorded
in the counters that see the *calling* context.

The default guard mode of a whole program comes from the environment variable
``GPUSCALAR_SYNC_GUARD`` (``allow``, ``warn`` or ``error``), read once at import.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .ledger import (
    SyncCounter,
    SyncRecord,
    SyncSite,
    _active_counters,
    counters_here,
    graph_body,
    graph_replays,
    in_graph_body,
    inside_device_op,
    listen_everywhere,
    listen_in_this_context,
    note_device_op,
    note_graph_replay,
    one_device_op,
)

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "SyncMode",
    "SyncRecord",
    "SyncSite",
    "SyncCounter",
    "SyncError",
    "SyncWarning",
    "GUARD_ENV_VAR",
    "count_syncs",
    "sync_guard",
    "total_syncs",
    "to_host",
    "admit",
    "note_device_op",
    "one_device_op",
    "inside_device_op",
    "graph_body",
    "in_graph_body",
    "graph_replays",
    "note_graph_replay",
    "declare_library_sync",
    "caller_site",
    "describe",
]

SyncMode = Literal["allow", "warn", "error"]
_MODES = ("allow", "warn", "error")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: The environment variable that sets the default `sync_guard` mode of a whole program.
GUARD_ENV_VAR = "GPUSCALAR_SYNC_GUARD"
#: Reason recorded for a sync that CuPy itself declared (``count_syncs(include_cupy=True)``).
CUPY_REASON = "cupy"


class SyncError(RuntimeError):
    """Raised by a sync under ``sync_guard("error")``, before anything is transferred."""


class SyncWarning(UserWarning):
    """Issued by a sync under ``sync_guard("warn")``; points at the user's call site."""


def _default_mode_from_env() -> str:
    raw = os.environ.get(GUARD_ENV_VAR, "")
    mode = raw.strip().lower()
    if not mode:
        return "allow"
    if mode not in _MODES:
        raise ValueError(
            f"environment variable {GUARD_ENV_VAR}={raw!r} is invalid; "
            f"allowed values: {', '.join(_MODES)}"
        )
    return mode


_DEFAULT_MODE = _default_mode_from_env()
_guard_mode: ContextVar[str] = ContextVar("gpuscalar_sync_guard", default=_DEFAULT_MODE)
#: True while `to_host` copies a value, so the CuPy hook does not count that read twice.
_in_gpuscalar_read: ContextVar[bool] = ContextVar("gpuscalar_in_read", default=False)
#: One ``next()`` per read: the process total, counted without a lock (a C call, atomic).
_reads = itertools.count()


# ---- call sites ---------------------------------------------------------------------------
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__)) + os.sep
_skip_prefixes: tuple[str, ...] = (_PACKAGE_DIR, _NUMPY_DIR)
_cupy_dirs_known = False


def _cupy_dirs(module: ModuleType | None = None) -> tuple[str, ...]:
    """Directories of CuPy's packages (cupy, cupyx, cupy_backends), given any CuPy module."""
    filename = getattr(module or sys.modules.get("cupy"), "__file__", None)
    if not filename:
        return ()
    path = os.path.dirname(os.path.abspath(filename))
    while os.path.basename(path) != "cupy" and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if os.path.basename(path) != "cupy":
        return ()
    root = os.path.dirname(path)
    return tuple(os.path.join(root, name) + os.sep for name in ("cupy", "cupyx", "cupy_backends"))


def _user_frame() -> FrameType | None:
    """The first frame outside gpuscalar, NumPy and CuPy (once CuPy is imported)."""
    global _skip_prefixes, _cupy_dirs_known
    if not _cupy_dirs_known and "cupy" in sys.modules:
        _skip_prefixes = (_PACKAGE_DIR, _NUMPY_DIR, *_cupy_dirs())
        _cupy_dirs_known = True
    frame: FrameType | None = sys._getframe(1)
    prefixes = _skip_prefixes
    while frame is not None and frame.f_code.co_filename.startswith(prefixes):
        frame = frame.f_back
    return frame


def caller_site() -> tuple[str, int, str]:
    """(filename, lineno, function) of the first frame outside gpuscalar, NumPy and CuPy."""
    frame = _user_frame()
    if frame is None:
        return ("<unknown>", 0, "<unknown>")
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


# ---- guards and counters ------------------------------------------------------------------
@contextlib.contextmanager
def count_syncs(*, include_cupy: bool = False, all_threads: bool = False) -> Iterator[SyncCounter]:
    """Count the syncs and device ops made inside the block. Nests: outer counters see all.

    By default the counter sees the block's own thread / asyncio task (a thread started inside
    the block is not seen). With ``all_threads=True`` it sees every thread of the process while
    the block runs: what `gpuscalar profile` and the pytest plugin use.

    With ``include_cupy=True`` the counter also records the syncs that the array library makes
    itself (reason ``"cupy"``, at the first frame outside gpuscalar, NumPy and CuPy): CuPy's own
    (``x.get()``, ``float(x)``, mask indexing, ...; hooked where CuPy is installed) and the
    strict device's (no CuPy needed), so unmodified CuPy code can be profiled. A gpuscalar read
    is still counted once. Counters without ``include_cupy`` never see those.
    """
    if not isinstance(include_cupy, bool):
        raise TypeError(
            f"count_syncs(include_cupy=...) takes a bool, got {type(include_cupy).__name__}"
        )
    if not isinstance(all_threads, bool):
        raise TypeError(
            f"count_syncs(all_threads=...) takes a bool, got {type(all_threads).__name__}"
        )
    counter = SyncCounter(include_cupy=include_cupy)
    if include_cupy:
        _acquire_cupy_hook()
    try:
        with _activate(counter, all_threads=all_threads):
            yield counter
    finally:
        if include_cupy:
            _release_cupy_hook()


def _activate(
    counter: SyncCounter, *, all_threads: bool = False
) -> contextlib.AbstractContextManager[SyncCounter]:
    """Make an existing counter active for a block: in this context, or in every thread (the
    pytest plugin's use). CuPy's hook is not installed here (`count_syncs` does that)."""
    if all_threads:
        return listen_everywhere(counter)
    return listen_in_this_context(counter)


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
    return int(repr(_reads)[6:-1])  # "count(N)": N reads so far (itertools.count has no getter)


def _check_guard_and_record(reason: str, cupy_only: bool) -> None:
    """Apply the guard (raise or warn), then record one sync in the counters that listen."""
    frame = _user_frame()
    if frame is None:
        filename, lineno, function = "<unknown>", 0, "<unknown>"
        module_globals: dict[str, Any] = {}
    else:
        code = frame.f_code
        filename, lineno, function = code.co_filename, frame.f_lineno, code.co_name
        module_globals = frame.f_globals
    mode = _guard_mode.get()
    if mode != "allow":
        message = (
            f"device->host sync ({reason}) at {filename}:{lineno} in {function}() "
            f"under sync_guard({mode!r})"
        )
        if mode == "error":
            raise SyncError(message) from None  # not 'during handling of' a cache miss
        # As warnings.warn(stacklevel=...) would at the user's frame: filters and "once" work.
        warnings.warn_explicit(
            message,
            SyncWarning,
            filename,
            lineno,
            module=module_globals.get("__name__"),
            registry=None
            if frame is None
            else module_globals.setdefault("__warningregistry__", {}),
        )
    counters = counters_here()
    if not counters:
        return
    record = SyncRecord(reason, filename, lineno, function)
    for counter in counters:
        if counter.include_cupy or not cupy_only:
            counter.records.append(record)  # (one atomic append: counters shared by threads)


def admit(reason: str) -> None:
    """The guard and record step of one read, for a caller with work to do before the transfer
    that a refused read must not do (a pending expression's evaluation: nothing launches); it
    then calls ``to_host(backend, array, None)``. Under ``sync_guard("error")`` this raises
    `SyncError`; otherwise the read is warned about as the guard says, recorded in the counters
    that listen and counted. With nobody listening it only counts."""
    if _counting() or _guard_mode.get() != "allow":
        _check_guard_and_record(reason, cupy_only=False)
    next(_reads)


def to_host(backend: Backend, array: Any, reason: str | None) -> Any:
    """Copy the 0-d ``array`` to the host as a Python scalar: the one counted sync.

    The read is admitted first (`admit`: the guard before the transfer, so under
    ``sync_guard("error")`` nothing moves; then the record and the count), here with ``reason``;
    ``reason`` None says the caller admitted it already (`admit`), before evaluating ``array``.
    With nobody listening (no counter sees this context, guard ``"allow"``) no frame is walked
    and no record built.
    """
    if reason is None:  # admitted by the caller
        if _counting():
            return _read_observed(backend, array)
        return backend.read_scalar(array)
    if _counting() or _guard_mode.get() != "allow":
        _check_guard_and_record(reason, cupy_only=False)
        next(_reads)
        return _read_observed(backend, array)
    next(_reads)
    return backend.read_scalar(array)


_counting = _active_counters.get  # (`ledger.counting`: truthy while any counter sees us)


def _read_observed(backend: Backend, array: Any) -> Any:
    """The transfer of an admitted read while someone listens: the library's own declaration of
    this read (CuPy's syncdetect, the strict device) is not counted again."""
    token = _in_gpuscalar_read.set(True)
    try:
        return backend.read_scalar(array)
    finally:
        _in_gpuscalar_read.reset(token)


#: Values whose ``repr`` is read on the host (no device value to read): shown as they are.
_HOST_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis))


def describe(value: object) -> str:
    """How to name a user's value in an error or warning message without reading it.

    Formatting a GPUScalar or a device array (``f"{value}"``, ``{value!r}``) reads it from the
    device: a hidden sync, and under ``sync_guard("error")`` a `SyncError` in place of the
    message meant for the user. Host numbers and strings are shown as they are (``3``,
    ``'fast'``); anything else is named by its type, and its shape and dtype where it has them
    (``a GPUScalar of dtype float32``, ``a cupy.ndarray of shape (3,) and dtype float64``),
    none of which needs the device.
    """
    kind = type(value)
    if kind in _HOST_SCALARS or isinstance(value, np.generic):
        return repr(value)
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v) for v in value)
        return f"a {kind.__name__} of {len(value)} ({inner})"
    module = kind.__module__.partition(".")[0]
    name = kind.__name__ if module in ("builtins", "gpuscalar") else f"{module}.{kind.__name__}"
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if name == "GPUScalar" or (dtype is not None and shape == ()):
        return f"a {name} of dtype {dtype}"
    if dtype is not None and isinstance(shape, tuple):
        return f"a {name} of shape {shape} and dtype {dtype}"
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


# ---- the array library's own syncs (CuPy, the strict device) ----------------------------------
_SYNCDETECT = "cupy._core.syncdetect"
_cupy_hook_lock = threading.Lock()
_cupy_hook_users = 0
#: ``cupy._core.syncdetect`` while hooked (Any: CuPy ships no types, and its module attribute
#: ``_declare_synchronize`` is what gets swapped)
_cupy_syncdetect: Any = None
_cupy_original: Callable[[], Any] | None = None
#: In ``sys.meta_path`` while counting waits for CuPy to be imported (see `_CupyImportWatcher`).
_cupy_watcher: _CupyImportWatcher | None = None


def declare_library_sync() -> None:
    """A sync the array library makes itself (CuPy's ``ndarray.get()``, a strict-device read).

    Recorded (reason ``"cupy"``) in the counters made with ``include_cupy=True`` that see the
    calling context, and checked against the guard while such a counter listens; a read that
    gpuscalar itself is making (inside `to_host`) is not counted twice. Costs one C call while
    nobody counts.
    """
    if not _counting() or _in_gpuscalar_read.get():
        return
    if any(counter.include_cupy for counter in counters_here()):
        _check_guard_and_record(CUPY_REASON, cupy_only=True)


def _make_cupy_wrapper(original: Callable[[], Any]) -> Callable[[], Any]:
    def _declare_synchronize() -> Any:
        declare_library_sync()
        return original()

    _declare_synchronize.__wrapped__ = original  # type: ignore[attr-defined]
    return _declare_synchronize


def _hook(module: Any) -> None:
    """Wrap ``module._declare_synchronize`` (CuPy's syncdetect); call under the lock."""
    global _cupy_syncdetect, _cupy_original, _skip_prefixes, _cupy_dirs_known
    if _cupy_syncdetect is not None:
        return
    original = module._declare_synchronize
    module._declare_synchronize = _make_cupy_wrapper(original)
    _cupy_syncdetect, _cupy_original = module, original
    _skip_prefixes = (_PACKAGE_DIR, _NUMPY_DIR, *_cupy_dirs(module))
    _cupy_dirs_known = "cupy" in sys.modules


class _HookAfterLoading(importlib.abc.Loader):
    """CuPy's own loader of its syncdetect module, then the hook (while anyone still counts)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _cupy_hook_lock:
            if _cupy_hook_users > 0:
                _hook(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...: CuPy's loader's
        return getattr(self._loader, name)


class _CupyImportWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when CuPy's syncdetect module is about to be imported, it hands
    the spec the other finders give a loader that hooks the module once it has run."""

    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _SYNCDETECT:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _HookAfterLoading(spec.loader)
                return spec
        return None


def _syncdetect_if_imported() -> tuple[Any, bool]:
    """(CuPy's syncdetect module where CuPy is imported, whether CuPy is installed but not
    imported yet). Never imports CuPy; imports syncdetect only once CuPy itself is."""
    module = sys.modules.get(_SYNCDETECT)
    if module is not None:
        return module, False
    if _SYNCDETECT in sys.modules:  # None: made unimportable on purpose
        return None, False
    if "cupy" in sys.modules:
        try:
            return importlib.import_module(_SYNCDETECT), False
        except ImportError:  # a broken CuPy: nothing of it can sync
            return None, False
    try:
        return None, importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):
        return None, False


def _acquire_cupy_hook() -> None:
    """Install the wrapper on first use (or the watcher that installs it when CuPy is
    imported); later users only bump the reference count. Without CuPy: only the count."""
    global _cupy_hook_users, _cupy_watcher
    module, installed = _syncdetect_if_imported()  # (outside the lock: it may import)
    with _cupy_hook_lock:
        _cupy_hook_users += 1
        if module is not None:
            _hook(module)
        elif installed and _cupy_syncdetect is None and _cupy_watcher is None:
            _cupy_watcher = _CupyImportWatcher()
            sys.meta_path.insert(0, _cupy_watcher)
            late = sys.modules.get(_SYNCDETECT)  # imported by another thread meanwhile
            if late is not None:
                _hook(late)


def _release_cupy_hook() -> None:
    """Restore CuPy's function (and drop the watcher) when the last counter with
    ``include_cupy`` exits."""
    global _cupy_hook_users, _cupy_syncdetect, _cupy_original, _cupy_watcher
    with _cupy_hook_lock:
        _cupy_hook_users -= 1
        if _cupy_hook_users > 0:
            return
        if _cupy_syncdetect is not None:
            _cupy_syncdetect._declare_synchronize = _cupy_original
            _cupy_syncdetect = _cupy_original = None
        if _cupy_watcher is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(_cupy_watcher)
            _cupy_watcher = None
