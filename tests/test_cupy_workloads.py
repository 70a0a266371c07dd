"""The workloads, the main job and the example, end to end on CuPy objects without a GPU.

Why: the strict device checks what CuPy would refuse, but not CuPy's own dispatch of the user
code around gpuscalar (``x += s`` passes its output positionally, ``g * lr_expr`` goes through
NumPy's dispatch, ``a[...] = s`` is an elementwise copy). Here every path runs on real
``cupy.ndarray``s: the user-level CuPy code on the fake device of `tests.cupy_device` (NumPy
does its math, host reads are CuPy's declared syncs), and everything gpuscalar launches through
its launch seam, replaced by the recorder of `tests.cupy_seam`, which checks each launch
against what CuPy accepts. These tests run in CI (CuPy installed, no GPU): they fail, never
skip, where CuPy is missing there.
"""

from __future__ import annotations

import math
import runpy
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict
from gpuscalar.optim import Adam
from gpuscalar.tools import benchmarks, demo
from gpuscalar.tools.workloads import WORKLOADS

from .cupy_fake import cupy_or_fail, host_view
from .cupy_seam import covers

NAMES = list(WORKLOADS)


@pytest.fixture
def device():
    """``(xp, log)`` of the fake CuPy device for user-level code alone (fails in CI without
    CuPy)."""
    cupy_or_fail()
    from .cupy_device import fake_device  # noqa: PLC0415 - imports CuPy

    with fake_device() as pair:
        yield pair


@pytest.fixture
def cupy_device():
    """``(xp, log, seam)``: the fake CuPy device, and the recording seam (checking each of
    gpuscalar's launches against CuPy) as gpuscalar's CUDA seam."""
    cupy_or_fail()
    from .cupy_device import fake_cupy_device  # noqa: PLC0415 - imports CuPy

    # (fake memory skips on a machine with a GPU: see tests/cupy_fake.refuse_on_a_gpu)
    with fake_cupy_device() as triple:
        yield triple


@dataclass
class Run:
    """One path run on the fake CuPy device, counted as a GPU would see it."""

    result: Any
    syncs: int
    #: device operations: gpuscalar's launches (those recorded into a graph excepted: the
    #: graph's replays count), the user code's launches outside graphs, host-to-device copies
    ops: int
    uploads: int
    #: gpuscalar launches whose outputs the recorder cannot compute (fused or raw kernels)
    uncomputed: int
    graphs: int


def run_on_cupy(cupy_device, function) -> Run:
    """``function(xp)`` on the fake CuPy device, counted (inputs made before are not)."""
    xp, log, seam = cupy_device
    before = (log.launches, log.uploads, len(seam.uploads), len(seam.launches),
              len(seam.graphs))
    with gs.count_syncs(include_cupy=True) as counter:
        result = function(xp)
    graphs = seam.graphs[before[4]:]
    recorded = sum(launch.kind != "device" for graph in graphs for launch in graph.launches)
    uploads = log.uploads - before[1]
    assert log.uploads_in_step == 0, "a host-to-device copy inside a captured step"
    return Run(
        result=result,
        syncs=counter.count,
        ops=counter.device_ops - recorded + log.launches - before[0] + uploads,
        uploads=uploads + len(seam.uploads) - before[2],
        uncomputed=sum(launch.kind in ("elementwise", "raw")
                       for launch in seam.launches[before[3]:]),
        graphs=len(graphs),
    )


def run_on_strict(function) -> tuple[Any, int, int]:
    """(result, syncs, device ops) of ``function(strict.xp)``: the strict device's counts."""
    with gs.count_syncs(include_cupy=True) as counter:
        result = function(strict.xp)
    return result, counter.count, counter.device_ops


def _host_answer(value):
    """An answer value read to the host: arrays by ``.get()`` (NumPy ones as they are)."""
    if isinstance(value, (list, tuple)):
        return [_host_answer(v) for v in value]
    if hasattr(value, "get") and not isinstance(value, np.ndarray):
        return value.get()
    return np.asarray(value)


def assert_same_values(left, right):
    assert left.keys() == right.keys()
    for key in left:
        a, b = _host_answer(left[key]), _host_answer(right[key])
        if isinstance(a, list):
            assert len(a) == len(b), key
            for x, y in zip(a, b, strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-12, atol=0, err_msg=key)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0, err_msg=key)


# ---- the fake device itself ----------------------------------------------------------------


def test_the_device_computes_user_level_cupy_code_with_numpy(device):
    import cupy

    xp, log = device
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal(3)
    x, v = xp.asarray(a), xp.asarray(b)
    assert type(x) is not cupy.ndarray and isinstance(x, cupy.ndarray)
    assert log.uploads == 2
    np.testing.assert_array_equal((x @ v).get(), a @ b)
    np.testing.assert_array_equal((x.T * 2.0 - v[:, None]).get(), a.T * 2.0 - b[:, None])
    np.testing.assert_array_equal(x.sum(axis=0).get(), a.sum(axis=0))
    y = x.copy()
    y += v  # CuPy passes the output positionally: _add(y, v, y)
    y[...] = xp.where(y > 0, y, 0.0)
    np.testing.assert_array_equal(y.get(), np.where(a + b > 0, a + b, 0.0))
    np.testing.assert_array_equal(x.get(), a)  # copy() made a new buffer
    np.testing.assert_array_equal(x[xp.asarray([2, 0])].get(), a[[2, 0]])
    assert float(xp.zeros(()) + 1.5) == 1.5


def test_host_reads_are_declared_syncs_as_cupy_declares_them(device):
    xp, log = device
    x = xp.arange(5, dtype=np.float64)
    with gs.count_syncs(include_cupy=True) as counter:
        total = float(x.sum())
        positive = bool(x.sum() > 0)
        data = x.get()
    assert (total, positive) == (10.0, True)
    np.testing.assert_array_equal(data, np.arange(5.0))
    assert counter.count == log.host_reads == 3
    assert {r.reason for r in counter.records} == {"cupy"}


def test_an_argument_with_its_own_hook_gets_the_call_as_on_cupy(device):
    """Real CuPy arrays have no hook, so CuPy calls the GPUScalar's (or any other object's):
    the device must hand the call on, not compute it itself."""
    xp, _ = device
    calls = []

    class Other:
        def __cupy_override_elementwise_kernel__(self, kernel, *args, **kwargs):
            calls.append((kernel.name, len(args), sorted(kwargs)))
            return "handled"

    x, other = xp.ones(3), Other()
    assert xp.multiply(x, other) == "handled"
    x_before = x
    x += other  # CuPy: _add(x, other, x), the output positional
    assert x == "handled"
    assert xp.where(x_before > 0, x_before, other) == "handled"
    assert calls == [("cupy_multiply", 2, []), ("cupy_add", 3, []), ("cupy_where", 3, [])]


def test_an_elementwise_kernel_of_its_own_is_refused_clearly(device):
    import cupy

    xp, _ = device
    kernel = cupy.ElementwiseKernel("T x", "T y", "y = x", "h6_copy")
    with pytest.raises(NotImplementedError, match="h6_copy"):
        kernel(xp.ones(2))


@covers("gs.matmul")
def test_gs_matmul_computes_numpys_product_through_the_cublas_calls_it_makes(cupy_device):
    """The device answers gpuscalar's cuBLAS calls (gemv, gemm, strided-batched gemm) from
    their arguments alone, column-major as cuBLAS reads them: NumPy's product comes back only
    if gs.matmul hands cuBLAS the right transposes, sizes and leading dimensions."""
    xp, _, seam = cupy_device
    rng = np.random.default_rng(3)
    cases = [((5, 3), (3,)), ((3, 5), (3,), "aT"), ((5, 3), (3, 4)), ((3, 5), (3, 4), "aT"),
             ((5, 3), (4, 3), "bT"), ((2, 5, 3), (2, 3, 1)), ((2, 5, 3), (3, 4))]
    for shape_a, shape_b, *transposed in cases:
        a, b = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
        if transposed == ["aT"]:
            a_dev, a = xp.asarray(a).T, a.T
        else:
            a_dev = xp.asarray(a)
        if transposed == ["bT"]:
            b_dev, b = xp.asarray(b).T, b.T
        else:
            b_dev = xp.asarray(b)
        # (gs.matmul allocates its result with cupy.empty, outside the seam: a plain array)
        product = host_view(gs.matmul(a_dev, b_dev))
        np.testing.assert_allclose(product, a @ b, rtol=1e-13,
                                   err_msg=f"{shape_a} @ {shape_b} {transposed}")
    out = xp.asarray(np.ones((5, 4)))
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    gs.matmul(xp.asarray(a), xp.asarray(b), out=out, beta=gs.asscalar(0.5, like=out))
    np.testing.assert_allclose(out.get(), a @ b + 0.5, rtol=1e-13)
    assert {launch.name[len("cublasD"):] for launch in seam.launches if launch.kind == "cublas"} \
        == {"gemv_v2", "gemm_v2", "gemmStridedBatched"}


# ---- the float paths: user-level CuPy code only ----------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_float_paths_run_on_cupy_objects(device, name):
    """Every float path on the fake device: NumPy's answer, one declared sync per host read
    (the strict device's count), and the launches the strict device counts (CuPy's
    ``linalg.norm`` of a vector included: square, sum, sqrt)."""
    xp, log = device
    workload = WORKLOADS[name]
    params = workload.params("quick")
    inputs = workload.make_inputs(xp, params)
    launches_before = log.launches
    with gs.count_syncs(include_cupy=True) as counter:
        answer = workload.run("float", xp, params, inputs)
    strict_syncs, strict_ops, _ = benchmarks.count_path(workload, "float", params)
    assert counter.count == strict_syncs
    assert log.launches - launches_before == strict_ops
    assert log.uploads == len(inputs) + sum(isinstance(v, list) and len(v) - 1
                                            for v in inputs.values())
    reference = workload.run("float", np, params)
    assert_same_values(answer, reference)


# ---- gpuscalar's paths: the user code on the device, gpuscalar's launches on the recorder ----


def _step_param(name: str) -> str:
    return "max_iter" if name in ("jacobi", "cg") else "steps"


@covers("cli bench", "gs.capture", "gs.CapturedStep", "gs.matmul")
@pytest.mark.parametrize("path", ["gpuscalar", "capture"])
@pytest.mark.parametrize("name", NAMES)
def test_workload_paths_run_end_to_end_on_cupy_objects(cupy_device, name, path):
    """Each workload's gpuscalar and capture path on CuPy objects: every launch accepted by
    CuPy (the recorder's checks), the syncs the workload states, the strict device's launch
    count (CuPy's skipped self-assignments included), no host-to-device copy in a step, and
    NumPy's answer where the device and the recorder computed every value."""
    xp, log, seam = cupy_device
    workload = WORKLOADS[name]
    params = workload.params("quick")
    inputs = workload.make_inputs(xp, params)
    step = _step_param(name)
    fewer = workload.params("quick", **{step: params[step] // 2})
    run = run_on_cupy(cupy_device, lambda xp: workload.run(path, xp, params, inputs))
    again = run_on_cupy(cupy_device, lambda xp: workload.run(path, xp, fewer, inputs))
    strict_inputs = workload.make_inputs(strict.xp, params)
    _, strict_syncs, strict_ops = run_on_strict(
        lambda sx: workload.run(path, sx, params, strict_inputs))
    _, _, strict_fewer_ops = run_on_strict(lambda sx: workload.run(path, sx, fewer, strict_inputs))

    if (name, path) == ("cg", "gpuscalar"):
        # its stop is decided from values fused kernels compute, which the recorder does not:
        # here the launches are checked and the reads bounded; the counts are pinned on the
        # strict device (tests/test_workloads.py)
        assert 1 <= run.syncs <= workload.host_values_needed(params)
        assert run.uploads == 0 and run.graphs == 0
        return
    if workload.loop_on_device and path == "capture":
        # one gs.while_loop: the device decides (no check read; cg returns its count to the
        # host), one graph with a WHILE node, no upload. Its launches were checked as recorded;
        # the loop as one device op is pinned on the strict device (tests/test_control*.py)
        assert run.syncs == strict_syncs == (name == "cg")
        assert run.graphs == 1 and run.uploads == again.uploads == 0
        return
    if name in ("jacobi", "cg"):  # one check per check_every iterations until converged
        iterations = int(np.max(_host_answer(run.result["iterations"])))
        checks = math.ceil(iterations / params["check_every"])
        assert run.syncs == checks + (name == "cg") == strict_syncs
    else:
        assert run.syncs == workload.host_values_needed(params) == strict_syncs
    # the steps launch what the strict device counts (the set-up may differ: see below)
    assert run.ops - again.ops == strict_ops - strict_fewer_ops
    setup = 0
    if (name, path) == ("clip_adam", "capture"):
        # optim.Adam's construction costs more ops on CuPy (its kernel's pointer and block
        # tables are uploaded once): measured on both devices, the rest must match
        shapes = params["shapes"]
        on_cupy = run_on_cupy(cupy_device, lambda xp: Adam([xp.zeros(s) for s in shapes]))
        setup = on_cupy.ops - run_on_strict(lambda sx: Adam([sx.zeros(s) for s in shapes]))[2]
        assert on_cupy.uploads == 2
    assert run.ops == strict_ops + setup
    assert run.graphs == (path == "capture")

    # no host-to-device copy inside a step: as many with half the steps (the seam refuses one
    # while a graph records, and the run checked none happened in a captured step)
    assert again.uploads == run.uploads == 2 * ((name, path) == ("clip_adam", "capture"))

    reference = workload.run(path, np, params, workload.make_inputs(np, params))
    if run.uncomputed == 0:
        assert_same_values(run.result, reference)
    else:  # a fused or raw kernel ran: the recorder gives its outputs memory, not values
        assert name != "jacobi", "the Jacobi paths launch no kernel of gpuscalar's own"


# ---- the main job and the example ------------------------------------------------------------


@covers("cli demo")
@pytest.mark.parametrize("path", list(demo.PATHS))
def test_demo_paths_run_end_to_end_on_cupy_objects(cupy_device, path):
    """The main job's paths on CuPy objects: the syncs and launches the strict device counts
    (which tests/test_demo.py pins), and the float path's answer is NumPy's."""
    function = demo.PATHS[path]
    steps = 23
    run = run_on_cupy(cupy_device, lambda xp: function(xp, steps))
    (_, strict_best, strict_mean), strict_syncs, strict_ops = run_on_strict(
        lambda sx: function(sx, steps))
    # the gpuscalar path reads best once, and that packed read brings back every loss it was
    # built from; the mean is built from the same losses and Python numbers, so it is answered
    # on the host from known values (no second sync: tests/test_demo.py). The capture path's
    # best and total are device buffers rewritten in place: two reads.
    expected_syncs = {"float": steps, "gpuscalar": 1, "gpuscalar + capture": 2}[path]
    assert run.syncs == strict_syncs == expected_syncs
    assert run.ops == strict_ops
    assert run.uploads == 2  # the data, made by each path before its loop
    assert run.graphs == (path == "gpuscalar + capture")
    weights, best, mean = run.result
    if path == "float":
        assert run.uncomputed == 0
        reference = function(np, steps)
        np.testing.assert_array_equal(weights.get(), reference[0])
        assert (best, mean) == reference[1:] == (strict_best, strict_mean)
    else:  # the fused update and the fused scalar expressions are not computed
        assert run.uncomputed > 0


def test_the_example_runs_end_to_end_on_cupy_objects(cupy_device, monkeypatch, capsys):
    """examples/logistic_regression.py with CuPy as the default backend: every sync is a
    logged loss. Its first loss (zero weights) is computed by the device; Adam's kernel is not
    (the recorder gives it no values), so the loss cannot fall here."""
    xp, log, seam = cupy_device
    example = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples"
                                 / "logistic_regression.py"), run_name="example")
    monkeypatch.setattr(gs, "default_backend",
                        lambda: types.SimpleNamespace(name="cupy", xp=xp))
    run = run_on_cupy(cupy_device, lambda xp: example["main"]())
    out = capsys.readouterr().out
    losses = [line.split()[-1] for line in out.splitlines() if line.startswith("step")]
    assert "backend: cupy" in out
    assert f"syncs: {len(losses)}" in out and len(losses) == 20
    assert run.syncs == 20 and run.uploads == 2 + 2  # X and y; Adam's two tables
    assert losses[0] == "0.6931"  # log(2): zero weights predict 1/2 everywhere
    assert run.uncomputed > 0


@covers("linalg.cg", "linalg.cgs", "linalg.bicgstab", "linalg.gmres", "linalg.minres",
        "linalg.aslinearoperator", "linalg.LinearOperator")
@pytest.mark.parametrize("solver", ["cg", "cgs", "bicgstab", "gmres", "minres"])
def test_a_krylov_solve_is_one_recorded_loop_on_cupy_objects(cupy_device, solver):
    """Each gs.linalg solver on CuPy objects: the set-up, then one graph (the WHILE loop)
    launched once, with no sync and no host-to-device copy; its body takes gpuscalar's
    capture-safe products (gs.matmul on the handle made before recording), every launch
    checked against CuPy. (The recorder does not compute fused kernels, so the values are
    not checked here: tests/test_linalg.py checks them against SciPy.)"""
    xp, _, seam = cupy_device
    n = 8
    a = np.eye(n) * 4.0 + np.diag(np.ones(n - 1), 1) + np.diag(np.ones(n - 1), -1)
    A, b = xp.asarray(a), xp.asarray(np.ones(n))
    assert isinstance(gs.linalg.aslinearoperator(A), gs.linalg.LinearOperator)
    run = run_on_cupy(cupy_device,
                      lambda xp: getattr(gs.linalg, solver)(A, b, maxiter=5))
    x, info = run.result
    assert run.syncs == 0 and run.uploads == 0 and run.graphs >= 1
    assert any(launch.kind == "cublas" for graph in seam.graphs for launch in graph.launches
               ) or any(launch.kind == "cublas" for launch in seam.launches)
    assert isinstance(info, gs.GPUScalar) and x.shape == (n,)
