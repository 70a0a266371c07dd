"""Restarted GMRES as one device loop: SciPy's Arnoldi steps, Givens rotations and triangular
solve, all on the device.

Why this module exists: GMRES is where the host usually comes back (cupyx solves each
restart's least-squares problem with ``numpy.linalg.lstsq`` on the host). SciPy's version
(``scipy/sparse/linalg/_isolve/iterative.py``) instead rotates the Hessenberg matrix with
Givens rotations as it grows and back-substitutes at each restart; here that runs on the device,
with the two nested loops flattened into one `gs.while_loop` whose iteration is one Arnoldi
step (one product with ``A``, as SciPy counts iterations):

- the column index ``col`` is a 0-d device array, so every access at ``col`` is a one-hot
  ``where`` or a ``take``, never a host index;
- SciPy's loops up to ``col`` run over all ``restart`` columns, where the ones past ``col`` are
  exact no-ops: the basis rows past ``col`` are zero (reset at each restart) and the rotations
  past ``col`` are the identity;
- the end of a cycle (triangular solve, update of ``x``, the outer tests and the next cycle's
  start) is a `gs.cond` inside the loop body.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..control import cond
from ..math import maximum, minimum, sqrt, where
from ..scalar import GPUScalar
from ._system import CONTINUE, System, make_system, put, set_to

__all__ = ["gmres"]

#: the loop stopped without converging (breakdown or the iteration limit): info = maxiter
NOT_CONVERGED = 2


def _safe(value: GPUScalar) -> GPUScalar:
    """A divisor that is never 0 (where the quotient is discarded): no division warning."""
    return where(value == 0, 1, value)


def _lartg(f: GPUScalar, g: GPUScalar) -> tuple[GPUScalar, GPUScalar, GPUScalar]:
    """LAPACK's ``lartg`` (what SciPy's gmres calls): ``c`` real >= 0, ``s`` and ``r`` with
    ``[c s; -conj(s) c] [f; g] = [r; 0]``; ``r = f`` when ``g == 0``, ``r = |g|`` when
    ``f == 0``."""
    abs_f, abs_g = abs(f), abs(g)
    d = sqrt(abs_f * abs_f + abs_g * abs_g)
    phase = where(abs_f == 0, 1, f / _safe(abs_f))  # f / |f|
    c = where(abs_g == 0, 1, abs_f / _safe(d))
    s = phase * g.conjugate() / _safe(d)
    return c, s, phase * d


def gmres(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
          restart: int | None = None, maxiter: int | None = None, M: Any = None,
          callback: Any = None, callback_type: Any = None) -> tuple[Any, GPUScalar]:
    """Solve ``A x = b`` by restarted GMRES as one device loop: no sync, no host least-squares
    (Givens rotations and the triangular solve run on the device). Returns ``(x, info)``,
    ``info`` an int64 GPUScalar: 0 converged (``||b - A x|| <= max(atol, rtol ||b||)``), else
    ``maxiter``, which counts restart cycles (default ``10 n``; ``restart`` default 20, at most
    ``n``). SciPy's algorithm (`scipy.sparse.linalg.gmres`)."""
    return _gmres(A, b, x0, rtol=rtol, atol=atol, restart=restart, maxiter=maxiter, M=M,
                  callback=callback, callback_type=callback_type)[:2]


def _gmres(A: Any, b: Any, x0: Any = None, *, rtol: float = 1e-5, atol: float = 0.0,
           restart: int | None = None, maxiter: int | None = None, M: Any = None,
           callback: Any = None, callback_type: Any = None
           ) -> tuple[Any, GPUScalar, GPUScalar]:
    if callback_type not in (None, "x", "pr_norm", "legacy"):
        raise ValueError(f"gpuscalar.linalg.gmres: unknown callback_type {callback_type!r}")
    s = make_system("gmres", A, b, x0, M, rtol, atol, maxiter, 10, callback)
    if restart is None:
        restart = 20
    if isinstance(restart, bool) or not isinstance(restart, (int, np.integer)) or restart < 1:
        raise ValueError(f"gpuscalar.linalg.gmres: restart must be an int >= 1, got {restart!r}")
    m = max(1, min(int(restart), s.n))
    eps = float(np.finfo(s.dtype).eps)
    xp = s.xp
    with s.backend.device_context(s.device):  # (through the backend: see System._zeros)
        rows = s.backend.call(xp.arange, m + 1)  # indices of S, the Hessenberg columns, the basis
        columns = s.backend.call(xp.arange, m)  # indices of the rotations
    x = s.x
    r = s.b - s.matvec(x)
    status = s.started(r)
    V = s.zeros(m + 1, s.n)
    h = s.zeros(m, m + 1)  # h[j] is column j of the Hessenberg matrix, as SciPy stores it
    cs = s.zeros(m, dtype=s.real_dtype)
    sn = s.zeros(m)
    S = s.zeros(m + 1)
    col = s.status(0)
    cycles = s.status(0)
    ptol_max_factor = s.scalar(1.0, s.real_dtype)
    # SciPy's inner tolerance (gh-8400): on the preconditioned residual
    ptol = s.scalar(s.norm(s.psolve(s.b)) * minimum(1.0, s.atol / _safe(s.bnorm)), s.real_dtype)
    _start_cycle(s, r, V, S, cs, sn)

    def step(x: Any, V: Any, h: Any, cs: Any, sn: Any, S: Any, col: Any, cycles: Any,
             ptol: Any, ptol_max_factor: Any, status: Any) -> None:
        j = GPUScalar(col)
        w = s.psolve(s.matvec(xp.take(V, j.array, axis=0)))
        # modified Gram-Schmidt against rows 0..j (the rows past j are zero: exact no-ops)
        h0 = s.norm(w)
        hcol = s.zeros(m + 1)
        for k in range(m):
            tmp = s.dot(V[k], w)
            put(hcol, k, tmp)
            w -= tmp * V[k]
        h1 = s.norm(w)
        breakdown = h1 <= eps * h0
        at_next = rows == (j + 1).array
        hcol[...] = xp.where(at_next, where(breakdown, 0, h1).array, hcol)
        V[...] = xp.where(at_next[:, None], w * where(breakdown, 1, 1 / _safe(h1)), V)
        # the past rotations (the ones at or past j are the identity: exact no-ops)
        for k in range(m - 1):
            n0, n1 = GPUScalar(hcol[k]), GPUScalar(hcol[k + 1])
            c, sk = GPUScalar(cs[k]), GPUScalar(sn[k])
            put(hcol, k, c * n0 + sk * n1)
            put(hcol, k + 1, -sk.conjugate() * n0 + c * n1)
        at_j = rows == j.array
        f = GPUScalar(xp.take(hcol, j.array))
        g = GPUScalar(xp.take(hcol, (j + 1).array))
        c, sk, mag = _lartg(f, g)
        at_rotation = columns == j.array
        cs[...] = xp.where(at_rotation, c.array, cs)
        sn[...] = xp.where(at_rotation, sk.array, sn)
        hcol[...] = xp.where(at_j, mag.array, xp.where(at_next, 0, hcol))
        h[...] = xp.where(at_rotation[:, None], hcol, h)
        S_j = GPUScalar(xp.take(S, j.array))
        tmp = -sk.conjugate() * S_j
        S[...] = xp.where(at_j, (c * S_j).array, xp.where(at_next, tmp.array, S))
        presid = abs(tmp)
        end = (presid <= GPUScalar(ptol)) | breakdown | (j == m - 1)

        def finish(x: Any, V: Any, h: Any, cs: Any, sn: Any, S: Any, cycles: Any,
                   ptol: Any, ptol_max_factor: Any, status: Any) -> None:
            _finish_cycle(s, columns, eps, j, presid, breakdown, x, V, h, cs, sn, S, cycles, ptol,
                          ptol_max_factor, status)

        cond(end, finish, None, x, V, h, cs, sn, S, cycles, ptol, ptol_max_factor, status)
        set_to(col, where(end, 0, j + 1))

    n = s.run(step, x, V, h, cs, sn, S, col, cycles, ptol, ptol_max_factor, status,
              max_iter=s.maxiter * m)
    info = where(GPUScalar(status) == 0, 0, s.maxiter)
    return x, info, n


def _start_cycle(s: System, r: Any, V: Any, S: Any, cs: Any, sn: Any) -> None:
    """A cycle's start: ``V[0] = M r / ||M r||``, ``S = (||M r||, 0, ...)``, the other basis
    rows zero and the rotations the identity."""
    v0 = s.psolve(r)
    norm_v0 = s.norm(v0)
    V[0] = v0 * (1 / _safe(norm_v0))
    V[1:] = 0
    S[...] = 0
    put(S, 0, norm_v0)
    cs[...] = 1
    sn[...] = 0


def _finish_cycle(s: System, columns: Any, eps: float, j: GPUScalar, presid: GPUScalar,
                  breakdown: GPUScalar, x: Any, V: Any, h: Any, cs: Any, sn: Any, S: Any,
                  cycles: Any, ptol: Any, ptol_max_factor: Any, status: Any) -> None:
    """SciPy's end of a cycle: back-substitute ``h y = S`` up to column ``j``, ``x += y V``,
    the outer tests, the inner tolerance's update and the next cycle's start."""
    xp, m = s.xp, columns.shape[0]
    h_jj = GPUScalar(xp.take(xp.take(h, j.array, axis=0), j.array))
    y = xp.where(columns <= j.array, S[:m], 0)
    # SciPy's pseudo-solve of a singular system: S[j] = 0 where h[j, j] == 0
    y = xp.where((columns == j.array) & (h_jj == 0).array, 0, y)
    for k in range(m - 1, -1, -1):  # the rows past j hold 0: exact no-ops
        y_k = GPUScalar(y[k])
        nonzero = y_k != 0
        y_k = where(nonzero, y_k / where(nonzero, GPUScalar(h[k, k]), 1), y_k)
        put(y, k, y_k)
        if k:
            y[:k] -= y_k * h[k, :k]
    x += s.vecmat(y, V[:m])
    r = s.b - s.matvec(x)
    rnorm = s.norm(r)
    cycles += 1
    atol = s.atol
    set_to(status, where(rnorm <= atol, 0, where(
        breakdown | (GPUScalar(cycles) >= s.maxiter), NOT_CONVERGED, CONTINUE)))
    factor = GPUScalar(ptol_max_factor)
    factor = where(presid <= GPUScalar(ptol), maximum(eps, 0.25 * factor),
                   minimum(1.0, 1.5 * factor))
    set_to(ptol_max_factor, factor)
    set_to(ptol, presid * minimum(factor, atol / _safe(rnorm)))
    _start_cycle(s, r, V, S, cs, sn)
