"""What CuPy refuses while a graph is recorded, refused by the strict device in bodies.

Why this module exists: on a GPU a `gs.while_loop`/`gs.cond` body and a `gs.capture` step are
recorded into a CUDA graph, and CuPy refuses, while its stream captures, a host-to-device copy
and every call into NVIDIA's libraries (CuPy 14.2's ``setStream`` of cuBLAS, cuSOLVER, cuRAND
and cuSPARSE raises ``NotImplementedError: calling <library> API during stream capture is
currently unsupported``). The strict device runs those bodies on the host
(`gpuscalar.sync.in_graph_body`), so it refuses the same calls there, with CuPy's words and the
gpuscalar call to use instead, and CPU tests see what the GPU would say. A module of its own:
``device.py`` is at the package's size limit. It is a leaf (NumPy data in, errors out).

The rules, as CuPy 14.2's source has them:

- a host-to-device copy: `H2D_CAPTURE_MESSAGE` (a ``RuntimeError``);
- cuBLAS (`CUBLAS_CAPTURE_MESSAGE`): a matrix product of floating or complex operands of one
  or more dimensions (``@``/``matmul``, ``dot``, ``vdot``, ``inner``, ``tensordot``,
  ``einsum`` of several operands, ``linalg.multi_dot``, ``linalg.matrix_power``); a product
  with a 0-d operand is a multiply, and integer products are CuPy's own kernels;
- cuSOLVER (`CUSOLVER_CAPTURE_MESSAGE`): the factorizations and solvers of ``xp.linalg``
  (``solve``, ``lstsq``, ``inv``, ``pinv``, ``eigh``, ``eigvalsh``, ``eig``, ``eigvals``,
  ``cholesky``, ``qr``, ``svd``, ``det``, ``slogdet``, ``matrix_rank``, ``tensorsolve``,
  ``tensorinv``, ``cond``) and the SVD-based matrix norms (``linalg.norm`` with ``ord`` 2, -2
  or ``"nuc"`` over two axes); ``linalg.norm``'s other orders are CuPy's own kernels;
- cuRAND (`CURAND_CAPTURE_MESSAGE`): every ``xp.random`` function (the legacy API draws with
  cuRAND's host generator) and every draw of a ``default_rng`` generator. CuPy's generator
  draws with kernels of its own, and those with array parameters upload a table of their
  shapes (a host-to-device copy); the ones without are not known to fail on a GPU: refusing
  them all is the conservative side until a GPU run says otherwise;
- cuSPARSE (`CUSPARSE_CAPTURE_MESSAGE`): a sparse matrix's product
  (`gpuscalar.devices.strict.sparse`).

A join of more than 8 inputs (``stack``, ``concatenate``) that CuPy makes through a pointer
table built on the host is a host-to-device copy too (`refuse_pointer_table`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ... import sync

__all__ = ["H2D_CAPTURE_MESSAGE", "CUBLAS_CAPTURE_MESSAGE", "CUSOLVER_CAPTURE_MESSAGE",
           "CURAND_CAPTURE_MESSAGE", "CUSPARSE_CAPTURE_MESSAGE", "refuse_upload",
           "LIBRARY_RULES", "refuse_cusolver", "refuse_curand", "refuse_cusparse"]

#: CuPy's words (a RuntimeError from ``MemoryPointer.copy_from_host_async``, cupy/cuda/memory.pyx,
#: CuPy 14) for a host-to-device copy while the current stream captures: what ``cupy.asarray``
#: of host data of >= 1 dimension, ``ndarray.set`` and host index arrays reach.
H2D_CAPTURE_MESSAGE = "the current stream is capturing, so H2D transfers are disallowed"
#: CuPy's words (a NotImplementedError from ``cupy_backends.cuda.libs.cublas.setStream``) for a
#: cuBLAS call while the current stream captures: what ``@``/``matmul``/``dot`` of floats reach.
CUBLAS_CAPTURE_MESSAGE = "calling cuBLAS API during stream capture is currently unsupported"
#: CuPy's words (a NotImplementedError from ``cupy_backends.cuda.libs.cusolver.setStream``) for a
#: cuSOLVER call while the current stream captures: what ``linalg.solve``, ``eigh``, ``inv`` reach.
CUSOLVER_CAPTURE_MESSAGE = "calling cuSOLVER API during stream capture is currently unsupported"
#: CuPy's words (a NotImplementedError from ``cupy_backends.cuda.libs.curand.setStream``) for a
#: cuRAND call while the current stream captures: what ``cupy.random``'s functions reach.
CURAND_CAPTURE_MESSAGE = "calling cuRAND API during stream capture is currently unsupported"
#: CuPy's words (a NotImplementedError from ``cupy_backends.cuda.libs.cusparse.setStream``) for a
#: cuSPARSE call while the current stream captures: what a sparse matrix's ``A @ x`` reaches.
CUSPARSE_CAPTURE_MESSAGE = "calling cuSPARSE API during stream capture is currently unsupported"

_BODY = "in a gs.while_loop/gs.cond body or a gs.capture step"


def refuse_upload() -> None:
    """A host-to-device copy: refused in a body, as CuPy refuses it while the current stream
    captures (the graph would replay a copy from host memory long gone)."""
    if sync.in_graph_body():
        raise RuntimeError(H2D_CAPTURE_MESSAGE)


# ---- cuBLAS ------------------------------------------------------------------------------------

#: NumPy's matrix products -> the gpuscalar call to use in a body instead
_PRODUCTS: dict[Any, str] = {
    np.matmul: "gs.matmul(a, b, out=...)",
    np.linalg.matmul: "gs.matmul(a, b, out=...)",
    np.dot: "gs.dot(a, b) (gs.matmul(a, b, out=...) for matrices)",
    np.ndarray.dot: "gs.dot(a, b) (gs.matmul(a, b, out=...) for matrices)",
    np.vdot: "gs.vdot(a, b)",
    np.inner: "gs.dot(a, b) for vectors, gs.matmul(a, b.T) for matrices",
    np.tensordot: "gs.dot or gs.matmul on reshaped operands",
    np.einsum: "gs.dot or gs.matmul",
    np.linalg.multi_dot: "gs.matmul, one product at a time",
    np.linalg.matrix_power: "gs.matmul, one product at a time",
}


def _refuse_cublas(function: Any, raw_args: tuple, raw_kwargs: dict) -> None:
    """A matrix product of floating or complex arrays (a product with a 0-d operand is a
    multiply in CuPy; integer products are CuPy's own kernels)."""
    arrays = [a for a in raw_args if type(a) is np.ndarray]
    if function is np.linalg.multi_dot and raw_args:
        arrays = [a for a in raw_args[0] if type(a) is np.ndarray]
    if function is np.linalg.matrix_power:
        power = raw_args[1] if len(raw_args) > 1 else raw_kwargs.get("n", 0)
        if abs(int(power)) < 2 and int(power) >= 0:
            return  # the identity or a copy: no product
        arrays = arrays[:1] * 2
    if len(arrays) >= 2 and all(a.ndim for a in arrays) and (
        np.result_type(*arrays).kind in "fc"
    ):
        name = getattr(function, "__name__", "the product")
        raise NotImplementedError(
            f"{CUBLAS_CAPTURE_MESSAGE} (CuPy's {name} of floating arrays is a cuBLAS call, "
            f"refused while a graph is recorded: {_BODY} use {_PRODUCTS[function]})")


# ---- cuSOLVER ----------------------------------------------------------------------------------

_LINALG = np.linalg
#: ``xp.linalg``'s cuSOLVER calls in CuPy
_CUSOLVER_NAMES = ("solve", "lstsq", "inv", "pinv", "eigh", "eigvalsh", "eig", "eigvals",
                   "cholesky", "qr", "svd", "svdvals", "det", "slogdet", "matrix_rank",
                   "tensorsolve", "tensorinv", "cond")


def refuse_cusolver(name: str) -> None:
    """``xp.linalg.<name>``, a cuSOLVER call in CuPy: refused in a body."""
    if sync.in_graph_body():
        raise NotImplementedError(
            f"{CUSOLVER_CAPTURE_MESSAGE} (CuPy's linalg.{name} is a cuSOLVER call, refused "
            f"while a graph is recorded: {_BODY} it cannot run; factor or invert before the "
            "loop (xp.linalg.cholesky, inv or qr outside the body) and apply the factors "
            "inside with gs.matmul, or iterate with gs.matmul/gs.spmv and gs.dot)")


def refuse_matrix_norm(ord: Any, ndim: int, axis: Any) -> None:
    """``linalg.norm`` with an SVD-based matrix order (2, -2, "nuc" over two axes)."""
    if not sync.in_graph_body() or ord not in (2, -2, "nuc"):
        return
    axes = 2 if (axis is None and ndim == 2) else len(axis) if type(axis) is tuple else 1
    if axes == 2:
        refuse_cusolver(f"norm(ord={ord!r}) of a matrix (an SVD)")


# ---- cuRAND and cuSPARSE -----------------------------------------------------------------------


def refuse_curand(name: str) -> None:
    """A random draw (``xp.random.<name>`` or a generator's method): refused in a body."""
    if sync.in_graph_body():
        raise NotImplementedError(
            f"{CURAND_CAPTURE_MESSAGE} (CuPy's random.{name} draws with cuRAND, refused while "
            f"a graph is recorded: {_BODY} it cannot run; draw what the loop needs before it, "
            "e.g. a buffer of draws made outside the body)")


def refuse_cusparse(what: str) -> None:
    """A sparse matrix product (cuSPARSE in CuPy): refused in a body."""
    if sync.in_graph_body():
        raise NotImplementedError(
            f"{CUSPARSE_CAPTURE_MESSAGE} (CuPy's {what} is a cuSPARSE call, refused while a "
            f"graph is recorded: {_BODY} use gs.spmv(A, x, out=...), gpuscalar's own CSR "
            "kernel)")


# ---- joins through a host-built pointer table --------------------------------------------------

#: CuPy 14's ``_concatenate`` (cupy/_core/_routines_manipulation.pyx) joins more than this many
#: inputs of the result's dtype, averaging under `_POINTER_TABLE_BYTES` each, in one kernel that
#: reads a table of their pointers, built on the host and copied with ``core.array(ptrs)``.
_POINTER_TABLE_MAX_COPIES = 8
_POINTER_TABLE_BYTES = 2 * 1024 * 1024


def _refuse_pointer_table(function: Any, raw_args: tuple, raw_kwargs: dict) -> None:
    """A join CuPy does through its host-built pointer table: a host-to-device copy, refused
    in a body with CuPy's words. Joins of 8 inputs or fewer, of mixed dtypes, or of large
    inputs are one copy kernel per input in CuPy: device work only."""
    arrays = raw_args[0] if raw_args else raw_kwargs.get("arrays", raw_kwargs.get("tup", ()))
    arrays = [a for a in arrays if type(a) is np.ndarray]
    if len(arrays) <= _POINTER_TABLE_MAX_COPIES:
        return
    out = raw_kwargs.get("out", raw_args[2] if len(raw_args) > 2 else None)
    dtype = raw_kwargs.get("dtype")
    if out is not None:
        target = out.dtype
    elif dtype is not None:
        target = np.dtype(dtype)
    else:
        target = np.result_type(*arrays)
    if all(a.dtype == target for a in arrays) and (
        sum(a.size for a in arrays) * target.itemsize < _POINTER_TABLE_BYTES * len(arrays)
    ):
        raise RuntimeError(H2D_CAPTURE_MESSAGE)


def _cusolver_rule(name: str) -> Callable[[Any, tuple, dict], None]:
    return lambda function, raw_args, raw_kwargs: refuse_cusolver(name)


#: NumPy function -> its check in a body (``check(function, raw_args, raw_kwargs)``, raising
#: what CuPy raises): the strict device looks each call up here, once, before running it
LIBRARY_RULES: dict[Any, Callable[[Any, tuple, dict], None]] = {
    **dict.fromkeys(_PRODUCTS, _refuse_cublas),
    **dict.fromkeys((np.concatenate, np.stack, np.hstack, np.vstack, np.dstack,
                     np.column_stack), _refuse_pointer_table),
    **{getattr(_LINALG, name): _cusolver_rule(name) for name in _CUSOLVER_NAMES
       if hasattr(_LINALG, name)},
}
