"""`gs.MetricLog` on CuPy: the ring's record kernel, and the late copies that bring rows home.

Why this module exists: a metric log is only worth having if recording costs the loop nothing
(no sync, no upload, a host cost below one CuPy ufunc call) and reading costs it no stall.
Here, for CuPy, the device's "metrics" executor (`CudaRings`, a `gpuscalar.deferred.Rings`;
every CUDA call through `gpuscalar.devices.cupy.backend.CudaSeam`):

- **record**: ONE launch of a cached ``RawKernel`` generated per column kinds (a number by
  value, a 0-d array by pointer, a pending GPUScalar computed in the kernel from its leaves, as
  the fused kernels compute one: `gpuscalar.lazy.codegen.plan_code`). One thread reads the
  device counter, writes the row at ``counter % capacity`` (its step number last) and bumps
  the counter. Nothing on the host knows the counter, so a captured step or a loop body that
  records fills the next row at every replay or iteration.
- **ready()** (`CudaRing.poll`): hands over the snapshots whose copies have completed (an event
  query each, never a wait), then, when none is under way, starts one: a device-to-device copy
  of the whole ring into a staging buffer *on the compute stream* (so it sees every record
  queued before it, replays included, and no later one: a consistent snapshot, never a torn
  row), an event, and on a side stream, after that event, the copy of the snapshot into pinned
  host memory, followed by another event. The counter in the snapshot says which rows exist;
  rows older than ``capacity`` steps behind it were overwritten (dropped, counted by the log).
- **flush()** (`CudaRing.drain`): the compute stream waits for the copies under way, takes a
  last snapshot, and that snapshot is read through `gpuscalar.sync.to_host`: one counted sync,
  after which every earlier copy has landed too.

Records must come from one stream at a time (the counter is bumped without atomics, as any
array a kernel updates in place). The ring is allocated from CuPy's default memory pool, not
the current allocator, so a log first used in a captured step's warm-up outlives that step's
private pool.
"""

from __future__ import annotations

import collections
import hashlib
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import sync
from ...lazy import codegen, expr, fusion
from ...lazy.expr import KEY
from ...scalar import GPUScalar
from .backend import CUPY, CupyBackend

if TYPE_CHECKING:
    from ...deferred import RowLayout

__all__ = ["CudaRings", "CudaRing", "record_source", "RECORD_PREFIX", "C_NAMES"]

#: Every record kernel's name starts with this.
RECORD_PREFIX = "gpuscalar_record_"
#: A by-value column (a number): the kernel takes it as an argument of the column's dtype.
_VALUE = "value"
_GRID, _BLOCK = (1,), (1,)
#: The C name a record kernel gives each dtype (a typedef of CuPy's type for it), so every
#: parameter is one word.
C_NAMES: dict[np.dtype, str] = {np.dtype(name): f"gs_{name}" for name in (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}

#: source -> compiled kernel (through the seam that compiled it)
_KERNELS: dict[str, Any] = CUPY.seam_cache({})


def record_source(columns: list[tuple[str, np.dtype, Any]], dtypes: tuple[np.dtype, ...]
                  ) -> tuple[str, str]:
    """(source, name) of the record kernel for ``columns``: per column ``(kind, dtype, plan)``
    with kind ``"value"`` (an argument of the column's dtype), ``"leaf"`` (a pointer to a 0-d
    array of ``dtype``) or ``"node"`` (the expression of ``plan``, computed here); ``dtypes``
    are the columns' dtypes. Slot 0 of a row holds its step, slot k+1 column k."""
    params = ["long long* __restrict__ _gs_state", "const long long _gs_capacity"]
    body: list[str] = []
    preambles: list[str] = []
    described = []
    for k, ((kind, dtype, plan), stored) in enumerate(zip(columns, dtypes, strict=True)):
        name, column_type = f"_gs_v{k}", C_NAMES[stored]
        if kind == _VALUE:
            params.append(f"const {column_type} {name}")
            value = name
            described.append(f"v{stored.str}")
        elif kind == "leaf":
            params.append(f"const {C_NAMES[dtype]}* __restrict__ {name}")
            value = f"{name}[0]"
            described.append(f"l{dtype.str}{stored.str}")
        else:
            code = codegen.plan_code(plan, f"{name}_")
            params += codegen.raw_kernel_params(code)
            body += code.statements
            preambles += [p for p in code.preambles if p not in preambles]
            value = code.value
            described.append(f"n{plan.name}{stored.str}")
        body.append(f"*reinterpret_cast<{column_type}*>(_gs_row + {16 * (k + 1)}) = "
                    f"static_cast<{column_type}>({value});")
    digest = hashlib.sha1("|".join(described).encode()).hexdigest()[:16]
    kernel = f"{RECORD_PREFIX}{len(columns)}_{digest}"
    headers: list[str] = []  # what a type needs (float16's header)
    typedefs = [f"typedef {codegen.cuda_type(d, headers)} {c};" for d, c in C_NAMES.items()]
    lines = [
        codegen.cupy_headers(), *headers, *typedefs, *preambles,
        f'extern "C" __global__ void {kernel}({", ".join(params)}) {{',
        "    if (blockIdx.x != 0 || threadIdx.x != 0) return;",
        "    const long long _gs_step = _gs_state[0];",
        f"    const long long _gs_row_bytes = {16 * (len(columns) + 1)};",
        "    unsigned char* _gs_row = reinterpret_cast<unsigned char*>(_gs_state) + 16",
        "        + (_gs_step % _gs_capacity) * _gs_row_bytes;",
        *(f"    {line}" for line in body),
        "    *reinterpret_cast<long long*>(_gs_row) = _gs_step;",
        "    _gs_state[0] = _gs_step + 1;",
        "}",
    ]
    return "\n".join(lines) + "\n", kernel


def _compiled(source: str, name: str) -> Any:
    kernel = _KERNELS.get(source)
    if kernel is None:
        kernel = _KERNELS[source] = CUPY.seam.compile_kernel(source, name, CUPY.kernel_options)
    return kernel


def _device_buffer(nbytes: int) -> Any:
    """An int64 device buffer of ``nbytes`` from CuPy's default pool (see the module doc)."""
    cupy = CUPY.xp
    memory = CUPY.seam.default_memory_pool().malloc(nbytes)
    return cupy.ndarray((nbytes // 8,), np.int64, memptr=memory)


class _Transfer:
    """One snapshot on its way: its pinned host buffer, the event after the snapshot (compute
    stream) and the event after the copy home (side stream)."""

    __slots__ = ("host", "taken", "copied")

    def __init__(self, seam: Any, nbytes: int) -> None:
        self.host = seam.pinned_empty(nbytes)
        self.taken, self.copied = seam.new_event(), seam.new_event()


class CudaRings:
    """The CuPy device's "metrics" executor (`gpuscalar.deferred.Rings`)."""

    def __init__(self, backend: CupyBackend) -> None:
        self.backend = backend

    def default_device(self) -> object:
        return self.backend.seam.current_device()

    def ring(self, device: object, layout: RowLayout) -> CudaRing:
        return CudaRing(device, layout)


class CudaRing:
    """A `gs.MetricLog`'s ring on a CUDA device (see the module docstring)."""

    def __init__(self, device: object, layout: RowLayout) -> None:
        seam = self.seam = CUPY.seam
        self.device, self.layout = device, layout
        self.names = layout.names
        self._nbytes = layout.nbytes
        with seam.device_context(device):
            self.state = _device_buffer(layout.nbytes)
            CUPY.call(self.state.fill, 0)
        self._capacity = np.int64(layout.capacity)
        #: per column: (name, the Python number types accepted by value, the conversion)
        self._columns: tuple[tuple[str, set[type], Callable[[Any], Any]], ...] = tuple(
            (name, set(), dtype.type)
            for name, dtype in zip(layout.names, layout.dtypes, strict=True))
        self._scalar_types: set[type] = set()
        self._plans: dict[tuple, Any] = {}  # column kinds -> kernel (None: unfused)
        #: a log of one column (the common one): that column, and its kind -> kernel (the
        #: same kernels as `_plans`, with no tuple to build and hash per record)
        self._single = self._columns[0] if len(self._columns) == 1 else None
        self._single_plans: dict[Any, Any] = {}
        self._staging: Any = None
        self._side: Any = None
        self._in_flight: collections.deque[_Transfer] = collections.deque()
        self._free: list[_Transfer] = []
        self._finalizer = weakref.finalize(self, _wait_for, seam, self._in_flight)

    # ---- record: one launch ----

    def record(self, values: dict[str, Any]) -> None:
        """The hot path: Python numbers of accepted types, CuPy GPUScalars on the ring's
        device; anything else (a first sight, an array, an error) takes `_record_checked`.
        A log of one column (the common one) is decided here, others by `_decided`."""
        single = self._single
        if single is None:
            kernel, args = self._decided(values)
        elif len(values) == 1 and single[0] in values:
            value = values[single[0]]
            kind = type(value)
            if kind in self._scalar_types and value._device == self.device:
                node = value._node
                if node is None:
                    kernel = self._single_plans.get(value._dtype)
                    args = (self.state, self._capacity, value._array)
                else:
                    kernel = self._single_plans.get(node[KEY])
                    args = (self.state, self._capacity, *expr.leaves_of(node))
            elif kind in single[1]:
                kernel = self._single_plans.get(_VALUE)
                args = (self.state, self._capacity, single[2](value))
            else:
                kernel = None
        else:
            kernel = None
        if kernel is None:
            return self._record_checked(values)
        seam, device = self.seam, self.device
        if seam.is_current_device(device):  # (the common record: no device switch to make)
            CUPY.call(kernel, _GRID, _BLOCK, args)
        else:
            with seam.device_context(device):
                CUPY.call(kernel, _GRID, _BLOCK, args)
        return None

    def _decided(self, values: dict[str, Any]) -> tuple[Any, Any]:
        """`record`'s decision for a log of several columns: (its kernel, the launch's
        arguments), or (None, None) where `_record_checked` decides."""
        columns = self._columns
        if len(values) != len(columns):
            return None, None
        parts: list[Any] = []
        args: list[Any] = [self.state, self._capacity]
        scalars, device = self._scalar_types, self.device
        try:
            for name, numbers, convert in columns:
                value = values[name]
                kind = type(value)
                if kind in scalars and value._device == device:
                    node = value._node
                    if node is None:
                        parts.append(value._dtype)
                        args.append(value._array)
                    else:
                        parts.append(node[KEY])
                        args += expr.leaves_of(node)
                elif kind in numbers:
                    parts.append(_VALUE)
                    args.append(convert(value))
                else:
                    return None, None
        except KeyError:
            return None, None
        return self._plans.get(tuple(parts)), tuple(args)

    def _record_checked(self, values: dict[str, Any]) -> None:
        """Every value checked (`RowLayout.items`), the kernel built for its kinds (and the
        hot path taught them), then the launch."""
        items = self.layout.items(values, CUPY, self.device)
        parts: list[Any] = []
        args: list[Any] = [self.state, self._capacity]
        columns: list[tuple[str, np.dtype, Any]] = []
        for (_, numbers, convert), (kind, payload, dtype), value in zip(
                self._columns, items, (values[n] for n in self.names), strict=True):
            if kind == "node" and not _fuses(payload):  # evaluated first (eagerly), then read
                kind, payload = "leaf", fusion.materialize(CUPY, payload, self.device)
            if kind == _VALUE:
                if type(value) in (bool, int, float, complex):
                    numbers.add(type(value))
                parts.append(_VALUE)
                args.append(convert(payload))
                columns.append((_VALUE, dtype, None))
            elif kind == "leaf":
                if isinstance(value, GPUScalar):
                    self._scalar_types.add(type(value))
                parts.append(dtype)
                args.append(payload)
                columns.append(("leaf", dtype, None))
            else:
                self._scalar_types.add(type(value))
                parts.append(payload[KEY])
                args += expr.leaves_of(payload)
                columns.append(("node", dtype, expr.plan_of(payload)))
        key = tuple(parts)
        kernel = self._plans.get(key)
        if kernel is None:
            kernel = self._plans[key] = _compiled(*record_source(columns, self.layout.dtypes))
        if self._single is not None:
            self._single_plans[key[0]] = kernel
        with self.seam.device_context(self.device):
            CUPY.call(kernel, _GRID, _BLOCK, tuple(args))

    # ---- the copies home ----

    def poll(self) -> list[np.ndarray]:
        """The snapshots whose copy has landed (in order; queried, never waited for); then,
        when no copy is under way, the next snapshot is started."""
        seam = self.seam
        done: list[np.ndarray] = []
        if seam.is_current_device(self.device):  # (the common poll: no device switch)
            self._poll(done)
        else:
            with seam.device_context(self.device):
                self._poll(done)
        return done

    def _poll(self, done: list[np.ndarray]) -> None:
        """`poll` on the ring's device (current): the landed snapshots appended to ``done``."""
        seam, in_flight = self.seam, self._in_flight
        self._not_capturing("ready")
        while in_flight and seam.event_done(in_flight[0].copied):
            transfer = in_flight.popleft()
            done.append(np.array(transfer.host))  # (pinned memory is reused: a copy)
            self._free.append(transfer)
        if not in_flight:
            self._start_copy()

    def _start_copy(self) -> None:
        seam = self.seam
        stream = seam.current_stream()
        if self._side is None:
            self._side = seam.new_stream()
            self._staging = _device_buffer(self._nbytes)
        transfer = self._free.pop() if self._free else _Transfer(seam, self._nbytes)
        staging = self._staging
        self._snapshot(stream)
        seam.record_event(transfer.taken, stream)
        self._side.wait_event(transfer.taken)
        seam.copy_async(transfer.host.ctypes.data, staging.data.ptr, self._nbytes, self._side)
        seam.record_event(transfer.copied, self._side)
        self._in_flight.append(transfer)

    def _snapshot(self, stream: Any) -> Any:
        """The ring copied into the staging buffer on ``stream``, after the copies under way
        have read the previous snapshot (a device-side wait)."""
        if self._in_flight:
            stream.wait_event(self._in_flight[-1].copied)
        self.seam.copy_async(self._staging.data.ptr, self.state.data.ptr, self._nbytes, stream)
        return self._staging

    def drain(self) -> list[np.ndarray]:
        """Every snapshot under way, then a last one, read with one counted sync."""
        seam = self.seam
        with seam.device_context(self.device):
            self._not_capturing("flush")
            if self._staging is None:
                self._staging = _device_buffer(self._nbytes)
            sync.admit("flush")  # the guard first: a refused read launches nothing
            last = sync.to_host(CUPY, self._snapshot(seam.current_stream()), None)
            done = []
            while self._in_flight:  # the compute stream waited for them before that read
                transfer = self._in_flight.popleft()
                if not seam.event_done(transfer.copied):  # (not expected: a wait, no read)
                    seam.event_wait(transfer.copied)
                done.append(np.array(transfer.host))
                self._free.append(transfer)
        return [*done, np.asarray(last)]

    def compute(self, func: Callable[..., Any], *args: Any) -> Any:
        return CUPY.call(func, CUPY.xp, self.state, *args)

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(sync.to_host(CUPY, array, "flush"))

    def _not_capturing(self, what: str) -> None:
        if self.seam.current_stream().is_capturing():
            raise RuntimeError(f"gs.MetricLog.{what}() cannot run while the current stream "
                               "captures a graph: call it between replays")

    def close(self) -> None:
        self._finalizer()


def _wait_for(seam: Any, in_flight: collections.deque) -> None:
    """Before pinned buffers are let go: wait for the copies that still write into them."""
    while in_flight:
        seam.event_wait(in_flight.popleft().copied)


#: structure key -> whether CuPy kernel code exists for it: bounded, as every cache keyed by a
#: structure (an evicted answer is decided again; a key held here stays alive in the key table)
_FUSES = expr.BoundedCache()


def _fuses(node: expr.Node) -> bool:
    """Whether CuPy kernel code exists for ``node``'s expressions (decided once per structure)."""
    return bool(_FUSES.get(node[KEY], _has_kernel_code, node))


def _has_kernel_code(node: expr.Node) -> bool:
    try:
        codegen.plan_code(expr.plan_of(node), "probe_")
    except codegen.FusionUnsupported:
        return False
    return True
