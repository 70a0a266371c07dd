"""Elementwise update rules as lazy nodes: one infix C printer and one NumPy evaluator.

Why this module exists: an optimizer's update (``p = param - lr * g``) must run as CUDA C in a
kernel and with NumPy on a host-evaluating backend, with the same arithmetic in the same order
on both. Writing it twice (or as text that both sides parse) lets the two drift; so a rule is
written once, with Python operators on `Rule` values, and recorded as `gpuscalar.lazy.expr`
nodes built by `make_node` (the same node type as a pending GPUScalar). This module then reads
those nodes two ways: `c_source` prints them as infix C with the fewest parentheses that keep
the tree's grouping (so a kernel's text reads as written, and the compiler sees exactly the
operations and order of the tree), and `evaluate` applies the matching NumPy ufunc per node.

A rule is dtype-generic: its leaves are *symbols* (a name the kernel defines: an array's
element, a hyperparameter, an earlier temporary) and small integer literals, all of the kernel's
type ``T`` on the device; the host evaluator is given values already cast to that dtype, and
NumPy treats a Python int as weak, as C converts the literal to ``T``. Float literals are
refused: C reads ``0.5`` as a double (promoting a float kernel's arithmetic) where NumPy keeps
float32, so a fractional constant is passed as a scalar instead.

The FMA-barrier policy is `c_source`'s ``barrier``: None (the optimizer kernels, as in 0.2:
the compiler may contract a multiply and an add within a rule, NVRTC's default) or the name of
an opaque function wrapped around every operation's value (as `gpuscalar.lazy.codegen` does for
expressions that must match eager CuPy bit for bit), so no contraction spans two operations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from . import expr

__all__ = ["Rule", "symbol", "symbols", "sqrt", "pow", "select", "minimum", "maximum", "sign",
           "c_source", "evaluate", "symbols_read", "CUDA_HELPERS", "cuda_helpers"]

#: Infix operators: C (and Python) spelling -> (NumPy ufunc, binding strength). Comparisons
#: bind weakest and are never chained unparenthesized (Python chains ``a == b == c``, C does not).
_INFIX: dict[str, tuple[Callable[..., Any], int]] = {
    "==": (np.equal, 0), "!=": (np.not_equal, 0), "<": (np.less, 0), "<=": (np.less_equal, 0),
    ">": (np.greater, 0), ">=": (np.greater_equal, 0),
    "+": (np.add, 1), "-": (np.subtract, 1),
    "*": (np.multiply, 2), "/": (np.divide, 2),
}
#: Functions: the name a kernel calls (defined in ``kernels/fused_elementwise.cu`` or by
#: `CUDA_HELPERS`) -> its NumPy twin.
_CALLS: dict[str, Callable[..., Any]] = {
    "sqrt": np.sqrt,
    "pow": np.power,
    "select": np.where,
    "minimum": np.minimum,
    "maximum": np.maximum,
    "sign": np.sign,
}
#: CUDA definitions of the `_CALLS` that ``kernels/fused_elementwise.cu`` lacks: only a kernel
#: whose rules call one carries it (`cuda_helpers`), so every other kernel's text is unchanged.
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
#: Binding strength of a symbol, a literal or a call: never parenthesized.
_ATOM = 9
_NO_DTYPES: tuple[np.dtype, ...] = ()


class _Symbol(str):
    """A named leaf of a rule (a str, so a node's children stay plain data)."""

    __slots__ = ()


def _child(value: Any) -> Any:
    """A rule operand as a node child: a node, a `_Symbol`, or an int literal."""
    if isinstance(value, Rule):
        return value.term
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"an update rule combines rules and int literals, got {type(value).__name__} "
            f"{value!r} (a fractional constant is a double in C but not in NumPy: pass it as a "
            "scalar)"
        )
    return value


def _key(child: Any) -> int:
    if expr.is_node(child):
        return child.key
    return expr.intern_key(("rule-symbol" if isinstance(child, _Symbol) else "rule-literal",
                            str(child)))


def _apply(name: str, *operands: Any) -> Rule:
    """The rule applying ``name`` (an `_INFIX` operator or a `_CALLS` function) to operands."""
    children = tuple(map(_child, operands))
    op = expr.get_op("rule", name, _NO_DTYPES, _NO_DTYPES)
    size = 1 + sum(child.size for child in children if expr.is_node(child))
    return Rule(expr.make_node(op, children, tuple(map(_key, children)), size))


def _infix(name: str) -> tuple[Callable[[Rule, Any], Rule], Callable[[Rule, Any], Rule]]:
    """The methods of the infix operator ``name``: ``rule <name> other`` and reflected."""

    def method(self: Rule, other: Any) -> Rule:
        return _apply(name, self, other)

    def reflected(self: Rule, other: Any) -> Rule:
        return _apply(name, other, self)

    return method, reflected


class Rule:
    """One per-element value of an update rule: a symbol, or operations on rules and int
    literals recorded as nodes (``+ - * /`` and comparisons; `sqrt`, `pow`, `select`,
    `minimum`, `maximum` and `sign` below). ``str(rule)`` is its C text."""

    __slots__ = ("term",)
    __hash__ = None  # type: ignore[assignment]  # == builds a rule, so no hash either

    def __init__(self, term: Any) -> None:
        self.term = term

    __add__, __radd__ = _infix("+")
    __sub__, __rsub__ = _infix("-")
    __mul__, __rmul__ = _infix("*")
    __truediv__, __rtruediv__ = _infix("/")
    __eq__ = _infix("==")[0]  # type: ignore[assignment]  # a rule, not a bool
    __ne__ = _infix("!=")[0]  # type: ignore[assignment]
    __lt__, __gt__ = _infix("<")[0], _infix(">")[0]
    __le__, __ge__ = _infix("<=")[0], _infix(">=")[0]

    def __bool__(self) -> bool:
        raise TypeError("an update rule has no truth value on the host: use select(c, a, b)")

    def __str__(self) -> str:
        return c_source(self)

    def __repr__(self) -> str:
        return f"Rule({c_source(self)})"


def symbol(name: str) -> Rule:
    """The rule reading the kernel's value ``name`` (an array element, a scalar, a temporary)."""
    if not name.isidentifier():
        raise ValueError(f"a rule symbol must be an identifier, got {name!r}")
    return Rule(_Symbol(name))


def symbols(names: str) -> tuple[Rule, ...]:
    """`symbol` of each whitespace-separated name: ``lr, g = symbols("lr g")``."""
    return tuple(map(symbol, names.split()))


def sqrt(x: Any) -> Rule:
    """Square root (C ``sqrt``, NumPy ``sqrt``)."""
    return _apply("sqrt", x)


def pow(x: Any, y: Any) -> Rule:  # noqa: A001 - the C name the kernel calls
    """``x`` to the power ``y`` (C ``pow``, NumPy ``power``)."""
    return _apply("pow", x, y)


def select(condition: Any, if_true: Any, if_false: Any) -> Rule:
    """``if_true`` where ``condition`` holds, else ``if_false`` (NumPy ``where``)."""
    return _apply("select", condition, if_true, if_false)


def minimum(x: Any, y: Any) -> Rule:
    """The smaller of two values, NaN propagating (NumPy ``minimum``)."""
    return _apply("minimum", x, y)


def maximum(x: Any, y: Any) -> Rule:
    """The larger of two values, NaN propagating (NumPy ``maximum``)."""
    return _apply("maximum", x, y)


def sign(x: Any) -> Rule:
    """-1, 0 or 1 by the sign of ``x``, NaN staying NaN (NumPy ``sign``)."""
    return _apply("sign", x)


def _fold(rule: Rule, leaf: Callable[[Any], Any], node: Callable[[str, list[Any]], Any]) -> Any:
    """``rule`` folded bottom-up: ``leaf(child)`` for a symbol or literal, ``node(name, args)``
    for an operation with its operands' results (an iterative walk, as every lazy walk)."""
    if not expr.is_node(rule.term):
        return leaf(rule.term)
    results: list[Any] = []
    for item, is_node in expr.postorder(rule.term):
        if not is_node:
            results.append(leaf(item))
            continue
        arity = len(item.children)
        args = results[len(results) - arity:]
        del results[len(results) - arity:]
        results.append(node(item.op.name, args))
    return results[0]


def c_source(rule: Rule, names: Mapping[str, str] | None = None, barrier: str | None = None) -> str:
    """``rule`` as one C expression. ``names`` renames symbols (e.g. ``counter`` to
    ``(*step_ptr)``). Without ``barrier``, infix with the fewest parentheses that keep the
    tree's grouping (operators associate left, as in C and Python: ``a - (b - c)`` keeps its
    parentheses, ``(a - b) - c`` prints as ``a - b - c``); with one, every operation's value is
    wrapped in a call to it, so no FMA contraction spans two operations."""
    renames = names or {}

    def leaf(child: Any) -> tuple[str, int]:
        if isinstance(child, _Symbol):
            return renames.get(child, str(child)), _ATOM
        return (f"({child})" if child < 0 else str(child)), _ATOM

    def node(name: str, args: list[tuple[str, int]]) -> tuple[str, int]:
        if name in _CALLS:
            text, strength = f"{name}({', '.join(text for text, _ in args)})", _ATOM
        else:
            strength = _INFIX[name][1]
            (left, left_strength), (right, right_strength) = args
            if left_strength < strength or left_strength == strength == 0:
                left = f"({left})"
            if right_strength <= strength:
                right = f"({right})"
            text = f"{left} {name} {right}"
        return (f"{barrier}({text})", _ATOM) if barrier else (text, strength)

    return _fold(rule, leaf, node)[0]


def evaluate(rule: Rule, values: Mapping[str, Any]) -> Any:
    """``rule`` with NumPy, elementwise: each node's ufunc on its operands, in the tree's order.
    ``values`` maps each symbol to its value (arrays and NumPy scalars of the kernel's dtype);
    int literals stay Python ints (weak, as C converts them to ``T``). Call it under
    ``np.errstate(all="ignore")`` for IEEE results without warnings, as a kernel gives."""

    def leaf(child: Any) -> Any:
        return values[child] if isinstance(child, _Symbol) else child

    def node(name: str, args: list[Any]) -> Any:
        return (_CALLS[name] if name in _CALLS else _INFIX[name][0])(*args)

    return _fold(rule, leaf, node)


def symbols_read(rule: Rule) -> frozenset[str]:
    """The names of the symbols ``rule`` reads."""
    return _fold(rule, lambda child: frozenset((str(child),) if isinstance(child, _Symbol) else ()),
                 lambda name, args: frozenset().union(*args))


def cuda_helpers(rules: Iterable[Rule]) -> str:
    """The `CUDA_HELPERS` definitions ``rules`` call, each once, in first-use order."""
    called: dict[str, None] = {}
    for rule in rules:
        _fold(rule, lambda child: None,
              lambda name, args: called.setdefault(name) if name in CUDA_HELPERS else None)
    return "".join(CUDA_HELPERS[name] for name in called)
