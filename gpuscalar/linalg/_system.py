"""What every Krylov solver shares: the operators, the argument checks, the tolerance and the
device-side helpers the loop bodies use.

Why this module exists: the five solvers (`gpuscalar.linalg`) take the arguments SciPy's and
cupyx's take (a dense array, a sparse matrix, a LinearOperator-like object or a callable, and
``b``, ``x0``, ``rtol``, ``atol``, ``maxiter``, ``M``) and check them the same way, without
reading anything on the device: the tolerance ``max(atol, rtol * ||b||)`` stays a device value,
and SciPy's early exits (``b == 0``, a converged start) become the loop's first status.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import Backend
from ..control import while_loop
from ..devices import backend_of
from ..math import maximum, where
from ..matmul import matmul
from ..reduce import dot, norm, vdot
from ..scalar import GPUScalar, _wrap
from ..sparse import is_sparse, sparse_format, spmv

__all__ = ["LinearOperator", "aslinearoperator", "System", "make_system", "set_to", "put",
           "CONTINUE"]

#: the loop's status while it runs; any other value says why it stopped (0: converged; a
#: negative value: SciPy's breakdown codes)
CONTINUE = 1
_INT64 = np.dtype(np.int64)


class LinearOperator:
    """A square operator ``x -> matvec(x)`` of a shape and dtype: what the solvers multiply by.

    ``matvec`` takes and returns 1-D device arrays and must work in a loop body (no sync, no
    host-to-device copy): on a GPU it is recorded once and replayed every iteration.
    """

    def __init__(self, shape: tuple[int, int], matvec: Callable[[Any], Any],
                 dtype: Any = None) -> None:
        self.shape = (int(shape[0]), int(shape[1]))
        self.matvec = matvec
        self.dtype = None if dtype is None else np.dtype(dtype)

    def __repr__(self) -> str:
        return f"<{self.shape[0]}x{self.shape[1]} gpuscalar.linalg.LinearOperator, {self.dtype}>"


def _is_sparse(value: Any) -> bool:
    """A SciPy, cupyx or strict sparse matrix (or array)."""
    return is_sparse(value)


def _sparse_product(a: Any) -> Callable[[Any], Any]:
    """``x -> a @ x`` for a sparse matrix: `gs.spmv` (capture-safe on every device) for CSR;
    another format is converted once, here, before any loop."""
    csr = a if sparse_format(a) == "csr" else a.tocsr()
    return lambda x: spmv(csr, x)


def aslinearoperator(A: Any, *, shape: tuple[int, int] | None = None,
                     dtype: Any = None) -> LinearOperator:
    """``A`` as a `LinearOperator`: a dense 2-D device array, a SciPy (NumPy) or cupyx (CuPy)
    sparse matrix, an object with ``matvec`` and ``shape`` (SciPy's and cupyx's
    LinearOperators), or a callable ``x -> A x`` (then ``shape`` is required; ``dtype``
    defaults to the right-hand side's)."""
    if isinstance(A, LinearOperator):
        return A
    if _is_sparse(A):
        return LinearOperator(A.shape, _sparse_product(A), A.dtype)
    if backend_of(A) is not None:
        if A.ndim != 2:
            raise ValueError(f"A must be a 2-D matrix, got an array of shape {A.shape}")
        return LinearOperator(A.shape, lambda x: matmul(A, x), A.dtype)
    if hasattr(A, "matvec") and hasattr(A, "shape"):
        return LinearOperator(A.shape, A.matvec, getattr(A, "dtype", None))
    if callable(A):
        if shape is None:
            raise TypeError("a callable operator needs shape=(n, n)")
        return LinearOperator(shape, A, dtype)
    raise TypeError(
        f"the operator must be a 2-D device array, a sparse matrix, a LinearOperator (an object "
        f"with matvec and shape) or a callable, got {type(A).__name__}"
    )


# ---- the system ---------------------------------------------------------------------------------


def _real_number(value: Any, solver: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"gpuscalar.linalg.{solver}: {name} must be a real Python number, got "
            f"{type(value).__name__} (checking a device value would need a read)"
        )
    if not float(value) >= 0:  # NaN too
        raise ValueError(f"gpuscalar.linalg.{solver}: {name} must be a real number >= 0, "
                         f"got {value}")
    return float(value)


def _vector(value: Any, n: int, solver: str, name: str, backend: Backend | None) -> Any:
    found = backend_of(value)
    if found is None:
        raise TypeError(f"gpuscalar.linalg.{solver}: {name} must be a NumPy or CuPy array (or "
                        f"the strict device's), got {type(value).__name__}")
    if backend is not None and found is not backend:
        raise TypeError(f"gpuscalar.linalg.{solver}: {name} is a {found.name} array but b is "
                        f"a {backend.name} array")
    if value.shape not in ((n,), (n, 1)):
        raise ValueError(f"gpuscalar.linalg.{solver}: {name} has shape {value.shape}; the "
                         f"system has {n} unknowns, so it must be ({n},) or ({n}, 1)")
    return value


def _solver_dtype(*dtypes: Any) -> np.dtype:
    """SciPy's promotion: the operands' common type, integers and bools as float64, float16 as
    float32; only float32, float64, complex64 and complex128 are solved in."""
    for d in dtypes:
        if d is not None and np.dtype(d).kind not in "biufc":
            raise TypeError(f"the solvers take bool, integer, floating or complex dtypes, got "
                            f"{np.dtype(d)}")
    known = [np.dtype(d) for d in dtypes if d is not None]
    common = np.result_type(*known, np.float32)
    return np.dtype(np.float64) if common.kind not in "fc" else common


def _operator(A: Any, n: int | None, solver: str, name: str) -> LinearOperator:
    shape = None if n is None else (n, n)
    try:
        op = aslinearoperator(A, shape=shape)
    except (TypeError, ValueError) as error:
        raise type(error)(f"gpuscalar.linalg.{solver}: {name}: {error}") from None
    if len(op.shape) != 2 or op.shape[0] != op.shape[1]:
        raise ValueError(f"gpuscalar.linalg.{solver}: {name} must be square, got shape "
                         f"{op.shape}")
    return op


class System:
    """A checked system ``A x = b``: the operators, ``x`` (a fresh array the solver updates in
    place), ``b``, the device tolerance ``atol`` and ``maxiter``, with the helpers the bodies
    call (``matvec``, ``psolve``, ``dot``, ``norm``)."""

    def __init__(self, solver: str, A: Any, b: Any, x0: Any, M: Any, rtol: Any, atol: Any,
                 maxiter: Any, default_iterations: int, callback: Any) -> None:
        if callback is not None:
            raise ValueError(
                f"gpuscalar.linalg.{solver}: callback is not supported: calling a Python "
                "function with each iterate needs the host at every iteration (a sync each), "
                "and the loop runs on the device (on a GPU, one graph launch with no Python "
                "in it); the iteration count is the solver's info when it does not converge"
            )
        backend = backend_of(b)
        if backend is None:
            raise TypeError(f"gpuscalar.linalg.{solver}: b must be a NumPy or CuPy array (or "
                            f"the strict device's), got {type(b).__name__}")
        if b.ndim not in (1, 2):
            raise ValueError(f"gpuscalar.linalg.{solver}: b must have shape (n,) or (n, 1), "
                             f"got {b.shape}")
        n = b.shape[0]
        self.A = _operator(A, n, solver, "A")
        if self.A.shape[0] != n:
            raise ValueError(f"gpuscalar.linalg.{solver}: A has shape {self.A.shape} but b "
                             f"has shape {b.shape}")
        _vector(b, n, solver, "b", None)
        self.M = None if M is None else _operator(M, n, solver, "M")
        if self.M is not None and self.M.shape != self.A.shape:
            raise ValueError(f"gpuscalar.linalg.{solver}: M has shape {self.M.shape} but A "
                             f"has shape {self.A.shape}")
        for op, name in ((A, "A"), (M, "M")):
            if _is_sparse(op) and type(op).__module__.startswith("scipy") and (
                    not backend.host_memory):
                raise TypeError(
                    f"gpuscalar.linalg.{solver}: {name} is a scipy.sparse matrix, which "
                    f"multiplies NumPy arrays, but b is a {backend.name} array; put it on b's "
                    "device first with gs.as_csr(A, like=b)"
                )
        if x0 is not None:
            _vector(x0, n, solver, "x0", backend)
        for op, name in ((A, "A"), (M, "M")):
            other = backend_of(op)
            if other is not None and other is not backend:
                raise TypeError(f"gpuscalar.linalg.{solver}: {name} is a {other.name} array "
                                f"but b is a {backend.name} array")
        self.dtype = _solver_dtype(self.A.dtype, b.dtype, None if x0 is None else x0.dtype)
        self.real_dtype = np.dtype(self.dtype.char.lower())
        self.backend, self.xp, self.n = backend, backend.xp, n
        self.device = backend.device_of(b)
        rtol_value = _real_number(rtol, solver, "rtol")
        atol_value = _real_number(atol, solver, "atol")
        if maxiter is None:
            maxiter = default_iterations * n
        if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)):
            raise TypeError(f"gpuscalar.linalg.{solver}: maxiter must be an int or None, got "
                            f"{type(maxiter).__name__}")
        if maxiter < 0:
            raise ValueError(f"gpuscalar.linalg.{solver}: maxiter must be >= 0, got {maxiter}")
        self.maxiter = int(maxiter)
        self.solver = solver
        with backend.device_context(self.device):
            self.b = b.astype(self.dtype).ravel()
            if backend_of(A) is not None and A.dtype != self.dtype:
                self.A = aslinearoperator(A.astype(self.dtype))
            if M is not None and backend_of(M) is not None and M.dtype != self.dtype:
                self.M = aslinearoperator(M.astype(self.dtype))
            self.bnorm = norm(self.b)
            #: SciPy's tolerance, max(atol, rtol * ||b||), kept on the device
            self.atol = _wrap(backend, maximum(atol_value, rtol_value * self.bnorm).array)
            if x0 is None:
                self.x = self.zeros()
            else:
                # SciPy returns b (zeros) for b == 0 whatever x0 is
                self.x = self.xp.where((self.bnorm != 0).array, x0.astype(self.dtype).ravel(),
                                       self._zeros(()))

    # ---- what bodies call ---------------------------------------------------------------------

    def matvec(self, x: Any) -> Any:
        return self.A.matvec(x)

    def psolve(self, x: Any) -> Any:
        return x if self.M is None else self.M.matvec(x)

    def dot(self, u: Any, v: Any) -> GPUScalar:
        """SciPy's ``dotprod``: ``gs.vdot(u, v)`` (``u`` conjugated) for complex, ``gs.dot``
        for real (both capture-safe)."""
        return vdot(u, v) if self.dtype.kind == "c" else dot(u, v)

    def vecmat(self, y: Any, V: Any) -> Any:
        """``y @ V`` (a combination of V's rows), `gs.matmul` (capture-safe)."""
        return matmul(y, V)

    def norm(self, u: Any) -> GPUScalar:
        return norm(u)

    def zeros(self, *shape: int, dtype: Any = None) -> Any:
        """A new array of zeros of ``shape`` (default ``(n,)``) on the system's device."""
        return self._zeros(shape or (self.n,), dtype)

    def _zeros(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        """Zeros through the backend (one device op: the one path by which gpuscalar reaches a
        device, so the fake-CuPy layer sees it)."""
        backend = self.backend
        with backend.device_context(self.device):
            return backend.call(backend.xp.zeros, shape,
                                dtype=self.dtype if dtype is None else dtype)

    def scalar(self, value: Any, dtype: Any = None) -> Any:
        """A 0-d state array holding ``value`` (a Python number: a fill; a GPUScalar: a copy)."""
        out = self._zeros((), dtype)
        set_to(out, value)
        return out

    def status(self, value: Any) -> Any:
        return self.scalar(value, _INT64)

    def started(self, r: Any, checks: Any = CONTINUE) -> Any:
        """The status before the first iteration: 0 when ``b == 0`` or the start has converged
        (``||r|| < atol``), else ``checks``."""
        return self.status(where((self.bnorm == 0) | (self.norm(r) < self.atol), 0, checks))

    def run(self, body: Callable[..., None], *state: Any, max_iter: int | None = None
            ) -> GPUScalar:
        """One `gs.while_loop` running ``body`` while the status (the last state) is CONTINUE."""
        return while_loop(_running, body, *state,
                          max_iter=self.maxiter if max_iter is None else max_iter)

    def info(self, status: Any, iterations: GPUScalar) -> GPUScalar:
        """SciPy's info: the stop's status (0 converged, < 0 breakdown) when the loop stopped
        before ``maxiter`` iterations, else ``maxiter``."""
        done = _wrap(self.backend, status)
        return where(iterations < self.maxiter, done, self.maxiter)


def _running(*state: Any) -> Any:
    return state[-1] == CONTINUE


def set_to(out: Any, value: Any) -> None:
    """``out[...] = value`` for a GPUScalar, a 0-d array or a Python number."""
    out[...] = value.array if isinstance(value, GPUScalar) else value


def put(out: Any, index: int, value: Any) -> None:
    """``out[index] = value`` (a GPUScalar's array): NumPy's ``out[index]`` is a copy, not a
    view, so a 0-d element is written through its parent."""
    out[index] = value.array if isinstance(value, GPUScalar) else value


def make_system(solver: str, A: Any, b: Any, x0: Any, M: Any, rtol: Any, atol: Any,
                maxiter: Any, default_iterations: int, callback: Any) -> System:
    return System(solver, A, b, x0, M, rtol, atol, maxiter, default_iterations, callback)
