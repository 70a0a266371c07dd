"""Compiling gpuscalar's CUDA with NVRTC, without a GPU (CI runs this; it must not skip there).

`load` finds NVRTC (CuPy's binding, from the ``nvidia-cuda-nvrtc-cu12`` wheel); `compile_source`
compiles one translation unit and fails the test with NVRTC's log; `elementwise_source` builds
the exact source ``cupy.ElementwiseKernel`` would compile for a `gpuscalar.lazy.codegen.KernelSpec`
(CuPy's own code generator, called with the argument kinds gpuscalar launches it with), so the
check covers what CuPy really compiles, not an imitation of it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Any

import numpy as np
import pytest

ARCH = "--gpu-architecture=compute_90"


def _preload_wheel_nvrtc() -> None:
    """Make the nvidia-cuda-nvrtc-cu12 wheel's libnvrtc findable when CuPy's own lookup
    (cuda-pathfinder) cannot: load it by absolute path so the later dlopen by soname hits it."""
    for base in sys.path:
        for lib in sorted(glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib",
                                                 "libnvrtc.so*"))):
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def _unavailable(problem: str) -> Any:
    """Skip the test, or fail it under ``CI=true``: CI installs the ``cuda12`` extra, so there a
    missing compiler or header is a broken install, not a reason to skip."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(problem + " (CI must compile-check the CUDA sources)")
    pytest.skip(problem)


def load() -> Any:
    """CuPy's NVRTC module; skips the test where NVRTC cannot load, fails it under CI=true."""
    problem = None
    try:
        from cupy_backends.cuda.libs import nvrtc as module

        try:
            module.getVersion()
        except Exception:  # noqa: BLE001 - retry once with the wheel's library preloaded
            _preload_wheel_nvrtc()
            module.getVersion()
        return module
    except Exception as error:  # noqa: BLE001 - reported below
        problem = f"NVRTC is not usable: {type(error).__name__}: {error}"
    return _unavailable(problem)


#: The CUDA runtime headers every CuPy kernel needs (CuPy's cuda_workaround.h / carray.cuh
#: include <cuda_runtime.h>, which includes cuda_device_runtime_api.h).
RUNTIME_HEADERS = ("cuda_runtime.h", "cuda_device_runtime_api.h")


def cuda_include_dir() -> str:
    """The CUDA runtime header directory, found where CuPy 14 finds it.

    CuPy (``core.assemble_cupy_compiler_options``) asks cuda-pathfinder for the ``cudart``
    headers: ``find_nvidia_header_directory("cudart")`` looks in site-packages (the
    ``nvidia-cuda-runtime-cu12`` wheel's ``nvidia/cuda_runtime/include``, CUDA 13's
    ``nvidia/cu13/include``), conda, then ``CUDA_PATH``/``CUDA_HOME``. Without them CuPy compiles
    no kernel at all, so a missing header fails under ``CI=true`` (skips elsewhere), never a
    silent fallback that would compile what a real GPU run cannot."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
    except Exception as error:  # noqa: BLE001 - reported below
        return _unavailable(f"cuda-pathfinder cannot look for the CUDA headers: {error}")
    missing = [h for h in RUNTIME_HEADERS
               if found is None or not os.path.isfile(os.path.join(found, h))]
    if missing:
        return _unavailable(
            f"the CUDA runtime headers {missing} are not installed where CuPy looks for them "
            f"(cuda-pathfinder found {found!r}); install the cuda12 extra "
            "(nvidia-cuda-runtime-cu12)"
        )
    return found


def cupy_options(extra: tuple[str, ...] = ()) -> list[str]:
    """The options CuPy compiles its own kernels with (its headers, CCCL, C++17, and the CUDA
    runtime headers `cuda_include_dir` finds), for sm_90."""
    from cupy._core import core

    include = cuda_include_dir()
    options = list(core.assemble_cupy_compiler_options((ARCH, *extra)))
    assert f"-I{include}" in options, f"CuPy does not pass the CUDA headers: {options}"
    return options


def compile_source(nvrtc: Any, source: str, name: str, options: list[str]) -> str:
    """PTX of ``source``; a compile error fails the test with NVRTC's log."""
    program = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, options)
        except Exception as error:  # noqa: BLE001 - rethrown with the compiler log
            pytest.fail(f"{name} failed to compile: {error}\n{nvrtc.getProgramLog(program)}")
        ptx = nvrtc.getPTX(program)
        return ptx.decode() if isinstance(ptx, bytes) else ptx
    finally:
        nvrtc.destroyProgram(program)


def elementwise_source(spec: Any, array_ndim: int = 1) -> str:
    """The kernel function CuPy generates for ``spec`` (a KernelSpec) when gpuscalar launches
    it: raw parameters are 0-d device arrays, ``_gs_a*`` parameters and outputs are arrays of
    ``array_ndim`` dimensions, the other parameters are scalar values. The spec's preamble is
    left out (`join_sources` adds each distinct preamble once)."""
    import cupy
    from cupy._core import _carray, _kernel, _scalar

    kernel = cupy.ElementwiseKernel(spec.in_params, spec.out_params, spec.operation, spec.name,
                                    loop_prep=spec.loop_prep)
    arrays_ndim = array_ndim if any(p.name.startswith("_gs_a") for p in kernel.in_params) else 0
    infos, in_types = [], []
    for param in kernel.in_params:
        dtype = np.dtype(param.dtype)
        if param.raw:
            infos.append(_kernel._ArgInfo(1, cupy.ndarray, dtype, 0, True, True))
            in_types.append(dtype)
        elif param.name.startswith("_gs_a"):
            infos.append(_kernel._ArgInfo(1, cupy.ndarray, dtype, arrays_ndim, True, True))
            in_types.append(dtype)
        else:
            infos.append(_kernel._ArgInfo(3, _scalar.CScalar, dtype, 0, True, True))
            in_types.append(None)
    out_types = tuple(np.dtype(p.dtype) for p in kernel.out_params)
    infos += [_kernel._ArgInfo(1, cupy.ndarray, np.dtype(p.dtype), 0 if p.raw else arrays_ndim,
                               True, True) for p in kernel.out_params]
    infos.append(_kernel._ArgInfo(2, _carray.Indexer, None, arrays_ndim, True, True))
    _, _, type_map = kernel._decide_params_type(tuple(in_types), out_types)
    return _kernel._get_elementwise_kernel_code(
        tuple(infos), type_map, kernel.params, kernel.operation, kernel.name, "",
        loop_prep=spec.loop_prep)


def join_sources(specs: list[Any], array_ndim: int = 1) -> str:
    """One translation unit holding every spec's kernel: CuPy's headers, each distinct preamble
    once (in first-use order), then the kernels."""
    from cupy._core import core

    preambles: list[str] = []
    for spec in specs:
        preambles += [part for part in spec.preambles if part not in preambles]
    headers = "".join(f"#include <{h}>\n" for h in core._cupy_header_list)
    bodies = [elementwise_source(spec, array_ndim) for spec in specs]
    return headers + "\n".join(preambles) + "\n" + "\n".join(bodies)


def join_raw_sources(kernels: list[Any]) -> str:
    """One translation unit holding every generated ``RawKernel`` (`codegen.RawSource`: CuPy's
    headers and preambles first, each distinct piece once, in first-use order, then the
    kernel functions)."""
    pieces: list[str] = []
    for kernel in kernels:
        pieces += [piece for piece in kernel.preambles if piece not in pieces]
    return "\n".join([*pieces, *(kernel.function for kernel in kernels)])


#: the machine code's architecture for `machine_code` (an H100/H200, what the GPU runs were on)
SASS_ARCH = "sm_90"


def _tool(name: str, wheel_dirs: tuple[str, ...]) -> str:
    """``name`` from NVIDIA's wheels (ptxas from the CUDA extra's ``nvidia-cuda-nvcc*``, of
    NVRTC's CUDA major; nvdisasm from the test extra's ``nvidia-cuda-nvdisasm``), else from
    PATH; skips where neither has it, fails under CI=true."""
    import shutil

    for base in sys.path:
        for sub in wheel_dirs:
            path = os.path.join(base, "nvidia", sub, "bin", name)
            if os.access(path, os.X_OK):
                return path
    found = shutil.which(name)
    return found if found else _unavailable(f"{name} is not installed (the test and CUDA "
                                            "extras' NVIDIA wheels bring it)")


def machine_code(ptx: str, tmp_path: Any) -> str:
    """The SASS that ptxas makes of ``ptx`` for `SASS_ARCH`, as nvdisasm prints it: what the GPU
    runs. ptxas optimizes too (it contracts a PTX ``mul`` and ``add`` into an FMA), so a check on
    the PTX alone is not a check on the machine code."""
    import subprocess

    ptxas = _tool("ptxas", ("cuda_nvcc", "cu13", "cu12"))
    nvdisasm = _tool("nvdisasm", ("cu13", "cuda_nvdisasm", "cu12"))
    source, cubin = tmp_path / "kernel.ptx", tmp_path / "kernel.cubin"
    source.write_text(ptx)
    assembled = subprocess.run([ptxas, f"-arch={SASS_ARCH}", str(source), "-o", str(cubin)],
                               capture_output=True, text=True)
    if assembled.returncode != 0:
        pytest.fail(f"ptxas failed: {assembled.stderr}")
    listed = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.fail(f"nvdisasm failed: {listed.stderr}")
    return listed.stdout
