"""RMSprop and Lion against their update equations written out in NumPy (tests/test_optim.py's
`ref_rmsprop`, `ref_lion`): every variant, float32 and float64, classes and functional steps,
device and pending hyperparameters with exact sync and op counts, skipping, the CuPy path
through the recording seam, and bad input. (The shared acceptance, capture, checkpoint and
launch-emulator tests run them too, through `CONFIGS`.)"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import optim

from .cupy_fake import cupy_or_fail, fake_memory
from .cupy_seam import RecordingSeam, covers, recording
from .helpers import backend_name, host
from .test_optim import counting, ref_lion, ref_rmsprop, rel_error

STEPS = 12
SHAPES = [(3, 4), (7,), ()]
#: tolerance against the float64 equations, by the arrays' dtype
TOLERANCE = {np.float32: 2e-6, np.float64: 1e-12}
RMSPROP_VARIANTS = {
    "plain": dict(lr=1e-2, alpha=0.9, eps=1e-8, weight_decay=0.0),
    "weight_decay": dict(lr=1e-2, alpha=0.99, eps=1e-6, weight_decay=0.05),
    "momentum": dict(lr=1e-2, alpha=0.9, eps=1e-8, weight_decay=0.01, momentum=0.9),
    "centered": dict(lr=1e-2, alpha=0.9, eps=1e-8, weight_decay=0.0, centered=True),
    "centered_momentum": dict(lr=5e-3, alpha=0.95, eps=1e-7, weight_decay=0.02, momentum=0.7,
                              centered=True),
}
LION_VARIANTS = {
    "plain": dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0),
    "weight_decay": dict(lr=3e-3, betas=(0.8, 0.95), weight_decay=0.5),
}


def _reference(algorithm: str, kw: dict):
    """The NumPy update for one tensor: ``(p, g, state) -> p`` (state updated)."""
    if algorithm == "lion":
        return lambda p, g, state: ref_lion(p, g, state, kw["lr"], kw["betas"],
                                            kw["weight_decay"])
    return lambda p, g, state: ref_rmsprop(p, g, state, kw["lr"], kw["alpha"], kw["eps"],
                                           kw["weight_decay"], kw.get("momentum", 0.0),
                                           kw.get("centered", False))


CASES = [("rmsprop", name) for name in RMSPROP_VARIANTS] + [("lion", n) for n in LION_VARIANTS]


def _kwargs(algorithm: str, variant: str) -> dict:
    return (RMSPROP_VARIANTS if algorithm == "rmsprop" else LION_VARIANTS)[variant]


def _magnitudes(algorithm: str, kw: dict, p, g, state: dict, sizes: dict) -> None:
    """Update ``sizes``: for the parameter (``"param"``) and each state tensor, the sum of the
    magnitudes of the terms it has added up so far (what bounds a sum's rounding error). Called
    with the float64 reference's ``p`` and ``state`` before ``reference(p, g, state)`` steps."""
    p, g = p.astype(np.float64), g.astype(np.float64)
    size_p = sizes.get("param", np.abs(p))
    if algorithm == "lion":
        b2 = kw["betas"][1]
        sizes["exp_avg"] = b2 * sizes.get("exp_avg", 0.0) + (1 - b2) * np.abs(g)
        sizes["param"] = size_p + kw["lr"] * (1 + kw["weight_decay"] * np.abs(p))
        return
    alpha, eps, wd = kw["alpha"], kw["eps"], kw["weight_decay"]
    grad = g + wd * p
    size_g = np.abs(g) + wd * np.abs(p)
    square = alpha * state.get("square_avg", 0.0) + (1 - alpha) * grad * grad
    sizes["square_avg"] = square  # a sum of nonnegative terms: its own size
    if kw.get("centered"):
        mean = alpha * state.get("grad_avg", 0.0) + (1 - alpha) * grad
        sizes["grad_avg"] = alpha * sizes.get("grad_avg", 0.0) + (1 - alpha) * size_g
        square = square - mean * mean
    step = size_g / (np.sqrt(square) + eps)
    if kw.get("momentum", 0.0):
        step = kw["momentum"] * sizes.get("momentum_buffer", 0.0) + step
        sizes["momentum_buffer"] = step
    sizes["param"] = size_p + kw["lr"] * step


def _tolerance(xp, dtype, sizes, want) -> float:
    """The bound on `rel_error` against the float64 equations. On NumPy and the strict device,
    `TOLERANCE` (NumPy's ufuncs, one rounding per operation). On CuPy the step is one fused
    kernel (CUDA's contractions into FMA, another order), whose rounding errors are as small
    per term but fall elsewhere: a sum's rounding error is bounded relative to the sum of its
    terms' magnitudes, not to the sum, so the bound is `TOLERANCE` (~17 eps of float32) times
    the tensor's condition ``||sum of |terms| || / ||tensor||`` (>= 1; 28 for the 0-d
    momentum buffer of rmsprop-momentum, whose momentum-weighted g / avg nearly cancel: its
    float32 error was 3.3e-6 on an H200, 1.5e-6 on NumPy)."""
    if backend_name(xp) != "cupy":
        return TOLERANCE[dtype]
    norm = float(np.linalg.norm(np.asarray(want, dtype=np.float64)))
    return TOLERANCE[dtype] * max(1.0, float(np.linalg.norm(sizes)) / max(norm, 1e-30))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("algorithm", "variant"), CASES, ids=[f"{a}-{v}" for a, v in CASES])
def test_class_matches_the_equations(xp, rng, algorithm, variant, dtype):
    kw = _kwargs(algorithm, variant)
    cls = optim.RMSprop if algorithm == "rmsprop" else optim.Lion
    init = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    params = [xp.asarray(p) for p in init]
    opt = cls(params, **kw)
    reference = _reference(algorithm, kw)
    ref = [p.astype(np.float64) for p in init]
    ref_state: list[dict] = [{} for _ in SHAPES]
    sizes: list[dict] = [{} for _ in SHAPES]
    grads = [xp.zeros(s, dtype=dtype) for s in SHAPES]
    ops = []
    for _ in range(STEPS):
        host_grads = [(rng.standard_normal(s) + 0.1 * p).astype(dtype)
                      for s, p in zip(SHAPES, ref, strict=True)]
        for g, h in zip(grads, host_grads, strict=True):
            g[...] = xp.asarray(h)
        with counting() as counter:
            opt.step(grads)
        assert counter.count == 0
        ops.append(counter.device_ops)
        for p, h, st, size in zip(ref, host_grads, ref_state, sizes, strict=True):
            _magnitudes(algorithm, kw, p, h, st, size)
        ref = [reference(p, h, st) for p, h, st in zip(ref, host_grads, ref_state, strict=True)]
    assert ops == [3] + [2] * (STEPS - 1)  # one kernel, the counter (+ the table, once)
    for got, want, size in zip(params, ref, sizes, strict=True):
        assert got.dtype == dtype
        assert rel_error(got, want) < _tolerance(xp, dtype, size["param"], want)
    names = opt._program.arrays[2:]
    assert set(names) == set(ref_state[0])  # the state PyTorch keeps for this variant
    for name in names:
        for got, state, size in zip(opt.state(name), ref_state, sizes, strict=True):
            assert rel_error(got, state[name]) < _tolerance(xp, dtype, size[name], state[name])
    assert int(opt.step_count) == STEPS


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("algorithm", "variant"), CASES, ids=[f"{a}-{v}" for a, v in CASES])
def test_functional_step_matches_the_equations(xp, rng, algorithm, variant, dtype):
    kw = _kwargs(algorithm, variant)
    init = rng.standard_normal(33).astype(dtype)
    p = xp.asarray(init)
    if algorithm == "lion":
        state = {"exp_avg": xp.zeros_like(p)}
    else:
        state = {"square_avg": xp.zeros_like(p)}
        if kw.get("momentum"):
            state["momentum_buffer"] = xp.zeros_like(p)
        if kw.get("centered"):
            state["grad_avg"] = xp.zeros_like(p)
    step = optim.lion_step if algorithm == "lion" else optim.rmsprop_step
    ref, ref_state, sizes = init.astype(np.float64), {}, {}
    reference = _reference(algorithm, kw)
    for _ in range(STEPS):
        g = rng.standard_normal(33).astype(dtype)
        device_g = xp.asarray(g)
        with counting() as counter:
            step(p, device_g, **state, **kw)
        assert counter.device_ops == 1 and counter.count == 0
        _magnitudes(algorithm, kw, ref, g, ref_state, sizes)
        ref = reference(ref, g, ref_state)
    assert rel_error(p, ref) < _tolerance(xp, dtype, sizes["param"], ref)
    for name, array in state.items():
        assert rel_error(array, ref_state[name]) < _tolerance(xp, dtype, sizes[name],
                                                              ref_state[name])


def _device_hyperparameters(algorithm: str, like) -> tuple[dict, dict]:
    """GPUScalar hyperparameters but lr, and the numbers they hold."""
    if algorithm == "lion":
        kw = {"betas": (gs.asscalar(0.9, like=like), gs.asscalar(0.99, like=like)),
              "weight_decay": gs.asscalar(0.1, like=like, dtype=np.float64)}
        values = {"betas": (0.9, 0.99), "weight_decay": 0.1}
    else:
        kw = {"alpha": gs.asscalar(0.9, like=like), "eps": gs.asscalar(1e-8, like=like),
              "weight_decay": gs.asscalar(0.01, like=like, dtype=np.float64),
              "momentum": gs.asscalar(0.5, like=like), "centered": True}
        values = {"alpha": 0.9, "eps": 1e-8, "weight_decay": 0.01, "momentum": 0.5,
                  "centered": True}
    return kw, values


@pytest.mark.parametrize("algorithm", ["rmsprop", "lion"])
def test_device_and_pending_hyperparameters_never_sync(xp, rng, algorithm):
    """Every hyperparameter a GPUScalar, lr a pending schedule of the live step counter (the
    kernel computes it: no launch of its own): zero syncs, one kernel + the counter per step."""
    cls = optim.RMSprop if algorithm == "rmsprop" else optim.Lion
    init = rng.standard_normal(40).astype(np.float32)
    p = xp.asarray(init)
    kw, values = _device_hyperparameters(algorithm, p)
    opt = cls([p], lr=0.0, **kw)
    opt.lr = 1e-2 * gs.minimum(1.0, (opt.step_count + 1) / 4)
    g = xp.zeros_like(p)
    ref, state, ops = init.astype(np.float64), {}, []
    for t in range(1, STEPS + 1):
        h = rng.standard_normal(40).astype(np.float32)
        g[...] = xp.asarray(h)
        with counting() as counter:
            opt.step([g])
        assert counter.count == 0
        ops.append(counter.device_ops)
        ref = _reference(algorithm, {**values, "lr": 1e-2 * min(1.0, t / 4)})(ref, h, state)
    assert ops == [3] + [2] * (STEPS - 1)
    assert rel_error(p, ref) < 1e-5


@pytest.mark.parametrize("algorithm", ["rmsprop", "lion"])
def test_skip_if_leaves_everything_untouched(xp, rng, algorithm):
    cls = optim.RMSprop if algorithm == "rmsprop" else optim.Lion
    kw = {"momentum": 0.9, "centered": True} if algorithm == "rmsprop" else {}
    p = xp.asarray(rng.standard_normal(8))
    opt = cls([p], **kw)
    opt.step([xp.asarray(rng.standard_normal(8))])
    before = [np.array(host(p), copy=True)] + [np.array(host(s[0]), copy=True)
                                               for s in map(opt.state, opt._program.arrays[2:])]
    grad = xp.asarray(np.full(8, np.inf))
    with counting() as counter:
        opt.step([grad], skip_if=~optim.all_finite([grad]))
    assert counter.count == 0
    after = [host(p)] + [host(s[0]) for s in map(opt.state, opt._program.arrays[2:])]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(opt.step_count) == 1
    state = ({"exp_avg": xp.zeros_like(p)} if algorithm == "lion" else
             {"square_avg": xp.zeros_like(p), "momentum_buffer": xp.zeros_like(p),
              "grad_avg": xp.zeros_like(p)})
    step = optim.lion_step if algorithm == "lion" else optim.rmsprop_step
    step(p, grad, **state, **kw, skip_if=~optim.all_finite([grad]))
    np.testing.assert_array_equal(host(p), before[0])


def test_rmsprop_momentum_set_to_zero_is_a_plain_step(xp, rng):
    """As PyTorch's: momentum 0 on an RMSprop made with momentum steps without the buffer
    and leaves it as it is (decided on the device for a GPUScalar momentum)."""
    for kind in ("number", "gpuscalar"):
        init = rng.standard_normal(6)
        p, g = xp.asarray(init.copy()), rng.standard_normal(6)
        opt = optim.RMSprop([p], lr=0.1, momentum=0.9)
        opt.momentum = 0.0 if kind == "number" else gs.asscalar(0.0, like=p)
        opt.step([xp.asarray(g)])
        np.testing.assert_allclose(host(p), ref_rmsprop(init, g, {}, 0.1, 0.99, 1e-8, 0, 0,
                                                        False), rtol=1e-12)
        np.testing.assert_array_equal(host(opt.state("momentum_buffer")[0]), 0.0)


def test_lion_moves_every_element_by_lr_and_keeps_a_zero_update():
    """Lion's update is a sign: each element moves by exactly lr (zero where the interpolated
    momentum is zero, NumPy's sign), and NaN stays NaN."""
    p = np.array([1.0, 1.0, 1.0, 1.0])
    optim.lion_step(p, np.array([3.0, -0.5, 0.0, np.nan]), np.zeros(4), lr=0.25)
    np.testing.assert_array_equal(p[:3], [0.75, 1.25, 1.0])
    assert np.isnan(p[3])


def test_bad_input_names_the_argument(rng):
    p = rng.standard_normal(3)
    with pytest.raises(TypeError, match="centered must be a bool"):
        optim.RMSprop([p], centered=1)
    opt = optim.RMSprop([p])
    with pytest.raises(ValueError, match="this RMSprop was made without momentum"):
        opt.momentum = 0.9
    with pytest.raises(ValueError, match="this RMSprop was made without momentum"):
        opt.momentum = gs.asscalar(0.9)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        opt.alpha = -0.1
    with pytest.raises(ValueError, match="momentum_buffer is needed when momentum is not 0"):
        optim.rmsprop_step(p, p.copy(), np.zeros(3), momentum=0.9)
    with pytest.raises(ValueError, match="grad_avg given but centered is False"):
        optim.rmsprop_step(p, p.copy(), np.zeros(3), grad_avg=np.zeros(3))
    with pytest.raises(ValueError, match="square_avg has shape"):
        optim.rmsprop_step(p, p.copy(), np.zeros(4))
    with pytest.raises(ValueError, match=r"betas\[1\] must be in \[0.0, 1.0\)"):
        optim.Lion([p], betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="betas must be a pair"):
        optim.lion_step(p, p.copy(), np.zeros(3), betas=0.9)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        optim.Lion([p], lr=-1.0)


# ---- the CuPy path, through the recording seam -------------------------------------------------


@pytest.fixture
def dev() -> Iterator[RecordingSeam]:
    cupy_or_fail()
    with fake_memory() as memory, recording(memory, compile=True) as seam:
        yield seam


@covers("optim.RMSprop", "optim.Lion")
@pytest.mark.parametrize("make", [
    lambda p: optim.RMSprop(p), lambda p: optim.RMSprop(p, momentum=0.9, centered=True),
    lambda p: optim.Lion(p, weight_decay=0.1),
], ids=["rmsprop", "rmsprop_centered_momentum", "lion"])
def test_a_cupy_step_is_checked_raw_launches_and_no_upload(dev, make):
    """On CuPy a step is the fused kernel and the counter (NVRTC-compiled, every argument
    checked against its parameter), the table write only for new gradient arrays, and never
    a host-to-device copy or a read (so it can be captured)."""
    params = [dev.array(np.ones(n, np.float32)) for n in (5, 3, 7)]
    opt = make(params)
    grads = [dev.array(np.full(p.shape, 0.5, np.float32)) for p in params]
    opt.step(grads)
    dev.clear()
    opt.step(grads)
    assert [launch.name for launch in dev.launches] == [
        f"gpuscalar_{opt._program.name}_float32_mt", "gpuscalar_count_step"]
    assert dev.kinds() == ["raw", "raw"] and not dev.uploads and not dev.reads
    dev.clear()
    opt.lr = gs.asscalar(1e-3, like=params[0]) * gs.minimum(1.0, opt.step_count / 10)
    opt.step([dev.array(np.ones(p.shape, np.float32)) for p in params],
             skip_if=gs.any(grads[0]) > 1.0)
    assert dev.count("raw") == 3 and not dev.uploads and not dev.reads


@covers("optim.rmsprop_step", "optim.lion_step")
def test_cupy_functional_steps_are_one_raw_launch_each(dev):
    p, g, a, b, c = (dev.array(np.ones(5, np.float32)) for _ in range(5))
    lr = gs.asscalar(1e-3, like=p)
    dev.clear()
    optim.rmsprop_step(p, g, a, b, c, lr=lr, momentum=0.9, centered=True)
    assert dev.kinds() == ["raw"] and dev.launches[0].name.startswith("gpuscalar_rmsprop")
    dev.clear()
    optim.lion_step(p, g, a, lr=1e-4, skip_if=gs.any(g) > 1.0)
    assert dev.kinds()[-1] == "raw" and dev.launches[-1].name.startswith("gpuscalar_lion")
    assert not dev.uploads and not dev.reads
