"""The convergence-loop workloads: Jacobi on independent systems and conjugate gradient.

Why this module exists: these two loops are where the syncs left after sync-free arithmetic
live (``if float(residual) < tol: break``), so each is written three ways, as every workload is
(`gpuscalar.tools.workloads` registers them): the float path checks on the host every
iteration, the gpuscalar path keeps a device flag and checks every ``check_every`` iterations,
and the capture path is one `gs.while_loop`: the device decides, no check is read. Kept apart
from the training workloads so each file holds one kind of loop.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import math as gsm
from .. import matmul
from .. import reduce as gsr
from .. import scalar as gss
from ..control import while_loop

__all__ = ["jacobi_inputs", "jacobi_float", "jacobi_gpuscalar", "jacobi_capture", "cg_inputs",
           "cg_float", "cg_gpuscalar", "cg_capture"]

#: The array module a path computes with (numpy, cupy or the strict device's namespace).
ArrayModule = Any
Params = Any
Inputs = dict[str, Any]
Answer = dict[str, Any]


# ---- (d) convergence loop: Jacobi on several independent systems --------------------------


def jacobi_inputs(xp: ArrayModule, params: Params) -> Inputs:
    rng = np.random.default_rng(params.get("seed", 0))
    problems, n = params["problems"], params["n"]
    # positive off-diagonal entries make the row-sum bound on the Jacobi rate tight, so each
    # system needs a predictable, moderately large number of iterations
    off = rng.uniform(0.0, 1.0, (problems, n, n)) / n
    for i in range(problems):
        np.fill_diagonal(off[i], 0.0)
    # diagonal dominance grows with the problem index, so the problems converge at different
    # iterations (which is what the device mask of the gpuscalar path has to handle)
    margin = 0.1 + 0.5 * np.arange(problems)[:, None] / problems
    diag = np.abs(off).sum(axis=2) * (1.0 + margin) + 1e-3
    A = off.copy()
    for i in range(problems):
        A[i][np.diag_indices(n)] = diag[i]
    b = rng.standard_normal((problems, n))
    return {"A": xp.asarray(A), "R": xp.asarray(off), "D": xp.asarray(diag), "b": xp.asarray(b)}


def jacobi_float(xp: ArrayModule, inputs: Inputs, *, problems: int, n: int, tol: float,
                 max_iter: int, check_every: int, seed: int = 0) -> Answer:
    """Each system solved in turn, with ``if float(residual) < tol: break`` every iteration."""
    A, R, D, b = inputs["A"], inputs["R"], inputs["D"], inputs["b"]
    solutions, iterations = [], []
    for i in range(problems):
        x = xp.zeros(n, dtype=b.dtype)
        done = 0
        while done < max_iter:
            x = (b[i] - R[i] @ x) / D[i]
            done += 1
            if float(xp.linalg.norm(b[i] - A[i] @ x)) < tol:  # one sync per iteration
                break
        solutions.append(x)
        iterations.append(done)
    return {"x": xp.stack(solutions), "iterations": iterations}


def jacobi_gpuscalar(xp: ArrayModule, inputs: Inputs, *, problems: int, n: int, tol: float,
                     max_iter: int, check_every: int, seed: int = 0) -> Answer:
    """All systems at once; a device mask freezes each system at the iteration where its
    residual drops below ``tol`` (the float path's ``break``), and the host asks whether any
    system is still active only every ``check_every`` iterations."""
    A, R, D, b = inputs["A"], inputs["R"], inputs["D"], inputs["b"]
    x = xp.zeros((problems, n), dtype=b.dtype)
    active = xp.ones(problems, dtype=bool)
    iterations = xp.zeros(problems, dtype=xp.int64)
    for it in range(1, max_iter + 1):
        x_new = (b - (R @ x[..., None])[..., 0]) / D
        x = xp.where(active[:, None], x_new, x)
        iterations += active
        residual = xp.linalg.norm(b - (A @ x[..., None])[..., 0], axis=1)
        active &= residual >= tol
        if it % check_every == 0 and not gsr.any(active):  # one sync per check
            break
    return {"x": x, "iterations": iterations}


def jacobi_capture(xp: ArrayModule, inputs: Inputs, *, problems: int, n: int, tol: float,
                   max_iter: int, check_every: int, seed: int = 0) -> Answer:
    """The masked Jacobi loop as one `gs.while_loop`: the device decides, after every
    iteration, whether any system is still active (on a GPU one graph launch with a conditional
    WHILE node, no sync); its state is updated in place and its products use gs.matmul. The
    answer is the gpuscalar path's: once no system is active an iteration changes nothing."""
    A, R, D, b = inputs["A"], inputs["R"], inputs["D"], inputs["b"]
    x = xp.zeros((problems, n), dtype=b.dtype)
    active = xp.ones(problems, dtype=bool)
    iterations = xp.zeros(problems, dtype=xp.int64)

    def iteration(x: Any, active: Any, iterations: Any) -> None:
        x_new = (b - matmul(R, x[..., None])[..., 0]) / D
        x[...] = xp.where(active[:, None], x_new, x)
        iterations[...] += active
        residual = xp.linalg.norm(b - matmul(A, x[..., None])[..., 0], axis=1)
        active[...] &= residual >= tol

    while_loop(lambda x, active, iterations: gsr.any(active), iteration, x, active, iterations,
               max_iter=max_iter)
    return {"x": x, "iterations": iterations}


# ---- (d') conjugate gradient until the residual is small (CuPy's examples/cg loop) ----------


def cg_inputs(xp: ArrayModule, params: Params) -> Inputs:
    rng = np.random.default_rng(params.get("seed", 0))
    n = params["n"]
    m = rng.standard_normal((n, n))
    a = m @ m.T / n + np.eye(n)  # symmetric positive definite, well conditioned
    return {"A": xp.asarray(a), "b": xp.asarray(rng.standard_normal(n))}


def _cg_start(xp: ArrayModule, A: Any, b: Any,
              product: Callable[[Any, Any], Any] = matmul) -> tuple[Any, Any, Any, Any, Any]:
    """x = 0, r = b - A x, p = r, a buffer for A p, and r.r (``product`` multiplies)."""
    x = xp.zeros_like(b)
    r = b - product(A, x)
    p = r.copy()
    return x, r, p, xp.empty_like(b), product(r, r)


def cg_float(xp: ArrayModule, inputs: Inputs, *, n: int, tol: float, max_iter: int,
             check_every: int, seed: int = 0) -> Answer:
    """CuPy's conjugate-gradient example: ``if float(norm(r)) < tol: break`` before every
    iteration, one sync each."""
    A, b = inputs["A"], inputs["b"]
    x, r, p, _, rr = _cg_start(xp, A, b, operator.matmul)
    done = 0
    while done < max_iter and float(xp.linalg.norm(r)) >= tol:  # one sync per check
        ap = A @ p
        alpha = rr / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = r @ r
        p *= rr_new / rr
        p += r
        rr = rr_new
        done += 1
    return {"x": x, "iterations": done}


def cg_gpuscalar(xp: ArrayModule, inputs: Inputs, *, n: int, tol: float, max_iter: int,
                 check_every: int, seed: int = 0) -> Answer:
    """The same iterations with the convergence test on the device: once the residual is
    small a device flag zeroes the step length, which freezes x, r and r.r (the float path's
    ``break``; p keeps growing by the frozen r, finite, and is never used again), and the host
    asks whether the solve is still active only every ``check_every`` iterations."""
    A, b = inputs["A"], inputs["b"]
    x, r, p, ap, rr = _cg_start(xp, A, b)
    rr = gss.GPUScalar(rr)
    active = gsr.norm(r) >= tol
    iterations = gss.asscalar(0, like=b, dtype="int64")
    for it in range(1, max_iter + 1):
        matmul(A, p, out=ap)
        alpha = gsm.where(active, rr / gsr.dot(p, ap), 0.0)
        x += alpha * p
        r -= alpha * ap
        rr_new = gsr.dot(r, r)
        p *= rr_new / rr
        p += r
        rr = rr_new
        iterations = iterations + active
        active = active & (gsr.norm(r) >= tol)
        if it % check_every == 0 and not active:  # one sync per check
            break
    return {"x": x, "iterations": int(iterations)}


def cg_capture(xp: ArrayModule, inputs: Inputs, *, n: int, tol: float, max_iter: int,
               check_every: int, seed: int = 0) -> Answer:
    """The float path's loop as one `gs.while_loop`: the device decides before every iteration
    whether the residual is still large (on a GPU one graph launch, no sync); the state is
    updated in place."""
    A, b = inputs["A"], inputs["b"]
    x, r, p, ap, rr_start = _cg_start(xp, A, b)
    rr = xp.empty((), dtype=b.dtype)  # the loop's state: an array of the caller's xp
    rr[...] = rr_start

    def iteration(x: Any, r: Any, p: Any, ap: Any, rr: Any) -> None:
        matmul(A, p, out=ap)
        alpha = gss.GPUScalar(rr) / gsr.dot(p, ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = gsr.dot(r, r)
        p *= rr_new / gss.GPUScalar(rr)
        p += r
        rr[...] = rr_new.array

    done = while_loop(lambda x, r, p, ap, rr: gsr.norm(r) >= tol, iteration, x, r, p, ap, rr,
                      max_iter=max_iter)
    return {"x": x, "iterations": int(done)}
