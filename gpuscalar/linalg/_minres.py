"""MINRES as one device loop: SciPy's Lanczos recurrence and stopping tests, no sync.

Why this module exists: MINRES (``scipy/sparse/linalg/_isolve/minres.py``; cupyx's copy reads
three scalars on the host every iteration) solves symmetric, possibly indefinite systems with a
short recurrence whose state is a dozen scalars. Here those scalars live in 0-d device arrays,
SciPy's stopping tests (``istop``) are one device expression, and SciPy's two ``ValueError``s
(an indefinite preconditioner, a non-symmetric ``A`` seen as ``beta**2 < 0``), which need the
host to raise, stop the loop with a negative ``info`` instead. Complex Hermitian systems use the
conjugating inner product (SciPy's minres is real only).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..control import while_loop
from ..math import maximum, minimum, sqrt, where
from ..scalar import GPUScalar
from ._system import make_system, set_to

__all__ = ["minres"]

#: istop values past SciPy's -1..6: SciPy raises for 7 and 9 (its messages' numbering);
#: 10: ``beta1 == 0``, x0 is the solution (SciPy returns before its loop)
NOT_SYMMETRIC, INDEFINITE_M, EXACT_START = 7, 9, 10
_SCALARS = ("beta", "oldb", "dbar", "epsln", "phibar", "rhs1", "rhs2", "tnorm2", "gmax",
            "gmin", "cs", "sn")


def minres(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, shift: float = 0.0,
           maxiter: int | None = None, M: Any = None, callback: Any = None
           ) -> tuple[Any, GPUScalar]:
    """Solve ``(A - shift I) x = b`` by MINRES (``A`` symmetric or Hermitian, possibly
    indefinite; ``M`` symmetric positive definite) as one device loop: no sync. Returns
    ``(x, info)``, ``info`` an int64 GPUScalar: 0 stopped by SciPy's tests, ``maxiter``
    (default ``5 n``) when the limit was reached, -7 where SciPy raises "non-symmetric
    matrix", -9 where it raises "indefinite preconditioner". SciPy's algorithm
    (`scipy.sparse.linalg.minres`)."""
    return _minres(A, b, x0, rtol=rtol, shift=shift, maxiter=maxiter, M=M,
                   callback=callback)[:2]


def _minres(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, shift: float = 0.0,
            maxiter: int | None = None, M: Any = None, callback: Any = None
            ) -> tuple[Any, GPUScalar, GPUScalar]:
    s = make_system("minres", A, b, x0, M, rtol, 0.0, maxiter, 5, callback)
    if isinstance(shift, bool) or not isinstance(shift, (int, float, np.floating, np.integer)):
        raise TypeError(f"gpuscalar.linalg.minres: shift must be a real Python number, got "
                        f"{type(shift).__name__}")
    shift, rtol = float(shift), float(rtol)
    real = s.real_dtype
    eps = float(np.finfo(real).eps)
    x = s.x
    r1 = s.b - s.matvec(x)
    y = s.psolve(r1).copy()  # never r1 itself (M = None): both are updated in place
    beta1_squared = s.dot(r1, y).real
    beta1 = s.scalar(sqrt(maximum(beta1_squared, 0.0)), real)
    sc = {name: s.scalar(0.0, real) for name in _SCALARS}
    for name in ("beta", "phibar", "rhs1"):
        set_to(sc[name], GPUScalar(beta1))
    set_to(sc["gmin"], float(np.finfo(real).max))
    set_to(sc["cs"], -1.0)
    w, w2 = s.zeros(), s.zeros()
    r2 = r1.copy()
    itn = s.status(0)
    istop = s.status(where(beta1_squared < 0, INDEFINITE_M,
                           where(beta1_squared == 0, EXACT_START, 0)))
    state = (x, r1, r2, y, w, w2, itn, *sc.values(), istop)

    def body(*_: Any) -> None:
        get = {name: GPUScalar(array) for name, array in sc.items()}
        b1 = GPUScalar(beta1)
        it = GPUScalar(itn) + 1
        set_to(itn, it)
        beta, oldb = get["beta"], get["oldb"]
        v = y * (1.0 / beta)
        y_new = s.matvec(v)
        y_new -= shift * v
        y_new -= where(it >= 2, beta / where(oldb == 0, 1, oldb), 0) * r1
        alfa = s.dot(v, y_new).real
        y_new -= (alfa / beta) * r2
        r1[...] = r2
        r2[...] = y_new
        y[...] = s.psolve(r2)
        beta_squared = s.dot(r2, y).real
        bad = beta_squared < 0  # SciPy raises "non-symmetric matrix" here
        beta = sqrt(maximum(beta_squared, 0.0))
        oldb = get["beta"]
        tnorm2 = get["tnorm2"] + alfa**2 + oldb**2 + beta**2
        early = (it == 1) & (beta / b1 <= 10 * eps)  # SciPy's istop = -1
        cs, sn, dbar = get["cs"], get["sn"], get["dbar"]
        oldeps = get["epsln"]
        delta = cs * dbar + sn * alfa
        gbar = sn * dbar - cs * alfa
        epsln = sn * beta
        dbar = -cs * beta
        root = sqrt(gbar * gbar + dbar * dbar)
        gamma = maximum(sqrt(gbar * gbar + beta * beta), eps)
        cs = gbar / gamma
        sn = beta / gamma
        phibar = get["phibar"]
        phi = where(bad, 0, cs * phibar)
        phibar = sn * phibar
        w_new = (v - oldeps * w2 - delta * w) * (1.0 / gamma)
        w2[...] = w
        w[...] = w_new
        x[...] += phi * w
        gmax = maximum(get["gmax"], gamma)
        gmin = minimum(get["gmin"], gamma)
        z = get["rhs1"] / gamma
        rhs1 = get["rhs2"] - delta * z
        rhs2 = -epsln * z
        anorm = sqrt(tnorm2)
        ynorm = s.norm(x)
        epsx = anorm * ynorm * eps
        test1 = where((ynorm == 0) | (anorm == 0), np.inf,
                      phibar / where((ynorm == 0) | (anorm == 0), 1, anorm * ynorm))
        test2 = where(anorm == 0, np.inf, root / where(anorm == 0, 1, anorm))
        acond = gmax / gmin
        tests = where(test1 <= rtol, 1, where(test2 <= rtol, 2, where(
            epsx >= b1, 3, where(acond >= 0.1 / eps, 4, where(
                it >= s.maxiter, 6, where(1 + test1 <= 1, 1, where(1 + test2 <= 1, 2, 0)))))))
        set_to(istop, where(bad, NOT_SYMMETRIC, where(early, -1, tests)))
        for name, value in (("beta", beta), ("oldb", oldb), ("dbar", dbar), ("epsln", epsln),
                            ("phibar", phibar), ("rhs1", rhs1), ("rhs2", rhs2),
                            ("tnorm2", tnorm2), ("gmax", gmax), ("gmin", gmin), ("cs", cs),
                            ("sn", sn)):
            set_to(sc[name], value)

    n = while_loop(lambda *state: state[-1] == 0, body, *state, max_iter=s.maxiter)
    stop = GPUScalar(istop)
    info = where(stop == 6, s.maxiter, where(stop == NOT_SYMMETRIC, -NOT_SYMMETRIC, where(
        stop == INDEFINITE_M, -INDEFINITE_M, 0)))
    return x, info, n
