"""gs.capture: the API, the guard during warm-up and capture, replay equals eager, bad input."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import ledger, optim, strict, sync
from gpuscalar.capture import _capturing
from gpuscalar.devices import CUPY
from gpuscalar.devices.cupy import graphs, linalg

from .helpers import backend_name, host


def _regression(xp, rng, n=64, d=8):
    x = xp.asarray(rng.standard_normal((n, d)))
    y = xp.asarray(rng.standard_normal(n))
    return x, y


def _train_step(x, y, w, total, lr=0.1):
    """One sync-free least-squares step: the loss accumulates in a 0-d device array."""
    err = gs.matmul(x, w) - y
    total += gs.mean(err * err)
    w -= (2.0 * lr / x.shape[0]) * gs.matmul(x.T, err)


def test_replay_equals_eager_over_many_calls(xp, rng):
    x, y = _regression(xp, rng)
    w_eager, total_eager = xp.zeros(x.shape[1]), xp.zeros(())
    w, total = xp.zeros(x.shape[1]), xp.zeros(())
    step = gs.capture(_train_step, x, y, w, total, warmup=2, steps=3)
    for _ in range(2):  # the warm-up ran the step twice, as eager code would
        _train_step(x, y, w_eager, total_eager)
    for _ in range(20):
        step()
        for _ in range(3):
            _train_step(x, y, w_eager, total_eager)
    assert host(w).tobytes() == host(w_eager).tobytes()
    assert host(total).item() == host(total_eager).item()


def test_a_replay_is_one_device_op_and_no_sync(xp, rng):
    x, y = _regression(xp, rng)
    w, total = xp.zeros(x.shape[1]), xp.zeros(())
    step = gs.capture(_train_step, x, y, w, total, warmup=1, steps=10)
    with gs.count_syncs() as counter:
        step()
        step()
    assert counter.device_ops == 2 and counter.count == 0


def test_recording_executes_nothing_warmup_runs_fn(xp):
    calls = []

    def fn(a):
        calls.append(1)
        a += 1.0

    a = xp.zeros(3)
    step = gs.capture(fn, a, warmup=3, steps=2)
    # fn ran warmup times; on a GPU it also ran (in Python) steps times while being recorded,
    # but the device executed only the warm-up
    assert host(a).tolist() == [3.0, 3.0, 3.0]
    step()
    assert host(a).tolist() == [5.0, 5.0, 5.0]
    if backend_name(xp) != "cupy":
        assert len(calls) == 3 + 2


def test_outputs_are_the_same_buffers_and_fresh_scalars(xp):
    a = xp.zeros(2)

    def fn(a):
        a += 1.0
        return a, gs.sum(a) * 2

    step = gs.capture(fn, a, warmup=0)
    first_array, first_scalar = step()
    value = float(first_scalar)  # read (and cached) after the first replay
    second_array, second_scalar = step()
    assert float(second_scalar) == value + 4.0  # a new value, not the cached one
    assert second_array is first_array  # the graph's static buffer, on every device
    assert host(second_array).tolist() == [2.0, 2.0]


def test_new_arrays_a_step_returns_are_the_same_buffers_at_every_replay(xp):
    """On a GPU a replay rewrites the buffers the recording returned; on NumPy and the strict
    device the first replay's outputs are those buffers and later ones are copied into them
    (inside the replay's one device op)."""
    a = xp.zeros(2)

    def fn(a):
        a += 1.0
        return {"double": a * 2.0, "pair": (a + 1.0, gs.sum(a))}

    step = gs.capture(fn, a, warmup=0)
    first = step()
    with gs.count_syncs() as counter:
        second = step()
    assert counter.device_ops == 1 and counter.count == 0
    assert second["double"] is first["double"] and second["pair"][0] is first["pair"][0]
    assert host(first["double"]).tolist() == [4.0, 4.0]  # the first buffers: the new values
    assert host(first["pair"][0]).tolist() == [3.0, 3.0]
    assert second["pair"][1] is not first["pair"][1]  # a fresh GPUScalar over the buffer
    assert float(second["pair"][1]) == 4.0


def test_python_values_a_step_returns_are_frozen_as_recorded(xp):
    """A Python number a step returns is the one it returned when recorded (on the CPU: at the
    first replay), as a graph freezes it; a later replay of another form is an error."""
    a, calls = xp.zeros(1), []

    def fn(a):
        calls.append(1)
        a += 1.0
        return a, len(calls)

    step = gs.capture(fn, a, warmup=1)
    first = step()[1]
    assert step()[1] == first and host(a).tolist() == [3.0]

    replays = []

    def changing(a):
        replays.append(1)
        return (a,) if len(replays) == 1 else (a, a)

    changing_step = gs.capture(changing, a, warmup=0)
    if backend_name(xp) == "cupy":
        pytest.skip("on a GPU the outputs are the recorded ones whatever fn does")
    changing_step()
    with pytest.raises(TypeError, match="the output of this replay is a tuple of 2 items, "
                                        "unlike the first replay's"):
        changing_step()


def test_a_numpy_scalar_result_is_the_value_computed_at_each_replay():
    """NumPy's 0-d arithmetic gives NumPy scalars, values rather than buffers: each replay's."""
    a = np.zeros(2)

    def fn(a):
        a += 1.0
        return a.sum()

    step = gs.capture(fn, a, warmup=0)
    assert (step(), step()) == (2.0, 4.0)


def test_an_output_buffer_whose_shape_changes_is_named(xp):
    if backend_name(xp) == "cupy":
        pytest.skip("on a GPU the outputs are the recorded ones whatever fn does")
    a, sizes = xp.zeros(4), iter([2, 3])
    step = gs.capture(lambda: [a[:next(sizes)] * 1.0], warmup=0)
    step()
    with pytest.raises(TypeError, match=r"the output\[0\] of this replay is a \w+ of shape "
                                        r"\(3,\)"):
        step()


def test_decorator_forms(xp):
    a = xp.zeros(1)

    @gs.capture
    def plain():
        a[...] += 1.0

    @gs.capture(warmup=0, steps=4)
    def configured():
        a[...] += 10.0

    assert isinstance(plain, gs.CapturedStep) and isinstance(configured, gs.CapturedStep)
    assert (plain.warmup, plain.steps, configured.warmup, configured.steps) == (2, 1, 0, 4)
    plain()
    configured()
    assert host(a).tolist() == [2.0 + 1.0 + 40.0]


@pytest.mark.parametrize("read", [float, bool, lambda s: f"{s:.2f}", lambda s: s.item()])
def test_a_gpuscalar_read_in_the_step_raises_from_capture_naming_the_line(xp, read):
    a = xp.ones(3)

    def leaky(a):
        loss = gs.sum(a)
        read(loss)  # the sync

    with pytest.raises(gs.SyncError, match=r"at .*test_capture.py:\d+ in (leaky|<lambda>)\(\)"):
        gs.capture(leaky, a, warmup=1)
    _program_still_usable(xp)


def test_a_device_read_in_the_step_raises_on_the_strict_device():
    a = strict.xp.ones(3)

    def leaky(a):
        if float(a.sum()) > 0:  # the array library's own read: CuPy's would raise the same way
            a *= 2

    with pytest.raises(gs.SyncError, match=r"\(cupy\) at .*test_capture.py"):
        gs.capture(leaky, a, warmup=1)
    assert host(a).tolist() == [1.0, 1.0, 1.0]  # the read raised before anything changed
    _program_still_usable(strict.xp)


def test_other_errors_propagate_and_leave_no_guard_behind(xp):
    def broken(a):
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        gs.capture(broken, xp.zeros(1), warmup=1)
    assert not _capturing.get(False)
    _program_still_usable(xp)


def _program_still_usable(xp):
    """After a failed capture: no guard or counter left, reads work, a new capture works."""
    assert sync._guard_mode.get() == "allow" and sync._active_counters.get() == ()
    assert float(gs.sum(xp.ones(2))) == 2.0
    b = xp.zeros(1)
    gs.capture(lambda: b.__iadd__(1.0), warmup=1)()
    assert host(b).tolist() == [2.0]


def test_captures_cannot_nest(xp):
    inner_errors = []

    def outer(a):
        try:
            gs.capture(lambda: None, warmup=1)
        except RuntimeError as error:
            inner_errors.append(str(error))
        a += 1

    gs.capture(outer, xp.zeros(1), warmup=1)
    assert inner_errors and "cannot nest" in inner_errors[0]


def test_a_pending_scalar_argument_and_the_optimizer_step_are_captured(xp, rng):
    """An optimizer step with a learning-rate schedule on its live step counter: the schedule
    is recomputed on the device at every replay (a Python number would be frozen)."""
    p = xp.asarray(rng.standard_normal(5))
    g = xp.asarray(rng.standard_normal(5))
    opt = optim.SGD([p], lr=0.0)

    def train():
        opt.lr = 0.5 * gs.minimum(1.0, (opt.step_count + 1) / 4)  # a device schedule
        opt.step([g])

    before = host(p).copy()
    step = gs.capture(train, warmup=1)
    for _ in range(5):
        step()
    assert int(opt.step_count) == 6
    rates = [0.5 * min(1.0, t / 4) for t in range(1, 7)]
    np.testing.assert_allclose(host(p), before - sum(rates) * host(g), rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({"fn": 3}, TypeError, "fn must be callable, got int"),
     ({"steps": 0}, ValueError, "steps must be >= 1"),
     ({"steps": 1.5}, TypeError, "steps must be an int"),
     ({"warmup": -1}, ValueError, "warmup must be >= 0"),
     ({"args": ("text",)}, TypeError, "argument 0 is a str"),
     ({"args": ([1.0],)}, TypeError, "argument 0 is a list")],
)
def test_bad_input(kwargs, error, match):
    fn = kwargs.pop("fn", lambda *args: None)
    args = kwargs.pop("args", ())
    with pytest.raises(error, match=match):
        gs.capture(fn, *args, **kwargs)


@pytest.mark.parametrize(
    ("count", "error", "match"),
    [(gs.asscalar(3), TypeError, "warmup must be an int, got GPUScalar"),
     (np.int64(-2), ValueError, r"warmup must be >= 0, got np.int64\(-2\)")],
)
def test_a_bad_count_is_named_without_a_sync(count, error, match):
    """Counts are named by type, or shown when they are host numbers: formatting a device
    value would read it (a SyncError under the guard, in place of this error)."""
    with gs.sync_guard("error"), pytest.raises(error, match=match):
        gs.capture(lambda: None, warmup=count)


def test_arguments_from_different_backends_or_devices_are_refused():
    with pytest.raises(TypeError, match="argument 1 is a strict value but an earlier one is "
                                        "numpy"):
        gs.capture(lambda a, b: None, np.zeros(1), strict.xp.zeros(1))
    with pytest.raises(ValueError, match="argument 1 is on device 1"):
        gs.capture(lambda a, b: None, strict.xp.zeros(1), strict.xp.zeros(1, device=1))


def test_decorator_form_takes_keywords_only():
    with pytest.raises(TypeError, match="keyword arguments only"):
        gs.capture(None, 3)


def test_release(xp):
    a = xp.zeros(1)
    step = gs.capture(lambda: a.__iadd__(1.0), warmup=0)
    step.release()
    assert step.released and "released" in repr(step)
    with pytest.raises(RuntimeError, match="released"):
        step()


def test_release_drops_the_function_and_its_arguments():
    """A released step holds neither fn nor args: what they reference (arrays, closures) can be
    freed although the step object is still alive (the release path is the same on every
    backend; NumPy arrays can be weakly referenced)."""
    import gc
    import weakref

    state = np.zeros(3)

    def step_fn(a):
        a += 1.0

    arg_ref, fn_ref = weakref.ref(state), weakref.ref(step_fn)
    step = gs.capture(step_fn, state, warmup=0)
    del state, step_fn
    gc.collect()
    assert arg_ref() is not None and fn_ref() is not None  # held by the ready step
    step.release()
    gc.collect()
    assert arg_ref() is None and fn_ref() is None
    assert "step_fn" in repr(step) and "released" in repr(step)


def test_frozen_python_numbers_are_baked_at_capture(xp):
    """On a GPU the Python number is baked into the graph; the README's rule. On the CPU the
    step is re-run, so the test pins what the documented fix gives on every backend."""
    lr = gs.asscalar(1.0, like=xp.zeros(1))
    buffer = xp.zeros(1)
    lr_store = xp.full((), 1.0)  # a device value updated in place: seen by every replay

    def fn():
        buffer[...] += lr_store

    step = gs.capture(fn, warmup=0)
    step()
    lr_store[...] = 3.0
    step()
    assert host(buffer).tolist() == [4.0] and float(lr) == 1.0


def test_cupys_own_matmul_in_a_capture_points_at_gs_matmul():
    if not gs.gpu_available():
        pytest.skip("CuPy needs a CUDA device, and this machine has none")
    import cupy

    x, w = cupy.ones((4, 3)), cupy.ones(3)
    with pytest.raises(NotImplementedError, match=r"gs\.matmul"):
        gs.capture(lambda: x @ w, warmup=0)
    _program_still_usable(cupy)


# ---- where a step without array arguments runs --------------------------------------------------


def test_a_step_without_arguments_runs_where_the_arrays_it_closes_over_live():
    a = strict.xp.zeros(2, device=1)
    host_copy = np.zeros(2)  # a host array beside device arrays does not decide

    def step():
        a[...] += 1.0
        host_copy.fill(0.0)

    captured = gs.capture(step, warmup=0)
    assert (captured.backend.name, captured.device) == ("strict", 1)
    with gs.count_syncs() as counter:
        captured()
    assert counter.device_ops == 1  # the strict device counts the replay as one op
    assert (gs.capture(lambda: host_copy.fill(1.0), warmup=0).backend.name) == "numpy"


def test_arguments_decide_before_the_closure():
    a = strict.xp.zeros(1)
    captured = gs.capture(lambda b: a.__iadd__(1.0), np.zeros(1), warmup=0)
    assert captured.backend.name == "numpy"


def test_a_closure_over_two_devices_is_refused():
    a, b = strict.xp.zeros(1), strict.xp.zeros(1, device=1)

    def step():
        a[...] += b

    with pytest.raises(TypeError, match=r"step uses arrays on different backends or devices "
                                        r"\('a' \(strict, device 0\), 'b' \(strict, device 1\)\)"):
        gs.capture(step)


def test_a_callable_object_without_arrays_runs_on_the_default_backend():
    calls = []
    captured = gs.capture(type("Step", (), {"__call__": lambda self: calls.append(1)})(),
                          warmup=1)
    assert captured.backend is gs.default_backend()
    assert len(calls) == (2 if captured.backend.name == "cupy" else 1)  # (+1: the recording)


def test_a_captured_step_may_replay_another_one(xp):
    a = xp.zeros(1)
    inner = gs.capture(lambda: a.__iadd__(1.0), warmup=0)
    outer = gs.capture(lambda: (inner(), a.__imul__(2.0)), warmup=1)  # (0 + 1) * 2
    outer()
    assert host(a).tolist() == [6.0]  # (2 + 1) * 2


def test_with_no_warmup_a_sync_raises_at_the_first_call_on_the_cpu(xp):
    if backend_name(xp) == "cupy":
        pytest.skip("on a GPU the recording raises (covered by the warm-up tests)")
    a = xp.ones(2)
    step = gs.capture(lambda: float(gs.sum(a)), warmup=0)  # nothing has run yet
    with pytest.raises(gs.SyncError):
        step()
    _program_still_usable(xp)


# ---- the capture's error and release paths (without a GPU: a stand-in stream) -------------------


class _StandInStream:
    """The calls `graphs._record` makes on a CuPy stream; ending the capture goes to the real
    CUDA runtime, which fails on a machine without a GPU: the cleanup failure to hide."""

    ptr = 12345

    def begin_capture(self):
        self.capturing = True

    def end_capture(self):
        self.capturing = False
        return "graph"


def _stream_for_record():
    pytest.importorskip("cupy")
    if gs.gpu_available():
        import cupy

        return cupy.cuda.Stream(non_blocking=True)
    return _StandInStream()


def test_an_error_while_recording_is_raised_not_the_cleanup_error():
    stream = _stream_for_record()

    def body():
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug") as raised:
        graphs._record(stream, body)
    if isinstance(stream, _StandInStream):  # the runtime refused to end it: noted, not raised
        assert any("cleanup also failed" in note for note in getattr(raised.value,
                                                                      "__notes__", [""]))
    else:
        assert not stream.is_capturing()


def test_cupys_cublas_refusal_while_recording_points_at_gs_matmul():
    stream = _stream_for_record()
    refusal = NotImplementedError("calling cuBLAS API during stream capture is currently "
                                  "unsupported")

    def body():
        raise refusal

    with pytest.raises(NotImplementedError, match=r"use gs\.matmul\(a, b, out=\.\.\.\)") as raised:
        graphs._record(stream, body)
    assert raised.value.__cause__ is refusal


def test_a_release_during_a_recording_waits_until_it_ends():
    closed = []

    class Resources:
        def close(self):
            closed.append(ledger.recordings_under_way())

    with graphs._recording():
        graphs._release(Resources())  # e.g. a step garbage-collected inside another's fn
        assert closed == []
    assert closed == [0]
    graphs._release(Resources())
    assert closed == [0, 0]


# ---- what CuPy refuses while capturing, refused in the step's body on the strict device ----------


def test_a_host_to_device_copy_in_a_step_is_refused_saying_what_to_do():
    a = strict.xp.zeros(3)
    batch = np.ones(3)

    def step():
        a[...] += strict.xp.asarray(batch)  # an upload inside the step: CuPy refuses it

    captured = gs.capture(step, warmup=1)  # the warm-up is eager: uploads are allowed there
    assert host(a).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(RuntimeError, match=r"H2D transfers are disallowed: a captured step "
                                           r"cannot copy host data .* before capturing") as raised:
        captured()
    assert str(raised.value.__cause__) == strict.H2D_CAPTURE_MESSAGE
    assert host(a).tolist() == [1.0, 1.0, 1.0]
    _program_still_usable(strict.xp)


def test_cupys_own_product_in_a_step_is_refused_pointing_at_gs_matmul():
    x, w = strict.xp.ones((4, 3)), strict.xp.ones(3)
    captured = gs.capture(lambda: x @ w, warmup=1)  # eager in the warm-up, as on a GPU
    with pytest.raises(NotImplementedError, match=r"cuBLAS API during stream capture .* use "
                                                  r"gs\.matmul\(a, b, out=\.\.\.\)"):
        captured()
    out = strict.xp.zeros(4)
    fixed = gs.capture(lambda: gs.matmul(x, w, out=out), warmup=0)
    fixed()
    assert host(out).tolist() == [3.0] * 4


# ---- a step called while another one is recorded runs inline -------------------------------------


@pytest.mark.needs_cupy  # the step runs on the CuPy backend
def test_a_step_called_while_a_graph_is_recorded_runs_inline_instead_of_launching(monkeypatch):
    """On CuPy (stood in for: a fake graph, the stream's capture state decided by the test): a
    replay launches the graph, but inside another recording (the current stream captures) the
    step's fn runs its steps inline, so its kernels are recorded into the outer graph."""
    a = np.zeros(1)
    bodies = []

    def fn(a):
        bodies.append(sync.in_graph_body())
        a[...] += 1.0

    inner = gs.capture(fn, a, warmup=0, steps=2)
    launches = []
    monkeypatch.setattr(inner, "backend", CUPY)
    recorded = object.__new__(graphs._CudaRecording)  # a recorded graph, stood in for
    recorded.resources = types.SimpleNamespace(graph=types.SimpleNamespace(
        launch=lambda: launches.append(1)))
    recorded.result = None
    monkeypatch.setattr(inner, "_recording", recorded)
    monkeypatch.setattr(CUPY, "device_context", lambda device: contextlib.nullcontext())
    capturing = [False]
    monkeypatch.setattr(graphs, "_stream_capturing", lambda device: capturing[0])
    inner()  # a plain replay: one graph launch, no Python step
    assert launches == [1] and bodies == [] and a.tolist() == [0.0]
    capturing[0] = True
    with gs.count_syncs() as counter:
        inner()  # inside a recording: two steps run (recorded), no launch
    assert launches == [1] and bodies == [True, True] and a.tolist() == [2.0]
    assert counter.device_ops == 1


# (The README's capture example runs, on NumPy and the strict device, against plain SGD by hand:
# tests/test_readme.py.)


# ---- what a recording prepares before it starts (CuPy; here with stand-ins) ----------------------


def test_prepare_makes_the_constants_and_when_asked_the_handle(monkeypatch):
    made, handles = [], []
    monkeypatch.setattr(linalg, "_device_constant",
                        lambda backend, device, dtype, value: made.append((dtype.name, value)))
    monkeypatch.setattr(linalg, "_handle",
                        lambda backend, device, stream: handles.append((device, stream)))
    backend = types.SimpleNamespace(device_context=lambda device: contextlib.nullcontext())
    linalg.prepare(backend, 0, "stream", handle=False)
    # alpha = 1 and beta = 0 of every dtype gs.matmul multiplies (float32/float64, and the
    # complex ones where it multiplies them too), and no handle
    assert {("float32", 0.0), ("float32", 1.0), ("float64", 0.0), ("float64", 1.0)} <= set(made)
    assert {name for name, _ in made} <= {"float32", "float64", "complex64", "complex128"}
    assert sorted(made) == sorted({(name, value) for name, _ in made for value in (0.0, 1.0)})
    assert handles == []
    linalg.prepare(backend, 0, "stream", handle=True)
    assert handles == [(0, "stream")]

    def no_library(backend, device, stream):
        raise linalg.cublas.CublasError("libcublas was not found")

    monkeypatch.setattr(linalg, "_handle", no_library)
    linalg.prepare(backend, 0, "stream", handle=True)  # a step without products still records


# ---- a returned pending scalar (issue 15 item 8; CuPy through the recording seam) ----------------


def test_warm_up_evaluates_a_returned_pending_scalar_so_recording_compiles_nothing(monkeypatch):
    """A step returning a pending GPUScalar: its fused kernel is built while warming up, so
    the recording (where a compile would stall the capture) builds none. Each kernel build is
    observed with the number of recordings under way at that moment."""
    from gpuscalar.devices.cupy import fusion  # noqa: PLC0415

    from .cupy_fake import fake_memory  # noqa: PLC0415 - imports CuPy
    from .cupy_seam import recording  # noqa: PLC0415

    builds = []
    build = fusion._build_kernel

    def observed_build(make_spec, args):
        builds.append(ledger.recordings_under_way())
        return build(make_spec, args)

    monkeypatch.setattr(fusion, "_build_kernel", observed_build)
    monkeypatch.setattr(fusion, "_KERNELS", fusion.BoundedCache())  # every kernel built anew
    with fake_memory() as memory, recording(memory) as seam:
        x = seam.array(np.arange(4.0))

        def step(x):
            return gs.sum(x) * 2.0 + 1.0  # pending: a fused kernel evaluates it

        captured = gs.capture(step, x, warmup=2)
        result = captured._recording.result
        assert isinstance(result, gs.GPUScalar) and result.is_materialized
        assert len(seam.graphs) == 1
    assert builds and builds == [0] * len(builds)  # built while warming up, none while recording


def test_a_pending_scalar_made_outside_a_step_is_a_recipe_never_cached_in_it(xp):
    """As in a gs.while_loop body: a pending GPUScalar made outside the step and used inside is
    evaluated where it is used, from its inputs at each replay (what a recorded graph does),
    and no evaluation inside caches a value on it: it stays pending after the step. Its input
    is a value (``GPUScalar(counter)`` copies): later writes to ``counter`` never change it."""
    counter = xp.zeros(())
    rate = gs.GPUScalar(counter) * 2.0 + 1.0  # pending, made outside, read inside
    out, value = xp.zeros(3), xp.zeros(())

    def step(out, value):
        value[...] = rate.array  # the scalar evaluated into a 0-d array (one launch)
        out += value

    captured = gs.capture(step, out, value, warmup=2)
    assert not rate.is_materialized
    counter[...] = 5.0
    captured()
    counter[...] = 10.0
    captured()
    assert host(out).tolist() == [1.0 + 1.0 + 1.0 + 1.0] * 3  # counter's value when taken
    assert not rate.is_materialized
    assert float(rate) == 1.0


@pytest.mark.needs_cupy  # the step runs on the CuPy backend (through the recording seam)
def test_on_cupy_a_replay_returns_the_recorded_buffers_rewritten():
    """The GPU side of "the same buffers at every replay": the recorded outputs, rewritten by
    each replay (`records_only`: the recording executes nothing, a replay writes into what the
    recording returned)."""
    from .cupy_fake import fake_memory, host_view  # noqa: PLC0415 - imports CuPy
    from .cupy_seam import recording  # noqa: PLC0415

    with fake_memory() as memory, recording(memory) as seam:
        seam.records_only = True
        a = seam.array(np.zeros(2))
        two = gs.asscalar(2.0, like=a)

        def fn(a):
            a += two
            return a * two

        step = gs.capture(fn, a, warmup=0)
        first = step()
        second = step()
        assert second is first and host_view(first).tolist() == [8.0, 8.0]
        step.release()


# ---- the "graphs" executor slot (issue 22) -----------------------------------------------------


def test_each_device_records_steps_through_its_graphs_executor():
    """`gs.capture` hands a step to ``backend.executor("graphs")`` (the protocol
    `gpuscalar.capture.Graphs`): NumPy and the strict device share the host one, which re-runs
    steps; a step's repr names what its device does."""
    from gpuscalar.capture import Graphs  # noqa: PLC0415
    from gpuscalar.devices import NUMPY, STRICT  # noqa: PLC0415
    from gpuscalar.devices.host.graphs import HostGraphs  # noqa: PLC0415

    on_numpy, on_strict = NUMPY.executor("graphs"), STRICT.executor("graphs")
    assert type(on_numpy) is type(on_strict) is HostGraphs
    members = {name for name in (*vars(Graphs), *Graphs.__annotations__)
               if not name.startswith("_")}
    assert members == {"form", "default_device", "library_syncs", "record"}
    step = gs.capture(lambda a: None, strict.xp.zeros(1), warmup=0)
    assert "strict, re-run" in repr(step)


@pytest.mark.needs_cupy  # the CuPy wing's executor module imports CuPy's side of the seam
def test_cupy_records_steps_through_its_own_graphs_executor():
    assert type(CUPY.executor("graphs")) is graphs.CudaGraphs
    assert CUPY.executor("graphs").form == "CUDA graph"
