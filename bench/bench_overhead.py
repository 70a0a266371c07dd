"""pytest-benchmark: GPUScalar scalar-op overhead (``pytest bench --benchmark-enable``).

Each benchmark times the GPUScalar op (lazily: recording a node); the raw backend 0-d op is timed
alongside and the ratio recorded in ``extra_info``. The exact device-op counts (none lazily, one
backend call per op eagerly) are asserted, which also runs in CI where benchmarks are disabled.
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
    assert counter.device_ops == 0 and counter.count == 0  # a pending expression
    assert isinstance(result, gs.GPUScalar) and not result.is_materialized
    with gs.lazy(False), gs.count_syncs() as counter:
        result = ours()
    assert counter.device_ops == 1 and counter.count == 0 and result.is_materialized
    benchmark(ours)
    if benchmark.enabled:
        benchmark.extra_info["raw_ns"] = best_time(raw, 20000, 5) * 1e9
        benchmark.extra_info["ratio"] = (
            best_time(ours, 20000, 5) * 1e9 / benchmark.extra_info["raw_ns"]
        )
