"""`gs.while_loop` and `gs.cond` on CuPy: CUDA conditional graph nodes, or a counted fallback.

Why this module exists: it is CuPy's "loops" executor (`CudaLoops`, the protocol
`gpuscalar.control.Loops`). CUDA 12.3+ graphs have conditional nodes (IF, WHILE) whose body graph
runs while a device-side flag says so, set by a kernel calling ``cudaGraphSetConditional``. A
whole solve becomes one launch and no sync. No released CuPy has an API for them; the mechanism
needs only the stream handle and NVIDIA's ``cuda-bindings`` (``cuda.bindings.runtime``):
``cudaStreamGetCaptureInfo`` -> ``cudaGraphConditionalHandleCreate`` -> ``cudaGraphAddNode``
(WHILE or IF) -> ``cudaStreamUpdateCaptureDependencies`` -> the body captured on a second stream
with ``cudaStreamBeginCaptureToGraph`` into the node's body graph. Everything that reaches CUDA
goes through `CudaSeam` (``conditional_nodes_unavailable``), so tests can stand in for it.

Where conditional nodes are unavailable (driver older than 12.3, ``cuda-bindings`` missing, or
a reason the seam gives) a call outside a capture falls back to a host loop with
one counted sync per predicate read, and warns once naming the reason; inside a capture (the
current stream records a graph) it is an error naming the reason, since a capture cannot read
the predicate on the host. The fallback checks what a recording would: a body whose loop runs
zero times, and the branch not taken, are recorded into a graph that is discarded unlaunched
(`_check_recorded`: nothing runs), and loops and branches nested there are checked the same way.

A body returning the new state (`bodies.commit`) has the copies into the state's buffers
recorded at the end of the body graph, before the condition kernel.

The condition kernel (`CONDITION_SOURCE`) is compile-checked with NVRTC in CI.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import ledger, sync
from ...bodies import (
    body_rules,
    check_returned_none,
    checking,
    commit,
    marked_checking,
    predicate_array,
)
from ...scalar import GPUScalar, _make_array, _wrap
from . import graphs, linalg
from .backend import CUPY, CupyBackend

__all__ = ["CONDITION_SOURCE", "CONDITION_KERNEL", "CudaLoops", "while_loop", "cond"]

#: The kernel that hands the device's decision to a conditional node ``h``: ``f`` is the
#: predicate (0-d bool; ``i`` nonzero takes its negation, for the else branch of `cond`),
#: ``n``/``lim`` bound a WHILE loop (``lim < 0``: no bound). The handle is a 64-bit argument.
#: ``cudaGraphSetConditional`` is declared as ``cuda_device_runtime_api.h`` declares it (CUDA
#: 12.3+): that header includes ``crt/host_defines.h``, which the nvidia-cuda-runtime wheels do
#: not ship, so NVRTC could not compile it in CI. NVRTC compiles this to an sm_90 cubin without
#: ``-rdc`` (CI checks that); that the driver resolves the call when loading it, only a GPU shows.
CONDITION_KERNEL = "gs_condition"
CONDITION_SOURCE = r"""
extern "C" __device__ __attribute__((cudart_builtin)) void cudaGraphSetConditional(
        unsigned long long handle, unsigned int value);

extern "C" __global__
void gs_condition(unsigned long long h, const bool* f, int i, const long long* n, long long lim) {
    bool go = (*f != (i != 0)) && (lim < 0 || *n < lim);
    cudaGraphSetConditional(h, go ? 1u : 0u);
}
"""

_warned_lock = threading.Lock()
_warned = False


def _warn_once(what: str, reason: str) -> None:
    global _warned
    with _warned_lock:
        if _warned:
            return
        _warned = True
    warnings.warn(
        f"gs.{what}: CUDA conditional graph nodes are unavailable ({reason}); running a host "
        "loop with one sync per predicate read instead",
        RuntimeWarning,
        stacklevel=4,
    )


def _fallback_reason(what: str, device: object) -> str | None:
    """Why this call cannot record conditional nodes (None: it can). Inside a capture, a
    missing feature is an error: the predicate cannot be read on the host there."""
    reason = CUPY.seam.conditional_nodes_unavailable()
    if reason is None:
        return None
    with CUPY.device_context(device):
        capturing = bool(CUPY.seam.current_stream().is_capturing())
    if capturing:
        raise RuntimeError(
            f"gs.{what} inside a CUDA graph capture needs conditional graph nodes, which are "
            f"unavailable: {reason}"
        )
    _warn_once(what, reason)
    return reason


# ---- recording conditional nodes ----------------------------------------------------------------

_INT64 = np.dtype(np.int64)
_streams_lock = threading.Lock()
#: (device, nesting depth) -> the stream a body is recorded on (depth -1: a loop's own graph):
#: kept for the process (a few streams), so a body's cuBLAS handle is made once, before any
#: recording needs it
_body_streams: dict[tuple[object, int], Any] = CUPY.seam_cache({})
_depth = threading.local()
#: graphs launched outside a capture, with what they use, until the device is done with them
_launched: list[tuple[Any, Any, Any]] = []


#: How deep loops and branches may nest with their body streams (and their cuBLAS handles)
#: made before any recording: a stream exists only once made, and a body is recorded on its
#: stream during the capture, when nothing may be allocated (a cuBLAS handle's workspace)
PREPARED_DEPTH = 4


def _body_stream(device: object, depth: int) -> Any:
    """The stream a body at nesting ``depth`` is recorded on (made once, with its cuBLAS
    handle and constants, by `_prepare_bodies` before any recording)."""
    with _streams_lock:
        stream = _body_streams.get((device, depth))
        if stream is None:
            stream = _body_streams[(device, depth)] = CUPY.seam.new_stream()
            made = True
        else:
            made = False
    if made and not CUPY.seam.current_stream().is_capturing():
        linalg.prepare(CUPY, device, stream, handle=True)
    return stream


def _prepare_bodies(device: object) -> None:
    """Make the body streams of every nesting depth up to `PREPARED_DEPTH`, each with its cuBLAS
    handle (so `gs.matmul` in a body finds it), before the first recording: inside a capture
    they could not be prepared. Called where no stream captures (a loop outside a capture, and
    the warm-up of `gs.capture`, which runs loops that way)."""
    for depth in range(-1, PREPARED_DEPTH):
        _body_stream(device, depth)


def _set_conditional(handle: int, flag: Any, invert: bool, count: Any, limit: int) -> None:
    """Launch the condition kernel: the node ``handle`` runs (again) iff ``flag`` (negated
    with ``invert``) holds and ``count < limit`` (``limit < 0``: always)."""
    CUPY.launch_kernel(CONDITION_SOURCE, CONDITION_KERNEL, 1,
                       (np.uint64(handle), flag, np.int32(invert), count, np.int64(limit)),
                       grid=1, block=1)


def _record_node(kind: str, handle: int, device: object, body: Callable[[], None]) -> None:
    """Add a ``kind`` conditional node for ``handle`` to the graph the current stream records,
    and record ``body()`` into the node's body graph on a stream of its own."""
    seam = CUPY.seam
    stream = seam.current_stream()
    depth = getattr(_depth, "value", 0)
    inner = _body_stream(device, depth)
    body_graph = seam.add_conditional_node(stream, handle, kind)
    seam.begin_capture_into(inner, body_graph)
    _depth.value = depth + 1
    try:
        with inner:
            body()
    except BaseException:
        seam.end_capture_into(inner)
        raise
    finally:
        _depth.value = depth
    seam.end_capture_into(inner)


def _record_while(cond_fn: Callable[..., Any], body: Callable[..., Any], state: tuple[Any, ...],
                  max_iter: int, device: object, count: Any) -> None:
    seam = CUPY.seam
    stream = seam.current_stream()
    with body_rules(CUPY):
        flag = predicate_array(cond_fn(*state), CUPY, "while_loop")
    handle = seam.conditional_handle(stream)
    _set_conditional(handle, flag, False, count, max_iter)

    def iteration() -> None:
        with body_rules(CUPY):
            commit(body(*state), state, CUPY)
            CUPY.call(CUPY.xp.add, count, 1, out=count)
            again = predicate_array(cond_fn(*state), CUPY, "while_loop")
        _set_conditional(handle, again, False, count, max_iter)

    _record_node("while", handle, device, iteration)


def _record_cond(pred: Any, true_fn: Callable[..., Any] | None,
                 false_fn: Callable[..., Any] | None, operands: tuple[Any, ...],
                 device: object) -> None:
    """Two IF nodes, the second on the negated predicate (IF-with-else needs CUDA 12.8); both
    conditions are set before either branch runs (a branch may write the predicate's array)."""
    seam = CUPY.seam
    stream = seam.current_stream()
    with body_rules(CUPY):
        flag = predicate_array(pred, CUPY, "cond")
    unused = CUPY.call(CUPY.xp.zeros, (), dtype=_INT64)  # the count an IF node never reads
    branches = []
    for branch, name, invert in ((true_fn, "true_fn", False), (false_fn, "false_fn", True)):
        if branch is not None:
            handle = seam.conditional_handle(stream)
            _set_conditional(handle, flag, invert, unused, -1)
            branches.append((handle, branch, name))
    for handle, branch, name in branches:

        def run(branch: Callable[..., Any] = branch, name: str = name) -> None:
            with body_rules(CUPY):
                check_returned_none(branch(*operands), "cond", name)

        _record_node("if", handle, device, run)


def _reap() -> None:
    """Release what finished graphs used (an event query: no wait, no value read)."""
    with _streams_lock:
        done = [entry for entry in _launched if entry[0].done]
        _launched[:] = [entry for entry in _launched if entry not in done]
    for _, _, pool in done:
        pool.free_all_blocks()


def _run_recorded(device: object, record: Callable[[], None]) -> None:
    """``record()`` into the graph of the current capture; outside one, into a graph of its
    own, launched once on the current stream and released when the device is done with it."""
    seam = CUPY.seam
    with CUPY.device_context(device), ledger.one_device_op():
        current = seam.current_stream()
        if current.is_capturing():
            record()
            return
        _reap()
        _prepare_bodies(device)
        stream, pool = _body_stream(device, -1), seam.new_memory_pool()
        stream.wait_event(current.record())
        with stream, seam.using_allocator(pool.malloc), graphs._recording():
            stream.begin_capture()  # (no release may free what the graph reads meanwhile)
            try:
                record()
            except BaseException:
                seam.end_abandoned_capture(stream)
                raise
            graph = stream.end_capture()
        graph.launch(current)
        with _streams_lock:
            _launched.append((current.record(), graph, pool))


# ---- checks: recorded, never launched ----------------------------------------------------------


def _check_recorded(device: object, run: Callable[[], None]) -> None:
    """``run()`` recorded into a graph that is discarded unlaunched: the check a recording makes
    (no sync, no upload, the body's result's form), with nothing run and nothing counted. On a
    stream that records already (a check nested in one), ``run()`` is recorded there."""
    seam = CUPY.seam
    with CUPY.device_context(device), ledger.one_device_op(count=False), marked_checking():
        if seam.current_stream().is_capturing():
            run()
            return
        _prepare_bodies(device)
        stream, pool = _body_stream(device, -1), seam.new_memory_pool()
        with stream, seam.using_allocator(pool.malloc), graphs._recording():
            stream.begin_capture()
            try:
                run()
            finally:
                seam.end_abandoned_capture(stream)
    pool.free_all_blocks()


def _checked_body(body: Callable[..., Any], state: tuple[Any, ...]) -> None:
    with body_rules(CUPY):
        commit(body(*state), state, CUPY)


def _checked_branch(branch: Callable[..., Any], name: str, operands: tuple[Any, ...]) -> None:
    with body_rules(CUPY):
        check_returned_none(branch(*operands), "cond", name)


def _check_while(cond_fn: Callable[..., Any], body: Callable[..., Any],
                 state: tuple[Any, ...]) -> None:
    with body_rules(CUPY):
        predicate_array(cond_fn(*state), CUPY, "while_loop")
    _checked_body(body, state)


def _check_cond(pred: Any, true_fn: Callable[..., Any] | None,
                false_fn: Callable[..., Any] | None, operands: tuple[Any, ...]) -> None:
    with body_rules(CUPY):
        predicate_array(pred, CUPY, "cond")
    for branch, name in ((true_fn, "true_fn"), (false_fn, "false_fn")):
        if branch is not None:
            _checked_branch(branch, name, operands)


# ---- the entry points ---------------------------------------------------------------------------


def _read(value: Any, what: str, reason: str) -> bool:
    """The predicate on the host: one counted sync (the fallback's price)."""
    array = predicate_array(value, CUPY, what)
    return bool(sync.to_host(CUPY, array, f"{what} predicate (fallback: {reason})"))


def while_loop(cond_fn: Callable[..., Any], body: Callable[..., Any], state: tuple[Any, ...],
               max_iter: int, device: object) -> GPUScalar:
    """`gs.while_loop` on CuPy (arguments checked by `gpuscalar.control.while_loop`)."""
    if checking():  # nested in a check: recorded and discarded, its count never read
        _check_recorded(device, lambda: _check_while(cond_fn, body, state))
        with CUPY.device_context(device):
            return _wrap(CUPY, CUPY.call(CUPY.xp.zeros, (), dtype=_INT64))
    reason = _fallback_reason("while_loop", device)
    with CUPY.device_context(device):
        if reason is None:
            with ledger.one_device_op():  # the count's fill (before the graph) and the graph
                count = CUPY.call(CUPY.xp.zeros, (), dtype=_INT64)
                _run_recorded(device, lambda: _record_while(cond_fn, body, state, max_iter,
                                                            device, count))
            return _wrap(CUPY, count)
        done = 0
        while done < max_iter:
            with body_rules(CUPY):
                decision = cond_fn(*state)
            if not _read(decision, "while_loop", reason):
                break
            _checked_body(body, state)
            done += 1
        if done == 0:  # a recording checks the body whatever the predicate says
            _check_recorded(device, lambda: _checked_body(body, state))
        return _wrap(CUPY, _make_array(CUPY, done, _INT64, device))


def cond(pred: Any, true_fn: Callable[..., Any] | None, false_fn: Callable[..., Any] | None,
         operands: tuple[Any, ...], device: object) -> None:
    """`gs.cond` on CuPy (arguments checked by `gpuscalar.control.cond`)."""
    if checking():
        _check_recorded(device, lambda: _check_cond(pred, true_fn, false_fn, operands))
        return
    reason = _fallback_reason("cond", device)
    if reason is None:
        _run_recorded(device, lambda: _record_cond(pred, true_fn, false_fn, operands, device))
        return
    with CUPY.device_context(device):
        taken = _read(pred, "cond", reason)
        branches = ((true_fn, "true_fn", taken), (false_fn, "false_fn", not taken))
        for branch, name, runs in branches:
            if branch is not None and not runs:  # recorded and discarded, before the other
                _check_recorded(device, functools.partial(_checked_branch, branch, name,
                                                          operands))
        for branch, name, runs in branches:
            if branch is not None and runs:
                _checked_branch(branch, name, operands)


class CudaLoops:
    """CuPy's "loops" executor (`gpuscalar.control.Loops`): conditional nodes, or the fallback."""

    def __init__(self, backend: CupyBackend) -> None:
        self.backend = backend

    def default_device(self) -> object:
        return self.backend.seam.current_device()

    def while_loop(self, cond_fn: Callable[..., Any], body: Callable[..., Any],
                   state: tuple[Any, ...], max_iter: int, device: object) -> GPUScalar:
        return while_loop(cond_fn, body, state, max_iter, device)

    def cond(self, pred: Any, true_fn: Callable[..., Any] | None,
             false_fn: Callable[..., Any] | None, operands: tuple[Any, ...],
             device: object) -> None:
        cond(pred, true_fn, false_fn, operands, device)
