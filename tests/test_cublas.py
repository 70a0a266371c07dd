"""The cuBLAS binding: it loads and checks its arguments on a machine without a GPU (CI installs
the nvidia-cublas wheel through the cuda12 extra), and reports failures by name."""

from __future__ import annotations

import ctypes
import os

import pytest

import gpuscalar as gs
from gpuscalar.devices.cupy import cublas


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


def _values(args):
    return [a.value if isinstance(a, (ctypes.c_void_p, ctypes.c_longlong)) else a for a in args]


@pytest.mark.parametrize(("converter", "signature"), [
    (cublas._gemm, cublas._GEMM), (cublas._gemv, cublas._GEMV),
    (cublas._gemm_batched, cublas._GEMM_BATCHED)])
def test_a_products_undeclared_call_passes_what_its_declaration_would(converter, signature):
    """The products' calls skip ctypes' per-argument conversion: each pointer goes as a
    c_void_p (the same object for the same address), each 64-bit integer as a c_longlong,
    each int as itself, and the values are the arguments given."""
    args = tuple(0x7F0000001000 + 256 * i if kind is ctypes.c_void_p else i + 1
                 for i, kind in enumerate(signature))
    passed = converter(*args)
    assert _values(passed) == list(args)
    for kind, value in zip(signature, passed, strict=True):
        assert type(value) is (int if kind is ctypes.c_int else kind)
    again = converter(*args)
    assert all(a is b for a, b, kind in zip(passed, again, signature, strict=True)
               if kind is ctypes.c_void_p)


class _Recorder:
    """A stand-in for an undeclared cuBLAS function: keeps the arguments of each call."""

    def __init__(self, status: int = 0) -> None:
        self.calls: list[tuple] = []
        self.status = status

    def __call__(self, *args):
        self.calls.append(args)
        return self.status


def test_a_product_repeated_is_converted_once(monkeypatch):
    """`call`'s ctypes way (tests/test_matmul_paths.py has both) keeps what a product's
    arguments were converted to: the same arguments again pass the very same objects (no
    conversion), other arguments are converted afresh, an argument count that is not the
    routine's is refused before the table is asked, and the table is emptied when it holds
    too many."""
    function = _Recorder()
    monkeypatch.setitem(cublas._ROUTES, "cublasDgemm_v2", (None, 14, function, cublas._gemm, None))
    monkeypatch.setattr(cublas, "_CONVERTED", {})
    p = 0x7F12345678A0
    args = (p, 1, 0, 64, 32, 16, p + 8, p + 16, 64, p + 24, 16, p + 32, p + 40, 64)
    cublas.call("cublasDgemm_v2", *args)
    cublas.call("cublasDgemm_v2", *args)
    other = args[:12] + (p + 48, 64)  # another output
    cublas.call("cublasDgemm_v2", *other)
    first, second, third = function.calls
    assert _values(first) == list(args) and _values(third) == list(other)
    assert all(a is b for a, b in zip(first, second, strict=True))
    assert third[12] is not first[12] and third[7] is first[7]  # (a's pointer: one wrapper)
    with pytest.raises(TypeError, match="cublasDgemm_v2 takes 14 arguments, got 12"):
        cublas.call("cublasDgemm_v2", *args[:12])
    assert len(function.calls) == 3
    monkeypatch.setattr(cublas, "_CONVERTED_KEPT", 2)
    cublas.call("cublasDgemm_v2", *args[:13], 65)
    assert len(cublas._CONVERTED) == 1  # (emptied at two, then this one kept)


def test_a_failed_product_names_the_routine_and_status(monkeypatch):
    """A product's failure, converted afresh or not, raises `CublasError` by name."""
    function = _Recorder(status=7)
    monkeypatch.setitem(cublas._ROUTES, "cublasSgemv_v2", (None, 12, function, cublas._gemv, None))
    p = 0x7F12345678A0
    args = (p, 0, 8, 4, p + 8, p + 16, 8, p + 24, 1, p + 32, p + 40, 1)
    for _ in range(2):
        with pytest.raises(cublas.CublasError, match="cublasSgemv_v2 failed: "
                                                     "CUBLAS_STATUS_INVALID_VALUE"):
            cublas.call("cublasSgemv_v2", *args)
    assert len(function.calls) == 2


def test_the_pointer_wrappers_are_bounded():
    for address in range(1, cublas._POINTERS_KEPT + 10):
        cublas._pointer(address * 16)
    assert len(cublas._POINTERS) <= cublas._POINTERS_KEPT


def test_a_products_call_goes_through_its_converter(library):
    """`call` on a product routine: the declared function is never asked; a failure still
    names the routine and status (the stub or real cuBLAS refuses a null handle)."""
    route = cublas._ROUTES.get("cublasSgemm_v2") or cublas._route("cublasSgemm_v2")
    declared, count, undeclared, converter, _binding = route
    assert count == 14 and converter is cublas._gemm and undeclared.argtypes is None
    with pytest.raises(TypeError, match="cublasSgemm_v2 takes 14 arguments, got 2"):
        cublas.call("cublasSgemm_v2", 0, 0)


_RECORDER_C = r"""
#include <stdio.h>
int cublasDgemm_v2(void* h, int ta, int tb, int m, int n, int k, const double* al,
    const double* A, int lda, const double* B, int ldb, const double* be, double* C, int ldc) {
  printf("%p %d %d %d %d %d %p %p %d %p %d %p %p %d\n", h, ta, tb, m, n, k, al, A, lda, B,
         ldb, be, C, ldc); fflush(stdout); return 0; }
int cublasDgemmStridedBatched(void* h, int ta, int tb, int m, int n, int k, const double* al,
    const double* A, int lda, long long sa, const double* B, int ldb, long long sb,
    const double* be, double* C, int ldc, long long sc, int batch) {
  printf("%p %d %d %d %d %d %p %p %d %lld %p %d %lld %p %p %d %lld %d\n", h, ta, tb, m, n, k,
         al, A, lda, sa, B, ldb, sb, be, C, ldc, sc, batch); fflush(stdout); return 0; }
int cublasDgemv_v2(void* h, int t, int m, int n, const double* al, const double* A, int lda,
    const double* x, int incx, const double* be, double* y, int incy) {
  printf("%p %d %d %d %p %p %d %p %d %p %p %d\n", h, t, m, n, al, A, lda, x, incx, be, y,
         incy); fflush(stdout); return 0; }
"""


def test_the_undeclared_calls_reach_c_as_the_declared_ones_do(tmp_path, capfd):
    """Through a C library of the same signatures (compiled here; skipped without gcc): each
    product's converter hands the C function exactly what the declared call hands it, 64-bit
    pointers, 64-bit strides and arguments past the registers included."""
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the recording library")
    (tmp_path / "rec.c").write_text(_RECORDER_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "librec.so"),
                    str(tmp_path / "rec.c")], check=True)
    lib = ctypes.CDLL(str(tmp_path / "librec.so"))
    p = 0x7F12345678A0
    cases = {
        "cublasDgemm_v2": (p, 1, 0, 64, 32, 16, p + 8, p + 16, 64, p + 24, 16, p + 32, p + 40, 64),
        "cublasDgemmStridedBatched": (p, 1, 0, 64, 32, 16, p + 8, p + 16, 64, 2**33 + 5, p + 24,
                                      16, 7, p + 32, p + 40, 64, 2**40, 3),
        "cublasDgemv_v2": (p, 1, 64, 32, p + 8, p + 16, 64, p + 24, 2, p + 32, p + 40, 1)}
    for name, args in cases.items():
        declared = getattr(lib, name)
        declared.argtypes, declared.restype = cublas._SIGNATURES[name], ctypes.c_int
        undeclared = lib._FuncPtr((name, lib))
        undeclared.restype = ctypes.c_int
        capfd.readouterr()
        assert declared(*args) == 0
        by_declaration = capfd.readouterr().out
        assert undeclared(*cublas._CONVERTERS[cublas._SIGNATURES[name]](*args)) == 0
        assert capfd.readouterr().out == by_declaration and by_declaration.count("0x7f12") >= 5
