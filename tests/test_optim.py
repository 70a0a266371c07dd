"""gpuscalar.optim against straightforward float64 PyTorch-formula references, with exact sync
and device-op counts, on-device skipping, checkpointing, and bad input."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import optim, sync
from gpuscalar.lazy import rules
from gpuscalar.optim import executors
from gpuscalar.optim.kernels import ADDRESS_CHUNK, kernel_source
from gpuscalar.optim.program import Program
from gpuscalar.optim.sgd import SGD_PLAIN

from .helpers import host

STEPS = 100

# ---- float64 references (PyTorch's documented update rules, written out plainly) ----------


def ref_adam(p, g, m, v, t, lr, b1, b2, eps, wd, decoupled):
    p, g = p.astype(np.float64), g.astype(np.float64)
    if wd and decoupled:
        p = p * (1 - lr * wd)
    elif wd:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def ref_sgd(p, g, buf, lr, momentum, dampening, wd, nesterov):
    p, g = p.astype(np.float64), g.astype(np.float64)
    g = g + wd * p
    if momentum:
        buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, buf


def ref_rmsprop(p, g, state, lr, alpha, eps, wd, momentum, centered):
    """PyTorch's RMSprop (torch.optim.RMSprop, its in-place ops written out); ``state`` holds
    square_avg, momentum_buffer and grad_avg (zeros before the first step) and is updated."""
    p, g = p.astype(np.float64), g.astype(np.float64)
    g = g + wd * p
    sq = state["square_avg"] = alpha * state.get("square_avg", 0.0) + (1 - alpha) * g * g
    if centered:
        grad_avg = state.get("grad_avg", 0.0)
        grad_avg = state["grad_avg"] = grad_avg + (1 - alpha) * (g - grad_avg)  # lerp_
        avg = np.sqrt(sq - grad_avg * grad_avg) + eps
    else:
        avg = np.sqrt(sq) + eps
    if momentum > 0:
        buf = state["momentum_buffer"] = momentum * state.get("momentum_buffer", 0.0) + g / avg
        return p - lr * buf
    return p - lr * g / avg


def ref_lion(p, g, state, lr, betas, wd):
    """Lion as published (Chen et al. 2023, Algorithm 2): ``state`` holds exp_avg (m)."""
    p, g = p.astype(np.float64), g.astype(np.float64)
    m = state.get("exp_avg", 0.0)
    update = np.sign(betas[0] * m + (1 - betas[0]) * g)
    state["exp_avg"] = betas[1] * m + (1 - betas[1]) * g
    return p - lr * (update + wd * p)


def close(actual, expected, rtol=1e-5):
    np.testing.assert_allclose(host(actual), expected, rtol=rtol, atol=1e-6)


# ---- adam_step ------------------------------------------------------------------------------


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adam_step_matches_reference_over_100_steps(xp, rng, decoupled, wd):
    hyper = dict(lr=1e-2, b1=0.8, b2=0.95, eps=1e-8, wd=wd, decoupled=decoupled)
    p64 = rng.standard_normal(64)
    m64, v64 = np.zeros(64), np.zeros(64)
    p = xp.asarray(p64, dtype=np.float32)
    m, v = xp.zeros_like(p), xp.zeros_like(p)
    for t in range(1, STEPS + 1):
        g64 = rng.standard_normal(64) + 0.5 * p64
        optim.adam_step(
            p, xp.asarray(g64, dtype=np.float32), m, v, step=t, lr=1e-2, betas=(0.8, 0.95),
            eps=1e-8, weight_decay=wd, decoupled_weight_decay=decoupled,
        )
        p64, m64, v64 = ref_adam(p64, g64.astype(np.float32), m64, v64, t, **hyper)
    close(p, p64)
    close(m, m64)
    close(v, v64)


def test_adam_step_with_device_hyperparameters_never_syncs(xp, rng, scalar_mode):
    p64 = rng.standard_normal(32)
    m64, v64 = np.zeros(32), np.zeros(32)
    p = xp.asarray(p64, dtype=np.float32)
    m, v = xp.zeros_like(p), xp.zeros_like(p)
    like = p
    hyper = {
        "lr": gs.asscalar(3e-3, like=like),
        "betas": (gs.asscalar(0.9, like=like), gs.asscalar(0.99, like=like)),
        "eps": gs.asscalar(1e-7, like=like, dtype=np.float64),
        "weight_decay": gs.asscalar(0.01, like=like),
    }
    step = gs.asscalar(0, like=like, dtype=np.int64)
    grads = [rng.standard_normal(32) for _ in range(STEPS)]
    device_grads = [xp.asarray(g, dtype=np.float32) for g in grads]
    with gs.count_syncs() as counter:
        for g in device_grads:
            step = step + 1
            optim.adam_step(p, g, m, v, step=step, decoupled_weight_decay=True, **hyper)
    assert counter.count == 0
    # ONE fused update per step; eagerly the step increment is a launch of its own, lazily the
    # kernel computes step + 1 in its prelude
    assert counter.device_ops == (1 if scalar_mode == "lazy" else 2) * STEPS
    for t, g in enumerate(grads, 1):
        p64, m64, v64 = ref_adam(
            p64, g.astype(np.float32), m64, v64, t, 3e-3, 0.9, 0.99, 1e-7, 0.01, True
        )
    close(p, p64)


def test_adam_step_is_one_device_op_in_place(rng):
    p = rng.standard_normal((3, 4)).astype(np.float32)
    before = p.copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    with gs.count_syncs() as counter:
        result = optim.adam_step(p, np.ones_like(p), m, v, step=1, lr=0.1)
    assert result is None
    assert counter.device_ops == 1 and counter.count == 0
    # First Adam step moves every parameter by ~lr against the gradient's sign.
    close(p, before - 0.1, rtol=1e-4)


def test_adam_step_skip_if_leaves_everything_untouched(rng):
    p = rng.standard_normal(10)
    m, v = rng.random(10), rng.random(10)
    saved = (p.copy(), m.copy(), v.copy())
    grad = np.full(10, np.inf)
    skip = ~optim.all_finite([grad])
    with gs.count_syncs() as counter:
        optim.adam_step(p, grad, m, v, step=3, lr=0.1, skip_if=skip)
    assert counter.count == 0
    for after, before in zip((p, m, v), saved, strict=True):
        np.testing.assert_array_equal(after, before)
    # The same call with a false flag does update.
    optim.adam_step(p, np.ones(10), m, v, step=3, lr=0.1, skip_if=gs.asscalar(False))
    assert not np.array_equal(p, saved[0])


# ---- sgd_step --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("momentum", "dampening", "nesterov", "wd"),
    [(0.0, 0.0, False, 0.0), (0.0, 0.0, False, 0.1), (0.9, 0.0, False, 0.0),
     (0.9, 0.3, False, 0.01), (0.9, 0.0, True, 0.01)],
)
def test_sgd_step_matches_reference_over_100_steps(xp, rng, momentum, dampening, nesterov, wd):
    p64, buf64 = rng.standard_normal(40), None
    p = xp.asarray(p64, dtype=np.float32)
    buf = None
    for _ in range(STEPS):
        g = rng.standard_normal(40).astype(np.float32)
        buf = optim.sgd_step(p, xp.asarray(g), buf, lr=0.01, momentum=momentum,
                             dampening=dampening, weight_decay=wd, nesterov=nesterov)
        p64, buf64 = ref_sgd(p64, g, buf64, 0.01, momentum, dampening, wd, nesterov)
    close(p, p64)
    if momentum:
        close(buf, buf64)
    else:
        assert buf is None


def test_sgd_step_creates_the_buffer_once(rng):
    p = rng.standard_normal(5)
    g = rng.standard_normal(5)
    buf = optim.sgd_step(p, g, lr=0.1, momentum=0.5)
    np.testing.assert_array_equal(buf, g)  # PyTorch: the first buffer is the gradient itself
    same = optim.sgd_step(p, g, buf, lr=0.1, momentum=0.5)
    assert same is buf
    np.testing.assert_allclose(buf, 1.5 * g)


def test_sgd_step_device_lr_no_sync(rng):
    p = rng.standard_normal(8)
    lr = gs.asscalar(0.5)
    g = np.ones(8)
    expected = p - 0.5 * STEPS * g
    with gs.count_syncs() as counter:
        for _ in range(STEPS):
            optim.sgd_step(p, g, lr=lr)
    assert counter.count == 0 and counter.device_ops == STEPS
    np.testing.assert_allclose(p, expected)


# ---- the optimizer classes: the user's own arrays, in place ------------------------------------


def counting():
    """A counter that also sees the strict device's own reads (as count_syncs(include_cupy=True)
    would, without needing CuPy)."""
    return sync._activate(sync.SyncCounter(include_cupy=True))


def snapshot(value):
    """Host copies (`host` returns NumPy arrays themselves, which later steps would update)."""
    if isinstance(value, list):
        return [snapshot(v) for v in value]
    return np.array(host(value), copy=True)


def rel_error(actual, expected):
    """Norm-wise relative error of one tensor (the acceptance measure)."""
    expected = np.asarray(expected, dtype=np.float64)
    diff = np.asarray(host(actual), dtype=np.float64) - expected
    return np.linalg.norm(diff) / max(np.linalg.norm(expected), 1e-30)


ACCEPTANCE_STEPS = 30
MIXED_SHAPES = [(3, 5), (7,), (2, 3, 4), (), (1,), (0,), (5000,)]  # (5000,): two chunks
SKIPPED_STEPS = {6, 17}  # gradients overflow there: skip_if holds on the device
CONFIGS = {
    "adam": (optim.Adam, dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)),
    "adamw": (optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1)),
    "sgd": (optim.SGD, dict(lr=0.05, weight_decay=0.01)),
    "sgd_momentum": (optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    "sgd_nesterov": (optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02)),
    "rmsprop": (optim.RMSprop, dict(lr=1e-3, alpha=0.9, eps=1e-6, weight_decay=0.01)),
    "rmsprop_centered_momentum": (optim.RMSprop, dict(lr=1e-3, alpha=0.95, eps=1e-8,
                                                      weight_decay=0.02, momentum=0.8,
                                                      centered=True)),
    "lion": (optim.Lion, dict(lr=1e-3, betas=(0.8, 0.95), weight_decay=0.1)),
}


class Reference:
    """PyTorch's update rules in float64 over several tensors, with skipped steps."""

    def __init__(self, config, params):
        self.cls, self.kw = CONFIGS[config]
        self.params = [p.astype(np.float64) for p in params]
        self.state = [{} for _ in params]  # per tensor: state name -> float64 array
        self.t = 0

    def step(self, grads):
        self.t += 1
        kw = self.kw
        for i, g in enumerate(grads):
            p, state = self.params[i], self.state[i]
            if self.cls is optim.SGD:
                p, buf = ref_sgd(
                    p, g, state.get("momentum_buffer"), kw["lr"], kw.get("momentum", 0.0),
                    kw.get("dampening", 0.0), kw["weight_decay"], kw.get("nesterov", False))
                if buf is not None:
                    state["momentum_buffer"] = buf
            elif self.cls is optim.RMSprop:
                p = ref_rmsprop(p, g, state, kw["lr"], kw["alpha"], kw["eps"], kw["weight_decay"],
                                kw.get("momentum", 0.0), kw.get("centered", False))
            elif self.cls is optim.Lion:
                p = ref_lion(p, g, state, kw["lr"], kw["betas"], kw["weight_decay"])
            else:
                p, state["exp_avg"], state["exp_avg_sq"] = ref_adam(
                    p, g, state.get("exp_avg", 0.0), state.get("exp_avg_sq", 0.0), self.t,
                    kw["lr"], *kw["betas"], kw["eps"], kw["weight_decay"],
                    self.cls is optim.AdamW)
            self.params[i] = p


@pytest.mark.parametrize("grads_mode", ["reused", "new"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_classes_match_pytorch_reference_on_the_users_arrays(xp, rng, config, grads_mode):
    """Acceptance: 30 steps over mixed shapes, float32, skip_if on two steps: relative error
    < 1e-5 against float64 PyTorch semantics, the arrays passed in updated, zero syncs, and
    exactly 1 kernel + 1 counter op per step (+1 launch writing the gradient table when the
    gradient arrays change)."""
    cls, kw = CONFIGS[config]
    init = [rng.standard_normal(s).astype(np.float32) for s in MIXED_SHAPES]
    params = [xp.asarray(p) for p in init]
    opt = cls(params, **kw)
    ref = Reference(config, init)
    grads = [xp.zeros(s, dtype=np.float32) for s in MIXED_SHAPES]
    flags = {b: gs.asscalar(b, like=params[0]) for b in (False, True)}
    ops, syncs = [], 0
    for t in range(ACCEPTANCE_STEPS):
        host_grads = [(rng.standard_normal(s) + 0.1 * p).astype(np.float32)
                      for s, p in zip(MIXED_SHAPES, ref.params, strict=True)]
        skip = t in SKIPPED_STEPS
        if skip:
            host_grads[0].flat[0] = np.inf
        if grads_mode == "new":
            grads = [xp.asarray(g) for g in host_grads]
        else:
            for g, h in zip(grads, host_grads, strict=True):
                g[...] = xp.asarray(h)
        with counting() as counter:
            opt.step(grads, skip_if=flags[skip])
        ops.append(counter.device_ops)
        syncs += counter.count
        if not skip:
            ref.step([g.astype(np.float64) for g in host_grads])
    assert syncs == 0
    table = [1] * ACCEPTANCE_STEPS if grads_mode == "new" else [1] + [0] * (ACCEPTANCE_STEPS - 1)
    assert ops == [2 + u for u in table]
    assert opt.params == params and all(a is b for a, b in zip(opt.params, params, strict=True))
    for got, want in zip(params, ref.params, strict=True):
        assert got.dtype == np.float32
        if want.size:
            assert rel_error(got, want) < 1e-5
    for name in opt._program.arrays[2:]:  # every state buffer the optimizer keeps
        for got, state in zip(opt.state(name), ref.state, strict=True):
            if got.size:
                assert rel_error(got, state[name]) < 1e-5
    assert int(opt.step_count) == ACCEPTANCE_STEPS - len(SKIPPED_STEPS)


def test_two_thousand_tensors_cost_one_kernel_and_the_counter_per_step(rng):
    """Acceptance (counting device): 2,000 tensors of one dtype, the same gradient arrays every
    step: 1 device op per step plus the step counter (the first step also writes the gradient
    table, once)."""
    xp = gs.strict.xp
    shapes = [(k % 7 + 1, 3) if k % 2 else (k % 13 + 1,) for k in range(2000)]
    params = [xp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    grads = [xp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    opt = optim.Adam(params, lr=1e-3)
    before = host(params[1999])
    ops = []
    for _ in range(3):
        with counting() as counter:
            opt.step(grads)
        assert counter.count == 0
        ops.append(counter.device_ops)
    # the first step writes the gradient table: one launch per ADDRESS_CHUNK addresses
    assert ops == [math.ceil(2000 / ADDRESS_CHUNK) + 2, 2, 2]
    assert int(opt.step_count) == 3
    assert not np.array_equal(host(params[1999]), before)  # the last tensor was updated too


def test_dtype_groups_one_kernel_each(xp, rng):
    """float32 and float64 parameters: one kernel per dtype group, one counter op."""
    init = [rng.standard_normal(s) for s in [(3,), (2, 2), (4,), (5,)]]
    dtypes = [np.float32, np.float64, np.float64, np.float32]
    params = [xp.asarray(p.copy(), dtype=d) for p, d in zip(init, dtypes, strict=True)]
    opt = optim.AdamW(params, lr=1e-2)
    grads = [xp.asarray(rng.standard_normal(p.shape), dtype=p.dtype) for p in params]
    counts = []
    for _ in range(2):
        with counting() as counter:
            opt.step(grads)
        counts.append((counter.device_ops, counter.count))
    assert counts == [(4, 0), (3, 0)]
    m = [np.zeros(p.shape) for p in init]
    v = [np.zeros(p.shape) for p in init]
    for t in (1, 2):
        for i, g in enumerate(grads):
            init[i], m[i], v[i] = ref_adam(init[i].astype(dtypes[i]), host(g), m[i], v[i], t,
                                           1e-2, 0.9, 0.999, 1e-8, 1e-2, True)
    for p, want, d in zip(params, init, dtypes, strict=True):
        assert p.dtype == d
        close(p, want)


def test_gradient_table_is_written_only_when_the_arrays_change(xp, rng):
    init = [rng.standard_normal(4), rng.standard_normal(3)]
    params = [xp.asarray(p.copy()) for p in init]
    opt = optim.SGD(params, lr=0.1)
    a = [xp.ones(4), xp.ones(3)]
    b = [xp.ones(4), xp.ones(3)]

    def ops(grads):
        with counting() as counter:
            opt.step(grads)
        return counter.device_ops

    assert [ops(a), ops(a), ops(tuple(a)), ops(b), ops(a), ops([a[0], b[1]])] == [
        3, 2, 2, 3, 3, 3]
    assert int(opt.step_count) == 6
    close(params[1], init[1] - 0.6)  # every step used the arrays it was given (all ones)


def test_steps_use_the_gradients_they_are_given(xp):
    p = xp.zeros(3)
    opt = optim.SGD([p], lr=1.0)
    ones, twos = xp.ones(3), xp.full(3, 2.0)
    for grads in ([ones], [twos], [ones], [twos], [twos]):
        opt.step(grads)
    np.testing.assert_array_equal(host(p), np.full(3, -8.0))


def test_step_reads_every_scalar_on_the_device(xp, rng):
    """What a CUDA graph replay needs: the same Python call, with new values written into the
    same device buffers (lr, betas, skip flag, gradients), computes with the new values, and the
    optimizer's Python-side state does not change from step to step."""
    p = xp.asarray(rng.standard_normal(5))
    g = xp.asarray(rng.standard_normal(5))
    lr, beta1 = gs.asscalar(1e-2, like=p), gs.asscalar(0.9, like=p)
    skip = gs.asscalar(False, like=p)
    opt = optim.Adam([p], lr=lr, betas=(beta1, 0.999))
    opt.step([g], skip_if=skip)

    def state():
        return ({k: id(v) for k, v in vars(opt).items()},
                [{k: id(v) for k, v in vars(group).items()} for group in opt._groups])

    before = state()
    skip.array[...] = xp.asarray(True)  # the captured flag buffer now says "skip"
    saved = snapshot(p)
    with gs.sync_guard("error"), counting() as counter:
        opt.step([g], skip_if=skip)
    assert counter.count == 0
    np.testing.assert_array_equal(host(p), saved)
    assert int(opt.step_count) == 1
    skip.array[...] = xp.asarray(False)
    lr.array[...] = xp.asarray(0.5)
    beta1.array[...] = xp.asarray(0.0)
    with gs.sync_guard("error"):
        opt.step([g], skip_if=skip)
    assert state() == before
    # Step 2 of Adam with beta1 = 0: m = g, bias1 = 1, so p moves by lr * g / (sqrt(v_hat) + eps).
    gh = host(g)
    v = 0.999 * (0.001 * gh * gh) + 0.001 * gh * gh
    expected = saved - 0.5 * gh / (np.sqrt(v / (1 - 0.999**2)) + 1e-8)
    close(p, expected)


def test_step_inside_capture(xp, rng):
    init = rng.standard_normal(6).astype(np.float32)
    p = xp.asarray(init.copy())
    g = xp.asarray(rng.standard_normal(6).astype(np.float32))
    opt = optim.Adam([p], lr=gs.asscalar(1e-2, like=p))
    skip = gs.asscalar(False, like=p)
    captured = gs.capture(lambda: opt.step([g], skip_if=skip), warmup=2)
    for _ in range(3):
        captured()
    steps = int(opt.step_count)
    assert steps == 5
    ref, m, v = init.astype(np.float64), np.zeros(6), np.zeros(6)
    for t in range(1, steps + 1):
        ref, m, v = ref_adam(ref, host(g), m, v, t, 1e-2, 0.9, 0.999, 1e-8, 0.0, False)
    close(p, ref)


@pytest.mark.parametrize("config", ["adam", "sgd_nesterov", "rmsprop_centered_momentum", "lion"])
def test_captured_step_with_new_gradient_arrays_each_call(xp, rng, config):
    """An AD-style step that computes its gradients into NEW arrays each call, captured with
    gs.capture: over many replays the parameters follow the float64 reference of the values
    the inputs held at each call, with zero syncs and one op per replay (on a GPU the graph's
    own table write restores the gradients' addresses; no host-to-device copy is made)."""
    cls, kw = CONFIGS[config]
    shapes = [(3, 4), (), (5,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [xp.asarray(p) for p in init]
    opt = cls(params, **kw)
    ref = Reference(config, init)
    inputs = [xp.zeros(s, dtype=np.float32) for s in shapes]  # updated in place per step
    made = []

    def step():
        grads = [xp.multiply(x, 2, out=xp.empty_like(x)) for x in inputs]  # new arrays
        made.append(grads)
        opt.step(grads)

    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    for x, v in zip(inputs, values, strict=True):
        x[...] = xp.asarray(v)
    captured = gs.capture(step, warmup=2)
    for _ in range(2):
        ref.step([2 * v.astype(np.float64) for v in values])
    ops = []
    for _ in range(10):
        values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for x, v in zip(inputs, values, strict=True):
            x[...] = xp.asarray(v)
        with counting() as counter:
            captured()
        assert counter.count == 0
        ops.append(counter.device_ops)
        ref.step([2 * v.astype(np.float64) for v in values])
    assert ops == [1] * 10
    assert int(opt.step_count) == 12
    for got, want in zip(params, ref.params, strict=True):
        assert rel_error(got, want) < 1e-5
    captured.release()


def test_eager_steps_between_replays(xp, rng):
    """Eager steps with other gradient arrays between replays of a captured step: each replay
    uses the arrays it was recorded with, each eager step the arrays it is given, also when an
    eager step passes the same arrays as the eager step before the replay."""
    p = xp.zeros(4)
    opt = optim.SGD([p], lr=1.0)
    static = xp.ones(4)  # the captured step's gradients, rewritten in place
    g1 = xp.full(4, 100.0)
    captured = gs.capture(lambda: opt.step([static]), warmup=1)
    expected = -1.0
    for action in ["eager", "replay", "eager", "eager", "replay", "replay", "eager"]:
        if action == "replay":
            captured()
            expected -= 1.0
        else:
            opt.step([g1])
            expected -= 100.0
        np.testing.assert_array_equal(host(p), np.full(4, expected))
    assert int(opt.step_count) == 8
    captured.release()


def test_schedule_from_the_live_step_counter_never_syncs(xp, rng):
    """A warm-up schedule on opt.step_count: no sync, and lazily no launch of its own (the
    kernel computes it in its prelude), where eager code launches its four operations."""
    shapes = [(6,), (2, 3)]
    all_grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes]
                 for _ in range(STEPS)]
    device_grads = [[xp.asarray(g) for g in grads] for grads in all_grads]
    init = [rng.standard_normal(s) for s in shapes]
    warmup = 10
    results, ops = {}, {}
    for lazy in (True, False):
        params = [xp.asarray(r, dtype=np.float32) for r in init]
        like = params[0]
        opt = optim.Adam(params, betas=(gs.asscalar(0.9, like=like),
                                        gs.asscalar(0.999, like=like)))
        with gs.lazy(lazy), counting() as counter:
            for grads in device_grads:
                opt.lr = 1e-2 * gs.minimum(1.0, (opt.step_count + 1) / warmup)
                opt.step(grads)
        assert counter.count == 0
        results[lazy], ops[lazy] = [host(p) for p in params], counter.device_ops
    assert ops[False] - ops[True] == 4 * STEPS  # add, divide, minimum, multiply per step
    ref = [r.copy() for r in init]
    m = [np.zeros(s) for s in shapes]
    v = [np.zeros(s) for s in shapes]
    for t, grads in enumerate(all_grads, 1):
        lr = 1e-2 * min(1.0, t / warmup)
        for i, g in enumerate(grads):
            ref[i], m[i], v[i] = ref_adam(ref[i], g, m[i], v[i], t, lr, 0.9, 0.999, 1e-8, 0,
                                          False)
    for lazy_value, eager_value, want in zip(results[True], results[False], ref, strict=True):
        close(lazy_value, want)
        assert lazy_value.tobytes() == eager_value.tobytes()  # the same bits either way


def test_step_count_views_the_live_counter(xp):
    p = xp.zeros(2)
    opt = optim.SGD([p], lr=0.1)
    before = opt.step_count
    assert before.dtype == np.int64 and int(before) == 0
    assert opt.step_count.array is opt.step_count.array  # one buffer, updated in place
    opt.step([xp.ones(2)])
    assert int(before) == 0  # a value already read is the value at that read
    assert int(opt.step_count) == 1
    opt.step([xp.ones(2)], skip_if=gs.asscalar(True, like=p))
    assert int(opt.step_count) == 1


def test_state_views_are_live_and_params_are_the_callers(xp, rng):
    w, b = xp.asarray(rng.standard_normal((2, 3))), xp.zeros(4)
    opt = optim.Adam([w, b], lr=0.1)
    assert opt.params[0] is w and opt.params[1] is b
    exp_avg = opt.state("exp_avg")
    assert [s.shape for s in exp_avg] == [(2, 3), (4,)]
    opt.step([xp.ones((2, 3)), xp.full(4, -1.0)])
    close(exp_avg[0], np.full((2, 3), 0.1))
    close(exp_avg[1], np.full(4, -0.1))
    close(b, np.full(4, 0.1), rtol=1e-4)


def test_class_skip_if_leaves_params_state_and_counter_untouched(xp, rng):
    params = [xp.asarray(rng.standard_normal(5)),
              xp.asarray(rng.standard_normal((2, 2)), dtype=np.float32)]
    opt = optim.Adam(params, lr=0.1)
    opt.step([xp.ones(5), xp.ones((2, 2), dtype=np.float32)])
    saved = snapshot(params + opt.state("exp_avg") + opt.state("exp_avg_sq"))
    bad = [xp.asarray([1, np.nan, 0, 0, 0.0]), xp.ones((2, 2), dtype=np.float32)]
    with counting() as counter:
        opt.step(bad, skip_if=~optim.all_finite(bad))
        count = opt.step_count
    assert counter.count == 0
    assert int(count) == 1
    for after, before in zip(host(params + opt.state("exp_avg") + opt.state("exp_avg_sq")),
                             saved, strict=True):
        np.testing.assert_array_equal(after, before)
    opt.step([xp.ones(5), xp.ones((2, 2), dtype=np.float32)],
             skip_if=gs.asscalar(False, like=params[0]))
    assert int(opt.step_count) == 2


def test_sgd_class_skipped_first_step_keeps_buffer_fresh(xp, rng):
    init = rng.standard_normal(4)
    p = xp.asarray(init.copy())
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    opt.step([xp.full(4, np.inf)], skip_if=gs.asscalar(True, like=p))
    g = rng.standard_normal(4)
    opt.step([xp.asarray(g)])
    close(opt.state("momentum_buffer")[0], g)  # buf = first real gradient
    close(p, init - 0.1 * g)


def test_empty_tensors_and_empty_groups(xp):
    p, empty = xp.ones(3, dtype=np.float32), xp.zeros(0)  # the float64 group has no elements
    opt = optim.SGD([p, empty], lr=0.5)
    grads = [xp.ones(3, dtype=np.float32), xp.zeros(0)]
    with counting() as counter:
        opt.step(grads)
    assert counter.device_ops == 3  # the table, the float32 kernel, the counter: no float64 op
    close(p, np.full(3, 0.5))


def test_strict_device_one(rng):
    xp = gs.strict.xp
    with gs.strict.device(1):
        p = xp.asarray(rng.standard_normal(3))
        g = xp.ones(3)
    opt = optim.SGD([p], lr=0.1, momentum=0.5)
    assert opt.state("momentum_buffer")[0].device.id == 1
    assert opt.step_count.device == 1
    opt.step([g])
    with pytest.raises(ValueError, match=r"grads\[0\] is on device 0 but params\[0\] is on 1"):
        opt.step([xp.ones(3)])
    assert int(opt.step_count) == 1


# ---- state_dict ---------------------------------------------------------------------------------


def _run(opt, grads_list):
    for grads in grads_list:
        opt.step(grads)


@pytest.mark.parametrize("config", ["adam", "adamw", "sgd_momentum", "sgd_nesterov",
                                    "rmsprop_centered_momentum", "lion"])
def test_state_dict_round_trip_resumes_bit_for_bit(xp, rng, config):
    cls, kw = CONFIGS[config]
    shapes, dtypes = [(3, 2), (5,), (4,)], [np.float32, np.float64, np.float32]
    params = [xp.asarray(rng.standard_normal(s), dtype=d)
              for s, d in zip(shapes, dtypes, strict=True)]
    steps = [[xp.asarray(rng.standard_normal(s), dtype=d)
              for s, d in zip(shapes, dtypes, strict=True)] for _ in range(9)]
    opt = cls(params, **kw)
    _run(opt, steps[:5])
    with counting() as counter:
        saved = opt.state_dict()
    assert counter.count == 0
    saved_params = [xp.array(p, copy=True) for p in params]
    _run(opt, steps[5:])
    # The checkpoint is a copy: later steps did not change it.
    assert int(gs.GPUScalar(saved["step"])) == 5
    fresh_params = [xp.array(p, copy=True) for p in saved_params]
    resumed = cls(fresh_params, **{k: v for k, v in kw.items() if k != "lr"}, lr=123.0)
    resumed.load_state_dict(saved)
    assert resumed.lr == kw["lr"]  # plain-number hyperparameters are restored
    # The optimizer copied the arrays in: changing the checkpoint afterwards changes nothing.
    for entry in saved["state"]:
        for array in entry.values():
            array[...] = xp.asarray(np.nan)
    _run(resumed, steps[5:])
    for a, b in zip(params, fresh_params, strict=True):
        np.testing.assert_array_equal(host(a), host(b))
    for name in opt._program.arrays[2:]:
        for a, b in zip(opt.state(name), resumed.state(name), strict=True):
            np.testing.assert_array_equal(host(a), host(b))
    assert int(resumed.step_count) == int(opt.step_count) == 9


def test_state_dict_contents(xp, rng):
    p = xp.asarray(rng.standard_normal(3))
    opt = optim.Adam([p], lr=gs.asscalar(0.1, like=p), betas=(0.8, 0.9), eps=1e-6)
    opt.step([xp.ones(3)])
    with counting() as counter:
        d = opt.state_dict()
    assert counter.device_ops == 3 and counter.count == 0  # step + two state copies
    assert set(d) == {"step", "state", "hyperparams"}
    assert d["hyperparams"] == {"betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.0}
    assert d["step"].shape == () and d["step"].dtype == np.int64
    assert [set(e) for e in d["state"]] == [{"exp_avg", "exp_avg_sq"}]
    assert d["state"][0]["exp_avg"] is not opt.state("exp_avg")[0]
    close(d["state"][0]["exp_avg"], np.full(3, 1 - 0.8))
    plain = optim.SGD([xp.zeros(2)], lr=0.1).state_dict()
    assert plain["state"] == [{}]
    assert plain["hyperparams"] == {"lr": 0.1, "momentum": 0.0, "dampening": 0.0,
                                    "weight_decay": 0.0}


def _bad_state_dicts(xp):
    """(mutation of a good state dict, error, message) cases for an Adam over float32 (3,) and
    float64 (2, 2) parameters."""
    def set_state(i, name, value):
        def change(d):
            d["state"][i][name] = value
        return change

    def drop(path):
        def change(d):
            target = d
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
        return change

    def put(key, value):
        def change(d):
            d[key] = value
        return change

    def hyper(name, value):
        def change(d):
            d["hyperparams"][name] = value
        return change

    return [
        (drop(["step"]), KeyError, "state_dict is missing 'step'"),
        (drop(["hyperparams"]), KeyError, "state_dict is missing 'hyperparams'"),
        (drop(["state", 1, "exp_avg_sq"]), KeyError,
         r"state_dict\['state'\]\[1\] is missing 'exp_avg_sq'"),
        (put("extra", 1), ValueError, r"unknown keys \['extra'\]"),
        (set_state(0, "momentum_buffer", xp.zeros(3, dtype=np.float32)), ValueError,
         r"state_dict\['state'\]\[0\] has unknown keys \['momentum_buffer'\]"),
        (lambda d: d["state"].pop(), ValueError,
         r"one entry per parameter \(2\), got 1 entries"),
        (set_state(0, "exp_avg", xp.zeros(4, dtype=np.float32)), ValueError,
         r"state_dict\['state'\]\[0\]\['exp_avg'\] has shape \(4,\) but the optimizer's "
         r"exp_avg of params\[0\] has \(3,\)"),
        (set_state(1, "exp_avg_sq", xp.zeros((2, 2), dtype=np.float32)), TypeError,
         r"state_dict\['state'\]\[1\]\['exp_avg_sq'\] has dtype float32 but .* has float64"),
        (set_state(0, "exp_avg", np.zeros(3, dtype=np.float32)) if xp is not np else
         set_state(0, "exp_avg", gs.strict.xp.zeros(3, dtype=np.float32)), TypeError,
         r"state_dict\['state'\]\[0\]\['exp_avg'\] is a \w+ array but the optimizer's "
         r"exp_avg of params\[0\] is \w+"),
        (set_state(0, "exp_avg", [0.0, 0.0, 0.0]), TypeError,
         r"state_dict\['state'\]\[0\]\['exp_avg'\] must be a NumPy or CuPy array, got list"),
        (put("step", xp.zeros((), dtype=np.int32)), TypeError,
         r"state_dict\['step'\] has dtype int32 but the step counter \(0-d int64\) has int64"),
        (put("step", xp.zeros(1, dtype=np.int64)), ValueError,
         r"state_dict\['step'\] has shape \(1,\)"),
        (hyper("lr", -1.0), ValueError, r"state_dict\['hyperparams'\]\['lr'\] must be >= 0"),
        (hyper("betas", (0.9, 1.0)), ValueError,
         r"state_dict\['hyperparams'\]\['betas'\]\[1\] must be in \[0.0, 1.0\)"),
        (hyper("momentum", 0.9), ValueError, r"unknown key 'momentum'"),
        (put("hyperparams", [("lr", 0.1)]), TypeError, "must be a mapping, got list"),
        (put("state", {0: {}}), ValueError, "must be a list of one entry per parameter"),
    ]


@pytest.mark.parametrize("case", range(17))
def test_load_state_dict_bad_input_names_the_key_and_changes_nothing(xp, rng, case):
    change, error, match = _bad_state_dicts(xp)[case]
    params = [xp.asarray(rng.standard_normal(3), dtype=np.float32),
              xp.asarray(rng.standard_normal((2, 2)))]
    opt = optim.Adam(params, lr=0.1)
    opt.step([xp.ones(3, dtype=np.float32), xp.ones((2, 2))])
    good = opt.state_dict()
    good["state"][0]["exp_avg"][...] = xp.asarray(7.0, dtype=np.float32)
    good["step"][...] = xp.asarray(40, dtype=np.int64)
    good["hyperparams"]["lr"] = 0.5
    before = snapshot(opt.state("exp_avg") + opt.state("exp_avg_sq"))
    change(good)
    with pytest.raises(error, match=match):
        opt.load_state_dict(good)
    assert opt.lr == 0.1 and int(opt.step_count) == 1
    for a, b in zip(host(opt.state("exp_avg") + opt.state("exp_avg_sq")), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_state_dict_cases_are_all_run(xp):
    assert len(_bad_state_dicts(xp)) == 17


def test_load_state_dict_from_the_optimizers_own_live_views(xp):
    """Sources that alias the optimizer's own buffers (its `state` views, swapped) are read
    before anything is written: the swap happens, not a copy of one into both."""
    params = [xp.zeros(3), xp.zeros(3)]
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    opt.step([xp.asarray([1.0, 2.0, 3.0]), xp.asarray([4.0, 5.0, 6.0])])
    live = opt.state("momentum_buffer")
    with counting() as counter:
        opt.load_state_dict({"step": opt.step_count.array,
                             "state": [{"momentum_buffer": live[1]},
                                       {"momentum_buffer": live[0]}],
                             "hyperparams": {}})
    assert counter.count == 0
    assert counter.device_ops == 3 + 3  # the three aliasing sources copied aside, then copied in
    buffers = [h.tolist() for h in host(opt.state("momentum_buffer"))]
    assert buffers == [[4.0, 5.0, 6.0], [1.0, 2.0, 3.0]]
    assert int(opt.step_count) == 1
    # independent sources are copied in directly: one op each
    d = opt.state_dict()
    with counting() as counter:
        opt.load_state_dict(d)
    assert counter.device_ops == 3


def test_load_state_dict_on_another_strict_device(rng):
    xp = gs.strict.xp
    opt = optim.SGD([xp.zeros(2)], lr=0.1, momentum=0.9)
    with gs.strict.device(1):
        other = optim.SGD([xp.zeros(2)], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"state_dict\['step'\] is on device 1 but"):
        opt.load_state_dict(other.state_dict())
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        opt.load_state_dict([("step", 0)])


# ---- bad input to the classes ----------------------------------------------------------------


def _everything(opt):
    """Host copies of an optimizer's parameters, state and step count."""
    names = opt._program.arrays[2:]
    return (snapshot(opt.params), [snapshot(opt.state(n)) for n in names],
            int(opt.step_count))


def _assert_same(before, after):
    for a, b in zip(before[0] + sum(before[1], []), after[0] + sum(after[1], []), strict=True):
        np.testing.assert_array_equal(a, b)
    assert before[2] == after[2]


@pytest.mark.parametrize("config", ["adam", "sgd_momentum"])
def test_read_only_arrays_are_refused_before_anything_changes(rng, config):
    """A read-only NumPy parameter (or state view) would fail half-way through a step, after
    other tensors were updated: it is refused up front, naming it, and nothing changes."""
    cls, kw = CONFIGS[config]
    a, ro = rng.standard_normal(3), rng.standard_normal(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"params\[1\] is read-only"):
        cls([a, ro], **kw)
    ro = ro.copy()
    opt = cls([a, rng.standard_normal((2, 2)), ro], **kw)
    grads = [np.ones(3), np.ones((2, 2)), np.ones(3)]
    opt.step(grads)
    before = _everything(opt)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"params\[2\] is read-only"):
        opt.step(grads)
    _assert_same(before, _everything(opt))
    ro.flags.writeable = True
    state = opt._program.arrays[2]
    opt.state(state)[1].flags.writeable = False  # the live view the optimizer writes
    with pytest.raises(ValueError, match=rf"the optimizer's {state} of params\[1\] is read-only"):
        opt.step(grads)
    with pytest.raises(ValueError, match=rf"the optimizer's {state} of params\[1\] is read-only"):
        opt.load_state_dict(opt.state_dict())
    _assert_same(before, _everything(opt))
    opt.state(state)[1].flags.writeable = True
    opt.step(grads)
    assert int(opt.step_count) == 2


def test_a_parameter_reshaped_in_place_is_refused_before_anything_changes(rng):
    """NumPy lets a parameter's (or a reused gradient's) shape change in place: the step would
    fail half-way; it is refused up front, naming the array."""
    params = [rng.standard_normal(3), rng.standard_normal(4)]
    grads = [np.ones(3), np.ones(4)]
    opt = optim.Adam(params, lr=0.1)
    opt.step(grads)
    before = _everything(opt)
    params[1].shape = (2, 2)
    with pytest.raises(ValueError, match=r"params\[1\] now has shape \(2, 2\)"):
        opt.step(grads)
    params[1].shape = (4,)
    _assert_same(before, _everything(opt))
    grads[1].shape = (1, 4)  # the same gradient arrays as the last step, reshaped
    with pytest.raises(ValueError, match=r"grads\[1\] has shape \(1, 4\)"):
        opt.step(grads)
    _assert_same(before, _everything(opt))


def test_functional_steps_refuse_read_only_arrays(rng):
    p, g = rng.standard_normal(4), rng.standard_normal(4)
    m, v = np.zeros(4), np.zeros(4)
    saved = p.copy()
    v.flags.writeable = False
    with pytest.raises(ValueError, match="exp_avg_sq is read-only"):
        optim.adam_step(p, g, m, v, step=1)
    np.testing.assert_array_equal(p, saved)
    np.testing.assert_array_equal(m, 0.0)
    buf = np.zeros(4)
    buf.flags.writeable = False
    with pytest.raises(ValueError, match="momentum_buffer is read-only"):
        optim.sgd_step(p, g, buf, lr=0.1, momentum=0.9)
    p.flags.writeable = False
    with pytest.raises(ValueError, match="param is read-only"):
        optim.sgd_step(p, g, lr=0.1)
    np.testing.assert_array_equal(p, saved)


def test_chunk_size_is_checked():
    class Odd(optim.SGD):
        chunk_size = 0

    with pytest.raises(ValueError, match="Odd.chunk_size must be an int >= 1, got 0"):
        Odd([np.zeros(2)], lr=0.1)


def test_optimizer_bad_input(xp, rng):
    with pytest.raises(TypeError, match="non-empty list of arrays"):
        optim.Adam([])
    with pytest.raises(TypeError, match="not a single array"):
        optim.Adam(xp.zeros(3))
    with pytest.raises(TypeError, match=r"params\[1\] must be a NumPy or CuPy array, got list"):
        optim.Adam([xp.zeros(3), [1.0, 2.0]])
    with pytest.raises(TypeError, match=r"params\[0\] must be float32 or float64"):
        optim.SGD([xp.zeros(3, dtype=np.int64)], lr=0.1)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        optim.SGD([xp.zeros(3)], lr=-1)
    with pytest.raises(ValueError, match=r"betas\[1\] must be in"):
        optim.Adam([xp.zeros(3)], betas=(0.9, 1.5))
    w = xp.zeros(4)
    with pytest.raises(ValueError, match=r"params\[0\] and params\[2\] share memory"):
        optim.Adam([w, xp.zeros(2), w])
    with pytest.raises(ValueError, match=r"params\[0\] and params\[1\] share memory"):
        optim.Adam([w[:3], w[2:]])
    optim.Adam([w[:2], w[2:]])  # adjacent views do not overlap
    with pytest.raises(ValueError, match="nesterov momentum needs momentum > 0"):
        optim.SGD([xp.zeros(3)], lr=0.1, nesterov=True)
    with pytest.raises(TypeError, match="nesterov must be a bool"):
        optim.SGD([xp.zeros(3)], lr=0.1, momentum=0.9, nesterov=1)

    params = [xp.zeros(3), xp.zeros((2, 2), dtype=np.float32)]
    opt = optim.Adam(params, lr=0.1)
    grads = [xp.ones(3), xp.ones((2, 2), dtype=np.float32)]
    opt.step(grads)
    saved = snapshot(params)
    bad_steps = [
        ([xp.zeros(3)], ValueError, r"one gradient per parameter \(2\), got 1 arrays"),
        (xp.zeros(3), ValueError, r"one gradient per parameter \(2\), got a single array"),
        ([xp.zeros(3), xp.zeros(4, dtype=np.float32)], ValueError,
         r"grads\[1\] has shape \(4,\) but params\[1\] has"),
        ([xp.zeros(3), xp.zeros((2, 2))], TypeError,
         r"grads\[1\] has dtype float64 but params\[1\] has float32"),
        ([xp.zeros(3), [[0.0, 0.0], [0.0, 0.0]]], TypeError,
         r"grads\[1\] must be a NumPy or CuPy array, got list"),
        ([params[0], grads[1]], ValueError, r"grads\[0\] is a parameter array itself"),
    ]
    for bad, error, match in bad_steps:
        with pytest.raises(error, match=match):
            opt.step(bad)
    with pytest.raises(TypeError, match="skip_if must be a bool GPUScalar"):
        opt.step(grads, skip_if=True)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        opt.lr = -0.5
    with pytest.raises(ValueError, match="eps must be >= 0"):
        opt.eps = -1.0
    with pytest.raises(TypeError, match="betas must be a pair"):
        opt.betas = 0.9
    with pytest.raises(KeyError, match="no state 'momentum_buffer'"):
        opt.state("momentum_buffer")
    assert opt.lr == 0.1 and opt.eps == 1e-8 and opt.betas == (0.9, 0.999)
    for a, b in zip(host(params), saved, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(opt.step_count) == 1
    with counting() as counter:  # the failed steps left the gradient table as it was
        opt.step(grads)
    assert counter.device_ops == 3


def test_other_backend_gradients_are_rejected(rng):
    opt = optim.SGD([gs.strict.xp.zeros(3)], lr=0.1)
    with pytest.raises(TypeError, match=r"grads\[0\] is a numpy array but params\[0\] is strict"):
        opt.step([np.zeros(3)])
    opt_np = optim.SGD([np.zeros(3)], lr=0.1)
    with pytest.raises(TypeError, match=r"grads\[0\] is a strict array but params\[0\] is numpy"):
        opt_np.step([gs.strict.xp.zeros(3)])
    with pytest.raises(TypeError, match="skip_if is a numpy GPUScalar but the arrays are strict"):
        opt.step([gs.strict.xp.zeros(3)], skip_if=gs.asscalar(False))


def test_contiguity(rng):
    """The kernels index flat memory: the strict device (as CuPy) rejects non-contiguous
    parameters and gradients with a clear error; NumPy evaluates any layout."""
    xp = gs.strict.xp
    base = xp.asarray(rng.standard_normal((4, 6)))
    with pytest.raises(ValueError, match=r"params\[0\] must be C-contiguous for the fused "
                                         r"strict kernel \(got strides \(48, 16\)\)"):
        optim.SGD([base[:, ::2]], lr=0.1)
    opt = optim.SGD([xp.zeros((4, 3))], lr=0.1)
    with pytest.raises(ValueError, match=r"grads\[0\] must be C-contiguous"):
        opt.step([base[:, ::2]])
    host_base = rng.standard_normal((4, 6))
    view = host_base[:, ::2]
    expected = view - 0.1 * np.ones((4, 3))
    np_opt = optim.SGD([view, host_base[:, 1::2]], lr=0.1)  # interleaved views: no overlap
    np_opt.step([np.ones((4, 3)), np.zeros((4, 3))])
    np.testing.assert_allclose(host_base[:, ::2], expected)


def test_sgd_hyperparameter_rules():
    plain = optim.SGD([np.zeros(2)], lr=0.1)
    with pytest.raises(ValueError, match="made without momentum"):
        plain.momentum = 0.9
    with pytest.raises(ValueError, match="made without momentum"):
        plain.momentum = gs.asscalar(0.9)
    plain.momentum = 0.0
    nesterov = optim.SGD([np.zeros(2)], lr=0.1, momentum=0.9, nesterov=True)
    assert nesterov.nesterov and not plain.nesterov
    with pytest.raises(ValueError, match="nesterov momentum needs dampening == 0"):
        nesterov.dampening = 0.5
    assert nesterov.momentum == 0.9 and nesterov.dampening == 0.0
    nesterov.momentum = 0.0  # as in PyTorch: plain SGD steps from now on (tested below)


@pytest.mark.parametrize("kind", ["number", "gpuscalar", "nesterov", "load_state_dict"])
def test_sgd_momentum_set_to_zero_is_plain_sgd(xp, kind):
    """PyTorch's rule: a step whose momentum is 0 is ``p -= lr * (g + wd * p)``, whatever the
    dampening, and leaves the momentum buffer alone; momentum set back resumes from it."""
    p = xp.zeros(3)
    nesterov = kind == "nesterov"
    momentum = gs.asscalar(0.9, like=p) if kind == "gpuscalar" else 0.9
    opt = optim.SGD([p], lr=1.0, momentum=momentum, dampening=0.0 if nesterov else 0.5,
                    nesterov=nesterov)
    g = xp.asarray([1.0, 2.0, 3.0])
    opt.step([g])  # the buffer starts as the gradient
    buf = snapshot(opt.state("momentum_buffer")[0])
    np.testing.assert_array_equal(buf, [1.0, 2.0, 3.0])
    if kind == "gpuscalar":
        momentum.array[...] = xp.asarray(0.0)  # decided on the device
    elif kind == "load_state_dict":
        d = opt.state_dict()
        d["hyperparams"]["momentum"] = 0.0
        opt.load_state_dict(d)
    else:
        opt.momentum = 0.0
    p[...] = xp.asarray(0.0)
    with counting() as counter:
        opt.step([g])
    assert counter.count == 0
    np.testing.assert_array_equal(host(p), [-1.0, -2.0, -3.0])  # not -(1 - dampening) * g
    np.testing.assert_array_equal(host(opt.state("momentum_buffer")[0]), buf)
    if kind == "gpuscalar":
        momentum.array[...] = xp.asarray(0.9)
    else:
        opt.momentum = 0.9
    p[...] = xp.asarray(0.0)
    opt.step([g])  # resumes from the kept buffer
    dampening = 0.0 if nesterov else 0.5
    new_buf = 0.9 * buf + (1 - dampening) * host(g)
    np.testing.assert_allclose(host(opt.state("momentum_buffer")[0]), new_buf)
    np.testing.assert_allclose(host(p), -(host(g) + 0.9 * new_buf) if nesterov else -new_buf)

# ---- clip_grad_norm and all_finite ----------------------------------------------------------


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_reference(xp, rng, norm_type, max_norm):
    originals = [rng.standard_normal(s) for s in [(3, 4), (5,), (1,)]]
    grads = [xp.array(h, copy=True) for h in originals]
    flat = np.concatenate([h.ravel() for h in originals])
    expected_norm = np.linalg.norm(flat, ord=norm_type)
    coef = min(1.0, max_norm / (expected_norm + 1e-6))
    with gs.count_syncs() as counter:
        total = optim.clip_grad_norm(grads, max_norm, norm_type=norm_type)
    assert counter.count == 0
    assert isinstance(total, gs.GPUScalar)
    assert float(total) == pytest.approx(expected_norm, rel=1e-12)
    for got, h in zip(grads, originals, strict=True):
        np.testing.assert_allclose(host(got), h * coef, rtol=1e-12)
    if max_norm < 1:
        clipped = np.linalg.norm(np.concatenate([host(g).ravel() for g in grads]), ord=norm_type)
        assert clipped == pytest.approx(max_norm, rel=1e-5)


def test_clip_grad_norm_device_max_norm_float32(rng):
    grads = [rng.standard_normal(10).astype(np.float32) * 100]
    host = grads[0].astype(np.float64)
    with gs.count_syncs() as counter:
        optim.clip_grad_norm(grads, gs.asscalar(np.float32(2.0)))
    assert counter.count == 0
    assert grads[0].dtype == np.float32
    np.testing.assert_allclose(grads[0], host * 2.0 / (np.linalg.norm(host) + 1e-6), rtol=1e-5)


def test_all_finite(rng):
    good = [rng.standard_normal(3), rng.standard_normal((2, 2))]
    with gs.count_syncs() as counter:
        ok = optim.all_finite(good)
        bad = optim.all_finite([good[0], np.array([1.0, -np.inf])])
        nan = optim.all_finite([np.array([np.nan])])
    assert counter.count == 0
    assert ok.dtype == np.bool_ and bool(ok) is True
    assert bool(bad) is False and bool(nan) is False


def test_all_finite_takes_0d_arrays_on_every_backend(xp):
    """A model with a scalar parameter: ``skip_if=~all_finite(grads)`` takes its 0-d gradient
    (NumPy's isfinite of a 0-d array is a NumPy bool, not an array)."""
    with counting() as counter:
        flags = [optim.all_finite([xp.asarray(1.0)]),
                 optim.all_finite([xp.asarray(np.nan)]),
                 optim.all_finite([xp.ones(3), xp.asarray(2.0, dtype=np.float32)]),
                 optim.all_finite([xp.ones(3), xp.asarray(-np.inf)])]
    assert counter.count == 0
    assert [f.dtype for f in flags] == [np.bool_] * 4
    assert [bool(f) for f in flags] == [True, False, True, False]


def test_loss_scaling_with_a_scalar_parameter(xp):
    """The README's loop on a model with a 0-d parameter: overflowing steps are skipped on the
    device, the others applied, with no sync."""
    w, b = xp.zeros(3), xp.asarray(0.0)
    opt = optim.SGD([w, b], lr=0.5)
    grads = [xp.ones(3), xp.asarray(2.0)]
    with counting() as counter:
        for value in (1.0, np.inf, 1.0):
            grads[1][...] = xp.asarray(value)
            opt.step(grads, skip_if=~optim.all_finite(grads))
    assert counter.count == 0
    np.testing.assert_array_equal(host(w), [-1.0, -1.0, -1.0])
    assert host(b) == -1.0 and int(opt.step_count) == 2


# ---- bad input -------------------------------------------------------------------------------


def _adam_args():
    p = np.zeros(4, np.float32)
    return p, np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"grad": np.zeros(5, np.float32)}, ValueError, r"grad has shape \(5,\)"),
        ({"grad": np.zeros(4, np.float64)}, TypeError, "grad has dtype float64"),
        ({"exp_avg": np.zeros((2, 2), np.float32)}, ValueError, "exp_avg has shape"),
        ({"exp_avg_sq": np.zeros(4, np.float64)}, TypeError, "exp_avg_sq has dtype"),
        ({"param": [0.0, 0.0, 0.0, 0.0]}, TypeError, "param must be a NumPy or CuPy array"),
        ({"grad": [0.0] * 4}, TypeError, "grad must be a NumPy or CuPy array"),
        ({"param": np.zeros(4, np.int32)}, TypeError, "float32 or float64, got dtype int32"),
        ({"lr": -1e-3}, ValueError, "lr must be >= 0"),
        ({"lr": "0.1"}, TypeError, "lr must be a real number"),
        ({"lr": gs.asscalar(True)}, TypeError, "lr must be a real number, got a GPUScalar"),
        ({"lr": gs.asscalar(np.float16(0.1))}, TypeError, "GPUScalar of dtype float16"),
        ({"betas": (1.0, 0.999)}, ValueError, r"betas\[0\] must be in \[0.0, 1.0\)"),
        ({"betas": (0.9, -0.1)}, ValueError, r"betas\[1\] must be >= 0"),
        ({"betas": 0.9}, TypeError, "betas must be a pair"),
        ({"step": 0}, ValueError, "step must be >= 1"),
        ({"step": float("nan")}, ValueError, "step must be >= 1"),
        ({"eps": -1.0}, ValueError, "eps must be >= 0"),
        ({"skip_if": True}, TypeError, "skip_if must be a bool GPUScalar"),
        ({"skip_if": gs.asscalar(1.0)}, TypeError, "skip_if must be a bool GPUScalar"),
    ],
)
def test_adam_step_bad_input_changes_nothing(change, error, match):
    p, g, m, v = _adam_args()
    args = {"param": p, "grad": g + 1, "exp_avg": m, "exp_avg_sq": v, "step": 1, "lr": 0.1}
    args.update(change)
    snapshot = {k: a.copy() for k, a in args.items() if isinstance(a, np.ndarray)}
    positional = [args.pop(k) for k in ("param", "grad", "exp_avg", "exp_avg_sq")]
    with pytest.raises(error, match=match):
        optim.adam_step(*positional, **args)
    for k, a in zip(("param", "grad", "exp_avg", "exp_avg_sq"), positional, strict=True):
        if k in snapshot:
            np.testing.assert_array_equal(a, snapshot[k])


def test_sgd_step_bad_input():
    p = np.zeros(3)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        optim.sgd_step(p, np.ones(3), lr=-0.1)
    with pytest.raises(ValueError, match="nesterov momentum needs momentum > 0"):
        optim.sgd_step(p, np.ones(3), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="nesterov momentum needs dampening == 0"):
        optim.sgd_step(p, np.ones(3), lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="momentum_buffer given but momentum is 0"):
        optim.sgd_step(p, np.ones(3), np.zeros(3), lr=0.1)
    with pytest.raises(ValueError, match=r"momentum_buffer has shape \(2,\)"):
        optim.sgd_step(p, np.ones(3), np.zeros(2), lr=0.1, momentum=0.9)
    np.testing.assert_array_equal(p, 0)



def test_clip_and_all_finite_bad_input():
    with pytest.raises(ValueError, match="at least one gradient"):
        optim.clip_grad_norm([], 1.0)
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        optim.clip_grad_norm([np.ones(3)], -1.0)
    with pytest.raises(ValueError, match="norm_type must be a positive number"):
        optim.clip_grad_norm([np.ones(3)], 1.0, norm_type=0)
    with pytest.raises(TypeError, match=r"grads\[1\] must be a NumPy or CuPy array"):
        optim.clip_grad_norm([np.ones(3), 3.0], 1.0)
    with pytest.raises(TypeError, match=r"arrays\[1\] must be a numpy array, got list"):
        optim.all_finite([np.ones(3), [1.0]])
    with pytest.raises(ValueError, match="at least one array"):
        optim.all_finite([])


def test_numpy_and_kernel_paths_share_one_description():
    """The NumPy evaluator runs exactly the Program's rules: editing a Program's body changes
    the NumPy result, so the CUDA kernel (printed from the same nodes) cannot drift."""
    param, grad, lr, weight_decay, g = rules.symbols("param grad lr weight_decay g")
    halved = Program(
        name="sgd_half", scalars=SGD_PLAIN.scalars, arrays=SGD_PLAIN.arrays,
        prelude=(), body=(("g", grad + weight_decay * param), ("p", param - lr * g / 2)),
        outputs=SGD_PLAIN.outputs,
    )
    p = np.ones(3)
    executors.run_program(gs.get_backend("numpy"), halved, {"lr": 1.0, "weight_decay": 0.0},
                       {"param": p, "grad": np.ones(3)}, None)
    np.testing.assert_array_equal(p, 0.5)
    source, _ = kernel_source(halved, "float64", [None, None], False)
    assert "const T p = param - lr * g / 2;" in source


def test_sgd_with_device_hyperparameters_never_syncs(rng):
    ref = rng.standard_normal(6)
    opt = optim.SGD([ref.astype(np.float32)], lr=gs.asscalar(0.05), momentum=gs.asscalar(0.9),
                    dampening=gs.asscalar(0.1), weight_decay=gs.asscalar(0.01))
    p = ref.astype(np.float32)
    buf = None
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(STEPS)]
    with gs.count_syncs() as counter:
        for g in grads:
            opt.step([g], skip_if=~optim.all_finite([g]))
            buf = optim.sgd_step(p, g, buf, lr=gs.asscalar(0.05), momentum=gs.asscalar(0.9),
                                 dampening=0.1, weight_decay=0.01)
    assert counter.count == 0
    buf64 = None
    for g in grads:
        ref, buf64 = ref_sgd(ref, g, buf64, 0.05, 0.9, 0.1, 0.01, False)
    close(opt.params[0], ref)
    close(p, ref)


def test_skip_if_costs_no_extra_op(xp, rng):
    """The kernels and the counter read the flag themselves: no op to combine it."""
    opt = optim.Adam([xp.asarray(rng.standard_normal(3)),
                      xp.asarray(rng.standard_normal(2), dtype=np.float32)])
    grads = [xp.ones(3), xp.ones(2, dtype=np.float32)]
    flag = gs.asscalar(False, like=grads[0])
    opt.step(grads)
    with counting() as plain:
        opt.step(grads)
    with counting() as skipping:
        opt.step(grads, skip_if=flag)
    assert (plain.device_ops, skipping.device_ops) == (3, 3)


# ---- issue 15: no hidden host-to-device copy in a step; error messages that would sync -------


def test_a_clip_and_adam_step_makes_no_hidden_host_to_device_copy():
    """A clip + Adam step over 12 gradients (more than the 8 inputs above which CuPy's
    stack/concatenate uploads a pointer table) recorded as a captured step's body on the strict
    device, which refuses every host-to-device copy with CuPy's words: none is made. The same
    step outside the body gives the same parameters (the body changes nothing it computes)."""
    from gpuscalar import strict

    def run(in_body):
        rng = np.random.default_rng(7)
        params = [strict.xp.asarray(rng.standard_normal(3)) for _ in range(12)]
        grads = [strict.xp.asarray(rng.standard_normal(3)) for _ in range(12)]
        opt = optim.Adam(params, lr=1e-2)
        with counting() as counter:
            for _ in range(3):
                with sync.graph_body() if in_body else contextlib.nullcontext():
                    total = optim.clip_grad_norm(grads, 0.5)
                    opt.step(grads, skip_if=~optim.all_finite(grads))
        assert counter.count == 0
        return [host(p) for p in params], float(total)

    (captured, norm_in_body), (plain, norm_plain) = run(True), run(False)
    assert norm_in_body == norm_plain
    for got, expected in zip(captured, plain, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n", [1, 2, 12])
def test_all_finite_device_ops(xp, n):
    """One array: isfinite and all (2 ops); n arrays: the slot vector, isfinite and all into
    the array's slot per array, and all of the slots (2 + 2n ops), whatever n (no stack)."""
    arrays = [xp.ones(3) for _ in range(n)]
    with gs.count_syncs() as counter:
        flag = optim.all_finite(arrays)
    assert counter.device_ops == (2 if n == 1 else 2 + 2 * n)
    assert bool(flag) is True
    arrays[-1][1] = np.nan
    assert bool(optim.all_finite(arrays)) is False


@pytest.mark.parametrize("setting, error, words", [
    (lambda opt: setattr(opt, "betas", gs.asscalar(0.9)), TypeError,
     "betas must be a pair .*got a GPUScalar of dtype float64"),
    (lambda opt: setattr(opt, "betas", (gs.asscalar(0.9),)), TypeError,
     r"got a tuple of 1 \(a GPUScalar of dtype float64\)"),
    (lambda opt: setattr(opt, "betas", [gs.asscalar(0.9)] * 3), TypeError,
     "got a list of 3"),
    (lambda opt: optim.clip_grad_norm([np.ones(3)], 1.0, norm_type=gs.asscalar(2.0)),
     ValueError, "norm_type must be .* got a GPUScalar of dtype float64"),
    (lambda opt: gs.unbroadcast(np.ones(3), gs.asscalar(3)), TypeError,
     "shape must be a tuple of ints, got a GPUScalar of dtype int64"),
], ids=["betas-scalar", "betas-short", "betas-long", "norm_type", "unbroadcast-shape"])
def test_bad_input_errors_name_a_gpuscalar_without_reading_it(setting, error, words):
    """Formatting a GPUScalar's value in an error message is a sync: under the error guard it
    would raise SyncError in place of the real error. The message names its type and dtype."""
    opt = optim.Adam([np.ones(3)], lr=0.1)
    with gs.sync_guard("error"), gs.count_syncs() as counter, pytest.raises(error, match=words):
        setting(opt)
    assert counter.count == 0


# ---- issue 21: clip_grad_norm of one array (PyTorch's clip_grad_norm_ takes one tensor) -----


@pytest.mark.parametrize("shape", [(1000,), (4, 5), ()])
def test_clip_grad_norm_of_one_array_scales_that_array(xp, shape):
    """One gradient array is clipped as ``[grad]`` is (never split into rows or elements):
    the same norm, the same scaled values, the same device ops; the scaled array's norm is
    ``max_norm``. On the strict device a 1,000-element vector cost 2,127 device ops before
    issue 21 (1,000 per-element norms, their gathering, and 1,000 multiplies)."""
    data = np.linspace(-2.0, 3.0, math.prod(shape)).reshape(shape)
    alone, listed = xp.array(data, copy=True), xp.array(data, copy=True)
    with counting() as counter:
        total = optim.clip_grad_norm(alone, 0.5)
    with counting() as listed_counter:
        listed_total = optim.clip_grad_norm([listed], 0.5)
    assert counter.count == listed_counter.count == 0
    assert counter.device_ops == listed_counter.device_ops <= 5  # eager: + the coefficient's 3
    assert host(total) == host(listed_total) == pytest.approx(np.linalg.norm(data.ravel()))
    np.testing.assert_array_equal(host(alone), host(listed))
    assert host(alone).shape == shape
    assert np.linalg.norm(np.ravel(host(alone))) == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize(("grads", "error", "words"), [
    (lambda: gs.asscalar(2.0), TypeError,
     "grads must be a NumPy or CuPy array, got a GPUScalar of dtype float64, which cannot be "
     "scaled in place"),
    (lambda: [np.ones(3), gs.asscalar(2.0)], TypeError,
     r"grads\[1\] must be a NumPy or CuPy array, got a GPUScalar"),
    (lambda: np.ones(3, np.int32), TypeError, "grads must be float32 or float64, got dtype int32"),
    (lambda: [np.ones(3), np.ones(3, np.int32)], TypeError, r"grads\[1\] must be float32"),
    (lambda: {"w": np.ones(3)}, TypeError, r"got a dict \(pass its \.values\(\)\)"),
    (lambda: np.float32(2.0), TypeError, "which is not a NumPy or CuPy array"),
    (lambda: (g for g in []), ValueError, "at least one gradient array, got an empty generator"),
    (lambda: 2.0, TypeError, "grads must be a NumPy or CuPy array, a GPUScalar or an iterable"),
], ids=["gpuscalar", "gpuscalar-item", "int-array", "int-item", "dict", "numpy-scalar",
        "empty-generator", "float"])
def test_clip_grad_norm_names_what_is_wrong_with_grads(grads, error, words):
    """Refused before anything is scaled, naming ``grads`` (one array) or ``grads[i]``."""
    grads = grads()
    with gs.count_syncs() as counter, pytest.raises(error, match=words):
        optim.clip_grad_norm(grads, 1.0)
    assert counter.device_ops == 0


@pytest.mark.parametrize("norm_type", [0, -1.0, -math.inf, "inf", None, True, float("nan"),
                                       np.float64(np.nan)])
def test_clip_grad_norm_refuses_a_norm_type_that_is_not_a_positive_number(norm_type):
    grad = np.ones(3)
    with pytest.raises(ValueError, match="norm_type must be a positive number or math.inf"):
        optim.clip_grad_norm(grad, 1.0, norm_type=norm_type)
    np.testing.assert_array_equal(grad, 1.0)


@pytest.mark.parametrize("norm_type", [np.float32(1.0), np.int64(2), 3, 0.5])
def test_clip_grad_norm_takes_numpy_real_norm_types(xp, norm_type):
    grad = xp.asarray(np.array([3.0, -4.0]))
    total = optim.clip_grad_norm(grad, 100.0, norm_type=norm_type)
    assert host(total) == pytest.approx(np.linalg.norm([3.0, -4.0], float(norm_type)))
