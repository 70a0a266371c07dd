"""Backends: CuPy is never imported eagerly; detection; dispatch counting; errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import backend


def test_import_gpuscalar_does_not_import_cupy():
    code = "import sys, gpuscalar; print('cupy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


def test_backend_of_recognises_numpy_and_nothing_else():
    assert backend.backend_of(np.zeros(2)) is backend.NUMPY
    for value in ([1.0], 1.0, "x", None, np.float64(1)):
        assert backend.backend_of(value) is None


def test_cupy_arrays_are_recognised_through_sys_modules(monkeypatch):
    class FakeCupyArray:
        pass

    class FakeCupyModule:
        ndarray = FakeCupyArray

    monkeypatch.setitem(sys.modules, "cupy", FakeCupyModule)
    assert backend.backend_of(FakeCupyArray()) is backend.CUPY
    monkeypatch.delitem(sys.modules, "cupy")
    assert backend.backend_of(FakeCupyArray()) is None


def test_cupy_imports_and_default_backend_follows_the_device():
    # CI installs cupy-cuda12x: the device-free part of the CuPy backend runs here; on a GPU
    # machine the same test sees the device.
    cupy = pytest.importorskip("cupy")
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver or no device: CuPy's own answer is "none"
        devices = 0
    assert gs.gpu_available() is (devices > 0)
    assert gs.default_backend() is (backend.CUPY if devices > 0 else backend.NUMPY)
    assert gs.get_backend("cupy") is backend.CUPY


def test_get_backend_rejects_unknown_names():
    assert gs.get_backend("numpy") is backend.NUMPY
    with pytest.raises(ValueError, match="'jax'.*'cupy', 'strict', 'numpy'"):
        gs.get_backend("jax")


def test_every_call_through_dispatch_is_one_device_op():
    with gs.count_syncs() as counter:
        backend.NUMPY.call(np.add, np.ones(2), 1.0)
        backend.NUMPY.vector_norm(np.ones(2), ord=2, axis=None, keepdims=False)
    assert counter.device_ops == 2 and counter.count == 0


def test_ufunc_lookup_is_cached_per_backend():
    assert backend.NUMPY.ufunc("add") is np.add
    assert backend.NUMPY.ufunc("add") is backend.NUMPY.ufunc("add")
    with pytest.raises(AttributeError):
        backend.NUMPY.ufunc("no_such_ufunc")


def test_describe_names_the_cpu_and_numpy():
    text = backend.describe(backend.NUMPY)
    assert text.startswith("CPU") and np.__version__ in text
