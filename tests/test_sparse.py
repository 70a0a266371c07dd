"""gs.spmv: CSR sparse matrix-vector products on every device, in loop, branch and capture bodies
(issue 23); the strict CSR stand-in; gpuscalar's CSR kernel through the recording seam and NVRTC."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import scipy.sparse

import gpuscalar as gs
from gpuscalar import strict, sync
from gpuscalar.devices.cupy import products
from gpuscalar.devices.strict import sparse as strict_sparse

from .helpers import host

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
PAIRS = [(a, x) for a, x in itertools.product(DTYPES, DTYPES)]


def _matrix(rng: np.random.Generator, rows: int = 7, cols: int = 5, dtype=np.float64):
    dense = rng.standard_normal((rows, cols)) * (rng.random((rows, cols)) < 0.5)
    if np.dtype(dtype).kind == "c":
        dense = dense + 1j * rng.standard_normal((rows, cols)) * (dense != 0)
    dense[2] = 0.0  # an empty row
    return scipy.sparse.csr_matrix(dense.astype(dtype)), dense.astype(dtype)


def _vector(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    v = rng.standard_normal(n)
    if np.dtype(dtype).kind == "c":
        v = v + 1j * rng.standard_normal(n)
    return v.astype(dtype)


def _tolerance(dtype) -> float:
    return 1e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12


# ---- values, dtypes, counts ---------------------------------------------------------------------


@pytest.mark.parametrize(("a_dtype", "x_dtype"), PAIRS)
def test_spmv_equals_the_dense_product_for_every_dtype_pair(xp, rng, a_dtype, x_dtype):
    matrix, dense = _matrix(rng, dtype=a_dtype)
    x = _vector(rng, 5, x_dtype)
    A, dx = gs.as_csr(matrix, like=xp.zeros(1)), xp.asarray(x)
    with gs.count_syncs() as counter:
        y = gs.spmv(A, dx)
    assert counter.count == 0 and counter.device_ops == 1
    expected = dense @ x
    assert y.dtype == expected.dtype == np.result_type(a_dtype, x_dtype) and y.shape == (7,)
    np.testing.assert_allclose(host(y), expected, rtol=_tolerance(expected.dtype), atol=1e-6)


def test_out_is_written_and_returned_and_matmul_takes_a_csr_matrix(xp, rng):
    matrix, dense = _matrix(rng)
    x = rng.standard_normal(5)
    A, dx = gs.as_csr(matrix, like=xp.zeros(1)), xp.asarray(x)
    out = xp.zeros(7)
    assert gs.spmv(A, dx, out=out) is out
    np.testing.assert_allclose(host(out), dense @ x, rtol=1e-12)
    again = xp.zeros(7)
    assert gs.matmul(A, dx, out=again) is again
    np.testing.assert_allclose(host(again), dense @ x, rtol=1e-12)
    np.testing.assert_allclose(host(gs.matmul(A, dx)), dense @ x, rtol=1e-12)


def test_a_scipy_csr_array_is_taken_on_numpy(rng):
    matrix, dense = _matrix(rng)
    x = rng.standard_normal(5)
    np.testing.assert_allclose(gs.spmv(scipy.sparse.csr_array(matrix), x), dense @ x)


# ---- in bodies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_spmv_in_a_loop_a_branch_and_a_captured_step_equals_the_eager_product(xp, rng, dtype):
    matrix, dense = _matrix(rng, rows=5, cols=5, dtype=dtype)
    A = gs.as_csr(matrix, like=xp.zeros(1))
    x0 = _vector(rng, 5, dtype)
    eager = host(gs.spmv(A, xp.asarray(x0)))

    x, y, i = xp.asarray(x0), xp.zeros(5, dtype=dtype), xp.zeros((), dtype=np.int64)

    def body(i, x, y):
        gs.spmv(A, x, out=y)
        i += 1

    def branch():
        y[...] = 0
        gs.spmv(A, x, out=y)

    with gs.count_syncs() as counter:
        n = gs.while_loop(lambda i, x, y: i < 1, body, i, x, y, max_iter=3)
        gs.cond(gs.GPUScalar(i) > 0, branch, None)
    assert counter.count == 0 and int(n) == 1
    np.testing.assert_allclose(host(y), eager, rtol=_tolerance(dtype))

    z = xp.zeros(5, dtype=dtype)
    step = gs.capture(lambda: gs.spmv(A, x, out=z), warmup=0)
    step()
    np.testing.assert_allclose(host(z), eager, rtol=_tolerance(dtype))


def test_cupys_own_sparse_product_is_refused_in_a_body_naming_gs_spmv(rng):
    matrix, dense = _matrix(rng, rows=5, cols=5)
    A, x = strict_sparse.csr_matrix(matrix), strict.xp.asarray(rng.standard_normal(5))
    np.testing.assert_allclose(host(A @ x), dense @ host(x))  # outside a body: computed
    with sync.graph_body(), pytest.raises(NotImplementedError) as raised:
        A @ x  # noqa: B018 - the refused product
    assert str(raised.value).startswith(strict.CUSPARSE_CAPTURE_MESSAGE)
    assert "gs.spmv(A, x, out=...)" in str(raised.value)
    with sync.graph_body():
        assert host(gs.spmv(A, x)).shape == (5,)  # gpuscalar's product: allowed


# ---- the strict CSR matrix ----------------------------------------------------------------------


def test_the_strict_csr_matrix_is_cupyx_shaped(rng):
    matrix, dense = _matrix(rng)
    with strict.device(1):
        A = strict_sparse.csr_matrix(matrix)
    assert (A.format, A.shape, A.dtype, A.nnz, A.device.id) == ("csr", (7, 5), np.float64,
                                                               matrix.nnz, 1)
    assert A.indices.dtype == A.indptr.dtype == np.int32
    assert type(A.data) is strict.StrictArray
    parts = strict_sparse.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)
    np.testing.assert_array_equal(host(parts.toarray()), dense)
    from_dense = strict_sparse.csr_matrix(strict.xp.asarray(dense))
    np.testing.assert_array_equal(host(from_dense.toarray()), dense)
    with gs.count_syncs(include_cupy=True) as counter:
        back = A.get()
    assert counter.count == 1 and (back != matrix).nnz == 0
    x = strict.xp.asarray(rng.standard_normal(5), device=1)
    np.testing.assert_allclose(host(gs.spmv(A, x)), dense @ host(x))
    with pytest.raises(ValueError, match="A is on device 1 but x on 0"):
        gs.spmv(A, strict.xp.zeros(5))


def test_making_a_strict_csr_matrix_uploads_so_not_in_a_body(rng):
    matrix, _ = _matrix(rng)
    with sync.graph_body(), pytest.raises(RuntimeError, match="H2D transfers are disallowed"):
        strict_sparse.csr_matrix(matrix)


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [("dense", TypeError, r"A must be a CSR sparse matrix .* \(a dense array: use gs.matmul\)"),
     ("csc", TypeError, r"A is a CSC matrix; .* A.tocsr\(\)"),
     ("coo", TypeError, r"A is a COO matrix; .* A.tocsr\(\)"),
     ("int", TypeError, "A has dtype int64; it must be float32, float64, complex64"),
     ("x_int", TypeError, "x has dtype int64"),
     ("x_list", TypeError, "x must be a numpy array, got list"),
     ("backends", TypeError, "A is a numpy matrix but x is a strict array"),
     ("shape", ValueError, r"A of shape \(7, 5\) needs a vector of length 5, got shape \(4,\)"),
     ("matrix_x", ValueError, r"needs a vector of length 5, got shape \(5, 2\)"),
     ("out_shape", ValueError, r"out has shape \(5,\) and dtype float64; the product has "
                               r"shape \(7,\)"),
     ("out_dtype", ValueError, "out has shape .* and dtype float32"),
     ("out_backend", TypeError, "out must be a numpy array, got StrictArray"),
     ("overlap", ValueError, "out overlaps x")],
)
def test_bad_input_names_what_is_wrong(rng, case, error, match):
    matrix, _ = _matrix(rng)
    A, x, kwargs = matrix, np.ones(5), {}
    if case == "dense":
        A = matrix.toarray()
    elif case in ("csc", "coo"):
        A = matrix.asformat(case)
    elif case == "int":
        A = scipy.sparse.csr_matrix(np.ones((7, 5), dtype=np.int64))
    elif case == "x_int":
        x = np.ones(5, dtype=np.int64)
    elif case == "x_list":
        x = [1.0] * 5
    elif case == "backends":
        x = strict.xp.ones(5)
    elif case == "shape":
        x = np.ones(4)
    elif case == "matrix_x":
        x = np.ones((5, 2))
    elif case == "out_shape":
        kwargs = {"out": np.zeros(5)}
    elif case == "out_dtype":
        kwargs = {"out": np.zeros(7, dtype=np.float32)}
    elif case == "out_backend":
        kwargs = {"out": strict.xp.zeros(7)}
    elif case == "overlap":
        square = scipy.sparse.csr_matrix(np.eye(5))
        A, kwargs = square, {"out": x}
    with pytest.raises(error, match=match):
        gs.spmv(A, x, **kwargs)


def test_as_csr_refuses_a_device_matrix_and_a_non_array_like():
    with pytest.raises(TypeError, match="matrix must be on the host"):
        gs.as_csr(strict.xp.ones((2, 2)), like=np.ones(1))
    with pytest.raises(TypeError, match="like must be a NumPy, strict or CuPy array, got list"):
        gs.as_csr(np.eye(2), like=[1.0])


# ---- CuPy: gpuscalar's CSR kernel through the recording seam and NVRTC --------------------------


@pytest.fixture
def dev() -> Iterator:
    from .cupy_fake import cupy_or_fail, fake_memory  # noqa: PLC0415 - imports CuPy
    from .cupy_seam import recording  # noqa: PLC0415

    cupy_or_fail()
    with fake_memory() as memory, recording(memory, compile=True) as seam:
        seam.records_only = True
        yield seam


def _cupyx_csr(dev, matrix, index=np.int32):
    """A ``cupyx.scipy.sparse.csr_matrix`` over fake memory (its constructor loads cuSPARSE,
    which CI lacks: the object is assembled as the constructor leaves it)."""
    import cupyx.scipy.sparse  # noqa: PLC0415

    A = object.__new__(cupyx.scipy.sparse.csr_matrix)
    A.data = dev.array(matrix.data)
    A.indices = dev.array(matrix.indices.astype(index))
    A.indptr = dev.array(matrix.indptr.astype(index))
    A._shape = matrix.shape
    return A


def _covers(*names):
    from .cupy_seam import covers  # noqa: PLC0415

    return covers(*names)


@pytest.mark.needs_cupy
@_covers("gs.spmv")
@pytest.mark.parametrize(("a_dtype", "x_dtype", "index"),
                         [(a, x, np.int32) for a, x in PAIRS] + [(np.float64, np.float64,
                                                                   np.int64)])
def test_spmv_on_cupy_is_one_checked_compiled_kernel_launch(dev, rng, a_dtype, x_dtype, index):
    matrix, _ = _matrix(rng, dtype=a_dtype)
    A = _cupyx_csr(dev, matrix, index)
    x = dev.array(_vector(rng, 10, x_dtype))[::2]  # a strided vector
    with gs.count_syncs() as counter:
        y = gs.spmv(A, x)
    assert counter.count == 0 and counter.device_ops == 1
    (launch,) = dev.launches
    assert launch.kind == "raw"  # argument by argument against its C signature, NVRTC-compiled
    assert launch.name == products.csr_kernel_name(a_dtype, x_dtype, index)
    assert y.dtype == np.result_type(a_dtype, x_dtype) and y.shape == (7,)
    assert launch.args[2][4] == 2  # x's element step
    assert not dev.uploads and not dev.reads


@pytest.mark.needs_cupy
def test_spmv_in_a_cupy_loop_body_is_recorded_without_cusparse(dev, rng):
    matrix, _ = _matrix(rng, rows=5, cols=5)
    A = _cupyx_csr(dev, matrix)
    x, y = dev.array(np.ones(5)), dev.array(np.zeros(5))
    i = dev.array(np.array(0.0))
    one, three = (gs.asscalar(v, like=i) for v in (1.0, 3.0))
    dev.clear()

    def body(i, x, y):
        gs.spmv(A, x, out=y)
        i += one

    gs.while_loop(lambda i, x, y: i < three, body, i, x, y, max_iter=10)
    kernels = [launch.name for launch in dev.launches if launch.kind == "raw"]
    assert products.csr_kernel_name(np.float64, np.float64) in kernels
    assert dev.count("cublas") == 0 and not dev.uploads


@pytest.mark.needs_cupy
@_covers("gs.as_csr")
def test_as_csr_on_cupy_uploads_the_three_arrays_before_any_loop(dev, rng, monkeypatch):
    import cupyx.scipy.sparse  # noqa: PLC0415

    made = []
    monkeypatch.setattr(cupyx.scipy.sparse, "csr_matrix",
                        lambda parts, shape: made.append((parts, shape)) or "csr")
    matrix, _ = _matrix(rng)
    assert gs.as_csr(matrix, like=dev.array(np.zeros(1))) == "csr"
    (parts, shape), = made
    assert shape == (7, 5) and [p.dtype for p in parts] == [np.float64, np.int32, np.int32]
    assert [u.how for u in dev.uploads] == ["xp.asarray"] * 3


@pytest.mark.parametrize("index", [np.int32, np.int64])
@pytest.mark.parametrize(("a_dtype", "x_dtype"), PAIRS)
def test_every_csr_kernel_compiles(nvrtc, a_dtype, x_dtype, index):
    from gpuscalar.devices.cupy.backend import CupyBackend  # noqa: PLC0415

    from . import nvrtc as nv  # noqa: PLC0415

    name = products.csr_kernel_name(a_dtype, x_dtype, index)
    ptx = nv.compile_source(nvrtc, products.csr_source(a_dtype, x_dtype, index), name,
                            nv.cupy_options(CupyBackend.kernel_options))
    assert f".entry {name}" in ptx
