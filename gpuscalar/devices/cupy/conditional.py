"""CUDA conditional graph nodes through NVIDIA's ``cuda-bindings``: the runtime calls alone.

Why this module exists: `gs.while_loop`/`gs.cond` (`gpuscalar.devices.cupy.control`) record WHILE
and IF nodes, which no released CuPy binds. These are the handful of CUDA runtime calls that takes
(``cudaStreamGetCaptureInfo``, ``cudaGraphConditionalHandleCreate``, ``cudaGraphAddNode``,
``cudaStreamUpdateCaptureDependencies``, ``cudaStreamBeginCaptureToGraph``), by stream handle. It
imports nothing of gpuscalar's, as `gpuscalar.devices.cupy.cublas` does, so the one seam
(`backend.CudaSeam`) can call it without an import circle; the bindings' 12.x names carry
``_v2``-style forms that 13.x drops, so each call branches on the bindings' major version.
"""

from __future__ import annotations

from typing import Any

__all__ = ["conditional_handle", "add_conditional_node", "begin_capture_into",
           "end_capture_into"]


def _runtime() -> tuple[Any, int]:
    """``cuda.bindings.runtime`` and the bindings' major version (12 or 13)."""
    import cuda.bindings  # noqa: PLC0415 - optional: the cuda12/cuda13 extras
    from cuda.bindings import runtime  # noqa: PLC0415

    return runtime, int(str(cuda.bindings.__version__).split(".")[0])


def _ok(result: Any, what: str) -> Any:
    """The values of a cuda-bindings call's ``(error, *values)``; an error raises naming it."""
    error, *values = result if isinstance(result, tuple) else (result,)
    runtime, _ = _runtime()
    if error != runtime.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{what} failed: {error!r}")
    return values


def _capture_graph(stream_ptr: int) -> tuple[Any, list[Any]]:
    """The graph ``stream_ptr`` captures into and its current dependencies (12.x:
    ``cudaStreamGetCaptureInfo`` without edge data; 13.x: with, in the 7-tuple)."""
    runtime, _ = _runtime()
    values = _ok(runtime.cudaStreamGetCaptureInfo(stream_ptr), "cudaStreamGetCaptureInfo")
    status, graph, dependencies = values[0], values[2], values[3]
    if status != runtime.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive:
        raise RuntimeError("gs.while_loop/gs.cond: the stream is not capturing")
    return graph, list(dependencies or [])


def conditional_handle(stream_ptr: int) -> int:
    """A conditional handle (default 0) in the graph ``stream_ptr`` captures into."""
    runtime, _ = _runtime()
    graph, _ = _capture_graph(stream_ptr)
    (handle,) = _ok(runtime.cudaGraphConditionalHandleCreate(graph, 0, 0),
                    "cudaGraphConditionalHandleCreate")
    return int(handle)


def add_conditional_node(stream_ptr: int, handle: int, kind: str) -> Any:
    """A ``kind`` ("while" or "if") node for ``handle`` after the stream's current
    dependencies, made its only dependency; returns the node's body graph."""
    runtime, major = _runtime()
    graph, dependencies = _capture_graph(stream_ptr)
    params = runtime.cudaGraphNodeParams()
    params.type = runtime.cudaGraphNodeType.cudaGraphNodeTypeConditional
    params.conditional.handle = handle
    params.conditional.type = (runtime.cudaGraphConditionalNodeType.cudaGraphCondTypeWhile
                               if kind == "while" else
                               runtime.cudaGraphConditionalNodeType.cudaGraphCondTypeIf)
    params.conditional.size = 1
    count = len(dependencies)
    if major >= 13:  # 13.x: the node names its execution context; the edge-data forms lost
        # their _v2 suffix. (12.x has no ctx: the context current when the graph is launched)
        params.conditional.ctx = _execution_context(runtime)
        added = runtime.cudaGraphAddNode(graph, dependencies, None, count, params)
        update = runtime.cudaStreamUpdateCaptureDependencies(
            stream_ptr, _ok(added, "cudaGraphAddNode"), None, 1,
            runtime.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies)
    else:
        added = runtime.cudaGraphAddNode(graph, dependencies, count, params)
        update = runtime.cudaStreamUpdateCaptureDependencies(
            stream_ptr, _ok(added, "cudaGraphAddNode"), 1,
            runtime.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies)
    _ok(update, "cudaStreamUpdateCaptureDependencies")
    return params.conditional.phGraph_out[0]


def _execution_context(runtime: Any) -> Any:
    """The current device's execution context (its primary context), which CUDA 13's
    ``cudaConditionalNodeParams.ctx`` must name (left empty, the node has no context)."""
    (device,) = _ok(runtime.cudaGetDevice(), "cudaGetDevice")
    (context,) = _ok(runtime.cudaDeviceGetExecutionCtx(device), "cudaDeviceGetExecutionCtx")
    return context


def begin_capture_into(stream_ptr: int, graph: Any) -> None:
    """Capture ``stream_ptr`` into ``graph`` (a conditional node's body), relaxed mode."""
    runtime, _ = _runtime()
    _ok(runtime.cudaStreamBeginCaptureToGraph(
        stream_ptr, graph, None, None, 0,
        runtime.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed),
        "cudaStreamBeginCaptureToGraph")


def end_capture_into(stream_ptr: int) -> None:
    """End a capture begun by `begin_capture_into` (the body graph belongs to its node)."""
    runtime, _ = _runtime()
    _ok(runtime.cudaStreamEndCapture(stream_ptr), "cudaStreamEndCapture")
