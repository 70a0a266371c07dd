"""gs.matmul: the cuBLAS call plan (checked on the CPU against NumPy by emulating cuBLAS's
column-major semantics), the NumPy/strict path, alpha/beta, and bad input."""

from __future__ import annotations

import gc
import itertools
import threading
import types

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import gpuscalar as gs
from gpuscalar import strict, sync
from gpuscalar.devices.cupy import cublas, graphs, linalg
from gpuscalar.matmul import _PLANS

from .helpers import host

# ---- an independent reading of what cuBLAS computes for a plan ----------------------------------


def _column_major(array, rows, cols, ld):
    """The buffer starting at ``array``'s first element read as a column-major rows x cols
    matrix of leading dimension ld (cuBLAS's view of memory)."""
    size = array.itemsize
    return as_strided(array, shape=(rows, cols), strides=(size, ld * size), writeable=False)


def _op(matrix, trans):
    return matrix.T if trans == cublas.OP_T else matrix


def emulate(call, a, b):
    """``a @ b`` computed the way cuBLAS would execute ``call`` on a's and b's buffers."""
    x, y = (b, a) if call.x_is == "b" else (a, b)
    if call.routine == "gemv":
        matrix = _column_major(x, call.m, call.n, call.ldx)
        length = call.n if call.transx == cublas.OP_N else call.m
        vector = as_strided(y, shape=(length,), strides=(call.incx * y.itemsize,))
        return _op(matrix, call.transx) @ vector
    shape_x = (call.m, call.k) if call.transx == cublas.OP_N else (call.k, call.m)
    shape_y = (call.k, call.n) if call.transy == cublas.OP_N else (call.n, call.k)
    if call.routine == "gemm":
        c = _op(_column_major(x, *shape_x, call.ldx), call.transx) @ _op(
            _column_major(y, *shape_y, call.ldy), call.transy)
        return c.T  # column-major C (n x m) is the row-major m x n result
    results = []
    for i in range(call.batch):  # each batch's matrices start stride * i elements further on
        xs = as_strided(x, shape=(call.batch,), strides=(call.stridex * x.itemsize,))[i:]
        ys = as_strided(y, shape=(call.batch,), strides=(call.stridey * y.itemsize,))[i:]
        c = _op(_column_major(xs, *shape_x, call.ldx), call.transx) @ _op(
            _column_major(ys, *shape_y, call.ldy), call.transy)
        results.append(c.T)
    return np.stack(results)


def _layouts(rng, shape):
    """The same matrix as a C-contiguous array, a transposed view, and a strided-row view."""
    base = rng.standard_normal(shape)
    yield base
    yield np.ascontiguousarray(base.T).T  # F-contiguous: a transposed view
    if len(shape) == 2:
        padded = np.zeros((shape[0], shape[1] + 3))
        padded[:, : shape[1]] = base
        yield padded[:, : shape[1]]  # rows strided by more than their length
        tall = np.zeros((2 * shape[0], shape[1]))
        tall[::2] = base
        yield tall[::2]  # every other row


@pytest.mark.parametrize(("m", "k", "n"), [(3, 4, 5), (1, 4, 5), (3, 1, 5), (3, 4, 1), (1, 1, 1),
                                           (6, 2, 6)])
def test_gemm_plans_compute_the_product_for_every_layout(m, k, n, rng):
    for a, b in itertools.product(_layouts(rng, (m, k)), _layouts(rng, (k, n))):
        call, shape = linalg.plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
        assert shape == (m, n) and call.routine == "gemm"
        np.testing.assert_allclose(emulate(call, a, b), a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("m", "k"), [(3, 4), (1, 4), (3, 1)])
def test_gemv_plans_for_matrix_vector_and_vector_matrix(m, k, rng):
    for a in _layouts(rng, (m, k)):
        for x in (rng.standard_normal(k), rng.standard_normal(2 * k)[::2]):
            call, shape = linalg.plan(a.shape, a.strides, x.shape, x.strides, a.itemsize)
            assert shape == (m,)
            np.testing.assert_allclose(emulate(call, a, x), a @ x, rtol=1e-12)
        for x in (rng.standard_normal(m), rng.standard_normal(3 * m)[::3]):
            call, shape = linalg.plan(x.shape, x.strides, a.shape, a.strides, a.itemsize)
            assert shape == (k,)
            np.testing.assert_allclose(emulate(call, x, a), x @ a, rtol=1e-12)


def test_dot_of_two_vectors_is_a_zero_d_result(rng):
    """A contiguous ``a`` is a k x 1 column read transposed (cuBLAS sums it in parallel); a
    strided one a 1 x k row (one thread sums it), as before."""
    for a, b, transposed in ((rng.standard_normal(7), rng.standard_normal(14)[::2], True),
                             (rng.standard_normal(21)[::3], rng.standard_normal(7), False)):
        call, shape = linalg.plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
        assert shape == () and call.routine == "gemv"
        assert (call.transx == cublas.OP_T) == transposed
        np.testing.assert_allclose(emulate(call, a, b), [a @ b], rtol=1e-12)


def test_batched_plans_with_a_broadcast_operand(rng):
    a3, b3 = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 5, 2))
    b2 = rng.standard_normal((5, 2))
    for a, b in ((a3, b3), (a3, b2), (rng.standard_normal((3, 5)), b3)):
        call, shape = linalg.plan(a.shape, a.strides, b.shape, b.strides, a.itemsize)
        assert call.routine == "gemm_batched" and shape == np.matmul(a, b).shape
        assert (call.stridex == 0) == (b.ndim == 2) and (call.stridey == 0) == (a.ndim == 2)
        np.testing.assert_allclose(emulate(call, a, b), np.matmul(a, b), rtol=1e-12)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "match"),
    [((3, 4), (5, 2), r"\(3, 4\) and \(5, 2\) do not align"), ((), (3,), "at least 1-D"),
     ((2, 2, 2, 2), (2, 2), "1-D, 2-D and 3-D"), ((2, 3, 4), (4,), "1-D operand with a batch"),
     ((2, 3, 4), (3, 4, 2), "batch sizes")],
)
def test_plan_rejects_shapes_that_cannot_multiply(a_shape, b_shape, match):
    a, b = np.zeros(a_shape), np.zeros(b_shape)
    with pytest.raises(ValueError, match=match):
        linalg.plan(a.shape, a.strides, b.shape, b.strides, 8)


def test_plan_rejects_layouts_cublas_cannot_read_without_a_copy():
    a = np.zeros((6, 8))[::2, ::2]  # neither rows nor columns contiguous
    with pytest.raises(ValueError, match="contiguous copy"):
        linalg.plan(a.shape, a.strides, (4, 2), (16, 8), 8)
    reversed_vector = np.zeros(4)[::-1]
    with pytest.raises(ValueError, match="reversed or broadcast"):
        linalg.plan((3, 4), (32, 8), reversed_vector.shape, reversed_vector.strides, 8)


# ---- the function on NumPy and the strict device ------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_equals_numpy_and_is_one_device_op(xp, rng, dtype):
    a = rng.standard_normal((5, 3)).astype(dtype)
    b = rng.standard_normal((3, 4)).astype(dtype)
    da, db = xp.asarray(a), xp.asarray(b)
    with gs.count_syncs() as counter:
        c = gs.matmul(da, db)
        t = gs.matmul(da.T, da)  # a transposed view, no copy
    assert counter.count == 0 and counter.device_ops == 2
    assert c.dtype == dtype and t.shape == (3, 3)
    np.testing.assert_allclose(host(c), a @ b, rtol=1e-5)
    np.testing.assert_allclose(host(t), a.T @ a, rtol=1e-5)


def test_alpha_and_beta_scale_the_product_and_out(xp, rng):
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    start = rng.standard_normal((4, 2))
    out = xp.asarray(start.copy())
    alpha = gs.asscalar(2.0, like=out) * 1.5  # a pending expression: no launch of its own
    with gs.count_syncs() as counter:
        result = gs.matmul(xp.asarray(a), xp.asarray(b), out=out, alpha=alpha, beta=0.5)
    assert result is out and counter.count == 0
    np.testing.assert_allclose(host(out), 3.0 * (a @ b) + 0.5 * start, rtol=1e-12)


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [("list", TypeError, "a must be a NumPy, strict or CuPy array, got list"),
     ("int", TypeError, "float32, float64, complex64 or complex128, got int64"),
     ("coo", TypeError, r"got coo_matrix \(COO sparse: convert it with .tocsr\(\)"),
     ("sparse_alpha", TypeError, "alpha and beta are not supported with a sparse matrix"),
     ("complex_alpha", TypeError, "alpha must be a real number or GPUScalar for a float64 "
                                  "product, got complex"),
     ("backends", TypeError, "a is a numpy array but b is strict"),
     ("devices", ValueError, "a is on device 0 but b on 1"),
     ("beta", ValueError, "beta scales out"),
     ("out_shape", ValueError, r"out has shape \(2, 2\)"),
     ("out_layout", ValueError, "out must be C-contiguous"),
     ("alpha", TypeError, "alpha must be a real number or GPUScalar for a float64 product, "
                          "got str")],
)
def test_bad_input_names_what_is_wrong(case, error, match):
    a, b = np.ones((2, 3)), np.ones((3, 2))
    kwargs = {}
    if case == "list":
        a = [[1.0]]
    elif case == "int":
        a = np.ones((2, 3), dtype=np.int64)
    elif case == "coo":
        import scipy.sparse  # noqa: PLC0415

        b = scipy.sparse.coo_matrix(b)
    elif case == "sparse_alpha":
        import scipy.sparse  # noqa: PLC0415

        a, b, kwargs = scipy.sparse.csr_matrix(a), np.ones(3), {"alpha": 2.0}
    elif case == "complex_alpha":
        kwargs = {"alpha": 1j}
    elif case == "backends":
        b = strict.xp.ones((3, 2))
    elif case == "devices":
        a, b = strict.xp.ones((2, 3)), strict.xp.ones((3, 2), device=1)
    elif case == "beta":
        kwargs = {"beta": 1.0}
    elif case == "out_shape":
        kwargs = {"out": np.zeros((2, 2)), "alpha": 1.0}
        a, b = np.ones((2, 3)), np.ones((3, 3))
    elif case == "out_layout":
        kwargs = {"out": np.zeros((2, 2), order="F")}
    elif case == "alpha":
        kwargs = {"alpha": "2"}
    with pytest.raises(error, match=match):
        gs.matmul(a, b, **kwargs)


# ---- edge shapes, overlap, and the handle registry ----------------------------------------------


@pytest.mark.parametrize(("a_shape", "b_shape"), [((0, 3), (3, 2)), ((2, 0), (0, 3)),
                                                  ((2, 3), (3, 0)), ((0,), (0,)), ((2, 0), (0,)),
                                                  ((0,), (0, 4)), ((2, 0, 3), (3, 4))])
def test_empty_operands_plan_valid_calls_and_match_numpy(xp, a_shape, b_shape):
    a, b = np.ones(a_shape), np.ones(b_shape)
    call, shape = linalg.plan(a.shape, a.strides, b.shape, b.strides, 8)
    assert shape == np.matmul(a, b).shape and call.k == a_shape[-1]
    assert min(call.ldx, call.ldc or 1, call.ldy or 1) >= 1  # cuBLAS refuses ld < 1
    result = gs.matmul(xp.asarray(a), xp.asarray(b))
    assert host(result).tolist() == np.matmul(a, b).tolist()  # k == 0: zeros


def test_out_may_not_overlap_an_operand(xp):
    a = xp.ones((3, 3))
    with pytest.raises(ValueError, match="out overlaps a in memory"):
        gs.matmul(a, xp.ones((3, 3)), out=a)
    buffer = xp.ones((4, 3))
    with pytest.raises(ValueError, match="out overlaps b in memory"):
        gs.matmul(xp.ones((3, 3)), buffer[:3], out=buffer[1:])
    separate = xp.zeros((3, 3))
    gs.matmul(buffer[:3], xp.ones((3, 3)), out=separate)  # disjoint views of one buffer: fine
    assert host(separate).tolist() == [[3.0] * 3] * 3


def test_a_batch_walked_backwards_is_refused():
    a = np.ones((3, 2, 2))[::-1]
    with pytest.raises(ValueError, match="steps backwards through its batch"):
        linalg.plan(a.shape, a.strides, (2, 2), (16, 8), 8)


class _FakeHandle:
    def __init__(self, fail=False):
        self.closed, self.fail = False, fail

    def close(self):
        self.closed = True
        if self.fail:
            raise cublas.CublasError("cublasDestroy_v2 failed: CUBLAS_STATUS_NOT_INITIALIZED")


def test_releasing_a_stream_destroys_only_its_handles(monkeypatch):
    handles = {(0, 111): _FakeHandle(), (1, 111): _FakeHandle(), (0, 222): _FakeHandle()}
    monkeypatch.setattr(linalg, "_HANDLES", dict(handles))
    linalg.release_stream(111)
    assert [h.closed for h in handles.values()] == [True, True, False]
    assert list(linalg._HANDLES) == [(0, 222)]
    failing = _FakeHandle(fail=True)
    linalg._HANDLES[(0, 333)] = failing
    linalg.close_handles()  # at exit: every handle, a failure does not stop the others
    assert failing.closed and handles[(0, 222)].closed and linalg._HANDLES == {}


# ---- cuBLAS's 32-bit int arguments --------------------------------------------------------------

_HUGE = 2**31  # one more than cuBLAS's int can hold


@pytest.mark.parametrize(
    ("a_shape", "a_strides", "b_shape", "b_strides", "named"),
    [((_HUGE, 2), (16, 8), (2,), (8,), r"gemv argument n \(a size of the product\) = 2147483648"),
     ((2, _HUGE), (8 * _HUGE, 8), (_HUGE, 2), (16, 8), r"gemm argument k \(a size"),
     ((2, 2), (8 * _HUGE, 8), (2, 2), (16, 8), r"argument ldy \(the leading dimension of a\)"),
     ((2, 3), (24, 8), (3, 2), (8 * _HUGE, 8), r"argument ldx \(the leading dimension of b\)"),
     ((3, 2), (16, 8), (2,), (8 * _HUGE,), r"argument incx \(the element step of vector b\)"),
     ((_HUGE, 2, 2), (32, 16, 8), (2, 2), (16, 8), r"argument batch \(the batch count\)")],
    ids=["rows", "inner", "lda", "ldb", "vector-step", "batch"],
)
def test_sizes_beyond_cublas_int_are_refused_naming_the_argument(a_shape, a_strides, b_shape,
                                                                  b_strides, named):
    with pytest.raises(ValueError, match=named + r".*32-bit int limit \(2147483647\)"):
        linalg.plan(a_shape, a_strides, b_shape, b_strides, 8)
    smaller = (a_shape[0] - 1, *a_shape[1:]) if a_shape[0] == _HUGE else None
    if smaller is not None and len(a_shape) == 2:  # the largest size cuBLAS can take is fine
        call, _ = linalg.plan(smaller, a_strides, b_shape, b_strides, 8)
        assert call.n == linalg.INT_MAX


# ---- cuBLAS handles: one per stream, living as long as the stream (stand-ins, no GPU) ------------


class _FakeStream:
    def __init__(self, ptr, capturing=False):
        self.ptr, self.capturing = ptr, capturing

    def is_capturing(self):
        return self.capturing


class _MadeHandle(_FakeHandle):
    """What ``cublas.Handle(allocate, stream_ptr)`` makes, without cuBLAS."""

    def __init__(self, allocate, stream_ptr):
        super().__init__()
        self.stream_ptr, self.recorded = stream_ptr, False


@pytest.fixture
def fake_backend(monkeypatch):
    monkeypatch.setattr(linalg, "_HANDLES", {})
    monkeypatch.setattr(linalg, "_DOOMED", [])
    monkeypatch.setattr(linalg, "_KEPT", [])
    monkeypatch.setattr(linalg, "_exit_hook", [True])  # (no atexit registration from a test)
    monkeypatch.setattr(linalg.cublas, "Handle", _MadeHandle)
    return types.SimpleNamespace(xp=types.SimpleNamespace(cuda=types.SimpleNamespace(Memory=None)))


@pytest.mark.needs_cupy  # a handle is made through the CuPy backend
def test_a_handle_lives_as_long_as_its_stream(fake_backend):
    stream = _FakeStream(555)
    handle = linalg._handle(fake_backend, 0, stream)
    assert linalg._handle(fake_backend, 0, stream) is handle and handle.stream_ptr == 555
    del stream
    gc.collect()
    # out of the table at once (a new stream may get the same pointer), destroyed later: the
    # garbage collector may run while a graph is being recorded
    assert linalg._HANDLES == {} and linalg._DOOMED == [handle] and not handle.closed
    again = _FakeStream(555)
    fresh = linalg._handle(fake_backend, 0, again)
    assert fresh is not handle and handle.closed and linalg._DOOMED == []
    assert linalg._HANDLES == {(0, 555): fresh}


@pytest.mark.needs_cupy  # a handle is made through the CuPy backend
def test_handles_of_gone_streams_wait_while_a_graph_is_recorded(fake_backend):
    stream = _FakeStream(556)
    handle = linalg._handle(fake_backend, 0, stream)
    del stream
    gc.collect()
    keep = [_FakeStream(600 + i) for i in range(3)]
    with graphs._recording():
        linalg._handle(fake_backend, 0, keep[0])
    with sync.graph_body():
        linalg._handle(fake_backend, 0, keep[1])
    keep[2].capturing = True  # the caller's own capture
    linalg._handle(fake_backend, 0, keep[2])
    assert not handle.closed and linalg._DOOMED == [handle]
    linalg.release_stream(600)  # a safe moment: the queue is drained
    assert handle.closed and linalg._DOOMED == []


@pytest.mark.needs_cupy  # a handle is made through the CuPy backend
def test_a_handle_that_recorded_a_graph_outlives_its_stream(fake_backend):
    stream = _FakeStream(557)
    handle = linalg._handle(fake_backend, 0, stream)
    handle.recorded = True  # the user's own capture recorded a product with it
    del stream
    gc.collect()
    assert linalg._KEPT == [handle] and linalg._HANDLES == {}
    other = _FakeStream(558)
    linalg._handle(fake_backend, 0, other)
    assert not handle.closed  # the user's graph may still read its workspace
    linalg.close_handles()
    assert handle.closed and linalg._KEPT == []


@pytest.mark.needs_cupy  # a handle is made through the CuPy backend
def test_a_finalizer_releasing_handles_while_one_is_made_does_not_deadlock(fake_backend,
                                                                          monkeypatch):
    """A captured step garbage-collected while a handle is being made (its workspace allocation
    may run the collector) releases its stream's handles from inside `_handle`."""
    other = _FakeHandle()
    linalg._HANDLES[(0, 999)] = other

    class Reentrant(_MadeHandle):
        def __init__(self, allocate, stream_ptr):
            linalg.release_stream(999)  # what the step's finalizer does, on this thread
            super().__init__(allocate, stream_ptr)

    monkeypatch.setattr(linalg.cublas, "Handle", Reentrant)
    stream, made = _FakeStream(777), []
    worker = threading.Thread(target=lambda: made.append(linalg._handle(fake_backend, 0,
                                                                        stream)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "making a handle deadlocked on a re-entrant release"
    assert made and other.closed and list(linalg._HANDLES) == [(0, 777)]


@pytest.mark.needs_cupy  # a handle is made through the CuPy backend
def test_handles_made_says_whether_the_program_multiplies_on_cupy(fake_backend, monkeypatch):
    registered = []
    monkeypatch.setattr(linalg, "_exit_hook", [])
    monkeypatch.setattr(linalg.atexit, "register", registered.append)
    assert not linalg.handles_made()  # a capture then makes no handle it would not use
    stream = _FakeStream(888)
    linalg._handle(fake_backend, 0, stream)
    assert linalg.handles_made() and registered == [linalg.close_handles]


# ---- a Python alpha on CuPy (issue 15 item 7; through the recording seam) -----------------------


def test_a_python_alpha_on_cupy_is_a_fill_kernel_and_keeps_nothing():
    """Any alpha but 1 and 0 is written by a fill kernel taking it as an argument: one counted
    launch on the current stream; no stream of its own, no wait, no upload, nothing kept per
    value. The defaults 1 and 0 are device constants made once and kept."""
    from .cupy_fake import fake_memory  # noqa: PLC0415 - imports CuPy
    from .cupy_seam import recording  # noqa: PLC0415

    rng = np.random.default_rng(7)
    with fake_memory() as memory, recording(memory) as seam:
        streams = []
        new_stream = seam.new_stream
        seam.new_stream = lambda: streams.append(1) or new_stream()
        a, b = seam.array(rng.standard_normal((4, 3))), seam.array(rng.standard_normal((3, 2)))
        gs.matmul(a, b)  # the defaults: constants 1 and 0, made once (a stream and a wait)
        kept = dict(linalg._CONSTANTS)
        assert sorted(float.fromhex(key[2]) for key in kept) == [0.0, 1.0]
        made = (len(streams), seam.stream_waits)
        for alpha, fills in ((1.0, 0), (0, 0), (0.25, 1), (-3.0, 1), (0.25, 1), (7, 1)):
            seam.clear()
            with gs.count_syncs() as counter:
                gs.matmul(a, b, alpha=alpha)
            launches = [launch.kind for launch in seam.launches]
            assert launches.count("cublas") == 1 and len(launches) == 1 + fills, (alpha, launches)
            if fills:
                fill = seam.launches[0]
                assert (fill.name, fill.args[-1]) == ("full", alpha)  # the value: an argument
            assert counter.device_ops == 1 + fills and counter.count == 0
            assert seam.uploads == [] and seam.reads == []
        assert (len(streams), seam.stream_waits) == made  # no stream made, nothing waited for
        assert linalg._CONSTANTS == kept  # nothing kept per value


# ---- complex dtypes, promotion, and bodies (issue 23) -------------------------------------------

ALL_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _random(rng, shape, dtype):
    v = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        v = v + 1j * rng.standard_normal(shape)
    return v.astype(dtype)


@pytest.mark.parametrize(("dtype_a", "dtype_b"),
                         [(d, d) for d in ALL_DTYPES] + [(np.float32, np.float64),
                                                         (np.float64, np.complex64),
                                                         (np.complex64, np.float32)])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((4, 3), (3, 2)), ((4, 3), (3,)),
                                                  ((3,), (3, 2)), ((2, 4, 3), (3, 2))])
def test_matmul_of_every_dtype_pair_promotes_as_numpy(xp, rng, dtype_a, dtype_b, a_shape,
                                                      b_shape):
    a, b = _random(rng, a_shape, dtype_a), _random(rng, b_shape, dtype_b)
    product = gs.matmul(xp.asarray(a), xp.asarray(b))
    expected = np.matmul(a, b)
    assert product.dtype == expected.dtype and product.shape == expected.shape
    np.testing.assert_allclose(host(product), expected, rtol=1e-5)


def test_complex_alpha_and_beta_scale_a_complex_product(xp, rng):
    a, b = _random(rng, (3, 3), np.complex128), _random(rng, (3,), np.complex128)
    start = _random(rng, (3,), np.complex128)
    out = xp.asarray(start.copy())
    alpha = gs.asscalar(np.complex128(1 - 2j), like=out)
    gs.matmul(xp.asarray(a), xp.asarray(b), out=out, alpha=alpha, beta=0.5j)
    np.testing.assert_allclose(host(out), (1 - 2j) * (a @ b) + 0.5j * start, rtol=1e-12)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_matmul_in_a_loop_a_branch_and_a_capture_equals_the_eager_product(xp, rng, dtype):
    a, x0 = xp.asarray(_random(rng, (4, 4), dtype)), xp.asarray(_random(rng, 4, dtype))
    eager = host(gs.matmul(a, x0))
    out, i = xp.zeros(4, dtype=dtype), xp.zeros((), dtype=np.int64)

    def body(i):
        gs.matmul(a, x0, out=out)
        i += 1

    gs.while_loop(lambda i: i < 1, body, i, max_iter=3)
    np.testing.assert_allclose(host(out), eager, rtol=1e-5)
    out[...] = 0
    gs.cond(gs.GPUScalar(i) > 0, lambda: body(xp.zeros((), dtype=np.int64)), None)
    np.testing.assert_allclose(host(out), eager, rtol=1e-5)
    out[...] = 0
    gs.capture(lambda: gs.matmul(a, x0, out=out), warmup=0)()
    np.testing.assert_allclose(host(out), eager, rtol=1e-5)


@pytest.mark.needs_cupy
@pytest.mark.parametrize(("dtype", "letter"), [(np.complex64, "C"), (np.complex128, "Z")])
def test_a_complex_product_in_a_cupy_loop_body_is_a_checked_cublas_call(dtype, letter):
    """Complex products call cuBLAS's C/Z routines on gpuscalar's handle, made before the
    recording (the seam refuses cublasCreate while capturing), with device-pointer alpha and
    beta constants made before it too."""
    from .cupy_fake import cupy_or_fail, fake_memory  # noqa: PLC0415
    from .cupy_seam import recording  # noqa: PLC0415

    cupy_or_fail()
    rng = np.random.default_rng(5)
    with fake_memory() as memory, recording(memory) as seam:
        seam.records_only = True
        a = seam.array(_random(rng, (3, 3), dtype))
        m = seam.array(_random(rng, (3, 2), dtype))
        x, y = seam.array(_random(rng, 3, dtype)), seam.array(np.zeros(3, dtype))
        i = seam.array(np.array(0.0))
        one, two = gs.asscalar(1.0, like=i), gs.asscalar(2.0, like=i)
        seam.clear()

        def body(i, x, y):
            gs.matmul(a, x, out=y)
            gs.matmul(a, m)
            i += one

        gs.while_loop(lambda i, x, y: i < two, body, i, x, y, max_iter=5)
        blas = [launch.name for launch in seam.launches if launch.kind == "cublas"]
        assert blas == [f"cublas{letter}gemv_v2", f"cublas{letter}gemm_v2"]
        assert not seam.uploads


# ---- the planned hot path (issue 22): a repeated product is one lookup and the same call --------


def _blas_calls(seam):
    return [(launch.name, launch.args) for launch in seam.launches if launch.kind == "cublas"]


@pytest.mark.parametrize(("a_shape", "b_shape", "view"), [
    ((4, 3), (3, 2), None), ((4, 3), (3,), None), ((3,), (3, 2), None), ((3,), (3,), None),
    ((2, 4, 3), (3, 2), None), ((2, 4, 3), (2, 3, 2), None), ((3, 4), (3, 2), "a.T"),
    ((8, 3), (3, 2), "a[::2]"), ((4, 3), (2, 3), "b.T")])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_a_repeated_product_takes_its_plan_and_makes_the_same_cublas_call(
        monkeypatch, a_shape, b_shape, view, dtype):
    """The first product is checked and planned; a repeated one (same types, shapes, strides,
    dtypes, out or not) is served by its plan: the same cuBLAS routine with the same arguments
    (into the same out, every pointer too), one counted device op, and nothing else."""
    from .cupy_fake import cupy_or_fail, fake_memory, host_view  # noqa: PLC0415
    from .cupy_seam import recording  # noqa: PLC0415

    cupy_or_fail()
    rng = np.random.default_rng(11)
    runs = []
    run = linalg._Plan.run
    monkeypatch.setattr(linalg._Plan, "run", lambda *args: runs.append(1) or run(*args))
    with fake_memory() as memory, recording(memory) as seam:
        a = seam.array(_random(rng, a_shape, dtype))
        b = seam.array(_random(rng, b_shape, dtype))
        a, b = {"a.T": (a.T, b), "a[::2]": (a[::2], b), "b.T": (a, b.T), None: (a, b)}[view]
        expected = np.matmul(host_view(a), host_view(b))
        out = seam.array(np.zeros(expected.shape, dtype))
        calls = []
        for turn in range(3):
            seam.clear()
            with gs.count_syncs() as counter:
                result = gs.matmul(a, b, out=out)
            assert result is out and counter.device_ops == 1 and counter.count == 0
            if turn:  # (the first makes the constants 1 and 0: uncounted, once)
                assert [launch.kind for launch in seam.launches] == ["cublas"]
            calls.append(_blas_calls(seam))
        assert calls[0] == calls[1] == calls[2] and runs == [1, 1]
        seam.clear()
        fresh = gs.matmul(a, b)  # without out: a plan of its own
        first = _blas_calls(seam)
        seam.clear()
        again = gs.matmul(a, b)
        assert fresh.shape == again.shape == expected.shape and fresh.dtype == dtype
        second = _blas_calls(seam)
        assert len(runs) == 3
        (name, args), (name2, args2) = first[0], second[0]
        out_at = 10 if "gemv" in name else 14 if "Batched" in name else 12
        assert name == name2 == calls[0][0][0]
        # the same call but the output's pointer (a new array each time)
        assert args[:out_at] + args[out_at + 1:] == args2[:out_at] + args2[out_at + 1:]
        assert args[:out_at] == calls[0][0][1][:out_at]


def test_a_planned_product_still_checks_what_depends_on_values():
    """A plan fixes what shapes, strides and dtypes decide; out's overlap with an operand is
    checked on every call, planned or not, and nothing is launched then."""
    from .cupy_fake import cupy_or_fail, fake_memory  # noqa: PLC0415
    from .cupy_seam import recording  # noqa: PLC0415

    cupy_or_fail()
    with fake_memory() as memory, recording(memory) as seam:
        first, second = seam.array(np.arange(16.0)), seam.array(np.arange(16.0))
        b = seam.array(np.ones((3, 2)))
        a1, a2 = first.reshape(4, 4)[:, :3], second.reshape(4, 4)[:, :3]
        separate = seam.array(np.zeros((4, 2)))
        for a in (a1, a2, a1):  # planned at the first: rows of a strided by 4
            gs.matmul(a, b, out=separate)
        seam.clear()
        with pytest.raises(ValueError, match="out overlaps a in memory"):
            gs.matmul(a2, b, out=second[8:].reshape(4, 2))
        shared = seam.array(np.zeros(14))
        with pytest.raises(ValueError, match="out overlaps b in memory"):
            gs.matmul(a1, shared[:6].reshape(3, 2), out=shared[4:12].reshape(4, 2))
        gs.matmul(a1, shared[:6].reshape(3, 2), out=shared[6:14].reshape(4, 2))  # adjacent
        assert [launch.kind for launch in seam.launches] == ["cublas"]


def test_plans_are_kept_in_a_bounded_thread_safe_table():
    from gpuscalar.lazy.expr import BoundedCache  # noqa: PLC0415

    assert isinstance(_PLANS, BoundedCache)


@pytest.mark.parametrize(("a_shape", "b_shape"), [((4, 3), (3, 2)), ((4, 3), (3,)),
                                                  ((2, 4, 3), (3, 2))])
def test_a_planned_product_with_alpha_and_beta_makes_the_calls_an_unplanned_one_makes(
        a_shape, b_shape):
    """alpha and beta ride on the plan too: read per call as `_matmul` reads them (a
    GPUScalar's array, the kept constants for 1 and 0, a fill kernel for another number),
    then the same cuBLAS call; beta without out is still refused."""
    from .cupy_fake import cupy_or_fail, fake_memory  # noqa: PLC0415
    from .cupy_seam import recording  # noqa: PLC0415

    cupy_or_fail()
    rng = np.random.default_rng(3)
    with fake_memory() as memory, recording(memory) as seam:
        a, b = seam.array(rng.standard_normal(a_shape)), seam.array(rng.standard_normal(b_shape))
        out = seam.array(np.zeros(np.matmul(np.ones(a_shape), np.ones(b_shape)).shape))
        scale = gs.GPUScalar(seam.array(np.array(0.5)))
        gs.matmul(a, b, out=out)  # (the constants 1 and 0 made: once, uncounted)
        for alpha, beta in ((scale, 1.0), (None, scale), (0.25, None), (1, 0.0)):
            seen = []
            for unplanned in (True, False, False):
                if unplanned:
                    _PLANS.clear()
                seam.clear()
                with gs.count_syncs() as counter:
                    gs.matmul(a, b, out=out, alpha=alpha, beta=beta)
                seen.append(([(launch.kind, launch.name) for launch in seam.launches],
                             counter.device_ops, counter.count))
                blas = _blas_calls(seam)
                if isinstance(alpha, gs.GPUScalar) or alpha in (None, 1):
                    seen[-1] += (blas,)  # (the same pointers every time)
            assert seen[0] == seen[1] == seen[2], (alpha, beta, seen)
            assert seen[0][0][-1][0] == "cublas" and seen[0][2] == 0
        with pytest.raises(ValueError, match="beta scales out, so it needs out="):
            gs.matmul(a, b, beta=scale)
