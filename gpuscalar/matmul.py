"""`gs.matmul`: a matrix product that works inside a CUDA graph capture, alpha/beta on the device.

Why this module exists: a training step's matrix products are what stop it from being captured
in a CUDA graph with CuPy (its cuBLAS calls refuse stream capture). ``gs.matmul(a, b, out=...,
alpha=..., beta=...)`` computes ``alpha * (a @ b) + beta * out``, and alpha/beta may be
GPUScalars (or pending expressions) without a sync. This is the device-neutral front: the
argument checks, dtype promotion and shape rules every device shares, and the table of planned
products (`_PLANS`) that serves a product seen before with one lookup. The device multiplies
through its ``"blas"`` executor (`Blas`): on CuPy one cuBLAS call on gpuscalar's own handle,
recordable and replayable (`gpuscalar.devices.cupy.linalg`); on NumPy and the strict device,
``np.matmul`` (one counted device op, `gpuscalar.devices.host.blas`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from . import sparse
from .backend import Backend, relative_extent
from .devices import backend_of
from .lazy.expr import BoundedCache
from .scalar import GPUScalar

__all__ = ["matmul", "product_shape", "check_coefficient", "Blas", "Planned", "MATMUL_DTYPES"]

#: the dtypes `matmul` multiplies (cuBLAS's S, D, C and Z routines on CuPy)
MATMUL_DTYPES = sparse.SPARSE_DTYPES


class Planned(Protocol):
    """A device's plan of one kind of product (`_PLANS`' values): ``run`` makes it again for
    operands of the same types, shapes, strides and dtypes, checking per call what a plan
    cannot know (devices, ``out``'s overlap, ``alpha`` and ``beta``)."""

    def run(self, a: Any, b: Any, out: Any, alpha: Any = None, beta: Any = None) -> Any: ...


class Blas(Protocol):
    """A device's matrix products: ``backend.executor("blas")``. `matmul` checks the
    arguments (backends, devices, dtypes, shapes, ``out``, alpha/beta) and calls, in order:"""

    def operands(self, a: Any, b: Any, dtype: np.dtype) -> tuple[Any, Any, Any]:
        """``a`` and ``b`` as the device multiplies them into ``dtype`` (their shapes aligned
        already; a device may convert the one of the other dtype, and refuse a layout or a
        size it cannot take), and the device's call for them (or None)."""
        ...

    def coefficient(self, value: Any, device: object, dtype: np.dtype, like: Any) -> Any:
        """alpha or beta (a checked number or GPUScalar) as the device reads it."""
        ...

    def matmul(self, call: Any, a: Any, b: Any, out: Any, alpha: Any, beta: Any,
               reads_out: bool, shape: tuple[int, ...], dtype: np.dtype, plans: BoundedCache,
               key: tuple[Any, ...] | None) -> Any:
        """``alpha * (a @ b) + beta * out`` into ``out`` (``reads_out``: beta was given) or a
        new array of ``shape`` and ``dtype``, ``call`` what `operands` returned. With ``key``
        (operands of one dtype, nothing converted), a device that can serve the same product
        again leaves its `Planned` in ``plans`` under ``key``."""
        ...

    def dot(self, a: Any, b: Any) -> Any:
        """``xp.dot(a, b)`` that also works where a graph is recorded (`gs.dot`)."""
        ...

    def vdot(self, a: Any, b: Any) -> Any:
        """``xp.vdot(a, b)`` that also works where a graph is recorded (`gs.vdot`)."""
        ...


def matmul(a: Any, b: Any, *, out: Any = None, alpha: Any = None, beta: Any = None) -> Any:
    """``alpha * (a @ b) + beta * out`` (``a @ b`` by default), without a sync.

    float32/float64/complex64/complex128 arrays of one backend and device, 1-D to 3-D (NumPy's
    matmul rules; a 2-D operand broadcasts over a batch); operands of different dtypes promote
    as ``xp.matmul`` does (float32 @ float64 is float64; on CuPy the operand of the other dtype
    is first converted, one more launch). ``out``: a C-contiguous array of the result's shape
    and dtype, written in place and returned. ``alpha``/``beta``: Python numbers or GPUScalars
    (read on the device; complex only for a complex product; ``beta`` needs ``out``). On CuPy
    this is one cuBLAS call on gpuscalar's own handle, which also works in `gs.capture` steps
    and `gs.while_loop`/`gs.cond` bodies; on NumPy and the strict device, ``np.matmul`` (one
    device op). ``a`` may be a CSR sparse matrix and ``b`` a vector: that is `gs.spmv`.
    """
    try:  # the hot path: a product seen before, one lookup
        if out is None:
            key: tuple[Any, ...] = (type(a), a.shape, a.strides, a.dtype, type(b), b.shape,
                                    b.strides, b.dtype)
        else:
            key = (type(a), a.shape, a.strides, a.dtype, type(b), b.shape, b.strides, b.dtype,
                   type(out), out.shape, out.strides, out.dtype)
        found = _PLANS.hit(key)
    except (AttributeError, TypeError):  # not arrays: `_matmul` says what is wrong
        pass
    else:
        if found is not None and (beta is None or out is not None):
            return found.run(a, b, out, alpha, beta)
    return _matmul(a, b, out, alpha, beta)


#: (type, shape, strides and dtype of a, of b, and of out where given) -> the device's
#: `Planned` product of one dtype, decided and checked once by `_matmul`
_PLANS = BoundedCache()


def _matmul(a: Any, b: Any, out: Any, alpha: Any, beta: Any) -> Any:
    """`matmul` checking everything (a product not planned yet, or with alpha/beta); a device
    may leave the plan of a product of one dtype with default alpha/beta for the next call."""
    if sparse.is_sparse(a):
        if alpha is not None or beta is not None:
            raise TypeError("gs.matmul: alpha and beta are not supported with a sparse matrix; "
                            "scale the vector or the result instead")
        return sparse.spmv(a, b, out=out)
    backend = _check_operands(a, b)
    dtype = np.result_type(a.dtype, b.dtype)
    if beta is not None and out is None:
        raise ValueError("gs.matmul: beta scales out, so it needs out=")
    shape = product_shape(a.shape, b.shape)  # (nothing launched yet)
    try:
        blas: Blas = backend.executor("blas")
    except LookupError:
        raise TypeError(f"gs.matmul does not support the {backend.name} backend") from None
    same = a.dtype == b.dtype
    a, b, call = blas.operands(a, b, dtype)
    if out is not None:
        _check_out(out, backend, a, b, shape, dtype)
    device = backend.device_of(a)
    alpha_scalar = blas.coefficient(check_coefficient(alpha, 1.0, "alpha", backend, device,
                                                      dtype), device, dtype, a)
    beta_scalar = blas.coefficient(check_coefficient(beta, 0.0, "beta", backend, device,
                                                     dtype), device, dtype, a)
    key: tuple[Any, ...] | None = None
    if same:  # (no operand converted)
        key = (type(a), a.shape, a.strides, a.dtype, type(b), b.shape, b.strides, b.dtype)
        if out is not None:
            key += (type(out), out.shape, out.strides, out.dtype)
    return blas.matmul(call, a, b, out, alpha_scalar, beta_scalar, beta is not None, shape,
                       dtype, _PLANS, key)


def product_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``a @ b`` by the rules `matmul` multiplies by; ``ValueError`` naming the
    shapes for operands that cannot be multiplied."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ValueError("gs.matmul operands must be at least 1-D (use * for a scalar)")
    if max(len(a_shape), len(b_shape)) > 3:
        raise ValueError(f"gs.matmul takes 1-D, 2-D and 3-D operands, got shapes {a_shape} "
                         f"and {b_shape}")
    inner_a = a_shape[-1]
    inner_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if inner_a != inner_b:
        raise ValueError(f"gs.matmul: shapes {a_shape} and {b_shape} do not align "
                         f"({inner_a} != {inner_b})")
    if (len(a_shape) == 1 or len(b_shape) == 1) and max(len(a_shape), len(b_shape)) == 3:
        raise ValueError(f"gs.matmul: a 1-D operand with a batch ({a_shape} @ {b_shape}) is not "
                         "supported; reshape the vector to a matrix")
    if len(a_shape) == 1 and len(b_shape) == 1:
        return ()
    if len(b_shape) == 1:
        return (a_shape[0],)
    if len(a_shape) == 1:
        return (b_shape[1],)
    batch_a = a_shape[0] if len(a_shape) == 3 else 1
    batch_b = b_shape[0] if len(b_shape) == 3 else 1
    if batch_a != batch_b and 1 not in (batch_a, batch_b):
        raise ValueError(f"gs.matmul: batch sizes of {a_shape} and {b_shape} do not match")
    m, n = a_shape[-2], b_shape[-1]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return (m, n)
    return (max(batch_a, batch_b), m, n)


def _operand_backend(value: Any, what: str) -> Backend:
    """The backend of matmul operand ``what``, which must be a float or complex array."""
    found = backend_of(value)
    if found is None:
        hint = (f" ({value.format.upper()} sparse: convert it with .tocsr(); only a CSR matrix "
                "may be a)" if sparse.sparse_format(value) is not None else "")
        raise TypeError(f"gs.matmul: {what} must be a NumPy, strict or CuPy array, got "
                        f"{type(value).__name__}{hint}")
    if value.dtype not in MATMUL_DTYPES:
        raise TypeError(f"gs.matmul: {what} must be float32, float64, complex64 or complex128, "
                        f"got {value.dtype}")
    return found


def _check_operands(a: Any, b: Any) -> Backend:
    backend, found = _operand_backend(a, "a"), _operand_backend(b, "b")
    if found is not backend:
        raise TypeError(f"gs.matmul: a is a {backend.name} array but b is {found.name}")
    if backend.multi_device and backend.device_of(a) != backend.device_of(b):
        raise ValueError(f"gs.matmul: a is on device {backend.device_of(a)!r} but b on "
                         f"{backend.device_of(b)!r}")
    return backend


def _check_out(out: Any, backend: Backend, a: Any, b: Any, shape: tuple[int, ...],
               dtype: np.dtype) -> None:
    if backend_of(out) is not backend:
        raise TypeError(f"gs.matmul: out must be a {backend.name} array, got "
                        f"{type(out).__name__}")
    if tuple(out.shape) != shape or out.dtype != dtype:
        raise ValueError(f"gs.matmul: out has shape {tuple(out.shape)} and dtype {out.dtype}; "
                         f"the product has shape {shape} and dtype {dtype}")
    if not out.flags.c_contiguous:
        raise ValueError("gs.matmul: out must be C-contiguous")
    if backend.multi_device and backend.device_of(out) != backend.device_of(a):
        raise ValueError(f"gs.matmul: out is on device {backend.device_of(out)!r} but a on "
                         f"{backend.device_of(a)!r}")
    for operand, what in ((a, "a"), (b, "b")):
        if _overlaps(backend, out, operand):
            raise ValueError(f"gs.matmul: out overlaps {what} in memory (cuBLAS would read it "
                             "while writing it); pass a separate out")


def _extent(backend: Backend, array: Any) -> tuple[int, int]:
    """The byte range an array's elements occupy (empty for an empty array)."""
    if array.size == 0:
        return (0, 0)
    address, (start, end) = backend.data_address(array), relative_extent(array)
    return address + start, address + end


def _overlaps(backend: Backend, x: Any, y: Any) -> bool:
    (x0, x1), (y0, y1) = _extent(backend, x), _extent(backend, y)
    return x0 < x1 and y0 < y1 and x0 < y1 and y0 < x1


def check_coefficient(value: Any, default: float, what: str, backend: Backend, device: object,
                      dtype: np.dtype) -> Any:
    """alpha or beta (``default`` for None) checked against the product: a GPUScalar of the
    arrays' backend and device (real for a real product), or a Python or NumPy number
    (complex only for a complex product). The device reads it (`Blas.coefficient`)."""
    if value is None:
        return default
    if isinstance(value, GPUScalar):
        if value.backend is not backend:
            raise TypeError(f"gs.matmul: {what} is a {value.backend.name} GPUScalar but the "
                            f"arrays are {backend.name}")
        if backend.multi_device and value.device != device:
            raise ValueError(f"gs.matmul: {what} is on device {value.device!r} but the arrays "
                             f"on {device!r}")
        if value.dtype.kind not in ("biufc" if dtype.kind == "c" else "biuf"):
            raise TypeError(f"gs.matmul: {what} must be real for a {dtype} product, got a "
                            f"GPUScalar of {value.dtype}")
        return value
    numbers: tuple[type, ...] = (int, float, np.integer, np.floating)
    if dtype.kind == "c":
        numbers += (complex, np.complexfloating)
    if isinstance(value, bool) or not isinstance(value, numbers):
        kind = "number" if dtype.kind == "c" else "real number"
        raise TypeError(f"gs.matmul: {what} must be a {kind} or GPUScalar for a {dtype} "
                        f"product, got {type(value).__name__}")
    return value
