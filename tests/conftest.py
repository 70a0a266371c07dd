"""Shared fixtures: the backend parametrization and a clean sync state around every test."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import sync

BACKEND_NAMES = ("numpy", "cupy")


@pytest.fixture(params=BACKEND_NAMES)
def xp(request: pytest.FixtureRequest):
    """The array module under test; CuPy cases skip where no CUDA device is present."""
    if request.param == "cupy" and not gs.gpu_available():
        pytest.skip("CuPy needs a CUDA device, and this machine has none")
    return importlib.import_module(request.param)


@pytest.fixture(autouse=True)
def clean_sync_state():
    """Every test starts and must end with no active counter and the default guard mode."""
    mode_before = sync._guard_mode.get()
    assert sync._active_counters.get() == ()
    yield
    assert sync._active_counters.get() == (), "a test left a sync counter active"
    assert sync._guard_mode.get() == mode_before, "a test left a sync guard active"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
