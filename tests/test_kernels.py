"""NVRTC compile checks for every CUDA C source gpuscalar ships (no GPU needed).

The shipped header (gpuscalar/kernels/*.cu) is compiled on its own, and every kernel variant
gpuscalar.optim generates from it is compiled with the options CuPy uses to build it: the
single-tensor kernels (each Program x dtype x pointer/value scalars x skip), the multi-tensor
kernels exactly as the optimizer classes ask for them (each class configuration x dtype x
numbers/GPUScalars x skip), the step-counter kernel, and the kernel that writes gradient
addresses from its arguments. NVRTC must load in CI (CI=true): there a
missing NVRTC is a failure, not a skip.
"""

from __future__ import annotations

import itertools
import os
from importlib import resources

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import optim
from gpuscalar.devices.cupy.backend import CupyBackend
from gpuscalar.optim import executors
from gpuscalar.optim.adam import ADAM
from gpuscalar.optim.kernels import (
    ADDRESS_CHUNK,
    ADDRESS_STRUCT,
    KERNEL_DTYPES,
    POINTER_CTYPES,
    address_table_source,
    counter_source,
    kernel_source,
)
from gpuscalar.optim.program import PROGRAMS
from gpuscalar.optim.sgd import SGD_MOMENTUM, SGD_PLAIN

from . import nvrtc as nv


def _compile(nvrtc, source: str, name: str) -> str:
    """PTX of ``source``, compiled as CuPy compiles a RawKernel (its include dirs, C++17)."""
    return nv.compile_source(nvrtc, source, name, nv.cupy_options(CupyBackend.kernel_options))


def _shipped_sources() -> list[str]:
    kernels = resources.files("gpuscalar").joinpath("kernels")
    return sorted(p.name for p in kernels.iterdir() if p.name.endswith(".cu"))


def test_a_kernel_source_is_shipped():
    assert "fused_elementwise.cu" in _shipped_sources()


@pytest.mark.parametrize("filename", _shipped_sources())
def test_shipped_source_compiles(nvrtc, filename):
    source = resources.files("gpuscalar").joinpath("kernels", filename).read_text()
    # A header of templates emits no code unless instantiated: instantiate each helper.
    probe = source + (
        '\nextern "C" __global__ void probe(float* x, double* y) {\n'
        "    x[0] = select(x[1] > 0, minimum(x[2], x[3]), x[4]);\n"
        "    y[0] = select(y[1] > 0, minimum(y[2], y[3]), y[4]);\n}\n"
    )
    assert ".entry probe" in _compile(nvrtc, probe, filename)


# Every Program x dtype, single-tensor layout (the functional steps), with scalars all by value
# or all by pointer (one pointer dtype per scalar, cycling through the supported ones), and
# with/without skip.
VARIANTS = [
    (program, dtype, mode, has_skip)
    for program, dtype, mode, has_skip in itertools.product(
        PROGRAMS, KERNEL_DTYPES, ("values", "pointers"), (False, True)
    )
]


@pytest.mark.parametrize(
    ("program", "dtype", "mode", "has_skip"),
    VARIANTS,
    ids=[f"{p.name}-{d}-{m}-{'skip' if s else 'noskip'}" for p, d, m, s in VARIANTS],
)
def test_generated_kernel_compiles(nvrtc, program, dtype, mode, has_skip):
    pointer_dtypes = itertools.cycle(POINTER_CTYPES)
    kinds = [None if mode == "values" else next(pointer_dtypes) for _ in program.scalars]
    source, name = kernel_source(program, dtype, kinds, has_skip)
    ptx = _compile(nvrtc, source, f"{name}.cu")
    assert f".entry {name}" in ptx
    # Every scalar read through a pointer appears as a pointer parameter in the source.
    for scalar, kind in zip(program.scalars, kinds, strict=True):
        assert (f"{scalar}_ptr" in source) == (kind is not None)


# Every multi-tensor variant the optimizer classes launch: each class configuration (so each
# Program) x dtype x hyperparameters as numbers or as GPUScalars of several dtypes x skip_if.
# The kinds come from the classes themselves (built on NumPy), so a new kind of scalar a class
# passes is compile-checked here without editing this list.
CLASS_CONFIGS = {
    "adam": (optim.Adam, {}),
    "adamw": (optim.AdamW, {}),
    "sgd": (optim.SGD, {"lr": 0.1}),
    "sgd_momentum": (optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}),
    "sgd_nesterov": (optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    "rmsprop": (optim.RMSprop, {}),
    "rmsprop_momentum": (optim.RMSprop, {"momentum": 0.9}),
    "rmsprop_centered": (optim.RMSprop, {"centered": True}),
    "rmsprop_centered_momentum": (optim.RMSprop, {"momentum": 0.9, "centered": True}),
    "lion": (optim.Lion, {"weight_decay": 0.1}),
}
CLASS_VARIANTS = list(itertools.product(CLASS_CONFIGS, KERNEL_DTYPES,
                                        ("numbers", "gpuscalars", "pending"), (False, True)))


def class_kernel(config: str, dtype: str, hyper: str, has_skip: bool) -> tuple[str, str]:
    """The multi-tensor kernel (source, name) an optimizer class of ``config`` launches over
    ``dtype``, its hyperparameters Python numbers, GPUScalars or pending expressions (``hyper``),
    its kinds routed by `route` (also tests/test_optim_kernel_texts.py's digests)."""
    cls, kwargs = CLASS_CONFIGS[config]
    opt = cls([np.zeros(3, dtype)], **kwargs)
    if hyper == "gpuscalars":  # one scalar dtype per hyperparameter, cycling
        dtypes = itertools.cycle(("float32", "float64", "int64", "int32"))
        for name in opt._hyperparameters:
            value = getattr(opt, name)
            if isinstance(value, tuple):
                setattr(opt, name, tuple(gs.asscalar(v, dtype=next(dtypes)) for v in value))
            elif name != "momentum" or value:
                setattr(opt, name, gs.asscalar(value, dtype=next(dtypes)))
    skip: object = has_skip
    if hyper == "pending":  # a warm-up schedule on the live step counter; a lazy skip flag
        opt.lr = 0.01 * gs.minimum(1.0, (opt.step_count + 1) / 100) * gs.cos(opt.step_count)
        if has_skip:
            skip = executors.route(~gs.isfinite(gs.asscalar(1.0) / opt.step_count))[0]
    kinds = [executors.route(value)[0] for value in opt._scalars()]
    return kernel_source(opt._program, dtype, kinds, skip, multi_tensor=True)


@pytest.mark.parametrize(
    ("config", "dtype", "hyper", "has_skip"),
    CLASS_VARIANTS,
    ids=[f"{c}-{d}-{h}-{'skip' if s else 'noskip'}" for c, d, h, s in CLASS_VARIANTS],
)
def test_multi_tensor_kernel_compiles(nvrtc, config, dtype, hyper, has_skip):
    source, name = class_kernel(config, dtype, hyper, has_skip)
    assert name.endswith("_mt")
    ptx = _compile(nvrtc, source, f"{name}.cu")
    assert f".entry {name}" in ptx
    # The step counter is read on the device (Adam: the step; SGD with momentum: "fresh").
    signature = source[source.index('extern "C"'):].split(") {", 1)[0]
    counter = {"adam": "step", "adamw": "step", "sgd_momentum": "fresh",
               "sgd_nesterov": "fresh"}.get(config)
    for read in ("step", "fresh"):
        assert (f"const long long* __restrict__ {read}_ptr" in signature) == (read == counter)
    if hyper == "pending":  # computed in the prelude from the expressions' leaves
        assert "const T lr = (T)(lr_v" in source and "_gs_opaque" in source
        assert ("if (skip) return;" in source) == has_skip
        return
    assert signature.endswith(", const bool* __restrict__ skip_ptr") == has_skip
    assert ("_ptr" in signature.replace("skip_ptr", "").replace(f"{counter}_ptr", "")) == (
        hyper == "gpuscalars"
    )


def test_class_variants_cover_every_program():
    programs = {class_kernel(c, "float32", "numbers", False)[1] for c in CLASS_CONFIGS}
    assert programs == {f"gpuscalar_{p.name}_float32_mt" for p in PROGRAMS}


@pytest.mark.parametrize("has_skip", [False, True], ids=["noskip", "skip"])
def test_step_counter_kernel_compiles(nvrtc, has_skip):
    source, name = counter_source(has_skip)
    assert f".entry {name}" in _compile(nvrtc, source, f"{name}.cu")
    assert ("if (skip) return;" in source) == has_skip
    assert "*count += 1;" in source


def test_address_table_kernel_compiles(nvrtc):
    """The kernel that writes gradient addresses from its arguments (inside a captured step
    too): it compiles, and its by-value struct is exactly `ADDRESS_STRUCT` (the size-one NumPy
    array CuPy passes by value), within CUDA's 4 KB of kernel parameters with the table pointer
    and the count."""
    source, name = address_table_source()
    ptx = _compile(nvrtc, source, f"{name}.cu")
    assert f".entry {name}" in ptx
    # PTX declares each parameter with its size in bytes: .param .u64 (table), .param .u64 (n),
    # then the struct as .param .align 8 .b8 [<size>]
    entry = ptx[ptx.index(f".entry {name}"):]
    params = entry[: entry.index(")")]
    assert params.count(".param .u64") == 2
    assert f".b8 {name}_param_2[{ADDRESS_STRUCT.itemsize}]" in params
    assert ADDRESS_STRUCT.itemsize == 8 * ADDRESS_CHUNK
    assert 8 + 8 + ADDRESS_STRUCT.itemsize <= 4096
    assert f"long long address[{ADDRESS_CHUNK}];" in source


@pytest.mark.parametrize("multi_tensor", [False, True], ids=["single", "multi"])
def test_generated_kernel_prints_the_program_rules(multi_tensor):
    """The CUDA body is the Program's own rules, printed as C (no second copy of the math)."""
    source, _ = kernel_source(ADAM, "float32", [None] * 6, False,
                                    multi_tensor=multi_tensor)
    for name, expression in ADAM.prelude + ADAM.body:
        assert f"const T {name} = {expression};" in source
    for array, temporary in ADAM.outputs:
        assert f"{array}_p[gs_i] = {temporary};" in source


def test_counter_reads_are_inlined_in_the_prelude():
    source, _ = kernel_source(ADAM, "float64", [None] * 5 + [("counter", "step")],
                                    multi_tensor=True)
    assert "const T step = (T)((*step_ptr) + 1);" in source
    source, _ = kernel_source(SGD_MOMENTUM, "float32",
                                    [None] * 4 + [("counter", "fresh")], multi_tensor=True)
    assert "const T fresh = (T)((*fresh_ptr) == 0);" in source


def test_kernel_source_rejects_unknown_dtype_and_kinds():
    with pytest.raises(KeyError):
        kernel_source(ADAM, "float16", [None] * 6, False)
    with pytest.raises(ValueError, match="unknown scalar kind"):
        kernel_source(SGD_PLAIN, "float32", [None, ("mystery",)])
    with pytest.raises(ValueError, match="sgd has 2 scalars"):
        kernel_source(SGD_PLAIN, "float32", [None])


def test_compile_check_catches_a_broken_kernel(nvrtc):
    """The check can fail: a source with an undefined helper is reported, with NVRTC's log."""
    for multi_tensor in (False, True):
        source, name = kernel_source(SGD_PLAIN, "float32", [None, None], False,
                                           multi_tensor=multi_tensor)
        broken = source.replace("param - lr * g", "param - lr * undefined_helper(g)")
        assert broken != source
        with pytest.raises(pytest.fail.Exception, match="undefined_helper"):
            _compile(nvrtc, broken, "broken.cu")


# ---- the CUDA runtime headers (issue 15: CuPy 14 compiles nothing without them) -------------


@pytest.mark.needs_cupy  # cuda-pathfinder, installed with CuPy
def test_cuda_runtime_headers_are_installed_where_cupy_looks():
    """The ``cuda12`` extra installs ``nvidia-cuda-runtime-cu12``, and CuPy's own lookup
    (cuda-pathfinder's ``cudart`` headers) finds them: without this no CuPy kernel compiles."""
    from cuda.pathfinder import find_nvidia_header_directory

    include = nv.cuda_include_dir()
    assert find_nvidia_header_directory("cudart") == include
    for header in nv.RUNTIME_HEADERS:
        assert os.path.isfile(os.path.join(include, header))
    assert f"-I{include}" in nv.cupy_options()


def test_a_kernel_including_the_cuda_runtime_headers_compiles(nvrtc):
    """The runtime headers CuPy's kernels reach (``<cuda_runtime.h>``; ``cupy/float16.cuh`` and
    ``cupy/bfloat16.cuh`` include ``<cuda_fp16.h>`` / ``<cuda_bf16.h>``), compiled with the
    options CuPy uses: none of them is one of NVRTC's built-in headers, so each fails to open
    without the wheel's include directory (``cuda_device_runtime_api.h`` is reached through
    ``cuda_runtime_api.h``; included on its own it needs nvcc's ``crt/host_defines.h``, which
    NVRTC does not use)."""
    source = (
        "#include <cuda_runtime.h>\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
        'extern "C" __global__ void runtime_probe(__half* x, __nv_bfloat16* y) {\n'
        "    x[threadIdx.x] = __float2half(static_cast<float>(blockDim.x));\n"
        "    y[threadIdx.x] = __float2bfloat16(1.5f);\n}\n"
    )
    assert ".entry runtime_probe" in _compile(nvrtc, source, "runtime_probe.cu")
    without = [o for o in nv.cupy_options() if o != f"-I{nv.cuda_include_dir()}"]
    with pytest.raises(pytest.fail.Exception, match="cuda_runtime.h"):
        nv.compile_source(nvrtc, source, "runtime_probe.cu", without)


def test_cupys_own_headers_compile(nvrtc):
    """CuPy's header list (``cupy/carray.cuh`` and friends, what every ElementwiseKernel,
    ReductionKernel and ufunc is compiled with) compiles against the installed CUDA headers."""
    from cupy._core import core

    source = "".join(f"#include <{h}>\n" for h in core._cupy_header_list) + (
        'extern "C" __global__ void header_probe(double* x) { x[0] = 1.0; }\n'
    )
    assert ".entry header_probe" in _compile(nvrtc, source, "header_probe.cu")


@pytest.mark.needs_cupy  # cuda-pathfinder, installed with CuPy
@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception),
                                         ("", pytest.skip.Exception)])
def test_missing_cuda_headers_fail_under_ci(monkeypatch, ci, outcome):
    """No silent fallback: without the headers CuPy compiles nothing, so CI fails (a developer
    machine without the extra skips), naming the wheel to install."""
    import cuda.pathfinder

    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_header_directory", lambda name: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="nvidia-cuda-runtime-cu12"):
        nv.cupy_options()
