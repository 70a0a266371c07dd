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

This module holds the scalar itself (the class, host reads and exports, the per-backend weak
and strong classes, pending scalars and their one constructor `_pending`, `asscalar`);
`gpuscalar.operators`, `.arrays` and `.math` build on it and install, each once at import, the
members of GPUScalar they own (its operators and their generator; the operators' array path;
the NumPy and CuPy entry points and ``clip``: see their ``install``), so this module imports none
of them and keeps no function of theirs. `gpuscalar.reads` answers a pending scalar's host read
and `gpuscalar.known` keeps the values read. All internal access to the wrapped array goes
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
from operator import index as operator_index
from typing import TYPE_CHECKING, Any, Protocol, overload

import numpy as np

from . import known, ledger, promote, reads, sync
from .backend import Backend
from .devices import HOST, backend_of, get_backend
from .lazy import expr, fusion
from .lazy.expr import SIZE, Node, make_node

__all__ = [
    "GPUScalar",
    "asscalar",
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


class _Pow(Protocol):
    """``s ** x`` and ``pow(s, x)`` (a modulus raises TypeError)."""

    @overload
    def __call__(self, other: GPUScalar | float, modulo: None = None, /) -> GPUScalar: ...
    @overload
    def __call__(self, other: Any, modulo: Any = None, /) -> Any: ...


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
    # _host: the host value once known (`_UNREAD` until then; see gpuscalar.known).
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
    _classes: dict[str, type]  # the backend's weak concrete classes by dtype kind (idem)
    _strong: dict[str, type]  # its strong ones (`_classes_for`)
    _is_strong: bool  # whether this class is strong (idem)
    __array_priority__ = 1000  # above cupy.ndarray's: its binary operators defer to ours
    __hash__ = None  # type: ignore[assignment]

    def __new__(cls, array: Any) -> GPUScalar:
        backend = backend_of(array)
        fresh = False
        if backend is None:
            if isinstance(array, np.generic):
                array, backend, fresh = np.asarray(array), HOST, True
            elif cls is not GPUScalar and isinstance(array, (numbers.Rational, numbers.Real)) \
                    and type(array) not in promote.PYTHON_SCALAR_TYPES:
                # a concrete class called with a Fraction or Decimal: `statistics` converts its
                # exact result back to the type of its data (``T(value)``), as for a float
                backend = cls._backend
                return _wrap(backend, _make_array(backend, float(array), np.dtype(np.float64),
                                                  None))
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
        if not fresh:  # a value, like float(a): a later write to ``a`` must not change it
            array = backend.call(backend.xp.copy, array)
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

    shape, ndim, size = (), 0, 1

    # Installed at import by the modules that own them (this module imports none of them):
    # the operators, from the tables above, and their per-backend generator
    # (`gpuscalar.operators.install`); the operators' array path (`gpuscalar.arrays.install`);
    # the NumPy and CuPy entry points and ``clip`` (`gpuscalar.math.install`). Their static
    # types are declared here; tests keep both equal.
    if TYPE_CHECKING:
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
        __pow__: _Pow

        def conjugate(self) -> GPUScalar: ...
        def clip(self, min: Any = None, max: Any = None,  # noqa: A002
                 out: Any = None) -> Any: ...
        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any: ...
        def __cupy_override_elementwise_kernel__(self, kernel: Any, *args: Any,
                                                 **kwargs: Any) -> Any: ...
        @classmethod
        def _generate_operators(cls, backend: Backend) -> None: ...
        @staticmethod
        def _array_call(name: str, operands: tuple[Any, ...], out: Any) -> Any: ...
        @staticmethod
        def _apply_ufunc(name: str, *operands: Any, numpy_call: bool = True,
                         **kwargs: Any) -> Any: ...

    # ---- host reads: each at most one counted transfer, then cached ----------------------
    def _host_value(self, reason: str) -> Any:
        host = self._host
        if host is not _UNREAD:
            return host
        array = self._array
        if array is None:
            host = reads.read_pending(self, reason)
        else:
            entry = _KNOWN.get(id(array))  # (gpuscalar.known, inlined: this is every read)
            if entry is not None and entry[0]() is array:
                host = entry[1]
            else:  # read (and then known: its array is gpuscalar's own, never written)
                host = sync.to_host(self._backend, array, reason)
                _remember(array, host)
        self._host = host
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
        if dtype is None:  # as NumPy converts the number it replaces (np.array([s, t]))
            dtype = self._dtype if self._is_strong else promote.PYTHON_DTYPES[self._dtype.kind]
        if _asks_dtype_only():  # cupy.full(shape, s): only the dtype is used, see there
            return np.zeros((), dtype)
        return np.asarray(self._host_value("__array__"), dtype=dtype)

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

    def __round__(self, ndigits: int | None = None) -> GPUScalar:
        """As Python's ``round`` of the number this scalar replaces: an int64 GPUScalar without
        ``ndigits`` (half to even), else a float64 one for a float (an int64 for an int); no
        sync. A complex one raises, as Python's complex does."""
        kind = self._dtype.kind
        if kind == "c":
            raise TypeError("round() of a complex GPUScalar: a Python complex has no __round__ "
                            "(the float path raises too)")
        decimals = 0 if ndigits is None else operator_index(ndigits)
        found = _ROUND_OPS.get((self._dtype, ndigits is None, decimals), _MISSING)
        if found is _MISSING:
            found = _resolve_round(self._dtype, ndigits is None, decimals)
        ops, dtype = found
        node: Any = self._array if self._node is None else _child(self)
        for op in ops:
            node = make_node(op, (node,))
        result = _pending(self._classes[dtype.kind], node, dtype, self._device)
        if kind != "f" and decimals < 0:  # an int to tens, hundreds...: as NumPy (eagerly)
            backend = self._backend
            return _wrap(backend, backend.call(backend.xp.round, _array_of(result), decimals))
        if not expr.is_lazy():
            _materialize(result)
        return result

    def as_integer_ratio(self) -> tuple[int, int]:
        """The exact ratio of the value (a read, as ``float.as_integer_ratio`` needs the
        value): what ``statistics`` and ``fractions.Fraction`` ask a number for."""
        return self._host_value("as_integer_ratio").as_integer_ratio()


#: (dtype, no ndigits, decimals) -> (the ops ``round`` applies in turn, the result dtype): a
#: float is rounded in float64 (the Python float it replaces), then made an int64 where Python
#: gives an int (no ndigits); an int or bool is the int64 it stands for.
_ROUND_OPS: dict[tuple[np.dtype, bool, int], Any] = {}
_FLOAT64, _INT64 = np.dtype(np.float64), np.dtype(np.int64)


def to_int64_op() -> expr.Op:
    """The op converting a real value to int64 where Python gives an int (``round(x)``,
    ``math.floor(x)``): ``positive`` on the int64 loop, the conversion being its input cast
    (truncating, as a C cast and NumPy's unsafe cast; exact on the integral values it gets)."""
    return expr.get_op("ufunc", "positive", (_INT64,), (_INT64,))


def _resolve_round(dtype: np.dtype, to_int: bool, decimals: int) -> Any:
    if dtype.kind == "f":
        ops = [expr.get_op("round", "round", (_FLOAT64,), (_FLOAT64,), 0, decimals)]
        if to_int:
            ops.append(to_int64_op())
        found = (tuple(ops), _INT64 if to_int else _FLOAT64)
    else:
        found = ((to_int64_op(),), _INT64)
    _ROUND_OPS[(dtype, to_int, decimals)] = found
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
    """The concrete (weak) classes for ``backend``, by dtype kind; their ``_strong`` attribute
    holds the strong ones.

    Each backend gets its own classes with the backend as a class attribute, so that
    ``type(a) is type(b)`` is the whole "same backend, both real, same strength" test on the
    fast path, and its dunders can be generated with that backend's ufuncs already bound.
    *Weak* scalars stand for a Python number (``float(x.sum())``, ``s * 2.0``), *strong* ones
    for the NumPy scalar the float path holds where NumPy made it (``np.sqrt(s)``, ``s *
    np.float32(2)``): in an array operation a strong float64 promotes a float32 array, as an
    ``np.float64`` does (`promote.scalar_stand_in`). Made under a lock (once per backend, first
    use only): threads that start together must share them.
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
        made = {}
        for strong in (False, True):
            real = type("GPUScalar", (_RealGPUScalar,), {**namespace, "_is_strong": strong})
            complex_ = type("GPUScalar", (GPUScalar,), {**namespace, "_is_strong": strong})
            real.__module__ = complex_.__module__ = __name__
            made[strong] = {**{kind: real for kind in "biuf"}, "c": complex_}
        weak, strong_classes = made[False], made[True]
        for kind_classes in (weak, strong_classes):
            for cls in (kind_classes["f"], kind_classes["c"]):
                cls._classes, cls._strong = weak, strong_classes  # type: ignore[attr-defined]
        for kind_classes in (weak, strong_classes):
            _install_fast_operators(kind_classes["f"], backend)
            _SCALAR_CLASSES.update((kind_classes["f"], kind_classes["c"]))
        classes = weak
        backend._scalar_classes = classes  # type: ignore[attr-defined]
    return classes


_CLASSES_LOCK = threading.Lock()


def _install_fast_operators(cls: Any, backend: Backend) -> None:
    """Give the real per-backend class ``cls`` its hot operators, with ``backend``'s ufuncs
    bound: made by the operator generator that `gpuscalar.operators.install` registered on
    GPUScalar (``_generate_operators``)."""
    cls._generate_operators(backend)


def _wrap(backend: Backend, result: Any) -> GPUScalar:
    """Private fast constructor for internal results (already validated)."""
    if type(result) is not np.ndarray and isinstance(result, np.generic):
        result = np.asarray(result)
    classes = backend.__dict__.get("_scalar_classes") or _classes_for(backend)
    dtype = result.dtype
    scalar = object.__new__(classes[dtype.kind])
    scalar._array = result
    scalar._host = _UNREAD
    scalar._node = None
    scalar._dtype = dtype
    scalar._device = backend.device_of(result) if backend.multi_device else "cpu"
    return scalar


def _pending(cls: type, node: Node, dtype: np.dtype, device: object) -> GPUScalar:
    """A GPUScalar of class ``cls`` (one of `_classes_for`'s) holding the expression ``node``
    (materialized at once past the size bound): the one constructor of pending scalars. The
    operators' hot paths write its body out (`gpuscalar.operators._install_fast_operators`
    says why; a test keeps them making the same object)."""
    scalar: GPUScalar = _new_object(cls)
    scalar._array, scalar._used, scalar._host = None, False, _UNREAD
    scalar._node, scalar._dtype, scalar._device = node, dtype, device
    if node[SIZE] > _MAX_NODES:
        _materialize(scalar)
    return scalar


_new_object, _MAX_NODES = object.__new__, expr.MAX_NODES


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
    host = scalar._host
    if host is _UNREAD:  # built from known values only: known too (as on the float path)
        host = scalar._host = reads.known_result(node)
    if host is not _UNREAD:
        _remember(array, host)
    return array


_UNREAD, _KNOWN, _remember = known.UNREAD, known._KNOWN, known.remember


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
    """Whether CuPy's ``full(shape, s)`` called ``__array__``: it only takes the dtype, then
    copies the 0-d device array with ``copyto`` (no sync), so no host read is needed. (CuPy
    14's ``full`` is Python: its frame is the caller of the C ``numpy.array``.)"""
    if not _DTYPE_ONLY_CALLERS:
        cupy = sys.modules.get("cupy")
        full = getattr(getattr(getattr(cupy, "_creation", None), "basic", None), "full", None)
        if full is None:
            return False
        _DTYPE_ONLY_CALLERS.append(full.__code__)
    caller = sys._getframe(1).f_back  # (None when __array__ was called from C at the top)
    return caller is not None and caller.f_code in _DTYPE_ONLY_CALLERS


_MISSING = object()  # "not found" in the tables of this module and those building on it


def _unpickle(backend_name: str, dtype: str, value: Any) -> GPUScalar:
    backend = get_backend(backend_name)
    return _wrap(backend, _make_array(backend, value, np.dtype(dtype), None))


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
        if source_backend.host_memory:
            source_backend = None  # host data: may be uploaded to any backend
        host_value, natural = value, value.dtype
    target_dtype = natural if dtype is None else np.dtype(dtype)
    if target_dtype.kind not in promote.SUPPORTED_KINDS:
        raise TypeError(f"asscalar() supports bool, integer, floating and complex dtypes, "
                        f"got {target_dtype}")
    if backend is None:
        backend = source_backend or HOST
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
    if backend.host_memory:
        return backend.call(np.asarray, value, dtype=dtype)
    args: tuple[Any, ...]
    kwargs = {"dtype": dtype}
    if backend.owns(value):  # a device array: copied (a value: see GPUScalar) on the device
        make, args = backend.xp.asarray, (value,)
        if value.dtype == dtype:  # asarray would hand back the array itself
            make, kwargs = backend.xp.copy, {}
    else:
        make, args = backend.xp.full, ((), np.asarray(value, dtype=dtype)[()])
    if backend.multi_device and device is not None:
        with backend.device_context(device):
            return backend.call(make, *args, **kwargs)
    return backend.call(make, *args, **kwargs)


