"""Promotion parity: a GPUScalar acts exactly as the Python scalar it replaces (rules 1-3).

Hypothesis draws dtype pairs over bool, int8-64, uint8-64, float16-64 and complex64/128, the
operators ``+ - * / // % **`` and the comparisons, and values. The oracle is the float path:
``x ⊕ s`` must equal ``x ⊕ s.item()`` (dtype and values), computed without reading ``s``; with
no array, ``s ⊕ t`` is ``s.item() ⊕ t.item()`` (tests/test_parity.py covers every operation).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuscalar as gs
from gpuscalar import promote

from . import test_parity

#: Every test here runs with lazy GPUScalar expressions and again eagerly.
pytestmark = pytest.mark.usefixtures("scalar_mode")

DTYPES = [np.dtype(t) for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)]
OPERATORS = ["add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power",
             "less", "less_equal", "equal", "not_equal", "greater", "greater_equal"]

dtypes = st.sampled_from(DTYPES)
operators = st.sampled_from(OPERATORS)
small_ints = st.integers(min_value=0, max_value=5)


def _outcome(thunk):
    """(result, None) or (None, exception type): parity covers errors too."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return thunk(), None
        except Exception as error:  # noqa: BLE001 - compared against NumPy's own error
            return None, type(error)


def _assert_same(got, expected):
    (got_value, got_error), (expected_value, expected_error) = got, expected
    if expected_error is not None or got_error is not None:
        assert (got_error is None) == (expected_error is None), (got_error, expected_error)
        assert issubclass(got_error, TypeError) == issubclass(expected_error, TypeError)
        return
    got_array = got_value.array if isinstance(got_value, gs.GPUScalar) else np.asarray(got_value)
    assert got_array.dtype == np.asarray(expected_value).dtype
    np.testing.assert_array_equal(got_array, np.asarray(expected_value))


@settings(max_examples=600, deadline=None)
@given(array_dtype=dtypes, scalar_dtype=dtypes, name=operators, values=st.lists(
    small_ints, min_size=3, max_size=3), scalar_value=small_ints, reflected=st.booleans())
def test_array_with_scalar_equals_array_with_python_value(
    array_dtype, scalar_dtype, name, values, scalar_value, reflected
):
    ufunc = getattr(np, name)
    x = np.asarray(values).astype(array_dtype)
    s = gs.GPUScalar(np.asarray(scalar_value).astype(scalar_dtype))
    python_value = np.asarray(scalar_value).astype(scalar_dtype).item()
    operands = (s, x) if reflected else (x, s)
    python_operands = (python_value, x) if reflected else (x, python_value)
    with gs.count_syncs() as counter:
        got = _outcome(lambda: ufunc(*operands))
    assert counter.count == 0
    _assert_same(got, _outcome(lambda: ufunc(*python_operands)))
    if got[1] is None:
        assert type(got[0]) is np.ndarray


#: NumPy's ufunc name -> the name of Python's operator in `recipes.OPERATIONS`.
PYTHON_OPERATORS = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "truediv",
    "floor_divide": "floordiv", "remainder": "mod", "power": "pow", "less": "lt",
    "less_equal": "le", "equal": "eq", "not_equal": "ne", "greater": "gt", "greater_equal": "ge",
}


def _float_path_case(name: str, python_operator: bool, operands: tuple) -> list[str]:
    """The mismatches of ``name`` (NumPy's ufunc, or Python's operator) against the float path
    (`test_parity.check`: dtype, item() type and value, or the error's category)."""
    if python_operator:
        return test_parity.check(PYTHON_OPERATORS[name], operands, None)
    ufunc = getattr(np, name)
    args = tuple(test_parity._python_value(o) for o in operands)
    want = test_parity._quiet(lambda: ufunc(*args))
    if test_parity.documented_exception(name, args, want):
        return []
    leaves = [gs.asscalar(o[2], dtype=o[1]) if type(o) is tuple else o for o in operands]
    with gs.count_syncs() as counter:
        got = test_parity._quiet(lambda: ufunc(*leaves))
    assert counter.count == 0  # building the result reads nothing
    if got[0] == "value":
        result = got[1]
        assert isinstance(result, gs.GPUScalar)
        got = test_parity._quiet(lambda: (result.dtype, result.item()))
    problem = test_parity._compare(name, got, want,
                                   any(map(test_parity._is_complex, args)))
    return [f"np.{name}{args}: {problem}"] if problem else []


@settings(max_examples=400, deadline=None)
@given(left=dtypes, right=dtypes, name=operators, a=small_ints, b=small_ints,
       python_operator=st.booleans())
def test_scalar_with_scalar_is_the_float_path(left, right, name, a, b, python_operator):
    """``s ⊕ t`` is ``s.item() ⊕ t.item()``: a float64/int64/complex128/bool GPUScalar."""
    operands = (("dev", left, a), ("dev", right, b))
    assert not _float_path_case(name, python_operator, operands)


@settings(max_examples=400, deadline=None)
@given(dtype=dtypes, name=operators, a=small_ints,
       other=st.one_of(st.booleans(), small_ints, st.floats(0, 5, width=16),
                       st.complex_numbers(max_magnitude=4, allow_nan=False),
                       st.sampled_from([np.float32(2.5), np.int8(3), np.uint8(0), np.bool_(True),
                                        np.float16(0.5), np.complex64(1j), np.float64(3)])),
       reflected=st.booleans(), python_operator=st.booleans())
def test_scalar_with_python_or_numpy_scalar_is_the_float_path(dtype, name, a, other, reflected,
                                                              python_operator):
    """``s ⊕ 3``, ``0.5 ⊕ s``, ``s ⊕ np.float32(2.5)``: as ``s.item()`` in its place (NEP 50
    where a NumPy scalar takes part)."""
    mine = ("dev", dtype, a)
    operands = (other, mine) if reflected else (mine, other)
    assert not _float_path_case(name, python_operator, operands)


def test_python_operators_take_the_same_paths():
    x = np.arange(4, dtype=np.float16)
    s = gs.sum(np.ones(3, dtype=np.float64))  # a float64 GPUScalar
    assert (x * s).dtype == np.float16  # as x * 3.0
    assert (s * x).dtype == np.float16
    assert (x < s).dtype == np.bool_
    i8 = np.arange(4, dtype=np.int8)
    n = gs.sum(np.ones(3, dtype=np.int64))
    assert (i8 + n).dtype == np.int8  # as i8 + 3
    assert (i8 / n).dtype == np.float64  # as i8 / 3
    assert (s + np.float32(1)).dtype == np.float32  # 3.0 + np.float32(1): NEP 50, weak float
    assert (gs.asscalar(np.float32(1)) + np.float64(1)).dtype == np.float64
    h = gs.sum(np.ones(3, dtype=np.float16))  # a float16 sum is a Python float: float64 results
    assert (h * 2).dtype == np.float64 and (h + h).dtype == np.float64
    assert (h + np.float16(1)).dtype == np.float16  # as 3.0 + np.float16(1)
    assert (gs.asscalar(np.int8(100)) * 3).item() == 300  # int(s) * 3, no int8 wrap


def test_weak_stand_in_table_covers_every_supported_kind():
    assert set(promote.WEAK_STAND_IN) == set(promote.SUPPORTED_KINDS)
    for dtype in DTYPES:
        python_type = type(np.zeros((), dtype).item())
        stand_in = promote.weak_stand_in(dtype)
        assert stand_in is python_type or (python_type is bool and stand_in == np.bool_)


def test_rule_results_table_names_every_rule():
    assert set(promote.RULE_RESULTS) == set(promote.Rule)


def test_cupy_dtype_argument_only_for_homogeneous_loops():
    f4 = np.dtype("float32")
    assert promote.cupy_dtype_argument((f4, f4, f4)) == f4
    assert promote.cupy_dtype_argument((f4, f4, np.dtype(bool))) is None


@pytest.mark.parametrize("name", OPERATORS)
def test_parity_signature_is_numpys_weak_resolution(name):
    signature = promote.parity_signature(name, (np.dtype("int8"), int))
    expected = getattr(np, name)(np.zeros(1, np.int8), 1).dtype
    assert signature[-1] == expected
