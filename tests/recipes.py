"""Random scalar expressions for the lazy-vs-eager and NVRTC tests.

A *recipe* is a tree: a leaf is ``("dev", dtype, value)`` (a GPUScalar of that dtype),
``("py", value)`` (a Python number) or ``("np", dtype, value)`` (a NumPy scalar such as
``np.float32(2)``, a strong operand); a node is ``(name, *children)`` with ``name`` a key of
`OPERATIONS`; ``("shared", ident, recipe)`` is a subexpression built once and used wherever the
same ident appears, so a recipe is a DAG (one GPUScalar, pending or not, used twice). `build`
turns a recipe into the value gpuscalar computes (lazily or eagerly, as the caller's mode says).
The same recipes come from a hypothesis strategy (`recipes`) and from a seeded generator
(`random_recipe`), so the NVRTC check can compile a fixed, broad set of shapes even when the
hypothesis test did not run first.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

import gpuscalar as gs

#: All 14 dtypes a GPUScalar may hold.
DTYPES = [np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)]

#: name -> (arity, function): every operator and helper a GPUScalar has.
OPERATIONS: dict[str, tuple[int, Callable[..., Any]]] = {
    # binary operators
    "add": (2, operator.add), "sub": (2, operator.sub), "mul": (2, operator.mul),
    "truediv": (2, operator.truediv), "floordiv": (2, operator.floordiv),
    "mod": (2, operator.mod), "pow": (2, operator.pow), "and": (2, operator.and_),
    "or": (2, operator.or_), "xor": (2, operator.xor), "lshift": (2, operator.lshift),
    "rshift": (2, operator.rshift), "lt": (2, operator.lt), "le": (2, operator.le),
    "eq": (2, operator.eq), "ne": (2, operator.ne), "gt": (2, operator.gt),
    "ge": (2, operator.ge), "divmod_q": (2, lambda a, b: divmod(a, b)[0]),
    "divmod_r": (2, lambda a, b: divmod(a, b)[1]),
    # binary helpers
    "minimum": (2, gs.minimum), "maximum": (2, gs.maximum), "arctan2": (2, gs.arctan2),
    "hypot": (2, gs.hypot), "power": (2, gs.power),
    # unary operators
    "neg": (1, operator.neg), "pos": (1, operator.pos), "abs": (1, abs),
    "invert": (1, operator.invert), "math.floor": (1, math.floor),
    "math.ceil": (1, math.ceil), "math.trunc": (1, math.trunc), "round": (1, round),
    "round2": (1, lambda a: round(a, 2)),
    # unary helpers
    "sqrt": (1, gs.sqrt), "exp": (1, gs.exp), "log": (1, gs.log), "log1p": (1, gs.log1p),
    "expm1": (1, gs.expm1), "sign": (1, gs.sign), "isfinite": (1, gs.isfinite),
    "isnan": (1, gs.isnan), "isinf": (1, gs.isinf), "sin": (1, gs.sin), "cos": (1, gs.cos),
    "tan": (1, gs.tan), "tanh": (1, gs.tanh), "floor": (1, gs.floor), "ceil": (1, gs.ceil),
    "log2": (1, gs.log2), "log10": (1, gs.log10), "exp2": (1, gs.exp2),
    "gs.abs": (1, gs.abs),
    # three operands
    "where": (3, gs.where), "clip": (3, gs.clip),
    # NumPy ufuncs through __array_ufunc__ (beyond the helpers above)
    **{f"np.{name}": (2, getattr(np, name)) for name in (
        "add", "minimum", "fmod", "logaddexp", "copysign", "nextafter", "fmax", "fmin",
        "heaviside", "float_power", "logical_and", "logical_xor", "gcd", "ldexp")},
    "np.divmod_r": (2, lambda a, b: np.divmod(a, b)[1]),
    **{f"np.{name}": (1, getattr(np, name)) for name in (
        "sin", "cbrt", "square", "reciprocal", "rint", "signbit", "logical_not", "conjugate",
        "arcsinh", "fabs")},
}

#: Python ints NumPy converts in more than one way (beyond +-2**53: through int64 or directly,
#: rounding once or twice; beyond int64: refused by some ufuncs), and small ones that wrap.
TRICKY_INTS = [2**53 + 2**29 + 1, -(2**53) - 2**29 - 1, 2**62 + 1, 2**63, 2**64 - 1, 2**64,
               -(2**63) - 1, -1, 255, 256, 65504, 2**31]


def device_value(dtype: np.dtype, raw: float) -> Any:
    """A value of ``dtype`` made from a float in [-8, 8] (wrapped into unsigned ranges)."""
    if dtype.kind == "b":
        return raw > 0
    if dtype.kind in "iu":
        return int(raw) % 200 if dtype.kind == "u" else int(raw)
    if dtype.kind == "c":
        return complex(raw, raw / 3)
    return raw


def build(recipe: Any, like: Any = None, *, stepwise: bool = False,
          memo: dict[Any, Any] | None = None) -> Any:
    """The value of ``recipe``: GPUScalars for device leaves (on the backend of ``like``).

    ``stepwise``: every operation's GPUScalar result is evaluated (``.array``) as soon as it is
    built, so a lazy run raises each error at the operation eager code raises it at.
    """
    memo = {} if memo is None else memo
    tag = recipe[0]
    if tag == "dev":
        _, dtype, value = recipe
        return gs.asscalar(value, dtype=dtype, like=like)
    if tag == "py":
        return recipe[1]
    if tag == "np":
        return recipe[1].type(recipe[2])
    if tag == "shared":
        _, ident, shared = recipe
        if ident not in memo:
            memo[ident] = build(shared, like, stepwise=stepwise, memo=memo)
        return memo[ident]
    arity, function = OPERATIONS[tag]
    operands = [build(child, like, stepwise=stepwise, memo=memo) for child in recipe[1:]]
    if tag in ("pow", "lshift") and all(type(o) in (bool, int) for o in operands) and (
            abs(operands[1]) > 64):
        # Python's own exact ints (no GPUScalar involved): 2**63 ** 2**64 would never finish
        raise OverflowError("a Python int operation too large for the test")
    value = function(*operands)
    if stepwise and isinstance(value, gs.GPUScalar):
        value.array  # noqa: B018 - evaluated here, where eager code computes it
    return value


# ---- hypothesis ---------------------------------------------------------------------------------

_raw = st.floats(-8, 8, allow_nan=False).map(lambda x: round(x, 2))
_python_numbers = st.one_of(
    st.booleans(), st.integers(-300, 300), st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10, 10), st.complex_numbers(max_magnitude=10), st.sampled_from(TRICKY_INTS),
)
device_leaves = st.builds(lambda d, r: ("dev", d, device_value(d, r)), st.sampled_from(DTYPES),
                          _raw)
numpy_leaves = st.builds(lambda d, r: ("np", d, device_value(d, r)), st.sampled_from(DTYPES),
                         _raw)
leaves = st.one_of(device_leaves, device_leaves, _python_numbers.map(lambda v: ("py", v)),
                   numpy_leaves)


@st.composite
def recipes(draw: Any, depth: int = 6) -> Any:
    """An expression DAG of depth <= ``depth`` whose root is an operation: up to two shared
    subexpressions (a device leaf or a small tree) may be used several times."""
    shared = [("shared", ident, draw(device_leaves) if draw(st.booleans()) else
               _tree(draw, 2, [])) for ident in range(draw(st.integers(0, 2)))]
    return _tree(draw, depth, shared)


def _tree(draw: Any, depth: int, shared: list[Any]) -> Any:
    name = draw(st.sampled_from(sorted(OPERATIONS)))
    children = []
    for _ in range(OPERATIONS[name][0]):
        choice = draw(st.integers(0, 5))
        if shared and choice == 5:
            children.append(draw(st.sampled_from(shared)))
        elif depth > 1 and choice <= 1:
            children.append(_tree(draw, depth - 1, shared))
        else:
            children.append(draw(leaves))
    return (name, *children)


# ---- a seeded generator (no hypothesis) ---------------------------------------------------------


def random_recipe(rng: random.Random, depth: int = 4, shared: list[Any] | None = None) -> Any:
    """A recipe drawn with ``rng``: the same sequence of shapes on every run (a DAG now and
    then, NumPy scalars and tricky ints among the leaves)."""
    if shared is None:
        shared = [("shared", 0, random_recipe(rng, 2, []))] if rng.random() < 0.3 else []
    name = rng.choice(sorted(OPERATIONS))
    children = []
    for _ in range(OPERATIONS[name][0]):
        draw = rng.random()
        if shared and draw < 0.15:
            children.append(shared[0])
        elif depth > 1 and draw < 0.45:
            children.append(random_recipe(rng, depth - 1, shared))
        elif draw < 0.75:
            dtype = rng.choice(DTYPES)
            children.append(("dev", dtype, device_value(dtype, rng.uniform(-8, 8))))
        elif draw < 0.85:
            dtype = rng.choice(DTYPES)
            children.append(("np", dtype, device_value(dtype, rng.uniform(-8, 8))))
        else:
            children.append(("py", rng.choice([True, 3, -2, 0.5, 1e3, 2j, *TRICKY_INTS[:3]])))
    return (name, *children)
