"""gs.while_loop and gs.cond on CuPy objects, through the recording seam and NVRTC.

Why: without a GPU the CUDA side cannot run, so these tests check what gpuscalar hands CUDA.
A loop is recorded as ONE conditional WHILE node (IF nodes for cond) whose body is the body's
launches followed by the condition kernel; `tests.cupy_seam.RecordingSeam` (with
``records_only``: recording executes nothing, as on a GPU) replays the graph, running a node's
body as often as the condition kernel's flag says. The fallback without conditional nodes and
the condition kernel's compilation (NVRTC, sm_90 cubin) are checked too. What only a GPU can
confirm: that the driver accepts the node and loads the kernel, and the timings.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import sync
from gpuscalar.devices import CUPY
from gpuscalar.devices.cupy import conditional as cuda_conditional
from gpuscalar.devices.cupy import control as cuda_control
from gpuscalar.devices.cupy.backend import CudaSeam

from . import nvrtc
from .cupy_fake import cupy_or_fail, fake_memory, host_view
from .cupy_seam import RecordingSeam, covers, recording
from .test_control import adds


@pytest.fixture
def dev() -> Iterator[RecordingSeam]:
    cupy_or_fail()
    with fake_memory() as memory, recording(memory) as seam:
        seam.records_only = True  # recording executes nothing, as on a GPU
        yield seam


def _constants(x, *values):
    """Device scalars beside ``x`` (made before a loop: a body may not upload)."""
    return [gs.asscalar(float(v), like=x) for v in values]


def _counting_loop(dev, start=0.0, stop=5, max_iter=100, counter=None):
    """``while x < stop: x += 1``; the predicate is a 0-d bool array (the recording seam
    computes CuPy ufuncs, and answers a fused kernel with zeros). ``counter`` (a list) gets
    the `count_syncs` counter active during the call of gs.while_loop alone."""
    x = dev.array(np.array(start))
    one, end = _constants(x, 1, stop)

    def body(x):
        x += one

    with sync.count_syncs() as inner:
        n = gs.while_loop(lambda x: x < end, body, x, max_iter=max_iter)
    if counter is not None:
        counter.append(inner)
    return x, n


def _condition_launches(launches):
    return [launch for launch in launches if launch.name == cuda_control.CONDITION_KERNEL]


@covers("gs.while_loop")
def test_a_loop_is_one_while_node_launched_once_without_a_sync(dev):
    counters: list = []
    x, n = _counting_loop(dev, counter=counters)
    assert counters[0].count == 0 and counters[0].device_ops == 1
    assert dev.graph_launches == 1 and len(dev.graphs) == 1
    assert not dev.uploads and not dev.reads
    (node,) = dev.conditionals
    assert node.kind == "while" and node.runs == 5  # the body ran as often as the flag said
    # the condition is set before the node and again at the end of its body, bounded by max_iter
    before = _condition_launches(dev.graphs[0].launches)
    assert len(before) == 1 and node.launches[-1].name == cuda_control.CONDITION_KERNEL
    for launch in (before[0], node.launches[-1]):
        handle, _, invert, _, limit = launch.args[2]
        assert int(handle) == node.handle and int(invert) == 0 and int(limit) == 100
    assert host_view(x).item() == 5.0 and n.item() == 5


def test_max_iter_bounds_the_recorded_loop(dev):
    x, n = _counting_loop(dev, max_iter=3)
    assert dev.conditionals[0].runs == 3
    assert host_view(x).item() == 3.0 and n.item() == 3


def test_a_false_predicate_skips_the_body(dev):
    x, n = _counting_loop(dev, start=9.0)
    assert dev.conditionals[0].runs == 0 and host_view(x).item() == 9.0 and n.item() == 0


def test_loops_nest_as_nodes_in_a_body(dev):
    i, j, total = (dev.array(np.array(0.0)) for _ in range(3))
    one, zero, three, four = _constants(i, 1, 0, 3, 4)

    def inner(j, total):
        total += one
        j += one

    def outer(i, j, total):
        j *= zero
        gs.while_loop(lambda j, t: j < four, inner, j, total, max_iter=10)
        i += one

    n = gs.while_loop(lambda i, j, t: i < three, outer, i, j, total, max_iter=10)
    outer_node, inner_node = dev.conditionals
    assert inner_node.runs == 12 and outer_node.runs == 3
    assert any(launch.kind == "conditional" for launch in outer_node.launches)
    assert host_view(total).item() == 12.0 and n.item() == 3


@covers("gs.cond")
@pytest.mark.parametrize("value", [1.0, -1.0])
def test_cond_records_two_if_nodes_and_runs_one(dev, value):
    x, out = dev.array(np.array(value)), dev.array(np.array(0.0))
    ten, zero = _constants(x, 10, 0)

    def then(o):
        o += ten

    def otherwise(o):
        o -= ten

    positive = x > zero  # (a comparison of its own: outside the counter)
    with sync.count_syncs() as counter:
        gs.cond(positive, then, otherwise, out)
    assert counter.count == 0 and counter.device_ops == 1 and dev.graph_launches == 1
    taken, other = dev.conditionals
    assert (taken.kind, other.kind) == ("if", "if")
    assert (taken.runs, other.runs) == ((1, 0) if value > 0 else (0, 1))
    assert host_view(out).item() == (10.0 if value > 0 else -10.0)


def test_a_loop_inside_a_captured_step_is_recorded_into_its_graph(dev):
    x = dev.array(np.array(0.0))
    one, zero, four = _constants(x, 1, 0, 4)

    def step(x):
        x *= zero
        gs.while_loop(lambda x: x < four, adds(one), x, max_iter=10)

    captured = gs.capture(step, x, warmup=0)
    assert len(dev.graphs) == 1 and dev.graph_launches == 0  # no graph of its own
    captured()
    captured()
    assert dev.graph_launches == 2 and host_view(x).item() == 4.0
    assert dev.conditionals[-1].runs == 2 * 4  # four iterations per replay
    captured.release()


def test_a_sync_in_a_recorded_body_is_a_sync_error(dev):
    x = dev.array(np.array(0.0))
    (four,) = _constants(x, 4)
    with pytest.raises(gs.SyncError, match="test_control_cuda.py"):
        gs.while_loop(lambda x: x < four, lambda x: float(gs.GPUScalar(x)) and None, x,
                      max_iter=10)
    assert not dev.current_stream().is_capturing()  # the recording was ended


# ---- functional state: the copies are recorded in the body -----------------------------------


@covers("gs.while_loop")
def test_a_body_returning_the_new_state_has_its_copies_recorded_in_the_node(dev):
    x = dev.array(np.array(0.0))
    one, end = _constants(x, 1, 5)
    with sync.count_syncs() as counter:
        n = gs.while_loop(lambda x: x < end, lambda x: x + one, x, max_iter=100)
    assert counter.count == 0 and counter.device_ops == 1 and dev.graph_launches == 1
    assert not dev.uploads and not dev.reads
    (node,) = dev.conditionals
    names = [launch.name for launch in node.launches]
    assert node.runs == 5 and "copyto" in names
    assert names.index("copyto") < names.index(cuda_control.CONDITION_KERNEL)
    assert host_view(x).item() == 5.0 and n.item() == 5


def test_a_swap_is_copied_aside_first_in_the_recorded_body(dev):
    a, b = dev.array(np.zeros(3)), dev.array(np.ones(3))
    i = dev.array(np.array(0.0))
    one, three = _constants(i, 1, 3)
    n = gs.while_loop(lambda a, b, i: i < three, lambda a, b, i: (b, a, i + one), a, b, i,
                      max_iter=10)
    (node,) = dev.conditionals
    names = [launch.name for launch in node.launches]
    assert names.count("copy") == 2 and names.count("copyto") == 3
    assert host_view(a).tolist() == [1.0] * 3 and host_view(b).tolist() == [0.0] * 3
    assert n.item() == 3


def test_a_wrong_result_form_is_refused_when_recorded_even_if_the_loop_never_runs(dev):
    x = dev.array(np.array(9.0))
    (end,) = _constants(x, 5)
    with pytest.raises(TypeError, match="new state item 0 is a float"):
        gs.while_loop(lambda x: x < end, lambda x: 1.0, x, max_iter=10)
    assert not dev.current_stream().is_capturing() and host_view(x).item() == 9.0


# ---- without conditional nodes ------------------------------------------------------------------


@pytest.fixture
def old_driver(dev, monkeypatch) -> RecordingSeam:
    dev.conditional_reason = "the CUDA driver supports CUDA 12.2, < 12.3"
    monkeypatch.setattr(cuda_control, "_warned", False)
    return dev


def test_the_fallback_is_a_host_loop_with_a_counted_sync_per_check_and_one_warning(old_driver):
    counters: list = []
    with pytest.warns(RuntimeWarning, match=r"unavailable \(the CUDA driver supports CUDA 12.2"):
        x, n = _counting_loop(old_driver, counter=counters)
    counter = counters[0]
    assert counter.count == 6 and old_driver.graph_launches == 0  # 5 true checks, 1 false
    assert all("fallback" in record.reason for record in counter.records)
    assert host_view(x).item() == 5.0 and n.item() == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: not again
        _counting_loop(old_driver)


def test_the_fallback_runs_cond_with_one_sync(old_driver):
    out = old_driver.array(np.array(0.0))
    ten, zero = _constants(out, 10, 0)
    with pytest.warns(RuntimeWarning), sync.count_syncs() as counter:
        gs.cond(out == zero, adds(ten), None, out)
    assert counter.count == 1 and host_view(out).item() == 10.0


def test_the_fallback_inside_a_capture_is_an_error_naming_the_reason(old_driver):
    x = old_driver.array(np.array(0.0))
    (four,) = _constants(x, 4)

    def step(x):
        gs.while_loop(lambda x: x < four, lambda x: None, x, max_iter=10)

    with pytest.raises(RuntimeError, match="needs conditional graph nodes.*CUDA 12.2"):
        gs.capture(step, x, warmup=0)


def test_the_fallback_checks_a_body_that_never_runs_by_recording_it_unlaunched(old_driver):
    """As a GPU records the body of a loop that runs zero times: a sync there is a SyncError, an
    upload is refused, the result's form is checked; the recording is discarded (no graph
    launched or kept) and changes nothing (`records_only`: a recording executes nothing)."""
    x = old_driver.array(np.array(9.0))
    one, end = _constants(x, 1, 5)
    with pytest.warns(RuntimeWarning):
        with pytest.raises(gs.SyncError, match="test_control_cuda.py"):
            gs.while_loop(lambda x: x < end, lambda x: float(gs.GPUScalar(x)) and None, x,
                          max_iter=10)
    assert not old_driver.current_stream().is_capturing()
    with pytest.raises(TypeError, match="a tuple of 2 items for 1 state item"):
        gs.while_loop(lambda x: x < end, lambda x: (x, x), x, max_iter=10)

    def uploads(x):
        x += CUPY.call(CUPY.xp.asarray, np.ones(()))  # a host-to-device copy

    with pytest.raises(RuntimeError, match="H2D"):
        gs.while_loop(lambda x: x < end, uploads, x, max_iter=10)
    recorded = old_driver.count()

    def adds_one(x):
        x += one

    n = gs.while_loop(lambda x: x < end, adds_one, x, max_iter=10)
    assert old_driver.count() > recorded  # the body was recorded (its add) ...
    assert host_view(x).item() == 9.0 and n.item() == 0  # ... and nothing ran
    assert old_driver.graph_launches == 0 and not old_driver.graphs


def test_the_fallback_checks_the_branch_not_taken_and_nested_loops_by_recording(old_driver):
    out = old_driver.array(np.array(0.0))
    ten, zero = _constants(out, 10, 0)
    taken = out == zero
    with pytest.warns(RuntimeWarning), pytest.raises(gs.SyncError):
        gs.cond(taken, adds(ten), lambda o: float(gs.GPUScalar(o)) and None, out)
    assert host_view(out).item() == 0.0  # checked before the branch taken runs, as recorded

    def writes(o):
        o += ten
        gs.while_loop(lambda o: o < ten, adds(ten), o, max_iter=5)  # nested: recorded too

    gs.cond(taken, adds(ten), writes, out)
    assert host_view(out).item() == 10.0  # the branch taken ran; the other changed nothing
    assert old_driver.graph_launches == 0 and not old_driver.graphs


def test_the_real_seam_names_why_conditional_nodes_are_unavailable(monkeypatch):
    cupy = cupy_or_fail()
    seam = CudaSeam()
    monkeypatch.setattr(cupy.cuda.runtime, "driverGetVersion", lambda: 12020)
    assert seam.conditional_nodes_unavailable() == "the CUDA driver supports CUDA 12.2, < 12.3"
    monkeypatch.setattr(cupy.cuda.runtime, "driverGetVersion", lambda: 12090)
    try:
        import cuda.bindings.runtime  # noqa: F401
    except ImportError:
        assert "cuda-bindings is not installed" in seam.conditional_nodes_unavailable()
    else:
        assert seam.conditional_nodes_unavailable() is None


# ---- the condition kernel -----------------------------------------------------------------------


def test_the_condition_kernel_compiles_to_an_sm90_cubin():
    module = nvrtc.load()
    program = module.createProgram(cuda_control.CONDITION_SOURCE, "condition.cu", [], [])
    try:
        module.compileProgram(program, ["--gpu-architecture=sm_90"])  # no -rdc
        cubin = module.getCUBIN(program)
    finally:
        module.destroyProgram(program)
    assert cuda_control.CONDITION_KERNEL.encode() in cubin
    assert b"cudaGraphSetConditional" in cubin


def test_the_runtime_calls_reach_the_driver_with_the_bindings_signatures(monkeypatch):
    """Each cuda-bindings call gpuscalar makes is accepted by the installed bindings (argument
    count and types for its major version) and gets as far as the driver, which, without a GPU,
    answers with an error that names the call."""
    pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is not installed")
    if gs.gpu_available():  # a made-up stream handle reaches a real driver, which crashes on it
        pytest.skip("a CUDA device is present: the loop tests make these calls for real there")
    from cuda.bindings import runtime

    calls = {
        "cudaStreamGetCaptureInfo": lambda: cuda_conditional.conditional_handle(0x10),
        "cudaStreamBeginCaptureToGraph": lambda: cuda_conditional.begin_capture_into(
            0x10, runtime.cudaGraph_t()),
        "cudaStreamEndCapture": lambda: cuda_conditional.end_capture_into(0x10),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=f"{name} failed: <cudaError_t"):
            call()
    # past the capture query (which fails first without a driver): the node itself
    monkeypatch.setattr(cuda_conditional, "_capture_graph", lambda ptr: (runtime.cudaGraph_t(), []))
    for kind in ("while", "if"):
        with pytest.raises(RuntimeError, match="cudaGraphAddNode failed: <cudaError_t"):
            cuda_conditional.add_conditional_node(0x10, 7, kind)


def test_a_loop_graph_is_released_once_the_device_is_done_without_waiting(dev, monkeypatch):
    monkeypatch.setattr(cuda_control, "_launched", [])
    _counting_loop(dev)
    assert len(cuda_control._launched) == 1
    waits = dev.stream_waits  # (the first call made its streams and cuBLAS constants)
    _counting_loop(dev)  # the first graph's event is done: released before recording again
    assert len(cuda_control._launched) == 1 and cuda_control._launched[0][1] is dev.graphs[-1]
    assert dev.stream_waits == waits and dev.device_syncs == 0  # an event query, not a wait


@covers("gs.matmul")
def test_matmul_in_a_loop_body_finds_its_cublas_handle_made_before_recording(dev):
    """A body is recorded on a stream of its own during the capture, when no cuBLAS handle may
    be made (its workspace is an allocation): the body streams and their handles are made
    before the first recording (the recording seam refuses cublasCreate on a capturing
    stream). Fails if the body stream is first made, unprepared, inside the recording."""
    a = dev.array(np.eye(4))
    x = dev.array(np.ones(4))
    y = dev.array(np.zeros(4))
    i = dev.array(np.array(0.0))
    one, three = _constants(i, 1, 3)

    def body(i, x, y):
        gs.matmul(a, x, out=y)
        i += one

    n = gs.while_loop(lambda i, x, y: i < three, body, i, x, y, max_iter=10)
    products = [launch for launch in dev.launches if launch.kind == "cublas"]
    assert len(products) == 1 and "gemv" in products[0].name  # recorded once, in the body
    assert isinstance(n, gs.GPUScalar)


def test_cuda_13_conditional_nodes_name_their_execution_context(monkeypatch):
    """cuda-bindings 13.x: ``cudaConditionalNodeParams.ctx`` is the current device's execution
    context (left empty, the node has none). Checked with a stand-in for the 13.x runtime."""
    from types import SimpleNamespace

    success = object()
    added: list[object] = []

    def call(*values):
        return lambda *args: (success, *values)

    def add_node(graph, dependencies, edge_data, count, params):
        added.append(params.conditional.ctx)
        return success, "node"

    runtime = SimpleNamespace(
        cudaError_t=SimpleNamespace(cudaSuccess=success),
        cudaGraphNodeParams=lambda: SimpleNamespace(
            type=None, conditional=SimpleNamespace(handle=None, type=None, size=None, ctx=None,
                                                   phGraph_out=["body graph"])),
        cudaGraphNodeType=SimpleNamespace(cudaGraphNodeTypeConditional="conditional"),
        cudaGraphConditionalNodeType=SimpleNamespace(cudaGraphCondTypeWhile="while",
                                                     cudaGraphCondTypeIf="if"),
        cudaGetDevice=call(3), cudaDeviceGetExecutionCtx=lambda device: (success, f"ctx{device}"),
        cudaGraphAddNode=add_node, cudaStreamUpdateCaptureDependencies=call(),
        cudaStreamUpdateCaptureDependenciesFlags=SimpleNamespace(
            cudaStreamSetCaptureDependencies="set"),
    )
    monkeypatch.setattr(cuda_conditional, "_runtime", lambda: (runtime, 13))
    monkeypatch.setattr(cuda_conditional, "_capture_graph", lambda ptr: ("graph", []))
    for kind in ("while", "if"):
        assert cuda_conditional.add_conditional_node(0x10, 7, kind) == "body graph"
    assert added == ["ctx3", "ctx3"]



def test_capture_inside_a_recorded_body_names_the_body_not_the_capturing_stream(dev):
    """The body's stream is capturing while it runs (into the loop's body graph): gs.capture
    there says why it cannot record, before it looks at the stream."""
    x = dev.array(np.array(0.0))
    one, three = _constants(x, 1, 3)

    def body(x):
        gs.capture(lambda y: None, x)  # on the device of x (a CuPy array), as in a real body
        x += one

    with pytest.raises(RuntimeError, match="cannot capture inside a gs.while_loop"):
        gs.while_loop(lambda x: x < three, body, x, max_iter=3)
