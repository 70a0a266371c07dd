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

Where the step runs: on the backend and device of its array and GPUScalar arguments (all on one);
for a step without array arguments, on those of the arrays its function closes over (a NumPy
array beside device arrays does not count); failing that, on CuPy's current device when a GPU is
present, else on NumPy.

Warm-up and recording run under ``sync_guard("error")``, with the array library's own syncs
guarded too (CuPy's syncdetect hook; the strict device's declared reads), so a sync raises
`SyncError` naming its reason and line before CUDA sees it. Any error ends the capture cleanly
(stream out of capture mode, partial graph discarded, stream and allocator restored) and the
user's error is raised, never a cleanup error. Nested captures are refused, but a step may call
another captured step: while a graph is being recorded (the current stream captures) the inner
step's ``fn`` runs ``steps`` times inline, so its kernels are recorded into the outer graph
(launching a graph into a capturing stream is not reliable), as on the CPU.

On NumPy and the strict device no graph exists: recording executes nothing, and each call runs
``fn`` ``steps`` times under the same guard, as ONE counted device op (a replay is one launch on
a GPU too). The outputs are the same buffers at every replay there too (`_StaticOutputs`): the
first replay's outputs become the step's buffers, and each later replay's are copied into them
(copies inside the replay's one device op). So code and tests run everywhere with the GPU's
semantics for sync-free code.

A Python number inside a captured step is baked in when it is recorded: values that change per
step (the learning rate, the step count) must be device scalars updated inside the step.

No host-to-device copy inside a step: CuPy refuses one while its stream captures (a graph would
replay a copy from host memory long gone), and the strict device refuses it in the step's body
(`sync.graph_body`) with CuPy's words, so CPU tests see it; both errors say what to do instead,
as does CuPy's refusal of its own cuBLAS calls (``x @ w``; use ``gs.matmul``). A 0-d array made
from a Python number is a fill kernel, not a copy, and is allowed.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np

from ... import known, ledger, sync
from ...backend import Backend
from ...scalar import GPUScalar, _array_of, _wrap
from .. import NUMPY, backend_of, default_backend
from . import linalg
from .backend import CUPY

__all__ = ["capture", "CapturedStep"]

#: True while a step is being warmed up or recorded in this context (captures cannot nest)
_capturing: ContextVar[bool] = ContextVar("gpuscalar_capturing", default=False)

_NUMBERS = (bool, int, float, complex, np.generic)
#: what CuPy's refusals inside a capture say (CuPy 14: cupy_backends.cuda.libs.cublas.setStream,
#: a NotImplementedError; cupy/cuda/memory.pyx copy_from_host_async, a RuntimeError); the
#: strict device says the same inside a step's body
_CUBLAS_REFUSAL = "cuBLAS"
_UPLOAD_REFUSAL = "H2D transfers are disallowed"


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
        raise ValueError(f"gs.capture: {name} must be >= {least}, got {sync.describe(value)}")
    return int(value)


# ---- where a step runs ----------------------------------------------------------------------

Placement = tuple[Backend, object]  # (backend, device)


def _where(value: Any) -> Placement | None:
    """The backend and device of an array or GPUScalar; None for anything else."""
    if isinstance(value, GPUScalar):
        return value.backend, value.device
    backend = backend_of(value)
    return None if backend is None else (backend, backend.device_of(value))


def _placement_of_args(args: tuple[Any, ...]) -> Placement | None:
    """Where every array or GPUScalar argument lives (None when there is none)."""
    found: Placement | None = None
    for index, arg in enumerate(args):
        if isinstance(arg, _NUMBERS):
            continue
        where = _where(arg)
        if where is None:
            raise TypeError(
                f"gs.capture: argument {index} is a {type(arg).__name__}; a captured step "
                "takes arrays, GPUScalars and numbers (close over anything else)"
            )
        if found is None:
            found = where
        elif where[0] is not found[0]:
            raise TypeError(f"gs.capture: argument {index} is a {where[0].name} value but an "
                            f"earlier one is {found[0].name}")
        elif where[1] != found[1]:
            raise ValueError(f"gs.capture: argument {index} is on device {where[1]!r} but an "
                             f"earlier one on {found[1]!r}")
    return found


def _placement_of_closure(fn: Callable[..., Any]) -> Placement | None:
    """Where the arrays that a step without array arguments closes over live (the variables
    it names directly; None when there are none or ``fn`` is not a Python function)."""
    try:
        variables = inspect.getclosurevars(fn)
    except TypeError:  # a callable object or a partial: nothing to inspect
        return None
    except ValueError:  # a closure cell not yet assigned ("cell is empty")
        return None
    places: dict[Placement, str] = {}
    for name, value in (*variables.nonlocals.items(), *variables.globals.items()):
        where = _where(value)
        if where is not None:
            places.setdefault(where, name)
    if len(places) > 1:  # a host array beside device arrays (a host copy, say): the device's
        places = {where: name for where, name in places.items() if where[0] is not NUMPY} or places
    if len(places) > 1:
        found = ", ".join(f"{name!r} ({backend.name}, device {device!r})"
                          for (backend, device), name in places.items())
        raise TypeError(f"gs.capture: {getattr(fn, '__name__', 'fn')} uses arrays on different "
                        f"backends or devices ({found}); pass the arrays it computes on as "
                        "arguments")
    return next(iter(places), None)


def _placement(fn: Callable[..., Any], args: tuple[Any, ...]) -> Placement:
    found = _placement_of_args(args) or _placement_of_closure(fn)
    if found is not None:
        return found
    backend = default_backend()  # a step that reaches its arrays some other way
    return backend, (CUPY.seam.current_device() if backend is CUPY else None)


# ---- the guard ----------------------------------------------------------------------------


def _refuse_nested_recording() -> None:
    """A capture may not start while another step is recorded or warmed up, nor inside a loop
    body (recorded into the enclosing graph already). Asked before anything else, so the error
    names the cause rather than what it leads to (on a GPU, the body's stream is capturing)."""
    if _capturing.get(False):  # (a ContextVar, not a device read)
        raise RuntimeError("gs.capture: a step is already being captured; captures cannot "
                           "nest (a captured step may replay another one)")
    if ledger.in_loop_body():
        raise RuntimeError("gs.capture: cannot capture inside a gs.while_loop or gs.cond "
                           "body (it is recorded into the enclosing graph already); "
                           "capture the whole loop instead")


@contextlib.contextmanager
def _guarded(backend: Backend, *, recording: bool) -> Iterator[None]:
    """Every sync raises, the array library's own included. While ``recording`` (warm-up and
    capture), another capture may not start inside."""
    token = None
    if recording:
        _refuse_nested_recording()
        token = _capturing.set(True)
    try:
        if backend is CUPY:  # CuPy's own syncs (float(x), x.get(), ...) through its hook
            library_syncs: Any = sync.count_syncs(include_cupy=True)
        else:  # the strict device declares its reads without CuPy
            library_syncs = sync._activate(sync.SyncCounter(include_cupy=True))
        # a body, as a loop's: a pending GPUScalar made outside is a recipe evaluated where it
        # is used, from its inputs' values at each replay (what a recorded graph does), never
        # cached on the scalar by an evaluation in here
        with sync.sync_guard("error"), library_syncs, ledger.loop_body():
            yield
    finally:
        if token is not None:
            _capturing.reset(token)


def _materialized(backend: Backend, result: Any) -> Any:
    """``result`` with every GPUScalar as a materialized one over the array its value is in
    (inside the capture: the evaluating kernel is recorded, and the value lives in a static
    buffer); the step's own scalars are not changed (nothing is cached in a body)."""
    if isinstance(result, GPUScalar):
        static = _array_of(result)
        known.mark_live(static)  # rewritten by every replay: never a known value
        return _wrap(backend, static)
    if isinstance(result, (tuple, list)):
        return _rebuilt(result, [_materialized(backend, r) for r in result])
    if isinstance(result, dict):
        return {key: _materialized(backend, value) for key, value in result.items()}
    return result


def _rebuilt(container: Any, items: list[Any]) -> Any:
    """A tuple or list (a named tuple included) like ``container`` holding ``items``."""
    if isinstance(container, tuple) and hasattr(container, "_fields"):
        return type(container)(*items)
    return type(container)(items)


class _StaticOutputs:
    """A step's outputs on NumPy and the strict device, as a GPU gives them: the same buffers at
    every replay. The first replay's outputs (a GPUScalar's value in its 0-d array) become the
    buffers; each later replay's are copied into them (device ops of the replay: not counted
    again). A NumPy scalar (NumPy's 0-d results) is returned as computed; any other value (a
    Python number, None) is the first replay's, as a recording freezes it. A later replay
    returning outputs of another form is an error (a graph's outputs cannot change)."""

    __slots__ = ("outputs",)

    def __init__(self) -> None:
        self.outputs: Any = _NOTHING_YET

    def keep(self, backend: Backend, result: Any) -> Any:
        if self.outputs is _NOTHING_YET:
            self.outputs = _materialized(backend, result)
            return _fresh(backend, self.outputs)
        return _copy_into(self.outputs, result, "the output")


_NOTHING_YET: Any = object()


def _copy_into(kept: Any, new: Any, where: str) -> Any:
    """Copy a replay's outputs ``new`` into the buffers ``kept`` (`_StaticOutputs`); returns
    what the replay returns: the buffers (GPUScalars fresh over theirs)."""

    def mismatch(what: str) -> TypeError:
        return TypeError(f"gs.capture: {where} of this replay is {what}, unlike the first "
                         "replay's; a captured step returns the same buffers at every replay, "
                         "so its outputs keep their form (on a GPU they are the recorded ones)")

    if isinstance(kept, GPUScalar):
        if not isinstance(new, GPUScalar) or new.dtype != kept.dtype:
            raise mismatch(f"a {type(new).__name__}" + (
                f" of dtype {new.dtype}" if isinstance(new, GPUScalar) else ""))
        target, source = _array_of(kept), _array_of(new)
        result: Any = _wrap(kept.backend, target)
    elif backend_of(kept) is not None:
        if backend_of(new) is not backend_of(kept) or new.shape != kept.shape or (
                new.dtype != kept.dtype):
            raise mismatch(f"a {type(new).__name__}" + (
                f" of shape {new.shape} and dtype {new.dtype}" if hasattr(new, "shape") else ""))
        target = result = kept
        source = new
    elif isinstance(kept, (tuple, list)):
        if type(new) is not type(kept) or len(new) != len(kept):
            raise mismatch(f"a {type(new).__name__}" + (
                f" of {len(new)} item{'' if len(new) == 1 else 's'}"
                if isinstance(new, (tuple, list)) else ""))
        return _rebuilt(kept, [_copy_into(old, value, f"{where}[{index}]")
                               for index, (old, value) in enumerate(zip(kept, new, strict=True))])
    elif isinstance(kept, dict):
        if not isinstance(new, dict) or new.keys() != kept.keys():
            raise mismatch(f"a {type(new).__name__}" + (
                f" with keys {sorted(map(str, new))}" if isinstance(new, dict) else ""))
        return {key: _copy_into(old, new[key], f"{where}[{key!r}]") for key, old in kept.items()}
    elif isinstance(kept, np.generic) and isinstance(new, np.generic):
        return new  # a NumPy 0-d result: a value, as computed
    else:  # a Python value, frozen as a recording freezes it
        return kept
    if source is not target:
        backend = backend_of(target)
        assert backend is not None
        backend.call(backend.xp.copyto, target, source)
    return result


def _fresh(backend: Backend, result: Any) -> Any:
    """The recorded outputs with each GPUScalar re-wrapped: the graph rewrote its buffer, so a
    value read (and cached) after an earlier replay must not be returned again."""
    if isinstance(result, GPUScalar):
        return _wrap(backend, _array_of(result))
    if isinstance(result, (tuple, list)):
        return _rebuilt(result, [_fresh(backend, r) for r in result])
    if isinstance(result, dict):
        return {key: _fresh(backend, value) for key, value in result.items()}
    return result


def _while_raising(error: BaseException, cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` while ``error`` is on its way: a cleanup failure is attached to it as a
    note, never raised in its place."""
    try:
        cleanup()
    except Exception as failure:  # noqa: BLE001 - the user's error is the one to raise
        if hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(f"(gs.capture cleanup also failed: {type(failure).__name__}: "
                           f"{failure})")


# ---- what a recorded graph owns on the GPU ------------------------------------------------------


class _GraphResources:
    """A recorded step's graph, private stream (and the cuBLAS handle bound to it) and private
    memory pool: released together, and never while a recording is under way (freeing device
    memory or destroying a cuBLAS handle synchronizes, which would invalidate it)."""

    __slots__ = ("device", "stream", "pool", "graph", "seam")
    # CuPy objects (CuPy ships no types): the stream and pool until closed, the graph once
    # recorded; None otherwise
    stream: Any
    pool: Any
    graph: Any

    def __init__(self, device: object, stream: Any, pool: Any) -> None:
        self.device, self.stream, self.pool, self.graph = device, stream, pool, None
        self.seam = CUPY.seam  # released through the seam that made them, whenever that is

    def close(self) -> None:
        stream, pool = self.stream, self.pool
        self.graph = self.stream = self.pool = None  # a graph still running finishes first
        if stream is None:
            return
        with self.seam.device_context(self.device):
            # the last replay has finished before its memory is freed (a wait, not a value read:
            # not CuPy's Device.synchronize, which declares a sync to a guard that may be on)
            self.seam.device_wait()
            linalg.release_stream(stream.ptr)
            pool.free_all_blocks()


_release_lock = threading.RLock()  # re-entrant: a finalizer may run while this thread holds it
_deferred: list[_GraphResources] = []


def _release(resources: _GraphResources) -> None:
    """Release now, or when the recordings under way (`ledger.recordings_under_way`) end."""
    with _release_lock:
        if ledger.recordings_under_way():
            _deferred.append(resources)
        else:
            resources.close()


@contextlib.contextmanager
def _recording() -> Iterator[None]:
    with _release_lock:  # the count changes only under this lock (see _release)
        ledger.note_recording(+1)
    try:
        yield
    finally:
        with _release_lock:
            under_way = ledger.note_recording(-1)
            waiting = _deferred[:] if under_way == 0 else []
            del _deferred[: len(waiting)]
        for resources in waiting:
            try:
                resources.close()
            except Exception as failure:  # noqa: BLE001 - a finalizer's failure, reported
                warnings.warn(f"gs.capture: releasing a captured step failed: {failure}",
                              RuntimeWarning, stacklevel=3)


def _end_abandoned(stream: Any) -> None:
    """End ``stream``'s capture and destroy the partial graph, without instantiating it. An
    invalidated capture reports an error here, and the stream has left capture mode anyway."""
    CUPY.seam.end_abandoned_capture(stream)


def _pointed(error: BaseException) -> BaseException | None:
    """CuPy's refusal of cuBLAS or of a host-to-device copy inside a capture, as an error that
    says what to do instead; None for any other error."""
    if isinstance(error, NotImplementedError) and _CUBLAS_REFUSAL in str(error):
        return NotImplementedError(
            f"{error}: CuPy cannot call cuBLAS while a graph is captured (x @ w, "
            "cupy.matmul, cupy.dot ...); use gs.matmul(a, b, out=...) in a captured step"
        )
    if isinstance(error, RuntimeError) and _UPLOAD_REFUSAL in str(error):
        return RuntimeError(
            f"{error}: a captured step cannot copy host data to the device (xp.asarray of a "
            "host array or list, x.set(host), host index arrays); make and upload arrays "
            "before capturing, and write new inputs into the step's buffers between replays "
            "(x[...] = device_batch)"
        )
    return None


def _record(stream: Any, body: Callable[[], Any]) -> tuple[Any, Any]:
    """``body()`` recorded on ``stream``: (the graph, what body returned). On any error the
    capture is ended and discarded and the error re-raised (CuPy's refusals of cuBLAS and of
    host-to-device copies saying what to do instead)."""
    stream.begin_capture()
    try:
        result = body()
    except BaseException as error:
        _while_raising(error, lambda: _end_abandoned(stream))
        pointed = _pointed(error)
        if pointed is not None:
            raise pointed from error
        raise
    return stream.end_capture(), result


def _stream_capturing(device: object) -> bool:
    """Whether CuPy's current stream on ``device`` is capturing: a step called while another
    graph is being recorded (`gs.capture`'s, or the caller's own capture)."""
    with CUPY.device_context(device):
        return bool(CUPY.seam.current_stream().is_capturing())


def _released_step(*args: Any) -> Any:
    """What a released `CapturedStep` holds instead of the user's function (never called: a
    released step refuses to run before reaching it)."""
    raise RuntimeError("gs.capture: this CapturedStep was released; capture it again")


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
        self.backend, self.device = _placement(fn, args)
        _refuse_nested_recording()
        self._fn, self._args = fn, args
        self._name = getattr(fn, "__name__", "fn")
        self._result: Any = None
        self._outputs = _StaticOutputs()  # the buffers a replay returns on NumPy / strict
        self._resources: _GraphResources | None = None
        self._released = False
        if self.backend is CUPY:
            self._record_on_cupy()
        else:
            with _guarded(self.backend, recording=True):
                for _ in range(self.warmup):
                    fn(*args)

    def _run_recorded_steps(self) -> Any:
        result = None
        with sync.graph_body():
            for _ in range(self.steps):
                result = self._fn(*self._args)
            return _materialized(self.backend, result)

    def _record_on_cupy(self) -> None:
        seam = CUPY.seam
        with CUPY.device_context(self.device):
            current = seam.current_stream()
            if current.is_capturing():
                raise RuntimeError("gs.capture: the current stream is already capturing")
            resources = _GraphResources(self.device, seam.new_stream(), seam.new_memory_pool())
            self._resources = resources
            self._finalizer = weakref.finalize(self, _release, resources)
            stream = resources.stream
            try:
                # the step's inputs may still be being written on the current stream
                stream.wait_event(current.record())
                with stream, seam.using_allocator(resources.pool.malloc):
                    with _guarded(CUPY, recording=True):
                        for _ in range(self.warmup):
                            # a returned pending GPUScalar is evaluated here too, so its kernel
                            # is compiled before recording (recording then compiles nothing)
                            _materialized(CUPY, self._fn(*self._args))
                    # what gs.matmul would otherwise make while recording: alpha/beta constants
                    # and this stream's cuBLAS handle, when no warm-up ran (it would have made
                    # it) or the program multiplies somewhere (a captured step called in fn
                    # runs inline while recording, on this stream, after warming up elsewhere)
                    linalg.prepare(CUPY, self.device, stream,
                                   handle=self.warmup == 0 or linalg.handles_made())
                    stream.synchronize()  # warm-up done (outside the guard: an intended wait)
                    with _guarded(CUPY, recording=True), _recording():
                        graph, result = _record(stream, self._run_recorded_steps)
                graph.upload(stream)
                # replays are launched on the caller's stream, which is not ordered after this
                # one: the upload has finished before the first replay
                stream.synchronize()
            except BaseException as error:
                self._released = True
                _while_raising(error, self._finalizer)  # stream, pool, cuBLAS handle: freed
                raise
        resources.graph, self._result = graph, result

    def __call__(self) -> Any:
        """Replay the step: one graph launch (on NumPy, ``steps`` calls of fn under the sync
        guard, counted as one device op); returns the step's outputs, the same buffers at
        every replay (a GPUScalar as a fresh GPUScalar over its buffer)."""
        if self._released:
            raise RuntimeError("gs.capture: this CapturedStep was released; capture it again")
        sync.note_graph_replay()
        resources = self._resources  # not None exactly when the step was recorded on CuPy
        if resources is not None and not _stream_capturing(self.device):
            graph = resources.graph
            with CUPY.device_context(self.device), sync.one_device_op():
                graph.launch()  # on the current stream: ordered with the caller's work
            return _fresh(self.backend, self._result)
        return self._run_inline()

    def _run_inline(self) -> Any:
        """``steps`` calls of fn under the sync guard, as one counted device op: the replay on
        NumPy and the strict device, and on CuPy a call while another graph is being recorded
        (launching a graph into a capturing stream is not reliable; the steps' kernels are
        recorded into the outer graph instead)."""
        result = None
        place = (CUPY.device_context(self.device) if self.backend is CUPY
                 else contextlib.nullcontext())
        try:
            with place, _guarded(self.backend, recording=False), sync.one_device_op(), (
                sync.graph_body()
            ):
                for _ in range(self.steps):
                    result = self._fn(*self._args)
                if self.backend is CUPY:  # inside another recording: this one's buffers
                    result = _materialized(self.backend, result)
                else:  # the same buffers at every replay, as a graph's
                    result = self._outputs.keep(self.backend, result)
        except (NotImplementedError, RuntimeError) as error:
            pointed = _pointed(error)
            if pointed is None:
                raise
            raise pointed from error
        return result

    def release(self) -> None:
        """Free the graph, the private stream and memory pool (temporaries; outputs you still
        hold stay valid). A released step cannot be replayed. The step's function and arguments
        are dropped too, so whatever they hold (arrays, closures) can be freed."""
        self._released = True
        self._result = None
        self._outputs = _StaticOutputs()
        self._fn, self._args = _released_step, ()
        if self._resources is not None:
            self._finalizer()

    @property
    def released(self) -> bool:
        return self._released

    def __repr__(self) -> str:
        state = "released" if self._released else "ready"
        kind = "CUDA graph" if self.backend is CUPY else f"{self.backend.name}, re-run"
        return (f"<gpuscalar CapturedStep {self._name}: "
                f"{self.steps} step(s), {kind}, {state}>")
