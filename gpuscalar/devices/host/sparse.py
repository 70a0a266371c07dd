"""gs.spmv and gs.as_csr on the host: the ``"sparse"`` executor of the NumPy device, and the
one the strict device's extends (`gpuscalar.devices.strict.sparse`): one home for both.

Why this module exists: on a device whose arrays hold NumPy data a CSR product is SciPy's,
computed on the host data inside one counted device op (`Backend.call`); `gpuscalar.sparse`'s
front has checked the arguments.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backend import Backend
from ...sparse import format_in

__all__ = ["HostSparse"]


class HostSparse:
    """The NumPy device's ``"sparse"`` executor (`gpuscalar.sparse.SparseProducts`): SciPy's
    sparse matrices and arrays, SciPy's product on the host."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def format_of(self, value: Any) -> str | None:
        return format_in("scipy.sparse", value)

    def host_matrix(self, matrix: Any) -> Any:
        """SciPy's matrix over ``matrix``'s host data (no copy)."""
        return matrix

    def overlaps(self, out: Any, x: Any) -> bool:
        backend = self.backend
        return backend.data_address(out) == backend.data_address(x)

    def spmv(self, matrix: Any, x: Any, out: Any, rows: int, dtype: np.dtype,
             device: object) -> Any:
        return self.backend.call(self._on_host, matrix, x, out)

    def _on_host(self, matrix: Any, x: Any, out: Any) -> Any:
        backend = self.backend
        product = np.asarray(self.host_matrix(matrix) @ backend.host_data(x))
        if out is None:
            return backend.from_host_data(product, x)
        backend.host_data(out)[...] = product
        return out

    def as_csr(self, host: Any, like: Any) -> Any:
        return host
