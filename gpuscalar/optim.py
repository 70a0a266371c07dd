"""Fused optimizer steps, sync-free gradient clipping and on-device skipping.

Why this module exists: an optimizer step is where device scalars pay off or are wasted. A
learning-rate schedule, Adam's bias correction from the step count, a clipping coefficient from
the gradient norm, a "skip this step, the gradients overflowed" flag: in most Python code each of
these is a Python float or bool, so computing it from device values costs a synchronization per
step. Here every hyperparameter may be a `GPUScalar`, read by the kernel through a pointer, and
nothing is ever read back to the host.

Each update rule is written once, as a `Program`: per-element expression strings in the common
subset of Python and C (``+ - * /``, comparisons, ``sqrt``, ``pow``, ``select``, ``minimum``).
On NumPy the strings are evaluated with NumPy inside ONE counted backend call (the CPU stand-in
for one kernel); on CuPy they are pasted into a CUDA kernel (``kernels/fused_elementwise.cu``
supplies the helpers), compiled once per variant and launched once. The two paths share the
math by construction.

The optimizer classes keep each dtype group's parameters, gradients and state in flat buffers
(the user's parameters become views into them, ``opt.params``), so a step is O(1) launches per
dtype group however many tensors there are, as PyTorch's fused/foreach Adam is.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from . import reduce
from .backend import Backend, backend_of
from .scalar import GPUScalar, _array_of, _wrap, minimum

__all__ = [
    "Program",
    "ADAM",
    "ADAMW",
    "SGD_PLAIN",
    "SGD_MOMENTUM",
    "SGD_NESTEROV",
    "PROGRAMS",
    "kernel_source",
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
#: C type of a hyperparameter read through a pointer, by the GPUScalar's dtype.
POINTER_CTYPES: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "int32": "int",
    "int64": "long long",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "bool": "bool",
}
#: NumPy twins of the helper functions the expression strings may call (see the .cu header).
NUMPY_HELPERS: dict[str, Any] = {
    "sqrt": np.sqrt,
    "pow": np.power,
    "select": np.where,
    "minimum": np.minimum,
}


@dataclass(frozen=True)
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
# ``fresh`` is 1 while the momentum buffer holds no history: PyTorch then sets buf = grad.
_SGD_MOMENTUM_BODY = (
    ("g", "grad + weight_decay * param"),
    ("b", "select(fresh != 0, g, momentum * momentum_buffer + (1 - dampening) * g)"),
)
#: PyTorch SGD with momentum (heavy ball).
SGD_MOMENTUM = Program(
    name="sgd_momentum",
    scalars=("lr", "momentum", "dampening", "weight_decay", "fresh"),
    arrays=("param", "grad", "momentum_buffer"),
    prelude=(),
    body=(*_SGD_MOMENTUM_BODY, ("p", "param - lr * b")),
    outputs=(("param", "p"), ("momentum_buffer", "b")),
)
#: PyTorch SGD with Nesterov momentum.
SGD_NESTEROV = Program(
    name="sgd_nesterov",
    scalars=SGD_MOMENTUM.scalars,
    arrays=SGD_MOMENTUM.arrays,
    prelude=(),
    body=(*_SGD_MOMENTUM_BODY, ("p", "param - lr * (g + momentum * b)")),
    outputs=SGD_MOMENTUM.outputs,
)
PROGRAMS: tuple[Program, ...] = (ADAM, ADAMW, SGD_PLAIN, SGD_MOMENTUM, SGD_NESTEROV)


# ---- the two evaluators of a Program ------------------------------------------------------


@cache
def _compiled(expression: str) -> Any:
    return compile(expression, f"<gpuscalar expression {expression!r}>", "eval")


def _evaluate_numpy(
    program: Program, scalars: dict[str, Any], arrays: dict[str, Any], skip: Any
) -> None:
    """The CPU stand-in for one kernel launch: the Program's math, with NumPy, in place.

    Scalars are cast to the arrays' dtype first, as the CUDA kernel does. ``skip`` (a 0-d bool
    array or None) keeps every output unchanged where true, without branching on its value.
    """
    with np.errstate(all="ignore"):  # IEEE results, no warnings: a kernel cannot warn either
        _evaluate_numpy_quietly(program, scalars, arrays, skip)


def _evaluate_numpy_quietly(
    program: Program, scalars: dict[str, Any], arrays: dict[str, Any], skip: Any
) -> None:
    dtype = arrays[program.arrays[0]].dtype
    env: dict[str, Any] = dict(NUMPY_HELPERS)
    for name in program.scalars:
        env[name] = np.asarray(scalars[name]).astype(dtype)
    for name, expression in program.prelude:
        env[name] = eval(_compiled(expression), env)  # noqa: S307 - library-owned expressions
    env.update(arrays)
    for name, expression in program.body:
        env[name] = eval(_compiled(expression), env)  # noqa: S307
    keep = True if skip is None else np.logical_not(skip)
    for array_name, temporary in program.outputs:
        np.copyto(arrays[array_name], env[temporary], casting="same_kind", where=keep)


@cache
def _header() -> str:
    return resources.files(__package__).joinpath("kernels/fused_elementwise.cu").read_text()


def kernel_source(
    program: Program, dtype: str, scalar_kinds: Sequence[str | None], has_skip: bool
) -> tuple[str, str]:
    """CUDA source and kernel name for ``program`` on arrays of ``dtype`` (``"float32"`` or
    ``"float64"``).

    ``scalar_kinds`` gives, per scalar in ``program.scalars``, the NumPy dtype name of the 0-d
    device array it is read from through a pointer, or None for a plain value of the array's
    type. ``has_skip`` adds a ``const bool*`` argument: when it points to true the kernel
    returns before touching anything.
    """
    ctype = KERNEL_DTYPES[dtype]
    kernel = f"gpuscalar_{program.name}_{dtype}"
    params = ["const long long n"]
    written = {array for array, _ in program.outputs}
    params += [
        f"{'' if name in written else 'const '}{ctype}* __restrict__ {name}_p"
        for name in program.arrays
    ]
    loads = []
    for name, kind in zip(program.scalars, scalar_kinds, strict=True):
        if kind is None:
            params.append(f"const T {name}")
        else:
            params.append(f"const {POINTER_CTYPES[kind]}* __restrict__ {name}_ptr")
            loads.append(f"    const T {name} = (T)(*{name}_ptr);")
    if has_skip:
        params.append("const bool* __restrict__ skip_ptr")
    lines = [_header(), f"typedef {ctype} T;", ""]
    lines.append(f'extern "C" __global__ void {kernel}(' + ", ".join(params) + ") {")
    if has_skip:
        lines.append("    if (*skip_ptr) return;")
    lines += loads
    lines += [f"    const T {name} = {expr};" for name, expr in program.prelude]
    lines.append(
        "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
        " i += (long long)blockDim.x * gridDim.x) {"
    )
    lines += [f"        const T {name} = {name}_p[i];" for name in program.arrays]
    lines += [f"        const T {name} = {expr};" for name, expr in program.body]
    lines += [f"        {array}_p[i] = {temp};" for array, temp in program.outputs]
    lines += ["    }", "}", ""]
    return "\n".join(lines), kernel


def _run_program(
    backend: Backend,
    program: Program,
    scalars: dict[str, Any],
    arrays: dict[str, Any],
    skip: GPUScalar | None,
) -> None:
    """Launch ``program`` once (one counted device op). Scalars are Python numbers or
    GPUScalars; arrays are same-shape, same-dtype arrays of ``backend``."""
    skip_array = None if skip is None else _array_of(skip)
    if backend.evaluates_on_host:
        data = backend.host_data
        raw = {k: data(_array_of(v)) if isinstance(v, GPUScalar) else v
               for k, v in scalars.items()}
        raw_arrays = {k: data(v) for k, v in arrays.items()}
        raw_skip = None if skip_array is None else data(skip_array)
        backend.call(_evaluate_numpy, program, raw, raw_arrays, raw_skip)
        return
    first = arrays[program.arrays[0]]
    dtype = first.dtype.name
    kinds = [v.dtype.name if isinstance(v, GPUScalar) else None for v in map(scalars.get,
             program.scalars)]
    source, name = kernel_source(program, dtype, kinds, skip is not None)
    args: list[Any] = [np.int64(first.size)]
    args += [arrays[name_] for name_ in program.arrays]
    args += [
        _array_of(v) if isinstance(v, GPUScalar) else first.dtype.type(v)
        for v in map(scalars.get, program.scalars)
    ]
    if skip_array is not None:
        args.append(skip_array)
    backend.launch_kernel(source, name, first.size, args)


# ---- validation --------------------------------------------------------------------------


def _check_array(value: Any, what: str) -> Backend:
    backend = backend_of(value)
    if backend is None:
        raise TypeError(f"{what} must be a NumPy or CuPy array, got {type(value).__name__}")
    if value.dtype.name not in KERNEL_DTYPES:
        raise TypeError(f"{what} must be float32 or float64, got dtype {value.dtype}")
    if backend.name == "cupy" and not value.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous for the fused CUDA kernel")
    return backend


def _check_like(value: Any, reference: Any, what: str, ref_what: str, backend: Backend) -> None:
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
    if backend.name == "cupy" and not value.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous for the fused CUDA kernel")


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
        if value.dtype.kind not in "fiu" or value.dtype.name not in POINTER_CTYPES:
            raise TypeError(
                f"{name} must be a real number, got a GPUScalar of dtype {value.dtype} (the "
                "kernels read float32/float64/int32/int64/uint32/uint64 scalars)"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
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


def _betas(betas: Any, backend: Backend, device: object) -> tuple[Any, Any]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    return (
        _hyper(betas[0], "betas[0]", backend, device, high=1.0, high_open=True),
        _hyper(betas[1], "betas[1]", backend, device, high=1.0, high_open=True),
    )


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
        momentum_buffer = backend.call(backend.xp.zeros_like, param)
    else:
        _check_like(momentum_buffer, param, "momentum_buffer", "param", backend)
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
        raise ValueError(f"norm_type must be a positive number or math.inf, got {norm_type!r}")
    max_norm = _hyper(max_norm, "max_norm", backend, backend.device_of(items[0]))
    total = reduce.global_norm(items, ord=norm_type)
    coef = _array_of(minimum(max_norm / (total + 1e-6), 1.0))
    for g in items:
        backend.call(backend.xp.multiply, g, coef, out=g, casting="same_kind")
    return total


def all_finite(arrays: Sequence[Any]) -> GPUScalar:
    """Whether every element of every array is finite, as a bool GPUScalar (no sync).

    For loss scaling: ``opt.step(grads, skip_if=~all_finite(grads))``.
    """
    items = list(arrays)
    if not items:
        raise ValueError("all_finite() needs at least one array")
    backend = backend_of(items[0])
    flags = []
    for i, a in enumerate(items):
        if backend is None or backend_of(a) is not backend:
            expected = "a NumPy or CuPy" if backend is None else f"a {backend.name}"
            raise TypeError(f"all_finite(): arrays[{i}] must be {expected} array, "
                            f"got {type(a).__name__}")
        flags.append(reduce.all(backend.call(backend.xp.isfinite, a)))
    if len(flags) == 1:
        return flags[0]
    return reduce.all(backend.call(backend.xp.stack, [_array_of(f) for f in flags]))


# ---- multi-tensor optimizers ---------------------------------------------------------------


class _Group:
    """One dtype's parameters: flat buffers for params, grads and state, and views into them."""

    def __init__(self, backend: Backend, indices: list[int], params: list[Any], state: tuple):
        xp = backend.xp
        self.indices = indices
        self.shapes = [p.shape for p in params]
        self.sizes = [int(p.size) for p in params]
        total = sum(self.sizes)
        dtype = params[0].dtype
        self.param = backend.call(xp.empty, total, dtype=dtype)
        backend.call(xp.concatenate, [p.reshape(-1) for p in params], out=self.param)
        self.grad = backend.call(xp.zeros, total, dtype=dtype)
        self.state = {name: backend.call(xp.zeros, total, dtype=dtype) for name in state}
        self.param_views = self._views(self.param)
        self.grad_views = self._views(self.grad)

    def _views(self, flat: Any) -> list[Any]:
        views, offset = [], 0
        for shape, size in zip(self.shapes, self.sizes, strict=True):
            views.append(flat[offset : offset + size].reshape(shape))
            offset += size
        return views


class Optimizer:
    """Base of the fused multi-tensor optimizers (`Adam`, `AdamW`, `SGD`).

    The parameters are copied into one flat buffer per dtype; ``opt.params`` are views into it
    (use them, not the originals, from then on). ``opt.grads`` are views into matching gradient
    buffers: a backward pass that writes there saves the one gather copy per group that
    `step` otherwise makes. State is on the device, the step counter is a device integer
    (``opt.step_count``), and ``lr`` may be set to a GPUScalar (a schedule computed on the
    device, e.g. from ``opt.step_count``). A step is O(1) device ops per dtype group.
    """

    _state_names: tuple[str, ...] = ()

    def __init__(self, params: Sequence[Any], lr: Any) -> None:
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
        self._backend, self._device = backend, device
        by_dtype: dict[Any, list[int]] = {}
        for i, p in enumerate(items):
            by_dtype.setdefault(p.dtype, []).append(i)
        self._groups = [
            _Group(backend, idx, [items[i] for i in idx], self._state_names)
            for idx in by_dtype.values()
        ]
        self._count = backend.call(backend.xp.zeros, (), dtype=np.int64)
        self._n = len(items)
        self.lr = lr

    # -- public attributes --
    @property
    def lr(self) -> Any:
        """The learning rate: a Python number or a GPUScalar (validated when set)."""
        return self._lr

    @lr.setter
    def lr(self, value: Any) -> None:
        self._lr = _hyper(value, "lr", self._backend, self._device)

    @property
    def params(self) -> list[Any]:
        """The parameters, as views into the optimizer's flat buffers, in the order given."""
        return self._gather("param_views")

    @property
    def grads(self) -> list[Any]:
        """Gradient buffers (views) shaped like ``params``; pass them to `step` to skip the
        gather copy."""
        return self._gather("grad_views")

    @property
    def step_count(self) -> GPUScalar:
        """Number of updates applied so far (skipped steps excluded), an int64 GPUScalar."""
        return _wrap(self._backend, self._count)

    def state(self, name: str) -> list[Any]:
        """Per-parameter views of a state buffer (e.g. ``"exp_avg"``), in parameter order."""
        if name not in self._state_names:
            raise KeyError(f"{type(self).__name__} has no state {name!r}; it has "
                           f"{list(self._state_names)}")
        out: list[Any] = [None] * self._n
        for group in self._groups:
            for i, view in zip(group.indices, group._views(group.state[name]), strict=True):
                out[i] = view
        return out

    def _gather(self, attribute: str) -> list[Any]:
        out: list[Any] = [None] * self._n
        for group in self._groups:
            for i, view in zip(group.indices, getattr(group, attribute), strict=True):
                out[i] = view
        return out

    # -- the step --
    def step(self, grads: Sequence[Any], *, skip_if: GPUScalar | None = None) -> None:
        """Apply one update from ``grads`` (arrays shaped like ``params``), with no sync.

        ``skip_if``: a bool GPUScalar; when true on the device, parameters, state and the step
        counter stay unchanged.
        """
        backend, xp = self._backend, self._backend.xp
        items = list(grads) if not hasattr(grads, "shape") else None
        if items is None or len(items) != self._n:
            got = "a single array" if items is None else f"{len(items)} arrays"
            raise ValueError(f"step() needs one gradient per parameter ({self._n}), got {got}")
        for group in self._groups:
            for i, view in zip(group.indices, group.param_views, strict=True):
                _check_like(items[i], view, f"grads[{i}]", f"params[{i}]", backend)
        skip = _skip(skip_if, backend, self._device)
        step = _wrap(backend, backend.call(xp.add, self._count, 1))
        program, scalars = self._program(step)
        for group in self._groups:
            group_grads = [items[i] for i in group.indices]
            if not all(g is v for g, v in zip(group_grads, group.grad_views, strict=True)):
                backend.call(xp.concatenate, [g.reshape(-1) for g in group_grads], out=group.grad)
            arrays = {"param": group.param, "grad": group.grad}
            arrays.update(group.state)
            _run_program(backend, program, scalars, arrays, skip)
        if skip is None:
            self._count = _array_of(step)
        else:
            self._count = backend.call(xp.where, _array_of(skip), self._count, _array_of(step))

    def _program(self, step: GPUScalar) -> tuple[Program, dict[str, Any]]:
        raise NotImplementedError


class Adam(Optimizer):
    """Fused multi-tensor Adam (PyTorch's ``torch.optim.Adam``; L2 ``weight_decay``)."""

    _state_names = ("exp_avg", "exp_avg_sq")
    _decoupled = False

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 0.0,
    ) -> None:
        super().__init__(params, lr)
        self.betas = _betas(betas, self._backend, self._device)
        self.eps = _hyper(eps, "eps", self._backend, self._device)
        self.weight_decay = _hyper(weight_decay, "weight_decay", self._backend, self._device)

    def _program(self, step: GPUScalar) -> tuple[Program, dict[str, Any]]:
        scalars = {
            "lr": self._lr,
            "beta1": self.betas[0],
            "beta2": self.betas[1],
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "step": step,
        }
        return (ADAMW if self._decoupled else ADAM), scalars


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


class SGD(Optimizer):
    """Fused multi-tensor SGD (PyTorch's ``torch.optim.SGD``: momentum, dampening, Nesterov,
    L2 weight decay). The momentum buffer starts as the first (non-skipped) gradient."""

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any,
        momentum: Any = 0.0,
        dampening: Any = 0.0,
        weight_decay: Any = 0.0,
        nesterov: bool = False,
    ) -> None:
        uses_momentum = isinstance(momentum, GPUScalar) or momentum != 0
        self._state_names = ("momentum_buffer",) if uses_momentum else ()
        super().__init__(params, lr)
        backend, device = self._backend, self._device
        self.momentum = _hyper(momentum, "momentum", backend, device)
        self.dampening = _hyper(dampening, "dampening", backend, device)
        self.weight_decay = _hyper(weight_decay, "weight_decay", backend, device)
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__}")
        if nesterov and (not uses_momentum or (
            not isinstance(dampening, GPUScalar) and dampening != 0
        )):
            raise ValueError("nesterov momentum needs momentum > 0 and dampening == 0")
        self.nesterov = nesterov

    def _program(self, step: GPUScalar) -> tuple[Program, dict[str, Any]]:
        scalars = {"lr": self._lr, "weight_decay": self.weight_decay}
        if not self._state_names:
            return SGD_PLAIN, scalars
        scalars.update(momentum=self.momentum, dampening=self.dampening, fresh=step == 1)
        return (SGD_NESTEROV if self.nesterov else SGD_MOMENTUM), scalars
