"""Device math helpers: ``gs.sqrt``, ``gs.minimum``, ``gs.where``, ``gs.clip``, ...

Why this module exists: code that used ``math.sqrt(float(x.sum()))`` or ``min(lr, cap)`` needs
the same operations on a GPUScalar without a sync. Each helper takes GPUScalars, arrays and
Python numbers, and follows the promotion rules (`gpuscalar.promote`): a GPUScalar for scalar
operands (a pending node when lazy, through the operators' generated hot paths in
`gpuscalar.operators`), an array of the parity dtype for array operands.

The ufunc helpers are generated from one table, `MATH_FUNCTIONS` (a new helper is one row there,
plus its name in ``gpuscalar/__init__.py``); ``where`` and ``clip`` are written out (``where``
records its own node; ``clip`` is ``minimum(maximum(...))``). This module builds on
`gpuscalar.scalar`, `.operators` and `.arrays`, never the reverse. Being the top of those layers,
it installs on GPUScalar the members that reach all of them (`install`): the entry points NumPy
and CuPy call (``__array_ufunc__``, ``__cupy_override_elementwise_kernel__``) and ``s.clip``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, overload

import numpy as np

from . import promote
from .arrays import _array_call, _common_backend, _operand_label, _stand_in, apply_ufunc
from .backend import SCALAR_FUNCTIONS, Backend
from .devices import backend_of
from .lazy import expr
from .lazy.expr import Node, make_node
from .operators import (
    _FAST_TABLES,
    _call_fast,
    _constant,
    _fast_function,
    _is_strong_kind,
    _kind_stand_in,
    _lazy_ufunc,
    is_scalar_kind,
    operand_kind,
    scalar_dtype,
)
from .scalar import (
    _MISSING,
    _SCALAR_CLASSES,
    GPUScalar,
    _array_of,
    _child,
    _pending,
    _wrap,
    asscalar,
)

__all__ = ["MATH_FUNCTIONS", "HELPERS", "clip", "clip_call", "where", *(
    "sqrt exp log log1p expm1 abs sign minimum maximum isfinite isnan isinf sin cos tan tanh "
    "arctan2 hypot floor ceil log2 log10 exp2 power").split()]

#: THE table of ufunc helpers: public name -> NumPy ufunc name (gs.sqrt, gs.exp, ...).
MATH_FUNCTIONS: dict[str, str] = {
    "sqrt": "sqrt",
    "exp": "exp",
    "log": "log",
    "log1p": "log1p",
    "expm1": "expm1",
    "abs": "absolute",
    "sign": "sign",
    "minimum": "minimum",
    "maximum": "maximum",
    "isfinite": "isfinite",
    "isnan": "isnan",
    "isinf": "isinf",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "tanh": "tanh",
    "arctan2": "arctan2",
    "hypot": "hypot",
    "floor": "floor",
    "ceil": "ceil",
    "log2": "log2",
    "log10": "log10",
    "exp2": "exp2",
    "power": "power",
}


class _OneOperand(Protocol):
    @overload
    def __call__(self, x: GPUScalar | float, /) -> GPUScalar: ...
    @overload
    def __call__(self, x: Any, /) -> Any: ...


class _TwoOperands(Protocol):
    @overload
    def __call__(self, x: GPUScalar, y: GPUScalar | float, /) -> GPUScalar: ...
    @overload
    def __call__(self, x: float, y: GPUScalar, /) -> GPUScalar: ...
    @overload
    def __call__(self, x: Any, y: Any, /) -> Any: ...


def _apply_math(name: str, *operands: Any) -> Any:
    """A helper's general path: anything but a real GPUScalar's hot path."""
    if len(operands) == 1 and type(operands[0]) in _SCALAR_CLASSES:
        only = operands[0]
        return _lazy_ufunc(only._backend, name, operands, only.device)
    if any(type(op) in _SCALAR_CLASSES for op in operands):
        result = apply_ufunc(name, *operands, numpy_call=False)
        if result is NotImplemented:
            labels = ", ".join(_operand_label(op) for op in operands)
            raise TypeError(f"gpuscalar.{name}() takes GPUScalars, arrays or numbers, got {labels}")
        return result
    for op in operands:
        backend = backend_of(op)
        if backend is not None:
            return backend.call(backend.ufunc(name), *operands)
    for op in operands:
        if type(op) not in promote.PYTHON_SCALAR_TYPES and not isinstance(op, np.generic):
            raise TypeError(
                f"gpuscalar.{name}() takes GPUScalars, arrays or numbers, got {type(op).__name__}"
            )
    return apply_ufunc(name, asscalar(operands[0]), *operands[1:], numpy_call=False)


def _make_math_function(public_name: str, ufunc_name: str) -> Callable[..., Any]:
    """The helper ``gs.<public_name>``: a real GPUScalar operand takes its class's generated
    hot path (the operators', `operators._fast_function`), anything else `_apply_math`. One
    function per operand count: no branch on it in the call."""
    nin = getattr(np, ufunc_name).nin
    fast_tables = _FAST_TABLES

    def miscounted(operands: tuple[Any, ...]) -> TypeError:
        return TypeError(f"gpuscalar.{public_name}() takes {nin} operand(s), got {len(operands)}")

    def one(*operands: Any) -> Any:
        try:
            (x,) = operands  # (a try costs nothing in CPython 3.11 unless it raises)
        except ValueError:
            raise miscounted(operands) from None
        tables = fast_tables.get(type(x))
        if tables is not None:
            fast = tables[0].get(ufunc_name) or _fast_function(type(x), ufunc_name, 1, False)
            if fast is not None:
                return fast(x)
        return _apply_math(ufunc_name, x)

    # real GPUScalar class -> this helper's hot path for its scalars, first (`firsts`) or
    # second (`seconds`): what `two_general` finds, kept, so a call is one lookup
    firsts: dict[type, Callable[..., Any]] = {}
    seconds: dict[type, Callable[..., Any]] = {}

    def two(*operands: Any) -> Any:
        try:
            x, y = operands
        except ValueError:
            raise miscounted(operands) from None
        fast = firsts.get(type(x))
        if fast is not None:
            result = fast(x, y)
        else:
            fast = seconds.get(type(y))
            if fast is None or type(x) in fast_tables:
                return two_general(x, y, operands)
            result = fast(y, x)
        if result is NotImplemented:
            raise refused(operands)
        return _apply_math(ufunc_name, x, y) if result is _MISSING else result

    def two_general(x: Any, y: Any, operands: tuple[Any, ...]) -> Any:
        tables = fast_tables.get(type(x))  # a real GPUScalar on either side: its hot path
        if tables is not None:
            fast = tables[1].get(ufunc_name) or _fast_function(type(x), ufunc_name, 2, False)
            if fast is not None:
                firsts[type(x)] = fast
            result = _MISSING if fast is None else fast(x, y)
        else:
            tables = fast_tables.get(type(y))
            if tables is None:
                return _apply_math(ufunc_name, x, y)
            fast = tables[2].get(ufunc_name) or _fast_function(type(y), ufunc_name, 2, True)
            if fast is not None:
                seconds[type(y)] = fast
            result = _MISSING if fast is None else fast(y, x)
        if result is NotImplemented:
            raise refused(operands)
        return _apply_math(ufunc_name, x, y) if result is _MISSING else result

    def refused(operands: tuple[Any, ...]) -> TypeError:
        labels = ", ".join(_operand_label(op) for op in operands)
        return TypeError(
            f"gpuscalar.{public_name}() takes GPUScalars, arrays or numbers, got {labels}")

    function = one if nin == 1 else two
    function.__name__ = function.__qualname__ = public_name
    function.__module__ = __name__
    function.__doc__ = (
        f"Device ``{ufunc_name}``: a GPUScalar for scalar operands, an array for array operands "
        "(parity dtype), never a sync."
    )
    return function


#: The generated helpers by public name (the module's globals of the same names).
HELPERS: dict[str, Callable[..., Any]] = {
    public: _make_math_function(public, ufunc) for public, ufunc in MATH_FUNCTIONS.items()}
globals().update(HELPERS)

if TYPE_CHECKING:  # what the loop above defines, for type checkers: a test keeps both equal
    sqrt: _OneOperand
    exp: _OneOperand
    log: _OneOperand
    log1p: _OneOperand
    expm1: _OneOperand
    abs: _OneOperand  # noqa: A001 - mirrors numpy/builtin name
    sign: _OneOperand
    minimum: _TwoOperands
    maximum: _TwoOperands
    isfinite: _OneOperand
    isnan: _OneOperand
    isinf: _OneOperand
    sin: _OneOperand
    cos: _OneOperand
    tan: _OneOperand
    tanh: _OneOperand
    arctan2: _TwoOperands
    hypot: _TwoOperands
    floor: _OneOperand
    ceil: _OneOperand
    log2: _OneOperand
    log10: _OneOperand
    exp2: _OneOperand
    power: _TwoOperands


_minimum, _maximum = HELPERS["minimum"], HELPERS["maximum"]


def clip(x: Any, lower: Any, upper: Any) -> Any:
    """``minimum(maximum(x, lower), upper)`` on the device (two ops); NaN propagates."""
    return _minimum(_maximum(x, lower), upper)


def where(condition: Any, x: Any, y: Any) -> Any:
    """Device select. All-scalar operands give a GPUScalar; with an array operand, the array's
    backend ``where`` with GPUScalar branches acting as the Python scalars they replace."""
    if type(condition) in _SCALAR_CLASSES:
        if condition._dtype.kind != "b":
            condition = condition != 0  # np.where's truth test, on the device
    elif type(condition) in promote.PYTHON_SCALAR_TYPES or isinstance(condition, np.generic):
        condition = bool(condition)  # a host number: np.where's truth test, on the host
    pending = _lazy_where(condition, x, y)
    if pending is not None:
        if not _is_lazy():
            _array_of(pending)
        return pending
    operands = (condition, x, y)
    found = _common_backend(operands) if any(type(o) in _SCALAR_CLASSES for o in operands) else None
    if found is None:
        backend = next((b for b in map(backend_of, operands) if b is not None), None)
        if backend is None:
            raise TypeError("gpuscalar.where() needs a GPUScalar or array operand")
        return backend.call(backend.xp.where, *operands)
    backend, has_array = found
    if not has_array:  # eager, or what the lazy path leaves to NumPy
        args = [_array_of(op) if type(op) in _SCALAR_CLASSES else op for op in operands]
        return _wrap(backend, backend.call(backend.xp.where, *args))
    # Parity: the result dtype is what where() gives with the scalars' Python values.
    result_dtype = promote.result_dtype([_stand_in(x), _stand_in(y)])
    args = _parity_arrays(backend, operands, result_dtype, keep=condition)
    return backend.call(backend.xp.where, *args)


def _parity_arrays(backend: Backend, operands: tuple[Any, ...], result_dtype: np.dtype,
                   keep: Any = None) -> list[Any]:
    """The operands of an array operation (``where``, ``clip``) as the backend takes them, each
    GPUScalar (but ``keep``) as a 0-d array of ``result_dtype``, the dtype that operation gives
    with the scalars' Python values (the parity rule; a cast is one op); a device scalar
    meeting a host array is read (rule 4)."""
    args = []
    for op in operands:
        if type(op) in _SCALAR_CLASSES:
            if op._backend is not backend:
                op = op._host_value("host operand")
            elif op is not keep and op.dtype != result_dtype:
                op = backend.call(_array_of(op).astype, result_dtype)
            else:
                op = _array_of(op)
        args.append(op)
    return args


def clip_call(x: Any, lower: Any, upper: Any, out: Any = None, **kwargs: Any) -> Any:
    """``np.clip`` / ``cupy.clip`` / ``x.clip`` with a GPUScalar bound or operand (clip is no
    NumPy ufunc by name, so the promotion rules are applied here): scalars only give a
    GPUScalar (`clip`); with an array, the array's clip with the parity dtype."""
    operands = (x, lower, upper)
    given = tuple(op for op in operands if op is not None)  # None: no bound on that side
    if len(given) < 2:
        raise TypeError("clip() needs at least one of its bounds (min, max), got None for both")
    found = _common_backend(given)
    if found is None:
        return NotImplemented
    backend, has_array = found
    if isinstance(out, tuple):
        out = out[0] if len(out) == 1 else out
    if not has_array:
        if out is not None or kwargs:
            raise TypeError("clip() of GPUScalars takes no out= or other keywords (GPUScalars "
                            f"are immutable), got {sorted(kwargs) + ['out'] * (out is not None)}")
        if lower is None:
            return _minimum(x, upper)
        return _maximum(x, lower) if upper is None else clip(x, lower, upper)
    result_dtype = promote.result_dtype([_stand_in(op) for op in given])
    args = _parity_arrays(backend, operands, result_dtype)
    if out is not None:
        kwargs["out"] = out
    return backend.call(backend.xp.clip, *args, **kwargs)


def _route_cupy_kernel(backend: Backend, kernel: Any, name: str | None, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
    """A CuPy elementwise kernel that is no NumPy ufunc, called with a GPUScalar: ``where``
    and ``clip`` by what they mean (parity dtype); anything else (``copyto``'s ``cupy_copy``,
    a user ``ElementwiseKernel``) gets each GPUScalar as its 0-d device array. An output (an
    argument past ``kernel.nin``) that is a GPUScalar is refused: GPUScalars are immutable."""
    nin = getattr(kernel, "nin", len(args))
    if any(type(a) in _SCALAR_CLASSES for a in (*args[nin:], kwargs.get("out"))):
        raise TypeError(f"GPUScalars are immutable: one cannot be the output of {name or kernel}")
    if name == "where" and len(args) == 3 and not kwargs:
        return where(*args)
    if name == "clip" and len(args) in (3, 4):
        return clip_call(*args, **kwargs)
    if name == "copy" and len(args) == 2 and not kwargs:  # copyto(x, s), full, x[...] = s
        source, target = args  # CuPy checked the casting rule already (on the dtypes)
        return backend.call(backend.xp.copyto, target, _array_of(source), casting="unsafe")
    arrays = [_array_of(a) if type(a) in _SCALAR_CLASSES else a for a in args]
    return backend.call(kernel, *arrays, **kwargs)


#: operand kinds (see `operators._LAZY_LOOPS`) -> (the result dtype, the where op, each
#: operand's key as a leaf or constant), or None where eager code decides (a condition that is
#: not bool, an operand that is not a scalar, no GPUScalar at all)
_WHERE_LOOPS: dict[tuple[Any, Any, Any], Any] = {}
_BOOL = np.dtype(bool)
_is_lazy = expr.is_lazy


def _is_scalar_kind(kind: Any) -> bool:
    return is_scalar_kind(kind) or kind in promote.PYTHON_SCALAR_TYPES or (
        isinstance(kind, type) and issubclass(kind, np.generic))


def _resolve_where(kinds: tuple[Any, Any, Any]) -> Any:
    found = None
    if all(map(_is_scalar_kind, kinds)) and _kind_stand_in(kinds[0]) == _BOOL and any(
            map(is_scalar_kind, kinds)):
        dtype = promote.result_dtype([_kind_stand_in(kinds[1]), _kind_stand_in(kinds[2])])
        if dtype.kind in promote.SUPPORTED_KINDS:
            op = expr.get_op("where", "where", (_BOOL, dtype, dtype), (dtype,))
            keys = tuple(expr.leaf_key(scalar_dtype(kind)) if is_scalar_kind(kind) else
                         expr.const_key(wanted) for kind, wanted in zip(kinds, op.in_dtypes,
                                                                          strict=True))
            found = (dtype, op, *keys)
    _WHERE_LOOPS[kinds] = found
    return found


def _lazy_where(condition: Any, x: Any, y: Any) -> GPUScalar | None:
    """``where(condition, x, y)`` over scalars (GPUScalars of one backend and device, Python
    and NumPy numbers) as a pending node: the branches meet in NumPy's result dtype for them (a
    Python number weak, as in eager ``where``). None where eager code must decide: an array
    operand, a condition that is not bool, scalars that cannot meet (eager raises), a number
    NumPy's ``where`` converts in its own way (it wraps ``-1`` into ``uint8``, see `_constant`).
    Written out operand by operand: it is as hot as an operator.
    """
    scalar_classes = _SCALAR_CLASSES
    c_scalar, x_scalar, y_scalar = (type(condition) in scalar_classes, type(x) in scalar_classes,
                                    type(y) in scalar_classes)
    kinds = (operand_kind(condition), operand_kind(x), operand_kind(y))
    found = _WHERE_LOOPS.get(kinds, _MISSING)
    if found is _MISSING:
        found = _resolve_where(kinds)
    if found is None:
        return None
    dtype, op, c_key, x_key, y_key = found
    # one backend and device (else eager code raises the error naming both)
    first = condition if c_scalar else x if x_scalar else y
    backend, device = first._backend, first._device
    if x_scalar and (x._backend is not backend or x._device != device):
        return None
    if y_scalar and (y._backend is not backend or y._device != device):
        return None
    # every number first: nothing is marked used yet
    if not c_scalar:
        condition = _BOOL.type(condition)
    if not x_scalar:
        x = _constant(x, dtype)
    if not y_scalar:
        y = _constant(y, dtype)
    size = 1
    if c_scalar:
        condition = condition._array if condition._node is None else _child(condition)
        if type(condition) is Node:
            c_key = condition.key
            size += condition.size
    if x_scalar:
        x = x._array if x._node is None else _child(x)
        if type(x) is Node:
            x_key = x.key
            size += x.size
    if y_scalar:
        y = y._array if y._node is None else _child(y)
        if type(y) is Node:
            y_key = y.key
            size += y.size
    node = make_node(op, (condition, x, y), (c_key, x_key, y_key), size)
    classes = type(first)._strong if any(map(_is_strong_kind, kinds)) else type(first)._classes
    return _pending(classes[dtype.kind], node, dtype, device)


# ---- GPUScalar's members that reach every layer: installed on the class by `install` ---------
def _clip_method(self: GPUScalar, min: Any = None, max: Any = None,  # noqa: A002
                 out: Any = None) -> Any:
    """``np.clip(s, lo, hi)`` and ``cupy.clip(s, lo, hi)`` (which call this method): as
    `gpuscalar.clip` (a GPUScalar; an array where a bound is one), no sync."""
    return clip_call(self, min, max, out=out)


def _array_ufunc(self: GPUScalar, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """NumPy's entry point (``np.sqrt(s)``, ``np.add(x, s)``): the operators' hot path where
    it applies, else `apply_ufunc`."""
    if "out" not in kwargs and any(type(i) is np.ndarray and not i.ndim for i in inputs):
        # a NumPy scalar on the left (np.float32(0.1) == s) arrives as a 0-d array (rule 3)
        inputs = tuple(i[()] if type(i) is np.ndarray and not i.ndim else i for i in inputs)
    if not kwargs and method == "__call__":  # np.minimum(s, t), np.sin(s): the hot path
        result = _call_fast(ufunc, inputs)
        if result is not _MISSING:
            return result
    if method != "__call__":
        return NotImplemented
    if ufunc.__name__ == "clip" and getattr(np, "clip", None) is not ufunc:
        # np.clip / x.clip: no NumPy ufunc by name
        return clip_call(*inputs, **kwargs)
    return apply_ufunc(ufunc.__name__, *inputs, **kwargs)


def _cupy_kernel(self: GPUScalar, kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """CuPy's hook for ``cupy.sqrt(s)``, ``x += s``, ``cupy.where``/``clip``/``copyto``
    and user ``ElementwiseKernel`` calls.

    A CuPy ufunc that is a NumPy ufunc goes through the promotion rules like a NumPy ufunc;
    its outputs may come positionally (CuPy's in-place operators call ``_add(x, s, x)``),
    and are then ``out=``, with NumPy's ``same_kind`` check. ``where`` and ``clip`` keep
    the parity rule (`_route_cupy_kernel`); any other elementwise kernel (``copyto``'s copy,
    ``fill``, a user kernel) receives each GPUScalar as its 0-d device array, which the kernel
    reads on the device: no sync.
    """
    ufunc_name = self._backend.elementwise_ufunc_name(kernel)
    if ufunc_name is not None and isinstance(getattr(np, ufunc_name, None), np.ufunc):
        nin = kernel.nin
        if len(args) > nin:  # outputs passed positionally: out=
            if kwargs.get("out") is not None:
                raise TypeError(f"{kernel.name}() got outputs both positionally and as out=")
            outputs = args[nin:]
            args = args[:nin]
            kwargs["out"] = outputs[0] if len(outputs) == 1 else outputs
        out = kwargs.get("out")
        if any(type(o) in _SCALAR_CLASSES for o in (out if type(out) is tuple else (out,))):
            raise TypeError(f"GPUScalars are immutable: one cannot be the output of "
                            f"{kernel.name}")
        if len(kwargs) == (out is not None):  # no keyword but out=: the cached decision
            result = _array_call(ufunc_name, args, out)
            if result is not _MISSING:
                return result
        return apply_ufunc(ufunc_name, *args, **kwargs)
    return _route_cupy_kernel(self._backend, kernel, ufunc_name, args, kwargs)


#: GPUScalar's members defined here: name -> function
_MEMBERS: dict[str, Callable[..., Any]] = {
    "clip": _clip_method,
    "__array_ufunc__": _array_ufunc,
    "__cupy_override_elementwise_kernel__": _cupy_kernel,
}


def install(cls: type[GPUScalar]) -> None:
    """Install on GPUScalar (``cls``), once, at import, its members defined here (`_MEMBERS`):
    before any per-backend class is made (`gpuscalar.scalar._classes_for` wraps
    ``__array_ufunc__`` for CuPy)."""
    for name, function in _MEMBERS.items():
        function.__name__, function.__qualname__ = name, f"GPUScalar.{name}"
        setattr(cls, name, function)


install(GPUScalar)
SCALAR_FUNCTIONS.update(clip=clip_call, where=where)  # for the strict device's xp.clip/xp.where
