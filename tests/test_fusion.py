"""Where pending expressions are evaluated: one op per materialization, none of their own when
an array operation consumes them, the eager values in both cases."""

from __future__ import annotations

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict

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
    from gpuscalar import fusion

    assert fusion.dtype_pins_loop("add", np.dtype(np.float32))
    assert fusion.dtype_pins_loop("true_divide", np.dtype(np.float64))
    # CuPy's first int8-output power loop reads bools: dtype=int8 would cast the inputs to bool
    assert not fusion.dtype_pins_loop("power", np.dtype(np.int8))


# ---- keyword arguments: every one honoured ------------------------------------------------------


def _large_pending(like):
    """A pending scalar larger than expr.KEEP_NODES (an array kernel keeps such a scalar)."""
    step = gs.asscalar(3, like=like, dtype=np.int64)
    lr = 0.1 * gs.minimum(1.0, (step + 1) / 10.0) * 0.5 * (1 + gs.cos(np.pi * step / 100))
    assert not gs.expr.is_lazy() or lr._node[1] > gs.expr.KEEP_NODES
    return lr


@pytest.mark.parametrize("build", [
    lambda x, p, m, o: np.add(x, p, where=m, out=o),
    lambda x, p, m, o: np.multiply(p, x, where=m, out=(o,)),
    lambda x, p, m, o: np.subtract(x, p, out=o, where=m, casting="same_kind"),
    lambda x, p, m, o: np.add(x, p, out=o, dtype=np.float64, casting="same_kind"),
])
def test_keyword_arrays_are_honoured_with_a_pending_operand(xp, build):
    """``where=`` (and the other keywords) reach the operation: the masked elements keep their
    value, as eagerly; on the strict device the mask is device data like the operands."""
    def run(lazy):
        x = xp.asarray(np.arange(4.0))
        mask = xp.asarray(np.array([True, False, True, False]))
        out = xp.asarray(np.full(4, -1.0))
        with gs.lazy(lazy):
            pending = gs.asscalar(2.0, like=x) * 3
            result = build(x, pending, mask, out)
        assert result is out or (type(result) is tuple and result[0] is out)
        return host(out).tolist()

    assert run(True) == run(False)


def test_cupy_fuses_only_the_keywords_its_kernel_implements():
    from gpuscalar import fusion

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
    """On NumPy a ufunc of 0-d operands gives a NumPy scalar; fused or not, the same."""
    with gs.lazy(False):
        eager = np.add(np.asarray(1.5), gs.asscalar(2.0) * 3)
    lazy = np.add(np.asarray(1.5), gs.asscalar(2.0) * 3)
    assert type(lazy) is type(eager) and lazy == eager
    assert type(np.float32(1.5) > gs.asscalar(2.0) * 3) is np.bool_


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
