"""CUDA source generation for the optimizer kernels: update kernels, step counter, address tables.

Why this module exists: a `Program`'s rules become a CUDA kernel here, and only here, one per
(program, dtype, scalar kinds, skip kind, layout); the compiled kernels are cached by that
variant in ONE bounded cache (`gpuscalar.devices.cupy.steps`), not the texts. The kernel text is
part of the contract (the NVRTC tests compile every variant; bench and the launch emulator run
it; tests/test_optim_kernel_texts.py holds every variant's bytes), so the generator is kept free
of anything a step decides at run time: each scalar's kind declares itself
(`ScalarKind.declaration`, `gpuscalar.optim.program`), and this module lays out the kernel.

Kernels come in two layouts. The functional steps (`adam_step`, `sgd_step`, ...) update one
tensor with a grid-stride loop. The optimizer classes update the arrays the user passed, in
place, with a *multi-tensor* kernel: one launch per dtype group per step however many tensors,
each block reading its tensor's addresses from a device-side table (one address table per array
role, and a block table of (tensor, start, end) chunks), as PyTorch's ``multi_tensor_apply``
does. The gradient table is rewritten by `address_table_source`'s kernel, which carries the
addresses in its own arguments (see `gpuscalar.optim.multi_tensor`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from ..lazy import codegen
from .program import (  # POINTER_CTYPES: the pointer kind's table, importable here as before
    POINTER_CTYPES,
    VALUE,
    PointerScalar,
    Program,
    ScalarCode,
    ScalarKind,
)

__all__ = [
    "KERNEL_DTYPES",
    "POINTER_CTYPES",
    "KERNEL_DTYPE_NAMES",
    "MULTI_TENSOR_CHUNK",
    "MULTI_TENSOR_BLOCK",
    "MULTI_TENSOR_ILP",
    "ADDRESS_CHUNK",
    "ADDRESS_STRUCT",
    "ADDRESS_BLOCK",
    "kernel_source",
    "counter_source",
    "address_table_source",
]

#: dtypes the fused kernels are generated for (NumPy name -> C type).
KERNEL_DTYPES: dict[str, str] = {"float32": "float", "float64": "double"}
#: The same table by dtype (``dtype.name`` is a slow property on a per-step path).
KERNEL_DTYPE_NAMES = {np.dtype(name): name for name in KERNEL_DTYPES}

#: Multi-tensor kernels: elements per block (a chunk of one tensor), threads per block, and
#: elements each thread loads before computing (memory-level parallelism).
MULTI_TENSOR_CHUNK = 4096
MULTI_TENSOR_BLOCK = 256
MULTI_TENSOR_ILP = 4
#: Gradient addresses one table-writing launch carries in its kernel arguments, by value: a
#: struct of int64 that, with the table pointer and the count, takes 4,016 bytes, within the
#: 4 KB of kernel parameters every CUDA device accepts.
ADDRESS_CHUNK = 500
#: The NumPy twin of that struct. CuPy passes a size-one NumPy array to a RawKernel by value
#: (``cupy/cuda/function.pyx``: ``_pointer`` -> ``CNumpyArray``; the driver copies the
#: parameter's ``sizeof`` bytes from its data when the launch is issued).
ADDRESS_STRUCT = np.dtype([("address", np.int64, (ADDRESS_CHUNK,))])
ADDRESS_BLOCK = 128


def _preambles(codes: Sequence[ScalarCode]) -> list[str]:
    """The preambles the scalars' code needs, each once, in first-use order."""
    return list(dict.fromkeys(p for code in codes for p in code.preambles))


def _normalized_kind(kind: Any) -> ScalarKind:
    """Shorthands accepted by `kernel_source`: None (by value), a dtype name (pointer), a kind's
    plain tuple (``("counter", "step")``)."""
    if kind is None:
        return VALUE
    if isinstance(kind, str):
        return PointerScalar(kind)
    if isinstance(kind, ScalarKind):
        return kind
    return ScalarKind.of(tuple(kind))


#: ``skip=True``'s kind: a ``const bool*``.
_BOOL_POINTER = PointerScalar("bool")


@cache
def _header() -> str:
    return resources.files("gpuscalar").joinpath("kernels/fused_elementwise.cu").read_text()


def kernel_source(
    program: Program,
    dtype: str,
    scalar_kinds: Sequence[Any],
    skip: Any = None,
    *,
    multi_tensor: bool = False,
) -> tuple[str, str]:
    """CUDA source and kernel name for ``program`` on arrays of ``dtype`` (``"float32"`` or
    ``"float64"``).

    ``scalar_kinds`` gives, per scalar in ``program.scalars``, how the kernel receives it: None
    (a plain value of the arrays' type), the NumPy dtype name of the 0-d device array it is read
    from through a pointer, or a kind (a `gpuscalar.optim.program.ScalarKind`, as `route` gives
    it, e.g. ``CounterScalar("step")``, or its plain tuple ``("counter", "step")``).
    ``skip``: None or False for no skip flag, True for a ``const bool*``, or a kind; when it
    reads true the kernel returns before touching anything.

    The single-tensor layout takes ``n`` and one pointer per array and loops grid-stride. The
    ``multi_tensor`` layout takes, per array, a device table of tensor addresses
    (``<array>_t``), and a block table ``blocks`` of 3 rows (tensor, start, end) by
    ``n_blocks``: block ``b`` updates elements ``[start, end)`` of tensor ``blocks[b]``.
    """
    kinds = tuple(_normalized_kind(k) for k in scalar_kinds)
    if len(kinds) != len(program.scalars):
        raise ValueError(f"{program.name} has {len(program.scalars)} scalars "
                         f"{program.scalars}, got {len(kinds)} kinds")
    if skip is None or skip is False:
        skip_kind = None
    else:
        skip_kind = _BOOL_POINTER if skip is True else _normalized_kind(skip)
    return _kernel_source(program, dtype, kinds, skip_kind, multi_tensor)


def _kernel_source(  # not cached: the compiled kernel is (`cupy.steps._STEP_KERNELS`, bounded)
    program: Program,
    dtype: str,
    kinds: tuple[ScalarKind, ...],
    skip: ScalarKind | None,
    multi_tensor: bool,
) -> tuple[str, str]:
    ctype = KERNEL_DTYPES[dtype]
    kernel = f"gpuscalar_{program.name}_{dtype}{'_mt' if multi_tensor else ''}"
    written = {array for array, _ in program.outputs}

    def qualifier(name: str) -> str:
        return "" if name in written else "const "

    if multi_tensor:
        params = [f"const long long* __restrict__ {name}_t" for name in program.arrays]
        params += ["const long long* __restrict__ blocks", "const long long n_blocks"]
    else:
        params = ["const long long n"]
        params += [f"{qualifier(name)}T* __restrict__ {name}_p" for name in program.arrays]
    codes = [kind.declaration(name) for name, kind in zip(program.scalars, kinds, strict=True)]
    prelude: list[str] = []
    for code in codes:
        params += code.params
        prelude += code.statements
    if skip is not None:  # the flag is read first: a skipped step reads nothing else
        skip_code = skip.declaration("skip", "bool")
        params += skip_code.params
        prelude = [*skip_code.statements, "if (skip) return;", *prelude]
        codes.insert(0, skip_code)
    # the rules print as infix C with no FMA barrier: the compiler may contract within a rule
    prelude += [f"const T {name} = {codegen.c_source(rule)};" for name, rule in program.prelude]

    def element(indent: str, load: Callable[[str], str]) -> list[str]:
        lines = [f"const T {name} = {load(name)};" for name in program.arrays]
        lines += [f"const T {name} = {codegen.c_source(rule)};" for name, rule in program.body]
        lines += [f"{array}_p[gs_i] = {temporary};" for array, temporary in program.outputs]
        return [indent + line for line in lines]

    lines = [_header(), *([program.helpers] if program.helpers else []), f"typedef {ctype} T;",
             *_preambles(codes), ""]
    lines.append(f'extern "C" __global__ void {kernel}(' + ", ".join(params) + ") {")
    lines += ["    " + line for line in prelude]
    if not multi_tensor:
        lines.append(
            "    for (long long gs_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
            " gs_i < n; gs_i += (long long)blockDim.x * gridDim.x) {"
        )
        lines += element("        ", lambda name: f"{name}_p[gs_i]")
        lines += ["    }", "}", ""]
        return "\n".join(lines), kernel
    ilp = MULTI_TENSOR_ILP
    lines += [
        "    const long long gs_block = blockIdx.x;",
        "    const long long gs_tensor = blocks[gs_block];",
        "    const long long gs_start = blocks[n_blocks + gs_block];",
        "    const long long gs_end = blocks[2 * n_blocks + gs_block];",
    ]
    lines += [
        f"    {qualifier(name)}T* __restrict__ {name}_p = "
        f"({qualifier(name)}T*){name}_t[gs_tensor];"
        for name in program.arrays
    ]

    def each_of_ilp(body: list[str]) -> list[str]:
        """``body`` for each of a thread's ``ilp`` elements still inside the chunk."""
        return [
            "#pragma unroll",
            f"        for (int gs_k = 0; gs_k < {ilp}; ++gs_k) {{",
            "            const long long gs_i = gs_base + (long long)gs_k * blockDim.x;",
            "            if (gs_i < gs_end) {",
            *body,
            "            }",
            "        }",
        ]

    lines += [
        "    for (long long gs_base = gs_start + threadIdx.x; gs_base < gs_end;"
        f" gs_base += {ilp}LL * blockDim.x) {{",
        *[f"        T {name}_r[{ilp}];" for name in program.arrays],
        # every element is loaded before any is computed (memory-level parallelism)
        *each_of_ilp([f"                {name}_r[gs_k] = {name}_p[gs_i];"
                      for name in program.arrays]),
        *each_of_ilp(element("                ", lambda name: f"{name}_r[gs_k]")),
        "    }",
        "}",
        "",
    ]
    return "\n".join(lines), kernel


def counter_source(skip: Any = None) -> tuple[str, str]:
    """CUDA source and name of the step-counter kernel (one thread): ``*count += 1``, or, with
    ``skip`` (as in `kernel_source`), only where the skip flag reads false."""
    if skip is None or skip is False:
        return _counter_source(None)
    return _counter_source(_BOOL_POINTER if skip is True else _normalized_kind(skip))


def _counter_source(skip: ScalarKind | None) -> tuple[str, str]:
    name = "gpuscalar_count_step"
    params = ["long long* __restrict__ count"]
    body = []
    codes = []
    if skip is not None:
        codes.append(skip.declaration("skip", "bool"))
        params += codes[0].params
        body += [*codes[0].statements, "if (skip) return;"]
    body.append("*count += 1;")
    lines = [_header(), *_preambles(codes),
             f'extern "C" __global__ void {name}(' + ", ".join(params) + ") {"]
    lines += ["    " + line for line in body] + ["}", ""]
    return "\n".join(lines), name


@cache
def address_table_source() -> tuple[str, str]:
    """CUDA source and name of the kernel that writes gradient addresses into an optimizer's
    device table from its own arguments: ``table[i] = addresses.address[i]`` for ``i < n``
    (``n <= ADDRESS_CHUNK``; ``addresses`` is an `ADDRESS_STRUCT` passed by value). The driver
    copies kernel arguments when a launch is issued, and a CUDA graph that records the launch
    keeps the copy: no host memory is read later, and each replay rewrites the table with the
    addresses it was recorded with."""
    name = "gpuscalar_write_addresses"
    lines = [
        f"struct gs_addresses {{ long long address[{ADDRESS_CHUNK}]; }};",
        f'extern "C" __global__ void {name}(long long* __restrict__ table, const long long n, '
        "const gs_addresses addresses) {",
        "    for (long long gs_i = threadIdx.x; gs_i < n; gs_i += blockDim.x) {",
        "        table[gs_i] = addresses.address[gs_i];",
        "    }",
        "}",
        "",
    ]
    return "\n".join(lines), name


