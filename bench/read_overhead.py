"""Host cost of one read (``float(s)``) with nothing listening, next to CuPy's ``float(a)``.

Why this benchmark exists: sync accounting (guards, counters, `gpuscalar profile`) must cost
almost nothing when nobody listens (docs/syncs.md). A read of a GPUScalar is a sync like CuPy's
``float(a)`` of a 0-d array; issue 21 sets its goal: ``float(s)`` within 1.5x of CuPy's
``float(a)`` on the host. The device's wait is the same for both and is not measured.

It runs CuPy's real host path on nullcuda (``shared/nullcuda``: CuPy's dispatch down to the
CUDA calls, which are counting stubs; no GPU needed), and reports, side by side in one process:

- ``cupy float(a)``: CuPy's own read of a 0-d array (every call a device->host copy);
- ``float(s) unread``: the first read of a materialized GPUScalar (construction excluded: many
  are built beforehand and each call reads the next one);
- ``float(GPUScalar(a))``: the same with the construction included;
- ``float(s) cached``: a read of a scalar already read (served from its cache, no copy).

Every case takes its operand from a prebuilt list through the same iterator, so the harness
costs the same in each row. Ratios are to ``cupy float(a)``.

Three ways to run it, from the repository root::

    .venv/bin/python bench/read_overhead.py                  # wall time per call (ns)
    .venv/bin/python bench/read_overhead.py --instructions   # instructions (callgrind), table
    PYTHONPATH=../shared .venv/bin/python -m nullcuda.measure bench/read_overhead.py

Instructions need valgrind (``apt-get install valgrind``, with its headers); the script finds
nullcuda in ``../shared`` or ``./shared`` (or on ``PYTHONPATH``) and exits with status 2 and a
one-line reason where nullcuda cannot be loaded (no CuPy 14, no compiler, ...). With a real GPU,
``--real-cuda`` measures the same cases on it (wall time; the GPU's copy is included).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run as a script, or loaded by path)
import nullcuda_harness as harness  # noqa: E402

BENCH = "read"
BASELINE = "cupy float(a)"
#: Issue 21's goal: a first read within this factor of CuPy's own read.
GOAL = 1.5
N = 2000
WARM = 3
#: Regions Bench runs per case when timing (best of 7).
REPEATS = 7


def cases(cupy: Any, gs: Any, n: int) -> dict[str, Callable[[], Any]]:
    """The measured calls, by label. Each draws its operand from a prebuilt list (the same
    harness everywhere); a case's list holds enough operands for the warm-up and the ``n``
    calls of each region Bench runs (one under callgrind, `REPEATS` when timing)."""
    a = cupy.asarray(2.5)
    count = WARM + REPEATS * n
    fresh = [gs.GPUScalar(a) for _ in range(count)]  # unread, materialized
    cached = gs.GPUScalar(a)
    float(cached)
    arrays, unread = iter([a] * count), iter(fresh)
    built, read = iter([a] * count), iter([cached] * count)
    scalar_type = gs.GPUScalar
    return {
        BASELINE: lambda: float(next(arrays)),
        "float(s) unread": lambda: float(next(unread)),
        "float(GPUScalar(a))": lambda: float(scalar_type(next(built))),
        "float(s) cached": lambda: float(next(read)),
    }


def main(argv: list[str] | None = None) -> int:
    return harness.main(argv, prog="read_overhead", doc=__doc__ or "", script=__file__,
                        bench_name=BENCH, make_cases=cases, baseline=BASELINE,
                        goal_case='float(s) unread', goal=GOAL, n_default=N, warm=WARM, width=24)


if __name__ == "__main__":
    sys.exit(main())
