"""Device-resident reductions, broadcast unreduction and global norms.

Why this module exists: `x.sum()` is where most hidden syncs begin, because the result is
immediately turned into a Python float, and AD rules for broadcasting (`unbroadcast`) do the same
for the gradient of a scalar operand. These functions keep the result on the device: a 0-d result
is a `GPUScalar`, anything else the backend's array. None of them ever synchronizes.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .backend import NUMPY, Backend, backend_of
from .scalar import GPUScalar, _array_of, _wrap

__all__ = [
    "sum",
    "mean",
    "prod",
    "min",
    "max",
    "norm",
    "dot",
    "vdot",
    "var",
    "std",
    "logsumexp",
    "any",
    "all",
    "count_nonzero",
    "unbroadcast",
    "global_norm",
]


def _operand(x: Any, function: str) -> tuple[Backend, Any]:
    """The backend and raw array of a reduction's input (an array or GPUScalar)."""
    if isinstance(x, GPUScalar):
        return x.backend, _array_of(x)
    backend = backend_of(x)
    if backend is None:
        raise TypeError(
            f"gpuscalar.{function}() takes a NumPy or CuPy array or a GPUScalar, got "
            f"{type(x).__name__}; convert lists with numpy.asarray/cupy.asarray first"
        )
    return backend, x


def _result(backend: Backend, value: Any) -> Any:
    """A 0-d result (array or NumPy scalar) as a GPUScalar; other arrays unchanged."""
    if getattr(value, "ndim", 0) == 0:
        if not hasattr(value, "ndim"):  # a Python number (NumPy's count_nonzero gives an int)
            value = np.asarray(value)
            if backend is not NUMPY:  # a fill kernel taking the value: never an upload
                value = backend.call(backend.xp.full, (), value[()], dtype=value.dtype)
        return _wrap(backend, value)
    return value


def _reduction(name: str, *, has_dtype: bool = True) -> Any:
    def reduction(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
        backend, array = _operand(x, name)
        kwargs: dict[str, Any] = {"axis": axis, "keepdims": keepdims}
        if dtype is not None:
            if not has_dtype:
                raise TypeError(f"gpuscalar.{name}() takes no dtype")
            kwargs["dtype"] = dtype
        return _result(backend, backend.call(getattr(backend.xp, name), array, **kwargs))

    reduction.__name__ = reduction.__qualname__ = name
    reduction.__doc__ = (
        f"Device ``{name}`` with NumPy's axis/dtype/keepdims; a 0-d result is a GPUScalar."
    )
    return reduction


sum = _reduction("sum")  # noqa: A001 - mirrors NumPy's names on purpose
mean = _reduction("mean")
prod = _reduction("prod")
min = _reduction("min", has_dtype=False)  # noqa: A001
max = _reduction("max", has_dtype=False)  # noqa: A001
any = _reduction("any", has_dtype=False)  # noqa: A001
all = _reduction("all", has_dtype=False)  # noqa: A001


def var(x: Any, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> Any:
    """Device variance (NumPy's ``ddof``); a 0-d result is a GPUScalar."""
    backend, array = _operand(x, "var")
    return _result(
        backend,
        backend.call(backend.xp.var, array, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims),
    )


def std(x: Any, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False) -> Any:
    """Device standard deviation (NumPy's ``ddof``); a 0-d result is a GPUScalar."""
    backend, array = _operand(x, "std")
    return _result(
        backend,
        backend.call(backend.xp.std, array, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims),
    )


def count_nonzero(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Number of non-zero elements; a 0-d result is an integer GPUScalar (NumPy returns a
    Python int here, which on a GPU would be a sync)."""
    backend, array = _operand(x, "count_nonzero")
    return _result(
        backend, backend.call(backend.xp.count_nonzero, array, axis=axis, keepdims=keepdims)
    )


def norm(x: Any, ord: float = 2, axis: Any = None, keepdims: bool = False) -> Any:
    """Vector ``ord``-norm on the device (``numpy.linalg.vector_norm`` semantics: with
    ``axis=None`` the array is treated as one flat vector, whatever its shape)."""
    backend, array = _operand(x, "norm")
    return _result(backend, backend.vector_norm(array, ord=ord, axis=axis, keepdims=keepdims))


def _pair(a: Any, b: Any, function: str) -> tuple[Backend, Any, Any]:
    backend_a, array_a = _operand(a, function)
    backend_b, array_b = _operand(b, function)
    if backend_a is not backend_b:
        raise TypeError(
            f"gpuscalar.{function}(): operands are on different backends "
            f"({backend_a.name} and {backend_b.name}); move one explicitly"
        )
    if backend_a.multi_device and backend_a.device_of(array_a) != backend_a.device_of(array_b):
        raise ValueError(
            f"gpuscalar.{function}(): operands are on devices {backend_a.device_of(array_a)!r} "
            f"and {backend_a.device_of(array_b)!r}"
        )
    return backend_a, array_a, array_b


def dot(a: Any, b: Any) -> Any:
    """Device ``dot``; the dot of two vectors is a GPUScalar."""
    backend, array_a, array_b = _pair(a, b, "dot")
    return _result(backend, backend.call(backend.xp.dot, array_a, array_b))


def vdot(a: Any, b: Any) -> GPUScalar:
    """Device ``vdot`` (conjugates ``a``, flattens both): always a GPUScalar."""
    backend, array_a, array_b = _pair(a, b, "vdot")
    return _result(backend, backend.call(backend.xp.vdot, array_a, array_b))


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """``log(sum(exp(x)))`` computed stably: the maximum is subtracted first, so large inputs
    do not overflow (and all ``-inf`` inputs give ``-inf``)."""
    backend, array = _operand(x, "logsumexp")
    xp = backend.xp
    shift = backend.call(xp.max, array, axis=axis, keepdims=True)
    shift = backend.call(xp.where, backend.call(xp.isfinite, shift), shift, 0)
    shifted = backend.call(xp.exp, backend.call(xp.subtract, array, shift))
    total = backend.call(xp.sum, shifted, axis=axis, keepdims=keepdims)
    if not keepdims:
        shift = shift.reshape(total.shape) if hasattr(total, "shape") else shift.reshape(())
    with np.errstate(divide="ignore"):  # log(0) = -inf when every input is -inf
        result = backend.call(xp.add, backend.call(xp.log, total), shift)
    return _result(backend, result)


def unbroadcast(grad: Any, shape: Sequence[int]) -> Any:
    """Sum ``grad`` over the axes broadcasting added or stretched, so it has ``shape``.

    The AD rule for any broadcasted operand: for ``z = x ⊕ y``, ``dx = unbroadcast(dz, x.shape)``.
    ``shape == ()`` (a scalar operand) gives a GPUScalar. One device reduction at most; no sync.
    """
    backend, array = _operand(grad, "unbroadcast")
    try:
        target = tuple(int(n) for n in shape)
    except TypeError:
        raise TypeError(f"unbroadcast() shape must be a tuple of ints, got {shape!r}") from None
    leading = array.ndim - len(target)
    if leading < 0 or builtins.any(
        n != 1 and n != array.shape[leading + i] for i, n in enumerate(target)
    ):
        raise ValueError(
            f"unbroadcast(): a gradient of shape {array.shape} cannot come from broadcasting an "
            f"operand of shape {target}"
        )
    axes = tuple(range(leading)) + tuple(
        leading + i for i, n in enumerate(target) if n == 1 and array.shape[leading + i] != 1
    )
    if axes:
        array = backend.call(backend.xp.sum, array, axis=axes, keepdims=False)
    if array.shape != target:
        array = array.reshape(target)  # only size-1 axes are restored: a view, no device work
    if isinstance(grad, GPUScalar) and not axes:
        return grad
    return _result(backend, array)


def global_norm(arrays: Iterable[Any], ord: float = 2) -> GPUScalar:
    """One ``ord``-norm over many arrays together (gradient clipping), as a GPUScalar.

    Computed as the norm of the per-array norms, which equals the norm of all elements
    concatenated for every ``ord`` (including ``inf``) without copying them together.
    """
    items = list(arrays)
    if not items:
        raise ValueError("global_norm() needs at least one array")
    norms = [norm(a, ord=ord) for a in items]
    backend = norms[0].backend
    for other in norms[1:]:
        if other.backend is not backend:
            raise TypeError(
                f"global_norm(): arrays are on different backends ({backend.name} and "
                f"{other.backend.name})"
            )
    if len(norms) == 1:
        return norms[0]
    stacked = backend.call(backend.xp.stack, [_array_of(n) for n in norms])
    if ord == math.inf:
        return _result(backend, backend.call(backend.xp.max, stacked))
    return _result(backend, backend.vector_norm(stacked, ord=ord, axis=None, keepdims=False))
