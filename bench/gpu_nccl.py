"""gs.distributed on one GPU: the latency of a 0-d all-reduce, eager and inside a captured step.

    python bench/gpu_nccl.py [--steps 1000] [--repeats 5] [--json FILE]

Why this script exists: issue 25 asks for the NCCL latency of a 0-d all-reduce inside a captured
step, measured on a GPU. Two GPUs are rarely lent, so this measures what one GPU can: a NCCL
communicator of ONE rank (CuPy's ``NcclCommunicator``; NCCL refuses two ranks on one device),
where NCCL still enqueues its kernel on the stream, so the figure is the collective's launch
and device cost without the network. Three loops of ``--steps`` steps, each ``loss *= 0.5; loss +=
1.0`` on 0-d arrays and ``gs.distributed.all_reduce`` of it: eager (one NCCL call per step),
the same step recorded once with `gs.capture` (``steps=10``: ten steps per replay) and, for
reference, the step without the collective, captured alike. Each is the median of
``--repeats`` timed runs after one untimed run, each run ending with one read. Per step:
(loop time) / steps; the collective's share is captured minus captured without it.

Without a GPU, or without CuPy's NCCL, it says so and exits 0 (nothing measured, no number).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpuscalar as gs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run as a script, or loaded by path)
from gpu_control import _write, median_seconds  # noqa: E402 - the GPU benchmarks' one timer

#: steps recorded into one CUDA graph (one replay)
CHUNK = 10


def one_rank_communicator() -> Any:
    """CuPy's NCCL communicator of one rank on device 0 (ValueError naming why not)."""
    try:
        from cupy.cuda import nccl
    except ImportError as error:
        raise ValueError(f"CuPy's NCCL binding is not available: {error}") from None
    if not getattr(nccl, "available", True):
        raise ValueError("CuPy was built without NCCL")
    return nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)


def measure(loss: Any, half: Any, one: Any, comm: Any, steps: int,
            repeats: int) -> dict[str, Any]:
    """Per-step seconds of the eager loop, the captured loop, and the captured loop without
    the collective, on ``loss`` (a 0-d float64 array of the communicator's device; ``half``
    and ``one``: 0-d arrays of 0.5 and 1.0 there); the collective's syncs (must be 0)."""
    def step_without(x: Any) -> None:  # two kernels, in place (nothing allocated per step)
        x *= half
        x += one

    def step(x: Any) -> None:
        step_without(x)
        gs.distributed.all_reduce(x, "sum", comm=comm)  # one rank: the same value

    def eager() -> None:
        for _ in range(steps):
            step(loss)
        gs.read(loss)  # one read: the queued work is timed

    captured = gs.capture(step, loss, steps=CHUNK)
    captured_without = gs.capture(step_without, loss, steps=CHUNK)

    def replayed(chunk: Any) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps // CHUNK):
                chunk()
            gs.read(loss)  # one read: the queued work is timed
        return run

    with gs.count_syncs(include_cupy=True) as counter:
        step(loss)
    result = {
        "steps": steps,
        "syncs_per_collective": counter.count,
        "eager_s_per_step": median_seconds(eager, repeats) / steps,
        "captured_s_per_step": median_seconds(replayed(captured), repeats) / steps,
        "captured_without_s_per_step": median_seconds(replayed(captured_without), repeats)
        / steps,
    }
    result["collective_in_capture_s"] = (result["captured_s_per_step"]
                                         - result["captured_without_s_per_step"])
    captured.release()
    captured_without.release()
    return result


def report(result: dict[str, Any]) -> str:
    us = {key: value * 1e6 for key, value in result.items() if key.endswith("_s_per_step")
          or key == "collective_in_capture_s"}
    return "\n".join([
        f"0-d all_reduce on a one-rank NCCL communicator, {result['steps']} steps, "
        f"graphs of {CHUNK} steps",
        f"  eager                       {us['eager_s_per_step']:8.2f} us per step",
        f"  captured                    {us['captured_s_per_step']:8.2f} us per step",
        f"  captured, no collective     {us['captured_without_s_per_step']:8.2f} us per step",
        f"  the collective in a graph   {us['collective_in_capture_s']:8.2f} us",
        f"  syncs per collective: {result['syncs_per_collective']}",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_nccl.py", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE", default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not gs.gpu_available():
        print("bench/gpu_nccl.py: no CUDA GPU here: nothing was measured")
        _write(args.json, {"measured": False, "reason": "no CUDA GPU"})
        return 0
    try:
        comm = one_rank_communicator()
    except ValueError as error:
        print(f"bench/gpu_nccl.py: {error}: nothing was measured")
        _write(args.json, {"measured": False, "reason": str(error)})
        return 0
    import cupy

    steps = args.steps - args.steps % CHUNK or CHUNK
    result = measure(cupy.ones(()), cupy.full((), 0.5), cupy.ones(()), comm, steps, args.repeats)
    print(report(result))
    _write(args.json, {"measured": True, "device": cupy.cuda.runtime.getDeviceProperties(0)
                       ["name"].decode(), **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
