"""Promotion rules, as data: what dtype and which backend a GPUScalar operation produces.

Why this module exists: a GPUScalar replaces the Python float that `float(x.sum())` used to
return. If swapping one for the other changed a result's dtype, users could not adopt it, so the
rules below reproduce NumPy 2's NEP 50 behaviour *without reading the scalar's value*. NEP 50
result dtypes depend only on the Python scalar's kind (bool/int/float/complex), never on its
value, and a GPUScalar's kind is known from its dtype: that is what makes parity sync-free.

The rules (DESIGN.md):

  1. GPUScalar ⊕ array (same backend)  -> array; dtype and values of ``x ⊕ s.item()`` (weak).
  2. GPUScalar ⊕ GPUScalar             -> GPUScalar; NumPy's promotion of two 0-d arrays.
  3. GPUScalar ⊕ Python scalar         -> GPUScalar; NEP 50. NumPy scalars are strong 0-d.
  4. device GPUScalar ⊕ host NumPy array -> host array; the scalar is read (counted sync).
  5. backends or devices that cannot meet -> TypeError / ValueError naming both sides.

Rules 2 and 3 are exactly what NumPy 2 does for 0-d arrays, so they need no table. Rule 1 needs
the *loop signature* NumPy would pick if the GPUScalar were its Python value; `parity_signature`
asks NumPy's own resolver (`ufunc.resolve_dtypes`) with the GPUScalar replaced by the Python type
that `item()` would return (`WEAK_STAND_IN`), and the op then runs that loop in one call.
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
    Rule.SCALAR_SCALAR: "GPUScalar, dtype as NumPy promotes two 0-d arrays; no sync",
    Rule.SCALAR_PYTHON: "GPUScalar, dtype by NEP 50 (Python scalar weak, NumPy scalar strong)",
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
    return ufunc.resolve_dtypes(operand_types + (None,) * ufunc.nout)


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
