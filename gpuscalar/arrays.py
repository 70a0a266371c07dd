"""GPUScalars meeting arrays: `apply_ufunc`, the promotion rules across operands, the fused
launch.

Why this module exists: an array operation with a GPUScalar operand (``lr_expr * g``,
``x += s``, ``np.add(x, s)``) must give NumPy's dtype for ``x ⊕ s.item()`` without reading
``s`` (rule 1), refuse operands that cannot meet (rules 4-5), and compute a pending scalar
inside the array kernel (`gpuscalar.lazy.fusion`): no launch and no sync of its own. Its
decision is cached per operand kinds (`_ARRAY_CALLS`), so a repeated fold is a dict lookup and
the launch. Built on `gpuscalar.scalar` and `gpuscalar.operators`; it installs itself on GPUScalar
as the operators' array path (`install`: ``GPUScalar._array_call``, ``_apply_ufunc``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import ledger, promote
from .backend import Backend, refuse_ufunc_keywords
from .devices import backend_of
from .lazy import fusion
from .lazy.expr import KEEP_NODES, SIZE, Node
from .operators import _lazy_ufunc
from .scalar import (
    _MISSING,
    _SCALAR_CLASSES,
    GPUScalar,
    _array_of,
    _wrap,
)

__all__ = ["apply_ufunc"]


def _common_backend(operands: tuple[Any, ...]) -> tuple[Backend, bool] | None:
    """The backend every operand lives on, and whether any operand is a (non-scalar) array.

    Python and NumPy scalars fit any backend. Returns None for an operand gpuscalar does not
    know (so Python can try the other side). Applies rules 4 and 5.
    """
    scalar_backend: Backend | None = None
    array_backend: Backend | None = None
    for operand in operands:
        if type(operand) in _SCALAR_CLASSES:
            backend = operand._backend
            if scalar_backend is None:
                scalar_backend = backend
            elif backend is not scalar_backend:
                _raise_incompatible(operands)
        elif type(operand) in promote.PYTHON_SCALAR_TYPES or isinstance(operand, np.generic):
            continue
        else:
            backend = backend_of(operand)
            if backend is None:
                return None
            if array_backend is None:
                array_backend = backend
            elif backend is not array_backend:
                _raise_incompatible(operands)
    if scalar_backend is None:
        raise TypeError("apply_ufunc needs at least one GPUScalar operand")
    if array_backend is None or array_backend is scalar_backend:
        if scalar_backend.multi_device:
            _check_devices(scalar_backend, operands)
        return scalar_backend, array_backend is not None
    if array_backend.host_memory:
        return array_backend, True  # rule 4: a device scalar meets a host array
    _raise_incompatible(operands)
    raise AssertionError("unreachable")


def _operand_label(value: Any) -> str:
    """Describe an operand for an error message without reading any device value."""
    if type(value) in _SCALAR_CLASSES:
        return f"GPUScalar({value.dtype}, backend={value.backend.name}, device={value.device!r})"
    backend = backend_of(value)
    if backend is not None:
        return (
            f"{backend.name} array(shape={value.shape}, dtype={value.dtype}, "
            f"device={backend.device_of(value)!r})"
        )
    return type(value).__name__


def _check_devices(backend: Backend, operands: tuple[Any, ...]) -> None:
    """Rule 5 for one multi-device backend: every GPUScalar and array on one device."""
    device = _MISSING
    for op in operands:
        if type(op) in _SCALAR_CLASSES:
            here = op._device
        elif backend.owns(op):
            here = backend.device_of(op)
        else:
            continue
        if device is _MISSING:
            device = here
        elif here != device:
            labels = " and ".join(_operand_label(op) for op in operands)
            raise ValueError(f"operands are on different devices: {labels}")


def _raise_incompatible(operands: tuple[Any, ...]) -> None:
    labels = " and ".join(_operand_label(op) for op in operands)
    raise TypeError(
        f"cannot combine {labels}: they live on different backends and gpuscalar never copies "
        "silently; move one side explicitly"
    )


def _stand_in(operand: Any) -> Any:
    """What NumPy's resolver sees for an operand: a GPUScalar as the Python type it replaces
    (weak), a Python scalar as itself, an array or NumPy scalar as its dtype (strong)."""
    if type(operand) in _SCALAR_CLASSES:  # a strong one: the NumPy scalar it stands for
        return operand.dtype if operand._is_strong else promote.weak_stand_in(operand.dtype)
    if type(operand) in promote.PYTHON_SCALAR_TYPES:
        return promote.python_operand_stand_in(operand)
    return operand.dtype


def apply_ufunc(name: str, *operands: Any, numpy_call: bool = True, **kwargs: Any) -> Any:
    """Apply the backend ufunc ``name`` to operands of which at least one is a GPUScalar.

    Implements the promotion rules: with an array operand the result is an array with the
    dtype NumPy gives for ``x ⊕ s.item()`` (rule 1), otherwise a GPUScalar (rules 2-3; a pending
    expression when lazy). A device GPUScalar meeting a host NumPy array is read first (rule 4,
    one counted sync); operands on backends or devices that cannot meet raise (rule 5). A
    pending GPUScalar operand of an array operation is computed inside that operation's kernel.

    Called for NumPy's ufunc (``numpy_call``, the default) a scalar result is strong, as the
    float path's NumPy scalar; a gs helper's (``numpy_call=False``) is weak, as ``math.sqrt``'s.

    An array operation without keywords but ``out=`` (``lr_expr * g``, ``x += s``) takes
    `_array_call`: its decision is cached per operand kinds, so a repeated one is a dict lookup
    and the launch.
    """
    if not kwargs or (len(kwargs) == 1 and "out" in kwargs):
        result = _array_call(name, operands, kwargs.get("out"))
        if result is not _MISSING:
            return result
    found = _common_backend(operands)
    if found is None:
        return NotImplemented
    backend, has_array = found
    refuse_ufunc_keywords(backend, kwargs)
    if not has_array:
        if kwargs.get("out") is not None:
            raise TypeError("GPUScalars are immutable: out= cannot be a GPUScalar")
        kwargs.pop("out", None)
        if not kwargs:  # as the ufunc on the Python numbers: pending (or evaluated, eager)
            device = next(op.device for op in operands if type(op) in _SCALAR_CLASSES)
            result = _lazy_ufunc(backend, name, operands, device, numpy_call=numpy_call)
            if result is not None:
                return result
        args = [_array_of(op) if type(op) in _SCALAR_CLASSES else op for op in operands]
        result = backend.call(backend.ufunc(name), *args, **backend.ufunc_array_kwargs, **kwargs)
        if type(result) is tuple:
            return tuple(_wrap(backend, r) for r in result)
        return _wrap(backend, result)

    operands = tuple(op._host_value("host operand")  # rule 4: a device value meets a host array
                     if type(op) in _SCALAR_CLASSES and op._backend is not backend else op
                     for op in operands)
    out = kwargs.get("out")
    if out is not None:
        out = out if isinstance(out, tuple) else (out,)
        if any(type(o) in _SCALAR_CLASSES for o in out):
            raise TypeError("GPUScalars are immutable: out= cannot be a GPUScalar")
        kwargs["out"] = out[0] if len(out) == 1 else out  # CuPy takes a single array
    if "dtype" not in kwargs and "signature" not in kwargs and "casting" not in kwargs:
        kwargs.update(_loop_keywords(backend, name, tuple(map(_stand_in, operands)), out))
    scalars = tuple(i for i, op in enumerate(operands) if type(op) in _SCALAR_CLASSES)
    return _launch(backend, name, operands, kwargs, out, scalars)


#: (ufunc name, each operand's type (and dtype, for GPUScalars and arrays), the output's type
#: and dtype) -> (backend, the keywords that pin the parity loop, the GPUScalar operands'
#: positions, the arrays'), for array operations whose operands all live on one backend:
#: `apply_ufunc`'s decision, made once per kinds (values never enter it; devices are checked
#: per call), and the function a fold of one pending scalar calls straight away where the
#: backend's executor has one (`fusion.Executor.direct_fold`: CuPy's fused launch), else None.
#: Bounded by the kinds a program combines.
_ARRAY_CALLS: dict[tuple[Any, ...], tuple[Backend, dict[str, Any], tuple[int, ...],
                                          tuple[int, ...], Callable[..., Any] | None, int]] = {}


def _array_call(name: str, operands: tuple[Any, ...], out: Any) -> Any:
    """`apply_ufunc` for an array operation through `_ARRAY_CALLS`; `_MISSING` where the general
    path decides (no array operand, rule 4, an unknown operand, several outputs, an error)."""
    key: list[Any] = [name]
    scalar_classes, python_types = _SCALAR_CLASSES, _PYTHON_SCALAR_TYPES
    for op in operands:
        kind = type(op)
        key.append(kind)
        if kind in scalar_classes:
            key.append(op._dtype)
        elif kind not in python_types:
            dtype = getattr(op, "dtype", None)
            if dtype is None:
                return _MISSING
            key.append(dtype)
    if out is not None:
        if type(out) is tuple:
            if len(out) != 1:
                return _MISSING
            out = out[0]
        if type(out) in scalar_classes or getattr(out, "dtype", None) is None:
            return _MISSING
        key += (_OUT, type(out), out.dtype)
    call_key = tuple(key)
    found = _ARRAY_CALLS.get(call_key)
    if found is None:
        found = _decide_array_call(name, operands, out)
        if found is None:
            return _MISSING
        _ARRAY_CALLS[call_key] = found
    backend, keywords, scalars, arrays, fold, decision = found
    device = None
    if backend.multi_device:  # rule 5, per call: one device
        device, device_of = operands[scalars[0]]._device, backend.device_of
        for i in scalars[1:]:
            if operands[i]._device != device:
                _check_devices(backend, operands)  # raises, naming both
        for i in arrays:
            if device_of(operands[i]) != device:
                _check_devices(backend, operands)
    if out is not None:
        keywords = {**keywords, "out": out}
    if fold is not None:  # one GPUScalar, keywords the executor's direct fold implements
        scalar = operands[scalars[0]]
        node = scalar._node  # read once: another thread may materialize it
        if node is not None and node[SIZE] <= KEEP_NODES:  # (a kept one: `_fused`)
            result = fold(decision, name, operands, keywords, scalars[0], node, device)
            if result is not NotImplemented:
                scalar._used = True
                return result
    return _launch(backend, name, operands, keywords, None if out is None else (out,), scalars)


_PYTHON_SCALAR_TYPES = promote.PYTHON_SCALAR_TYPES
_OUT = object()  # marks where an `_ARRAY_CALLS` key's output part begins


def _decide_array_call(name: str, operands: tuple[Any, ...], out: Any) -> Any:
    """What `_array_call` caches: the backend and the loop keywords, or None where the general
    path decides (no array operand; a GPUScalar of another backend, rule 4)."""
    found = _common_backend(operands)
    if found is None or not found[1]:
        return None
    backend = found[0]
    if any(type(op) in _SCALAR_CLASSES and op._backend is not backend for op in operands):
        return None
    outs = None if out is None else (out,)
    keywords = _loop_keywords(backend, name, tuple(map(_stand_in, operands)), outs)
    scalars = tuple(i for i, op in enumerate(operands) if type(op) in _SCALAR_CLASSES)
    arrays = tuple(i for i, op in enumerate(operands) if backend.owns(op))
    fold = (fusion.executor_for(backend).direct_fold({**keywords, "out": None}, operands)
            if len(scalars) == 1 else None)
    return backend, keywords, scalars, arrays, fold, next(_DECISIONS)


#: Each decision's number: what a direct fold's plans are keyed by, with the structure (an int
#: hashes in one step where the decision's key, a tuple of types and dtypes, is walked)
_DECISIONS = itertools.count()


def _loop_keywords(backend: Backend, name: str, stand_ins: tuple[Any, ...],
                   out: tuple[Any, ...] | None) -> dict[str, Any]:
    """The keywords that make the backend run NumPy's loop for ``x ⊕ s.item()`` (rule 1):
    ``signature=`` where the backend takes one, else CuPy's ``dtype=`` where it pins that
    loop; ``casting="unsafe"``. The outputs keep NumPy's ``same_kind`` check."""
    signature = promote.parity_signature(name, stand_ins)
    if out is not None:
        promote.check_output_casting(name, signature, out)
    # The loop is NumPy's own choice for x ⊕ s.item(); running it may narrow the GPUScalar
    # (int64 -> int8, float64 -> float32) exactly as NumPy narrows the Python scalar.
    keywords: dict[str, Any] = {"casting": "unsafe"}
    if backend.supports_signature:
        keywords["signature"] = signature
    else:
        dtype = promote.cupy_dtype_argument(signature)
        if dtype is not None and fusion.executor_for(backend).pins_loop(name, dtype):
            keywords["dtype"] = dtype
    return keywords


def _launch(backend: Backend, name: str, operands: tuple[Any, ...], kwargs: dict[str, Any],
            out: tuple[Any, ...] | None, scalars: tuple[int, ...]) -> Any:
    """The array operation itself: the pending GPUScalar operands (at positions ``scalars``)
    computed in its kernel (`_fused`), materialized ones passed as their 0-d arrays. Returns
    the caller's output array(s) where ``out`` is given, as NumPy and CuPy do."""
    args, nodes = list(operands), {}
    for position in scalars:
        op = operands[position]
        node = op._node  # read once: another thread may materialize op
        if node is not None:
            nodes[position] = node
        args[position] = op._array
    if nodes:
        return _fused(backend, name, operands, args, kwargs, nodes)
    result = backend.call(backend.ufunc(name), *args, **kwargs)
    if out is not None:
        return out[0] if len(out) == 1 else out
    return result


_KEEP_NONE: frozenset[int] = frozenset()


def _fused(backend: Backend, name: str, operands: tuple[Any, ...], args: list[Any],
           kwargs: dict[str, Any], nodes: dict[int, Node]) -> Any:
    """An array ufunc computing its pending GPUScalar operands (``position -> its node, as
    read once``; ``args``: the operands, the others materialized) in its own kernel; one larger
    than `expr.KEEP_NODES` is stored by that kernel too (it is kept: no launch of its own),
    published as `_materialize` does."""
    keep = _KEEP_NONE
    for position, node in nodes.items():
        if node[SIZE] > KEEP_NODES:
            keep = keep | {position}
    result, kept = fusion.fused_ufunc(backend, name, args, kwargs, nodes, keep)
    for position in nodes:
        scalar = operands[position]
        if position in kept:
            if scalar._array is None and not ledger.in_loop_body():  # (as _materialize)
                scalar._array, scalar._node = kept[position], None
        else:
            scalar._used = True
    return result


def install(cls: type[GPUScalar]) -> None:
    """Install on GPUScalar (``cls``), once, at import, the path its operators take where an
    operand is an array (`gpuscalar.operators` reaches this module only through the class):
    ``_array_call`` (the cached decision: a fold is a dict lookup and the launch) and
    ``_apply_ufunc`` (everything else)."""
    cls._array_call = staticmethod(_array_call)  # type: ignore[method-assign]
    cls._apply_ufunc = staticmethod(apply_ufunc)  # type: ignore[method-assign]


install(GPUScalar)
