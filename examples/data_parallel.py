"""Data-parallel training on MPI ranks: one packed all-reduce per step, one sync per step.

Why this example exists: the usual data-parallel step reads the loss on the host to average it
(``comm.allreduce(float(loss))``) and moves the gradient through the host too. Here each rank
computes the main job's model (`gpuscalar.tools.demo`: least squares, SGD with a warm-up) on its
shard of the batch, and ONE ``gs.distributed.all_reduce([loss, grad], "mean", comm=comm)``
averages the loss and the gradient together (one collective, one counted sync on MPI); the
gradient is then clipped by its global norm (after the average every rank holds the same full
gradient, so its norm is the global one: no second collective) and applied. The averaged loss
comes back known, so logging it costs nothing.

The script checks the weights against ONE process on the full batch (a tolerance: the full
batch sums its products in another order than the shards do, ``RTOL``) and against one process
that adds the shards' gradients in rank order (to the last bit with 2 ranks: one addition of two
numbers is the same either way), and prints the syncs per step of both loops, counted:
``gs.distributed.all_reduce`` against the ``comm.allreduce(float(loss))`` baseline.

    mpiexec -n 2 python examples/data_parallel.py [--backend numpy|strict] [--steps N]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from mpi4py import MPI

import gpuscalar as gs
from gpuscalar import strict

SAMPLES, FEATURES, MAX_NORM = 2048, 32, 5.0
#: weights against the full-batch single process (float64; another summation order)
RTOL = 1e-12


def data(samples: int = SAMPLES, features: int = FEATURES) -> tuple[np.ndarray, np.ndarray]:
    """The main job's data (`gpuscalar.tools.demo`)."""
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(features)
    x = rng.standard_normal((samples, features))
    return x, x @ true_w + 0.1 * rng.standard_normal(samples)


def shard(rank: int, size: int) -> slice:
    per = SAMPLES // size
    return slice(rank * per, (rank + 1) * per)


def lr_at(step: int) -> float:
    return 0.1 * min(1.0, step / 10)  # the demo's warm-up


def train(xp: Any, comm: MPI.Intracomm, steps: int) -> tuple[Any, list[float]]:
    """The data-parallel loop with gpuscalar: one packed all_reduce per step."""
    x_all, y_all = data()
    part = shard(comm.Get_rank(), comm.Get_size())
    x, y = xp.asarray(x_all[part]), xp.asarray(y_all[part])
    w = xp.zeros(FEATURES)
    losses = []
    for step in range(1, steps + 1):
        residual = x @ w - y
        loss = gs.mean(residual * residual)  # this shard's loss: a GPUScalar, no sync
        grad = (2.0 / x.shape[0]) * (x.T @ residual)
        loss, grad = gs.distributed.all_reduce([loss, grad], "mean", comm=comm)  # 1 sync
        gs.clip_grad_norm(grad, MAX_NORM)  # the global norm: every rank holds the same grad
        gs.optim.sgd_step(w, grad, lr=lr_at(step))
        losses.append(float(loss))  # known already: no sync
    return w, losses


def baseline(xp: Any, comm: MPI.Intracomm, steps: int) -> Any:
    """What people write today: the loss read on the host and all-reduced as a float, the
    gradient through the host (``get``, MPI, upload back; plain NumPy on NumPy)."""
    x_all, y_all = data()
    part = shard(comm.Get_rank(), comm.Get_size())
    x, y = xp.asarray(x_all[part]), xp.asarray(y_all[part])
    w = xp.zeros(FEATURES)
    size = comm.Get_size()
    for step in range(1, steps + 1):
        residual = x @ w - y
        loss = comm.allreduce(float(gs.mean(residual * residual))) / size  # a sync
        grad = (2.0 / x.shape[0]) * (x.T @ residual)
        host = grad.get() if xp is not np else grad  # a sync on a device
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        grad = xp.asarray(host / size)
        norm = float(gs.global_norm(grad))  # the usual clipping reads the norm: a sync
        if norm > MAX_NORM:
            grad *= MAX_NORM / (norm + 1e-6)
        w -= lr_at(step) * grad
        del loss
    return w


def single_process(steps: int, size: int, *, full_batch: bool) -> np.ndarray:
    """One process on the full batch (``full_batch``), or adding the ``size`` shards' gradients
    and losses in rank order, as the collective does."""
    x, y = data()
    w = np.zeros(FEATURES)
    for step in range(1, steps + 1):
        if full_batch:
            residual = x @ w - y
            grad = (2.0 / SAMPLES) * (x.T @ residual)
        else:
            parts = [shard(r, size) for r in range(size)]
            grads = [(2.0 / (p.stop - p.start)) * (x[p].T @ (x[p] @ w - y[p])) for p in parts]
            total = grads[0]
            for g in grads[1:]:
                total = total + g
            grad = total / size
        gs.clip_grad_norm(grad, MAX_NORM)
        gs.optim.sgd_step(w, grad, lr=lr_at(step))
    return w


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("numpy", "strict"), default="numpy")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    xp = strict.xp if args.backend == "strict" else np
    host = (lambda a: a.get()) if xp is not np else (lambda a: a)

    with gs.count_syncs(include_cupy=True) as ours:
        w, losses = train(xp, comm, args.steps)
    with gs.count_syncs(include_cupy=True) as theirs:
        w_base = baseline(xp, comm, args.steps)
    w = host(w)
    same_order = single_process(args.steps, size, full_batch=False)
    full = single_process(args.steps, size, full_batch=True)
    np.testing.assert_allclose(w, full, rtol=RTOL, atol=0)
    np.testing.assert_allclose(host(w_base), full, rtol=RTOL, atol=0)
    bitwise = bool(np.array_equal(w, same_order))
    if size == 2:
        assert bitwise, "2 ranks: the weights must equal the shard-ordered single process"
    weights = comm.gather(w.tobytes())
    if rank == 0:
        assert all(b == weights[0] for b in weights), "ranks disagree on the weights"
        print(f"{size} ranks, {args.steps} steps on {args.backend}: final loss {losses[-1]:.6g}")
        print(f"weights == one process on the full batch (rtol {RTOL:g}); "
              f"== shard-ordered single process to the last bit: {bitwise}")
        print(f"syncs per step (rank 0, counted with include_cupy): gs.distributed.all_reduce "
              f"{ours.count / args.steps:g}, comm.allreduce(float(loss)) baseline "
              f"{theirs.count / args.steps:g}")
        print(f"SYNCS ours={ours.count} baseline={theirs.count} steps={args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
