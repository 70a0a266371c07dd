"""gs.progress: a bar whose postfix shows a log's latest ready row and its lag, with no sync per
step; tqdm on a terminal where installed, a plain line in place without it, plain lines every
``every`` seconds when the output is not a terminal.

The logs here are small fakes of `gs.MetricLog`'s host side (``ready()``, ``flush()``,
``dropped``): rows come back a chosen number of steps late, as they would from a GPU."""

from __future__ import annotations

import io
import math
import sys

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict
from gpuscalar.progressbar import EVERY, REFRESH, Progress, progress


class FakeLog:
    """A MetricLog's host side: rows numbered from 0 under "step", ready ``delay`` steps after
    they are recorded (0: at once, as on NumPy and the strict device)."""

    def __init__(self, delay: int = 0, dropped: int = 0, capacity: int | None = None) -> None:
        if capacity is not None:
            self.capacity = capacity
        self.delay = delay
        self.pending: list[dict] = []
        self.recorded = 0
        self.dropped = dropped
        self.flushes = 0
        self.polls = 0

    def record(self, **values) -> None:
        self.pending.append({"step": self.recorded, **values})
        self.recorded += 1

    def ready(self) -> list[dict]:
        self.polls += 1
        done = max(len(self.pending) - self.delay, 0)
        rows, self.pending = self.pending[:done], self.pending[done:]
        return rows

    def flush(self) -> list[dict]:
        self.flushes += 1
        rows, self.pending = self.pending, []
        return rows


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_tqdm(monkeypatch):
    """tqdm unimportable, as in an install without the ``progress`` extra."""
    monkeypatch.setitem(sys.modules, "tqdm", None)


def loop(bar: Progress, log: FakeLog, clock: Clock, seconds: float = 1.0) -> list[tuple]:
    """Run ``bar``, recording ``loss = 1 / (i + 1)`` per step, ``seconds`` a step; returns
    (step, lag, postfix) after each step, as the bar sees them."""
    seen = []
    for i in bar:
        if seen:
            seen[-1] = (*seen[-1][:2], bar.postfix())  # what it drew after the previous step
        log.record(loss=1 / (i + 1))
        clock.now += seconds
        seen.append((i, None, None))
    return seen


# ---- the three styles --------------------------------------------------------------------------


def test_not_a_terminal_gives_a_line_every_n_seconds_and_a_final_line():
    log, clock, out = FakeLog(delay=2), Clock(), io.StringIO()
    bar = gs.progress(range(10), log, desc="train", file=out, every=3, clock=clock)
    assert bar.style == "lines" and bar.total == 10
    for i in bar:
        log.record(loss=1 / (i + 1))
        clock.now += 1
    lines = out.getvalue().splitlines()
    # a line after steps 3, 6, 9 (3 seconds apart), then the final line after step 10
    assert [line.split(" [")[0] for line in lines] == [
        "train: 3/10", "train: 6/10", "train: 9/10", "train: 10/10"]
    assert lines[0] == "train: 3/10 [30%, 3.0s, 1.0 steps/s] loss=1, step=0, lag=2"
    assert lines[1].endswith("loss=0.25, step=3, lag=2")
    assert lines[-1] == "train: 10/10 [100%, 10.0s, 1.0 steps/s] loss=0.125, step=7, lag=2"
    assert "\r" not in out.getvalue()
    assert bar.closed and bar.exhausted and log.flushes == 0


def test_every_zero_is_a_line_per_step_and_infinity_only_the_final_line():
    for every, count in ((0, 4), (math.inf, 1)):
        log, out = FakeLog(), io.StringIO()
        for i in gs.progress(range(4), log, file=out, every=every, clock=Clock()):
            log.record(loss=float(i))
        lines = out.getvalue().splitlines()
        assert len(lines) == count  # the final line is not repeated after the last step's
        assert lines[-1] == "4/4 [100%, 0.0s] loss=3, step=3, lag=0"


def test_a_terminal_without_tqdm_redraws_one_line_in_place(no_tqdm):
    log, clock, out = FakeLog(delay=1), Clock(), Terminal()
    bar = gs.progress(range(3), log, desc="fit", file=out, clock=clock)
    assert bar.style == "in place" and bar.terminal
    for i in bar:
        log.record(loss=0.5 * i, name="x")
        clock.now += REFRESH  # each step one redraw
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1  # one line, ended when closed
    draws = text.rstrip("\n").split("\r")[1:]
    assert draws == [
        "fit: 1/3 [33%, 0.1s, 10.0 steps/s] no row yet",
        "fit: 2/3 [66%, 0.2s, 10.0 steps/s] loss=0, name=x, step=0, lag=1",
        "fit: 3/3 [100%, 0.3s, 10.0 steps/s] loss=0.5, name=x, step=1, lag=1",
        "fit: 3/3 [100%, 0.3s, 10.0 steps/s] loss=0.5, name=x, step=1, lag=1",
    ]


def test_in_place_redraws_blank_what_a_longer_line_left(no_tqdm):
    out = Terminal()
    bar = gs.progress(range(2), file=out, clock=Clock())
    bar._width = 40  # a longer line was drawn before
    bar._draw()
    assert out.getvalue() == "\r" + "0/2 [0%, 0.0s]".ljust(40)


def test_a_terminal_redraws_at_most_every_refresh_seconds(no_tqdm):
    log, clock, out = FakeLog(), Clock(), Terminal()
    for i in gs.progress(range(10), log, file=out, clock=clock):
        log.record(loss=float(i))
        clock.now += REFRESH / 4
    assert out.getvalue().count("\r") == 10 // 4 + 1  # 2 redraws in the loop, the final one
    assert log.polls == 10 + 1  # but the log is drained every step, and once when closing


def test_tqdm_draws_the_bar_on_a_terminal_with_the_rows_in_its_postfix():
    pytest.importorskip("tqdm")  # the test extra installs it
    log, clock, out = FakeLog(delay=1), Clock(), Terminal()
    bar = gs.progress(range(4), log, desc="train", file=out, clock=clock)
    assert bar.style == "tqdm"
    for i in bar:
        log.record(loss=1 / (i + 1))
        clock.now += 1
    text = out.getvalue()
    assert "train:" in text and "4/4" in text
    last = text.rstrip("\n").split("\r")[-1]
    assert last.startswith("train: 100%") and last.endswith("loss=0.3333, step=2, lag=1]")
    assert text.endswith("\n")  # tqdm leaves the finished bar


def test_the_terminal_is_the_files_own_answer_unless_told(no_tqdm):
    assert gs.progress([], file=Terminal()).style == "in place"
    assert gs.progress([], file=io.StringIO()).style == "lines"
    assert gs.progress([], file=io.StringIO(), terminal=True).style == "in place"
    assert gs.progress([], file=Terminal(), terminal=False).style == "lines"
    closed = io.StringIO()
    closed.close()
    assert gs.progress([], file=closed).style == "lines"  # isatty() on a closed file raises


def test_the_default_file_is_stderr_and_every_defaults_to_EVERY(capsys):
    bar = gs.progress(range(2))
    assert bar.file is sys.stderr and bar.every == EVERY
    assert list(bar) == [0, 1]
    assert capsys.readouterr().err.startswith("2/2 [100%")


# ---- the lag and the rows ----------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0, 1, 3])
def test_the_lag_is_the_loops_step_minus_the_rows_step(delay):
    log, clock = FakeLog(delay=delay), Clock()
    bar = gs.progress(range(8), log, file=io.StringIO(), clock=clock)
    seen = []
    for i in bar:
        assert bar.step == i  # the step handed out
        assert bar.n == i  # steps done
        if i > delay:  # a row is ready once `delay` later steps are done
            assert bar.row["step"] == i - 1 - delay
            assert bar.lag == delay + 1  # inside step i, before it records its own row
        elif i:
            assert bar.row is None and bar.lag is None and bar.postfix() == "no row yet"
        log.record(loss=float(i))
        seen.append(i)
    assert seen == list(range(8))
    assert bar.step == 7 and bar.lag == delay and bar.rows == 8 - delay


def test_start_numbers_the_loops_steps_for_a_log_that_already_has_rows():
    log, clock = FakeLog(), Clock()
    for _ in range(5):  # a first epoch recorded rows 0..4
        log.record(loss=1.0)
    log.ready()
    bar = gs.progress(range(3), log, file=io.StringIO(), start=5, clock=clock)
    for _ in bar:
        log.record(loss=2.0)
    assert bar.row == {"step": 7, "loss": 2.0} and bar.step == 7 and bar.lag == 0


def test_rows_without_a_step_are_numbered_as_they_arrive():
    class Plain:
        def __init__(self):
            self.rows = []

        def ready(self):
            rows, self.rows = self.rows, []
            return rows

    log = Plain()
    bar = gs.progress(range(3), log, file=io.StringIO(), clock=Clock())
    for i in bar:
        log.rows.append({"loss": float(i)})
    assert bar.row == {"loss": 2.0, "step": 2} and bar.lag == 0


def test_on_row_sees_every_row_the_bar_takes_in_order():
    log, taken = FakeLog(delay=2), []
    bar = gs.progress(range(5), log, file=io.StringIO(), on_row=taken.append, clock=Clock())
    for i in bar:
        log.record(loss=float(i))
    assert [row["step"] for row in taken] == [0, 1, 2]
    assert taken[-1] is bar.row


def test_host_values_of_every_kind_are_formatted_without_a_read():
    log = FakeLog()
    bar = gs.progress(range(1), log, file=io.StringIO(), clock=Clock())
    for _ in bar:
        log.record(a=np.float32(0.123456), b=np.int64(3), c=True, d="ok", e=1e-7, f=2 + 1j)
    assert bar.postfix() == "a=0.1235, b=3, c=True, d=ok, e=1e-07, f=2+1j, step=0, lag=0"


def test_dropped_rows_are_shown_live_and_in_the_final_line():
    log, out = FakeLog(dropped=3), io.StringIO()
    for i in gs.progress(range(2), log, file=out, every=math.inf, clock=Clock()):
        log.record(loss=float(i))
    assert out.getvalue() == "2/2 [100%, 0.0s] loss=1, step=1, lag=0, dropped=3\n"


def test_a_bar_without_a_log_has_no_postfix_and_without_len_no_total():
    out = io.StringIO()
    items = list(gs.progress((c for c in "abc"), desc="chars", file=out, clock=Clock()))
    assert items == ["a", "b", "c"]
    assert out.getvalue() == "chars: 3 [0.0s]\n"


def test_the_log_is_polled_before_each_redraw_and_every_quarter_of_its_capacity():
    log, clock = FakeLog(capacity=8), Clock()
    bar = gs.progress(range(10), log, file=io.StringIO(), every=math.inf, clock=clock)
    assert bar.poll_every == 2
    for i in bar:
        log.record(loss=float(i))
    assert log.polls == 10 // 2 + 1  # every 2 steps, and once when closing
    log, clock, out = FakeLog(capacity=1000), Clock(), io.StringIO()
    for i in gs.progress(range(10), log, file=out, every=3, clock=clock):
        log.record(loss=float(i))
        clock.now += 1
    assert log.polls == 3 + 1  # before each of the 3 lines, and once when closing
    assert out.getvalue().splitlines()[0].endswith("loss=2, step=2, lag=0")  # fresh when drawn
    assert gs.progress([], FakeLog(capacity=3)).poll_every == 1
    assert gs.progress([], FakeLog(capacity=1000), poll_every=7).poll_every == 7


# ---- no syncs ----------------------------------------------------------------------------------


def test_a_loop_with_a_log_and_a_bar_makes_no_sync_on_the_strict_device(no_tqdm):
    """The bar polls the log and formats its host rows; the loop's device values are never
    read: no sync counted, none refused by the guard, whatever the style."""
    x = strict.xp.asarray(np.linspace(0.0, 1.0, 16))
    for out in (io.StringIO(), Terminal()):
        log, clock = FakeLog(delay=1), Clock()
        with gs.count_syncs() as counter, gs.sync_guard("error"):
            total = gs.asscalar(0.0, like=x)
            bar = gs.progress(range(6), log, desc="strict", file=out, every=0, clock=clock)
            for i in bar:
                loss = gs.mean(x * x) * (i + 1)  # a GPUScalar on the strict device
                total = total + loss
                log.record(loss=float(i + 1) / 3)  # the host value a MetricLog would copy back
                clock.now += 1
        assert counter.count == 0 and counter.device_ops > 0
        assert out.getvalue().rstrip("\n").split("\n")[-1].split("\r")[-1].endswith(
            "loss=1.667, step=4, lag=1")


def test_a_device_value_in_a_row_is_refused_by_name_not_read():
    class Leaky(FakeLog):
        def ready(self):
            return [{"step": 0, "loss": gs.asscalar(1.5)}]

    with gs.sync_guard("error"), pytest.raises(
            TypeError, match="row value 'loss' is a GPUScalar of dtype float64; a ready row "
            "holds host numbers"):
        for _ in gs.progress(range(2), Leaky(), file=io.StringIO()):
            pass


# ---- closing -----------------------------------------------------------------------------------


def test_an_exception_in_the_loop_closes_the_bar_with_a_final_line_and_no_flush():
    log, out = FakeLog(delay=5), io.StringIO()
    bar = gs.progress(range(10), log, file=out, every=math.inf, flush=True, clock=Clock())
    with pytest.raises(ZeroDivisionError):
        for i in bar:
            log.record(loss=float(i))
            if i == 6:
                1 / 0  # noqa: B018
    assert bar.closed and not bar.exhausted and log.flushes == 0
    # 6 steps done; step 6 is the one the exception left, its row recorded: rows 0..6, 5 late
    assert out.getvalue() == "6/10 [60%, 0.0s] loss=1, step=1, lag=5\n"


def test_flush_true_waits_for_the_last_rows_once_at_the_end():
    log, out = FakeLog(delay=3), io.StringIO()
    bar = gs.progress(range(5), log, file=out, every=math.inf, flush=True, clock=Clock())
    for i in bar:
        log.record(loss=float(i))
    assert log.flushes == 1 and bar.lag == 0
    assert out.getvalue() == "5/5 [100%, 0.0s] loss=4, step=4, lag=0\n"
    bar.close()  # once only
    assert log.flushes == 1 and out.getvalue().count("\n") == 1


def test_a_break_and_the_with_block_close_without_flushing():
    log, out = FakeLog(), io.StringIO()
    with gs.progress(range(10), log, file=out, every=math.inf, flush=True,
                     clock=Clock()) as bar:
        for i in bar:
            log.record(loss=float(i))
            if i == 2:
                break
    assert bar.closed and log.flushes == 0
    # 2 steps done (as tqdm counts a break), step 2's row recorded: lag 0
    assert out.getvalue() == "2/10 [20%, 0.0s] loss=2, step=2, lag=0\n"
    with gs.progress(range(3), file=out, clock=Clock()) as unused:
        pass  # never iterated: the with block still closes it
    assert unused.closed


def test_a_bar_is_iterated_once():
    bar = gs.progress(range(2), file=io.StringIO())
    assert list(bar) == [0, 1]
    with pytest.raises(RuntimeError, match="iterated once"):
        iter(bar)


def test_durations_over_a_minute():
    clock, out = Clock(), io.StringIO()
    for _ in gs.progress(range(1), file=out, clock=clock):
        clock.now += 3723
    assert out.getvalue() == "1/1 [100%, 1:02:03, 0.0 steps/s]\n"


# ---- bad arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    ({"log": object()}, TypeError, "log must be a gs.MetricLog .* got an object"),
    ({"log": [1, 2]}, TypeError, "log must be a gs.MetricLog"),
    ({"every": -1}, ValueError, "every must be >= 0 seconds, got -1"),
    ({"every": math.nan}, ValueError, "every must be >= 0 seconds, got nan"),
    ({"every": True}, TypeError, "every must be a number of seconds, got True"),
    ({"every": "1"}, TypeError, "every must be a number of seconds, got '1'"),
    ({"total": -1}, ValueError, "total must be None or an int >= 0, got -1"),
    ({"total": 2.0}, ValueError, "total must be None or an int >= 0, got 2.0"),
    ({"desc": 3}, TypeError, "desc must be a str, got 3"),
    ({"file": "out.txt"}, TypeError, "file must have a write"),
    ({"flush": True}, ValueError, "flush=True waits for a log's last rows; no log"),
    ({"start": 1.0}, TypeError, "start must be an int"),
    ({"on_row": 3}, TypeError, "on_row must be callable"),
    ({"terminal": 1}, TypeError, "terminal must be None or a bool"),
    ({"clock": 0.0}, TypeError, "clock must be callable"),
    ({"poll_every": 0}, ValueError, "poll_every must be None or an int >= 1 .steps., got 0"),
    ({"poll_every": 2.0}, ValueError, "poll_every must be None or an int >= 1"),
])
def test_bad_arguments_are_refused_with_clear_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        progress(range(3), **kwargs)


def test_bad_iterables_logs_and_rows_are_refused_by_name():
    with gs.sync_guard("error"):
        with pytest.raises(TypeError, match="iterable must be iterable, got a GPUScalar"):
            progress(gs.asscalar(3))  # named, not read
        with pytest.raises(TypeError, match="every must be a number of seconds, got a GPUS"):
            progress(range(3), every=gs.asscalar(1.0))

    class NoFlush:
        def ready(self):
            return []

    with pytest.raises(TypeError, match="flush=True needs a log with flush()"):
        progress(range(3), NoFlush(), flush=True)

    class Odd(NoFlush):
        def __init__(self, rows):
            self._rows = rows

        def ready(self):
            return self._rows

    for rows, message in ((None, r"log.ready\(\) must return rows .* got None"),
                          ([3.0], r"log.ready\(\) returned 3.0 as a row"),
                          ([{"step": 0.5, "loss": 1.0}], "row value 'step' is 0.5")):
        with pytest.raises(TypeError, match=message):
            list(progress(range(2), Odd(rows), file=io.StringIO()))


def test_gs_progress_is_the_function():
    assert gs.progress is progress and "progress" in gs.__all__


def test_any_object_with_write_is_a_file():
    class Writer:  # no flush(), no isatty(): not a terminal
        def __init__(self):
            self.parts = []

        def write(self, text):
            self.parts.append(text)

    out = Writer()
    assert list(gs.progress(range(2), file=out, clock=Clock())) == [0, 1]
    assert out.parts == ["2/2 [100%, 0.0s]\n"]


# ---- with gs.MetricLog ---------------------------------------------------------------------------


@pytest.fixture
def metric_log():
    if not hasattr(gs, "MetricLog"):
        pytest.skip("gs.MetricLog is not there yet (gpuscalar/deferred.py)")
    return gs.MetricLog


@pytest.mark.parametrize("style", ["lines", "in place", "tqdm"])
def test_a_loop_with_a_metric_log_and_a_bar_makes_no_sync_on_the_strict_device(
        metric_log, style, monkeypatch):
    """The real log on the strict device: each record is one device op, and its rows are
    ready at once (lag 0), so the bar shows each step's loss, the values the loop computed on
    the device, with no sync: none counted, none refused by the guard."""
    if style == "in place":
        monkeypatch.setitem(sys.modules, "tqdm", None)
    elif style == "tqdm":
        pytest.importorskip("tqdm")
    out = io.StringIO() if style == "lines" else Terminal()
    x = strict.xp.asarray(np.linspace(0.0, 1.0, 16))
    log, clock, shown = metric_log(capacity=4), Clock(), []
    with gs.count_syncs() as counter, gs.sync_guard("error"):
        bar = gs.progress(range(6), log, desc="strict", file=out, every=0, clock=clock)
        assert bar.style == style and bar.poll_every == 1
        for i in bar:
            loss = gs.mean(x * x) * (i + 1)  # a pending GPUScalar on the strict device
            log.record(loss=loss)
            clock.now += REFRESH
            if i:
                shown.append((bar.row["step"], bar.row["loss"], bar.lag))
    assert counter.count == 0 and counter.device_ops >= 6  # a record each, at least
    assert log.dropped == 0 and bar.lag == 0 and bar.row["step"] == 5
    mean = float(np.mean(np.linspace(0.0, 1.0, 16) ** 2))
    assert shown == [(k, pytest.approx(mean * (k + 1)), 1) for k in range(5)]
    assert f"loss={mean * 6:.4g}, step=5, lag=0" in out.getvalue()


def test_a_metric_log_flushed_at_the_end_costs_one_sync(metric_log):
    x = strict.xp.asarray(np.ones(4))
    log, out = metric_log(capacity=8), io.StringIO()
    with gs.count_syncs() as counter:
        for i in gs.progress(range(3), log, file=out, every=math.inf, flush=True, clock=Clock()):
            log.record(loss=gs.sum(x) * i)
    assert counter.count == 1  # the flush, once, at the end
    assert out.getvalue() == "3/3 [100%, 0.0s] loss=8, step=2, lag=0\n"


def test_rows_a_metric_log_dropped_are_shown_with_the_warning_it_gives(metric_log):
    """A log polled less often than its capacity (poll_every overridden) loses rows: the log
    warns and counts them, and the bar shows the count."""
    from gpuscalar.deferred import DroppedRowsWarning

    log, out = metric_log(capacity=2), io.StringIO()
    with pytest.warns(DroppedRowsWarning, match="overwritten"):
        for i in gs.progress(range(6), log, file=out, every=math.inf, poll_every=5,
                             clock=Clock()):
            log.record(loss=float(i))
    assert log.dropped == 3  # rows 0..2: the poll after step 5 found rows 3 and 4
    assert out.getvalue() == "6/6 [100%, 0.0s] loss=5, step=5, lag=0, dropped=3\n"
