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

This module is the device-neutral front (the argument checks); each device's ``"sparse"``
executor (`SparseProducts`) recognises its own matrices and computes the product.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import numpy as np

from .backend import Backend
from .devices import BACKENDS, backend_of

__all__ = ["spmv", "as_csr", "is_sparse", "sparse_format", "SPARSE_DTYPES", "SparseProducts"]

#: the dtypes of matrices and vectors `spmv` multiplies (and `gs.matmul`)
SPARSE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64),
                 np.dtype(np.complex128))

_DTYPE_NAMES = "float32, float64, complex64 or complex128"


class SparseProducts(Protocol):
    """A device's sparse matrices and their products: ``backend.executor("sparse")``. The
    front (`spmv`, `as_csr`) checks the arguments; the device recognises its own matrices,
    checks what only it knows, and multiplies."""

    def format_of(self, value: Any) -> str | None:
        """The format (``"csr"``, ``"csc"`` ...) of ``value`` if it is one of this device's
        sparse matrices, else None (no import, no device work)."""
        ...

    def overlaps(self, out: Any, x: Any) -> bool:
        """Whether writing ``out`` could change ``x`` while the product reads it."""
        ...

    def spmv(self, matrix: Any, x: Any, out: Any, rows: int, dtype: np.dtype,
             device: object) -> Any:
        """``matrix @ x`` (a checked CSR matrix and vector of this device) into ``out`` or a
        new vector of ``rows`` elements of ``dtype`` on ``device``: one device op."""
        ...

    def as_csr(self, host: Any, like: Any) -> Any:
        """SciPy's CSR matrix ``host`` as this device's CSR matrix on the device of ``like``."""
        ...


def format_in(package: str, value: Any) -> str | None:
    """The ``format`` of ``value`` when its type comes from ``package`` (``"scipy.sparse"``,
    ``"cupyx.scipy.sparse"``), else None: how a device's `SparseProducts.format_of` knows its
    matrices without importing their library."""
    if (type(value).__module__ or "").startswith(package):
        found = getattr(value, "format", None)
        return found if isinstance(found, str) else None
    return None


def _sparse_of(value: Any) -> tuple[Backend, str] | None:
    """The device whose sparse matrix ``value`` is, and its format; None for anything else."""
    for backend in BACKENDS:
        if "sparse" in backend.executors:
            found = backend.executor("sparse").format_of(value)
            if found is not None:
                return backend, found
    return None


def sparse_format(value: Any) -> str | None:
    """The format (``"csr"``, ``"csc"``, ``"coo"`` ...) of a SciPy, cupyx or strict sparse
    matrix; None for anything else (no import, no device work)."""
    found = _sparse_of(value)
    return None if found is None else found[1]


def is_sparse(value: Any) -> bool:
    """Whether ``value`` is a SciPy, cupyx or strict sparse matrix (of any format)."""
    return _sparse_of(value) is not None


def _check_matrix(matrix: Any) -> Backend:
    sparse = _sparse_of(matrix)
    if sparse is None:
        backend = backend_of(matrix)
        hint = (" (a dense array: use gs.matmul)" if backend is not None else "")
        raise TypeError(f"gs.spmv: A must be a CSR sparse matrix (scipy.sparse, "
                        f"cupyx.scipy.sparse or gpuscalar.devices.strict.sparse), got "
                        f"{type(matrix).__name__}{hint}")
    backend, found = sparse
    if found != "csr":
        raise TypeError(f"gs.spmv: A is a {found.upper()} matrix; gs.spmv multiplies CSR "
                        "matrices: convert it once, before the loop, with A.tocsr()")
    dtype = np.dtype(matrix.data.dtype)
    if dtype not in SPARSE_DTYPES:
        raise TypeError(f"gs.spmv: A has dtype {dtype}; it must be {_DTYPE_NAMES}")
    if len(matrix.shape) != 2:
        raise ValueError(f"gs.spmv: A must be 2-D, got shape {matrix.shape}")
    return backend


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
        if backend.executor("sparse").overlaps(out, x):
            raise ValueError("gs.spmv: out overlaps x (the kernel would read x while writing "
                             "out); pass a separate out")
    return backend.executor("sparse").spmv(A, x, out, rows, dtype, device)


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
    found = backend_of(matrix)
    if found is not None and not found.host_memory:
        raise TypeError("gs.as_csr: matrix must be on the host (a SciPy sparse matrix or a "
                        "NumPy array)")
    return backend.executor("sparse").as_csr(scipy_sparse.csr_matrix(matrix), like)
