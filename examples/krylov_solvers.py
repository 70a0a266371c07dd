"""SciPy's Krylov solvers with zero syncs: cg, cgs, bicgstab, gmres and minres from
``gpuscalar.linalg``, each solving the same system as one device loop.

Why this example exists: ``cupyx.scipy.sparse.linalg``'s solvers read a residual norm (and more)
on the host every iteration, one or more syncs each. ``gpuscalar.linalg``'s decide on the device
when to stop (``gs.while_loop``: on a GPU one graph launch), so a whole solve makes no sync; the
iterations are SciPy's. The script solves one symmetric positive definite system (a 1-D
Laplacian plus a shift, Jacobi-preconditioned) with each solver and prints, per solver, the
iterations, ``info``, the syncs the solve made, and the residual ``||b - A x|| / ||b||`` (read
after the solve, with one sync each: below ``rtol`` = 1e-8, except for minres, whose test is
SciPy's ``||r|| <= rtol ||A|| ||x||``).

Runs on CuPy when a GPU is present, else NumPy:  python examples/krylov_solvers.py [N]
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import gpuscalar as gs
from gpuscalar.linalg._cg import _bicgstab, _cg, _cgs
from gpuscalar.linalg._gmres import _gmres
from gpuscalar.linalg._minres import _minres

# the solvers' entry points that also return the iteration count (the loop's, no callback)
SOLVERS: dict[str, Any] = {"cg": _cg, "cgs": _cgs, "bicgstab": _bicgstab, "gmres": _gmres,
                           "minres": _minres}
RTOL = 1e-8


def laplacian_system(xp: Any, n: int) -> tuple[Any, Any, Any]:
    """A (the 1-D Laplacian plus 0.1 I, dense), b (a smooth load) and a Jacobi M."""
    a = np.diag(np.full(n, 2.1)) - np.diag(np.ones(n - 1), 1) - np.diag(np.ones(n - 1), -1)
    b = np.sin(np.linspace(0.0, 3.0 * np.pi, n)) + 0.5
    m = np.diag(1.0 / np.diag(a))
    return xp.asarray(a), xp.asarray(b), xp.asarray(m)


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    backend = gs.default_backend()
    a, b, m = laplacian_system(backend.xp, size)
    print(f"backend: {backend.name}, N = {size}")
    for name, solve in SOLVERS.items():
        with gs.count_syncs() as counter:
            x, info, iterations = solve(a, b, M=m, rtol=RTOL)
        residual = float(gs.norm(b - gs.matmul(a, x)) / gs.norm(b))
        print(f"{name}: iterations {int(iterations)}, info {int(info)}, "
              f"syncs {counter.count}, residual {residual:.2e}")


if __name__ == "__main__":
    main()
