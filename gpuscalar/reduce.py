"""Device-resident reductions, broadcast unreduction and global norms.

Why this module exists: `x.sum()` is where most hidden syncs begin, because the result is
immediately turned into a Python float, and AD rules for broadcasting (`unbroadcast`) do the same
for the gradient of a scalar operand. These functions keep the result on the device: a 0-d result
is a `GPUScalar`, anything else the backend's array. None of them ever synchronizes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, cast, overload

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .backend import Backend
from .devices import backend_of
from .scalar import GPUScalar, _array_of, _wrap
from .sync import describe

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


def _operand(x: Any, function: str, what: str = "") -> tuple[Backend, Any]:
    """The backend and raw array of a reduction's input (an array or GPUScalar); ``what``
    names it in errors where the function takes many (``arrays[2]``)."""
    if isinstance(x, GPUScalar):
        return x.backend, _array_of(x)
    backend = backend_of(x)
    if backend is None:
        if what:
            raise TypeError(
                f"gpuscalar.{function}(): {what} must be a NumPy or CuPy array or a GPUScalar, "
                f"got {type(x).__name__}"
            )
        raise TypeError(
            f"gpuscalar.{function}() takes a NumPy or CuPy array or a GPUScalar, got "
            f"{type(x).__name__}; convert lists with numpy.asarray/cupy.asarray first"
        )
    if x.dtype.kind in _NOT_NUMERIC:
        raise TypeError(
            f"gpuscalar.{function}() cannot reduce {what + ', ' if what else ''}an array of "
            f"dtype {x.dtype}: a device scalar holds a bool, integer, floating or complex value "
            "(CuPy has no datetime64, timedelta64 or object arrays); convert first, e.g. "
            "x.astype(numpy.int64)"
        )
    return backend, x


#: dtype kinds no reduction takes: datetime64 (M), timedelta64 (m), object, strings, void. NumPy
#: would sum timedelta64 or object arrays, but a GPUScalar cannot hold the result (and CuPy has
#: no such arrays), so they are refused by name rather than failing deeper or turning into int64.
_NOT_NUMERIC = frozenset("mMOSUV")


def _result(backend: Backend, value: Any) -> Any:
    """A 0-d result (array or NumPy scalar) as a GPUScalar; other arrays unchanged."""
    ndim = getattr(value, "ndim", None)
    if ndim is None:  # a Python number (NumPy's count_nonzero gives an int)
        value = np.asarray(value)
        if not backend.host_memory:  # a fill kernel taking the value: never an upload
            value = backend.call(backend.xp.full, (), value[()], dtype=value.dtype)
        return _wrap(backend, value)
    return _wrap(backend, value) if ndim == 0 else value


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
    """Device ``dot`` (``xp.dot``'s rules and promotion); the dot of two vectors is a GPUScalar.

    Works in `gs.while_loop`/`gs.cond` bodies and `gs.capture` steps on every device, for
    every float and complex dtype: on CuPy two vectors always take gpuscalar's own dot kernel
    (the same bits in a recording and out of it; cuBLAS would refuse the recording stream),
    and matrices in a recording `gs.matmul` (the device's ``"blas"`` executor,
    `gpuscalar.matmul.Blas`).
    """
    backend, array_a, array_b = _pair(a, b, "dot")
    return _result(backend, backend.executor("blas").dot(array_a, array_b))


def vdot(a: Any, b: Any) -> GPUScalar:
    """Device ``vdot`` (conjugates ``a``, flattens both): always a GPUScalar. Works in loop,
    branch and capture bodies on every device, as `dot` does."""
    backend, array_a, array_b = _pair(a, b, "vdot")
    return _result(backend, backend.executor("blas").vdot(array_a, array_b))


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
    if type(shape) is tuple and not shape:  # a scalar operand (the common case): every axis
        target: tuple[int, ...] = ()
        axes = tuple(range(array.ndim))
    else:
        target = _target_shape(shape)
        axes = _stretched_axes(array.shape, target)
    if axes:  # (every axis: axis=None, CuPy's own path for a whole sum)
        array = backend.call(backend.xp.sum, array, axis=axes if target else None,
                             keepdims=False)
    if array.shape != target:
        array = array.reshape(target)  # only size-1 axes are restored: a view, no device work
    if isinstance(grad, GPUScalar) and not axes:
        return grad
    return _result(backend, array)


def _target_shape(shape: Any) -> tuple[int, ...]:
    """`unbroadcast`'s ``shape`` as a tuple of ints, or a TypeError naming what it was."""
    try:
        return tuple(map(int, shape))
    except TypeError:
        kind = f"a GPUScalar of dtype {shape.dtype}" if isinstance(shape, GPUScalar) else (
            type(shape).__name__)  # (never the value of a GPUScalar: formatting it would sync)
        raise TypeError(f"unbroadcast() shape must be a tuple of ints, got {kind}") from None


def _stretched_axes(given: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """The axes of a gradient of shape ``given`` that broadcasting an operand of shape
    ``target`` added or stretched (a loop, not generators: this runs for every AD rule), or a
    ValueError where ``given`` cannot come from ``target``."""
    leading = len(given) - len(target)
    if leading < 0:
        raise _not_broadcast(given, target)
    axes = list(range(leading))
    for i, n in enumerate(target):
        if n != given[leading + i]:
            if n != 1:
                raise _not_broadcast(given, target)
            axes.append(leading + i)
    return tuple(axes)


def _not_broadcast(given: tuple[int, ...], target: tuple[int, ...]) -> ValueError:
    return ValueError(f"unbroadcast(): a gradient of shape {given} cannot come from "
                      f"broadcasting an operand of shape {target}")


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
    refuses). Up to `STACK_COPIES` this is one gathering (the backend's ``stack_scalars``: one
    counted op; ``xp.stack`` on the host devices, one gathering kernel on CuPy, whose own
    ``stack`` would copy each input with a kernel of its own); above, a preallocated vector is
    filled `STACK_COPIES` inputs at a time (``out=slots[i:j]``): ``1 + ceil(n / 8)`` counted
    ops, device work only, the same values as one stack (each input cast to ``dtype`` as
    ``stack`` casts: ``same_kind``)."""
    if len(scalars) <= STACK_COPIES:
        return backend.stack_scalars(list(scalars), dtype)
    slots = backend.call(backend.xp.empty, (len(scalars),), dtype=dtype)
    for start in range(0, len(scalars), STACK_COPIES):
        chunk = list(scalars[start:start + STACK_COPIES])
        backend.stack_scalars(chunk, dtype, out=slots[start:start + len(chunk)])
    return slots


def array_items(
    arrays: Any, function: str, what: str = "arrays", noun: str = "array"
) -> tuple[list[Any], bool]:
    """The items of a "one array or many" argument, and whether it was a single one.

    A **single array** is one item, whatever its ndim (0-d included), never split into its rows
    or elements: an object a backend owns (a NumPy ``ndarray`` or subclass, a CuPy ``ndarray``,
    a strict-device array) or a GPUScalar (a 0-d device value; the caller decides whether it
    takes one). Anything else must be an **iterable** of items (a list, tuple, generator, ...),
    consumed once, in order; each item is checked by the caller (with its index). Refused, by
    ``function``'s name: an array-like no backend owns (anything with ``shape`` and ``dtype``:
    a NumPy scalar such as ``numpy.float64(1.0)``, a PyTorch or JAX array), a string or bytes,
    a mapping (its keys would be taken: pass ``.values()``), anything not iterable (a
    ``TypeError``), and no items at all (a ``ValueError``). No device work, no sync.
    """
    if isinstance(arrays, GPUScalar) or backend_of(arrays) is not None:
        return [arrays], True
    if hasattr(arrays, "shape") and hasattr(arrays, "dtype"):
        raise TypeError(
            f"gpuscalar.{function}(): {what} must be a NumPy or CuPy array, a GPUScalar or an "
            f"iterable of them, got {describe(arrays)}, which is not a NumPy or CuPy array: "
            "convert it with numpy.asarray or cupy.asarray"
        )
    if isinstance(arrays, (str, bytes, bytearray, Mapping)):
        hint = " (pass its .values())" if isinstance(arrays, Mapping) else ""
        raise TypeError(
            f"gpuscalar.{function}(): {what} must be a NumPy or CuPy array, a GPUScalar or an "
            f"iterable of them, got {describe(arrays)}{hint}"
        )
    try:  # (described only for an error: describing a list of arrays formats each one)
        items = list(arrays)
    except TypeError:
        raise TypeError(
            f"gpuscalar.{function}(): {what} must be a NumPy or CuPy array, a GPUScalar or an "
            f"iterable of them, got {describe(arrays)}"
        ) from None
    if not items:
        raise ValueError(f"gpuscalar.{function}() needs at least one {noun}, got an empty "
                         f"{type(arrays).__name__}")
    return items, False


def _norm_order(ord: Any) -> Any:
    """``ord`` of `global_norm`, checked on the host: a real number other than NaN (``None``
    is 2, as in NumPy)."""
    if ord is None:
        return 2
    if (isinstance(ord, (bool, np.bool_, GPUScalar)) or not isinstance(ord, numbers.Real)
            or math.isnan(ord)):
        reason = (" (its value is on the device; reading it would be a sync)"
                  if isinstance(ord, GPUScalar) else "")
        raise ValueError(
            f"gpuscalar.global_norm(): unsupported ord {describe(ord)}{reason}: the vector norms "
            "are a real number p (2, 1, 0 for the count of nonzeros, math.inf, -math.inf or any "
            "other p) or None (2)"
        )
    return ord


def _norm_dtype(common: np.dtype) -> np.dtype:
    """The dtype of NumPy's vector norm of an array of dtype ``common``: float64 if it is not
    inexact, the real dtype if complex."""
    if common.kind not in "fc":
        return np.dtype(np.float64)
    return np.finfo(common).dtype  # the real dtype of a complex one


def global_norm(arrays: Any, ord: float | None = 2, *, comm: Any = None) -> GPUScalar:
    """One ``ord``-norm over many arrays together (gradient clipping), as a GPUScalar.

    ``arrays``: one array (any ndim, 0-d included: exactly ``global_norm([x])``, never split
    into its rows or elements), one GPUScalar (a 0-d array: its absolute value) or an iterable
    of arrays and GPUScalars on one backend and device (`array_items`). The result is the
    vector norm of all their elements concatenated (``numpy.linalg.norm(numpy.concatenate(
    [a.ravel() for a in arrays]), ord)``), its dtype included, without copying them together:
    each array's norm, then those combined (for ``2`` and other ``p``, their ``p``-norm; ``1``
    and ``0``, their sum; ``inf``, their maximum; ``-inf``, their minimum). ``ord``: any real
    number but NaN (``0`` counts the nonzero elements, a negative ``p`` is NumPy's
    ``sum(|x|**p)**(1/p)``), or None (2); anything else (``"fro"``, NaN, ``True``, a GPUScalar)
    is a ValueError naming it. Arrays with no elements add nothing (with ``ord=-inf``, at least
    one element is needed, as in NumPy; with ``inf`` none at all gives 0, as NumPy). In a
    mixed-dtype list, an array whose own norm would have another dtype than the result
    (float16 among float64, int8 among float32) is first converted to the common dtype, as the
    concatenation converts it.

    Device ops: one array is ``norm(x, ord)`` (1); ``n`` arrays are ``n`` norms, their
    gathering into one vector (`stack_scalars`: 1 op up to 8 arrays, ``1 + ceil(n / 8)`` above)
    and its reduction (1); plus 1 for each array converted first. Never a host-to-device copy
    (no ``xp.stack`` of more than 8 inputs), so it can run inside a captured CUDA-graph step.

    ``comm``: the user's own communicator (an ``mpi4py`` intracommunicator or a NCCL one, as
    `gpuscalar.distributed.all_reduce` takes; anything else is a TypeError naming it, before
    any device work), for sharded arrays (each process holds a different part): the norm of
    every process's arrays concatenated, the same on every process, with ONE collective of one
    scalar however many arrays: this process's sum of ``|x|**p`` (``p`` finite; its local norm
    raised to ``p``), maximum (``inf``) or minimum (``-inf``) of ``|x|``, or count of nonzeros
    (``0``) is all-reduced (sum, max, min, sum), then its ``1/p`` root taken. Equal to one
    process's norm of the concatenation within rounding (the local norms are combined in
    another order: a few units in the last place, the tests use ``rtol=1e-12`` in float64 and
    ``1e-5`` in float32). Every process passes arrays of the same dtypes (any counts and
    shapes, none at all on a process included); a process with no elements adds nothing (with
    ``-inf``, the minimum's identity ``inf``: if no process has any, the result is ``inf``, not
    NumPy's error, which would need a sync to agree on). Inside a ``gs.while_loop``/``gs.cond``
    body it is refused as `gpuscalar.distributed.all_reduce` refuses it. Accounting: the local
    norm's ops, then `all_reduce`'s for one GPUScalar (MPI on host data: a non-blocking
    collective, its first read the one counted sync; NCCL: enqueued on the stream, no sync),
    and the root (pending: computed at its first use).
    """
    if comm is not None:
        checked_comm(comm, "global_norm")
    items, single = array_items(arrays, "global_norm")
    p = _norm_order(ord)
    operands = [
        _operand(a, "global_norm", "arrays" if single else f"arrays[{i}]")
        for i, a in enumerate(items)
    ]  # bad input named by this function, before any device work
    backend, first = operands[0]
    for i, (other, array) in enumerate(operands[1:], 1):
        if other is not backend:
            raise TypeError(
                f"gpuscalar.global_norm(): arrays[{i}] is a {other.name} array but arrays[0] is "
                f"{backend.name}"
            )
        if backend.multi_device and backend.device_of(array) != backend.device_of(first):
            raise ValueError(
                f"gpuscalar.global_norm(): arrays[{i}] is on device "
                f"{backend.device_of(array)!r} but arrays[0] on {backend.device_of(first)!r}"
            )
    common = np.result_type(*{array.dtype for _, array in operands})
    dtype = _norm_dtype(common)
    parts, p_each = [array for _, array in operands], p
    if p in (math.inf, -math.inf):  # no elements, nothing to the max/min (CuPy refuses them)
        nonempty = [array for array in parts if array.size]
        if not nonempty and p < 0 and comm is not None:  # the minimum's identity: inf
            empty = backend.call(backend.xp.full, (), math.inf, dtype=dtype)
            return _across_processes(cast(GPUScalar, _result(backend, empty)), p, comm)
        if not nonempty and p < 0:
            raise ValueError("gpuscalar.global_norm(ord=-inf): the arrays have no elements "
                             "(the minimum of nothing, which numpy.linalg.norm refuses too)")
        parts, p_each = (nonempty, p) if nonempty else (parts[:1], 1)  # 0 for inf, as NumPy
    # as the concatenation converts each array to the common dtype, an array whose own norm
    # would have another dtype (float16 among float64, int8 among float32) is converted first
    norms = [
        backend.vector_norm(
            a if _norm_dtype(a.dtype) == dtype else backend.call(a.astype, common),
            ord=p_each, axis=None, keepdims=False,
        )
        for a in parts
    ]
    if len(norms) == 1:
        total = norms[0]
    else:
        stacked = stack_scalars(backend, norms, dtype)
        xp = backend.xp
        if p in (1, 0):  # norms are >= 0: their sum (one op on CuPy, not abs and sum)
            total = backend.call(xp.sum, stacked)
        elif p == math.inf:
            total = backend.call(xp.max, stacked)
        elif p == -math.inf:
            total = backend.call(xp.min, stacked)
        else:
            total = backend.vector_norm(stacked, ord=p, axis=None, keepdims=False)
    local = cast(GPUScalar, _result(backend, total))
    return local if comm is None else _across_processes(local, p, comm)


def checked_comm(comm: Any, function: str) -> None:
    """A TypeError naming ``comm`` and ``function`` unless ``comm`` is a communicator
    `gpuscalar.distributed.all_reduce` reduces over (no device work, nothing sent)."""
    from . import distributed  # noqa: PLC0415 - only with a comm

    try:
        distributed.wrap_comm(comm)
    except TypeError as error:
        reason = str(error).removeprefix("gs.distributed.all_reduce: ")
        raise TypeError(f"gpuscalar.{function}(): {reason}") from None


def _across_processes(local: GPUScalar, p: Any, comm: Any) -> GPUScalar:
    """The ``p``-norm over every process of ``comm``, from this process's norm ``local``: ONE
    collective of one scalar (see `global_norm`)."""
    from . import distributed  # noqa: PLC0415 - only with a comm

    if p in (math.inf, -math.inf):
        return cast(GPUScalar, distributed.all_reduce(local, "max" if p > 0 else "min",
                                                      comm=comm))
    if p in (0, 1):  # a count, or a sum of |x|: summed as they are
        return cast(GPUScalar, distributed.all_reduce(local, "sum", comm=comm))
    # |x|**p summed in float64 (a GPUScalar's arithmetic is the Python float's), the root
    # brought back to the norm's dtype (times a NumPy scalar of it: NEP 50's weak float)
    powered = local * local if p == 2 else local ** p
    total = cast(GPUScalar, distributed.all_reduce(powered, "sum", comm=comm))
    root = total ** 0.5 if p == 2 else total ** (1.0 / p)
    return cast(GPUScalar, root if local.dtype == root.dtype else root * local.dtype.type(1))
