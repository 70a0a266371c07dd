"""The host evaluator compiled per expression structure: `expr.fold_plan`'s NumPy evaluation,
bit for bit, at a fraction of its cost.

A host-heavy loop (a solver's scalar recurrence on values read once, `gpuscalar.known`)
evaluates the same few structures over and over, each op a NumPy ufunc call (~7.6k host
instructions with its signature) inside an ``np.errstate`` (~10k): ~30x a Python float's
arithmetic. So each structure's evaluation is compiled once into a Python function, written
by `expr.fold_plan` itself (its ``apply`` writes each step's statement), that binds every op's
call and runs the float64 steps whose NumPy loop is one IEEE 754 operation as the Python
float operation, which is the same operation: its result is unique unless it is a NaN (IEEE
fixes every other bit: the correctly rounded value and the sign of a zero), so only a NaN
result (or a division by zero, which Python refuses) is computed again by the ufunc, whose NaN
bits are the result (two NaN operands give either one's bits, by the machine code: CPython's
generic and specialized float additions differ there, and so do NumPy's scalar math and its
loops). A function of such steps alone runs without ``np.errstate`` (Python's float
arithmetic never warns; the recomputation is quiet on its own); any other step makes the
whole function quiet, as `expr.evaluate_plan` always was, and there float32 and complex steps run
as NumPy's scalar operators, on the same terms.

This module sits below `gpuscalar.lazy.expr` (it imports nothing of gpuscalar's): expr hands
in its walk, `fold_plan`, and caches each structure's function (`expr.host_program`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FLOAT64_OPERATIONS", "SCALAR_OPERATIONS", "compile_host_program"]

#: float64 ufunc (its loop reads float64 operands) -> the Python float operation that is its
#: loop's IEEE 754 operation (``{0}``, ``{1}``: the operands), and the loop's output dtype. Where
#: Python cannot give the IEEE result (a zero divisor, the square root of a negative) or the
#: result is not fixed by the values (the maximum of 0.0 and -0.0), the form gives ``nan``: the
#: ufunc's value is taken, as for every NaN.
FLOAT64_OPERATIONS: dict[str, tuple[str, np.dtype]] = {
    **{name: (form, np.dtype(np.float64)) for name, form in (
        ("add", "{0} + {1}"), ("subtract", "{0} - {1}"), ("multiply", "{0} * {1}"),
        ("divide", "{0} / {1} if {1} else nan"), ("negative", "-{0}"), ("positive", "+{0}"),
        ("absolute", "abs({0})"), ("sqrt", "sqrt({0}) if {0} >= 0.0 else nan"),
        ("maximum", "{0} if {0} > {1} else {1} if {1} > {0} else nan"),
        ("minimum", "{0} if {0} < {1} else {1} if {1} < {0} else nan"))},
    **{name: (form, np.dtype(np.bool_)) for name, form in (
        ("less", "{0} < {1}"), ("less_equal", "{0} <= {1}"), ("greater", "{0} > {1}"),
        ("greater_equal", "{0} >= {1}"), ("equal", "{0} == {1}"), ("not_equal", "{0} != {1}"))},
}
_F8, _BOOL = np.dtype(np.float64), np.dtype(np.bool_)
_F4, _C8, _C16 = np.dtype(np.float32), np.dtype(np.complex64), np.dtype(np.complex128)
#: ufunc -> the NumPy scalar operator that is its loop on NumPy scalars of the loop's dtype
#: (NumPy's scalar math: the same IEEE 754 operation in that dtype, warning as the ufunc does,
#: so in a quiet function only), the dtypes it serves (float32, and the complex dtypes where the
#: operation is one per component) and whether it compares (a bool). A NaN is the ufunc's.
SCALAR_OPERATIONS: dict[str, tuple[str, frozenset[np.dtype], bool]] = {
    **{name: (form, frozenset((_F4, _C8, _C16)), compares) for name, form, compares in (
        ("add", "{0} + {1}", False), ("subtract", "{0} - {1}", False),
        ("negative", "-{0}", False), ("positive", "+{0}", False),
        ("equal", "{0} == {1}", True), ("not_equal", "{0} != {1}", True))},
    **{name: (form, frozenset((_F4,)), compares) for name, form, compares in (
        ("multiply", "{0} * {1}", False), ("divide", "{0} / {1}", False),
        ("absolute", "abs({0})", False), ("less", "{0} < {1}", True),
        ("less_equal", "{0} <= {1}", True), ("greater", "{0} > {1}", True),
        ("greater_equal", "{0} >= {1}", True))},
}
#: How a compiled step's operand is held: as `fold_plan` gives it (a NumPy value), as a leaf's
#: host value (a Python number, NumPy scalar or 0-d array of the leaf's dtype), or as a Python
#: float or bool (a float64 step's result).
_NUMPY, _HOST, _PYTHON = 0, 1, 2


def _float64_step(op: Any, operands: list[tuple[str, int, Any]]) -> str | None:
    """The Python float operation that is ``op``'s NumPy loop, if ``op`` is one of
    `FLOAT64_OPERATIONS` on float64 operands, else None."""
    row = FLOAT64_OPERATIONS.get(op.name) if op.kind == "ufunc" else None
    if row is None or op.out_dtypes != (row[1],) or \
            any(dtype != _F8 for dtype in op.in_dtypes) or \
            any(dtype != _F8 for _, _, dtype in operands):
        return None
    return row[0]


def _scalar_step(op: Any, operands: list[tuple[str, int, Any]]) -> str | None:
    """The NumPy scalar operator that is ``op``'s loop (`SCALAR_OPERATIONS`), if its operands
    and loop are all of one dtype it serves, else None."""
    row = SCALAR_OPERATIONS.get(op.name) if op.kind == "ufunc" else None
    if row is None or len(set(op.in_dtypes)) != 1 or op.in_dtypes[0] not in row[1]:
        return None
    dtype = op.in_dtypes[0]
    if op.out_dtypes != ((_BOOL if row[2] else dtype),) or \
            any(d != dtype for _, _, d in operands):
        return None
    return row[0]


def _quiet_recompute(op: Any) -> Callable[..., float]:
    """``op`` (a float64 step) on Python floats, by its NumPy loop, quiet: its NaN's bits."""
    on_host, float64 = op.row.on_host, np.float64

    @np.errstate(all="ignore")
    def recompute(*operands: float) -> float:
        return float(on_host(op, [float64(x) for x in operands]))

    return recompute


def _recompute(op: Any) -> Callable[..., Any]:
    """``op`` on NumPy scalars by its NumPy loop (called in a quiet function): its NaN."""
    on_host = op.row.on_host
    return lambda *operands: on_host(op, list(operands))


def compile_host_program(plan: Any, fold_plan: Callable[..., Any]
                         ) -> tuple[Callable[[list[Any]], Any], bool]:
    """``(run, gives_python)`` for ``plan`` (an `expr.Plan`; see `expr.host_program`): ``run(s)``
    written by ``fold_plan`` (`expr.fold_plan`, THE walk), each step's statement by its
    ``apply``, then compiled."""
    namespace: dict[str, Any] = {"float": float, "nan": math.nan, "sqrt": math.sqrt}
    lines: list[str] = []
    steps = 0
    quiet = False  # whether a step may warn: then the whole function runs quiet

    def bind(value: Any) -> str:
        name = f"g{len(namespace)}"
        namespace[name] = value
        return name

    def as_numpy(operand: tuple[str, int, Any]) -> str:
        text, held, dtype = operand
        return text if held == _NUMPY else f"{bind(dtype.type)}({text})"

    def as_python(operand: tuple[str, int, Any]) -> str:
        text, held, _ = operand
        return text if held == _PYTHON else f"float({text})"

    def write(op: Any, operands: list[tuple[str, int, Any]]) -> tuple[str, int, Any]:
        nonlocal quiet, steps
        result, steps = f"r{steps}", steps + 1
        form = _float64_step(op, operands)
        if form is None:
            quiet = True
            form = _scalar_step(op, operands)
            args = list(map(as_numpy, operands))
            if form is None:
                lines.append(f"{result} = {op.row._host_source(op, args, bind)}")
                return result, _NUMPY, op.dtype
            args = once(args, result)
            lines.append(f"{result} = {form.format(*args)}")
            if op.dtype != _BOOL:
                lines.append(f"if {result} != {result}:  # a NaN: the ufunc's own bits")
                lines.append(f"    {result} = {bind(_recompute(op))}({', '.join(args)})")
            return result, _NUMPY, op.dtype
        args = once(list(map(as_python, operands)), result)
        value = form.format(*args)
        if op.dtype == _BOOL:  # a comparison: no NaN
            lines.append(f"{result} = {value}")
            return result, _PYTHON, _BOOL
        lines.append(f"{result} = {value}")
        lines.append(f"if {result} != {result}:  # a NaN: the ufunc's own bits")
        lines.append(f"    {result} = {bind(_quiet_recompute(op))}({', '.join(args)})")
        return result, _PYTHON, _F8

    def once(args: list[str], result: str) -> list[str]:
        """Each operand that is a conversion made once, into a local."""
        for j, arg in enumerate(args):
            if not arg.isidentifier():
                lines.append(f"{result}_{j} = {arg}")
                args[j] = f"{result}_{j}"
        return args

    sources = [(f"s[{i}]", _HOST if kind[0] == "leaf" else _NUMPY,
                kind[1] if isinstance(kind[1], np.dtype) else None)
               for i, kind in enumerate(plan.leaf_kinds)]
    root = fold_plan(plan, sources, write)
    source = "\n".join(["def run(s):", *(f"    {line}" for line in lines),
                        f"    return {root[0]}"])
    exec(source, namespace)  # noqa: S102 - only names, subscripts and operators: see `bind`
    run = namespace["run"]
    return (np.errstate(all="ignore")(run) if quiet else run), root[1] == _PYTHON
