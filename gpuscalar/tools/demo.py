"""The main job: the same small training loop written twice, and what each costs in syncs.

Why this module exists: it is the shortest honest demonstration of the library. The float path
is written the way people write CuPy code today (`float(loss)`, `if loss < best`, a Python float
learning rate schedule); the gpuscalar path keeps every one of those values on the device and
reads only what is printed. Both compute the same weights; the sync counts differ. The
gpuscalar path also logs its loss every step into a `gs.MetricLog` and shows it in a
`gs.progress` bar, as a user watching the run would, and still reads only those two values.

The timing is honest: both paths run once untimed first (kernel compilation, the first cuBLAS
call and the memory pool's first allocations land there, not on whichever path runs first),
then each is timed several times and the median is reported. Sync counts come from one run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import gpuscalar as gs
from gpuscalar import strict, sync
from gpuscalar.backend import Backend
from gpuscalar.devices import default_backend, describe, get_backend
from gpuscalar.progressbar import TextOutput
from gpuscalar.tools.benchmarks import cpu_note

BACKEND_CHOICES = ("numpy", "strict", "cupy")


def _data(xp: Any, samples: int, features: int) -> tuple[Any, Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(features)
    x = rng.standard_normal((samples, features))
    y = x @ true_w + 0.1 * rng.standard_normal(samples)
    return xp.asarray(x), xp.asarray(y), xp.zeros(features)


def float_path(xp: Any, steps: int, samples: int = 2048,
               features: int = 32) -> tuple[Any, float, float]:
    """What users write today: every loss, comparison and schedule value is a host float.

    The loss is read with ``float(gs.mean(...))``, which is exactly ``float(x.mean())`` but goes
    through gpuscalar's counted read, so the syncs show on NumPy too. Returns the weights, the
    best loss and the mean loss.
    """
    x, y, w = _data(xp, samples, features)
    best = math.inf
    total = 0.0
    for step in range(1, steps + 1):
        residual = x @ w - y
        loss = float(gs.mean(residual * residual))  # one sync per step
        total += loss
        if loss < best:
            best = loss
        lr = 0.1 * min(1.0, step / 10)  # warm-up
        grad = (2.0 / samples) * (x.T @ residual)
        w -= lr * grad
    return w, best, total / steps


#: Rows of the gpuscalar path's loss log: a ring on the device, which its bar drains every
#: quarter of it (16 steps) and before each redraw, so no row is overwritten unread.
LOG_CAPACITY = 64


class _Nowhere:
    """Where the gpuscalar path's bar draws when it is not shown: the bar and its log still run
    (counted and timed), and the lines go nowhere."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def gpuscalar_path(xp: Any, steps: int, samples: int = 2048, features: int = 32, *,
                   show: TextOutput | None = None) -> tuple[Any, float, float]:
    """The same loop with device scalars: the only reads are the two reported values.

    The running best and total start as Python numbers (they join the device expressions as
    kernel arguments: no launch to make them), and the update is one fused SGD kernel
    (`gs.optim.sgd_step`: ``w -= lr * grad`` in one launch, the same arithmetic). The learning
    rate stays what the float path computes, a Python number from the Python step: nothing in
    it comes from the device, so nothing moves there (the capture path, whose step must live
    on the device, computes it there). Every step's loss is recorded into a `gs.MetricLog` (on
    the device: no sync) and a `gs.progress` bar shows the latest row that has reached the
    host, drawn on ``show`` (a file) or nowhere: the log and the bar cost no sync."""
    x, y, w = _data(xp, samples, features)
    best: Any = math.inf
    total: Any = 0.0
    log = gs.MetricLog(capacity=LOG_CAPACITY)
    for step in gs.progress(range(1, steps + 1), log, desc="gpuscalar",
                            file=_Nowhere() if show is None else show):
        residual = x @ w - y
        loss = gs.mean(residual * residual)  # a GPUScalar: no sync
        log.record(loss=loss)  # a row on the device: no sync; the bar shows it when it lands
        total = total + loss
        best = gs.minimum(best, loss)
        lr = 0.1 * min(1.0, step / 10)  # warm-up: as in the float path
        grad = (2.0 / samples) * (x.T @ residual)
        gs.optim.sgd_step(w, grad, lr=lr)  # w -= lr * grad: one launch, no sync
    return w, float(best), float(total / steps)  # the 2 syncs


#: The path whose warm-up run draws its progress bar (on stderr, unless --quiet).
SHOWN = "gpuscalar"

#: Steps recorded into one CUDA graph by the capture path.
CHUNK = 10


def capture_path(xp: Any, steps: int, samples: int = 2048,
                 features: int = 32) -> tuple[Any, float, float]:
    """The gpuscalar path recorded as CUDA graphs of `CHUNK` steps (`gs.capture`), each replayed
    with one launch; leftover steps run eagerly. A graph replays buffers, not Python variables,
    so the state (weights, step counter, total and best loss) lives in device arrays updated
    in place, the products use `gs.matmul` (CuPy's ``@`` refuses cuBLAS inside a capture) and
    the learning rate is computed on the device from the live step counter. The recording
    itself is part of the run, on the clock. On NumPy and the strict device no graph exists:
    each replay re-runs the steps under the sync guard, so the answer is the same everywhere."""
    x, y, w = _data(xp, samples, features)
    step = xp.zeros((), dtype=xp.int64)
    total = xp.zeros((), dtype=w.dtype)
    best = xp.full((), math.inf, dtype=w.dtype)
    residual, grad = xp.empty_like(y), xp.empty_like(w)

    def one_step(w: Any, step: Any, total: Any, best: Any, residual: Any, grad: Any) -> None:
        step += 1  # in place: the arguments are the graph's buffers
        gs.matmul(x, w, out=residual)
        residual -= y
        loss = gs.mean(residual * residual)  # pending: fused into the two kernels below
        total += loss
        xp.minimum(best, loss, out=best)
        lr = 0.1 * gs.minimum(1.0, gs.GPUScalar(step) / 10)  # reads the counter at each replay
        gs.matmul(x.T, residual, out=grad)
        grad *= 2.0 / samples
        w -= lr * grad

    state = (w, step, total, best)
    before = [array.copy() for array in state]
    buffers = (*state, residual, grad)
    replay = gs.capture(one_step, *buffers, warmup=1, steps=CHUNK)
    for array, value in zip(state, before, strict=True):  # undo the warm-up: device copies
        array[...] = value
    for _ in range(steps // CHUNK):
        replay()
    for _ in range(steps % CHUNK):
        one_step(*buffers)
    replay.release()
    return w, float(gs.GPUScalar(best)), float(gs.GPUScalar(total) / steps)  # the 2 syncs


PATHS: dict[str, Callable[..., tuple[Any, float, float]]] = {
    "float": float_path,
    "gpuscalar": gpuscalar_path,
    "gpuscalar + capture": capture_path,
}


def _timed(backend: Backend, path: Callable[..., Any], steps: int) -> float:
    """Seconds for one run of ``path``, including the device work it queued."""
    start = time.perf_counter()
    path(backend.xp, steps)
    backend.synchronize()
    return time.perf_counter() - start


def run(backend: Backend, steps: int, repeats: int = 5, *,
        show: TextOutput | None = None) -> dict[str, Any]:
    """Run every path: one counted run each on the strict device (syncs and device ops, as a
    GPU would see them: every array call is a launch, every host read a sync), one untimed
    warm-up run each on ``backend`` (its answers are the ones reported; the `SHOWN` path's
    draws its progress bar on ``show`` where given), then ``repeats`` timed runs each on
    ``backend`` (median reported)."""
    if type(repeats) is not int or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {sync.describe(repeats)}")
    xp = backend.xp
    results: dict[str, Any] = {"repeats": repeats, "warmup_runs": 1}
    for name, path in PATHS.items():
        counter = sync.SyncCounter(include_cupy=True)  # the device's own reads count too
        with sync._activate(counter):
            path(strict.xp, steps)
        results[name] = {"syncs": counter.count, "device_ops": counter.device_ops}
    for name, path in PATHS.items():  # warm-up: compilation and first calls, on neither clock
        shown = {"show": show} if name == SHOWN and show is not None else {}
        weights, best, mean = path(xp, steps, **shown)
        backend.synchronize()
        results[name].update(weights=weights, best=best, mean=mean)
    for name, path in PATHS.items():
        times = [_timed(backend, path, steps) for _ in range(repeats)]
        results[name]["times"] = times
        results[name]["seconds"] = statistics.median(times)
    reference = results["float"]["weights"]
    for name in PATHS:
        difference = gs.max(xp.abs(results[name]["weights"] - reference))
        results[name]["max_weight_difference"] = float(difference)
    results["max_weight_difference"] = max(results[name]["max_weight_difference"]
                                           for name in PATHS)
    return results


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuscalar demo",
        description="The same training loop three ways: the float path (float(loss) every "
        "step), the gpuscalar path (values stay on the device) and the gpuscalar path captured "
        "as CUDA graphs; prints each path's syncs, device ops and median time.")
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--repeats", type=_positive_int, default=5,
                        help="timed runs of each path after the warm-up (default 5)")
    parser.add_argument("--backend", choices=BACKEND_CHOICES, default=None,
                        help="default: cupy when a GPU is present, else numpy; strict is the "
                        "CuPy-strict CPU device")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar on stderr (the gpuscalar path still logs its "
                        "loss every step and runs the bar, drawing it nowhere)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.backend == "cupy" and not gs.gpu_available():
        parser.error("--backend cupy needs CuPy and a CUDA device; none was found")
    backend = default_backend() if args.backend is None else get_backend(args.backend)
    steps = "1 step" if args.steps == 1 else f"{args.steps} steps"
    print(f"gpuscalar demo: {steps} of linear regression on {describe(backend)}")
    note = cpu_note(backend)
    if note is not None:
        print(textwrap.fill(note, width=100))
    sys.stdout.flush()  # the header before the bar, where stdout and stderr share a terminal
    results = run(backend, args.steps, args.repeats, show=None if args.quiet else sys.stderr)
    width = max(len(name) for name in PATHS) + 2
    print()
    print(f"  {'path':<{width}} {'syncs':>6} {'device ops':>11} {'time (ms)':>10}   answer")
    for name in PATHS:
        row = results[name]
        print(f"  {name:<{width}} {row['syncs']:>6} {row['device_ops']:>11} "
              f"{row['seconds'] * 1e3:>10.1f}   best loss {row['best']:.6f}, "
              f"mean loss {row['mean']:.6f}")
    print()
    print(textwrap.fill(
        "syncs and device ops: counted on the strict device, as a GPU sees them (every array "
        "call is one launch; a graph replay is one). time: "
        + ("1 run" if args.repeats == 1 else f"median of {args.repeats} runs")
        + " of each path after one untimed warm-up run (compilation and "
        "first calls excluded; the capture path's recording is on its clock).", width=100))
    syncs = results[SHOWN]["syncs"]
    print(textwrap.fill(
        f"{SHOWN} path: {syncs} sync{'' if syncs == 1 else 's'} with a progress bar and a "
        "per-step loss log on (each step records its loss on the device, one launch; the bar "
        "shows the latest row that has reached the host, never waiting for one).", width=100))
    difference = results["max_weight_difference"]
    print(f"weights: largest difference from the float path's = {difference:.2e}"
          + (" (bit-identical)" if difference == 0 else ""))
    return 0
