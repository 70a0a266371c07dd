"""A fake CuPy *device* for user-level code: real ``cupy.ndarray``s whose math NumPy does.

Why this file exists: `tests.cupy_fake` makes real CuPy arrays over fake memory, so CuPy's
dispatch runs until its first CUDA call. That is enough for one call into CuPy, but the
workloads, the main job and the examples are whole programs of user-level CuPy code
(``X @ w``, ``x - y``, ``x.sum()``, ``xp.zeros``, ``a[...] = v``, ``.copy()``), and each of
those stops at CUDA. To run them end to end, this module adds a device:

- `FakeDeviceArray`, a Python subclass of ``cupy.ndarray`` (CuPy supports subclasses: views,
  transposes and basic indexing keep the type). Its elementwise operations are intercepted by
  ``__cupy_override_elementwise_kernel__``, the hook CuPy's ``ufunc.__call__`` and
  ``ElementwiseKernel.__call__`` look for on their positional arguments *before* any CUDA call
  (cupy/_core/_kernel.pyx, v14.2), and computed with NumPy on `host_view`s. When another
  argument has a hook of its own (a GPUScalar), the call is handed to that hook, exactly as real
  CuPy would do (a real ``cupy.ndarray`` has no hook, so the GPUScalar's would be the one
  called): the real dispatch of ``x += s`` or ``g * lr_expr`` stays under test.
- The methods CuPy implements in Cython that reach CUDA (matmul, ``sum``/``mean``/``max``/
  ``min``, ``copy``, ``astype``, advanced indexing, host reads) are overridden on the
  subclass, and the creation functions are provided by `FakeCupy`, a small ``xp`` namespace
  (everything else is CuPy's own, so its ufuncs and functions dispatch as they would on a GPU).
- Host reads (``get``, ``item``, ``float()``, ``bool()``, ...) declare a synchronization through
  ``cupy._core.syncdetect._declare_synchronize``, as CuPy does, and are counted; host-to-device
  copies (``xp.asarray`` of host data, ``ndarray.set``) are counted too, with whether they
  happened inside a captured step.
- `fake_cupy_device` adds gpuscalar's side: `DeviceSeam`, the recorder of `tests.cupy_seam`
  (each launch checked against CuPy) as gpuscalar's CUDA seam, answering on this device: its
  arrays are `FakeDeviceArray`s, and cuBLAS calls (gs.matmul) are computed from their pointer
  arguments, column-major as cuBLAS reads them. While a fake stream captures, the device's
  operations are recorded into the graph rather than run (recording executes nothing; each
  replay runs them), as a CUDA graph records the user's kernels beside gpuscalar's.

Only what the workloads, the main job and the example use is here; anything else stops at CUDA
(a `NotImplementedError` for an elementwise kernel that is no CuPy ufunc: gpuscalar's own
kernels go through its launch seam, not through this device).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np
from cupy._core import syncdetect

from gpuscalar import sync
from gpuscalar.devices import CUPY

from .cupy_fake import FakeMemory, fake_memory, host_view
from .cupy_seam import Launch, RecordingSeam

HOOK = "__cupy_override_elementwise_kernel__"


@dataclass
class DeviceLog:
    """What the fake device saw: launches, host reads (syncs) and host-to-device copies."""

    memory: FakeMemory
    #: the recording seam standing for gpuscalar's CUDA calls (`fake_cupy_device`), if any
    seam: Any = None
    #: operations launched on their own (not recorded into a CUDA graph)
    launches: int = 0
    #: operations recorded into a graph while a stream captured (replayed by its launches)
    recorded: int = 0
    host_reads: int = 0
    uploads: int = 0
    #: host-to-device copies made while a captured step ran (gpuscalar.sync.in_graph_body)
    uploads_in_step: int = 0


_active: list[DeviceLog] = []


def _log() -> DeviceLog:
    if not _active:
        raise RuntimeError("tests.cupy_device: a FakeDeviceArray was used outside fake_device()")
    return _active[-1]


def _host(value: Any) -> Any:
    """The NumPy data of a fake-device array (a view, no copy); other values unchanged."""
    if isinstance(value, cupy.ndarray):
        return host_view(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_host(v) for v in value)
    return value


def to_device(data: Any, dtype: Any = None) -> FakeDeviceArray:
    """A new fake-device array holding a copy of NumPy ``data`` (not counted as an upload:
    it stands for the result a device computed)."""
    data = np.asarray(data, dtype=dtype)
    out = FakeDeviceArray(data.shape, data.dtype,
                          memptr=_log().memory.allocate(data.nbytes))
    host_view(out)[...] = data
    return out


def _capturing(log: DeviceLog) -> Any:
    """The seam's current stream while it captures, else None."""
    stream = None if log.seam is None else log.seam.current_stream()
    return stream if stream is not None and stream.captured is not None else None


def _recorded(name: str, work: Any) -> bool:
    """Count one device operation; while the seam's current stream captures, record ``work``
    into the graph instead (its replays run it) and say so: as on a GPU, recording executes
    nothing."""
    log = _log()
    stream = _capturing(log)
    if stream is not None:
        stream.captured.append(Launch("device", work, name, (), {}))
        log.recorded += 1
        return True
    log.launches += 1
    return False


def _in_place(name: str, write: Any) -> None:
    """An operation writing into existing device memory: run now, or recorded in a capture."""
    if not _recorded(name, write):
        write()


def _fresh(name: str, compute: Any) -> FakeDeviceArray:
    """An operation whose result is a new array: its memory is allocated now (as CuPy does,
    capturing or not) and a recorded operation rewrites it at each replay."""
    out = to_device(compute())
    _recorded(name, lambda: host_view(out).__setitem__(Ellipsis, compute()))
    return out


def _declare_read() -> None:
    _log().host_reads += 1
    syncdetect._declare_synchronize()


def _upload() -> None:
    log = _log()
    log.uploads += 1
    if sync.in_graph_body():
        log.uploads_in_step += 1


class FakeDeviceArray(cupy.ndarray):
    """A ``cupy.ndarray`` over fake memory whose device work NumPy does (see the module)."""

    def __cupy_override_elementwise_kernel__(self, kernel: Any, *args: Any, **kwargs: Any) -> Any:
        for arg in args:  # real CuPy calls the first hook it finds; a real array has none
            if not isinstance(arg, FakeDeviceArray) and hasattr(arg, HOOK):
                return getattr(arg, HOOK)(kernel, *args, **kwargs)
        return _elementwise(kernel, args, kwargs)

    # ---- Cython methods that reach CUDA, computed with NumPy ----
    def __matmul__(self, other: Any) -> Any:
        if not isinstance(other, cupy.ndarray):
            return NotImplemented
        return _compute(np.matmul, self, other)

    def __rmatmul__(self, other: Any) -> Any:
        if not isinstance(other, cupy.ndarray):
            return NotImplemented
        return _compute(np.matmul, other, self)

    def take(self, indices: Any, axis: Any = None, out: Any = None) -> Any:
        # cupy.take(a, i) calls a.take(i): CuPy's take kernel, with device indices (no read)
        return _compute(np.take, self, indices, axis=axis, out=out)

    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None,
            keepdims: bool = False) -> Any:
        return _compute(np.sum, self, axis=axis, dtype=dtype, out=out, keepdims=keepdims)

    def mean(self, axis: Any = None, dtype: Any = None, out: Any = None,
             keepdims: bool = False) -> Any:
        return _compute(np.mean, self, axis=axis, dtype=dtype, out=out, keepdims=keepdims)

    def max(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> Any:
        return _compute(np.max, self, axis=axis, out=out, keepdims=keepdims)

    def min(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> Any:
        return _compute(np.min, self, axis=axis, out=out, keepdims=keepdims)

    def copy(self, order: str = "C") -> Any:
        return _compute(np.copy, self, order=order)

    def astype(self, dtype: Any, order: str = "K", casting: Any = None, subok: Any = None,
               copy: bool = True) -> Any:
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        view = host_view(self)
        return _fresh("astype", lambda: view.astype(dtype, order=order))

    def __getitem__(self, index: Any) -> Any:
        if not _advanced(index):
            return super().__getitem__(index)  # a view: no device work
        view, where = host_view(self), _host(index)
        return _fresh("take", lambda: view[where])

    def __setitem__(self, index: Any, value: Any) -> None:
        if hasattr(value, HOOK) and not isinstance(value, FakeDeviceArray):
            super().__setitem__(index, value)  # CuPy's own dispatch of the value (its hook)
            return
        if _assigns_itself(self, index, value):
            return  # CuPy skips a copy onto itself, launching nothing
        view, where, data = host_view(self), _host(index), _host(value)
        _in_place("setitem", lambda: view.__setitem__(where, data))

    # ---- host reads: one declared synchronization each ----
    def get(self, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> np.ndarray:
        _declare_read()
        return host_view(self).copy(order=order)

    def item(self) -> Any:
        return self.get().item()

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    def set(self, arr: Any, stream: Any = None) -> None:
        _upload()
        host_view(self)[...] = np.asarray(arr).reshape(self.shape)


def _assigns_itself(array: FakeDeviceArray, index: Any, value: Any) -> bool:
    """CuPy 14's condition (``_ndarray_setitem`` and ``_scatter_op``,
    cupy/_core/_routines_indexing.pyx) for skipping ``array[index] = value``: a basic index,
    and the value, its leading unit dimensions squeezed, has the view's address, shape and
    strides (``a[...] -= v`` assigns its own view back; ``x[...] = x``)."""
    if not isinstance(value, cupy.ndarray) or _advanced(index):
        return False
    view = cupy.ndarray.__getitem__(array, index)
    lead = next((i for i, n in enumerate(value.shape) if n != 1), value.ndim)
    return (value.shape[lead:] == view.shape and value.strides[lead:] == view.strides
            and value.data.ptr == view.data.ptr)


def _advanced(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (cupy.ndarray, np.ndarray, list)) for i in items)


def _compute(func: Any, *args: Any, out: Any = None, **kwargs: Any) -> Any:
    """``func`` over the NumPy data of ``args``: one device operation; the result in ``out``
    or in a new fake-device array."""
    data = _host(args)
    if out is None:
        return _fresh(func.__name__, lambda: func(*data, **kwargs))
    target = host_view(out)
    _in_place(func.__name__, lambda: target.__setitem__(Ellipsis, func(*data, **kwargs)))
    return out


def _elementwise(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A CuPy ufunc call, computed by the NumPy ufunc of the same name (outputs given
    positionally, as CuPy's in-place operators pass them, or as ``out=``)."""
    if type(kernel).__name__ != "ufunc":
        raise NotImplementedError(
            f"tests.cupy_device computes CuPy ufuncs only, not the elementwise kernel "
            f"{getattr(kernel, 'name', kernel)!r} (gpuscalar's own kernels go through its "
            "launch seam)"
        )
    name = str(kernel.name).removeprefix("cupy_")
    ufunc = getattr(np, name)
    outs = list(args[kernel.nin:])
    out = kwargs.pop("out", None)
    if out is not None:
        outs.append(out)
    kwargs.pop("_where", None)
    inputs = _host(args[:kernel.nin])
    if not outs:
        if kernel.nout > 1:
            raise NotImplementedError(f"tests.cupy_device: {name} has {kernel.nout} outputs")
        with np.errstate(all="ignore"):  # a kernel cannot warn: IEEE results, as on a GPU
            return _fresh(name, lambda: ufunc(*inputs, **kwargs))
    targets = tuple(host_view(o) for o in outs)
    with np.errstate(all="ignore"):
        _in_place(name, lambda: ufunc(*inputs, out=targets, **kwargs))
    return outs[0] if len(outs) == 1 else tuple(outs)


class FakeCupy:
    """The ``xp`` of the fake device: CuPy's module, with creation functions that make
    `FakeDeviceArray`s (CuPy's own would fill memory with a CUDA call)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(cupy, name)

    class linalg:  # noqa: N801 - the ``xp.linalg`` namespace
        """``xp.linalg``: CuPy's ``norm`` of a whole array (elementwise ops and a reduction,
        which the device computes: three launches), NumPy's for an ``axis`` (CuPy's
        reduction kernel there has no hook to intercept: one launch, as CuPy's)."""

        @staticmethod
        def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
            if axis is None:
                return cupy.linalg.norm(x, ord=ord, keepdims=keepdims)
            return _compute(np.linalg.norm, x, ord=ord, axis=axis, keepdims=keepdims)

    @staticmethod
    def asarray(a: Any, dtype: Any = None, order: Any = None) -> Any:
        if isinstance(a, FakeDeviceArray):
            return a if dtype is None else a.astype(dtype, copy=False)
        _upload()
        return to_device(np.asarray(a, dtype=dtype, order=order))

    @staticmethod
    def zeros(shape: Any, dtype: Any = float, order: str = "C") -> Any:
        return FakeCupy.full(shape, 0, dtype)

    @staticmethod
    def ones(shape: Any, dtype: Any = float, order: str = "C") -> Any:
        return FakeCupy.full(shape, 1, dtype)

    @staticmethod
    def empty(shape: Any, dtype: Any = float, order: str = "C") -> Any:
        return FakeCupy.full(shape, 0, dtype)

    @staticmethod
    def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> Any:
        if hasattr(fill_value, HOOK) or isinstance(fill_value, cupy.ndarray):
            raise NotImplementedError("tests.cupy_device: full() with a device fill value")
        return _fresh("full", lambda: np.full(shape, fill_value, dtype=dtype))

    @staticmethod
    def zeros_like(a: Any, dtype: Any = None) -> Any:
        return FakeCupy.zeros(a.shape, a.dtype if dtype is None else dtype)

    @staticmethod
    def empty_like(a: Any, dtype: Any = None) -> Any:
        return FakeCupy.zeros(a.shape, a.dtype if dtype is None else dtype)

    @staticmethod
    def arange(*args: Any, dtype: Any = None) -> Any:
        return _fresh("arange", lambda: np.arange(*args, dtype=dtype))

    @staticmethod
    def stack(arrays: Any, axis: int = 0) -> Any:
        return _compute(np.stack, list(arrays), axis=axis)


@contextlib.contextmanager
def fake_device() -> Iterator[tuple[FakeCupy, DeviceLog]]:
    """Fake memory (CuPy's allocator routed to host buffers) and the fake device's log for the
    block; yields ``(xp, log)``."""
    with fake_memory() as memory:
        log = DeviceLog(memory)
        _active.append(log)
        try:
            yield FakeCupy(), log
        finally:
            _active.remove(log)


class DeviceSeam(RecordingSeam):
    """`tests.cupy_seam.RecordingSeam` whose answers are `FakeDeviceArray`s, so the user code
    that goes on with gpuscalar's results runs on this device too (a plain fake-memory array
    would stop at CUDA at its first operation)."""

    def _answer(self, launch: Launch) -> Any:
        if launch.kind == "device":  # this device's own operation, replayed by a graph
            return launch.func()
        if launch.kind == "cublas":
            return _blas(launch.name, launch.args)
        return super()._answer(launch)

    def blas(self, routine: str, *args: Any) -> None:
        super().blas(routine, *args)  # recorded (into a capture too) and checked
        if _capturing(_log()) is None:
            _blas(routine, args)

    def _device(self, value: Any) -> Any:
        made = super()._device(value)
        return made.view(FakeDeviceArray) if type(made) is cupy.ndarray else made

    def _elementwise_outputs(self, launch: Any) -> Any:
        made = super()._elementwise_outputs(launch)
        if isinstance(made, tuple):
            return tuple(_as_device(m) for m in made)
        return _as_device(made)


def _column_major(address: int, rows: int, cols: int, ld: int, dtype: np.dtype) -> np.ndarray:
    """The ``rows`` x ``cols`` matrix at a fake device address, stored as cuBLAS stores it."""
    size = dtype.itemsize * ((cols - 1) * ld + rows)
    raw = (ctypes.c_char * size).from_address(address)
    strides = (dtype.itemsize, ld * dtype.itemsize)
    return np.ndarray((rows, cols), dtype, buffer=raw, strides=strides)


def _blas(routine: str, args: tuple[int, ...]) -> None:
    """cuBLAS ``routine`` (gemv, gemm, strided-batched gemm; device pointer mode) computed
    with NumPy on the fake memory its pointer arguments name."""
    dtype = np.dtype(np.float32 if routine.startswith("cublasS") else np.float64)

    def scalar(address: int) -> Any:
        return _column_major(address, 1, 1, 1, dtype)[0, 0]

    def op(address: int, trans: int, rows: int, cols: int, ld: int) -> np.ndarray:
        # op(A) is rows x cols; A itself is stored transposed when trans is set
        if trans:
            return _column_major(address, cols, rows, ld, dtype).T
        return _column_major(address, rows, cols, ld, dtype)

    def gemm(ta: int, tb: int, m: int, n: int, k: int, alpha: int, a: int, lda: int, b: int,
             ldb: int, beta: int, c: int, ldc: int) -> None:
        out = _column_major(c, m, n, ldc, dtype)
        product = scalar(alpha) * (op(a, ta, m, k, lda) @ op(b, tb, k, n, ldb))
        out[...] = product if scalar(beta) == 0 else product + scalar(beta) * out

    if routine.endswith("gemm_v2"):
        gemm(*args[1:])
    elif routine.endswith("gemmStridedBatched"):
        (ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch) = args[1:]
        for i in range(batch):
            step = i * dtype.itemsize
            gemm(ta, tb, m, n, k, alpha, a + sa * step, lda, b + sb * step, ldb, beta,
                 c + sc * step, ldc)
    else:  # gemv: y = alpha op(A) x + beta y, A m x n
        trans, m, n, alpha, a, lda, x, incx, beta, y, incy = args[1:]
        rows, cols = (n, m) if trans else (m, n)
        vector = _column_major(x, 1, cols, incx, dtype)[0]
        out = _column_major(y, 1, rows, incy, dtype)[0]
        product = scalar(alpha) * (op(a, trans, rows, cols, lda) @ vector)
        out[...] = product if scalar(beta) == 0 else product + scalar(beta) * out


def _as_device(array: Any) -> Any:
    return array.view(FakeDeviceArray) if type(array) is cupy.ndarray else array


@contextlib.contextmanager
def fake_cupy_device() -> Iterator[tuple[FakeCupy, DeviceLog, DeviceSeam]]:
    """The fake device for user-level code and, as gpuscalar's CUDA seam, the recorder of
    `tests.cupy_seam` (each of gpuscalar's launches checked against CuPy, answered on this
    device); yields ``(xp, log, seam)``."""
    with fake_device() as (xp, log):
        seam = log.seam = DeviceSeam(log.memory)
        with CUPY.seam_replaced(seam):
            yield xp, log, seam
