"""Conjugate gradient, CGS and BiCGSTAB as single device loops: SciPy's iterations, no sync.

Why this module exists: these three are SciPy's short-recurrence solvers
(``scipy/sparse/linalg/_isolve/iterative.py``), whose host versions (and cupyx's) read a norm,
and for CGS and BiCGSTAB a breakdown test, every iteration. Here each is one `gs.while_loop`
whose body is SciPy's iteration written with in-place updates: a scalar that changes lives in a
0-d array, SciPy's first-iteration special case is the general update applied to zero vectors
(``p *= beta; p += z`` with ``p = 0`` is ``p = z`` exactly), and each ``return`` inside SciPy's
loop is the status the body sets for the next test (a masked update where SciPy returns in the
middle of an iteration).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..math import where
from ..scalar import GPUScalar
from ._system import CONTINUE, make_system, set_to

__all__ = ["cg", "cgs", "bicgstab"]

#: SciPy's breakdown codes
RHO_BREAKDOWN, OMEGA_BREAKDOWN = -10, -11


def _safe(value: GPUScalar) -> GPUScalar:
    """A divisor that is never 0 (where the quotient is discarded): no division warning."""
    return where(value == 0, 1, value)


def cg(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
       maxiter: int | None = None, M: Any = None, callback: Any = None
       ) -> tuple[Any, GPUScalar]:
    """Solve ``A x = b`` by conjugate gradients (``A`` Hermitian positive definite) as one
    device loop: no sync. Returns ``(x, info)``, ``info`` an int64 GPUScalar: 0 converged
    (``||b - A x|| < max(atol, rtol ||b||)``), else the iteration count (``maxiter``, default
    ``10 n``). SciPy's algorithm and iterates (`scipy.sparse.linalg.cg`)."""
    return _cg(A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M, callback=callback)[:2]


def _cg(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
        maxiter: int | None = None, M: Any = None, callback: Any = None
        ) -> tuple[Any, GPUScalar, GPUScalar]:
    system = make_system("cg", A, b, x0, M, rtol, atol, maxiter, 10, callback)
    s = system
    x = s.x
    r = s.b - s.matvec(x)
    p = s.zeros()
    rho_prev = s.scalar(1.0)
    status = s.started(r)

    def body(x: Any, r: Any, p: Any, rho_prev: Any, status: Any) -> None:
        z = s.psolve(r)
        rho = s.dot(r, z)
        p *= rho / GPUScalar(rho_prev)  # beta; p == 0 in the first iteration
        p += z
        q = s.matvec(p)
        alpha = rho / s.dot(p, q)
        x += alpha * p
        r -= alpha * q
        set_to(rho_prev, rho)
        set_to(status, where(s.norm(r) < s.atol, 0, CONTINUE))

    n = s.run(body, x, r, p, rho_prev, status)
    return x, s.info(status, n), n


def cgs(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
        maxiter: int | None = None, M: Any = None, callback: Any = None
        ) -> tuple[Any, GPUScalar]:
    """Solve ``A x = b`` by conjugate gradient squared as one device loop: no sync. Returns
    ``(x, info)`` as `cg` (``info`` -10 or -11: SciPy's breakdowns; ``maxiter`` default
    ``10 n``). SciPy's algorithm (`scipy.sparse.linalg.cgs`)."""
    return _cgs(A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M, callback=callback)[:2]


def _cgs(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
         maxiter: int | None = None, M: Any = None, callback: Any = None
         ) -> tuple[Any, GPUScalar, GPUScalar]:
    s = make_system("cgs", A, b, x0, M, rtol, atol, maxiter, 10, callback)
    rhotol = float(np.finfo(s.dtype).eps) ** 2
    x = s.x
    r = s.b - s.matvec(x)
    rtilde = r.copy()
    p, u, q = s.zeros(), s.zeros(), s.zeros()
    rho = s.scalar(s.dot(rtilde, r))
    rho_prev = s.scalar(1.0)

    def checks(rho: GPUScalar) -> GPUScalar:
        return where(abs(rho) < rhotol, RHO_BREAKDOWN, CONTINUE)

    status = s.started(r, checks(GPUScalar(rho)))

    def body(x: Any, r: Any, p: Any, u: Any, q: Any, rho: Any, rho_prev: Any,
             status: Any) -> None:
        rho_cur = GPUScalar(rho)
        beta = rho_cur / GPUScalar(rho_prev)
        u[...] = r  # u = r + beta q; p = u + beta (q + beta p); q == p == 0 at first
        u += beta * q
        p *= beta
        p += q
        p *= beta
        p += u
        phat = s.psolve(p)
        vhat = s.matvec(phat)
        rv = s.dot(rtilde, vhat)
        broken = rv == 0  # SciPy returns here: alpha = 0 leaves x as it is
        alpha = where(broken, 0, rho_cur / _safe(rv))
        q[...] = u
        q -= alpha * vhat
        uhat = s.psolve(u + q)
        x += alpha * uhat
        r[...] = s.b - s.matvec(x)  # SciPy's true residual
        set_to(rho_prev, rho_cur)
        rho_next = s.dot(rtilde, r)
        set_to(rho, rho_next)
        set_to(status, where(broken, OMEGA_BREAKDOWN,
                             where(s.norm(r) < s.atol, 0, checks(rho_next))))

    n = s.run(body, x, r, p, u, q, rho, rho_prev, status)
    return x, s.info(status, n), n


def bicgstab(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
             maxiter: int | None = None, M: Any = None, callback: Any = None
             ) -> tuple[Any, GPUScalar]:
    """Solve ``A x = b`` by BiCGSTAB as one device loop: no sync. Returns ``(x, info)`` as
    `cg` (``info`` -10 or -11: SciPy's breakdowns; ``maxiter`` default ``10 n``). SciPy's
    algorithm (`scipy.sparse.linalg.bicgstab`), its half-step exit included."""
    return _bicgstab(A, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, M=M,
                     callback=callback)[:2]


def _bicgstab(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
              maxiter: int | None = None, M: Any = None, callback: Any = None
              ) -> tuple[Any, GPUScalar, GPUScalar]:
    s = make_system("bicgstab", A, b, x0, M, rtol, atol, maxiter, 10, callback)
    rhotol = omegatol = float(np.finfo(s.dtype).eps) ** 2
    x = s.x
    r = s.b - s.matvec(x)
    rtilde = r.copy()
    p, v = s.zeros(), s.zeros()
    rho = s.scalar(s.dot(rtilde, r))
    # with p = v = 0 and these, SciPy's general update gives its first p = r exactly
    rho_prev, alpha, omega = s.scalar(1.0), s.scalar(1.0), s.scalar(1.0)
    status = s.started(r, where(abs(GPUScalar(rho)) < rhotol, RHO_BREAKDOWN, CONTINUE))

    def body(x: Any, r: Any, p: Any, v: Any, rho: Any, rho_prev: Any, alpha: Any,
             omega: Any, status: Any) -> None:
        rho_cur, omega_prev = GPUScalar(rho), GPUScalar(omega)
        beta = (rho_cur / GPUScalar(rho_prev)) * (GPUScalar(alpha) / omega_prev)
        p -= omega_prev * v
        p *= beta
        p += r
        phat = s.psolve(p)
        v[...] = s.matvec(phat)
        rv = s.dot(rtilde, v)
        broken = rv == 0  # SciPy returns x as it is: alpha = omega = 0 below
        alpha_new = where(broken, 0, rho_cur / _safe(rv))
        r -= alpha_new * v
        half = ~broken & (s.norm(r) < s.atol)  # SciPy's half-step exit: x += alpha phat
        shat = s.psolve(r)
        t = s.matvec(shat)
        omega_new = where(broken | half, 0, s.dot(t, r) / _safe(s.dot(t, t)))
        x += alpha_new * phat
        x += omega_new * shat
        r -= omega_new * t
        rho_next = s.dot(rtilde, r)
        set_to(rho_prev, rho_cur)
        set_to(rho, rho_next)
        set_to(alpha, alpha_new)
        set_to(omega, omega_new)
        set_to(status, where(
            broken, OMEGA_BREAKDOWN, where(
                half | (s.norm(r) < s.atol), 0, where(
                    abs(rho_next) < rhotol, RHO_BREAKDOWN, where(
                        abs(omega_new) < omegatol, OMEGA_BREAKDOWN, CONTINUE)))))

    n = s.run(body, x, r, p, v, rho, rho_prev, alpha, omega, status)
    return x, s.info(status, n), n
