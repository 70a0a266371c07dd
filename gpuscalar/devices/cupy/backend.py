"""The CuPy device's backend: `CupyBackend` and `CudaSeam`, the ONE object through which
gpuscalar's CuPy code reaches CUDA.

Why this module exists: it is the root of the CuPy wing (`gpuscalar.devices.cupy`). CuPy is
never imported by `import gpuscalar`; a CuPy array is recognised by looking in `sys.modules`,
as array-api-compat does, because a user who holds a CuPy array has already imported CuPy.

Every place gpuscalar reaches CUDA (kernel and function launches, device->host reads,
host->device copies, device contexts, streams, graph capture, kernel compilation) goes through
ONE object, `CudaSeam`, held by `CUPY.seam`. Why: CI has no GPU, and a test double that stands
for the device must replace one seam, not CuPy's many entry points (``tests/cupy_seam.py``
records every launch there and checks it against what CuPy accepts). Swap it for a block with
``with CUPY.seam_replaced(double): ...``.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from ... import ledger
from ...backend import CUPY_UFUNC_KEYWORDS, Backend

__all__ = ["CudaSeam", "CupyBackend", "CUPY"]


#: CuPy's ``cupy.cuda.device.get_device_id``, bound at first use (`CudaSeam.is_current_device`)
_device_id_reader: Callable[[], int] | None = None


def _load_device_id_reader() -> Callable[[], int]:
    global _device_id_reader
    reader: Callable[[], int] = CUPY.xp.cuda.device.get_device_id
    _device_id_reader = reader
    return reader


#: `gpuscalar.devices.cupy.cublas.call`, once imported (a products' hot path: an import
#: statement per call costs more than the lookup; imported on first use, as the seam's other
#: CUDA modules)
_BLAS_CALL: Callable[..., Any] | None = None


def _blas_call() -> Callable[..., Any]:
    global _BLAS_CALL
    from . import cublas  # noqa: PLC0415 - on first use only

    _BLAS_CALL = cublas.call
    return _BLAS_CALL


class CudaSeam:
    """Every call by which gpuscalar's CuPy code reaches CUDA: the one seam a test double
    replaces (`CupyBackend.seam_replaced`), so tests without a GPU see, check and answer each
    launch, read, copy, stream and graph operation. This is the real one: each method is the
    plain CuPy call. Methods take CuPy objects and return what CuPy returns.

    Counting stays in `Backend.call`: under a replaced seam it calls ``launch`` once per
    counted device op; with this real seam it makes the plain call itself (no extra cost on
    the hot path). A gpuscalar function that composes several CuPy calls into one counted op
    takes ``xp`` as an argument, so a double can hand it a namespace of its own."""

    @staticmethod
    def _cupy() -> ModuleType:
        return CUPY.xp

    # ---- work on the device -------------------------------------------------------------------

    def launch(self, func: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
        """Run ``func(*args, **kwargs)``: a CuPy ufunc, ``ElementwiseKernel``, ``RawKernel``
        (``args`` = grid, block, kernel arguments), ``cupy`` function or array method, or a
        gpuscalar host evaluator."""
        return func(*args, **kwargs)

    def compile_kernel(self, source: str, name: str, options: tuple[str, ...]) -> Any:
        """A ``cupy.RawKernel`` for ``name`` in ``source`` (NVRTC compiles it on first launch)."""
        return self._cupy().RawKernel(source, name, options=options)

    def copy_to_host(self, array: Any) -> Any:
        """A 0-d device array's value on the host: a device->host copy (a sync). Only
        `CupyBackend.read_scalar` calls this (and only `sync.to_host` calls that)."""
        # ndarray.get() is CuPy's own single choke point for device->host copies.
        host = array.get()
        return host.item() if host.ndim == 0 else host

    def upload(self, array: Any, host: np.ndarray, stream: Any) -> None:
        """Copy NumPy ``host`` into the contiguous device ``array`` on ``stream``."""
        array.set(host, stream)

    # ---- devices and streams ------------------------------------------------------------------

    def device_context(self, device: object) -> Any:
        """A context manager making ``device`` (an id) current."""
        return self._cupy().cuda.Device(device)

    def current_device(self) -> int:
        """The current device's id."""
        return int(self._cupy().cuda.Device().id)

    def is_current_device(self, device: object) -> bool:
        """Whether ``device`` (an id) is this thread's current device, read without a
        ``Device`` object (CuPy's ``get_device_id``): the fold's check before it enters
        `device_context` (gpuscalar.devices.cupy.fusion.fold_on_cupy)."""
        get_id = _device_id_reader or _load_device_id_reader()
        return bool(device == get_id())

    def synchronize(self) -> None:
        """Wait for the current device (CuPy's ``Device.synchronize``: a declared sync)."""
        self._cupy().cuda.Device().synchronize()

    def device_wait(self) -> None:
        """Wait for the current device without declaring a sync (``cudaDeviceSynchronize``):
        for releasing memory, never for reading a value."""
        self._cupy().cuda.runtime.deviceSynchronize()

    def current_stream(self) -> Any:
        """CuPy's current stream on the current device."""
        return self._cupy().cuda.get_current_stream()

    def new_stream(self) -> Any:
        """A new non-blocking ``cupy.cuda.Stream``."""
        return self._cupy().cuda.Stream(non_blocking=True)

    def new_memory_pool(self) -> Any:
        """A new, private ``cupy.cuda.MemoryPool``."""
        return self._cupy().cuda.MemoryPool()

    def default_memory_pool(self) -> Any:
        """CuPy's default device memory pool."""
        return self._cupy().get_default_memory_pool()

    def using_allocator(self, malloc: Any) -> Any:
        """A context manager routing CuPy's allocations to ``malloc`` in this thread."""
        return self._cupy().cuda.using_allocator(malloc)

    # ---- asynchronous copies to pinned host memory (devices.cupy.metrics: gs.MetricLog) ----

    def pinned_empty(self, nbytes: int) -> np.ndarray:
        """A NumPy ``uint8`` array of ``nbytes`` in pinned (page-locked) host memory: where an
        asynchronous device->host copy can land while the host goes on."""
        memory = self._cupy().cuda.alloc_pinned_memory(int(nbytes))  # (cupyx.empty_pinned's way)
        return np.frombuffer(memory, np.uint8, int(nbytes))

    def new_event(self) -> Any:
        """A new ``cupy.cuda.Event`` without timing data (the cheapest to record and query)."""
        return self._cupy().cuda.Event(block=False, disable_timing=True)

    def record_event(self, event: Any, stream: Any) -> None:
        """Record ``event`` on ``stream``: it completes when the work queued there so far has."""
        event.record(stream)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """Enqueue a copy of ``nbytes`` from address ``src`` to ``dst`` on ``stream``
        (``cudaMemcpyAsync``, the direction read from the addresses: device to device, or
        device to pinned host memory). Nothing waits: an event recorded after it tells when it
        is done."""
        runtime = self._cupy().cuda.runtime
        runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDefault, stream.ptr)

    def event_done(self, event: Any) -> bool:
        """Whether ``event`` has completed (``cudaEventQuery``: a poll, never a wait)."""
        return bool(event.done)

    def event_wait(self, event: Any) -> None:
        """Block until ``event`` has completed (``cudaEventSynchronize``): a wait, not a value
        read; for releasing host buffers a copy may still write (values are read through
        `gpuscalar.sync.to_host`)."""
        event.synchronize()

    # ---- cuBLAS (devices.cupy.cublas: CuPy's own cuBLAS refuses a capturing stream) ------

    def blas_handle(self, stream: Any) -> Any:
        """A `gpuscalar.devices.cupy.cublas.Handle` bound to ``stream`` (device pointer mode, own
        workspace)."""
        from . import cublas  # noqa: PLC0415 - loads the cuBLAS library: only when multiplying

        return cublas.Handle(self._cupy().cuda.Memory, stream.ptr)

    def blas(self, routine: str, *args: Any) -> None:
        """Call cuBLAS ``routine`` (e.g. ``cublasSgemm_v2``) with ``args`` (a handle's value,
        integers and device pointers), as `gpuscalar.devices.cupy.cublas.call` does."""
        call = _BLAS_CALL or _blas_call()
        call(routine, *args)

    # ---- CUDA graphs --------------------------------------------------------------------------

    def end_abandoned_capture(self, stream: Any) -> None:
        """End ``stream``'s capture and destroy the partial graph without instantiating it."""
        runtime = self._cupy().cuda.runtime
        graph = runtime.streamEndCapture(stream.ptr)
        if graph:
            runtime.graphDestroy(graph)

    # ---- conditional graph nodes (devices.cupy.conditional, for gs.while_loop / gs.cond) ----

    def conditional_nodes_unavailable(self) -> str | None:
        """Why `gs.while_loop`/`gs.cond` cannot record CUDA conditional nodes here (None: they
        can): conditional nodes need a driver for CUDA 12.3+ and NVIDIA's ``cuda-bindings``."""
        version = int(self._cupy().cuda.runtime.driverGetVersion())
        if version < 12030:
            return f"the CUDA driver supports CUDA {version // 1000}.{version % 1000 // 10}, < 12.3"
        try:
            import cuda.bindings.runtime  # noqa: F401, PLC0415 - optional (the cuda12/13 extras)
        except ImportError:
            return "cuda-bindings is not installed (pip install gpuscalar[cuda12] or [cuda13])"
        return None

    def conditional_handle(self, stream: Any) -> int:
        """A new conditional handle in the graph that ``stream`` (capturing) records."""
        from . import conditional  # noqa: PLC0415 - cuda-bindings: only for these nodes

        return conditional.conditional_handle(stream.ptr)

    def add_conditional_node(self, stream: Any, handle: int, kind: str) -> Any:
        """Append a ``kind`` ("while" or "if") conditional node for ``handle`` to what
        ``stream`` records; returns the node's (empty) body graph."""
        from . import conditional  # noqa: PLC0415 - as above

        return conditional.add_conditional_node(stream.ptr, handle, kind)

    def begin_capture_into(self, stream: Any, graph: Any) -> None:
        """Start recording ``stream``'s work into ``graph`` (a conditional node's body)."""
        from . import conditional  # noqa: PLC0415 - as above

        conditional.begin_capture_into(stream.ptr, graph)

    def end_capture_into(self, stream: Any) -> None:
        """End the recording `begin_capture_into` started."""
        from . import conditional  # noqa: PLC0415 - as above

        conditional.end_capture_into(stream.ptr)

    # Streams themselves (``begin_capture``, ``end_capture``, ``record``, ``wait_event``,
    # ``synchronize``, ``is_capturing``) and graphs (``upload``, ``launch``) are CuPy objects the
    # seam hands out; a double hands out its own.


#: a CuPy array's device id and data address, fetched in C (`CupyBackend.devices_of`,
#: `data_addresses`): the optimizer checks and writes one per gradient array every step
_CUPY_DEVICE_ID = operator.attrgetter("data.device_id")
_CUPY_DATA_PTR = operator.attrgetter("data.ptr")


#: how the names of the gathering kernels (`stack_kernel`) begin
STACK_PREFIX = "gpuscalar_stack_"


@functools.lru_cache(maxsize=8)  # one per count of inputs, 1 to 8
def stack_kernel(count: int) -> Any:
    """The ``ElementwiseKernel`` writing ``count`` 0-d arrays (any dtypes, read through
    pointers) into the ``count`` elements of its output vector, each cast to its dtype."""
    inputs = ", ".join(f"raw {'ABCDEFGH'[k]} a{k}" for k in range(count))  # (one-letter types)
    cases = " ".join(f"case {k}: y = (Y)a{k}[0]; break;" for k in range(count))
    return CUPY.xp.ElementwiseKernel(inputs, "Y y", f"switch (i) {{ {cases} }}",
                                     f"{STACK_PREFIX}{count}")


class CupyBackend(Backend):
    name = "cupy"
    multi_device = True
    supports_signature = False
    ufunc_keywords = CUPY_UFUNC_KEYWORDS
    #: `Backend.executors`: cuBLAS and CSR products, conditional nodes, CUDA graphs, fused
    #: scalar kernels, optimizer step kernels, the metrics ring, NCCL and MPI collectives
    executors = {
        "blas": "gpuscalar.devices.cupy.linalg:CupyBlas",
        "sparse": "gpuscalar.devices.cupy.products:CupySparse",
        "loops": "gpuscalar.devices.cupy.control:CudaLoops",
        "graphs": "gpuscalar.devices.cupy.graphs:CudaGraphs",
        "scalars": "gpuscalar.devices.cupy.fusion:CupyExecutor",
        "steps": "gpuscalar.devices.cupy.steps:CudaExecutor",
        "metrics": "gpuscalar.devices.cupy.metrics:CudaRings",
        "collectives": "gpuscalar.devices.cupy.collectives:CudaCollectives",
    }

    def __init__(self) -> None:
        self.seam: CudaSeam = CudaSeam()
        #: what was made through a seam and must not outlive it (compiled kernels, device
        #: constants, cuBLAS handles): emptied while another seam stands, refilled after
        self._kernels: dict[tuple[str, str], Any] = {}
        self._seam_caches: list[dict[Any, Any]] = [self._kernels]

    # `call` is `Backend.call` (the real seam's ``launch`` is the plain call it makes, so the
    # hot path costs nothing extra); `seam_replaced` installs `_call_through_seam` instead.

    def _call_through_seam(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`Backend.call` while a seam that launches by itself stands: counted, then the seam's
        ``launch``."""
        ledger.note_device_op()
        return self.seam.launch(func, args, kwargs)

    def seam_cache(self, cache: dict[Any, Any]) -> dict[Any, Any]:
        """Register ``cache`` (a module's dict of device objects made through the seam) to be
        emptied while `seam_replaced` stands and restored after; returns it."""
        if not any(cache is known for known in self._seam_caches):
            self._seam_caches.append(cache)
        return cache

    @contextlib.contextmanager
    def seam_replaced(self, seam: CudaSeam) -> Iterator[CudaSeam]:
        """Route every CUDA call gpuscalar makes on CuPy to ``seam`` (a test double, usually a
        `CudaSeam` subclass) for the block; the previous seam is restored on exit. The caches
        of device objects (`seam_cache`) start empty under ``seam`` and get their contents
        back after: nothing made through one seam is used through another."""
        if not isinstance(seam, CudaSeam):
            raise TypeError(f"seam_replaced: expected a CudaSeam, got {type(seam).__name__}")
        saved = self.seam, self.__dict__.get("call"), [dict(c) for c in self._seam_caches]
        for cache in self._seam_caches:
            cache.clear()
        self.seam = seam
        if type(seam).launch is not CudaSeam.launch:
            self.call = self._call_through_seam  # type: ignore[method-assign]
        else:
            self.__dict__.pop("call", None)
        try:
            yield seam
        finally:
            self.seam = saved[0]
            if saved[1] is None:
                self.__dict__.pop("call", None)
            else:
                self.call = saved[1]  # type: ignore[method-assign]
            for cache, contents in zip(self._seam_caches, saved[2], strict=False):
                cache.clear()
                cache.update(contents)
            # a cache registered under ``seam`` (a wing module imported on first use: an
            # executor slot's) holds only what ``seam`` made
            for cache in self._seam_caches[len(saved[2]):]:
                cache.clear()

    @property
    def xp(self) -> ModuleType:
        module = sys.modules.get("cupy")
        if module is not None:
            return module
        import cupy  # noqa: PLC0415 - only when CuPy is explicitly asked for

        return cupy

    def owns(self, value: object) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and isinstance(value, cupy.ndarray)

    def device_of(self, array: Any) -> object:
        # the allocation's device id, read without the ``Device`` object ``array.device`` makes
        # (the same id: CuPy's ``ndarray.device`` is ``Device(array.data.device_id)``); every
        # fold and optimizer step asks it
        return array.data.device_id

    def devices_of(self, arrays: Iterable[Any]) -> Iterable[object]:
        return map(_CUPY_DEVICE_ID, arrays)  # (the allocation's device: array.device.id)

    def device_context(self, device: object) -> Any:
        return self.seam.device_context(device)

    def synchronize(self) -> None:
        self.seam.synchronize()

    def read_scalar(self, array: Any) -> Any:
        return self.seam.copy_to_host(array)

    def vector_norm(self, x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
        if axis is None and not keepdims:
            # along axis 0 of the flat vector: for ord 2 CuPy's one-launch reduction
            # (``_norm_ord2``: square, add, root), where its axis=None path of a vector is three
            # launches (``sqrt((x * x).sum())``); other orders take the same kernels either way
            return self.call(self.xp.linalg.norm, x.ravel(), ord=ord, axis=0)
        flat = x.ravel() if axis is None else x
        return self.call(self.xp.linalg.norm, flat, ord=ord, axis=axis, keepdims=keepdims)

    def stack_scalars(self, scalars: list[Any], dtype: Any, out: Any = None) -> Any:
        """One launch of a gathering kernel (`stack_kernel`): CuPy's ``stack`` copies each 0-d
        input with a kernel of its own (eight launches for one counted op). The casts
        ``stack`` would refuse (not ``same_kind``) are refused the same way, first."""
        dtype = np.dtype(dtype) if out is None else out.dtype
        for scalar in scalars:
            if not np.can_cast(scalar.dtype, dtype, "same_kind"):
                raise TypeError(f"Cannot cast array data from {scalar.dtype!r} to {dtype!r} "
                                "according to the rule 'same_kind'")
        if out is None:
            with self.seam.device_context(self.device_of(scalars[0])):
                out = self.xp.empty((len(scalars),), dtype=dtype)
        self.call(stack_kernel(len(scalars)), *scalars, out)
        return out

    # ---- fused kernels (issue 4, gpuscalar.optim): compile once per source, launch counted ----
    #: NVRTC options for every kernel gpuscalar ships (tests/test_kernels.py compiles with these).
    kernel_options: tuple[str, ...] = ("--std=c++17",)

    def launch_kernel(
        self,
        source: str,
        name: str,
        size: int,
        args: list[Any] | tuple[Any, ...],
        *,
        grid: int | None = None,
        block: int = 256,
    ) -> None:
        """Compile ``source`` (cached by text) and launch kernel ``name`` over ``size`` elements
        with a grid-stride loop: one counted device op. 0-d arrays in ``args`` are passed as
        device pointers, so the kernel reads device scalars itself (no sync). ``grid`` (blocks)
        overrides the grid computed from ``size``, for kernels that index their own work."""
        cache = self._kernels
        kernel = cache.get((source, name))
        if kernel is None:
            kernel = cache[(source, name)] = self.seam.compile_kernel(
                source, name, self.kernel_options
            )
        if grid is None:
            grid = max(1, min((size + block - 1) // block, 65535))
        self.call(kernel, (grid,), (block,), tuple(args))

    def data_address(self, array: Any) -> int:
        return int(array.data.ptr)

    def data_addresses(self, arrays: Iterable[Any]) -> Iterable[int]:
        return map(_CUPY_DATA_PTR, arrays)

    def upload(self, array: Any, host: np.ndarray) -> None:
        """Copy NumPy ``host`` into the contiguous device ``array``: one counted device op,
        asynchronous on the current stream (CuPy stages pageable host memory; no device sync).
        Refused inside a captured step (`ledger.in_graph_body`), before CuPy is asked."""
        if ledger.in_graph_body():
            raise RuntimeError(
                "gpuscalar: a host-to-device copy was asked for inside a captured step "
                "(gs.capture): CuPy refuses one while the stream captures, and a recorded copy "
                "would read host memory that is gone when the graph replays; pass the values "
                "as kernel arguments (which the graph keeps) or copy before capturing"
            )
        ledger.note_device_op()
        seam = self.seam
        seam.upload(array, host, seam.current_stream())

    # ---- end of fused kernels ----


#: the CuPy device (`gpuscalar.devices` lists it first)
CUPY = CupyBackend()
