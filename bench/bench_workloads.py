"""pytest-benchmark suite: every workload, float path and gpuscalar path, timed side by side.

Why this file exists: ``pytest bench/ --benchmark-enable`` times each version on the default
backend (CuPy with a GPU, else NumPy) with the sync and device-op counts in
``benchmark.extra_info``. By default the suite runs with ``--benchmark-disable`` (pyproject), so
each body runs once at the "quick" size as a plain test and the sync-count assertions run in CI;
with ``--benchmark-enable`` the "default" size is timed.

The workloads themselves live in `gpuscalar.tools.workloads` (shared with ``gpuscalar bench``).
"""

from __future__ import annotations

import pytest

import gpuscalar as gs
from gpuscalar.tools.benchmarks import count_path, settle
from gpuscalar.tools.workloads import PATHS, WORKLOADS

BACKEND = gs.default_backend()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload(benchmark, name: str, path: str) -> None:
    workload = WORKLOADS[name]
    size = "quick" if benchmark.disabled else "default"
    params = workload.params(size)
    syncs = {p: count_path(workload, p, params)[:2] for p in PATHS}
    needed = workload.host_values_needed(params)
    assert syncs["gpuscalar"][0] <= needed, "the gpuscalar path reads more than the host needs"
    assert syncs["gpuscalar"][0] < syncs["float"][0]
    benchmark.extra_info.update(
        syncs=syncs[path][0],
        device_ops=syncs[path][1],
        host_values_needed=needed,
        backend=BACKEND.name,
        size=size,
    )
    xp = BACKEND.xp
    inputs = workload.make_inputs(xp, params)
    settle(inputs)

    def run_once() -> dict:
        answer = workload.run(path, xp, params, inputs)
        settle(answer)  # a GPU's queued work belongs to the timing
        return answer

    answer = benchmark(run_once)
    assert set(answer) == set(workload.run("float", xp, params, inputs))
