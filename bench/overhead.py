"""Per-op cost of GPUScalar arithmetic against the raw backend 0-d op, and of one host read.

Run ``python bench/overhead.py`` (NumPy here; ``--backend cupy`` on a GPU; ``--json FILE`` also
writes the numbers). For each operation it times:

- *lazy*: recording the operation as a pending expression (the default mode): no launch, so on
  every backend this is gpuscalar's own Python cost. Target: <= 1 us per node on the CI machine,
  far below a CuPy launch (~10 us);
- *eager*: one backend call per operation (``gs.lazy(False)``), the 0.1.0 behaviour;
- *raw*: the same operation on the backend's 0-d arrays directly.

On NumPy the raw op costs a few hundred nanoseconds, so the ratios show gpuscalar's overhead at
its most visible; on CuPy each raw or eager op is a kernel launch. The operators come first
(``ops``), then the helpers and NumPy ufuncs on GPUScalars (``helpers``: ``gs.minimum``,
``gs.where``, ``np.minimum`` through ``__array_ufunc__``, ``divmod``, ``round``, ``gs.clip``),
some of which record two nodes (``nodes``), where eager code makes two backend calls. It also
times one host read of a small reduction with the device idle (``float(gs.sum(x))``): on NumPy a
copy of memory already on the host, on a GPU a launch, a sync and a device-to-host copy.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

import gpuscalar as gs
from gpuscalar.devices import get_backend
from gpuscalar.tools.benchmarks import progress


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


def helper_cases(xp: Any) -> dict[str, tuple[Callable[[], Any], Callable[[], Any], int, int]]:
    """name -> (gpuscalar op, raw backend op(s) on 0-d arrays, nodes it records lazily, backend
    calls it makes eagerly)."""
    a, b = xp.asarray(1.5), xp.asarray(2.5)
    yes = xp.asarray(True)
    s, t, c = gs.GPUScalar(a), gs.GPUScalar(b), gs.GPUScalar(yes)
    return {
        "gs.minimum(s, t)": (lambda: gs.minimum(s, t), lambda: xp.minimum(a, b), 1, 1),
        "gs.minimum(1.0, s)": (lambda: gs.minimum(1.0, s), lambda: xp.minimum(1.0, a), 1, 1),
        "gs.maximum(s, 0.0)": (lambda: gs.maximum(s, 0.0), lambda: xp.maximum(a, 0.0), 1, 1),
        "np.minimum(s, t)": (lambda: np.minimum(s, t), lambda: xp.minimum(a, b), 1, 1),
        "gs.where(c, s, t)": (lambda: gs.where(c, s, t), lambda: xp.where(yes, a, b), 1, 1),
        "gs.where(c, s, 0.0)": (lambda: gs.where(c, s, 0.0), lambda: xp.where(yes, a, 0.0), 1, 1),
        "round(s, 2)": (lambda: round(s, 2), lambda: xp.round(a, 2), 1, 1),
        "divmod(s, t)": (lambda: divmod(s, t), lambda: xp.divmod(a, b), 2, 1),
        "gs.clip(s, 0.0, 1.0)": (lambda: gs.clip(s, 0.0, 1.0),
                                 lambda: xp.minimum(xp.maximum(a, 0.0), 1.0), 2, 2),
    }


def best_time(function: Callable[[], Any], number: int, repeat: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=repeat)) / number


def read_latency(backend_name: str, number: int = 200, repeat: int = 5) -> float:
    """Seconds for ``float(gs.sum(x))`` of a small array with nothing else queued: the cost of
    one sync (a reduction launch, the wait and the copy on a GPU)."""
    backend = get_backend(backend_name)
    x = backend.xp.ones(16)

    def read() -> float:
        return float(gs.sum(x))

    read()  # compile the reduction first
    backend.synchronize()
    return best_time(read, number, repeat)


def measure(backend_name: str = "numpy", number: int = 20000, repeat: int = 7, *,
            quiet: bool = True) -> dict[str, Any]:
    """Nanoseconds per op (lazy, eager, raw) for each case, and the idle read latency; a
    progress line per case on a terminal's stderr unless ``quiet``."""
    backend = get_backend(backend_name)
    xp = backend.xp

    def row(ours: Callable[[], Any], raw: Callable[[], Any], nodes: int = 1,
            calls: int = 1) -> dict[str, Any]:
        lazy_s = best_time(ours, number, repeat)
        with gs.lazy(False):
            ours()  # compile the eager kernels first (CuPy)
            eager_s = best_time(ours, number, repeat)
        raw()
        raw_s = best_time(raw, number, repeat)
        backend.synchronize()
        return {"lazy_ns": lazy_s * 1e9, "eager_ns": eager_s * 1e9, "raw_ns": raw_s * 1e9,
                "lazy_ratio": lazy_s / raw_s, "eager_ratio": eager_s / raw_s, "nodes": nodes,
                "eager_calls": calls}

    def rows(table: dict[str, Any]) -> dict[str, Any]:
        measured = {}
        for name, functions in table.items():
            progress(f"overhead.py: {name} ...", quiet=quiet)
            measured[name] = row(*functions)
        return measured

    ops, helpers = rows(cases(xp)), rows(helper_cases(xp))
    return {"backend": backend_name, "device": gs.devices.describe(backend), "ops": ops,
            "helpers": helpers, "read_latency_us": read_latency(backend_name) * 1e6,
            "read_is_device_sync": not backend.evaluates_on_host}


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'op':<20} {'nodes':>5} {'lazy':>9} {'eager':>9} {'raw 0-d':>9} {'lazy/raw':>9} "
             f"{'eager/raw':>9}"]
    for name, row in (*result["ops"].items(), *result.get("helpers", {}).items()):
        lines.append(f"{name:<20} {row.get('nodes', 1):>5} {row['lazy_ns']:>7.0f}ns "
                     f"{row['eager_ns']:>7.0f}ns {row['raw_ns']:>7.0f}ns "
                     f"{row['lazy_ratio']:>8.2f}x {row['eager_ratio']:>8.2f}x")
    what = ("a reduction launch, the wait, the copy" if result["read_is_device_sync"]
            else "no device: a host reduction, not a GPU sync")
    lines.append(f"float(gs.sum(small array)), queue idle: {result['read_latency_us']:.1f} us "
                 f"({what})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Per-op CPU cost of GPUScalar operations (lazy, eager) against the raw "
        "backend 0-d op, and of one host read.")
    parser.add_argument("--backend", default="numpy", choices=("numpy", "strict", "cupy"))
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the numbers")
    parser.add_argument("--number", type=int, default=20000, help="calls per timing")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.backend == "cupy" and not gs.gpu_available():
        print("bench/overhead.py: --backend cupy needs CuPy and a CUDA device, and none was "
              "found; nothing measured", file=sys.stderr)
        return 2
    result = measure(args.backend, number=args.number, quiet=args.quiet)
    calls = "1 call" if args.number == 1 else f"{args.number} calls"
    print(f"per-op CPU time on {result['device']} (best of 7 x {calls})")
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
