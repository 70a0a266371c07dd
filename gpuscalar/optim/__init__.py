"""Fused optimizer steps on the user's own arrays, sync-free clipping and on-device skipping.

Why this module exists: an optimizer step is where device scalars pay off or are wasted. A
learning-rate schedule, Adam's bias correction from the step count, a clipping coefficient from
the gradient norm, a "skip this step, the gradients overflowed" flag: in most Python code each of
these is a Python float or bool, so computing it from device values costs a synchronization per
step. Here every hyperparameter may be a `GPUScalar`, read by the kernel on the device, and
nothing is ever read back to the host.

Each update rule is written once, as a `Program`: per-element expression strings in the common
subset of Python and C (``+ - * /``, comparisons, ``sqrt``, ``pow``, ``select``, ``minimum``).
On NumPy (and the strict device) the strings are evaluated with NumPy inside ONE counted backend
call (the CPU stand-in for one kernel); on CuPy they are pasted into a CUDA kernel
(``kernels/fused_elementwise.cu`` supplies the helpers), compiled once per variant and launched
once. The two paths share the math by construction.

Kernels come in two layouts. The functional steps (`adam_step`, `sgd_step`) update one tensor
with a grid-stride loop. The optimizer classes (`Adam`, `AdamW`, `SGD`) update the arrays the
user passed, in place, with a *multi-tensor* kernel: one launch per dtype group per step however
many tensors, each block reading its tensor's addresses from a device-side table (one address
table per array role, and a block table of (tensor, start, end) chunks), as PyTorch's
``multi_tensor_apply`` does. The parameter and state tables are built once. The gradient table is
rewritten when the gradient arrays differ from the previous step's, by a small kernel that carries
the addresses in its own arguments (one launch per `ADDRESS_CHUNK` tensors), never by a
host-to-device copy: inside a captured step (`gs.capture`) CuPy refuses such a copy, while kernel
arguments are copied into the CUDA graph when it is recorded, so every replay rewrites the table
with the addresses it was recorded with.

How a kernel receives each scalar (the learning rate, betas, the step, ``skip_if`` ...) is
decided in one place, `_route`: a Python number by value, a GPUScalar through a pointer to its
0-d array, a pending GPUScalar expression computed in the kernel's prelude (one code generator,
`gpuscalar.codegen`, serves these preludes and the fused scalar kernels), the optimizer's live
step counter through a pointer with the arithmetic inlined.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from .. import reduce, sync
from ..backend import NUMPY, Backend, backend_of
from ..lazy import codegen, expr
from ..scalar import GPUScalar, _array_of, _node_of, _wrap, apply_ufunc, minimum

__all__ = [
    "Program",
    "ADAM",
    "ADAMW",
    "SGD_PLAIN",
    "SGD_MOMENTUM",
    "SGD_NESTEROV",
    "PROGRAMS",
    "KERNEL_DTYPES",
    "POINTER_CTYPES",
    "COUNTER_READS",
    "kernel_source",
    "counter_source",
    "address_table_source",
    "ADDRESS_CHUNK",
    "ADDRESS_STRUCT",
    "adam_step",
    "sgd_step",
    "clip_grad_norm",
    "all_finite",
    "Optimizer",
    "Adam",
    "AdamW",
    "SGD",
]

#: dtypes the fused kernels are generated for (NumPy name -> C type).
KERNEL_DTYPES: dict[str, str] = {"float32": "float", "float64": "double"}
#: C type of a scalar read through a pointer, by the 0-d array's dtype.
POINTER_CTYPES: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "int32": "int",
    "int64": "long long",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "bool": "bool",
}
#: The same tables by dtype (``dtype.name`` is a slow property on a per-step path).
_KERNEL_DTYPE_NAMES = {np.dtype(name): name for name in KERNEL_DTYPES}
_POINTER_DTYPE_NAMES = {np.dtype(name): name for name in POINTER_CTYPES}
#: NumPy twins of the helper functions the expression strings may call (see the .cu header).
NUMPY_HELPERS: dict[str, Any] = {
    "sqrt": np.sqrt,
    "pow": np.power,
    "select": np.where,
    "minimum": np.minimum,
}
#: What a class kernel computes from the live step counter ``{0}`` (an int64 read on the device),
#: in the common subset of Python and C: Adam's 1-based step, and SGD's "no history yet" flag.
COUNTER_READS: dict[str, str] = {"step": "({0} + 1)", "fresh": "({0} == 0)"}

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
_ADDRESS_BLOCK = 128


@dataclass(frozen=True, eq=False)  # identity: a kernel-cache key hashed on every step
class Program:
    """One fused elementwise update, described once for NumPy and CUDA.

    ``scalars`` are hyperparameter names; ``prelude`` computes per-call values from them;
    ``body`` computes per-element temporaries from the arrays' current elements (read by name)
    and earlier temporaries; ``outputs`` maps each written array to the temporary stored in it.
    Every array is read before any is written, so in-place updates are safe.
    """

    name: str
    scalars: tuple[str, ...]
    arrays: tuple[str, ...]
    prelude: tuple[tuple[str, str], ...]
    body: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]


_ADAM_PRELUDE = (
    ("bias1", "1 - pow(beta1, step)"),
    ("bias2_sqrt", "sqrt(1 - pow(beta2, step))"),
    ("step_size", "lr / bias1"),
)
_ADAM_MOMENTS = (
    ("m", "beta1 * exp_avg + (1 - beta1) * g"),
    ("v", "beta2 * exp_avg_sq + (1 - beta2) * g * g"),
)
_ADAM_ARGS = {
    "scalars": ("lr", "beta1", "beta2", "eps", "weight_decay", "step"),
    "arrays": ("param", "grad", "exp_avg", "exp_avg_sq"),
}
_ADAM_OUTPUTS = (("param", "p"), ("exp_avg", "m"), ("exp_avg_sq", "v"))

#: PyTorch Adam: L2 weight decay is added to the gradient.
ADAM = Program(
    name="adam",
    **_ADAM_ARGS,
    prelude=_ADAM_PRELUDE,
    body=(
        ("g", "grad + weight_decay * param"),
        *_ADAM_MOMENTS,
        ("p", "param - step_size * m / (sqrt(v) / bias2_sqrt + eps)"),
    ),
    outputs=_ADAM_OUTPUTS,
)
#: PyTorch AdamW: decoupled weight decay shrinks the parameter before the Adam update.
ADAMW = Program(
    name="adamw",
    **_ADAM_ARGS,
    prelude=(*_ADAM_PRELUDE, ("decay", "1 - lr * weight_decay")),
    body=(
        ("g", "grad"),
        *_ADAM_MOMENTS,
        ("p", "param * decay - step_size * m / (sqrt(v) / bias2_sqrt + eps)"),
    ),
    outputs=_ADAM_OUTPUTS,
)
#: PyTorch SGD without momentum.
SGD_PLAIN = Program(
    name="sgd",
    scalars=("lr", "weight_decay"),
    arrays=("param", "grad"),
    prelude=(),
    body=(("g", "grad + weight_decay * param"), ("p", "param - lr * g")),
    outputs=(("param", "p"),),
)
# ``fresh`` is 1 while the momentum buffer holds no history: PyTorch then sets buf = grad. With
# momentum 0 (a number set after construction, or a GPUScalar's value) PyTorch's step is plain
# SGD and leaves the buffer alone: so does this one, decided on the device.
_SGD_MOMENTUM_BODY = (
    ("g", "grad + weight_decay * param"),
    ("b", "select(momentum == 0, momentum_buffer, "
          "select(fresh != 0, g, momentum * momentum_buffer + (1 - dampening) * g))"),
)
#: PyTorch SGD with momentum (heavy ball).
SGD_MOMENTUM = Program(
    name="sgd_momentum",
    scalars=("lr", "momentum", "dampening", "weight_decay", "fresh"),
    arrays=("param", "grad", "momentum_buffer"),
    prelude=(),
    body=(*_SGD_MOMENTUM_BODY, ("p", "param - lr * select(momentum == 0, g, b)")),
    outputs=(("param", "p"), ("momentum_buffer", "b")),
)
#: PyTorch SGD with Nesterov momentum.
SGD_NESTEROV = Program(
    name="sgd_nesterov",
    scalars=SGD_MOMENTUM.scalars,
    arrays=SGD_MOMENTUM.arrays,
    prelude=(),
    body=(*_SGD_MOMENTUM_BODY,
          ("p", "param - lr * select(momentum == 0, g, g + momentum * b)")),
    outputs=SGD_MOMENTUM.outputs,
)
PROGRAMS: tuple[Program, ...] = (ADAM, ADAMW, SGD_PLAIN, SGD_MOMENTUM, SGD_NESTEROV)


# ---- how a kernel receives one scalar ------------------------------------------------------
#
# A scalar's *kind* is the part of a kernel's identity it decides (a kernel-cache key, never a
# value); its *leaves* are the runtime arguments the kernel receives for it. Kinds:
#   ("value",)              a Python number, passed by value as the arrays' type T
#   ("pointer", dtype)      a GPUScalar's 0-d array of ``dtype``, dereferenced by the kernel
#   ("counter", read)       the optimizer's int64 step counter, through a pointer, with the
#                           arithmetic COUNTER_READS[read] inlined into the prelude
#   ("pending", key)        a pending (lazy) GPUScalar of that expression structure: its leaves
#                           (0-d arrays and constants) are parameters, and the prelude computes
#                           it with gpuscalar.codegen's code (CuPy's routines, FMA barriers), so
#                           ``opt.lr = base * gs.minimum(1, (opt.step_count + 1) / warmup)``
#                           costs no launch of its own; on the host, gpuscalar.expr evaluates it
# `_kernel_arguments` passes leaves as they are.

ScalarKind = tuple
_VALUE: ScalarKind = ("value",)


class _CounterRead:
    """A value the kernel derives from a live int64 counter buffer on the device."""

    __slots__ = ("array", "read")

    def __init__(self, array: Any, read: str) -> None:
        self.array, self.read = array, read


def _route(value: Any) -> tuple[ScalarKind, tuple[Any, ...]]:
    """THE one place that decides how a fused kernel receives a scalar: ``(kind, leaves)``.

    ``value`` is a Python number, a GPUScalar, or a `_CounterRead`; it is already validated.
    A pending GPUScalar is computed by the kernel itself, in its prelude: no launch of its own.
    """
    if isinstance(value, GPUScalar):
        node = _node_of(value)
        if node is not None:
            plan = expr.plan_of(node)
            if value.backend.evaluates_on_host or _cupy_fuses(plan):
                return ("pending", plan.key), tuple(expr.leaves_of(node))
        array = _array_of(value)  # CuPy cannot compute it in the kernel: one launch first
        return ("pointer", _POINTER_DTYPE_NAMES[array.dtype]), (array,)
    if type(value) is _CounterRead:
        return ("counter", value.read), (value.array,)
    return _VALUE, (value,)


_CUPY_FUSES: dict[Any, bool] = {}


def _cupy_fuses(plan: expr.Plan) -> bool:
    """Whether CuPy kernel code can be generated for ``plan``'s expressions (not, e.g., an
    operation CuPy has no fusable routine for): decided once per structure."""
    try:
        return _CUPY_FUSES[plan.key]
    except KeyError:
        pass
    try:
        codegen.plan_code(plan, "probe_")
    except codegen.FusionUnsupported:
        fuses = False
    else:
        fuses = True
    _CUPY_FUSES[plan.key] = fuses
    return fuses


def _kernel_arguments(kind: ScalarKind, leaves: tuple[Any, ...], ctype: type) -> tuple:
    """A scalar's kernel arguments, in the order `_scalar_declaration` declares them; ``ctype``
    is the NumPy scalar type of the kernel's T (a by-value number is converted to it)."""
    if kind[0] == "value":
        return (ctype(leaves[0]),)
    return leaves


@dataclass(frozen=True)
class _ScalarCode:
    """How a kernel declares one scalar: its parameters, the prelude statements that end by
    defining the scalar's name, and any preamble code they need (emitted once, before the
    kernel, in first-use order)."""

    params: tuple[str, ...]
    statements: tuple[str, ...]
    preambles: tuple[str, ...] = ()


def _preambles(codes: Sequence[_ScalarCode]) -> list[str]:
    """The preambles the scalars' code needs, each once, in first-use order."""
    return list(dict.fromkeys(p for code in codes for p in code.preambles))


def _scalar_declaration(name: str, kind: ScalarKind, ctype: str = "T") -> _ScalarCode:
    """The code that gives a kernel scalar ``name`` (of C type ``ctype``) of ``kind``. Every
    identifier it adds starts with ``name``."""
    tag = kind[0]
    if tag == "value":
        return _ScalarCode((f"const T {name}_val",),
                           (f"const {ctype} {name} = ({ctype})({name}_val);",))
    if tag == "pointer":
        return _ScalarCode((f"const {POINTER_CTYPES[kind[1]]}* __restrict__ {name}_ptr",),
                           (f"const {ctype} {name} = ({ctype})(*{name}_ptr);",))
    if tag == "counter":
        read = COUNTER_READS[kind[1]].format(f"(*{name}_ptr)")
        return _ScalarCode((f"const long long* __restrict__ {name}_ptr",),
                           (f"const {ctype} {name} = ({ctype}){read};",))
    if tag == "pending":  # the expression's own code (gpuscalar.codegen), then the cast to T
        code = codegen.plan_code(expr.plan_for_key(kind[1]), f"{name}_")
        return _ScalarCode(
            tuple(codegen.raw_kernel_params(code)),
            (*code.statements, f"const {ctype} {name} = ({ctype})({code.value});"),
            (codegen.cupy_headers(), *code.preambles),
        )
    raise ValueError(f"unknown scalar kind {kind!r}")


def _host_scalar(backend: Backend, kind: ScalarKind, leaves: tuple[Any, ...]) -> Any:
    """The value a kernel would compute for a scalar, on a host-evaluating backend (called
    inside the counted device op, where reading the device data is the device's own work)."""
    tag = kind[0]
    if tag == "value":
        return leaves[0]
    if tag == "pointer":
        return backend.host_data(leaves[0])
    if tag == "counter":
        code = _compiled(COUNTER_READS[kind[1]].format("counter"))
        return eval(code, {"counter": backend.host_data(leaves[0])})  # noqa: S307 - ours
    if tag == "pending":
        return expr.evaluate_plan(expr.plan_for_key(kind[1]), leaves, backend.host_data)
    raise ValueError(f"unknown scalar kind {kind!r}")


def _normalized_kind(kind: Any) -> ScalarKind:
    """Shorthands accepted by `kernel_source`: None (by value), a dtype name (pointer)."""
    if kind is None:
        return _VALUE
    if isinstance(kind, str):
        return ("pointer", kind)
    return tuple(kind)


# ---- the two evaluators of a Program ------------------------------------------------------


@cache
def _compiled(expression: str) -> Any:
    return compile(expression, f"<gpuscalar expression {expression!r}>", "eval")


def _evaluate_host(
    backend: Backend,
    program: Program,
    scalars: Sequence[tuple[ScalarKind, tuple]],
    tensors: Sequence[Mapping[str, np.ndarray]],
    skip: tuple[ScalarKind, tuple] | None,
) -> None:
    """The CPU stand-in for one kernel launch: ``program`` over every tensor, in place.

    ``scalars`` are routed scalars in ``program.scalars`` order and ``tensors`` maps each of the
    program's arrays to its NumPy data, per tensor. Scalars are cast to the arrays' dtype first,
    as the CUDA kernel does. When ``skip`` holds true, nothing is written (the kernel returns).
    """
    if skip is not None and bool(_host_scalar(backend, *skip)):
        return
    if not tensors:
        return
    dtype = tensors[0][program.arrays[0]].dtype
    with np.errstate(all="ignore"):  # IEEE results, no warnings: a kernel cannot warn either
        env: dict[str, Any] = dict(NUMPY_HELPERS)
        for name, routed in zip(program.scalars, scalars, strict=True):
            env[name] = np.asarray(_host_scalar(backend, *routed)).astype(dtype)
        for name, expression in program.prelude:
            env[name] = eval(_compiled(expression), env)  # noqa: S307 - library-owned strings
        body = [(name, _compiled(expression)) for name, expression in program.body]
        for arrays in tensors:
            local = dict(env)
            local.update(arrays)
            for name, code in body:
                local[name] = eval(code, local)  # noqa: S307
            for array_name, temporary in program.outputs:
                np.copyto(arrays[array_name], local[temporary], casting="same_kind")


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
    from through a pointer, or a full kind (see `_route`, e.g. ``("counter", "step")``).
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
        skip_kind = ("pointer", "bool") if skip is True else _normalized_kind(skip)
    return _kernel_source(program, dtype, kinds, skip_kind, multi_tensor)


@cache
def _kernel_source(
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
    codes = [_scalar_declaration(name, kind)
             for name, kind in zip(program.scalars, kinds, strict=True)]
    prelude: list[str] = []
    for code in codes:
        params += code.params
        prelude += code.statements
    if skip is not None:  # the flag is read first: a skipped step reads nothing else
        skip_code = _scalar_declaration("skip", skip, "bool")
        params += skip_code.params
        prelude = [*skip_code.statements, "if (skip) return;", *prelude]
        codes.insert(0, skip_code)
    prelude += [f"const T {name} = {expression};" for name, expression in program.prelude]

    def element(indent: str, load: Callable[[str], str]) -> list[str]:
        lines = [f"const T {name} = {load(name)};" for name in program.arrays]
        lines += [f"const T {name} = {expression};" for name, expression in program.body]
        lines += [f"{array}_p[gs_i] = {temporary};" for array, temporary in program.outputs]
        return [indent + line for line in lines]

    lines = [_header(), f"typedef {ctype} T;", *_preambles(codes), ""]
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
    return _counter_source(("pointer", "bool") if skip is True else _normalized_kind(skip))


@cache
def _counter_source(skip: ScalarKind | None) -> tuple[str, str]:
    name = "gpuscalar_count_step"
    params = ["long long* __restrict__ count"]
    body = []
    codes = []
    if skip is not None:
        codes.append(_scalar_declaration("skip", skip, "bool"))
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


def _run_program(
    backend: Backend,
    program: Program,
    scalars: dict[str, Any],
    arrays: dict[str, Any],
    skip: GPUScalar | None,
) -> None:
    """Launch ``program`` once on one tensor (one counted device op). Scalars are Python
    numbers or GPUScalars; arrays are same-shape, same-dtype arrays of ``backend``."""
    routed = [_route(scalars[name]) for name in program.scalars]
    skip_routed = None if skip is None else _route(skip)
    if backend.evaluates_on_host:
        tensors = [{name: backend.host_data(array) for name, array in arrays.items()}]
        backend.call(_evaluate_host, backend, program, routed, tensors, skip_routed)
        return
    first = arrays[program.arrays[0]]
    source, name = _kernel_source(
        program, _KERNEL_DTYPE_NAMES[first.dtype], tuple(kind for kind, _ in routed),
        None if skip_routed is None else skip_routed[0], False,
    )
    args: list[Any] = [np.int64(first.size)]
    args += [arrays[name_] for name_ in program.arrays]
    for kind, leaves in routed:
        args += _kernel_arguments(kind, leaves, first.dtype.type)
    if skip_routed is not None:
        args += skip_routed[1]
    backend.launch_kernel(source, name, first.size, args)


# ---- validation --------------------------------------------------------------------------


def _needs_contiguous(backend: Backend) -> bool:
    """Kernels index flat memory: CuPy (and the strict device standing in for it) need
    C-contiguous arrays; NumPy evaluates any layout."""
    return backend is not NUMPY


def _check_array(value: Any, what: str) -> Backend:
    backend = backend_of(value)
    if backend is None:
        raise TypeError(f"{what} must be a NumPy or CuPy array, got {type(value).__name__}")
    if value.dtype not in _KERNEL_DTYPE_NAMES:
        raise TypeError(f"{what} must be float32 or float64, got dtype {value.dtype}")
    if _needs_contiguous(backend) and not value.flags.c_contiguous:
        raise ValueError(
            f"{what} must be C-contiguous for the fused {backend.name} kernel (got strides "
            f"{value.strides}); pass a contiguous copy (xp.ascontiguousarray)"
        )
    return backend


def _check_like(
    value: Any,
    reference: Any,
    what: str,
    ref_what: str,
    backend: Backend,
    *,
    contiguous: bool = True,
) -> None:
    other = backend_of(value)
    if other is None:
        raise TypeError(f"{what} must be a NumPy or CuPy array, got {type(value).__name__}")
    if other is not backend:
        raise TypeError(f"{what} is a {other.name} array but {ref_what} is {backend.name}")
    if value.shape != reference.shape:
        raise ValueError(f"{what} has shape {value.shape} but {ref_what} has {reference.shape}")
    if value.dtype != reference.dtype:
        raise TypeError(f"{what} has dtype {value.dtype} but {ref_what} has {reference.dtype}")
    if backend.multi_device and backend.device_of(value) != backend.device_of(reference):
        raise ValueError(
            f"{what} is on device {backend.device_of(value)!r} but {ref_what} is on "
            f"{backend.device_of(reference)!r}"
        )
    if contiguous and _needs_contiguous(backend) and not value.flags.c_contiguous:
        raise ValueError(
            f"{what} must be C-contiguous for the fused {backend.name} kernel (got strides "
            f"{value.strides}); pass a contiguous copy (xp.ascontiguousarray)"
        )


def _writeable(backend: Backend, array: Any) -> bool:
    """Whether a kernel may write ``array``: a host-evaluating backend's data may be read-only
    (NumPy's ``flags.writeable``); device memory always is writeable."""
    return not backend.evaluates_on_host or backend.host_data(array).flags.writeable


def _read_only(what: str) -> ValueError:
    return ValueError(f"{what} is read-only (flags.writeable is False), but it is updated in "
                      "place")


def _check_writeable(backend: Backend, array: Any, what: str) -> None:
    if not _writeable(backend, array):
        raise _read_only(what)


def _hyper(
    value: Any,
    name: str,
    backend: Backend,
    device: object,
    *,
    low: float | None = 0.0,
    high: float | None = None,
    high_open: bool = False,
) -> Any:
    """Validate a hyperparameter: a Python/NumPy real number (range-checked on the host) or a
    real GPUScalar on ``backend`` and ``device`` (its value is not checked: that would sync)."""
    if isinstance(value, GPUScalar):
        if value.backend is not backend:
            raise TypeError(
                f"{name} is a {value.backend.name} GPUScalar but the arrays are {backend.name}"
            )
        if backend.multi_device and value.device != device:
            raise ValueError(f"{name} is on device {value.device!r} but the arrays on {device!r}")
        if value.dtype.kind not in "fiu" or value.dtype not in _POINTER_DTYPE_NAMES:
            raise TypeError(
                f"{name} must be a real number, got a GPUScalar of dtype {value.dtype} (the "
                "kernels read float32/float64/int32/int64/uint32/uint64 scalars)"
            )
        return value
    if type(value) is not float and type(value) is not int and (
        isinstance(value, bool) or not isinstance(value, numbers.Real)
    ):  # (the exact types first: this runs for every hyperparameter of every step)
        raise TypeError(f"{name} must be a real number or GPUScalar, got {type(value).__name__}")
    number = float(value)
    if math.isnan(number) or (low is not None and number < low):
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    if high is not None and (number >= high if high_open else number > high):
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in [{low}, {high}{bracket}, got {value!r}")
    return value


def _skip(value: Any, backend: Backend, device: object) -> GPUScalar | None:
    if value is None:
        return None
    if not isinstance(value, GPUScalar) or value.dtype != np.bool_:
        kind = f"dtype {value.dtype}" if isinstance(value, GPUScalar) else type(value).__name__
        raise TypeError(
            f"skip_if must be a bool GPUScalar (e.g. ~gpuscalar.optim.all_finite(grads)), got "
            f"{kind}; for a host-side bool, simply don't call the step"
        )
    if value.backend is not backend:
        raise TypeError(
            f"skip_if is a {value.backend.name} GPUScalar but the arrays are {backend.name}"
        )
    if backend.multi_device and value.device != device:
        raise ValueError(f"skip_if is on device {value.device!r} but the arrays on {device!r}")
    return value


def _describe(value: Any) -> str:
    """A user's value for an error message, read without a sync: a GPUScalar or device array is
    named by type and dtype (formatting its value would read it from the device, a sync, and a
    ``SyncError`` under ``sync_guard("error")`` in place of the real error)."""
    if isinstance(value, GPUScalar):
        return f"a GPUScalar of dtype {value.dtype}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v) for v in value)
        return f"a {type(value).__name__} of {len(value)} ({inner})"
    backend = backend_of(value)
    if backend is not None and backend is not NUMPY:
        return f"a {backend.name} array of shape {value.shape} and dtype {value.dtype}"
    return repr(value)


def _betas(betas: Any, backend: Backend, device: object, name: str = "betas") -> tuple[Any, Any]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"{name} must be a pair (beta1, beta2), got {_describe(betas)}")
    return (
        _hyper(betas[0], f"{name}[0]", backend, device, high=1.0, high_open=True),
        _hyper(betas[1], f"{name}[1]", backend, device, high=1.0, high_open=True),
    )


def _byte_span(backend: Backend, array: Any) -> tuple[int, int]:
    """[low, high) bytes an array's elements occupy (strides may be negative)."""
    low = high = backend.data_address(array)
    for size, stride in zip(array.shape, array.strides, strict=True):
        reach = (size - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high + array.itemsize


def _first_overlap(backend: Backend, arrays: Sequence[Any]) -> tuple[int, int] | None:
    """Indices of two arrays sharing memory (updating both in one kernel would race), or None.
    Sorted byte spans, O(n log n); interleaved NumPy views are confirmed with shares_memory."""
    spans = sorted(
        (*_byte_span(backend, a), i) for i, a in enumerate(arrays) if a.size
    )
    active: list[tuple[int, int]] = []  # (high, index) of spans that may reach further
    for low, high, i in spans:
        active = [(h, j) for h, j in active if h > low]
        for _, j in active:
            if not backend.evaluates_on_host or np.shares_memory(
                backend.host_data(arrays[i]), backend.host_data(arrays[j])
            ):
                return min(i, j), max(i, j)
        active.append((high, i))
    return None


# ---- functional steps ----------------------------------------------------------------------


def adam_step(
    param: Any,
    grad: Any,
    exp_avg: Any,
    exp_avg_sq: Any,
    *,
    step: Any,
    lr: Any = 1e-3,
    betas: tuple[Any, Any] = (0.9, 0.999),
    eps: Any = 1e-8,
    weight_decay: Any = 0.0,
    decoupled_weight_decay: bool = False,
    skip_if: GPUScalar | None = None,
) -> None:
    """One Adam (or, with ``decoupled_weight_decay``, AdamW) update of ``param``, in place.

    PyTorch's semantics. ``step`` is the 1-based number of this update. Every hyperparameter
    and ``step`` may be a Python number or a GPUScalar; bias correction is computed on the
    device from ``step``. One fused kernel (one device op), no sync. ``skip_if``: a bool
    GPUScalar; when true on the device, nothing is changed.
    """
    backend = _check_array(param, "param")
    device = backend.device_of(param)
    for value, what in ((grad, "grad"), (exp_avg, "exp_avg"), (exp_avg_sq, "exp_avg_sq")):
        _check_like(value, param, what, "param", backend)
    for value, what in ((param, "param"), (exp_avg, "exp_avg"), (exp_avg_sq, "exp_avg_sq")):
        _check_writeable(backend, value, what)
    beta1, beta2 = _betas(betas, backend, device)
    scalars = {
        "lr": _hyper(lr, "lr", backend, device),
        "beta1": beta1,
        "beta2": beta2,
        "eps": _hyper(eps, "eps", backend, device),
        "weight_decay": _hyper(weight_decay, "weight_decay", backend, device),
        "step": _hyper(step, "step", backend, device, low=1.0),
    }
    skip = _skip(skip_if, backend, device)
    program = ADAMW if decoupled_weight_decay else ADAM
    arrays = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    _run_program(backend, program, scalars, arrays, skip)


def sgd_step(
    param: Any,
    grad: Any,
    momentum_buffer: Any = None,
    *,
    lr: Any,
    momentum: Any = 0.0,
    dampening: Any = 0.0,
    weight_decay: Any = 0.0,
    nesterov: bool = False,
    skip_if: GPUScalar | None = None,
) -> Any:
    """One SGD update of ``param`` in place (PyTorch's semantics); returns the momentum buffer.

    With momentum (a GPUScalar counts as momentum), ``momentum_buffer=None`` creates the buffer
    (PyTorch's first step: ``buf = grad``). Hyperparameters may be Python numbers or GPUScalars.
    One fused kernel, no sync; ``skip_if`` as in `adam_step` (a buffer created by a skipped
    call holds no history yet: pass None again).
    """
    backend = _check_array(param, "param")
    device = backend.device_of(param)
    _check_like(grad, param, "grad", "param", backend)
    _check_writeable(backend, param, "param")
    scalars = {
        "lr": _hyper(lr, "lr", backend, device),
        "weight_decay": _hyper(weight_decay, "weight_decay", backend, device),
    }
    momentum = _hyper(momentum, "momentum", backend, device)
    dampening = _hyper(dampening, "dampening", backend, device)
    if not isinstance(nesterov, bool):
        raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__}")
    skip = _skip(skip_if, backend, device)
    if not isinstance(momentum, GPUScalar) and momentum == 0:
        if nesterov:
            raise ValueError("nesterov momentum needs momentum > 0")
        if momentum_buffer is not None:
            raise ValueError("momentum_buffer given but momentum is 0")
        _run_program(backend, SGD_PLAIN, scalars, {"param": param, "grad": grad}, skip)
        return None
    if nesterov and not isinstance(dampening, GPUScalar) and dampening != 0:
        raise ValueError("nesterov momentum needs dampening == 0")
    fresh = momentum_buffer is None
    if fresh:
        with backend.device_context(device):
            momentum_buffer = backend.call(backend.xp.zeros_like, param)
    else:
        _check_like(momentum_buffer, param, "momentum_buffer", "param", backend)
        _check_writeable(backend, momentum_buffer, "momentum_buffer")
    scalars.update(momentum=momentum, dampening=dampening, fresh=1 if fresh else 0)
    arrays = {"param": param, "grad": grad, "momentum_buffer": momentum_buffer}
    _run_program(backend, SGD_NESTEROV if nesterov else SGD_MOMENTUM, scalars, arrays, skip)
    return momentum_buffer


# ---- clipping and finiteness ---------------------------------------------------------------


def clip_grad_norm(grads: Sequence[Any], max_norm: Any, norm_type: float = 2.0) -> GPUScalar:
    """Scale ``grads`` in place so their total ``norm_type``-norm is at most ``max_norm``.

    PyTorch's ``clip_grad_norm_``: the coefficient is ``min(1, max_norm / (norm + 1e-6))``,
    computed and applied on the device (no ``if``, no sync). Returns the total norm before
    clipping as a GPUScalar. ``norm_type`` may be ``math.inf``; ``max_norm`` a GPUScalar.
    """
    items = list(grads)
    if not items:
        raise ValueError("clip_grad_norm() needs at least one gradient array")
    backend = _check_array(items[0], "grads[0]")
    for i, g in enumerate(items[1:], 1):
        _check_array(g, f"grads[{i}]")
        if backend_of(g) is not backend:
            raise TypeError(f"grads[{i}] is a {backend_of(g).name} array but grads[0] is "
                            f"{backend.name}")
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)) or norm_type <= 0:
        raise ValueError(
            f"norm_type must be a positive number or math.inf, got {_describe(norm_type)}"
        )
    max_norm = _hyper(max_norm, "max_norm", backend, backend.device_of(items[0]))
    total = reduce.global_norm(items, ord=norm_type)
    # as PyTorch, the coefficient is applied in each gradient's dtype; when lazy, each multiply
    # computes it in its own kernel (no launch for the coefficient)
    coef = minimum(max_norm / (total + 1e-6), 1.0)
    for g in items:
        apply_ufunc("multiply", g, coef, out=g)
    return total


def all_finite(arrays: Sequence[Any]) -> GPUScalar:
    """Whether every element of every array is finite, as a bool GPUScalar (no sync).

    For loss scaling: ``opt.step(grads, skip_if=~all_finite(grads))``. Device ops: 2 for one
    array (``isfinite``, ``all``); for ``n`` arrays 1 (a bool vector of ``n`` slots) + 2 per
    array (``isfinite``, and its ``all`` written into the array's slot) + 1 (``all`` of the
    slots). No ``xp.stack``, which in CuPy would be a hidden host-to-device copy for more than
    8 arrays (`gpuscalar.reduce.partials_into_slots`): it runs inside a captured step.
    """
    items = list(arrays)
    if not items:
        raise ValueError("all_finite() needs at least one array")
    backend = backend_of(items[0])
    for i, a in enumerate(items):
        if backend is None or backend_of(a) is not backend:
            expected = "a NumPy or CuPy" if backend is None else f"a {backend.name}"
            raise TypeError(f"all_finite(): arrays[{i}] must be {expected} array, "
                            f"got {type(a).__name__}")
    xp = backend.xp

    def flags(a: Any) -> Any:
        # a 0-d array's flag is a NumPy bool on NumPy, not an array: reduce a 1-element view
        return backend.call(xp.isfinite, a.reshape(1) if a.ndim == 0 else a)

    if len(items) == 1:
        return reduce.all(flags(items[0]))
    slots = reduce.partials_into_slots(
        backend, items, np.bool_, lambda a, out: backend.call(xp.all, flags(a), out=out)
    )
    return reduce.all(slots)


# ---- multi-tensor optimizers ---------------------------------------------------------------


class _Group:
    """One dtype's tensors: the user's parameters, the optimizer's state (one flat buffer per
    state, with a view per tensor), and what the kernel reads them through: NumPy data per
    tensor on a host-evaluating backend, device address tables and a block table on CuPy."""

    def __init__(
        self,
        backend: Backend,
        program: Program,
        indices: list[int],
        params: list[Any],
        grad_table: Any,
        chunk: int,
    ) -> None:
        xp = backend.xp
        self.indices = indices
        self.dtype = params[0].dtype
        self.shapes = [p.shape for p in params]
        sizes = [int(p.size) for p in params]
        offsets = np.cumsum([0, *sizes])
        state_names = program.arrays[2:]
        self.written = ("param", *state_names)  # what the step writes, per tensor
        self.state = {
            name: backend.call(xp.zeros, int(offsets[-1]), dtype=self.dtype)
            for name in state_names
        }
        self.state_views = {
            name: [flat[int(o) : int(o) + s].reshape(p.shape)
                   for p, o, s in zip(params, offsets[:-1], sizes, strict=True)]
            for name, flat in self.state.items()
        }
        chunks = [-(-s // chunk) for s in sizes]
        self.n_blocks = int(sum(chunks))
        if backend.evaluates_on_host:
            data = backend.host_data
            self.tensors = [
                {"param": data(p), **{name: data(self.state_views[name][t])
                                      for name in state_names}}
                for t, p in enumerate(params)
            ]
            return
        address = backend.data_address
        table = np.array(
            [[address(p) for p in params],
             *[[address(v) for v in self.state_views[name]] for name in state_names]],
            dtype=np.int64,
        )
        tensor = np.repeat(np.arange(len(params), dtype=np.int64), chunks)
        first_block = np.repeat(np.cumsum([0, *chunks[:-1]]), chunks)
        start = (np.arange(self.n_blocks, dtype=np.int64) - first_block) * chunk
        end = np.minimum(start + chunk, np.asarray(sizes, np.int64)[tensor])
        self._tables = backend.call(xp.asarray, table)  # kept alive: the kernel reads its rows
        self._blocks = backend.call(xp.asarray, np.stack([tensor, start, end]).astype(np.int64))
        # one address table per array of the program: param, grad (the optimizer's, rewritten
        # when the gradient arrays change), then the state buffers
        self.prefix = (self._tables[0], grad_table, *self._tables[1:], self._blocks,
                       np.int64(self.n_blocks))

    def launch(
        self,
        backend: Backend,
        program: Program,
        scalars: list[tuple[ScalarKind, tuple]],
        skip: tuple[ScalarKind, tuple] | None,
    ) -> None:
        """The group's update: one counted device op (none when every tensor is empty)."""
        if self.n_blocks == 0:
            return
        if backend.evaluates_on_host:
            backend.call(_evaluate_host, backend, program, scalars, self.tensors, skip)
            return
        source, name = _kernel_source(
            program, _KERNEL_DTYPE_NAMES[self.dtype], tuple(kind for kind, _ in scalars),
            None if skip is None else skip[0], True,
        )
        args = list(self.prefix)
        ctype = self.dtype.type
        for kind, leaves in scalars:
            args += _kernel_arguments(kind, leaves, ctype)
        if skip is not None:
            args += skip[1]
        backend.launch_kernel(source, name, 0, args, grid=self.n_blocks,
                              block=MULTI_TENSOR_BLOCK)


def _increment_on_host(backend: Backend, count: Any, skip: tuple | None) -> None:
    if skip is None or not bool(_host_scalar(backend, *skip)):
        np.add(count, 1, out=count)


class _Hyperparameter:
    """An optimizer hyperparameter: a number or a GPUScalar, validated whenever it is set (so a
    bad value never reaches a kernel). ``check(optimizer, name, value)`` returns the value."""

    def __init__(self, check: Callable[[Any, str, Any], Any], doc: str) -> None:
        self.check = check
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.attribute = name, f"_{name}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.attribute)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.attribute, self.check(obj, self.name, value))


def _nonnegative(opt: Optimizer, name: str, value: Any) -> Any:
    return _hyper(value, name, opt._backend, opt._device)


class Optimizer:
    """Base of the fused multi-tensor optimizers (`Adam`, `AdamW`, `SGD`).

    The arrays passed in are the parameters: `step` updates them in place (``opt.params[0] is
    w``). Per dtype group a step is one multi-tensor kernel, whatever the number of tensors,
    plus one op for the step counter; no copy of parameters or gradients is made. State lives
    on the device (`state`, `state_dict`). The step counter is a 0-d int64 device buffer updated
    in place (`step_count`), hyperparameters may be GPUScalars, and ``skip_if`` is read on the
    device, so a step never syncs, allocates no device memory, and can be captured as a CUDA
    graph (with the same or new gradient arrays each call: see `step`).
    """

    _program: Program
    #: hyperparameter attributes, in `state_dict` order
    _hyperparameters: tuple[str, ...] = ("lr",)
    #: Elements per block of the multi-tensor kernel (a tuning knob read when an optimizer is
    #: made: a subclass may set another; the kernels' code does not depend on it).
    chunk_size: int = MULTI_TENSOR_CHUNK

    lr = _Hyperparameter(_nonnegative, "The learning rate: a number or a GPUScalar (>= 0).")

    def __init__(self, params: Sequence[Any], lr: Any, program: Program) -> None:
        chunk = self.chunk_size
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"{type(self).__name__}.chunk_size must be an int >= 1, got "
                             f"{_describe(chunk)}")
        items = list(params) if not hasattr(params, "shape") else None
        if not items:
            raise TypeError(
                "params must be a non-empty list of arrays"
                + ("" if items is not None else ", not a single array (wrap it in a list)")
            )
        backend = _check_array(items[0], "params[0]")
        device = backend.device_of(items[0])
        for i, p in enumerate(items[1:], 1):
            other = _check_array(p, f"params[{i}]")
            if other is not backend:
                raise TypeError(f"params[{i}] is a {other.name} array but params[0] is "
                                f"{backend.name}")
            if backend.multi_device and backend.device_of(p) != device:
                raise ValueError(f"params[{i}] is on device {backend.device_of(p)!r} but "
                                 f"params[0] on {device!r}")
        for i, p in enumerate(items):
            _check_writeable(backend, p, f"params[{i}]")
        overlap = _first_overlap(backend, items)
        if overlap is not None:
            i, j = overlap
            raise ValueError(
                f"params[{i}] and params[{j}] share memory (the same array twice, or "
                "overlapping views): each parameter must be updated once per step"
            )
        self._backend, self._device, self._program = backend, device, program
        self._params = items
        self._param_ids = frozenset(map(id, items))
        self.lr = lr
        by_dtype: dict[Any, list[int]] = {}
        for i, p in enumerate(items):
            by_dtype.setdefault(p.dtype, []).append(i)
        with backend.device_context(device):
            xp = backend.xp
            self._count = backend.call(xp.zeros, (), dtype=np.int64)
            grad_table = (None if backend.evaluates_on_host
                          else backend.call(xp.zeros, len(items), dtype=np.int64))
            self._groups: list[_Group] = []
            offset = 0
            for indices in by_dtype.values():
                rows = None if grad_table is None else grad_table[offset:offset + len(indices)]
                self._groups.append(_Group(backend, program, indices,
                                           [items[i] for i in indices], rows, chunk))
                offset += len(indices)
        # The gradient table, in table order (dtype group by group), is written in chunks of
        # ADDRESS_CHUNK entries, one launch each: on a device by a kernel that carries them in
        # its arguments (the table slice it writes, and how many); on a host-evaluating backend
        # the "table" is each tensor's "grad" entry.
        self._grad_table = grad_table
        self._order = [i for group in self._groups for i in group.indices]
        n = len(items)
        bounds = [(lo, min(lo + ADDRESS_CHUNK, n)) for lo in range(0, n, ADDRESS_CHUNK)]
        self._address_chunks = [
            (lo, hi, None if grad_table is None else grad_table[lo:hi]) for lo, hi in bounds
        ]
        self._where = {i: (group, k) for group in self._groups
                       for k, i in enumerate(group.indices)}
        # What Python knows the gradient table holds: the arrays it points to (kept alive, so
        # that an identity check is sound), as of `graph_replays()` when it was written eagerly;
        # None when unknown (after a captured step wrote it).
        self._grads: tuple[Any, ...] | None = None
        self._grads_replays = -1
        self._step_read = _CounterRead(self._count, "step")
        self._fresh_read = _CounterRead(self._count, "fresh")

    # -- public attributes --
    @property
    def params(self) -> list[Any]:
        """The parameters: the arrays passed in, updated in place by `step`, in that order."""
        return list(self._params)

    @property
    def step_count(self) -> GPUScalar:
        """Updates applied so far (skipped steps excluded): an int64 GPUScalar viewing the live
        device counter, which `step` increments in place.

        It is read where it is consumed: an expression built from it and consumed by this
        step's `step` (e.g. a learning-rate schedule assigned to ``opt.lr``) sees the count
        before this step; read it (``int(...)``) or copy it before `step` to keep an old value.
        Each access returns a new GPUScalar, so a host read is never a stale cached value.
        """
        return _wrap(self._backend, self._count)

    def state(self, name: str) -> list[Any]:
        """Live per-parameter views of a state buffer (e.g. ``"exp_avg"``), in parameter order
        (later steps update them; `state_dict` returns copies)."""
        names = self._program.arrays[2:]
        if name not in names:
            raise KeyError(f"{type(self).__name__} has no state {name!r}; it has {list(names)}")
        return [self._state_view(i, name) for i in range(len(self._params))]

    def _state_view(self, i: int, name: str) -> Any:
        group, k = self._where[i]
        return group.state_views[name][k]

    # -- the step --
    def step(self, grads: Sequence[Any], *, skip_if: GPUScalar | None = None) -> None:
        """Apply one update from ``grads`` to the parameters, in place, with no sync.

        ``grads``: one array per parameter, of its shape, dtype, backend and device (C-contiguous
        on CuPy), not a parameter itself. Reusing the same gradient arrays from step to step
        costs nothing extra; new ones cost writing their addresses into the kernel's table (one
        launch per `ADDRESS_CHUNK` parameters), and the optimizer keeps a reference to the last
        ones. Inside a captured step (`gs.capture`) the table is always written, from kernel
        arguments the graph keeps, so any gradient arrays work there, new ones each call
        included. ``skip_if``: a bool GPUScalar; when true on the device, parameters, state and
        the step counter stay unchanged. Everything that could make the step fail is checked
        before anything is written.
        """
        backend = self._backend
        if backend.evaluates_on_host:
            self._check_host_arrays()
        items, changed = self._checked_grads(grads)
        skip = _skip(skip_if, backend, self._device)
        scalars = [_route(value) for value in self._scalars()]
        skip_routed = None if skip is None else _route(skip)
        in_graph_body = sync.in_graph_body()
        with backend.device_context(self._device):
            # a captured step always writes the table (each replay then restores its own), and
            # a replay on a GPU changes the table without Python: then it is written again
            if changed or in_graph_body or self._grads_replays != sync.graph_replays():
                self._write_grads(items)
                if in_graph_body:  # recorded (nothing ran yet) or replayed: unknown afterwards
                    self._grads, self._grads_replays = None, -1
                else:
                    self._grads, self._grads_replays = tuple(items), sync.graph_replays()
            for group in self._groups:
                group.launch(backend, self._program, scalars, skip_routed)
            self._increment(skip_routed)

    def _check_host_arrays(self) -> None:
        """On a host-evaluating backend, what would make a step fail half-way (with some tensors
        updated): every array the step writes must still be writeable and have its shape and
        dtype (NumPy lets either change in place after the optimizer was made)."""
        for group in self._groups:
            for tensor, i, shape in zip(group.tensors, group.indices, group.shapes, strict=True):
                for name in group.written:
                    array = tensor[name]
                    if array.flags.writeable and array.shape == shape and (
                        array.dtype == group.dtype
                    ):
                        continue
                    what = (f"params[{i}]" if name == "param"
                            else f"the optimizer's {name} of params[{i}]")
                    if not array.flags.writeable:
                        raise _read_only(what)
                    raise ValueError(f"{what} now has shape {array.shape} and dtype "
                                     f"{array.dtype}, but the optimizer was made for {shape} "
                                     f"and {group.dtype}; nothing was changed")

    def _checked_grads(self, grads: Any) -> tuple[list[Any], bool]:
        """The gradients as a list, and whether they differ from the arrays the table points to.
        Each new gradient is validated before anything is touched (on a host-evaluating backend,
        every gradient: NumPy lets an array's shape change in place)."""
        items = list(grads) if not hasattr(grads, "shape") else None
        n = len(self._params)
        last = self._grads
        same = items is not None and last is not None and len(items) == n and all(
            map(operator.is_, items, last)
        )
        if same and not self._backend.evaluates_on_host:
            return items, False
        if items is None or len(items) != n:
            got = "a single array" if items is None else f"{len(items)} arrays"
            raise ValueError(f"step() needs one gradient per parameter ({n}), got {got}")
        backend, param_ids = self._backend, self._param_ids
        for i, (g, p) in enumerate(zip(items, self._params, strict=True)):
            if type(g) is not type(p) or g.shape != p.shape or g.dtype != p.dtype or (
                g.strides != p.strides
            ) or (backend.multi_device and backend.device_of(g) != self._device):
                _check_like(g, p, f"grads[{i}]", f"params[{i}]", backend)
            if id(g) in param_ids:
                raise ValueError(f"grads[{i}] is a parameter array itself; pass its gradient")
        return items, not same

    def _write_grads(self, items: list[Any]) -> None:
        """Point the kernels at ``items``: one counted launch per `ADDRESS_CHUNK` entries of
        the gradient table, each carrying its addresses by value (never a host-to-device copy,
        so it works inside a captured step, and no host memory is read after the launch)."""
        backend, order = self._backend, self._order
        if backend.evaluates_on_host:
            data = backend.host_data
            for lo, hi, _ in self._address_chunks:
                indices = order[lo:hi]
                backend.call(self._set_host_grads, indices, [data(items[i]) for i in indices])
            return
        address = backend.data_address
        addresses = np.zeros(len(self._address_chunks) * ADDRESS_CHUNK, np.int64)
        addresses[: len(order)] = np.fromiter((address(items[i]) for i in order), np.int64,
                                              count=len(order))
        packed = addresses.view(ADDRESS_STRUCT)  # one struct per chunk
        source, name = address_table_source()
        for k, (lo, hi, table) in enumerate(self._address_chunks):
            args = [table, np.int64(hi - lo), packed[k : k + 1]]  # the struct: by value
            backend.launch_kernel(source, name, hi - lo, args, grid=1, block=_ADDRESS_BLOCK)

    def _set_host_grads(self, indices: list[int], data: list[Any]) -> None:
        where = self._where
        for i, array in zip(indices, data, strict=True):
            group, k = where[i]
            group.tensors[k]["grad"] = array

    def _increment(self, skip: tuple[ScalarKind, tuple] | None) -> None:
        """``count += 1`` (or ``+= !skip``) in place, after the kernels read it: one op."""
        backend = self._backend
        if backend.evaluates_on_host:
            backend.call(_increment_on_host, backend, backend.host_data(self._count), skip)
            return
        source, name = _counter_source(None if skip is None else skip[0])
        args = [self._count] + ([] if skip is None else list(skip[1]))
        backend.launch_kernel(source, name, 1, args, grid=1, block=1)

    def _scalars(self) -> list[Any]:
        """The values of ``self._program.scalars`` for this step (numbers, GPUScalars, or
        reads of the live step counter)."""
        raise NotImplementedError

    # -- checkpointing --
    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of the optimizer: copies on the device, no sync.

        ``{"step": 0-d int64 array, "state": [per parameter, {state name: array}],
        "hyperparams": {name: value}}``. ``hyperparams`` holds the hyperparameters that are
        plain numbers (a GPUScalar hyperparameter, e.g. a schedule, is code: set it again).
        For SGD with momentum, the momentum buffers hold history exactly when step > 0.
        """
        backend = self._backend
        copy = backend.xp.copy
        names = self._program.arrays[2:]
        with backend.device_context(self._device):
            step = backend.call(copy, self._count)
            state = [{name: backend.call(copy, self._state_view(i, name)) for name in names}
                     for i in range(len(self._params))]
        hyperparams = {}
        for name in self._hyperparameters:
            value = getattr(self, name)
            parts = value if isinstance(value, tuple) else (value,)
            if not any(isinstance(part, GPUScalar) for part in parts):
                hyperparams[name] = value
        return {"step": step, "state": state, "hyperparams": hyperparams}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a checkpoint made by `state_dict` (of an optimizer of the same class over
        parameters of the same shapes and dtypes). The arrays are copied into the optimizer's
        own buffers. Everything is validated first: a bad entry raises an error naming its key
        and leaves the optimizer as it was."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        expected = ("step", "state", "hyperparams")
        for key in expected:
            if key not in state_dict:
                raise KeyError(f"state_dict is missing {key!r} (expected keys {list(expected)})")
        unknown = sorted(set(state_dict) - set(expected), key=str)
        if unknown:
            raise ValueError(f"state_dict has unknown keys {unknown} (expected {list(expected)})")
        backend = self._backend
        copies = [(self._count, state_dict["step"], "state_dict['step']",
                   "the step counter (0-d int64)")]
        state = state_dict["state"]
        n = len(self._params)
        if not isinstance(state, Sequence) or len(state) != n:
            got = f"{len(state)} entries" if isinstance(state, Sequence) else type(state).__name__
            raise ValueError(f"state_dict['state'] must be a list of one entry per parameter "
                             f"({n}), got {got}")
        names = self._program.arrays[2:]
        for i, entry in enumerate(state):
            where = f"state_dict['state'][{i}]"
            if not isinstance(entry, Mapping):
                raise TypeError(f"{where} must be a mapping, got {type(entry).__name__}")
            for name in names:
                if name not in entry:
                    raise KeyError(f"{where} is missing {name!r} (expected {list(names)})")
            extra = sorted(set(entry) - set(names), key=str)
            if extra:
                raise ValueError(f"{where} has unknown keys {extra} (expected {list(names)})")
            copies += [(self._state_view(i, name), entry[name], f"{where}[{name!r}]",
                        f"the optimizer's {name} of params[{i}]") for name in names]
        for target, source, what, ref_what in copies:
            _check_like(source, target, what, ref_what, backend, contiguous=False)
            _check_writeable(backend, target, ref_what)
        hyperparams = state_dict["hyperparams"]
        if not isinstance(hyperparams, Mapping):
            raise TypeError("state_dict['hyperparams'] must be a mapping, got "
                            f"{type(hyperparams).__name__}")
        checked = {}
        for name, value in hyperparams.items():
            if name not in self._hyperparameters:
                raise ValueError(f"state_dict['hyperparams'] has unknown key {name!r} "
                                 f"(expected some of {list(self._hyperparameters)})")
            descriptor = getattr(type(self), name)
            checked[descriptor.attribute] = descriptor.check(
                self, f"state_dict['hyperparams'][{name!r}]", value
            )
        # A source may view the optimizer's own buffers (e.g. `state` views, swapped): copied
        # in sequence, a later source would read what an earlier copy wrote. Those are copied
        # aside first (one op each).
        own = [_byte_span(backend, self._count)] + [
            _byte_span(backend, flat) for group in self._groups for flat in group.state.values()
            if flat.size
        ]

        def aliased(source: Any) -> bool:
            if not source.size:
                return False
            low, high = _byte_span(backend, source)
            return any(low < own_high and own_low < high for own_low, own_high in own)

        with backend.device_context(self._device):
            sources = [backend.call(backend.xp.copy, source) if aliased(source) else source
                       for _, source, _, _ in copies]
            for (target, _, _, _), source in zip(copies, sources, strict=True):
                backend.call(backend.xp.copyto, target, source)
        for attribute, value in checked.items():
            setattr(self, attribute, value)


class Adam(Optimizer):
    """Fused multi-tensor Adam on the user's arrays (PyTorch's ``torch.optim.Adam``; L2
    ``weight_decay``). State: ``exp_avg``, ``exp_avg_sq``."""

    _decoupled = False
    _hyperparameters = ("lr", "betas", "eps", "weight_decay")

    betas = _Hyperparameter(
        lambda opt, name, value: _betas(value, opt._backend, opt._device, name),
        "(beta1, beta2): numbers in [0, 1) or GPUScalars.",
    )
    eps = _Hyperparameter(_nonnegative, "Added to the denominator: a number or GPUScalar.")
    weight_decay = _Hyperparameter(_nonnegative, "Weight decay: a number or GPUScalar (>= 0).")

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 0.0,
    ) -> None:
        super().__init__(params, lr, ADAMW if self._decoupled else ADAM)
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay

    def _scalars(self) -> list[Any]:
        beta1, beta2 = self._betas
        return [self._lr, beta1, beta2, self._eps, self._weight_decay, self._step_read]


class AdamW(Adam):
    """Fused multi-tensor AdamW (PyTorch's ``torch.optim.AdamW``: decoupled weight decay)."""

    _decoupled = True

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 1e-2,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay)


def _sgd_momentum(opt: SGD, name: str, value: Any) -> Any:
    value = _nonnegative(opt, name, value)
    if isinstance(value, GPUScalar):
        if opt._program is SGD_PLAIN:
            raise ValueError(f"{name}: this SGD was made without momentum (no momentum "
                             "buffers); make a new SGD with momentum > 0")
        return value
    if opt._program is SGD_PLAIN and value != 0:
        raise ValueError(f"{name}: this SGD was made without momentum (no momentum buffers); "
                         "make a new SGD with momentum > 0")
    return value  # 0 on an SGD made with momentum: plain SGD steps, buffers kept (PyTorch's)


def _sgd_dampening(opt: SGD, name: str, value: Any) -> Any:
    value = _nonnegative(opt, name, value)
    if opt._program is SGD_NESTEROV and not isinstance(value, GPUScalar) and value != 0:
        raise ValueError(f"{name}: nesterov momentum needs dampening == 0")
    return value


class SGD(Optimizer):
    """Fused multi-tensor SGD on the user's arrays (PyTorch's ``torch.optim.SGD``: momentum,
    dampening, Nesterov, L2 weight decay). Made with momentum (> 0 or a GPUScalar), the state
    is a ``momentum_buffer``, which starts as the first non-skipped step's gradient. As in
    PyTorch, a step whose momentum is 0 (set later, or a GPUScalar's value, decided on the
    device) is a plain SGD step that leaves the buffers as they are."""

    _hyperparameters = ("lr", "momentum", "dampening", "weight_decay")

    momentum = _Hyperparameter(_sgd_momentum, "Momentum: a number or GPUScalar (>= 0).")
    dampening = _Hyperparameter(_sgd_dampening, "Dampening: a number or GPUScalar (>= 0).")
    weight_decay = _Hyperparameter(_nonnegative, "Weight decay: a number or GPUScalar (>= 0).")

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any,
        momentum: Any = 0.0,
        dampening: Any = 0.0,
        weight_decay: Any = 0.0,
        nesterov: bool = False,
    ) -> None:
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__}")
        uses_momentum = isinstance(momentum, GPUScalar) or (
            isinstance(momentum, numbers.Real) and momentum != 0
        )
        if nesterov and (not uses_momentum or (
            not isinstance(dampening, GPUScalar) and dampening != 0
        )):
            raise ValueError("nesterov momentum needs momentum > 0 and dampening == 0")
        program = (SGD_NESTEROV if nesterov else SGD_MOMENTUM) if uses_momentum else SGD_PLAIN
        super().__init__(params, lr, program)
        self.momentum = momentum
        self.dampening = dampening
        self.weight_decay = weight_decay

    @property
    def nesterov(self) -> bool:
        """Whether the update uses Nesterov momentum (fixed at construction)."""
        return self._program is SGD_NESTEROV

    def _scalars(self) -> list[Any]:
        if self._program is SGD_PLAIN:
            return [self._lr, self._weight_decay]
        return [self._lr, self._momentum, self._dampening, self._weight_decay, self._fresh_read]
