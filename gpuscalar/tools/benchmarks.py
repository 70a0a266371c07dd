"""``gpuscalar bench``: syncs, device ops and time of every workload's three paths.

Why this module exists: the workloads (`gpuscalar.workloads`) show what gpuscalar changes, and
this module measures it the same way on every machine.

*Counts* come from the **strict device** (`gpuscalar.strict`): duck arrays over NumPy that act
like CuPy arrays (reductions return 0-d arrays, not Python scalars; implicit host conversion is
refused) and declare every host read (``float()``, ``int()``, ``bool()``, ``if``, ``format``,
...) as a sync and every array-library call (ufunc, reduction, ``xp.*`` function, ``copy``) as
one device op. That counts the float path's ``float(x.sum())`` — which never passes through
gpuscalar — by the same rule as gpuscalar's own reads. The counts are properties of the program,
not of the machine: they are what a GPU would see.

*Times* come from the selected backend (CuPy when a GPU is present, else NumPy): the median of
several runs of each path, each run ending with one read of the answer so that work still queued
on a GPU is included. On NumPy a sync costs nothing, so CPU time ratios mostly measure Python
overhead; see the README's "Benchmarks" section.
"""

from __future__ import annotations

import argparse
import builtins
import datetime
import json
import platform
import statistics
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import __version__, devices, strict, sync
from ..reduce import max as device_max
from ..reduce import sum as device_sum
from ..scalar import GPUScalar
from .workloads import PATHS, WORKLOADS, ArrayModule, Workload, get_workload

__all__ = [
    "PathResult",
    "WorkloadResult",
    "count_path",
    "settle",
    "measure",
    "max_difference",
    "format_table",
    "LEGEND",
    "cpu_note",
    "progress",
    "main",
]

# ---- counting on the strict device ----------------------------------------------------------


def count_path(
    workload: Workload, path: str, params: dict[str, Any]
) -> tuple[int, int, dict[str, Any]]:
    """(syncs, device ops, answer) of one path on the strict device; inputs are not counted.

    The counter sees gpuscalar's reads and the device's own (``float(x.sum())`` on a plain
    array), and every array-library call as a device op: what a GPU would see.
    """
    inputs = workload.make_inputs(strict.xp, params)
    counter = sync.SyncCounter(include_cupy=True)  # the device's own reads count too
    with sync._activate(counter):
        answer = workload.run(path, strict.xp, params, inputs)
    return counter.count, counter.device_ops, answer


# ---- timing on the real backend ------------------------------------------------------------


@dataclass
class PathResult:
    """Counts (strict device) and times (selected backend) of one path of one workload."""

    syncs: int
    device_ops: int
    times_s: list[float]
    median_s: float
    #: syncs gpuscalar itself counted on the selected backend (the float path's reads of
    #: plain arrays never pass through gpuscalar, so this is 0 there)
    gpuscalar_syncs_on_backend: int


@dataclass
class WorkloadResult:
    name: str
    description: str
    params: dict[str, Any]
    host_values_needed: int
    host_values_reason: str
    float: PathResult
    gpuscalar: PathResult
    capture: PathResult
    #: answer key -> largest absolute difference between the float path's answer and each
    #: other path's (backend run)
    max_difference: dict[str, builtins.float]  # `float` here is the field above

    @property
    def time_ratio(self) -> builtins.float:
        """Float-path median time over gpuscalar median time (> 1: gpuscalar is faster)."""
        return self.float.median_s / self.gpuscalar.median_s

    @property
    def capture_ratio(self) -> builtins.float:
        """Float-path median time over the captured path's (> 1: the graphs are faster)."""
        return self.float.median_s / self.capture.median_s


def settle(answer: dict[str, Any]) -> None:
    """Wait for the answer's device work: read one reduction of its first array, if any.

    Each timed run ends with this read so that a GPU's queued kernels are inside the timing;
    on NumPy it costs one tiny reduction, the same for both paths.
    """
    for value in answer.values():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, GPUScalar):
                float(item)
                return
            if devices.backend_of(item) is not None:
                float(device_sum(item))
                return


def _time_path(workload: Workload, path: str, xp: ArrayModule, params: dict[str, Any],
               repeats: int) -> tuple[list[float], int, dict[str, Any]]:
    inputs = workload.make_inputs(xp, params)
    settle(inputs)
    times, syncs, answer = [], 0, {}
    for _ in range(repeats):
        start = time.perf_counter()
        with sync.count_syncs() as counter:
            answer = workload.run(path, xp, params, inputs)
        settle(answer)
        times.append(time.perf_counter() - start)
        syncs = counter.count
    return times, syncs, answer


def measure(workload: Workload, backend: devices.Backend, size: str = "default",
            repeats: int = 5) -> WorkloadResult:
    """Count and time both paths of ``workload`` at ``size`` on ``backend``."""
    if type(repeats) is not int or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {sync.describe(repeats)}")
    params = workload.params(size)
    xp = backend.xp
    paths, answers = {}, {}
    for path in PATHS:
        syncs, ops, _ = count_path(workload, path, params)
        times, backend_syncs, answers[path] = _time_path(workload, path, xp, params, repeats)
        paths[path] = PathResult(syncs, ops, times, statistics.median(times), backend_syncs)
    differences = {
        f"{path}:{key}": max_difference(answers["float"][key], answers[path][key])
        for path in PATHS[1:]
        for key in answers["float"]
    }
    return WorkloadResult(
        name=workload.name,
        description=workload.description,
        params=params,
        host_values_needed=workload.host_values_needed(params),
        host_values_reason=workload.host_values_reason,
        float=paths["float"],
        gpuscalar=paths["gpuscalar"],
        capture=paths["capture"],
        max_difference=differences,
    )


def max_difference(a: Any, b: Any) -> float:
    """Largest absolute difference between two answers' values (floats, lists or arrays of
    one backend), computed on the device and read once."""
    if isinstance(a, (list, tuple)) and a and not isinstance(a[0], (int, float)):
        return max(max_difference(x, y) for x, y in zip(a, b, strict=True))
    backend = devices.backend_of(a) or devices.backend_of(b)
    if backend is None:
        return float(np.max(np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))))
    xp = backend.xp
    a, b = xp.asarray(a), xp.asarray(b)
    return float(device_max(xp.abs(a - b)))


# ---- the command line ----------------------------------------------------------------------


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "gpuscalar": __version__}
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        versions["cupy"] = cupy.__version__
    return versions


def _format_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def format_table(results: Sequence[WorkloadResult]) -> str:
    """The one table: counts float -> gpuscalar (-> gpuscalar + capture, where a replay is one
    device op), median times of the three paths and their ratios to the float path."""
    header = ("workload", "syncs", "device ops", "time float", "time gpuscalar", "ratio",
              "gpuscalar + capture", "ratio")
    rows = [header]
    for r in results:
        rows.append((
            r.name,
            f"{r.float.syncs} -> {r.gpuscalar.syncs} -> {r.capture.syncs}",
            f"{r.float.device_ops} -> {r.gpuscalar.device_ops} -> {r.capture.device_ops}",
            _format_time(r.float.median_s),
            _format_time(r.gpuscalar.median_s),
            f"{r.time_ratio:.2f}x",
            _format_time(r.capture.median_s),
            f"{r.capture_ratio:.2f}x",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def progress(message: str, *, quiet: bool = False) -> None:
    """One line of progress on stderr for a run longer than a couple of seconds; silent with
    ``quiet`` or when stderr is not a terminal (logs and pipes get only the results)."""
    if not quiet and sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


LEGEND = ("legend: 'a -> b -> c' = float path -> gpuscalar path -> gpuscalar + capture path. "
          "Syncs and device ops are counted on the strict device: the same on any machine "
          "(on a GPU every array call is one launch, a graph replay is one). "
          "ratio = float time / that path's time (> 1: faster than the float path).")


def cpu_note(backend: devices.Backend) -> str | None:
    """Where the backend evaluates on the host (NumPy, the strict device), what the times mean
    and what carries over to a GPU; None on a GPU."""
    if not backend.evaluates_on_host:
        return None
    return (f"No GPU: times are CPU times ({backend.name}), where a sync is free and a launch "
            "costs ~0.5 us, so they measure gpuscalar's Python overhead, not what it saves. "
            "The counts carry over to a GPU: each sync stalls the pipeline, each launch costs "
            "~10 us of CPU time in CuPy.")


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=100)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuscalar bench",
        description="Run each workload's float, gpuscalar and captured paths and print one "
        "table: syncs and device ops (counted), median times and ratios to the float path.",
    )
    parser.add_argument("--backend", choices=("numpy", "strict", "cupy"), default=None,
                        help="array backend for the timings (default: cupy with a GPU, "
                        "else numpy; strict: the CuPy-strict CPU device)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines on stderr")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the numbers, date, device and versions to FILE")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and 5 repeats (a few seconds)")
    parser.add_argument("--workload", action="append", choices=tuple(WORKLOADS), default=None,
                        help="run only this workload (repeatable)")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``gpuscalar bench``; returns the exit status (2 for bad usage)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse already printed a one-line reason
        return int(exit_.code or 0)
    if args.backend == "cupy":
        if not devices.gpu_available():
            print("gpuscalar bench: --backend cupy needs CuPy and a CUDA device, and none was "
                  "found; use --backend numpy", file=sys.stderr)
            return 2
        backend = devices.get_backend("cupy")
    elif args.backend is not None:
        backend = devices.get_backend(args.backend)
    else:
        backend = devices.default_backend()
    if args.json:
        try:
            with open(args.json, "a", encoding="utf-8"):
                pass  # fail now, not after the run
        except OSError as error:
            print(f"gpuscalar bench: cannot write --json {args.json!r}: {error.strerror}",
                  file=sys.stderr)
            return 2
    size, repeats = ("quick", 5) if args.quick else ("default", 7)
    names = args.workload or list(WORKLOADS)
    results = []
    for number, name in enumerate(names, 1):
        progress(f"gpuscalar bench: [{number}/{len(names)}] {name} ...", quiet=args.quiet)
        results.append(measure(get_workload(name), backend, size, repeats))
    device = devices.describe(backend)
    print(f"gpuscalar bench: {backend.name} backend, {device}, {size} sizes, median of "
          f"{repeats} runs")
    note = cpu_note(backend)
    if note is not None:
        print(_wrapped(note))
    print(format_table(results))
    print(_wrapped(LEGEND))
    if args.json:
        report = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": backend.name,
            "device": device,
            "versions": _versions(),
            "size": size,
            "repeats": repeats,
            "workloads": [
                {**asdict(r), "time_ratio": r.time_ratio, "capture_ratio": r.capture_ratio}
                for r in results
            ],
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
            handle.write("\n")
        print(f"wrote {args.json}")
    return 0
