"""A recording double for gpuscalar's CUDA seam (`gpuscalar.devices.cupy.backend.CudaSeam`):
CuPy without a GPU.

Why this file exists: `tests/cupy_fake.py` gives real ``cupy.ndarray`` objects over fake device
memory, so CuPy's own dispatch runs until its first CUDA runtime call. gpuscalar's own launches
all go through one seam (`CUPY.seam`); `RecordingSeam` replaces it for a block and, for each
launch gpuscalar makes,

1. records it (`Launch`: the kernel object, its kind, generated source where there is one, the
   arguments),
2. checks it against what CuPy accepts, by calling CuPy for real with the same arguments over
   fake memory: a CUDA runtime error means CuPy's argument handling, dtype resolution and kernel
   preparation all accepted the call (a pass); a ``TypeError`` / ``ValueError`` is a failure.
   A ``RawKernel`` launch is also checked against the kernel's C signature (`parse_kernel`,
   the same parser tests/test_optim_launch.py uses), argument by argument,
3. hands back outputs: ufuncs and ``cupy`` functions / array methods are computed with NumPy on
   `cupy_fake.host_view`s (so simple results are right); ``ElementwiseKernel`` and ``RawKernel``
   outputs keep their memory (right shape and dtype, values not computed), except the device
   leaves a host read's kernel packs (``gpuscalar_read_*``: copies, `_pack_read_leaves`).

It also records every host->device copy (`RecordingSeam.uploads`, including ``xp.asarray`` of
host data) and every device->host read (`reads`), hands out fake streams whose capture records
launches into a `FakeGraph` (replayed by ``graph.launch()``; an upload while capturing is refused
with CuPy's own message), and records cuBLAS calls (`blas`), checked against
gpuscalar.devices.cupy.cublas's signature table.

Usage::

    with fake_memory() as memory, recording(memory) as seam:
        ...  # gpuscalar on fake-memory CuPy arrays
    assert seam.count("ufunc") == 1 and not seam.uploads
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import re
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from gpuscalar.devices import CUPY
from gpuscalar.devices.cupy import control as cuda_control
from gpuscalar.devices.cupy import cublas, metrics, products
from gpuscalar.devices.cupy.backend import STACK_PREFIX, CudaSeam
from gpuscalar.lazy import codegen

from .cupy_fake import FakeMemory, cuda_runtime_errors, cupy_or_fail, from_host, host_view

# ---- RawKernel signatures (shared with tests/test_optim_launch.py) ---------------------------

C_TYPES = {"float": np.float32, "double": np.float64, "long long": np.int64, "int": np.int32,
           "unsigned int": np.uint32, "unsigned long long": np.uint64, "bool": np.bool_,
           "signed char": np.int8, "unsigned char": np.uint8, "short": np.int16,
           "unsigned short": np.uint16, "float16": np.float16,
           "thrust::complex<float>": np.complex64, "thrust::complex<double>": np.complex128}
#: the one-word type names of gs.MetricLog's record kernels (gpuscalar.devices.cupy.metrics.C_NAMES)
C_TYPES.update({name: dtype.type for dtype, name in metrics.C_NAMES.items()})


def kernel_structs(source: str) -> dict[str, np.dtype]:
    """The structs a source declares (``struct S { long long f[N]; };``), as the NumPy dtypes
    whose size-one arrays CuPy passes by value for them (field by field, no padding: every
    field of these structs has the struct's alignment)."""
    found = {}
    for sname, body in re.findall(r"struct (\w+) \{(.*?)\};", source):
        fields = []
        for ctype, field, count in re.findall(r"([\w ]+?) (\w+)(?:\[(\d+)\])?;", body):
            shape = (int(count),) if count else ()
            fields.append((field, C_TYPES[ctype.strip()], shape))
        found[sname] = np.dtype(fields)
    return found


def parse_kernel(source: str, name: str) -> tuple[np.dtype | None, list[tuple], str]:
    """The kernel's T, its parameters as (declaration, NumPy dtype, is_pointer, name), and the
    source after the signature."""
    signature = re.search(rf'void {name}\((.*?)\) {{', source).group(1)
    typedef = re.search(r"typedef (\w+) T;", source)
    t_type = np.dtype(C_TYPES[typedef.group(1)]) if typedef else None
    structs = kernel_structs(source)
    params = []
    for param in (p.strip() for p in signature.split(",")):
        match = re.fullmatch(r"(?:const )?([\w :<>]+?)(\*)?(?: __restrict__)? (\w+)", param)
        ctype, pointer, pname = match.groups()
        if ctype == "T":
            want = t_type
        elif ctype in structs:
            assert not pointer, f"{param}: a struct is passed by value"
            want = structs[ctype]
        else:
            want = np.dtype(C_TYPES[ctype])
        params.append((param, want, bool(pointer), pname))
    return t_type, params, source[source.index(signature) + len(signature):]


def check_raw_arguments(source: str, name: str, args: tuple[Any, ...]) -> None:
    """Each kernel argument matches its C parameter: a pointer gets a ``cupy.ndarray`` of the
    pointed-to dtype, a value a NumPy scalar (or size-one array, for a struct) of its dtype."""
    cupy = cupy_or_fail()
    _, params, _ = parse_kernel(source, name)
    assert len(args) == len(params), f"{name}: {len(args)} arguments for {len(params)} parameters"
    for arg, (decl, want, pointer, _) in zip(args, params, strict=True):
        if pointer:
            assert isinstance(arg, cupy.ndarray), f"{name}: {decl} got {type(arg).__name__}"
            assert want is None or arg.dtype == want, f"{name}: {decl} got {arg.dtype} data"
        else:
            assert isinstance(arg, np.generic | np.ndarray), (
                f"{name}: {decl} got {type(arg).__name__} (CuPy guesses a Python number's C type)")
            assert arg.dtype == want and arg.size == 1, f"{name}: {decl} got {arg.dtype}"


# ---- what the double records ------------------------------------------------------------------


@dataclasses.dataclass
class Launch:
    """One launch gpuscalar made: ``kind`` is "ufunc", "elementwise", "raw", "function" (a
    ``cupy`` function), "method" (a ``cupy.ndarray`` method), "python" (anything else) or
    "cublas"; ``source`` the generated code (a RawKernel's source, an ElementwiseKernel's
    operation and preamble)."""

    kind: str
    func: Any
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    source: str | None = None
    result: Any = None  # what it returned while recorded (`RecordingSeam.records_only`)


@dataclasses.dataclass
class Upload:
    """One host->device copy: the target array and the host data."""

    array: Any
    host: np.ndarray
    how: str


def _kind(func: Any) -> str:
    cupy = cupy_or_fail()
    kind = type(func).__name__
    if kind == "ufunc" and type(func).__module__.startswith("cupy"):
        return "ufunc"
    if isinstance(func, cupy.ElementwiseKernel):
        return "elementwise"
    if isinstance(func, cupy.RawKernel):
        return "raw"
    if isinstance(getattr(func, "__self__", None), cupy.ndarray):
        return "method"
    if str(getattr(func, "__module__", "") or "").startswith("cupy"):
        return "function"
    return "python"


def _name(func: Any) -> str:
    return str(getattr(func, "name", None) or getattr(func, "__name__", type(func).__name__))


def _host_args(value: Any) -> Any:
    """``value`` with every ``cupy.ndarray`` replaced by its host view (lists/tuples walked)."""
    cupy = cupy_or_fail()
    if isinstance(value, cupy.ndarray):
        return host_view(value)
    if isinstance(value, list | tuple):
        return type(value)(_host_args(v) for v in value)
    if isinstance(value, dict):
        return {key: _host_args(v) for key, v in value.items()}
    return value


def _plain(value: Any) -> Any:
    """``value`` with every ``cupy.ndarray`` subclass instance (a test device's array, with
    hooks of its own) replaced by a plain ``cupy.ndarray`` over the same memory, so the check
    sees CuPy's own dispatch (lists, tuples and dicts walked)."""
    cupy = cupy_or_fail()
    if isinstance(value, cupy.ndarray) and type(value) is not cupy.ndarray:
        return cupy.ndarray(value.shape, value.dtype, value.data, value.strides)
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    return value


def _preprocessed(args: Any) -> list[Any]:
    """``args`` as CuPy's ``_preprocess_args`` makes them (cupy/_core/_kernel.pyx, v14.2):
    arrays stay, anything else becomes a ``CScalar`` (a ``TypeError`` for what CuPy refuses).
    CuPy does this only after asking CUDA for the current device, so a real call without a GPU
    never gets here: the double does it itself."""
    cupy = cupy_or_fail()
    from cupy._core import _scalar  # noqa: PLC0415 - CuPy's internals, for the checks only

    return [a if isinstance(a, cupy.ndarray) else _scalar.CScalar(a) for a in args]


def _check_shapes(name: str, inputs: list[Any], outputs: list[Any]) -> None:
    """The arrays broadcast together and every output has the broadcast shape."""
    cupy = cupy_or_fail()
    shapes = [a.shape for a in (*inputs, *outputs) if isinstance(a, cupy.ndarray)]
    shape = np.broadcast_shapes(*shapes) if shapes else ()
    for out in outputs:
        assert out.shape == shape, f"{name}: output of shape {out.shape}, broadcast is {shape}"


def check_ufunc_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """What CuPy's ``ufunc.__call__`` decides after its first CUDA call: the loop
    (``_ops.guess_routine``), the output dtypes, the cast into given outputs, the shapes."""
    nin, nout = func.nin, func.nout
    unknown = set(kwargs) - {"out", "dtype", "casting"}
    assert not unknown, f"{func.name}: CuPy's ufuncs take no {sorted(unknown)}"
    out = kwargs.get("out")
    outs = list(args[nin:]) if out is None else list(out if isinstance(out, tuple) else (out,))
    assert all(isinstance(o, cupy_or_fail().ndarray) for o in outs), f"{func.name}: out {outs}"
    ins = _preprocessed(args[:nin])
    dtype = kwargs.get("dtype")
    op = func._ops.guess_routine(func.name, {}, ins, None if dtype is None else np.dtype(dtype),
                                 func._out_ops)
    _, out_dtypes = op.resolve_dtypes(ins, outs + [None] * (nout - len(outs)))
    casting = kwargs.get("casting", "same_kind")
    for given, core in zip(outs, out_dtypes, strict=False):
        assert np.can_cast(core, given.dtype, casting), (
            f"{func.name}: its {core} result cannot be cast to the {given.dtype} output "
            f"({casting!r} casting)")
    _check_shapes(func.name, ins, outs)


def check_elementwise_call(kernel: Any, args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What ``ElementwiseKernel.__call__`` decides after its first CUDA call: the parameter
    types (``_decide_params_type``) and the shapes. Returns the output dtypes."""
    cupy = cupy_or_fail()
    ins, outs = _preprocessed(args[:kernel.nin]), list(args[kernel.nin:])
    in_types = tuple(a.dtype if isinstance(a, cupy.ndarray) else None for a in ins)
    _, out_types, _ = kernel._decide_params_type(in_types, tuple(o.dtype for o in outs))
    if "size" not in kwargs:
        raw = {p.name for p in kernel.params if p.raw}
        names = [p.name for p in kernel.params]
        sized = [a for a, n in zip((*ins, *outs), names, strict=False) if n not in raw]
        _check_shapes(kernel.name, sized[:len(ins)] if outs else sized,
                      [o for o, p in zip(outs, kernel.out_params, strict=False) if not p.raw])
    return out_types


def elementwise_code(kernel: Any, args: tuple[Any, ...]) -> str:
    """The translation unit CuPy would compile for this launch of ``kernel`` (an
    ``ElementwiseKernel``): CuPy's headers, the kernel's preamble and CuPy's own generated code
    (``_get_elementwise_kernel_code``) for these arguments' kinds, dtypes and dimensions."""
    cupy = cupy_or_fail()
    from cupy._core import _carray, _kernel, _scalar, core  # noqa: PLC0415 - checks only

    ins, outs = _preprocessed(args[:kernel.nin]), list(args[kernel.nin:])
    in_types = tuple(a.dtype if isinstance(a, cupy.ndarray) else None for a in ins)
    in_dtypes, out_dtypes, type_map = kernel._decide_params_type(
        in_types, tuple(o.dtype for o in outs))
    raw = [p.raw for p in kernel.params]
    shapes = [a.shape for a, r in zip((*ins, *outs), raw, strict=False)
              if isinstance(a, cupy.ndarray) and not r]
    ndim = len(np.broadcast_shapes(*shapes)) if shapes else 0
    infos = []
    for arg, dtype, is_raw in zip(ins, in_dtypes, raw, strict=False):
        if isinstance(arg, cupy.ndarray):
            infos.append(_kernel._ArgInfo(1, cupy.ndarray, arg.dtype,
                                          arg.ndim if is_raw else ndim, True, True))
        else:
            infos.append(_kernel._ArgInfo(3, _scalar.CScalar, np.dtype(dtype), 0, True, True))
    for out, dtype, is_raw in zip(outs or [None] * kernel.nout, out_dtypes,
                                  raw[kernel.nin:], strict=False):
        infos.append(_kernel._ArgInfo(1, cupy.ndarray, np.dtype(dtype),
                                      out.ndim if (is_raw and out is not None) else ndim,
                                      True, True))
    infos.append(_kernel._ArgInfo(2, _carray.Indexer, None, ndim, True, True))
    body = _kernel._get_elementwise_kernel_code(
        tuple(infos), type_map, kernel.params, kernel.operation, kernel.name, kernel.preamble,
        **kernel.kwargs)
    return "".join(f"#include <{h}>\n" for h in core._cupy_header_list) + body


#: sources NVRTC already compiled in this process (each compiles once)
_COMPILED: set[str] = set()


def nvrtc_compile(source: str, name: str, options: tuple[str, ...] = ()) -> None:
    """Compile ``source`` with NVRTC and CuPy's options (once per source); a compile error
    fails the test with the compiler's log."""
    if source in _COMPILED:
        return
    from . import nvrtc  # noqa: PLC0415 - loads NVRTC: only for seams that compile

    nvrtc.compile_source(nvrtc.load(), source, name, nvrtc.cupy_options(options))
    _COMPILED.add(source)


def _numpy_twin(func: Any, kind: str) -> Any:
    """NumPy's function of the same name and module (``cupy_add`` -> ``np.add``,
    ``cupy.linalg.norm`` -> ``np.linalg.norm``), or None."""
    name = _name(func).removeprefix("cupy_")
    if kind == "ufunc":
        return getattr(np, name, None)
    module = str(getattr(func, "__module__", "") or "")
    found: Any = np
    for part in module.split(".")[1:]:
        if part.startswith("_"):
            break
        found = getattr(found, part, None)
        if found is None:
            return getattr(np, name, None)
    return getattr(found, name, getattr(np, name, None))


#: One packed store of a host read's kernel (`gpuscalar.lazy.codegen.read_source`): a device leaf
#: ``NAME[0]`` written at byte ``OFFSET`` of ``_gs_pack``.
_PACK_STORE = re.compile(r"&_gs_pack\[(\d+)\]\) = (\w+)\[0\];")


def _pack_read_leaves(launch: Launch) -> None:
    """Answer the leaf slots of a host read's packing ``RawKernel`` (`codegen.read_source`,
    `codegen.pack_source`; its parameters by name, ``_gs_pack`` last): the leaves' own bytes,
    copied as the kernel copies them, so the values the read makes known are the device's.
    A value the kernel computes (a fused expression) is not computed, as for any fused
    kernel."""
    _, params, body = parse_kernel(launch.source, launch.name)
    args = launch.args[2]
    by_name = {param[3]: arg for param, arg in zip(params, args, strict=True)}
    target = host_view(args[-1])
    for offset, name in _PACK_STORE.findall(body):
        leaf = np.asarray(host_view(by_name[name])).reshape(-1)[:1]
        start = int(offset)
        target[start:start + leaf.dtype.itemsize] = leaf.view(np.uint8)


#: One store of a gs.MetricLog record kernel (`gpuscalar.devices.cupy.metrics.record_source`): a
#: column written at byte OFFSET of the row from a parameter (by value, or ``NAME[0]``).
_RECORD_STORE = re.compile(
    r"\*reinterpret_cast<(\w+)\*>\(_gs_row \+ (\d+)\) = static_cast<\w+>\((\w+)(\[0\])?\);")


def _run_dot_kernel(launch: Launch) -> None:
    """What gpuscalar's dot kernels compute (`products.dot`), on the fake memory: the dot
    kernel's whole sum (``conj(x)`` first with its flag) into the first slot of its target and
    zeros in the others (each block's partial sum is the GPU's split; the total is the same
    up to the order of additions), and the partial-sum kernel's total of its ``count`` values."""
    args = launch.args[2]
    if launch.name.startswith(products.DOT_PREFIX + "sum_"):
        partials, count, out = args
        host_view(out)[...] = host_view(partials)[:int(count)].sum()
        return
    x, _, y, _, n, conj, target = args
    xs, ys = host_view(x)[:int(n)], host_view(y)[:int(n)]
    total = np.vdot(xs, ys) if conj else np.dot(xs, ys)
    view = host_view(target).reshape(-1)
    view[...] = 0
    view[0] = total


def _run_stack_kernel(launch: Launch) -> Any:
    """What a gathering kernel does (`gpuscalar.devices.cupy.backend.stack_kernel`), on the
    fake memory: each 0-d input into its element of the output, cast to its dtype."""
    *scalars, out = launch.args
    view = host_view(out)
    for k, scalar in enumerate(scalars):
        view[k] = host_view(scalar)[()]
    return out


def _run_record_kernel(launch: Launch) -> None:
    """What a record kernel does, on the fake memory: read the counter, write the row at
    ``counter % capacity`` (each column from its parameter, cast to the column's type; a
    column computed from a pending expression is not computed, as for any fused value), its
    step, and bump the counter."""
    args = launch.args[2]
    _, params, _ = parse_kernel(launch.source, launch.name)
    by_name = {param[3]: arg for param, arg in zip(params, args, strict=True)}
    state = host_view(args[0]).view(np.uint8)
    capacity = int(args[1])
    row_bytes = int(re.search(r"_gs_row_bytes = (\d+);", launch.source).group(1))
    step = int(state[:8].view(np.int64)[0])
    base = 16 + (step % capacity) * row_bytes
    for ctype, offset, name, pointer in _RECORD_STORE.findall(launch.source):
        if name not in by_name:
            continue
        arg = by_name[name]
        value = np.asarray(host_view(arg) if pointer else arg).astype(C_TYPES[ctype])
        start = base + int(offset)
        state[start:start + value.itemsize] = value.reshape(1).view(np.uint8)
    state[base:base + 8] = np.array([step], np.int64).view(np.uint8)
    state[:8] = np.array([step + 1], np.int64).view(np.uint8)


@dataclasses.dataclass
class AsyncCopy:
    """One asynchronous copy (`CudaSeam.copy_async`): ``kind`` is "D2D" or "D2H" (into pinned
    host memory)."""

    dst: int
    src: int
    nbytes: int
    stream: Any
    kind: str


def _uploads_a_pointer_table(launch: Launch) -> bool:
    """Whether CuPy's ``concatenate`` (``stack``, ``vstack``, ...) copies a table of the
    inputs' pointers from the host: more than 8 inputs of the output's dtype, under 2 MiB each
    on average (``_concatenate`` in cupy/_core/_routines_manipulation.pyx, v14.2). CuPy decides
    this after its first CUDA call, so the double models it."""
    cupy = cupy_or_fail()
    if launch.name not in ("concatenate", "stack", "vstack", "hstack", "dstack", "column_stack"):
        return False
    arrays = launch.args[0] if launch.args else launch.kwargs.get("arrays", ())
    if not isinstance(arrays, list | tuple) or len(arrays) <= 8:
        return False
    out, dtype = launch.kwargs.get("out"), launch.kwargs.get("dtype")
    dtype = out.dtype if out is not None else np.dtype(dtype) if dtype is not None else (
        np.result_type(*(a.dtype for a in arrays if isinstance(a, cupy.ndarray))))
    if any(not isinstance(a, cupy.ndarray) or a.dtype != dtype for a in arrays):
        return False
    return sum(a.size for a in arrays) * dtype.itemsize < 2 * 1024 * 1024 * len(arrays)


class FakeEvent:
    """A recorded stream event (``stream.record()``); the fake device is always done."""

    done = True


@dataclasses.dataclass
class FakeConditional:
    """A conditional node (``kind`` "while" or "if") recorded for ``handle``: its body graph's
    launches. Replayed, its body runs as often as the condition kernel's flag says."""

    kind: str
    handle: int
    launches: list[Launch] = dataclasses.field(default_factory=list, repr=False)
    runs: int = 0


class FakeGraph:
    """What a fake stream's capture recorded: ``launch()`` replays the recorded launches'
    answers (values recomputed, nothing re-checked), ``upload`` is a no-op."""

    def __init__(self, seam: RecordingSeam, launches: list[Launch]) -> None:
        self.seam, self.launches = seam, launches

    def upload(self, stream: Any) -> None:
        pass

    def launch(self, stream: Any = None) -> None:
        self.seam.graph_launches += 1
        for launch in self.launches:
            self.seam._replay(launch)


class FakeStream:
    """A stream handed out by the double: a context manager, capture records launches."""

    _ptrs = itertools.count(0x5000)

    def __init__(self, seam: RecordingSeam) -> None:
        self.seam, self.ptr, self.captured = seam, next(self._ptrs), None

    def __enter__(self) -> FakeStream:
        self.seam._streams.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seam._streams.remove(self)

    def is_capturing(self) -> bool:
        return self.captured is not None

    def begin_capture(self) -> None:
        assert self.captured is None, "begin_capture on a capturing stream"
        self.captured = []
        self.snapshot = self.seam._snapshot()

    def end_capture(self) -> FakeGraph:
        assert self.captured is not None, "end_capture without begin_capture"
        graph, self.captured = FakeGraph(self.seam, self.captured), None
        self.seam._restore(self.snapshot)
        self.seam.graphs.append(graph)
        return graph

    def record(self) -> FakeEvent:
        return FakeEvent()

    def wait_event(self, event: Any) -> None:
        assert isinstance(event, FakeEvent)

    def synchronize(self) -> None:
        self.seam.stream_waits += 1


class FakePool:
    """A private memory pool over the fake memory."""

    def __init__(self, memory: FakeMemory) -> None:
        self.malloc = memory.allocate

    def free_all_blocks(self) -> None:
        pass


class FakeHandle:
    """A cuBLAS handle that never loads cuBLAS."""

    _values = itertools.count(0x7000)

    def __init__(self, stream: Any) -> None:
        self.value, self.stream = next(self._values), stream
        self.lock, self.recorded = threading.Lock(), False

    def close(self) -> None:
        self.value = None


class SeamNamespace:
    """``cupy`` (or one of its submodules) as seen by a gpuscalar function that composes several
    CuPy calls into one counted device op and takes ``xp`` as an argument (``reduce.py``'s
    per-array norm shares): each call goes through the seam's ``launch``, recorded and checked
    like any other (not counted again: the composite was counted once)."""

    def __init__(self, seam: RecordingSeam, module: Any) -> None:
        self._seam, self._module = seam, module

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._module, name)
        if isinstance(found, type(self._module)):
            return SeamNamespace(self._seam, found)
        if not callable(found) or isinstance(found, type):
            return found
        seam = self._seam

        def launched(*args: Any, **kwargs: Any) -> Any:
            return seam.launch(found, args, kwargs)

        return launched


class RecordingSeam(CudaSeam):
    """gpuscalar's CUDA seam over fake memory: records, checks and answers every call (see the
    module docstring). ``check=False`` skips the real-CuPy checks (faster; answers only)."""

    def __init__(self, memory: FakeMemory, *, check: bool = True,
                 compile: bool = False) -> None:
        self.memory, self.check, self.compile = memory, check, compile
        self.launches: list[Launch] = []
        self.uploads: list[Upload] = []
        self.reads: list[Any] = []
        self.graphs: list[FakeGraph] = []
        self.graph_launches = self.stream_waits = self.device_syncs = 0
        self._default_stream = FakeStream(self)
        self._streams: list[FakeStream] = []
        self._checking = threading.local()
        self.conditions: dict[int, bool] = {}  # conditional handle -> its flag
        #: pinned host buffers, asynchronous copies, event records/queries/waits (MetricLog)
        self.pinned: list[np.ndarray] = []
        self.copies: list[AsyncCopy] = []
        self.event_records: list[tuple[FakeEvent, Any]] = []
        self.event_queries = self.event_waits = 0
        #: while True, a recorded event stays pending until `complete_events` (or a read)
        self.conditionals: list[FakeConditional] = []
        self._handles = itertools.count(0x9000)

    hold_events = False

    def array(self, values: Any, dtype: Any = None) -> Any:
        """A fake-memory ``cupy.ndarray`` holding ``values`` (test input; not an upload)."""
        return from_host(self.memory, values, dtype)

    # ---- queries ----

    def count(self, kind: str | None = None) -> int:
        """How many launches (of ``kind``) were recorded."""
        return sum(1 for launch in self.launches if kind is None or launch.kind == kind)

    def kinds(self) -> list[str]:
        return [launch.kind for launch in self.launches]

    def clear(self) -> None:
        """Forget what was recorded so far (launches, uploads, reads)."""
        self.launches.clear()
        self.uploads.clear()
        self.reads.clear()

    # ---- launches ----

    def launch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if getattr(self._checking, "on", False):  # gpuscalar re-entered from a check's real call
            return func(*args, **kwargs)
        kind = _kind(func)
        if kind == "python":  # a gpuscalar function composing CuPy calls as one counted op
            cupy = cupy_or_fail()
            args = tuple(SeamNamespace(self, a) if a is cupy else a for a in args)
            return func(*args, **kwargs)
        source = None
        if kind == "raw":
            source = func.code
        elif kind == "elementwise":
            source = f"{func.preamble}\n{func.operation}"
        launch = Launch(kind, func, _name(func), args, dict(kwargs), source)
        self.launches.append(launch)
        if kind == "function" and launch.name in ("asarray", "array") and args and not isinstance(
                args[0], cupy_or_fail().ndarray):
            self._note_upload(None, np.asarray(args[0]), f"xp.{launch.name}")
        if kind == "function" and _uploads_a_pointer_table(launch):
            self._note_upload(None, np.zeros(len(args[0]), np.uint64),
                              f"xp.{launch.name}'s pointer table ({len(args[0])} arrays)")
        if self.check:
            self._check(launch)
        capture = self._capturing()
        if capture is not None:
            capture.captured.append(launch)
        result = self._answer(launch)
        if capture is not None and self.records_only:
            launch.result = result
        return result

    # ---- recording executes nothing (opt-in: ``records_only``) ----

    #: Whether a capture leaves the fake memory as it found it (a GPU executes nothing while
    #: recording) and a replay writes into the buffers the recording returned (a graph's
    #: static buffers). Off by default: the launches are still answered while recorded, so
    #: their results have values.
    records_only = False

    def _snapshot(self) -> dict[int, np.ndarray] | None:
        if not self.records_only:
            return None
        with self.memory._lock:
            return {address: buffer.copy() for address, buffer in self.memory._buffers.items()}

    def _restore(self, snapshot: dict[int, np.ndarray] | None) -> None:
        if snapshot is None:
            return
        with self.memory._lock:
            for address, saved in snapshot.items():
                self.memory._buffers[address][...] = saved

    def _replay(self, launch: Launch) -> None:
        """Answer a recorded launch again; with ``records_only``, into what it returned when
        recorded (a replayed graph writes the same buffers)."""
        fresh = self._answer(launch)
        if launch.result is None or fresh is launch.result:
            return
        olds = launch.result if isinstance(launch.result, tuple) else (launch.result,)
        news = fresh if isinstance(fresh, tuple) else (fresh,)
        for old, new in zip(olds, news, strict=True):
            if old is not new and isinstance(old, cupy_or_fail().ndarray):
                host_view(old)[...] = host_view(new)

    def _capturing(self) -> FakeStream | None:
        stream = self.current_stream()
        return stream if stream.captured is not None else None

    def _check(self, launch: Launch) -> None:
        """CuPy itself, called with the same arguments, must get as far as CUDA (or return)."""
        if launch.kind == "raw":
            grid, block, kernel_args = launch.args
            assert all(isinstance(v, int) and v > 0 for v in (*grid, *block)), launch.args[:2]
            check_raw_arguments(launch.source, launch.func.name, tuple(kernel_args))
        try:
            if launch.kind == "ufunc":
                check_ufunc_call(launch.func, launch.args, launch.kwargs)
            elif launch.kind == "elementwise":
                check_elementwise_call(launch.func, launch.args, launch.kwargs)
                if self.compile:
                    nvrtc_compile(elementwise_code(launch.func, launch.args), launch.name)
            elif launch.kind == "raw" and self.compile:
                nvrtc_compile(launch.source, launch.name, tuple(launch.func.options))
        except (TypeError, ValueError) as error:
            raise AssertionError(f"CuPy refuses gpuscalar's {launch.kind} launch of "
                                 f"{launch.name}: {type(error).__name__}: {error}") from error
        self._checking.on = True
        try:
            func = launch.func
            if launch.kind == "method":  # the same method of the plain array
                func = getattr(_plain(func.__self__), func.__name__)
            func(*_plain(launch.args), **_plain(launch.kwargs))
        except cuda_runtime_errors():
            pass
        except Exception as error:
            raise AssertionError(f"CuPy refuses gpuscalar's {launch.kind} launch of "
                                 f"{launch.name}: {type(error).__name__}: {error}") from error
        finally:
            self._checking.on = False

    def _answer(self, launch: Launch) -> Any:
        kind, args, kwargs = launch.kind, launch.args, launch.kwargs
        if kind == "conditional":
            return self._run_conditional(launch.func)
        if kind == "raw" and launch.name == cuda_control.CONDITION_KERNEL:
            handle, flag, invert, count, limit = args[2]
            go = bool(host_view(flag)) != bool(invert) and (
                limit < 0 or host_view(count).item() < limit)
            self.conditions[int(handle)] = go
            return None
        if kind == "raw" and launch.name.startswith(metrics.RECORD_PREFIX):
            return _run_record_kernel(launch)
        if kind == "raw" and launch.name.startswith(codegen.READ_PREFIX):
            return _pack_read_leaves(launch)
        if kind == "raw" and launch.name.startswith(products.DOT_PREFIX):
            return _run_dot_kernel(launch)
        if kind in ("raw", "cublas"):
            return None
        if kind == "elementwise" and launch.name.startswith(STACK_PREFIX):
            return _run_stack_kernel(launch)
        if kind == "elementwise":
            return self._elementwise_outputs(launch)
        out = kwargs.get("out")
        if kind == "method":
            target = getattr(host_view(launch.func.__self__), launch.func.__name__, None)
        else:
            target = _numpy_twin(launch.func, kind)
        if target is None:
            raise AssertionError(f"the recording seam cannot answer {kind} {launch.name}")
        with np.errstate(all="ignore"):  # a kernel cannot warn: IEEE results, as on a GPU
            result = target(*_host_args(args), **_host_args(kwargs))
        if out is not None:
            return out
        if isinstance(result, tuple):
            return tuple(self._device(r) for r in result)
        return self._device(result) if result is not None else None

    def _device(self, value: Any) -> Any:
        if isinstance(value, np.ndarray | np.generic):
            return from_host(self.memory, np.asarray(value))
        return value

    def _elementwise_outputs(self, launch: Launch) -> Any:
        cupy = cupy_or_fail()
        kernel, args = launch.func, launch.args
        nin, nout = kernel.nin, kernel.nout
        outs = list(args[nin:nin + nout]) or [None] * nout
        given = launch.kwargs.get("size")
        ins = args[:nin]
        arrays = [a for a in ins if isinstance(a, cupy.ndarray)]
        shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
        if given is not None:
            shape = (given,)
        out_dtypes = check_elementwise_call(kernel, args, launch.kwargs)
        made = [o if o is not None else from_host(self.memory, np.zeros(shape, dtype))
                for o, dtype in zip(outs, out_dtypes, strict=True)]
        return made[0] if nout == 1 else tuple(made)

    # ---- the rest of the seam ----

    def compile_kernel(self, source: str, name: str, options: tuple[str, ...]) -> Any:
        return cupy_or_fail().RawKernel(source, name, options=options)

    def copy_to_host(self, array: Any) -> Any:
        self.complete_events()  # a blocking read: the device has done what was queued before
        self.reads.append(array)
        host = host_view(array)
        return host.item() if host.ndim == 0 else host.copy()

    def _note_upload(self, array: Any, host: np.ndarray, how: str) -> None:
        if self._capturing() is not None:
            # CuPy's own words (cupy/cuda/memory.pyx, copy_from_host_async, v14.2)
            raise RuntimeError("the current stream is capturing, so H2D transfers are "
                               f"disallowed ({how}, refused by the recording seam)")
        self.uploads.append(Upload(array, host.copy(), how))

    def upload(self, array: Any, host: np.ndarray, stream: Any) -> None:
        self._note_upload(array, host, "upload")
        host_view(array)[...] = host.reshape(array.shape)

    def device_context(self, device: object) -> Any:
        assert device == 0, f"the fake memory is on device 0, not {device!r}"
        return contextlib.nullcontext()

    def current_device(self) -> int:
        return 0

    def synchronize(self) -> None:
        self.device_syncs += 1

    def device_wait(self) -> None:
        pass

    def current_stream(self) -> FakeStream:
        return self._streams[-1] if self._streams else self._default_stream

    def new_stream(self) -> FakeStream:
        return FakeStream(self)

    def new_memory_pool(self) -> FakePool:
        return FakePool(self.memory)

    def default_memory_pool(self) -> FakePool:
        return FakePool(self.memory)

    def using_allocator(self, malloc: Any) -> Any:
        return cupy_or_fail().cuda.using_allocator(malloc)

    # ---- pinned memory, events and asynchronous copies (gs.MetricLog) ----

    def pinned_empty(self, nbytes: int) -> np.ndarray:
        buffer = np.zeros(int(nbytes), np.uint8)
        self.pinned.append(buffer)
        return buffer

    def new_event(self) -> FakeEvent:
        return FakeEvent()

    def record_event(self, event: Any, stream: Any) -> None:
        assert isinstance(event, FakeEvent) and isinstance(stream, FakeStream), (event, stream)
        assert stream.captured is None, "an event recorded on a capturing stream"
        event.done = not self.hold_events
        self.event_records.append((event, stream))

    def complete_events(self) -> None:
        """The device catches up: every recorded event completes."""
        for event, _ in self.event_records:
            event.done = True

    def event_done(self, event: Any) -> bool:
        assert isinstance(event, FakeEvent)
        self.event_queries += 1
        return event.done

    def event_wait(self, event: Any) -> None:
        assert isinstance(event, FakeEvent)
        self.event_waits += 1
        event.done = True

    def _pinned_holds(self, address: int, nbytes: int) -> bool:
        return any(b.ctypes.data <= address and address + nbytes <= b.ctypes.data + b.nbytes
                   for b in self.pinned)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        assert isinstance(stream, FakeStream), stream
        assert stream.captured is None, "an asynchronous copy on a capturing stream"
        assert self.memory.region(src, nbytes) is not None, "the source is no device memory"
        if self.memory.region(dst, nbytes) is not None:
            kind = "D2D"
        else:
            assert self._pinned_holds(dst, nbytes), "the target is neither device nor pinned"
            kind = "D2H"
        ctypes.memmove(dst, src, nbytes)  # the fake device copies at once (in stream order)
        self.copies.append(AsyncCopy(dst, src, nbytes, stream, kind))

    def end_abandoned_capture(self, stream: Any) -> None:
        stream.captured = None
        self._restore(getattr(stream, "snapshot", None))

    # ---- conditional nodes (gpuscalar.devices.cupy.control) ----

    #: what `conditional_nodes_unavailable` answers (a reason: gs.while_loop falls back)
    conditional_reason: str | None = None

    def conditional_nodes_unavailable(self) -> str | None:
        return self.conditional_reason

    def conditional_handle(self, stream: Any) -> int:
        assert stream.captured is not None, "a conditional handle outside a capture"
        handle = next(self._handles)
        self.conditions[handle] = False
        return handle

    def add_conditional_node(self, stream: Any, handle: int, kind: str) -> FakeConditional:
        assert stream.captured is not None, "a conditional node outside a capture"
        assert kind in ("while", "if") and handle in self.conditions, (kind, handle)
        node = FakeConditional(kind, handle)
        stream.captured.append(Launch("conditional", node, kind, (), {}))
        self.conditionals.append(node)
        return node

    def begin_capture_into(self, stream: Any, graph: Any) -> None:
        assert isinstance(graph, FakeConditional) and stream.captured is None
        stream.captured, stream.into = [], graph

    def end_capture_into(self, stream: Any) -> None:
        assert stream.captured is not None, "end_capture_into without begin_capture_into"
        stream.into.launches, stream.captured = stream.captured, None

    def _run_conditional(self, node: FakeConditional) -> None:
        """Run ``node``'s body while (WHILE) or if (IF) its flag is set, as the device would."""
        while self.conditions[node.handle]:
            node.runs += 1
            for launch in node.launches:
                self._replay(launch)
            if node.kind == "if":
                break

    def blas_handle(self, stream: Any) -> FakeHandle:
        # cublasCreate allocates (its workspace too): on a GPU that fails while the stream (or
        # the current one) captures, so a handle must be made before any recording
        if stream.captured is not None or self._capturing() is not None:
            raise RuntimeError("cublasCreate while a stream captures: a cuBLAS handle must be "
                               "made before recording (refused by the recording seam)")
        return FakeHandle(stream)

    def blas(self, routine: str, *args: Any) -> None:
        signature = cublas._SIGNATURES.get(routine)
        assert signature is not None, f"unknown cuBLAS routine {routine}"
        assert len(args) == len(signature), f"{routine}: {len(args)} arguments"
        assert all(isinstance(a, int) for a in args), f"{routine}: {args}"
        launch = Launch("cublas", routine, routine, args, {})
        self.launches.append(launch)
        capture = self._capturing()
        if capture is not None:
            capture.captured.append(launch)


#: public name ("gs.sum", "optim.Adam", "ad.vjp_add", "cli demo") -> tests that run it through
#: the recording seam (filled by `covers`; tests/test_cupy_api_walk.py checks it is complete)
COVERED: dict[str, list[str]] = {}


def covers(*names: str) -> Any:
    """Mark a dispatch test as covering public ``names`` (for the API walk)."""

    def mark(test: Any) -> Any:
        for name in names:
            COVERED.setdefault(name, []).append(f"{test.__module__}.{test.__name__}")
        return test

    return mark


@contextlib.contextmanager
def recording(memory: FakeMemory, *, check: bool = True,
              compile: bool = False) -> Iterator[RecordingSeam]:
    """`RecordingSeam` over ``memory`` as CuPy's seam for the block (``compile``: NVRTC
    compiles each distinct generated kernel, as CuPy would on a GPU)."""
    seam = RecordingSeam(memory, check=check, compile=compile)
    with CUPY.seam_replaced(seam):
        yield seam


# ---- complex kernel parameters (devices.cupy.products: CuPy's complex<T> as cfloat/cdouble) ----

C_TYPES.update({"cfloat": np.complex64, "cdouble": np.complex128})


# ---- the fold's current-device check (issue 22: `CudaSeam.is_current_device`) ---------------


def _is_current_device(self: RecordingSeam, device: object) -> bool:
    """The double's answer: the fake memory's one device (0) is always current."""
    return device == self.current_device()


RecordingSeam.is_current_device = _is_current_device  # type: ignore[method-assign,assignment]
