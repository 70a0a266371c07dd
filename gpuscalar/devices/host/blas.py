"""gs.matmul, gs.dot and gs.vdot computed by NumPy on the host: the ``"blas"`` executor of the
NumPy device and of the strict device (`HostBlas`, one home for both).

Why this module exists: both devices hold NumPy data in this process (`Backend.host_data`), so a
product is ``np.matmul``/``np.dot``/``np.vdot`` inside one counted device op (`Backend.call`),
with alpha and beta read on the host; `gpuscalar.matmul`'s front has checked the arguments.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backend import Backend
from ...lazy.expr import BoundedCache
from ...scalar import GPUScalar, _array_of

__all__ = ["HostBlas"]


def _matmul_on_host(backend: Backend, a: Any, b: Any, out: Any, alpha: Any, beta: Any) -> Any:
    data = backend.host_data
    product = np.matmul(data(a), data(b))
    alpha_value = data(_array_of(alpha)) if isinstance(alpha, GPUScalar) else alpha
    beta_value = data(_array_of(beta)) if isinstance(beta, GPUScalar) else beta
    dtype = product.dtype
    if not (isinstance(alpha_value, (int, float, complex)) and alpha_value == 1):
        product = np.multiply(np.asarray(alpha_value).astype(dtype), product)
    if out is None:
        return backend.from_host_data(product, a)
    target = data(out)
    if isinstance(beta_value, (int, float, complex)) and beta_value == 0:
        target[...] = product
    else:
        target[...] = np.asarray(beta_value).astype(dtype) * target + product
    return out


def _on_host(backend: Backend, function: Any, a: Any, b: Any) -> Any:
    """NumPy's ``function`` (``dot``/``vdot``) of two host-evaluated arrays, as the backend's
    array (0-d for a number)."""
    return backend.from_host_data(np.asarray(function(backend.host_data(a),
                                                      backend.host_data(b))), a)


class HostBlas:
    """The ``"blas"`` executor (`gpuscalar.matmul.Blas`) of a device whose arrays hold NumPy
    data: each product one device op. ``dot``/``vdot`` are the device's own ``xp.dot``/``xp.vdot``
    where its arrays are host memory (NumPy), NumPy's on the host data otherwise (the strict
    device's own would refuse in a loop body)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def operands(self, a: Any, b: Any, dtype: np.dtype) -> tuple[Any, Any, None]:
        return a, b, None  # NumPy promotes mixed dtypes itself

    def coefficient(self, value: Any, device: object, dtype: np.dtype, like: Any) -> Any:
        return value  # read on the host, in the product's device op

    def matmul(self, call: None, a: Any, b: Any, out: Any, alpha: Any, beta: Any,
               reads_out: bool, shape: tuple[int, ...], dtype: np.dtype, plans: BoundedCache,
               key: tuple[Any, ...] | None) -> Any:
        backend = self.backend
        return backend.call(_matmul_on_host, backend, a, b, out, alpha, beta)

    def dot(self, a: Any, b: Any) -> Any:
        backend = self.backend
        if backend.host_memory:
            return backend.call(backend.xp.dot, a, b)
        return backend.call(_on_host, backend, np.dot, a, b)

    def vdot(self, a: Any, b: Any) -> Any:
        backend = self.backend
        if backend.host_memory:
            return backend.call(backend.xp.vdot, a, b)
        return backend.call(_on_host, backend, np.vdot, a, b)
