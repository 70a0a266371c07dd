"""The main job: the same small training loop written twice, and what each costs in syncs.

Why this module exists: it is the shortest honest demonstration of the library. The float path
is written the way people write CuPy code today (`float(loss)`, `if loss < best`, a Python float
learning rate schedule); the gpuscalar path keeps every one of those values on the device and
reads only what is printed. Both compute the same weights; the sync counts differ.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import gpuscalar as gs
from gpuscalar.backend import Backend, default_backend, describe, get_backend


def _data(xp: Any, samples: int, features: int) -> tuple[Any, Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(features)
    x = rng.standard_normal((samples, features))
    y = x @ true_w + 0.1 * rng.standard_normal(samples)
    return xp.asarray(x), xp.asarray(y), xp.zeros(features)


def float_path(xp: Any, steps: int, samples: int = 2048, features: int = 32) -> tuple[Any, float]:
    """What users write today: every loss, comparison and schedule value is a host float.

    The loss is read with ``float(gs.mean(...))``, which is exactly ``float(x.mean())`` but goes
    through gpuscalar's counted read, so the syncs show on NumPy too.
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
    print(f"  float path:     best loss {best:.6f}, mean loss {total / steps:.6f}")
    return w, best


def gpuscalar_path(
    xp: Any, steps: int, samples: int = 2048, features: int = 32
) -> tuple[Any, float]:
    """The same loop with device scalars: the only reads are the two printed values."""
    x, y, w = _data(xp, samples, features)
    best = gs.asscalar(math.inf, like=w)
    total = gs.asscalar(0.0, like=w)
    step = gs.asscalar(0.0, like=w)
    for _ in range(steps):
        step = step + 1
        residual = x @ w - y
        loss = gs.mean(residual * residual)  # a GPUScalar: no sync
        total = total + loss
        best = gs.minimum(best, loss)
        lr = 0.1 * gs.minimum(1.0, step / 10)  # warm-up, on the device
        grad = (2.0 / samples) * (x.T @ residual)
        w -= lr * grad  # an array op consuming a device scalar: no sync
    print(f"  gpuscalar path: best loss {best:.6f}, mean loss {total / steps:.6f}")  # 2 syncs
    return w, float(best)


def run(backend: Backend, steps: int) -> dict[str, Any]:
    """Run both paths on ``backend``; return syncs, times and whether the answers agree."""
    xp = backend.xp
    results: dict[str, Any] = {}
    for name, path in (("float", float_path), ("gpuscalar", gpuscalar_path)):
        with gs.count_syncs() as counter:
            start = time.perf_counter()
            weights, best = path(xp, steps)
            if backend.name == "cupy":
                xp.cuda.Device().synchronize()
            elapsed = time.perf_counter() - start
        results[name] = {
            "syncs": counter.count,
            "device_ops": counter.device_ops,
            "seconds": elapsed,
            "weights": weights,
            "best": best,
        }
    difference = gs.max(xp.abs(results["float"]["weights"] - results["gpuscalar"]["weights"]))
    results["max_weight_difference"] = float(difference)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuscalar demo", description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--backend", choices=("numpy", "cupy"), default=None,
                        help="default: cupy when a GPU is present, else numpy")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.backend == "cupy" and not gs.gpu_available():
        parser.error("--backend cupy needs CuPy and a CUDA device; none was found")
    backend = default_backend() if args.backend is None else get_backend(args.backend)
    print(f"gpuscalar demo: {args.steps} steps of linear regression on {describe(backend)}")
    results = run(backend, args.steps)
    print()
    print(f"  {'path':<10} {'syncs':>6} {'time (ms)':>10}")
    for name in ("float", "gpuscalar"):
        row = results[name]
        print(f"  {name:<10} {row['syncs']:>6} {row['seconds'] * 1e3:>10.1f}")
    print(f"\n  max |w_float - w_gpuscalar| = {results['max_weight_difference']:.2e}")
    return 0
