"""Real ``cupy.ndarray`` objects over fake device memory: CuPy's own dispatch without a GPU.

Why this file exists: CI has no GPU, and CuPy cannot create an array there, so neither NumPy nor
the strict device can show what CuPy's own Python/Cython dispatch does with a GPUScalar
(positional ``out`` in in-place operators, ufunc objects that are no NumPy ufunc, its function
signatures, hidden host-to-device copies). CuPy needs CUDA only when it finally talks to the
device: an ``ndarray`` made over a ``cupy.cuda.UnownedMemory`` (no allocation) is a complete
CuPy array, and CuPy's dispatch on it runs until its first CUDA runtime call
(``cudaGetDevice``, a launch, a copy), which raises ``CUDARuntimeError`` on a machine without a
driver. So "CuPy raised a CUDA runtime error" means "CuPy accepted the call and got as far as
CUDA": a pass. A ``TypeError``, ``AttributeError`` or ``SyncError`` before that is a failure.

The memory behind each fake array is a host NumPy buffer (its address is the "device" pointer),
so a test double standing for the device (gpuscalar's launch seam) can read and write the
values. ``cupy.cuda.set_allocator`` routes CuPy's own allocations (``cupy.empty``) to the same
fake memory while `fake_memory` is active.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest


def cupy_or_fail() -> Any:
    """CuPy, imported; skips where it is not installed, but fails under ``CI=true`` (the
    ``cuda12`` extra installs it there, so a missing CuPy is a broken install, not a skip)."""
    try:
        import cupy
    except ImportError as error:  # pragma: no cover - only without the cuda extra
        if os.environ.get("CI") == "true":
            pytest.fail(f"CuPy must be importable in CI (install the cuda12 extra): {error}")
        pytest.skip(f"CuPy is not installed: {error}")
    return cupy


def refuse_on_a_gpu() -> None:
    """Skip where a CUDA device is present: there CuPy would launch real kernels on these host
    addresses (an illegal access that can take the GPU context down), and the real CuPy tests
    (the ``cupy`` backend parameter) run instead. CI has no GPU, so there this never skips."""
    import gpuscalar as gs

    if gs.gpu_available():
        pytest.skip("a CUDA device is present: fake device memory is for machines without one "
                    "(the real CuPy tests run here instead)")


class FakeMemory:
    """Host buffers standing for device memory: each allocation is a NumPy ``uint8`` buffer
    whose address is handed to CuPy as a device pointer on device 0."""

    def __init__(self) -> None:
        refuse_on_a_gpu()
        self._buffers: dict[int, np.ndarray] = {}
        self._sizes: dict[int, int] = {}  # address -> the bytes asked for (padding excluded)
        self._starts: list[int] = []  # the addresses, sorted (to find a raw address's owner)
        self._lock = threading.Lock()

    def allocate(self, nbytes: int) -> Any:
        """A ``cupy.cuda.MemoryPointer`` over ``nbytes`` of fresh, zeroed fake memory."""
        cupy = cupy_or_fail()
        buffer = np.zeros(max(int(nbytes), 1) + 256, dtype=np.uint8)
        address = buffer.ctypes.data
        address += (-address) % 256  # CuPy's pool aligns to 256 bytes; so do we
        with self._lock:
            self._buffers[address] = buffer
            self._sizes[address] = int(nbytes)
            bisect.insort(self._starts, address)
        memory = cupy.cuda.UnownedMemory(address, int(nbytes), buffer, 0)
        return cupy.cuda.MemoryPointer(memory, 0)

    def owns(self, address: int) -> bool:
        """Whether ``address`` lies in a buffer this fake memory handed out."""
        with self._lock:
            return any(start <= address < start + buffer.nbytes
                       for start, buffer in self._buffers.items())

    def region(self, address: int, nbytes: int) -> np.ndarray | None:
        """The ``nbytes`` at raw ``address`` as a writable ``uint8`` view, when one allocation
        holds them all (its requested size, not its padding), else None. Why: a kernel reads
        memory through addresses held in tables (gpuscalar.optim's multi-tensor kernels), and a
        test double standing for the device must resolve and bound-check each such read."""
        with self._lock:
            at = bisect.bisect_right(self._starts, address)
            if at == 0:
                return None
            start = self._starts[at - 1]
            if address + nbytes > start + self._sizes[start]:
                return None
            buffer = self._buffers[start]
        offset = address - buffer.ctypes.data
        return buffer[offset:offset + nbytes]


def empty(memory: FakeMemory, shape: Any, dtype: Any = np.float64) -> Any:
    """A C-contiguous ``cupy.ndarray`` of ``shape`` and ``dtype`` over fake memory (zeros)."""
    cupy = cupy_or_fail()
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return cupy.ndarray(shape, dtype, memptr=memory.allocate(nbytes))


def host_view(array: Any) -> np.ndarray:
    """A writable NumPy view of a fake-memory ``cupy.ndarray``'s elements (same shape, dtype
    and strides): what a test double reads and writes where the device would."""
    dtype = np.dtype(array.dtype)
    if array.size == 0:
        return np.empty(array.shape, dtype)
    offsets = [(n - 1) * s for n, s in zip(array.shape, array.strides, strict=True)]
    low = array.data.ptr + sum(o for o in offsets if o < 0)
    high = array.data.ptr + sum(o for o in offsets if o > 0) + dtype.itemsize
    raw = (ctypes.c_char * (high - low)).from_address(low)
    return np.ndarray(array.shape, dtype, buffer=raw, offset=array.data.ptr - low,
                      strides=array.strides)


def from_host(memory: FakeMemory, values: Any, dtype: Any = None) -> Any:
    """A fake-memory ``cupy.ndarray`` holding a copy of ``values`` (a test's input data)."""
    data = np.asarray(values, dtype=dtype)
    array = empty(memory, data.shape, data.dtype)
    host_view(array)[...] = data
    return array


@contextlib.contextmanager
def fake_memory() -> Iterator[FakeMemory]:
    """CuPy's allocator routed to fake memory for the block (``cupy.empty`` and every array
    CuPy allocates then lie in host buffers); the previous allocator is restored on exit."""
    cupy = cupy_or_fail()
    memory = FakeMemory()
    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(memory.allocate)
    try:
        yield memory
    finally:
        cupy.cuda.set_allocator(previous)


def cuda_runtime_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "CuPy got as far as the CUDA runtime / driver / compiler"."""
    cupy = cupy_or_fail()
    from cupy_backends.cuda.api import driver, runtime

    return (runtime.CUDARuntimeError, driver.CUDADriverError, cupy.cuda.compiler.CompileException)


def reaches_cuda(call: Any, *args: Any, **kwargs: Any) -> bool:
    """Run ``call``: True when it raised a CUDA runtime error (CuPy accepted the call and got as
    far as CUDA), False when it returned; any other exception propagates (a failure)."""
    try:
        call(*args, **kwargs)
    except cuda_runtime_errors():
        return True
    return False
