"""The cuBLAS binding: it loads and checks its arguments on a machine without a GPU (CI installs
the nvidia-cublas wheel through the cuda12 extra), and reports failures by name."""

from __future__ import annotations

import ctypes
import os

import pytest

import gpuscalar as gs
from gpuscalar.cuda import cublas


@pytest.fixture(scope="module")
def library():
    try:
        return cublas.library()
    except cublas.CublasError as error:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{error} (CI installs cuBLAS with the cuda12 extra)")
        pytest.skip(str(error))


def test_the_library_loads_and_reports_its_version(library):
    major, minor, patch = cublas.version()
    assert major >= 12 and minor >= 0 and patch >= 0
    for name in ("cublasSgemm_v2", "cublasDgemmStridedBatched", "cublasSetWorkspace_v2"):
        assert getattr(library, name).restype is ctypes.c_int


def test_calls_check_their_arguments_before_cublas_sees_them(library):
    with pytest.raises(ValueError, match="does not bind 'cublasSsyrk_v2'"):
        cublas.call("cublasSsyrk_v2", 0)
    with pytest.raises(TypeError, match="cublasSetStream_v2 takes 2 arguments, got 1"):
        cublas.call("cublasSetStream_v2", 0)
    with pytest.raises(ctypes.ArgumentError):
        cublas.call("cublasSetPointerMode_v2", 0, "device")


def test_failures_name_the_function_and_status(library):
    handle = ctypes.c_void_p()
    if gs.gpu_available():
        cublas.call("cublasCreate_v2", ctypes.byref(handle))
        with pytest.raises(cublas.CublasError, match="cublasSetPointerMode_v2 failed: "
                                                     "CUBLAS_STATUS_INVALID_VALUE"):
            cublas.call("cublasSetPointerMode_v2", handle.value, 7)
        cublas.call("cublasDestroy_v2", handle.value)
    else:  # no device: cuBLAS refuses to initialise, and says so by name
        with pytest.raises(cublas.CublasError, match=r"cublasCreate_v2 failed: CUBLAS_STATUS_"):
            cublas.call("cublasCreate_v2", ctypes.byref(handle))


def test_a_handle_that_cannot_be_made_leaves_nothing_behind(library):
    if gs.gpu_available():
        pytest.skip("a GPU is present: the handle is made (covered by gs.matmul's tests)")
    allocated = []
    with pytest.raises(cublas.CublasError):
        cublas.Handle(allocated.append, 0)
    assert allocated == []  # the workspace is only allocated once cuBLAS has a handle


def test_every_status_has_a_name():
    assert cublas.STATUS_NAMES[0] == "CUBLAS_STATUS_SUCCESS"
    assert all(name.startswith("CUBLAS_STATUS_") for name in cublas.STATUS_NAMES.values())


def test_the_library_matches_cupys_cuda_version(library):
    path = cublas._find()
    major = cublas._cuda_major()
    assert major is None or cublas._major_of(path) in (major, None)
    if major is not None:
        assert cublas.version()[0] == major


@pytest.mark.parametrize(("name", "major"), [("/x/libcublas.so.12", 12),
                                             ("libcublas.so.13.1.0.3", 13),
                                             ("/usr/lib/libcublas.so", None)])
def test_the_cuda_major_of_a_library_file(name, major):
    assert cublas._major_of(name) == major
