"""Syncs and device ops per solve: gpuscalar.linalg's solvers against cupyx's, counted on the
strict device (no GPU needed; counts, not times).

Why this benchmark exists: CuPy's own solvers (``cupyx.scipy.sparse.linalg``) read on the host
every iteration (a residual test, breakdown tests, GMRES's least-squares problem), one or more
syncs each; gpuscalar.linalg's are one `gs.while_loop` per solve. cupyx's ``cg`` and ``gmres``
are ported below with the fewest edits (the namespace is a parameter; cuBLAS calls become the
array operations they compute; every host read kept where cupyx makes it), and its ``minres``
is the port in ``tests/clients/minres_cupyx.py`` (its original reads). Each row: iterations,
then syncs and device ops per solve for gpuscalar and for cupyx's text, all on the strict
device with ``gs.count_syncs(include_cupy=True)`` (the device's own reads counted).

    python -m bench.krylov_counts [N]
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy
import numpy as np

import gpuscalar as gs
from gpuscalar.linalg._cg import _bicgstab, _cg, _cgs
from gpuscalar.linalg._gmres import _gmres
from gpuscalar.linalg._minres import _minres
from tests.clients import minres_cupyx

RTOL = 1e-8


# ---- cupyx's text (CuPy 14.2, cupyx/scipy/sparse/linalg/_iterative.py), ported -------------
# Edits are marked "port:"; cupy -> the namespace ``xp``; A and M dense (A @ v); reads kept.


def cg_cupyx(A, b, x0=None, *, rtol=1e-5, atol=0.0, maxiter=None, M=None, xp):  # noqa: N803
    matvec = A.__matmul__  # port: A dense
    psolve = (lambda v: v) if M is None else M.__matmul__  # port: IdentityOperator / M dense
    x = xp.zeros_like(b) if x0 is None else x0.copy()  # port: _make_system's x

    n = A.shape[0]
    if maxiter is None:
        maxiter = n * 10
    if n == 0:
        return xp.empty_like(b), 0
    b_norm = xp.linalg.norm(b)
    if b_norm == 0:
        return b, 0
    atol = max(float(atol), rtol * float(b_norm))

    r = b - matvec(x)
    iters = 0
    rho = 0
    while iters < maxiter:
        z = psolve(r)
        rho1 = rho
        rho = xp.vdot(r, z)  # port: cublas.dotc
        if iters == 0:
            p = z
        else:
            beta = rho / rho1
            p = z + beta * p
        q = matvec(p)
        alpha = rho / xp.vdot(p, q)  # port: cublas.dotc
        x = x + alpha * p
        r = r - alpha * q
        iters += 1
        resid = xp.linalg.norm(r)  # port: cublas.nrm2
        if resid <= atol:
            break

    info = 0
    if iters == maxiter and not (resid <= atol):
        info = iters

    return x, info


def gmres_cupyx(A, b, x0=None, *, rtol=1e-5, atol=0.0, restart=None, maxiter=None,  # noqa: N803
                M=None, xp):
    matvec = A.__matmul__  # port: A dense
    psolve = (lambda v: v) if M is None else M.__matmul__  # port
    x = xp.zeros_like(b) if x0 is None else x0.copy()  # port

    n = A.shape[0]
    if n == 0:
        return xp.empty_like(b), 0
    b_norm = xp.linalg.norm(b)
    if b_norm == 0:
        return b, 0
    atol = max(float(atol), rtol * float(b_norm))
    if maxiter is None:
        maxiter = n * 10
    if restart is None:
        restart = 20
    restart = min(restart, n)

    V = xp.empty((n, restart), dtype=A.dtype, order='F')
    H = xp.zeros((restart+1, restart), dtype=A.dtype, order='F')
    e = numpy.zeros((restart+1,), dtype=A.dtype)

    iters = 0
    while True:
        mx = psolve(x)
        r = b - matvec(mx)
        r_norm = xp.linalg.norm(r)  # port: cublas.nrm2
        if r_norm <= atol or iters >= maxiter:
            break
        v = r / r_norm
        V[:, 0] = v
        e[0] = float(r_norm)  # port: numpy's setitem reads the device value (float())

        # Arnoldi iteration
        for j in range(restart):
            z = psolve(v)
            u = matvec(z)
            h = V[:, :j+1].conj().T @ u  # port: _make_compute_hu's two gemv calls
            u -= V[:, :j+1] @ h
            H[:j+1, j] = h
            H[j+1, j] = xp.linalg.norm(u)  # port: cublas.nrm2(u, out=H[j+1, j])
            if j+1 < restart:
                v = u / H[j+1, j]
                V[:, j+1] = v

        # Note: The least-square solution to equation Hy = e is computed on CPU
        # because it is faster if the matrix size is small.
        ret = numpy.linalg.lstsq(H.get(), e, rcond=None)  # port: cupy.asnumpy(H)
        y = xp.asarray(ret[0])
        x += V @ y
        iters += restart

    info = 0
    if iters >= maxiter and not (r_norm <= atol):
        info = iters
    return mx, info


# ---- the counts -------------------------------------------------------------------------------


def system(xp: Any, n: int) -> tuple[Any, Any]:
    """A symmetric positive definite system (every solver applies): a 1-D Laplacian + 0.1 I."""
    a = np.diag(np.full(n, 2.1)) - np.diag(np.ones(n - 1), 1) - np.diag(np.ones(n - 1), -1)
    b = np.sin(np.linspace(0.0, 3.0 * np.pi, n)) + 0.5
    return xp.asarray(a), xp.asarray(b)


def counted(solve: Any) -> tuple[Any, int, int]:
    with gs.count_syncs(include_cupy=True) as counter:
        result = solve()
    return result, counter.count, counter.device_ops


def rows(n: int) -> list[tuple[str, int, int, int, str, str]]:
    xp = gs.strict.xp
    a, b = system(xp, n)
    ours: dict[str, Any] = {"cg": _cg, "cgs": _cgs, "bicgstab": _bicgstab, "gmres": _gmres,
                            "minres": _minres}
    theirs: dict[str, Any] = {
        "cg": functools.partial(cg_cupyx, xp=xp),
        "gmres": functools.partial(gmres_cupyx, xp=xp),
        "minres": functools.partial(minres_cupyx.minres_original, cupy=xp,
                                    read=minres_cupyx.original_read),
    }
    table = []
    for name, solve in ours.items():
        (_, info, iterations), syncs, ops = counted(functools.partial(solve, a, b, rtol=RTOL))
        assert gs.read(info)[0] == 0, name
        their_syncs = their_ops = "-"
        if name in theirs:
            keyword = "tol" if name == "minres" else "rtol"
            _, count, device_ops = counted(functools.partial(theirs[name], a, b,
                                                             **{keyword: RTOL}))
            their_syncs, their_ops = str(count), str(device_ops)
        table.append((name, int(iterations), syncs, ops, their_syncs, their_ops))
    return table


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    print(f"strict device, N = {n}, rtol = {RTOL}: per solve")
    print(f"{'solver':<10}{'iterations':>11}{'syncs':>7}{'device ops':>12}"
          f"{'cupyx syncs':>13}{'cupyx ops':>11}")
    for name, iterations, syncs, ops, their_syncs, their_ops in rows(n):
        print(f"{name:<10}{iterations:>11}{syncs:>7}{ops:>12}{their_syncs:>13}{their_ops:>11}")


if __name__ == "__main__":
    main()
