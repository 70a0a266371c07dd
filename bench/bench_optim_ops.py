"""Device ops per optimizer step: the fused multi-tensor classes (on the user's own arrays)
against a naive per-tensor Adam made of separate elementwise ops (what a hand-written NumPy/CuPy
Adam issues).

On a GPU every device op is a kernel launch (~5-10 µs of CPU time in CuPy), so the op count is
the launch-overhead cost of a step. Counts are exact and backend-independent, so they are
measured on NumPy and asserted; timings here are CPU timings of the NumPy backend only.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import optim
from gpuscalar.devices import NUMPY

N_TENSORS = 20
SHAPES = [(64, 32) if k % 2 else (32,) for k in range(N_TENSORS)]


def naive_adam_step(params, grads, ms, vs, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """Per-tensor Adam, one device op per elementwise operation (each counted)."""
    call = NUMPY.call
    bias1 = 1 - b1**t
    bias2_sqrt = (1 - b2**t) ** 0.5
    for p, g, m, v in zip(params, grads, ms, vs, strict=True):
        call(np.multiply, m, b1, out=m)
        call(np.add, m, call(np.multiply, g, 1 - b1), out=m)
        call(np.multiply, v, b2, out=v)
        call(np.add, v, call(np.multiply, call(np.multiply, g, g), 1 - b2), out=v)
        denom = call(np.add, call(np.divide, call(np.sqrt, v), bias2_sqrt), eps)
        call(np.subtract, p, call(np.multiply, call(np.divide, m, denom), lr / bias1), out=p)


def _problem(dtypes):
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(dtypes[k % len(dtypes)])
              for k, s in enumerate(SHAPES)]
    grads = [rng.standard_normal(p.shape).astype(p.dtype) for p in params]
    return params, grads


def _ops(step):
    with gs.count_syncs() as counter:
        step()
    assert counter.count == 0
    return counter.device_ops


@pytest.mark.parametrize("dtypes", [(np.float32,), (np.float32, np.float64)],
                         ids=["1-dtype-group", "2-dtype-groups"])
def test_fused_adam_ops_per_step(benchmark, dtypes):
    params, grads = _problem(dtypes)
    opt = optim.Adam(params)
    first = _ops(lambda: opt.step(grads))  # writes the gradient arrays' addresses once
    fused = _ops(lambda: opt.step(grads))
    ms = [np.zeros_like(p) for p in params]
    vs = [np.zeros_like(p) for p in params]
    unfused = _ops(lambda: naive_adam_step(params, grads, ms, vs, 1))
    benchmark.extra_info.update(
        tensors=N_TENSORS, dtype_groups=len(dtypes), fused_ops=fused, unfused_ops=unfused
    )
    assert fused < unfused
    assert fused == len(dtypes) + 1  # one kernel per dtype group + the step counter
    assert first == fused + 1  # + the gradient table (one launch per 500 tensors), when the
    # gradient arrays change
    assert unfused == 13 * N_TENSORS  # 13 elementwise ops per tensor, as written above
    benchmark(opt.step, grads)


def test_unfused_adam_cpu_time(benchmark):
    params, grads = _problem((np.float32,))
    ms = [np.zeros_like(p) for p in params]
    vs = [np.zeros_like(p) for p in params]
    benchmark.extra_info["unfused_ops"] = _ops(lambda: naive_adam_step(params, grads, ms, vs, 1))
    benchmark(naive_adam_step, params, grads, ms, vs, 2)


@pytest.mark.parametrize("make", [
    lambda p: optim.SGD(p, lr=0.1, momentum=0.9), lambda p: optim.AdamW(p),
    lambda p: optim.RMSprop(p, momentum=0.9, centered=True), lambda p: optim.Lion(p),
], ids=["sgd-momentum", "adamw", "rmsprop-centered-momentum", "lion"])
def test_every_fused_optimizer_ops_per_step(benchmark, make):
    """Every optimizer class costs what Adam costs: one kernel per dtype group + the counter."""
    params, grads = _problem((np.float32, np.float64))
    opt = make(params)
    assert _ops(lambda: opt.step(grads)) == 4  # + the gradient table, once
    assert _ops(lambda: opt.step(grads)) == 3
    benchmark.extra_info.update(tensors=N_TENSORS, dtype_groups=2, fused_ops=3)
    benchmark(opt.step, grads)
