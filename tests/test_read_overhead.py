"""bench/read_overhead.py: the table it prints, and a clean exit where it cannot measure."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "read_overhead.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("read_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_nullcuda_it_exits_2_with_one_clear_line(monkeypatch, capsys):
    bench = _bench_module()

    def missing():
        raise ModuleNotFoundError("No module named 'nullcuda'")

    monkeypatch.setattr(bench.harness, "import_nullcuda", missing)
    assert bench.main(["--n", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("read_overhead: cannot measure (ModuleNotFoundError: ")
    assert "nullcuda needs CuPy 14" in err


def test_the_table_has_every_case_side_by_side_with_ratios():
    """Wall time on nullcuda, in a fresh process (it must load beneath CuPy before CuPy)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--n", "20"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    if done.returncode == 2 and "cannot measure" in done.stderr:
        pytest.skip(done.stderr.strip())  # no nullcuda here (no CuPy 14, gcc, ...)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpuscalar ") and "on nullcuda (no GPU)" in lines[0]
    assert lines[1].split()[:3] == ["case", "ns", "(wall)"]
    labels = [line[:24].rstrip() for line in lines[2:6]]
    assert labels == ["cupy float(a)", "float(s) unread", "float(GPUScalar(a))", "float(s) cached"]
    assert lines[2].split()[-1] == "1.00x"
    assert all(line.split()[-1].endswith("x") for line in lines[2:6])
    assert lines[6].startswith("goal: float(s) unread within 1.5x of cupy float(a): ")
