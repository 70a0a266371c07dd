"""The compiled host evaluator (`expr.host_program`, `gpuscalar.lazy.hostprogram`):
`expr.fold_plan`'s NumPy evaluation, bit for bit, with float64 steps run as Python float
operations and float32 and complex ones as NumPy's scalar operators (a NaN result, or a zero
divisor, computed again by the ufunc), no warnings, the same dtypes and Python types."""

from __future__ import annotations

import math
import struct
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuscalar as gs
from gpuscalar import known, reads
from gpuscalar.lazy import expr, hostprogram, keytable

from . import recipes
from .cupy_fake import cupy_or_fail

F8, BOOL = np.dtype(np.float64), np.dtype(np.bool_)


def reference(plan: expr.Plan, sources: list[Any]) -> np.ndarray:
    """The host evaluation the compiled one must equal: `expr.fold_plan` with each op's
    `OpKind.on_host`, quiet, each leaf's host value as its dtype's NumPy scalar."""
    values = [kind[1].type(value) if kind[0] == "leaf" else value
              for value, kind in zip(sources, plan.leaf_kinds, strict=True)]
    with np.errstate(all="ignore"):
        return np.asarray(expr.fold_plan(plan, values))


def compiled(plan: expr.Plan, sources: list[Any]) -> tuple[np.ndarray, Any]:
    """The compiled evaluation, as `evaluate_plan` (a 0-d array) and as a read gives it (a
    Python number), with no warning and NumPy's error state left as it was."""
    run, gives_python = expr.host_program(plan)
    state = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = run(list(sources))
    assert np.geterr() == state
    python = value if gives_python else known.python_value(value)
    if gives_python:
        assert type(value) in (float, bool)
    return np.asarray(value), python


def assert_same(plan: expr.Plan, sources: list[Any]) -> None:
    """Equal dtypes and bits, the same Python number, or the same error (NumPy's, for an
    integer to a negative power)."""
    try:
        expected = reference(plan, sources)
    except (ValueError, TypeError, OverflowError, ZeroDivisionError) as error:
        with pytest.raises(type(error)):
            compiled(plan, sources)
        return
    array, python = compiled(plan, sources)
    assert array.dtype == expected.dtype, (expr.describe_structure(plan.key), sources)
    assert array.tobytes() == expected.tobytes(), (expr.describe_structure(plan.key), sources,
                                                   array, expected)
    want = known.python_value(expected)
    assert type(python) is type(want)
    assert np.asarray(python).tobytes() == np.asarray(want).tobytes()


def _bits(value: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", value))[0]


#: float64 values that meet every IEEE case: NaNs of both signs and several payloads (quiet
#: and signalling), infinities, zeros of both signs, subnormals, the extremes, ordinary values.
SPECIAL = [_bits(b) for b in (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000123,
                              0xFFF0000000000456, 0x7FF0000000000001)] + [
    math.inf, -math.inf, 0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308,
    1.7976931348623157e308, -1.7976931348623157e308, 1.0, -1.0, 0.1, 3.0, 1e300, 1e-300]
floats64 = st.one_of(st.sampled_from(SPECIAL), st.floats(allow_nan=True, allow_infinity=True),
                     st.integers(0, 2**64 - 1).map(_bits))


def _leaf(dtype: np.dtype = F8) -> np.ndarray:
    return np.zeros((), dtype)  # a 0-d array: a leaf (its value comes with the sources)


def _step_node(name: str, children: tuple[Any, ...]) -> expr.Node:
    arity = len(children)
    out = BOOL if hostprogram.FLOAT64_OPERATIONS[name][1] == BOOL else F8
    return expr.make_node(expr.get_op("ufunc", name, (F8,) * arity, (out,)), children)


@pytest.mark.parametrize("name", sorted(hostprogram.FLOAT64_OPERATIONS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=floats64, b=floats64, form=st.sampled_from(["python", "numpy", "array"]))
def test_every_python_float_step_gives_the_ufuncs_bits(name, a, b, form):
    """Each float64 step run as a Python float operation: the ufunc's bits for every pair of
    values (NaNs of any payload, infinities, signed zeros, subnormals), whichever form the
    leaf's host value takes (a read's Python float, a NumPy scalar, a host array)."""
    arity = 2 if "{1}" in hostprogram.FLOAT64_OPERATIONS[name][0] else 1
    value = {"python": a, "numpy": np.float64(a), "array": np.asarray(a)}[form]
    for children, sources in (((_leaf(), _leaf())[:arity], [value, b][:arity]),
                              ((_leaf(), np.float64(b))[:arity], [value, np.float64(b)][:arity])):
        plan = expr.plan_of(_step_node(name, children))
        assert expr.host_program(plan)[1]  # taken: the value is Python's
        assert_same(plan, sources)


@pytest.mark.parametrize("name", sorted(hostprogram.FLOAT64_OPERATIONS))
def test_every_python_float_step_on_every_pair_of_special_values(name, monkeypatch):
    """The same on every pair of `SPECIAL` values, each by a program compiled afresh and run
    once, then by one run many times: CPython adds two floats in its generic code at first
    and in its specialized instruction later, which give different NaNs for two NaNs (the
    ufunc gives it)."""
    arity = 2 if "{1}" in hostprogram.FLOAT64_OPERATIONS[name][0] else 1
    plan = expr.plan_of(_step_node(name, (_leaf(), _leaf())[:arity]))
    pairs = [[a, b][:arity] for a in SPECIAL for b in SPECIAL[:len(SPECIAL) if arity == 2 else 1]]
    for pair in pairs:
        monkeypatch.setattr(expr, "_HOST_PROGRAMS", {})
        assert_same(plan, pair)
    for pair in pairs:
        assert_same(plan, pair)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(floats64, min_size=4, max_size=4),
       names=st.lists(st.sampled_from(["add", "subtract", "multiply", "divide"]), min_size=3,
                      max_size=3),
       last=st.sampled_from(["less", "equal", "negative", "sqrt", "maximum", "hypot"]))
def test_chains_of_python_float_steps_give_the_folds_bits(values, names, last):
    """Steps feeding steps (a NaN recomputed by the ufunc flows on), ending in a comparison,
    a unary step, a maximum, or a step that is no Python float operation (NumPy's own,
    quiet)."""
    a, b, c, d = (_leaf() for _ in range(4))
    node = _step_node(names[0], (_step_node(names[1], (a, b)), _step_node(names[2], (c, d))))
    if last == "hypot":
        node = expr.make_node(expr.get_op("ufunc", "hypot", (F8, F8), (F8,)),
                              (node, np.float64(0.5)))
        assert not expr.host_program(expr.plan_of(node))[1]
    else:
        arity = 2 if "{1}" in hostprogram.FLOAT64_OPERATIONS[last][0] else 1
        node = _step_node(last, (node, np.float64(0.5))[:arity])
    assert_same(expr.plan_of(node), [*values, np.float64(0.5)][:len(expr.leaves_of(node))])


def _bits32(value: int) -> float:
    return float(np.uint32(value).view(np.float32))


#: float32 values for every IEEE case, as `SPECIAL`.
SPECIAL32 = [_bits32(b) for b in (0x7FC00000, 0xFFC00000, 0x7FC00123, 0xFF800456,
                                  0x7F800001)] + [
    math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-45, 1.1754943508222875e-38,
    3.4028234663852886e38, -3.4028234663852886e38, 1.0, -1.0, float(np.float32(0.1)), 3.0]
floats32 = st.one_of(st.sampled_from(SPECIAL32), st.floats(width=32),
                     st.integers(0, 2**32 - 1).map(_bits32))
SCALAR_CASES = sorted((name, dtype.name) for name, (_, dtypes, _) in
                      hostprogram.SCALAR_OPERATIONS.items() for dtype in dtypes)


def _scalar_value(dtype: np.dtype, data: Any) -> Any:
    """A host value of ``dtype``: a read's Python number (float32: the float it is exactly)."""
    if dtype.kind == "c":
        part = floats32 if dtype == np.complex64 else floats64
        return complex(data.draw(part), data.draw(part))
    return data.draw(floats32)


@pytest.mark.parametrize(("name", "dtype"), SCALAR_CASES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_numpy_scalar_step_gives_the_ufuncs_bits(name, dtype, data):
    """float32 and complex steps run as NumPy's scalar operators (in a quiet function): the
    ufunc's bits for every pair of values, NaNs of any payload included (the ufunc's)."""
    d = np.dtype(dtype)
    form, _, compares = hostprogram.SCALAR_OPERATIONS[name]
    arity = 2 if "{1}" in form else 1
    op = expr.get_op("ufunc", name, (d,) * arity, (BOOL if compares else d,))
    plan = expr.plan_of(expr.make_node(op, (_leaf(d), _leaf(d))[:arity]))
    a, b = _scalar_value(d, data), _scalar_value(d, data)
    assert_same(plan, [a, b][:arity])
    assert_same(plan, [d.type(a), np.asarray(b, d)][:arity])
    constant = expr.plan_of(expr.make_node(op, (_leaf(d), d.type(b))[:arity]))
    assert_same(constant, [a, d.type(b)][:arity])


@pytest.mark.parametrize(("name", "dtype"), SCALAR_CASES)
def test_every_numpy_scalar_step_on_every_pair_of_special_values(name, dtype):
    d = np.dtype(dtype)
    form, _, compares = hostprogram.SCALAR_OPERATIONS[name]
    arity = 2 if "{1}" in form else 1
    op = expr.get_op("ufunc", name, (d,) * arity, (BOOL if compares else d,))
    plan = expr.plan_of(expr.make_node(op, (_leaf(d), _leaf(d))[:arity]))
    values = SPECIAL32 if d.kind == "f" else [complex(x, y) for x in SPECIAL32[::3]
                                              for y in SPECIAL32[1::3]]
    for a in values:
        for b in values[:len(values) if arity == 2 else 1]:
            assert_same(plan, [a, b][:arity])


def _pending(recipe: Any) -> gs.GPUScalar | None:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            value = recipes.build(recipe)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError, FloatingPointError):
            return None
    if not isinstance(value, gs.GPUScalar) or value.is_materialized:
        return None
    return value


def _check_structure(value: gs.GPUScalar, rng: np.random.Generator) -> None:
    """The compiled evaluation equals the fold on the leaves' own values, and again with
    every float64 leaf replaced by special values."""
    node = value._node
    plan = expr.plan_of(node)
    sources = [leaf if isinstance(leaf, np.generic) else leaf.item()
               for leaf in expr.leaves_of(node)]
    assert_same(plan, sources)
    for _ in range(3):
        changed = [rng.choice(np.array(SPECIAL)).item() if kind == ("leaf", F8) else source
                   for source, kind in zip(sources, plan.leaf_kinds, strict=True)]
        assert_same(plan, changed)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes.recipes())
def test_random_structures_compile_to_the_folds_bits(recipe):
    """Every op kind and dtype (ufuncs of one and two outputs, where, round, casts between
    dtypes): compiled from the plan by `fold_plan`, equal to it."""
    value = _pending(recipe)
    if value is not None:
        _check_structure(value, np.random.default_rng(0))


def test_seeded_structures_compile_to_the_folds_bits():
    import random

    generator, rng = random.Random(2027), np.random.default_rng(1)
    checked = 0
    for _ in range(400):
        value = _pending(recipes.random_recipe(generator))
        if value is not None:
            _check_structure(value, rng)
            checked += 1
    assert checked > 100


def test_the_fast_path_runs_python_floats_and_the_ufunc_only_for_a_nan(monkeypatch):
    """``k * 2.0 + 1.0`` on a known float64 runs no NumPy call (only Python floats), unless a
    step's result is a NaN or a divisor is zero: then that step's ufunc gives it."""
    calls: list[str] = []
    original = hostprogram._quiet_recompute

    def counted(op: expr.Op) -> Any:
        recompute = original(op)

        def run(*operands: float) -> float:
            calls.append(op.name)
            return recompute(*operands)

        return run

    monkeypatch.setattr(hostprogram, "_quiet_recompute", counted)
    monkeypatch.setattr(expr, "_HOST_PROGRAMS", {})
    node = _step_node("divide", (_step_node("add", (_step_node("multiply", (
        _leaf(), np.float64(2.0))), np.float64(1.0))), _leaf()))
    run, gives_python = expr.host_program(expr.plan_of(node))
    assert gives_python and not hasattr(run, "__wrapped__")  # not made quiet: no np.errstate
    assert run([0.5, np.float64(2.0), np.float64(1.0), 4.0]) == 0.5 and calls == []
    assert run([0.5, np.float64(2.0), np.float64(1.0), 0.0]) == math.inf
    assert calls == ["divide"]
    calls.clear()
    assert math.isnan(run([math.inf, np.float64(0.0), np.float64(1.0), 4.0]))
    assert calls == ["multiply", "add", "divide"]


def test_other_steps_run_quiet_and_give_numpy_values():
    node = expr.make_node(expr.get_op("ufunc", "hypot", (F8, F8), (F8,)),
                          (_step_node("multiply", (_leaf(), np.float64(1e300))),
                           np.float64(-math.inf)))
    run, gives_python = expr.host_program(expr.plan_of(node))
    assert not gives_python
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):  # the caller's setting: the evaluation stays quiet
            value = run([1e300, np.float64(1e300), np.float64(-math.inf)])
    assert type(value) is np.float64 and value == math.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.complex128, np.int64])
def test_other_dtypes_keep_numpys_loop(dtype):
    """Only float64 steps become Python operations: other dtypes' steps give NumPy scalars of
    their dtype (by NumPy's scalar operator or the ufunc), in a quiet function."""
    d = np.dtype(dtype)
    node = expr.make_node(expr.get_op("ufunc", "add", (d, d), (d,)), (_leaf(d), d.type(1)))
    run, gives_python = expr.host_program(expr.plan_of(node))
    assert not gives_python and hasattr(run, "__wrapped__")  # quiet: np.errstate
    assert type(run([d.type(2).item(), d.type(1)])) is d.type


def test_compiled_programs_are_bounded_and_forgotten_at_each_sweep():
    assert any(table is expr._HOST_PROGRAMS for table in keytable.FORGOTTEN_AT_SWEEP)
    previous = expr.cache_size()
    try:
        for i in range(5):
            expr.host_program(expr.plan_of(_step_node("add", (_leaf(), np.float64(i)))))
            expr.host_program(expr.plan_of(_step_node("add", (_step_node(
                "negative", (_leaf(),)), np.float64(i)))))
        expr.set_cache_size(1)
        assert len(expr._HOST_PROGRAMS) <= 1
        for name in ("add", "subtract", "multiply"):
            expr.host_program(expr.plan_of(_step_node(name, (_leaf(), _leaf()))))
            assert len(expr._HOST_PROGRAMS) <= 1
    finally:
        expr.set_cache_size(previous)


def test_known_reads_give_the_float_paths_numbers_and_types(xp):
    """Through gpuscalar: reads of expressions of known values (float, bool, int, complex
    results) equal the fold's, with no sync and no device op."""
    a, b = gs.sum(xp.asarray([0.1])), gs.sum(xp.asarray([0.7]))
    n = gs.sum(xp.asarray([3], dtype=np.int64))
    fa, fb = float(a), float(b)
    int(n)
    with gs.count_syncs(include_cupy=True) as counter:
        values = [float(a * 2.0 + 1.0), float((a - b) / (a + b)), bool(a < b),
                  float(-abs(a - b)), float(a / 0.0), float(gs.maximum(a, b) * 3),
                  int(n * 2 + 1), complex(a + 1j), float(n / 2), bool(a == a)]
        values.append(gs.read(a * b + 1.0, a / b)[1])
    assert counter.count == 0 and counter.device_ops == 0
    assert [type(v) for v in values] == [float, float, bool, float, float, float, int,
                                         complex, float, bool, float]
    assert values[:6] == [fa * 2.0 + 1.0, (fa - fb) / (fa + fb), True, -abs(fa - fb),
                          math.inf, fb * 3]
    assert values[6:10] == [7, complex(fa + 1j), 1.5, True]
    assert values[10] == fa / fb


def test_a_leaf_not_known_gives_unread(xp):
    a, b = gs.sum(xp.asarray([1.5])), gs.sum(xp.asarray([2.5]))
    float(a)
    node = (a * b + 1.0)._node
    assert reads.known_result(node) is known.UNREAD
    float(b)
    assert reads.known_result(node) == 1.5 * 2.5 + 1.0


@pytest.fixture
def cupy_device():
    """The fake CuPy device of `tests.cupy_device` (fails in CI without CuPy)."""
    cupy_or_fail()
    from .cupy_device import fake_cupy_device  # noqa: PLC0415 - imports CuPy

    with fake_cupy_device() as triple:
        yield triple


def test_known_reads_on_cupy_arrays_run_on_the_host(cupy_device):
    """Leaves that are real ``cupy.ndarray``s (over fake memory), read once: an expression of
    them is answered on the host, no sync, no device op, the float path's bits."""
    xp = cupy_device[0]
    a, b = gs.sum(xp.asarray([0.1, 0.2])), gs.sum(xp.asarray([0.7]))
    fa, fb = float(a), float(b)
    with gs.count_syncs(include_cupy=True) as counter:
        ratio = float((a - b) / (a + b) * 2.0)
        less, bigger = bool(a < b), float(gs.maximum(a, b) + 1.0)
    assert counter.count == 0 and counter.device_ops == 0
    assert ratio.hex() == ((fa - fb) / (fa + fb) * 2.0).hex()
    assert (less, bigger) == (True, fb + 1.0)


def test_a_structure_is_compiled_once_for_all_its_reads(xp, monkeypatch):
    compiles: list[int] = []
    original = hostprogram.compile_host_program

    def counted(plan: expr.Plan, walk: Any) -> Any:
        compiles.append(plan.key)
        return original(plan, walk)

    monkeypatch.setattr(hostprogram, "compile_host_program", counted)
    monkeypatch.setattr(expr, "_HOST_PROGRAMS", {})
    k = gs.sum(xp.asarray([0.5]))
    float(k)
    assert [float(k * 2.0 + i) for i in range(5)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(compiles) == 1
