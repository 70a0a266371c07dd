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


def test_the_captured_chunk_is_one_device_op_per_replay_on_the_strict_device():
    run = gpu_capture.cupy_versions(gs.strict.xp, steps=20, chunk=5)["cupy graph"]()
    with gs.count_syncs() as counter:
        run()
    # two in-place resets and 4 replays; then the one read of the total (a sync, not an op)
    assert counter.device_ops == 2 + 4 and counter.count == 1


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
