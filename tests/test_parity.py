"""The promotion contract, end to end: **a GPUScalar is the Python number it replaces.**

For every operator, ufunc and ``gs`` math function (`recipes.OPERATIONS`), every source dtype,
and every kind of other operand (a GPUScalar of the same and of another dtype, the Python
numbers ``True, 3, 0.5, 1j`` and NumPy scalars, on either side), on NumPy and the strict
device, lazily and eagerly, the result must be what the *float path* gives: the same
expression with each GPUScalar ``s`` replaced by ``s.item()`` and each ``gs`` helper by its
NumPy ufunc (`ORACLES`). Compared: the dtype (a Python float result is float64, an int int64, a
bool bool, a complex complex128; a NumPy result its own dtype), the Python type of ``item()``,
and the value (bit for bit, but `ULP_OPS` within 2 ulp and complex ``* / abs`` within a few
eps). Where the float path raises, gpuscalar raises the same category.

The documented exceptions (DESIGN.md, "Promotion rules") are skipped, each by name, in
`DOCUMENTED_EXCEPTIONS` (and where the device is CuPy, in `CUPY_EXCEPTIONS`: docs/semantics.md,
"Limits on CuPy", where CuPy's complex ``**`` and ``sign`` also have their own tolerance); a
case they do not name that disagrees fails, listing every such case.
Each case runs twice: with fresh device leaves (the device computes it) and again with the same
leaves once their values are known (lazily, a read brings its inputs back: host arithmetic).
"""

from __future__ import annotations

import functools
import math
import operator
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpuscalar as gs

from . import recipes
from .test_expr import GENERATED_SHAPES

pytestmark = pytest.mark.usefixtures("scalar_mode")

#: Every source dtype (uint64 included: its item() is a Python int, as int64's).
DTYPES = recipes.DTYPES

#: The GPUScalar of another dtype each source dtype meets (another kind, or another width).
OTHER_DTYPE = {np.dtype(a): np.dtype(b) for a, b in (
    ("bool", "int32"), ("int8", "float32"), ("int16", "uint8"), ("int32", "bool"),
    ("int64", "complex64"), ("uint8", "int8"), ("uint16", "float16"), ("uint32", "complex128"),
    ("uint64", "float64"), ("float16", "int64"), ("float32", "float64"),
    ("float64", "float32"), ("complex64", "float64"), ("complex128", "int16"),
)}

PYTHON_NUMBERS = (True, 3, 0.5, 1j)
NUMPY_SCALARS = (np.float32(2), np.float64(0.5), np.int8(3), np.bool_(True), np.complex64(1j))

#: A ``gs`` helper -> the NumPy function the float path calls on the Python values.
_HELPER_ORACLES: dict[str, Callable[..., Any]] = {
    "gs.abs": np.absolute,
    "clip": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
}


def _oracle(name: str) -> Callable[..., Any]:
    function = recipes.OPERATIONS[name][1]
    if name in _HELPER_ORACLES:
        return _HELPER_ORACLES[name]
    if getattr(function, "__module__", "").startswith("gpuscalar"):
        return getattr(np, name)  # gs.sqrt -> np.sqrt, gs.where -> np.where, ...
    return function  # Python's operators, math.floor, round, NumPy's own ufuncs


ORACLES = {name: _oracle(name) for name in recipes.OPERATIONS}

#: Transcendental functions and powers: within 2 ulp of the float path (the GPU's libm).
ULP_OPS = frozenset({
    "pow", "power", "exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "log2",
    "log10", "exp2", "arctan2", "hypot", "np.logaddexp", "np.float_power", "np.sin", "np.cbrt",
    "np.arcsinh",
})
#: Complex results of these: within a few eps (CPython's complex formulas are not NumPy's).
COMPLEX_EPS_OPS = ULP_OPS | {"mul", "truediv", "abs", "gs.abs", "np.reciprocal", "np.square"}

_ORDERING = frozenset({"lt", "le", "gt", "ge"})
_INT64 = np.iinfo(np.int64)


def _is_int_like(value: Any) -> bool:
    return type(value) in (bool, int) or (isinstance(value, np.generic)
                                          and value.dtype.kind in "biu")


def _is_complex(value: Any) -> bool:
    return isinstance(value, (complex, np.complexfloating))


#: name -> (what DESIGN.md says, predicate(operation, Python operands, float path's outcome)).
#: These inputs are skipped: documented, not promised.
DOCUMENTED_EXCEPTIONS: dict[str, tuple[str, Callable[[str, tuple, Any], bool]]] = {
    "bool invert": (
        "~ of a bool GPUScalar is logical not (Python's ~True is -2)",
        lambda name, args, outcome: name == "invert" and type(args[0]) is bool),
    "division by zero": (
        "IEEE inf/nan (Python raises ZeroDivisionError)",
        lambda name, args, outcome: outcome[0] == "raised" and outcome[1] is ZeroDivisionError),
    "int64 overflow": (
        "Python ints are unbounded; the device computes in int64",
        lambda name, args, outcome: outcome[0] == "value" and type(outcome[1]) is int
        and not _INT64.min <= outcome[1] <= _INT64.max),
    "round(s, n)": (
        "Python rounds the exact decimal value",
        lambda name, args, outcome: name == "round2"),
    "int op float beyond 2**53": (
        "a Python int converted to float64 on the device",
        lambda name, args, outcome: any(type(a) is int and abs(a) > 2**53 for a in args)),
    "** with a negative int exponent": (
        "Python gives a float; the device's int64 power does not",
        lambda name, args, outcome: name == "pow" and all(map(_is_int_like, args))
        and args[1] < 0),
    "** at infinities": (
        "IEEE pow at inf (Python may raise OverflowError)",
        lambda name, args, outcome: name == "pow" and any(
            isinstance(a, (float, complex, np.inexact)) and not np.isfinite(a) for a in args)),
    "negative float ** fractional": (
        "Python gives a complex; the device gives nan",
        lambda name, args, outcome: name == "pow" and outcome[0] == "value"
        and isinstance(outcome[1], complex) and not any(map(_is_complex, args))),
    "an int beyond a NumPy integer scalar's range": (
        "NumPy raises OverflowError (or compares exactly) for a Python int its integer scalar "
        "cannot hold; the device converts the value (wrapping), without reading it",
        lambda name, args, outcome: any(isinstance(a, np.integer) for a in args) and any(
            type(a) is int and not all(np.iinfo(b.dtype).min <= a <= np.iinfo(b.dtype).max
                                       for b in args if isinstance(b, np.integer))
            for a in args)),
    "negative shift count": (
        "Python raises ValueError; the device cannot raise (its shift gives 0)",
        lambda name, args, outcome: name in ("lshift", "rshift") and len(args) == 2
        and _is_int_like(args[1]) and args[1] < 0),
}

#: Skipped only where the device is CuPy (docs/semantics.md, "Limits on CuPy"): what CuPy's own
#: kernels give, which gpuscalar cannot change without a sync or CuPy's compiler flags.
CUPY_EXCEPTIONS: dict[str, tuple[str, Callable[[str, tuple, Any], bool]]] = {
    "an integer to a negative integer power on CuPy": (
        "NumPy raises ValueError; on the device the exponent's sign is not known without a "
        "sync, and CuPy's integral_power gives 0 (1 for a base of 1, +-1 for -1)",
        lambda name, args, outcome: name in ("pow", "power") and outcome[0] == "raised"
        and outcome[1] is ValueError and all(map(_is_int_like, args)) and args[1] < 0),
    "float32 subnormal results on CuPy": (
        "CuPy compiles every kernel with -ftz=true (cupy/cuda/compiler.py), so a float32 "
        "result below the smallest normal flushes (nextafter(0, 1) is FLT_MIN, as "
        "cupy.nextafter's own docstring says)",
        lambda name, args, outcome: outcome[0] == "value" and _is_float32_subnormal(outcome[1])),
}


def _is_float32_subnormal(value: Any) -> bool:
    if not isinstance(value, (np.float32, np.complex64)):
        return False
    tiny = np.finfo(np.float32).tiny
    return any(0 < abs(part) < tiny for part in (value.real, value.imag))


_ERRORS = (TypeError, ValueError, OverflowError, ZeroDivisionError, FloatingPointError)
_PYTHON_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64),
                  complex: np.dtype(np.complex128)}


def _category(error: BaseException) -> type:
    return next((kind for kind in _ERRORS if isinstance(error, kind)), type(error))


def _quiet(thunk: Callable[[], Any]) -> tuple[str, Any]:
    """("value", result) or ("raised", error category)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return "value", thunk()
        except _ERRORS as error:
            return "raised", _category(error)


def _expected(value: Any) -> tuple[np.dtype, type]:
    """The dtype a GPUScalar standing for ``value`` has, and the type of its item()."""
    if type(value) in _PYTHON_DTYPES:
        return _PYTHON_DTYPES[type(value)], type(value)
    return value.dtype, type(value.item())


#: Complex powers on CuPy: ``exp(y * log(x))`` (thrust's ``pow``), whose value moves by
#: ``|w|`` eps of its magnitude for each eps of ``w = y * log(x)``.
_COMPLEX_POWERS = frozenset({"pow", "power", "np.float_power"})


def _ulps(name: str, dtype: np.dtype, complex_operands: bool,
          cupy_args: tuple | None = None) -> int:
    """The tolerance in eps (complex: of the magnitude) or ulps; ``cupy_args``: the float
    path's operands where the device is CuPy, whose complex math is thrust's."""
    if cupy_args is not None and dtype.kind == "c":
        if name in _COMPLEX_POWERS:  # 2 ulp of w, and 4 eps for exp, sin, cos and the product
            with np.errstate(all="ignore"):
                w = np.log(np.complex128(cupy_args[0])) * np.complex128(cupy_args[1])
            if np.isfinite(w):
                return max(8, math.ceil(4 + 2 * abs(w)))
        if name == "sign":  # z / |z| with CUDA's hypot (2 ulp) for |z|
            return 4
    if (dtype.kind == "c" or complex_operands) and name in COMPLEX_EPS_OPS:
        return 8
    return 2 if name in ULP_OPS else 0


def _same_value(got: Any, want: Any, dtype: np.dtype, ulps: int) -> bool:
    got, want = np.asarray(got, dtype=dtype), np.asarray(want, dtype=dtype)
    if dtype.kind == "c":
        if ulps:  # relative to the magnitude: a few eps of the larger part
            if np.isnan(got) or np.isnan(want) or np.isinf(got) or np.isinf(want):
                return bool(np.isnan(got) == np.isnan(want)) if np.isnan(want) else got == want
            scale = max(abs(want.real), abs(want.imag), np.finfo(dtype).tiny)
            return bool(abs(got - want) <= ulps * np.finfo(dtype).eps * scale)
        return _same_value(got.real, want.real, got.real.dtype, 0) and \
            _same_value(got.imag, want.imag, got.imag.dtype, 0)
    if dtype.kind == "f":
        if np.isnan(want) or np.isnan(got):
            return bool(np.isnan(want) and np.isnan(got))
        if ulps and np.isfinite(want):
            return bool(abs(got - want) <= ulps * np.spacing(abs(want)))
    return got.tobytes() == want.tobytes()


# ---- the cases ----------------------------------------------------------------------------------


def _leaf(dtype: np.dtype, raw: float) -> tuple[str, np.dtype, Any]:
    return ("dev", dtype, recipes.device_value(dtype, raw))


def cases(name: str, dtype: np.dtype) -> list[tuple[Any, ...]]:
    """The operand lists of ``name`` for a source GPUScalar of ``dtype``: leaves ("dev", dtype,
    value), Python numbers and NumPy scalars (as themselves)."""
    arity = recipes.OPERATIONS[name][0]
    mine, same, other = _leaf(dtype, 2.5), _leaf(dtype, -1.5), _leaf(OTHER_DTYPE[dtype], -1.5)
    if arity == 1:
        return [(mine,), (same,)]
    partners = [*PYTHON_NUMBERS, *NUMPY_SCALARS]
    if arity == 2:
        found = [(mine, same), (mine, other), (other, mine)]
        for partner in partners:
            found += [(mine, partner), (partner, mine)]
        # a NumPy integer scalar with a GPUScalar whose value it cannot hold (uint8 199 + int8):
        # the float path raises NumPy's OverflowError (NEP 50)
        return found + [(same, partner) for partner in NUMPY_SCALARS]
    found = [(mine, same, other), (other, mine, same)]
    for partner in partners:
        found += [(mine, partner, same), (partner, mine, same), (same, partner, mine)]
    return found


def _python_value(operand: Any) -> Any:
    """What the float path holds in place of an operand: a leaf's ``item()``."""
    if type(operand) is tuple:
        _, dtype, value = operand
        return np.asarray(value).astype(dtype).item()
    return operand


def _run(function: Callable[..., Any], operands: list[Any],
         register: bool = False) -> tuple[str, Any]:
    """The gpuscalar outcome: ("value", (dtype, item)) or ("raised", category); a result that is
    not a GPUScalar is ("not a GPUScalar", result)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            result = function(*operands)
        except _ERRORS as error:
            return "raised", _category(error)
        if not isinstance(result, gs.GPUScalar):
            return "not a GPUScalar", result
        if register and not result.is_materialized:  # NVRTC compiles it (test_expr.py)
            GENERATED_SHAPES.setdefault(result._node[0], result._node)
        dtype = result.dtype
        try:
            return "value", (dtype, result.item())
        except _ERRORS as error:  # lazily, an error surfaces where the value is computed
            return "raised", _category(error)


def documented_exception(name: str, args: tuple, outcome: tuple[str, Any],
                         on_cupy: bool = False) -> str | None:
    exceptions = {**DOCUMENTED_EXCEPTIONS, **CUPY_EXCEPTIONS} if on_cupy else DOCUMENTED_EXCEPTIONS
    for exception, (_, applies) in exceptions.items():
        if applies(name, args, outcome):
            return exception
    return None


def _is_cupy(like: Any) -> bool:
    return type(like).__module__.split(".")[0] == "cupy"


def _describe(operands: tuple[Any, ...]) -> str:
    """``gs(int8 2), 0.5, np.float32(2.0)``: how a case reads in a failure message."""
    return ", ".join(f"gs({o[1]} {_python_value(o)!r})" if type(o) is tuple else repr(o)
                     for o in operands)


def check(name: str, operands: tuple[Any, ...], like: Any) -> list[str]:
    """The mismatches of one case (empty when it holds or is a documented exception)."""
    args = tuple(_python_value(o) for o in operands)
    want = _quiet(lambda: ORACLES[name](*args))
    on_cupy = _is_cupy(like)
    if documented_exception(name, args, want, on_cupy):
        return []
    function = recipes.OPERATIONS[name][1]
    leaves = [gs.asscalar(o[2], dtype=o[1], like=like) if type(o) is tuple else o
              for o in operands]
    problems = []
    for path in ("device", "known"):  # fresh leaves; then the same leaves, read by now
        # NVRTC compiles the shapes of leaves and Python numbers (NumPy scalars' are alike)
        got = _run(function, leaves, register=path == "device" and not any(
            isinstance(o, np.generic) for o in operands))
        problem = _compare(name, got, want, any(map(_is_complex, args)),
                           args if on_cupy else None)
        if problem:
            problems.append(f"{name}({_describe(operands)}) [{path}]: {problem}")
    return problems


def _compare(name: str, got: tuple[str, Any], want: tuple[str, Any],
             complex_operands: bool = False, cupy_args: tuple | None = None) -> str | None:
    if want[0] == "raised":
        if got[0] == "raised" and issubclass(got[1], want[1]):
            return None
        return f"float path raises {want[1].__name__}, gpuscalar gives {got}"
    if got[0] != "value":
        return f"float path gives {want[1]!r}, gpuscalar {got}"
    dtype, item = got[1]
    want_dtype, want_type = _expected(want[1])
    if dtype != want_dtype or type(item) is not want_type:
        return (f"float path gives {want[1]!r} ({want_dtype}, item {want_type.__name__}), "
                f"gpuscalar {dtype} {item!r} (item {type(item).__name__})")
    if not _same_value(item, want[1], dtype, _ulps(name, dtype, complex_operands, cupy_args)):
        return f"float path gives {want[1]!r}, gpuscalar {item!r} ({dtype})"
    return None


# ---- the tests ----------------------------------------------------------------------------------


def test_every_operation_has_an_oracle_and_every_exception_a_reason():
    assert set(ORACLES) == set(recipes.OPERATIONS)
    assert all(reason for reason, _ in (*DOCUMENTED_EXCEPTIONS.values(),
                                        *CUPY_EXCEPTIONS.values()))
    assert set(OTHER_DTYPE) == set(DTYPES) and all(k != v for k, v in OTHER_DTYPE.items())


@pytest.mark.parametrize("name", sorted(recipes.OPERATIONS))
def test_every_operation_gives_the_float_path(xp, name):
    like = xp.zeros(1)
    problems = []
    for dtype in DTYPES:
        for operands in cases(name, dtype):
            problems += check(name, operands, like)
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])


# ---- NumPy scalars on the left of comparisons ---------------------------------------------------

COMPARISONS = {"lt": operator.lt, "le": operator.le, "eq": operator.eq, "ne": operator.ne,
               "gt": operator.gt, "ge": operator.ge}
MIRRORED = {"lt": "gt", "le": "ge", "eq": "eq", "ne": "ne", "gt": "lt", "ge": "le"}
LEFT_SCALARS = (np.float32(0.1), np.float64(0.1), np.float16(0.1), np.int8(3), np.uint8(3),
                np.int64(-2), np.bool_(True), np.complex64(1j))


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_numpy_scalars_on_the_left_compare_as_mirrored_without_a_sync(xp, name):
    """``np.float32(0.1) == s`` is ``s == np.float32(0.1)``: a bool GPUScalar, the float path's
    answer, and no sync (the strict device counts its own: ``include_cupy=True``)."""
    like = xp.zeros(1)
    problems = []
    for dtype in DTYPES:
        for raw in (0.1, 3.0, -2.0):
            value = np.asarray(recipes.device_value(dtype, raw) if dtype.kind != "f" else raw
                               ).astype(dtype)
            for left in LEFT_SCALARS:
                python = value.item()
                if name in _ORDERING and (dtype.kind == "c" or left.dtype.kind == "c"):
                    continue  # complex ordering: a documented exception
                want = _quiet(functools.partial(COMPARISONS[name], left, python))
                s = gs.asscalar(value, like=like)
                with gs.count_syncs(include_cupy=True) as counter:
                    got = _quiet(functools.partial(COMPARISONS[name], left, s))
                    mirrored = _quiet(functools.partial(COMPARISONS[MIRRORED[name]], s, left))
                case = f"{left!r} {name} {dtype} {python!r}"
                if counter.count:
                    problems.append(f"{case}: {counter.count} syncs")
                for form, outcome in (("left", got), ("mirrored", mirrored)):
                    if outcome[0] == "value" and not isinstance(outcome[1], gs.GPUScalar):
                        problems.append(f"{case} ({form}): a {type(outcome[1]).__name__}, "
                                        "not a GPUScalar")
                        continue
                    if outcome[0] == "value":
                        outcome = _quiet(lambda o=outcome: ("value", (o[1].dtype, o[1].item())))[1]
                    problem = _compare(name, outcome, want)
                    if problem:
                        problems.append(f"{case} ({form}): {problem}")
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])


# ---- a few named cases (readable statements of the rule) ---------------------------------------


def test_a_float32_sum_times_two_is_the_float_paths_float64():
    s = gs.sum(np.full(3, 0.1, dtype=np.float32))
    python = s.item()
    result = s * 2.0
    assert result.dtype == np.float64 and result.item() == python * 2.0
    assert (s + np.float32(1)).dtype == np.float32  # float + np.float32: NEP 50, weak float
    assert (np.float32(1) + s).dtype == np.float32
    assert (s + np.float64(1)).dtype == np.float64


def test_bool_is_an_int_under_python_operators_and_bool_under_ufuncs():
    t = gs.asscalar(True)
    assert (t + t).dtype == np.int64 and (t + t).item() == 2 and type((t + t).item()) is int
    assert np.add(t, t).dtype == np.bool_ and np.add(t, t).item() is True
    assert (-t).item() == -1 and (t / 2).item() == 0.5
    assert (t & t).item() is True and (~t).item() is False  # ~: the documented exception


def test_round_and_math_floor_ceil_trunc_give_int64():
    s = gs.asscalar(np.float32(-2.5))
    for function in (round, math.floor, math.ceil, math.trunc):
        result = function(s)
        assert result.dtype == np.int64 and type(result.item()) is int
        assert result.item() == function(-2.5)
