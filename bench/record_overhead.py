"""Host cost of ``log.record(loss=s, lr=t)`` per step, next to one CuPy ufunc call (``g * a``).

Why this benchmark exists: a `gs.MetricLog` is only worth recording every step if recording
costs the loop nothing it would notice. Issue 24 sets the goal: the host cost of ``record`` at
most that of one CuPy ufunc call. ``record`` is one launch of a cached ``RawKernel`` (no sync,
no upload); the device's time for it is not measured here (one thread, a few stores).

It runs CuPy's real host path on nullcuda (``shared/nullcuda``: CuPy's dispatch down to the
CUDA calls, which are counting stubs; no GPU needed), and reports, side by side in one process:

- ``cupy g * a``: one CuPy ufunc call, a 1024-element array times a 0-d array;
- ``record(loss=s, lr=t)``: two materialized GPUScalars (``s = gs.sum(g)``, ``t``);
- ``record(loss=s, lr=0.1)``: a Python float column (a kernel argument);
- ``record(loss=s*2+1, lr=t)``: a pending GPUScalar, computed in the record kernel;
``ready()`` and ``flush()`` are not measured: they run between steps, not per step.

Ratios are to ``cupy g * a``. Three ways to run it, from the repository root::

    .venv/bin/python bench/record_overhead.py                  # wall time per call (ns)
    .venv/bin/python bench/record_overhead.py --instructions   # instructions (callgrind), table
    PYTHONPATH=../shared .venv/bin/python -m nullcuda.measure bench/record_overhead.py

Instructions need valgrind (with its headers); the script finds nullcuda in ``../shared`` or
``./shared`` (or on ``PYTHONPATH``) and exits with status 2 and a one-line reason where nullcuda
cannot be loaded. With a real GPU, ``--real-cuda`` measures the same cases on it (wall time).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run as a script, or loaded by path)
import nullcuda_harness as harness  # noqa: E402

BENCH = "record"
BASELINE = "cupy g * a"
GOAL_CASE = "record(loss=s, lr=t)"
#: Issue 24's goal: record within this factor of one CuPy ufunc call.
GOAL = 1.0
N = 2000
WARM = 3
#: Regions Bench runs per case when timing (best of 7).
REPEATS = 7


def cases(cupy: Any, gs: Any, n: int) -> dict[str, Callable[[], Any]]:
    """The measured calls, by label. The log is large enough that no row is dropped meanwhile
    (drops cost nothing on the host anyway: the ring wraps on the device)."""
    g = cupy.linspace(0.0, 1.0, 1024)
    a = cupy.asarray(0.5)
    s = gs.sum(g)
    t = gs.GPUScalar(a)
    log = gs.MetricLog(capacity=4096)
    log.record(loss=s, lr=t)  # the ring, and the kernel for these column kinds
    floats = gs.MetricLog(capacity=4096, like=g)
    floats.record(loss=s, lr=0.1)
    pending = gs.MetricLog(capacity=4096)
    pending.record(loss=s * 2.0 + 1.0, lr=t)
    return {
        BASELINE: lambda: g * a,
        GOAL_CASE: lambda: log.record(loss=s, lr=t),
        "record(loss=s, lr=0.1)": lambda: floats.record(loss=s, lr=0.1),
        "record(loss=s*2+1, lr=t)": lambda: pending.record(loss=s * 2.0 + 1.0, lr=t),
    }


def main(argv: list[str] | None = None) -> int:
    return harness.main(argv, prog="record_overhead", doc=__doc__ or "", script=__file__,
                        bench_name=BENCH, make_cases=cases, baseline=BASELINE,
                        goal_case=GOAL_CASE, goal=GOAL, n_default=N, warm=WARM, width=28)


if __name__ == "__main__":
    sys.exit(main())
