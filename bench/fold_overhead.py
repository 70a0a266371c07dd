"""gpuscalar's own Python per call on the CuPy path, measured without a GPU.

Why this benchmark exists: a pending scalar folded into an array operation (``lr_expr * g``)
saves a launch only if gpuscalar's Python before CuPy's launch stays well below a launch
(~10 us of CPU time in CuPy). That cost cannot be seen on NumPy (another code path) and a GPU is
rarely at hand, so this script runs the real CuPy path on real ``cupy.ndarray`` objects over
fake, host-backed device memory (`tests.cupy_fake`) and replaces the two calls that need the CUDA
runtime: the launch (`gpuscalar.devices.CUPY.call`) by a recorder that returns the output array
(the caller's ``out``, or a preallocated fake array of the result's shape), and the device switch
(``CUPY.device_context``) by a no-op. What is timed is then gpuscalar's Python plus CuPy's
argument handling up to the launch call (``cupy.multiply(..., out=w)`` dispatch for that row).

Rows (best of ``--repeat`` runs, microseconds per call):

- *fold*: a repeated fold of the same expression structure (``lr_expr = lr * 0.5 + 1e-3``,
  2 nodes, stays pending when consumed): ``lr_expr * g``, ``g * lr_expr`` and the ``out=`` path
  that ``w -= lr_expr * g`` style updates take (``cupy.multiply(lr_expr, g, out=w)``). Targets:
  <= 3 us per repeated fold;
- *node*: recording one node (``lr * 0.5``). Target: <= 1.5 us;
- *materialize*: computing a 2-node expression into a new 0-d array (one launch).

A row whose call CuPy itself refuses before gpuscalar runs (a CuPy dispatch defect being fixed
elsewhere) prints the error instead of a time. Run ``python bench/fold_overhead.py`` from the
repository root (``--json FILE`` also writes the numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's tests package

import gpuscalar as gs  # noqa: E402
from gpuscalar.devices import CUPY  # noqa: E402
from gpuscalar.lazy import fusion  # noqa: E402
from tests.cupy_fake import fake_memory, from_host  # noqa: E402

SIZE = 1024


@contextlib.contextmanager
def recorded_launches(result: Any) -> Iterator[list[int]]:
    """CuPy launches replaced by a recorder (counts them; returns the output array without
    running anything) and device switches by a no-op, for the block."""
    launches = [0]

    def call(func: Any, *args: Any, **kwargs: Any) -> Any:
        launches[0] += 1
        out = kwargs.get("out")
        if out is not None:
            return out
        nin, nout = getattr(func, "nin", None), getattr(func, "nout", None)
        if nin is not None and len(args) == nin + nout:  # outputs passed positionally
            return args[-1] if nout == 1 else args[nin:]
        return result

    saved = CUPY.__dict__.get("call"), CUPY.__dict__.get("device_context")
    CUPY.call = call  # type: ignore[method-assign]
    no_switch = contextlib.nullcontext()  # reusable: the stand-in allocates nothing per call
    CUPY.device_context = lambda device: no_switch  # type: ignore[method-assign]
    seam = CUPY.seam
    seam.is_current_device = lambda device: True  # (a read of the CUDA runtime otherwise)
    try:
        yield launches
    finally:
        del seam.is_current_device
        for name, value in zip(("call", "device_context"), saved, strict=True):
            if value is None:
                delattr(CUPY, name)
            else:
                setattr(CUPY, name, value)


def cases(memory: Any) -> dict[str, tuple[Callable[[], Any], int]]:
    """name -> (call, launches it makes)."""
    import cupy  # noqa: PLC0415 - the script needs CuPy, imported where it is used

    g = from_host(memory, np.linspace(0.0, 1.0, SIZE))
    w = from_host(memory, np.ones(SIZE))
    lr = gs.GPUScalar(from_host(memory, np.float64(0.1)))

    def pending() -> gs.GPUScalar:
        return lr * 0.5 + 1e-3

    left, right, into = pending(), pending(), pending()
    root = pending()._node  # a fixed expression for the materialize row
    device = lr.device
    return {
        "fold: lr_expr * g": (lambda: left * g, 1),
        "fold: g * lr_expr": (lambda: g * right, 1),
        "fold: multiply(lr_expr, g, out=w)": (lambda: cupy.multiply(into, g, out=w), 1),
        "node: lr * 0.5": (lambda: lr * 0.5, 0),
        "materialize (2 nodes)": (lambda: fusion.materialize(CUPY, root, device), 1),
        "  of which cupy.empty(()) (CuPy + fake allocator)": (
            lambda: cupy.empty((), dtype=np.float64), 0),
    }


def measure(number: int, repeat: int) -> dict[str, Any]:
    """name -> best microseconds per call (or the error the call raised)."""
    results: dict[str, Any] = {}
    with fake_memory() as memory:
        result = from_host(memory, np.zeros(SIZE))
        with recorded_launches(result) as launches:
            for name, (call, expected) in cases(memory).items():
                before = launches[0]
                try:
                    call()
                except Exception as error:  # noqa: BLE001 - reported in the table
                    results[name] = f"{type(error).__name__}: {str(error)[:60]}"
                    continue
                if launches[0] - before != expected:
                    results[name] = f"made {launches[0] - before} launches, not {expected}"
                    continue
                best = min(timeit.repeat(call, number=number, repeat=repeat))
                results[name] = best / number * 1e6
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000, help="calls per timing run")
    parser.add_argument("--repeat", type=int, default=7, help="timing runs (best is kept)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    if gs.gpu_available():
        print("bench/fold_overhead.py measures the CuPy path over fake memory, for machines "
              "without a GPU; here use: python bench/overhead.py --backend cupy", file=sys.stderr)
        return 2
    results = measure(args.number, args.repeat)
    width = max(map(len, results))
    print(f"{'case':<{width}}  us/call (gpuscalar's Python on the CuPy path, no launch)")
    for name, value in results.items():
        shown = f"{value:8.2f}" if isinstance(value, float) else value
        print(f"{name:<{width}}  {shown}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
