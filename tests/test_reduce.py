"""Device-resident reductions equal NumPy's; unbroadcast and global_norm; never a sync."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gpuscalar as gs

from .helpers import backend_name, host

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
    bit for bit what one ``stack`` of them gives, and the norm of all elements concatenated.

    "One stack" is computed by the backend's own norm kernels: NumPy's on the host backends;
    on CuPy, CuPy's (``cupy.linalg.norm`` along axis 0, as gpuscalar calls it: one launch for
    ord 2; ``cupy.max``) on the device, since CuPy's
    reductions add in another order than NumPy's and ``pow`` is CUDA's (a few ulps from
    NumPy's for ord 1, 3, 0.5 on an H200): the gathering, not the reduction order, is
    what is checked bit for bit."""
    arrays = [rng.standard_normal(int(rng.integers(1, 6))) for _ in range(count)]
    arrays[1] = arrays[1].astype(np.float32)  # a mixed-dtype model: float64 result
    with gs.count_syncs() as counter:
        total = gs.global_norm([xp.asarray(a) for a in arrays], ord=ord)
    assert counter.count == 0 and total.dtype == np.float64
    # the float32 array is converted to float64 first, as a concatenation converts it
    if backend_name(xp) == "cupy":
        device_norms = xp.stack([xp.linalg.norm(xp.asarray(a.astype(np.float64)), ord=ord,
                                                axis=0) for a in arrays])
        one_stack = host(xp.max(device_norms) if ord == math.inf
                         else xp.linalg.norm(device_norms, ord=ord, axis=0))
    else:
        norms = np.stack([np.linalg.vector_norm(a.astype(np.float64), ord=ord) for a in arrays])
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


# ---- issue 21: one array is one array; global_norm is the norm of the concatenation ---------

#: The functions taking "one array or many", each called on its argument; clip_grad_norm scales
#: it in place (its result is the norm before clipping).
MANY_ARRAY_FUNCTIONS = {
    "global_norm": gs.global_norm,
    "global_norm-inf": lambda arrays: gs.global_norm(arrays, ord=math.inf),
    "all_finite": gs.all_finite,
    "clip_grad_norm": lambda arrays: gs.clip_grad_norm(arrays, 1.0),
}


def _counted(call, *args):
    with gs.count_syncs() as counter:
        result = call(*args)
    assert counter.count == 0
    return result, counter.device_ops


@pytest.mark.parametrize("shape", [(1000,), (10, 100), (2, 5, 4), (1,), ()])
@pytest.mark.parametrize("name", list(MANY_ARRAY_FUNCTIONS))
def test_a_single_array_is_one_array_not_its_elements(xp, name, shape):
    """``f(x)`` is ``f([x])``, whatever ``x.ndim`` (0-d included): the same result, bit for bit,
    and the same device ops (before issue 21, a 1,000-element vector was split into its
    elements: 1,127 ops for global_norm, 2,002 for all_finite and 2,127 for clip_grad_norm on the
    strict device)."""
    data = np.linspace(-3.0, 5.0, math.prod(shape)).reshape(shape)
    alone, listed = xp.array(data, copy=True), xp.array(data, copy=True)
    function = MANY_ARRAY_FUNCTIONS[name]
    got, ops = _counted(function, alone)
    expected, expected_ops = _counted(function, [listed])
    assert ops == expected_ops
    if name != "clip_grad_norm":  # (the norm and a multiply; + the coefficient's ops if eager)
        assert ops == (2 if name == "all_finite" else 1)
    assert isinstance(got, gs.GPUScalar) and got.dtype == expected.dtype
    assert host(got) == host(expected)
    np.testing.assert_array_equal(host(alone), host(listed))  # clip scaled both the same way
    if name == "clip_grad_norm" and shape:
        assert host(got) == pytest.approx(np.linalg.norm(data.ravel()), rel=1e-12)
        np.testing.assert_allclose(host(alone), data / (host(got) + 1e-6), rtol=1e-12)


@pytest.mark.parametrize("name", list(MANY_ARRAY_FUNCTIONS))
def test_any_iterable_of_arrays_is_the_list_of_them(xp, name):
    """A list, a tuple and a generator of arrays give the same result (a generator is consumed
    once; clip_grad_norm still scales each array it yielded)."""
    datas = [np.arange(1.0, 7.0).reshape(2, 3), np.array([-4.0, 0.5]), np.array(2.0)]
    outcomes = []
    for make in (list, tuple, lambda arrays: (a for a in arrays)):
        arrays = [xp.array(d, copy=True) for d in datas]
        result = host(MANY_ARRAY_FUNCTIONS[name](make(arrays)))
        outcomes.append((result, [host(a) for a in arrays]))
    for result, after in outcomes[1:]:
        assert result == outcomes[0][0]
        for got, expected in zip(after, outcomes[0][1], strict=True):
            np.testing.assert_array_equal(got, expected)


def test_a_gpuscalar_is_a_0d_array_for_global_norm_and_all_finite(xp):
    """A GPUScalar (a loss, a scalar gradient) counts as a 0-d array, alone or in a list;
    clip_grad_norm refuses one (it cannot be scaled in place, tests/test_optim.py)."""
    vector = xp.asarray(np.array([3.0, 4.0]))
    s = gs.asscalar(-12.0, like=vector)
    assert host(gs.global_norm(s)) == 12.0 == host(gs.global_norm([s]))
    assert host(gs.global_norm([vector, s])) == 13.0
    assert host(gs.global_norm((vector, s), ord=math.inf)) == 12.0
    assert bool(gs.all_finite(s)) is True and bool(gs.all_finite([vector, s])) is True
    bad = gs.asscalar(np.nan, like=vector)
    assert bool(gs.all_finite(bad)) is False and bool(gs.all_finite([vector, bad])) is False
    with gs.count_syncs() as counter:
        gs.global_norm(s)
        gs.all_finite(s)
    assert counter.count == 0 and counter.device_ops == 1 + 2


class _ForeignArray:
    """An array-like no backend owns (a PyTorch or JAX array): shape and dtype, iterable."""

    shape, dtype = (2,), np.dtype(np.float64)

    def __iter__(self):
        return iter([np.ones(()), np.ones(())])


@pytest.mark.parametrize("name", ["global_norm", "all_finite", "clip_grad_norm"])
@pytest.mark.parametrize(("bad", "error", "words"), [
    (3.0, TypeError, r"array, a GPUScalar or an iterable of them, got 3\.0"),
    (None, TypeError, "iterable of them, got None"),
    (np.float64(2.0), TypeError, r"got np\.float64\(2\.0\), which is not a NumPy or CuPy array"),
    (_ForeignArray(), TypeError, r"got a tests\._ForeignArray of shape \(2,\) and "
                                 "dtype float64, which is not a NumPy or CuPy array"),
    ("abc", TypeError, "iterable of them, got 'abc'"),
    ({"w": np.ones(3)}, TypeError, r"got a dict \(pass its \.values\(\)\)"),
    ([], ValueError, "needs at least one .*array, got an empty list"),
    ((a for a in ()), ValueError, "needs at least one .*array, got an empty generator"),
], ids=["float", "none", "numpy-scalar", "foreign-array", "str", "dict", "empty", "empty-gen"])
def test_what_is_neither_an_array_nor_arrays_is_named(name, bad, error, words):
    function = getattr(gs, name)
    args = (bad, 1.0) if name == "clip_grad_norm" else (bad,)
    with pytest.raises(error, match=rf"gpuscalar\.{name}\(\).*{words}"):
        function(*args)


@pytest.mark.parametrize("name", ["global_norm", "all_finite", "clip_grad_norm"])
def test_good_arrays_are_never_described(xp, name, monkeypatch):
    """Naming a value for an error formats it (each array's shape and dtype): done only when
    there is an error to raise, never on the way of a good list (it was ~45% of a
    `global_norm` of six CuPy arrays' host cost)."""
    def refuse(value):
        raise AssertionError(f"described {type(value).__name__} on the good path")

    monkeypatch.setattr("gpuscalar.reduce.describe", refuse)
    arrays = [xp.ones((2, 3)), xp.ones(4)]
    function = getattr(gs, name)
    for passed in (arrays, tuple(arrays), iter(arrays)):
        function(*((passed, 1.0) if name == "clip_grad_norm" else (passed,)))


def test_global_norm_and_all_finite_name_the_bad_item():
    from gpuscalar import strict

    with pytest.raises(TypeError, match=r"global_norm\(\): arrays\[1\] must be a NumPy or "
                                        r"CuPy array or a GPUScalar, got list"):
        gs.global_norm([np.ones(2), [1.0]])
    with pytest.raises(TypeError, match=r"global_norm\(\): arrays\[1\] is a strict array but "
                                        r"arrays\[0\] is numpy"):
        gs.global_norm([np.ones(2), strict.xp.ones(2)])
    with pytest.raises(TypeError, match=r"all_finite\(\): arrays\[1\] must be a numpy array, "
                                        "got a strict one"):
        gs.all_finite([np.ones(2), strict.xp.ones(2)])
    with pytest.raises(TypeError, match=r"global_norm\(\) cannot reduce arrays\[1\], an array "
                                        "of dtype timedelta64"):
        gs.global_norm([np.ones(2), np.array([1], dtype="timedelta64[s]")])
    with pytest.raises(TypeError, match=r"global_norm\(\) cannot reduce arrays, an array of "
                                        "dtype object"):
        gs.global_norm(np.array([1.0], dtype=object))
    with strict.device(1):
        elsewhere = strict.xp.ones(2)
    for function in (gs.global_norm, gs.all_finite):
        with pytest.raises(ValueError, match=r"arrays\[1\] is on device 1 but arrays\[0\] on 0"):
            function([strict.xp.ones(2), elsewhere])


# ---- global_norm(arrays, ord) == numpy.linalg.norm(numpy.concatenate(...), ord) ---------------

#: Every kind of ord global_norm takes: NumPy's named vector norms and other p, negative too.
ORDS = [2, 1, math.inf, -math.inf, 0, 3, 0.5, -1, -2.5, None]
NORM_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.bool_, np.complex64,
               np.complex128]
#: Element values: small (no float16 overflow for any ord above, with the sizes drawn below),
#: zeros for ord=0 and negative p, and non-finite values for the inexact dtypes.
FINITE_VALUES = [0.0, 0.5, -1.0, 2.0, -3.0, 1.25, -0.75, 2.5]
NON_FINITE = [np.nan, np.inf, -np.inf]


def _concatenation_norm(datas, ord):
    """What global_norm must equal: NumPy's norm of every element, concatenated."""
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 ** -p, inf - inf: NumPy's values
        return np.linalg.norm(np.concatenate([d.ravel() for d in datas]), ord)


@st.composite
def _arrays_for_norm(draw):
    """1 to 12 arrays (over 8: gathered in chunks), 0-d or up to 3-D with empty axes, of one
    dtype or mixed (float16 among float64, int8 among float32, bool, complex ...)."""
    count = draw(st.integers(1, 12))
    one = draw(st.sampled_from(NORM_DTYPES))
    mixed = draw(st.booleans())
    datas = []
    for _ in range(count):
        dtype = np.dtype(draw(st.sampled_from(NORM_DTYPES)) if mixed else one)
        values = FINITE_VALUES + (NON_FINITE if dtype.kind in "fc" and draw(st.booleans()) else [])
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
        data = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from(values)))
        datas.append((data * (1 - 0.5j) if dtype.kind == "c" else data).astype(dtype))
    return datas


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # xp: a module
@given(datas=_arrays_for_norm(), ord=st.sampled_from(ORDS))
def test_global_norm_is_the_norm_of_the_concatenation(xp, datas, ord):
    """Value and dtype of ``numpy.linalg.norm(numpy.concatenate([a.ravel() ...]), ord)`` for
    every ord. Bit for bit on every backend for ``inf``, ``-inf`` and ``0`` (a maximum, a
    minimum, a count: exact whatever the order, CuPy's included; but a complex ``|z|`` on CuPy
    is CUDA's ``hypot``, within the tolerance below of NumPy's); on NumPy and the strict
    device, where the reduction order is NumPy's, also for one array and every ord but 2
    (NumPy's ``linalg.norm`` of a vector takes a ``dot`` there). Otherwise (per-array norms
    combined, or CuPy's order of summation and CUDA's ``pow``) within the stated tolerance
    ``rtol = 8 * eps(dtype) / min(1, |p|)`` (a root 1/p of a sum amplifies its rounding; p is
    never 0 there)."""
    try:
        expected = _concatenation_norm(datas, ord)
    except ValueError:  # the minimum of no elements (ord=-inf)
        assert ord == -math.inf and all(d.size == 0 for d in datas)
        with pytest.raises(ValueError, match="no elements"):
            gs.global_norm([xp.asarray(d) for d in datas], ord=ord)
        return
    arrays = [xp.asarray(d) for d in datas]
    with gs.count_syncs() as counter, np.errstate(divide="ignore", invalid="ignore"):
        total = gs.global_norm(arrays, ord=ord)
    assert counter.count == 0
    assert isinstance(total, gs.GPUScalar) and total.dtype == expected.dtype
    got = host(total)
    p = 2 if ord is None else ord
    on_cupy = backend_name(xp) == "cupy"
    # On CuPy a complex |z| is CUDA's hypot (a few ulps from NumPy's): exact for a count only.
    magnitudes_exact = not (on_cupy and any(d.dtype.kind == "c" for d in datas))
    exact = p == 0 or (p in (math.inf, -math.inf) and magnitudes_exact) or (
        len(datas) == 1 and p != 2 and not on_cupy)
    got = np.asarray(got, expected.dtype)  # (a Python float from the device: its exact value)
    if exact:
        np.testing.assert_array_equal(got, expected)
    else:
        rtol = 8 * float(np.finfo(expected.dtype).eps) / min(1.0, abs(p))
        np.testing.assert_allclose(got, expected, rtol=rtol)


@pytest.mark.parametrize("ord", [
    "fro", "nuc", "inf", float("nan"), np.nan, True, np.bool_(False), 1j, [2], (1, 2)],
    ids=["fro", "nuc", "str-inf", "nan", "np-nan", "True", "np-bool", "complex", "list", "tuple"])
def test_global_norm_refuses_an_unsupported_ord_by_name(xp, ord):
    """A ValueError naming the ord, before any device work (NumPy would give nan for nan, the
    1-norm for True)."""
    arrays = [xp.ones(3), xp.ones(2)]
    with gs.count_syncs() as counter, pytest.raises(
            ValueError, match=r"global_norm\(\): unsupported ord .*a real number p"):
        gs.global_norm(arrays, ord=ord)
    assert counter.device_ops == 0


def test_global_norm_refuses_a_gpuscalar_ord_without_reading_it():
    with gs.sync_guard("error"), pytest.raises(
            ValueError, match="unsupported ord a GPUScalar of dtype float64 .*would be a sync"):
        gs.global_norm([np.ones(3)], ord=gs.asscalar(2.0))


def test_global_norm_ord_none_is_2_and_numpy_real_types_are_taken(xp):
    arrays = [xp.asarray(np.array([3.0])), xp.asarray(np.array([[4.0]]))]
    assert host(gs.global_norm(arrays, ord=None)) == 5.0 == host(gs.global_norm(arrays))
    assert host(gs.global_norm(arrays, ord=np.float32(1.0))) == 7.0
    assert host(gs.global_norm(arrays, ord=np.int64(0))) == 2.0


@pytest.mark.parametrize("ord", [math.inf, -math.inf])
def test_global_norm_of_arrays_with_no_elements_for_max_and_min(xp, ord):
    """Arrays with no elements add nothing to a maximum or minimum (CuPy refuses the max of an
    empty array; global_norm never asks it): no elements at all is 0 for ``inf``, as NumPy gives,
    and a ValueError for ``-inf``, as NumPy raises."""
    empty, values = xp.zeros((0, 3)), xp.asarray(np.array([-2.0, 0.5]))
    expected = 2.0 if ord > 0 else 0.5
    with gs.count_syncs() as counter:
        total = gs.global_norm([empty, values, empty], ord=ord)
    assert counter.count == 0 and counter.device_ops == 1  # the empty arrays cost nothing
    assert host(total) == expected
    assert host(gs.global_norm([values, empty[:, :0]], ord=ord)) == expected
    if ord > 0:
        total = gs.global_norm([empty, xp.zeros(0, dtype=np.float32)], ord=ord)
        assert total.dtype == np.float64 and host(total) == 0.0
        assert np.linalg.norm(np.zeros(0), ord) == 0.0
    else:
        with pytest.raises(ValueError, match=r"ord=-inf\): the arrays have no elements"):
            gs.global_norm([empty, empty], ord=ord)
        with pytest.raises(ValueError):
            np.linalg.norm(np.zeros(0), ord)


@pytest.mark.parametrize(("dtypes", "converted"), [
    ((np.float32, np.float32), 0), ((np.float32, np.float64), 1), ((np.float16, np.float64), 1),
    ((np.int8, np.float32), 1), ((np.int8, np.int32), 0), ((np.complex64, np.float32), 0),
    ((np.complex64, np.float64), 1), ((np.float32, np.float64, np.float32), 2)])
def test_global_norm_converts_only_arrays_whose_norm_has_another_dtype(xp, dtypes, converted):
    """As the concatenation converts each array to the common dtype, an array whose own norm
    would have another dtype than the result is converted first: one op each (none when all
    norms share the result's dtype: int8 and int32 norms are both float64)."""
    arrays = [xp.asarray(np.arange(1, 4).astype(d)) for d in dtypes]
    with gs.count_syncs() as counter:
        total = gs.global_norm(arrays)
    assert counter.device_ops == converted + len(arrays) + 1 + 1  # + norms, stack, norm
    expected = _concatenation_norm([host(a) for a in arrays], 2)
    assert total.dtype == expected.dtype
    assert host(total) == pytest.approx(float(expected), rel=1e-6)


# ---- the single-array path through CuPy's real dispatch (fake memory, recording seam) --------


@pytest.mark.needs_cupy
@pytest.mark.parametrize("shape", [(1000,), (10, 100), ()])
def test_a_single_cupy_array_is_one_array_through_cupys_dispatch(shape):
    """On real ``cupy.ndarray``s over fake memory, each launch checked against CuPy itself
    (`tests.cupy_seam.RecordingSeam`): ``f(x)`` launches exactly what ``f([x])`` launches
    (one norm; isfinite and all; a norm and the clip's multiply), never one per element, and
    copies nothing from the host."""
    from tests.cupy_fake import cupy_or_fail, fake_memory, host_view
    from tests.cupy_seam import recording

    cupy_or_fail()
    data = np.linspace(-3.0, 5.0, math.prod(shape)).reshape(shape)
    # lazy: clip's coefficient is then computed inside the multiply's kernel, a launch through
    # the seam (eager GPUScalar arithmetic calls CuPy's ufuncs itself, past the seam)
    with gs.lazy(True), fake_memory() as memory, recording(memory) as seam:
        for name, function in MANY_ARRAY_FUNCTIONS.items():
            launched = []
            for argument in (lambda x: x, lambda x: [x]):
                x = seam.array(data)
                seam.clear()
                result = function(argument(x))
                assert isinstance(result, gs.GPUScalar)
                launched.append([(launch.kind, launch.name) for launch in seam.launches])
                assert not seam.uploads and not seam.reads, name
                if name.startswith("global_norm"):  # cupy.linalg.norm, computed by the seam
                    ord = math.inf if name.endswith("inf") else 2
                    assert float(result) == pytest.approx(np.linalg.norm(data.ravel(), ord))
                    seam.clear()
                elif name == "all_finite":
                    assert bool(result) is True
                    seam.clear()
                else:
                    assert host_view(x).shape == shape
            assert launched[0] == launched[1], name
            assert len(launched[0]) == (2 if name in ("all_finite", "clip_grad_norm") else 1)


# ---- dot, vdot and norm in loop, branch and capture bodies (issue 23) ---------------------------

BODY_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _values(rng, shape, dtype):
    v = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        v = v + 1j * rng.standard_normal(shape)
    return v.astype(dtype)


def _products(x, y, m):
    """dot of vectors, of a matrix and a vector, of an N-d array and a matrix; vdot; norm."""
    return {"dot": gs.dot(x, y), "matrix-dot": gs.dot(m, y), "nd-dot": gs.dot(m.reshape(2, 2, 5),
                                                                           m.T),
            "vdot": gs.vdot(x, y), "norm": gs.norm(x), "norm-1": gs.norm(m, ord=1)}


@pytest.mark.parametrize(("dtype_x", "dtype_y"),
                         [(d, d) for d in BODY_DTYPES]
                         + [(np.float32, np.float64), (np.float64, np.complex64),
                            (np.complex64, np.float32)])
def test_dot_vdot_norm_in_a_loop_a_branch_and_a_capture_equal_the_eager_values(
        xp, rng, dtype_x, dtype_y):
    x, y = xp.asarray(_values(rng, 5, dtype_x)), xp.asarray(_values(rng, 5, dtype_y))
    m = xp.asarray(_values(rng, (4, 5), dtype_x))
    first = _products(x, y, m)
    eager = {name: np.asarray(host(value)) for name, value in first.items()}
    dtypes = {name: value.dtype for name, value in first.items()}
    assert dtypes["dot"] == np.result_type(dtype_x, dtype_y)  # promotes as xp.dot
    tolerance = 1e-5 if np.float32 in (np.dtype(dtype_x).type, np.dtype(dtype_y).type) or (
        np.complex64 in (np.dtype(dtype_x).type, np.dtype(dtype_y).type)) else 1e-12
    slots = {name: xp.zeros(value.shape, dtype=dtypes[name]) for name, value in eager.items()}

    def store():
        for name, value in _products(x, y, m).items():  # (a GPUScalar's 0-d array: a copy)
            slots[name][...] = value.array if isinstance(value, gs.GPUScalar) else value

    def check(where):
        for name, value in eager.items():
            np.testing.assert_allclose(host(slots[name]), value, rtol=tolerance,
                                       err_msg=f"{name} in {where}")
            slots[name][...] = 0

    i = xp.zeros((), dtype=np.int64)

    def body(i):
        store()
        i += 1

    with gs.count_syncs() as counter:
        gs.while_loop(lambda i: i < 1, body, i, max_iter=2)
    assert counter.count == 0
    check("a loop body")
    with gs.count_syncs() as counter:
        gs.cond(gs.GPUScalar(i) > 0, store, None)
    assert counter.count == 0
    check("a branch")
    step = gs.capture(store, warmup=0)
    step()
    check("a captured step")


def test_vdot_and_dot_name_vectors_of_different_lengths(xp):
    with pytest.raises(ValueError):
        gs.dot(xp.ones(3), xp.ones(4))
    with pytest.raises(ValueError):
        gs.vdot(xp.ones(3), xp.ones(4))


# ---- CuPy: the recorded paths through the recording seam, and NVRTC ----------------------------


def _seam_loop(seam, body_fn, *state):
    i = seam.array(np.array(0.0))
    one, two = gs.asscalar(1.0, like=i), gs.asscalar(2.0, like=i)
    seam.clear()

    def body(i, *state):
        body_fn(*state)
        i += one

    gs.while_loop(lambda i, *state: i < two, body, i, *state, max_iter=5)


@pytest.mark.needs_cupy
@pytest.mark.parametrize(("dtype_x", "dtype_y", "n"),
                         [(d, d, 5) for d in BODY_DTYPES]
                         + [(np.float32, np.float64, 5), (np.float64, np.complex128, 5000)])
def test_dot_and_vdot_in_a_cupy_loop_body_are_gpuscalars_kernel_not_cublas(dtype_x, dtype_y, n):
    """Recorded in a loop body, a vector dot is gpuscalar's own kernel (one launch; two with
    partial sums above BLOCK * PER_THREAD elements), checked against its C signature and
    compiled by NVRTC; no cuBLAS call, no upload. Outside a recording it stays cupy.dot."""
    from gpuscalar.devices.cupy import products  # noqa: PLC0415
    from tests.cupy_fake import cupy_or_fail, fake_memory  # noqa: PLC0415
    from tests.cupy_seam import recording  # noqa: PLC0415

    cupy_or_fail()
    rng = np.random.default_rng(3)
    with fake_memory() as memory, recording(memory, compile=True) as seam:
        seam.records_only = True
        x = seam.array(_values(rng, 2 * n, dtype_x))[::2]  # strided
        y = seam.array(_values(rng, n, dtype_y))
        found = []

        def body(x, y):
            found.extend((gs.dot(x, y), gs.vdot(x, y)))
            gs.norm(y)  # cupy.linalg.norm: CuPy's own kernels, no library call

        _seam_loop(seam, body, x, y)
        assert [s.dtype for s in found] == [np.result_type(dtype_x, dtype_y)] * 2
        assert [launch.name for launch in seam.launches].count("norm") == 1
        raw = [launch for launch in seam.launches if launch.kind == "raw"]
        dot_name, sum_name = products.dot_kernel_names(np.dtype(dtype_x), np.dtype(dtype_y))
        names = [launch.name for launch in raw]
        per_dot = 1 if products.blocks_for(n) == 1 else 2
        assert names.count(dot_name) == 2 and names.count(sum_name) == 2 * (per_dot - 1)
        conj = [launch.args[2][5] for launch in raw if launch.name == dot_name]
        assert conj == [np.int32(0), np.int32(1)] and raw[1].args[2][1] == 2  # x's step
        assert seam.count("cublas") == 0 and not seam.uploads and not seam.reads
        seam.clear()
        gs.dot(x, y)  # eager: the same kernel (the same bits as in the body)
        assert [launch.name for launch in seam.launches] == [dot_name] + [sum_name] * (per_dot - 1)


@pytest.mark.needs_cupy
def test_a_matrix_dot_in_a_cupy_loop_body_is_gs_matmul_on_its_own_handle():
    from tests.cupy_fake import cupy_or_fail, fake_memory  # noqa: PLC0415
    from tests.cupy_seam import recording  # noqa: PLC0415

    cupy_or_fail()
    with fake_memory() as memory, recording(memory) as seam:
        seam.records_only = True
        m, v = seam.array(np.ones((3, 4))), seam.array(np.ones(4, np.float32))
        _seam_loop(seam, lambda m, v: gs.dot(m, v), m, v)
        blas = [launch.name for launch in seam.launches if launch.kind == "cublas"]
        assert blas == ["cublasDgemv_v2"] and not seam.uploads  # float32 v promoted first
        assert any(launch.name == "astype" for launch in seam.launches)


@pytest.mark.parametrize(("dtype_x", "dtype_y"),
                         list(__import__("itertools").product(BODY_DTYPES, repeat=2)))
def test_every_dot_kernel_compiles(nvrtc, dtype_x, dtype_y):
    from gpuscalar.devices.cupy import products  # noqa: PLC0415
    from gpuscalar.devices.cupy.backend import CupyBackend  # noqa: PLC0415

    from . import nvrtc as nv  # noqa: PLC0415

    x, y = np.dtype(dtype_x), np.dtype(dtype_y)
    ptx = nv.compile_source(nvrtc, products.dot_source(x, y), "dot",
                            nv.cupy_options(CupyBackend.kernel_options))
    for name in products.dot_kernel_names(x, y):
        assert f".entry {name}" in ptx
