"""The CuPy launch path of gpuscalar.optim, run on the CPU against an emulated CUDA device.

Why this file exists: CI has no GPU, so the code that only CuPy runs -- address tables, block
tables, the kernel that writes gradient addresses from its arguments, kernel arguments, the
step-counter kernel, and what a CUDA graph replay does to them -- would otherwise first execute
on a real device. Here CuPy itself is the backend, on real ``cupy.ndarray``s over fake memory
(tests/cupy_fake.py), so the optimizers get their real CUDA executor
(`gpuscalar.devices.cupy.steps.CudaExecutor`); the double stands for ONE seam, gpuscalar's
`CudaSeam` (installed with `CUPY.seam_replaced`), not for a device backend. It receives every
launch (recorded and checked against CuPy by `tests.cupy_seam.RecordingSeam`), checks each
argument against the C type of the generated kernel's parameter (a CuPy RawKernel passes a
NumPy scalar by its dtype: a float64 for a ``const float`` would be garbage on a GPU; a struct
parameter takes a size-one NumPy array of the struct's dtype), reads the tables' addresses back
to the allocations they point into, and runs the generated code's scalar lines and the
Program's rules (the library's host evaluator) with NumPy, block by block. It records graphs
as CuPy does (launches kept with copies of their by-value arguments, uploads refused) and
replays them without running the step's Python.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import re
import shutil
import subprocess
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import optim, sync
from gpuscalar.devices import CUPY
from gpuscalar.devices.cupy import control as cuda_control
from gpuscalar.devices.cupy import fusion, steps
from gpuscalar.lazy import codegen
from gpuscalar.optim import executors
from gpuscalar.optim.kernels import (
    ADDRESS_CHUNK,
    ADDRESS_STRUCT,
    MULTI_TENSOR_CHUNK,
    address_table_source,
    kernel_source,
)
from gpuscalar.optim.program import POINTER_KINDS, PROGRAMS, PendingScalar, Program, apply_rules
from gpuscalar.optim.sgd import SGD_PLAIN

from .cupy_fake import cupy_or_fail, host_view
from .test_optim import CONFIGS, MIXED_SHAPES, Reference, rel_error

if os.environ.get("CI") == "true":  # the cuda12 extra installs CuPy: missing is an error there
    import cupy  # noqa: F401
cupy = pytest.importorskip("cupy")  # real cupy.ndarrays over fake memory

from .cupy_device import DeviceSeam, fake_device, to_device  # noqa: E402 - after CuPy
from .cupy_seam import FakeGraph, Launch, parse_kernel  # noqa: E402 - after CuPy


class NativeKernels:
    """Generated CUDA C compiled for the host with g++, one thread after another (the kernels
    are elementwise: no thread reads what another writes). One translation unit for all."""

    SHIM = "\n".join([
        "#include <cmath>", "using std::sqrt; using std::pow;", "#define __global__",
        "#define __device__", "#define __forceinline__ inline", "#define __restrict__ __restrict",
        "struct gs_dim3 { unsigned long long x; };",
        "static gs_dim3 blockIdx, threadIdx, blockDim, gridDim;", "",
    ])
    _CTYPES = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
               np.dtype(np.int64): ctypes.c_longlong, np.dtype(np.int32): ctypes.c_int,
               np.dtype(np.uint32): ctypes.c_uint, np.dtype(np.uint64): ctypes.c_ulonglong,
               np.dtype(np.bool_): ctypes.c_bool}

    def __init__(self, sources: dict[str, str], workdir: pathlib.Path) -> None:
        self.index = {source: i for i, source in enumerate(sources)}
        units = [self.SHIM]
        for source, i in self.index.items():
            name = sources[source]
            _, params, _ = parse_kernel(source, name)
            signature = ", ".join(p[0] for p in params)
            names = ", ".join(p[3] for p in params)
            units += [
                f"namespace gs_k{i} {{", source.replace('extern "C" __global__', ""),
                f'extern "C" void gs_launch_{i}(long long gs_grid, long long gs_block, '
                f"{signature}) {{",
                "    blockDim.x = gs_block; gridDim.x = gs_grid;",
                "    for (long long b = 0; b < gs_grid; ++b)",
                "        for (long long t = 0; t < gs_block; ++t) {",
                f"            blockIdx.x = b; threadIdx.x = t; {name}({names});",
                "        }", "}", "}",
            ]
        cpp, lib = workdir / "kernels.cpp", workdir / "kernels.so"
        cpp.write_text("\n".join(units))
        result = subprocess.run(["g++", "-O1", "-std=c++17", "-shared", "-fPIC", "-w", "-o",
                                 str(lib), str(cpp)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr[-4000:]
        self.lib = ctypes.CDLL(str(lib))

    def _by_value(self, arg: Any, dtype: np.dtype) -> Any:
        if dtype.fields is None:
            return self._CTYPES[dtype](arg.item())
        fields = []  # a ctypes struct of the same layout, passed by value as the driver would
        for field, (field_dtype, _) in dtype.fields.items():
            ctype = self._CTYPES[field_dtype.base]
            fields.append((field, ctype * field_dtype.shape[0] if field_dtype.shape else ctype))
        struct = type("Struct", (ctypes.Structure,), {"_fields_": fields})
        assert ctypes.sizeof(struct) == dtype.itemsize
        return struct.from_buffer_copy(arg.tobytes())

    def launch(self, source: str, args: list[tuple], grid: int, block: int) -> None:
        function = getattr(self.lib, f"gs_launch_{self.index[source]}")
        values = [ctypes.c_longlong(grid), ctypes.c_longlong(block)]
        for arg, dtype, pointer in args:
            values.append(ctypes.c_void_p(CUPY.data_address(arg)) if pointer
                          else self._by_value(arg, dtype))
        function.restype = None
        function(*values)


class Inputs:
    """What the tests make their inputs with: fake-device arrays holding host data, made
    outside the device's accounting (neither a launch, a recorded graph node, nor an upload:
    they stand for data already on the device)."""

    @staticmethod
    def asarray(a: Any, dtype: Any = None) -> Any:
        return to_device(host_view(a) if isinstance(a, cupy.ndarray) else a, dtype)

    @staticmethod
    def zeros(shape: Any, dtype: Any = float) -> Any:
        return to_device(np.zeros(shape, dtype))

    @staticmethod
    def full(shape: Any, value: Any, dtype: Any = None) -> Any:
        return to_device(np.full(shape, value, dtype))

    @staticmethod
    def copy(a: Any) -> Any:
        return to_device(host_view(a))


class EmulatedCuda(DeviceSeam):
    """gpuscalar's CUDA seam (`CUPY.seam`) whose kernels run as NumPy emulations, over real
    ``cupy.ndarray``s in fake memory (tests/cupy_device.py's device, so user-level CuPy code
    such as bench/gpu_adam.py runs too). CuPy is the backend: the optimizers get their real
    CUDA executor, and every launch reaches this double through the one seam, where
    `tests.cupy_seam.RecordingSeam` records it and checks it against CuPy.

    It also emulates CUDA graph capture as CuPy does it (`record` / `replay`, on the seam's
    fake streams): while recording, launches are recorded, not run (``records_only``), with
    their by-value arguments copied (the graph keeps the values; pointers keep pointing at the
    same memory), and an upload is refused; a replay runs the recorded launches without
    running any Python of the step."""

    records_only = True

    def __init__(self, memory: Any, native: NativeKernels | None = None) -> None:
        super().__init__(memory)
        self.sources: dict[str, str] = {}  # every source launched -> its kernel name
        self.native = native
        self.max_chunk = MULTI_TENSOR_CHUNK  # the longest block a multi-tensor launch has
        self.xp = Inputs()

    def names(self) -> list[str]:
        """The names of the launches recorded since the last `clear`."""
        return [launch.name for launch in self.launches]

    def launch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if isinstance(func, cupy.RawKernel) and not getattr(self._checking, "on", False):
            grid, block, kernel_args = args
            # checked here, before RecordingSeam's own check, so the message names the C type;
            # a replay passes these same (copied) arguments again
            self._check_arguments(func.code, func.name, kernel_args)
            # CuPy copies by-value arguments when it launches (a graph node keeps them)
            args = (grid, block, tuple(a.copy() if type(a) is np.ndarray else a
                                       for a in kernel_args))
        return super().launch(func, args, kwargs)

    def _answer(self, launch: Launch) -> Any:
        if launch.kind != "raw" or launch.name == cuda_control.CONDITION_KERNEL:
            return super()._answer(launch)
        (grid,), (block,), kernel_args = launch.args
        self.sources[launch.source] = launch.name
        self._run(launch.source, launch.name, list(kernel_args), grid, block)
        return None

    @contextlib.contextmanager
    def record(self) -> Any:
        """Record the block's launches as a graph (as gs.capture does on CuPy: a graph body,
        on a capturing stream); yields the list of recorded launches."""
        stream = self.new_stream()
        with stream:
            stream.begin_capture()
            try:
                with sync.graph_body():
                    yield stream.captured
            finally:
                stream.end_capture()

    def replay(self, graph: list[Launch]) -> None:
        """Run a recorded graph: the launches alone, no Python of the step (one op)."""
        sync.note_graph_replay()
        with sync.one_device_op():
            FakeGraph(self, graph).launch()

    # ---- the emulation ------------------------------------------------------------------
    def _memory(self, address: int, dtype: np.dtype, count: int) -> np.ndarray:
        """``count`` elements at ``address``, as a view of the allocation that holds them."""
        region = self.memory.region(address, count * dtype.itemsize)
        assert region is not None, (f"the kernel reads {count} x {dtype} at {address:#x}, "
                                    "which no allocation holds")
        assert address % dtype.itemsize == 0, "misaligned address"
        return region.view(dtype)

    def _check_arguments(self, source: str, name: str, args: Any) -> None:
        """Each argument against its C parameter, as the driver will read it: a pointer gets a
        device array of the pointed-to dtype, a struct a C-contiguous size-one NumPy array of
        the struct's dtype (what CuPy passes by value), a value a NumPy scalar of its dtype (a
        float64 for a ``const float`` would be garbage on a GPU)."""
        _, params, _ = parse_kernel(source, name)
        assert len(params) == len(args), f"{name}: {len(params)} parameters, {len(args)} args"
        for (param, want, pointer, _), arg in zip(params, args, strict=True):
            if pointer:
                ok = isinstance(arg, cupy.ndarray) and arg.dtype == want
            elif want.fields is not None:
                ok = (type(arg) is np.ndarray and arg.size == 1 and arg.dtype == want
                      and arg.flags.c_contiguous)
            else:
                ok = isinstance(arg, np.generic) and arg.dtype == want
            assert ok, f"{name}: {param} got {type(arg).__name__} {getattr(arg, 'dtype', '')}"

    def _run(self, source: str, name: str, args: list[Any], grid: int | None,
             block: int) -> None:
        t_type, params, body = parse_kernel(source, name)
        env: dict[str, Any] = {pname: host_view(arg) if pointer else arg
                               for (_, _, pointer, pname), arg in zip(params, args, strict=True)}
        if name.endswith("_mt"):  # every address the kernel will read lies in an allocation
            blocks = np.asarray(env["blocks"]).reshape(3, -1)
            assert blocks.shape[1] == int(env["n_blocks"]) == grid
            for tensor, start, end in blocks.T:
                assert 0 <= start < end and end - start <= self.max_chunk
                for table in (pname for _, _, _, pname in params if pname.endswith("_t")):
                    self._memory(int(np.asarray(env[table])[tensor]), t_type, int(end))
        if name == "gpuscalar_write_addresses":  # one block; n fits the struct and the table
            n = int(env["n"])
            assert grid == 1 and 0 < n <= ADDRESS_CHUNK and n <= env["table"].size
        if self.native is not None:
            self.native.launch(source, [(arg, want, pointer) for (_, want, pointer, _), arg
                                        in zip(params, args, strict=True)], grid, block)
            return
        lines = re.findall(r"const (T|bool) (\w+) = \((?:T|bool)\)(.*);", body)
        scalars = {}
        for ctype, sname, expression in lines:
            if not (sname.endswith(("_p", "_r")) or sname.startswith("gs_")):
                python = re.sub(r"\(\*(\w+)\)|\*(\w+)",
                                lambda m: f"{m.group(1) or m.group(2)}[()]", expression)
                value = eval(python, dict(env))  # noqa: S307 - the generated code under test
                scalars[sname] = np.asarray(value).astype(np.bool_ if ctype == "bool" else t_type)
            if sname == "skip" and scalars["skip"]:
                return  # "if (skip) return;"
        if name == "gpuscalar_count_step":
            env["count"][()] += 1
            return
        if name == "gpuscalar_write_addresses":
            env["table"][:n] = env["addresses"]["address"][0, :n]
            return
        program = next(p for p in PROGRAMS
                       if name in (f"gpuscalar_{p.name}_{t_type.name}",
                                   f"gpuscalar_{p.name}_{t_type.name}_mt"))
        if not name.endswith("_mt"):
            n = int(env["n"])
            self._apply(program, scalars, {a: env[f"{a}_p"].reshape(-1)[:n]
                                           for a in program.arrays})
            return
        for tensor, start, end in blocks.T:
            arrays = {}
            for array in program.arrays:
                address = int(np.asarray(env[f"{array}_t"])[tensor])
                arrays[array] = self._memory(address, t_type, int(end))[start:end]
            self._apply(program, scalars, arrays)

    @staticmethod
    def _apply(program: Program, scalars: dict[str, Any], arrays: dict[str, Any]) -> None:
        apply_rules(program, scalars, [arrays])


@contextlib.contextmanager
def emulated(native: NativeKernels | None = None) -> Iterator[EmulatedCuda]:
    """`EmulatedCuda` as CuPy's seam for the block, over a fresh fake device."""
    with fake_device() as (_, log):
        seam = log.seam = EmulatedCuda(log.memory, native)
        with CUPY.seam_replaced(seam):
            yield seam


@pytest.fixture
def emu() -> Iterator[EmulatedCuda]:
    cupy_or_fail()
    with emulated() as seam:
        yield seam


@pytest.mark.parametrize("grads_mode", ["reused", "new"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_classes_on_the_launch_path(emu, rng, config, grads_mode):
    cls, kw = CONFIGS[config]
    shapes = [*MIXED_SHAPES, (9000,)]  # three chunks
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [emu.xp.asarray(p) for p in init]
    opt = cls(params, **kw)
    ref = Reference(config, init)
    grads = [emu.xp.zeros(s, dtype=np.float32) for s in shapes]
    skip_flags = {b: gs.GPUScalar(emu.xp.asarray(b)) for b in (False, True)}
    for t in range(8):
        host_grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        if grads_mode == "new":
            grads = [emu.xp.asarray(g) for g in host_grads]
        else:
            for g, h in zip(grads, host_grads, strict=True):
                host_view(g)[...] = h
        emu.clear()
        with sync._activate(sync.SyncCounter()) as counter:
            opt.step(grads, skip_if=skip_flags[t == 3])
        assert counter.count == 0
        written = grads_mode == "new" or t == 0  # the gradient table: one launch (8 tensors)
        assert counter.device_ops == (3 if written else 2)
        assert emu.names() == ["gpuscalar_write_addresses"] * written + [
            f"gpuscalar_{opt._program.name}_float32_mt", "gpuscalar_count_step"]
        if t != 3:
            ref.step([g.astype(np.float64) for g in host_grads])
    for got, want in zip(params, ref.params, strict=True):
        if want.size:
            assert rel_error(host_view(got), want) < 1e-5
    assert int(opt.step_count) == 7


def test_dtype_groups_and_device_hyperparameters_on_the_launch_path(emu, rng):
    init = [rng.standard_normal(s) for s in [(3,), (5000,), (4, 2)]]
    dtypes = [np.float32, np.float64, np.float32]
    params = [emu.xp.asarray(p, dtype=d) for p, d in zip(init, dtypes, strict=True)]
    scalar = gs.GPUScalar
    opt = optim.Adam(params, lr=scalar(emu.xp.asarray(2e-2, dtype=np.float64)),
                     betas=(scalar(emu.xp.asarray(0.8, dtype=np.float32)), 0.99),
                     eps=scalar(emu.xp.asarray(1e-6)), weight_decay=0.01)
    grads = [emu.xp.asarray(rng.standard_normal(p.shape), dtype=p.dtype) for p in params]
    m = [np.zeros(p.shape) for p in init]
    v = [np.zeros(p.shape) for p in init]
    for t in range(1, 4):
        emu.clear()
        opt.step(grads)
        assert emu.names() == ["gpuscalar_write_addresses"] * (t == 1) + [
            "gpuscalar_adam_float32_mt", "gpuscalar_adam_float64_mt", "gpuscalar_count_step"]
        for i, g in enumerate(grads):
            init[i], m[i], v[i] = ref_adam(init[i].astype(dtypes[i]).astype(np.float64),
                                           host_view(g).astype(np.float64), m[i], v[i], t, 2e-2,
                                           np.float32(0.8), 0.99, 1e-6, 0.01)
    for got, want in zip(params, init, strict=True):
        assert rel_error(host_view(got), want) < 1e-5


def ref_adam(p, g, m, v, t, lr, b1, b2, eps, wd):
    g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps), m, v


def test_functional_steps_on_the_launch_path(emu, rng):
    p0 = rng.standard_normal(300).astype(np.float32)
    g0 = rng.standard_normal(300).astype(np.float32)
    p, g = emu.xp.asarray(p0), emu.xp.asarray(g0)
    m, v = emu.xp.zeros(300, dtype=np.float32), emu.xp.zeros(300, dtype=np.float32)
    step = gs.GPUScalar(emu.xp.asarray(1, dtype=np.int64))  # a value: CuPy's copy kernel
    optim.adam_step(p, g, m, v, step=step, lr=0.1)
    assert emu.names() == ["copy", "gpuscalar_adam_float32"]
    expected = p0 - 0.1 * g0 / (np.abs(g0) + 1e-8)
    np.testing.assert_allclose(host_view(p), expected, rtol=1e-4, atol=1e-6)
    buf = optim.sgd_step(p, g, lr=0.5, momentum=0.9)
    np.testing.assert_array_equal(host_view(buf), g0)


def test_state_dict_round_trip_on_the_launch_path(emu, rng):
    params = [emu.xp.asarray(rng.standard_normal(s), dtype=np.float32) for s in [(4,), (3, 3)]]
    grads = [emu.xp.asarray(rng.standard_normal(p.shape), dtype=np.float32) for p in params]
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    opt.step(grads)
    saved = opt.state_dict()
    copies = [emu.xp.copy(p) for p in params]
    opt.step(grads)
    other = optim.SGD(copies, lr=0.1, momentum=0.9)
    other.load_state_dict(saved)
    other.step(grads)
    for a, b in zip(params, copies, strict=True):
        np.testing.assert_array_equal(host_view(a), host_view(b))


def _table(emu, opt) -> list[int]:
    """The emulated device's gradient table of ``opt``, as a list of addresses."""
    return host_view(opt._grad_table).tolist()


def test_gradient_table_is_written_from_kernel_arguments(emu, rng):
    """New gradient arrays: the table is written by `gpuscalar_write_addresses`, whose
    arguments (checked against the generated C signature: the table slice, the count as int64,
    the addresses as a size-one NumPy struct passed by value) hold the arrays' addresses, one
    launch per ADDRESS_CHUNK tensors, and never by an upload (the seam records every
    host-to-device copy: there is none)."""
    n = 2 * ADDRESS_CHUNK + 3  # three chunks, the last one short
    dtypes = [np.float64 if k % 3 == 0 else np.float32 for k in range(n)]  # two dtype groups
    params = [emu.xp.asarray(rng.standard_normal(k % 4 + 1), dtype=d)
              for k, d in enumerate(dtypes)]
    init = [host_view(p).astype(np.float64) for p in params]
    opt = optim.SGD(params, lr=0.5)
    for _ in range(2):
        host_grads = [rng.standard_normal(p.shape) for p in params]
        grads = [emu.xp.asarray(g, dtype=p.dtype)
                 for g, p in zip(host_grads, params, strict=True)]
        emu.clear()
        with sync._activate(sync.SyncCounter()) as counter:
            opt.step(grads)
        assert counter.count == 0 and counter.device_ops == 3 + 2 + 1
        assert not emu.uploads  # the seam saw no host-to-device copy (nor `xp.asarray`)
        assert emu.names() == ["gpuscalar_write_addresses"] * 3 + [
            "gpuscalar_sgd_float64_mt", "gpuscalar_sgd_float32_mt", "gpuscalar_count_step"]
        # the table holds each gradient's address, in table order (dtype group by group)
        assert _table(emu, opt) == [CUPY.data_address(grads[i]) for i in opt._order]
        for i, g in enumerate(host_grads):
            init[i] = init[i].astype(dtypes[i]).astype(np.float64) - 0.5 * g.astype(dtypes[i])
        for p, want in zip(params, init, strict=True):
            np.testing.assert_allclose(host_view(p).astype(np.float64), want, rtol=1e-6)


def test_the_emulator_checks_the_address_struct(emu):
    """The argument check can fail for the struct too: addresses passed as an int64 array
    (CuPy would refuse a size-500 NumPy array), or a struct of the wrong size."""
    source, name = address_table_source()
    table = emu.xp.zeros(4, dtype=np.int64)
    addresses = np.arange(ADDRESS_CHUNK, dtype=np.int64)
    with pytest.raises(AssertionError, match="const gs_addresses addresses got ndarray int64"):
        CUPY.launch_kernel(source, name, 4, [table, np.int64(4), addresses], grid=1)
    short = np.zeros(1, np.dtype([("address", np.int64, (ADDRESS_CHUNK - 1,))]))
    with pytest.raises(AssertionError, match="const gs_addresses addresses got ndarray"):
        CUPY.launch_kernel(source, name, 4, [table, np.int64(4), short], grid=1)
    CUPY.launch_kernel(source, name, 3, [table, np.int64(3), addresses.view(ADDRESS_STRUCT)],
                      grid=1)
    assert host_view(table).tolist() == [0, 1, 2, 0]


@pytest.mark.parametrize("config", ["adam", "sgd_momentum"])
def test_captured_step_with_new_gradient_arrays_on_the_launch_path(emu, rng, config):
    """A graph recorded as CuPy records one (no upload possible; by-value arguments kept;
    replays run no Python) of a step that makes NEW gradient arrays each call (as an AD loop
    does; at recording they come from the graph's pool, whose addresses the replays reuse, and
    the graph's earlier nodes write them): every replay updates with the values written there,
    matching the float64 reference over many replays, with zero syncs and one op each."""
    cls, kw = CONFIGS[config]
    shapes = [(3, 5), (7,), (), (5000,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [emu.xp.asarray(p) for p in init]
    opt = cls(params, **kw)
    ref = Reference(config, init)
    made = []  # the gradient arrays each call of the step made

    def step() -> None:
        grads = [emu.xp.zeros(s, dtype=np.float32) for s in shapes]
        made.append(grads)
        opt.step(grads)

    for _ in range(2):  # warm-up: eager steps, as gs.capture's, on the zeros they make
        step()
        ref.step([np.zeros(s) for s in shapes])
    with emu.record() as graph:
        step()
    assert [launch.name for launch in graph] == ["gpuscalar_write_addresses",
                                               f"gpuscalar_{opt._program.name}_float32_mt",
                                               "gpuscalar_count_step"]
    recorded = made[-1]
    # an eager step on the recorded arrays before any replay: the recording ran nothing, so the
    # table still points at the last warm-up's arrays and must be written
    host_grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    for g, h in zip(recorded, host_grads, strict=True):
        host_view(g)[...] = h
    opt.step(recorded)
    ref.step([h.astype(np.float64) for h in host_grads])
    for _ in range(12):
        host_grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for g, h in zip(recorded, host_grads, strict=True):
            host_view(g)[...] = h  # what the graph's own nodes would compute into its pool
        host_view(opt._grad_table)[:] = 0  # whatever an eager step left: the replay rewrites
        with sync._activate(sync.SyncCounter()) as counter:
            emu.replay(graph)
        assert counter.count == 0 and counter.device_ops == 1
        ref.step([h.astype(np.float64) for h in host_grads])
    assert int(opt.step_count) == 15
    for got, want in zip(params, ref.params, strict=True):
        assert rel_error(host_view(got), want) < 1e-5


def test_eager_steps_between_replays_on_the_launch_path(emu, rng):
    """Eager steps with other gradients between replays: the replay restores the table it was
    recorded with, even when the recording passed the same arrays as the step before it (the
    body always writes the table), and an eager step after a replay rewrites its own, even
    with the same arrays as the eager step before (a replay moved `sync.graph_replays()`)."""
    shape = (6,)
    p0 = rng.standard_normal(shape).astype(np.float32)
    p = emu.xp.asarray(p0)
    opt = optim.SGD([p], lr=1.0)
    static = emu.xp.asarray(np.full(shape, 1.0, np.float32))  # the captured step's gradients
    other = emu.xp.asarray(np.full(shape, 100.0, np.float32))
    for _ in range(2):
        opt.step([static])  # warm-up with the arrays the step is then recorded with
    with emu.record() as graph:
        opt.step([static])
    expected = p0.astype(np.float64) - 2 * 1.0
    for grads, replay in [(other, False), (None, True), (other, False), (other, False),
                          (None, True), (None, True), (static, False), (other, False)]:
        emu.clear()
        if replay:
            emu.replay(graph)
            expected = expected - 1.0
        else:
            opt.step([grads])
            expected = expected - host_view(grads).astype(np.float64)
        np.testing.assert_allclose(host_view(p).astype(np.float64), expected, rtol=1e-6)
    assert int(opt.step_count) == 10


@pytest.mark.parametrize("chunk", [1000, 65536])
def test_chunk_size_is_the_block_tables_alone(emu, rng, chunk):
    """Another `chunk_size` (what bench/gpu_adam.py compares) changes only the block table:
    the same kernel source, blocks of at most ``chunk`` elements, the same numbers."""
    shapes = [(9000,), (3, 5), (), (70000,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [emu.xp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]

    class Chunked(optim.Adam):
        chunk_size = chunk

    results, sources = [], []
    for cls in (optim.Adam, Chunked):
        emu.max_chunk = cls.chunk_size
        params = [emu.xp.asarray(p) for p in init]
        opt = cls(params, lr=1e-2)
        emu.sources.clear()
        for _ in range(3):
            opt.step(grads)
        blocks = host_view(opt._groups[0]._blocks)
        assert blocks.shape[1] == sum(-(-s // cls.chunk_size) for s in (9000, 15, 1, 70000))
        assert (blocks[2] - blocks[1]).max() == min(cls.chunk_size, 70000)
        results.append([host_view(p).copy() for p in params])
        sources.append(set(emu.sources))
    assert sources[0] == sources[1]
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gpu_adam_bench_runs_on_the_launch_path(emu, rng, capsys):
    """bench/gpu_adam.py's rows (the chunk sizes compared among them) and its report, with
    PyTorch's rows present or not, run on the emulated device with tiny sizes (the GPU run is
    the first that can time them; no timing is checked here, only what is reported)."""
    from bench import gpu_adam

    def new(data: np.ndarray) -> Any:
        return to_device(np.ascontiguousarray(data))

    fake_cupy = types.SimpleNamespace(
        float32=np.float32,
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None)),
        empty=lambda n, dtype: new(np.empty(n, dtype)),
        empty_like=lambda a: new(np.empty(a.shape, a.dtype)),
        zeros_like=lambda a: new(np.zeros(a.shape, a.dtype)),
        copy=lambda a: new(host_view(a)),
        concatenate=lambda arrays: new(np.concatenate([host_view(a) for a in arrays])),
        copyto=lambda dst, src: host_view(dst).__setitem__(Ellipsis, host_view(src)),
        sqrt=cupy.sqrt,
        random=types.SimpleNamespace(
            standard_normal=lambda n, dtype: new(rng.standard_normal(n).astype(dtype))),
    )
    emu.max_chunk = 65536
    rows = gpu_adam._large_rows(fake_cupy, 70000, 2, [4096, 16384, 65536])
    rows += gpu_adam._many_rows(fake_cupy, 3, 100, 2)
    names = [r["name"] for r in rows]
    assert names == ["copy", "Adam class", "Adam class, chunk 16,384", "Adam class, chunk 65,536",
                     "flat buffer (adam_step)", "CuPy unfused", "Adam class",
                     "Adam class, new grads", "flat buffer (adam_step)", "adam_step loop"]
    assert [r.get("chunk") for r in rows[1:4]] == [4096, 16384, 65536]
    acceptance = gpu_adam._report([dict(r) for r in rows])
    assert acceptance["best_chunk"] in (4096, 16384, 65536)
    assert acceptance["large_beats_torch_fused"] is None
    assert "no comparison with its fused Adam" in capsys.readouterr().out
    torch_rows = [{"name": "torch fused", "case": rows[1]["case"], "ms_per_step": 1e9,
                   "gb_per_s": 1e-9},
                  {"name": "torch fused", "case": rows[6]["case"], "ms_per_step": 1e-9,
                   "gb_per_s": 1e9}]
    acceptance = gpu_adam._report([dict(r) for r in rows] + torch_rows)
    assert acceptance["large_beats_torch_fused"] is True
    assert acceptance["many_tensors_beats_torch_fused"] is False
    out = capsys.readouterr().out
    assert "gpuscalar faster" in out and "PyTorch faster" in out


def test_cupy_upload_is_refused_inside_a_graph_body():
    """Belt and braces: CupyBackend.upload raises, naming the problem, inside a captured step
    (checked before CuPy is touched: this runs without a GPU)."""
    with sync.graph_body(), pytest.raises(RuntimeError, match="inside a captured step"):
        CUPY.upload(object(), np.zeros(3))


def test_the_emulator_rejects_a_wrongly_typed_argument(emu):
    """The argument check can fail: a float64 passed for a ``const float`` parameter."""
    source, name = kernel_source(SGD_PLAIN, "float32", [None, None])
    x = emu.xp.zeros(4, dtype=np.float32)
    with pytest.raises(AssertionError, match="const T lr_val got float64"):
        CUPY.launch_kernel(source, name, 4, [np.int64(4), x, x, np.float64(0.1),
                                            np.float32(0.0)])


def _scenario(device: EmulatedCuda, seed: int) -> list[np.ndarray]:
    """Every kind of launch gpuscalar.optim makes, on ``device``: every class configuration
    over mixed shapes (a tensor spanning three chunks, an empty one), reused and new gradients,
    a skipped step; two dtype groups with GPUScalar hyperparameters of several dtypes; the
    functional steps. Returns every array it updated, as NumPy copies."""
    rng = np.random.default_rng(seed)
    xp, out = device.xp, []
    shapes = [*MIXED_SHAPES, (9000,), (257,)]
    for cls, kw in CONFIGS.values():
        params = [xp.asarray(rng.standard_normal(s), dtype=np.float32) for s in shapes]
        opt = cls(params, **kw)
        reused = [xp.asarray(rng.standard_normal(s), dtype=np.float32) for s in shapes]
        flags = [gs.GPUScalar(xp.asarray(b)) for b in (False, True, False)]
        for t, flag in enumerate(flags):
            grads = reused if t != 1 else [xp.copy(g) for g in reused]
            opt.step(grads, skip_if=flag)
        opt.step(reused)
        out += params + [s for name in opt._program.arrays[2:] for s in opt.state(name)]
        out.append(opt.step_count.array)
    dtypes = [np.float64, np.float32, np.float64]
    params = [xp.asarray(rng.standard_normal(s), dtype=d)
              for s, d in zip([(5,), (300,), (4097,)], dtypes, strict=True)]
    scalar = gs.GPUScalar
    opt = optim.AdamW(params, lr=scalar(xp.asarray(1e-2, dtype=np.float32)),
                      betas=(scalar(xp.asarray(0.8)), 0.95),
                      eps=scalar(xp.asarray(1, dtype=np.int32)),
                      weight_decay=scalar(xp.asarray(0, dtype=np.int64)))
    grads = [xp.asarray(rng.standard_normal(p.shape), dtype=p.dtype) for p in params]
    for _ in range(3):
        opt.step(grads)
    sgd = optim.SGD([xp.asarray(rng.standard_normal(7))], lr=scalar(xp.asarray(0.1)),
                    momentum=scalar(xp.asarray(0.9, dtype=np.float32)), nesterov=True)
    sgd.step([xp.asarray(rng.standard_normal(7))])
    sgd.step([xp.asarray(rng.standard_normal(7))])
    out += params + opt.state("exp_avg_sq") + sgd.params + sgd.state("momentum_buffer")
    p, g = xp.asarray(rng.standard_normal(600)), xp.asarray(rng.standard_normal(600))
    m, v = xp.zeros(600), xp.zeros(600)
    optim.adam_step(p, g, m, v, step=scalar(xp.asarray(2, dtype=np.int64)), lr=0.1,
                    betas=(0.5, scalar(xp.asarray(0.9))), skip_if=scalar(xp.asarray(False)))
    buf = optim.sgd_step(p, g, lr=0.5, momentum=0.9, dampening=0.1)
    optim.sgd_step(p, g, buf, lr=0.5, momentum=0.9, dampening=0.1)
    out += [p, m, v, buf]
    return [host_view(a).copy() for a in out]


def test_generated_cuda_c_runs_natively(tmp_path):
    """The generated CUDA C itself (ILP loops, block tables, scalar lines, the counter kernel)
    compiled for the host and run over the same scenario as the NumPy emulation: the same
    numbers. Skips where no host C++ compiler is installed (the NVRTC checks still run)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine to run the generated C on the host")
    cupy_or_fail()
    with emulated() as numpy_run:
        expected = _scenario(numpy_run, seed=7)
    kernels = {name.removesuffix("_mt").rsplit("_", 1)[0] for name in numpy_run.sources.values()}
    assert kernels == {"gpuscalar_adam", "gpuscalar_adamw", "gpuscalar_sgd",
                       "gpuscalar_sgd_momentum", "gpuscalar_sgd_nesterov", "gpuscalar_rmsprop",
                       "gpuscalar_rmsprop_centered_momentum", "gpuscalar_lion",
                       "gpuscalar_count", "gpuscalar_write"}
    with emulated(NativeKernels(numpy_run.sources, tmp_path)) as native:
        got = _scenario(native, seed=7)
    assert set(native.sources) <= set(numpy_run.sources)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)


def test_a_pending_hyperparameter_cupy_cannot_compute_is_evaluated_first(emu, rng, monkeypatch):
    """A pending learning rate is computed in the kernel's prelude when CuPy kernel code exists
    for it; when it does not (an operation with no fusable routine), it is evaluated first (one
    launch) and passed by pointer, and the step still runs."""
    lr = gs.GPUScalar(emu.xp.asarray(0.5)) * 0.1
    assert type(executors.route(lr)[0]) is PendingScalar

    def no_code(plan, prefix):
        raise codegen.FusionUnsupported("no fusable routine")

    monkeypatch.setattr(steps, "_CUPY_FUSES", {})
    monkeypatch.setattr(codegen, "plan_code", no_code)
    # nor a fused kernel an earlier test built for the same expression (this seam answers an
    # ElementwiseKernel with memory whose values it does not compute; it computes a ufunc)
    monkeypatch.setattr(fusion, "_KERNELS", fusion.BoundedCache())
    lr = gs.GPUScalar(emu.xp.asarray(0.5)) * 0.1
    assert executors.route(lr)[0] is POINTER_KINDS[np.dtype("float64")] and lr.is_materialized
    start = rng.standard_normal(5).astype(np.float32)
    params = [emu.xp.asarray(start)]
    opt = optim.SGD(params, lr=gs.GPUScalar(emu.xp.asarray(0.5)) * 0.1)
    opt.step([emu.xp.asarray(np.ones(5, np.float32))])
    np.testing.assert_allclose(host_view(params[0]), start - np.float32(0.05), rtol=1e-6)


def test_the_emulator_bounds_every_table_read(emu):
    """The address check can fail: a read through a table address must lie inside one
    allocation (its requested size, not the fake memory's padding)."""
    x = emu.xp.zeros(4, dtype=np.float32)
    address = CUPY.data_address(x)
    assert emu._memory(address, np.dtype(np.float32), 4).tolist() == [0.0] * 4
    assert emu._memory(address + 4, np.dtype(np.float32), 3).size == 3
    for at, count in [(address, 5), (address + 4, 4), (64, 1)]:
        with pytest.raises(AssertionError, match="which no allocation holds"):
            emu._memory(at, np.dtype(np.float32), count)


def test_a_repeated_functional_step_reuses_its_launch_plan(emu, rng, monkeypatch):
    """A functional step's kernel, grid and count are decided once per (program, dtype, scalar
    kinds, skip kind, size): a repeated step makes no new plan and skips the general array
    checks, with the values of the general path; another size or dtype makes its own plan.
    Non-contiguous arrays still get the general checks' error."""
    from gpuscalar.optim import checks

    p0, g0 = rng.standard_normal(300), rng.standard_normal(300)
    p, g = emu.xp.asarray(p0), emu.xp.asarray(g0)
    lr = gs.GPUScalar(emu.xp.asarray(0.05))  # read through a pointer
    optim.sgd_step(p, g, lr=lr)
    assert steps._LAUNCH_PLANS  # (emptied under this seam, then made)
    made = []
    plan = steps.CudaExecutor._plan
    monkeypatch.setattr(steps.CudaExecutor, "_plan",
                        lambda self, key: made.append(key) or plan(self, key))
    with monkeypatch.context() as patch:
        patch.setattr(checks, "check_array", _refuse_checks)
        for _ in range(3):
            optim.sgd_step(p, g, lr=lr, weight_decay=0.0)
    assert made == []
    expected = p0.copy()
    for _ in range(4):
        expected = expected - 0.05 * (g0 + 0.0 * expected)
    np.testing.assert_allclose(host_view(p), expected, rtol=1e-12)
    q = emu.xp.asarray(rng.standard_normal(7).astype(np.float32))
    optim.sgd_step(q, emu.xp.asarray(np.ones(7, np.float32)), lr=lr)
    assert len(made) == 1 and made[0][1] == np.float32 and made[0][-1] == 7
    strided = emu.xp.asarray(np.zeros(600))[::2]
    assert checks._placed(p, strided) is None
    with pytest.raises(ValueError, match="grad must be C-contiguous"):
        optim.sgd_step(p, strided, lr=lr)


def _refuse_checks(*args, **kwargs):
    raise AssertionError("the general checks ran")
