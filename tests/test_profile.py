"""profile.py: ``gpuscalar profile [-m MODULE | SCRIPT] [ARGS...]``, in-process and as a real
command.

Counts are checked against ``count_syncs(include_cupy=True)`` running the same program in this
process (what the profiler reports must agree with it), and against the facts of the sample
scripts that do not depend on how gpuscalar avoids a read (one ``bool`` read per step of
``loop.py``, one read per worker of ``threads.py``, ...).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pytest

import gpuscalar as gs
from gpuscalar import profile

SCRIPTS = Path(__file__).parent / "scripts"
LOOP = str(SCRIPTS / "loop.py")
ROOT = Path(__file__).resolve().parent.parent


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


def _counted_in_process(script: str, *args: str) -> gs.SyncCounter:
    """The syncs ``count_syncs(include_cupy=True)`` counts while ``script`` runs as __main__
    in this process (its output swallowed; argv and path restored)."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(io.StringIO()), gs.count_syncs(include_cupy=True) as c:
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return c


def _rows_of(counter: gs.SyncCounter) -> list[list[str]]:
    """The report rows a counter's sites make (what `_report_rows` reads back)."""
    return [
        [str(s.count), f"{os.path.relpath(s.filename)}:{s.lineno}", s.function, s.reason]
        for s in counter.sites()
    ]


def test_reports_syncs_by_call_site(capsys):
    expected = _counted_in_process(LOOP, "4")
    assert profile.main([LOOP, "4"]) == 0
    out, err = capsys.readouterr()
    assert out == "final loss 2.857\n"
    assert err.splitlines()[0] == expected.report().splitlines()[0]  # the totals line
    rows = _report_rows(err)
    assert rows == _rows_of(expected)
    short = os.path.relpath(LOOP)
    assert rows[0] == ["4", f"{short}:{_line_of(LOOP, 'a bool() read')}", "step", "bool"]
    assert "syncs only" not in err  # every sync is counted, on any machine: no caveat


def test_script_runs_as_main_with_its_argv_and_path(capsys):
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
def test_exit_status_of_the_script_is_propagated(capsys, code, status, message):
    assert profile.main([str(SCRIPTS / "argv_probe.py"), code]) == status
    err = capsys.readouterr().err
    assert "gpuscalar: 0 syncs" in err
    if message:
        assert err.splitlines()[0] == message


def test_failing_script_prints_traceback_and_report_and_exits_1(capsys):
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


def test_json_output(tmp_path, capsys):
    target = tmp_path / "syncs.json"
    expected = _counted_in_process(LOOP, "2").to_dict()
    assert profile.main(["--json", str(target), LOOP, "2"]) == 0
    capsys.readouterr()
    data = json.loads(target.read_text())
    assert (data["count"], data["device_ops"], data["exit_status"]) == (
        expected["count"], expected["device_ops"], 0
    )
    assert data["script"] == LOOP and data["module"] is None
    assert data["include_cupy"] is True and data["all_threads"] is True
    assert data["sites"] == expected["sites"] and data["records"] == expected["records"]
    assert (data["sites"][0]["function"], data["sites"][0]["reason"]) == ("step", "bool")
    assert data["sites"][0]["count"] == 2  # one read per step
    assert data["sites"][0]["file"] == LOOP
    assert data["sites"][0]["line"] == _line_of(LOOP, "a bool() read")


def test_json_into_a_missing_directory_is_an_error_before_running(tmp_path, capsys):
    target = tmp_path / "missing" / "syncs.json"
    assert profile.main(["--json", str(target), LOOP]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # the script did not run
    assert err.count("\n") == 1 and "does not exist" in err


@pytest.mark.parametrize(("below", "status"), [(1, 1), (0, 0), (None, 1)])
def test_fail_over(capsys, below, status):
    syncs = _counted_in_process(LOOP, "2").count
    limit = 0 if below is None else syncs - below
    assert profile.main(["--fail-over", str(limit), LOOP, "2"]) == status
    err = capsys.readouterr().err
    assert ("more than --fail-over" in err) == (status == 1)
    if status:
        assert err.splitlines()[-1] == (
            f"gpuscalar profile: {syncs} syncs, more than --fail-over {limit}"
        )


def test_guard_error_stops_at_the_first_sync(capsys):
    assert profile.main(["--guard", "error", LOOP]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    site = f"{LOOP}:{_line_of(LOOP, 'a bool() read')}"
    assert f"gpuscalar.sync.SyncError: device->host sync (bool) at {site} in step()" in err
    assert "During handling" not in err
    assert "gpuscalar: 0 syncs" in err


def test_guard_warn_warns_at_each_sync(capsys):
    expected = _counted_in_process(LOOP, "1")
    with pytest.warns(gs.SyncWarning) as caught:
        assert profile.main(["--guard", "warn", LOOP, "1"]) == 0
    assert [(w.filename, w.lineno) for w in caught.list] == [
        (r.filename, r.lineno) for r in expected.records
    ]
    assert caught.list[0].lineno == _line_of(LOOP, "a bool() read")
    assert capsys.readouterr().err.splitlines()[0] == expected.report().splitlines()[0]


def test_cupy_syncs_are_counted_without_a_gpu(capsys, monkeypatch):
    if "cupy._core.syncdetect" not in sys.modules:
        try:
            import cupy._core.syncdetect  # noqa: F401
        except ImportError:  # no CuPy: a stand-in module plays its part
            stand_in = types.ModuleType("cupy._core.syncdetect")
            stand_in._declare_synchronize = lambda: None
            monkeypatch.setitem(sys.modules, "cupy._core.syncdetect", stand_in)
            monkeypatch.setitem(sys.modules, "cupy._core", types.ModuleType("cupy._core"))
            monkeypatch.setattr(sys.modules["cupy._core"], "syncdetect", stand_in, raising=False)
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
    syncs = _counted_in_process(LOOP, "2").count
    assert syncs > 1
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
    assert done.stderr.splitlines()[0].startswith(f"gpuscalar: {syncs} syncs, ")
    assert done.stderr.splitlines()[-1] == (
        f"gpuscalar profile: {syncs} syncs, more than --fail-over 1"
    )
    assert json.loads(target.read_text())["count"] == syncs


# ---- every sync: the strict device's own, worker threads -----------------------------------
STRICT = str(SCRIPTS / "strict_syncs.py")
THREADS = str(SCRIPTS / "threads.py")


def test_strict_device_syncs_are_all_counted_and_agree_with_count_syncs(capsys):
    expected = _counted_in_process(STRICT)
    assert profile.main([STRICT]) == 0
    out, err = capsys.readouterr()
    assert out == "total 6.0\n0.0 1.5 True\n"
    assert err.splitlines()[0] == "gpuscalar: 4 syncs, " + (
        f"{expected.device_ops} device ops"
    )
    short = os.path.relpath(STRICT)
    rows = sorted(_report_rows(err), key=lambda row: int(row[1].rsplit(":", 1)[1]))
    assert rows == [
        ["1", f"{short}:{_line_of(STRICT, 'total')}", "<module>", "format"],
        ["1", f"{short}:{_line_of(STRICT, 'explicit read')}", "<module>", "cupy"],
        ["1", f"{short}:{_line_of(STRICT, 'float() of')}", "<module>", "cupy"],
        ["1", f"{short}:{_line_of(STRICT, 'bool() of')}", "<module>", "cupy"],
    ]
    assert sorted(rows) == sorted(_rows_of(expected))  # count_syncs agrees, site by site


def test_strict_device_syncs_are_counted_where_cupy_cannot_be_imported():
    # A fresh process in which CuPy cannot be imported at all (None in sys.modules).
    code = (
        "import sys; sys.modules['cupy'] = None\n"
        "from gpuscalar.__main__ import main\n"
        f"status = main(['profile', {STRICT!r}])\n"
        "assert 'cupy' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith("gpuscalar: 4 syncs, ")


def test_worker_threads_syncs_are_counted_at_the_workers_line(capsys):
    assert profile.main([THREADS, "3"]) == 0
    out, err = capsys.readouterr()
    assert out == "done 2.0\n"
    short = os.path.relpath(THREADS)
    assert _report_rows(err) == [
        ["3", f"{short}:{_line_of(THREADS, 'a worker')}", "work", "float"],
        ["1", f"{short}:{_line_of(THREADS, 'main thread')}", "<module>", "format"],
    ]
    assert err.splitlines()[0].startswith("gpuscalar: 4 syncs, 4 device ops")  # 4 gs.sum


def test_a_numpy_script_does_not_make_profile_import_cupy(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        "import numpy as np\n"
        "import gpuscalar as gs\n"
        "float(gs.sum(np.ones(2)))\n"
        "print('cupy imported:', 'cupy' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpuscalar", "profile", str(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cupy imported: False\n"
    assert done.stderr.splitlines()[0] == "gpuscalar: 1 sync, 1 device op"


def test_cupy_imported_by_the_script_is_hooked_then(tmp_path):
    """CuPy installed but not imported when the profile starts: its syncs are still seen."""
    pytest.importorskip("cupy._core.syncdetect", reason="needs CuPy installed (no GPU needed)")
    script = tmp_path / "late_cupy.py"
    script.write_text(
        "import sys\n"
        "print('cupy imported before:', 'cupy' in sys.modules)\n"
        "from cupy._core import syncdetect\n"
        "syncdetect._declare_synchronize()  # what every CuPy copy to the host declares\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpuscalar", "profile", str(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cupy imported before: False\n"
    assert _report_rows(done.stderr) == [
        ["1", f"{script}:4", "<module>", "cupy"],
    ]


# ---- -m MODULE --------------------------------------------------------------------------------
def test_module_runs_as_python_dash_m_with_its_argv_and_path(capsys, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    argv_before, path_before = list(sys.argv), list(sys.path)
    main_before = sys.modules["__main__"]
    # Everything after MODULE belongs to the module, options of the profiler's own included.
    assert profile.main(["-m", "argv_probe", "--json", "x.json", "-m", "y"]) == 0
    seen = json.loads(capsys.readouterr().out)
    probe = str(SCRIPTS / "argv_probe.py")
    assert seen["argv"] == [probe, "--json", "x.json", "-m", "y"]
    assert seen["path0"] == str(SCRIPTS)  # the current directory, as `python -m` has it
    assert seen["name"] == "__main__" and seen["file"] == probe and seen["main_is_me"]
    assert not Path("x.json").exists()
    assert sys.argv == argv_before and sys.path == path_before
    assert sys.modules["__main__"] is main_before and "argv_probe" not in sys.modules


def test_module_syncs_are_reported_as_the_scripts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    assert profile.main([LOOP, "2"]) == 0
    as_script = capsys.readouterr()
    target = tmp_path / "m.json"
    assert profile.main(["--json", str(target), "-m", "loop", "2"]) == 0
    as_module = capsys.readouterr()
    assert as_module.out == as_script.out == "final loss 2.857\n"
    assert _report_rows(as_module.err) == _report_rows(as_script.err)
    data = json.loads(target.read_text())
    assert (data["module"], data["script"]) == ("loop", str(SCRIPTS / "loop.py"))


def test_module_of_a_package_runs_its_main(tmp_path, capsys, monkeypatch):
    package = tmp_path / "syncpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import numpy as np\nimport gpuscalar as gs\nprint(f'{gs.sum(np.ones(3)):.0f}')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert profile.main(["-m", "syncpkg"]) == 0
    out, err = capsys.readouterr()
    assert out == "3\n"
    assert _report_rows(err) == [
        ["1", f"{os.path.join('syncpkg', '__main__.py')}:3", "<module>", "format"]
    ]
    sys.modules.pop("syncpkg", None)


def test_failing_module_traceback_starts_in_the_module(capsys, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    assert profile.main(["-m", "fails"]) == 1
    err = capsys.readouterr().err
    traceback_text = err.split("gpuscalar: ", 1)[0]
    frames = [line for line in traceback_text.splitlines() if line.startswith('  File "')]
    assert frames and all(str(SCRIPTS / "fails.py") in frame for frame in frames)
    assert traceback_text.rstrip().endswith("ValueError: the sample script fails on purpose")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-m", "no_such_module_here"], "cannot find module 'no_such_module_here'"),
        (["-m", "json"], "is a package and cannot be directly executed"),
        (["-m"], "-m needs a MODULE name"),
    ],
)
def test_module_errors_exit_2_before_running(capsys, argv, words):
    assert profile.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and words in err and "Traceback" not in err
    assert "gpuscalar: " not in err  # nothing ran, so no report


# ---- a reader that closes the output early (`| head`) -------------------------------------------
def _with_reader_gone(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m gpuscalar ARGS`` with stdout a pipe whose reader has already closed."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails with EPIPE, as after `head` has quit
    try:
        return subprocess.run(
            [sys.executable, "-m", "gpuscalar", *args],
            stdout=write_end, stderr=subprocess.PIPE, timeout=120, cwd=ROOT,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["profile", "--help"], ["bench", "--help"]]
)
def test_no_broken_pipe_traceback_from_the_commands(args):
    done = _with_reader_gone(*args)
    assert done.stderr == b""  # no traceback, no "Exception ignored" at exit
    # 1 for EPIPE, as Python's documentation has it (argparse's help ignores the error: 0)
    assert done.returncode == (1 if args[0].startswith("--") else 0)


def test_profiled_output_into_a_closed_reader_ends_quietly_with_the_report():
    done = _with_reader_gone("profile", str(SCRIPTS / "pipe_flood.py"))
    err = done.stderr.decode()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "ignored" not in err
    assert err.splitlines()[0] == "gpuscalar: 1 sync, 1 device op"
    assert done.returncode == 1


def test_a_broken_pipe_of_the_programs_own_is_its_failure(tmp_path, capsys):
    script = tmp_path / "own_pipe.py"
    script.write_text("raise BrokenPipeError(32, 'a socket of the program')\n")
    assert profile.main([str(script)]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "BrokenPipeError: [Errno 32] a socket of the program" in err
