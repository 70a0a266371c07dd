"""Issue 22: bounded compiles and one bounded optimizer-kernel cache.

A lazy running total whose terms vary with the data (``total = total + (a if cond else b)``)
makes 2^k expression shapes in k steps; evaluated whole, each would be a kernel of its own, and
CuPy keeps every module. `fusion.splits` bounds the structures evaluated whole (what a CuPy
kernel is compiled for), whatever the data; structure keys are the same on every backend, so the
bound is checked here on NumPy and the strict device by the structures the host executor
evaluates whole, one op each. And the optimizer's step kernels live in ONE `expr.BoundedCache`.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar.devices.host import fusion as host_fusion
from gpuscalar.lazy import expr, fusion

from .helpers import host


@pytest.fixture
def fresh_families(monkeypatch):
    """A fresh churn table (the rule's state is process-wide; no other test sees this one's)."""
    monkeypatch.setattr(fusion, "_FAMILIES", expr.BoundedCache())


def _whole_structures(monkeypatch) -> list[int]:
    """The structure key of every evaluation the host executor makes in one op (a CuPy kernel
    each), in order."""
    seen: list[int] = []
    materialize = host_fusion._materialize_on_host
    fused = host_fusion._fused_on_host

    def recording_materialize(backend, root):
        seen.append(root[expr.KEY])
        return materialize(backend, root)

    def recording_fused(backend, name, operands, kwargs, pending, keep):
        seen.extend(root[expr.KEY] for root in pending.values())
        return fused(backend, name, operands, kwargs, pending, keep)

    monkeypatch.setattr(host_fusion, "_materialize_on_host", recording_materialize)
    monkeypatch.setattr(host_fusion, "_fused_on_host", recording_fused)
    return seen


def _running_total(xp, steps: int, seed: int, fold_every: int = 0):
    """The issue's loop: a fresh loss each step, a data-dependent choice of term, never read
    (every ``fold_every`` steps the total is folded into an array operation instead)."""
    rng = random.Random(seed)
    g = xp.ones(3)
    total = gs.GPUScalar(xp.asarray(0.0))
    folds = []
    for i in range(steps):
        loss = gs.GPUScalar(xp.asarray(float(i % 7) * 0.25))
        total = total + (loss * 2 if rng.random() < 0.5 else loss + 1)
        if fold_every and i % fold_every == fold_every - 1:
            folds.append(g * total)
    return total, folds


@pytest.mark.parametrize("name", ["numpy", "strict"])
def test_a_data_dependent_running_total_evaluates_a_bounded_set_of_structures(
        name, monkeypatch, fresh_families):
    xp = np if name == "numpy" else gs.strict.xp
    seen = _whole_structures(monkeypatch)
    steps = 5000
    total, _ = _running_total(xp, steps, seed=1)
    assert float(total) == pytest.approx(float(total))
    distinct = set(seen)
    # without the rule: one new structure per materialization (~every 32 steps, ~156 here)
    assert len(distinct) <= 80
    late = set(seen[len(seen) * 3 // 5:])  # the last two fifths: ~2,000 steps after warm-up
    assert len(late - set(seen[:len(seen) * 3 // 5])) <= 2  # <= 1 per 1,000 steps


def test_folds_of_a_churning_total_are_bounded_too(monkeypatch, fresh_families):
    seen = _whole_structures(monkeypatch)
    total, folds = _running_total(gs.strict.xp, 4000, seed=2, fold_every=10)
    first, later = seen[:len(seen) // 2], seen[len(seen) // 2:]
    assert len(set(later) - set(first)) <= 2
    assert len(set(seen)) <= 120


def test_results_are_bit_identical_to_eager(fresh_families):
    xp = gs.strict.xp
    lazy_total, lazy_folds = _running_total(xp, 3000, seed=3, fold_every=7)
    with gs.lazy(False):
        eager_total, eager_folds = _running_total(xp, 3000, seed=3, fold_every=7)
    assert float(lazy_total) == float(eager_total)
    assert np.asarray(lazy_total.item()).tobytes() == np.asarray(eager_total.item()).tobytes()
    for a, b in zip(lazy_folds, eager_folds, strict=True):
        assert host(a).tobytes() == host(b).tobytes()


def test_a_repeating_structure_costs_what_it_always_cost(fresh_families):
    """A loop repeating its shape never churns: one op per materialization at the size bound,
    one op per fold, as before the rule."""
    xp = gs.strict.xp
    g = xp.ones(3)
    total = gs.GPUScalar(xp.asarray(0.0))
    losses = [gs.GPUScalar(xp.asarray(float(i))) for i in range(640)]
    with gs.count_syncs() as counter:
        for loss in losses:
            total = total + loss * 2
    assert counter.device_ops == 640 // 32 - 1  # one per 64-node chain (the last is pending)
    with gs.count_syncs() as counter:
        g * total
    assert counter.device_ops == 1


def test_a_churning_family_still_evaluates_its_repeating_structure_whole(fresh_families):
    """After `PROMOTE_AFTER` meetings a structure of a churning family is whole again."""
    xp = gs.strict.xp
    _running_total(xp, 2000, seed=4)  # the family of 65-node totals churns
    a = gs.GPUScalar(xp.asarray(1.0))

    def chain():
        total = a
        for i in range(20):
            total = total + (a * 2 if i % 2 else a + 1)
        return total

    costs = []
    for _ in range(fusion.PROMOTE_AFTER + 2):
        total = chain()
        with gs.count_syncs() as counter:
            total.array  # noqa: B018 - materializes
        costs.append(counter.device_ops)
    assert costs[-1] == 1


# ---- the optimizer's step kernels: one bounded cache ----------------------------------------


def test_optimizer_kernels_live_in_one_bounded_cache(rng):
    """More distinct step-kernel variants than the bound: at most the bound stay cached, and
    steps after eviction still compute the right values."""
    from gpuscalar import optim  # noqa: PLC0415
    from gpuscalar.devices.cupy import steps  # noqa: PLC0415

    from .cupy_fake import cupy_or_fail  # noqa: PLC0415
    from .cupy_seam import host_view  # noqa: PLC0415
    from .test_optim_launch import emulated  # noqa: PLC0415

    cupy_or_fail()
    previous = gs.set_cache_size(3)
    try:
        with emulated() as emu:
            assert len(steps._STEP_KERNELS) == 0  # emptied under the test seam
            lrs = [0.25, gs.GPUScalar(emu.xp.asarray(0.25)),
                   gs.GPUScalar(emu.xp.asarray(np.float32(0.25))),
                   gs.GPUScalar(emu.xp.asarray(np.int64(0)))]
            for dtype in (np.float32, np.float64):  # 8 variants: 2 dtypes x 4 lr kinds
                p0 = rng.standard_normal(50).astype(dtype)
                g0 = rng.standard_normal(50).astype(dtype)
                p, g = emu.xp.asarray(p0), emu.xp.asarray(g0)
                expected = p0.copy()
                for _ in range(2):  # again after eviction: compiled anew, the same values
                    for lr in lrs:
                        optim.sgd_step(p, g, lr=lr)
                        if not (isinstance(lr, gs.GPUScalar) and lr.dtype.kind == "i"):
                            expected = expected - dtype(0.25) * g0
                        assert len(steps._STEP_KERNELS) <= 3
                np.testing.assert_allclose(host_view(p), expected, rtol=1e-5, atol=1e-6)
            assert steps.step_kernel_count() == len(steps._STEP_KERNELS) <= 3
    finally:
        gs.set_cache_size(previous)


def test_pending_kinds_are_bounded_with_the_caches():
    """The optimizer's pending kinds (one per structure key a step received pending) are bounded
    by `gs.cache_size`, oldest first, so the structure keys they hold can be dropped too; a
    dropped kind is remade equal from its key."""
    from gpuscalar.optim.program import PENDING_KINDS, PendingScalar

    previous = expr.set_cache_size(3)
    try:
        made = [PENDING_KINDS.setdefault(key, PendingScalar(key)) for key in range(-10, -4)]
        assert len(PENDING_KINDS) <= 3 and -10 not in PENDING_KINDS and -5 in PENDING_KINDS
        assert PENDING_KINDS.get(-5) is made[-1]
        assert PENDING_KINDS.setdefault(-10, PendingScalar(-10)) == made[0]
    finally:
        expr.set_cache_size(previous)
        for key in range(-10, -4):
            PENDING_KINDS.pop(key, None)
