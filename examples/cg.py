"""Conjugate gradient that decides when to stop on the device: zero syncs for the whole solve.

Why this example exists: CuPy's own conjugate-gradient example (``examples/cg/cg.py`` in CuPy's
repository) reads the residual norm on the host every iteration (``if norm(r1) < tol``), one
sync per iteration, which is what keeps a GPU idle between iterations. Here the same algorithm
runs under ``gs.while_loop``: the state (x, r, p, A @ p and r.r) lives in device arrays updated in
place, ``gs.matmul`` and ``gs.dot`` keep every product on the device (``gs.dot`` of two vectors
is gpuscalar's own dot kernel in the loop body and outside it), and the predicate
``norm(r) >= tol`` is decided by the device. The script solves the same system both ways and
prints the iteration counts, the syncs each made, and whether the iterates are the same bits.

Runs on CuPy when a GPU is present, else NumPy:  python examples/cg.py [N]
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import gpuscalar as gs

TOL, MAX_ITER = 1e-8, 1000


def spd_system(xp: Any, n: int, seed: int = 0) -> tuple[Any, Any]:
    """A symmetric positive definite A (well conditioned) and a right-hand side b."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    a = m @ m.T / n + np.eye(n)
    return xp.asarray(a), xp.asarray(rng.standard_normal(n))


def start(xp: Any, a: Any, b: Any) -> tuple[Any, ...]:
    """The solver's state: x = 0, r = b - A x, p = r, a buffer for A p, and r.r (0-d)."""
    x = xp.zeros_like(b)
    r = b - gs.matmul(a, x)
    p = r.copy()
    rr = gs.dot(r, r).array.copy()  # (r.r, a 0-d state array)
    return x, r, p, xp.empty_like(b), rr


def not_converged(a: Any, x: Any, r: Any, p: Any, ap: Any, rr: Any) -> gs.GPUScalar:
    return gs.norm(r) >= TOL


def iteration(a: Any, x: Any, r: Any, p: Any, ap: Any, rr: Any) -> None:
    """One CG iteration, every array updated in place, nothing read on the host."""
    gs.matmul(a, p, out=ap)
    alpha = gs.GPUScalar(rr) / gs.dot(p, ap)
    x += alpha * p
    r -= alpha * ap
    rr_new = gs.dot(r, r)
    p *= rr_new / gs.GPUScalar(rr)  # beta, before rr is overwritten
    p += r
    rr[...] = rr_new.array


def solve_on_device(a: Any, b: Any, xp: Any) -> tuple[Any, gs.GPUScalar]:
    state = start(xp, a, b)
    n = gs.while_loop(not_converged, iteration, a, *state, max_iter=MAX_ITER)
    return state[0], n


def solve_with_host_checks(a: Any, b: Any, xp: Any) -> tuple[Any, int]:
    """The straightforward loop, as CuPy's example writes it: one host check per iteration."""
    state = start(xp, a, b)
    n = 0
    while n < MAX_ITER and float(gs.norm(state[1])) >= TOL:
        iteration(a, *state)
        n += 1
    return state[0], n


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    backend = gs.default_backend()
    xp = backend.xp
    a, b = spd_system(xp, size)
    with gs.count_syncs() as device_counter:
        x, n = solve_on_device(a, b, xp)
    with gs.count_syncs() as host_counter:
        x_plain, n_plain = solve_with_host_checks(a, b, xp)
    same = bool(gs.all(x == x_plain))
    residual = float(gs.norm(b - gs.matmul(a, x)))
    print(f"backend: {backend.name}, N = {size}")
    print(f"while_loop: iterations {int(n)}, syncs {device_counter.count}")
    print(f"host checks: iterations {n_plain}, syncs {host_counter.count}")
    print(f"same iterates: {same}")
    print(f"residual: {residual:.3e}")


if __name__ == "__main__":
    main()
