"""gs.read and gs.MetricLog on every device: exact values, sync and device-op counts.

On NumPy and the strict device rows are ready at once; on a GPU (the ``cupy`` case) ``ready()``
starts a copy and the rows arrive by a later call, so the tests poll (never waiting) where
they only need the rows, and assert the counts that hold everywhere.
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import known, sync
from gpuscalar.deferred import DroppedRowsWarning

from .helpers import host


def _polled(log: gs.MetricLog, expected: int, seconds: float = 5.0) -> list[dict]:
    """``ready()`` until ``expected`` rows came (at once on a CPU device; a GPU's copies land
    a little later): no sync either way."""
    rows: list[dict] = []
    deadline = time.monotonic() + seconds
    while len(rows) < expected and time.monotonic() < deadline:
        rows += log.ready()
    return rows


# ---- gs.read -----------------------------------------------------------------------------


def test_read_many_values_is_one_sync_and_one_device_op(xp):
    x = xp.asarray(np.arange(1.0, 6.0))
    s, m = gs.sum(x), gs.max(x)
    t = s * 2.0 + m  # pending
    a = xp.asarray(np.float32(0.5))  # a user's 0-d array
    with sync.count_syncs() as counter:
        values = gs.read(s, t, m, a, 3, 2.5, np.float32(1.5), True)
    assert values == (15.0, 35.0, 5.0, 0.5, 3, 2.5, 1.5, True)
    assert [type(v) for v in values] == [float, float, float, float, int, float, float, bool]
    assert counter.count == 1 and counter.device_ops == 1
    assert counter.records[0].reason == "read"


def test_after_a_read_every_scalar_is_known_and_reads_nothing(xp):
    x = xp.asarray(np.arange(1.0, 6.0))
    s = gs.sum(x)
    t = s * 3.0  # pending: known through its own cache, its leaf through the registry
    a = xp.asarray(2.0)
    gs.read(s, t, a)
    with sync.count_syncs() as counter:
        assert gs.read(s, t) == (15.0, 45.0)
        assert float(s) == 15.0 and float(t) == 45.0
        assert float(s + 1.0) == 16.0  # from known values, on the host
    assert counter.count == 0 and counter.device_ops == 0
    assert known.value_of(a) is known.UNREAD  # the user's array: read, not remembered
    with sync.count_syncs() as counter:
        assert gs.read(a) == (2.0,)
    assert counter.count == 1


def test_read_of_known_values_and_numbers_syncs_nothing(xp):
    s = gs.sum(xp.asarray(np.arange(4.0)))
    float(s)
    with sync.count_syncs() as counter:
        assert gs.read() == ()
        assert gs.read(1, 2.0, s) == (1, 2.0, 6.0)
    assert counter.count == 0 and counter.device_ops == 0


def test_read_packs_every_dtype_and_a_value_given_twice_once(xp):
    values = [xp.asarray(np.array(v, dtype=d)) for v, d in
              ((True, np.bool_), (-7, np.int8), (200, np.uint8), (-(2 ** 40), np.int64),
               (0.1, np.float16), (0.1, np.float32), (1 / 3, np.float64),
               (1 + 2j, np.complex64), (3 - 4j, np.complex128))]
    scalars = [gs.GPUScalar(v) for v in values]
    with sync.count_syncs() as counter:
        read = gs.read(*scalars, scalars[3], values[6])
    assert counter.count == 1
    expected = [np.asarray(host(v)).item() for v in values]
    assert list(read) == [*expected, expected[3], expected[6]]
    assert [type(v) for v in read[:9]] == [bool, int, int, int, float, float, float, complex,
                                         complex]


def test_read_under_an_error_guard_moves_nothing(xp):
    s = gs.sum(xp.asarray(np.arange(3.0)))
    with sync.count_syncs() as counter, sync.sync_guard("error"):
        with pytest.raises(sync.SyncError, match="read"):
            gs.read(s, s * 2.0)
    assert counter.device_ops == 0  # the guard is checked before the packing op
    with sync.sync_guard("error"):
        assert gs.read(1.5) == (1.5,)


def test_read_refuses_bad_values_clearly(xp):
    x = xp.asarray(np.arange(3.0))
    with pytest.raises(ValueError, match=r"argument 1 is a .* of shape \(3,\).*reduce first"):
        gs.read(1.0, x)
    with pytest.raises(TypeError, match="argument 0 is 'loss'"):
        gs.read("loss")
    with pytest.raises(TypeError, match="argument 1 is a list"):
        gs.read(1, [1.0])
    with pytest.raises(TypeError, match="dtype <U1"):
        gs.read(np.str_("a"))


def test_read_names_both_backends_or_devices_when_mixed():
    s = gs.sum(np.arange(3.0))
    t = gs.sum(gs.strict.xp.asarray(np.arange(3.0)))
    with pytest.raises(TypeError, match=r"argument 1 is .* on strict device 0, but argument 0 "
                                        r"is .* on numpy device 'cpu'"):
        gs.read(s, t)
    with gs.strict.device(1):
        u = gs.sum(gs.strict.xp.asarray(np.arange(3.0)))
    with pytest.raises(ValueError, match="on strict device 1, but argument 0 .* device 0"):
        gs.read(t, 2.0, u)


def test_read_from_many_threads_gives_each_its_values():
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for i in range(50):
                x = gs.strict.xp.asarray(np.arange(float(seed + i), seed + i + 4.0))
                s = gs.sum(x)
                with sync.count_syncs() as counter:
                    got = gs.read(s, s * 0.5, gs.max(x))
                base = seed + i
                assert got == (4 * base + 6.0, 2 * base + 3.0, base + 3.0)
                assert counter.count == 1
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(100 * k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


# ---- gs.MetricLog ------------------------------------------------------------------------------


def test_record_is_one_device_op_and_no_sync_and_rows_keep_dtypes(xp):
    x = xp.asarray(np.arange(1.0, 5.0, dtype=np.float32))
    log = gs.MetricLog(capacity=8)
    total = gs.sum(x)
    with sync.count_syncs() as counter:
        log.record(loss=total, lr=0.1, step_count=np.int32(3), finite=True)  # makes the ring
    assert counter.count == 0 and counter.device_ops == 2  # the ring's allocation, the row
    assert log.columns == {"loss": np.float32, "lr": np.float64, "step_count": np.int32,
                           "finite": np.bool_}
    with sync.count_syncs() as counter:
        for i in range(3):
            log.record(loss=gs.mean(x) * i, lr=0.1 / (i + 1), step_count=i, finite=i < 2)
    assert counter.count == 0 and counter.device_ops == 3 + 3  # 3 means + 3 records
    with sync.count_syncs() as counter:
        rows = _polled(log, 4)
    assert counter.count == 0
    assert rows == [
        {"step": 0, "loss": 10.0, "lr": 0.1, "step_count": 3, "finite": True},
        {"step": 1, "loss": 0.0, "lr": 0.1, "step_count": 0, "finite": True},
        {"step": 2, "loss": 2.5, "lr": 0.05, "step_count": 1, "finite": True},
        {"step": 3, "loss": 5.0, "lr": float(np.float64(0.1) / 3), "step_count": 2,
         "finite": False}]
    assert log.latest == rows[-1] and log.delivered == 4
    with sync.count_syncs() as counter:
        assert log.ready() == [] and log.flush() == []  # each row once
    assert counter.count == 1  # the flush


def test_ready_on_a_cpu_device_is_at_once_and_costs_nothing():
    for make in (np.asarray, gs.strict.xp.asarray):
        s = gs.sum(make(np.arange(3.0)))
        log = gs.MetricLog(4)
        log.record(v=s)
        with sync.count_syncs() as counter:
            assert log.ready() == [{"step": 0, "v": 3.0}]
        assert counter.count == 0 and counter.device_ops == 0


def test_flush_is_one_sync_and_returns_the_rest_in_order(xp):
    s = gs.sum(xp.asarray(np.arange(3.0)))
    log = gs.MetricLog(capacity=16)
    for i in range(5):
        log.record(i=i, v=s * i)
    with sync.count_syncs() as counter:
        rows = log.flush()
    assert counter.count == 1 and counter.records[0].reason == "flush"
    assert rows == [{"step": i, "i": i, "v": 3.0 * i} for i in range(5)]


def test_overwritten_rows_are_counted_and_warned_about_never_silently_lost(xp):
    s = gs.sum(xp.asarray(np.arange(3.0)))
    log = gs.MetricLog(capacity=3)
    for i in range(8):
        log.record(i=i, v=s)
    with pytest.warns(DroppedRowsWarning, match=r"5 row\(s\) \(step 0..4\) were overwritten"):
        rows = log.flush()
    assert [row["i"] for row in rows] == [5, 6, 7] and log.dropped == 5
    log.record(i=8, v=s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing new dropped: no warning
        assert [row["step"] for row in log.flush()] == [8]
    assert log.dropped == 5


def test_records_in_a_captured_step_fill_successive_rows(xp):
    x = xp.asarray(np.arange(1.0, 4.0))
    count = xp.zeros((), dtype=np.int64)
    log = gs.MetricLog(capacity=16)

    def step() -> None:
        x[...] = x * 2.0
        count[...] = count + 1
        log.record(total=gs.sum(x), n=count, lr=0.5)

    captured = gs.capture(step, warmup=1)
    for _ in range(3):
        captured()
    rows = log.flush()
    assert [row["step"] for row in rows] == [0, 1, 2, 3]  # the warm-up's row, then 3 replays
    assert [row["total"] for row in rows] == [12.0, 24.0, 48.0, 96.0]
    assert [row["n"] for row in rows] == [1, 2, 3, 4]
    assert {row["lr"] for row in rows} == {0.5}
    captured.release()


def test_records_in_a_device_loop_fill_a_row_per_iteration(xp):
    x = xp.asarray(np.array(1.0))
    log = gs.MetricLog(capacity=32)
    log.record(x=gs.GPUScalar(x))  # the first record (the ring) outside the loop

    def body(x: object) -> None:
        x[...] = x * 3.0
        log.record(x=gs.GPUScalar(x) + 0.0)

    iterations = gs.while_loop(lambda x: gs.GPUScalar(x) < 100.0, body, x, max_iter=10)
    rows = log.flush()
    assert host(iterations) == 5
    assert [row["x"] for row in rows] == [1.0, 3.0, 9.0, 27.0, 81.0, 243.0]


def test_the_first_record_inside_a_captured_body_is_refused(xp):
    log = gs.MetricLog(capacity=4)
    x = xp.asarray(np.arange(3.0))

    def step(x: object) -> None:
        log.record(v=gs.sum(x))

    with pytest.raises(RuntimeError, match="record once before"):
        gs.capture(step, x, warmup=0)()


def test_ready_and_flush_are_refused_inside_a_body(xp):
    log = gs.MetricLog(capacity=4)
    x = xp.asarray(np.arange(3.0))
    log.record(v=gs.sum(x))

    def step(x: object) -> None:
        log.ready()

    with pytest.raises(RuntimeError, match=r"ready\(\) runs on the host"):
        gs.capture(step, x, warmup=1)


def test_record_refuses_bad_columns_and_values_clearly(xp):
    x = xp.asarray(np.arange(3.0))
    log = gs.MetricLog(capacity=4)
    with pytest.raises(TypeError, match="at least one value"):
        log.record()
    with pytest.raises(ValueError, match="'step' is the row's own step number"):
        log.record(step=1)
    with pytest.raises(ValueError, match=r"loss= is a .* of shape \(3,\)"):
        log.record(loss=x)
    with pytest.raises(TypeError, match="loss= is 'high'"):
        log.record(loss="high")
    log.record(loss=gs.sum(x), n=1)
    with pytest.raises(ValueError, match=r"columns are \['loss', 'n'\].*missing \['n'\]"):
        log.record(loss=1.0)
    with pytest.raises(ValueError, match=r"unknown \['lr'\]"):
        log.record(loss=1.0, n=2, lr=0.1)
    with pytest.raises(TypeError, match="column 'n' holds int64.*dtype float64"):
        log.record(loss=1.0, n=2.5)
    with pytest.raises(TypeError, match="column 'loss' holds float64.*complex128"):
        log.record(loss=1j, n=2)
    log.record(n=3, loss=2)  # any order; an int into a float column
    assert [row["loss"] for row in log.flush()] == [3.0, 2.0]


def test_metric_log_arguments_and_placement_errors():
    with pytest.raises(TypeError, match="capacity must be an int"):
        gs.MetricLog(capacity=2.0)
    with pytest.raises(ValueError, match="capacity must be between 1"):
        gs.MetricLog(capacity=0)
    with pytest.raises(TypeError, match="like= must be an array or GPUScalar"):
        gs.MetricLog(like=1.0)
    log = gs.MetricLog(like=gs.strict.xp.asarray(1.0))
    with pytest.raises(TypeError, match="v= is .* on numpy device 'cpu', but the log lives on "
                                        "strict device 0"):
        log.record(v=gs.sum(np.arange(3.0)))
    log.record(v=1.5)
    with gs.strict.device(1):
        other = gs.strict.xp.asarray(2.0)
    with pytest.raises(ValueError, match="strict device 1, but the log lives on strict device 0"):
        log.record(v=other)
    assert log.flush() == [{"step": 0, "v": 1.5}]
    log.close()
    with pytest.raises(RuntimeError, match="closed"):
        log.record(v=1.0)
    assert "capacity 1024" in repr(log)


def test_the_ring_is_the_devices_metrics_executor_and_a_device_without_one_is_named():
    """`MetricLog` asks the device for its ring (the "metrics" slot): NumPy and the strict
    device share the host wing's; a device with none is a TypeError naming it."""
    from gpuscalar.backend import Backend
    from gpuscalar.deferred import _rings
    from gpuscalar.devices import NUMPY, STRICT

    assert type(_rings(NUMPY)) is type(_rings(STRICT)) and _rings(NUMPY) is not _rings(STRICT)
    assert _rings(NUMPY).default_device() == "cpu"

    class Planted(Backend):
        name = "planted"

    with pytest.raises(TypeError, match="gs.MetricLog: no ring for the planted backend"):
        _rings(Planted())


def test_a_log_shared_by_threads_keeps_every_row():
    x = gs.strict.xp.asarray(np.arange(3.0))
    log = gs.MetricLog(capacity=4096)
    log.record(worker=-1, v=gs.sum(x))

    def worker(k: int) -> None:
        for i in range(100):
            log.record(worker=k, v=gs.sum(x) * i)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = log.flush()
    assert [row["step"] for row in rows] == list(range(801)) and log.dropped == 0
    for k in range(8):
        assert sorted(r["v"] for r in rows if r["worker"] == k) == [3.0 * i for i in range(100)]
