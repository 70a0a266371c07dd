"""Conjugate gradient with the rows of A split across MPI ranks, in the chunked form.

Why this example exists: a solver's residual is the other scalar (besides the loss) that a
multi-process job reads every iteration: the usual loop does ``comm.allreduce(float(p @ ap))``
for each dot product and checks ``norm(r) < tol`` on the host after every iteration. Here each
rank holds its rows of A (and of x and r) and the full search direction p, computes its rows of
``A @ p``, and its share of each dot product; the dot products are all-reduced with
``gs.distributed.all_reduce``, packed (one collective for ``r.r`` and the new residual rows
every rank needs for the next p). The loop runs in blocks of ``K`` iterations with ONE
convergence check per block (the chunked form of docs/distributed.md), not one per iteration.

What it costs, counted (printed as SYNCS): CG needs its two reductions inside every iteration
(``p.Ap`` for alpha, ``r.r`` for beta), so they cannot wait for the end of a block. On MPI on
the host: ``p.Ap`` alone (a GPUScalar) goes as a non-blocking ``Iallreduce``, its pending
result waited for where the update first uses it (an uncounted wait, as a device op); the
packed ``[r.r, r]`` carries an array, so it is a blocking collective: each iteration's one
counted sync. The block's check reads ``r.r``, which that collective brought to the host: free.
So a block of ``K`` iterations costs ``K`` syncs, and checking once per block instead of every
iteration costs nothing more. On NCCL (CuPy on GPUs) the collectives are stream-ordered, with
no sync, and the block's check is its one sync (the block may then be recorded in a
``gs.capture`` step).

The script checks the solution against ONE process solving the whole system (``numpy.linalg.
solve``, and ``gs.linalg.cg`` to the same tolerance) and that every rank holds the same x.

    mpiexec -n 2 python examples/distributed_cg.py [--backend numpy|strict] [--n N] [--k K]
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np
from mpi4py import MPI

import gpuscalar as gs
from gpuscalar import strict

#: relative residual the solve stops at; the solution's tolerance against numpy.linalg.solve
TOL, SOLUTION_RTOL = 1e-10, 1e-8


def spd_system(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric positive definite A (well conditioned) and b: the same on every rank."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return m @ m.T / n + np.eye(n), rng.standard_normal(n)


def rows_of(rank: int, size: int, n: int) -> slice:
    """The rows rank ``rank`` owns (the last rank takes what is left)."""
    per = n // size
    return slice(rank * per, n if rank == size - 1 else (rank + 1) * per)


class RowSplitCG:
    """CG state on one rank: its rows of A, x, r and A p; the full p (every rank the same)."""

    def __init__(self, xp: Any, a: np.ndarray, b: np.ndarray, comm: MPI.Intracomm) -> None:
        rank, size, n = comm.Get_rank(), comm.Get_size(), b.size
        self.xp, self.comm, self.rows = xp, comm, rows_of(rank, size, n)
        self.before, self.after = self.rows.start, n - self.rows.stop
        self.a = xp.asarray(a[self.rows])  # this rank's rows of A
        self.x = xp.zeros(self.rows.stop - self.rows.start)
        self.r = xp.asarray(b[self.rows]).copy()  # r = b - A 0 (copies: updated in place)
        self.p = xp.asarray(b).copy()  # p = r, in full: each rank's rows of A @ p need it
        # r.r, all-reduced (one collective): a GPUScalar every rank holds the same
        self.rr = gs.distributed.all_reduce(gs.dot(self.r, self.r), "sum", comm=comm)
        self.b_norm = math.sqrt(float(self.rr))  # (known after the collective: free)

    def padded(self, own: Any) -> Any:
        """This rank's rows in a full-length vector of zeros (summed across ranks: the whole
        vector, exactly, as adding zeros is exact)."""
        xp = self.xp
        return xp.concatenate([xp.zeros(self.before), own, xp.zeros(self.after)])

    def iteration(self) -> None:
        """One CG iteration: two packed collectives, no other communication."""
        comm, rows = self.comm, self.rows
        ap = self.a @ self.p  # this rank's rows of A @ p
        p_ap = gs.distributed.all_reduce(gs.dot(self.p[rows], ap), "sum", comm=comm)
        alpha = self.rr / p_ap
        self.x += alpha * self.p[rows]
        self.r -= alpha * ap
        # r.r and the whole new r (for the next p) in ONE packed collective
        rr_new, r_full = gs.distributed.all_reduce([gs.dot(self.r, self.r),
                                                    self.padded(self.r)], "sum", comm=comm)
        beta = rr_new / self.rr
        self.p *= beta
        self.p += r_full
        self.rr = rr_new

    def converged(self) -> bool:
        """The block's one check: ||r|| < TOL ||b|| (r.r came back known from the collective
        on MPI: no sync; on NCCL this read is the block's one sync)."""
        return math.sqrt(float(self.rr)) < TOL * self.b_norm

    def solution(self) -> np.ndarray:
        """The whole x, gathered on every rank (with mpi4py, outside the counted loop)."""
        x = self.x.get() if self.xp is not np else self.x
        return np.concatenate(self.comm.allgather(np.asarray(x)))


def solve(xp: Any, a: np.ndarray, b: np.ndarray, comm: MPI.Intracomm, k: int,
          max_blocks: int) -> tuple[np.ndarray, int, list[int]]:
    """The chunked loop: blocks of ``k`` iterations, one check per block. Returns x, the
    iterations run and the syncs each block made (counted)."""
    cg = RowSplitCG(xp, a, b, comm)
    syncs, iterations = [], 0
    for _ in range(max_blocks):
        with gs.count_syncs(include_cupy=True) as counter:
            for _ in range(k):
                cg.iteration()
            iterations += k
            done = cg.converged()
        syncs.append(counter.count)
        if done:
            break
    return cg.solution(), iterations, syncs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("numpy", "strict"), default="numpy")
    parser.add_argument("--n", type=int, default=120)
    parser.add_argument("--k", type=int, default=5, help="iterations per block")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    xp = strict.xp if args.backend == "strict" else np
    a, b = spd_system(args.n)
    x, iterations, syncs = solve(xp, a, b, comm, args.k, max_blocks=args.n)

    # one process on the whole system
    exact = np.linalg.solve(a, b)
    np.testing.assert_allclose(x, exact, rtol=0, atol=SOLUTION_RTOL * np.abs(exact).max())
    single, info = gs.linalg.cg(a, b, rtol=TOL)
    assert info == 0, info
    np.testing.assert_allclose(x, single, rtol=0, atol=SOLUTION_RTOL * np.abs(exact).max())
    everyone = comm.allgather(x.tobytes())
    assert all(found == everyone[0] for found in everyone), "ranks disagree on x"
    residual = np.linalg.norm(b - a @ x) / np.linalg.norm(b)
    if rank == 0:
        print(f"{size} ranks, n={args.n} on {args.backend}: {iterations} iterations in "
              f"{len(syncs)} blocks of {args.k}; relative residual {residual:.2e}")
        print(f"x == numpy.linalg.solve and gs.linalg.cg within {SOLUTION_RTOL:g} (of max |x|)")
        print(f"syncs per block (rank 0, counted): {syncs} (2 collectives per iteration: "
              "p.Ap pending, [r.r, r] blocking; the check free)")
        print(f"SYNCS blocks={len(syncs)} k={args.k} per_block={','.join(map(str, syncs))}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
