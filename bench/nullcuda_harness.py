"""What every nullcuda benchmark of this folder shares: finding nullcuda, timing or counting the
cases with its `Bench`, running a script under callgrind and reading the figures back.

Why this module exists: host-cost benchmarks (`read_overhead.py`, `record_overhead.py`,
`host_instructions.py`) each compare gpuscalar calls with their CuPy peers on nullcuda
(``shared/nullcuda``: CuPy's real dispatch down to the CUDA calls, which are counting stubs), in
one process; only their cases and tables differ. The scripts import it by path (they run as
``python bench/NAME.py``, and tests load them by file).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: the exceptions that mean "cannot measure here" (no nullcuda, no compiler, no valgrind)
CANNOT_MEASURE: tuple[type[BaseException], ...] = (ImportError, OSError, RuntimeError,
                                                   SystemExit)


def import_nullcuda() -> Any:
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


def fail(prog: str, message: str) -> int:
    """Say why on stderr; the exit status of a benchmark that cannot measure (2)."""
    print(f"{prog}: {message}", file=sys.stderr)
    return 2


def cannot_measure(prog: str, exc: BaseException) -> int:
    detail = str(exc) or type(exc).__name__
    return fail(prog, f"cannot measure ({type(exc).__name__}: {detail}); nullcuda needs CuPy 14, "
                      "gcc and the Python headers, and --instructions needs valgrind")


def measure_cases(bench_name: str, make_cases: Callable[[Any, Any], dict[str, Any]],
                  *, n: int, warm: int, real_cuda: bool = False) -> dict[str, float] | None:
    """Install nullcuda (unless ``real_cuda``), import CuPy and gpuscalar, and register each case
    of ``make_cases(cupy, gs)`` (label -> a function, or (function, calls per region)) with
    nullcuda's Bench: under callgrind the dumps hold the instructions (returns None);
    otherwise wall-time ns per call (returned)."""
    nullcuda = import_nullcuda()
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
    bench = Bench(bench_name, warm=warm)
    rows: dict[str, float] = {}
    for label, case in make_cases(cupy, gs).items():
        fn, calls = case if isinstance(case, tuple) else (case, n)
        row = bench.case(label, fn, n=calls)
        if "ns" in row:
            rows[label] = row["ns"]
    return None if bench.callgrind else rows


def instructions(script: str, bench_name: str, args: list[str],
                 out: str | None) -> dict[str, float]:
    """Run ``script args`` under callgrind (nullcuda.measure) and read its regions back."""
    nullcuda = import_nullcuda()
    from nullcuda import measure as nm  # noqa: PLC0415

    env_path = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(nullcuda.__file__)),
                                           os.environ.get("PYTHONPATH")) if p)
    os.environ["PYTHONPATH"] = env_path
    status, directory = nm.run(script, args, out)
    if status != 0:
        raise RuntimeError(f"the run under callgrind exited with status {status}")
    found = nm.load(directory).get(bench_name)
    if not found:
        raise RuntimeError(f"no callgrind regions found in {directory}")
    return found


def ratio_table(rows: dict[str, float], unit: str, baseline: str, goal_case: str, goal: float,
                width: int) -> str:
    """Each case with its ratio to ``baseline``, and whether ``goal_case`` is within ``goal``."""
    base = rows.get(baseline)
    lines = [f"{'case':<{width}} {unit:>14}  vs {baseline}"]
    for label, value in rows.items():
        ratio = f"{value / base:6.2f}x" if base else "     -"
        lines.append(f"{label:<{width}} {value:>14,.0f}  {ratio}")
    mine = rows.get(goal_case)
    if base and mine is not None:
        verdict = "met" if mine <= goal * base else "NOT met"
        lines.append(f"goal: {goal_case} within {goal}x of {baseline}: {verdict} "
                     f"({mine / base:.2f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None, *, prog: str, doc: str, script: str, bench_name: str,
         make_cases: Callable[[Any, Any], dict[str, Any]], baseline: str, goal_case: str,
         goal: float, n_default: int, warm: int, width: int) -> int:
    """The command line of a side-by-side benchmark: wall time on nullcuda (or a real GPU with
    ``--real-cuda``), or ``--instructions`` under callgrind; exit 2 with one line where it
    cannot measure."""
    import argparse  # noqa: PLC0415
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind (needs valgrind)")
    parser.add_argument("--real-cuda", action="store_true",
                        help="measure on a real GPU (wall time) instead of nullcuda")
    parser.add_argument("--n", type=int, default=n_default,
                        help=f"calls per region (default {n_default})")
    parser.add_argument("--out", help="with --instructions: directory for callgrind's dumps")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    options = parser.parse_args(argv)
    if options.n < 1:
        return fail(prog, f"--n must be >= 1, got {options.n}")
    try:
        if options.instructions:
            rows = instructions(script, bench_name, ["--n", str(options.n)], options.out)
            unit = "instructions"
        else:
            found = measure_cases(bench_name, lambda cupy, gs: make_cases(cupy, gs, options.n),
                                  n=options.n, warm=warm, real_cuda=options.real_cuda)
            if found is None:  # under nullcuda.measure: it prints the figures
                return 0
            rows, unit = found, "ns (wall)"
    except (*CANNOT_MEASURE, subprocess.SubprocessError) as exc:
        return cannot_measure(prog, exc)
    print(ratio_table(rows, unit, baseline, goal_case, goal, width))
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump({"unit": unit, "per_call": rows}, handle, indent=1)
            handle.write("\n")
    return 0
