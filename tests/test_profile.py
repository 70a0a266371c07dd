"""profile.py: ``gpuscalar profile SCRIPT [ARGS...]``, in-process and as a real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import gpuscalar as gs
from gpuscalar import profile

SCRIPTS = Path(__file__).parent / "scripts"
LOOP = str(SCRIPTS / "loop.py")


def _line_of(script: Path | str, marker: str) -> int:
    """Line number of the first line of ``script`` that contains ``marker``."""
    lines = Path(script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def _report_rows(stderr: str) -> list[list[str]]:
    """The data rows of the report table in ``stderr`` (after the header row)."""
    lines = stderr.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split() == ["count", "site", "function", "reason"]
    )
    rows = []
    for line in lines[header + 1 :]:
        cells = line.split()
        if len(cells) != 4 or not cells[0].isdigit():
            break
        rows.append(cells)
    return rows


@pytest.fixture
def no_cupy(monkeypatch):
    """Profile gpuscalar's syncs only, as on a machine without a GPU (whatever this one has)."""
    monkeypatch.setattr(profile, "_cupy_countable", lambda: False)


def test_reports_syncs_by_call_site(capsys, no_cupy):
    assert profile.main([LOOP, "4"]) == 0
    out, err = capsys.readouterr()
    assert out == "final loss 2.857\n"
    assert err.splitlines()[0] == "gpuscalar: 5 syncs, 8 device ops"
    bool_line, format_line = _line_of(LOOP, "a bool() read"), _line_of(LOOP, "a format() read")
    short = os.path.relpath(LOOP)
    assert _report_rows(err) == [
        ["4", f"{short}:{bool_line}", "step", "bool"],
        ["1", f"{short}:{format_line}", "main", "format"],
    ]
    assert "gpuscalar syncs only" in err


def test_script_runs_as_main_with_its_argv_and_path(capsys, no_cupy):
    probe = str(SCRIPTS / "argv_probe.py")
    argv_before, path_before = list(sys.argv), list(sys.path)
    main_before = sys.modules["__main__"]
    # Options after SCRIPT belong to the script, not to the profiler.
    assert profile.main([probe, "--json", "x.json", "--fail-over", "0"]) == 0
    seen = json.loads(capsys.readouterr().out)
    assert seen["argv"] == [probe, "--json", "x.json", "--fail-over", "0"]
    assert seen["path0"] == str(SCRIPTS)
    assert seen["name"] == "__main__" and seen["file"] == probe and seen["main_is_me"]
    assert not Path("x.json").exists()
    assert sys.argv == argv_before and sys.path == path_before
    assert sys.modules["__main__"] is main_before


@pytest.mark.parametrize(
    ("code", "status", "message"),
    [
        ("exit=0", 0, ""),
        ("exit=3", 3, ""),
        ("exit=none", 0, ""),
        ("exit=stopped here", 1, "stopped here"),
    ],
)
def test_exit_status_of_the_script_is_propagated(capsys, no_cupy, code, status, message):
    assert profile.main([str(SCRIPTS / "argv_probe.py"), code]) == status
    err = capsys.readouterr().err
    assert "gpuscalar: 0 syncs" in err
    if message:
        assert err.splitlines()[0] == message


def test_failing_script_prints_traceback_and_report_and_exits_1(capsys, no_cupy):
    script = str(SCRIPTS / "fails.py")
    assert profile.main([script]) == 1
    out, err = capsys.readouterr()
    assert out == "total 6.0\n"
    traceback_text, report = err.split("gpuscalar: ", 1)
    assert traceback_text.startswith("Traceback (most recent call last):\n")
    assert f'File "{script}", line {_line_of(script, "raise ValueError")}' in traceback_text
    assert "profile.py" not in traceback_text  # the traceback starts in the user's script
    assert traceback_text.rstrip().endswith("ValueError: the sample script fails on purpose")
    assert report.startswith("1 sync, 1 device op")
    assert _report_rows(err)[0][1].endswith(f"fails.py:{_line_of(script, 'total {total}')}")


def test_json_output(tmp_path, capsys, no_cupy):
    target = tmp_path / "syncs.json"
    assert profile.main(["--json", str(target), LOOP, "2"]) == 0
    capsys.readouterr()
    data = json.loads(target.read_text())
    assert (data["count"], data["device_ops"], data["exit_status"]) == (3, 4, 0)
    assert data["script"] == LOOP and data["include_cupy"] is False
    assert [(s["function"], s["reason"], s["count"]) for s in data["sites"]] == [
        ("step", "bool", 2),
        ("main", "format", 1),
    ]
    assert data["sites"][0]["file"] == LOOP
    assert data["sites"][0]["line"] == _line_of(LOOP, "a bool() read")
    assert len(data["records"]) == 3


def test_json_into_a_missing_directory_is_an_error_before_running(tmp_path, capsys):
    target = tmp_path / "missing" / "syncs.json"
    assert profile.main(["--json", str(target), LOOP]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # the script did not run
    assert err.count("\n") == 1 and "does not exist" in err


@pytest.mark.parametrize(("limit", "status"), [(2, 1), (3, 0), (0, 1)])
def test_fail_over(capsys, no_cupy, limit, status):
    assert profile.main(["--fail-over", str(limit), LOOP, "2"]) == status
    err = capsys.readouterr().err
    assert ("more than --fail-over" in err) == (status == 1)
    if status:
        assert err.splitlines()[-1] == f"gpuscalar profile: 3 syncs, more than --fail-over {limit}"


def test_guard_error_stops_at_the_first_sync(capsys, no_cupy):
    assert profile.main(["--guard", "error", LOOP]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    site = f"{LOOP}:{_line_of(LOOP, 'a bool() read')}"
    assert f"gpuscalar.sync.SyncError: device->host sync (bool) at {site} in step()" in err
    assert "During handling" not in err
    assert "gpuscalar: 0 syncs" in err


def test_guard_warn_warns_at_each_sync(capsys, no_cupy):
    with pytest.warns(gs.SyncWarning) as caught:
        assert profile.main(["--guard", "warn", LOOP, "1"]) == 0
    assert [(w.filename, w.lineno) for w in caught.list] == [
        (LOOP, _line_of(LOOP, "a bool() read")),
        (LOOP, _line_of(LOOP, "a format() read")),
    ]
    assert "gpuscalar: 2 syncs" in capsys.readouterr().err


def test_cupy_syncs_are_counted_when_cupy_is_usable(capsys, monkeypatch):
    if "cupy._core.syncdetect" not in sys.modules:
        try:
            import cupy._core.syncdetect  # noqa: F401
        except ImportError:  # no CuPy: a stand-in module plays its part
            stand_in = types.ModuleType("cupy._core.syncdetect")
            stand_in._declare_synchronize = lambda: None
            monkeypatch.setitem(sys.modules, "cupy._core.syncdetect", stand_in)
            monkeypatch.setitem(sys.modules, "cupy._core", types.ModuleType("cupy._core"))
            monkeypatch.setattr(sys.modules["cupy._core"], "syncdetect", stand_in, raising=False)
    monkeypatch.setattr(profile, "_cupy_countable", lambda: True)
    script = str(SCRIPTS / "cupy_syncs.py")
    assert profile.main([script]) == 0
    err = capsys.readouterr().err
    short = os.path.relpath(script)
    assert _report_rows(err) == [
        ["2", f"{short}:{_line_of(script, 'what every CuPy')}", "<module>", "cupy"],
        ["1", f"{short}:{_line_of(script, 'print(float')}", "<module>", "float"],
    ]
    assert "gpuscalar syncs only" not in err


def test_missing_script_is_a_one_line_error(capsys):
    assert profile.main(["no/such/script.py"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gpuscalar profile: error: cannot open script 'no/such/script.py': "
        "No such file or directory\n"
    )


def test_script_that_does_not_compile_is_a_one_line_error(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("x = 1\ndef broken(:\n    pass\n")
    assert profile.main([str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuscalar profile: error: cannot compile {script} (line 2): ")
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "no SCRIPT given: name the Python file to run"),
        (["--fail-over", "-1", LOOP], "must be >= 0"),
        (["--fail-over", "many", LOOP], "expected a whole number"),
        (["--guard", "sometimes", LOOP], "invalid choice"),
        (["--bogus", LOOP], "unrecognized arguments"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, words):
    assert profile.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and words in err and "Traceback" not in err
    assert "ARGS" not in err.splitlines()[-1]  # a script's arguments are never required


def test_help_exits_0(capsys):
    assert profile.main(["--help"]) == 0
    assert "--fail-over N" in capsys.readouterr().out


def test_command_line_runs_in_a_fresh_process(tmp_path):
    target = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuscalar",
            "profile",
            "--json",
            str(target),
            "--fail-over",
            "1",
            LOOP,
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == "final loss 2.857\n"
    assert done.stderr.splitlines()[0] == "gpuscalar: 3 syncs, 4 device ops"
    assert done.stderr.splitlines()[-1] == "gpuscalar profile: 3 syncs, more than --fail-over 1"
    assert json.loads(target.read_text())["count"] == 3
