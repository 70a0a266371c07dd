"""gs.read and gs.MetricLog on CuPy objects, through the recording seam (no GPU needed).

Every launch is checked against CuPy (an ElementwiseKernel's parameter types and shapes; a
RawKernel's arguments against its C signature) and, where marked, compiled by NVRTC from the
exact source CuPy would compile. The double records the pinned buffers, events and
asynchronous copies of the log, runs its record kernel on the fake memory (the columns that
come from parameters; a pending expression's value is not computed, as for any fused kernel),
and can hold events pending to show that ``ready()`` never waits.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import known, sync
from gpuscalar.deferred import DroppedRowsWarning
from gpuscalar.devices.cupy import metrics

from .cupy_fake import cupy_or_fail, fake_memory, host_view
from .cupy_seam import RecordingSeam, covers, recording


@pytest.fixture
def dev() -> Iterator[RecordingSeam]:
    cupy_or_fail()
    with fake_memory() as memory, recording(memory) as seam:
        yield seam


# ---- gs.read -----------------------------------------------------------------------------


@covers("gs.read")
def test_read_is_one_packing_kernel_and_one_transfer(dev):
    x = dev.array(np.arange(1.0, 6.0))
    s, m = gs.sum(x), gs.max(x)
    a = dev.array(np.array(2.5, np.float32))
    t = s * 2.0 + 1.0  # pending: computed in the same kernel
    dev.clear()
    with sync.count_syncs() as counter:
        values = gs.read(s, m, a, t, 7)
    assert counter.count == 1 and counter.device_ops == 1
    assert dev.kinds() == ["raw"] and not dev.uploads
    launch = dev.launches[0]
    assert launch.name.startswith("gpuscalar_read_many_4_") and launch.args[:2] == ((1,), (1,))
    [buffer] = dev.reads
    # four values, then the pending one's leaf (s: its value comes back a second time)
    assert buffer.shape == (5 * 16,) and buffer.dtype == np.uint8
    assert values[:3] == (15.0, 5.0, 2.5) and values[4] == 7  # (a fused value: not computed)
    assert known.value_of(s.array) == 15.0 and known.value_of(a) is known.UNREAD
    dev.clear()
    with sync.count_syncs() as counter:
        assert gs.read(s, m) == (15.0, 5.0)
    assert counter.count == 0 and not dev.launches


def test_read_kernels_compile_with_nvrtc():
    cupy_or_fail()
    with fake_memory() as memory, recording(memory, compile=True) as seam:
        x = seam.array(np.arange(1.0, 6.0, dtype=np.float32))
        s = gs.sum(x)
        flags = [gs.GPUScalar(seam.array(np.array(v, d))) for v, d in
                 ((True, np.bool_), (3, np.int8), (2 ** 40, np.int64), (0.5, np.float16),
                  (1j, np.complex64), (2 - 1j, np.complex128))]
        values = gs.read(s, gs.sqrt(s) * 2.0 + 1.0, s > 3.0, *flags)
        assert values[0] == 15.0 and values[3:] == (True, 3, 2 ** 40, 0.5, 1j, 2 - 1j)
    assert seam.count("raw") == 1


# ---- gs.MetricLog ------------------------------------------------------------------------------


@covers("gs.MetricLog")
def test_record_is_one_checked_launch_with_no_upload_and_rows_come_back_late(dev):
    x = dev.array(np.arange(1.0, 5.0))
    s = gs.sum(x)
    log = gs.MetricLog(capacity=8)
    dev.clear()
    with sync.count_syncs() as counter:
        log.record(loss=s, lr=0.1)  # the ring (a fill), then the row
        log.record(loss=s, lr=0.05)
    assert counter.count == 0 and counter.device_ops == 3
    assert dev.kinds() == ["method", "raw", "raw"] and not dev.uploads
    assert dev.launches[1].func is dev.launches[2].func  # one cached kernel
    assert dev.launches[1].name.startswith(metrics.RECORD_PREFIX)
    dev.clear()
    with sync.count_syncs() as counter:
        first = log.ready()  # starts the copy home
        second = log.ready()  # its events are done: the rows
    assert counter.count == 0 and counter.device_ops == 0 and not dev.reads
    assert first == []
    assert second == [{"step": 0, "loss": 10.0, "lr": 0.1}, {"step": 1, "loss": 10.0, "lr": 0.05}]
    d2d, d2h = dev.copies[:2]
    assert (d2d.kind, d2h.kind) == ("D2D", "D2H")
    assert d2d.stream is not d2h.stream  # the copy home runs on a side stream
    assert d2d.stream is dev.current_stream()  # the snapshot in the compute stream's order
    assert len(dev.pinned) == 1 and dev.pinned[0].nbytes == 16 + 8 * 3 * 16
    assert len(dev.event_records) == 4 and dev.event_waits == 0
    log.record(loss=s, lr=0.025)
    with sync.count_syncs() as counter:
        assert log.flush() == [{"step": 2, "loss": 10.0, "lr": 0.025}]
    assert counter.count == 1 and len(dev.reads) == 1 and dev.event_waits == 0


def test_ready_never_waits_for_a_copy_under_way(dev):
    dev.hold_events = True
    log = gs.MetricLog(capacity=4)
    log.record(v=gs.sum(dev.array(np.arange(3.0))))
    assert log.ready() == [] and log.ready() == []  # the copy has not landed: nothing, at once
    queries, copies = dev.event_queries, len(dev.copies)
    assert log.ready() == [] and dev.event_queries == queries + 1  # one query per call
    assert len(dev.copies) == copies  # no second copy while one is under way
    assert dev.event_waits == 0
    dev.complete_events()
    assert log.ready() == [{"step": 0, "v": 3.0}]


def test_flush_reads_once_after_the_copies_under_way(dev):
    dev.hold_events = True
    log = gs.MetricLog(capacity=4, like=dev.array(0.0))  # numbers only: placed by like=
    log.record(v=1.0)
    assert log.ready() == []  # a copy under way (holding step 0)
    log.record(v=2.0)
    with sync.count_syncs() as counter:
        rows = log.flush()
    assert rows == [{"step": 0, "v": 1.0}, {"step": 1, "v": 2.0}]
    assert counter.count == 1 and dev.event_waits == 0  # the read waited for the side copy


def test_a_captured_step_records_into_successive_rows_with_no_upload(dev):
    dev.records_only = True  # recording executes nothing, as on a GPU
    cupy = cupy_or_fail()
    x = dev.array(np.arange(1.0, 4.0))
    first = dev.array(1.0)
    log = gs.MetricLog(capacity=16)

    def step(x: object) -> None:
        gs.devices.CUPY.call(cupy.multiply, x, 2.0, out=x)
        gs.devices.CUPY.call(cupy.multiply, first, 2.0, out=first)
        log.record(total=gs.sum(x) * 1.0, first=first, lr=0.5)

    captured = gs.capture(step, x, warmup=1)
    dev.clear()
    for _ in range(3):
        captured()
    assert dev.graph_launches == 3 and not dev.uploads and not dev.launches
    rows = log.flush()
    assert [row["step"] for row in rows] == [0, 1, 2, 3]  # warm-up, then each replay
    assert [row["first"] for row in rows] == [2.0, 4.0, 8.0, 16.0]
    assert {row["lr"] for row in rows} == {0.5}
    recorded = [launch for launch in dev.graphs[0].launches if launch.kind == "raw"]
    assert len(recorded) == 1 and recorded[0].name.startswith(metrics.RECORD_PREFIX)
    captured.release()


def test_rows_overwritten_on_the_device_are_counted(dev):
    log = gs.MetricLog(capacity=2, like=dev.array(0.0))
    for i in range(5):
        log.record(i=i)
    assert log.ready() == []
    with pytest.warns(DroppedRowsWarning, match=r"3 row\(s\) \(step 0..2\)"):
        assert [row["i"] for row in log.ready()] == [3, 4]
    assert log.dropped == 3


def test_record_and_ready_switch_devices_only_where_the_ring_is_not_current(dev, monkeypatch):
    """A record or a poll on the current device (the common case) enters no device context;
    where the ring's device is not the current one (forced here: the fake memory has one
    device) both enter it, with the same launches and the same rows."""
    entered: list[object] = []
    enter = type(dev).device_context

    def counted(seam: RecordingSeam, device: object) -> object:
        entered.append(device)
        return enter(seam, device)

    monkeypatch.setattr(type(dev), "device_context", counted)
    s = gs.sum(dev.array(np.arange(1.0, 5.0)))
    log = gs.MetricLog(capacity=8)
    log.record(loss=s, lr=0.1)  # the first: the ring made and the kernel built, checked
    entered.clear()
    dev.clear()
    log.record(loss=s, lr=0.05)
    assert log.ready() == []  # starts the copy home
    assert entered == [] and dev.kinds() == ["raw"]
    monkeypatch.setattr(type(dev), "is_current_device", lambda seam, device: False)
    log.record(loss=s, lr=0.025)
    rows = log.ready()
    assert entered == [0, 0] and dev.kinds() == ["raw", "raw"]
    assert dev.launches[0].func is dev.launches[1].func
    assert [row["lr"] for row in rows] == [0.1, 0.05] and rows[0]["loss"] == 10.0
    assert [row["lr"] for row in log.flush()] == [0.025]


def test_a_log_of_one_column_records_through_its_decided_kernel(dev, monkeypatch):
    """A log of one column (a leaf, a pending scalar, a number) is checked on its first record
    of each kind and launched straight after: the same kernel, the same rows; a new kind
    (another dtype) or a wrong name takes the checked path again (its kernel, its error)."""
    checked: list[dict] = []
    check = metrics.CudaRing._record_checked

    def counted(ring: metrics.CudaRing, values: dict) -> None:
        checked.append(values)
        return check(ring, values)

    monkeypatch.setattr(metrics.CudaRing, "_record_checked", counted)
    s = gs.sum(dev.array(np.arange(1.0, 5.0)))
    for pending, value in ((False, s), (True, s * 2.0), (False, 0.5)):
        log = gs.MetricLog(capacity=8, like=dev.array(0.0))
        checked.clear()
        dev.clear()
        log.record(v=value)
        log.record(v=value)
        assert len(checked) == 1 and dev.kinds()[-2:] == ["raw", "raw"]
        assert dev.launches[-1].func is dev.launches[-2].func
        if not pending:  # (the fake computes no pending value)
            assert [row["v"] for row in log.flush()] == [float(value)] * 2
    log = gs.MetricLog(capacity=8)
    log.record(v=s)
    checked.clear()
    log.record(v=gs.sum(dev.array(np.arange(1.0, 5.0, dtype=np.float32))))  # a new kind
    assert len(checked) == 1
    with pytest.raises(ValueError, match="the columns are"):
        log.record(w=s)
    assert len(checked) == 2


def test_record_kernels_compile_with_nvrtc_for_every_column_kind():
    cupy_or_fail()
    with fake_memory() as memory, recording(memory, compile=True) as seam:
        x = seam.array(np.arange(1.0, 5.0, dtype=np.float32))
        s = gs.sum(x)
        log = gs.MetricLog(capacity=4)
        values = {f"c{name}": seam.array(np.array(1, name)) for name in
                  ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                   "uint64", "float16", "float32", "float64", "complex64", "complex128")}
        log.record(loss=s, pending=gs.sqrt(s) * 2.0, lr=0.1, n=3, flag=True, z=1j,
                   half=np.float16(0.5), **values)
        log.record(loss=1, pending=s, lr=gs.sum(x), n=np.int8(2), flag=s > 1.0, z=s,
                   half=0.25, **values)
        rows = log.flush()
    assert seam.count("raw") == 2
    assert [row["n"] for row in rows] == [3, 2] and rows[1]["half"] == 0.25
    assert rows[0]["cfloat16"] == 1.0 and rows[0]["ccomplex64"] == 1 + 0j


def test_a_cupy_ring_buffer_holds_the_documented_layout(dev):
    log = gs.MetricLog(capacity=3, like=dev.array(0.0))
    log.record(a=2.5, b=7)
    assert isinstance(log._ring, metrics.CudaRing)
    state = host_view(log._ring.state).view(np.uint8)
    assert state[:8].view(np.int64)[0] == 1  # the counter
    row = state[16:16 + 48]
    assert row[:8].view(np.int64)[0] == 0  # the row's step
    assert row[16:24].view(np.float64)[0] == 2.5 and row[32:40].view(np.int64)[0] == 7


# ---- bench/record_overhead.py: record's host cost next to one CuPy ufunc call -----------------

_BENCH = Path(__file__).resolve().parent.parent / "bench" / "record_overhead.py"


def test_the_record_benchmark_exits_2_with_one_line_without_nullcuda(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("record_overhead", _BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def missing() -> None:
        raise ModuleNotFoundError("No module named 'nullcuda'")

    monkeypatch.setattr(bench.harness, "import_nullcuda", missing)
    assert bench.main(["--n", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("record_overhead: cannot measure (ModuleNotFoundError: ")


def test_the_record_benchmark_prints_record_next_to_a_ufunc_call():
    """Wall time on nullcuda, in a fresh process (it loads beneath CuPy before CuPy)."""
    done = subprocess.run([sys.executable, str(_BENCH), "--n", "20"], capture_output=True,
                          text=True, timeout=300, cwd=_BENCH.parent.parent)
    if done.returncode == 2 and "cannot measure" in done.stderr:
        pytest.skip(done.stderr.strip())  # no nullcuda here (no CuPy 14, gcc, ...)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "on nullcuda (no GPU)" in lines[0]
    assert [line[:28].rstrip() for line in lines[2:6]] == [
        "cupy g * a", "record(loss=s, lr=t)", "record(loss=s, lr=0.1)",
        "record(loss=s*2+1, lr=t)"]
    assert lines[2].split()[-1] == "1.00x"
    assert lines[6].startswith("goal: record(loss=s, lr=t) within 1.0x of cupy g * a: ")
