"""pytest_plugin.py: the ``sync_counter`` fixture, ``max_syncs`` marker and session report.

Each test writes a small test file and runs pytest on it with ``pytester`` (inline, except one
run in a fresh process to prove the plugin is loaded through its ``pytest11`` entry point).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

HEADER = """
import numpy as np
import pytest

import gpuscalar as gs
"""


def _write(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_inner=HEADER + body)


def _line_of(pytester: pytest.Pytester, marker: str) -> int:
    lines = (pytester.path / "test_inner.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def test_sync_counter_counts_the_test_body_only(pytester):
    _write(
        pytester,
        """
@pytest.fixture
def warmed():
    float(gs.sum(np.ones(3)))  # a sync in set-up: not the body's
    yield
    float(gs.sum(np.ones(3)))  # nor in tear-down

def test_body(warmed, sync_counter):
    assert sync_counter.count == 0 and sync_counter.device_ops == 0
    s = gs.sum(np.ones(3))
    float(s)
    float(s)
    assert sync_counter.count == 1 and sync_counter.device_ops == 1
    assert sync_counter.records[0].reason == "float"
    assert sync_counter.records[0].function == "test_body"

def test_fresh_counter_per_test(sync_counter):
    assert sync_counter.count == 0
""",
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)


def test_max_syncs_passes_at_the_limit_and_fails_over_it_with_the_report(pytester):
    _write(
        pytester,
        """
@pytest.mark.max_syncs(2)
def test_at_limit():
    bool(gs.sum(np.ones(3)) > 1)
    bool(gs.sum(np.ones(3)) > 1)

@pytest.mark.max_syncs(2)
def test_over_limit():
    for _ in range(3):
        bool(gs.sum(np.ones(3)) > 1)  # the loop's sync

@pytest.mark.max_syncs(n=0)
def test_zero_budget_keyword():
    gs.sum(np.ones(3)) * 2

@pytest.mark.max_syncs(0)
def test_failure_inside_the_body_is_reported_as_is():
    assert gs.sum(np.ones(3)).item() == 4.0
""",
    )
    result = pytester.runpytest("-rA")
    result.assert_outcomes(passed=2, failed=2)
    line = _line_of(pytester, "the loop's sync")
    result.stdout.fnmatch_lines(
        [
            "*3 gpuscalar syncs in the test body, more than max_syncs(2)",
            "gpuscalar: 3 syncs, 6 device ops",
            f"*3  test_inner.py:{line}  test_over_limit  bool",
        ]
    )
    result.stdout.fnmatch_lines(["*assert 3.0 == 4.0*"])
    assert "more than max_syncs(0)" not in result.stdout.str()
    assert "traceback entries are hidden" not in result.stdout.str()


def test_max_syncs_counts_with_the_sync_counter_fixture(pytester):
    _write(
        pytester,
        """
@pytest.mark.max_syncs(1)
def test_both(sync_counter):
    float(gs.sum(np.ones(3)))
    float(gs.sum(np.ones(3)))
    assert sync_counter.count == 2
""",
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*2 gpuscalar syncs in the test body, more than max_syncs(1)"])


BAD_MARKERS = [
    ("max_syncs", "TypeError: @pytest.mark.max_syncs takes exactly one argument*"),
    ("max_syncs(1, 2)", "TypeError: @pytest.mark.max_syncs takes exactly one argument*"),
    ("max_syncs(limit=3)", "TypeError: @pytest.mark.max_syncs takes exactly one argument*"),
    ("max_syncs('3')", "TypeError: @pytest.mark.max_syncs(n) takes an int, got str '3'"),
    ("max_syncs(True)", "TypeError: @pytest.mark.max_syncs(n) takes an int, got bool True"),
    ("max_syncs(-1)", "ValueError: @pytest.mark.max_syncs(n) takes n >= 0, got -1"),
]


def test_bad_max_syncs_markers_fail_with_a_clear_error(pytester):
    _write(
        pytester,
        "".join(
            f"\n@pytest.mark.{marker}\ndef test_marked_{i}():\n    pass\n"
            for i, (marker, _) in enumerate(BAD_MARKERS)
        ),
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=len(BAD_MARKERS))
    for i, (_, message) in enumerate(BAD_MARKERS):
        result.stdout.fnmatch_lines([f"*_ test_marked_{i} _*", f"E*{message}"])
    assert "pytest_plugin.py" not in result.stdout.str()


def test_marker_is_registered(pytester):
    _write(pytester, "\n@pytest.mark.max_syncs(5)\ndef test_marked():\n    pass\n")
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)
    pytester.runpytest("--markers").stdout.fnmatch_lines(["@pytest.mark.max_syncs(n): fail*"])


def test_session_report(pytester):
    _write(
        pytester,
        """
def test_two():
    float(gs.sum(np.ones(3)))
    bool(gs.sum(np.ones(3)) > 2)  # the second sync (of a value never read: 2 device ops)

def test_none():
    gs.sum(np.ones(3))

def test_one(sync_counter):
    float(gs.mean(np.ones(3)))
""",
    )
    result = pytester.runpytest("--gpuscalar-report")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*gpuscalar sync report*",
            "3 syncs, 5 device ops in the bodies of 3 tests",
            "tests with the most syncs:",
            "      2  test_inner.py::test_two",
            "      1  test_inner.py::test_one",
            "gpuscalar: 3 syncs, 5 device ops",
            "*count  site*function*reason",
        ]
    )
    result.stdout.fnmatch_lines([f"*1  test_inner.py:{_line_of(pytester, 'the second')}*bool"])
    assert "test_inner.py::test_none" not in result.stdout.str()


def test_no_report_without_the_option(pytester):
    _write(pytester, "\ndef test_sync():\n    float(gs.sum(np.ones(3)))\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    assert "gpuscalar sync report" not in result.stdout.str()


def test_plugin_is_loaded_through_the_entry_point_in_a_fresh_process(pytester):
    _write(
        pytester,
        """
def test_loaded(request):
    assert request.config.pluginmanager.hasplugin("gpuscalar")

@pytest.mark.max_syncs(0)
def test_budget():
    float(gs.sum(np.ones(3)))
""",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*1 gpuscalar syncs in the test body, more than max_syncs(0)"])
    disabled = pytester.runpytest_subprocess("-p", "no:gpuscalar", "-p", "no:cacheprovider")
    disabled.assert_outcomes(passed=1, failed=1)  # max_syncs unchecked; test_loaded fails
    disabled.stdout.fnmatch_lines(["FAILED test_inner.py::test_loaded*"])


def test_session_report_says_test_for_one_test(pytester):
    _write(pytester, "def test_only():\n    float(gs.sum(np.ones(3)))\n")
    result = pytester.runpytest("--gpuscalar-report")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["1 sync, 1 device op in the bodies of 1 test"])


def test_syncs_in_threads_the_test_starts_are_counted_at_their_line(pytester):
    _write(
        pytester,
        """
import threading

def work():
    float(gs.sum(np.ones(3)))  # the worker's sync

def run_workers(n):
    workers = [threading.Thread(target=work) for _ in range(n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

def test_counter(sync_counter):
    run_workers(2)
    assert sync_counter.count == 2 and sync_counter.device_ops == 2
    assert {r.function for r in sync_counter.records} == {"work"}

@pytest.mark.max_syncs(1)
def test_budget():
    run_workers(2)
""",
    )
    result = pytester.runpytest("--gpuscalar-report")
    result.assert_outcomes(passed=1, failed=1)
    line = _line_of(pytester, "the worker's sync")
    result.stdout.fnmatch_lines(
        [
            "*2 gpuscalar syncs in the test body, more than max_syncs(1)",
            f"*2  test_inner.py:{line}  work      float",
        ]
    )
    result.stdout.fnmatch_lines(["4 syncs, 4 device ops in the bodies of 2 tests"])


def test_library_reads_are_not_part_of_a_budget(pytester):
    _write(
        pytester,
        """
from gpuscalar.strict import xp

@pytest.mark.max_syncs(1)
def test_checks_its_result(sync_counter):
    x = xp.arange(3.0)
    assert float(gs.sum(x)) == 3.0  # gpuscalar's read: the budget's
    assert x.get().tolist() == [0.0, 1.0, 2.0]  # the test's own check of its result
    assert sync_counter.count == 1
""",
    )
    pytester.runpytest().assert_outcomes(passed=1)
