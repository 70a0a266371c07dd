"""`gs.capture`: record a sync-free step once as a CUDA graph, replay it with one launch.

Why this module exists: removing syncs alone does not make a launch-bound loop fast on a GPU;
each CuPy launch costs ~10 us of CPU. A step that never syncs can be recorded as a CUDA graph and
replayed with a single launch (an H100 ran a small training loop 13.3x faster than its float
path this way). The float path can never be captured: a sync inside a capture invalidates it.
gpuscalar makes steps sync-free, so it is the library that can make them capturable.

``gs.capture(fn, *args, warmup=2, steps=1)`` runs ``fn(*args)`` ``warmup`` times (kernels
compile, caches settle), then records ``steps`` consecutive calls into one graph on a private
stream with a private memory pool; calling the returned `CapturedStep` replays the graph and
returns what ``fn`` returned: the same device buffers every time (a GPUScalar result as a fresh
GPUScalar over its buffer, so no stale host value is ever cached). The arrays ``fn`` reads and
writes are the graph's static buffers: update inputs in place (``x[...] = batch``).

Warm-up and recording run under ``sync_guard("error")``, with the array library's own syncs
guarded too (CuPy's syncdetect hook; the strict device's declared reads), so a sync raises
`SyncError` naming its reason and line before CUDA sees it. Any error ends the capture cleanly
(stream out of capture mode, graph and pool discarded, stream and allocator restored) and the
user's error is raised, never a cleanup error. Nested captures are refused.

On NumPy and the strict device no graph exists: recording executes nothing, and each call runs
``fn`` ``steps`` times under the same guard, as ONE counted device op (a replay is one launch on
a GPU too). So code and tests run everywhere with the GPU's semantics for sync-free code.

A Python number inside a captured step is baked in when it is recorded: values that change per
step (the learning rate, the step count) must be device scalars updated inside the step.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np

from . import sync
from .backend import CUPY, Backend, backend_of, default_backend
from .scalar import GPUScalar, _array_of, _wrap

__all__ = ["capture", "CapturedStep"]

_capturing: ContextVar[bool] = ContextVar("gpuscalar_capturing", default=False)

_NUMBERS = (bool, int, float, complex, np.generic)


def capture(fn: Callable[..., Any] | None = None, /, *args: Any, warmup: int = 2,
            steps: int = 1) -> Any:
    """Warm up and record ``fn(*args)``; returns a `CapturedStep` (call it to replay).

    Also a decorator: ``@gs.capture`` (no arguments, the defaults) or
    ``@gs.capture(warmup=3, steps=10)``.
    """
    if fn is None:
        if args:
            raise TypeError("gs.capture(...) as a decorator takes keyword arguments only")
        return lambda function: CapturedStep(function, (), warmup=warmup, steps=steps)
    return CapturedStep(fn, args, warmup=warmup, steps=steps)


def _check_count(value: Any, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"gs.capture: {name} must be an int, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"gs.capture: {name} must be >= {least}, got {value}")
    return int(value)


def _backend_of_args(args: tuple[Any, ...]) -> Backend:
    """The backend (and device) every array or GPUScalar argument lives on."""
    found: Backend | None = None
    device: object = None
    for index, arg in enumerate(args):
        if isinstance(arg, GPUScalar):
            backend, where = arg.backend, arg.device
        elif isinstance(arg, _NUMBERS):
            continue
        else:
            backend = backend_of(arg)
            if backend is None:
                raise TypeError(
                    f"gs.capture: argument {index} is a {type(arg).__name__}; a captured step "
                    "takes arrays, GPUScalars and numbers (close over anything else)"
                )
            where = backend.device_of(arg)
        if found is None:
            found, device = backend, where
        elif backend is not found:
            raise TypeError(f"gs.capture: argument {index} is a {backend.name} value but an "
                            f"earlier one is {found.name}")
        elif where != device:
            raise ValueError(f"gs.capture: argument {index} is on device {where!r} but an "
                             f"earlier one on {device!r}")
    if found is not None:
        return found
    return default_backend()  # a step that closes over its arrays: the GPU when there is one


@contextlib.contextmanager
def _guarded(backend: Backend) -> Iterator[None]:
    """Every sync raises, the array library's own included; and no capture may nest."""
    if _capturing.get(False):  # (a ContextVar, not a device read)
        raise RuntimeError("gs.capture: a step is already being captured; captures cannot nest")
    token = _capturing.set(True)
    try:
        if backend is CUPY:  # CuPy's own syncs (float(x), x.get(), ...) through its hook
            library_syncs: Any = sync.count_syncs(include_cupy=True)
        else:  # the strict device declares its reads without CuPy
            library_syncs = sync._activate(sync.SyncCounter(include_cupy=True))
        with sync.sync_guard("error"), library_syncs:
            yield
    finally:
        _capturing.reset(token)


def _materialized(result: Any) -> Any:
    """``result`` with every pending GPUScalar evaluated (inside the capture: its kernel is
    recorded, and its value lives in a static buffer)."""
    if isinstance(result, GPUScalar):
        _array_of(result)
        return result
    if isinstance(result, (tuple, list)):
        return type(result)(_materialized(r) for r in result)
    if isinstance(result, dict):
        return {key: _materialized(value) for key, value in result.items()}
    return result


def _fresh(backend: Backend, result: Any) -> Any:
    """The recorded outputs with each GPUScalar re-wrapped: the graph rewrote its buffer, so a
    value read (and cached) after an earlier replay must not be returned again."""
    if isinstance(result, GPUScalar):
        return _wrap(backend, _array_of(result))
    if isinstance(result, (tuple, list)):
        return type(result)(_fresh(backend, r) for r in result)
    if isinstance(result, dict):
        return {key: _fresh(backend, value) for key, value in result.items()}
    return result


_CUBLAS_REFUSAL = "cuBLAS"


class CapturedStep:
    """A step recorded by `capture`: call it to replay (one launch on a GPU, one counted device
    op everywhere). ``release()`` frees its graph and memory pool; the step cannot be replayed
    afterwards."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], *, warmup: int = 2,
                 steps: int = 1) -> None:
        if not callable(fn):
            raise TypeError(f"gs.capture: fn must be callable, got {type(fn).__name__}")
        self.warmup = _check_count(warmup, "warmup", 0)
        self.steps = _check_count(steps, "steps", 1)
        self.backend = _backend_of_args(args)
        self._fn, self._args = fn, args
        self._graph: Any = None
        self._result: Any = None
        self._released = False
        if self.backend is CUPY:
            self._record_on_cupy()
        else:
            with _guarded(self.backend):
                for _ in range(self.warmup):
                    fn(*args)

    # ---- CuPy ------------------------------------------------------------------------------
    def _record_on_cupy(self) -> None:
        cupy = CUPY.xp
        if cupy.cuda.get_current_stream().is_capturing():
            raise RuntimeError("gs.capture: the current stream is already capturing")
        stream = cupy.cuda.Stream(non_blocking=True)
        pool = cupy.cuda.MemoryPool()
        self._stream, self._pool = stream, pool
        # The step's inputs may still be being written on the current stream.
        stream.wait_event(cupy.cuda.get_current_stream().record())
        with stream, cupy.cuda.using_allocator(pool.malloc):
            with _guarded(self.backend):
                for _ in range(self.warmup):
                    self._fn(*self._args)
        stream.synchronize()  # warm-up finished (outside the guard: this wait is intended)
        with stream, cupy.cuda.using_allocator(pool.malloc), _guarded(self.backend):
            stream.begin_capture()
            try:
                for _ in range(self.steps):
                    result = self._fn(*self._args)
                result = _materialized(result)
            except NotImplementedError as error:
                stream.end_capture()  # discard the partial graph; the stream leaves capture
                if _CUBLAS_REFUSAL in str(error):
                    raise NotImplementedError(
                        f"{error}: CuPy cannot call cuBLAS while a graph is captured (x @ w, "
                        "cupy.matmul, cupy.dot ...); use gs.matmul(a, b, out=...) in a "
                        "captured step"
                    ) from error
                raise
            except BaseException:
                stream.end_capture()
                raise
            graph = stream.end_capture()
        graph.upload(stream)
        self._graph, self._result = graph, result
        self._finalizer = weakref.finalize(self, pool.free_all_blocks)

    # ---- replay ------------------------------------------------------------------------------
    def __call__(self) -> Any:
        """Replay the step: one graph launch (on NumPy, ``steps`` calls of fn under the sync
        guard, counted as one device op); returns the step's outputs."""
        if self._released:
            raise RuntimeError("gs.capture: this CapturedStep was released; capture it again")
        if self.backend is CUPY:
            with sync.one_device_op():
                self._graph.launch()  # on the current stream: ordered with the caller's work
            return _fresh(self.backend, self._result)
        result = None
        with _guarded(self.backend), sync.one_device_op():
            for _ in range(self.steps):
                result = self._fn(*self._args)
        return result

    def release(self) -> None:
        """Free the graph and the step's private memory pool (its outputs' buffers included)."""
        self._released = True
        self._graph = self._result = None
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    @property
    def released(self) -> bool:
        return self._released

    def __repr__(self) -> str:
        state = "released" if self._released else "ready"
        kind = "CUDA graph" if self.backend is CUPY else f"{self.backend.name}, re-run"
        return (f"<gpuscalar CapturedStep {getattr(self._fn, '__name__', 'fn')}: "
                f"{self.steps} step(s), {kind}, {state}>")

