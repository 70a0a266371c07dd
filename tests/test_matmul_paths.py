"""gs.matmul's two ways to cuBLAS (`gpuscalar.devices.cupy.cublas.call`): CuPy's Cython binding
where the current stream does not capture, the ctypes call where it does, on one handle.

Each way is shown taken, with what it passes and the handle state it leaves for the other: CuPy's
binding resets the handle's workspace to cuBLAS's default pool (its ``cublasSetStream``), so
the ctypes way binds the stream and the fixed workspace again before a product it records. The
recording seam (tests/cupy_seam.py) stands in for `CudaSeam.blas` as a whole, above both ways,
so these tests drive `call` itself with recorders for both functions; on a GPU the last test
multiplies through both ways and compares the results bit for bit.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar.devices.cupy import cublas

from .helpers import host

P = 0x7F12345678A0
HANDLE, STREAM, WORKSPACE = P, P + 0x100, P + 0x200
GEMM_ARGS = (HANDLE, 1, 0, 64, 32, 16, P + 8, P + 16, 64, P + 24, 16, P + 32, P + 40, 64)


class _Ways:
    """Recorders for both ways to cuBLAS and for the declared calls that bind a handle,
    installed as `call`'s routes; ``capturing`` makes CuPy's binding refuse, as CuPy does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple] = []
        self.capturing = False
        monkeypatch.setattr(cublas, "_ROUTES", {})
        monkeypatch.setattr(cublas, "_CONVERTED", {})
        monkeypatch.setattr(cublas, "_FIXED", {})
        monkeypatch.setattr(cublas, "_UNBOUND", set())
        routes = cublas._ROUTES
        routes["cublasDgemm_v2"] = (None, 14, self._ctypes, cublas._gemm, self._cupy)
        for name, count in (("cublasSetStream_v2", 2), ("cublasSetWorkspace_v2", 3)):
            routes[name] = (self._declared(name), count, None, None, None)

    def _cupy(self, *args):
        if self.capturing:
            raise NotImplementedError("calling cuBLAS API during stream capture is currently "
                                      "unsupported")
        self.log.append(("cupy", args))

    def _ctypes(self, *args):
        values = tuple(a.value if isinstance(a, ctypes.c_void_p) else a for a in args)
        self.log.append(("ctypes", values))
        return 0

    def _declared(self, name):
        def declared(*args):
            self.log.append((name, args))
            return 0
        return declared

    def take(self) -> list[str]:
        names = [entry[0] for entry in self.log]
        del self.log[:]
        return names


def test_outside_a_capture_a_product_takes_cupys_binding_with_the_same_arguments(monkeypatch):
    ways = _Ways(monkeypatch)
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    assert ways.log == [("cupy", GEMM_ARGS)]
    assert cublas._UNBOUND == {HANDLE}  # CuPy's cublasSetStream reset the workspace


def test_inside_a_capture_a_product_takes_ctypes_after_binding_the_handle_again(monkeypatch):
    """CuPy's binding refuses a capturing stream before it touches the handle; the ctypes call
    passes the same values, after the handle's stream and fixed workspace are bound again
    (once: a second recorded product finds them bound), and CuPy's binding, used again
    outside the capture, leaves them to be bound again before the next recorded product."""
    ways = _Ways(monkeypatch)
    cublas._FIXED[HANDLE] = (STREAM, WORKSPACE, 1 << 25)
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)  # a warm-up, outside the capture
    assert ways.take() == ["cupy"]
    ways.capturing = True
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    log = ways.log[:]
    assert ways.take() == ["cublasSetStream_v2", "cublasSetWorkspace_v2", "ctypes"]
    assert log[0][1] == (HANDLE, STREAM) and log[1][1] == (HANDLE, WORKSPACE, 1 << 25)
    assert log[2][1] == GEMM_ARGS and not cublas._UNBOUND
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    assert ways.take() == ["ctypes"]
    ways.capturing = False
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    ways.capturing = True
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    assert ways.take() == ["cupy", "cublasSetStream_v2", "cublasSetWorkspace_v2", "ctypes"]


def test_a_handle_never_given_to_cupys_binding_is_not_bound_again(monkeypatch):
    ways = _Ways(monkeypatch)
    cublas._FIXED[HANDLE] = (STREAM, WORKSPACE, 1 << 25)
    ways.capturing = True
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    assert ways.take() == ["ctypes"]


def test_without_cupys_binding_every_product_takes_ctypes(monkeypatch):
    ways = _Ways(monkeypatch)
    route = cublas._ROUTES["cublasDgemm_v2"]
    cublas._ROUTES["cublasDgemm_v2"] = route[:4] + (None,)
    cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    assert ways.log == [("ctypes", GEMM_ARGS)] and not cublas._UNBOUND


def test_a_handle_records_how_to_bind_it_again_until_it_is_closed(monkeypatch):
    """`Handle` leaves its stream and workspace in `_FIXED` once bound, and takes them (and
    any pending re-binding of its value) away when closed."""
    made = []

    def fake_call(name, *args):
        made.append(name)
        if name == "cublasCreate_v2":
            ctypes.cast(args[0], ctypes.POINTER(ctypes.c_void_p))[0] = HANDLE

    monkeypatch.setattr(cublas, "call", fake_call)
    monkeypatch.setattr(cublas, "_FIXED", {})
    monkeypatch.setattr(cublas, "_UNBOUND", {HANDLE})  # a value cuBLAS handed out before

    class Buffer:
        ptr = WORKSPACE

    handle = cublas.Handle(lambda nbytes: Buffer(), STREAM)
    assert cublas._FIXED == {HANDLE: (STREAM, WORKSPACE, cublas.Handle.WORKSPACE_BYTES)}
    assert not cublas._UNBOUND
    cublas._UNBOUND.add(HANDLE)
    handle.close()
    assert cublas._FIXED == {} and not cublas._UNBOUND
    assert made == ["cublasCreate_v2", "cublasSetPointerMode_v2", "cublasSetStream_v2",
                    "cublasSetWorkspace_v2", "cublasDestroy_v2"]


@pytest.mark.needs_cupy
def test_cupys_binding_is_used_only_where_one_libcublas_is_loaded(monkeypatch):
    """CuPy's binding calls the libcublas its module was linked to, and a handle must be used
    by the library that made it: with two copies loaded (another package's), ctypes only."""
    from cupy_backends.cuda.libs import cublas as cupy_cublas  # noqa: PLC0415

    monkeypatch.setattr(cublas, "_loaded_libraries", lambda: {(1, 2)})
    assert cublas._cupy_binding("cublasZgemmStridedBatched") is cupy_cublas.zgemmStridedBatched
    assert cublas._cupy_binding("cublasSgemv_v2") is cupy_cublas.sgemv
    monkeypatch.setattr(cublas, "_loaded_libraries", lambda: {(1, 2), (1, 3)})
    assert cublas._cupy_binding("cublasDgemm_v2") is None


@pytest.mark.needs_cupy
def test_a_failure_in_cupys_binding_names_the_routine_and_status(monkeypatch):
    from cupy_backends.cuda.libs import cublas as cupy_cublas  # noqa: PLC0415

    def refused(*args):
        raise cupy_cublas.CUBLASError(7)

    _Ways(monkeypatch)
    route = cublas._ROUTES["cublasDgemm_v2"]
    cublas._ROUTES["cublasDgemm_v2"] = route[:4] + (refused,)
    with pytest.raises(cublas.CublasError, match="cublasDgemm_v2 failed: "
                                                 "CUBLAS_STATUS_INVALID_VALUE"):
        cublas.call("cublasDgemm_v2", *GEMM_ARGS)
    assert not cublas._UNBOUND


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((48, 40), (40, 24)), ((48, 40), (40,)),
                                                  ((3, 16, 8), (8, 12))])
def test_on_a_gpu_both_ways_give_the_same_bits(monkeypatch, dtype, a_shape, b_shape):
    """On a GPU: the same product made eagerly (CuPy's binding) and recorded in a captured step
    (ctypes, after the handle is bound again), then eagerly again: each way taken where it
    should be, the same bits from all three."""
    if not gs.gpu_available():
        pytest.skip("CuPy needs a CUDA device, and this machine has none")
    import cupy  # noqa: PLC0415

    rng = np.random.default_rng(3)

    def random(shape):
        values = rng.standard_normal(shape)
        if np.dtype(dtype).kind == "c":
            values = values + 1j * rng.standard_normal(shape)
        return cupy.asarray(values.astype(dtype))

    a, b = random(a_shape), random(b_shape)
    gs.matmul(a, b)  # (its routine's route is made by a first product)
    ways: list[str] = []
    for name, route in list(cublas._ROUTES.items()):
        declared, count, undeclared, converter, binding = route
        if converter is None or binding is None:
            continue

        def by_ctypes(*args, _f=undeclared):
            ways.append("ctypes")
            return _f(*args)

        def by_cupy(*args, _f=binding):
            ways.append("cupy")
            return _f(*args)

        monkeypatch.setitem(cublas._ROUTES, name, (declared, count, by_ctypes, converter,
                                                   by_cupy))
    eager = host(gs.matmul(a, b))
    if not ways:
        pytest.skip("CuPy's binding is not used here (more than one libcublas is loaded)")
    assert ways == ["cupy"]
    out = cupy.zeros(eager.shape, dtype=dtype)
    del ways[:]
    step = gs.capture(lambda: gs.matmul(a, b, out=out), warmup=1)
    step()
    assert ways == ["cupy", "cupy", "ctypes"]  # the warm-up; refused while recording: ctypes
    np.testing.assert_array_equal(host(out), eager)
    np.testing.assert_array_equal(host(gs.matmul(a, b)), eager)
