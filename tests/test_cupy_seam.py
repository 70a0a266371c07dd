"""gpuscalar's own entry points, end to end on CuPy objects, through the recording seam.

Why: without a GPU, CuPy cannot run a kernel, so the NumPy and strict-device tests cannot see
what gpuscalar hands CuPy. Here every launch gpuscalar makes on real ``cupy.ndarray``s (over
fake memory) goes through `tests.cupy_seam.RecordingSeam`, which checks it against CuPy itself
(the real call must get as far as CUDA; a RawKernel's arguments must match its C signature) and
answers it. The tests assert exact launch counts and kinds, values where the seam computes them
(ufuncs and ``cupy`` functions, by NumPy), and that optimizer and captured steps copy nothing
from the host. Each test names the public API it covers (`covers`) for the API walk.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import ad, optim, sync
from gpuscalar.devices import CUPY

from .cupy_fake import cupy_or_fail, fake_memory, host_view
from .cupy_seam import RecordingSeam, covers, recording


@pytest.fixture
def dev() -> Iterator[RecordingSeam]:
    cupy_or_fail()
    with fake_memory() as memory, recording(memory) as seam:
        yield seam


def _data(n: int = 6, dtype: type = np.float64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 2.0, n).astype(dtype)


# ---- the seam itself ----------------------------------------------------------------------------


def test_the_seam_is_restored_and_refuses_a_non_seam():
    before = gs.devices.CUPY.seam
    with fake_memory() as memory, recording(memory) as seam:
        assert gs.devices.CUPY.seam is seam
    assert gs.devices.CUPY.seam is before
    assert "call" not in vars(gs.devices.CUPY)  # the real seam: Backend.call, nothing added
    with pytest.raises(TypeError, match="expected a CudaSeam, got object"):
        with gs.devices.CUPY.seam_replaced(object()):  # type: ignore[arg-type]
            pass


def test_the_seam_rejects_a_launch_cupy_refuses(dev):
    """The check is real: a launch CuPy's own argument handling refuses fails the test."""
    x = dev.array(_data())
    with pytest.raises(AssertionError, match="CuPy refuses gpuscalar's function launch of sum"):
        gs.devices.CUPY.call(cupy_or_fail().sum, x, bogus=1)


def test_the_seam_rejects_a_raw_argument_of_the_wrong_type(dev):
    cupy = cupy_or_fail()
    source = 'extern "C" __global__ void k(const double* __restrict__ x, long long n) {}'
    kernel = cupy.RawKernel(source, "k")
    x = dev.array(_data())
    with pytest.raises(AssertionError, match="long long n got int"):
        gs.devices.CUPY.call(kernel, (1,), (32,), (x, 6))
    with pytest.raises(AssertionError, match="double"):
        gs.devices.CUPY.call(kernel, (1,), (32,), (dev.array(_data(dtype=np.float32)),
                                                     np.int64(6)))


def test_the_seam_sees_the_pointer_table_cupy_uploads_for_many_arrays(dev):
    cupy = cupy_or_fail()
    few, many = ([dev.array(_data(3, seed=i)) for i in range(n)] for n in (8, 9))
    gs.devices.CUPY.call(cupy.stack, few)
    assert not dev.uploads
    gs.devices.CUPY.call(cupy.stack, many)
    assert [u.how for u in dev.uploads] == ["xp.stack's pointer table (9 arrays)"]
    gs.devices.CUPY.call(cupy.stack, [*many[:8], dev.array(_data(3, np.float32))])
    assert len(dev.uploads) == 1  # mixed dtypes: CuPy copies them one by one


def test_the_seam_checks_what_cupy_decides_after_its_first_cuda_call(dev):
    """CuPy asks CUDA for the device before it resolves loops and dtypes, so a real call
    without a GPU never reaches them: the double checks them itself."""
    cupy = cupy_or_fail()
    x, counts = dev.array(_data()), dev.array(np.zeros(6, np.int64))
    with pytest.raises(AssertionError, match="float64 result cannot be cast to the int64"):
        gs.devices.CUPY.call(cupy.add, x, 1.0, out=counts)
    with pytest.raises(AssertionError, match="take no \\['keepdims'\\]"):
        gs.devices.CUPY.call(cupy.add, x, 1.0, keepdims=True)
    with pytest.raises(AssertionError, match="cannot be broadcast"):
        gs.devices.CUPY.call(cupy.add, x, 1.0, out=dev.array(np.zeros(3)))
    kernel = cupy.ElementwiseKernel("T a, T b", "T c", "c = a + b", "gs_test_add")
    with pytest.raises(AssertionError, match="Type is mismatched"):
        gs.devices.CUPY.call(kernel, x, dev.array(np.ones(6, np.float32)))
    assert gs.devices.CUPY.call(kernel, x, x).shape == (6,)  # and a right call passes


# ---- scalars: lazy expressions and folds -----------------------------------------------------


@covers("gs.GPUScalar", "gs.lazy", "gs.sqrt", "gs.exp", "gs.log", "gs.abs", "gs.maximum",
        "gs.minimum", "gs.power", "gs.tanh", "gs.sin", "gs.cos", "gs.tan", "gs.arctan2",
        "gs.hypot", "gs.exp2", "gs.expm1", "gs.log10", "gs.log1p", "gs.log2", "gs.ceil",
        "gs.floor", "gs.sign", "gs.isfinite", "gs.isinf", "gs.isnan", "gs.where", "gs.clip")
def test_a_scalar_expression_is_one_checked_launch(dev):
    x = dev.array(_data())
    s = gs.sum(x)
    t = gs.where(gs.isfinite(s) & ~gs.isnan(s) & ~gs.isinf(s),
                 gs.clip(gs.sqrt(gs.exp(gs.log(gs.abs(s)))) * gs.maximum(s, 1.0), 0.0, 1e9)
                 + gs.minimum(gs.power(s, 2.0), gs.tanh(s)) + gs.sin(s) + gs.cos(s)
                 + gs.tan(s) + gs.arctan2(s, 2.0) + gs.hypot(s, 1.0) + gs.exp2(gs.sign(s))
                 + gs.expm1(s) + gs.log10(s) + gs.log1p(s) + gs.log2(s) + gs.ceil(s)
                 + gs.floor(s), 0.0)
    with gs.lazy():
        u = t * 2.0
    assert dev.kinds() == ["function"]  # gs.sum only: the expression is still pending
    float(u)  # one packing RawKernel (`codegen.read_source`), checked against its signature
    assert dev.kinds() == ["function", "raw"], dev.kinds()
    assert len(dev.reads) == 1 and not dev.uploads
    assert "sqrt" in dev.launches[1].source and "hypot" in dev.launches[1].source


@covers("gs.asscalar")
def test_a_pending_scalar_folds_into_the_array_ufunc(dev):
    data = _data()
    x = dev.array(data)
    y = gs.asscalar(3.0, like=x) * x
    kinds = dev.kinds()
    assert kinds == ["function", "ufunc"], kinds  # cupy.full, then one multiply
    assert dev.launches[1].name == "cupy_multiply"
    np.testing.assert_array_equal(host_view(y), 3.0 * data)
    dev.clear()
    z = (gs.sum(x) * 2.0 + 1.0) * x  # a pending expression folds into the one array launch
    assert [launch.kind for launch in dev.launches] == ["function", "elementwise"]
    assert z.shape == x.shape and not dev.reads and not dev.uploads


# ---- reductions --------------------------------------------------------------------------------

REDUCTIONS = {
    "sum": (lambda x: gs.sum(x), np.sum), "mean": (lambda x: gs.mean(x), np.mean),
    "norm": (lambda x: gs.norm(x), np.linalg.norm), "max": (lambda x: gs.max(x), np.max),
    "min": (lambda x: gs.min(x), np.min), "prod": (lambda x: gs.prod(x), np.prod),
    "std": (lambda x: gs.std(x), np.std), "var": (lambda x: gs.var(x), np.var),
    "all": (lambda x: gs.all(x), np.all), "any": (lambda x: gs.any(x), np.any),
    "count_nonzero": (lambda x: gs.count_nonzero(x), np.count_nonzero),
    "dot": (lambda x: gs.dot(x, x), lambda h: np.dot(h, h)),
    "vdot": (lambda x: gs.vdot(x, x), lambda h: np.vdot(h, h)),
}


@covers(*(f"gs.{name}" for name in REDUCTIONS))
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_a_reduction_is_one_checked_launch_and_one_read(dev, name):
    ours, numpy = REDUCTIONS[name]
    data = _data()
    value = ours(dev.array(data))
    assert isinstance(value, gs.GPUScalar)
    # (a dot of two vectors is gpuscalar's own dot kernel, eager and recorded alike)
    kind = "raw" if name in ("dot", "vdot") else "function"
    assert len(dev.launches) == 1 and dev.launches[0].kind == kind, dev.kinds()
    assert float(value) == pytest.approx(float(numpy(data)), rel=1e-12)
    assert len(dev.reads) == 1 and not dev.uploads


@covers("gs.logsumexp")
def test_logsumexp_is_checked_cupy_calls_with_the_right_value(dev):
    data = _data()
    value = gs.logsumexp(dev.array(data))
    assert dev.count("raw") == 0 and not dev.reads  # CuPy ufuncs and functions, all checked
    expected = np.log(np.sum(np.exp(data - data.max()))) + data.max()
    assert float(value) == pytest.approx(expected, rel=1e-12)
    assert len(dev.reads) == 1 and not dev.uploads


@covers("gs.unbroadcast")
def test_unbroadcast_sums_the_broadcast_axes(dev):
    data = np.arange(6.0).reshape(2, 3)
    out = gs.unbroadcast(dev.array(data), (3,))
    assert out.shape == (3,) and dev.kinds() == ["function"]
    np.testing.assert_array_equal(host_view(out), data.sum(axis=0))


@covers("gs.global_norm", "gs.clip_grad_norm", "optim.clip_grad_norm", "gs.all_finite",
        "optim.all_finite")
@pytest.mark.parametrize("count", [2, 12])  # over 8 arrays: CuPy's concatenate uploads a table
def test_global_norm_clip_and_all_finite_copy_nothing_from_the_host(dev, count):
    datas = [_data(n, seed=n) for n in range(1, count + 1)]
    arrays = [dev.array(d) for d in datas]
    norm = gs.global_norm(arrays)
    assert float(norm) == pytest.approx(np.linalg.norm(np.concatenate(datas)), rel=1e-12)
    finite = gs.all_finite(arrays)
    total = gs.clip_grad_norm(arrays, 1.0)
    assert isinstance(finite, gs.GPUScalar) and isinstance(total, gs.GPUScalar)
    assert not dev.uploads, [u.how for u in dev.uploads]


STACK_DTYPES = [(np.float32, np.float64), (np.float64, np.float64), (np.complex64, np.complex128),
                (np.float32, np.complex64), (np.bool_, np.int64)]


@covers("gs.global_norm")
@pytest.mark.parametrize("count", range(1, 9))
@pytest.mark.parametrize(("dtype", "result"), STACK_DTYPES)
def test_gathering_scalars_is_one_compiled_launch(count, dtype, result):
    """`stack_scalars` on CuPy: one launch of the gathering kernel for up to 8 inputs (CuPy's
    ``stack`` would copy each with a kernel of its own), NVRTC-compiled, each input cast as
    ``stack`` casts; the dtypes mixed where they may be."""
    from gpuscalar.devices.cupy.backend import STACK_PREFIX  # noqa: PLC0415

    cupy_or_fail()
    kind = np.dtype(dtype).kind
    values = [np.asarray(k % 2 if kind == "b" else 1.5 * k - 2.25j * (k % 3) if kind == "c"
                         else 1.5 * k - 2.25, dtype) for k in range(count)]
    with fake_memory() as memory, recording(memory, compile=True) as seam:
        scalars = [seam.array(v) for v in values]
        seam.clear()
        out = CUPY.stack_scalars(scalars, result)
        assert [launch.name for launch in seam.launches] == [f"{STACK_PREFIX}{count}"]
        assert out.dtype == result and out.shape == (count,)
        np.testing.assert_array_equal(host_view(out), np.stack(values).astype(result))
        into = seam.array(np.zeros(count + 2, result))
        CUPY.stack_scalars(scalars, result, out=into[1:count + 1])
        np.testing.assert_array_equal(host_view(into)[1:count + 1], host_view(out))
        assert host_view(into)[0] == 0 and host_view(into)[-1] == 0


def test_gathering_refuses_the_casts_stack_refuses(dev):
    scalars = [dev.array(np.asarray(1.0 + 2.0j)), dev.array(np.asarray(3.0))]
    dev.clear()
    with pytest.raises(TypeError, match="complex128.*float64.*same_kind"):
        CUPY.stack_scalars(scalars, np.float64)
    assert not dev.launches


# ---- optimizers ---------------------------------------------------------------------------------


def _params(dev: RecordingSeam, dtype: type = np.float32) -> list:
    return [dev.array(np.ones(n, dtype)) for n in (5, 3, 7)]


@covers("optim.Adam", "optim.AdamW", "optim.SGD", "optim.Optimizer")
@pytest.mark.parametrize("make", [
    lambda p: optim.Adam(p, lr=1e-3), lambda p: optim.AdamW(p, lr=1e-3, weight_decay=0.01),
    lambda p: optim.SGD(p, lr=0.1), lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
], ids=["adam", "adamw", "sgd", "momentum", "nesterov"])
def test_an_optimizer_step_is_checked_raw_launches_and_no_upload(dev, make):
    params = _params(dev)
    opt = make(params)
    grads = [dev.array(np.full(p.shape, 0.5, np.float32)) for p in params]
    opt.step(grads)  # first step: the gradient table is written by a kernel
    dev.clear()
    opt.step(grads)  # same grads: the fused update and the step counter, nothing else
    assert dev.kinds() == ["raw", "raw"], [(launch.kind, launch.name) for launch in dev.launches]
    assert not dev.uploads and not dev.reads
    new = [dev.array(np.full(p.shape, 0.25, np.float32)) for p in params]
    dev.clear()
    opt.step(new, skip_if=gs.any(new[0]) > 1.0)  # new arrays: a table write, from arguments
    assert dev.count("raw") == 3 and not dev.uploads and not dev.reads


@covers("optim.Adam", "optim.Optimizer")
def test_state_dict_round_trip_is_device_copies(dev):
    params = _params(dev)
    opt = optim.Adam(params, lr=1e-3)
    opt.step([dev.array(np.ones(p.shape, np.float32)) for p in params])
    dev.clear()
    state = opt.state_dict()
    assert {launch.name for launch in dev.launches} == {"copy"} and not dev.reads
    dev.clear()
    opt.load_state_dict(state)
    assert not dev.uploads and not dev.reads


@covers("optim.adam_step", "optim.sgd_step")
def test_functional_steps_are_one_raw_launch_each(dev):
    p, g, m, v = (dev.array(np.ones(5, np.float32)) for _ in range(4))
    step = gs.asscalar(1, like=p)
    dev.clear()
    optim.adam_step(p, g, m, v, step=step, lr=1e-3)
    assert dev.kinds() == ["raw"] and dev.launches[0].name.startswith("gpuscalar_adam")
    dev.clear()
    optim.sgd_step(p, g, lr=0.1)
    assert dev.kinds() == ["raw"] and not dev.uploads and not dev.reads


# ---- gs.ad --------------------------------------------------------------------------------------


@covers(*(f"ad.{name}" for name in ad.__all__), "gs.ad")
def test_vjp_rules_on_scalars_and_arrays(dev):
    data = _data()
    x = dev.array(data)
    s = gs.sum(x)
    g = gs.asscalar(1.0, like=x)
    for rule in (ad.vjp_add, ad.vjp_sub, ad.vjp_mul, ad.vjp_truediv, ad.vjp_pow,
                 ad.vjp_maximum, ad.vjp_minimum):
        da, db = rule(g, s, s)
        float(da), float(db)
    dsum = ad.vjp_sum(g, x)
    dmean = ad.vjp_mean(g, x)
    assert dsum.shape == dmean.shape == x.shape
    assert not dev.uploads


# ---- matmul (cuBLAS) and capture ---------------------------------------------------------------


@covers("gs.matmul")
def test_matmul_is_one_checked_cublas_call(dev):
    a, b = dev.array(np.ones((2, 3))), dev.array(np.ones((3, 4)))
    out = dev.array(np.zeros((2, 4)))
    gs.matmul(a, b, out=out)
    calls = [launch for launch in dev.launches if launch.kind == "cublas"]
    assert [c.name for c in calls] == ["cublasDgemm_v2"]
    dev.clear()
    gs.matmul(a, dev.array(np.ones(3)), out=dev.array(np.zeros(2)), alpha=gs.sum(a))
    assert [c.name for c in dev.launches if c.kind == "cublas"] == ["cublasDgemv_v2"]


@covers("gs.capture", "gs.CapturedStep")
def test_a_captured_optimizer_step_records_replays_and_uploads_nothing(dev):
    params = _params(dev)
    opt = optim.Adam(params, lr=1e-3)
    grads = [dev.array(np.ones(p.shape, np.float32)) for p in params]
    dev.clear()

    def step(first: object) -> gs.GPUScalar:
        opt.step(grads)
        return gs.global_norm(params)

    captured = gs.capture(step, params[0], warmup=1)
    assert captured.backend is gs.devices.CUPY
    assert len(dev.graphs) == 1 and not dev.uploads
    recorded = dev.graphs[0].launches
    assert [launch.kind for launch in recorded].count("raw") >= 2
    dev.clear()
    with sync.count_syncs() as counter:
        captured()
    assert dev.graph_launches == 1 and not dev.launches and not dev.uploads
    assert counter.count == 0 and counter.device_ops == 1
    captured.release()  # while the recording seam stands: the release reaches the device too


def test_device_objects_made_through_the_recorder_do_not_outlive_it():
    """cuBLAS handles and alpha/beta constants made through a double (fake memory, fake
    handles) are dropped when the seam is restored; what the real seam made comes back."""
    from gpuscalar.devices.cupy import linalg

    sentinel = ("real seam", np.dtype(np.float64), "0x0p+0")  # stands for a real constant
    linalg._CONSTANTS[sentinel] = real = object()
    before = dict(linalg._CONSTANTS), dict(linalg._HANDLES)
    with fake_memory() as memory, recording(memory) as seam:
        assert sentinel not in linalg._CONSTANTS  # the real seam's objects are not used here
        a, b = seam.array(np.ones((2, 3))), seam.array(np.ones((3, 4)))
        gs.matmul(a, b, out=seam.array(np.zeros((2, 4))))
        made = {id(v) for v in (*linalg._CONSTANTS.values(), *linalg._HANDLES.values())}
        assert made  # the matmul made its constants and handle through the recorder
    after = {id(v) for v in (*linalg._CONSTANTS.values(), *linalg._HANDLES.values())}
    assert not made & after
    assert linalg._CONSTANTS.keys() == before[0].keys()
    assert linalg._HANDLES.keys() == before[1].keys()
    assert linalg._CONSTANTS.pop(sentinel) is real


def test_every_kernel_gpuscalar_launches_compiles_with_nvrtc():
    """The code CuPy would generate for each ElementwiseKernel launch, with these arguments,
    and each RawKernel's source compile with NVRTC (CuPy's options, sm_90)."""
    cupy_or_fail()
    with fake_memory() as memory, recording(memory, compile=True) as seam:
        x = seam.array(_data())
        s = gs.sum(x)
        float(gs.where(s > 1.0, gs.sqrt(s) * 2.0 + gs.log1p(s), gs.exp(-s)))
        (s * 3.0 + 1.0) * x  # a pending expression folded into an array launch
        x32 = seam.array(_data(dtype=np.float32))
        x32 * gs.clip(gs.sum(x32), 0.0, 1.0)
        params = _params(seam)
        opt = optim.AdamW(params, lr=gs.asscalar(1e-3, like=params[0]), weight_decay=0.01)
        opt.step([seam.array(np.ones(p.shape, np.float32)) for p in params],
                 skip_if=~gs.all_finite(params))
    assert seam.count("elementwise") >= 2 and seam.count("raw") >= 3, seam.kinds()


def test_a_host_to_device_copy_while_capturing_is_refused_as_cupy_refuses_it(dev):
    cupy = cupy_or_fail()
    x = dev.array(_data())

    def step(x: object) -> None:
        gs.devices.CUPY.call(cupy.asarray, np.ones(3))  # what CuPy refuses while capturing

    with pytest.raises(RuntimeError, match="a captured step cannot copy host data"):
        gs.capture(step, x, warmup=0)
    assert not dev.uploads  # refused, not made
