"""Vector-Jacobian products (VJP rules) for broadcasting arithmetic, without syncs.

Why this module exists: hand-written or framework AD rules are a classic source of hidden syncs
(Zygote's and Flux's rules returning Python floats for scalar operands, ``sum(dz)`` turned into a
host number for a broadcast scalar). Here every rule keeps cotangents on the device: array
operands get arrays of their own shape, scalar operands get GPUScalars. Each binary rule has
the signature ``(g, a, b) -> (da, db)``, where ``g`` is the cotangent of ``a ⊕ b`` (with
broadcasting) and each operand may be an array, a GPUScalar or a Python number. Shapes are fixed
after broadcasting in one place, `gpuscalar.unbroadcast`, as in HIPS/autograd.

Python-number operands: their cotangent is returned as a GPUScalar too (never None), so a
constant can later become a trainable scalar without changing the calling code.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import promote
from .devices import backend_of
from .math import log, where
from .reduce import unbroadcast
from .scalar import GPUScalar, _array_of, asscalar
from .sync import describe

__all__ = [
    "vjp_add",
    "vjp_sub",
    "vjp_mul",
    "vjp_truediv",
    "vjp_pow",
    "vjp_maximum",
    "vjp_minimum",
    "vjp_sum",
    "vjp_mean",
]


def _shape(x: Any, name: str) -> tuple[int, ...]:
    if isinstance(x, GPUScalar):
        return ()
    if backend_of(x) is not None:
        return tuple(x.shape)
    if type(x) in promote.PYTHON_SCALAR_TYPES or isinstance(x, np.generic):
        return ()
    raise TypeError(
        f"{name} must be an array, a GPUScalar or a Python number, got {type(x).__name__}"
    )


def _cotangent(g: Any, a: Any, b: Any, rule: str) -> tuple[Any, tuple, tuple]:
    """Validate ``g`` against the broadcast shape of ``a`` and ``b``; return it as a device
    value (a Python-number ``g`` becomes a GPUScalar beside the operands)."""
    shape_a, shape_b = _shape(a, f"{rule}(): a"), _shape(b, f"{rule}(): b")
    try:
        out_shape = np.broadcast_shapes(shape_a, shape_b)
    except ValueError:
        raise ValueError(
            f"{rule}(): operands of shapes {shape_a} and {shape_b} do not broadcast"
        ) from None
    if not isinstance(g, GPUScalar) and backend_of(g) is None:
        if type(g) not in promote.PYTHON_SCALAR_TYPES and not isinstance(g, np.generic):
            raise TypeError(
                f"{rule}(): g must be an array, a GPUScalar or a Python number, got "
                f"{type(g).__name__}"
            )
        like = next((x for x in (a, b) if isinstance(x, GPUScalar) or backend_of(x)), None)
        g = asscalar(g, like=like)
    g_shape = _shape(g, f"{rule}(): g")
    if g_shape != out_shape:
        raise ValueError(
            f"{rule}(): g has shape {g_shape} but a {shape_a} and b {shape_b} broadcast to "
            f"{out_shape}"
        )
    return g, shape_a, shape_b


def vjp_add(g: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Cotangents of ``a + b``: ``g`` unbroadcast to each operand's shape."""
    g, shape_a, shape_b = _cotangent(g, a, b, "vjp_add")
    return unbroadcast(g, shape_a), unbroadcast(g, shape_b)


def vjp_sub(g: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Cotangents of ``a - b``: ``g`` and ``-g``, unbroadcast."""
    g, shape_a, shape_b = _cotangent(g, a, b, "vjp_sub")
    return unbroadcast(g, shape_a), unbroadcast(-g, shape_b)


def vjp_mul(g: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Cotangents of ``a * b``: ``g * b`` and ``g * a``, unbroadcast."""
    g, shape_a, shape_b = _cotangent(g, a, b, "vjp_mul")
    return unbroadcast(g * b, shape_a), unbroadcast(g * a, shape_b)


def vjp_truediv(g: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Cotangents of ``a / b``: ``g / b`` and ``-g * a / b**2``, unbroadcast."""
    g, shape_a, shape_b = _cotangent(g, a, b, "vjp_truediv")
    da = g / b
    return unbroadcast(da, shape_a), unbroadcast(-(da * a) / b, shape_b)


def vjp_pow(g: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Cotangents of ``a ** b``: ``g * b * a**(b-1)`` and ``g * a**b * log(a)``, unbroadcast.

    As in HIPS/autograd, ``log(a)`` is taken with ``a == 0`` replaced by 1, so ``0 ** b`` gives a
    zero (not NaN) cotangent for ``b``; a negative base gives NaN there, as the real log does.
    """
    g, shape_a, shape_b = _cotangent(g, a, b, "vjp_pow")
    # Python-number operands join g on the device: Python's ``0.0 ** -1`` would raise.
    a, b = (x if _shape_is_device(x) else asscalar(x, like=g) for x in (a, b))
    da = g * b * a ** (b - 1)
    safe_a = where(_as_device(a == 0, g), 1, a)
    db = g * a**b * log(safe_a)
    return unbroadcast(da, shape_a), unbroadcast(db, shape_b)


def _shape_is_device(x: Any) -> bool:
    return isinstance(x, GPUScalar) or backend_of(x) is not None


def _as_device(value: Any, like: Any) -> Any:
    """A Python bool from comparing two Python numbers, as a bool GPUScalar beside ``like``."""
    if isinstance(value, GPUScalar) or backend_of(value) is not None:
        return value
    return asscalar(bool(value), like=like)


def _select_vjp(g: Any, a: Any, b: Any, rule: str, wins: str) -> tuple[Any, Any]:
    """Shared rule of maximum/minimum: the cotangent goes to the selected operand; ties split
    it evenly (as PyTorch and HIPS/autograd do). Masks multiply ``g``, so its dtype is kept."""
    g, shape_a, shape_b = _cotangent(g, a, b, rule)
    a_wins = a > b if wins == "greater" else a < b
    b_wins = b > a if wins == "greater" else b < a
    tie = _as_device(a == b, g) * (g * 0.5)
    da = g * _as_device(a_wins, g) + tie
    db = g * _as_device(b_wins, g) + tie
    return unbroadcast(da, shape_a), unbroadcast(db, shape_b)


def vjp_maximum(g: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Cotangents of ``maximum(a, b)``: ``g`` to the larger operand, split evenly on ties."""
    return _select_vjp(g, a, b, "vjp_maximum", "greater")


def vjp_minimum(g: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Cotangents of ``minimum(a, b)``: ``g`` to the smaller operand, split evenly on ties."""
    return _select_vjp(g, a, b, "vjp_minimum", "less")


def _axes(x: Any, axis: Any) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {describe(axis)}")
        if not -x.ndim <= a < x.ndim:
            raise ValueError(f"axis {a} is out of bounds for an array of shape {x.shape}")
    return tuple(a % x.ndim for a in axes)


def _reduction_cotangent(
    g: Any, x: Any, axis: Any, keepdims: bool, rule: str, mean: bool = False
) -> Any:
    """``g`` broadcast back to ``x``'s shape as a new (writable) array, or a GPUScalar when
    ``x`` is one; with ``mean``, divided by the number of elements reduced."""
    if isinstance(x, GPUScalar):
        if axis not in (None, ()):
            raise ValueError(
                f"{rule}(): x is a scalar, so axis must be None, got {describe(axis)}")
        return g if isinstance(g, GPUScalar) else asscalar(g, like=x)
    backend = backend_of(x)
    if backend is None:
        raise TypeError(f"{rule}(): x must be an array or a GPUScalar, got {type(x).__name__}")
    axes = _axes(x, axis)
    reduced = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    expected = reduced if keepdims else tuple(n for i, n in enumerate(x.shape) if i not in axes)
    if isinstance(g, GPUScalar):
        g_array = _array_of(g)
    elif backend_of(g) is backend:
        g_array = g
    elif type(g) in promote.PYTHON_SCALAR_TYPES or isinstance(g, np.generic):
        g_array = _array_of(asscalar(g, like=x))
    else:
        raise TypeError(
            f"{rule}(): g must be a {backend.name} array, a GPUScalar or a Python number, got "
            f"{type(g).__name__}"
        )
    if tuple(g_array.shape) != expected:
        raise ValueError(
            f"{rule}(): g has shape {tuple(g_array.shape)} but reducing x of shape {x.shape} "
            f"over axis={axis!r} gives {expected}"
        )
    dtype = x.dtype if x.dtype.kind in "fc" else g_array.dtype
    out = backend.call(backend.xp.empty, x.shape, dtype=dtype)
    backend.call(backend.xp.copyto, out, g_array.reshape(reduced), casting="same_kind")
    if mean:
        count = math.prod(x.shape[i] for i in axes)
        backend.call(backend.xp.multiply, out, 1.0 / max(count, 1), out=out, casting="same_kind")
    return out


def vjp_sum(g: Any, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Cotangent of ``sum(x, axis, keepdims)``: ``g`` broadcast to ``x``'s shape (a new array
    with ``x``'s floating dtype; a GPUScalar for a GPUScalar ``x``)."""
    return _reduction_cotangent(g, x, axis, keepdims, "vjp_sum")


def vjp_mean(g: Any, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Cotangent of ``mean(x, axis, keepdims)``: ``g / n`` broadcast to ``x``'s shape, where
    ``n`` is the number of elements averaged."""
    return _reduction_cotangent(g, x, axis, keepdims, "vjp_mean", mean=True)
