"""Shared fixtures: the backend parametrization and a clean sync state around every test."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict, sync

from . import cupy_fake
from . import nvrtc as nvrtc_helpers

#: Every backend-parametrized test runs on each: NumPy, the CuPy-strict CPU device (a duck
#: array that refuses implicit host conversion, as CuPy does) and CuPy (skipped without a GPU).
BACKEND_NAMES = ("numpy", "strict", "cupy")


@pytest.fixture(params=BACKEND_NAMES)
def xp(request: pytest.FixtureRequest):
    """The array namespace under test; CuPy cases skip where no CUDA device is present."""
    if request.param == "strict":
        return strict.xp
    if request.param == "cupy" and not gs.gpu_available():
        pytest.skip("CuPy needs a CUDA device, and this machine has none")
    return importlib.import_module(request.param)


@pytest.fixture(params=("lazy", "eager"))
def scalar_mode(request: pytest.FixtureRequest):
    """Run a test with lazy GPUScalar expressions (the default) and again eagerly; the test
    may read the mode (``"lazy"`` or ``"eager"``) where exact device-op counts differ."""
    with gs.lazy(request.param == "lazy"):
        yield request.param


@pytest.fixture(autouse=True)
def clean_sync_state():
    """Every test starts and must end with no active counter and the default guard mode."""
    mode_before = sync._guard_mode.get()
    assert sync._active_counters.get() == ()
    assert not sync.inside_device_op()
    yield
    assert sync._active_counters.get() == (), "a test left a sync counter active"
    assert sync._guard_mode.get() == mode_before, "a test left a sync guard active"
    assert not sync.inside_device_op(), "a test left a device op open"


@pytest.fixture(scope="session")
def nvrtc():
    """CuPy's NVRTC binding (compile checks without a GPU); skips without it, fails in CI."""
    return nvrtc_helpers.load()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs_cupy``: the test imports CuPy (no GPU needed). Without CuPy (an
    install without the ``cuda12``/``cuda13`` extra) it skips, saying so; under ``CI=true``,
    where the extra is installed, it fails instead (`cupy_fake.cupy_or_fail`)."""
    if item.get_closest_marker("needs_cupy") is not None:
        cupy_fake.cupy_or_fail()


@pytest.fixture
def switch_often():
    """Threads switch every microsecond during the test (forced interleaving, for anything
    process-wide shared by threads)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line per skip reason (with its count) instead of pytest's line per location: on a
    machine without a GPU every CuPy case skips for the same reason."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"skipped {count}: {reason}")
