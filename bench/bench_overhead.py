"""pytest-benchmark: GPUScalar scalar-op overhead (``pytest bench --benchmark-enable``).

Each benchmark times the GPUScalar op (lazily: recording its node(s)); the raw backend 0-d op is
timed alongside and the ratio recorded in ``extra_info``. The exact device-op counts (none
lazily, the backend calls eagerly) are asserted, which also runs in CI where benchmarks
are disabled.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpuscalar as gs

from .overhead import best_time, cases, helper_cases

CASES = {name: (ours, raw, 1, 1) for name, (ours, raw) in cases(np).items()}
CASES.update(helper_cases(np))


@pytest.mark.parametrize("name", sorted(CASES))
def test_scalar_op_overhead(benchmark, name):
    ours, raw, nodes, calls = CASES[name]
    with gs.count_syncs() as counter:
        result = ours()
    assert counter.device_ops == 0 and counter.count == 0  # pending expression(s)
    results = result if isinstance(result, tuple) else (result,)
    assert all(isinstance(r, gs.GPUScalar) and not r.is_materialized for r in results)
    assert sum(r._node[1] for r in results) == nodes  # the nodes recorded
    with gs.lazy(False), gs.count_syncs() as counter:
        result = ours()
    results = result if isinstance(result, tuple) else (result,)
    # eager: each result is its node evaluated at once (divmod's two: two device ops)
    assert counter.device_ops == calls * len(results) and counter.count == 0
    assert all(r.is_materialized for r in results)
    benchmark(ours)
    if benchmark.enabled:
        benchmark.extra_info["raw_ns"] = best_time(raw, 20000, 5) * 1e9
        benchmark.extra_info["ratio"] = (
            best_time(ours, 20000, 5) * 1e9 / benchmark.extra_info["raw_ns"]
        )
