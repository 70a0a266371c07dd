"""bench/gpu_report.py: its CPU behaviour, the section runner, the sync-table check, the writers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import gpu_report
from gpuscalar import strict
from gpuscalar.tools.workloads import WORKLOADS


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(gpu_report.REPO / "bench" / "gpu_report.py"),
                           *args], capture_output=True, text=True, timeout=120)


def test_without_a_gpu_it_says_so_writes_a_report_and_exits_0(tmp_path):
    if gpu_report.environment()["gpu"]:
        pytest.skip("a GPU is present: the report itself is the test there")
    result = _run("--out", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    assert "no GPU found" in result.stdout and "nothing was measured" in result.stdout
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["environment"]["gpu"] is False and report["sections"] == []
    assert report["environment"]["numpy"] and report["environment"]["date"]
    assert "cupy" in report["environment"]  # its version, or None where CuPy is not installed
    assert "No GPU was found" in (tmp_path / "report" / "report.md").read_text()


def test_out_is_required_and_must_be_writable(tmp_path):
    missing = _run()
    assert missing.returncode == 2 and "--out DIR is required" in missing.stderr
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    unwritable = _run("--out", str(blocker / "inside"))
    assert unwritable.returncode == 2 and "cannot write to --out" in unwritable.stderr


def _section(name, code, budget=20.0, **kwargs):
    return gpu_report.Section(name, name.title(), (sys.executable, "-c", code), budget, **kwargs)


def test_sections_run_in_their_own_processes_and_failures_stay_local(tmp_path):
    sections = [
        _section("good", "print('fine')"),
        _section("broken", "raise SystemExit('it broke')"),
        _section("slow", "import time; time.sleep(30)", budget=1.0),
        _section("absent", "print('never')", requires="bench/no_such_script.py"),
        _section("after", "print('still runs')"),
    ]
    results = gpu_report.run_sections(sections, tmp_path, total_budget_s=60)
    by_name = {r.name: r for r in results}
    assert by_name["good"].status == "ok" and "fine" in by_name["good"].output_tail
    assert by_name["broken"].status == "failed" and "it broke" in by_name["broken"].output_tail
    assert by_name["slow"].status == "timeout" and "limit" in by_name["slow"].reason
    assert by_name["absent"].status == "skipped" and "does not exist" in by_name["absent"].reason
    assert by_name["after"].status == "ok"


def test_a_section_writes_json_that_the_report_collects(tmp_path):
    code = "import json, sys; json.dump({'answer': 42}, open(sys.argv[1], 'w'))"
    section = gpu_report.Section("data", "Data", (sys.executable, "-c", code, "{json}"), 20,
                                 writes_json=True)
    (result,) = gpu_report.run_sections([section], tmp_path, total_budget_s=30)
    assert result.status == "ok" and result.data == {"answer": 42}


def test_sections_past_the_overall_budget_are_skipped(tmp_path):
    sections = [_section("first", "import time; time.sleep(2)"), _section("second", "pass")]
    results = gpu_report.run_sections(sections, tmp_path, total_budget_s=6)
    assert [r.status for r in results] == ["ok", "skipped"]
    assert "no time left" in results[1].reason


def test_every_planned_section_exists_and_fits_the_budget():
    names = [s.name for s in gpu_report.SECTIONS]
    assert names[-1] == "tests"  # measurements first, the long suite last
    assert {"environment", "syncs", "bench", "adam", "overhead", "demo", "capture"} <= set(names)
    for section in gpu_report.SECTIONS:
        script = section.argv[1]
        if script.endswith(".py") and not section.requires:
            assert (gpu_report.REPO / script).exists(), script
    # the suite gets what the measurements leave, and they always leave it a minute and a half
    measurements = sum(s.budget_s for s in gpu_report.SECTIONS[:-1])
    assert gpu_report.TOTAL_BUDGET_S - measurements >= 80
    budgets = {s.name: s.budget_s for s in gpu_report.SECTIONS}
    # cold NVRTC compiles (Adam, the optimizer table) and a PyTorch import (capture) need room
    assert budgets["adam"] >= 50 and budgets["capture"] >= 35
    assert gpu_report.TOTAL_BUDGET_S < 300  # five minutes, with room for the script itself


def test_pytest_counts_come_from_the_final_summary_line():
    output = ("....F..s\n=== short test summary info ===\nFAILED tests/test_a.py::test_b - 2 "
              "passed\n2 failed, 1200 passed, 9 skipped, 1 error, 3 warnings in 31.20s\n")
    assert gpu_report.pytest_counts(output) == {"failed": 2, "passed": 1200, "skipped": 9,
                                                "errors": 1, "warnings": 3}
    assert gpu_report.pytest_counts("1300 passed in 20.01s") == {"passed": 1300}
    assert gpu_report.pytest_counts("....\n[ 40%]") == {}  # stopped before its summary


def test_the_driver_version_is_read_from_either_kernel_module_text():
    closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159  Tue Oct 28 2025\nGCC 12"
    opened = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
    assert gpu_report.module_version(closed) == "580.159"
    assert gpu_report.module_version(opened) == "580.95.05"
    assert gpu_report.module_version("no driver here") is None
    assert (gpu_report._cuda_version(13000), gpu_report._cuda_version(12080)) == ("13.0", "12.8")


def test_a_section_without_json_can_parse_its_output(tmp_path):
    code = "print('..s'); print('2 passed, 1 skipped in 0.10s'); raise SystemExit(1)"
    section = gpu_report.Section("tests", "Tests", (sys.executable, "-c", code), 20,
                                 parse=gpu_report.pytest_counts)
    (result,) = gpu_report.run_sections([section], tmp_path, total_budget_s=30)
    assert result.status == "failed" and result.returncode == 1
    assert result.data == {"passed": 2, "skipped": 1}
    text = gpu_report.to_markdown({"gpu": True}, [result])
    assert "counts: 2 passed, 1 skipped" in text and "| tests | failed |" in text


def test_workload_sync_tables_show_only_the_stated_reads_on_the_strict_device():
    rows = gpu_report.workload_sync_tables(strict.xp, size="quick")
    assert [r["workload"] for r in rows] == list(WORKLOADS)
    for row in rows:
        assert row["only_stated_reads"], row
        assert row["table"].startswith(f"gpuscalar: {row['syncs']} sync")


def test_overhead_labels_a_cpu_read_as_no_gpu_sync(tmp_path):
    result = subprocess.run([sys.executable, str(gpu_report.REPO / "bench" / "overhead.py"),
                             "--number", "50", "--json", str(tmp_path / "o.json")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "queue idle:" in result.stdout and "not a GPU sync" in result.stdout
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["read_is_device_sync"] is False and data["read_latency_us"] > 0
    assert set(data["ops"]) == {"s + 1.0", "s * t", "s < t", "-s", "gs.sqrt(s)"}


def test_markdown_names_every_section_and_flags_extra_reads():
    rows = [{"workload": "w", "syncs": 3, "needed": 1, "only_stated_reads": False,
             "table": "gpuscalar: 3 syncs"}]
    results = [
        gpu_report.SectionResult("syncs", "Sync table", "failed", 1.0, 1, "", {"workloads": rows}),
        gpu_report.SectionResult("demo", "The demo", "ok", 2.0, 0, "demo output"),
    ]
    text = gpu_report.to_markdown({"gpu": True, "device": "NVIDIA H100"}, results)
    assert "## Sync table" in text and "## The demo" in text and "demo output" in text
    assert "MORE THAN STATED" in text and "No GPU" not in text


def test_a_test_section_out_of_time_still_reports_its_counts(tmp_path):
    """At its limit the test section is interrupted first: pytest prints its summary line
    (the counts so far) before it stops, so the report says how far it got."""
    suite = tmp_path / "test_slow.py"
    suite.write_text("import time\n\ndef test_quick():\n    pass\n\n"
                     "def test_also_quick():\n    pass\n\n"
                     "def test_slow():\n    time.sleep(60)\n")
    section = gpu_report.Section(
        "tests", "Tests", (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:gpuscalar", "-o", "addopts=", str(suite)),
        8.0, parse=gpu_report.pytest_counts, interrupt=True)
    (result,) = gpu_report.run_sections([section], tmp_path, total_budget_s=60)
    assert result.status == "timeout"
    assert result.data.get("passed") == 2, result.output_tail


def test_the_test_section_runs_without_pytest_benchmark(monkeypatch):
    """pyproject's addopts name pytest-benchmark's flag, which pytest refuses without the
    plugin (a GPU machine may lack it): the command then overrides addopts and leaves bench/
    out; with the plugin it is unchanged."""
    argv = gpu_report.SECTIONS[-1].argv
    real_find_spec = gpu_report.importlib.util.find_spec
    monkeypatch.setattr(gpu_report.importlib.util, "find_spec",
                        lambda name: None if name == "pytest_benchmark" else real_find_spec(name))
    adjusted = gpu_report._without_pytest_benchmark(argv)
    assert adjusted[:len(argv)] == argv and adjusted[len(argv):] == (
        "-o", "addopts=-rfE", "--ignore=bench")
    monkeypatch.setattr(gpu_report.importlib.util, "find_spec", real_find_spec)
    assert gpu_report._without_pytest_benchmark(argv) == argv


def test_tests_gpu_narrows_the_test_section_to_what_ci_cannot_run(monkeypatch):
    """``--tests gpu``: the test section selects the GPU's own tests (-k), spread over xdist
    workers with a per-test limit where those plugins are installed; the other sections, and
    ``--tests all``, are unchanged."""
    assert gpu_report.sections_for("all") == gpu_report.SECTIONS
    real_find_spec = gpu_report.importlib.util.find_spec
    for present in (True, False):
        monkeypatch.setattr(
            gpu_report.importlib.util, "find_spec",
            lambda name, present=present: (real_find_spec("json") if present else None)
            if name in ("xdist", "pytest_timeout") else real_find_spec(name))
        narrowed = gpu_report.sections_for("gpu")
        assert narrowed[:-1] == gpu_report.SECTIONS[:-1]
        extra = narrowed[-1].argv[len(gpu_report.SECTIONS[-1].argv):]
        assert extra[:2] == gpu_report.GPU_TESTS_ONLY
        assert (("-n", "12", "--timeout", "120") if present else ()) == extra[2:]
        assert narrowed[-1].name == "tests" and narrowed[-1].interrupt


def test_a_section_keeps_its_whole_output_beside_the_report(tmp_path):
    long = "\n".join(f"line {i}" for i in range(200))
    results = gpu_report.run_sections([_section("chatty", f"print({long!r})")], tmp_path,
                                      total_budget_s=60)
    assert results[0].status == "ok"
    kept = (tmp_path / "chatty.log").read_text()
    assert "line 0" in kept and "line 199" in kept and "line 0" not in results[0].output_tail
