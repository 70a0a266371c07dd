"""gpuscalar.ad VJP rules against central finite differences, for every operand shape pattern
(same shape, broadcast, GPUScalar, Python number), with zero syncs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import ad

from .helpers import host

#: Every test here runs with lazy GPUScalar expressions and again eagerly.
pytestmark = pytest.mark.usefixtures("scalar_mode")

RULES = {
    "add": (ad.vjp_add, np.add),
    "sub": (ad.vjp_sub, np.subtract),
    "mul": (ad.vjp_mul, np.multiply),
    "truediv": (ad.vjp_truediv, np.divide),
    "pow": (ad.vjp_pow, np.power),
    "maximum": (ad.vjp_maximum, np.maximum),
    "minimum": (ad.vjp_minimum, np.minimum),
}
# "gs": a GPUScalar operand; "py": a Python float operand; a tuple: an array of that shape.
PATTERNS = {
    "same-shape": ((3, 4), (3, 4)),
    "broadcast-3x1-1x4": ((3, 1), (1, 4)),
    "leading-axis": ((4,), (2, 4)),
    "array-gpuscalar": ((3, 4), "gs"),
    "gpuscalar-array": ("gs", (2, 3)),
    "array-number": ((3, 4), "py"),
    "number-array": ("py", (3, 1)),
    "gpuscalar-gpuscalar": ("gs", "gs"),
    "gpuscalar-number": ("gs", "py"),
    "number-gpuscalar": ("py", "gs"),
}
H = 1e-6


def _operand(kind, rng, xp):
    """(host float64 value, the value handed to the rule)."""
    if kind == "py":
        value = float(rng.uniform(0.5, 2.0))
        return value, value
    if kind == "gs":
        value = float(rng.uniform(0.5, 2.0))
        return value, gs.asscalar(value, like=xp.zeros(1))
    value = rng.uniform(0.5, 2.0, size=kind)
    return value, xp.asarray(value)


def _numeric_gradient(f, values, k):
    """Central differences of scalar ``f(*values)`` with respect to ``values[k]``."""
    base = values[k]
    if isinstance(base, float):
        up = list(values)
        down = list(values)
        up[k], down[k] = base + H, base - H
        return (f(*up) - f(*down)) / (2 * H)
    grad = np.empty_like(base)
    for index in np.ndindex(base.shape):
        bumped = base.copy()
        bumped[index] += H
        up = f(*[bumped if i == k else v for i, v in enumerate(values)])
        bumped[index] -= 2 * H
        down = f(*[bumped if i == k else v for i, v in enumerate(values)])
        grad[index] = (up - down) / (2 * H)
    return grad


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("rule", RULES)
def test_binary_rule_matches_finite_differences(xp, rng, rule, pattern):
    vjp, op = RULES[rule]
    (a_host, a), (b_host, b) = (_operand(kind, rng, xp) for kind in PATTERNS[pattern])
    out_shape = np.broadcast_shapes(np.shape(a_host), np.shape(b_host))
    w = rng.standard_normal(out_shape)
    g = gs.asscalar(float(w), like=xp.zeros(1)) if out_shape == () else xp.asarray(w)

    def f(x, y):
        return float(np.sum(w * op(x, y)))

    with gs.count_syncs() as counter:
        da, db = vjp(g, a, b)
    assert counter.count == 0
    for operand, cotangent, k in ((a, da, 0), (b, db, 1)):
        if isinstance(operand, (float, gs.GPUScalar)):
            assert isinstance(cotangent, gs.GPUScalar), "a scalar operand gets a GPUScalar"
        else:
            assert cotangent.shape == operand.shape
        expected = _numeric_gradient(f, [a_host, b_host], k)
        np.testing.assert_allclose(host(cotangent), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rule", ["maximum", "minimum"])
def test_ties_split_the_cotangent(rule):
    vjp = RULES[rule][0]
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([1.0, 0.0, 5.0])
    da, db = vjp(np.full(3, 4.0), a, b)
    winner_a = [2.0, 4.0, 0.0] if rule == "maximum" else [2.0, 0.0, 4.0]
    np.testing.assert_array_equal(da, winner_a)
    np.testing.assert_array_equal(db, 4.0 - np.array(winner_a))


def test_pow_zero_base_gives_finite_exponent_cotangent():
    _, db = ad.vjp_pow(np.ones(2), np.array([0.0, 2.0]), 3.0)
    assert float(db) == pytest.approx(8.0 * np.log(2.0))
    da, db = ad.vjp_pow(gs.asscalar(1.0), 0.0, 2.0)
    assert (float(da), float(db)) == (0.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        da, _ = ad.vjp_pow(1.0, 0.0, -1.0)  # IEEE, on the device: Python's 0.0 ** -2 raises
    assert float(da) == -np.inf


def test_rules_keep_float32(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    g = np.ones((3, 4), np.float32)
    for vjp, _ in RULES.values():
        da, db = vjp(g, np.abs(a) + 1, 2.5)
        assert da.dtype == np.float32
        assert isinstance(db, gs.GPUScalar) and db.dtype == np.float32
        da, db = vjp(g, gs.asscalar(np.float32(1.5)), np.abs(a) + 1)
        assert da.dtype == np.float32 and db.dtype == np.float32


def test_python_number_cotangent_when_everything_is_a_number():
    da, db = ad.vjp_mul(2.0, 3.0, 5.0)
    assert isinstance(da, gs.GPUScalar) and isinstance(db, gs.GPUScalar)
    assert (float(da), float(db)) == (10.0, 6.0)


@pytest.mark.parametrize(
    ("shape", "axis", "keepdims"),
    [((3, 4), None, False), ((2, 3, 4), 0, False), ((2, 3, 4), (0, 2), True),
     ((2, 3, 4), -1, False), ((5,), None, True)],
)
@pytest.mark.parametrize("which", ["sum", "mean"])
def test_reduction_rules_match_finite_differences(xp, rng, which, shape, axis, keepdims):
    reduce_host = np.sum if which == "sum" else np.mean
    vjp = ad.vjp_sum if which == "sum" else ad.vjp_mean
    x_host = rng.standard_normal(shape)
    out_shape = reduce_host(x_host, axis=axis, keepdims=keepdims).shape
    w = rng.standard_normal(out_shape)
    g = gs.asscalar(float(w), like=xp.zeros(1)) if out_shape == () else xp.asarray(w)
    with gs.count_syncs() as counter:
        dx = vjp(g, xp.asarray(x_host), axis=axis, keepdims=keepdims)
    assert counter.count == 0
    assert dx.shape == shape
    expected = _numeric_gradient(
        lambda x: float(np.sum(w * reduce_host(x, axis=axis, keepdims=keepdims))), [x_host], 0
    )
    np.testing.assert_allclose(host(dx), expected, rtol=1e-6, atol=1e-7)
    dx[...] = 0  # a real, writable array (gradient clipping scales in place)


def test_reduction_rules_dtype_and_scalar_input():
    x = np.ones((2, 2), np.float32)
    dx = ad.vjp_mean(gs.asscalar(1.0), x)
    assert dx.dtype == np.float32
    np.testing.assert_array_equal(dx, 0.25)
    s = gs.asscalar(3.0)
    assert float(ad.vjp_sum(gs.asscalar(2.0), s)) == 2.0
    assert float(ad.vjp_mean(2.0, s)) == 2.0


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((np.ones((3, 4)), np.ones((3, 1)), np.ones((1, 5))), ValueError,
         r"g has shape \(3, 4\) but a \(3, 1\) and b \(1, 5\) broadcast to \(3, 5\)"),
        ((np.ones(3), np.ones(3), np.ones(4)), ValueError,
         r"operands of shapes \(3,\) and \(4,\) do not broadcast"),
        ((np.ones(3), [1.0, 2.0, 3.0], 2.0), TypeError, "a must be an array, a GPUScalar"),
        ((np.ones(3), np.ones(3), "2"), TypeError, "b must be an array, a GPUScalar"),
        (("1", np.ones(3), np.ones(3)), TypeError, "g must be an array, a GPUScalar"),
    ],
)
@pytest.mark.parametrize("rule", RULES)
def test_binary_rules_bad_input(rule, args, error, match):
    with pytest.raises(error, match=f"vjp_{rule}\\(\\): {match}"):
        RULES[rule][0](*args)


def test_reduction_rules_bad_input():
    with pytest.raises(ValueError, match=r"g has shape \(2,\) but reducing x of shape \(3, 4\)"):
        ad.vjp_sum(np.ones(2), np.ones((3, 4)), axis=1)
    with pytest.raises(TypeError, match=r"vjp_mean\(\): x must be an array or a GPUScalar"):
        ad.vjp_mean(1.0, [1.0, 2.0])
    with pytest.raises(ValueError, match="axis 2 is out of bounds"):
        ad.vjp_sum(np.ones(3), np.ones((3, 4)), axis=2)
    with pytest.raises(ValueError, match="x is a scalar, so axis must be None"):
        ad.vjp_sum(1.0, gs.asscalar(1.0), axis=0)


def test_a_device_axis_is_named_without_a_sync():
    """An axis that is a GPUScalar: the error names it by type and dtype, under the error
    guard too (formatting or comparing its value would read it from the device)."""
    axis = gs.asscalar(1)
    with gs.sync_guard("error"):
        with pytest.raises(ValueError, match="axis must be None, got a GPUScalar of dtype int64"):
            ad.vjp_sum(1.0, gs.asscalar(1.0), axis=axis)
        with pytest.raises(TypeError, match=r"axis must be None, an int or a tuple of ints, got "
                                            r"a tuple of 2 \(0, a GPUScalar of dtype int64\)"):
            ad.vjp_mean(np.ones(3), np.ones((3, 4)), axis=(0, axis))


def test_every_public_rule_is_tested():
    tested = {f"vjp_{name}" for name in RULES} | {"vjp_sum", "vjp_mean"}
    assert set(ad.__all__) == tested
    assert all(callable(getattr(ad, name)) for name in itertools.chain(ad.__all__))
