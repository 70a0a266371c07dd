"""``cupyx.scipy.sparse.csr_matrix`` on the strict device: a CSR matrix whose arrays are strict.

Why this module exists: a solver written for CuPy takes a ``cupyx.scipy.sparse.csr_matrix``,
and the strict device must give it one whose ``data``/``indices``/``indptr`` are strict arrays
(SciPy's matrix would hold host arrays, which the next device operation refuses). A module of
its own: ``device.py`` is at the package's size limit.

What CuPy does, and so this does: ``A @ x`` and ``A.dot(x)`` are cuSPARSE calls in CuPy, one
device op here; inside a `gs.while_loop`/`gs.cond` body or a `gs.capture` step (where CuPy's
cuSPARSE refuses the capturing stream) they are refused with CuPy's words and the gpuscalar
call to use instead, ``gs.spmv(A, x, out=...)``. ``get()`` is a sync (SciPy's matrix back),
``toarray()`` a device op. Indices are int32, as in ``cupyx.scipy.sparse``.

`StrictSparse` is the strict device's ``"sparse"`` executor (`gpuscalar.sparse.SparseProducts`):
the host's (`gpuscalar.devices.host.sparse`) for these matrices.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ... import sync
from ..host.sparse import HostSparse
from . import capture
from . import device as strict

__all__ = ["csr_matrix", "StrictSparse"]


def _scipy_sparse() -> Any:
    """``scipy.sparse`` (imported when a strict CSR matrix is first made or multiplied)."""
    return importlib.import_module("scipy.sparse")


class csr_matrix:  # noqa: N801 - cupyx.scipy.sparse's name
    """``cupyx.scipy.sparse.csr_matrix`` on the strict device (see the module docstring).

    Made from a SciPy sparse matrix (an upload: one device op, refused in a captured body), a
    dense 2-D strict array, or ``(data, indices, indptr)`` strict arrays with ``shape``.
    """

    format = "csr"

    def __init__(self, arg1: Any, shape: tuple[int, int] | None = None, dtype: Any = None
                 ) -> None:
        if type(arg1) is tuple and len(arg1) == 3:
            data, indices, indptr = arg1
            if not all(type(a) is strict.StrictArray for a in arg1):
                raise TypeError("csr_matrix((data, indices, indptr)): all three must be strict "
                                "arrays (upload with gs.strict.xp.asarray first)")
            if shape is None:
                raise ValueError("csr_matrix((data, indices, indptr)) needs shape=")
            rows = int(shape[0])
            if indptr.shape != (rows + 1,) or indices.shape != data.shape or data.ndim != 1:
                raise ValueError(f"csr_matrix: indptr of shape {indptr.shape}, indices of "
                                 f"shape {indices.shape} and data of shape {data.shape} do "
                                 f"not describe {rows} rows")
            self.data = data if dtype is None else data.astype(dtype)
            self.indices = indices.astype(np.int32)
            self.indptr = indptr.astype(np.int32)
            self._shape = (rows, int(shape[1]))
            return
        if type(arg1) is strict.StrictArray:
            with sync.one_device_op():  # the dense-to-CSR conversion, on the "device"
                host = _scipy_sparse().csr_matrix(arg1._data, dtype=dtype)
            device = arg1._device
        elif type(arg1).__module__.startswith("scipy.sparse"):
            host = arg1.tocsr()
            if dtype is not None:
                host = host.astype(dtype)
            device = None
        else:
            raise TypeError(f"csr_matrix: cannot make a strict CSR matrix from "
                            f"{type(arg1).__name__}")
        xp = strict.xp
        self.data = xp.asarray(host.data, device=device)
        self.indices = xp.asarray(host.indices.astype(np.int32), device=device)
        self.indptr = xp.asarray(host.indptr.astype(np.int32), device=device)
        self._shape = (int(host.shape[0]), int(host.shape[1]))

    # ---- metadata (no device work) ---------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def nnz(self) -> int:
        return int(self.data.size)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def device(self) -> strict.Device:
        return self.data.device

    def __repr__(self) -> str:
        return (f"<strict csr_matrix of shape {self._shape}, dtype {self.dtype}, {self.nnz} "
                f"stored elements, on device {self.data._device}>")

    # ---- host views of the arrays, for the host product (gpuscalar.sparse) -------------------
    def host_matrix(self) -> Any:
        """SciPy's CSR matrix over the arrays' data (no copy, no transfer: the host side of a
        device op, for its caller to count)."""
        return _scipy_sparse().csr_matrix((self.data._data, self.indices._data, self.indptr._data),
                                       shape=self._shape, copy=False)

    # ---- device work -----------------------------------------------------------------------
    def _product(self, other: Any) -> Any:
        capture.refuse_cusparse("csr_matrix @ x")
        if type(other) is not strict.StrictArray:
            return NotImplemented
        if other.ndim not in (1, 2) or other.shape[0] != self._shape[1]:
            raise ValueError(f"dimension mismatch: {self._shape} @ {other.shape}")
        with sync.one_device_op():
            product = np.asarray(self.host_matrix() @ other._data)
        return strict._wrap(product, self.data._device)

    def __matmul__(self, other: Any) -> Any:
        return self._product(other)

    def dot(self, other: Any) -> Any:
        return self._product(other)

    def toarray(self) -> strict.StrictArray:
        """The dense matrix (one device op)."""
        with sync.one_device_op():
            return strict._wrap(self.host_matrix().toarray(), self.data._device)

    def tocsr(self, copy: bool = False) -> csr_matrix:
        return self

    def get(self, stream: Any = None) -> Any:
        """SciPy's CSR matrix, copied to the host (a sync, as ``cupyx``'s ``get``)."""
        strict._declare_sync()
        return self.host_matrix().copy()


class StrictSparse(HostSparse):
    """The strict device's ``"sparse"`` executor: `csr_matrix`, multiplied on the host."""

    def format_of(self, value: Any) -> str | None:
        return "csr" if type(value) is csr_matrix else None

    def host_matrix(self, matrix: Any) -> Any:
        return matrix.host_matrix()

    def as_csr(self, host: Any, like: Any) -> Any:
        with self.backend.device_context(self.backend.device_of(like)):
            return csr_matrix(host)
