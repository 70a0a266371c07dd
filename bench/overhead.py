"""Per-op overhead of GPUScalar arithmetic over the raw backend 0-d op, as a ratio.

Run ``python bench/overhead.py`` (NumPy here; ``--backend cupy`` on a GPU). On NumPy the raw
0-d op costs a few hundred nanoseconds, so this measures gpuscalar's Python overhead at its most
visible; on CuPy each op is a kernel launch (~10 µs of CPU time) and the ratio shrinks.
Target: <= 2x for ``s + 1.0`` and ``s * t``.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import gpuscalar as gs
from gpuscalar.backend import get_backend


def cases(xp: Any) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """name -> (gpuscalar op, raw backend op on 0-d arrays)."""
    a, b = xp.asarray(1.5), xp.asarray(2.5)
    s, t = gs.GPUScalar(a), gs.GPUScalar(b)
    return {
        "s + 1.0": (lambda: s + 1.0, lambda: a + 1.0),
        "s * t": (lambda: s * t, lambda: a * b),
        "s < t": (lambda: s < t, lambda: a < b),
        "-s": (lambda: -s, lambda: -a),
        "gs.sqrt(s)": (lambda: gs.sqrt(s), lambda: xp.sqrt(a)),
    }


def best_time(function: Callable[[], Any], number: int, repeat: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=repeat)) / number


def measure(backend_name: str = "numpy", number: int = 20000, repeat: int = 7) -> dict[str, dict]:
    xp = get_backend(backend_name).xp
    results = {}
    for name, (ours, raw) in cases(xp).items():
        ours_s, raw_s = best_time(ours, number, repeat), best_time(raw, number, repeat)
        results[name] = {"gpuscalar_ns": ours_s * 1e9, "raw_ns": raw_s * 1e9,
                         "ratio": ours_s / raw_s}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    args = parser.parse_args()
    print(f"{'op':<12} {'gpuscalar':>12} {'raw 0-d op':>12} {'ratio':>7}")
    for name, row in measure(args.backend).items():
        print(f"{name:<12} {row['gpuscalar_ns']:>10.0f}ns {row['raw_ns']:>10.0f}ns "
              f"{row['ratio']:>6.2f}x")


if __name__ == "__main__":
    main()
