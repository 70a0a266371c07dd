"""CUDA C for every node tree: pending scalar expressions, each op as CuPy writes it, and rules.

Why this module exists: a fused expression must give the same bits as the eager operations it
replaces. Eager CuPy runs each operation as its own ufunc kernel: CuPy's routine for the chosen
loop (``cupy.<ufunc>._ops``), its inputs converted as CuPy converts them (``fix_cast_expr``),
compiled with CuPy's default options. So each node here emits exactly that: CuPy's own routine
string, type names and casts, in a block of its own. Between nodes, the value passes through an
opaque barrier (``OPAQUE_PREAMBLE``: an exact ``add.rn`` of -0.0 in inline PTX), so neither
NVVM nor ptxas can contract a multiply of one operation with an add of the next into an FMA
— which eager CuPy, one kernel per operation, can never do — while inside a routine it
contracts exactly as it would in CuPy's own kernel (same routine, same default flags).

The output is plain source text and parameter lists for ``cupy.ElementwiseKernel`` (CuPy adds
its headers, broadcasting and launch), or, for a host read (`read_source`, `pack_source`), a
whole one-thread ``cupy.RawKernel`` around the same statements (its own CuPy headers, pointer
parameters, the values packed for one transfer), generated deterministically from a
`gpuscalar.expr.Plan`:
parameters are numbered by position, preambles are kept in first-use order, and kernel names
come from the expression's structure, so equal structures give equal source in every process.
Nothing here needs a GPU: tests compile every generated shape with NVRTC.

One generator serves every consumer: `write_c` is the one walk that writes C for any node tree,
the per-op spelling and the FMA-barrier policy its parameters. `scalar_code` spells each op as
CuPy's routine with barriers (the statements that compute an expression, used by the
materializing kernel, by the fused array-operation kernel in its ``loop_prep``, once per
thread, and by the fused optimizers' prelude); `c_source` spells an optimizer's update rule
(`gpuscalar.lazy.rules`) as infix C on the kernel's generic type ``T``, without barriers as in
0.2. The walk is the host evaluator's (`expr.fold_plan`), so C and NumPy read a tree alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import expr

__all__ = [
    "FusionUnsupported",
    "OWN_ROUTINES",
    "INT_EXPONENT_PREAMBLE",
    "unfused_args",
    "OPAQUE_PREAMBLE",
    "ScalarCode",
    "KernelSpec",
    "cuda_type",
    "cast_expression",
    "cupy_op",
    "scalar_code",
    "plan_code",
    "OPAQUE",
    "Spelling",
    "with_barrier",
    "write_c",
    "c_source",
    "RULE_CALLS",
    "CUDA_HELPERS",
    "cuda_helpers",
    "raw_kernel_params",
    "cupy_headers",
    "leaf_code",
    "materialize_spec",
    "ArrayOperand",
    "fused_spec",
    "RawSource",
    "read_source",
    "pack_source",
    "PACK_BYTES",
    "READ_PREFIX",
]


class FusionUnsupported(Exception):
    """This operation has no CuPy routine to fuse (the caller evaluates it eagerly instead)."""


@contextlib.contextmanager
def _cupy_internals(what: str) -> Iterator[None]:
    """Code generation reads CuPy's private internals (CuPy 14: a ufunc's ``_ops`` and
    ``_preamble``, ``_scalar.get_typename``, ``_where_ufunc``, ...). A CuPy version without one
    of them makes fusion unsupported, not broken: the caller evaluates eagerly, unfused."""
    try:
        yield
    except (AttributeError, ImportError) as error:
        raise FusionUnsupported(
            f"CuPy's {what} is not available in this CuPy version ({error}); evaluated eagerly"
        ) from error


#: Ends each operation with an instruction of its own that rounds: no FMA spans two operations,
#: as none can between two eager kernels. Two compilers contract a multiply and an add: NVVM (an
#: empty ``asm volatile`` on the register stops it) and ptxas, which fuses a PTX ``mul.f64``
#: with the ``add.f64`` that reads it (seen on an H200: lazy ``a*b + c*d`` differed from eager
#: in 741 of 4,500 cases). So the barrier is ``add.rn`` of -0.0: exact for every value (-0.0,
#: subnormals and infinities included; no ``.ftz``), and an instruction with an explicit
#: rounding mode, which ptxas never contracts; tests/test_codegen.py assembles the PTX with
#: ptxas and reads the machine code to check it. Integers and float16 (rounded to half by every
#: CuPy operation) need no barrier.
OPAQUE_PREAMBLE = """
#ifndef GPUSCALAR_OPAQUE_DEFINED
#define GPUSCALAR_OPAQUE_DEFINED
template <typename T> __device__ __forceinline__ T _gs_opaque(T x) { return x; }
__device__ __forceinline__ float _gs_opaque(float x) {
    asm volatile("add.rn.f32 %0, %0, 0f80000000;" : "+f"(x)); return x;
}
__device__ __forceinline__ double _gs_opaque(double x) {
    asm volatile("add.rn.f64 %0, %0, 0d8000000000000000;" : "+d"(x)); return x;
}
__device__ __forceinline__ thrust::complex<float> _gs_opaque(thrust::complex<float> x) {
    return thrust::complex<float>(_gs_opaque(x.real()), _gs_opaque(x.imag()));
}
__device__ __forceinline__ thrust::complex<double> _gs_opaque(thrust::complex<double> x) {
    return thrust::complex<double>(_gs_opaque(x.real()), _gs_opaque(x.imag()));
}
#endif
"""

#: ldexp's int64 exponent clamped into C int's range, as NumPy's ``ldexp`` loop clamps it
#: (CuPy's routine ``ldexp(in0, in1)`` converts it to int, wrapping: ``2**40`` becomes 0).
INT_EXPONENT_PREAMBLE = """
#ifndef GPUSCALAR_INT_EXPONENT_DEFINED
#define GPUSCALAR_INT_EXPONENT_DEFINED
__device__ __forceinline__ long long _gs_int_exponent(long long e) {
    return e < -2147483648LL ? -2147483648LL : (e > 2147483647LL ? 2147483647LL : e);
}
#endif
"""


def _cupy() -> Any:
    import cupy  # noqa: PLC0415 - code generation is only asked for on the CuPy backend/tests

    return cupy


def cuda_type(dtype: np.dtype, headers: list[str] | None = None) -> str:
    """CuPy's C type name for ``dtype`` (``float``, ``thrust::complex<double>``, ``float16``);
    headers a type needs are appended to ``headers``."""
    with _cupy_internals("_scalar.get_typename"):
        from cupy._core import _scalar  # noqa: PLC0415

        needed: set[Any] = set()
        name = _scalar.get_typename(dtype, needed)
    if headers is not None:
        for header in sorted(needed, key=str):
            if header not in headers:
                headers.append(header)
    return name


def cast_expression(src: np.dtype, dst: np.dtype, expression: str) -> str:
    """CuPy's ``fix_cast_expr``: how a value of dtype ``src`` is written where ``dst`` is read
    (bool -> number as 0/1, complex -> real part or != 0; otherwise C's conversion)."""
    if src.kind == dst.kind:
        return expression
    if src.kind == "b":
        return f"({expression}) ? 1 : 0"
    if src.kind == "c":
        if dst.kind == "b":
            return f"({expression}) != {cuda_type(src)}()"
        return f"({expression}).real()"
    return expression


# ---- CuPy's routine for an op ----------------------------------------------------------------


def _cupy_ufunc(op: expr.Op) -> Any:
    cupy = _cupy()
    with _cupy_internals(f"ufunc for {op.kind}"):
        ufunc = op.row.cupy_ufunc(cupy, op)
    if ufunc is None or not hasattr(ufunc, "_ops"):
        raise FusionUnsupported(f"CuPy has no ufunc for {op!r}")
    return ufunc


def cupy_op(op: expr.Op) -> tuple[Any, Any]:
    """(CuPy ufunc, CuPy ``_Op``) that runs ``op``: the routine for exactly its loop when CuPy
    has one, else the routine CuPy itself picks for those input dtypes (value-equivalent: e.g.
    CuPy compares int8 values in its int64 loop). Raises `FusionUnsupported` when neither."""
    ufunc = _cupy_ufunc(op)
    extras = op.row.routine_operands(op)  # (round's decimals)
    in_dtypes = op.in_dtypes + tuple(dtype for _, dtype in extras)
    with _cupy_internals("ufunc routine table (_ops)"):
        for candidate in ufunc._ops.ops:
            if candidate.in_types == in_dtypes and candidate.out_types == op.out_dtypes:
                found = candidate
                break
        else:
            found = ufunc._ops._guess_routine_from_in_types(in_dtypes)
        if found is None and (op.name, in_dtypes[0].kind) in OWN_ROUTINES:
            found = _OwnRoutine(in_dtypes, op.out_dtypes,
                                OWN_ROUTINES[op.name, in_dtypes[0].kind])
        if found is None or not isinstance(found.routine, str) or ufunc._loop_prep:
            raise FusionUnsupported(f"CuPy has no fusable routine for {op!r}")
    return ufunc, found


#: (ufunc name, input dtype kind) -> gpuscalar's own routine for a NumPy loop CuPy 14 lacks
#: (cupy/_logic/ops.py: no complex loop for ``logical_not/and/or/xor``; NumPy's complex loops
#: read a number as true where either part is nonzero, NaN included). Without it, a complex
#: GPUScalar's ``np.logical_not(s)`` would reach CuPy's ufunc, a TypeError where the float path
#: gives a bool. The strict device refuses these loops as CuPy does unless they are listed here
#: (`gpuscalar.strict.cupy_lacks_loop`), so CI sees such a gap.
OWN_ROUTINES: dict[tuple[str, str], str] = {
    ("logical_not", "c"): "out0 = in0 == in0_type(0)",
    ("logical_and", "c"): "out0 = (in0 != in0_type(0)) && (in1 != in1_type(0))",
    ("logical_or", "c"): "out0 = (in0 != in0_type(0)) || (in1 != in1_type(0))",
    ("logical_xor", "c"): "out0 = (in0 != in0_type(0)) != (in1 != in1_type(0))",
}


def unfused_args(backend: Any, op: expr.Op, args: list[Any]) -> list[Any]:
    """The operands eager CuPy is called with for ``op`` where it runs unfused (a CuPy without
    the internals read here; `expr.OpKind.replay` is called with them): complex operands of a
    loop CuPy lacks (`OWN_ROUTINES`) as their truth values (one ``!= 0`` each), ldexp's int64
    exponent clamped as NumPy clamps it. Both are ufunc loops, known by the op's name, so any
    other op (``where``, ``round``) keeps its operands as they are."""
    if (op.name, op.in_dtypes[0].kind) in OWN_ROUTINES:
        return [backend.call(backend.ufunc("not_equal"), a, 0) for a in args]
    if op.name == "ldexp" and op.in_dtypes[1].itemsize > 4:
        exponent = args[1]
        clamped = (np.clip(exponent, -2**31, 2**31 - 1) if isinstance(exponent, np.generic)
                   else backend.call(backend.xp.clip, exponent, -2**31, 2**31 - 1))
        return [args[0], clamped]
    return args


@dataclass(frozen=True)
class _OwnRoutine:
    """A routine of `OWN_ROUTINES`, shaped as CuPy's ``_Op`` (what `_routine_lines` reads)."""

    in_types: tuple[np.dtype, ...]
    out_types: tuple[np.dtype, ...]
    routine: str


# ---- statements for one expression -------------------------------------------------------------


@dataclass
class ScalarCode:
    """C statements computing one scalar expression, and what they need."""

    #: (name, dtype, is_device_leaf): kernel parameters, leaves and constants in plan order
    params: list[tuple[str, np.dtype, bool]] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    #: C expression of the value (a variable, or a leaf read)
    value: str = ""
    dtype: np.dtype = np.dtype(np.float64)
    preambles: list[str] = field(default_factory=list)


def leaf_code(dtype: np.dtype, prefix: str) -> ScalarCode:
    """A materialized GPUScalar read by a kernel: one device-leaf parameter, no statements."""
    name = f"{prefix}l0"
    return ScalarCode(params=[(name, dtype, True)], value=f"{name}[0]", dtype=dtype)


def scalar_code(root: expr.Node, prefix: str) -> ScalarCode:
    """Statements computing the expression ``root``; every name starts with ``prefix``.

    Device leaves are parameters read as ``name[0]`` (a raw 0-d CArray in an ElementwiseKernel
    or a pointer in a raw kernel), constants are value parameters of their loop dtype.
    """
    return plan_code(expr.plan_of(root), prefix)


def plan_code(plan: expr.Plan, prefix: str) -> ScalarCode:
    """`scalar_code` for every expression of ``plan``'s structure: each op spelled as CuPy's
    routine (`_cupy_spelling`), FMA barriers between ops (`OPAQUE`) for parity with eager CuPy."""
    code = ScalarCode(preambles=[OPAQUE_PREAMBLE])
    sources: list[tuple[str, np.dtype]] = []
    for index, (kind, dtype) in enumerate(plan.leaf_kinds):
        name = f"{prefix}{'l' if kind == 'leaf' else 'c'}{index}"
        code.params.append((name, dtype, kind == "leaf"))
        sources.append((f"{name}[0]" if kind == "leaf" else name, dtype))
    code.value, code.dtype = write_c(plan, sources, _cupy_spelling(code, prefix), OPAQUE)
    return code


# ---- THE code generator: one walk, the spelling and the barrier policy its parameters --------

#: The FMA-barrier function of `OPAQUE_PREAMBLE`: fused scalar expressions wrap every op's value
#: in it; optimizer kernels pass no barrier (NVRTC may contract within a rule, as in 0.2).
OPAQUE = "_gs_opaque"

#: How one op is written: ``spell(op, operands, barrier)`` -> the op's value, given its operands'
#: values (whatever the spelling's values are: a C variable and its dtype, an infix text and its
#: binding strength) and the barrier policy (`with_barrier`).
Spelling = Callable[[expr.Op, list[Any], "str | None"], Any]


def with_barrier(text: str, barrier: str | None) -> str:
    """An op's C value under the barrier policy: wrapped in a call to ``barrier`` (no FMA
    contraction can span two ops), or as it is (None)."""
    return text if barrier is None else f"{barrier}({text})"


def write_c(plan: expr.Plan, sources: list[Any], spell: Spelling, barrier: str | None) -> Any:
    """THE C writer for any node tree (a pending scalar's, an update rule's): ``plan``'s ops in
    order, walked by `expr.fold_plan` (the host evaluator's walk), each written by ``spell``
    under the barrier policy ``barrier``; ``sources`` are the leaves' values. Returns the root's
    value. One walk, so both kinds of kernel read a tree in the order NumPy evaluates it."""
    return expr.fold_plan(plan, sources, lambda op, operands: spell(op, operands, barrier))


def _cupy_spelling(code: ScalarCode, prefix: str) -> Spelling:
    """Each op as eager CuPy runs it: its routine in a block of its own, into the variable
    ``{prefix}v{step}``, its statements appended to ``code``; a value is (variable, dtype)."""
    steps = itertools.count()

    def spell(op: expr.Op, inputs: list[Any], barrier: str | None) -> tuple[str, np.dtype]:
        variable = f"{prefix}v{next(steps)}"
        code.statements += _node_statements(op, inputs, variable, code.preambles, barrier)
        return variable, op.dtype

    return spell


def _routine_lines(routine_op: Any, operands: list[tuple[str, np.dtype]],
                   headers: list[str]) -> list[str]:
    """CuPy's routine as its own elementwise kernel runs it: the ``inN_type``/``outN_type``
    typedefs, each operand converted as CuPy converts it (``fix_cast_expr``), the outputs, the
    routine. Shared by a fused scalar op and a fused array operation, so both match eager CuPy
    alike; headers the types need are appended to ``headers``."""
    lines = [f"typedef {cuda_type(dtype, headers)} in{i}_type;"
             for i, dtype in enumerate(routine_op.in_types)]
    lines += [f"typedef {cuda_type(dtype, headers)} out{i}_type;"
              for i, dtype in enumerate(routine_op.out_types)]
    for i, ((source, dtype), wanted) in enumerate(zip(operands, routine_op.in_types,
                                                      strict=True)):
        lines.append(f"const in{i}_type in{i}({cast_expression(dtype, wanted, source)});")
    lines += [f"out{i}_type out{i};" for i in range(len(routine_op.out_types))]
    lines.append(f"{routine_op.routine.strip()};")
    return lines


def _node_statements(op: expr.Op, inputs: list[tuple[str, np.dtype]], variable: str,
                     preambles: list[str], barrier: str | None) -> list[str]:
    ufunc, routine_op = cupy_op(op)
    with _cupy_internals("ufunc preamble"):
        if ufunc._preamble and ufunc._preamble not in preambles:
            preambles.append(ufunc._preamble)
    headers: list[str] = []
    value_type = cuda_type(op.dtype, headers)
    operands = list(inputs)
    if op.name == "ldexp" and routine_op.in_types[1].itemsize > 4:
        # C's ldexp takes an int: CuPy's int64 loop converts the exponent (2**40 wraps to 0);
        # NumPy's clamps it into int's range, which keeps the value (|e| > 2200 saturates)
        source, dtype = operands[1]
        wanted = routine_op.in_types[1]
        operands[1] = (f"_gs_int_exponent({cast_expression(dtype, wanted, source)})", wanted)
        if INT_EXPONENT_PREAMBLE not in preambles:
            preambles.append(INT_EXPONENT_PREAMBLE)
    operands += op.row.routine_operands(op)  # (round's decimals)
    lines = [f"{value_type} {variable};", "{",
             *(f"    {line}" for line in _routine_lines(routine_op, operands, headers))]
    produced = routine_op.out_types[op.output]
    result = cast_expression(produced, op.dtype, f"out{op.output}")
    value = with_barrier(f"static_cast<{value_type}>({result})", barrier)
    lines.append(f"    {variable} = {value};")
    lines.append("}")
    for header in headers:
        if header not in preambles:
            preambles.insert(0, header)
    return lines


#: Binding strength of each infix operator of an update rule (C's, and Python's: comparisons
#: bind weakest and are never chained unparenthesized, as Python chains ``a == b == c`` and C
#: does not); any other rule op is a call of the function of its name (`RULE_CALLS`).
_INFIX_STRENGTH = {"==": 0, "!=": 0, "<": 0, "<=": 0, ">": 0, ">=": 0,
                   "+": 1, "-": 1, "*": 2, "/": 2}
#: The functions a rule may call: defined in ``kernels/fused_elementwise.cu`` or by
#: `CUDA_HELPERS` (their NumPy twins: `expr.RULE_FUNCTIONS`).
RULE_CALLS = ("sqrt", "pow", "select", "minimum", "maximum", "sign")
#: CUDA definitions of the `RULE_CALLS` that ``kernels/fused_elementwise.cu`` lacks: only a
#: kernel whose rules call one carries it (`cuda_helpers`), so every other kernel's text is
#: unchanged.
CUDA_HELPERS: dict[str, str] = {
    # numpy.sign: NaN stays NaN, a zero of either sign gives +0
    "sign": (
        "template <typename T>\n"
        "__device__ __forceinline__ T sign(T x) { return x > 0 ? T(1) : (x < 0 ? T(-1) : "
        "(x == 0 ? T(0) : x)); }\n"
    ),
    # numpy.maximum: NaN-propagating, as the header's minimum
    "maximum": (
        "template <typename T>\n"
        "__device__ __forceinline__ T maximum(T a, T b) { return (a != a || a > b) ? a : b; }\n"
    ),
}
#: Binding strength of a symbol, a literal, a call or a barrier: never parenthesized.
_ATOM = 9


def _infix_spelling(op: expr.Op, args: list[tuple[str, int]],
                    barrier: str | None) -> tuple[str, int]:
    """An update rule's op as C on the kernel's generic type ``T``: an infix operator with the
    fewest parentheses that keep the tree's grouping (operators associate left, as in C and
    Python: ``a - (b - c)`` keeps its parentheses, ``(a - b) - c`` prints as ``a - b - c``), or
    a call; a value is (text, binding strength)."""
    name = op.name
    if name in _INFIX_STRENGTH:
        strength = _INFIX_STRENGTH[name]
        (left, left_strength), (right, right_strength) = args
        if left_strength < strength or left_strength == strength == 0:
            left = f"({left})"
        if right_strength <= strength:
            right = f"({right})"
        text = f"{left} {name} {right}"
    else:
        text, strength = f"{name}({', '.join(text for text, _ in args)})", _ATOM
    return (text, strength) if barrier is None else (with_barrier(text, barrier), _ATOM)


def c_source(rule: Any, names: Mapping[str, str] | None = None, barrier: str | None = None) -> str:
    """An update rule (`gpuscalar.lazy.rules.RuleTerm`) as one C expression. ``names`` renames
    symbols (e.g. ``counter`` to ``(*step_ptr)``); int literals print as C literals of ``T``.
    ``barrier`` is the FMA-barrier policy: None (the optimizer kernels, as in 0.2) or a function
    wrapped around every op's value, so no contraction spans two ops (as `OPAQUE` in fused
    scalar kernels)."""
    renames = names or {}

    def leaf(child: Any) -> tuple[str, int]:
        if isinstance(child, str):  # a symbol
            return renames.get(child, child), _ATOM
        return (f"({child})" if child < 0 else str(child)), _ATOM

    term = rule.term
    if not expr.is_node(term):
        return leaf(term)[0]
    sources = [leaf(child) for child in expr.leaves_of(term)]
    return write_c(expr.plan_of(term), sources, _infix_spelling, barrier)[0]


def cuda_helpers(rules: Iterable[Any]) -> str:
    """The `CUDA_HELPERS` definitions the update ``rules`` call, each once, in first-use order
    (the order the C writer meets them)."""
    called: dict[str, None] = {}
    for rule in rules:
        if expr.is_node(rule.term):
            for op, _ in expr.plan_of(rule.term).steps:
                if op.name in CUDA_HELPERS:
                    called.setdefault(op.name)
    return "".join(CUDA_HELPERS[name] for name in called)


def raw_kernel_params(code: ScalarCode) -> list[str]:
    """``code``'s parameters as a ``RawKernel`` declares them: a device leaf is a pointer to its
    0-d array, a constant a value of its dtype's C type."""
    return [f"const {cuda_type(dtype)}* __restrict__ {name}" if leaf
            else f"const {cuda_type(dtype)} {name}" for name, dtype, leaf in code.params]


def cupy_headers() -> str:
    """The headers CuPy puts before every elementwise kernel (complex, CArray, ...): a raw
    kernel that runs CuPy's routines includes them itself."""
    with _cupy_internals("header list"):
        from cupy._core import core  # noqa: PLC0415

        return "".join(f"#include <{header}>\n" for header in core._cupy_header_list)


# ---- kernels -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelSpec:
    """Arguments for ``cupy.ElementwiseKernel``; ``preambles`` are the distinct pieces of its
    preamble (headers first), in order."""

    in_params: str
    out_params: str
    operation: str
    name: str
    preambles: tuple[str, ...]
    loop_prep: str = ""

    @property
    def preamble(self) -> str:
        return "\n".join(self.preambles)


def _param_list(code: ScalarCode) -> list[str]:
    return [f"{'raw ' if leaf else ''}{dtype.name} {name}" for name, dtype, leaf in code.params]


def materialize_spec(root: expr.Node) -> KernelSpec:
    """The kernel that computes ``root`` into a new 0-d array ``_gs_out`` (one thread)."""
    code = scalar_code(root, "_gs_")
    plan = expr.plan_of(root)
    return KernelSpec(
        in_params=", ".join(_param_list(code)),
        out_params=f"{code.dtype.name} _gs_out",
        operation="\n".join([*code.statements, f"_gs_out = {code.value};"]),
        name=f"gpuscalar_expr_{plan.name}",
        preambles=tuple(code.preambles),
    )


def read_source(root: expr.Node, extras: tuple[int, ...]) -> RawSource:
    """The ``RawKernel`` of a host read of ``root``: one thread computes it
    (`scalar_code`, the statements `materialize_spec` runs) and packs, for one transfer, the
    value and the device leaves at positions ``extras`` into the bytes ``_gs_pack``: slot k
    (`PACK_BYTES` bytes, aligned for any dtype) holds the k-th value, and slot 0 is also the
    read's 0-d result (`gpuscalar.lazy.fusion.Executor.read`). Its parameters are the
    expression's leaves and constants (pointers and values, `raw_kernel_params`), then
    ``_gs_pack``."""
    code = scalar_code(root, "_gs_")
    values = [(code.value, code.dtype), *(_packed_leaf(code, index) for index in extras)]
    name = f"{READ_PREFIX}{expr.plan_of(root).name}_{len(extras)}"
    return _packing_kernel(name, [code], values)


#: Bytes per value in a packed read (`gpuscalar.lazy.fusion.PACK_SLOT`): room and alignment
#: for any dtype, complex128 included.
PACK_BYTES = 16
#: Every packing kernel's name starts with this (`read_source`, `pack_source`).
READ_PREFIX = "gpuscalar_read_"


def _packed_leaf(code: ScalarCode, index: int) -> tuple[str, np.dtype]:
    name, dtype, is_leaf = code.params[index]
    assert is_leaf, "only device leaves are packed"
    return f"{name}[0]", dtype


@dataclass(frozen=True)
class RawSource:
    """A generated ``RawKernel`` (`read_source`, `pack_source`): its name, the distinct pieces
    its source starts with (CuPy's headers, the headers its types need, the preambles), in
    order, and the kernel function."""

    name: str
    preambles: tuple[str, ...]
    function: str

    @property
    def source(self) -> str:
        return "\n".join([*self.preambles, self.function])


def _packing_kernel(name: str, codes: list[ScalarCode],
                    values: list[tuple[str, np.dtype]]) -> RawSource:
    """A one-thread ``RawKernel`` running the statements of ``codes`` in order, then storing
    each of ``values`` (a C value and its dtype) in its slot of the bytes ``_gs_pack``."""
    headers: list[str] = []
    params: list[str] = []
    statements: list[str] = []
    preambles: list[str] = []
    for code in codes:
        params += raw_kernel_params(code)
        for _, dtype, _ in code.params:
            cuda_type(dtype, headers)  # (the headers a parameter's type needs)
        statements += code.statements
        preambles += [part for part in code.preambles if part not in preambles]
    statements += [f"*reinterpret_cast<{cuda_type(dtype, headers)}*>"
                   f"(&_gs_pack[{PACK_BYTES * slot}]) = {value};"
                   for slot, (value, dtype) in enumerate(values)]
    params.append("unsigned char* __restrict__ _gs_pack")
    function = "\n".join([
        f'extern "C" __global__ void {name}({", ".join(params)}) {{',
        "    if (blockIdx.x != 0 || threadIdx.x != 0) return;",
        *(f"    {line}" for line in statements),
        "}",
    ]) + "\n"
    pieces = [cupy_headers(), *(h for h in headers if h not in preambles), *preambles]
    return RawSource(name, tuple(pieces), function)


@dataclass(frozen=True)
class ArrayOperand:
    """One operand of a fused array operation: ``kind`` is ``"array"`` (an array of ``dtype``),
    ``"scalar"`` (a GPUScalar: ``root`` is its node, or None for a materialized one) or
    ``"python"`` (a number, passed as a value of the routine's input type). A scalar with
    ``keep`` is also stored, by one thread, in a 0-d output (its GPUScalar is then kept)."""

    kind: str
    dtype: np.dtype
    root: expr.Node | None = None
    keep: bool = False


def fused_spec(ufunc_name: str, routine_op: Any, operands: list[ArrayOperand],
               out_dtypes: tuple[np.dtype, ...]) -> KernelSpec:
    """The kernel for one array ufunc whose GPUScalar operands are computed in its
    ``loop_prep`` (once per thread): the pending scalars cost no launch of their own.

    ``routine_op`` is the CuPy ``_Op`` the eager call would run; ``out_dtypes`` the dtypes of
    the output arrays (new ones, or the ``out=`` the caller gives).
    """
    cupy = _cupy()
    ufunc = getattr(cupy, ufunc_name)
    headers: list[str] = []
    preambles = [OPAQUE_PREAMBLE]
    with _cupy_internals("ufunc preamble"):
        if ufunc._preamble:
            preambles.append(ufunc._preamble)
    params, loop_prep, sources, kept = [], [], [], []
    described = [ufunc_name, repr(routine_op.in_types)]
    for k, operand in enumerate(operands):
        if operand.kind == "array":
            params.append(f"{operand.dtype.name} _gs_a{k}")
            sources.append((f"_gs_a{k}", operand.dtype))
            described.append(f"a{operand.dtype.str}")
        elif operand.kind == "python":
            wanted = routine_op.in_types[k]
            params.append(f"{wanted.name} _gs_p{k}")
            sources.append((f"_gs_p{k}", wanted))
            described.append(f"p{wanted.str}")
        else:
            prefix = f"_gs_s{k}_"
            code = (leaf_code(operand.dtype, prefix) if operand.root is None
                    else scalar_code(operand.root, prefix))
            params += _param_list(code)
            loop_prep += code.statements
            if operand.keep:
                kept.append(f"raw {code.dtype.name} _gs_w{k}")
                loop_prep.append(f"if (blockIdx.x == 0 && threadIdx.x == 0) "
                                 f"_gs_w{k}[0] = {code.value};")
            for preamble in code.preambles:
                if preamble not in preambles:
                    preambles.append(preamble)
            sources.append((code.value, code.dtype))
            described.append(("k" if operand.keep else "s") + (
                operand.dtype.str if operand.root is None
                else expr.describe_structure(operand.root.key)))
    body = _routine_lines(routine_op, sources, headers)
    outs = []
    for i, (produced, wanted) in enumerate(zip(routine_op.out_types, out_dtypes, strict=True)):
        outs.append(f"{wanted.name} _gs_out{i}")
        body.append(f"_gs_out{i} = {cast_expression(produced, wanted, f'out{i}')};")
        described.append(f"o{wanted.str}")
    digest = hashlib.sha1("|".join(described).encode()).hexdigest()[:16]
    return KernelSpec(
        in_params=", ".join(params),
        out_params=", ".join(outs + kept),
        operation="\n".join(body),
        name=f"gpuscalar_fused_{ufunc_name}_{digest}",
        preambles=tuple(headers + preambles),
        loop_prep="\n".join(loop_prep),
    )


def pack_source(items: list[tuple[Any, ...]]) -> RawSource:
    """The ``RawKernel`` of a read of several values at once
    (`gpuscalar.read`): one thread packs every value into the bytes ``_gs_pack`` for one
    transfer. Each item is ``("leaf", dtype)`` (a 0-d device array, a materialized GPUScalar)
    or ``("node", root, extras)`` (a pending GPUScalar, computed here from its leaves, as
    `read_source` computes one). Slot k (`PACK_BYTES` bytes, aligned for any dtype) holds the
    k-th item's value; the device leaves at positions ``extras`` of each pending item follow,
    item by item, so they become known with it. Every name of item k starts with
    ``_gs_{k}_``; the parameters are each item's (a pointer, or the expression's leaves and
    constants), in order, then ``_gs_pack``."""
    codes: list[ScalarCode] = []
    extra_values: list[tuple[str, np.dtype]] = []
    described: list[str] = []
    for k, item in enumerate(items):
        prefix = f"_gs_{k}_"
        if item[0] == "leaf":
            code = leaf_code(np.dtype(item[1]), prefix)
            described.append(f"l{code.dtype.str}")
        else:
            _, root, extras = item
            code = scalar_code(root, prefix)
            extra_values += [_packed_leaf(code, index) for index in extras]
            described.append(f"n{expr.describe_structure(root.key)}{tuple(extras)}")
        codes.append(code)
    values = [(code.value, code.dtype) for code in codes] + extra_values
    digest = hashlib.sha1("|".join(described).encode()).hexdigest()[:16]
    return _packing_kernel(f"{READ_PREFIX}many_{len(items)}_{digest}", codes, values)
