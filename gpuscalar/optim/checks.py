"""Validation of what users pass the optimizers: arrays, hyperparameters, overlaps.

Why this module exists: everything that could make a step fail is checked before anything is
written, with an error naming the argument, and without a sync (a GPUScalar's value is never
read: only its backend, device and dtype). One set of checks serves the functional steps, the
optimizer classes, `load_state_dict` and clipping; what differs by backend (layouts, whether
data may be read-only) is asked of the step's executor.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import sync
from ..backend import Backend
from ..devices import BACKENDS, backend_of
from ..scalar import GPUScalar
from .executors import Executor, _read_only, executor_for
from .kernels import KERNEL_DTYPE_NAMES
from .program import POINTER_KINDS

__all__ = ["check_array", "check_like", "step_arrays", "check_writeable", "check_skip", "hyper",
           "describe", "betas_pair", "first_overlap", "byte_span"]


#: An array's layout: what `check_array` decides from (its type gives the backend; with its
#: dtype, shape and strides, whether the kernels take it), read in one C call.
_LAYOUT = operator.attrgetter("__class__", "shape", "dtype", "strides")
#: Layouts `check_array` accepted -> their backend and its executor, so that a step's arrays
#: are checked with one dict read (`step_arrays`). Few in a program (a shape and dtype per
#: parameter); emptied past `_KNOWN_LAYOUTS` entries, or when a backend is registered
#: (`BACKENDS`: an array type's backend is decided in its order).
_LAYOUTS: dict[tuple[Any, ...], tuple[Backend, Executor]] = {}
_KNOWN_LAYOUTS = 1024
_layouts_for: list[int] = [len(BACKENDS)]


def check_array(value: Any, what: str) -> Backend:
    backend = backend_of(value)
    if backend is None:
        raise TypeError(f"{what} must be a NumPy or CuPy array, got {type(value).__name__}")
    if value.dtype not in KERNEL_DTYPE_NAMES:
        raise TypeError(f"{what} must be float32 or float64, got dtype {value.dtype}")
    if executor_for(backend).contiguous and not value.flags.c_contiguous:
        raise ValueError(
            f"{what} must be C-contiguous for the fused {backend.name} kernel (got strides "
            f"{value.strides}); pass a contiguous copy (xp.ascontiguousarray)"
        )
    _learn_layout(value, backend)
    return backend


def _learn_layout(value: Any, backend: Backend) -> None:
    """Remember that arrays of ``value``'s layout pass `check_array` (on ``backend``): each is
    a function of the layout (the backend of the type, the dtype, C-contiguity of the shape and
    strides at the dtype's item size)."""
    try:
        layout = _LAYOUT(value)
        hash(layout)
    except (AttributeError, TypeError):  # (an array type with odd attributes: not remembered)
        return
    if len(_LAYOUTS) >= _KNOWN_LAYOUTS or _layouts_for[0] != len(BACKENDS):
        _LAYOUTS.clear()
        _layouts_for[0] = len(BACKENDS)
    _LAYOUTS[layout] = backend, executor_for(backend)


def check_like(
    value: Any,
    reference: Any,
    what: str,
    ref_what: str,
    backend: Backend,
    *,
    contiguous: bool = True,
) -> None:
    other = backend_of(value)
    if other is None:
        raise TypeError(f"{what} must be a NumPy or CuPy array, got {type(value).__name__}")
    if other is not backend:
        raise TypeError(f"{what} is a {other.name} array but {ref_what} is {backend.name}")
    if value.shape != reference.shape:
        raise ValueError(f"{what} has shape {value.shape} but {ref_what} has {reference.shape}")
    if value.dtype != reference.dtype:
        raise TypeError(f"{what} has dtype {value.dtype} but {ref_what} has {reference.dtype}")
    if backend.multi_device and backend.device_of(value) != backend.device_of(reference):
        raise ValueError(
            f"{what} is on device {backend.device_of(value)!r} but {ref_what} is on "
            f"{backend.device_of(reference)!r}"
        )
    if contiguous and executor_for(backend).contiguous and not value.flags.c_contiguous:
        raise ValueError(
            f"{what} must be C-contiguous for the fused {backend.name} kernel (got strides "
            f"{value.strides}); pass a contiguous copy (xp.ascontiguousarray)"
        )


def step_arrays(param: Any, grad: Any, **state: Any) -> tuple[Backend, object]:
    """Validate a functional step's arrays, before anything is written: ``grad`` and the
    ``state`` arrays (by name) like ``param``; ``param`` and the state writeable. Returns the
    backend and device.

    The common case costs a few C calls (`_placed`): every array of one layout `check_array`
    accepted before, on one device, writeable; otherwise each check runs in turn, and the
    first that fails says what is wrong."""
    placed = _placed(param, grad, *state.values())
    if placed is not None:
        return placed
    backend = check_array(param, "param")
    for what, value in (("grad", grad), *state.items()):
        check_like(value, param, what, "param", backend)
    for what, value in (("param", param), *state.items()):
        check_writeable(backend, value, what)
    return backend, backend.device_of(param)


def _placed(param: Any, *others: Any) -> tuple[Backend, object] | None:
    """``(backend, device)`` when `step_arrays`' checks would all pass for ``param`` and
    ``others`` (the grad, then the state): ``param``'s layout was accepted by `check_array`,
    each other array has the same layout (so the same backend, shape, dtype and contiguity) and
    device, and what the step writes is writeable. None when it cannot tell at once."""
    try:
        layout = _LAYOUT(param)
        known = _LAYOUTS.get(layout)
        if known is None or _layouts_for[0] != len(BACKENDS):
            return None
        for other in others:
            if _LAYOUT(other) != layout:
                return None
    except (AttributeError, TypeError):  # not an array (or an unhashable shape): the checks say
        return None
    backend, executor = known
    device = backend.device_of(param)
    if backend.multi_device:
        for other in others:
            if backend.device_of(other) != device:
                return None
    if executor.read_only_possible:
        if not executor.writeable(param):
            return None
        for other in others[1:]:  # (the grad is only read)
            if not executor.writeable(other):
                return None
    return backend, device


def check_writeable(backend: Backend, array: Any, what: str) -> None:
    if not executor_for(backend).writeable(array):
        raise _read_only(what)


#: The dtypes of GPUScalars a kernel reads as a real hyperparameter (through a pointer).
_REAL_SCALAR_DTYPES = frozenset(dtype for dtype in POINTER_KINDS if dtype.kind in "fiu")


def hyper(
    value: Any,
    name: str,
    backend: Backend,
    device: object,
    *,
    low: float | None = 0.0,
    high: float | None = None,
    high_open: bool = False,
) -> Any:
    """Validate a hyperparameter: a Python/NumPy real number (range-checked on the host) or a
    real GPUScalar on ``backend`` and ``device`` (its value is not checked: that would sync)."""
    if type(value) is float and high is None and low is not None and value >= low:
        return value  # (the common case first: this runs for every hyperparameter of a step)
    if isinstance(value, GPUScalar):
        if value.backend is not backend:
            raise TypeError(
                f"{name} is a {value.backend.name} GPUScalar but the arrays are {backend.name}"
            )
        if backend.multi_device and value.device != device:
            raise ValueError(f"{name} is on device {value.device!r} but the arrays on {device!r}")
        if value.dtype not in _REAL_SCALAR_DTYPES:
            raise TypeError(
                f"{name} must be a real number, got a GPUScalar of dtype {value.dtype} (the "
                "kernels read float32/float64/int32/int64/uint32/uint64 scalars)"
            )
        return value
    if type(value) is not float and type(value) is not int and (
        isinstance(value, bool) or not isinstance(value, numbers.Real)
    ):  # (the exact types first: this runs for every hyperparameter of every step)
        raise TypeError(f"{name} must be a real number or GPUScalar, got {type(value).__name__}")
    number = float(value)
    if math.isnan(number) or (low is not None and number < low):
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    if high is not None and (number >= high if high_open else number > high):
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in [{low}, {high}{bracket}, got {value!r}")
    return value


def check_skip(value: Any, backend: Backend, device: object) -> GPUScalar | None:
    if value is None:
        return None
    if not isinstance(value, GPUScalar) or value.dtype != np.bool_:
        kind = f"dtype {value.dtype}" if isinstance(value, GPUScalar) else type(value).__name__
        raise TypeError(
            f"skip_if must be a bool GPUScalar (e.g. ~gpuscalar.optim.all_finite(grads)), got "
            f"{kind}; for a host-side bool, simply don't call the step"
        )
    if value.backend is not backend:
        raise TypeError(
            f"skip_if is a {value.backend.name} GPUScalar but the arrays are {backend.name}"
        )
    if backend.multi_device and value.device != device:
        raise ValueError(f"skip_if is on device {value.device!r} but the arrays on {device!r}")
    return value


#: A user's value for an error message, read without a sync (`gpuscalar.sync.describe`).
describe = sync.describe


def betas_pair(
    betas: Any, backend: Backend, device: object, name: str = "betas"
) -> tuple[Any, Any]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"{name} must be a pair (beta1, beta2), got {describe(betas)}")
    return (
        hyper(betas[0], f"{name}[0]", backend, device, high=1.0, high_open=True),
        hyper(betas[1], f"{name}[1]", backend, device, high=1.0, high_open=True),
    )


def byte_span(backend: Backend, array: Any) -> tuple[int, int]:
    """[low, high) bytes an array's elements occupy (strides may be negative)."""
    low = high = backend.data_address(array)
    for size, stride in zip(array.shape, array.strides, strict=True):
        reach = (size - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high + array.itemsize


def first_overlap(backend: Backend, arrays: Sequence[Any]) -> tuple[int, int] | None:
    """Indices of two arrays sharing memory (updating both in one kernel would race), or None.
    Sorted byte spans, O(n log n); interleaved NumPy views are confirmed with shares_memory."""
    spans = sorted(
        (*byte_span(backend, a), i) for i, a in enumerate(arrays) if a.size
    )
    executor = executor_for(backend)
    active: list[tuple[int, int]] = []  # (high, index) of spans that may reach further
    for low, high, i in spans:
        active = [(h, j) for h, j in active if h > low]
        for _, j in active:
            if executor.shares_memory(arrays[i], arrays[j]):
                return min(i, j), max(i, j)
        active.append((high, i))
    return None


