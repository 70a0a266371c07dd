"""gs.while_loop on a GPU: a conjugate-gradient solve without syncs, and the cost of a loop.

    python bench/gpu_control.py [--n 2000] [--repeats 5] [--iterations 1000] [--json FILE]

Why this script exists: the claim of `gs.while_loop` is a number measured on a GPU. Two
measurements, each the median of ``--repeats`` timed runs after one untimed run (compilation,
cuBLAS handles), each run ending with one read (so queued work is timed):

- the CG solve of ``examples/cg.py`` (float64, an SPD system of size ``--n``, tol 1e-8): the
  straightforward loop with a host check per iteration (one sync each) against
  ``gs.while_loop`` (one launch, zero syncs); the iterates must be the same bits;
- what one ``while_loop`` iteration costs beyond its body: a loop of ``--iterations``
  iterations of a one-kernel body, against the same body recorded ``--iterations`` times in one
  CUDA graph (`gs.capture`, ``steps=``), per iteration.

Without a GPU this script says so and exits 0 (nothing is measured, no number is printed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpuscalar as gs

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cg.py"


def load_cg() -> Any:
    """``examples/cg.py`` as a module: the benchmark measures the example as shipped."""
    spec = importlib.util.spec_from_file_location("gpuscalar_example_cg", EXAMPLE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``run()`` (which ends with a host read) after one untimed run."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_cg(xp: Any, n: int, repeats: int) -> dict[str, Any]:
    cg = load_cg()
    a, b = cg.spd_system(xp, n)
    found: dict[str, Any] = {}

    def host_checks() -> None:
        found["host"] = cg.solve_with_host_checks(a, b, xp)

    def while_loop() -> None:
        x, count = cg.solve_on_device(a, b, xp)
        found["device"] = (x, int(count))  # the one read that ends the run

    with gs.count_syncs() as host_syncs:
        host_checks()
    with gs.count_syncs() as device_syncs:
        cg.solve_on_device(a, b, xp)
    seconds = {"host checks": median_seconds(host_checks, repeats),
               "while_loop": median_seconds(while_loop, repeats)}
    (x_host, n_host), (x_device, n_device) = found["host"], found["device"]
    return {
        "n": n,
        "iterations": {"host checks": n_host, "while_loop": n_device},
        "syncs": {"host checks": host_syncs.count, "while_loop": device_syncs.count},
        "seconds": seconds,
        "speedup": seconds["host checks"] / seconds["while_loop"],
        "same_iterates": bool(gs.all(x_host == x_device)),
    }


def measure_iteration_cost(xp: Any, iterations: int, repeats: int) -> dict[str, Any]:
    x = xp.zeros(())
    one, limit = gs.asscalar(1.0, like=x), gs.asscalar(float(iterations), like=x)

    def body(x: Any) -> None:
        x += one

    def looped() -> None:
        x[...] = 0
        gs.while_loop(lambda x: x < limit, body, x, max_iter=iterations)
        float(gs.GPUScalar(x))

    step = gs.capture(body, x, warmup=1, steps=iterations)

    def graphed() -> None:
        step()
        float(gs.GPUScalar(x))

    loop_s, graph_s = median_seconds(looped, repeats), median_seconds(graphed, repeats)
    step.release()
    return {
        "iterations": iterations,
        "while_loop_seconds": loop_s,
        "graph_of_bodies_seconds": graph_s,
        "microseconds_per_iteration_beyond_body": (loop_s - graph_s) / iterations * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="CG system size (float64)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=1000,
                        help="iterations of the loop whose cost per iteration is measured")
    parser.add_argument("--json", metavar="FILE", default=None)
    args = parser.parse_args(argv)
    for name in ("n", "repeats", "iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not gs.gpu_available():
        print("bench/gpu_control.py needs a CUDA GPU with CuPy; none found here, nothing "
              "measured.")
        _write(args.json, {"measured": False, "reason": "no CUDA GPU"})
        return 0
    xp = gs.get_backend("cupy").xp
    result = {"cg": measure_cg(xp, args.n, args.repeats),
              "loop": measure_iteration_cost(xp, args.iterations, args.repeats)}
    cg, loop = result["cg"], result["loop"]
    print(f"CG, N={cg['n']} float64, median of {args.repeats} runs after 1 untimed run")
    for name in ("host checks", "while_loop"):
        print(f"  {name:12s} {cg['seconds'][name] * 1e3:9.2f} ms  "
              f"{cg['iterations'][name]} iterations, {cg['syncs'][name]} syncs")
    print(f"  speed-up {cg['speedup']:.2f}x; same iterates: {cg['same_iterates']}")
    print(f"one while_loop iteration beyond its body: "
          f"{loop['microseconds_per_iteration_beyond_body']:.2f} us "
          f"({loop['iterations']} iterations of a one-kernel body)")
    _write(args.json, {"measured": True, **result})
    return 0


def _write(path: str | None, data: dict[str, Any]) -> None:
    """The JSON record, when ``--json FILE`` was given."""
    if path:
        Path(path).write_text(json.dumps(data, indent=2), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
