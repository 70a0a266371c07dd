"""Counting on the strict device, the measurements and the ``gpuscalar bench`` command line."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import devices
from gpuscalar.__main__ import main as cli_main
from gpuscalar.tools import benchmarks
from gpuscalar.tools.workloads import WORKLOADS

# ---- counts on the strict device ------------------------------------------------------------


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_counts_gpuscalar_path_reads_at_most_what_the_host_needs(name):
    workload = WORKLOADS[name]
    params = workload.params("quick")
    float_syncs, float_ops, _ = benchmarks.count_path(workload, "float", params)
    gs_syncs, gs_ops, _ = benchmarks.count_path(workload, "gpuscalar", params)
    assert gs_syncs <= workload.host_values_needed(params)
    assert gs_syncs < float_syncs
    assert float_ops > 0 and gs_ops > 0
    # the strict device sees the same gpuscalar reads as gpuscalar itself on NumPy
    with gs.count_syncs() as counter:
        workload.run("gpuscalar", np, params)
    assert counter.count == gs_syncs


@pytest.mark.parametrize("size", ["quick", "default"])
def test_gpuscalar_paths_launch_no_more_than_the_float_paths(size):
    """Lazy scalars (folded into the array kernels and the fused optimizer steps) make every
    gpuscalar path issue at most the device ops of its float path, with fewer syncs."""
    for name, workload in WORKLOADS.items():
        params = workload.params(size)
        float_syncs, float_ops, _ = benchmarks.count_path(workload, "float", params)
        gs_syncs, gs_ops, _ = benchmarks.count_path(workload, "gpuscalar", params)
        assert gs_ops <= float_ops, (name, gs_ops, float_ops)
        assert gs_syncs < float_syncs


def test_lr_schedule_costs_two_device_ops_per_step():
    """The gradient and the fused update: the schedule and the step counter cost nothing."""
    workload = WORKLOADS["lr_schedule"]
    counts = {}
    for steps in (100, 200):
        params = workload.params("quick", steps=steps)
        counts[steps] = benchmarks.count_path(workload, "gpuscalar", params)
    assert counts[200][1] - counts[100][1] == 2 * 100
    assert counts[100][0] == counts[200][0] == 0  # no sync at all


def test_float_path_sync_counts_follow_the_code():
    p = WORKLOADS["train_logging"].params("quick")
    assert benchmarks.count_path(WORKLOADS["train_logging"], "float", p)[0] == p["steps"]
    p = WORKLOADS["clip_adam"].params("quick")
    syncs = benchmarks.count_path(WORKLOADS["clip_adam"], "float", p)[0]
    assert syncs == p["steps"] * len(p["shapes"])
    p = WORKLOADS["broadcast_ad"].params("quick")
    assert benchmarks.count_path(WORKLOADS["broadcast_ad"], "float", p)[0] == 2 * p["steps"]
    p = WORKLOADS["jacobi"].params("quick")
    syncs, _, answer = benchmarks.count_path(WORKLOADS["jacobi"], "float", p)
    assert syncs == sum(answer["iterations"])  # one residual check per iteration
    p = WORKLOADS["lr_schedule"].params("quick")
    assert benchmarks.count_path(WORKLOADS["lr_schedule"], "float", p)[0] == p["steps"]


# ---- measurements --------------------------------------------------------------------------


def test_measure_reports_counts_times_and_agreement():
    result = benchmarks.measure(WORKLOADS["lr_schedule"], devices.NUMPY, "quick", 2)
    assert result.float.syncs == 100 and result.gpuscalar.syncs == 0
    assert len(result.float.times_s) == 2 and result.gpuscalar.median_s > 0
    assert result.gpuscalar.gpuscalar_syncs_on_backend == 0
    assert max(result.max_difference.values()) < 1e-12
    assert result.time_ratio == result.float.median_s / result.gpuscalar.median_s
    table = benchmarks.format_table([result])
    assert "lr_schedule" in table and "100 -> 0" in table


@pytest.mark.parametrize("repeats", [0, 1.5])
def test_measure_rejects_bad_repeats(repeats):
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        benchmarks.measure(WORKLOADS["lr_schedule"], devices.NUMPY, "quick", repeats)


def test_a_device_repeat_count_is_named_without_a_sync():
    with gs.sync_guard("error"), pytest.raises(
            ValueError, match="repeats must be a positive int, got a GPUScalar of dtype int64"):
        benchmarks.measure(WORKLOADS["lr_schedule"], devices.NUMPY, "quick",
                           gs.asscalar(3))


def test_max_difference_of_floats_lists_and_arrays():
    assert benchmarks.max_difference(1.0, 1.25) == 0.25
    assert benchmarks.max_difference([1.0, 2.0], np.array([1.0, 2.5])) == 0.5
    assert benchmarks.max_difference([np.zeros(2), np.ones(2)], [np.zeros(2), np.full(2, 3.0)]) == 2


# ---- the command line ------------------------------------------------------------------------


def test_bench_quick_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert cli_main(["bench", "--quick", "--backend", "numpy", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["backend"] == "numpy"
    assert report["device"] == devices.describe(devices.NUMPY)
    assert report["size"] == "quick" and report["repeats"] == 5
    assert report["date"][:4].isdigit()
    assert {"python", "numpy", "gpuscalar"} <= set(report["versions"])
    assert [w["name"] for w in report["workloads"]] == list(WORKLOADS)
    for entry in report["workloads"]:
        assert entry["name"] in printed
        assert entry["gpuscalar"]["syncs"] <= entry["host_values_needed"]
        assert entry["gpuscalar"]["syncs"] < entry["float"]["syncs"]
        assert entry["float"]["median_s"] > 0 and entry["gpuscalar"]["median_s"] > 0
        assert max(entry["max_difference"].values()) < 1e-9
        assert (f"{entry['float']['syncs']} -> {entry['gpuscalar']['syncs']} -> "
                f"{entry['capture']['syncs']}") in printed


def test_bench_runs_a_selected_workload_on_the_default_backend(capsys, monkeypatch):
    monkeypatch.setattr(devices, "gpu_available", lambda: False)
    assert benchmarks.main(["--quick", "--workload", "jacobi"]) == 0
    printed = capsys.readouterr().out
    assert "numpy backend" in printed and "jacobi" in printed and "train_logging" not in printed


def test_bench_unknown_backend_is_a_usage_error(capsys):
    assert benchmarks.main(["--backend", "tpu"]) == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_bench_unknown_workload_is_a_usage_error(capsys):
    assert benchmarks.main(["--workload", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_bench_cupy_without_gpu_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(devices, "gpu_available", lambda: False)
    assert benchmarks.main(["--backend", "cupy", "--quick"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "--backend cupy needs CuPy and a CUDA device" in captured.err


def test_bench_unwritable_json_fails_before_running(tmp_path, capsys):
    target = tmp_path / "missing" / "bench.json"
    assert benchmarks.main(["--quick", "--backend", "numpy", "--json", str(target)]) == 2
    captured = capsys.readouterr()
    assert "cannot write --json" in captured.err and captured.out == ""


def test_bench_on_the_strict_device_explains_its_numbers(capsys):
    assert benchmarks.main(["--quick", "--backend", "strict", "--workload", "lr_schedule"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "strict backend" in out
    assert "No GPU: times are CPU times (strict)" in out  # said before the table
    assert out.index("No GPU") < out.index("device ops")
    assert "legend: 'a -> b -> c' = float path -> gpuscalar path -> gpuscalar + capture path" in out


class _Terminal:
    """A stand-in stderr that says it is a terminal and keeps what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.mark.parametrize("quiet", [False, True])
def test_bench_progress_goes_to_a_terminal_only_and_not_when_quiet(monkeypatch, capsys, quiet):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = ["--quick", "--backend", "numpy", "--workload", "lr_schedule", "--workload", "jacobi"]
    assert benchmarks.main(argv + (["--quiet"] if quiet else [])) == 0
    lines = terminal.text.splitlines()
    assert lines == ([] if quiet else ["gpuscalar bench: [1/2] lr_schedule ...",
                                       "gpuscalar bench: [2/2] jacobi ..."])
    assert "[1/2]" not in capsys.readouterr().out  # progress never mixes into the results


def test_bench_progress_is_silent_when_stderr_is_not_a_terminal(capsys):
    assert benchmarks.main(["--quick", "--backend", "numpy", "--workload", "jacobi"]) == 0
    assert capsys.readouterr().err == ""  # captured stderr is no terminal


def test_overhead_script_asked_for_cupy_without_a_gpu_exits_2(monkeypatch, capsys):
    from bench import overhead

    monkeypatch.setattr(gs, "gpu_available", lambda: False)
    assert overhead.main(["--backend", "cupy"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "needs CuPy and a CUDA device" in captured.err


def test_fold_overhead_measures_every_row_with_one_launch_per_fold():
    """bench/fold_overhead.py runs CuPy's real dispatch over fake memory: every row must time
    (a row that CuPy refuses, or that launches more than expected, prints a reason instead)."""
    from bench import fold_overhead

    from .cupy_fake import refuse_on_a_gpu

    refuse_on_a_gpu()
    results = fold_overhead.measure(number=1, repeat=1)
    assert results and all(isinstance(value, float) for value in results.values()), results
