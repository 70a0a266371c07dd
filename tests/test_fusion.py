"""Where pending expressions are evaluated: one op per materialization, none of their own when
an array operation consumes them, the eager values in both cases."""

from __future__ import annotations

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict
from gpuscalar.lazy import expr

from .helpers import backend_name, host


def schedule(step, base=0.1, warmup=10.0):
    """A warm-up learning rate: four scalar operations."""
    return base * gs.minimum(1.0, (step + 1) / warmup)


def test_a_read_evaluates_once_and_keeps_the_array(xp):
    step = gs.asscalar(4.0, like=xp.zeros(1))
    lr = schedule(step)
    with gs.count_syncs() as counter:
        array = lr.array
        again = lr.array
        value = float(lr)
    assert array is again and lr.is_materialized
    assert counter.device_ops == 1 and counter.count == 1
    with gs.lazy(False):
        assert value == float(schedule(step)) == 0.05


def test_an_array_operation_computes_a_pending_scalar_in_its_own_kernel(xp):
    step = gs.asscalar(3, like=xp.zeros(1, dtype=xp.int64))
    g = xp.asarray(np.linspace(-1, 1, 7, dtype=np.float32))
    lr = schedule(step)
    with gs.count_syncs() as counter:
        update = lr * g
    assert counter.device_ops == 1 and counter.count == 0
    assert not lr.is_materialized  # consumed, not materialized
    assert update.dtype == np.float32  # parity: as g * float(lr)
    with gs.lazy(False):
        eager = schedule(step) * g
    assert host(update).tobytes() == host(eager).tobytes()


def test_a_scalar_of_any_size_costs_one_launch_in_an_array_operation(xp):
    g = xp.ones(5)
    s = gs.asscalar(0.5, like=g)
    deep = s
    for i in range(40):
        deep = deep * 1.01 + (i % 3)
    with gs.count_syncs() as counter:
        result = g * deep
    assert counter.device_ops == 1
    with gs.lazy(False):
        expected = g * float(deep)
    assert host(result).tolist() == host(expected).tolist()


def test_an_update_costs_the_launches_a_python_float_costs():
    """On the strict device every array call is an op: w -= lr * g is two, however the
    learning rate is computed (the float path needs a sync to get its Python float)."""
    w = strict.xp.ones(6, dtype=np.float32)
    g = strict.xp.full(6, 0.5, dtype=np.float32)
    step = gs.asscalar(2, like=strict.xp.zeros(1, dtype=np.int64))
    with gs.count_syncs() as with_python_float:
        w -= 0.03 * g
    lr = schedule(step)
    with gs.count_syncs() as with_device_scalar:
        w -= lr * g
    assert with_python_float.device_ops == with_device_scalar.device_ops == 2
    assert with_device_scalar.count == 0
    assert host(w).tolist() == pytest.approx([1 - 0.03 * 0.5 - 0.03 * 0.5] * 6)


def test_in_place_update_with_a_pending_scalar_is_one_op_and_keeps_casting_rules(xp):
    x = xp.asarray(np.arange(4, dtype=np.float32))
    s = gs.asscalar(2.0, like=x) * 3
    with gs.count_syncs() as counter:
        x += s
    assert counter.device_ops == 1 and x.dtype == np.float32
    assert host(x).tolist() == [6.0, 7.0, 8.0, 9.0]
    ints = xp.asarray(np.arange(3, dtype=np.int8))
    with pytest.raises(TypeError, match="same_kind"):
        ints += gs.asscalar(1.5, like=x) * 2  # float into int8: NumPy's rule, no device work


@pytest.mark.parametrize("array_dtype", ["float16", "float32", "float64", "int32", "uint8",
                                         "complex64", "bool"])
@pytest.mark.parametrize("scalar_dtype", ["float64", "int64", "float32", "complex128"])
def test_fused_results_equal_eager_bit_for_bit(xp, array_dtype, scalar_dtype):
    if array_dtype == "bool" and scalar_dtype != "complex128":
        array = xp.asarray(np.array([True, False, True]))
    else:
        array = xp.asarray(np.array([1, 2, 3]).astype(array_dtype))
    s = gs.asscalar(np.array(1.25).astype(scalar_dtype), like=array)
    for op in (lambda a, t: a * t, lambda a, t: t - a, lambda a, t: a < t,
               lambda a, t: np.maximum(a, t)):
        try:
            with gs.lazy(False):
                eager = op(array, (s + 1) * 2)
        except TypeError:
            with pytest.raises(TypeError):
                op(array, (s + 1) * 2)
            continue
        lazy = op(array, (s + 1) * 2)
        assert lazy.dtype == eager.dtype
        assert host(lazy).tobytes() == host(eager).tobytes()


def test_a_pending_scalar_meeting_a_host_array_is_read_once():
    s = gs.GPUScalar(strict.xp.asarray(2.0)) * 3
    with gs.count_syncs() as counter:
        result = np.arange(3.0) * s
    assert type(result) is np.ndarray and result.tolist() == [0.0, 6.0, 12.0]
    # one evaluation on the device, then the host multiply (a NumPy op gpuscalar issues)
    assert counter.device_ops == 2 and [r.reason for r in counter.records] == ["host operand"]


def test_a_refused_read_launches_nothing():
    s = gs.asscalar(2.0) * 3
    with gs.count_syncs() as counter, gs.sync_guard("error"), pytest.raises(gs.SyncError):
        float(s)
    assert counter.device_ops == 0 and not s.is_materialized


def test_eager_mode_launches_every_operation(xp):
    g = xp.ones(3)
    step = gs.asscalar(1.0, like=g)
    with gs.lazy(False), gs.count_syncs() as counter:
        g * schedule(step)
    assert counter.device_ops == 5  # add, divide, minimum, multiply, and the array multiply


def test_materialization_is_one_counted_op_on_every_host_backend(xp):
    if backend_name(xp) == "cupy":
        pytest.skip("host evaluation only")
    s = gs.asscalar(1.0, like=xp.zeros(1))
    pending = gs.sqrt(s + 3) * 2
    with gs.count_syncs() as counter:
        array = pending.array
    assert counter.device_ops == 1 and type(array) is type(xp.zeros(1))


def test_dtype_argument_is_only_given_where_it_pins_cupys_loop():
    pytest.importorskip("cupy")  # CuPy's ufunc tables exist without a device
    from gpuscalar.devices.cupy import fusion

    assert fusion.dtype_pins_loop("add", np.dtype(np.float32))
    assert fusion.dtype_pins_loop("true_divide", np.dtype(np.float64))
    # CuPy's first int8-output power loop reads bools: dtype=int8 would cast the inputs to bool
    assert not fusion.dtype_pins_loop("power", np.dtype(np.int8))


# ---- keyword arguments: every one honoured ------------------------------------------------------


def _large_pending(like):
    """A pending scalar larger than expr.KEEP_NODES (an array kernel keeps such a scalar)."""
    step = gs.asscalar(3, like=like, dtype=np.int64)
    lr = 0.1 * gs.minimum(1.0, (step + 1) / 10.0) * 0.5 * (1 + gs.cos(np.pi * step / 100))
    assert not expr.is_lazy() or lr._node[1] > expr.KEEP_NODES
    return lr


@pytest.mark.parametrize(("build", "masked"), [
    (lambda x, p, m, o: np.add(x, p, where=m, out=o), True),
    (lambda x, p, m, o: np.multiply(p, x, where=m, out=(o,)), True),
    (lambda x, p, m, o: np.subtract(x, p, out=o, where=m, casting="same_kind"), True),
    (lambda x, p, m, o: np.add(x, p, out=o, dtype=np.float64, casting="same_kind"), False),
])
def test_keyword_arrays_are_honoured_with_a_pending_operand(xp, build, masked):
    """``where=`` (and the other keywords) reach the operation: the masked elements keep their
    value, as eagerly (NumPy). CuPy's ufuncs take no ``where=`` (only ``out``, ``dtype``,
    ``casting``), nor does the strict device's: there a pending operand changes nothing, the call
    is CuPy's TypeError lazily and eagerly alike."""
    def run(lazy):
        x = xp.asarray(np.arange(4.0))
        mask = xp.asarray(np.array([True, False, True, False]))
        out = xp.asarray(np.full(4, -1.0))
        with gs.lazy(lazy):
            pending = gs.asscalar(2.0, like=x) * 3
            result = build(x, pending, mask, out)
        assert result is out or (type(result) is tuple and result[0] is out)
        return host(out).tolist()

    if masked and backend_name(xp) in ("cupy", "strict"):
        for lazy in (True, False):
            with pytest.raises(TypeError, match="where"):
                run(lazy)
        return
    assert run(True) == run(False)


def test_cupy_fuses_only_the_keywords_its_kernel_implements():
    from gpuscalar.devices.cupy import fusion

    assert fusion.cupy_fuses_keywords({})
    assert fusion.cupy_fuses_keywords({"casting": "unsafe"})
    assert fusion.cupy_fuses_keywords({"out": object(), "dtype": np.float32, "casting": "unsafe"})
    for refused in ({"where": object(), "casting": "unsafe"},
                    {"order": "C", "casting": "unsafe"},
                    {"casting": "same_kind"},
                    {"dtype": np.float32},          # CuPy checks same_kind for this one
                    {"out": object()},
                    {"subok": True, "casting": "unsafe"}):
        assert not fusion.cupy_fuses_keywords(refused), refused


def test_a_host_result_has_the_eager_type():
    """A NumPy scalar or 0-d host array meeting a GPUScalar is a NumPy scalar (rule 3): the
    result is a GPUScalar, fused or not, on either side, with no sync."""
    with gs.lazy(False):
        eager = np.add(np.asarray(1.5), gs.asscalar(2.0) * 3)
    with gs.count_syncs() as counter:
        lazy = np.add(np.asarray(1.5), gs.asscalar(2.0) * 3)
        compared = np.float32(1.5) > gs.asscalar(2.0) * 3
    assert counter.count == 0
    assert type(lazy) is type(eager) and isinstance(lazy, gs.GPUScalar)
    assert lazy.item() == eager.item() == 7.5
    assert isinstance(compared, gs.GPUScalar) and compared.dtype == bool
    assert compared.item() is False


# ---- a kept scalar needs a launch that stores it ------------------------------------------------


def test_an_empty_array_operation_keeps_no_scalar(xp):
    """CuPy launches nothing for an empty shape, so a scalar it was to store would be garbage:
    no backend keeps one there (the same decision everywhere); a later read evaluates it."""
    empty = xp.zeros(0, dtype=np.float32)
    lr = _large_pending(empty)
    with gs.count_syncs() as counter:
        result = lr * empty
    assert result.shape == (0,) and counter.device_ops == 1
    assert not lr.is_materialized
    with gs.count_syncs() as counter:
        value = float(lr)
    assert counter.device_ops == 1 and counter.count == 1
    with gs.lazy(False):
        assert value == float(_large_pending(empty))
    full = xp.ones(3, dtype=np.float32)
    lr = _large_pending(full)
    lr * full
    assert lr.is_materialized  # a non-empty operation stores it (no launch of its own)


# ---- the dispatch plan and the bounded caches (issue 15) -----------------------------------------


@pytest.fixture
def bounded_to():
    """Sets the caches' bound for one test and restores it (and the caches' contents stay
    valid: entries are only ever evicted)."""
    from gpuscalar.lazy import fusion

    previous = fusion.cache_size()
    yield fusion.set_cache_size
    fusion.set_cache_size(previous)


def test_a_bounded_cache_keeps_the_most_recently_used_entries(bounded_to):
    from gpuscalar.lazy import fusion

    bounded_to(3)
    cache, built = fusion.BoundedCache(), []

    def make(key):
        built.append(key)
        return [key]  # a new object each build: a rebuild is visible

    first = cache.get("a", make, "a")
    for key in "bc":
        cache.get(key, make, key)
    assert cache.get("a", make, "a") is first  # a hit builds nothing, and refreshes "a"
    cache.get("d", make, "d")  # evicts "b", the least recently used
    assert len(cache) == 3 and "b" not in cache and "a" in cache
    assert built == ["a", "b", "c", "d"]
    assert cache.get("b", make, "b") == ["b"] and built[-1] == "b"  # eviction: a rebuild
    bounded_to(1)  # shrinking evicts at once
    assert len(cache) == 1 and "b" in cache
    for bad, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), ("8", TypeError),
                       (True, TypeError)):
        with pytest.raises(error, match="set_cache_size"):
            bounded_to(bad)
    assert len(cache) == 1  # a refused bound changes nothing


def test_threads_meeting_a_key_together_build_it_once():
    """The miss path holds the cache's lock: threads that all miss the same key while it is
    being built wait for it and get the same object (a compiled kernel is built once)."""
    import threading

    from gpuscalar.lazy import fusion

    cache, threads, built = fusion.BoundedCache(), 8, []
    arrived = threading.Semaphore(0)
    results = [None] * threads

    def make():
        for _ in range(threads - 1):  # every other thread is inside get() or about to be
            arrived.acquire()
        built.append(object())
        return built[-1]

    def use(i):
        if i:
            arrived.release()
        results[i] = cache.get("key", make)

    first = threading.Thread(target=use, args=(0,))
    first.start()
    others = [threading.Thread(target=use, args=(i,)) for i in range(1, threads)]
    for thread in others:
        thread.start()
    for thread in (first, *others):
        thread.join()
    assert len(built) == 1 and all(result is built[0] for result in results)


def _fold_on_fake_cupy(run):
    """Run ``run(memory)`` with gpuscalar's launches recorded over fake CuPy memory; return
    the recorded ElementwiseKernel launches."""
    from .cupy_fake import fake_memory
    from .cupy_seam import recording

    with fake_memory() as memory, recording(memory, check=False) as seam:
        run(memory)
    return [launch for launch in seam.launches if launch.kind == "elementwise"]


def test_a_repeated_fold_on_cupy_reuses_one_plan_and_one_kernel():
    """``lr_expr * g`` with the same structure every step: the first fold decides the plan
    (CuPy's routine, the kernel); the next ones only look it up. Each is one launch, the same
    kernel with the step's own leaves."""
    from gpuscalar.devices.cupy import fusion

    from .cupy_fake import from_host

    def run(memory):
        g = from_host(memory, np.arange(4.0, dtype=np.float32))
        w = from_host(memory, np.ones(4, dtype=np.float32))
        for step in range(3):
            lr = gs.GPUScalar(from_host(memory, np.float64(0.1 * (step + 1))))
            pending = lr * 0.5 + 1e-3
            if step == 1:
                plans, kernels = len(fusion._PLANS), fusion.kernel_count()
            with gs.count_syncs() as counter:
                pending * g
                np.multiply(pending, g, out=w)
            assert counter.device_ops == 2 and not pending.is_materialized
            leaves.append(pending._node)
        assert (len(fusion._PLANS), fusion.kernel_count()) == (plans, kernels)

    leaves = []
    launches = _fold_on_fake_cupy(run)
    assert len(launches) == 6
    # one kernel: ``out=`` of the dtype the fold would make is another plan, the same kernel
    assert len({id(launch.func) for launch in launches}) == 1
    for launch, node in zip(launches[::2], leaves, strict=True):
        assert launch.args[0] is node.children[0].children[0]  # this step's own lr leaf


def test_a_plan_is_keyed_by_everything_it_decided_from(monkeypatch):
    """Operand dtypes, the output's dtype and the operation each decide CuPy's routine and the
    kernel: with every plan cached (folds in any order, twice), each fold launches the kernel
    a fold of its own, with empty caches, would build."""
    from gpuscalar.devices.cupy import fusion

    from .cupy_fake import from_host

    folds = [
        lambda a: a["e"] * a["g32"],
        lambda a: a["e"] * a["g64"],
        lambda a: a["e"] * a["gi64"],
        lambda a: a["gi64"] * a["e"],
        lambda a: np.multiply(a["e"], a["g32"], out=a["o64"]),
        lambda a: np.multiply(a["e"], a["g64"], out=a["o32"], casting="unsafe"),
        lambda a: a["g32"] < a["e"],
        lambda a: a["k"] * a["g32"],
        lambda a: a["k"] + a["gi64"],
    ]

    def sources(which):
        def run(memory):
            lr = gs.GPUScalar(from_host(memory, np.float64(0.5)))
            step = gs.GPUScalar(from_host(memory, np.int64(3)))
            arrays = {"e": lr * 2.0 + 1.0, "k": step * 2,
                      "g32": from_host(memory, np.arange(3, dtype=np.float32)),
                      "g64": from_host(memory, np.arange(3, dtype=np.float64)),
                      "gi64": from_host(memory, np.arange(3, dtype=np.int64)),
                      "o32": from_host(memory, np.zeros(3, dtype=np.float32)),
                      "o64": from_host(memory, np.zeros(3, dtype=np.float64))}
            for index in which:
                folds[index](arrays)

        return [(launch.source, launch.func.in_params, launch.func.out_params)
                for launch in _fold_on_fake_cupy(run)]

    order = list(range(len(folds)))
    warm = sources(order + order[::-1])
    alone = []
    for index in order:
        monkeypatch.setattr(fusion, "_PLANS", fusion.BoundedCache())
        monkeypatch.setattr(fusion, "_KERNELS", fusion.BoundedCache())
        alone += sources([index])
    assert warm == alone + alone[::-1]
    assert len(set(alone)) >= 7  # the folds do need different kernels


def test_an_evicted_plan_costs_only_a_rebuild_of_the_same_kernel(bounded_to):
    """With room for one entry, alternating two folds evicts each plan and kernel in turn: every
    fold is still one launch, of a kernel with the same generated source as before."""
    from gpuscalar.devices.cupy import fusion

    from .cupy_fake import from_host

    bounded_to(1)

    def run(memory):
        g32 = from_host(memory, np.arange(3, dtype=np.float32))
        g64 = from_host(memory, np.arange(3, dtype=np.float64))
        lr = gs.GPUScalar(from_host(memory, np.float64(0.5)))
        for _ in range(2):
            with gs.count_syncs() as counter:
                (lr + 1.0) * g32
                (lr + 1.0) * g64
            assert counter.device_ops == 2
            assert len(fusion._PLANS) == len(fusion._KERNELS) == 1  # the bound holds

    launches = _fold_on_fake_cupy(run)
    assert len(launches) == 4
    assert launches[0].func is not launches[2].func  # rebuilt, not kept
    assert [launch.source for launch in launches[:2]] == [launch.source for launch in launches[2:]]
    assert launches[0].source != launches[1].source


def test_an_output_overlapping_an_input_is_checked_on_every_fold():
    """Overlap depends on the call's arrays, not on the plan: an output that is exactly an input
    folds (one kernel), one that partly overlaps it is evaluated as CuPy's ufunc would be
    (the scalar first, then CuPy's own call, which copies the input), each time."""
    from .cupy_fake import fake_memory, from_host
    from .cupy_seam import recording

    with fake_memory() as memory, recording(memory, check=False) as seam:
        w = from_host(memory, np.arange(5.0))
        lr = gs.GPUScalar(from_host(memory, np.float64(0.5)))
        assert seam.kinds() == ["function"]  # GPUScalar(a) is a value: one device copy of a
        seam.clear()
        for _ in range(2):
            np.multiply(lr * 2.0, w, out=w)
            np.multiply(lr * 2.0, w[1:], out=w[:-1])
    assert seam.kinds() == ["elementwise", "elementwise", "ufunc"] * 2


def test_a_host_read_on_cupy_is_one_packing_kernel_and_one_transfer():
    """Reading a pending expression on CuPy evaluates it with the read kernel
    (``gpuscalar_read_*``, a RawKernel, not the ``gpuscalar_expr_*`` materializer) whose uint8
    output packs the value and the unknown device leaf: one launch, one transfer. The leaf is known
    afterwards: reading it, or an expression of it and Python numbers, needs neither."""
    from gpuscalar.lazy.fusion import PACK_SLOT

    from .cupy_fake import fake_memory, from_host
    from .cupy_seam import recording

    with fake_memory() as memory, recording(memory) as seam:
        leaf = gs.GPUScalar(from_host(memory, np.float32(0.5)))
        seam.clear()  # (the construction's copy: tests/test_cupy_into.py counts it)
        pending = leaf * 2.0 + 1.0
        with gs.count_syncs() as counter:
            float(pending)  # (the recorder does not compute the fused value: not checked)
        assert counter.count == 1 and counter.device_ops == 1
        assert seam.kinds() == ["raw"]
        assert seam.launches[0].name.startswith("gpuscalar_read_")
        assert len(seam.reads) == 1 and seam.reads[0].dtype == np.uint8
        assert seam.reads[0].shape == (2 * PACK_SLOT,)  # the value, then the leaf
        assert pending.is_materialized  # kept, as a materialization keeps it
        seam.clear()
        with gs.count_syncs() as counter:
            assert float(leaf) == 0.5  # the packed leaf (the device's bytes)
            assert float(leaf * 3.0) == 1.5  # known leaves: computed on the host
        assert counter.count == counter.device_ops == 0
        assert seam.launches == [] and seam.reads == []


# ---- executors, chosen once -------------------------------------------------------------------


def test_each_backend_has_one_executor_and_its_scalars_use_it(xp, monkeypatch):
    """Evaluation picks its executor once per backend (host evaluator, or CuPy's fused
    kernels); a pending scalar is materialized by its class's executor, one call."""
    from gpuscalar.devices import backend_of
    from gpuscalar.lazy import fusion

    backend = backend_of(xp.zeros(1))
    executor = fusion.executor_for(backend)
    assert executor is fusion.executor_for(backend) and executor.backend is backend
    assert executor is backend.executor("scalars")  # the device's "scalars" slot
    assert type(executor).__module__ == ("gpuscalar.devices.cupy.fusion" if backend.name == "cupy"
                                         else "gpuscalar.devices.host.fusion")
    with gs.lazy(True):
        s = gs.asscalar(2.0, like=xp.zeros(1)) * 3.0
    assert type(s)._executor is executor
    node = s._node
    assert node is not None
    calls = []
    real = type(executor).materialize

    def spy(self, root, device):
        calls.append(root.key)
        return real(self, root, device)

    monkeypatch.setattr(type(executor), "materialize", spy)
    assert host(s.array) == 6.0
    assert calls == [node.key]


def test_a_repeated_array_operation_decides_its_loop_once(xp, monkeypatch):
    """``lr * g`` decides NumPy's parity loop (and CuPy's dtype= pin) from the operands' kinds
    once; repeated, it is a lookup: the resolver is not asked again, the result the same."""
    from gpuscalar import arrays, promote

    monkeypatch.setattr(arrays, "_ARRAY_CALLS", {})  # decided afresh here
    asked = []
    real = promote.parity_signature
    monkeypatch.setattr(promote, "parity_signature",
                        lambda name, kinds: asked.append(name) or real(name, kinds))
    g = xp.asarray(np.arange(3.0, dtype=np.float32))
    lr = gs.asscalar(0.5, like=g, dtype=np.float64)
    first = lr * g
    count = len(asked)
    assert count >= 1
    second = lr * g
    third = g * lr
    assert len(asked) == count + 1  # g * lr is another order: decided once, too
    fourth = g * lr
    assert len(asked) == count + 1
    for result in (first, second, third, fourth):
        assert result.dtype == np.float32 and host(result).tolist() == [0.0, 0.5, 1.0]


def test_the_fold_fast_path_launches_what_the_general_path_launches(monkeypatch):
    """A fold of one pending scalar on CuPy goes from `arrays._array_call`'s cached decision
    straight to `fusion.fold_on_cupy` (issue 22: the fold's host cost): it launches the same
    kernel (the same generated source and parameters) with the same arguments, one launch per
    fold, as the general path (`_launch` -> `fused_ufunc` -> `_fused_on_cupy`); an overlapping
    output, a Python int operand and a kept scalar still take the general path."""
    from gpuscalar import arrays
    from gpuscalar.devices.cupy import fusion

    from .cupy_fake import from_host

    taken = []
    fast = fusion.fold_on_cupy

    def spy(*args):
        found = fast(*args)
        taken.append(found is not NotImplemented)
        return found

    def run(memory):
        lr = gs.GPUScalar(from_host(memory, np.float64(0.5)))
        step = gs.GPUScalar(from_host(memory, np.int64(3)))
        g32 = from_host(memory, np.arange(3, dtype=np.float32))
        gi64 = from_host(memory, np.arange(3, dtype=np.int64))
        o64 = from_host(memory, np.zeros(3, dtype=np.float64))
        for _ in range(2):
            with gs.count_syncs() as counter:
                (lr * 2.0 + 1.0) * g32
                g32 * (lr * 2.0 + 1.0)
                np.multiply(lr * 2.0, g32, out=o64)
                (step * 2) + gi64
                assert (gi64 < (lr + 1.0)).dtype == np.bool_
                np.multiply(lr * 2.0, o64, out=o64)
            assert counter.device_ops == 6

    def launches():
        monkeypatch.setattr(arrays, "_ARRAY_CALLS", {})  # decided afresh: the fold function
        monkeypatch.setattr(fusion, "_PLANS", fusion.BoundedCache())
        monkeypatch.setattr(fusion, "_KERNELS", fusion.BoundedCache())
        found = _fold_on_fake_cupy(run)
        return [(launch.source, launch.func.in_params, launch.func.out_params,
                 [(type(a), getattr(a, "dtype", None), getattr(a, "shape", None))
                  for a in launch.args]) for launch in found]

    monkeypatch.setattr(fusion, "fold_on_cupy", spy)
    with_fast = launches()
    assert len(with_fast) == 12 and taken and all(taken)
    monkeypatch.setattr(fusion, "fold_on_cupy", lambda *args: NotImplemented)
    assert launches() == with_fast
