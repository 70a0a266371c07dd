"""Real clients, as tests (issue 21): on code nobody here wrote, a GPUScalar is a drop-in for the
float it replaces: the same results bit for bit, and no more syncs than the original.

The clients:
- CuPy 14.2's ``cupyx.scipy.sparse.linalg.minres``, ported in `tests.clients.minres_cupyx` with
  its four ``.get().item()`` reads as ``gs.GPUScalar(...)`` (the port) or as they were (the
  original); on CuPy the original is cupyx's own function;
- CuPy's ``_symOrtho`` (a host-heavy scalar function: comparisons, ``abs``, ``numpy.sign``,
  ``numpy.sqrt``) called with GPUScalars;
- ``scipy.optimize.minimize`` (L-BFGS-B, BFGS, CG, Nelder-Mead, BFGS with finite differences),
  unmodified, on an objective computed with device arrays (`tests.clients.rosenbrock`) that
  returns ``float(xp.mean(...))`` (the float path) or ``gs.mean(...)`` (the gpuscalar path).

Syncs are counted with ``gs.count_syncs(include_cupy=True)``: it sees gpuscalar's reads and the
array library's own (CuPy's ``.get()``, ``float()``, ``bool()``; the strict device declares its
reads the same way), so the original and the port are counted by one rule. NumPy declares no
reads (the original's reads are free and unseen there), so sync counts are compared on the strict
device and CuPy only; results are compared on every backend.

Measured on the strict device when these tests were written (2026-11, gpuscalar at commit
669228a, before the contract of issue 21 landed: known values, Python-precision scalar
arithmetic), syncs original -> port:
    minres spd (n=30, Jacobi M, check=True)        92 -> 382  29 iterations, x bit-identical
    minres indefinite (n=30, shift=0.5)            99 -> 419  32 iterations, x bit-identical
    minres spd float32 (n=30, Jacobi M)            74 -> 304  23 iterations, x differs (1.4e-6)
    _symOrtho, inputs read before the call           0 -> 3..6 (each comparison and result read)
    _symOrtho, inputs pending                        2 -> 3..6
    minimize L-BFGS-B (gradient read with .get())  108 -> 162  x bit-identical
    minimize BFGS                                   72 -> 372  x bit-identical
    minimize CG                                    330 -> 2786 x bit-identical
    minimize Nelder-Mead                           385 -> 850  x bit-identical
    minimize BFGS, finite differences              180 -> 516  x bit-identical
After the contract landed (known values, Python-precision scalar arithmetic, strong scalars
for NumPy's own results; commit after 1322147), syncs original -> port: minres 92 -> 92,
99 -> 99, 74 -> 74 (float32 now bit-identical too); _symOrtho 0 -> 0 (inputs read) and
2 -> 2 at most (pending inputs); minimize L-BFGS-B 108 -> 108, BFGS 72 -> 72, CG 330 -> 330,
Nelder-Mead 385 -> 385, BFGS with finite differences 180 -> 180; every x bit-identical.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict

from .clients import minres_cupyx, rosenbrock
from .helpers import backend_name, host


@pytest.fixture(params=("strict", "cupy"))
def counted_xp(request: pytest.FixtureRequest) -> Any:
    """The backends whose own reads are declared syncs, so the original's syncs are counted by
    the same rule as the port's: the strict device and CuPy (skipped without a GPU)."""
    if request.param == "strict":
        return strict.xp
    if not gs.gpu_available():
        pytest.skip("CuPy needs a CUDA device, and this machine has none")
    import cupy

    return cupy


def _bits(value: Any) -> tuple[str, tuple[int, ...], bytes]:
    """An array's dtype, shape and bytes, read explicitly from its device: equal bits or not."""
    array = np.ascontiguousarray(host(value))
    return (array.dtype.str, array.shape, array.tobytes())


def _float_bits(value: Any) -> str:
    """A scalar's exact value (sign of zero and NaN included), read explicitly."""
    return float(host(value)).hex()


# ---- minres ---------------------------------------------------------------------------------
N = 30


def _system(kind: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A small symmetric system (host data) and the minres keywords it is solved with."""
    rng = np.random.default_rng(21)
    q, _ = np.linalg.qr(rng.standard_normal((N, N)))
    if kind == "indefinite":
        eigenvalues, dtype = np.linspace(-50.0, 50.0, N), np.float64
        keywords: dict[str, Any] = {"shift": 0.5, "tol": 1e-10}
    else:
        eigenvalues = np.linspace(1.0, 100.0, N)
        dtype = np.float32 if kind == "spd-float32" else np.float64
        keywords = {"check": True, "tol": 1e-6 if dtype == np.float32 else 1e-10}
    a = (q * eigenvalues) @ q.T
    a = ((a + a.T) / 2).astype(dtype)
    b = rng.standard_normal(N).astype(dtype)
    if kind != "indefinite":
        keywords["M"] = np.diag(1.0 / np.diag(a)).astype(dtype)  # Jacobi preconditioner
    return a, b, keywords


def _original_minres(xp: Any) -> Callable[..., Any]:
    """The original: on CuPy, cupyx's own minres (the client itself); elsewhere the port's text
    with CuPy's own reads (``.get().item()``)."""
    if backend_name(xp) == "cupy":
        from cupyx.scipy.sparse.linalg import minres

        return minres
    return functools.partial(minres_cupyx.minres_original, cupy=xp)


def _run_minres(xp: Any, kind: str, port: bool) -> tuple[Any, int, int, int]:
    """Solve the system with the port or the original: (x, info, iterations, syncs)."""
    a, b, keywords = _system(kind)
    if "M" in keywords:
        keywords["M"] = xp.asarray(keywords["M"])
    solve = (
        functools.partial(minres_cupyx.minres_port, cupy=xp) if port else _original_minres(xp)
    )
    a, b = xp.asarray(a), xp.asarray(b)
    iterations: list[None] = []
    with gs.count_syncs(include_cupy=True) as counter:
        x, info = solve(a, b, callback=lambda _: iterations.append(None), **keywords)
    return x, info, len(iterations), counter.count


MINRES_SYSTEMS = ("spd", "indefinite", "spd-float32")


@pytest.mark.parametrize("kind", MINRES_SYSTEMS)
def test_minres_port_gives_the_originals_solution_bit_for_bit(xp, kind):
    """Lazy GPUScalars (the default): the port's pending scalars (``cs * dbar + sn * alpha``,
    ...) are computed in fused kernels, which must round as the original's Python floats and
    as the eager operations below do. On CuPy a difference here while the eager test passes is
    a fused kernel contracting a multiply and an add into one FMA (seen on an H200 with CUDA
    13: x differed by up to 5.6e-16 from the first iteration)."""
    x0, info0, iterations0, _ = _run_minres(xp, kind, port=False)
    x1, info1, iterations1, _ = _run_minres(xp, kind, port=True)
    assert (info1, iterations1) == (info0, iterations0)
    assert _bits(x1) == _bits(x0), (
        f"x differs from the original's by up to {np.max(np.abs(host(x1) - host(x0))):.3g}"
    )


@pytest.mark.parametrize("kind", MINRES_SYSTEMS)
def test_minres_port_evaluated_eagerly_gives_the_originals_solution_bit_for_bit(xp, kind):
    """Every GPUScalar operation its own kernel (``gs.lazy(False)``): the original's bits on
    every backend, CuPy included (one rounding per operation, as Python's floats; CUDA's
    ``pow`` is not correctly rounded, but ``alpha ** 2`` only feeds MINRES's estimate of
    ``||A||``, and the iteration counts agree)."""
    x0, info0, iterations0, _ = _run_minres(xp, kind, port=False)
    with gs.lazy(False):
        x1, info1, iterations1, _ = _run_minres(xp, kind, port=True)
    assert (info1, iterations1) == (info0, iterations0)
    assert _bits(x1) == _bits(x0), (
        f"x differs from the original's by up to {np.max(np.abs(host(x1) - host(x0))):.3g}"
    )


@pytest.mark.parametrize("kind", MINRES_SYSTEMS)
def test_minres_port_makes_no_more_syncs_than_the_original(counted_xp, kind):
    _, _, iterations0, syncs0 = _run_minres(counted_xp, kind, port=False)
    _, _, iterations1, syncs1 = _run_minres(counted_xp, kind, port=True)
    assert iterations1 == iterations0
    assert syncs1 <= syncs0, (
        f"{syncs1} syncs with GPUScalars, {syncs0} in the original ({iterations0} iterations)"
    )


# ---- _symOrtho: a host-heavy scalar function --------------------------------------------------
SYM_ORTHO_INPUTS = [(3.0, 4.0), (4.0, -3.0), (0.0, 2.5), (-2.5, 0.0), (1e-3, -7.0), (0.1, 0.3)]


def _device_pair(xp: Any, a: float, b: float) -> tuple[gs.GPUScalar, gs.GPUScalar]:
    """``a`` and ``b`` as device results (GPUScalars of 0-d reductions), not yet read."""
    return gs.sum(xp.asarray([a])), gs.sum(xp.asarray([b]))


@pytest.mark.parametrize(("a", "b"), SYM_ORTHO_INPUTS)
def test_sym_ortho_on_read_scalars_matches_floats_without_a_sync(xp, a, b):
    sa, sb = _device_pair(xp, a, b)
    fa, fb = float(sa), float(sb)  # read once: from now on their values are known
    expected = minres_cupyx._symOrtho(fa, fb)
    with gs.count_syncs(include_cupy=True) as counter:
        c, s, r = minres_cupyx._symOrtho(sa, sb)
        assert [_float_bits(v) for v in (c, s, r)] == [_float_bits(v) for v in expected]
    assert counter.count == 0, [(rec.reason, rec.lineno) for rec in counter.records]


@pytest.mark.parametrize(("a", "b"), SYM_ORTHO_INPUTS)
def test_sym_ortho_on_pending_scalars_reads_each_input_at_most_once(counted_xp, a, b):
    xp = counted_xp
    with gs.count_syncs(include_cupy=True) as float_path:
        expected = minres_cupyx._symOrtho(*(float(xp.sum(xp.asarray([v]))) for v in (a, b)))
    with gs.count_syncs(include_cupy=True) as port:
        c, s, r = minres_cupyx._symOrtho(*_device_pair(xp, a, b))
        # read inside the count: what the float path already holds on the host is known here
        assert [_float_bits(v) for v in (c, s, r)] == [_float_bits(v) for v in expected]
    assert float_path.count == 2
    assert port.count <= float_path.count, [(rec.reason, rec.lineno) for rec in port.records]


# ---- scipy.optimize.minimize ------------------------------------------------------------------
X0 = np.array([-1.2, 1.0, -0.5, 0.8])
#: (method, whether the gradient is given; without it SciPy takes finite differences)
MINIMIZE_CASES = [("L-BFGS-B", True), ("BFGS", True), ("CG", True), ("Nelder-Mead", False),
                  ("BFGS", False)]
MINIMIZE_IDS = ["L-BFGS-B", "BFGS", "CG", "Nelder-Mead", "BFGS-finite-differences"]


def _minimize(xp: Any, method: str, with_jac: bool, path: str) -> tuple[Any, int]:
    """``scipy.optimize.minimize`` on the float or gpuscalar path: (result, syncs)."""
    optimize = pytest.importorskip("scipy.optimize")
    fun = rosenbrock.float_path(xp) if path == "float" else rosenbrock.gpuscalar_path(xp)
    jac = rosenbrock.gradient(xp) if with_jac else None
    with gs.count_syncs(include_cupy=True) as counter:
        result = optimize.minimize(fun, X0, jac=jac, method=method)
    return result, counter.count


@pytest.mark.parametrize(("method", "with_jac"), MINIMIZE_CASES, ids=MINIMIZE_IDS)
def test_minimize_with_gpuscalar_objective_gives_the_float_paths_result(xp, method, with_jac):
    expected, _ = _minimize(xp, method, with_jac, "float")
    result, _ = _minimize(xp, method, with_jac, "gpuscalar")
    assert (result.nit, result.nfev) == (expected.nit, expected.nfev)
    assert result.x.tobytes() == expected.x.tobytes()
    assert _float_bits(result.fun) == _float_bits(expected.fun)


@pytest.mark.parametrize(("method", "with_jac"), MINIMIZE_CASES, ids=MINIMIZE_IDS)
def test_minimize_with_gpuscalar_objective_makes_no_more_syncs(counted_xp, method, with_jac):
    expected, float_syncs = _minimize(counted_xp, method, with_jac, "float")
    result, gpuscalar_syncs = _minimize(counted_xp, method, with_jac, "gpuscalar")
    assert result.nfev == expected.nfev
    assert gpuscalar_syncs <= float_syncs, (
        f"{gpuscalar_syncs} syncs with gs.mean, {float_syncs} with float ({expected.nfev} "
        f"evaluations)"
    )
