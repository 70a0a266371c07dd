"""Elementwise update rules as lazy nodes: the rule builder (Python operators -> nodes).

Why this module exists: an optimizer's update (``p = param - lr * g``) must run as CUDA C in a
kernel and with NumPy on a host-evaluating backend, with the same arithmetic in the same order
on both. Writing it twice (or as text that both sides parse) lets the two drift; so a rule is
written once, with Python operators on `RuleTerm` values, and recorded as `gpuscalar.lazy.expr`
nodes built by `make_node` (the same node type as a pending GPUScalar, ops of kind ``"rule"``,
whose row of the op-kind table is `expr.RuleKind`).
The package's one code generator writes them as infix C (`gpuscalar.lazy.codegen.c_source`:
the fewest parentheses that keep the tree's grouping, the FMA-barrier policy a parameter) and
its one host evaluator applies each node's NumPy twin (`gpuscalar.lazy.expr.evaluate`,
`expr.RULE_FUNCTIONS`); this module only builds the nodes.

A rule is dtype-generic: its leaves are *symbols* (a name the kernel defines: an array's
element, a hyperparameter, an earlier temporary) and small integer literals, all of the kernel's
type ``T`` on the device; the host evaluator is given values already cast to that dtype, and
NumPy treats a Python int as weak, as C converts the literal to ``T``. Float literals are
refused: C reads ``0.5`` as a double (promoting a float kernel's arithmetic) where NumPy keeps
float32, so a fractional constant is passed as a scalar instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import codegen, expr

__all__ = ["RuleTerm", "symbol", "symbols", "sqrt", "pow", "select", "minimum", "maximum", "sign",
           "evaluate", "symbols_read"]

_NO_DTYPES: tuple[np.dtype, ...] = ()


class _Symbol(str):
    """A named leaf of a rule (a str, so a node's children stay plain data)."""

    __slots__ = ()


def _child(value: Any) -> Any:
    """A rule operand as a node child: a node, a `_Symbol`, or an int literal."""
    if isinstance(value, RuleTerm):
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


def _apply(name: str, *operands: Any) -> RuleTerm:
    """The rule applying ``name`` (an infix operator or a function of
    `gpuscalar.lazy.codegen.RULE_CALLS`) to operands."""
    children = tuple(map(_child, operands))
    op = expr.get_op("rule", name, _NO_DTYPES, _NO_DTYPES)
    size = 1 + sum(child.size for child in children if expr.is_node(child))
    return RuleTerm(expr.make_node(op, children, tuple(map(_key, children)), size))


_Method = Callable[["RuleTerm", Any], "RuleTerm"]


def _infix(name: str) -> tuple[_Method, _Method]:
    """The methods of the infix operator ``name``: ``rule <name> other`` and reflected."""

    def method(self: RuleTerm, other: Any) -> RuleTerm:
        return _apply(name, self, other)

    def reflected(self: RuleTerm, other: Any) -> RuleTerm:
        return _apply(name, other, self)

    return method, reflected


class RuleTerm:
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
        return codegen.c_source(self)

    def __repr__(self) -> str:
        return f"RuleTerm({codegen.c_source(self)})"


def symbol(name: str) -> RuleTerm:
    """The rule reading the kernel's value ``name`` (an array element, a scalar, a temporary)."""
    if not name.isidentifier():
        raise ValueError(f"a rule symbol must be an identifier, got {name!r}")
    return RuleTerm(_Symbol(name))


def symbols(names: str) -> tuple[RuleTerm, ...]:
    """`symbol` of each whitespace-separated name: ``lr, g = symbols("lr g")``."""
    return tuple(map(symbol, names.split()))


def sqrt(x: Any) -> RuleTerm:
    """Square root (C ``sqrt``, NumPy ``sqrt``)."""
    return _apply("sqrt", x)


def pow(x: Any, y: Any) -> RuleTerm:  # noqa: A001 - the C name the kernel calls
    """``x`` to the power ``y`` (C ``pow``, NumPy ``power``)."""
    return _apply("pow", x, y)


def select(condition: Any, if_true: Any, if_false: Any) -> RuleTerm:
    """``if_true`` where ``condition`` holds, else ``if_false`` (NumPy ``where``)."""
    return _apply("select", condition, if_true, if_false)


def minimum(x: Any, y: Any) -> RuleTerm:
    """The smaller of two values, NaN propagating (NumPy ``minimum``)."""
    return _apply("minimum", x, y)


def maximum(x: Any, y: Any) -> RuleTerm:
    """The larger of two values, NaN propagating (NumPy ``maximum``)."""
    return _apply("maximum", x, y)


def sign(x: Any) -> RuleTerm:
    """-1, 0 or 1 by the sign of ``x``, NaN staying NaN (NumPy ``sign``)."""
    return _apply("sign", x)


def evaluate(rule: RuleTerm, values: Mapping[str, Any]) -> Any:
    """``rule`` with NumPy, elementwise, by the one host evaluator (`expr.evaluate`): each
    node's ufunc on its operands, in the tree's order. ``values`` maps each symbol to its value
    (arrays and NumPy scalars of the kernel's dtype); int literals stay Python ints (weak, as C
    converts them to ``T``). Call it under ``np.errstate(all="ignore")`` for IEEE results
    without warnings, as a kernel gives."""
    return expr.evaluate(rule.term,
                         lambda leaf: values[leaf] if isinstance(leaf, _Symbol) else leaf)


def symbols_read(rule: RuleTerm) -> frozenset[str]:
    """The names of the symbols ``rule`` reads."""
    leaves = expr.leaves_of(rule.term) if expr.is_node(rule.term) else [rule.term]
    return frozenset(str(leaf) for leaf in leaves if isinstance(leaf, _Symbol))
