"""The CuPy-strict CPU device: a stand-in for a CUDA device, made of NumPy arrays.

Why this module exists: CI has no GPU, and NumPy arrays forgive what CuPy arrays refuse. A real
H100 run of gpuscalar 0.1.0 failed 17 tests that CPU CI had passed, all for one reason: code that
turned device arrays into host arrays implicitly (``np.asarray(x)``, ``pytest.approx(x)``,
``np.testing.assert_allclose(x, ...)``), which CuPy refuses. An ``ndarray`` subclass can never
refuse that, so this device is a *duck* array over NumPy (NEP 13 ``__array_ufunc__`` and NEP 18
``__array_function__``; `NDArrayOperatorsMixin` supplies the operators) that behaves as CuPy does
where it matters:

- implicit host conversion (``__array__``, so ``np.asarray`` and everything built on it) is a
  ``TypeError`` with CuPy's message, and so is mixing a host NumPy array into a device operation;
- explicit transfers and scalar reads (``get()``, ``item()``, ``tolist()``, ``float()``,
  ``int()``, ``bool()``, ``complex()``, ``repr``/``str``/``format``, boolean-mask indexing,
  ``nonzero``, ``asnumpy``) are syncs, declared exactly as CuPy declares its own: seen by
  ``count_syncs(include_cupy=True)`` (reason ``"cupy"``) and stopped there by ``sync_guard``;
- reductions return 0-d arrays, never Python scalars;
- every array lives on a device (an int id, ``device(n)`` selects the current one as
  ``cupy.cuda.Device(n)`` does); operands on different devices are a ``ValueError``;
- every array-library call (ufunc, reduction, namespace function, copy, non-view indexing,
  assignment) is one device op in ``count_syncs().device_ops``, as a kernel launch would be;
  calls nested inside one (NumPy's implementation calling NumPy) are not counted again;
- CuPy's rules for a GPUScalar handed to CuPy: ``x.fill(s)`` (and a 0-d array) is a declared
  sync (CuPy reads ``s == 0`` back), ``clip`` and ``where`` with a GPUScalar operand follow the
  GPUScalar's promotion rules (CuPy's kernels call its hook);
- assigning a host array through a plain index (``x[...] = host``) is CuPy's ``ValueError``
  (CuPy fills from scalars only); upload with ``x.set(host)`` or ``xp.asarray(host)``;
- launch counts that depend on more than the call, as CuPy 14's source has them: assigning an
  array onto itself (``x[...] = x``, and the store-back of ``x[...] -= v``) launches nothing;
  ``xp.linalg.norm`` counts the kernels ``cupy.linalg.norm`` launches (three for the 2-norm of
  a vector: square, sum, sqrt; one for a 2-norm over given axes);
- inside a body (a `gs.while_loop`/`gs.cond` body or a `gs.capture` step:
  `gpuscalar.sync.in_graph_body`), what CuPy refuses while its stream captures
  (`gpuscalar.devices.strict.capture`, from CuPy 14's source): a host-to-device copy (``xp.asarray``
  of host data of 1 or more dimensions, ``x.set(host)``, host index arrays, a join of more
  than 8 inputs through a host-built pointer table) is a ``RuntimeError`` with CuPy's words,
  `H2D_CAPTURE_MESSAGE`; cuBLAS (matrix products of floating arrays), cuSOLVER
  (``xp.linalg.solve``, ``eigh``, ``inv`` ...), cuRAND (``xp.random.*``, generator draws) and
  cuSPARSE (`gpuscalar.devices.strict.sparse`) are CuPy's ``NotImplementedError`` with the gpuscalar
  call to use instead. A 0-d array made from a Python number is allowed there, as in CuPy;
- boolean-mask indexing and assignment (``x[mask]``, ``x[mask] = v``) are syncs, as CuPy 14
  reads the mask's count back; namedtuple results (``linalg.eigh``, ``svd``, ``qr``,
  ``slogdet``) hold strict arrays;
- ``xp.random.default_rng`` is CuPy's, drawing strict arrays (`gpuscalar.devices.strict.random`).

One implementation serves three purposes: the tests (the ``xp`` fixture runs every
backend-parametrized test on it), promotion rules 4 and 5 (several devices), and the counts of
``gpuscalar bench`` (both paths of every workload run on it, so the float path's
``float(x.sum())``, which never passes through gpuscalar, is counted by the same rule).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ... import sync
from ...backend import CUPY_UFUNC_KEYWORDS, SCALAR_FUNCTIONS, Backend, refuse_ufunc_keywords
from ...known import INCOMING, arrive
from . import capture, loops
from .capture import (
    CUBLAS_CAPTURE_MESSAGE,
    CURAND_CAPTURE_MESSAGE,
    CUSOLVER_CAPTURE_MESSAGE,
    CUSPARSE_CAPTURE_MESSAGE,
    H2D_CAPTURE_MESSAGE,
)
from .random import Generator, default_rng_on

__all__ = ["StrictArray", "StrictBackend", "STRICT", "Device", "xp", "device", "IMPLICIT_MESSAGE",
           "H2D_CAPTURE_MESSAGE", "CUBLAS_CAPTURE_MESSAGE", "CUSOLVER_CAPTURE_MESSAGE",
           "CURAND_CAPTURE_MESSAGE", "CUSPARSE_CAPTURE_MESSAGE", "FILL_MESSAGE"]

#: CuPy's words when something asks for a host array implicitly.
IMPLICIT_MESSAGE = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
    "NumPy array explicitly."
)
#: CuPy's words (a ValueError from ``ndarray.fill``) for ``x[...] = host_array``.
FILL_MESSAGE = "non-scalar numpy.ndarray cannot be used for fill"

_current_device: ContextVar[int] = ContextVar("gpuscalar_strict_device", default=0)


@contextlib.contextmanager
def device(device_id: int) -> Iterator[Device]:
    """Make ``device_id`` the current strict device for the block (``cupy.cuda.Device(n)``)."""
    token = _current_device.set(_checked_device_id(device_id))
    try:
        yield Device(device_id)
    finally:
        _current_device.reset(token)


def _checked_device_id(device_id: Any) -> int:
    if type(device_id) is not int or device_id < 0:
        raise ValueError(f"a strict device id is an int >= 0, got {sync.describe(device_id)}")
    return device_id


@dataclass(frozen=True)
class Device:
    """A strict device, as ``cupy.cuda.Device``: ``.id`` is the device number."""

    id: int

    def __repr__(self) -> str:
        return f"<strict device {self.id}>"


_DeviceWork = sync.one_device_op  # one array-library call: one device op, nested ones free


def _declare_sync() -> None:
    """A read by the device itself (not through gpuscalar): declared as CuPy declares its own,
    unless NumPy's implementation is reading inside a device op (no transfer there). In a body
    (a loop, branch or captured step, which the host executor runs inside the one device op
    the loop counts as) it is always declared: there it is a sync the GPU would refuse."""
    if not sync.inside_device_op() or sync.in_graph_body():
        sync.declare_library_sync()


# ---- moving between NumPy data and strict arrays ---------------------------------------------


def _wrap(data: Any, device_id: int) -> StrictArray:
    array = object.__new__(StrictArray)
    array._data = data
    array._device = device_id
    return array


def _lift(value: Any, device_id: int) -> Any:
    """NumPy results as strict arrays on ``device_id``: 0-d results stay arrays, as on a GPU."""
    if type(value) is np.ndarray:
        return _wrap(value, device_id)
    if isinstance(value, np.generic):
        return _wrap(np.asarray(value), device_id)
    if type(value) is tuple:
        return tuple(_lift(v, device_id) for v in value)
    if type(value) is list:
        return [_lift(v, device_id) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # linalg.eigh's, svd's ...
        return type(value)(*(_lift(v, device_id) for v in value))
    return value


class _Operands:
    """Unwraps the operands of one call and checks that they can meet on one device."""

    __slots__ = ("device",)

    def __init__(self) -> None:
        self.device: int | None = None

    def unwrap(self, value: Any) -> Any:
        kind = type(value)
        if kind is StrictArray:
            self._meet(value._device)
            return value._data
        if kind is tuple or kind is list:
            return kind(self.unwrap(v) for v in value)
        if kind is dict:
            return {k: self.unwrap(v) for k, v in value.items()}
        if kind is np.ndarray:
            raise TypeError(
                f"Unsupported type {kind}: a host NumPy array cannot be an operand of a "
                "strict-device operation (CuPy refuses it too); move it with xp.asarray()"
            )
        if getattr(value, "_backend", None) is STRICT:  # a GPUScalar of this device
            array = value.array
            self._meet(array._device)
            return array._data
        return value

    def _meet(self, device_id: int) -> None:
        if self.device is None:
            self.device = device_id
        elif device_id != self.device:
            raise ValueError(
                f"operands are on different strict devices ({self.device} and {device_id}); "
                "move one explicitly"
            )

    def result_device(self) -> int:
        return _current_device.get() if self.device is None else self.device


def _call(function: Callable[..., Any], args: tuple, kwargs: dict, count: bool = True) -> Any:
    operands = _Operands()
    raw_args = operands.unwrap(args)
    raw_kwargs = operands.unwrap(kwargs)
    rule = _LIBRARY_RULES.get(function)
    if rule is not None and sync.in_graph_body():  # what CuPy refuses while capturing
        rule(function, raw_args, raw_kwargs)
    loops.refuse_array_call(function, raw_args)  # a loop CuPy lacks (logical_not of c)
    with _DeviceWork(count):
        result = function(*raw_args, **raw_kwargs)
    return _lift(result, operands.result_device())


_LIBRARY_RULES = capture.LIBRARY_RULES
_refuse_upload_in_graph_body = capture.refuse_upload


def _draw(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """A random draw (`gpuscalar.devices.strict.random`): a strict array, 0-d for a number, as
    CuPy's."""
    return _call(lambda *raw, **named: np.asarray(function(*raw, **named)), args, kwargs)


def _refuse_implicit(*_: Any, **__: Any) -> Any:
    raise TypeError(IMPLICIT_MESSAGE)


def _device_index(key: Any) -> Any:
    """An advanced index with its host arrays and lists uploaded, as CuPy uploads them
    (``x[[0, 2]]``; refused in a captured step's body, as in CuPy while capturing)."""
    single = type(key) is not tuple
    parts = (key,) if single else key
    if not any(type(p) is list or type(p) is np.ndarray for p in parts):
        return key
    uploaded = tuple(asarray(p) if type(p) is list or type(p) is np.ndarray else p
                     for p in parts)
    return uploaded[0] if single else uploaded


# ---- the array -------------------------------------------------------------------------------


def _counted_method(name: str) -> Callable[..., Any]:
    def method(self: StrictArray, *args: Any, **kwargs: Any) -> Any:
        return _call(getattr(np.ndarray, name), (self, *args), kwargs)

    method.__name__ = name
    return method


def _view_method(name: str) -> Callable[..., Any]:
    def method(self: StrictArray, *args: Any, **kwargs: Any) -> Any:
        return _wrap(getattr(self._data, name)(*args, **kwargs), self._device)

    method.__name__ = name
    return method


def _basic_index(key: Any) -> bool:
    parts = key if type(key) is tuple else (key,)
    return all(
        part is None or part is Ellipsis or type(part) in (int, slice)
        or isinstance(part, np.integer)
        for part in parts
    )


def _as_view_key(key: Any) -> tuple:
    """A basic index that makes NumPy return a view, a 0-d one included (never a scalar copy)."""
    parts = key if type(key) is tuple else (key,)
    return parts if Ellipsis in parts else (*parts, Ellipsis)


def _is_view(value: Any, target: np.ndarray) -> bool:
    """Whether assigning the device value ``value`` to the view ``target`` is the assignment
    CuPy 14 skips: ``_scatter_op`` (cupy/_core/_routines_indexing.pyx) returns without a launch
    when the value, its leading unit dimensions squeezed, has the target view's address, shape
    and strides. That is the assign-back of ``a[...] += v`` (Python stores the view it updated)
    and ``x[...] = x``. A pending GPUScalar is new memory once evaluated: never the target."""
    if type(value) is StrictArray:
        data = value._data
    elif getattr(value, "_backend", None) is STRICT and value.is_materialized:
        data = value.array._data
    else:
        return False
    lead = 0
    while lead < data.ndim and data.shape[lead] == 1:
        lead += 1
    return (data.shape[lead:] == target.shape and data.strides[lead:] == target.strides
            and _address(data) == _address(target))


def _address(data: np.ndarray) -> int:
    return data.__array_interface__["data"][0]


class StrictArray(NDArrayOperatorsMixin):
    """An array on a strict device: NumPy data that only leaves through a counted sync.

    Make one with ``gpuscalar.strict.xp.asarray(...)`` (or any creation function of ``xp``).
    """

    # __weakref__: as cupy.ndarray, a strict array can be weakly referenced (gpuscalar.known)
    __slots__ = ("_data", "_device", "__weakref__")
    _data: np.ndarray
    _device: int
    __array_priority__ = 100  # as cupy.ndarray: below GPUScalar's, above NumPy's

    def __new__(cls, *args: Any, **kwargs: Any) -> StrictArray:
        raise TypeError("make strict arrays with gpuscalar.strict.xp.asarray() (or zeros, ...)")

    # ---- metadata (no device work) -------------------------------------------------------
    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    itemsize = property(lambda self: self._data.itemsize)
    nbytes = property(lambda self: self._data.nbytes)
    strides = property(lambda self: self._data.strides)
    flags = property(lambda self: self._data.flags)
    T = property(lambda self: _wrap(self._data.T, self._device))
    real = property(lambda self: _wrap(self._data.real, self._device))
    imag = property(lambda self: _wrap(self._data.imag, self._device))

    @property
    def device(self) -> Device:
        return Device(self._device)

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[StrictArray]:
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (_wrap(self._data[i, ...], self._device) for i in range(len(self._data)))

    # ---- host transfers: each a declared sync --------------------------------------------
    __array__ = _refuse_implicit

    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        """Copy to the host explicitly, as ``cupy.ndarray.get()`` (a sync)."""
        _declare_sync()
        if out is not None:
            np.copyto(out, self._data)
            return out
        return self._data.copy()

    def item(self, *args: Any) -> Any:
        _declare_sync()
        return self._data.item(*args)

    def tolist(self) -> Any:
        _declare_sync()
        return self._data.tolist()

    def _scalar_read(self, convert: Callable[[Any], Any]) -> Any:
        if self._data.size != 1:
            raise TypeError(
                f"only size-1 arrays can be converted to Python scalars, got shape {self.shape}"
            )
        _declare_sync()
        return convert(self._data.reshape(()).item())

    def __float__(self) -> float:
        return self._scalar_read(float)

    def __int__(self) -> int:
        return self._scalar_read(int)

    def __complex__(self) -> complex:
        return self._scalar_read(complex)

    def __index__(self) -> int:
        if self._data.dtype.kind not in "biu":
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        return self._scalar_read(int)

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise ValueError(
                "The truth value of an array with more than one element is ambiguous."
            )
        return self._scalar_read(bool)

    def __format__(self, spec: str) -> str:
        _declare_sync()
        return format(self._data.item() if self._data.ndim == 0 else self._data, spec)

    def __repr__(self) -> str:
        _declare_sync()
        inner = repr(self._data).removeprefix("array(").removesuffix(")")
        return f"strict_array({inner}, device={self._device})"

    def __str__(self) -> str:
        _declare_sync()
        return str(self._data)

    def __reduce__(self) -> Any:
        _declare_sync()
        return (_unpickle, (self._data.copy(), self._device))

    # ---- interop without a transfer -------------------------------------------------------
    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._data.__dlpack_device__()

    # ---- device operations ----------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        everything = inputs + (out if type(out) is tuple else (out,))
        for value in everything:
            kind = type(value)
            if kind is not StrictArray and hasattr(value, "__array_ufunc__") and (
                kind is not np.ndarray
            ):
                return NotImplemented  # a GPUScalar (its promotion rules call us back) or other
        if method == "__call__":
            refuse_ufunc_keywords(STRICT, kwargs)
        result = _call(ufunc if method == "__call__" else getattr(ufunc, method), inputs, kwargs)
        if out is not None:
            return out[0] if type(out) is tuple and len(out) == 1 else out
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        for kind in types:
            if kind is not StrictArray and kind is not np.ndarray:
                return NotImplemented
        routed = _gpuscalar_route(getattr(func, "__name__", ""), args, kwargs)
        if routed is not None:
            return routed(*args, **kwargs)
        return _call(func, args, kwargs, count=func not in _METADATA_FUNCTIONS)

    def __getitem__(self, key: Any) -> Any:
        if _basic_index(key):  # a view, as on the GPU: no device work
            return _wrap(self._data[_as_view_key(key)], self._device)
        key = _device_index(key)
        parts = key if type(key) is tuple else (key,)
        if any(type(p) is StrictArray and p.dtype == np.bool_ for p in parts):
            _declare_sync()  # CuPy reads the mask's count back to size the result
        return _call(np.ndarray.__getitem__, (self, key), {})

    def __setitem__(self, key: Any, value: Any) -> None:
        device_value = type(value) is StrictArray or hasattr(value, "_backend")  # a GPUScalar
        if _basic_index(key):
            if not device_value and np.ndim(value) != 0:
                # CuPy fills a view from a scalar only: host data must be uploaded explicitly
                raise ValueError(f"{FILL_MESSAGE} (upload host data with x.set(host) or "
                                 "xp.asarray(host) first)")
            if device_value and _is_view(value, self._data[_as_view_key(key)]):
                return  # CuPy skips copying an array onto itself: no device work
        else:
            key = _device_index(key)
            if any(type(p) is StrictArray and p.dtype == np.bool_
                   for p in (key if type(key) is tuple else (key,))):
                _declare_sync()  # CuPy reads the mask's count back (_prepare_mask_indexing)
            if not device_value and np.ndim(value) != 0:
                value = xp.asarray(value)  # CuPy uploads host data for an advanced index
        _call(np.ndarray.__setitem__, (self, key, value), {})

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Copy the NumPy array ``arr`` into this array, as ``cupy.ndarray.set`` (an upload: one
        device op; refused inside a captured step's body, as CuPy refuses it while capturing)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._data.flags.c_contiguous or self._data.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        _refuse_upload_in_graph_body()
        with _DeviceWork():
            np.copyto(self._data, arr)

    def fill(self, value: Any) -> None:
        """``ndarray.fill``: one device op. With a device value (a 0-d array, a GPUScalar),
        CuPy 14 also compares ``value == 0`` and reads the answer back to choose a memset (a
        sync, declared as CuPy's); ``x[...] = value`` and ``xp.copyto(x, value)`` do not."""
        if type(value) is StrictArray or getattr(value, "_backend", None) is STRICT:
            _declare_sync()
        _call(np.ndarray.fill, (self, value), {})

    def clip(self, *args: Any, **kwargs: Any) -> Any:
        """``ndarray.clip``: one device op; with a GPUScalar bound, the GPUScalar's rules (the
        bound acts as the Python scalar it replaces), as CuPy's clip kernel hands it over."""
        routed = _gpuscalar_route("clip", args, kwargs)
        if routed is not None:
            return routed(self, *args, **kwargs)
        return _call(np.ndarray.clip, (self, *args), kwargs)

    def nonzero(self) -> tuple[StrictArray, ...]:
        _declare_sync()  # the result's size is read back, as in CuPy
        return _call(np.ndarray.nonzero, (self,), {})


#: Methods that run device work (a reduction, a copy, a sort): one device op each.
_COUNTED_METHODS = ("sum", "mean", "prod", "max", "min", "any", "all", "var", "std", "argmax",
                    "argmin", "cumsum", "cumprod", "dot", "copy", "astype",
                    "round", "conj", "flatten", "repeat", "take", "trace", "ptp", "sort",
                    "argsort")
#: Methods that make views: no device work.
_VIEW_METHODS = ("reshape", "ravel", "transpose", "squeeze", "swapaxes", "view", "diagonal")
for _name in _COUNTED_METHODS:
    setattr(StrictArray, _name, _counted_method(_name))
for _name in _VIEW_METHODS:
    setattr(StrictArray, _name, _view_method(_name))
del _name


def _unpickle(data: np.ndarray, device_id: int) -> StrictArray:
    with _DeviceWork():
        return _wrap(data, device_id)


#: NumPy functions that only look at metadata or make views: no device work on a GPU either.
_METADATA_FUNCTIONS = frozenset({
    np.shape, np.ndim, np.size, np.result_type, np.can_cast, np.reshape, np.ravel,
    np.transpose, np.squeeze, np.expand_dims, np.broadcast_to, np.swapaxes, np.moveaxis,
    np.atleast_1d, np.atleast_2d, np.atleast_3d, np.iscomplexobj, np.isrealobj,
})

#: Namespace functions whose result size depends on data: CuPy reads a count back (a sync).
_SYNCING_FUNCTIONS = frozenset({"nonzero", "argwhere", "flatnonzero", "unique", "extract",
                                "compress"})

def _gpuscalar_route(name: str, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """GPUScalar's own function for ``clip`` or ``where`` called with a GPUScalar operand (else
    None). CuPy implements both as elementwise kernels that hand a GPUScalar operand to its
    ``__cupy_override_elementwise_kernel__`` hook, which applies the promotion rules (the
    scalar acts as the Python number it replaces); NumPy would unwrap it as a strong 0-d array.
    `gpuscalar.math` puts both in `SCALAR_FUNCTIONS` (math is above the registry, which imports
    this module: importing math here would close a circle)."""
    if name not in ("clip", "where") or not any(
            getattr(a, "_backend", None) is STRICT for a in (*args, *kwargs.values())):
        return None
    return SCALAR_FUNCTIONS[name]


# ---- the namespace (``xp``) ------------------------------------------------------------------


class _Ufunc:
    """A NumPy ufunc in the strict namespace: dispatches to the arrays, or makes a 0-d array on
    the current device from scalars (``xp.sqrt(2.0)``, as ``cupy.sqrt(2.0)``)."""

    __slots__ = ("_ufunc",)

    def __init__(self, ufunc: np.ufunc) -> None:
        self._ufunc = ufunc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(getattr(a, "_backend", None) is not None for a in args):
            return self._ufunc(*args, **kwargs)  # a GPUScalar: its __array_ufunc__ decides
        return _call(self._ufunc, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ufunc, name)

    def __repr__(self) -> str:
        return f"<strict ufunc {self._ufunc.__name__!r}>"


class _QuietUfunc(_Ufunc):
    """For gpuscalar's own hot path, which counts its device op itself."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._ufunc, args, kwargs, count=False)


class _Namespace:
    """``xp`` for the strict device: NumPy's functions, with arrays made and kept on it."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if isinstance(value, ModuleType):
            found: Any = _Namespace(value)
        elif isinstance(value, np.ufunc):
            found = _Ufunc(value)
        elif isinstance(value, type) or not callable(value):
            found = value  # dtypes, constants, newaxis
        else:
            found = _namespace_function(name, value, drawn=self._module is np.random)
        self.__dict__[name] = found
        return found

    def __repr__(self) -> str:
        return f"<gpuscalar strict namespace over {self._module.__name__}>"


def _namespace_function(name: str, function: Callable[..., Any], drawn: bool = False
                        ) -> Callable[..., Any]:
    syncs = name in _SYNCING_FUNCTIONS

    def strict_function(*args: Any, device: int | None = None, **kwargs: Any) -> Any:
        if drawn:  # xp.random.*: cuRAND in CuPy, refused in a body
            capture.refuse_curand(name)
        if syncs:
            _declare_sync()
        routed = _gpuscalar_route(name, args, kwargs)
        if routed is not None:
            return routed(*args, **kwargs)
        if device is None:
            return _call(function, args, kwargs)
        token = _current_device.set(_checked_device_id(device))
        try:
            return _call(function, args, kwargs)
        finally:
            _current_device.reset(token)

    strict_function.__name__ = name
    strict_function.__doc__ = f"``numpy.{name}`` on the strict device (one device op)."
    return strict_function


def asarray(value: Any, dtype: Any = None, *, device: int | None = None, copy: Any = None) -> Any:
    """A strict array from host data (an upload, one device op) or another strict array (the
    same object when nothing changes, as ``cupy.asarray``)."""
    target = _current_device.get() if device is None else _checked_device_id(device)
    if type(value) is StrictArray:
        if value._device == target and (dtype is None or value.dtype == np.dtype(dtype)) and (
            not copy
        ):
            return value
        with _DeviceWork():
            return _wrap(np.array(value._data, dtype=dtype, copy=True), target)
    if getattr(value, "_backend", None) is STRICT:
        return asarray(value.array, dtype=dtype, device=device, copy=copy)
    if hasattr(value, "__array_ufunc__") and type(value) is not np.ndarray and not isinstance(
        value, np.generic
    ):
        raise TypeError(f"cannot make a strict array from {type(value).__name__}")
    data = np.array(value, dtype=dtype, copy=True)
    if data.dtype.kind in "OUSV":
        raise TypeError(
            f"cannot make a strict array from {type(value).__name__} (dtype {data.dtype}); "
            "device arrays hold numbers, as in CuPy"
        )
    if data.ndim:  # (CuPy makes a 0-d array with a fill kernel: no copy, allowed anywhere)
        _refuse_upload_in_graph_body()
    with _DeviceWork():
        return _wrap(data, target)


def _linalg_norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    """``cupy.linalg.norm``: NumPy's norm, counted as the kernels CuPy launches for it (the
    SVD-based matrix orders are cuSOLVER in CuPy: refused in a body)."""
    data = _Operands().unwrap(x)
    capture.refuse_matrix_norm(ord, np.ndim(data), axis)
    result = _call(np.linalg.norm, (x,), {"ord": ord, "axis": axis, "keepdims": keepdims})
    for _ in range(_cupy_norm_launches(np.result_type(data), np.ndim(data), ord, axis) - 1):
        sync.note_device_op()
    return result


def _cupy_norm_launches(dtype: np.dtype, ndim: int, ord: Any, axis: Any) -> int:
    """How many kernels ``cupy.linalg.norm`` launches (cupy/linalg/_norms.py, CuPy 14.2): the
    Frobenius/2-norm of a whole array is ``sqrt((x * x).sum())``, three kernels (complex:
    ``abs``, ``*=``, ``sum``, ``sqrt``); a 2-norm over given axes is one reduction kernel; the
    other orders are ``abs`` and a reduction or two. An integer or bool array is first cast to
    float (one more). The SVD-based matrix norms (ord 2, -2, 'nuc') are counted as one."""
    cast = int(dtype.kind not in "fc")
    complex_ = dtype.kind == "c"
    if axis is None and (ord is None or (ndim == 1 and ord == 2)
                         or (ndim == 2 and ord in ("f", "fro"))):
        return cast + 3 + complex_
    axes = range(ndim) if axis is None else axis if type(axis) is tuple else (axis,)
    if len(axes) == 1:
        if ord is None or ord == 2:
            launches = 1  # _norm_ord2: one reduction kernel
        elif ord in (np.inf, -np.inf, 1):
            launches = 2  # abs, max/min/sum
        elif ord == 0:
            launches = 3  # x != 0, astype, sum
        else:
            launches = 5  # abs, **= ord, sum, reciprocal(ord), **=
    elif ord in (1, -1, np.inf, -np.inf):
        launches = 3  # abs, sum, max/min
    else:
        launches = 1  # _norm_ord2 over two axes (or the SVD, not modelled)
    return cast + launches


def asnumpy(value: Any) -> np.ndarray:
    """Copy a strict array to the host explicitly (``cupy.asnumpy``: a sync)."""
    if type(value) is StrictArray:
        return value.get()
    return np.asarray(value)


#: The strict device's array namespace: ``xp.asarray``, ``xp.zeros``, ``xp.sqrt``, ``xp.linalg``.
xp = _Namespace(np)
xp.__dict__.update(
    asarray=asarray,
    array=asarray,
    asnumpy=asnumpy,
    ndarray=StrictArray,
    Device=device,
)
xp.linalg.__dict__["norm"] = _linalg_norm
xp.random.__dict__.update(default_rng=default_rng_on(_draw), Generator=Generator)


# ---- the backend -----------------------------------------------------------------------------


class StrictBackend(Backend):
    """gpuscalar's view of the strict device (see the module docstring)."""

    name = "strict"
    multi_device = True
    ufunc_keywords = CUPY_UFUNC_KEYWORDS
    evaluates_on_host = True
    #: the host wing's executors (`Backend.executors`): one home for both host devices (its
    #: own sparse one extends the host's for the strict CSR matrices)
    executors = {
        "blas": "gpuscalar.devices.host.blas:HostBlas",
        "sparse": "gpuscalar.devices.strict.sparse:StrictSparse",
        "loops": "gpuscalar.devices.host.control:HostLoops",
        "graphs": "gpuscalar.devices.host.graphs:HostGraphs",
        "scalars": "gpuscalar.devices.host.fusion:HostExecutor",
        "steps": "gpuscalar.devices.host.steps:strict_steps",
        "metrics": "gpuscalar.devices.host.metrics:HostRings",
        "collectives": "gpuscalar.devices.host.collectives:HostCollectives",
    }

    @property
    def xp(self) -> Any:
        return xp

    def owns(self, value: object) -> bool:
        return type(value) is StrictArray

    def device_of(self, array: Any) -> object:
        return array._device

    def device_context(self, device_id: object) -> Any:
        return device(device_id)  # type: ignore[arg-type]

    def read_scalar(self, array: Any) -> Any:
        data = array._data  # the counted transfer itself (sync.to_host) is the sync
        return data.item() if data.ndim == 0 else data.copy()

    def call(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        loops.refuse_pending(args)  # an expression holding an op CuPy could not run
        with _DeviceWork():  # one op, whatever the strict arrays do inside it
            return func(*args, **kwargs)

    def ufunc(self, name: str) -> Any:
        cache = self.__dict__.setdefault("_ufuncs", {})
        found = cache.get(name)
        if found is None:
            found = cache[name] = _QuietUfunc(getattr(np, name))
        return found

    def vector_norm(self, x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
        return self.call(np.linalg.vector_norm, x, ord=ord, axis=axis, keepdims=keepdims)

    def host_data(self, array: Any) -> Any:
        if INCOMING:  # a non-blocking collective still writing it: wait (gpuscalar.known)
            arrive(array)
        return array._data

    def from_host_data(self, data: Any, like: Any) -> Any:
        return _wrap(np.asarray(data), like._device)

    def upload(self, array: Any, host: np.ndarray) -> None:
        """Copy NumPy ``host`` into ``array`` (as `CupyBackend.upload`): one counted device
        op, refused inside a captured step's body as CuPy refuses it while capturing."""
        array.set(host)


STRICT = StrictBackend()
