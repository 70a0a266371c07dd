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


def test_the_three_versions_of_the_loop_agree_on_numpy():
    versions = gpu_capture.cupy_versions(np, steps=20, chunk=5)
    results = {name: prepare()() for name, prepare in versions.items()}
    reference_w, reference_total = results["cupy eager"]
    for weights, total in results.values():
        np.testing.assert_allclose(weights, reference_w, rtol=1e-6)
        assert total == pytest.approx(reference_total, rel=1e-6)


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
