"""Benchmark workloads, each written twice: the float path people write today, and gpuscalar's.

Why this module exists: a claim like "gpuscalar removes syncs" is only worth something on code
that users really write. Each workload here is a small, complete loop (training with loss
logging, gradient clipping + Adam, a broadcasted AD backward, a convergence loop, a learning-rate
schedule, a training loop with the loss accumulated every step) in three versions that compute
the same answer:

- the *float path* reads device values into Python the usual way (``float(x.sum())``,
  ``int(step)``, Python ``if``/``min`` on device values), one sync each on a GPU;
- the *gpuscalar path* keeps those values on the device as `GPUScalar`s and reads only what the
  host really needs (``host_values_needed``, stated per workload with the reason);
- the *capture path* is the gpuscalar path with its steps recorded as CUDA graphs
  (`gpuscalar.capture`) and replayed, a chunk of steps per launch, between the host's reads;
  its state lives in buffers updated in place, as a graph needs.

They live in the package, not in the repository's ``bench/`` folder, because both the
``gpuscalar bench`` command of an installed package and the pytest-benchmark suite in ``bench/``
import them. Every path takes the array module ``xp`` (NumPy, CuPy, or the counting device of
`gpuscalar.benchmarks`), the inputs made by `Workload.make_inputs`, and the size parameters; it
never mutates its inputs, and returns a dict answer: Python floats/ints for values the host
needs, device arrays for the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import CapturedStep, capture, matmul
from .. import math as gsm
from .. import reduce as gsr
from .. import scalar as gss
from ..optim import Adam, clip_grad_norm, sgd_step
from ..sync import describe
from . import solvers

__all__ = ["Workload", "WORKLOADS", "SIZES", "PATHS", "get_workload", "warmup_cosine"]

#: The versions of every workload, in table order.
PATHS: tuple[str, ...] = ("float", "gpuscalar", "capture")
#: Size presets: "quick" for tests and ``gpuscalar bench --quick``, "default" for the real run.
SIZES: tuple[str, str] = ("quick", "default")

Params = Mapping[str, Any]
Inputs = dict[str, Any]
Answer = dict[str, Any]
#: The array module ``xp`` a path computes with: ``numpy``, ``cupy`` or `gpuscalar.strict.xp`
#: (a namespace object standing for a module, so not a `types.ModuleType`).
ArrayModule = Any


@dataclass(frozen=True)
class Workload:
    """One benchmark workload: both paths, how to make inputs, and what the host really needs."""

    name: str
    description: str
    make_inputs: Callable[[ArrayModule, Params], Inputs]
    float_path: Callable[..., Answer]
    gpuscalar_path: Callable[..., Answer]
    capture_path: Callable[..., Answer]
    #: params -> the number of values this workload really needs on the host
    host_values_needed: Callable[[Params], int]
    #: why the host needs exactly those values (shown in the JSON and the README)
    host_values_reason: str
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    validate: Callable[[Params], None] = lambda params: None
    #: whether the capture path is one `gs.while_loop` (the device decides when to stop: it
    #: reads nothing on the host, where the other paths read a decision per check)
    loop_on_device: bool = False

    def params(self, size: str = "default", **overrides: Any) -> dict[str, Any]:
        """The parameters of a size preset, with ``overrides`` applied and validated."""
        if size not in self.sizes:
            raise ValueError(f"workload {self.name!r}: unknown size {size!r}; expected {SIZES}")
        params = {**self.sizes[size], **overrides}
        unknown = set(params) - set(self.sizes[size])
        if unknown:
            raise TypeError(f"workload {self.name!r}: unknown parameter(s) {sorted(unknown)}")
        self.validate(params)
        return params

    def path(self, path: str) -> Callable[..., Answer]:
        """The function of one version: ``"float"``, ``"gpuscalar"`` or ``"capture"``."""
        if path not in PATHS:
            raise ValueError(f"unknown workload path {path!r}; expected one of {PATHS}")
        return getattr(self, f"{path}_path")

    def run(
        self, path: str, xp: ArrayModule, params: Params, inputs: Inputs | None = None
    ) -> Answer:
        """Run one version on ``xp`` (making fresh inputs when none are given)."""
        function = self.path(path)
        if inputs is None:
            inputs = self.make_inputs(xp, params)
        return function(xp, inputs, **params)


def _positive_ints(params: Params, *names: str) -> None:
    for name in names:
        value = params[name]
        if type(value) is not int or value < 1:
            raise ValueError(
                f"parameter {name!r} must be a positive int, got {describe(value)}")


def _positive_number(params: Params, name: str) -> None:
    """A host number > 0 (a device value would be compared, and named, by a sync)."""
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"parameter {name!r} must be a number > 0, got {describe(value)}")


def _rng(params: Params) -> np.random.Generator:
    return np.random.default_rng(params.get("seed", 0))


def _captured(step: Callable[[], Any], state: list[Any], steps: int = 1) -> CapturedStep:
    """``gs.capture(step, warmup=1, steps=steps)`` with its warm-up run undone: the ``state``
    arrays the step updates in place are restored from copies taken before (device copies, no
    sync), so the capture path computes exactly the steps the other paths compute.

    The state arrays are passed to `capture` (and ignored by the step) so that the step is
    placed on their backend and device: ``step`` reaches its arrays only through other
    functions, which capture cannot see, and would otherwise be placed on the default backend
    (CuPy wherever a GPU is present, even for a NumPy or strict-device run)."""
    saved = [array.copy() for array in state]
    captured = capture(lambda *arrays: step(), *state, warmup=1, steps=steps)
    for array, value in zip(state, saved, strict=True):
        array[...] = value
    return captured


def _repeated(step: Callable[[], None], times: int) -> Callable[[], None]:
    """``step`` run ``times`` times in a row: the body of one captured chunk of steps."""

    def chunk() -> None:
        for _ in range(times):
            step()

    return chunk


def _chunks(total: int, size: int) -> tuple[int, int]:
    """(full chunks of ``size`` steps, steps left over) for ``total`` steps."""
    return total // size, total % size


# ---- (a) training loop with per-step loss logging -----------------------------------------


def _regression_inputs(xp: ArrayModule, params: Params) -> Inputs:
    rng = _rng(params)
    n, d = params["n"], params["d"]
    x = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d)
    y = x @ w_true + 0.1 * rng.standard_normal(n)
    return {"X": xp.asarray(x), "y": xp.asarray(y)}


def train_logging_float(xp: ArrayModule, inputs: Inputs, *, n: int, d: int, steps: int,
                        log_every: int, lr: float, seed: int = 0) -> Answer:
    """SGD on least squares; every step's loss becomes a Python float and is accumulated."""
    X, y = inputs["X"], inputs["y"]
    w = xp.zeros(d, dtype=X.dtype)
    logged, running = [], 0.0
    for step in range(1, steps + 1):
        err = X @ w - y
        running += float((err * err).mean())  # one sync per step
        if step % log_every == 0:
            logged.append(running / log_every)
            running = 0.0
        w -= (2.0 * lr / n) * (X.T @ err)
    return {"w": w, "logged": logged}


def train_logging_gpuscalar(xp: ArrayModule, inputs: Inputs, *, n: int, d: int, steps: int,
                            log_every: int, lr: float, seed: int = 0) -> Answer:
    """The same loop; the running loss is a GPUScalar expression, read once per logged window,
    and the update is gpuscalar's fused SGD step (one kernel for ``w -= c * grad``)."""
    X, y = inputs["X"], inputs["y"]
    w = xp.zeros(d, dtype=X.dtype)
    logged: list[float] = []
    running: float | gss.GPUScalar = 0.0  # a GPUScalar from the first step on
    for step in range(1, steps + 1):
        err = X @ w - y
        running = running + gsr.mean(err * err)  # a pending sum: no launch of its own
        if step % log_every == 0:
            logged.append(float(running) / log_every)  # the one sync (and launch) of a window
            running = 0.0
        sgd_step(w, X.T @ err, lr=2.0 * lr / n)
    return {"w": w, "logged": logged}


def train_logging_capture(xp: ArrayModule, inputs: Inputs, *, n: int, d: int, steps: int,
                          log_every: int, lr: float, seed: int = 0) -> Answer:
    """The gpuscalar loop with each logging window (``log_every`` steps, the running loss
    reset first) recorded as one CUDA graph: one launch per window, one read after it."""
    X, y = inputs["X"], inputs["y"]
    w = xp.zeros(d, dtype=X.dtype)
    running = xp.zeros((), dtype=X.dtype)

    def step() -> None:
        err = matmul(X, w) - y
        running[...] += gsr.mean(err * err)
        sgd_step(w, matmul(X.T, err), lr=2.0 * lr / n)

    def window() -> None:
        running[...] = 0.0
        for _ in range(log_every):
            step()

    windows, rest = _chunks(steps, log_every)
    replay = _captured(window, [w, running])
    logged = []
    for _ in range(windows):
        replay()
        logged.append(float(gss.GPUScalar(running)) / log_every)  # the window's one sync
    for _ in range(rest):
        step()
    return {"w": w, "logged": logged}


def _validate_train(params: Params) -> None:
    _positive_ints(params, "n", "d", "steps", "log_every")


# ---- (b) gradient clipping + Adam ---------------------------------------------------------


def _clip_inputs(xp: ArrayModule, params: Params) -> Inputs:
    rng = _rng(params)
    shapes = params["shapes"]
    return {
        "params": [xp.asarray(rng.standard_normal(s)) for s in shapes],
        "targets": [xp.asarray(rng.standard_normal(s)) for s in shapes],
    }


def _gradients(params: list[Any], targets: list[Any], scale: float) -> list[Any]:
    # gradient of sum(0.5 * scale * (p - target)**2): large at first, so clipping engages
    return [scale * (p - t) for p, t in zip(params, targets, strict=True)]


def _adam_update(xp: ArrayModule, p: Any, g: Any, m: Any, v: Any, t: int, lr: float,
                 betas: tuple[float, float], eps: float) -> None:
    """Plain elementwise Adam with a host step count (no sync in either path)."""
    b1, b2 = betas
    m *= b1
    m += (1.0 - b1) * g
    v *= b2
    v += (1.0 - b2) * (g * g)
    denom = xp.sqrt(v / (1.0 - b2**t)) + eps
    p -= (lr / (1.0 - b1**t)) * m / denom


def clip_adam_float(xp: ArrayModule, inputs: Inputs, *, shapes: tuple, steps: int, scale: float,
                    max_norm: float, lr: float, betas: tuple[float, float], eps: float,
                    seed: int = 0) -> Answer:
    """Global-norm clipping as commonly written: one ``float()`` per gradient array, then a
    Python ``min`` and ``if`` on the host, then Adam."""
    params = [p.copy() for p in inputs["params"]]
    moments = [(xp.zeros_like(p), xp.zeros_like(p)) for p in params]
    total = 0.0
    for t in range(1, steps + 1):
        grads = _gradients(params, inputs["targets"], scale)
        total = math.sqrt(sum(float((g * g).sum()) for g in grads))  # one sync per array
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0:
            for g in grads:
                g *= coef
        for p, g, (m, v) in zip(params, grads, moments, strict=True):
            _adam_update(xp, p, g, m, v, t, lr, betas, eps)
    return {"params": params, "last_norm": total}


def clip_adam_gpuscalar(xp: ArrayModule, inputs: Inputs, *, shapes: tuple, steps: int,
                        scale: float, max_norm: float, lr: float, betas: tuple[float, float],
                        eps: float, seed: int = 0) -> Answer:
    """The same step with `gpuscalar.optim.clip_grad_norm` (device norm, device clip factor);
    the last gradient norm is read once at the end."""
    params = [p.copy() for p in inputs["params"]]
    moments = [(xp.zeros_like(p), xp.zeros_like(p)) for p in params]
    for t in range(1, steps + 1):  # steps >= 1 (_validate_clip): norm is always set
        grads = _gradients(params, inputs["targets"], scale)
        norm = clip_grad_norm(grads, max_norm)
        for p, g, (m, v) in zip(params, grads, moments, strict=True):
            _adam_update(xp, p, g, m, v, t, lr, betas, eps)
    return {"params": params, "last_norm": float(norm)}  # the one sync


def clip_adam_capture(xp: ArrayModule, inputs: Inputs, *, shapes: tuple, steps: int,
                      scale: float, max_norm: float, lr: float, betas: tuple[float, float],
                      eps: float, seed: int = 0) -> Answer:
    """Clipping + Adam as CUDA graphs of ten steps: the gradients are written into fixed
    buffers, Adam's step count lives on the device (`gpuscalar.optim.Adam`), and the last
    norm is read once at the end."""
    params = [p.copy() for p in inputs["params"]]
    grads = [xp.zeros_like(p) for p in params]
    opt = Adam(params, lr=lr, betas=betas, eps=eps)

    def step() -> Any:
        for g, p, t in zip(grads, params, inputs["targets"], strict=True):
            xp.subtract(p, t, out=g)
            g *= scale
        norm = clip_grad_norm(grads, max_norm)
        opt.step(grads)
        return norm

    chunks, rest = _chunks(steps, 10)
    checkpoint = opt.state_dict()
    replay = _captured(lambda: [step() for _ in range(10)][-1], params)
    opt.load_state_dict(checkpoint)
    for _ in range(chunks):  # steps >= 1 (_validate_clip): norm is always set
        norm = replay()
    for _ in range(rest):
        norm = step()
    return {"params": params, "last_norm": float(norm)}  # the one sync


def _validate_clip(params: Params) -> None:
    _positive_ints(params, "steps")
    if not params["shapes"]:
        raise ValueError("parameter 'shapes' must name at least one parameter array")
    _positive_number(params, "max_norm")


# ---- (c) AD backward over broadcasted ops with scalar parameters --------------------------


def _ad_inputs(xp: ArrayModule, params: Params) -> Inputs:
    rng = _rng(params)
    rows, cols = params["rows"], params["cols"]
    x = rng.uniform(-1.0, 1.0, (rows, cols))
    target = 1.5 * x - 0.5 + 0.3 * rng.standard_normal(cols) + 0.05 * rng.standard_normal(
        (rows, cols)
    )
    return {"x": xp.asarray(x), "target": xp.asarray(target)}


def broadcast_ad_float(xp: ArrayModule, inputs: Inputs, *, rows: int, cols: int, steps: int,
                       lr: float, seed: int = 0) -> Answer:
    """Model ``a * x + b + s`` (scalars a, b; row vector s). The backward of a broadcasted
    scalar is a full sum, read into a Python float as AD libraries do (two syncs per step)."""
    x, target = inputs["x"], inputs["target"]
    a, b = 0.0, 0.0
    s = xp.zeros(cols, dtype=x.dtype)
    scale = 2.0 / (rows * cols)
    for _ in range(steps):
        dpred = scale * (a * x + b + s - target)  # d loss / d pred for the mean squared error
        grad_a = float((dpred * x).sum())
        grad_b = float(dpred.sum())
        grad_s = dpred.sum(axis=0)
        a -= lr * grad_a
        b -= lr * grad_b
        s -= lr * grad_s
    return {"a": a, "b": b, "s": s}


def broadcast_ad_gpuscalar(xp: ArrayModule, inputs: Inputs, *, rows: int, cols: int, steps: int,
                           lr: float, seed: int = 0) -> Answer:
    """The same backward with `gpuscalar.unbroadcast`: the scalar gradients stay on the device,
    and the scalar updates are expressions computed inside the next step's array kernels. The
    row vector's update is gpuscalar's fused SGD step."""
    x, target = inputs["x"], inputs["target"]
    a = b = 0.0
    s = xp.zeros(cols, dtype=x.dtype)
    scale = 2.0 / (rows * cols)
    for _ in range(steps):
        dpred = scale * (a * x + b + s - target)
        a = a - lr * gsr.unbroadcast(dpred * x, ())
        b = b - lr * gsr.unbroadcast(dpred, ())
        sgd_step(s, gsr.unbroadcast(dpred, s.shape), lr=lr)
    return {"a": float(a), "b": float(b), "s": s}  # the fitted scalars: two syncs


def broadcast_ad_capture(xp: ArrayModule, inputs: Inputs, *, rows: int, cols: int, steps: int,
                         lr: float, seed: int = 0) -> Answer:
    """The same backward, ten steps per CUDA graph: the scalars a and b are 0-d device arrays
    updated in place by their device gradients."""
    x, target = inputs["x"], inputs["target"]
    a, b = xp.zeros((), dtype=x.dtype), xp.zeros((), dtype=x.dtype)
    s = xp.zeros(cols, dtype=x.dtype)
    scale = 2.0 / (rows * cols)

    def step() -> None:
        dpred = scale * (a * x + b + s - target)
        a[...] -= lr * gsr.unbroadcast(dpred * x, ())
        b[...] -= lr * gsr.unbroadcast(dpred, ())
        sgd_step(s, gsr.unbroadcast(dpred, s.shape), lr=lr)

    chunks, rest = _chunks(steps, 10)
    replay = _captured(_repeated(step, 10), [a, b, s])
    for _ in range(chunks):
        replay()
    for _ in range(rest):
        step()
    return {"a": float(gss.GPUScalar(a)), "b": float(gss.GPUScalar(b)), "s": s}  # two syncs


def _validate_ad(params: Params) -> None:
    _positive_ints(params, "rows", "cols", "steps")


# ---- (d) convergence loops: Jacobi and conjugate gradient (their paths: tools/solvers.py) ----


def _validate_jacobi(params: Params) -> None:
    _positive_ints(params, "problems", "n", "max_iter", "check_every")
    _positive_number(params, "tol")


def _validate_cg(params: Params) -> None:
    _positive_ints(params, "n", "max_iter", "check_every")
    _positive_number(params, "tol")


# ---- (e) learning-rate schedule: warm-up + cosine -----------------------------------------


def _schedule_inputs(xp: ArrayModule, params: Params) -> Inputs:
    rng = _rng(params)
    n = params["n"]
    return {"w0": xp.asarray(rng.standard_normal(n)), "target": xp.asarray(rng.standard_normal(n))}


def warmup_cosine(xp: ArrayModule, step: Any, *, steps: int, warmup: int, base_lr: float,
                  min_lr: float) -> Any:
    """Warm-up then cosine decay of the learning rate at ``step`` (1-based): a GPUScalar for
    a device step counter, an array for an array of steps (one formula for both)."""
    warm = base_lr * step / warmup
    progress = (step - warmup) / (steps - warmup)
    cosine = min_lr + 0.5 * (base_lr - min_lr) * (1.0 + gsm.cos(math.pi * progress))
    return gsm.where(step <= warmup, warm, cosine)


def lr_schedule_float(xp: ArrayModule, inputs: Inputs, *, n: int, steps: int, warmup: int,
                      base_lr: float, min_lr: float, seed: int = 0) -> Answer:
    """The step counter lives on the device with the optimizer state (as in fused/capturable
    optimizers); the float path reads it every step to compute the rate with Python math."""
    w = inputs["w0"].copy()
    step = xp.zeros((), dtype=xp.int64)
    rates = []
    for _ in range(steps):
        step += 1
        t = int(step)  # one sync per step
        if t <= warmup:
            lr = base_lr * t / warmup
        else:
            progress = (t - warmup) / (steps - warmup)
            lr = min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
        rates.append(lr)
        w -= lr * (w - inputs["target"])
    return {"w": w, "lr": rates}


def lr_schedule_gpuscalar(xp: ArrayModule, inputs: Inputs, *, n: int, steps: int, warmup: int,
                          base_lr: float, min_lr: float, seed: int = 0) -> Answer:
    """The same schedule computed from a device step counter: a pending expression that the
    fused SGD step computes in its own kernel, so a step is two launches (the gradient and the
    update) and no sync. The trace of rates is the same formula over all steps at once."""
    w = inputs["w0"].copy()
    step = gss.asscalar(0, like=w, dtype=np.int64)
    schedule: Params = {"steps": steps, "warmup": warmup, "base_lr": base_lr, "min_lr": min_lr}
    for _ in range(steps):
        step = step + 1  # stays one node however many steps it counts
        sgd_step(w, w - inputs["target"], lr=warmup_cosine(xp, step, **schedule))
    rates = warmup_cosine(xp, xp.arange(1, steps + 1, dtype=xp.int64), **schedule)
    return {"w": w, "lr": rates}


def lr_schedule_capture(xp: ArrayModule, inputs: Inputs, *, n: int, steps: int, warmup: int,
                        base_lr: float, min_lr: float, seed: int = 0) -> Answer:
    """The same schedule in CUDA graphs of ten steps: the step counter is a 0-d device array
    incremented in place, and the schedule reads it inside the fused update at every replay."""
    w = inputs["w0"].copy()
    count = xp.zeros((), dtype=xp.int64)
    schedule: Params = {"steps": steps, "warmup": warmup, "base_lr": base_lr, "min_lr": min_lr}

    def step() -> None:
        count[...] += 1
        lr = warmup_cosine(xp, gss.GPUScalar(count), **schedule)  # read when the kernel runs
        sgd_step(w, w - inputs["target"], lr=lr)

    chunks, rest = _chunks(steps, 10)
    replay = _captured(_repeated(step, 10), [w, count])
    for _ in range(chunks):
        replay()
    for _ in range(rest):
        step()
    rates = warmup_cosine(xp, xp.arange(1, steps + 1, dtype=xp.int64), **schedule)
    return {"w": w, "lr": rates}


def _validate_schedule(params: Params) -> None:
    _positive_ints(params, "n", "steps", "warmup")
    if params["warmup"] >= params["steps"]:
        raise ValueError(
            f"parameter 'warmup' ({params['warmup']}) must be smaller than 'steps' "
            f"({params['steps']})"
        )


# ---- (f) training with the loss accumulated every step ----------------------------------------


def train_total_float(xp: ArrayModule, inputs: Inputs, *, n: int, d: int, steps: int, lr: float,
                      seed: int = 0) -> Answer:
    """Least-squares SGD, ``total += float(loss)`` every step (the loop the H100 graph figures
    were measured on)."""
    X, y = inputs["X"], inputs["y"]
    w = xp.zeros(d, dtype=X.dtype)
    total = 0.0
    for _ in range(steps):
        err = X @ w - y
        total += float((err * err).mean())  # one sync per step
        w -= (2.0 * lr / n) * (X.T @ err)
    return {"w": w, "total": total}


def train_total_gpuscalar(xp: ArrayModule, inputs: Inputs, *, n: int, d: int, steps: int,
                          lr: float, seed: int = 0) -> Answer:
    """The same loop with the total kept on the device (read once) and the fused SGD step."""
    X, y = inputs["X"], inputs["y"]
    w = xp.zeros(d, dtype=X.dtype)
    total: float | gss.GPUScalar = 0.0
    for _ in range(steps):
        err = X @ w - y
        total = total + gsr.mean(err * err)
        sgd_step(w, X.T @ err, lr=2.0 * lr / n)
    return {"w": w, "total": float(total)}  # the one sync


def train_total_capture(xp: ArrayModule, inputs: Inputs, *, n: int, d: int, steps: int,
                        lr: float, seed: int = 0) -> Answer:
    """Ten steps per CUDA graph (products by gs.matmul), the total a 0-d device array."""
    X, y = inputs["X"], inputs["y"]
    w = xp.zeros(d, dtype=X.dtype)
    total = xp.zeros((), dtype=X.dtype)

    def step() -> None:
        err = matmul(X, w) - y
        total[...] += gsr.mean(err * err)
        sgd_step(w, matmul(X.T, err), lr=2.0 * lr / n)

    chunks, rest = _chunks(steps, 10)
    replay = _captured(_repeated(step, 10), [w, total])
    for _ in range(chunks):
        replay()
    for _ in range(rest):
        step()
    return {"w": w, "total": float(gss.GPUScalar(total))}  # the one sync


def _validate_total(params: Params) -> None:
    _positive_ints(params, "n", "d", "steps")


# ---- the registry -------------------------------------------------------------------------

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            name="train_logging",
            description="least-squares SGD, loss logged as a window mean every log_every steps",
            make_inputs=_regression_inputs,
            float_path=train_logging_float,
            gpuscalar_path=train_logging_gpuscalar,
            capture_path=train_logging_capture,
            host_values_needed=lambda p: p["steps"] // p["log_every"],
            host_values_reason="one logged mean loss per window of log_every steps",
            sizes={
                "quick": dict(n=256, d=16, steps=100, log_every=25, lr=0.05),
                "default": dict(n=2048, d=64, steps=400, log_every=50, lr=0.05),
            },
            validate=_validate_train,
        ),
        Workload(
            name="clip_adam",
            description="global-norm gradient clipping + Adam over several parameter arrays",
            make_inputs=_clip_inputs,
            float_path=clip_adam_float,
            gpuscalar_path=clip_adam_gpuscalar,
            capture_path=clip_adam_capture,
            host_values_needed=lambda p: 1,
            host_values_reason=(
                "the last gradient norm, for a log line; the clip decision itself is a device "
                "min(1, max_norm / norm) factor"
            ),
            sizes={
                "quick": dict(shapes=((32, 16), (16,), (16, 4), (4,)), steps=30, scale=10.0,
                              max_norm=1.0, lr=0.01, betas=(0.9, 0.999), eps=1e-8),
                "default": dict(shapes=((256, 128), (128,), (128, 128), (128,), (128, 10), (10,)),
                                steps=100, scale=10.0, max_norm=1.0, lr=0.01,
                                betas=(0.9, 0.999), eps=1e-8),
            },
            validate=_validate_clip,
        ),
        Workload(
            name="broadcast_ad",
            description="backward of a * x + b + s: scalar gradients of broadcasted operands",
            make_inputs=_ad_inputs,
            float_path=broadcast_ad_float,
            gpuscalar_path=broadcast_ad_gpuscalar,
            capture_path=broadcast_ad_capture,
            host_values_needed=lambda p: 2,
            host_values_reason="the two fitted scalar parameters a and b, read once at the end",
            sizes={
                "quick": dict(rows=128, cols=16, steps=60, lr=0.5),
                "default": dict(rows=1024, cols=64, steps=300, lr=0.5),
            },
            validate=_validate_ad,
        ),
        Workload(
            name="jacobi",
            description="Jacobi on independent diagonally dominant systems until residual < tol",
            make_inputs=solvers.jacobi_inputs,
            float_path=solvers.jacobi_float,
            gpuscalar_path=solvers.jacobi_gpuscalar,
            capture_path=solvers.jacobi_capture,
            host_values_needed=lambda p: -(-p["max_iter"] // p["check_every"]),
            host_values_reason=(
                "one 'is any system still active?' decision per check, at most "
                "ceil(max_iter / check_every) checks"
            ),
            sizes={
                "quick": dict(problems=4, n=16, tol=1e-8, max_iter=400, check_every=8),
                "default": dict(problems=8, n=64, tol=1e-10, max_iter=600, check_every=10),
            },
            validate=_validate_jacobi,
            loop_on_device=True,
        ),
        Workload(
            name="cg",
            description="conjugate gradient on an SPD system until the residual norm < tol",
            make_inputs=solvers.cg_inputs,
            float_path=solvers.cg_float,
            gpuscalar_path=solvers.cg_gpuscalar,
            capture_path=solvers.cg_capture,
            host_values_needed=lambda p: -(-p["max_iter"] // p["check_every"]) + 1,
            host_values_reason=(
                "one 'still active?' decision per check, at most ceil(max_iter / check_every) "
                "checks, and the iteration count, read at the end"
            ),
            sizes={
                "quick": dict(n=64, tol=1e-8, max_iter=200, check_every=5),
                "default": dict(n=512, tol=1e-10, max_iter=1000, check_every=10),
            },
            validate=_validate_cg,
            loop_on_device=True,
        ),
        Workload(
            name="lr_schedule",
            description="warm-up + cosine learning rate from a device step counter, SGD update",
            make_inputs=_schedule_inputs,
            float_path=lr_schedule_float,
            gpuscalar_path=lr_schedule_gpuscalar,
            capture_path=lr_schedule_capture,
            host_values_needed=lambda p: 0,
            host_values_reason=(
                "none: the rate only feeds the device update, and the trace of rates is "
                "returned as one device array"
            ),
            sizes={
                "quick": dict(n=64, steps=100, warmup=10, base_lr=0.1, min_lr=0.001),
                "default": dict(n=4096, steps=500, warmup=50, base_lr=0.1, min_lr=0.001),
            },
            validate=_validate_schedule,
        ),
        Workload(
            name="train_total",
            description="least-squares SGD with the loss accumulated every step, read at the end",
            make_inputs=_regression_inputs,
            float_path=train_total_float,
            gpuscalar_path=train_total_gpuscalar,
            capture_path=train_total_capture,
            host_values_needed=lambda p: 1,
            host_values_reason="the total loss, read once at the end",
            sizes={
                "quick": dict(n=256, d=16, steps=100, lr=0.05),
                "default": dict(n=1024, d=64, steps=2000, lr=0.05),
            },
            validate=_validate_total,
        ),
    )
}


def get_workload(name: str) -> Workload:
    """The registered workload called ``name``; a `ValueError` lists the known names."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; expected one of {', '.join(WORKLOADS)}"
        ) from None
