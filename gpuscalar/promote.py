"""Promotion rules, as data: what dtype and which backend a GPUScalar operation produces.

Why this module exists: a GPUScalar replaces the Python float that `float(x.sum())` used to
return. If swapping one for the other changed a result's dtype, users could not adopt it, so the
rules below reproduce NumPy 2's NEP 50 behaviour *without reading the scalar's value*. NEP 50
result dtypes depend only on the Python scalar's kind (bool/int/float/complex), never on its
value, and a GPUScalar's kind is known from its dtype: that is what makes parity sync-free.

One rule (DESIGN.md, "Promotion rules"): **a GPUScalar is the Python number it replaces.** Every
result is what the same expression gives with each GPUScalar ``s`` replaced by ``s.item()`` (a
Python bool, int, float or complex), NumPy 2 (NEP 50) semantics wherever arrays or NumPy scalars
take part. In detail:

  1. GPUScalar ⊕ array (same backend)  -> array; dtype and values of ``x ⊕ s.item()`` (weak).
  2. GPUScalar ⊕ GPUScalar or Python number -> GPUScalar of the Python result's type: float64,
     int64, complex128 or bool, computed on the device at that precision (`scalar_stand_in`).
  3. GPUScalar ⊕ NumPy scalar (either side) -> as the Python number ⊕ that NumPy scalar (NEP 50).
  4. device GPUScalar ⊕ host NumPy array -> host array; the scalar is read (counted sync).
  5. backends or devices that cannot meet -> TypeError / ValueError naming both sides.

Every rule is one question to NumPy's own resolver (`parity_signature`, ``ufunc.resolve_dtypes``)
with each GPUScalar replaced by the Python type ``item()`` returns (`WEAK_STAND_IN`: weak ``int``,
``float``, ``complex``; a Python bool is NumPy's bool). Python's operators treat a bool as the int
it is in arithmetic (``True + True == 2``) where a NumPy ufunc keeps bool (``np.add(True, True)``
is True): `BOOL_AS_INT` names those operators, and only the operators (``s + t``, ``-s``), never
the ufuncs (``np.add(s, t)``, ``gs.sqrt(s)``), read it. The op then runs that loop on the device
in one call, a narrower GPUScalar cast up inside the kernel.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any

import numpy as np

__all__ = [
    "PYTHON_SCALAR_TYPES",
    "SUPPORTED_KINDS",
    "WEAK_STAND_IN",
    "Rule",
    "RULE_RESULTS",
    "weak_stand_in",
    "BOOL_AS_INT",
    "PYTHON_DTYPES",
    "scalar_stand_in",
    "python_number_stand_in",
    "python_operand_stand_in",
    "parity_signature",
    "check_output_casting",
    "cupy_dtype_argument",
    "result_dtype",
]

#: Exact Python scalar types (exact, because ``np.float64`` subclasses ``float``).
PYTHON_SCALAR_TYPES = frozenset({bool, int, float, complex})

#: dtype kinds a GPUScalar may hold: bool, signed, unsigned, floating, complex.
SUPPORTED_KINDS = frozenset("biufc")

#: For each dtype kind, what NumPy's resolver should see in place of a GPUScalar so that it
#: acts as the Python scalar ``s.item()`` returns. ``resolve_dtypes`` takes the Python types
#: ``int``, ``float`` and ``complex`` as weak; a Python bool behaves like ``np.dtype(bool)``,
#: the lowest type, so that stands in for it.
WEAK_STAND_IN: dict[str, Any] = {
    "b": np.dtype(bool),
    "i": int,
    "u": int,
    "f": float,
    "c": complex,
}


#: The dtype NumPy gives the Python number a GPUScalar of each dtype kind stands for
#: (``np.asarray(s.item())``): what ``np.asarray(s)`` and ``np.array([s, t])`` give.
PYTHON_DTYPES: dict[str, np.dtype] = {
    "b": np.dtype(bool), "i": np.dtype(np.int64), "u": np.dtype(np.int64),
    "f": np.dtype(np.float64), "c": np.dtype(np.complex128),
}

#: The ufuncs behind Python's operators where a Python bool takes part as the int it is
#: (``True + True == 2``, ``-True == -1``, ``True / 2 == 0.5``, ``math.floor(True) == 1``);
#: ``& | ^ ~`` and comparisons keep bool (``~`` of a bool GPUScalar is logical not, as NumPy's).
BOOL_AS_INT = frozenset({
    "add", "subtract", "multiply", "divide", "true_divide", "floor_divide", "remainder",
    "power", "divmod", "negative", "positive", "absolute", "left_shift", "right_shift",
    "floor", "ceil", "trunc", "round",
})


def scalar_stand_in(dtype: np.dtype, ufunc_name: str, python_operator: bool) -> Any:
    """The resolver stand-in for a GPUScalar of ``dtype`` in an operation without arrays: the
    Python type of its ``item()`` (rules 2-3); a bool is an int under Python's arithmetic
    operators (``python_operator``: ``s + t``, not ``np.add(s, t)``)."""
    if python_operator and dtype.kind == "b" and ufunc_name in BOOL_AS_INT:
        return int
    return WEAK_STAND_IN[dtype.kind]


def python_number_stand_in(value_type: type, ufunc_name: str, python_operator: bool) -> Any:
    """The resolver stand-in for a Python number of ``value_type`` (see `scalar_stand_in`)."""
    if value_type is bool:
        return int if python_operator and ufunc_name in BOOL_AS_INT else np.dtype(bool)
    return value_type


class Rule(Enum):
    """Which promotion rule an operation falls under."""

    ARRAY_PARITY = 1
    SCALAR_SCALAR = 2
    SCALAR_PYTHON = 3
    HOST_OPERAND = 4
    INCOMPATIBLE = 5


#: What each rule returns; the README's promotion table is this dict.
RULE_RESULTS: dict[Rule, str] = {
    Rule.ARRAY_PARITY: "backend array, dtype of x ⊕ s.item() (GPUScalar is weak); no sync",
    Rule.SCALAR_SCALAR: "GPUScalar of the Python result's type (float64, int64, complex128, "
                        "bool), computed on the device; no sync",
    Rule.SCALAR_PYTHON: "GPUScalar, as the Python number ⊕ the operand (NEP 50: a NumPy scalar "
                        "is strong); no sync",
    Rule.HOST_OPERAND: "host NumPy array; the device scalar is read once (reason 'host operand')",
    Rule.INCOMPATIBLE: "TypeError (backends) / ValueError (devices) naming both sides",
}


def weak_stand_in(dtype: np.dtype) -> Any:
    """The resolver stand-in for a GPUScalar of ``dtype``."""
    return WEAK_STAND_IN[dtype.kind]


def python_operand_stand_in(value: Any) -> Any:
    """The resolver stand-in for a Python scalar operand (bool is not accepted by NumPy)."""
    kind = type(value)
    return np.dtype(bool) if kind is bool else kind


@functools.lru_cache(maxsize=8192)
def parity_signature(ufunc_name: str, operand_types: tuple[Any, ...]) -> tuple[np.dtype, ...]:
    """NumPy's loop dtypes for ``ufunc_name`` over ``operand_types`` (dtypes or weak stand-ins).

    Raises NumPy's own error (e.g. ``UFuncTypeError``) where NumPy has no such loop, which is
    what ``x ⊕ s.item()`` would raise too.
    """
    ufunc = getattr(np, ufunc_name)
    signature = ufunc.resolve_dtypes(operand_types + (None,) * ufunc.nout)
    if any(dtype == _OBJECT for dtype in signature):
        # NumPy compares two Python ints exactly, as objects (they may be unbounded); on the
        # device they are the int64 they are held in (docs/semantics.md: in-range values)
        operand_types = tuple(_INT64 if kind is int else kind for kind in operand_types)
        signature = ufunc.resolve_dtypes(operand_types + (None,) * ufunc.nout)
    return signature


_OBJECT, _INT64 = np.dtype(object), np.dtype(np.int64)


def check_output_casting(ufunc_name: str, signature: tuple[np.dtype, ...], out: Any) -> None:
    """In-place ops (``x += s``) keep NumPy's default ``same_kind`` rule for the output."""
    outputs = out if isinstance(out, tuple) else (out,)
    loop_outputs = signature[len(signature) - len(outputs):]
    for loop_dtype, target in zip(loop_outputs, outputs, strict=True):
        if not np.can_cast(loop_dtype, target.dtype, casting="same_kind"):
            raise TypeError(
                f"Cannot cast ufunc {ufunc_name!r} output from {loop_dtype!r} to "
                f"{target.dtype!r} with casting rule 'same_kind'"
            )


def cupy_dtype_argument(signature: tuple[np.dtype, ...]) -> np.dtype | None:
    """CuPy ufuncs pick a loop by ``dtype=`` matching every *output* type, not by signature.

    That selects the parity loop exactly when the loop is homogeneous (all inputs and outputs of
    one dtype: arithmetic). For mixed loops (comparisons, ldexp) CuPy's own promotion is used;
    its result dtype is the same, values can differ only where NumPy would round the Python
    scalar to the array's precision first (documented in the README).
    """
    first = signature[0]
    return first if all(dt == first for dt in signature) else None


def result_dtype(operand_types: list[Any]) -> np.dtype:
    """NumPy's result dtype for dtypes and weak stand-ins mixed (used by ``where``)."""
    weak_examples = {int: 0, float: 0.0, complex: 0j}
    return np.result_type(*(weak_examples.get(t, t) for t in operand_types))
