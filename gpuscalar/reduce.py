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
from typing import Any, Literal, Protocol, cast, overload

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .backend import Backend, backend_of
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
    if x.dtype.kind in _NOT_NUMERIC:
        raise TypeError(
            f"gpuscalar.{function}() cannot reduce an array of dtype {x.dtype}: a device "
            "scalar holds a bool, integer, floating or complex value (CuPy has no datetime64, "
            "timedelta64 or object arrays); convert first, e.g. x.astype(numpy.int64)"
        )
    return backend, x


#: dtype kinds no reduction takes: datetime64 (M), timedelta64 (m), object, strings, void. NumPy
#: would sum timedelta64 or object arrays, but a GPUScalar cannot hold the result (and CuPy has
#: no such arrays), so they are refused by name rather than failing deeper or turning into int64.
_NOT_NUMERIC = frozenset("mMOSUV")


def _result(backend: Backend, value: Any) -> Any:
    """A 0-d result (array or NumPy scalar) as a GPUScalar; other arrays unchanged."""
    if getattr(value, "ndim", 0) == 0:
        if not hasattr(value, "ndim"):  # a Python number (NumPy's count_nonzero gives an int)
            value = np.asarray(value)
            if not backend.host_memory:  # a fill kernel taking the value: never an upload
                value = backend.call(backend.xp.full, (), value[()], dtype=value.dtype)
        return _wrap(backend, value)
    return value


class _Reduction(Protocol):
    """The signature of `sum`, `mean`, ... as type checkers see it: with the defaults
    (``axis=None``, ``keepdims=False``) the result is 0-d, so a `GPUScalar`; with an axis or
    kept dimensions it is an array or a GPUScalar depending on the input's shape (``Any``)."""

    @overload
    def __call__(
        self, x: Any, axis: None = None, dtype: Any = None, keepdims: Literal[False] = False
    ) -> GPUScalar: ...
    @overload
    def __call__(self, x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False
                 ) -> Any: ...


class _Moment(Protocol):
    """`var` and `std` as type checkers see them (see `_Reduction`)."""

    @overload
    def __call__(self, x: Any, axis: None = None, dtype: Any = None, ddof: int = 0,
                 keepdims: Literal[False] = False) -> GPUScalar: ...
    @overload
    def __call__(self, x: Any, axis: Any = None, dtype: Any = None, ddof: int = 0,
                 keepdims: bool = False) -> Any: ...


def _reduction(name: str, *, has_dtype: bool = True) -> _Reduction:
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
    return cast(_Reduction, reduction)  # `_result` makes every 0-d result a GPUScalar


sum = _reduction("sum")  # noqa: A001 - mirrors NumPy's names on purpose
mean = _reduction("mean")
prod = _reduction("prod")
min = _reduction("min", has_dtype=False)  # noqa: A001
max = _reduction("max", has_dtype=False)  # noqa: A001
any = _reduction("any", has_dtype=False)  # noqa: A001
all = _reduction("all", has_dtype=False)  # noqa: A001


def _moment(name: str, what: str) -> _Moment:
    def moment(
        x: Any, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False
    ) -> Any:
        backend, array = _operand(x, name)
        return _result(
            backend,
            backend.call(
                getattr(backend.xp, name), array, axis=axis, dtype=dtype, ddof=ddof,
                keepdims=keepdims,
            ),
        )

    moment.__name__ = moment.__qualname__ = name
    moment.__doc__ = f"Device {what} (NumPy's ``ddof``); a 0-d result is a GPUScalar."
    return cast(_Moment, moment)  # `_result` makes every 0-d result a GPUScalar


var = _moment("var", "variance")
std = _moment("std", "standard deviation")


@overload
def count_nonzero(x: Any, axis: None = None, keepdims: Literal[False] = False) -> GPUScalar: ...
@overload
def count_nonzero(x: Any, axis: Any = None, keepdims: bool = False) -> Any: ...
def count_nonzero(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Number of non-zero elements; a 0-d result is an integer GPUScalar (NumPy returns a
    Python int here, which on a GPU would be a sync).

    CuPy's ``count_nonzero(a, axis=None)`` takes no ``keepdims``: the kept axes are restored
    here by a reshape (a view, no device work)."""
    backend, array = _operand(x, "count_nonzero")
    counted = _result(backend, backend.call(backend.xp.count_nonzero, array, axis=axis))
    if not keepdims:
        return counted
    axes = normalize_axis_tuple(range(array.ndim) if axis is None else axis, array.ndim)
    kept = tuple(1 if i in axes else n for i, n in enumerate(array.shape))
    if not kept:
        return counted
    return (_array_of(counted) if isinstance(counted, GPUScalar) else counted).reshape(kept)


@overload
def norm(x: Any, ord: float = 2, axis: None = None, keepdims: Literal[False] = False
         ) -> GPUScalar: ...
@overload
def norm(x: Any, ord: float = 2, axis: Any = None, keepdims: bool = False) -> Any: ...
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


@overload
def logsumexp(x: Any, axis: None = None, keepdims: Literal[False] = False) -> GPUScalar: ...
@overload
def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any: ...
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
        kind = f"a GPUScalar of dtype {shape.dtype}" if isinstance(shape, GPUScalar) else (
            type(shape).__name__)  # (never the value of a GPUScalar: formatting it would sync)
        raise TypeError(f"unbroadcast() shape must be a tuple of ints, got {kind}") from None
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


def partials_into_slots(
    backend: Backend, arrays: Sequence[Any], dtype: Any, partial: Any
) -> Any:
    """A fresh device vector of ``dtype`` whose slot ``i`` holds ``partial(arrays[i], out)``.

    For per-array reductions combined afterwards (`gpuscalar.optim.all_finite`): each
    reduction writes its result straight into a 0-d view of one preallocated vector (``out=``),
    so nothing is gathered at all: 1 counted op for the vector (an allocation from CuPy's
    pool, no kernel), then only ``partial``'s own ops. Never ``xp.stack`` (see
    `stack_scalars`)."""
    slots = backend.call(backend.xp.empty, (len(arrays),), dtype=dtype)
    for i, array in enumerate(arrays):
        partial(array, slots[i, ...])  # a 0-d view: the reduction's out, no extra launch
    return slots


#: CuPy 14's ``_concatenate`` (cupy/_core/_routines_manipulation.pyx) copies each input with its
#: own kernel up to this many inputs; above it, inputs of one dtype (under 2 MiB each on average)
#: are joined by one kernel reading a table of their pointers built on the host and copied to
#: the device (``core.array(ptrs)``): a hidden host-to-device copy, refused while capturing.
STACK_COPIES = 8


def stack_scalars(backend: Backend, scalars: Sequence[Any], dtype: Any) -> Any:
    """The 0-d device arrays ``scalars`` as one vector of ``dtype``, without a host copy.

    ``xp.stack`` of them all would, in CuPy, upload a pointer table for more than
    `STACK_COPIES` inputs (a hidden host-to-device copy every call, which a CUDA-graph capture
    refuses). Up to `STACK_COPIES` this is one ``xp.stack`` (one counted op; CuPy copies each
    input); above, a preallocated vector is filled `STACK_COPIES` inputs at a time with
    ``xp.stack(chunk, out=slots[i:j])``: ``1 + ceil(n / 8)`` counted ops, device work only, the
    same values as one stack (each input is copied, cast as ``stack`` casts)."""
    xp = backend.xp
    if len(scalars) <= STACK_COPIES:
        return backend.call(xp.stack, list(scalars))
    slots = backend.call(xp.empty, (len(scalars),), dtype=dtype)
    for start in range(0, len(scalars), STACK_COPIES):
        chunk = list(scalars[start:start + STACK_COPIES])
        backend.call(xp.stack, chunk, out=slots[start:start + len(chunk)])
    return slots


def global_norm(arrays: Iterable[Any], ord: float = 2) -> GPUScalar:
    """One ``ord``-norm over many arrays together (gradient clipping), as a GPUScalar.

    Computed as the norm of the per-array norms, which equals the norm of all elements
    concatenated for every ``ord`` (including ``inf``) without copying them together. Device
    ops: one array is ``norm(x, ord)`` (1); ``n`` arrays are ``n`` norms, their gathering into
    one vector (`stack_scalars`: 1 op up to 8 arrays, ``1 + ceil(n / 8)`` above) and its norm
    (1). Never a host-to-device copy (no ``xp.stack`` of more than 8 inputs), so it can run
    inside a captured CUDA-graph step.
    """
    items = list(arrays)
    if not items:
        raise ValueError("global_norm() needs at least one array")
    for a in items:
        _operand(a, "global_norm")  # bad input named by this function, before any device work
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
    dtype = np.result_type(*[n.dtype for n in norms])
    stacked = stack_scalars(backend, [_array_of(n) for n in norms], dtype)
    if ord == math.inf:
        return _result(backend, backend.call(backend.xp.max, stacked))
    return _result(backend, backend.vector_norm(stacked, ord=ord, axis=None, keepdims=False))
