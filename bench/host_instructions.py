"""Issue 22's "Measures": host instructions per op, gpuscalar next to its CuPy peer, on nullcuda.

Why this benchmark exists: on a GPU a launch-bound loop runs at the speed of its host, so the
Python gpuscalar adds before a launch decides whether it is faster than the float path it
replaces. This script runs CuPy's real host path on nullcuda (``shared/nullcuda``: CuPy's
dispatch down to ``cuLaunchKernel`` over counting stubs; no GPU needed) and counts instructions
with callgrind, each gpuscalar case beside its peer in the same process:

- ``fold``: ``g * (s*2.0 + 1.0)`` (a pending scalar folded into the array kernel) vs CuPy's
  ``g * a`` (goal <= 1.5x);
- ``read``: ``float(s)`` of an unread GPUScalar vs CuPy's ``float(a)`` (goal <= 1.5x);
- ``matmul``: ``gs.matmul(A, x)`` and ``gs.matmul(A, B)`` vs ``A @ x`` and ``A @ B`` (goal
  <= 1.3x);
- ``adam``: ``Adam.step`` over `TENSORS` tensors with fresh gradient arrays every step, per
  tensor (goal <= 2,500 instructions), and with the same gradient arrays for reference;
- ``demo``: one step of ``gpuscalar.tools.demo``'s gpuscalar path vs its float path (goal:
  gpuscalar <= float), from runs of 1 and ``1 + DEMO_STEPS`` steps (the difference, per step);
- ``compiles`` (``--compiles``, run plainly, not under callgrind): a lazy running total whose
  terms vary with the data, ``total = total + (loss * 2 if coin() else loss + 1)``, NVRTC
  compiles (module loads) per 10^4 steps after warm-up and resident memory (RSS now, not the
  peak) at the warm-up mark and at the end, with
  `gpuscalar.lazy.fusion`'s churn rule and without it (``SPLIT_NODES`` set out of reach: the
  behaviour before issue 22), in one process each (goal <= 1 compile per 1,000 steps).

Run from the repository root::

    .venv/bin/python bench/host_instructions.py                  # instructions table (callgrind)
    .venv/bin/python bench/host_instructions.py --compiles       # the compile-bound rows
    .venv/bin/python bench/host_instructions.py --time           # wall time instead (nullcuda)

It exits with status 2 and a one-line reason where nullcuda (or valgrind) is missing. Figures
are recorded, dated, in docs/benchmarks.md; the script measures, it does not judge beyond the
goal column.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run as a script, or loaded by path)
import nullcuda_harness as harness  # noqa: E402

ROOT = harness.ROOT
BENCH = "issue22"
TENSORS = 100
DEMO_STEPS = 20
WARM = 3
REPEATS = 7
#: (gpuscalar case, peer case or None, goal ratio or absolute, what the goal reads)
PAIRS: list[tuple[str, str | None, float, str]] = [
    ("fold g*(s*2.0+1.0)", "cupy g*a", 1.5, "<= 1.5x"),
    ("float(s) unread", "cupy float(a)", 1.5, "<= 1.5x"),
    ("gs.matmul(A, x)", "cupy A @ x", 1.3, "<= 1.3x"),
    ("gs.matmul(A, B)", "cupy A @ B", 1.3, "<= 1.3x"),
]
#: per call of each case: how many calls a region makes (callgrind is ~50x slower)
CALLS = {"fold": 200, "read": 200, "matmul": 200, "adam": 6, "demo": 2}


def _fail(message: str) -> int:
    return harness.fail("host_instructions", message)


def cases(cupy: Any, gs: Any) -> dict[str, tuple[Callable[[], Any], int]]:
    """The measured calls, by label, with the calls per region."""
    import numpy as np  # noqa: PLC0415

    from gpuscalar.tools import demo  # noqa: PLC0415

    count = WARM + REPEATS * CALLS["read"]
    g = cupy.linspace(0.0, 1.0, 1024)
    a = cupy.asarray(0.5)
    s = gs.sum(g)
    arrays, unread = iter([a] * count), iter([gs.GPUScalar(a) for _ in range(count)])
    rng = np.random.default_rng(0)
    A = cupy.asarray(rng.standard_normal((64, 64)))
    B = cupy.asarray(rng.standard_normal((64, 64)))
    x = cupy.asarray(rng.standard_normal(64))
    shapes = [(256,)] * TENSORS
    params = [cupy.asarray(rng.standard_normal(sh)) for sh in shapes]
    opt = gs.optim.Adam(params, lr=1e-3)
    pools = [[cupy.asarray(rng.standard_normal(sh)) for sh in shapes] for _ in range(4)]
    turn = [0]

    def adam_fresh() -> None:  # new gradient arrays every step (a backward pass's)
        turn[0] += 1
        opt.step(pools[turn[0] % 4])

    reused = pools[0]
    opt_reused = gs.optim.Adam([cupy.asarray(p) for p in params], lr=1e-3)
    xp = cupy
    return {
        "cupy g*a": (lambda: g * a, CALLS["fold"]),
        "fold g*(s*2.0+1.0)": (lambda: g * (s * 2.0 + 1.0), CALLS["fold"]),
        "cupy float(a)": (lambda: float(next(arrays)), CALLS["read"]),
        "float(s) unread": (lambda: float(next(unread)), CALLS["read"]),
        "cupy A @ x": (lambda: A @ x, CALLS["matmul"]),
        "gs.matmul(A, x)": (lambda: gs.matmul(A, x), CALLS["matmul"]),
        "cupy A @ B": (lambda: A @ B, CALLS["matmul"]),
        "gs.matmul(A, B)": (lambda: gs.matmul(A, B), CALLS["matmul"]),
        f"adam step, {TENSORS} fresh grads": (adam_fresh, CALLS["adam"]),
        f"adam step, {TENSORS} reused grads": (lambda: opt_reused.step(reused), CALLS["adam"]),
        "demo float path, 1 step": (lambda: demo.float_path(xp, 1), CALLS["demo"]),
        f"demo float path, {1 + DEMO_STEPS} steps":
            (lambda: demo.float_path(xp, 1 + DEMO_STEPS), CALLS["demo"]),
        "demo gpuscalar path, 1 step": (lambda: demo.gpuscalar_path(xp, 1), CALLS["demo"]),
        f"demo gpuscalar path, {1 + DEMO_STEPS} steps":
            (lambda: demo.gpuscalar_path(xp, 1 + DEMO_STEPS), CALLS["demo"]),
    }


def measure() -> dict[str, float] | None:
    """Register the cases with nullcuda's Bench: instructions under callgrind (the dumps hold
    them; returns None), wall-time ns per call otherwise (returned)."""
    nullcuda = harness.import_nullcuda()
    nullcuda.install()  # before CuPy is imported
    import cupy  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))
    from nullcuda.measure import Bench  # noqa: PLC0415

    import gpuscalar as gs  # noqa: PLC0415

    if not gs.gpu_available():
        raise RuntimeError("gpuscalar sees no CUDA device (nullcuda not installed beneath CuPy?)")
    print(f"gpuscalar {gs.__version__}, CuPy {cupy.__version__}, on nullcuda", flush=True)
    bench = Bench(BENCH, warm=WARM)
    rows: dict[str, float] = {}
    for label, (fn, n) in cases(cupy, gs).items():
        row = bench.case(label, fn, n=n)
        if "ns" in row:
            rows[label] = row["ns"]
    return None if bench.callgrind else rows


def instructions(out: str | None) -> dict[str, float]:
    """Run this script under callgrind (nullcuda.measure) and read the figures back."""
    return harness.instructions(__file__, BENCH, ["--inner"], out)


def table(rows: dict[str, float], unit: str) -> str:
    """The Measures table: each gpuscalar case, its peer, the ratio and the goal."""
    lines = [f"{'case':<34} {unit:>12} {'peer':>12} {'ratio':>7}  goal"]
    for case, peer, goal, goal_text in PAIRS:
        mine, theirs = rows.get(case), rows.get(peer or "")
        if mine is None or theirs is None:
            continue
        ratio = mine / theirs
        verdict = "met" if ratio <= goal else "NOT met"
        lines.append(f"{case:<34} {mine:>12,.0f} {theirs:>12,.0f} {ratio:>6.2f}x  "
                     f"{goal_text} ({peer}): {verdict}")
    for label in (f"adam step, {TENSORS} fresh grads", f"adam step, {TENSORS} reused grads"):
        if label in rows:
            per = rows[label] / TENSORS
            note = (f"<= 2,500 per tensor: {'met' if per <= 2500 else 'NOT met'}"
                    if "fresh" in label else "(reference)")
            lines.append(f"{label + ', per tensor':<34} {per:>12,.0f} {'':>12} {'':>7}  {note}")
    steps = {}
    for path in ("float", "gpuscalar"):
        one = rows.get(f"demo {path} path, 1 step")
        many = rows.get(f"demo {path} path, {1 + DEMO_STEPS} steps")
        if one is not None and many is not None:
            steps[path] = (many - one) / DEMO_STEPS
    if len(steps) == 2:
        ratio = steps["gpuscalar"] / steps["float"]
        lines.append(f"{'demo gpuscalar step':<34} {steps['gpuscalar']:>12,.0f} "
                     f"{steps['float']:>12,.0f} {ratio:>6.2f}x  <= 1.0x (float path's step): "
                     f"{'met' if ratio <= 1.0 else 'NOT met'}")
    return "\n".join(lines)


# ---- compiles of a data-dependent running total ----------------------------------------------


def compile_run(steps: int, bounded: bool, read_every: int, seed: int = 0) -> dict[str, Any]:
    """In this process (nullcuda installed here): ``steps`` of the issue's loop; module loads
    (one per NVRTC compile or kernel-cache load) and the resident set size, after a warm-up of
    a tenth. (Not the peak, ``ru_maxrss``: the first NVRTC compile of a process maps NVRTC, a
    one-time ~20-30 MB that lands before or after the warm-up mark as CuPy's disk cache has
    it.)"""
    nullcuda = harness.import_nullcuda()
    nullcuda.install()
    import cupy  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))
    import gpuscalar as gs  # noqa: PLC0415
    from gpuscalar.lazy import fusion  # noqa: PLC0415

    if not bounded:
        fusion.SPLIT_NODES = 1 << 60  # the rule out of reach: every structure whole, as before
    coin = random.Random(seed).random
    g = cupy.ones(16)
    losses = [cupy.asarray(float(i % 7) * 0.25) for i in range(64)]
    total = gs.GPUScalar(cupy.asarray(0.0))

    def rss_mb() -> float:  # resident now (not the peak: NVRTC's one-time load is ~20-30 MB)
        try:
            with open("/proc/self/statm") as statm:
                return int(statm.read().split()[1]) * resource.getpagesize() / 2**20
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    warm = steps // 10
    marks: dict[str, Any] = {}
    for i in range(steps):
        if i == warm:
            marks["modules_at_warm"] = nullcuda.counters()["modules"]
            marks["rss_at_warm_mb"] = rss_mb()
        loss = gs.GPUScalar(losses[i % 64])
        total = total + (loss * 2 if coin() < 0.5 else loss + 1)
        if read_every and i % read_every == read_every - 1:
            if (i // read_every) % 2:
                float(total)
            else:
                g * total  # noqa: B018 - a fold, every other time
    float(total)
    modules = nullcuda.counters()["modules"]
    after = steps - warm
    return {"steps": steps, "bounded": bounded, "read_every": read_every,
            "modules": modules, "modules_after_warm": modules - marks["modules_at_warm"],
            "per_1000_after_warm": 1000 * (modules - marks["modules_at_warm"]) / after,
            "rss_at_warm_mb": round(marks["rss_at_warm_mb"], 1), "rss_end_mb": round(rss_mb(), 1)}


def compiles(steps: int) -> list[dict[str, Any]]:
    """`compile_run` in a fresh process per configuration (CuPy's modules live per process)."""
    rows = []
    for read_every in (0, 10):
        for bounded in (False, True):
            command = [sys.executable, __file__, "--compile-run", str(steps), str(int(bounded)),
                       str(read_every)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr
                                   else f"status {done.returncode}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def compile_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'running total, random terms':<36} {'steps':>7} {'compiles':>9} "
             f"{'after warm-up':>14} {'per 1,000':>10} {'RSS warm->end MB':>18}"]
    for row in rows:
        what = ("with the churn rule" if row["bounded"] else "before (no rule)") + (
            f", read/fold every {row['read_every']}" if row["read_every"] else ", never read")
        lines.append(f"{what:<36} {row['steps']:>7,} {row['modules']:>9,} "
                     f"{row['modules_after_warm']:>14,} {row['per_1000_after_warm']:>10.2f} "
                     f"{row['rss_at_warm_mb']:>8.1f} -> {row['rss_end_mb']:<8.1f}")
    lines.append("goal: <= 1 compile per 1,000 steps after warm-up (a tenth of the run), RSS "
                 "flat")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="wall time (ns), not instructions")
    parser.add_argument("--compiles", type=int, nargs="?", const=10_000, metavar="STEPS",
                        help="the compile-bound rows (default 10,000 steps)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile-run", nargs=3, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help="directory for callgrind's dumps")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    options = parser.parse_args(argv)
    try:
        if options.compile_run:
            steps, bounded, read_every = options.compile_run
            print(json.dumps(compile_run(steps, bool(bounded), read_every)))
            return 0
        if options.inner:
            measure()  # under nullcuda.measure: the dumps hold the figures
            return 0
        if options.compiles:
            found = compiles(options.compiles)
            print(compile_table(found))
            payload: Any = found
        else:
            if options.time:
                timed = measure()
                assert timed is not None
                rows, unit = timed, "ns"
            else:
                rows, unit = instructions(options.out), "instr"
            print(table(rows, unit))
            print("\nall cases:")
            for label, value in rows.items():
                print(f"  {label:<40} {value:>14,.0f}")
            payload = {"unit": unit, "per_call": rows}
    except (ImportError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return _fail(f"cannot measure ({type(exc).__name__}: {exc}); nullcuda needs CuPy 14, "
                     "gcc and the Python headers, and instructions need valgrind")
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
