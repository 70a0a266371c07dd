"""CSR sparse matrix-vector products that work in device loops and captured steps: `gs.spmv`.

Why this module exists: the matrices ``cupyx.scipy.sparse.linalg``'s solvers exist for are
sparse, and CuPy's ``A @ x`` calls cuSPARSE, which refuses a stream being captured, so a
sparse product cannot sit in a `gs.while_loop` body or a `gs.capture` step with CuPy alone.
``gs.spmv(A, x, out=None)`` computes ``A @ x`` for a CSR matrix on every device:

- CuPy: ``cupyx.scipy.sparse.csr_matrix`` with gpuscalar's own kernel
  (`gpuscalar.devices.cupy.products`: one thread per row, int32 or int64 indices), one launch, no
  library handle, no host-to-device copy: recordable in every body, and the same path outside one;
- NumPy: ``scipy.sparse`` CSR matrices and arrays (``csr_matrix``/``csr_array``), SciPy's
  product on the host (one counted device op);
- the strict device: `gpuscalar.devices.strict.sparse.csr_matrix`, CuPy's class with strict arrays
  (its own ``A @ x`` is refused in bodies, as cuSPARSE's is in CuPy), the host product (one
  device op).

Every float and complex dtype (float32/64, complex64/128); the matrix and the vector may
differ, the result has their promoted dtype (``numpy.result_type``). `as_csr` puts a SciPy
matrix on the device of an array, for code that runs on every device (tests, solvers).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from .backend import Backend, relative_extent
from .devices import CUPY, NUMPY, STRICT, backend_of
from .devices.cupy import products
from .devices.strict import sparse as strict_sparse

__all__ = ["spmv", "as_csr", "is_sparse", "sparse_format", "SPARSE_DTYPES"]

#: the dtypes of matrices and vectors `spmv` multiplies
SPARSE_DTYPES = products.PRODUCT_DTYPES

_DTYPE_NAMES = "float32, float64, complex64 or complex128"


def sparse_format(value: Any) -> str | None:
    """The format (``"csr"``, ``"csc"``, ``"coo"`` ...) of a SciPy, cupyx or strict sparse
    matrix; None for anything else (no import, no device work)."""
    kind = type(value)
    if kind is strict_sparse.csr_matrix:
        return "csr"
    module = kind.__module__ or ""
    if module.startswith(("scipy.sparse", "cupyx.scipy.sparse")):
        found = getattr(value, "format", None)
        return found if isinstance(found, str) else None
    return None


def is_sparse(value: Any) -> bool:
    """Whether ``value`` is a SciPy, cupyx or strict sparse matrix (of any format)."""
    return sparse_format(value) is not None


def _matrix_backend(matrix: Any) -> Backend:
    kind = type(matrix)
    if kind is strict_sparse.csr_matrix:
        return STRICT
    if (kind.__module__ or "").startswith("cupyx"):
        return CUPY
    return NUMPY


def _check_matrix(matrix: Any) -> Backend:
    found = sparse_format(matrix)
    if found is None:
        backend = backend_of(matrix)
        hint = (" (a dense array: use gs.matmul)" if backend is not None else "")
        raise TypeError(f"gs.spmv: A must be a CSR sparse matrix (scipy.sparse, "
                        f"cupyx.scipy.sparse or gpuscalar.devices.strict.sparse), got "
                        f"{type(matrix).__name__}{hint}")
    if found != "csr":
        raise TypeError(f"gs.spmv: A is a {found.upper()} matrix; gs.spmv multiplies CSR "
                        "matrices: convert it once, before the loop, with A.tocsr()")
    dtype = np.dtype(matrix.data.dtype)
    if dtype not in SPARSE_DTYPES:
        raise TypeError(f"gs.spmv: A has dtype {dtype}; it must be {_DTYPE_NAMES}")
    if len(matrix.shape) != 2:
        raise ValueError(f"gs.spmv: A must be 2-D, got shape {matrix.shape}")
    return _matrix_backend(matrix)


def _extent(array: Any) -> tuple[int, int]:
    """The byte range a CuPy array's elements occupy."""
    if array.size == 0:
        return (0, 0)
    start, end = relative_extent(array)
    pointer = int(array.data.ptr)
    return pointer + start, pointer + end


def _overlaps(x: Any, y: Any) -> bool:
    (x0, x1), (y0, y1) = _extent(x), _extent(y)
    return x0 < x1 and y0 < y1 and x0 < y1 and y0 < x1


def spmv(A: Any, x: Any, out: Any = None) -> Any:  # noqa: N803 - the matrix is A
    """``A @ x`` for a CSR sparse matrix ``A`` and a vector ``x`` on its device, without a
    sync; works in `gs.while_loop`/`gs.cond` bodies and `gs.capture` steps on every device.

    ``A``: ``cupyx.scipy.sparse.csr_matrix`` (CuPy), a ``scipy.sparse`` CSR matrix or array
    (NumPy) or `gpuscalar.devices.strict.sparse.csr_matrix` (the strict device); another format is a
    ``TypeError`` saying to convert it with ``A.tocsr()`` (before the loop). ``x``: a 1-D
    array of length ``A.shape[1]`` on the same backend and device. Both float32, float64,
    complex64 or complex128; the result has their promoted dtype. ``out``: a 1-D array of
    length ``A.shape[0]`` and that dtype, not overlapping ``x``, written and returned; else a
    new array. One device op (on CuPy, one launch of gpuscalar's CSR kernel)."""
    backend = _check_matrix(A)
    found = backend_of(x)
    if found is None:
        raise TypeError(f"gs.spmv: x must be a {backend.name} array, got {type(x).__name__}")
    if found is not backend:
        raise TypeError(f"gs.spmv: A is a {backend.name} matrix but x is a {found.name} array")
    if x.dtype not in SPARSE_DTYPES:
        raise TypeError(f"gs.spmv: x has dtype {x.dtype}; it must be {_DTYPE_NAMES}")
    rows, cols = (int(n) for n in A.shape)
    if x.ndim != 1 or x.shape[0] != cols:
        raise ValueError(f"gs.spmv: A of shape {(rows, cols)} needs a vector of length {cols}, "
                         f"got shape {x.shape}")
    device = backend.device_of(x)
    if backend.multi_device and backend.device_of(A.data) != device:
        raise ValueError(f"gs.spmv: A is on device {backend.device_of(A.data)!r} but x on "
                         f"{device!r}")
    dtype = np.result_type(A.data.dtype, x.dtype)
    if out is not None:
        if backend_of(out) is not backend:
            raise TypeError(f"gs.spmv: out must be a {backend.name} array, got "
                            f"{type(out).__name__}")
        if out.shape != (rows,) or out.dtype != dtype:
            raise ValueError(f"gs.spmv: out has shape {out.shape} and dtype {out.dtype}; the "
                             f"product has shape {(rows,)} and dtype {dtype}")
        if backend.multi_device and backend.device_of(out) != device:
            raise ValueError(f"gs.spmv: out is on device {backend.device_of(out)!r} but x on "
                             f"{device!r}")
        if backend.data_address(out) == backend.data_address(x) or (
                backend is CUPY and _overlaps(out, x)):
            raise ValueError("gs.spmv: out overlaps x (the kernel would read x while writing "
                             "out); pass a separate out")
    if backend is NUMPY or backend is STRICT:
        return backend.call(_on_host, backend, A, x, out)
    if backend is not CUPY:
        raise TypeError(f"gs.spmv does not support the {backend.name} backend")
    if A.indices.dtype != A.indptr.dtype or A.indices.dtype not in products.INDEX_C_NAMES:
        raise TypeError(f"gs.spmv: A's indices are {A.indices.dtype} and its indptr "
                        f"{A.indptr.dtype}; the kernel reads int32 or int64, both alike")
    with backend.device_context(device):
        if out is None:
            out = backend.xp.empty((rows,), dtype=dtype)
        products.csr_matvec(A.indptr, A.indices, A.data, x, out)
    return out


def _on_host(backend: Backend, matrix: Any, x: Any, out: Any) -> Any:
    host = matrix.host_matrix() if backend is STRICT else matrix
    product = np.asarray(host @ backend.host_data(x))
    if out is None:
        return backend.from_host_data(product, x)
    backend.host_data(out)[...] = product
    return out


def as_csr(matrix: Any, like: Any) -> Any:
    """``matrix`` (a SciPy sparse matrix or array, a dense NumPy array) as a CSR matrix on the
    device of the array ``like``: SciPy's ``csr_matrix`` for NumPy, ``cupyx.scipy.sparse``'s
    for CuPy, `gpuscalar.devices.strict.sparse.csr_matrix` for the strict device (on ``like``'s
    device). An upload on a device (refused inside a captured body): make it before the loop."""
    scipy_sparse = importlib.import_module("scipy.sparse")  # only for sparse matrices
    backend = backend_of(like)
    if backend is None:
        raise TypeError(f"gs.as_csr: like must be a NumPy, strict or CuPy array, got "
                        f"{type(like).__name__}")
    if backend_of(matrix) is not None and backend_of(matrix) is not NUMPY:
        raise TypeError("gs.as_csr: matrix must be on the host (a SciPy sparse matrix or a "
                        "NumPy array)")
    host = scipy_sparse.csr_matrix(matrix)
    if backend is NUMPY:
        return host
    if backend is STRICT:
        with STRICT.device_context(backend.device_of(like)):
            return strict_sparse.csr_matrix(host)
    cupyx_sparse = importlib.import_module("cupyx.scipy.sparse")  # only for CuPy arrays
    xp = backend.xp
    with backend.device_context(backend.device_of(like)):
        parts = [backend.call(xp.asarray, part) for part in (host.data, host.indices,
                                                              host.indptr)]
        return cupyx_sparse.csr_matrix(tuple(parts), shape=host.shape)
