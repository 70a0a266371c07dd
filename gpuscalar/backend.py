"""Array backends: NumPy (always) and CuPy (when the user has imported it).

Why this module exists: every CuPy-specific line of gpuscalar lives here, so the rest of the
package is written once against a small `Backend` interface and tested on NumPy. CuPy is never
imported by `import gpuscalar`; a CuPy array is recognised by looking in `sys.modules`, as
array-api-compat does, because a user who holds a CuPy array has already imported CuPy.

`Backend.call` is the single dispatch point through which gpuscalar issues device work, so that
every operation is counted (`count_syncs().device_ops`). `Backend.read_scalar` is the raw
device→host copy; only `sync.to_host` may call it, which is how sync accounting stays exact.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import sync

__all__ = [
    "Backend",
    "NumpyBackend",
    "CupyBackend",
    "NUMPY",
    "CUPY",
    "BACKENDS",
    "register_backend",
    "backend_of",
    "get_backend",
    "default_backend",
    "gpu_available",
    "describe",
]


class Backend:
    """What gpuscalar needs to know about one array library."""

    name: str = ""
    #: keyword arguments that make a ufunc return a 0-d array rather than a scalar
    ufunc_array_kwargs: dict[str, Any] = {}
    #: whether arrays of this backend can live on different devices (device checks needed)
    multi_device: bool = False
    #: whether a ufunc accepts NumPy's ``signature=`` to pin the loop (else ``dtype=`` is used)
    supports_signature: bool = True
    #: whether arrays hold NumPy data in this process (NumPy, the strict device), so that
    #: gpuscalar's host evaluators (optimizer programs, fused scalar expressions) can compute
    #: on `host_data` inside one counted device op
    evaluates_on_host: bool = False

    @property
    def xp(self) -> ModuleType:
        raise NotImplementedError

    def owns(self, value: object) -> bool:
        """Whether ``value`` is an array of this backend (no import, no sync)."""
        raise NotImplementedError

    def device_of(self, array: Any) -> object:
        raise NotImplementedError

    def device_context(self, device: object) -> Any:
        """A context manager making ``device`` current for array creation."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait until the device has finished the work queued so far (for timings; a host
        backend has nothing queued)."""

    def read_scalar(self, array: Any) -> Any:
        """Copy a 0-d array to the host as a Python scalar. Only `sync.to_host` calls this."""
        raise NotImplementedError

    def host_data(self, array: Any) -> Any:
        """The NumPy data of an array of a host-evaluating backend (no transfer, no copy)."""
        raise NotImplementedError(f"the {self.name} backend does not evaluate on the host")

    def from_host_data(self, data: Any, like: Any) -> Any:
        """An array of this backend over NumPy ``data``, on the device of the array ``like``."""
        raise NotImplementedError(f"the {self.name} backend does not evaluate on the host")

    def data_address(self, array: Any) -> int:
        """The address of an array's first element (no transfer): what a kernel's pointer table
        holds (gpuscalar.optim), and what overlap checks compare."""
        return int(self.host_data(array).__array_interface__["data"][0])

    def call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Issue one device operation, counted. Every op gpuscalar issues goes through here."""
        sync.note_device_op()
        return func(*args, **kwargs)

    def ufunc(self, name: str) -> Any:
        """The backend's ufunc called ``name`` (NumPy's naming), looked up once."""
        cache = self.__dict__.setdefault("_ufuncs", {})
        found = cache.get(name)
        if found is None:
            found = cache[name] = getattr(self.xp, name)
        return found

    def vector_norm(self, x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
        raise NotImplementedError

    def elementwise_ufunc_name(self, kernel: Any) -> str | None:
        """NumPy's name for a CuPy ufunc object (``cupy_add`` -> ``add``); None for any other
        elementwise kernel. Used by GPUScalar's ``__cupy_override_elementwise_kernel__``."""
        if type(kernel).__name__ != "ufunc":
            return None
        name = str(getattr(kernel, "name", ""))
        return name.removeprefix("cupy_") or None

    def __repr__(self) -> str:
        return f"<gpuscalar backend {self.name}>"


class NumpyBackend(Backend):
    name = "numpy"
    # NumPy >= 2.3 returns 0-d arrays from ufuncs given out=...; older NumPy returns scalars,
    # which the scalar wrapper normalizes.
    ufunc_array_kwargs = (
        {"out": ...} if tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 3) else {}
    )

    @property
    def xp(self) -> ModuleType:
        return np

    evaluates_on_host = True

    def owns(self, value: object) -> bool:
        return isinstance(value, np.ndarray)

    def device_of(self, array: Any) -> object:
        return "cpu"

    def read_scalar(self, array: Any) -> Any:
        return array.item()

    def host_data(self, array: Any) -> Any:
        return array

    def from_host_data(self, data: Any, like: Any) -> Any:
        return np.asarray(data)

    def vector_norm(self, x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
        return self.call(np.linalg.vector_norm, x, ord=ord, axis=axis, keepdims=keepdims)


class CupyBackend(Backend):
    name = "cupy"
    multi_device = True
    supports_signature = False

    @property
    def xp(self) -> ModuleType:
        module = sys.modules.get("cupy")
        if module is None:
            import cupy as module  # noqa: PLC0415 - only when CuPy is explicitly asked for
        return module

    def owns(self, value: object) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and isinstance(value, cupy.ndarray)

    def device_of(self, array: Any) -> object:
        return array.device.id

    def device_context(self, device: object) -> Any:
        return self.xp.cuda.Device(device)

    def synchronize(self) -> None:
        self.xp.cuda.Device().synchronize()

    def read_scalar(self, array: Any) -> Any:
        # ndarray.get() is CuPy's own single choke point for device->host copies.
        return array.get().item()

    def vector_norm(self, x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
        flat = x.ravel() if axis is None else x
        return self.call(self.xp.linalg.norm, flat, ord=ord, axis=axis, keepdims=keepdims)

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
        cache = self.__dict__.setdefault("_kernels", {})
        kernel = cache.get((source, name))
        if kernel is None:
            kernel = cache[(source, name)] = self.xp.RawKernel(
                source, name, options=self.kernel_options
            )
        if grid is None:
            grid = max(1, min((size + block - 1) // block, 65535))
        self.call(kernel, (grid,), (block,), tuple(args))

    def data_address(self, array: Any) -> int:
        return int(array.data.ptr)

    def upload(self, array: Any, host: np.ndarray) -> None:
        """Copy NumPy ``host`` into the contiguous device ``array``: one counted device op,
        asynchronous on the current stream (CuPy stages pageable host memory; no device sync).
        Refused inside a captured step (`sync.in_graph_body`), before CuPy is asked."""
        if sync.in_graph_body():
            raise RuntimeError(
                "gpuscalar: a host-to-device copy was asked for inside a captured step "
                "(gs.capture): CuPy refuses one while the stream captures, and a recorded copy "
                "would read host memory that is gone when the graph replays; pass the values "
                "as kernel arguments (which the graph keeps) or copy before capturing"
            )
        self.call(array.set, host, self.xp.cuda.get_current_stream())

    # ---- end of fused kernels ----


NUMPY = NumpyBackend()
CUPY = CupyBackend()
#: Checked in order by `backend_of`; NumPy last, because other array types may subclass or
#: wrap ndarray. `gpuscalar.strict` registers the strict CPU device here when imported.
BACKENDS: list[Backend] = [CUPY, NUMPY]


def register_backend(backend: Backend) -> None:
    """Add ``backend`` to those gpuscalar recognises (before NumPy); idempotent."""
    if backend not in BACKENDS:
        BACKENDS.insert(len(BACKENDS) - 1, backend)


def backend_of(value: object) -> Backend | None:
    """The backend that owns ``value`` (an array), or None for anything else."""
    for backend in BACKENDS:
        if backend.owns(value):
            return backend
    return None


def get_backend(name: str) -> Backend:
    """Backend by name: ``"numpy"``, ``"strict"`` (the CuPy-strict CPU device) or ``"cupy"``
    (imports CuPy)."""
    for backend in BACKENDS:
        if backend.name == name:
            if backend is CUPY:
                CUPY.xp  # noqa: B018 - raises ImportError with CuPy's own message if missing
            return backend
    names = ", ".join(repr(b.name) for b in BACKENDS)
    raise ValueError(f"unknown backend {name!r}; expected one of {names}")


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device (imports CuPy if installed)."""
    try:
        import cupy
    except Exception:  # noqa: BLE001 - any import failure means "no usable CuPy"
        return False
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001 - CUDA driver missing or no device
        return False


def default_backend() -> Backend:
    """CuPy when a GPU is present, else NumPy."""
    return CUPY if gpu_available() else NUMPY


def describe(backend: Backend) -> str:
    """A human-readable description of the device a backend computes on."""
    if backend is NUMPY:
        return f"CPU ({_cpu_model()}), NumPy {np.__version__}"
    if backend is not CUPY:
        return f"{backend.name} device: CPU ({_cpu_model()}), NumPy {np.__version__}"
    cupy = backend.xp
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return f"{name}, CuPy {cupy.__version__}"


def _cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
