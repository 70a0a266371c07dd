"""sync.py: the sync contract, device-op counts, reports, warnings, the env default, CuPy hook."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import types
import warnings

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict, sync
from gpuscalar.devices import NUMPY, get_backend


def _next_line() -> int:
    """The line number of the caller's next line (where the sync under test happens)."""
    return inspect.currentframe().f_back.f_lineno + 1


# ---- the core contract ----------------------------------------------------------------------
def test_a_read_is_one_sync_and_a_second_read_none(xp):
    s = gs.sum(xp.arange(4.0))
    with gs.count_syncs() as counter:
        assert float(s) == 6.0
        assert counter.count == 1
        assert s.is_materialized
        assert s.item() == 6.0 and str(s) == "6.0" and bool(s)
    assert counter.count == 1
    assert [r.reason for r in counter.records] == ["float"]


def test_total_syncs_counts_every_read_in_the_process():
    before = gs.total_syncs()
    float(gs.sum(np.ones(3)))
    int(gs.sum(np.ones(3, dtype=np.int64)))
    assert gs.total_syncs() == before + 2


def test_error_guard_raises_before_the_transfer_and_leaves_the_scalar_unread():
    s = gs.sum(np.ones(3))
    before = gs.total_syncs()
    with gs.count_syncs() as counter, gs.sync_guard("error"):
        line = _next_line()
        with pytest.raises(gs.SyncError) as info:
            float(s)
    assert isinstance(info.value, RuntimeError)
    assert counter.count == 0 and gs.total_syncs() == before
    message = str(info.value)
    assert "(float)" in message and f"{__file__}:{line + 1}" in message
    with gs.count_syncs() as after:
        assert float(s) == 3.0  # outside the guard the value is still readable
    assert after.count == 1  # ... and is read now: nothing was transferred or cached before


def test_error_guard_does_not_call_the_backend_read(monkeypatch):
    calls = []
    monkeypatch.setattr(NUMPY, "read_scalar", lambda array: calls.append(array) or 0.0)
    s = gs.sum(np.ones(3))
    with gs.sync_guard("error"), pytest.raises(gs.SyncError):
        bool(s)
    assert calls == []


def test_a_read_admitted_first_is_guarded_recorded_and_counted_once(monkeypatch):
    """`sync.admit` is the guard and record step of a read whose caller evaluates the array
    between it and the transfer (``to_host(backend, array, None)``): refused, nothing after it
    runs; allowed, the read is recorded and counted once, as ``to_host`` with a reason does."""
    calls = []
    real_read = NUMPY.read_scalar
    monkeypatch.setattr(NUMPY, "read_scalar", lambda array: calls.append(array) or real_read(array))
    with gs.sync_guard("error"), pytest.raises(gs.SyncError, match="a reason"):
        sync.admit("a reason")
    before = gs.total_syncs()
    with gs.count_syncs() as counter:
        sync.admit("a reason")
        assert sync.to_host(NUMPY, np.asarray(2.5), None) == 2.5
        assert sync.to_host(NUMPY, np.asarray(1.5), "another") == 1.5
    assert [r.reason for r in counter.records] == ["a reason", "another"]
    assert gs.total_syncs() == before + 2 and len(calls) == 2
    sync.admit("unobserved")  # nobody listening: counted only
    assert sync.to_host(NUMPY, np.asarray(0.5), None) == 0.5
    assert gs.total_syncs() == before + 3


def test_guards_nest_and_restore():
    default = sync._guard_mode.get()
    s, t = gs.sum(np.ones(2)), gs.sum(np.ones(3))
    with gs.sync_guard("error"):
        with gs.sync_guard("allow"):
            assert float(s) == 2.0
            assert sync._guard_mode.get() == "allow"
        assert sync._guard_mode.get() == "error"
        with pytest.raises(gs.SyncError):
            float(t)
    assert sync._guard_mode.get() == default
    assert float(t) == 3.0


def test_guard_restored_when_the_block_raises():
    default = sync._guard_mode.get()
    with pytest.raises(KeyError), gs.sync_guard("error"):
        raise KeyError("x")
    assert sync._guard_mode.get() == default


@pytest.mark.parametrize("mode", ["never", "", "ERROR", None, 1])
def test_guard_rejects_unknown_modes(mode):
    with pytest.raises(ValueError, match="allow"):
        with gs.sync_guard(mode):
            pass  # pragma: no cover - not reached


def test_guards_and_counters_are_per_thread():
    seen: dict[str, object] = {}

    def worker():
        s = gs.sum(np.ones(5))
        seen["mode"] = sync._guard_mode.get()
        seen["counters"] = sync._active_counters.get()
        with gs.count_syncs() as own:
            seen["value"] = float(s)  # allowed here although the main thread forbids syncs
        seen["own"] = own.count

    s = gs.sum(np.ones(2))
    with gs.count_syncs() as main_counter, gs.sync_guard("error"):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        with pytest.raises(gs.SyncError):
            float(s)
    assert seen == {"mode": sync._DEFAULT_MODE, "counters": (), "value": 5.0, "own": 1}
    assert main_counter.count == 0


def test_nested_counters_outer_sees_inner():
    x = np.arange(3.0)
    with gs.count_syncs() as outer:
        float(gs.sum(x))
        with gs.count_syncs() as inner:
            float(gs.mean(x))
            float(gs.max(x))
        float(gs.min(x))
    assert inner.count == 2 and inner.device_ops == 2
    assert outer.count == 4 and outer.device_ops == 4
    assert [r.reason for r in outer.records] == ["float"] * 4


def test_counter_deactivated_when_the_block_raises():
    before = sync._active_counters.get()
    with pytest.raises(ZeroDivisionError), gs.count_syncs():
        1 / 0  # noqa: B018
    assert sync._active_counters.get() == before


def _read_in_helper(s):
    return bool(s)  # a sync in a user function: recorded here


def test_records_point_at_the_users_frame():
    s = gs.sum(np.ones(3))
    with gs.count_syncs() as counter:
        line = _next_line()
        f"{s:.2f}"  # noqa: B018
        _read_in_helper(gs.sum(np.ones(2)) > 1)
    first, second = counter.records
    assert (first.reason, first.filename, first.lineno, first.function) == (
        "format",
        __file__,
        line,
        "test_records_point_at_the_users_frame",
    )
    helper_line = inspect.getsourcelines(_read_in_helper)[1] + 1
    assert (second.reason, second.lineno, second.function) == (
        "bool",
        helper_line,
        "_read_in_helper",
    )
    assert first.site == f"{__file__}:{line}"
    assert not any(r.filename.startswith(sync._PACKAGE_DIR) for r in counter.records)


def test_caller_site_is_the_first_frame_outside_gpuscalar():
    line = _next_line()
    assert sync.caller_site() == (
        __file__,
        line,
        "test_caller_site_is_the_first_frame_outside_gpuscalar",
    )


def test_a_read_that_numpy_makes_for_the_user_is_recorded_at_the_users_line():
    # NumPy's Python code (fromnumeric.py, _methods.py) calls __array__: not the user's line.
    s, t = gs.sum(np.ones(3)), gs.sum(np.ones(2))
    with gs.count_syncs() as counter:
        line = _next_line()
        mean = np.mean([s])
        rounded = np.round(t, 1)
    assert (mean, rounded) == (3.0, 2.0)
    assert [(r.reason, r.filename, r.lineno) for r in counter.records] == [
        ("__array__", __file__, line),
        ("__array__", __file__, line + 1),
    ]
    numpy_dir = os.path.dirname(np.__file__)
    assert not any(r.filename.startswith(numpy_dir) for r in counter.records)


# ---- nobody listening: no frame walk, no record --------------------------------------------
@pytest.fixture
def no_listener():
    """Skip where a counter listens to every thread (pytest --gpuscalar-report does, around
    each test body): a process-wide listener is exactly what these tests must not have."""
    if sync._active_counters.get():
        pytest.skip("a counter that sees every thread is active (--gpuscalar-report?)")


def _frame_walk_forbidden(*args, **kwargs):
    raise AssertionError("a frame walk (or a record) while nobody listens")


def test_a_read_with_nobody_listening_walks_no_frame_and_builds_no_record(
    no_listener, monkeypatch
):
    monkeypatch.setattr(sync, "_user_frame", _frame_walk_forbidden)
    monkeypatch.setattr(sync, "SyncRecord", _frame_walk_forbidden)
    x = np.arange(4.0)
    before = gs.total_syncs()
    with gs.sync_guard("allow"):  # (whatever GPUSCALAR_SYNC_GUARD says)
        assert float(gs.sum(x)) == 6.0
        assert bool(gs.sum(x) * 2 > 1)  # a pending expression: evaluated, then read
        s = gs.GPUScalar(strict.xp.asarray(2.5))
        assert float(s) == 2.5
    assert gs.total_syncs() == before + 3  # the process total still counts every read
    # The patched functions are the ones a listened-to read calls (so the above could fail):
    with gs.count_syncs(), pytest.raises(AssertionError, match="frame walk"):
        float(gs.sum(x))
    with gs.sync_guard("warn"), pytest.raises(AssertionError, match="frame walk"):
        float(gs.sum(x))


def test_the_strict_devices_own_reads_walk_no_frame_with_nobody_listening(
    no_listener, monkeypatch
):
    monkeypatch.setattr(sync, "_user_frame", _frame_walk_forbidden)
    x = strict.xp.arange(3.0)
    with gs.sync_guard("allow"):
        assert x.get()[2] == 2.0 and float(x[1]) == 1.0
    with gs.count_syncs(include_cupy=True), pytest.raises(AssertionError, match="frame walk"):
        x.get()


def test_total_syncs_counts_reads_of_every_thread_exactly(no_listener):
    threads, per_thread = 8, 200
    start = threading.Barrier(threads)

    def work():
        start.wait(10)
        for _ in range(per_thread):
            float(gs.sum(np.ones(2)))

    before = gs.total_syncs()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
    finally:
        sys.setswitchinterval(previous)
    assert gs.total_syncs() == before + threads * per_thread


# ---- counters that see every thread ---------------------------------------------------------
def _in_a_thread(target) -> None:
    worker = threading.Thread(target=target)
    worker.start()
    worker.join(30)
    assert not worker.is_alive()


def _worker_read():
    float(gs.sum(np.ones(3)))  # a worker's read


def test_all_threads_counter_sees_a_thread_started_inside_and_the_default_does_not():
    with gs.count_syncs() as own, gs.count_syncs(all_threads=True) as everywhere:
        _in_a_thread(_worker_read)
        line = _next_line()
        float(gs.sum(np.ones(2)))
    worker_line = inspect.getsourcelines(_worker_read)[1] + 1
    assert [(r.reason, r.lineno, r.function) for r in everywhere.records] == [
        ("float", worker_line, "_worker_read"),
        ("float", line, "test_all_threads_counter_sees_a_thread_started_inside_and_the_default_"
                        "does_not"),
    ]
    assert everywhere.device_ops == 2  # the worker's gs.sum and ours
    assert [r.lineno for r in own.records] == [line] and own.device_ops == 1
    assert sync._active_counters.get() == ()  # nothing left registered


def test_all_threads_counter_sees_threads_already_running():
    started, counting, done = threading.Event(), threading.Event(), threading.Event()

    def worker():
        started.set()
        counting.wait(10)
        _worker_read()
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(10)
    with gs.count_syncs(all_threads=True) as everywhere:
        counting.set()
        assert done.wait(10)
    thread.join(10)
    assert everywhere.count == 1 and everywhere.records[0].function == "_worker_read"


def test_all_threads_counter_sees_library_syncs_of_other_threads():
    x = strict.xp.arange(3.0)

    def worker():
        x.get()  # the strict device's own read, in a worker

    with gs.count_syncs(include_cupy=True, all_threads=True) as everywhere:
        with gs.count_syncs(all_threads=True) as gpuscalar_only:
            _in_a_thread(worker)
    assert [(r.reason, r.function) for r in everywhere.records] == [("cupy", "worker")]
    assert gpuscalar_only.count == 0


def test_a_read_seen_by_both_kinds_of_counter_is_recorded_once_in_each():
    with gs.count_syncs(all_threads=True) as outer, gs.count_syncs() as inner:
        with gs.count_syncs(all_threads=True) as innermost:
            float(gs.sum(np.ones(2)))
    assert outer.count == inner.count == innermost.count == 1
    assert outer.device_ops == inner.device_ops == innermost.device_ops == 1


def test_the_guard_stays_per_thread_under_an_all_threads_counter():
    errors: list[BaseException] = []

    def worker():  # no guard in this thread: its read is allowed, and counted
        try:
            _worker_read()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    with gs.count_syncs(all_threads=True) as everywhere, gs.sync_guard("error"):
        _in_a_thread(worker)
        with pytest.raises(gs.SyncError):
            float(gs.sum(np.ones(2)))
    assert errors == [] and everywhere.count == 1


def test_all_threads_counter_deregistered_when_the_block_raises():
    with pytest.raises(KeyError), gs.count_syncs(all_threads=True):
        raise KeyError("inside")
    assert sync._active_counters.get() == ()
    with gs.count_syncs() as later:
        _in_a_thread(_worker_read)
    assert later.count == 0


def test_all_threads_counters_from_many_threads_at_once(switch_often):
    """Threads register, read and deregister process-wide counters together: each counter
    sees at least its own thread's reads, and none is left registered."""
    threads, rounds = 6, 100
    start = threading.Barrier(threads)
    seen: list[int] = []

    def work():
        start.wait(10)
        for _ in range(rounds):
            with gs.count_syncs(all_threads=True) as everywhere:
                float(gs.sum(np.ones(2)))
            seen.append(everywhere.count)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert len(seen) == threads * rounds and min(seen) >= 1
    assert sync._active_counters.get() == ()


@pytest.mark.parametrize("flag", [1, "yes", None])
def test_all_threads_must_be_a_bool(flag):
    with pytest.raises(TypeError, match="all_threads"):
        with gs.count_syncs(all_threads=flag):
            pass  # pragma: no cover - not reached


# ---- device-op counts --------------------------------------------------------------------
def test_device_op_counts_for_known_chains(xp, scalar_mode):
    lazy = scalar_mode == "lazy"
    x = xp.arange(6.0)
    s, t = gs.sum(x), gs.sum(x) + 1
    with gs.count_syncs() as counter:
        r = (s * 2 + 1) / t
    assert (counter.device_ops, counter.count) == (0 if lazy else 3, 0)
    with gs.count_syncs() as counter:
        gs.sum(x)
    assert (counter.device_ops, counter.count) == (1, 0)
    with gs.count_syncs() as counter:
        float(r)  # lazy: the whole expression (and t's +1) in one evaluation, then the read
    assert (counter.device_ops, counter.count) == (1 if lazy else 0, 1)
    with gs.count_syncs() as counter:
        -gs.sqrt(r)
        abs(s)
        s < t  # noqa: B015
    assert (counter.device_ops, counter.count) == (0 if lazy else 4, 0)


def test_backend_call_is_the_counted_dispatch_point():
    backend = get_backend("numpy")
    with gs.count_syncs() as outer, gs.count_syncs() as inner:
        assert backend.call(np.add, 1, 2) == 3
        sync.note_device_op()
    assert outer.device_ops == inner.device_ops == 2
    assert outer.count == 0


def test_device_ops_are_not_counted_without_a_counter():
    with gs.count_syncs() as counter:
        pass
    gs.sum(np.ones(3)) * 2  # noqa: B018
    assert counter.device_ops == 0


# ---- reports -----------------------------------------------------------------------------
def _three_sites():
    x = np.ones(4)
    with gs.count_syncs() as counter:
        for _ in range(3):
            bool(gs.sum(x) > 0)  # three bool syncs on one line (each of a value never read)
        line_bool = _next_line() - 2
        float(gs.sum(np.ones(2)))
        line_float = _next_line() - 2
    return counter, line_bool, line_float


def test_sites_group_by_line_function_reason_most_frequent_first():
    counter, line_bool, line_float = _three_sites()
    sites = counter.sites()
    assert [(s.lineno, s.reason, s.count, s.function) for s in sites] == [
        (line_bool, "bool", 3, "_three_sites"),
        (line_float, "float", 1, "_three_sites"),
    ]
    assert sites[0].site == f"{__file__}:{line_bool}"


def test_report_is_a_table_by_call_site():
    counter, line_bool, line_float = _three_sites()
    text = counter.report()
    lines = text.splitlines()
    assert lines[0] == f"gpuscalar: 4 syncs, {counter.device_ops} device ops"
    assert lines[1].split() == ["count", "site", "function", "reason"]
    short = os.path.relpath(__file__)
    assert lines[2].split() == ["3", f"{short}:{line_bool}", "_three_sites", "bool"]
    assert lines[3].split() == ["1", f"{short}:{line_float}", "_three_sites", "float"]
    assert len(lines) == 4
    limited = counter.report(limit=1).splitlines()
    assert limited[2].split()[0] == "3"
    assert limited[3].strip() == "... 1 more sites, 1 syncs"
    with pytest.raises(ValueError, match="limit"):
        counter.report(limit=-1)


def test_report_of_an_empty_counter():
    with gs.count_syncs() as counter:
        pass
    assert counter.report() == "gpuscalar: 0 syncs, 0 device ops"
    assert counter.to_dict() == {"count": 0, "device_ops": 0, "sites": [], "records": []}


def test_to_dict_is_json_ready():
    counter, line_bool, line_float = _three_sites()
    data = json.loads(json.dumps(counter.to_dict()))
    assert data["count"] == 4 and data["device_ops"] == counter.device_ops
    assert data["sites"] == [
        {
            "file": __file__,
            "line": line_bool,
            "function": "_three_sites",
            "reason": "bool",
            "count": 3,
        },
        {
            "file": __file__,
            "line": line_float,
            "function": "_three_sites",
            "reason": "float",
            "count": 1,
        },
    ]
    assert data["records"][0] == {
        "reason": "bool",
        "filename": __file__,
        "lineno": line_bool,
        "function": "_three_sites",
    }
    assert len(data["records"]) == 4


# ---- warnings and the program-wide default -----------------------------------------------
def test_warn_guard_warns_at_the_users_line_and_still_reads():
    s = gs.sum(np.ones(3))
    with gs.count_syncs() as counter, gs.sync_guard("warn"):
        with pytest.warns(gs.SyncWarning) as caught:
            line = _next_line()
            value = float(s)
    assert value == 3.0 and counter.count == 1
    (warning,) = caught.list
    assert issubclass(warning.category, UserWarning)
    assert (warning.filename, warning.lineno) == (__file__, line)
    assert "(float)" in str(warning.message) and f"{__file__}:{line}" in str(warning.message)


def test_warning_turned_into_an_error_stops_before_the_transfer():
    s = gs.sum(np.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", gs.SyncWarning)
        with gs.count_syncs() as counter, gs.sync_guard("warn"):
            with pytest.raises(gs.SyncWarning):
                bool(s)
    assert counter.count == 0
    with gs.count_syncs() as after:
        bool(s)
    assert after.count == 1  # the stopped read transferred (and cached) nothing


def _run_python(code: str, guard: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != sync.GUARD_ENV_VAR}
    if guard is not None:
        env[sync.GUARD_ENV_VAR] = guard
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


_ENV_PROBE = """
    import warnings
    import numpy as np
    import gpuscalar as gs
    warnings.simplefilter("always")
    s = gs.sum(np.ones(3))
    try:
        print("value", float(s))
    except gs.SyncError as exc:
        print("SyncError", exc)
    with gs.sync_guard("allow"):
        print("allowed", float(gs.sum(np.ones(2))))
"""


@pytest.mark.parametrize(
    ("guard", "expected_out", "expected_err"),
    [
        (None, ["value 3.0", "allowed 2.0"], ""),
        (
            " Warn ",
            ["value 3.0", "allowed 2.0"],
            "SyncWarning: device->host sync (float) at <string>:8",
        ),
        (
            "error",
            ["SyncError device->host sync (float) at <string>:8 in <module>()", "allowed 2.0"],
            "",
        ),
    ],
)
def test_env_var_sets_the_default_guard_for_a_program(guard, expected_out, expected_err):
    done = _run_python(_ENV_PROBE, guard)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert [line.split(" under")[0] for line in out] == expected_out
    assert expected_err in done.stderr
    if not expected_err:
        assert "SyncWarning" not in done.stderr


def test_env_var_with_an_invalid_value_fails_at_import():
    done = _run_python("import gpuscalar", "sometimes")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError:")
    assert sync.GUARD_ENV_VAR in last and "'sometimes'" in last
    assert all(mode in last for mode in ("allow", "warn", "error"))


# ---- CuPy's own syncs --------------------------------------------------------------------
@pytest.fixture
def syncdetect(tmp_path, monkeypatch):
    """CuPy's syncdetect module (CuPy imports without a device); a stand-in where CuPy is absent.

    Calling its ``_declare_synchronize()`` is what CuPy's ``ndarray.get()`` does before a copy.
    """
    try:
        return importlib.import_module("cupy._core.syncdetect")
    except ImportError:
        module = types.ModuleType("cupy._core.syncdetect")
        module.__file__ = str(tmp_path / "cupy" / "_core" / "syncdetect.py")
        module._declare_synchronize = lambda: None
        monkeypatch.setitem(sys.modules, "cupy._core.syncdetect", module)
        return module


@pytest.fixture
def spy(syncdetect, monkeypatch):
    """Replace CuPy's function by a call counter, so tests see the wrapper call through."""
    calls: list[int] = []
    monkeypatch.setattr(syncdetect, "_declare_synchronize", lambda: calls.append(1))
    return calls


def test_cupy_syncs_counted_and_function_restored(syncdetect, spy):
    original = syncdetect._declare_synchronize
    with gs.count_syncs(include_cupy=True) as counter:
        assert syncdetect._declare_synchronize is not original
        line = _next_line()
        syncdetect._declare_synchronize()
        syncdetect._declare_synchronize()
    assert syncdetect._declare_synchronize is original
    assert spy == [1, 1]  # CuPy's own function still runs (its allow_synchronize check)
    assert counter.count == 2 and counter.device_ops == 0
    record = counter.records[0]
    assert (record.reason, record.filename, record.lineno, record.function) == (
        "cupy",
        __file__,
        line,
        "test_cupy_syncs_counted_and_function_restored",
    )
    assert sync._cupy_hook_users == 0


def test_cupy_syncs_not_counted_by_other_counters(syncdetect, spy):
    with gs.count_syncs() as plain:
        syncdetect._declare_synchronize()
        with gs.count_syncs(include_cupy=True) as with_cupy:
            syncdetect._declare_synchronize()
            float(gs.sum(np.ones(2)))
    assert [r.reason for r in with_cupy.records] == ["cupy", "float"]
    assert [r.reason for r in plain.records] == ["float"]
    assert spy == [1, 1]


def test_cupy_hook_nests(syncdetect, spy):
    original = syncdetect._declare_synchronize
    with gs.count_syncs(include_cupy=True) as outer:
        wrapper = syncdetect._declare_synchronize
        with gs.count_syncs(include_cupy=True) as inner:
            assert syncdetect._declare_synchronize is wrapper  # installed once
            syncdetect._declare_synchronize()
        assert syncdetect._declare_synchronize is wrapper  # still needed by `outer`
        syncdetect._declare_synchronize()
    assert syncdetect._declare_synchronize is original
    assert (outer.count, inner.count) == (2, 1)


def test_cupy_hook_records_into_the_calling_threads_counters(syncdetect, spy):
    original = syncdetect._declare_synchronize
    entered, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def worker():
        with gs.count_syncs(include_cupy=True) as counter:
            syncdetect._declare_synchronize()
            entered.set()
            release.wait(10)
            syncdetect._declare_synchronize()
        results["worker"] = counter.count

    def bystander():  # no counter in this thread: its CuPy syncs are nobody's
        syncdetect._declare_synchronize()

    thread = threading.Thread(target=worker)
    thread.start()
    assert entered.wait(10)
    with gs.count_syncs(include_cupy=True) as main_counter:
        syncdetect._declare_synchronize()
        other = threading.Thread(target=bystander)
        other.start()
        other.join()
        release.set()
        thread.join()
        assert syncdetect._declare_synchronize is not original  # main still counts
    assert syncdetect._declare_synchronize is original
    assert results["worker"] == 2 and main_counter.count == 1
    assert len(spy) == 4


def test_cupy_hook_reference_count_is_thread_safe(syncdetect, spy):
    original = syncdetect._declare_synchronize
    counts: list[int] = []

    def worker():
        for _ in range(50):
            with gs.count_syncs(include_cupy=True) as counter:
                syncdetect._declare_synchronize()
            counts.append(counter.count)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counts == [1] * 400
    assert syncdetect._declare_synchronize is original and sync._cupy_hook_users == 0


def test_a_gpuscalar_read_that_goes_through_cupy_is_counted_once(syncdetect, spy, monkeypatch):
    def read_like_cupy(array):
        sys.modules["cupy._core.syncdetect"]._declare_synchronize()  # as ndarray.get() does
        return array.get().item()  # and the strict device declares its own get() too

    monkeypatch.setattr(strict.STRICT, "read_scalar", read_like_cupy)
    s = gs.GPUScalar(strict.xp.asarray(4.0))
    with gs.count_syncs(include_cupy=True) as counter:
        assert float(s) == 4.0
        syncdetect._declare_synchronize()  # a CuPy sync of the user's own
    assert spy == [1, 1]
    assert [r.reason for r in counter.records] == ["float", "cupy"]


def test_cupy_sync_obeys_the_guard(syncdetect, spy):
    with gs.count_syncs(include_cupy=True) as counter, gs.sync_guard("error"):
        line = _next_line()
        with pytest.raises(gs.SyncError, match=rf"\(cupy\) at .*test_sync.py:{line + 1}"):
            syncdetect._declare_synchronize()
    assert spy == [] and counter.count == 0


def test_cupy_sync_site_skips_cupy_frames(syncdetect, spy):
    cupy_dirs = sync._cupy_dirs(syncdetect)
    assert cupy_dirs, "syncdetect should live in a 'cupy' package directory"
    namespace: dict[str, object] = {}
    # A function "inside CuPy" (like cupy.asnumpy) that declares a sync for its caller.
    fake_file = os.path.join(cupy_dirs[0], "_fake_asnumpy.py")
    exec(compile("def asnumpy(sd):\n    sd._declare_synchronize()\n", fake_file, "exec"), namespace)
    with gs.count_syncs(include_cupy=True) as counter:
        line = _next_line()
        namespace["asnumpy"](syncdetect)
    assert counter.records[0].site == f"{__file__}:{line}"


def test_include_cupy_without_cupy_counts_the_strict_device_and_hooks_nothing(
    syncdetect, monkeypatch
):
    # CuPy (if any) is fully imported by the fixture; now its syncdetect cannot be imported.
    monkeypatch.setitem(sys.modules, "cupy._core.syncdetect", None)
    meta_path = list(sys.meta_path)
    x = strict.xp.asarray([1.0, 2.0])
    with gs.count_syncs(include_cupy=True) as counter:
        assert sync._cupy_syncdetect is None and sys.meta_path == meta_path  # nothing hooked
        line = _next_line()
        x.get()  # the strict device's own read: declared, counted without CuPy
        float(gs.sum(x))
    assert [(r.reason, r.lineno) for r in counter.records] == [("cupy", line), ("float", line + 1)]
    assert sync._cupy_hook_users == 0


def test_counting_cupy_does_not_import_it_and_hooks_it_when_imported():
    """CuPy installed, not imported: ``count_syncs(include_cupy=True)`` imports nothing, and
    CuPy's syncs are seen once the program imports it (a fresh process, CuPy unimported)."""
    pytest.importorskip("cupy._core.syncdetect", reason="needs CuPy installed (no GPU needed)")
    done = _run_python(
        """
        import sys
        import gpuscalar as gs
        from gpuscalar import sync
        meta_path = list(sys.meta_path)
        with gs.count_syncs(include_cupy=True) as counter:
            assert "cupy" not in sys.modules
            from cupy._core import syncdetect
            wrapped = syncdetect._declare_synchronize
            syncdetect._declare_synchronize()  # line 10: what CuPy declares before a copy
        assert wrapped is not syncdetect._declare_synchronize  # restored on exit
        assert sys.meta_path == meta_path and sync._cupy_hook_users == 0
        print([(r.reason, r.lineno) for r in counter.records])
        """,
        None,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[('cupy', 10)]\n"


@pytest.mark.parametrize("flag", [1, "yes", None])
def test_include_cupy_must_be_a_bool(flag):
    with pytest.raises(TypeError, match="include_cupy"):
        with gs.count_syncs(include_cupy=flag):
            pass  # pragma: no cover - not reached


def test_one_device_op_counts_its_block_once_and_nests():
    x = np.ones(3)
    with gs.count_syncs() as counter:
        with sync.one_device_op():
            gs.sum(x) + 1.0  # two gpuscalar ops inside: not counted again
            assert sync.inside_device_op()
            with sync.one_device_op():
                gs.sum(x)
        with sync.one_device_op(count=False):
            gs.sum(x)  # suppressed, and the block itself is not counted
        gs.sum(x)
    assert counter.device_ops == 2 and not sync.inside_device_op()


def test_graph_body_marks_the_block_and_restores_on_exit():
    assert not sync.in_graph_body()
    with sync.graph_body():
        assert sync.in_graph_body()
        with sync.graph_body():
            assert sync.in_graph_body()
        assert sync.in_graph_body()
    assert not sync.in_graph_body()
    with pytest.raises(KeyError):
        with sync.graph_body():
            raise KeyError("inside")
    assert not sync.in_graph_body()


def test_graph_body_is_per_thread():
    seen = []
    with sync.graph_body():
        worker = threading.Thread(target=lambda: seen.append(sync.in_graph_body()))
        worker.start()
        worker.join()
    assert seen == [False]


def test_a_captured_step_runs_its_body_as_a_graph_body_and_counts_replays(xp):
    x = xp.zeros(3)
    inside: list[bool] = []

    def step(x):
        inside.append(sync.in_graph_body())
        x += 1.0

    replay = gs.capture(step, x, warmup=2, steps=3)  # warm-up: eager, not a graph body
    before = sync.graph_replays()
    replay()
    replay()
    assert sync.graph_replays() == before + 2
    if xp.__name__ != "cupy":  # on a GPU the body runs once, while it is recorded
        assert inside == [False, False] + [True] * 6
    else:
        assert inside == [False, False, True, True, True]
    replay.release()
