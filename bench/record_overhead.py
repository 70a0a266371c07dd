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

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = "record"
BASELINE = "cupy g * a"
GOAL_CASE = "record(loss=s, lr=t)"
#: Issue 24's goal: record within this factor of one CuPy ufunc call.
GOAL = 1.0
N = 2000
WARM = 3
#: Regions Bench runs per case when timing (best of 7).
REPEATS = 7


def _import_nullcuda() -> Any:
    """The nullcuda package, from PYTHONPATH or a ``shared`` folder next to the checkout."""
    try:
        import nullcuda  # noqa: PLC0415
    except ImportError:
        for candidate in (ROOT / "shared", ROOT.parent / "shared"):
            if (candidate / "nullcuda" / "__init__.py").is_file():
                sys.path.insert(0, str(candidate))
                break
        import nullcuda  # noqa: PLC0415
    return nullcuda


def _fail(message: str) -> int:
    print(f"record_overhead: {message}", file=sys.stderr)
    return 2


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


def _table(rows: dict[str, float], unit: str) -> str:
    base = rows.get(BASELINE)
    lines = [f"{'case':<28} {unit:>14}  vs {BASELINE}"]
    for label, value in rows.items():
        ratio = f"{value / base:6.2f}x" if base else "     -"
        lines.append(f"{label:<28} {value:>14,.0f}  {ratio}")
    if base:
        first = rows.get(GOAL_CASE)
        if first is not None:
            verdict = "met" if first <= GOAL * base else "NOT met"
            lines.append(f"goal: {GOAL_CASE} <= {GOAL}x {BASELINE}: {verdict} "
                         f"({first / base:.2f}x)")
    return "\n".join(lines)


def measure(n: int, real_cuda: bool) -> dict[str, float] | None:
    """Register the cases with nullcuda's Bench: instructions under callgrind (the dumps hold
    them; returns None), wall-time ns per call otherwise (returned)."""
    nullcuda = _import_nullcuda()
    if not real_cuda:
        nullcuda.install()  # before CuPy is imported
    import cupy  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))
    from nullcuda.measure import Bench  # noqa: PLC0415

    import gpuscalar as gs  # noqa: PLC0415

    if not gs.gpu_available():
        raise RuntimeError("gpuscalar sees no CUDA device (nullcuda not installed beneath CuPy?)")
    where = "a real GPU" if real_cuda else "nullcuda (no GPU)"
    print(f"gpuscalar {gs.__version__} from {os.path.dirname(gs.__file__)}, "
          f"CuPy {cupy.__version__}, on {where}", flush=True)
    bench = Bench(BENCH, warm=WARM)
    rows: dict[str, float] = {}
    for label, fn in cases(cupy, gs, n).items():
        row = bench.case(label, fn, n=n)
        if "ns" in row:
            rows[label] = row["ns"]
    return None if bench.callgrind else rows


def instructions(n: int, out: str | None) -> dict[str, float]:
    """Run this script under callgrind (nullcuda.measure) and read the figures back."""
    nullcuda = _import_nullcuda()
    from nullcuda import measure as nm  # noqa: PLC0415

    env_path = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(nullcuda.__file__)),
                                           os.environ.get("PYTHONPATH")) if p)
    os.environ["PYTHONPATH"] = env_path
    status, directory = nm.run(__file__, ["--n", str(n)], out)
    if status != 0:
        raise RuntimeError(f"the run under callgrind exited with status {status}")
    found = nm.load(directory).get(BENCH)
    if not found:
        raise RuntimeError(f"no callgrind regions found in {directory}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind (needs valgrind)")
    parser.add_argument("--real-cuda", action="store_true",
                        help="measure on a real GPU (wall time) instead of nullcuda")
    parser.add_argument("--n", type=int, default=N, help=f"calls per region (default {N})")
    parser.add_argument("--out", help="with --instructions: directory for callgrind's dumps")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    options = parser.parse_args(argv)
    if options.n < 1:
        return _fail(f"--n must be >= 1, got {options.n}")
    try:
        if options.instructions:
            rows, unit = instructions(options.n, options.out), "instructions"
        else:
            found = measure(options.n, options.real_cuda)
            if found is None:  # under nullcuda.measure: it prints the figures
                return 0
            rows, unit = found, "ns (wall)"
    except (ImportError, OSError, RuntimeError, SystemExit, subprocess.SubprocessError) as exc:
        detail = str(exc) or type(exc).__name__
        return _fail(f"cannot measure ({type(exc).__name__}: {detail}); nullcuda needs CuPy 14, "
                     "gcc and the Python headers, and --instructions needs valgrind")
    print(_table(rows, unit))
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump({"unit": unit, "per_call": rows}, handle, indent=1)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
