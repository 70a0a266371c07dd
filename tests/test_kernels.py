"""NVRTC compile checks for every CUDA C source gpuscalar ships (no GPU needed).

The shipped header (gpuscalar/kernels/*.cu) is compiled on its own, and every kernel variant
gpuscalar.optim can generate from it (each Program x dtype x pointer/value scalars x skip) is
compiled with the options CuPy uses to build it. NVRTC must load in CI (CI=true): there a
missing NVRTC is a failure, not a skip.
"""

from __future__ import annotations

import ctypes
import glob
import itertools
import os
import sys
from importlib import resources

import pytest

from gpuscalar import optim
from gpuscalar.backend import CupyBackend

ARCH = "--gpu-architecture=compute_90"
OPTIONS = [ARCH, *CupyBackend.kernel_options]


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


@pytest.fixture(scope="module")
def nvrtc():
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
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(problem + " (CI must compile-check the CUDA sources)")
    pytest.skip(problem)


def _compile(nvrtc, source: str, name: str) -> str:
    program = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, OPTIONS)
        except Exception as error:  # noqa: BLE001 - rethrown with the compiler log
            pytest.fail(f"{name} failed to compile: {error}\n{nvrtc.getProgramLog(program)}")
        ptx = nvrtc.getPTX(program)
        return ptx.decode() if isinstance(ptx, bytes) else ptx
    finally:
        nvrtc.destroyProgram(program)


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


# Every Program x dtype, with scalars all by value, all by pointer (one pointer dtype per
# scalar, cycling through the supported ones), and with/without skip.
VARIANTS = [
    (program, dtype, mode, has_skip)
    for program, dtype, mode, has_skip in itertools.product(
        optim.PROGRAMS, optim.KERNEL_DTYPES, ("values", "pointers"), (False, True)
    )
]


@pytest.mark.parametrize(
    ("program", "dtype", "mode", "has_skip"),
    VARIANTS,
    ids=[f"{p.name}-{d}-{m}-{'skip' if s else 'noskip'}" for p, d, m, s in VARIANTS],
)
def test_generated_kernel_compiles(nvrtc, program, dtype, mode, has_skip):
    pointer_dtypes = itertools.cycle(optim.POINTER_CTYPES)
    kinds = [None if mode == "values" else next(pointer_dtypes) for _ in program.scalars]
    source, name = optim.kernel_source(program, dtype, kinds, has_skip)
    ptx = _compile(nvrtc, source, f"{name}.cu")
    assert f".entry {name}" in ptx
    # Every scalar read through a pointer appears as a pointer parameter in the source.
    for scalar, kind in zip(program.scalars, kinds, strict=True):
        assert (f"{scalar}_ptr" in source) == (kind is not None)


def test_generated_kernel_uses_the_program_expressions():
    """The CUDA body is the Program's own expression strings (no second copy of the math)."""
    source, _ = optim.kernel_source(optim.ADAM, "float32", [None] * 6, False)
    for name, expression in optim.ADAM.prelude + optim.ADAM.body:
        assert f"const T {name} = {expression};" in source
    for array, temporary in optim.ADAM.outputs:
        assert f"{array}_p[i] = {temporary};" in source


def test_kernel_source_rejects_unknown_dtype():
    with pytest.raises(KeyError):
        optim.kernel_source(optim.ADAM, "float16", [None] * 6, False)


def test_compile_check_catches_a_broken_kernel(nvrtc):
    """The check can fail: a source with an undefined helper is reported, with NVRTC's log."""
    source, name = optim.kernel_source(optim.SGD_PLAIN, "float32", [None, None], False)
    broken = source.replace("param - lr * g", "param - lr * undefined_helper(g)")
    with pytest.raises(pytest.fail.Exception, match="undefined_helper"):
        _compile(nvrtc, broken, "broken.cu")
