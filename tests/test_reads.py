"""gpuscalar.reads: a pending GPUScalar's host read answers from known values, or brings its
unknown inputs back in the same transfer (known values never sync twice)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import known

from .helpers import host


def _device_values(xp, *values, dtype=None):
    """Reduction results (materialized GPUScalars), not read yet."""
    return [gs.sum(xp.asarray([v], dtype=dtype)) for v in values]


def test_a_read_brings_the_unknown_inputs_back_in_the_same_transfer(xp):
    a, b, c = _device_values(xp, 1.5, 2.25, -0.5)
    with gs.count_syncs(include_cupy=True) as counter:
        assert float(a * b) == 1.5 * 2.25  # one transfer: the product, a and b
        assert float(a) == 1.5 and float(b) == 2.25  # known: no sync
        assert float(a - b / 3.0) == 1.5 - 2.25 / 3.0  # built from known values: on the host
    assert counter.count == 1
    with gs.count_syncs(include_cupy=True) as counter:
        assert float(a + c) == 1.0  # c is new: one read, which brings c back too
        assert float(c * 4) == -2.0
    assert counter.count == 1


def test_an_expression_of_known_values_costs_no_device_op_and_gives_the_float_paths_bits(xp):
    a, b = _device_values(xp, 0.1, 0.7)
    fa, fb = float(a), float(b)
    with gs.count_syncs(include_cupy=True) as counter:
        value = float(gs.sqrt(a * a + b * b) / (a - b) + math.pi)
    assert counter.count == 0 and counter.device_ops == 0
    assert value.hex() == (math.sqrt(fa * fa + fb * fb) / (fa - fb) + math.pi).hex()


def test_values_built_before_the_read_become_known_with_it(xp):
    """As in a solver: a running total is built first, its inputs are read later."""
    a, b = _device_values(xp, 3.0, 4.0)
    total = a * a + b * b  # pending, unread
    check = a < b  # read first: brings a and b back
    with gs.count_syncs(include_cupy=True) as counter:
        assert bool(check)
        assert float(total) == 25.0
    assert counter.count == 1


def test_a_scalar_materialized_from_known_values_is_known(xp):
    a, b = _device_values(xp, 2.0, 8.0)
    float(a), float(b)
    ratio = a / b
    ratio.array  # noqa: B018 - materialized (one device op), from known values
    assert ratio.is_materialized
    with gs.count_syncs(include_cupy=True) as counter:
        assert float(ratio) == 0.25 and float(ratio * 2) == 0.5
    assert counter.count == 0


@pytest.mark.parametrize("dtypes", [("int8", "float32", "complex64"), ("bool", "uint16", "int64"),
                                    ("float16", "complex128", "uint8")])
def test_leaves_of_every_dtype_come_back_exactly(xp, dtypes):
    values = {"int8": -7, "float32": 1.1, "complex64": 1 - 2j, "bool": True, "uint16": 65000,
              "int64": -(2**40), "float16": 0.3, "complex128": 0.1 + 0.2j, "uint8": 255}
    scalars = [gs.asscalar(values[d], dtype=d, like=xp.zeros(1)) for d in dtypes]
    expected = [np.dtype(d).type(values[d]).item() for d in dtypes]
    first, second, third = scalars
    with gs.count_syncs(include_cupy=True) as counter:
        host((first + second) * third)  # one read brings all three back
        got = [s.item() for s in scalars]
    assert counter.count == 1
    assert [type(v) for v in got] == [type(v) for v in expected] and got == expected
    assert all(known.value_of(s.array) == v for s, v in zip(scalars, expected, strict=True))


def test_a_leaf_used_twice_comes_back_once(xp):
    (a,) = _device_values(xp, 3.0)
    with gs.count_syncs(include_cupy=True) as counter:
        assert float(a * a - a) == 6.0
        assert float(a) == 3.0
    assert counter.count == 1


def test_a_refused_read_moves_and_launches_nothing(xp):
    a, b = _device_values(xp, 1.0, 2.0)
    product = a * b
    with gs.count_syncs() as counter, gs.sync_guard("error"), pytest.raises(gs.SyncError):
        float(product)
    assert counter.device_ops == 0 and not product.is_materialized
    assert known.value_of(a.array) is known.UNREAD


def test_eager_reads_know_what_they_compute_from_known_values(xp):
    """Eager (gs.lazy(False)) evaluates each operation at once: a value built from known ones
    is known too, though a read brings back that value alone."""
    (a,) = _device_values(xp, 1.25)
    float(a)
    with gs.lazy(False):
        doubled = a * 2.0
        assert doubled.is_materialized
        with gs.count_syncs(include_cupy=True) as counter:
            assert float(doubled) == 2.5
    assert counter.count == 0


def test_a_user_array_written_after_wrapping_never_changes_the_value(xp):
    """gs.GPUScalar(a) is a value: the known value can never go stale."""
    array = xp.asarray(1.0)
    s = gs.GPUScalar(array)
    assert float(s) == 1.0
    array[...] = 5.0
    t = gs.GPUScalar(array)
    assert float(s) == 1.0 and float(t) == 5.0 and float(s + t) == 6.0
