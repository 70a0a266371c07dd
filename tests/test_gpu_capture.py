"""bench/gpu_capture.py: without a GPU it says so; its loop's versions agree (run on NumPy,
where the captured version is re-run under the sync guard)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import gpuscalar as gs
from bench import gpu_capture

from .helpers import host


@pytest.mark.parametrize("xp", [np, gs.strict.xp], ids=["numpy", "strict"])
def test_the_three_versions_of_the_loop_agree(xp):
    """On the CPU the captured version re-runs its chunk under the sync guard (the strict
    device's own reads guarded too), so this also shows the captured step is sync-free."""
    versions = gpu_capture.cupy_versions(xp, steps=20, chunk=5)
    results = {name: prepare()() for name, prepare in versions.items()}
    reference_w, reference_total = results["cupy eager"]
    assert reference_total > 0
    for weights, total in results.values():
        np.testing.assert_allclose(host(weights), host(reference_w), rtol=1e-6)
        assert total == pytest.approx(reference_total, rel=1e-6)


@pytest.mark.parametrize("xp", [np, gs.strict.xp], ids=["numpy", "strict"])
def test_the_graph_equals_the_eager_run_of_its_kernels_bit_for_bit(xp):
    versions = gpu_capture.cupy_versions(xp, steps=20, chunk=5)
    weights, totals = {}, {}
    for name in ("cupy eager gs.matmul", "cupy graph", "cupy eager"):
        w, totals[name] = versions[name]()()
        weights[name] = host(w).copy()
    found = gpu_capture.identical_to_eager(weights, totals)
    assert found == {"cupy graph": {"reference": "cupy eager gs.matmul",
                                    "weights_bitwise_equal": True, "total_equal": True,
                                    "max_weight_difference": 0.0}}
    weights["cupy graph"][0] = np.nextafter(weights["cupy graph"][0], np.float32(np.inf))
    changed = gpu_capture.identical_to_eager(weights, totals)["cupy graph"]
    assert not changed["weights_bitwise_equal"] and changed["max_weight_difference"] > 0
    text = gpu_capture.format_table({"versions": {}, "identical_to_eager": found})
    assert "cupy graph vs cupy eager gs.matmul (same kernels, eager): identical" in text


def test_the_captured_chunk_is_one_device_op_per_replay_on_the_strict_device():
    run = gpu_capture.cupy_versions(gs.strict.xp, steps=20, chunk=5)["cupy graph"]()
    with gs.count_syncs() as counter:
        run()
    # two in-place resets and 4 replays; then the one read of the total (a sync, not an op)
    # of gs.GPUScalar(total), a value: its copy is one device op
    assert counter.device_ops == 2 + 4 + 1 and counter.count == 1


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    if gs.gpu_available():
        pytest.skip("a GPU is present: the script measures instead")
    out = tmp_path / "capture.json"
    result = subprocess.run([sys.executable, gpu_capture.__file__, "--json", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "nothing measured" in result.stdout
    assert json.loads(out.read_text()) == {"measured": False, "reason": "no CUDA GPU"}


@pytest.mark.parametrize("argv", [["--steps", "25", "--chunk", "10"], ["--repeats", "0"]])
def test_bad_arguments_are_refused(argv):
    result = subprocess.run([sys.executable, gpu_capture.__file__, *argv], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and ("multiple of --chunk" in result.stderr
                                       or "--repeats must be at least 1" in result.stderr)
