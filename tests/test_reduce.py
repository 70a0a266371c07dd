"""Device-resident reductions equal NumPy's; unbroadcast and global_norm; never a sync."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gpuscalar as gs

from .helpers import host

#: Every test here runs with lazy GPUScalar expressions and again eagerly.
pytestmark = pytest.mark.usefixtures("scalar_mode")

REDUCTIONS = ["sum", "mean", "prod", "min", "max", "any", "all", "var", "std"]

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)
float_dtypes = st.sampled_from([np.float32, np.float64, np.int32, np.int64])


def _host(value):
    return value.array if isinstance(value, gs.GPUScalar) else value


@settings(max_examples=150, deadline=None)
@given(data=st.data(), shape=shapes, dtype=float_dtypes, name=st.sampled_from(REDUCTIONS),
       keepdims=st.booleans())
def test_reductions_equal_numpy(data, shape, dtype, name, keepdims):
    x = data.draw(hnp.arrays(dtype, shape, elements=st.integers(-3, 3)))
    axis = data.draw(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
    with gs.count_syncs() as counter:
        got = getattr(gs, name)(x, axis=axis, keepdims=keepdims)
    assert counter.count == 0 and counter.device_ops == 1
    expected = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    assert isinstance(got, gs.GPUScalar) == (np.ndim(expected) == 0)
    assert _host(got).dtype == np.asarray(expected).dtype
    np.testing.assert_allclose(_host(got), expected, rtol=1e-6)


def test_reduction_dtype_and_ddof(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    assert gs.sum(x, dtype=np.float64).dtype == np.float64
    assert gs.var(x, ddof=1).item() == pytest.approx(float(np.var(x, ddof=1)), rel=1e-6)
    assert gs.std(x, axis=0, ddof=1).shape == (5,)
    with pytest.raises(TypeError, match="dtype"):
        gs.max(x, dtype=np.float64)


def test_full_reduction_of_xp_array_is_gpuscalar(xp):
    x = xp.arange(6, dtype=xp.float32).reshape(2, 3)
    with gs.count_syncs() as counter:
        total = gs.sum(x)
        rows = gs.sum(x, axis=1)
    assert counter.count == 0
    assert isinstance(total, gs.GPUScalar) and total.dtype == xp.float32
    assert not isinstance(rows, gs.GPUScalar) and rows.shape == (2,)
    assert total.item() == 15.0


def test_norm_dot_vdot_count_nonzero(rng):
    x = rng.standard_normal((3, 4))
    y = rng.standard_normal((3, 4))
    with gs.count_syncs() as counter:
        two = gs.norm(x)
        one = gs.norm(x, ord=1)
        inf = gs.norm(x, ord=math.inf)
        per_row = gs.norm(x, axis=1)
        dot = gs.dot(x[0], y[0])
        vdot = gs.vdot(x, y)
        nonzero = gs.count_nonzero(x > 0)
        matrix = gs.dot(x, y.T)
    assert counter.count == 0
    assert two.item() == pytest.approx(np.sqrt((x * x).sum()))
    assert one.item() == pytest.approx(np.abs(x).sum())
    assert inf.item() == pytest.approx(np.abs(x).max())
    np.testing.assert_allclose(per_row, np.sqrt((x * x).sum(axis=1)))
    assert dot.item() == pytest.approx(float(np.dot(x[0], y[0])))
    assert vdot.item() == pytest.approx(float(np.vdot(x, y)))
    assert isinstance(nonzero, gs.GPUScalar) and nonzero.item() == int((x > 0).sum())
    assert matrix.shape == (3, 3)


def test_logsumexp_is_stable_and_correct(rng):
    x = rng.standard_normal((3, 4))
    assert gs.logsumexp(x).item() == pytest.approx(np.log(np.exp(x).sum()))
    np.testing.assert_allclose(gs.logsumexp(x, axis=1), np.log(np.exp(x).sum(axis=1)))
    assert gs.logsumexp(x, axis=0, keepdims=True).shape == (1, 4)
    big = np.array([1000.0, 1000.0])
    assert gs.logsumexp(big).item() == pytest.approx(1000.0 + math.log(2))
    assert gs.logsumexp(np.array([-np.inf, -np.inf])).item() == -math.inf
    with gs.count_syncs() as counter:
        gs.logsumexp(big)
    assert counter.count == 0


@pytest.mark.parametrize(
    ("grad_shape", "target"),
    [((2, 3), (3,)), ((4, 2, 3), (2, 3)), ((2, 3), (1, 3)), ((2, 3), (2, 1)),
     ((2, 3), (1, 1)), ((2, 3), ()), ((2, 3), (2, 3)), ((5, 1, 3), (4, 3)[:0] + (1, 3))],
)
def test_unbroadcast_sums_added_and_stretched_axes(xp, grad_shape, target, rng):
    grad = xp.asarray(rng.standard_normal(grad_shape))
    with gs.count_syncs() as counter:
        result = gs.unbroadcast(grad, target)
    assert counter.count == 0
    assert counter.device_ops == (0 if grad_shape == target else 1)
    assert isinstance(result, gs.GPUScalar) == (target == ())
    assert tuple(result.shape) == target
    # The defining property: for any y broadcast to grad's shape, <grad, y> = <result, y0>.
    y0 = rng.standard_normal(target)
    expected = float(np.sum(host(grad) * np.broadcast_to(y0, grad_shape)))
    assert float(np.sum(np.asarray(host(result)) * y0)) == pytest.approx(expected)


def test_unbroadcast_bad_input():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
        gs.unbroadcast(np.ones((2, 3)), (4,))
    with pytest.raises(ValueError, match=r"\(3,\).*\(2, 3\)"):
        gs.unbroadcast(np.ones(3), (2, 3))
    with pytest.raises(TypeError, match="list"):
        gs.unbroadcast([1.0, 2.0], ())
    with pytest.raises(TypeError, match="shape"):
        gs.unbroadcast(np.ones(3), 3)


def test_unbroadcast_of_scalar_gradient_to_scalar_is_identity():
    g = gs.asscalar(2.0)
    assert gs.unbroadcast(g, ()) is g


def test_global_norm(rng, xp):
    arrays = [xp.asarray(rng.standard_normal(shape)) for shape in ((3,), (2, 2), (5,))]
    flat = np.concatenate([host(a).ravel() for a in arrays])
    with gs.count_syncs() as counter:
        two = gs.global_norm(arrays)
        inf = gs.global_norm(arrays, ord=math.inf)
        one = gs.global_norm(arrays, ord=1)
    assert counter.count == 0
    assert two.item() == pytest.approx(np.linalg.norm(flat))
    assert inf.item() == pytest.approx(np.abs(flat).max())
    assert one.item() == pytest.approx(np.abs(flat).sum())
    assert gs.global_norm(arrays[:1]).item() == pytest.approx(np.linalg.norm(host(arrays[0])))


def test_reductions_reject_non_arrays():
    for bad in ([1.0, 2.0], "abc", None, 3.0):
        with pytest.raises(TypeError, match=type(bad).__name__):
            gs.sum(bad)
    with pytest.raises(ValueError, match="at least one"):
        gs.global_norm([])
    with pytest.raises(TypeError, match="list"):
        gs.dot([1.0], np.ones(1))


def test_reduction_of_gpuscalar_input():
    s = gs.asscalar(2.5)
    assert gs.sum(s).item() == 2.5
    assert gs.norm(-s).item() == 2.5
