"""Synchronization accounting: the ONE place where a device value is copied to the host.

Why this module exists: a device→host read stalls the GPU pipeline, and users cannot see where it
happens. Every host read in gpuscalar goes through `to_host`, which (1) applies the active
`sync_guard` *before* any transfer, (2) records the read with the user's call site in every
active `count_syncs()` counter, and (3) only then copies the value. On the NumPy backend the copy
costs nothing but is counted the same way, which is what makes sync-count tests meaningful on a
machine without a GPU.

State (guard mode, active counters) lives in `contextvars`, so it is per thread and per asyncio
task, nests, and is restored on exit — never process-global. Modelled on CuPy's syncdetect.

`count_syncs(include_cupy=True)` also sees the syncs that unmodified CuPy code makes: CuPy calls
``cupy._core.syncdetect._declare_synchronize()`` (looked up at call time) before every
device→host copy (``ndarray.get``, and so ``item``, ``float``, ``bool``, ``repr``, ``asnumpy``,
``nonzero``, boolean-mask indexing, ``Device.synchronize``). While any such counter is active,
anywhere in the process, that function is wrapped (installed once, reference-counted under a
lock); the wrapper records into the counters of the *calling* context only.

The default guard mode of a whole program comes from the environment variable
``GPUSCALAR_SYNC_GUARD`` (``allow``, ``warn`` or ``error``), read once at import.
"""

from __future__ import annotations

import contextlib
import importlib
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
    graph_body,
    graph_replays,
    in_graph_body,
    inside_device_op,
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
_total_lock = threading.Lock()
_total = 0


# ---- call sites ---------------------------------------------------------------------------
_skip_prefixes: tuple[str, ...] = (_PACKAGE_DIR,)
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
    """The first frame outside gpuscalar (and outside CuPy, once CuPy is imported)."""
    global _skip_prefixes, _cupy_dirs_known
    if not _cupy_dirs_known and "cupy" in sys.modules:
        _skip_prefixes = (_PACKAGE_DIR, *_cupy_dirs())
        _cupy_dirs_known = True
    frame: FrameType | None = sys._getframe(1)
    prefixes = _skip_prefixes
    while frame is not None and frame.f_code.co_filename.startswith(prefixes):
        frame = frame.f_back
    return frame


def caller_site() -> tuple[str, int, str]:
    """(filename, lineno, function) of the first frame outside gpuscalar (and CuPy)."""
    frame = _user_frame()
    if frame is None:
        return ("<unknown>", 0, "<unknown>")
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


# ---- guards and counters ------------------------------------------------------------------
@contextlib.contextmanager
def count_syncs(*, include_cupy: bool = False) -> Iterator[SyncCounter]:
    """Count the syncs and device ops made inside the block. Nests: outer counters see all.

    With ``include_cupy=True`` the counter also records the syncs that CuPy's own code makes
    (reason ``"cupy"``, at the first frame outside gpuscalar and CuPy), so unmodified CuPy code
    can be profiled. A gpuscalar read is still counted once. Needs CuPy installed (ImportError
    otherwise). Counters without ``include_cupy`` never see CuPy's own syncs.
    """
    if not isinstance(include_cupy, bool):
        raise TypeError(
            f"count_syncs(include_cupy=...) takes a bool, got {type(include_cupy).__name__}"
        )
    counter = SyncCounter(include_cupy=include_cupy)
    if include_cupy:
        _acquire_cupy_hook()
    try:
        token = _active_counters.set(_active_counters.get() + (counter,))
        try:
            yield counter
        finally:
            _active_counters.reset(token)
    finally:
        if include_cupy:
            _release_cupy_hook()


@contextlib.contextmanager
def _activate(counter: SyncCounter) -> Iterator[SyncCounter]:
    """Make an existing gpuscalar-only counter active for a block (the pytest plugin's use)."""
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


def _check_guard_and_record(reason: str, cupy_only: bool) -> None:
    """Apply the guard (raise or warn), then record one sync in the active counters."""
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
    record = SyncRecord(reason, filename, lineno, function)
    for counter in _active_counters.get():
        if counter.include_cupy or not cupy_only:
            counter.records.append(record)


def to_host(backend: Backend, array: Any, reason: str) -> Any:
    """Copy the 0-d ``array`` to the host as a Python scalar: the one counted sync.

    The guard is checked before the transfer, so under ``sync_guard("error")`` nothing moves.
    ``array`` may be a function returning the array (a pending expression's evaluation): it is
    called only once the read is allowed, so a refused read launches nothing either.
    """
    global _total
    _check_guard_and_record(reason, cupy_only=False)
    with _total_lock:
        _total += 1
    if callable(array):
        array = array()
    token = _in_gpuscalar_read.set(True)  # the library's own declaration of this read is ours
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


# ---- CuPy's own syncs ---------------------------------------------------------------------
_cupy_hook_lock = threading.Lock()
_cupy_hook_users = 0
#: ``cupy._core.syncdetect`` while hooked (Any: CuPy ships no types, and its module attribute
#: ``_declare_synchronize`` is what gets swapped)
_cupy_syncdetect: Any = None
_cupy_original: Callable[[], Any] | None = None


def _import_syncdetect() -> Any:
    try:
        return importlib.import_module("cupy._core.syncdetect")
    except ImportError as exc:
        raise ImportError(
            "count_syncs(include_cupy=True) needs CuPy (cupy._core.syncdetect could not be "
            f"imported: {exc}); install cupy-cuda12x or cupy-cuda13x, or use include_cupy=False"
        ) from exc


def declare_library_sync() -> None:
    """A sync the array library makes itself (CuPy's ``ndarray.get()``, a strict-device read).

    Recorded (reason ``"cupy"``) in the counters made with ``include_cupy=True``, and checked
    against the guard while such a counter is active; a read that gpuscalar itself is making
    (inside `to_host`) is not counted twice.
    """
    if not _in_gpuscalar_read.get() and any(c.include_cupy for c in _active_counters.get()):
        _check_guard_and_record(CUPY_REASON, cupy_only=True)


def _make_cupy_wrapper(original: Callable[[], Any]) -> Callable[[], Any]:
    def _declare_synchronize() -> Any:
        declare_library_sync()
        return original()

    _declare_synchronize.__wrapped__ = original  # type: ignore[attr-defined]
    return _declare_synchronize


def _acquire_cupy_hook() -> None:
    """Install the wrapper on first use; later users only bump the reference count."""
    global _cupy_hook_users, _cupy_syncdetect, _cupy_original, _skip_prefixes, _cupy_dirs_known
    with _cupy_hook_lock:
        if _cupy_hook_users == 0:
            module = _import_syncdetect()
            original = module._declare_synchronize
            module._declare_synchronize = _make_cupy_wrapper(original)
            _cupy_syncdetect, _cupy_original = module, original
            _skip_prefixes = (_PACKAGE_DIR, *_cupy_dirs(module))
            _cupy_dirs_known = "cupy" in sys.modules
        _cupy_hook_users += 1


def _release_cupy_hook() -> None:
    """Restore CuPy's function when the last counter with ``include_cupy`` exits."""
    global _cupy_hook_users, _cupy_syncdetect, _cupy_original
    with _cupy_hook_lock:
        _cupy_hook_users -= 1
        if _cupy_hook_users == 0 and _cupy_syncdetect is not None:
            _cupy_syncdetect._declare_synchronize = _cupy_original
            _cupy_syncdetect = _cupy_original = None
