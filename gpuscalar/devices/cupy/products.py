"""Vector dot products and CSR matrix-vector products that a CUDA graph can record.

Why this module exists: CuPy computes ``cupy.dot``/``cupy.vdot`` of floating vectors with
cuBLAS and ``csr_matrix @ x`` with cuSPARSE, and both libraries refuse a stream that captures
(``NotImplementedError: calling cuBLAS API during stream capture is currently unsupported``), so
neither can run in a `gs.while_loop`/`gs.cond` body or a `gs.capture` step. The kernels here are
gpuscalar's own (compiled from the sources below by NVRTC, launched through the seam): no
library handle, no host-to-device copy, nothing allocated but the result (and, for long vectors,
a vector of per-block partial sums), so they record like any kernel.

- ``dot``: ``sum(x[i] * y[i])`` (``conj(x[i])`` for ``vdot``) over two strided vectors of any
  float or complex dtypes, accumulated in their promoted dtype (``numpy.result_type``, as
  ``xp.dot`` promotes). One block (``BLOCK`` threads, a tree reduction in shared memory) for up
  to ``BLOCK * PER_THREAD`` elements: one launch; above, up to ``MAX_BLOCKS`` blocks write
  partial sums and a second one-block launch adds them. Deterministic: the order of additions
  depends only on the length.
- ``csr_matvec``: ``y = A @ x`` for a CSR matrix (int32 or int64 ``indptr``/``indices``, as
  ``cupyx.scipy.sparse`` has them), one thread per row (grid-stride), ``x`` and ``y`` strided.

`CupySparse` is CuPy's ``"sparse"`` executor (`gpuscalar.sparse.SparseProducts`): cupyx's CSR
matrices multiplied by ``csr_matvec``. On NumPy and the strict device the same products are
computed on the host (NumPy's ``dot``, ``vdot``, SciPy's CSR product), each one counted device
op: see `gpuscalar.devices.host`.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np

from ...backend import Backend, relative_extent
from ...sparse import SPARSE_DTYPES, format_in
from .backend import CUPY

__all__ = ["PRODUCT_DTYPES", "DOT_PREFIX", "BLOCK", "PER_THREAD", "MAX_BLOCKS", "C_NAMES",
           "INDEX_C_NAMES", "dot_source", "dot_kernel_names", "csr_source", "csr_kernel_name",
           "dot", "csr_matvec", "blocks_for", "CupySparse"]

#: the dtypes gpuscalar's product kernels (and gs.matmul's cuBLAS routines) take
PRODUCT_DTYPES = SPARSE_DTYPES
#: each dtype's C type in the kernels (``cfloat``/``cdouble``: CuPy's ``complex<T>``)
C_NAMES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
           np.dtype(np.complex64): "cfloat", np.dtype(np.complex128): "cdouble"}
#: threads per block of the dot kernels (the shared-memory tree is sized for it)
BLOCK = 256
#: elements each thread adds, at least, before a second block is used
PER_THREAD = 8
#: the most blocks a dot uses (their partial sums are added by one block)
MAX_BLOCKS = 1024

_PRELUDE = r"""#include <cupy/complex.cuh>
typedef complex<float> cfloat;
typedef complex<double> cdouble;
__device__ inline float gs_conj(float v) { return v; }
__device__ inline double gs_conj(double v) { return v; }
__device__ inline cfloat gs_conj(cfloat v) { return conj(v); }
__device__ inline cdouble gs_conj(cdouble v) { return conj(v); }
"""

_BLOCK_SUM = r"""
template <typename R>
__device__ void gs_block_sum(R acc, R* out) {
    __shared__ __align__(16) unsigned char raw[%(block)d * sizeof(R)];
    R* part = reinterpret_cast<R*>(raw);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = %(block)d / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] = part[threadIdx.x] + part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}
"""

# (each signature on one line: tests/cupy_seam.py's parse_kernel reads it that way)
_DOT = (
    '\nextern "C" __global__ void %(dot)s(const %(x)s* x, long long incx, const %(y)s* y, '
    'long long incy, long long n, int conj_x, %(r)s* out) {'
) + r"""
    %(r)s acc = %(r)s(0);
    long long step = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        %(r)s a = %(r)s(x[i * incx]);
        if (conj_x) a = gs_conj(a);
        acc += a * %(r)s(y[i * incy]);
    }
    gs_block_sum(acc, out);
}

extern "C" __global__ void %(sum)s(const %(r)s* partial, long long n, %(r)s* out) {
    %(r)s acc = %(r)s(0);
    for (long long i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    gs_block_sum(acc, out);
}
"""

_CSR = (
    '\nextern "C" __global__ void %(name)s(const %(i)s* indptr, const %(i)s* indices, '
    'const %(a)s* data, const %(x)s* x, long long incx, long long rows, %(r)s* y, '
    'long long incy) {'
) + r"""
    long long step = (long long)blockDim.x * gridDim.x;
    long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long row = first; row < rows; row += step) {
        %(r)s acc = %(r)s(0);
        %(i)s end = indptr[row + 1];
        for (%(i)s j = indptr[row]; j < end; ++j) {
            acc += %(r)s(data[j]) * %(r)s(x[(long long)indices[j] * incx]);
        }
        y[row * incy] = acc;
    }
}
"""


def _tag(*dtypes: np.dtype) -> str:
    return "_".join(dtype.name for dtype in dtypes)


#: how the names of the dot kernels begin
DOT_PREFIX = "gpuscalar_dot_"


def dot_kernel_names(x: np.dtype, y: np.dtype) -> tuple[str, str]:
    """The names of the dot kernel and of its partial-sum kernel for these operand dtypes."""
    r = np.result_type(x, y)
    return f"{DOT_PREFIX}{_tag(x, y, r)}", f"{DOT_PREFIX}sum_{_tag(r)}"


@functools.lru_cache(maxsize=64)  # (a few dtype pairs; made anew, the text cost ~140k instructions)
def dot_source(x: np.dtype, y: np.dtype) -> str:
    """The CUDA C of the dot kernels for operands of dtypes ``x`` and ``y`` (both in
    `PRODUCT_DTYPES`), accumulating in their promoted dtype."""
    x, y = np.dtype(x), np.dtype(y)
    r = np.result_type(x, y)
    dot_name, sum_name = dot_kernel_names(x, y)
    return _PRELUDE + _BLOCK_SUM % {"block": BLOCK} + _DOT % {
        "dot": dot_name, "sum": sum_name, "x": C_NAMES[x], "y": C_NAMES[y], "r": C_NAMES[r]}


#: the index dtypes of CSR matrices the kernel reads, and their C types
INDEX_C_NAMES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}


_INT32 = np.dtype(np.int32)


def csr_kernel_name(data: np.dtype, x: np.dtype, index: np.dtype = _INT32) -> str:
    r = np.result_type(data, x)
    return f"gpuscalar_csr_matvec_{_tag(np.dtype(index), np.dtype(data), np.dtype(x), r)}"


@functools.lru_cache(maxsize=64)
def csr_source(data: np.dtype, x: np.dtype, index: np.dtype = _INT32) -> str:
    """The CUDA C of the CSR matrix-vector kernel for matrix values of dtype ``data``, a
    vector of dtype ``x`` (both in `PRODUCT_DTYPES`) and indices of dtype ``index`` (int32 or
    int64, for ``indptr`` and ``indices`` alike)."""
    data, x, index = np.dtype(data), np.dtype(x), np.dtype(index)
    r = np.result_type(data, x)
    return _PRELUDE + _CSR % {"name": csr_kernel_name(data, x, index), "a": C_NAMES[data],
                              "x": C_NAMES[x], "r": C_NAMES[r], "i": INDEX_C_NAMES[index]}


def blocks_for(n: int) -> int:
    """How many blocks the dot of ``n`` elements uses (1: one launch, no partial sums)."""
    return max(1, min(-(-n // (BLOCK * PER_THREAD)), MAX_BLOCKS))


_UNIT_STEP = np.int64(1)


def _step(array: Any) -> np.int64:
    """A 1-D array's element step (any sign; 1 for fewer than two elements)."""
    stride, itemsize = array.strides[0], array.itemsize
    if stride == itemsize or array.shape[0] < 2:
        return _UNIT_STEP
    return np.int64(stride // itemsize)


def dot(x: Any, y: Any, conj: bool) -> Any:
    """``sum(x * y)`` (``conj(x)`` first with ``conj``) of two CuPy vectors of equal length and
    dtypes in `PRODUCT_DTYPES`, as a new 0-d CuPy array of their promoted dtype: one launch,
    two above ``BLOCK * PER_THREAD`` elements (counted device ops). Capture-safe. On ``x``'s
    device (entered only when it is not current)."""
    device = x.data.device_id
    if CUPY.seam.is_current_device(device):
        return _dot(x, y, conj)
    with CUPY.seam.device_context(device):
        return _dot(x, y, conj)


def _dot(x: Any, y: Any, conj: bool) -> Any:
    source, dot_name, sum_name, r = _dot_plan(x.dtype, y.dtype)
    n = x.shape[0]
    blocks = blocks_for(n)
    out = CUPY.xp.ndarray((), r)
    target = out if blocks == 1 else CUPY.xp.ndarray((blocks,), r)
    CUPY.launch_kernel(source, dot_name, n, (x, _step(x), y, _step(y), np.int64(n),
                                             _CONJ[conj], target), grid=blocks, block=BLOCK)
    if blocks > 1:
        CUPY.launch_kernel(source, sum_name, blocks, (target, np.int64(blocks), out), grid=1,
                           block=BLOCK)
    return out


#: the dot kernel's ``conj`` argument (an ``int``), by the flag
_CONJ = {False: np.int32(0), True: np.int32(1)}


@functools.lru_cache(maxsize=64)
def _dot_plan(x: np.dtype, y: np.dtype) -> tuple[str, str, str, np.dtype]:
    """`dot`'s kernel text, kernel names and result dtype for operands of dtypes ``x``, ``y``."""
    return (dot_source(x, y), *dot_kernel_names(x, y), np.result_type(x, y))


def csr_matvec(indptr: Any, indices: Any, data: Any, x: Any, y: Any) -> None:
    """``y[...] = A @ x`` for the CSR matrix (``indptr``, ``indices``, ``data``) of
    ``y.shape[0]`` rows, on CuPy: one counted launch, capture-safe. Shapes, dtypes and index
    types (one of `INDEX_C_NAMES`, both alike) are checked by the caller (`gpuscalar.sparse`)."""
    rows = int(y.shape[0])
    index = indices.dtype
    CUPY.launch_kernel(csr_source(data.dtype, x.dtype, index),
                       csr_kernel_name(data.dtype, x.dtype, index), rows,
                       (indptr, indices, data, x, _step(x), np.int64(rows), y, _step(y)))


# ---- the "sparse" executor (gs.spmv, gs.as_csr) ---------------------------------------------


def _extent(array: Any) -> tuple[int, int]:
    """The byte range a CuPy array's elements occupy."""
    if array.size == 0:
        return (0, 0)
    start, end = relative_extent(array)
    pointer = int(array.data.ptr)
    return pointer + start, pointer + end


class CupySparse:
    """CuPy's ``"sparse"`` executor (`gpuscalar.sparse.SparseProducts`):
    ``cupyx.scipy.sparse`` matrices, the CSR product by gpuscalar's kernel (`csr_matvec`)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def format_of(self, value: Any) -> str | None:
        return format_in("cupyx.scipy.sparse", value)

    def overlaps(self, out: Any, x: Any) -> bool:
        if self.backend.data_address(out) == self.backend.data_address(x):
            return True
        (x0, x1), (y0, y1) = _extent(out), _extent(x)
        return x0 < x1 and y0 < y1 and x0 < y1 and y0 < x1

    def spmv(self, matrix: Any, x: Any, out: Any, rows: int, dtype: np.dtype,
             device: object) -> Any:
        if matrix.indices.dtype != matrix.indptr.dtype or (
                matrix.indices.dtype not in INDEX_C_NAMES):
            raise TypeError(f"gs.spmv: A's indices are {matrix.indices.dtype} and its indptr "
                            f"{matrix.indptr.dtype}; the kernel reads int32 or int64, both alike")
        backend = self.backend
        with backend.device_context(device):
            if out is None:
                out = backend.xp.empty((rows,), dtype=dtype)
            csr_matvec(matrix.indptr, matrix.indices, matrix.data, x, out)
        return out

    def as_csr(self, host: Any, like: Any) -> Any:
        cupyx_sparse = importlib.import_module("cupyx.scipy.sparse")  # only for CuPy arrays
        backend = self.backend
        xp = backend.xp
        with backend.device_context(backend.device_of(like)):
            parts = [backend.call(xp.asarray, part) for part in (host.data, host.indices,
                                                                  host.indptr)]
            return cupyx_sparse.csr_matrix(tuple(parts), shape=host.shape)
