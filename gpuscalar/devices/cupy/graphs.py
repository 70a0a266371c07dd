"""`gs.capture` on CuPy: a sync-free step recorded once as a CUDA graph, replayed with one launch.

Why this module exists: it is CuPy's "graphs" executor (`gpuscalar.capture.Graphs`), the device
side of `gs.capture` (whose front, `gpuscalar.capture`, checks the arguments, places the step and
guards it). A step is warmed up and recorded on a private stream with a private memory pool (the
stream's cuBLAS handle made before recording, where nothing may be allocated); calling it
launches the graph on the caller's current stream. Any error ends the capture cleanly (stream out
of capture mode, partial graph discarded, stream and allocator restored) and the user's error is
raised, never a cleanup error. A step called while another graph is being recorded (the current
stream captures) runs its ``fn`` inline, so its kernels are recorded into the outer graph
(launching a graph into a capturing stream is not reliable). What a recorded graph owns (graph,
stream, pool, cuBLAS handle) is released together, and never while a recording is under way
(`_recording`, which `gpuscalar.devices.cupy.control` enters too).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ... import ledger, sync
from ...capture import CapturedStep, _fresh, _guarded, _materialized, _pointed, _while_raising
from . import linalg
from .backend import CUPY, CupyBackend

__all__ = ["CudaGraphs"]


class CudaGraphs:
    """CuPy's "graphs" executor (`gpuscalar.capture.Graphs`): steps recorded as CUDA graphs."""

    form = "CUDA graph"

    def __init__(self, backend: CupyBackend) -> None:
        self.backend = backend

    def default_device(self) -> object:
        return self.backend.seam.current_device()

    def library_syncs(self) -> contextlib.AbstractContextManager[Any]:
        """CuPy's own syncs (``float(x)``, ``x.get()``, ...) through its hook."""
        return sync.count_syncs(include_cupy=True)

    def record(self, step: CapturedStep) -> _CudaRecording:
        return _CudaRecording(step)


class _CudaRecording:
    """A step's CUDA graph (`gpuscalar.capture.Recording`): warmed up and recorded when made,
    its graph, stream, pool and cuBLAS handle released by `release` or when the step is
    collected (a finalizer on the step, which it does not hold)."""

    __slots__ = ("resources", "result", "finalizer")

    def __init__(self, step: CapturedStep) -> None:
        seam = CUPY.seam
        with CUPY.device_context(step.device):
            current = seam.current_stream()
            if current.is_capturing():
                raise RuntimeError("gs.capture: the current stream is already capturing")
            resources = _GraphResources(step.device, seam.new_stream(), seam.new_memory_pool())
            self.resources = resources
            self.finalizer = weakref.finalize(step, _release, resources)
            stream = resources.stream
            try:
                # the step's inputs may still be being written on the current stream
                stream.wait_event(current.record())
                with stream, seam.using_allocator(resources.pool.malloc):
                    # a returned pending GPUScalar is evaluated in the warm-up too, so its
                    # kernel is compiled before recording (recording then compiles nothing)
                    step.warm_up(materialize=True)
                    # what gs.matmul would otherwise make while recording: alpha/beta constants
                    # and this stream's cuBLAS handle, when no warm-up ran (it would have made
                    # it) or the program multiplies somewhere (a captured step called in fn
                    # runs inline while recording, on this stream, after warming up elsewhere)
                    linalg.prepare(CUPY, step.device, stream,
                                   handle=step.warmup == 0 or linalg.handles_made())
                    stream.synchronize()  # warm-up done (outside the guard: an intended wait)
                    with _guarded(CUPY, recording=True), _recording():
                        graph, result = _record(stream, step.run_recorded_steps)
                graph.upload(stream)
                # replays are launched on the caller's stream, which is not ordered after this
                # one: the upload has finished before the first replay
                stream.synchronize()
            except BaseException as error:
                _while_raising(error, self.finalizer)  # stream, pool, cuBLAS handle: freed
                raise
        resources.graph, self.result = graph, result

    def replay(self, step: CapturedStep) -> Any:
        """One graph launch on the current stream (ordered with the caller's work); inside
        another recording, ``fn`` inline, its kernels recorded into the outer graph."""
        if not _stream_capturing(step.device):
            graph = self.resources.graph
            with CUPY.device_context(step.device), sync.one_device_op():
                graph.launch()  # on the current stream: ordered with the caller's work
            return _fresh(CUPY, self.result)
        # inside another recording: this one's buffers
        return step.run_inline(CUPY.device_context(step.device),
                               lambda result: _materialized(CUPY, result))

    def release(self) -> None:
        self.result = None
        self.finalizer()


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
