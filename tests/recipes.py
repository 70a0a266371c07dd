"""Random scalar expressions for the lazy-vs-eager and NVRTC tests.

A *recipe* is a tree: a leaf is ``("dev", dtype, value)`` (a GPUScalar of that dtype) or
``("py", value)`` (a Python number); a node is ``(name, *children)`` with ``name`` a key of
`OPERATIONS`. `build` turns a recipe into the value gpuscalar computes (lazily or eagerly, as
the caller's mode says). The same recipes come from a hypothesis strategy (`recipes`) and from a
seeded generator (`random_recipe`), so the NVRTC check can compile a fixed, broad set of shapes
even when the hypothesis test did not run first.
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
}


def device_value(dtype: np.dtype, raw: float) -> Any:
    """A value of ``dtype`` made from a float in [-8, 8] (wrapped into unsigned ranges)."""
    if dtype.kind == "b":
        return raw > 0
    if dtype.kind in "iu":
        return int(raw) % 200 if dtype.kind == "u" else int(raw)
    if dtype.kind == "c":
        return complex(raw, raw / 3)
    return raw


def build(recipe: Any, like: Any = None) -> Any:
    """The value of ``recipe``: GPUScalars for device leaves (on the backend of ``like``)."""
    if recipe[0] == "dev":
        _, dtype, value = recipe
        return gs.asscalar(value, dtype=dtype, like=like)
    if recipe[0] == "py":
        return recipe[1]
    arity, function = OPERATIONS[recipe[0]]
    return function(*(build(child, like) for child in recipe[1:]))


# ---- hypothesis ---------------------------------------------------------------------------------

_raw = st.floats(-8, 8, allow_nan=False).map(lambda x: round(x, 2))
_python_numbers = st.one_of(
    st.booleans(), st.integers(-300, 300), st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10, 10), st.complex_numbers(max_magnitude=10),
)
device_leaves = st.builds(lambda d, r: ("dev", d, device_value(d, r)), st.sampled_from(DTYPES),
                          _raw)
leaves = st.one_of(device_leaves, device_leaves, _python_numbers.map(lambda v: ("py", v)))


@st.composite
def recipes(draw: Any, depth: int = 6) -> Any:
    """An expression tree of depth <= ``depth`` whose root is an operation."""
    name = draw(st.sampled_from(sorted(OPERATIONS)))
    arity = OPERATIONS[name][0]
    children = []
    for _ in range(arity):
        if depth > 1 and draw(st.integers(0, 2)) == 0:
            children.append(draw(recipes(depth=depth - 1)))
        else:
            children.append(draw(leaves))
    return (name, *children)


# ---- a seeded generator (no hypothesis) ---------------------------------------------------------


def random_recipe(rng: random.Random, depth: int = 4) -> Any:
    """A recipe drawn with ``rng``: the same sequence of shapes on every run."""
    name = rng.choice(sorted(OPERATIONS))
    children = []
    for _ in range(OPERATIONS[name][0]):
        if depth > 1 and rng.random() < 0.4:
            children.append(random_recipe(rng, depth - 1))
        elif rng.random() < 0.7:
            dtype = rng.choice(DTYPES)
            children.append(("dev", dtype, device_value(dtype, rng.uniform(-8, 8))))
        else:
            children.append(("py", rng.choice([True, 3, -2, 0.5, 1e3, 2j])))
    return (name, *children)
