"""A captured training loop against its float path, its eager path and PyTorch's CUDA graph.

    python bench/gpu_capture.py [--steps 2000] [--chunk 10] [--repeats 5] [--json FILE]

Why this script exists: the claim of `gs.capture` is a number measured on a GPU, next to the
same loop in PyTorch. The loop: least-squares linear regression, n=1024 samples, d=64 features,
2000 SGD steps, the loss accumulated every step (the loop an H100 ran in 397 ms as a CuPy float
path and in 29.8 ms as CUDA graphs of 10 steps). Versions (CuPy, then PyTorch when it imports
and sees CUDA; PyTorch is not a dependency):

- float: ``total += float(loss)`` every step (a sync per step);
- eager: the loss kept on the device, no sync until the end;
- eager gs.matmul (CuPy only): the eager loop with the products of the graph (``gs.matmul``:
  cuBLAS gemv), the graph's exact reference;
- graph: ``--chunk`` steps recorded once (`gs.capture`; PyTorch: ``torch.cuda.graph``) and
  replayed ``steps / chunk`` times.

Each version runs once untimed (compilation, first cuBLAS calls), then ``--repeats`` timed runs;
the median is reported, each run ending with one read of the total (so queued work is timed).
The weights of every version are compared with CuPy's eager weights (a difference of rounding
only: CuPy's ``@`` is another cuBLAS routine than gs.matmul's gemv), and each graph bitwise with
the eager run of the same kernels (CuPy's graph with "cupy eager gs.matmul", PyTorch's with
"torch eager"): "results identical to eager" is that comparison, in the JSON under
``identical_to_eager``. Without a GPU this script says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import gpuscalar as gs

N, D, LR = 1024, 64, 0.05


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(np.float32)
    y = (x @ rng.standard_normal(D) + 0.1 * rng.standard_normal(N)).astype(np.float32)
    return x, y


# ---- the loop, written once -------------------------------------------------------------------
#
# Each version is prepared once (data on the device; the graph captured) and then run whole:
# ``prepare() -> run``, where ``run()`` starts from zero weights and returns (weights, total).
# The step and the float path are written once for any array library with ``@``, ``.T`` and
# ``.mean()`` whose ``+=``/``-=`` work in place (CuPy, PyTorch, NumPy).

Version = Callable[[], Callable[[], tuple[Any, float]]]
SCALE = 2.0 * LR / N  # the gradient of the mean squared error is 2/n * X^T err


def train_step(x: Any, y: Any, w: Any, total: Any, matmul: Callable[[Any, Any], Any]) -> None:
    """One SGD step of least squares; the loss is added to the 0-d device array ``total``."""
    err = matmul(x, w) - y
    total += (err * err).mean()
    w -= SCALE * matmul(x.T, err)


def _float_and_eager(x: Any, y: Any, zeros: Callable[[tuple[int, ...]], Any],
                     steps: int) -> dict[str, Callable[[], tuple[Any, float]]]:
    def float_path() -> tuple[Any, float]:
        w = zeros((D,))
        total = 0.0
        for _ in range(steps):
            err = x @ w - y
            total += float((err * err).mean())  # one sync per step
            w -= SCALE * (x.T @ err)
        return w, total

    def eager_path() -> tuple[Any, float]:
        w, total = zeros((D,)), zeros(())
        for _ in range(steps):
            train_step(x, y, w, total, operator.matmul)
        return w, float(total)  # the one read

    return {"float": float_path, "eager": eager_path}


def cupy_versions(xp: Any, steps: int, chunk: int) -> dict[str, Version]:
    """The loop's versions on ``xp`` (CuPy; NumPy works too, where the graph is a re-run)."""
    x_host, y_host = _data()
    x, y = xp.asarray(x_host), xp.asarray(y_host)

    def zeros(shape: tuple[int, ...]) -> Any:
        return xp.zeros(shape, dtype=np.float32)

    def prepare_graph() -> Callable[[], tuple[Any, float]]:
        w, total = zeros((D,)), zeros(())

        def block() -> None:
            for _ in range(chunk):
                train_step(x, y, w, total, gs.matmul)  # CuPy's @ refuses to be captured

        replay = gs.capture(block, warmup=1)

        def run() -> tuple[Any, float]:
            w[...] = 0.0
            total[...] = 0.0
            for _ in range(steps // chunk):
                replay()
            return w, float(gs.GPUScalar(total))

        return run

    def eager_gs_matmul() -> tuple[Any, float]:
        w, total = zeros((D,)), zeros(())
        for _ in range(steps):
            train_step(x, y, w, total, gs.matmul)  # the graph's kernels, run eagerly
        return w, float(gs.GPUScalar(total))

    paths = _float_and_eager(x, y, zeros, steps)
    return {"cupy float": lambda: paths["float"], "cupy eager": lambda: paths["eager"],
            "cupy eager gs.matmul": lambda: eager_gs_matmul, "cupy graph": prepare_graph}


def torch_versions(torch: Any, steps: int, chunk: int) -> dict[str, Version]:
    """The same loop in PyTorch on CUDA; its graph through ``torch.cuda.graph``."""
    x_host, y_host = _data()
    x = torch.as_tensor(x_host, device="cuda")
    y = torch.as_tensor(y_host, device="cuda")

    def zeros(shape: tuple[int, ...]) -> Any:
        return torch.zeros(shape, dtype=torch.float32, device="cuda")

    def prepare_graph() -> Callable[[], tuple[Any, float]]:
        w, total = zeros((D,)), zeros(())

        def block() -> None:
            for _ in range(chunk):
                train_step(x, y, w, total, operator.matmul)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on the capturing stream, as PyTorch advises
            block()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            block()

        def run() -> tuple[Any, float]:
            w.zero_()
            total.zero_()
            for _ in range(steps // chunk):
                graph.replay()
            return w, float(total)

        return run

    paths = _float_and_eager(x, y, zeros, steps)
    return {"torch float": lambda: paths["float"], "torch eager": lambda: paths["eager"],
            "torch graph": prepare_graph}


def _host(weights: Any) -> np.ndarray:
    return weights.get() if hasattr(weights, "get") else weights.cpu().numpy()


def measure(steps: int, chunk: int, repeats: int) -> dict[str, Any]:
    import cupy

    versions = cupy_versions(cupy, steps, chunk)
    try:
        import torch

        if torch.cuda.is_available():
            versions.update(torch_versions(torch, steps, chunk))
    except ImportError:
        pass
    rows, weights = {}, {}
    for name, prepare in versions.items():
        run = prepare()  # the data on the device, the graph captured
        run()  # untimed: compilation and first cuBLAS calls
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            w, total = run()  # ends with one read of the total: queued work is inside
            times.append(time.perf_counter() - start)
        weights[name] = _host(w)
        rows[name] = {"median_ms": statistics.median(times) * 1e3, "total": total,
                      "times_ms": [t * 1e3 for t in times]}
    reference = weights["cupy eager"]
    for name, row in rows.items():
        row["max_weight_difference_vs_cupy_eager"] = float(np.max(np.abs(weights[name] -
                                                                          reference)))
        row["speedup_vs_cupy_float"] = rows["cupy float"]["median_ms"] / row["median_ms"]
    totals = {name: row["total"] for name, row in rows.items()}
    return {"steps": steps, "chunk": chunk, "repeats": repeats, "n": N, "d": D,
            "device": gs.devices.describe(gs.get_backend("cupy")), "versions": rows,
            "identical_to_eager": identical_to_eager(weights, totals)}


#: each graph and the eager run of the same kernels it must equal bit for bit
GRAPH_REFERENCES = {"cupy graph": "cupy eager gs.matmul", "torch graph": "torch eager"}


def identical_to_eager(weights: dict[str, np.ndarray],
                       totals: dict[str, float]) -> dict[str, dict[str, Any]]:
    """For each graph measured, whether its weights and total equal (``==``, bit for bit) those
    of the eager run of the same kernels."""
    found = {}
    for graph, eager in GRAPH_REFERENCES.items():
        if graph in weights and eager in weights:
            same_weights = bool(np.array_equal(weights[graph], weights[eager]))
            found[graph] = {"reference": eager, "weights_bitwise_equal": same_weights,
                            "total_equal": totals[graph] == totals[eager],
                            "max_weight_difference": float(np.max(np.abs(weights[graph] -
                                                                         weights[eager])))}
    return found


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'version':<21} {'median':>10} {'vs cupy float':>14} {'max |w - w_eager|':>18}"]
    for name, row in result["versions"].items():
        lines.append(f"{name:<21} {row['median_ms']:>8.1f}ms "
                     f"{row['speedup_vs_cupy_float']:>13.1f}x "
                     f"{row['max_weight_difference_vs_cupy_eager']:>18.2e}")
    for graph, check in result.get("identical_to_eager", {}).items():
        verdict = ("identical" if check["weights_bitwise_equal"] and check["total_equal"]
                   else f"NOT identical (max |w diff| {check['max_weight_difference']:.2e}, "
                        f"totals equal: {check['total_equal']})")
        lines.append(f"{graph} vs {check['reference']} (same kernels, eager): {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--chunk", type=int, default=10, help="steps per captured graph")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE", default=None)
    args = parser.parse_args(argv)
    for name in ("steps", "chunk", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.steps % args.chunk:
        parser.error(f"--steps ({args.steps}) must be a multiple of --chunk ({args.chunk})")
    if not gs.gpu_available():
        print("bench/gpu_capture.py needs a CUDA GPU with CuPy; none found here, nothing "
              "measured.")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump({"measured": False, "reason": "no CUDA GPU"}, handle)
        return 0
    result = measure(args.steps, args.chunk, args.repeats)
    print(f"linear regression n={N} d={D}, {args.steps} steps, loss accumulated every step, "
          f"graphs of {args.chunk} steps; median of {args.repeats} runs after 1 untimed run")
    print(f"device: {result['device']}")
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"measured": True, **result}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
