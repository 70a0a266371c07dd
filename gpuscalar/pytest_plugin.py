"""pytest plugin: sync budgets for tests (auto-loaded through the ``pytest11`` entry point).

Why this module exists: a sync that creeps into a training step is a performance regression
that no functional test notices. With this plugin a test states its budget and fails with the
report of where the syncs came from when it is exceeded:

- fixture ``sync_counter``: a `SyncCounter` that counts the syncs and device ops of the test's
  body (the call phase; fixture set-up and tear-down are not counted), in every thread: a worker
  thread the test starts is counted too, at the worker's line;
- marker ``@pytest.mark.max_syncs(n)``: fail the test when its body makes more than ``n`` syncs;
- option ``--gpuscalar-report``: a terminal summary of the session's syncs (test bodies), by
  test and by call site.

The syncs counted are gpuscalar's own reads (as ``count_syncs()`` counts them), on every
backend alike; the array library's own reads (``x.get()``, ``cupy.asnumpy``, ...), which a test
makes to check its results, are not part of a budget. While a test body runs, its counter sees
every thread of the process (``count_syncs(all_threads=True)``), so a thread still running from
an earlier test is counted too: join the threads a test starts.

Disable it with ``-p no:gpuscalar``.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import pytest

from . import sync

__all__ = ["sync_counter"]

MARKER_HELP = (
    "max_syncs(n): fail the test if its body makes more than n gpuscalar device->host syncs"
)
_COUNTER_KEY = pytest.StashKey[sync.SyncCounter]()
_SESSION_KEY = pytest.StashKey["_SessionSyncs"]()
#: How many tests and call sites the session summary lists.
REPORT_TESTS = 10
REPORT_SITES = 20


@dataclass
class _SessionSyncs:
    """The session's syncs, test bodies only, for ``--gpuscalar-report``."""

    counter: sync.SyncCounter = field(default_factory=sync.SyncCounter)
    per_test: dict[str, int] = field(default_factory=dict)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuscalar", "gpuscalar device->host sync accounting")
    group.addoption(
        "--gpuscalar-report",
        action="store_true",
        default=False,
        help="print a summary of the gpuscalar syncs made by the test bodies, by call site",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    if config.getoption("gpuscalar_report", default=False):
        config.stash[_SESSION_KEY] = _SessionSyncs()


@pytest.fixture
def sync_counter(request: pytest.FixtureRequest) -> sync.SyncCounter:
    """A `SyncCounter` active for the test's body: ``.count``, ``.device_ops``, ``.records``.

    It counts in every thread (a worker the test starts included), at each sync's own line."""
    counter = sync.SyncCounter()
    request.node.stash[_COUNTER_KEY] = counter
    return counter


def _max_syncs(item: pytest.Item) -> int | None:
    """The limit of the closest ``max_syncs`` marker, validated; None when unmarked."""
    __tracebackhide__ = True  # a bad marker is the user's error: show the message, not us
    marker = item.get_closest_marker("max_syncs")
    if marker is None:
        return None
    args, kwargs = marker.args, marker.kwargs
    if len(args) + len(kwargs) != 1 or (kwargs and "n" not in kwargs):
        given = [sync.describe(a) for a in args]  # (never a device value: that is a sync)
        given += [f"{key}={sync.describe(value)}" for key, value in kwargs.items()]
        raise TypeError(
            "@pytest.mark.max_syncs takes exactly one argument, the limit n; "
            f"got max_syncs({', '.join(given)})"
        )
    limit = marker.args[0] if marker.args else marker.kwargs["n"]
    if type(limit) is not int:
        shown = sync.describe(limit)  # (never the value of a device scalar: a sync)
        if not shown.startswith(("a ", "an ")):
            shown = f"{type(limit).__name__} {shown}"
        raise TypeError(f"@pytest.mark.max_syncs(n) takes an int, got {shown}")
    if limit < 0:
        raise ValueError(f"@pytest.mark.max_syncs(n) takes n >= 0, got {limit}")
    return limit


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    __tracebackhide__ = True  # while validating the marker (see `_max_syncs`)
    limit = _max_syncs(item)
    __tracebackhide__ = False
    counter = item.stash.get(_COUNTER_KEY, None)
    session = item.config.stash.get(_SESSION_KEY, None)
    if counter is None and limit is None and session is None:
        return (yield)
    if counter is None:
        counter = sync.SyncCounter()
    try:
        with sync._activate(counter, all_threads=True):
            result = yield
    finally:
        if session is not None:
            session.counter.records.extend(counter.records)
            session.counter.device_ops += counter.device_ops
            session.per_test[item.nodeid] = counter.count
    if limit is not None and counter.count > limit:
        pytest.fail(
            f"{counter.count} gpuscalar syncs in the test body, more than max_syncs({limit})\n"
            + counter.report(),
            pytrace=False,
        )
    return result


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is None:
        return
    write = terminalreporter.write_line
    terminalreporter.section("gpuscalar sync report")
    counter = session.counter
    write(f"{_counted(counter.count, 'sync')}, {_counted(counter.device_ops, 'device op')} "
          f"in the bodies of {_counted(len(session.per_test), 'test')}")
    busiest = sorted(
        ((n, nodeid) for nodeid, n in session.per_test.items() if n), key=lambda t: (-t[0], t[1])
    )
    if busiest:
        write("tests with the most syncs:")
        for n, nodeid in busiest[:REPORT_TESTS]:
            write(f"  {n:>5}  {nodeid}")
        write(counter.report(limit=REPORT_SITES))


def _counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``1 test``, ``3 tests``)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
