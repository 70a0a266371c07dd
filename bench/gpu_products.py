"""Vector products on a GPU: where a dot product's time goes, host and device, route by route.

    python bench/gpu_products.py [--repeat 200] [--json FILE]

Why this script exists: on the third H200 run (2026-11-26) the CG workloads got slower once
`gs.matmul` of two vectors became cuBLAS's transposed k × 1 gemv (`gs.while_loop`'s CG 2.14 ->
3.56 ms; `gpuscalar bench`'s `cg` 10.9 -> 15.7 ms), and nothing on a CPU can say whether the
device or the host pays. Each case is timed by `cupyx.profiler.benchmark` (CPU time per call
and GPU time per call between CUDA events, ``--repeat`` calls after warm-up): a dot product by
CuPy's ``@``, `gs.matmul`, `gs.dot` and gpuscalar's own dot kernel (the one graphs record), at
three lengths, a matrix-vector product for scale, and the `cg` workload's float and gpuscalar
paths whole.

Without a GPU this script says so and exits 0 (nothing is measured, no number is printed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import gpuscalar as gs

LENGTHS = (512, 2000, 1_000_000)


def _gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CUDA driver, no device: nothing to measure
        return False


def _case(name: str, run: Callable[[], Any], repeat: int) -> dict[str, Any]:
    from cupyx.profiler import benchmark

    try:
        result = benchmark(run, n_repeat=repeat, n_warmup=10)
    except Exception as error:  # one route failing must not lose the others' figures
        return {"case": name, "error": f"{type(error).__name__}: {error}"[:300]}
    cpu = float(np.median(result.cpu_times)) * 1e6
    gpu = float(np.median(result.gpu_times[0])) * 1e6
    return {"case": name, "cpu_us": cpu, "gpu_us": gpu}


def measure(repeat: int) -> dict[str, Any]:
    import cupy

    from gpuscalar.devices.cupy import products
    from gpuscalar.tools import solvers
    from gpuscalar.tools.workloads import WORKLOADS

    rng = np.random.default_rng(0)
    rows = []
    for n in LENGTHS:
        r = cupy.asarray(rng.standard_normal(n))
        rows.append(_case(f"cupy r @ r, n={n}", lambda r=r: r @ r, repeat))
        rows.append(_case(f"gs.matmul(r, r), n={n}", lambda r=r: gs.matmul(r, r), repeat))
        rows.append(_case(f"gs.dot(r, r), n={n}", lambda r=r: gs.dot(r, r), repeat))
        rows.append(_case(f"gpuscalar dot kernel, n={n}",
                          lambda r=r: products.dot(r, r, False), repeat))
    a = cupy.asarray(rng.standard_normal((2000, 2000)))
    x = cupy.asarray(rng.standard_normal(2000))
    rows.append(_case("cupy A @ x, 2000 x 2000", lambda: a @ x, repeat))
    rows.append(_case("gs.matmul(A, x), 2000 x 2000", lambda: gs.matmul(a, x), repeat))
    cg = WORKLOADS["cg"]
    params = dict(cg.sizes["default"])
    inputs = solvers.cg_inputs(cupy, params)
    for path in ("float", "gpuscalar"):
        run = getattr(solvers, f"cg_{path}")
        rows.append(_case(f"cg workload, {path} path (n={params['n']})",
                          lambda run=run: run(cupy, inputs, **params), max(repeat // 20, 5)))
    device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    return {"device": device, "cupy": cupy.__version__, "repeat": repeat, "rows": rows}


def table(data: dict[str, Any]) -> str:
    lines = [f"device: {data['device']}, CuPy {data['cupy']}; median per call of "
             f"{data['repeat']} (cupyx.profiler.benchmark)",
             f"{'case':<42} {'cpu us':>10} {'gpu us':>10}"]
    lines += [f"{row['case']:<42} {row['cpu_us']:>10.1f} {row['gpu_us']:>10.1f}"
              if "error" not in row else f"{row['case']:<42} failed: {row['error']}"
              for row in data["rows"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not _gpu():
        print("bench/gpu_products.py: no GPU found (CuPy sees no CUDA device): nothing measured")
        return 0
    data = measure(args.repeat)
    print(table(data))
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
