"""Device-resident reductions equal NumPy's; unbroadcast and global_norm; never a sync."""

from __future__ import annotations

import functools
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


# ---- issue 15: CuPy's signatures, keepdims of count_nonzero, dtypes no reduction takes -------

#: Every public reduction of reduce.py, called with each keyword it forwards to ``xp``.
SIGNATURE_CALLS = {
    **{name: functools.partial(getattr(gs, name), axis=0, keepdims=True)
       for name in ("min", "max", "any", "all")},
    **{name: functools.partial(getattr(gs, name), axis=0, dtype=np.float64, keepdims=True)
       for name in ("sum", "mean", "prod")},
    "var": lambda x: gs.var(x, axis=0, dtype=np.float64, ddof=1, keepdims=True),
    "std": lambda x: gs.std(x, axis=0, dtype=np.float64, ddof=1, keepdims=True),
    "count_nonzero": lambda x: gs.count_nonzero(x, axis=0, keepdims=True),
    "count_nonzero-all": lambda x: gs.count_nonzero(x, keepdims=True),
    "norm": lambda x: gs.norm(x, ord=1, axis=0, keepdims=True),
    "dot": lambda x: gs.dot(x[0], x[1]),
    "vdot": lambda x: gs.vdot(x, x),
    "logsumexp": lambda x: gs.logsumexp(x, axis=0, keepdims=True),
    "unbroadcast": lambda x: gs.unbroadcast(x, (1, 3)),
    "global_norm": lambda x: gs.global_norm([x, x[0], x[1]]),
    "global_norm-inf": lambda x: gs.global_norm([x, x[0]], ord=math.inf),
    "global_norm-3": lambda x: gs.global_norm([x, x[0]], ord=3),
    "global_norm-12": lambda x: gs.global_norm([x] * 12),  # gathered 8 at a time, out=
    "all_finite-12": lambda x: gs.all_finite([x] * 12),  # per-array all into a slot, out=
}


def _cupy_signature_problem(cupy, name, args, kwargs):
    """Why CuPy's function ``name`` would refuse these arguments (None if it takes them):
    CuPy's ufuncs take ``out``/``dtype``/``casting``; its functions are bound to their real
    Python signature."""
    import inspect

    found = getattr(cupy, name, None)
    if found is None:
        return f"cupy has no {name}"
    if type(found).__name__ == "ufunc":
        extra = set(kwargs) - {"out", "dtype", "casting"}
        return f"cupy.{name} takes no {sorted(extra)}" if extra else None
    try:
        inspect.signature(found).bind(*args, **kwargs)
    except TypeError as error:
        return f"cupy.{name}{inspect.signature(found)}: {error}"
    return None


class _RecordingNamespace:
    """NumPy's namespace, recording every function taken from it and called (name, args,
    kwargs): what gpuscalar asks of ``xp``, whichever helper makes the call."""

    def __init__(self, calls):
        self._calls = calls

    def __getattr__(self, name):
        found = getattr(np, name)
        if not callable(found) or isinstance(found, type):
            return found

        def recorded(*args, **kwargs):
            self._calls.append((name, args, kwargs))
            return found(*args, **kwargs)

        recorded.__name__ = name
        return recorded


@pytest.mark.parametrize("name", list(SIGNATURE_CALLS))
def test_every_xp_call_of_reduce_fits_cupys_signature(name, monkeypatch):
    """Each reduction runs on NumPy with every ``xp.*`` call recorded, and each call is bound to
    the signature of CuPy 14's function of the same name: a keyword CuPy lacks (as
    ``count_nonzero(keepdims=...)`` was) fails here, in CI, without a GPU."""
    from tests.cupy_fake import cupy_or_fail

    cupy = cupy_or_fail()
    calls = []
    monkeypatch.setattr(type(gs.get_backend("numpy")), "xp",
                        property(lambda self: _RecordingNamespace(calls)))
    SIGNATURE_CALLS[name](np.arange(1.0, 7.0).reshape(2, 3))
    assert calls or name == "norm"  # (norm goes through Backend.vector_norm, checked below)
    problems = [p for p in (_cupy_signature_problem(cupy, *c) for c in calls) if p]
    assert problems == []


@pytest.mark.parametrize("name", list(SIGNATURE_CALLS))
def test_every_reduction_reaches_cuda_on_a_real_cupy_array(name):
    """The same calls on a real ``cupy.ndarray`` over fake memory get as far as the CUDA
    runtime (CuPy accepted the first call gpuscalar made); a TypeError would propagate."""
    from tests.cupy_fake import fake_memory, from_host, reaches_cuda

    with fake_memory() as memory:
        x = from_host(memory, np.arange(1.0, 7.0).reshape(2, 3))
        assert reaches_cuda(SIGNATURE_CALLS[name], x)


@pytest.mark.needs_cupy  # CuPy's signatures
def test_the_signature_check_can_fail():
    import cupy

    assert "keepdims" in _cupy_signature_problem(cupy, "count_nonzero", (np.ones(2),),
                                                 {"axis": None, "keepdims": False})
    assert "casting2" in _cupy_signature_problem(cupy, "add", (1, 2), {"casting2": "no"})
    assert _cupy_signature_problem(cupy, "sum", (np.ones(2),), {"axis": 0, "out": None}) is None
    assert "no_such" in _cupy_signature_problem(cupy, "no_such", (), {})


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_count_nonzero_keepdims_equals_numpy(xp, axis, keepdims):
    data = (np.arange(24).reshape(2, 3, 4) % 3).astype(np.float32)
    with gs.count_syncs() as counter:
        got = gs.count_nonzero(xp.asarray(data), axis=axis, keepdims=keepdims)
    assert counter.count == 0
    expected = np.count_nonzero(data, axis=axis, keepdims=keepdims)
    assert isinstance(got, gs.GPUScalar) == (np.ndim(expected) == 0)
    got = host(got)
    assert np.shape(got) == np.shape(expected)
    np.testing.assert_array_equal(got, expected)


NOT_NUMERIC = {
    "datetime64[D]": np.array(["2020-01-01", "2020-01-03"], dtype="datetime64[D]"),
    "timedelta64[s]": np.array([1, 2], dtype="timedelta64[s]"),
    "object": np.array([1, 2], dtype=object),
}
ALL_REDUCTIONS = {
    **{name: getattr(gs, name) for name in REDUCTIONS + ["count_nonzero", "norm", "logsumexp"]},
    "dot": lambda x: gs.dot(x, x), "vdot": lambda x: gs.vdot(x, x),
    "unbroadcast": lambda x: gs.unbroadcast(x, ()),
    "global_norm": lambda x: gs.global_norm([x, x]),
}


@pytest.mark.parametrize("dtype", list(NOT_NUMERIC))
@pytest.mark.parametrize("name", list(ALL_REDUCTIONS))
def test_reductions_of_datetime_timedelta_object_arrays_name_the_dtype(name, dtype):
    """Never a KeyError from deep inside, never a silent int64 (NumPy's sum of an object array
    of ints): a TypeError naming the function and the dtype."""
    with pytest.raises(TypeError, match=rf"gpuscalar\.{name}\(\).*{dtype.split('[')[0]}"):
        ALL_REDUCTIONS[name](NOT_NUMERIC[dtype])


# ---- global_norm without xp.stack (issue 15: a hidden host-to-device copy in CuPy) ----------


@pytest.mark.parametrize("ord", [2, 1, math.inf, 3, 0.5])
@pytest.mark.parametrize("count", [2, 8, 9, 12, 17])
def test_global_norm_of_many_arrays_equals_one_stack_of_their_norms(xp, rng, ord, count):
    """Past 8 arrays the per-array norms are gathered 8 at a time into slices of one vector:
    bit for bit what one ``stack`` of them gives (what global_norm computed before), and the
    norm of all elements concatenated."""
    arrays = [rng.standard_normal(int(rng.integers(1, 6))) for _ in range(count)]
    arrays[1] = arrays[1].astype(np.float32)  # a mixed-dtype model: float64 result
    with gs.count_syncs() as counter:
        total = gs.global_norm([xp.asarray(a) for a in arrays], ord=ord)
    assert counter.count == 0 and total.dtype == np.float64
    norms = np.stack([np.linalg.vector_norm(a, ord=ord) for a in arrays]).astype(np.float64)
    one_stack = np.max(norms) if ord == math.inf else np.linalg.vector_norm(norms, ord=ord)
    assert total.item() == one_stack
    flat = np.concatenate([a.astype(np.float64) for a in arrays])
    assert total.item() == pytest.approx(np.linalg.vector_norm(flat, ord=ord), rel=1e-6)


@pytest.mark.parametrize("count, ops", [(1, 1), (2, 2 + 2), (8, 8 + 2), (9, 9 + 1 + 2 + 1),
                                        (16, 16 + 1 + 2 + 1), (17, 17 + 1 + 3 + 1)])
def test_global_norm_device_ops(xp, count, ops):
    """n norms, their gathering (one stack up to 8; above, the vector and one stack per 8) and
    the norm of the norms; one array is just its norm."""
    arrays = [xp.ones(3) for _ in range(count)]
    with gs.count_syncs() as counter:
        gs.global_norm(arrays)
    assert counter.device_ops == ops


def test_global_norm_and_all_finite_run_in_a_captured_steps_body():
    """More than 8 same-dtype per-array results: ``xp.stack`` of them is CuPy's pointer-table
    upload, which the strict device refuses in a step's body; the slot vector is not one."""
    from gpuscalar import optim, strict, sync

    arrays = [strict.xp.ones(3) * i for i in range(12)]
    with sync.graph_body(), gs.count_syncs() as counter:
        total = gs.global_norm(arrays)
        inf = gs.global_norm(arrays, ord=math.inf)
        finite = optim.all_finite(arrays)
    assert counter.count == 0
    assert total.item() == pytest.approx(math.sqrt(3 * sum(i * i for i in range(12))))
    assert inf.item() == 11.0 and bool(finite) is True
    with sync.graph_body(), pytest.raises(RuntimeError, match="H2D"):
        strict.xp.stack([gs.norm(a).array for a in arrays])  # what global_norm did before
