"""The backend protocol: what gpuscalar needs to know about one array library (a device).

Why this module exists: the rest of the package is written once against the small `Backend`
interface and tested on NumPy and the strict device. The devices themselves live in
`gpuscalar.devices`, one folder (a wing) per device, and their registry (`backend_of`,
`get_backend`, ...) in `gpuscalar.devices`; this module holds only the protocol and helpers
that know no device (`relative_extent`), so a wing imports it without importing another wing.

`Backend.call` is the single dispatch point through which gpuscalar issues device work, so that
every operation is counted (`count_syncs().device_ops`). `Backend.read_scalar` is the raw
device→host copy; only `sync.to_host` may call it, which is how sync accounting stays exact.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, ClassVar

from . import ledger

__all__ = ["Backend", "relative_extent", "SCALAR_FUNCTIONS", "CUPY_UFUNC_KEYWORDS",
           "refuse_ufunc_keywords"]

#: GPUScalar's own functions that a device's namespace hands a call with a GPUScalar operand
#: to (``"clip"``, ``"where"``: as CuPy's kernels call the scalar's hook, which applies the
#: promotion rules), put here by `gpuscalar.math` when imported: a wing reaches them without
#: importing the features above the registry (that would be an import circle)
SCALAR_FUNCTIONS: dict[str, Callable[..., Any]] = {}


#: what CuPy 14's ufunc ``__call__`` accepts (cupy/_core/_kernel.pyx: anything else is
#: ``TypeError("Wrong arguments ...")``); the strict device refuses the rest as CuPy does
CUPY_UFUNC_KEYWORDS = frozenset({"out", "dtype", "casting"})


def refuse_ufunc_keywords(backend: Backend, kwargs: dict[str, Any]) -> None:
    """CuPy's TypeError for keywords its ufuncs do not take, on a backend that has its rule."""
    accepted = backend.ufunc_keywords
    if accepted is not None and not accepted.issuperset(kwargs):
        extra = {name: value for name, value in kwargs.items() if name not in accepted}
        raise TypeError(f"Wrong arguments {extra} (a {backend.name} ufunc takes "
                        f"{', '.join(sorted(accepted))} only)")


#: held while a backend makes an executor (`Backend.executor`'s miss path)
_EXECUTORS_MADE = threading.RLock()


class Backend:
    """What gpuscalar needs to know about one array library."""

    name: str = ""
    #: keyword arguments that make a ufunc return a 0-d array rather than a scalar
    ufunc_array_kwargs: dict[str, Any] = {}
    #: whether arrays of this backend can live on different devices (device checks needed)
    multi_device: bool = False
    #: whether a ufunc accepts NumPy's ``signature=`` to pin the loop (else ``dtype=`` is used)
    supports_signature: bool = True
    #: the keyword arguments the backend's ufuncs take, None for all of NumPy's; CuPy 14's take
    #: ``out``, ``dtype`` and ``casting`` only (``where=`` is its TypeError, "Wrong arguments")
    ufunc_keywords: frozenset[str] | None = None
    #: whether arrays hold NumPy data in this process (NumPy, the strict device), so that
    #: gpuscalar's host evaluators (optimizer programs, fused scalar expressions) can compute
    #: on `host_data` inside one counted device op
    evaluates_on_host: bool = False
    #: whether arrays of this backend ARE host memory (NumPy): such data may meet any backend
    #: (read on the host, or uploaded by a fill kernel), and making one costs no device op
    #: beyond the host call; the strict device stands for a GPU, so it is not
    host_memory: bool = False
    #: The device's executors, one per slot a feature asks for (`executor`): slot ->
    #: ``"module:factory"``, the module inside the device's wing, imported on first use and the
    #: factory called once with the backend (a device bundle names its runtimes as tinygrad's
    #: ``Device`` names ``runtime.ops_*``: neither the protocol nor the registry imports them,
    #: so no wing module's imports reach back up). The protocol of each slot lives beside the
    #: feature that consumes it.
    executors: ClassVar[Mapping[str, str]] = {}

    def executor(self, slot: str) -> Any:
        """This device's executor for ``slot`` (see `executors`), made once. A device without
        one is a ``LookupError`` naming the device and the slot."""
        made = self.__dict__.get("_executors")
        if made is not None:
            found = made.get(slot)
            if found is not None:
                return found
        with _EXECUTORS_MADE:  # the miss path only: each executor made once per backend
            made = self.__dict__.setdefault("_executors", {})
            found = made.get(slot)
            if found is None:
                spec = self.executors.get(slot)
                if spec is None:
                    raise LookupError(f"gpuscalar: the {self.name} device has no {slot!r} "
                                      f"executor (it has: {', '.join(sorted(self.executors))})")
                module, _, factory = spec.partition(":")
                found = made[slot] = getattr(importlib.import_module(module), factory)(self)
        return found

    @property
    def xp(self) -> ModuleType:
        raise NotImplementedError

    def owns(self, value: object) -> bool:
        """Whether ``value`` is an array of this backend (no import, no sync)."""
        raise NotImplementedError

    def device_of(self, array: Any) -> object:
        raise NotImplementedError

    def devices_of(self, arrays: Iterable[Any]) -> Iterable[object]:
        """`device_of` of each array, lazily (a backend may fetch them in one C-level pass)."""
        return map(self.device_of, arrays)

    def device_context(self, device: object) -> Any:
        """A context manager making ``device`` current for array creation."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait until the device has finished the work queued so far (for timings; a host
        backend has nothing queued)."""

    def read_scalar(self, array: Any) -> Any:
        """Copy a 0-d array to the host as a Python scalar (a 1-d one, several scalars packed
        by `gpuscalar.lazy.fusion`'s reads, as a NumPy array). Only `sync.to_host` calls
        this."""
        raise NotImplementedError

    def host_data(self, array: Any) -> Any:
        """The NumPy data of an array of a host-evaluating backend (no transfer, no copy)."""
        raise NotImplementedError(f"the {self.name} backend does not evaluate on the host")

    def from_host_data(self, data: Any, like: Any) -> Any:
        """An array of this backend over NumPy ``data``, on the device of the array ``like``."""
        raise NotImplementedError(f"the {self.name} backend does not evaluate on the host")

    def data_address(self, array: Any) -> int:
        """The address of an array's first element (no transfer): what a kernel's pointer table
        holds (gpuscalar.optim), and what overlap checks compare."""
        return int(self.host_data(array).__array_interface__["data"][0])

    def data_addresses(self, arrays: Iterable[Any]) -> Iterable[int]:
        """`data_address` of each array, lazily (one C-level pass where the backend can)."""
        return map(self.data_address, arrays)

    def call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Issue one device operation, counted. Every op gpuscalar issues goes through here."""
        ledger.note_device_op()
        return func(*args, **kwargs)

    def ufunc(self, name: str) -> Any:
        """The backend's ufunc called ``name`` (NumPy's naming), looked up once."""
        cache = self.__dict__.setdefault("_ufuncs", {})
        found = cache.get(name)
        if found is None:
            found = cache[name] = getattr(self.xp, name)
        return found

    def vector_norm(self, x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
        raise NotImplementedError

    def stack_scalars(self, scalars: list[Any], dtype: Any, out: Any = None) -> Any:
        """The 0-d arrays ``scalars`` (at most 8: `gpuscalar.reduce.stack_scalars` makes the
        chunks) as one new vector of ``dtype``, or written into the vector ``out``, cast as
        ``xp.stack`` casts (``same_kind``): one counted op. Here ``xp.stack``."""
        if out is None:
            return self.call(self.xp.stack, scalars, dtype=dtype)
        return self.call(self.xp.stack, scalars, out=out)

    def elementwise_ufunc_name(self, kernel: Any) -> str | None:
        """NumPy's name for a CuPy ufunc object (``cupy_add`` -> ``add``); None for any other
        elementwise kernel. Used by GPUScalar's ``__cupy_override_elementwise_kernel__``."""
        if type(kernel).__name__ != "ufunc":
            return None
        name = str(getattr(kernel, "name", ""))
        return name.removeprefix("cupy_") or None

    def __repr__(self) -> str:
        return f"<gpuscalar backend {self.name}>"


def relative_extent(array: Any) -> tuple[int, int]:
    """The byte range of a non-empty array's elements, relative to its data pointer (what
    overlap checks compare: `gpuscalar.devices.cupy.linalg`, `gpuscalar.sparse`)."""
    start = end = 0
    for length, stride in zip(array.shape, array.strides, strict=True):
        if stride < 0:
            start += (length - 1) * stride
        else:
            end += (length - 1) * stride
    return start, end + array.itemsize
