"""Backends: CuPy is never imported eagerly; detection; dispatch counting; errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import devices


def test_import_gpuscalar_does_not_import_cupy():
    code = "import sys, gpuscalar; print('cupy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


def test_backend_of_recognises_numpy_and_nothing_else():
    assert devices.backend_of(np.zeros(2)) is devices.NUMPY
    for value in ([1.0], 1.0, "x", None, np.float64(1)):
        assert devices.backend_of(value) is None


def test_cupy_arrays_are_recognised_through_sys_modules(monkeypatch):
    class FakeCupyArray:
        pass

    class FakeCupyModule:
        ndarray = FakeCupyArray

    monkeypatch.setitem(sys.modules, "cupy", FakeCupyModule)
    assert devices.backend_of(FakeCupyArray()) is devices.CUPY
    monkeypatch.delitem(sys.modules, "cupy")
    assert devices.backend_of(FakeCupyArray()) is None


def test_cupy_imports_and_default_backend_follows_the_device():
    # CI installs cupy-cuda12x: the device-free part of the CuPy backend runs here; on a GPU
    # machine the same test sees the device.
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver or no device: CuPy's own answer is "none"
        count = 0
    assert gs.gpu_available() is (count > 0)
    assert gs.default_backend() is (devices.CUPY if count > 0 else devices.NUMPY)
    assert gs.get_backend("cupy") is devices.CUPY


def test_get_backend_rejects_unknown_names():
    assert gs.get_backend("numpy") is devices.NUMPY
    with pytest.raises(ValueError, match="'jax'.*'cupy', 'strict', 'numpy'"):
        gs.get_backend("jax")


def test_every_call_through_dispatch_is_one_device_op():
    with gs.count_syncs() as counter:
        devices.NUMPY.call(np.add, np.ones(2), 1.0)
        devices.NUMPY.vector_norm(np.ones(2), ord=2, axis=None, keepdims=False)
    assert counter.device_ops == 2 and counter.count == 0


def test_ufunc_lookup_is_cached_per_backend():
    assert devices.NUMPY.ufunc("add") is np.add
    assert devices.NUMPY.ufunc("add") is devices.NUMPY.ufunc("add")
    with pytest.raises(AttributeError):
        devices.NUMPY.ufunc("no_such_ufunc")


def test_describe_names_the_cpu_and_numpy():
    text = devices.describe(devices.NUMPY)
    assert text.startswith("CPU") and np.__version__ in text
