"""gs.progress: a progress bar that shows a loop's logged values without stalling the loop.

Why this module exists: the syncs left in a sync-free loop are the ones added to watch it. A bar
whose postfix is ``f"{loss:.3f}"`` reads the loss every step, one sync each. `progress` shows
instead the latest row a `gs.MetricLog` has already brought to the host (``log.ready()``: it
polls, never waits), and how many steps that row lags behind the loop; the loop itself never
waits for the device. The values of a ready row are host numbers: formatting them reads nothing.

The bar is tqdm's where tqdm is installed (the ``progress`` extra) and the output is a terminal,
redrawn in place at most every `REFRESH` seconds; on a terminal without tqdm, one plain line
redrawn in place. When the output is not a terminal (a log file, a pipe, CI), plain lines, one
every ``every`` seconds, each on its own line (tqdm's in-place redraws would pile up there).
Closing (exhaustion, an exception in the loop, ``break``, the ``with`` block's end) draws a
final line with the latest row, the lag and the rows the log dropped; ``flush=True`` waits for
the log's last rows first: one counted sync, at the end only, and only when asked.

The log is polled before each redraw (so the row shown is as fresh as the device allows) and
every `poll_every` steps between them (a quarter of the log's capacity by default, so its ring
is drained before a row is overwritten unread), not at every step: on a GPU a poll that finds
the last copy landed starts the next one (a few CUDA calls), which a fast loop should not pay
per step. The bar takes the rows from the log (``ready()`` hands each row out once): pass
``on_row`` to see every row it takes, e.g. to write them to a file. This module never imports
the log's module: any object with a ``ready()`` method returning rows (mappings) is a log here.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from .sync import describe

__all__ = ["EVERY", "REFRESH", "Progress", "TextOutput", "progress"]

T = TypeVar("T")


class TextOutput(Protocol):
    """Where a bar draws: a text file (``sys.stderr``, an open file, ``io.StringIO``); its
    ``flush()`` is called after each line and its ``isatty()`` tells whether it is a terminal,
    where it has them."""

    def write(self, text: str, /) -> object: ...

#: Seconds between two lines when the output is not a terminal (``every``'s default).
EVERY = 10.0
#: Seconds between two redraws of the bar on a terminal.
REFRESH = 0.1
#: The key under which a log's row carries its row number.
STEP = "step"
#: The types a row value may have: host numbers and strings, formatted without a read.
_HOST_VALUES = (bool, int, float, complex, str, np.generic)


def progress(iterable: Iterable[T], log: Any = None, *, total: int | None = None,
             desc: str | None = None, file: TextOutput | None = None, every: float = EVERY,
             start: int = 0, flush: bool = False, poll_every: int | None = None,
             on_row: Callable[[Mapping[str, Any]], object] | None = None,
             terminal: bool | None = None,
             clock: Callable[[], float] = time.monotonic) -> Progress[T]:
    """A progress bar over ``iterable`` (yielding its items) whose postfix shows the latest row
    of ``log`` that is ready on the host and its lag in steps, with no sync per step.

    ``log``: a `gs.MetricLog` (or any object with ``ready()``), polled with ``log.ready()``
    before each redraw and every ``poll_every`` steps (default: a quarter of ``log.capacity``,
    or every step for a log without one), never waited for. The lag is the loop's current step
    minus the row's ``"step"`` (its row number), the loop's steps numbered from ``start`` (the
    row the loop's first step records: 0 for a fresh log recorded once per step).
    ``total``: the number of steps (default ``len(iterable)`` where it has one). ``desc``: a
    label before the bar. ``file``: where to draw (default ``sys.stderr``). ``every``: seconds
    between lines when ``file`` is not a terminal (``0``: a line per step; ``math.inf``: the
    final line only). ``flush``: when the loop runs to its end, call ``log.flush()`` (one
    counted sync) so the final line shows the log's last row; off by default, since the
    contract is no sync. ``on_row``: called with each row the bar takes from the log, in
    order. ``terminal``: whether ``file`` redraws in place (default ``file.isatty()``).
    ``clock``: seconds, for tests. Use it as ``for item in gs.progress(...)`` or
    ``with gs.progress(...) as bar:``.
    """
    return Progress(iterable, log, total=total, desc=desc, file=file, every=every, start=start,
                    flush=flush, poll_every=poll_every, on_row=on_row, terminal=terminal,
                    clock=clock)


class Progress(Generic[T]):
    """The bar `progress` returns: iterate over it once; closing it draws the final line."""

    def __init__(self, iterable: Iterable[T], log: Any, *, total: int | None, desc: str | None,
                 file: TextOutput | None, every: float, start: int, flush: bool,
                 poll_every: int | None, on_row: Callable[[Mapping[str, Any]], object] | None,
                 terminal: bool | None, clock: Callable[[], float]) -> None:
        _check(iterable, log, total, desc, file, every, start, flush, on_row, terminal, clock)
        if poll_every is None:
            capacity = getattr(log, "capacity", None)
            poll_every = max(capacity // 4, 1) if type(capacity) is int else 1
        elif type(poll_every) is not int or poll_every < 1:
            raise ValueError("progress: poll_every must be None or an int >= 1 (steps), got "
                             f"{describe(poll_every)}")
        if total is None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable = iterable
        self.log = log
        self.total = total
        self.desc = desc
        self.file: TextOutput = sys.stderr if file is None else file
        self.every = float(every)
        self.start = start
        self.flush_at_end = flush
        #: steps between two polls of the log, besides the poll before each redraw
        self.poll_every = poll_every
        self._unpolled = 0  # steps done since the last poll
        self.on_row = on_row
        self.clock = clock
        if terminal is None:
            terminal = _isatty(self.file)
        self.terminal = terminal
        #: steps done: items the loop has finished with
        self.n = 0
        self._yielded = 0  # items handed to the loop: n, or n + 1 inside a step
        #: the latest row taken from the log, None before the first
        self.row: Mapping[str, Any] | None = None
        #: rows taken from the log so far
        self.rows = 0
        self.closed = False
        #: whether the loop ran to the iterable's end (no exception, no ``break``)
        self.exhausted = False
        self._iterated = False
        self._drawn_at: tuple[int, int] | None = None  # (n, rows) when last drawn
        self._started = clock()
        self._drawn = self._started  # when a line was last drawn
        self._width = 0  # of the last in-place plain line, to blank its leftovers
        self._tqdm: Any = None
        if terminal:
            try:  # imported by name: tqdm ships no type information (it is Any here)
                tqdm = importlib.import_module("tqdm").tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._tqdm = tqdm(total=total, desc=desc, file=self.file, mininterval=0,
                                  miniters=1, dynamic_ncols=True)
        #: how the bar is drawn: "tqdm", "in place" (a terminal without tqdm) or "lines"
        self.style = "tqdm" if self._tqdm is not None else "in place" if terminal else "lines"

    # ---- what the postfix shows ---------------------------------------------------------------

    @property
    def step(self) -> int | None:
        """The loop's current step, numbered from ``start``: the step just done when the bar
        is drawn, the one a ``break`` or an exception left; None before the first."""
        return self.start + self._yielded - 1 if self._yielded else None

    @property
    def lag(self) -> int | None:
        """How many steps the latest ready row lags behind the loop's current step (0: the row
        of the step just done); None without a row."""
        if self.row is None or not self._yielded:
            return None
        return self.start + self._yielded - 1 - self.row[STEP]

    @property
    def dropped(self) -> int:
        """Rows the log overwrote before they were read (its ``dropped``; 0 where it has none)."""
        dropped = getattr(self.log, "dropped", 0)
        return dropped if type(dropped) is int else 0

    def postfix(self) -> str:
        """The latest row's values, its step and lag: ``loss=0.6701, step=56, lag=0``."""
        if self.log is None:
            return ""
        if self.row is None:
            text = "no row yet"
        else:
            cells = [f"{key}={_format(value)}" for key, value in self.row.items() if key != STEP]
            text = ", ".join([*cells, f"step={self.row[STEP]}", f"lag={self.lag}"])
        dropped = self.dropped
        return text + (f", dropped={dropped}" if dropped else "")

    def poll(self) -> None:
        """Take the rows the log has ready (``log.ready()``: never waits) and keep the latest."""
        if self.log is not None:
            self._unpolled = 0
            self._take(self.log.ready(), "ready()")

    def _take(self, rows: Any, method: str) -> None:
        if not isinstance(rows, Iterable):
            raise TypeError(f"progress: log.{method} must return rows (a list of mappings), "
                            f"got {describe(rows)}")
        for row in rows:
            if not isinstance(row, Mapping):
                raise TypeError(f"progress: log.{method} returned {describe(row)} as a row; "
                                "a row is a mapping of names to host numbers")
            if STEP not in row:  # no row number: numbered in order of arrival
                row = {**row, STEP: self.start + self.rows}
            for key, value in row.items():
                if not isinstance(value, _HOST_VALUES) or (key == STEP and type(value) is not int):
                    raise TypeError(
                        f"progress: the log's row value {key!r} is {describe(value)}; a ready "
                        "row holds host numbers (formatting a device value would read it)")
            self.rows += 1
            self.row = row
            if self.on_row is not None:
                self.on_row(row)

    # ---- iterating and drawing ----------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        if self._iterated:
            raise RuntimeError("progress: a bar is iterated once (make a new one per loop)")
        self._iterated = True
        return self._steps()

    def _steps(self) -> Iterator[T]:
        clock, interval = self.clock, REFRESH if self.terminal else self.every
        poll_every = self.poll_every
        try:
            for item in self.iterable:
                self._yielded += 1
                yield item
                self.n += 1  # the loop's body for this item is done
                unpolled = self._unpolled = self._unpolled + 1
                now = clock()
                if now - self._drawn >= interval:
                    self._drawn = now
                    self.poll()
                    self._draw()
                elif unpolled >= poll_every:
                    self.poll()
            self.exhausted = True
        finally:
            self.close()

    def __enter__(self) -> Progress[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Draw the final line and release the bar; once (later calls do nothing). The log's
        last rows are waited for (``log.flush()``: one sync) only where the bar was made with
        ``flush=True`` and the loop ran to its end (not on an exception or a ``break``)."""
        if self.closed:
            return
        self.closed = True
        if self.log is not None:
            self.poll()
            if self.flush_at_end and self.exhausted:
                self._take(self.log.flush(), "flush()")
        self._draw(final=True)

    def _draw(self, final: bool = False) -> None:
        drawn_at, self._drawn_at = self._drawn_at, (self.n, self.rows)
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(self.postfix(), refresh=False)
            self._tqdm.update(self.n - self._tqdm.n)
            if final:
                self._tqdm.close()
            return
        line = self.line()
        if self.style == "lines":
            if final and drawn_at == self._drawn_at:
                return  # the last line drawn already says it all
            self.file.write(line + "\n")
        else:
            self.file.write("\r" + line.ljust(self._width) + ("\n" if final else ""))
            self._width = len(line)
        flush = getattr(self.file, "flush", None)
        if flush is not None:
            flush()

    def line(self) -> str:
        """The plain line: ``desc: 57/200 [28%, 0.9s, 63.3 steps/s] loss=0.6701, ...``."""
        elapsed = max(self.clock() - self._started, 0.0)
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        facts = [f"{100 * self.n // self.total}%"] if self.total else []
        facts.append(_duration(elapsed))
        if elapsed > 0:
            facts.append(f"{self.n / elapsed:.1f} steps/s")
        text = f"{count} [{', '.join(facts)}]"
        postfix = self.postfix()
        return (f"{self.desc}: " if self.desc else "") + text + (f" {postfix}" if postfix else "")


def _format(value: Any) -> str:
    if isinstance(value, (float, complex, np.floating, np.complexfloating)):
        return f"{value:.4g}"
    return str(value)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _isatty(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed file
        return False


def _check(iterable: Any, log: Any, total: Any, desc: Any, file: Any, every: Any, start: Any,
           flush: Any, on_row: Any, terminal: Any, clock: Any) -> None:
    """Refuse bad arguments with a message naming them (device values named, never read)."""
    if not isinstance(iterable, Iterable):
        raise TypeError(f"progress: iterable must be iterable, got {describe(iterable)}")
    if log is not None and not callable(getattr(log, "ready", None)):
        raise TypeError("progress: log must be a gs.MetricLog (an object with a ready() "
                        f"method), got {describe(log)}")
    if flush and log is None:
        raise ValueError("progress: flush=True waits for a log's last rows; no log was given")
    if flush and not callable(getattr(log, "flush", None)):
        raise TypeError(f"progress: flush=True needs a log with flush(), got {describe(log)}")
    if total is not None and (type(total) is not int or total < 0):
        raise ValueError(f"progress: total must be None or an int >= 0, got {describe(total)}")
    if desc is not None and not isinstance(desc, str):
        raise TypeError(f"progress: desc must be a str, got {describe(desc)}")
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"progress: file must have a write() method, got {describe(file)}")
    if type(every) not in (int, float):
        raise TypeError(f"progress: every must be a number of seconds, got {describe(every)}")
    if math.isnan(every) or every < 0:
        raise ValueError(f"progress: every must be >= 0 seconds, got {every!r}")
    if type(start) is not int:
        raise TypeError(f"progress: start must be an int (a row number), got {describe(start)}")
    if on_row is not None and not callable(on_row):
        raise TypeError(f"progress: on_row must be callable, got {describe(on_row)}")
    if terminal is not None and type(terminal) is not bool:
        raise TypeError(f"progress: terminal must be None or a bool, got {describe(terminal)}")
    if not callable(clock):
        raise TypeError(f"progress: clock must be callable, got {describe(clock)}")
