"""gs.matmul's products on CuPy: cuBLAS called as a CUDA graph capture requires (the ``"blas"``
executor, `CupyBlas`), and `gs.dot`/`gs.vdot` while a graph is recorded.

Why this module exists: CuPy's own cuBLAS calls refuse stream capture (see
`gpuscalar.devices.cupy.cublas`), so `gpuscalar.matmul`'s front (argument checks, promotion,
shapes, the table of planned products) hands a CuPy product to this executor, which calls cuBLAS
on a handle of its own per device and stream, with a fixed workspace for what a graph records,
alpha and beta read from device memory: a product can be recorded and replayed, and alpha/beta
may be GPUScalars without a sync. Outside a capture the product goes through CuPy's Cython
binding on the same handle (cheaper on the host; cuBLAS's default workspace, as CuPy's own
products), inside one through ctypes after the fixed workspace is bound again
(`gpuscalar.devices.cupy.cublas.call`).

Layouts: cuBLAS is column-major; a row-major ``C = A @ B`` is computed as ``Cᵀ = Bᵀ Aᵀ`` on the
same buffers. An operand may be C-contiguous or a transposed (F-contiguous) view, and its rows may
be strided (``x[::2]``): the transposition becomes cuBLAS's op flag and the row stride its
leading dimension, so nothing is copied. 1-D operands use gemv, 3-D (batched, a 2-D operand
broadcast by a zero stride) use gemmStridedBatched. `plan` works this out from shapes and
strides alone, so it is tested on the CPU against NumPy.
"""

from __future__ import annotations

import atexit
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import ledger, sync
from ...backend import Backend, relative_extent
from ...lazy.expr import BoundedCache
from ...matmul import MATMUL_DTYPES, check_coefficient, matmul, product_shape
from ...scalar import GPUScalar, _array_of, asscalar
from . import cublas, products
from .backend import CUPY

__all__ = ["CupyBlas", "BlasCall", "plan", "MATMUL_DTYPES", "INT_MAX", "prepare",
           "release_stream", "close_handles", "handles_made"]

#: the cuBLAS routine letter of each dtype
_LETTERS = {np.dtype(np.float32): "S", np.dtype(np.float64): "D", np.dtype(np.complex64): "C",
            np.dtype(np.complex128): "Z"}


@dataclass(frozen=True)
class BlasCall:
    """One cuBLAS call for a row-major product, in cuBLAS's (column-major) terms.

    ``routine`` is ``"gemm"``, ``"gemv"`` or ``"gemm_batched"``. For gemm: ``C(m x n) =
    op(X) op(Y)`` where X is the buffer of operand ``x_is`` ("a" or "b"); for gemv: ``y(m') =
    op(X) x`` with X ``rows x cols``. Strides and leading dimensions are in elements.
    """

    routine: str
    x_is: str
    transx: int = cublas.OP_N
    transy: int = cublas.OP_N
    m: int = 0
    n: int = 0
    k: int = 0
    ldx: int = 0
    ldy: int = 0
    ldc: int = 0
    incx: int = 1
    incy: int = 1
    stridex: int = 0
    stridey: int = 0
    stridec: int = 0
    batch: int = 1


def _matrix(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
            what: str) -> tuple[int, int]:
    """A row-major matrix's buffer as cuBLAS sees it: (op that gives back the matrix, ld)."""
    rows, cols = shape
    if any(s % itemsize for s in strides):
        raise ValueError(f"gs.matmul: {what} has strides {strides} that are not whole elements")
    row_stride, col_stride = (s // itemsize for s in strides)
    if rows == 0 or cols == 0:  # nothing is read (NumPy's strides of an empty array vary)
        return cublas.OP_T, max(cols, 1)
    # a stride along an axis of length 1 is never used: read it as the contiguous one
    if col_stride == 1 or cols == 1:
        # row-major rows: as a column-major buffer this is the transpose, of leading dim ld
        ld = row_stride if rows > 1 else cols
        if ld >= cols:
            return cublas.OP_T, ld
    if row_stride == 1 or rows == 1:
        ld = col_stride if cols > 1 else rows
        if ld >= rows:
            return cublas.OP_N, ld
    raise ValueError(
        f"gs.matmul: {what} of shape {shape} has strides {strides}: it needs rows or columns that "
        "are contiguous (a C-contiguous array, a transposed view, or strided rows); pass a "
        "contiguous copy (xp.ascontiguousarray)"
    )


def _step(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """A vector's element step for cuBLAS (any positive step; 1 for a vector of one element)."""
    return strides[0] // itemsize if shape[0] > 1 else 1


#: cuBLAS takes sizes, leading dimensions, increments and batch counts as 32-bit ``int``
INT_MAX = 2**31 - 1
_INT_FIELDS = ("m", "n", "k", "ldx", "ldy", "ldc", "incx", "incy", "batch")


def plan(a_shape: tuple[int, ...], a_strides: tuple[int, ...], b_shape: tuple[int, ...],
         b_strides: tuple[int, ...], itemsize: int) -> tuple[BlasCall, tuple[int, ...]]:
    """The cuBLAS call computing ``a @ b`` into a new C-contiguous output, and its shape.

    Raises ``ValueError`` naming the shapes for operands that cannot be multiplied, for
    layouts cuBLAS cannot read without a copy, and for a size, leading dimension, increment or
    batch count beyond cuBLAS's 32-bit ``int`` (naming it).
    """
    call, shape = _plan(a_shape, a_strides, b_shape, b_strides, itemsize)
    for field in _INT_FIELDS:
        value = getattr(call, field)
        if value > INT_MAX:
            raise ValueError(
                f"gs.matmul: shapes {a_shape} and {b_shape} (strides {a_strides} and "
                f"{b_strides}) need cuBLAS {call.routine} argument {field} "
                f"({_meaning(call, field)}) = {value}, beyond its 32-bit int limit "
                f"({INT_MAX}); split the product into smaller ones"
            )
    return call, shape


def _meaning(call: BlasCall, field: str) -> str:
    """What a cuBLAS argument of ``call`` is, in terms of the operands a and b."""
    matrix = call.x_is
    other = "a" if matrix == "b" else "b"
    if field in ("m", "n", "k"):
        return "a size of the product"
    if field == "ldx":
        return f"the leading dimension of {matrix}"
    if field == "ldy":
        return f"the leading dimension of {other}"
    if field == "ldc":
        return "the leading dimension of the output"
    if field == "incx":
        return f"the element step of vector {other}"
    if field == "incy":
        return "the element step of the output"
    return "the batch count"


def _plan(a_shape: tuple[int, ...], a_strides: tuple[int, ...], b_shape: tuple[int, ...],
          b_strides: tuple[int, ...], itemsize: int) -> tuple[BlasCall, tuple[int, ...]]:
    product_shape(a_shape, b_shape)  # the shape rules every device shares
    k = a_shape[-1]
    for shape, strides, what in ((a_shape, a_strides, "a"), (b_shape, b_strides, "b")):
        if len(shape) == 1 and strides[0] <= 0 and shape[0] > 1:
            raise ValueError(f"gs.matmul: {what} has stride {strides[0]}; reversed or "
                             "broadcast vectors need a contiguous copy")
    if len(a_shape) == 1 and len(b_shape) == 1:  # a dot product
        step_a, incx = _step(a_shape, a_strides, itemsize), _step(b_shape, b_strides, itemsize)
        if step_a == 1:  # (k x 1)ᵀ b: gemv's transposed form sums one column in parallel
            return (BlasCall("gemv", "a", transx=cublas.OP_T, m=k, n=1, k=k, ldx=max(k, 1),
                             incx=incx, incy=1), ())
        # a 1 x k matrix times b (its row step the leading dimension): one thread sums the row
        return (BlasCall("gemv", "a", transx=cublas.OP_N, m=1, n=k, k=k, ldx=step_a,
                         incx=incx, incy=1), ())
    if len(b_shape) == 1:  # y(m) = A(m x k) x
        op, ld = _matrix(a_shape, a_strides, itemsize, "a")
        rows, cols = (k, a_shape[0]) if op == cublas.OP_T else (a_shape[0], k)
        return (BlasCall("gemv", "a", transx=op, m=rows, n=cols, k=k, ldx=ld,
                         incx=_step(b_shape, b_strides, itemsize), incy=1), (a_shape[0],))
    if len(a_shape) == 1:  # y(n) = x(k) B(k x n) = Bᵀ x
        op, ld = _matrix(b_shape, b_strides, itemsize, "b")
        flipped = cublas.OP_N if op == cublas.OP_T else cublas.OP_T
        rows, cols = (b_shape[1], k) if flipped == cublas.OP_N else (k, b_shape[1])
        return (BlasCall("gemv", "b", transx=flipped, m=rows, n=cols, k=k, ldx=ld,
                         incx=_step(a_shape, a_strides, itemsize), incy=1), (b_shape[1],))
    batch_a = a_shape[0] if len(a_shape) == 3 else 1
    batch_b = b_shape[0] if len(b_shape) == 3 else 1
    m, n = a_shape[-2], b_shape[-1]
    # Cᵀ (n x m, column-major) = Bᵀ (n x k) Aᵀ (k x m): X is b's buffer, Y is a's
    opx, ldx = _matrix(b_shape[-2:], b_strides[-2:], itemsize, "b")
    opy, ldy = _matrix(a_shape[-2:], a_strides[-2:], itemsize, "a")
    # _matrix gives the op recovering the row-major matrix; we need its transpose
    transx = cublas.OP_N if opx == cublas.OP_T else cublas.OP_T
    transy = cublas.OP_N if opy == cublas.OP_T else cublas.OP_T
    call = BlasCall("gemm", "b", transx=transx, transy=transy, m=n, n=m, k=k, ldx=ldx,
                    ldy=ldy, ldc=max(n, 1))
    if len(a_shape) == 2 and len(b_shape) == 2:
        return call, (m, n)
    batch = max(batch_a, batch_b)
    for shape, strides, what in ((a_shape, a_strides, "a"), (b_shape, b_strides, "b")):
        if len(shape) == 3 and shape[0] > 1 and strides[0] < 0:
            raise ValueError(f"gs.matmul: {what} steps backwards through its batch (stride "
                             f"{strides[0]}); pass a contiguous copy")
    stride_b = b_strides[0] // itemsize if len(b_shape) == 3 and batch_b > 1 else 0
    stride_a = a_strides[0] // itemsize if len(a_shape) == 3 and batch_a > 1 else 0
    return (BlasCall("gemm_batched", "b", transx=transx, transy=transy, m=n, n=m, k=k,
                     ldx=ldx, ldy=ldy, ldc=max(n, 1), stridex=stride_b, stridey=stride_a,
                     stridec=m * n, batch=batch), (batch, m, n))


class _Plan:
    """What `CupyBlas.matmul` decided for one kind of CuPy product (`run` makes it again):
    the routine, its arguments but the handle, alpha, beta and pointers, and the byte ranges of a
    and b relative to their data pointers (out's overlap is checked per call)."""

    __slots__ = ("shape", "dtype", "routine", "x_is_b", "head", "mid", "tail", "a_range",
                 "b_range", "last")

    def __init__(self, call: BlasCall, shape: tuple[int, ...], dtype: np.dtype, a: Any,
                 b: Any) -> None:
        self.shape, self.dtype = shape, dtype
        letter = _LETTERS[dtype]
        self.x_is_b = call.x_is == "b"
        if call.routine == "gemm":
            self.routine = f"cublas{letter}gemm_v2"
            self.head: tuple[int, ...] = (call.transx, call.transy, call.m, call.n, call.k)
            self.mid: tuple[int, ...] = (call.ldx,)
            self.tail: tuple[int, ...] = (call.ldy,)
            self.last: tuple[int, ...] = (call.ldc,)
        elif call.routine == "gemm_batched":
            self.routine = f"cublas{letter}gemmStridedBatched"
            self.head = (call.transx, call.transy, call.m, call.n, call.k)
            self.mid, self.tail = (call.ldx, call.stridex), (call.ldy, call.stridey)
            self.last = (call.ldc, call.stridec, call.batch)
        else:
            self.routine = f"cublas{letter}gemv_v2"
            self.head = (call.transx, call.m, call.n)
            self.mid, self.tail = (call.ldx,), (call.incx,)
            self.last = (call.incy,)
        self.a_range, self.b_range = relative_extent(a), relative_extent(b)

    def run(self, a: Any, b: Any, out: Any, alpha: Any = None, beta: Any = None,
            entered: bool = False) -> Any:
        """The planned product again: the per-call checks (devices, out's overlap, alpha and
        beta), then the cuBLAS call, as `CupyBlas.matmul` would make it. On the operands' device:
        when it is not current, `run` runs again inside its context (``entered``)."""
        a_data, b_data = a.data, b.data
        device = a_data.device_id
        if b_data.device_id != device:
            raise ValueError(f"gs.matmul: a is on device {device!r} but b on "
                             f"{b_data.device_id!r}")
        seam = CUPY.seam
        if not entered and not seam.is_current_device(device):
            with seam.device_context(device):
                return self.run(a, b, out, alpha, beta, True)
        a_ptr, b_ptr = a_data.ptr, b_data.ptr
        if out is not None:
            out_data = out.data
            if out_data.device_id != device:
                raise ValueError(f"gs.matmul: out is on device {out_data.device_id!r} but a on "
                                 f"{device!r}")
            out_ptr = out_data.ptr
            size = out.nbytes
            for ptr, (lo, hi), what in ((a_ptr, self.a_range, "a"), (b_ptr, self.b_range, "b")):
                if out_ptr < ptr + hi and ptr + lo < out_ptr + size:
                    raise ValueError(f"gs.matmul: out overlaps {what} in memory (cuBLAS would "
                                     "read it while writing it); pass a separate out")
        scale: tuple[Any, ...] | None
        if alpha is None and beta is None:
            scale = _DEFAULTS.get((device, self.dtype))
            if scale is None:
                scale = _defaults(device, self.dtype)
        else:  # as `_matmul` reads them (a fill kernel for a number but 1 or 0; a cast, ...)
            scale = (_coefficient(check_coefficient(alpha, 1.0, "alpha", CUPY, device, self.dtype),
                                  device, self.dtype, a).data.ptr,
                     _coefficient(check_coefficient(beta, 0.0, "beta", CUPY, device, self.dtype),
                                  device, self.dtype, a).data.ptr)
        if out is None:
            out = CUPY.xp.ndarray(self.shape, self.dtype)  # (xp.empty's C-ordered array)
            out_ptr = out.data.ptr
        stream = seam.current_stream()
        handle = _HANDLES.get((device, stream.ptr))
        if handle is None:
            handle = _new_handle(CUPY, (device, stream.ptr), stream)
        if not handle.recorded and stream.is_capturing():
            handle.recorded = True  # a graph now reads its workspace: see _stream_gone
        x_ptr, y_ptr = (b_ptr, a_ptr) if self.x_is_b else (a_ptr, b_ptr)
        sync.note_device_op()  # one cuBLAS launch
        with handle.lock:
            seam.blas(self.routine, handle.value, *self.head, scale[0], x_ptr, *self.mid, y_ptr,
                      *self.tail, scale[1], out_ptr, *self.last)
        return out


#: (device, dtype) -> the data pointers of the constants 1 and 0 (`_device_constant`), and the
#: arrays holding them
_DEFAULTS: dict[tuple[Any, np.dtype], tuple[int, int, Any, Any]] = CUPY.seam_cache({})


def _defaults(device: object, dtype: np.dtype) -> tuple[int, int, Any, Any]:
    one = _device_constant(CUPY, device, dtype, 1.0)
    zero = _device_constant(CUPY, device, dtype, 0.0)
    found = _DEFAULTS[(device, dtype)] = (one.data.ptr, zero.data.ptr, one, zero)
    return found


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The byte strides of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _empty_sum(backend: Backend, device: object, shape: tuple[int, ...], dtype: np.dtype,
               out: Any, beta: Any) -> Any:
    """A product with nothing to sum (``k == 0``) or nothing to write: zeros, or beta * out."""
    xp = backend.xp
    with backend.device_context(device):
        if out is None:
            return backend.call(xp.zeros, shape, dtype=dtype)
        if out.size:
            if beta is None:
                backend.call(out.fill, 0)
            else:
                backend.call(xp.multiply, out, beta, out=out)
    return out


def _coefficient(value: Any, device: object, dtype: np.dtype, like: Any) -> Any:
    """alpha or beta (checked by `check_coefficient`) as cuBLAS reads it: a 0-d device array of
    the product's dtype (read through a device pointer)."""
    if isinstance(value, GPUScalar):
        return _array_of(asscalar(value, dtype=dtype))
    number = complex(value)
    if number.imag == 0 and number.real in _KEPT_VALUES:
        return _device_constant(CUPY, device, dtype, number.real)
    # Any other number: written on the current stream by a fill kernel that takes it as an
    # argument (one counted launch; no stream of its own, no wait, nothing kept per value, and
    # inside a capture the number is baked into the graph like every kernel argument).
    return _array_of(asscalar(value, like=like, dtype=dtype))


#: The Python alpha/beta values kept as device constants: the defaults 1 and 0 (made before a
#: capture by `prepare`), compared by value; the constant itself is keyed by bits (0.0, -0.0).
_KEPT_VALUES = frozenset({1.0, 0.0})


_constants_lock = threading.RLock()
#: (device, dtype, the value's bits) -> a 0-d device array: a Python alpha/beta, made once, kept
_CONSTANTS: dict[tuple[Any, np.dtype, str], Any] = CUPY.seam_cache({})


def _device_constant(backend: Backend, device: object, dtype: np.dtype, value: float) -> Any:
    """A 0-d device array holding ``value`` (1 or 0, the defaults), made once and kept. It is
    written on a stream of its own and waited for, from the default memory pool: made during a
    capture, it must hold
    its value at once (not at the first replay) and outlive the step. In a captured step the
    Python number is baked into the graph, as every Python number is. Not counted as a device
    op: a one-time upload, like compiling a kernel."""
    key = (device, dtype, value.hex())  # by bits: -0.0 and nan are keys like any other
    found = _CONSTANTS.get(key)
    if found is None:
        xp = backend.xp
        with _constants_lock, backend.device_context(device):
            found = _CONSTANTS.get(key)
            if found is None:
                seam = CUPY.seam
                side = seam.new_stream()
                with side, seam.using_allocator(seam.default_memory_pool().malloc):
                    found = seam.launch(xp.full, ((), value), {"dtype": dtype})  # uncounted
                side.synchronize()  # (a wait for an upload, not a value read)
                _CONSTANTS[key] = found
    return found


# ---- the executor (gs.matmul, gs.dot, gs.vdot) ---------------------------------------------------


def _recorded() -> bool:
    """Whether CuPy work issued now is recorded into a CUDA graph (a loop, branch or captured
    body, or a capture of the user's own): CuPy's cuBLAS refuses the stream then."""
    return ledger.in_graph_body() or bool(CUPY.seam.current_stream().is_capturing())


def _same_length(a: Any, b: Any, function: str) -> None:
    if a.size != b.size:
        raise ValueError(f"gs.{function}: the vectors have different lengths ({a.size} and "
                         f"{b.size})")


class CupyBlas:
    """CuPy's ``"blas"`` executor (`gpuscalar.matmul.Blas`): cuBLAS on gpuscalar's handles."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def operands(self, a: Any, b: Any, dtype: np.dtype) -> tuple[Any, Any, BlasCall]:
        """The sizes first, as cuBLAS would see C-contiguous operands (nothing launched yet),
        then the operand of the other dtype converted (a copy), then the layouts."""
        plan(a.shape, _c_strides(a.shape, dtype.itemsize), b.shape,
             _c_strides(b.shape, dtype.itemsize), dtype.itemsize)
        backend = self.backend
        a, b = (operand if operand.dtype == dtype else backend.call(operand.astype, dtype)
                for operand in (a, b))
        return a, b, plan(a.shape, a.strides, b.shape, b.strides, dtype.itemsize)[0]

    def coefficient(self, value: Any, device: object, dtype: np.dtype, like: Any) -> Any:
        return _coefficient(value, device, dtype, like)

    def matmul(self, call: BlasCall, a: Any, b: Any, out: Any, alpha: Any, beta: Any,
               reads_out: bool, shape: tuple[int, ...], dtype: np.dtype, plans: BoundedCache,
               key: tuple[Any, ...] | None) -> Any:
        backend = self.backend
        device = backend.device_of(a)
        if call.k == 0 or 0 in shape:  # cuBLAS may return early without writing the output
            return _empty_sum(backend, device, shape, dtype, out, beta if reads_out else None)
        if key is not None:
            plans.get(key, _Plan, call, shape, dtype, a, b)
        if out is None:
            with backend.device_context(device):
                out = backend.xp.empty(shape, dtype=dtype)
        _launch(backend, call, a, b, out, alpha, beta)
        return out

    def dot(self, a: Any, b: Any) -> Any:
        """``xp.dot(a, b)`` that also works where a graph is recorded (`gs.dot`). Two floating
        or complex vectors: gpuscalar's dot kernel (`products.dot`) always, so a dot is the same
        bits in and out of a recording, and the cheapest route measured, host and device
        (docs/benchmarks.md, "Vector products"). Other operands: ``cupy.dot`` outside a
        recording; while recording, matrices `matmul` (gpuscalar's cuBLAS handle; an N-d
        operand reshaped to a matrix, copied where it must be), a 0-d operand CuPy's multiply.
        Mixed dtypes promote as ``xp.dot`` promotes."""
        backend = self.backend
        dtype = np.result_type(a.dtype, b.dtype)
        if dtype not in MATMUL_DTYPES or 0 in (a.ndim, b.ndim):
            return backend.call(backend.xp.dot, a, b)
        if a.ndim == 1 and b.ndim == 1:
            _same_length(a, b, "dot")
            a, b = (v if v.dtype in MATMUL_DTYPES else backend.call(v.astype, dtype)
                    for v in (a, b))
            return products.dot(a, b, conj=False)
        if not _recorded():
            return backend.call(backend.xp.dot, a, b)
        if a.ndim <= 2 and b.ndim <= 2:
            return matmul(*(v if v.dtype in MATMUL_DTYPES else backend.call(v.astype, dtype)
                            for v in (a, b)))
        inner = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if a.shape[-1] != inner:
            raise ValueError(f"gs.dot: shapes {a.shape} and {b.shape} are not aligned "
                             f"({a.shape[-1]} != {inner})")
        xp = backend.xp
        rows = backend.call(xp.ascontiguousarray, a, dtype=dtype).reshape(-1, inner)
        if b.ndim == 1:
            return matmul(rows, backend.call(xp.ascontiguousarray, b, dtype=dtype)).reshape(
                a.shape[:-1])
        moved = xp.moveaxis(b, -2, 0)  # (K, ..., N): a view
        columns = backend.call(xp.ascontiguousarray, moved, dtype=dtype).reshape(inner, -1)
        return matmul(rows, columns).reshape(a.shape[:-1] + b.shape[:-2] + b.shape[-1:])

    def vdot(self, a: Any, b: Any) -> Any:
        """``xp.vdot(a, b)`` (``a`` conjugated, both flattened) that also works where a graph is
        recorded (`gs.vdot`): as `dot`, gpuscalar's dot kernel for floating and complex
        operands, in a recording or not."""
        backend = self.backend
        dtype = np.result_type(a.dtype, b.dtype)
        if dtype not in MATMUL_DTYPES:
            return backend.call(backend.xp.vdot, a, b)
        _same_length(a, b, "vdot")
        flat = []
        for v in (a, b):
            if v.dtype not in MATMUL_DTYPES:
                v = backend.call(v.astype, dtype)
            flat.append(v.reshape(-1) if v.flags.c_contiguous else backend.call(
                backend.xp.ravel, v))
        return products.dot(flat[0], flat[1], conj=True)


# ---- CuPy: the cuBLAS handles ------------------------------------------------------------------
#
# One handle (and 32 MiB workspace for recorded products) per device and stream. A handle
# lives as long as its stream: a captured step's private stream is released with the step
# (`release_stream`); any other stream object is watched (weakref.finalize), and when it is
# garbage-collected its handle leaves the table at once (a new stream may reuse the pointer) and
# is destroyed at the next safe moment: never inside a finalizer, which may run while a graph is
# being recorded (destroying a handle waits for the device, which would invalidate it). A handle
# that recorded into a graph on a stream gpuscalar does not own (the user's own capture) is kept
# until exit, since that graph reads its workspace.

# re-entrant: a garbage-collected captured step's finalizer may release handles (through
# `release_stream`) while this thread holds the lock making a handle
_handles_lock = threading.RLock()
#: (device, stream pointer) -> gpuscalar's cuBLAS handle bound to that stream
_HANDLES: dict[tuple[object, int], cublas.Handle] = CUPY.seam_cache({})
#: handles whose stream object is gone: destroyed at the next safe moment (`_drain`)
_DOOMED: list[cublas.Handle] = []
#: handles whose stream is gone but that a graph of the user's own capture may still use
_KEPT: list[cublas.Handle] = []
_exit_hook: list[bool] = []  # close_handles registered with atexit


def _handle(backend: Backend, device: object, stream: Any) -> cublas.Handle:
    """The cuBLAS handle for ``stream`` (a CuPy stream object) on ``device`` (the current
    device), made on first use. One per stream: work on two streams never shares a workspace."""
    key = (device, stream.ptr)
    handle = _HANDLES.get(key)
    if handle is None:
        handle = _new_handle(backend, key, stream)
    return handle


def _new_handle(backend: Backend, key: tuple[object, int], stream: Any) -> cublas.Handle:
    if _DOOMED and not stream.is_capturing():
        _drain()
    with _handles_lock:
        handle = _HANDLES.get(key)
        if handle is None:
            if not _exit_hook:
                atexit.register(close_handles)
                _exit_hook.append(True)
            # the workspace straight from CUDA, not a memory pool: a pool would keep it,
            # once freed, for the stream it was allocated on (which may be gone by then)
            handle = CUPY.seam.blas_handle(stream)
            _HANDLES[key] = handle
            try:
                watcher = weakref.finalize(stream, _stream_gone, key, handle)
            except TypeError:  # a stream object without weak references: kept until exit
                pass
            else:
                watcher.atexit = False
    return handle


def _stream_gone(key: tuple[object, int], handle: cublas.Handle) -> None:
    """A watched stream object was garbage-collected: its handle leaves the table now and is
    destroyed later (this runs inside the garbage collector, perhaps during a recording)."""
    with _handles_lock:
        if _HANDLES.get(key) is not handle:
            return  # released already (a captured step's stream)
        del _HANDLES[key]
        (_KEPT if getattr(handle, "recorded", False) else _DOOMED).append(handle)


def _drain() -> None:
    """Destroy the handles of streams that are gone, unless a graph is being recorded."""
    if ledger.recordings_under_way() or ledger.in_graph_body():
        return
    with _handles_lock:
        doomed = _DOOMED[:]
        del _DOOMED[:]
    for handle in doomed:
        try:
            handle.close()
        except cublas.CublasError as failure:
            warnings.warn(f"gs.matmul: destroying the cuBLAS handle of a stream that is gone "
                          f"failed: {failure}", RuntimeWarning, stacklevel=2)


def handles_made() -> bool:
    """Whether this process has made a cuBLAS handle (called gs.matmul on CuPy)."""
    return bool(_exit_hook)


def prepare(backend: Backend, device: object, stream: Any, *, handle: bool) -> None:
    """Make, before a graph is recorded on ``stream``, what `matmul` would otherwise make while
    recording: the default alpha/beta constants (1 and 0, float32 and float64) on ``device``,
    and with ``handle`` the stream's cuBLAS handle and workspace (skipped when cuBLAS cannot be
    loaded: a product in the step then raises that error itself)."""
    with backend.device_context(device):
        for dtype in MATMUL_DTYPES:
            for value in (1.0, 0.0):
                _device_constant(backend, device, dtype, value)
        if handle:
            try:
                _handle(backend, device, stream)
            except cublas.CublasError:
                pass


def release_stream(stream_ptr: int) -> None:
    """Destroy the handles bound to ``stream_ptr`` (its stream is going away; a captured step
    calls this when it is released), and those of streams that are gone. cuBLAS waits for the
    device first."""
    with _handles_lock:
        doomed = [_HANDLES.pop(key) for key in [k for k in _HANDLES if k[1] == stream_ptr]]
    for handle in doomed:
        handle.close()
    if _DOOMED:
        _drain()


def close_handles() -> None:
    """Destroy every cuBLAS handle gpuscalar made (registered to run at exit)."""
    with _handles_lock:
        doomed = [*_HANDLES.values(), *_DOOMED, *_KEPT]
        _HANDLES.clear()
        del _DOOMED[:], _KEPT[:]
    for handle in doomed:
        try:
            handle.close()
        except cublas.CublasError:  # at exit the driver may be gone first: nothing to free
            pass


# ---- CuPy: the cuBLAS call ----------------------------------------------------------------------


def _launch(backend: Backend, call: BlasCall, a: Any, b: Any, out: Any, alpha: Any,
            beta: Any) -> None:
    seam = CUPY.seam
    device = backend.device_of(a)
    with backend.device_context(device):
        stream = seam.current_stream()
        handle = _handle(backend, device, stream)
        if not handle.recorded and stream.is_capturing():
            handle.recorded = True  # a graph now reads its workspace: see _stream_gone
        letter = _LETTERS[out.dtype]
        x, y = (b, a) if call.x_is == "b" else (a, b)
        alpha_ptr, beta_ptr = alpha.data.ptr, beta.data.ptr
        sync.note_device_op()  # one cuBLAS launch
        with handle.lock:
            if call.routine == "gemm":
                seam.blas(f"cublas{letter}gemm_v2", handle.value, call.transx, call.transy,
                          call.m, call.n, call.k, alpha_ptr, x.data.ptr, call.ldx,
                          y.data.ptr, call.ldy, beta_ptr, out.data.ptr, call.ldc)
            elif call.routine == "gemm_batched":
                seam.blas(f"cublas{letter}gemmStridedBatched", handle.value, call.transx,
                          call.transy, call.m, call.n, call.k, alpha_ptr, x.data.ptr,
                          call.ldx, call.stridex, y.data.ptr, call.ldy, call.stridey,
                          beta_ptr, out.data.ptr, call.ldc, call.stridec, call.batch)
            else:
                vector = b if call.x_is == "a" else a
                seam.blas(f"cublas{letter}gemv_v2", handle.value, call.transx, call.m,
                          call.n, alpha_ptr, x.data.ptr, call.ldx, vector.data.ptr,
                          call.incx, beta_ptr, out.data.ptr, call.incy)
