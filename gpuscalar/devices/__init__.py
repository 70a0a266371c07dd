"""The devices gpuscalar knows, and how it finds the one an array lives on: the registry.

Why this package exists: a device is one folder here (a wing) that owns its code: `host` (NumPy),
`strict` (the CuPy-strict CPU device) and `cupy` (CuPy, with its CUDA seam, graphs, conditional
nodes, cuBLAS, kernels). Code outside the wings finds a device through this registry
(`backend_of`, `get_backend`, `default_backend`) and talks to it through the `Backend` protocol
(`gpuscalar.backend`), never asking which one it is. Adding a device (PyTorch tensors, say) is
one more folder and one registration line below (`BACKENDS`).

No import circle: the registry imports each wing's root module only (`host.backend`,
`strict.device`, `cupy.backend`), and what those reach, beside their own wing, is below the
registry (`gpuscalar.backend`, `sync`, `ledger`, `known`, `lazy.expr`, `lazy.codegen`); a wing's
other modules (`cupy.graphs`, `cupy.linalg`, ...) may use the registry. `tests/test_layering.py`
checks both.
"""

from __future__ import annotations

import numpy as np

from ..backend import Backend  # the protocol every device implements, re-exported
from .cupy.backend import CUPY
from .host.backend import NUMPY
from .strict.device import STRICT

__all__ = [
    "Backend",
    "NUMPY",
    "HOST",
    "STRICT",
    "CUPY",
    "BACKENDS",
    "register_backend",
    "backend_of",
    "get_backend",
    "default_backend",
    "gpu_available",
    "describe",
]

#: Checked in order by `backend_of`; NumPy last, because other array types may subclass or
#: wrap ndarray. A new device is one more entry here (or a `register_backend` call).
BACKENDS: list[Backend] = [CUPY, STRICT, NUMPY]

#: The backend of host memory: where a Python number or a host NumPy array lives (a role the
#: features need, "the host", not a device they pick: code outside the wings names this, never
#: a device)
HOST: Backend = NUMPY


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
