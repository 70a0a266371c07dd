"""pytest-benchmark: GPUScalar scalar-op overhead (``pytest bench --benchmark-enable``).

Each benchmark times the GPUScalar op; the raw backend 0-d op is timed alongside and the ratio
recorded in ``extra_info``. The exact device-op count (one backend call per op) is asserted,
which also runs in CI where benchmarks are disabled.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuscalar as gs

from .overhead import best_time, cases

CASES = cases(np)


@pytest.mark.parametrize("name", sorted(CASES))
def test_scalar_op_overhead(benchmark, name):
    ours, raw = CASES[name]
    with gs.count_syncs() as counter:
        result = ours()
    assert counter.device_ops == 1 and counter.count == 0
    assert isinstance(result, gs.GPUScalar)
    benchmark(ours)
    if benchmark.enabled:
        benchmark.extra_info["raw_ns"] = best_time(raw, 20000, 5) * 1e9
        benchmark.extra_info["ratio"] = (
            best_time(ours, 20000, 5) * 1e9 / benchmark.extra_info["raw_ns"]
        )
