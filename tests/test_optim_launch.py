"""The CuPy launch path of gpuscalar.optim, run on the CPU against an emulated CUDA device.

Why this file exists: CI has no GPU, so the code that only CuPy runs -- address tables, block
tables, gradient-address uploads, kernel arguments, the step-counter kernel -- would otherwise
first execute on a real device. Here a backend that is not host-evaluating (as CuPy) receives
every `launch_kernel` call, checks each argument against the C type of the generated kernel's
parameter (a CuPy RawKernel passes a NumPy scalar by its dtype: a float64 for a ``const float``
would be garbage on a GPU), reads the tables' addresses back to the arrays they point into, and
runs the generated code's scalar lines and the Program's strings with NumPy, block by block.
"""

from __future__ import annotations

import contextlib
import ctypes
import pathlib
import re
import shutil
import subprocess
import types
from typing import Any

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import backend as backend_module
from gpuscalar import optim, sync

from .test_optim import CONFIGS, MIXED_SHAPES, Reference, rel_error


class EmuArray(np.ndarray):
    """An array of the emulated device."""


_C_TYPES = {"float": np.float32, "double": np.float64, "long long": np.int64, "int": np.int32,
            "unsigned int": np.uint32, "unsigned long long": np.uint64, "bool": np.bool_}


def _parse(source: str, name: str) -> tuple[np.dtype | None, list[tuple], str]:
    """The kernel's T, its parameters as (declaration, NumPy dtype, is_pointer, name), and the
    source after the signature."""
    signature = re.search(rf'void {name}\((.*?)\) {{', source).group(1)
    typedef = re.search(r"typedef (\w+) T;", source)
    t_type = np.dtype(_C_TYPES[typedef.group(1)]) if typedef else None
    params = []
    for param in (p.strip() for p in signature.split(",")):
        match = re.fullmatch(r"(?:const )?([\w ]+?)(\*)?(?: __restrict__)? (\w+)", param)
        ctype, pointer, pname = match.groups()
        want = t_type if ctype == "T" else np.dtype(_C_TYPES[ctype])
        params.append((param, want, bool(pointer), pname))
    return t_type, params, source[source.index(signature) + len(signature):]


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
            _, params, _ = _parse(source, name)
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

    def launch(self, source: str, args: list[tuple], grid: int, block: int,
               device: EmulatedCuda) -> None:
        function = getattr(self.lib, f"gs_launch_{self.index[source]}")
        values = [ctypes.c_longlong(grid), ctypes.c_longlong(block)]
        for arg, dtype, pointer in args:
            values.append(ctypes.c_void_p(device.data_address(arg)) if pointer
                          else self._CTYPES[dtype](arg.item()))
        function.restype = None
        function(*values)


class _Namespace(types.SimpleNamespace):
    """Allocation functions of the emulated device; NumPy's ufuncs for everything else."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


class EmulatedCuda(backend_module.Backend):
    """A device backend (kernels, not host evaluation) whose kernels run as NumPy emulations."""

    name = "emulated-cuda"

    def __init__(self, native: NativeKernels | None = None) -> None:
        self.buffers: list[EmuArray] = []  # every allocation, to resolve kernel addresses
        self.launches: list[str] = []
        self.sources: dict[str, str] = {}  # every source launched -> its kernel name
        self.native = native
        self._xp = _Namespace(
            zeros=lambda *a, **k: self._new(np.zeros(*a, **k)),
            asarray=lambda a, dtype=None: self._new(np.array(a, dtype=dtype, copy=True)),
            copy=lambda a: self._new(np.array(a, copy=True)),
            copyto=np.copyto,
        )

    @property
    def xp(self) -> Any:
        return self._xp

    def _new(self, data: np.ndarray) -> EmuArray:
        array = data.view(EmuArray)
        self.buffers.append(array)
        return array

    def owns(self, value: object) -> bool:
        return type(value) is EmuArray

    def device_of(self, array: Any) -> object:
        return 0

    def device_context(self, device: object) -> Any:
        return contextlib.nullcontext()

    def read_scalar(self, array: Any) -> Any:
        return np.asarray(array).item()

    def data_address(self, array: Any) -> int:
        return int(array.__array_interface__["data"][0])

    def upload(self, array: Any, host: np.ndarray) -> None:
        assert type(host) is np.ndarray and host.dtype == array.dtype
        assert array.flags.c_contiguous
        self.call(np.copyto, array, host)

    def launch_kernel(self, source: str, name: str, size: int, args: Any, *,
                      grid: int | None = None, block: int = 256) -> None:
        self.launches.append(name)
        self.sources[source] = name
        if grid is None:  # as CupyBackend.launch_kernel: a grid-stride loop over ``size``
            grid = max(1, min((size + block - 1) // block, 65535))
        self.call(self._run, source, name, list(args), grid, block)

    # ---- the emulation ------------------------------------------------------------------
    def _memory(self, address: int, dtype: np.dtype, count: int) -> np.ndarray:
        """``count`` elements at ``address``, as a view of the allocation that holds them."""
        for buffer in self.buffers:
            base = self.data_address(buffer)
            if base <= address and address + count * dtype.itemsize <= base + buffer.nbytes:
                assert (address - base) % dtype.itemsize == 0, "misaligned address"
                flat = np.asarray(buffer).reshape(-1).view(np.uint8)
                return flat[address - base: address - base + count * dtype.itemsize].view(dtype)
        raise AssertionError(f"the kernel reads {count} x {dtype} at {address:#x}, which no "
                             "allocation holds")

    def _run(self, source: str, name: str, args: list[Any], grid: int | None,
             block: int) -> None:
        t_type, params, body = _parse(source, name)
        env: dict[str, Any] = {}
        assert len(params) == len(args), f"{name}: {len(params)} parameters, {len(args)} args"
        for (param, want, pointer, pname), arg in zip(params, args, strict=True):
            if pointer:
                assert type(arg) is EmuArray and arg.dtype == want, (
                    f"{name}: {param} got {type(arg).__name__} {getattr(arg, 'dtype', '')}")
                env[pname] = arg
            else:
                assert isinstance(arg, np.generic) and arg.dtype == want, (
                    f"{name}: {param} got {type(arg).__name__} {getattr(arg, 'dtype', '')}")
                env[pname] = arg
        if name.endswith("_mt"):  # every address the kernel will read lies in an allocation
            blocks = np.asarray(env["blocks"]).reshape(3, -1)
            assert blocks.shape[1] == int(env["n_blocks"]) == grid
            for tensor, start, end in blocks.T:
                assert 0 <= start < end and end - start <= optim.MULTI_TENSOR_CHUNK
                for table in (pname for _, _, _, pname in params if pname.endswith("_t")):
                    self._memory(int(np.asarray(env[table])[tensor]), t_type, int(end))
        if self.native is not None:
            self.native.launch(source, [(arg, want, pointer) for (_, want, pointer, _), arg
                                        in zip(params, args, strict=True)], grid, block, self)
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
        program = next(p for p in optim.PROGRAMS
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
    def _apply(program: optim.Program, scalars: dict[str, Any], arrays: dict[str, Any]) -> None:
        with np.errstate(all="ignore"):
            env = dict(optim.NUMPY_HELPERS)
            env.update(scalars)
            for name, expression in program.prelude:
                env[name] = eval(expression, env)  # noqa: S307
            env.update(arrays)
            for name, expression in program.body:
                env[name] = eval(expression, env)  # noqa: S307
            for array, temporary in program.outputs:
                np.copyto(arrays[array], env[temporary], casting="same_kind")


@pytest.fixture
def emu(monkeypatch):
    device = EmulatedCuda()
    monkeypatch.setattr(backend_module, "BACKENDS", [device, *backend_module.BACKENDS])
    return device


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
                np.copyto(g, h)
        emu.launches.clear()
        with sync._activate(sync.SyncCounter()) as counter:
            opt.step(grads, skip_if=skip_flags[t == 3])
        assert counter.count == 0
        assert counter.device_ops == (3 if grads_mode == "new" or t == 0 else 2)
        assert emu.launches == [f"gpuscalar_{opt._program.name}_float32_mt",
                                "gpuscalar_count_step"]
        if t != 3:
            ref.step([g.astype(np.float64) for g in host_grads])
    for got, want in zip(params, ref.params, strict=True):
        if want.size:
            assert rel_error(np.asarray(got), want) < 1e-5
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
        emu.launches.clear()
        opt.step(grads)
        assert emu.launches == ["gpuscalar_adam_float32_mt", "gpuscalar_adam_float64_mt",
                                "gpuscalar_count_step"]
        for i, g in enumerate(grads):
            init[i], m[i], v[i] = ref_adam(init[i].astype(dtypes[i]).astype(np.float64),
                                           np.asarray(g, np.float64), m[i], v[i], t, 2e-2,
                                           np.float32(0.8), 0.99, 1e-6, 0.01)
    for got, want in zip(params, init, strict=True):
        assert rel_error(np.asarray(got), want) < 1e-5


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
    step = gs.GPUScalar(emu.xp.asarray(1, dtype=np.int64))
    optim.adam_step(p, g, m, v, step=step, lr=0.1)
    assert emu.launches == ["gpuscalar_adam_float32"]
    expected = p0 - 0.1 * g0 / (np.abs(g0) + 1e-8)
    np.testing.assert_allclose(np.asarray(p), expected, rtol=1e-4, atol=1e-6)
    buf = optim.sgd_step(p, g, lr=0.5, momentum=0.9)
    np.testing.assert_array_equal(np.asarray(buf), g0)


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
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_emulator_rejects_a_wrongly_typed_argument(emu):
    """The argument check can fail: a float64 passed for a ``const float`` parameter."""
    source, name = optim.kernel_source(optim.SGD_PLAIN, "float32", [None, None])
    x = emu.xp.zeros(4, dtype=np.float32)
    with pytest.raises(AssertionError, match="const T lr_val got float64"):
        emu.launch_kernel(source, name, 4, [np.int64(4), x, x, np.float64(0.1),
                                            np.float32(0.0)])


def _scenario(device: EmulatedCuda, seed: int) -> list[np.ndarray]:
    """Every kind of launch gpuscalar.optim makes, on ``device``: the five class configurations
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
    return [np.array(a, copy=True) for a in out]


def test_generated_cuda_c_runs_natively(monkeypatch, tmp_path):
    """The generated CUDA C itself (ILP loops, block tables, scalar lines, the counter kernel)
    compiled for the host and run over the same scenario as the NumPy emulation: the same
    numbers. Skips where no host C++ compiler is installed (the NVRTC checks still run)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine to run the generated C on the host")
    emulated = EmulatedCuda()
    monkeypatch.setattr(backend_module, "BACKENDS", [emulated, *backend_module.BACKENDS])
    expected = _scenario(emulated, seed=7)
    kernels = {name.removesuffix("_mt").rsplit("_", 1)[0] for name in emulated.sources.values()}
    assert kernels == {"gpuscalar_adam", "gpuscalar_adamw", "gpuscalar_sgd",
                       "gpuscalar_sgd_momentum", "gpuscalar_sgd_nesterov", "gpuscalar_count"}
    native = EmulatedCuda(NativeKernels(emulated.sources, tmp_path))
    monkeypatch.setattr(backend_module, "BACKENDS", [native, *backend_module.BACKENDS[1:]])
    got = _scenario(native, seed=7)
    assert set(native.sources) <= set(emulated.sources)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
