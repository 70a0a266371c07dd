"""gpuscalar.optim against straightforward float64 PyTorch-formula references, with exact sync
and device-op counts, on-device skipping, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import optim

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


def test_adam_step_with_device_hyperparameters_never_syncs(xp, rng):
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
    assert counter.device_ops == 2 * STEPS  # the step increment and ONE fused update each
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


# ---- classes -----------------------------------------------------------------------------


def _shapes(n):
    return [(3, 2), (5,), (2, 2, 2)][:n] if n <= 3 else [(k % 4 + 1,) for k in range(n)]


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
def test_adam_classes_match_reference(xp, rng, cls):
    shapes = [(3, 2), (7,), (2, 2, 2)]
    ref = [rng.standard_normal(s) for s in shapes]
    # One float64 parameter among float32 ones: two dtype groups.
    dtypes = [np.float32, np.float64, np.float32]
    opt = cls([xp.asarray(r, dtype=d) for r, d in zip(ref, dtypes, strict=True)], lr=1e-2,
              betas=(0.9, 0.99), weight_decay=0.02)
    m = [np.zeros(s) for s in shapes]
    v = [np.zeros(s) for s in shapes]
    for t in range(1, STEPS + 1):
        grads = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes, strict=True)]
        opt.step([xp.asarray(g) for g in grads])
        for i, g in enumerate(grads):
            ref[i], m[i], v[i] = ref_adam(ref[i], g, m[i], v[i], t, 1e-2, 0.9, 0.99, 1e-8, 0.02,
                                          cls is optim.AdamW)
    for got, want, d in zip(opt.params, ref, dtypes, strict=True):
        assert got.dtype == d
        close(got, want)
    for got, want in zip(opt.state("exp_avg_sq"), v, strict=True):
        close(got, want)
    assert int(opt.step_count) == STEPS


@pytest.mark.parametrize(("momentum", "nesterov"), [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_class_matches_reference(xp, rng, momentum, nesterov):
    shapes = [(4,), (2, 3)]
    ref = [rng.standard_normal(s) for s in shapes]
    opt = optim.SGD([xp.asarray(r, dtype=np.float32) for r in ref], lr=0.05, momentum=momentum,
                    nesterov=nesterov, weight_decay=0.01)
    bufs = [None, None]
    for _ in range(STEPS):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        opt.step([xp.asarray(g) for g in grads])
        for i, g in enumerate(grads):
            ref[i], bufs[i] = ref_sgd(ref[i], g, bufs[i], 0.05, momentum, 0.0, 0.01, nesterov)
    for got, want in zip(opt.params, ref, strict=True):
        close(got, want)


def test_classes_with_device_schedule_never_sync(rng):
    shapes = [(6,), (2, 3)]
    ref = [rng.standard_normal(s) for s in shapes]
    opt = optim.Adam([r.astype(np.float32) for r in ref], betas=(gs.asscalar(0.9),
                                                                 gs.asscalar(0.999)))
    m = [np.zeros(s) for s in shapes]
    v = [np.zeros(s) for s in shapes]
    warmup = 10
    all_grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes]
                 for _ in range(STEPS)]
    with gs.count_syncs() as counter:
        for grads in all_grads:
            opt.lr = 1e-2 * gs.minimum(1.0, (opt.step_count + 1) / warmup)
            opt.step(grads)
    assert counter.count == 0
    for t, grads in enumerate(all_grads, 1):
        lr = 1e-2 * min(1.0, t / warmup)
        for i, g in enumerate(grads):
            ref[i], m[i], v[i] = ref_adam(ref[i], g, m[i], v[i], t, lr, 0.9, 0.999, 1e-8, 0,
                                          False)
    for got, want in zip(opt.params, ref, strict=True):
        close(got, want)


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW, optim.SGD])
def test_step_is_constant_device_ops_per_dtype_group(rng, cls):
    kwargs = {"lr": 0.1, "momentum": 0.9} if cls is optim.SGD else {}

    def ops_per_step(n_tensors, n_groups):
        dtypes = [np.float32, np.float64][:n_groups]
        params = [rng.standard_normal(s).astype(dtypes[k % n_groups])
                  for k, s in enumerate(_shapes(n_tensors))]
        opt = cls(params, **kwargs)
        grads = [np.ones_like(p) for p in params]
        with gs.count_syncs() as counter:
            opt.step(grads)
        with gs.count_syncs() as zero_copy:
            opt.step(opt.grads)  # gradients written in place: no gather copy
        return counter.device_ops, zero_copy.device_ops

    two, twenty = ops_per_step(2, 1), ops_per_step(20, 1)
    assert two == twenty
    # step counter + (gather + kernel) per group; without the gather, one op less per group.
    extra = 1 if cls is optim.SGD else 0  # SGD's "fresh buffer" flag from the step counter
    assert two == (3 + extra, 2 + extra)
    assert ops_per_step(20, 2) == (5 + extra, 3 + extra)


def test_views_share_memory_with_flat_buffers(rng):
    opt = optim.Adam([rng.standard_normal((2, 3)).astype(np.float32), np.zeros(4, np.float32)])
    grads = opt.grads
    grads[0][...] = 1.0
    grads[1][...] = -1.0
    before = [p.copy() for p in opt.params]
    opt.step(grads)
    np.testing.assert_allclose(opt.params[0], before[0] - 1e-3, rtol=1e-4)
    np.testing.assert_allclose(opt.params[1], before[1] + 1e-3, rtol=1e-4)


def test_class_skip_if_leaves_params_state_and_counter_untouched(rng):
    params = [rng.standard_normal(5), rng.standard_normal((2, 2)).astype(np.float32)]
    opt = optim.Adam(params, lr=0.1)
    opt.step([np.ones(5), np.ones((2, 2), np.float32)])
    saved = [p.copy() for p in opt.params] + [s.copy() for s in opt.state("exp_avg")]
    bad = [np.array([1, np.nan, 0, 0, 0.0]), np.ones((2, 2), np.float32)]
    with gs.count_syncs() as counter:
        opt.step(bad, skip_if=~optim.all_finite(bad))
        count = opt.step_count
    assert counter.count == 0
    assert int(count) == 1
    for after, before in zip(opt.params + opt.state("exp_avg"), saved, strict=True):
        np.testing.assert_array_equal(after, before)
    opt.step([np.ones(5), np.ones((2, 2), np.float32)], skip_if=gs.asscalar(False))
    assert int(opt.step_count) == 2


def test_sgd_class_skipped_first_step_keeps_buffer_fresh(rng):
    p = rng.standard_normal(4)
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    opt.step([np.full(4, np.inf)], skip_if=gs.asscalar(True))
    g = rng.standard_normal(4)
    opt.step([g])
    np.testing.assert_allclose(opt.state("momentum_buffer")[0], g)  # buf = first real grad
    np.testing.assert_allclose(opt.params[0], p - 0.1 * g)


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


def test_optimizer_bad_input(rng):
    with pytest.raises(TypeError, match="non-empty list of arrays"):
        optim.Adam([])
    with pytest.raises(TypeError, match="not a single array"):
        optim.Adam(np.zeros(3))
    with pytest.raises(TypeError, match=r"params\[1\] must be a NumPy or CuPy array, got list"):
        optim.Adam([np.zeros(3), [1.0, 2.0]])
    with pytest.raises(TypeError, match=r"params\[0\] must be float32 or float64"):
        optim.SGD([np.zeros(3, np.int64)], lr=0.1)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        optim.SGD([np.zeros(3)], lr=-1)
    with pytest.raises(ValueError, match=r"betas\[1\] must be in"):
        optim.Adam([np.zeros(3)], betas=(0.9, 1.5))
    opt = optim.Adam([np.zeros(3), np.zeros((2, 2), np.float32)], lr=0.1)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        opt.lr = -0.5
    assert opt.lr == 0.1
    with pytest.raises(ValueError, match=r"one gradient per parameter \(2\), got 1 arrays"):
        opt.step([np.zeros(3)])
    with pytest.raises(ValueError, match=r"grads\[1\] has shape \(4,\) but params\[1\] has"):
        opt.step([np.zeros(3), np.zeros(4, np.float32)])
    with pytest.raises(TypeError, match=r"grads\[1\] has dtype float64 but params\[1\] has "
                                        "float32"):
        opt.step([np.zeros(3), np.zeros((2, 2))])
    with pytest.raises(KeyError, match="no state 'momentum_buffer'"):
        opt.state("momentum_buffer")
    np.testing.assert_array_equal(opt.params[0], 0)
    assert int(opt.step_count) == 0


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
    """The NumPy evaluator runs exactly the Program's strings: editing a Program's body changes
    the NumPy result, so the CUDA kernel (generated from the same strings) cannot drift."""
    halved = optim.Program(
        name="sgd_half", scalars=optim.SGD_PLAIN.scalars, arrays=optim.SGD_PLAIN.arrays,
        prelude=(), body=(("g", "grad + weight_decay * param"), ("p", "param - lr * g / 2")),
        outputs=optim.SGD_PLAIN.outputs,
    )
    p = np.ones(3)
    optim._run_program(gs.get_backend("numpy"), halved, {"lr": 1.0, "weight_decay": 0.0},
                       {"param": p, "grad": np.ones(3)}, None)
    np.testing.assert_array_equal(p, 0.5)
    source, _ = optim.kernel_source(halved, "float64", [None, None], False)
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


def test_skip_if_costs_one_extra_op_per_step(rng):
    opt = optim.Adam([rng.standard_normal(3), rng.standard_normal(2).astype(np.float32)])
    flag = gs.asscalar(False)
    with gs.count_syncs() as plain:
        opt.step(opt.grads)
    with gs.count_syncs() as skipping:
        opt.step(opt.grads, skip_if=flag)
    assert (plain.device_ops, skipping.device_ops) == (3, 4)
