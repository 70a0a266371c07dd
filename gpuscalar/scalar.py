"""GPUScalar: a float-like number that lives on the device.

Why this module exists: reductions on a GPU produce a value on the device, and turning it into a
Python float forces a synchronization. A GPUScalar wraps the 0-d device array instead, does its
arithmetic, comparisons and math on the device, feeds arrays and kernels without ever reading the
value, and only synchronizes when Python truly needs the host value (`float(s)`, `bool(s)`,
formatting, ...): once, through `sync.to_host`, cached afterwards.

By default its operations are *lazy*: an operation on GPUScalars and Python numbers records a node
(`gpuscalar.lazy.expr.Node`, built by `expr.make_node` only) whose dtype `promote` decides at
once, and launches nothing; the expression is evaluated where it is consumed, by the executor of
the scalar's backend (`gpuscalar.lazy.fusion.executor_for`, chosen once per backend and held by
the scalar's class): in one kernel, or folded into the consuming array kernel.
``gs.lazy(False)`` / ``GPUSCALAR_LAZY=0`` give the eager behaviour, one backend call per
operation, with the same numbers.

Operators are generated from the tables below (thin dunders, the logic in `apply_ufunc`,
`_binary` and `_lazy_ufunc`); their static types are declared beside them (a test keeps both
equal). Promotion decisions come from `promote`; an array operation's decision is cached per
operand kinds (`_ARRAY_CALLS`). The helpers (``gs.minimum``, ..., in `gpuscalar.math`, which
builds on this module) and NumPy ufuncs called on a GPUScalar take the operators' generated hot
paths (`_call_fast`), and ``where`` and ``round`` have hot paths of their own: recording a node
must cost far less than the ~10 us launch it saves. All internal access to the wrapped array goes
through `_array_of`, which materializes a pending expression.

Handed to CuPy, a GPUScalar goes through CuPy's own dispatch: CuPy's ufuncs and elementwise
kernels call its ``__cupy_override_elementwise_kernel__`` (in-place operators with the output
positional, ``where``/``clip``/``copyto``, user kernels); CuPy's array operators defer to its
reflected operators (`_DeferToReflected`), so ``g * lr_expr`` is one launch. CuPy's
``x.fill(s)`` reads ``s == 0`` back (a sync in CuPy itself); ``x[...] = s`` does not.
"""

from __future__ import annotations

import numbers
import sys
import threading
from collections.abc import Callable
from operator import index as operator_index
from typing import TYPE_CHECKING, Any, Protocol, overload

import numpy as np

from . import ledger, promote, sync
from .backend import NUMPY, Backend, backend_of, get_backend
from .lazy import expr, fusion
from .lazy.expr import Node, make_node

__all__ = [
    "GPUScalar",
    "asscalar",
    "apply_ufunc",
    "lazy",
    "BINARY_OPERATORS",
    "COMPARISON_OPERATORS",
    "UNARY_OPERATORS",
]

#: dunder stem -> ufunc name, for binary operators with a reflected form.
BINARY_OPERATORS: dict[str, str] = {
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "truediv": "divide",
    "floordiv": "floor_divide",
    "mod": "remainder",
    "pow": "power",
    "divmod": "divmod",
    "and": "bitwise_and",
    "or": "bitwise_or",
    "xor": "bitwise_xor",
    "lshift": "left_shift",
    "rshift": "right_shift",
}

#: dunder stem -> ufunc name; the result is a bool GPUScalar.
COMPARISON_OPERATORS: dict[str, str] = {
    "lt": "less",
    "le": "less_equal",
    "eq": "equal",
    "ne": "not_equal",
    "gt": "greater",
    "ge": "greater_equal",
}

#: dunder stem -> ufunc name, one operand. ``~`` of a bool scalar is logical not (np.invert).
UNARY_OPERATORS: dict[str, str] = {
    "neg": "negative",
    "pos": "positive",
    "abs": "absolute",
    "invert": "invert",
    "floor": "floor",
    "ceil": "ceil",
    "trunc": "trunc",
}

lazy = expr.lazy


class _Binary(Protocol):
    """A binary operator's static type: a GPUScalar with a GPUScalar or a Python number; an
    array (not known statically) with anything else."""

    @overload
    def __call__(self, other: GPUScalar | float, /) -> GPUScalar: ...
    @overload
    def __call__(self, other: Any, /) -> Any: ...


class _Divmod(Protocol):
    @overload
    def __call__(self, other: GPUScalar | float, /) -> tuple[GPUScalar, GPUScalar]: ...
    @overload
    def __call__(self, other: Any, /) -> Any: ...


class _Unary(Protocol):
    def __call__(self) -> GPUScalar: ...


#: What GPUScalar's NumPy and CuPy hooks dispatch to in `gpuscalar.math` (which builds on this
#: module, so this one cannot import it): ``clip_call`` (``np.clip(s, ...)``, ``s.clip``) and
#: ``route_cupy_kernel`` (CuPy kernels that are no NumPy ufunc). Set by `register_math_hooks`
#: when gpuscalar.math is imported, which importing gpuscalar does.
_math_hooks: dict[str, Callable[..., Any]] = {}


def register_math_hooks(*, clip_call: Callable[..., Any],
                        route_cupy_kernel: Callable[..., Any]) -> None:
    """Install `gpuscalar.math`'s functions behind GPUScalar's NumPy and CuPy hooks."""
    _math_hooks.update(clip_call=clip_call, route_cupy_kernel=route_cupy_kernel)


class GPUScalar:
    """A 0-d device value that behaves like a Python number and syncs only when read.

    Construct from a 0-d NumPy/CuPy array (or a NumPy scalar); use `asscalar` for Python numbers.
    Arithmetic, comparisons and math stay on the device. Host reads (`item`, `float`, `int`,
    `bool`, `complex`, `format`, `str`, `repr`, `numpy.asarray`, pickling) transfer once and
    cache. Immutable and, because ``==`` is device-valued, unhashable.
    """

    # _array: the 0-d device array, None while pending; _node: the pending expression (or None);
    # _dtype, _device: always known (the device id on multi-device backends, else "cpu");
    # _used: whether a pending expression was already used (see expr.KEEP_NODES);
    # _host: unset until the first read.
    # Threads may share a scalar (see `_materialize`): _array is published by one store before
    # _node is dropped, so a reader that finds no node finds the array, and one that still
    # finds the node computes the same value from it.
    __slots__ = ("_array", "_node", "_dtype", "_device", "_used", "_host")
    _array: Any
    _node: Node | None
    _dtype: np.dtype
    _device: object
    _used: bool
    _host: Any
    _backend: Backend  # a class attribute of the concrete per-backend subclasses
    _executor: fusion.Executor  # the backend's evaluator of pending expressions (idem)
    __array_priority__ = 1000  # above cupy.ndarray's: its binary operators defer to ours
    __hash__ = None  # type: ignore[assignment]

    def __new__(cls, array: Any) -> GPUScalar:
        backend = backend_of(array)
        if backend is None:
            if isinstance(array, np.generic):
                array, backend = np.asarray(array), NUMPY
            else:
                raise TypeError(
                    "GPUScalar() takes a 0-d NumPy or CuPy array, got "
                    f"{type(array).__name__}; use gpuscalar.asscalar() for Python numbers"
                )
        if array.ndim != 0:
            raise ValueError(
                f"GPUScalar() takes a 0-d array, got an array of shape {array.shape}; "
                "reduce it first (e.g. gpuscalar.sum)"
            )
        if array.dtype.kind not in promote.SUPPORTED_KINDS:
            raise TypeError(
                "GPUScalar() supports bool, integer, floating and complex dtypes, "
                f"got {array.dtype}"
            )
        return _wrap(backend, array)

    # ---- no-sync attributes -------------------------------------------------------------
    @property
    def array(self) -> Any:
        """The wrapped 0-d backend array (no sync; evaluates a pending expression: one op)."""
        return _array_of(self)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def device(self) -> object:
        """``"cpu"`` for NumPy, the CUDA device id for CuPy (no sync)."""
        return self._device

    @property
    def is_materialized(self) -> bool:
        """Whether the value is held in a 0-d array (False: a pending expression, evaluated
        where it is consumed)."""
        return self._array is not None

    shape = ()
    ndim = 0
    size = 1

    if TYPE_CHECKING:  # the operators installed from the tables below; a test keeps both equal
        __add__: _Binary
        __radd__: _Binary
        __sub__: _Binary
        __rsub__: _Binary
        __mul__: _Binary
        __rmul__: _Binary
        __truediv__: _Binary
        __rtruediv__: _Binary
        __floordiv__: _Binary
        __rfloordiv__: _Binary
        __mod__: _Binary
        __rmod__: _Binary
        __rpow__: _Binary
        __divmod__: _Divmod
        __rdivmod__: _Divmod
        __and__: _Binary
        __rand__: _Binary
        __or__: _Binary
        __ror__: _Binary
        __xor__: _Binary
        __rxor__: _Binary
        __lshift__: _Binary
        __rlshift__: _Binary
        __rshift__: _Binary
        __rrshift__: _Binary
        __lt__: _Binary
        __le__: _Binary
        __eq__: _Binary  # device-valued, as NumPy's
        __ne__: _Binary
        __gt__: _Binary
        __ge__: _Binary
        __neg__: _Unary
        __pos__: _Unary
        __abs__: _Unary
        __invert__: _Unary
        __floor__: _Unary
        __ceil__: _Unary
        __trunc__: _Unary

    # ---- host reads: each at most one counted transfer, then cached ----------------------
    def _host_value(self, reason: str) -> Any:
        try:
            return self._host
        except AttributeError:
            pass  # not read yet; the transfer happens outside the handler (clean tracebacks)
        array = self._array
        # A pending expression is evaluated only once the read is allowed: one launch, one sync.
        host = self._host = sync.to_host(
            self._backend, (lambda: _materialize(self)) if array is None else array, reason
        )
        return host

    def item(self) -> Any:
        """The value as a Python scalar (one sync the first time, cached)."""
        return self._host_value("item")

    def __float__(self) -> float:
        return float(self._host_value("float"))

    def __int__(self) -> int:
        return int(self._host_value("int"))

    def __complex__(self) -> complex:
        return complex(self._host_value("complex"))

    def __bool__(self) -> bool:
        return bool(self._host_value("bool"))

    def __index__(self) -> int:
        if self.dtype.kind not in "biu":
            raise TypeError(
                f"only integer or bool GPUScalars can be used as an index, not {self.dtype}"
            )
        return int(self._host_value("index"))

    def __format__(self, spec: str) -> str:
        return format(self._host_value("format"), spec)

    def __str__(self) -> str:
        return str(self._host_value("str"))

    def __repr__(self) -> str:
        value = self._host_value("repr")
        return f"GPUScalar({value!r}, dtype={self.dtype}, device={self.device!r})"

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if _asks_dtype_only():  # cupy.full(shape, s): only the dtype is used, see there
            return np.zeros((), self.dtype if dtype is None else dtype)
        value = self._host_value("__array__")
        return np.asarray(value, dtype=self.dtype if dtype is None else dtype)

    def __reduce__(self) -> tuple[Any, ...]:
        value = self._host_value("pickle")
        return (_unpickle, (self._backend.name, self.dtype.str, value))

    def __copy__(self) -> GPUScalar:
        return self  # immutable

    def __deepcopy__(self, memo: dict[int, Any]) -> GPUScalar:
        return self

    # ---- export without a host round trip: the 0-d array itself, no copy, no sync ---------
    def __dlpack__(self, **kwargs: Any) -> Any:
        """DLPack export of the 0-d array (``torch.from_dlpack(s)``, ``np.from_dlpack(s)``)."""
        return _array_of(self).__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _array_of(self).__dlpack_device__()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface of the 0-d device array (``cupy.asarray(s)``,
        ``numba.cuda.as_cuda_array(s)``); only CuPy scalars have one."""
        array = _array_of(self)
        try:
            return array.__cuda_array_interface__
        except AttributeError:
            raise AttributeError(
                f"a {self._backend.name} GPUScalar has no __cuda_array_interface__ (its data is "
                "not in CUDA memory); use DLPack (__dlpack__)"
            ) from None

    # ---- numbers.Real / numbers.Complex members: device-valued, no sync --------------------
    @property
    def real(self) -> GPUScalar:
        """The real part (the scalar itself for a real dtype), a GPUScalar; no sync."""
        if self._dtype.kind != "c":
            return self
        backend = self._backend
        return _wrap(backend, backend.call(backend.xp.real, _array_of(self)))

    @property
    def imag(self) -> GPUScalar:
        """The imaginary part (zero of the scalar's dtype for a real dtype, as ``np.imag``),
        a GPUScalar; no sync."""
        backend = self._backend
        if self._dtype.kind != "c":
            return _wrap(backend, _make_array(backend, 0, self._dtype, self._device))
        return _wrap(backend, backend.call(backend.xp.imag, _array_of(self)))

    def clip(self, min: Any = None, max: Any = None, out: Any = None) -> Any:  # noqa: A002
        """``np.clip(s, lo, hi)`` and ``cupy.clip(s, lo, hi)`` (which call this method): as
        `gpuscalar.clip` (a GPUScalar; an array where a bound is one), no sync."""
        return _math_hooks["clip_call"](self, min, max, out=out)

    def conjugate(self) -> GPUScalar:
        """The complex conjugate (the scalar itself for a real dtype), a GPUScalar; no sync."""
        if self._dtype.kind != "c":
            return self
        return apply_ufunc("conjugate", self)

    # ---- device operations ---------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if not kwargs and method == "__call__":  # np.minimum(s, t), np.sin(s): the hot path
            result = _call_fast(ufunc, inputs)
            if result is not _MISSING:
                return result
        if method != "__call__":
            return NotImplemented
        if ufunc.__name__ == "clip" and getattr(np, "clip", None) is not ufunc:
            # np.clip / x.clip: no NumPy ufunc by name
            return _math_hooks["clip_call"](*inputs, **kwargs)
        return apply_ufunc(ufunc.__name__, *inputs, **kwargs)

    def __cupy_override_elementwise_kernel__(self, kernel: Any, *args: Any, **kwargs: Any) -> Any:
        """CuPy's hook for ``cupy.sqrt(s)``, ``x += s``, ``cupy.where``/``clip``/``copyto``
        and user ``ElementwiseKernel`` calls.

        A CuPy ufunc that is a NumPy ufunc goes through the promotion rules like a NumPy ufunc;
        its outputs may come positionally (CuPy's in-place operators call ``_add(x, s, x)``),
        and are then ``out=``, with NumPy's ``same_kind`` check. ``where`` and ``clip`` keep
        the parity rule (`gpuscalar.math._route_cupy_kernel`); any other elementwise kernel
        (``copyto``'s copy, ``fill``, a user kernel) receives each GPUScalar as its 0-d device
        array, which the kernel reads on the device: no sync.
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
        return _math_hooks["route_cupy_kernel"](self._backend, kernel, ufunc_name, args, kwargs)

    def __round__(self, ndigits: int | None = None) -> GPUScalar:
        decimals = 0 if ndigits is None else operator_index(ndigits)
        if expr.is_lazy():
            found = _ROUND_OPS.get((self._dtype, decimals), _MISSING)
            if found is _MISSING:
                found = _resolve_round(self._dtype, decimals)
            if found is not None:
                op, key = found
                child = _child(self)
                if type(child) is Node:
                    key, size = child.key, child.size + 1
                else:
                    size = 1
                return _pending(self._backend, make_node(op, (child,), (key,), size),
                                self._dtype, self._device)
        backend = self._backend
        result = backend.call(backend.xp.round, _array_of(self), decimals)
        return _wrap(backend, result)

    @overload
    def __pow__(self, other: GPUScalar | float, modulo: None = None) -> GPUScalar: ...
    @overload
    def __pow__(self, other: Any, modulo: Any = None) -> Any: ...

    def __pow__(self, other: Any, modulo: Any = None) -> Any:
        if modulo is not None:
            raise TypeError("pow() with a modulus is not supported for GPUScalar")
        return _binary(self, other, "power", False)


#: (dtype, decimals) -> (the round op, the key of a leaf of that dtype), or None where rounding runs
#: eagerly (bool; integers to negative decimals, which NumPy computes through floats)
_ROUND_OPS: dict[tuple[np.dtype, int], Any] = {}


def _resolve_round(dtype: np.dtype, decimals: int) -> Any:
    found = None
    if dtype.kind in "fc" or (dtype.kind in "iu" and decimals >= 0):
        op = expr.get_op("round", "round", (dtype,), (dtype,), 0, decimals)
        found = (op, expr.leaf_key(dtype))
    _ROUND_OPS[(dtype, decimals)] = found
    return found


class _RealGPUScalar(GPUScalar):
    """GPUScalar of a real dtype (bool, int, float): registered as `numbers.Real`."""

    __slots__ = ()


numbers.Complex.register(GPUScalar)
numbers.Real.register(_RealGPUScalar)

#: Every concrete scalar class (one real and one complex class per backend, made on first use).
_SCALAR_CLASSES: set[type] = set()


class _DeferToReflected:
    """``__array_ufunc__`` of CuPy GPUScalars: the method, seen from the class; None, seen
    from an instance.

    Why: ``g * s`` with a CuPy array ``g`` on the left runs ``cupy.ndarray.__mul__``, which
    (core.pyx ``_should_use_rop``, CuPy 14) reads ``s.__array_ufunc__`` from the *instance*
    and returns NotImplemented when it is None, so Python calls ``s.__rmul__(g)``: gpuscalar's
    own rules, a pending ``s`` folded into the one kernel. Otherwise CuPy calls
    ``numpy.multiply(g, s)``, whose CuPy handler probes ``s.__cuda_array_interface__``, which
    evaluates a pending scalar in a launch of its own. NumPy looks ``__array_ufunc__`` up on
    the *type*, so ``np.sqrt(s)`` and ``np.add(x, s)`` still reach the method.
    """

    __slots__ = ("method",)

    def __init__(self, method: Any) -> None:
        self.method = method

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self.method if instance is None else None


def _classes_for(backend: Backend) -> dict[str, type]:
    """The concrete classes for ``backend``, by dtype kind.

    Each backend gets its own pair of classes with the backend as a class attribute, so that
    ``type(a) is type(b)`` is the whole "same backend, both real" test on the fast path, and
    its dunders can be generated with that backend's ufuncs already bound. Made under a lock
    (once per backend, first use only): threads that start together must share one pair.
    """
    classes = backend.__dict__.get("_scalar_classes")
    if classes is not None:
        return classes
    with _CLASSES_LOCK:
        classes = backend.__dict__.get("_scalar_classes")
        if classes is not None:
            return classes
        executor = fusion.executor_for(backend)
        namespace: dict[str, Any] = {"__slots__": (), "_backend": backend, "_executor": executor}
        if executor.defers_to_reflected:
            namespace["__array_ufunc__"] = _DeferToReflected(GPUScalar.__array_ufunc__)
        real = type("GPUScalar", (_RealGPUScalar,), dict(namespace))
        complex_ = type("GPUScalar", (GPUScalar,), dict(namespace))
        real.__module__ = complex_.__module__ = __name__
        _install_fast_operators(real, backend)
        _SCALAR_CLASSES.update((real, complex_))
        classes = {kind: real for kind in "biuf"}
        classes["c"] = complex_
        backend._scalar_classes = classes  # type: ignore[attr-defined]
    return classes


_CLASSES_LOCK = threading.Lock()


def _wrap(backend: Backend, result: Any) -> GPUScalar:
    """Private fast constructor for internal results (already validated)."""
    if type(result) is not np.ndarray and isinstance(result, np.generic):
        result = np.asarray(result)
    classes = backend.__dict__.get("_scalar_classes") or _classes_for(backend)
    dtype = result.dtype
    scalar = object.__new__(classes[dtype.kind])
    scalar._array = result
    scalar._node = None
    scalar._dtype = dtype
    scalar._device = backend.device_of(result) if backend.multi_device else "cpu"
    return scalar


def _pending(backend: Backend, node: Node, dtype: np.dtype, device: object) -> GPUScalar:
    """A GPUScalar holding the expression ``node`` (materialized at once past the size bound)."""
    classes = backend.__dict__.get("_scalar_classes") or _classes_for(backend)
    scalar = object.__new__(classes[dtype.kind])
    scalar._array = None
    scalar._node = node
    scalar._dtype = dtype
    scalar._device = device
    scalar._used = False
    if node.size > expr.MAX_NODES:
        _materialize(scalar)
    return scalar


def _child(scalar: GPUScalar) -> Any:
    """What an expression built from ``scalar`` holds: its array (a leaf), or its node; an
    expression larger than `expr.KEEP_NODES` used a second time is materialized first."""
    node = scalar._node
    if node is None:
        return scalar._array
    if scalar._used and node.size > expr.KEEP_NODES:
        return _materialize(scalar)
    scalar._used = True
    return node


def _materialize(scalar: GPUScalar) -> Any:
    """Evaluate a pending GPUScalar (one device op); it keeps the array and drops the node.

    Safe for a scalar shared by threads, like a float: the node is read once (if another thread
    materialized the scalar since the caller looked, its array is returned), and the array is
    published by one store of an immutable value before the node is dropped, so no reader sees
    neither. Threads that evaluate it together each launch once (the same bits); the first
    published array is kept. Single-threaded: exactly one device op, as before.
    """
    node = scalar._node
    if node is None:  # materialized meanwhile by another thread
        return scalar._array
    array = scalar._executor.materialize(node, scalar._device)
    published = scalar._array
    if published is not None:  # another thread's evaluation of the same node won
        return published
    if ledger.in_loop_body():  # a recipe, evaluated afresh each iteration: not cached
        return array
    scalar._array = array  # the publication: one store
    scalar._node = None  # then drop the tree (memory only)
    return array


def _node_of(scalar: GPUScalar) -> Node | None:
    """A pending GPUScalar's expression (for consumers that compute it themselves), else None."""
    return scalar._node


def _array_of(scalar: GPUScalar) -> Any:
    """The one internal accessor for a GPUScalar's device array (materializes if pending)."""
    array = scalar._array
    if array is None:
        array = _materialize(scalar)
    return array


#: code objects of CuPy functions that convert a fill value with ``numpy.array(value)`` only to
#: learn its dtype (made on first use; empty without CuPy)
_DTYPE_ONLY_CALLERS: list[Any] = []


def _asks_dtype_only() -> bool:
    """Whether ``__array__`` was called by CuPy's ``full(shape, s)`` (no ``dtype=``), which
    calls ``numpy.array(fill_value).dtype`` and then copies the value with ``copyto`` (a kernel
    that reads the GPUScalar's 0-d device array, no sync). Answering with a 0-d array of the
    right dtype but no value spares a host read whose value CuPy throws away. CuPy 14's
    ``full`` is Python, so its frame is the caller of the C ``numpy.array``."""
    if not _DTYPE_ONLY_CALLERS:
        cupy = sys.modules.get("cupy")
        full = getattr(getattr(getattr(cupy, "_creation", None), "basic", None), "full", None)
        if full is None:
            return False
        _DTYPE_ONLY_CALLERS.append(full.__code__)
    caller = sys._getframe(1).f_back  # (None when __array__ was called from C at the top)
    return caller is not None and caller.f_code in _DTYPE_ONLY_CALLERS


def _unpickle(backend_name: str, dtype: str, value: Any) -> GPUScalar:
    backend = get_backend(backend_name)
    return _wrap(backend, _make_array(backend, value, np.dtype(dtype), None))


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


def _binary(left: GPUScalar, right: Any, name: str, reflected: bool) -> Any:
    """A dunder's general path: GPUScalar with another GPUScalar or a Python scalar (rules 2-3);
    anything else goes to `apply_ufunc`."""
    kind = type(right)
    backend = left._backend
    if kind in promote.PYTHON_SCALAR_TYPES:
        other = right
    elif kind in _SCALAR_CLASSES and kind._backend is backend and right._device == left._device:
        other = None
    else:  # an array (``lr_expr * g``: the fold, straight to its cached decision) or other
        operands = (right, left) if reflected else (left, right)
        result = _array_call(name, operands, None)
        return apply_ufunc(name, *operands) if result is _MISSING else result
    if expr.is_lazy():
        operands = (right, left) if reflected else (left, right)
        result = _lazy_ufunc(backend, name, operands, left.device)
        if result is not None:
            return result
    if other is None:
        other = _array_of(right)
    mine = _array_of(left)
    args = (other, mine) if reflected else (mine, other)
    result = backend.call(backend.ufunc(name), *args, **backend.ufunc_array_kwargs)
    if type(result) is tuple:
        return tuple(_wrap(backend, r) for r in result)
    return _wrap(backend, result)


#: (ufunc name, operand kinds) -> (one op per output, the loop's input dtypes, each operand's
#: key as a leaf or constant), or None where the ufunc is not elementwise (a gufunc such as
#: matmul): eager code decides. An operand's *kind* is a GPUScalar's dtype, or the type of a
#: Python or NumPy scalar (a type is never a dtype, so leaves and constants never share a kind).
_LAZY_LOOPS: dict[tuple[Any, ...], Any] = {}
_MISSING = object()


def _kind_stand_in(kind: Any) -> Any:
    """What NumPy's resolver sees for an operand of ``kind`` in a scalar-only operation (rules
    2-3): a GPUScalar as a 0-d array of its dtype, a Python scalar weak, a NumPy scalar strong."""
    if isinstance(kind, np.dtype):
        return kind
    if kind in promote.PYTHON_SCALAR_TYPES:
        return np.dtype(bool) if kind is bool else kind
    return np.dtype(kind)


def _resolve_lazy_loop(name: str, kinds: tuple[Any, ...]) -> Any:
    """Fill `_LAZY_LOOPS` for ``name`` over operands of ``kinds`` (NumPy's error where NumPy
    has no loop for them, as the eager call raises)."""
    found = None
    if getattr(np, name).signature is None:
        signature = promote.parity_signature(name, tuple(map(_kind_stand_in, kinds)))
        nin = len(kinds)
        in_dtypes, out_dtypes = signature[:nin], signature[nin:]
        ops = tuple(expr.get_op("ufunc", name, in_dtypes, out_dtypes, k)
                    for k in range(len(out_dtypes)))
        keys = tuple(expr.leaf_key(kind) if isinstance(kind, np.dtype) else expr.const_key(dtype)
                     for kind, dtype in zip(kinds, in_dtypes, strict=True))
        found = (tuple((op, op.dtype) for op in ops), in_dtypes, keys)
    _LAZY_LOOPS[(name,) + kinds] = found
    return found


def _constant(value: Any, dtype: np.dtype) -> Any:
    """A Python or NumPy number as a kernel argument of ``dtype``, converted as NumPy converts
    it for the eager operation; None where only NumPy can say (see `_EXACT_INT`) or where the
    value does not fit ``dtype`` (NumPy raises, or special-cases it: comparisons)."""
    if type(value) is int and not -_EXACT_INT <= value <= _EXACT_INT:
        return None
    try:
        return dtype.type(value)
    except OverflowError:
        return None


def _lazy_ufunc(backend: Backend, name: str, operands: tuple[Any, ...],
                device: object) -> Any:
    """Record ufunc ``name`` over GPUScalars and Python/NumPy scalars as pending node(s).

    The loop (and so every result dtype) is `promote`'s, NumPy's own choice for the eager call;
    a NumPy error for these operand types is raised here, as eager code would. Python numbers
    are converted to the loop's input dtype now, as NumPy converts them. Returns None where
    eager code must decide: a number NumPy converts in its own way (`_constant`), a gufunc.
    """
    scalar_classes = _SCALAR_CLASSES
    kinds: list[Any] = [name]
    for operand in operands:
        kinds.append(operand._dtype if type(operand) in scalar_classes else type(operand))
    found = _LAZY_LOOPS.get(tuple(kinds), _MISSING)
    if found is _MISSING:
        found = _resolve_lazy_loop(name, tuple(kinds[1:]))
    if found is None:
        return None
    outputs, in_dtypes, leaf_keys = found
    children = list(operands)
    keys = list(leaf_keys)
    size = 1
    scalars = []
    for i, operand in enumerate(operands):  # every number first: nothing is marked used yet
        if type(operand) in scalar_classes:
            scalars.append(i)
        else:
            children[i] = constant = _constant(operand, in_dtypes[i])
            if constant is None:
                return None
    for i in scalars:
        children[i] = child = _child(operands[i])
        if type(child) is Node:
            keys[i] = child.key
            size += child.size
    children_, keys_ = tuple(children), tuple(keys)
    results = tuple(_pending(backend, make_node(op, children_, keys_, size), dtype, device)
                    for op, dtype in outputs)
    return results[0] if len(results) == 1 else results


#: A Python int beyond +-2**53 is left to NumPy, eagerly: NumPy converts such an int to a float
#: loop's dtype in two ways depending on the ufunc (directly, or through int64, which rounds once
#: where the direct way rounds twice), and some ufuncs (the logical ones) refuse ints beyond
#: int64 where others take them. Within +-2**53 every way gives the same value.
_EXACT_INT = 2**53


def _wrapped_int(value: int, dtype: np.dtype) -> np.generic:
    """``value`` modulo 2**bits as a NumPy integer of ``dtype`` (two's complement)."""
    bits = dtype.itemsize * 8
    value %= 1 << bits
    if dtype.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return dtype.type(value)


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
    if array_backend is NUMPY:
        return NUMPY, True  # rule 4: a device scalar meets a host array
    _raise_incompatible(operands)
    raise AssertionError("unreachable")


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
    if type(operand) in _SCALAR_CLASSES:
        return promote.weak_stand_in(operand.dtype)
    if type(operand) in promote.PYTHON_SCALAR_TYPES:
        return promote.python_operand_stand_in(operand)
    return operand.dtype


def apply_ufunc(name: str, *operands: Any, **kwargs: Any) -> Any:
    """Apply the backend ufunc ``name`` to operands of which at least one is a GPUScalar.

    Implements the promotion rules: with an array operand the result is an array with the
    dtype NumPy gives for ``x ⊕ s.item()`` (rule 1), otherwise a GPUScalar (rules 2-3; a pending
    expression when lazy). A device GPUScalar meeting a host NumPy array is read first (rule 4,
    one counted sync); operands on backends or devices that cannot meet raise (rule 5). A
    pending GPUScalar operand of an array operation is computed inside that operation's kernel.

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
    if not has_array:
        if kwargs.get("out") is not None:
            raise TypeError("GPUScalars are immutable: out= cannot be a GPUScalar")
        kwargs.pop("out", None)
        if not kwargs and expr.is_lazy():
            device = next(op.device for op in operands if type(op) in _SCALAR_CLASSES)
            result = _lazy_ufunc(backend, name, operands, device)
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
#: per call). Bounded by the kinds a program combines.
_ARRAY_CALLS: dict[tuple[Any, ...], tuple[Backend, dict[str, Any], tuple[int, ...],
                                          tuple[int, ...]]] = {}


def _array_call(name: str, operands: tuple[Any, ...], out: Any) -> Any:
    """`apply_ufunc` for an array operation through `_ARRAY_CALLS`; `_MISSING` where the general
    path decides (no array operand, rule 4, an unknown operand, several outputs, an error)."""
    key: list[Any] = [name]
    scalar_classes = _SCALAR_CLASSES
    for op in operands:
        kind = type(op)
        key.append(kind)
        if kind in scalar_classes:
            key.append(op._dtype)
        elif kind not in promote.PYTHON_SCALAR_TYPES:
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
    found = _ARRAY_CALLS.get(tuple(key))
    if found is None:
        found = _decide_array_call(name, operands, out)
        if found is None:
            return _MISSING
        _ARRAY_CALLS[tuple(key)] = found
    backend, keywords, scalars, arrays = found
    if backend.multi_device:  # rule 5, per call: one device
        device, device_of = operands[scalars[0]]._device, backend.device_of
        for i in scalars:
            if operands[i]._device != device:
                _check_devices(backend, operands)  # raises, naming both
        for i in arrays:
            if device_of(operands[i]) != device:
                _check_devices(backend, operands)
    if out is not None:
        keywords = {**keywords, "out": out}
    return _launch(backend, name, operands, keywords, None if out is None else (out,), scalars)


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
    return backend, keywords, scalars, arrays


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
        if dtype is not None and fusion.dtype_pins_loop(name, dtype):
            keywords["dtype"] = dtype
    return keywords


def _launch(backend: Backend, name: str, operands: tuple[Any, ...], kwargs: dict[str, Any],
            out: tuple[Any, ...] | None, scalars: tuple[int, ...]) -> Any:
    """The array operation itself: the pending GPUScalar operands (at positions ``scalars``)
    computed in its kernel (`_fused`), materialized ones passed as their 0-d arrays. Returns
    the caller's output array(s) where ``out`` is given, as NumPy and CuPy do."""
    args, pending = list(operands), {}
    for position in scalars:
        op = operands[position]
        node = op._node  # read once: another thread may materialize op
        if node is not None:
            pending[position] = (op, node)
        args[position] = op._array
    if pending:
        return _fused(backend, name, args, kwargs, pending)
    result = backend.call(backend.ufunc(name), *args, **kwargs)
    if out is not None:
        return out[0] if len(out) == 1 else out
    return result


def _fused(backend: Backend, name: str, args: list[Any], kwargs: dict[str, Any],
           pending: dict[int, tuple[GPUScalar, Node]]) -> Any:
    """An array ufunc computing its pending GPUScalar operands (``position -> (scalar, its
    node as read once)``) in its own kernel; one larger than `expr.KEEP_NODES` is stored by
    that kernel too (it is kept: no launch of its own), published as `_materialize` does."""
    nodes, keep = {}, []
    for position, (_, node) in pending.items():
        nodes[position] = node
        if node.size > expr.KEEP_NODES:
            keep.append(position)
    result, kept = fusion.fused_ufunc(backend, name, args, kwargs, nodes, frozenset(keep))
    for position, (scalar, _) in pending.items():
        if position in kept:
            if scalar._array is None and not ledger.in_loop_body():  # (as _materialize)
                scalar._array, scalar._node = kept[position], None
        else:
            scalar._used = True
    return result


def asscalar(value: Any, *, like: Any = None, dtype: Any = None) -> GPUScalar:
    """Make a device scalar from a Python number, NumPy scalar, 0-d array or GPUScalar.

    It lives on the backend and device of ``like`` (an array or GPUScalar), NumPy when ``like``
    is None. Its dtype is ``dtype`` if given, else the value's own; a Python float takes
    ``like``'s dtype when ``like`` is floating (a Python int when ``like`` is an integer, a
    Python complex when ``like`` is complex), else float64 / int64 / complex128 / bool.
    """
    if like is None:
        backend, like_dtype, device = None, None, None
    elif type(like) in _SCALAR_CLASSES:
        backend, like_dtype, device = like._backend, like.dtype, like.device
    else:
        backend = backend_of(like)
        if backend is None:
            raise TypeError(
                f"asscalar(like=...) takes an array or GPUScalar, got {type(like).__name__}"
            )
        like_dtype, device = like.dtype, backend.device_of(like)

    kind = type(value)
    if kind in _SCALAR_CLASSES:
        source_backend = value._backend
        host_value: Any = value  # its array is only needed (and evaluated) to make a new one
        natural = value.dtype
    elif kind in promote.PYTHON_SCALAR_TYPES:
        source_backend, host_value = None, value
        natural = _python_default_dtype(value, like_dtype)
    elif isinstance(value, np.generic):
        source_backend, host_value, natural = None, value, value.dtype
    else:
        source_backend = backend_of(value)
        if source_backend is None:
            raise TypeError(
                "asscalar() takes a Python number, NumPy scalar, 0-d array or GPUScalar, got "
                f"{kind.__name__}"
            )
        if value.ndim != 0:
            raise ValueError(f"asscalar() takes a 0-d array, got shape {value.shape}")
        if source_backend is NUMPY:
            source_backend = None  # host data: may be uploaded to any backend
        host_value, natural = value, value.dtype
    target_dtype = natural if dtype is None else np.dtype(dtype)
    if target_dtype.kind not in promote.SUPPORTED_KINDS:
        raise TypeError(f"asscalar() supports bool, integer, floating and complex dtypes, "
                        f"got {target_dtype}")
    if backend is None:
        backend = source_backend or NUMPY
    if source_backend is not None and source_backend is not backend:
        raise TypeError(
            f"asscalar(): the value is a {source_backend.name} device value and like= is "
            f"{backend.name}; gpuscalar never copies silently"
        )
    if kind in _SCALAR_CLASSES:
        if target_dtype == natural and (device is None or value.device == device):
            return value
        host_value = _array_of(value)
    return _wrap(backend, _make_array(backend, host_value, target_dtype, device))


def _python_default_dtype(value: Any, like_dtype: np.dtype | None) -> np.dtype:
    kind = type(value)
    if kind is bool:
        return np.dtype(bool)
    natural, like_kinds = ((np.dtype(np.int64), "iu") if kind is int else
                           (np.dtype(np.float64), "f") if kind is float else
                           (np.dtype(np.complex128), "c"))
    return like_dtype if like_dtype is not None and like_dtype.kind in like_kinds else natural


def _make_array(backend: Backend, value: Any, dtype: np.dtype, device: object) -> Any:
    """A 0-d array of ``backend`` (on ``device``) holding ``value``: one device op.

    Host data (a Python number, a NumPy scalar or 0-d array) is converted on the host as
    ``asarray`` converts it (its errors included), then written by a fill kernel that takes the
    value as an argument (``xp.full``: on CuPy 14 ``copyto`` launches its copy ufunc with the
    scalar as a kernel argument): no host-to-device copy, which a CUDA graph being captured
    refuses (`sync.graph_body`), and no pageable staging copy either.
    """
    if backend is NUMPY:
        return backend.call(np.asarray, value, dtype=dtype)
    args: tuple[Any, ...]
    if backend.owns(value):  # a device array: converted (or moved) on the device
        make, args = backend.xp.asarray, (value,)
    else:
        make, args = backend.xp.full, ((), np.asarray(value, dtype=dtype)[()])
    if backend.multi_device and device is not None:
        with backend.device_context(device):
            return backend.call(make, *args, dtype=dtype)
    return backend.call(make, *args, dtype=dtype)


def _make_binary(name: str, reflected: bool) -> Any:
    def operator(self: GPUScalar, other: Any) -> Any:
        return _binary(self, other, name, reflected)

    return operator


def _make_unary(name: str) -> Any:
    def operator(self: GPUScalar) -> GPUScalar:
        backend = self._backend
        if expr.is_lazy():
            return _lazy_ufunc(backend, name, (self,), self.device)
        return _wrap(
            backend,
            backend.call(backend.ufunc(name), _array_of(self), **backend.ufunc_array_kwargs),
        )

    return operator


def _install_fast_operators(cls: Any, backend: Backend) -> None:
    """Give a real per-backend class dunders with the backend's ufuncs bound (the hot path).

    A real GPUScalar with a Python bool/int/float, or with a GPUScalar of the same class,
    can only produce a real result of the same backend, so the result class is known without
    looking at dtypes. Everything else goes to `_binary`, which handles all cases. Lazy, an
    operation is a dict lookup of its loop (per operand dtypes), the conversion of a Python
    number, and one node; eager, one ufunc call.
    """
    fast_class = cls
    multi_device = backend.multi_device
    device_of = backend.device_of
    out_ellipsis = backend.ufunc_array_kwargs == {"out": ...}
    real_python_types = frozenset({bool, int, float})
    note_op = sync.note_device_op
    counting = ledger.counting  # ContextVar.get, inlined: counting costs nothing when idle
    is_lazy = expr.is_lazy
    leaf_keys = expr.LEAF_KEYS
    max_nodes, keep_nodes = expr.MAX_NODES, expr.KEEP_NODES
    new = object.__new__

    def finish(result: Any) -> GPUScalar:
        if not out_ellipsis and type(result) is not np.ndarray and isinstance(result, np.generic):
            result = np.asarray(result)
        scalar: GPUScalar = new(cls)
        scalar._array = result
        scalar._node = None
        scalar._dtype = result.dtype
        scalar._device = device_of(result) if multi_device else "cpu"
        return scalar

    def finish_pair(results: tuple[Any, Any]) -> tuple[GPUScalar, GPUScalar]:
        return finish(results[0]), finish(results[1])

    def pending(self: GPUScalar, node: Node, dtype: Any, size: int) -> GPUScalar:
        """A GPUScalar of this class holding ``node`` (of ``size`` nodes)."""
        scalar: GPUScalar = new(cls)
        scalar._array = None
        scalar._node = node
        scalar._dtype = dtype
        scalar._device = self._device
        scalar._used = False
        if size > max_nodes:
            _materialize(scalar)
        return scalar

    def make(name: str, reflected: bool) -> Any:
        ufunc = backend.ufunc(name)
        # (own dtype, other's dtype or Python type) -> (op, the other operand's loop type, the
        # other's leaf or constant key, result dtype, add); for two results (divmod), op and
        # result dtype are pairs
        loops: dict[tuple[Any, Any], tuple[Any, ...]] = {}
        foldable = name in ("add", "subtract") and not reflected
        pair = getattr(np, name).nout == 2

        def resolve(mine: np.dtype, other: Any) -> tuple[Any, ...]:
            is_scalar = isinstance(other, np.dtype)
            other_stand_in = other if is_scalar else promote.python_operand_stand_in(other(0))
            operands = (other_stand_in, mine) if reflected else (mine, other_stand_in)
            signature = promote.parity_signature(name, operands)
            op = expr.get_op("ufunc", name, signature[:2], signature[2:])
            other_loop = signature[0 if reflected else 1]
            other_key = expr.leaf_key(other) if is_scalar else expr.const_key(other_loop)
            if pair:
                ops = tuple(expr.get_op("ufunc", name, signature[:2], signature[2:], k)
                            for k in range(2))
                found = loops[(mine, other)] = (
                    ops, other_loop.type, other_key, signature[2:], None
                )
                return found
            # x + c and x - c with a Python int in an integer loop are both recorded as one
            # add of a wrapped constant, so a counter's step + 1 + 1 ... stays one node
            add = None
            if foldable and other is int and op.dtype.kind in "iu":
                add = expr.get_op("ufunc", "add", signature[:2], signature[2:])
            single: tuple[Any, ...] = (op, other_loop.type, other_key, op.dtype, add)
            loops[(mine, other)] = single
            return single

        def record(self: GPUScalar, op: expr.Op, dtype: np.dtype, other: Any, other_key: int,
                   other_size: int, op2: expr.Op | None = None,
                   dtype2: np.dtype | None = None) -> Any:
            """The pending result of ``op`` on this scalar and ``other`` (a node, leaf or
            constant of key ``other_key``); with ``op2`` (divmod's second result) a pair of
            nodes with the same children."""
            node = self._node
            if node is not None and self._used and node.size > keep_nodes:
                _materialize(self)  # used again: keep it rather than compute it twice
                node = None
            if node is None:
                mine, mine_key, size = self._array, leaf_keys[self._dtype], 1 + other_size
            else:
                self._used = True
                mine, mine_key, size = node, node.key, node.size + 1 + other_size
            if reflected:
                children, keys = (other, mine), (other_key, mine_key)
            else:
                children, keys = (mine, other), (mine_key, other_key)
            result = pending(self, make_node(op, children, keys, size), dtype, size)
            if op2 is None:
                return result
            return result, pending(self, make_node(op2, children, keys, size), dtype2, size)

        def record_pair(self: GPUScalar, ops: tuple[expr.Op, expr.Op],
                        dtypes: tuple[np.dtype, np.dtype], other: Any, other_key: int,
                        other_size: int) -> tuple[GPUScalar, GPUScalar]:
            """`record` for an op with two results (divmod)."""
            return record(self, ops[0], dtypes[0], other, other_key, other_size, ops[1],
                          dtypes[1])

        build, done = (record_pair, finish_pair) if pair else (record, finish)

        def operator(self: GPUScalar, other: Any) -> Any:
            kind = type(other)
            if kind is fast_class:
                if multi_device and other._device != self._device:
                    return _binary(self, other, name, reflected)  # rule 5: the device error
                if is_lazy():  # both GPUScalars of this class
                    mine = self._dtype
                    op, _, other_key, dtype, _ = (
                        loops.get((mine, other._dtype)) or resolve(mine, other._dtype))
                    if other._node is None:
                        return build(self, op, dtype, other._array, other_key, 0)
                    other_child = _child(other)
                    if other._node is None:  # kept (materialized) now: a leaf
                        return build(self, op, dtype, other_child, other_key, 0)
                    return build(self, op, dtype, other_child, other_child.key,
                                  other_child.size)
                other = other._array if other._array is not None else _materialize(other)
            elif kind not in real_python_types:
                return _binary(self, other, name, reflected)
            elif is_lazy():
                mine = self._dtype
                op, loop_type, other_key, dtype, add = (
                    loops.get((mine, kind)) or resolve(mine, kind))
                try:
                    if kind is int and not -_EXACT_INT <= other <= _EXACT_INT:
                        raise OverflowError  # see _EXACT_INT
                    constant = loop_type(other)
                except OverflowError:  # NumPy decides such cases eagerly (and may raise)
                    with expr.lazy(False):
                        return _binary(self, other, name, reflected)
                node = self._node
                if add is not None:  # exact in integer (modular) arithmetic
                    offset = other if op is add else -other
                    # fold into an add whose right operand is a constant (never a device
                    # leaf: reading one would be a hidden sync, and the key says "constant")
                    if node is not None and node.op is add \
                            and isinstance(node.children[1], np.generic) \
                            and not (self._used and node.size > keep_nodes):
                        first, previous = node.children
                        constant = _wrapped_int(offset + int(previous), dtype)
                        self._used = True
                        keys = (expr.child_key(first), other_key)
                        size = node.size
                        return pending(self, make_node(add, (first, constant), keys, size),
                                       dtype, size)
                    op, constant = add, _wrapped_int(offset, dtype)
                return build(self, op, dtype, constant, other_key, 0)
            mine_array = self._array if self._array is not None else _materialize(self)
            if counting():
                note_op()
            if out_ellipsis:
                if reflected:
                    return done(ufunc(other, mine_array, out=...))
                return done(ufunc(mine_array, other, out=...))
            return done(ufunc(other, mine_array) if reflected else ufunc(mine_array, other))

        return operator

    def make_unary(name: str) -> Any:
        ufunc = backend.ufunc(name)
        ops: dict[np.dtype, tuple[Any, ...]] = {}  # own dtype -> (op, leaf key, dtype)

        def resolve(mine: np.dtype) -> tuple[Any, ...]:
            signature = promote.parity_signature(name, (mine,))
            op = expr.get_op("ufunc", name, signature[:1], signature[1:])
            found = ops[mine] = (op, expr.leaf_key(mine), op.dtype)
            return found

        def operator(self: GPUScalar) -> Any:
            if is_lazy():
                op, mine_key, dtype = ops.get(self._dtype) or resolve(self._dtype)
                child = self._array if self._node is None else _child(self)
                if type(child) is Node:
                    mine_key, size = child.key, child.size + 1
                else:
                    size = 1
                return pending(self, make_node(op, (child,), (mine_key,), size), dtype, size)
            mine_array = self._array if self._array is not None else _materialize(self)
            if counting():
                note_op()
            # a real operand gives a real result for every unary operator
            return finish(ufunc(mine_array, out=...) if out_ellipsis else ufunc(mine_array))

        return operator

    for stem, ufunc_name in UNARY_OPERATORS.items():
        method = make_unary(ufunc_name)
        method.__name__ = method.__qualname__ = f"__{stem}__"
        setattr(cls, method.__name__, method)
    # the helpers (gs.sqrt(s), gs.minimum(s, t), ...) take the same hot paths, and so do other
    # elementwise ufuncs called through __array_ufunc__ (made on first use: `_fast_function`)
    helpers = set(UNARY_OPERATORS.values())  # others are made on first use
    cls._fast_unary = {name: make_unary(name) for name in helpers
                       if getattr(np, name).nin == 1 and getattr(np, name).nout == 1}
    cls._fast_binary = {name: make(name, False) for name in helpers
                        if getattr(np, name).nin == 2 and getattr(np, name).nout == 1}
    cls._fast_binary["divmod"] = make("divmod", False)
    cls._fast_rbinary = {name: make(name, True) for name in cls._fast_binary}
    cls._fast_makers = (make_unary, make)
    _FAST_TABLES[cls] = (cls._fast_unary, cls._fast_binary, cls._fast_rbinary)

    tables = [(BINARY_OPERATORS, ("", "r")), (COMPARISON_OPERATORS, ("",))]
    for table, prefixes in tables:
        for stem, ufunc_name in table.items():
            for prefix in prefixes:
                if ufunc_name == "power" and prefix == "":
                    continue  # pow(s, x, modulo) needs the base class's three-argument form
                method = make(ufunc_name, prefix == "r")
                method.__name__ = method.__qualname__ = f"__{prefix}{stem}__"
                setattr(cls, method.__name__, method)


def _fast_function(cls: Any, key: Any, nin: int, reflected: bool) -> Any:
    """The hot path of the real class ``cls`` for a ufunc (``key``: NumPy's name, or the NumPy
    ufunc itself) with ``nin`` operands (a GPUScalar first, or second when ``reflected``), made
    on first use; None where it has none: not NumPy's own elementwise ufunc of one output (two
    for a binary one), or not one the backend has (the general path decides)."""
    table = cls._fast_unary if nin == 1 else cls._fast_rbinary if reflected else cls._fast_binary
    function = table.get(key, _MISSING)
    if function is _MISSING:
        name = key if type(key) is str else getattr(key, "__name__", "")
        ufunc = getattr(np, name, None)
        function = None
        if not isinstance(ufunc, np.ufunc) or (ufunc is not key and name is not key):
            pass  # another library's ufunc of the same name, or none
        elif name in table:
            function = table[name]
        elif (ufunc.signature is None and ufunc.nin == nin
                and (ufunc.nout == 1 or (nin == 2 and ufunc.nout == 2))
                and getattr(cls._backend.xp, name, None) is not None):
            make_unary, make = cls._fast_makers
            function = table[name] = make_unary(name) if nin == 1 else make(name, reflected)
        table[key] = function
    return function


#: real GPUScalar class -> its hot paths (one-operand, binary, reflected binary): name -> function
_FAST_TABLES: dict[type, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}


def _call_fast(name: Any, operands: tuple[Any, ...]) -> Any:
    """``ufunc name(*operands)`` (``name``: NumPy's name or the NumPy ufunc) through a real
    GPUScalar class's hot path (the operators'), or `_MISSING` where none applies. One operand:
    it must be a real GPUScalar; two: either may be (the other anything: the hot path hands
    what it does not know to `_binary`)."""
    if len(operands) == 2:
        first, second = operands
        tables = _FAST_TABLES.get(type(first))
        if tables is not None:
            function = tables[1].get(name) or _fast_function(type(first), name, 2, False)
            return _MISSING if function is None else function(first, second)
        tables = _FAST_TABLES.get(type(second))
        if tables is not None:
            function = tables[2].get(name) or _fast_function(type(second), name, 2, True)
            return _MISSING if function is None else function(second, first)
        return _MISSING
    if len(operands) == 1:
        tables = _FAST_TABLES.get(type(operands[0]))
        if tables is not None:
            function = tables[0].get(name) or _fast_function(type(operands[0]), name, 1, False)
            return _MISSING if function is None else function(operands[0])
    return _MISSING


def _install_operators() -> None:
    for stem, ufunc_name in BINARY_OPERATORS.items():
        for dunder, reflected in ((f"__{stem}__", False), (f"__r{stem}__", True)):
            if dunder in GPUScalar.__dict__:
                continue
            method = _make_binary(ufunc_name, reflected)
            method.__name__ = method.__qualname__ = dunder
            setattr(GPUScalar, dunder, method)
    for stem, ufunc_name in COMPARISON_OPERATORS.items():
        method = _make_binary(ufunc_name, False)
        method.__name__ = method.__qualname__ = f"__{stem}__"
        setattr(GPUScalar, f"__{stem}__", method)
    for stem, ufunc_name in UNARY_OPERATORS.items():
        method = _make_unary(ufunc_name)
        method.__name__ = method.__qualname__ = f"__{stem}__"
        setattr(GPUScalar, f"__{stem}__", method)


_install_operators()
