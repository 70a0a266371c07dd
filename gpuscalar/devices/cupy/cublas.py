"""A small ctypes binding to cuBLAS: the calls `gs.matmul` needs, usable inside a graph capture.

Why this module exists: CuPy refuses cuBLAS during stream capture (``NotImplementedError:
calling cuBLAS API during stream capture is currently unsupported``, raised in
``cupy_backends.cuda.libs.cublas.setStream``), so ``x @ w`` cannot be recorded in a CUDA graph.
cuBLAS itself can be captured when it is called as CUDA's graph rules ask: with a handle of its
own, a fixed workspace (``cublasSetWorkspace_v2``, so nothing is allocated while capturing),
the capturing stream (``cublasSetStream_v2``), and ``CUBLAS_POINTER_MODE_DEVICE`` so that alpha
and beta are read from device memory (GPUScalars) when the graph runs, not copied from the host
when it is recorded. An H100 run captured and replayed exactly this correctly (29.8 ms for the
training loop the float path ran in 397 ms).

Why ctypes onto libcublas rather than a binding package: the handful of functions needed fit in
one module; the library is the one CuPy itself uses (found by ``cuda-pathfinder``, a CuPy 14
dependency that the ``cuda12``/``cuda13`` extras also name, from the ``nvidia-cublas`` wheels or
the CUDA toolkit), so nothing new is installed for CUDA 12 or 13; and it loads, and its
argument checks run, on a machine without a GPU (CI). NVIDIA's ``nvmath-python`` would add a
dependency (and its own CUDA-version extras) for the same calls.

Where the current stream does not capture, a product goes through CuPy's own Cython binding of
the same routine instead (`call`: a tenth of a ctypes call's host instructions), on the same
handle; see "Two ways to one handle" below for what that binding does to the handle.

The wrappers take raw integers (device pointers, a stream pointer) and raise `CublasError` naming
the function and cuBLAS status. Checking shapes, dtypes and layouts is `gpuscalar.linalg`'s job.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "CublasError",
    "OP_N",
    "OP_T",
    "POINTER_MODE_DEVICE",
    "STATUS_NAMES",
    "library",
    "version",
    "Handle",
]

OP_N, OP_T = 0, 1
POINTER_MODE_HOST, POINTER_MODE_DEVICE = 0, 1
#: cuBLAS status codes (cublas_api.h)
STATUS_NAMES = {
    0: "CUBLAS_STATUS_SUCCESS",
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
_size_t = ctypes.c_size_t
#: function -> argument types (every function returns a cublasStatus_t, an int)
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cublasGetProperty": (_I, ctypes.POINTER(_I)),
    "cublasCreate_v2": (ctypes.POINTER(_P),),
    "cublasDestroy_v2": (_P,),
    "cublasSetStream_v2": (_P, _P),
    "cublasSetWorkspace_v2": (_P, _P, _size_t),
    "cublasSetPointerMode_v2": (_P, _I),
}
_GEMM = (_P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I)
_GEMV = (_P, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I)
_GEMM_BATCHED = (_P, _I, _I, _I, _I, _I, _P, _P, _I, _L, _P, _I, _L, _P, _P, _I, _L, _I)
# S, D: float32, float64; C, Z: complex64, complex128 (cuComplex/cuDoubleComplex alpha and
# beta, read through device pointers like the real ones)
#: a product routine -> the name of CuPy's Cython binding of it (same arguments, same order)
_CUPY_NAMES: dict[str, str] = {}
for _letter in "SDCZ":
    # handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc
    _SIGNATURES[f"cublas{_letter}gemm_v2"] = _GEMM
    _CUPY_NAMES[f"cublas{_letter}gemm_v2"] = f"{_letter.lower()}gemm"
    # handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy
    _SIGNATURES[f"cublas{_letter}gemv_v2"] = _GEMV
    _CUPY_NAMES[f"cublas{_letter}gemv_v2"] = f"{_letter.lower()}gemv"
    # ... gemm's arguments with a stride after A, B and C, then the batch count
    _SIGNATURES[f"cublas{_letter}gemmStridedBatched"] = _GEMM_BATCHED
    _CUPY_NAMES[f"cublas{_letter}gemmStridedBatched"] = f"{_letter.lower()}gemmStridedBatched"
del _letter


class CublasError(RuntimeError):
    """A cuBLAS call failed (or the library could not be loaded); the message names both."""


_lock = threading.Lock()
_library: Any = None


def _cuda_major() -> int | None:
    """The CUDA major version CuPy was built for (its cuBLAS must match); None without CuPy.
    Known without a GPU."""
    try:
        import cupy  # noqa: PLC0415 - the binding serves CuPy arrays

        return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    except (ImportError, RuntimeError):
        return None


def _major_of(path: str) -> int | None:
    """12 for ``.../libcublas.so.12`` or ``libcublas.so.12.9.1.3``; None for ``libcublas.so``."""
    suffix = os.path.basename(path).removeprefix("libcublas.so.")
    head = suffix.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _find() -> str:
    """The path of the libcublas to use: one of CuPy's CUDA major already loaded in this process
    (by CuPy; PyTorch may have loaded another), else cuda-pathfinder's (CuPy's own lookup: the
    nvidia-cublas wheels, CUDA_PATH, ...)."""
    major = _cuda_major()
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith("libcublas.so") and (
                    major is None or _major_of(path) in (major, None)
                ):
                    return path
    except OSError:
        pass
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # noqa: PLC0415 - CuPy's dependency
    except ImportError as error:
        raise CublasError(
            "cuBLAS could not be located: cuda-pathfinder (installed with CuPy >= 14) is "
            f"missing ({error}); install gpuscalar's cuda12 or cuda13 extra"
        ) from error
    try:
        path = load_nvidia_dynamic_lib("cublas").abs_path
    except Exception as error:  # noqa: BLE001 - pathfinder raises its own not-found types
        raise CublasError(
            f"libcublas was not found ({type(error).__name__}: {error}); install the "
            "nvidia-cublas wheel for your CUDA (pip install 'gpuscalar[cuda12]') or the CUDA "
            "toolkit"
        ) from error
    found = _major_of(path)
    if major is not None and found not in (major, None):
        raise CublasError(f"the libcublas found ({path}) is for CUDA {found} but CuPy is built "
                          f"for CUDA {major}; install the nvidia-cublas wheel for CUDA {major}")
    return path


def library() -> Any:
    """The loaded cuBLAS (ctypes), with every function gpuscalar calls declared."""
    global _library
    with _lock:
        if _library is None:
            path = _find()
            try:
                loaded = ctypes.CDLL(path)
            except OSError as error:
                raise CublasError(f"libcublas at {path} could not be loaded: {error}") from error
            for name, argtypes in _SIGNATURES.items():
                function = getattr(loaded, name)
                function.argtypes = argtypes
                function.restype = _I
            _library = loaded
        return _library


def _failure(name: str, status: int) -> str:
    return f"{name} failed: {STATUS_NAMES.get(status, f'status {status}')}"


def _check(name: str, status: int) -> None:
    if status != 0:
        raise CublasError(_failure(name, status))


#: address -> its ``c_void_p``: the pointers a product passes recur (handles, constants, pooled
#: buffers), and an immutable wrapper made once is passed again; emptied when it holds too many
_POINTERS: dict[int, Any] = {}
_POINTERS_KEPT = 4096


def _pointer(address: int) -> Any:
    if len(_POINTERS) >= _POINTERS_KEPT:
        _POINTERS.clear()
    found = _POINTERS[address] = _P(address)
    return found


# The products' calls without ctypes' per-argument declarations (half the host instructions
# of a declared call): each converter returns the arguments as the declarations would convert
# them, each pointer as its c_void_p, each 64-bit integer as a c_longlong, each int as itself.

def _gemm(handle: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int, a: int,
          lda: int, b: int, ldb: int, beta: int, c: int, ldc: int) -> tuple[Any, ...]:
    get = _POINTERS.get
    return (get(handle) or _pointer(handle), transa, transb, m, n, k,
            get(alpha) or _pointer(alpha), get(a) or _pointer(a), lda, get(b) or _pointer(b),
            ldb, get(beta) or _pointer(beta), get(c) or _pointer(c), ldc)


def _gemv(handle: int, trans: int, m: int, n: int, alpha: int, a: int, lda: int, x: int,
          incx: int, beta: int, y: int, incy: int) -> tuple[Any, ...]:
    get = _POINTERS.get
    return (get(handle) or _pointer(handle), trans, m, n, get(alpha) or _pointer(alpha),
            get(a) or _pointer(a), lda, get(x) or _pointer(x), incx,
            get(beta) or _pointer(beta), get(y) or _pointer(y), incy)


def _gemm_batched(handle: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int,
                  a: int, lda: int, stridea: int, b: int, ldb: int, strideb: int, beta: int,
                  c: int, ldc: int, stridec: int, batch: int) -> tuple[Any, ...]:
    get = _POINTERS.get
    return (get(handle) or _pointer(handle), transa, transb, m, n, k,
            get(alpha) or _pointer(alpha), get(a) or _pointer(a), lda, _L(stridea),
            get(b) or _pointer(b), ldb, _L(strideb), get(beta) or _pointer(beta),
            get(c) or _pointer(c), ldc, _L(stridec), batch)


_CONVERTERS: dict[tuple[Any, ...], Callable[..., tuple[Any, ...]]] = {
    _GEMM: _gemm, _GEMV: _gemv, _GEMM_BATCHED: _gemm_batched}
#: name -> how `call` calls it: (the declared function, its argument count, and for a product
#: the same symbol undeclared, the converter of its arguments and CuPy's binding of it (None
#: where it may not be used, `_cupy_binding`); else None three times)
_ROUTES: dict[str, tuple[Any, int, Any, Any, Any]] = {}

#: a product's arguments -> what its converter made of them, for the ctypes way (`call`: in a
#: capture, and for every product where CuPy's binding may not be used): a product made again
#: with the same handle, operands, output and sizes (a step's, whose buffers the memory pool
#: hands out again) is converted once, and the lookup of these integers costs a third of
#: converting them. The routines of one signature convert alike, and the three signatures differ in
#: length, so the arguments alone are the key. Emptied when it holds too many.
_CONVERTED: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_CONVERTED_KEPT = 4096


def _route(name: str) -> tuple[Any, int, Any, Any, Any]:
    if name not in _SIGNATURES:
        raise ValueError(f"gpuscalar.devices.cupy.cublas does not bind {name!r}")
    argtypes = _SIGNATURES[name]
    loaded = library()
    converter = _CONVERTERS.get(argtypes)
    undeclared = binding = None
    if converter is not None:
        undeclared = loaded._FuncPtr((name, loaded))  # the same symbol, no argtypes
        undeclared.restype = _I
        binding = _cupy_binding(name)
    route = _ROUTES[name] = (getattr(loaded, name), len(argtypes), undeclared, converter,
                             binding)
    return route


def _convert(converter: Callable[..., tuple[Any, ...]], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` converted for an undeclared call, kept for the next call with equal ones."""
    converted = converter(*args)
    if len(_CONVERTED) >= _CONVERTED_KEPT:
        _CONVERTED.clear()
    _CONVERTED[args] = converted
    return converted


# ---- Two ways to one handle ------------------------------------------------------------------
#
# CuPy's Cython binding of a product (``cupy_backends.cuda.libs.cublas.dgemm``, ...; CuPy's own
# products call it) first binds the handle to the current stream (``cublasSetStream``), after
# refusing a stream that captures (``NotImplementedError``, raised before the handle is
# touched). gs.matmul's handle is the current stream's, so the stream stays the same, but
# cuBLAS documents ``cublasSetStream`` as resetting the handle's workspace to cuBLAS's default
# pool, unconditionally. That is how CuPy's own products run, and harmless outside a capture;
# a product recorded into a graph must use the fixed workspace `Handle` set (nothing allocated
# while recording, and the graph reads it when it is replayed). So `call` tries CuPy's binding
# first; where it refuses, the ctypes call runs, and where CuPy's binding used the handle since
# the handle's stream and workspace were bound, binds them again first (host-side settings,
# which PyTorch makes before each of its own captured products too).

#: the handle value of each `Handle` alive -> (its stream pointer, its workspace's pointer and
#: size): how to bind it again
_FIXED: dict[int, tuple[int, int, int]] = {}
#: values of handles CuPy's binding has used since their workspace was bound (`_bind_again`)
_UNBOUND: set[int] = set()


def _cupy_binding(name: str) -> Any:
    """CuPy's Cython binding of product ``name``, or None where it may not be used: without
    CuPy, or where more than one libcublas is loaded (a handle must be used by the library that
    made it, and CuPy's binding calls the library its module was linked to)."""
    try:
        module = importlib.import_module("cupy_backends.cuda.libs.cublas")
    except ImportError:
        return None
    if len(_loaded_libraries()) != 1:
        return None
    return getattr(module, _CUPY_NAMES[name], None)


def _loaded_libraries() -> set[tuple[int, int]]:
    """The files (device, inode) of the libcublas copies mapped into this process."""
    found = set()
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith("libcublas.so"):
                    status = os.stat(path)
                    found.add((status.st_dev, status.st_ino))
    except OSError:
        return set()
    return found


def _bind_again(handle: int) -> None:
    """Bind ``handle``'s stream and fixed workspace again (CuPy's binding reset them)."""
    fixed = _FIXED.get(handle)
    if fixed is not None:
        stream, workspace, nbytes = fixed
        call("cublasSetStream_v2", handle, stream)  # (first: it resets the workspace)
        call("cublasSetWorkspace_v2", handle, workspace, nbytes)
    _UNBOUND.discard(handle)


def _cupy_error() -> Any:
    """CuPy's cuBLAS error type (what its binding raises for a failed status)."""
    return importlib.import_module("cupy_backends.cuda.libs.cublas").CUBLASError


def call(name: str, *args: Any) -> None:
    """Call cuBLAS function ``name`` (declared in the signature table); raise on failure.

    A product's call (gemm, gemv, gemmStridedBatched) takes one of two ways to the same
    routine on the same handle, which must be the current stream's (gs.matmul's is): where
    the current stream does not capture, CuPy's Cython binding of it (which binds the handle
    to that stream again, and so to cuBLAS's default workspace); where it captures, after the
    handle's fixed workspace is bound again if needed (`_bind_again`), the undeclared symbol
    with the values its converter (`_gemm`, ...) made of the arguments, without ctypes'
    per-argument conversion, made once for equal arguments (`_CONVERTED`). Its arguments must
    be Python ints, as `gs.matmul` passes them (the tests' recording seam checks that they
    are). Any other call goes through the declared function, which converts its arguments or
    refuses them (``ctypes.ArgumentError``)."""
    route = _ROUTES.get(name)
    if route is None:
        route = _route(name)
    declared, count, undeclared, converter, binding = route
    if len(args) != count:
        raise TypeError(f"{name} takes {count} arguments, got {len(args)}")
    if converter is None:
        status = declared(*args)
    else:
        if binding is not None:
            try:
                binding(*args)
            except NotImplementedError:  # the stream captures: the ctypes call records
                pass
            except _cupy_error() as failure:
                raise CublasError(_failure(name, failure.status)) from failure
            else:
                _UNBOUND.add(args[0])
                return
        if _UNBOUND and args[0] in _UNBOUND:
            _bind_again(args[0])
        converted = _CONVERTED.get(args)
        if converted is None:
            converted = _convert(converter, args)
        status = undeclared(*converted)
    if status:
        _check(name, status)


def version() -> tuple[int, int, int]:
    """cuBLAS's (major, minor, patch): works without a GPU."""
    parts = []
    for kind in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = _I()
        _check("cublasGetProperty", library().cublasGetProperty(kind, ctypes.byref(value)))
        parts.append(value.value)
    return (parts[0], parts[1], parts[2])


class Handle:
    """A cuBLAS handle of gpuscalar's own for one stream: device pointer mode, a fixed workspace.

    ``allocate(nbytes)`` returns a device buffer object with a ``.ptr``, freed when dropped.
    The stream and the workspace are set here (``cublasSetStream_v2`` resets the workspace, so
    the stream comes first): a handle made before a capture (in its warm-up) allocates nothing
    while the graph is recorded. Where CuPy's binding used the handle since (`call`, outside a
    capture), the first product recorded binds the same stream and workspace again (`_FIXED`:
    settings on the host, nothing allocated). A cuBLAS handle must not be used by two threads
    at once: hold ``lock`` around a call.
    """

    WORKSPACE_BYTES = 32 * 2**20  # cuBLAS recommends >= 4 MiB on Hopper; 32 MiB is common
    #: set by gs.matmul once a call was recorded into a CUDA graph (the graph reads the workspace)
    recorded = False

    def __init__(self, allocate: Callable[[int], Any], stream_ptr: int) -> None:
        handle = _P()
        call("cublasCreate_v2", ctypes.byref(handle))
        self.value: int | None = handle.value
        self.lock = threading.Lock()
        try:
            call("cublasSetPointerMode_v2", self.value, POINTER_MODE_DEVICE)
            call("cublasSetStream_v2", self.value, stream_ptr)
            self.workspace = allocate(self.WORKSPACE_BYTES)
            call("cublasSetWorkspace_v2", self.value, self.workspace.ptr,
                 self.WORKSPACE_BYTES)
        except BaseException:
            call("cublasDestroy_v2", self.value)
            raise
        value = handle.value or 0
        _UNBOUND.discard(value)  # (a value cuBLAS handed out before, now bound)
        _FIXED[value] = (stream_ptr, self.workspace.ptr, self.WORKSPACE_BYTES)

    def close(self) -> None:
        """Destroy the handle (cuBLAS waits for the device first), then drop the workspace."""
        if self.value:
            value, self.value = self.value, None
            _FIXED.pop(value, None)
            _UNBOUND.discard(value)
            call("cublasDestroy_v2", value)
            self.workspace = None
