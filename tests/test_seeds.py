"""The examples the project grew from (../shared/seeds), with their sync counts asserted."""

from __future__ import annotations

import numpy as np
import pytest

import gpuscalar as gs

#: Every test here runs with lazy GPUScalar expressions and again eagerly.
pytestmark = pytest.mark.usefixtures("scalar_mode")


def test_zygote_mwe_gradients_stay_on_device(xp, rng):
    """Zygote/GPUArrays: loss = sum(1 .- x). The gradient w.r.t. the broadcast scalar `1` came
    back as a host float (a sync); with unbroadcast it is a device scalar."""
    x = xp.asarray(rng.standard_normal((4, 3)).astype(np.float32))
    one = gs.asscalar(1.0, like=x)
    with gs.count_syncs() as counter:
        loss = gs.sum(one - x)
        g = xp.ones_like(x)  # d loss / d (1 - x)
        grad_x = gs.unbroadcast(-g, x.shape)
        grad_one = gs.unbroadcast(g, ())
    assert counter.count == 0
    assert isinstance(loss, gs.GPUScalar) and loss.dtype == np.float32
    assert isinstance(grad_one, gs.GPUScalar) and grad_one.dtype == np.float32
    assert grad_one.item() == x.size
    assert float(xp.abs(grad_x + 1).max()) == 0.0
    assert loss.item() == pytest.approx(float((1 - x).sum()), rel=1e-6)


def test_nilang_axpy_shared_scalar_gradient(xp, rng):
    """NiLang's axpy y += alpha * x with a shared scalar alpha: its gradient is a reduction,
    sum(x * dy), computed on the device — no race, no expanded vector, no sync."""
    x = xp.asarray(rng.random(100))
    y = xp.asarray(rng.random(100))
    alpha = gs.asscalar(0.4, like=x)
    with gs.count_syncs() as counter:
        y_new = y + alpha * x
        loss_grad = xp.ones_like(y_new)  # loss = sum(y_new)
        grad_x = gs.unbroadcast(loss_grad * alpha, x.shape)
        grad_alpha = gs.unbroadcast(loss_grad * x, ())
    assert counter.count == 0
    assert isinstance(grad_alpha, gs.GPUScalar)
    assert grad_alpha.item() == pytest.approx(float(x.sum()))
    assert grad_x.shape == x.shape and float(xp.abs(grad_x - 0.4).max()) < 1e-12


def test_loss_accumulated_over_100_steps_read_once(xp, rng):
    x = xp.asarray(rng.standard_normal(64))
    with gs.count_syncs() as counter:
        total = gs.asscalar(0.0, like=x)
        for step in range(100):
            total = total + gs.mean((x - step / 100) ** 2)
        printed = f"{total / 100:.4f}"
    assert counter.count == 1
    reference = np.mean([np.mean((np.asarray(x) - s / 100) ** 2) for s in range(100)]) \
        if xp is np else None
    if reference is not None:
        assert printed == f"{reference:.4f}"


def test_fifty_op_chain_makes_zero_syncs_and_one_read(xp):
    x = xp.linspace(0.0, 1.0, 16)
    s = gs.sum(x)
    with gs.count_syncs() as counter:
        for i in range(25):
            s = gs.maximum(s * 0.5 + 1.0, 0.0) if i % 2 else s / 2 + gs.mean(x * s) * 0.0
            x = x * 0.999 + s * 0.0
    assert counter.count == 0
    assert counter.device_ops >= 50
    with gs.count_syncs() as counter:
        float(s)
        float(s)
        f"{s:.3f}"
    assert counter.count == 1
