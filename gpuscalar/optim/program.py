"""Update rules as data: `Program`, the scalar kinds a kernel receives, and the host evaluator.

Why this module exists: each optimizer's update is written once, as a `Program` of per-element
expression strings in the common subset of Python and C (``+ - * /``, comparisons, ``sqrt``,
``pow``, ``select``, ``minimum``, ``sign``). Two evaluators read the same strings, so the CPU and
GPU math cannot drift: this module's `evaluate_host` runs them with NumPy (inside one counted
backend call, the CPU stand-in for one kernel), and `gpuscalar.optim.kernels` pastes them into
CUDA. An algorithm's file defines its Programs and `register`s them (the kernel tests walk
`PROGRAMS`), so a new optimizer touches no shared list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ..backend import Backend
from ..lazy import expr

__all__ = ["Program", "PROGRAMS", "register", "NUMPY_HELPERS", "COUNTER_READS", "ScalarKind",
           "VALUE", "CounterRead", "evaluate_host", "host_scalar", "SIGN_HELPER"]

#: NumPy twins of the helper functions the expression strings may call (see the .cu header).
NUMPY_HELPERS: dict[str, Any] = {
    "sqrt": np.sqrt,
    "pow": np.power,
    "select": np.where,
    "minimum": np.minimum,
    "sign": np.sign,  # defined in CUDA by the Programs that use it (`SIGN_HELPER`)
}
#: CUDA twin of ``numpy.sign`` (NaN stays NaN, a zero of either sign gives +0), for a Program's
#: ``helpers``: only the kernels that use it carry it, so every other kernel's text is unchanged.
SIGN_HELPER = (
    "template <typename T>\n"
    "__device__ __forceinline__ T sign(T x) { return x > 0 ? T(1) : (x < 0 ? T(-1) : "
    "(x == 0 ? T(0) : x)); }\n"
)
#: What a class kernel computes from the live step counter ``{0}`` (an int64 read on the device),
#: in the common subset of Python and C: Adam's 1-based step, and SGD's "no history yet" flag.
COUNTER_READS: dict[str, str] = {"step": "({0} + 1)", "fresh": "({0} == 0)"}


@dataclass(frozen=True, eq=False)  # identity: a kernel-cache key hashed on every step
class Program:
    """One fused elementwise update, described once for NumPy and CUDA.

    ``scalars`` are hyperparameter names; ``prelude`` computes per-call values from them;
    ``body`` computes per-element temporaries from the arrays' current elements (read by name)
    and earlier temporaries; ``outputs`` maps each written array to the temporary stored in it.
    Every array is read before any is written, so in-place updates are safe. ``helpers`` is
    CUDA code the kernel needs beyond ``kernels/fused_elementwise.cu`` (e.g. `SIGN_HELPER`).
    """

    name: str
    scalars: tuple[str, ...]
    arrays: tuple[str, ...]
    prelude: tuple[tuple[str, str], ...]
    body: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    helpers: str = ""


#: Every registered Program, in registration order (the kernel tests compile each one).
PROGRAMS: list[Program] = []


def register(*programs: Program) -> None:
    """Add an algorithm's Programs to `PROGRAMS` (once each)."""
    PROGRAMS.extend(p for p in programs if p not in PROGRAMS)


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
# `gpuscalar.optim.executors.route` decides a value's kind; `kernels` declares each kind in C.

ScalarKind = tuple
#: The kind of a scalar passed by value.
VALUE: ScalarKind = ("value",)


class CounterRead:
    """A value the kernel derives from a live int64 counter buffer on the device."""

    __slots__ = ("array", "read")

    def __init__(self, array: Any, read: str) -> None:
        self.array, self.read = array, read


def host_scalar(backend: Backend, kind: ScalarKind, leaves: tuple[Any, ...]) -> Any:
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


# ---- the two evaluators of a Program ------------------------------------------------------


@cache
def _compiled(expression: str) -> Any:
    return compile(expression, f"<gpuscalar expression {expression!r}>", "eval")


def evaluate_host(
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
    if skip is not None and bool(host_scalar(backend, *skip)):
        return
    if not tensors:
        return
    dtype = tensors[0][program.arrays[0]].dtype
    with np.errstate(all="ignore"):  # IEEE results, no warnings: a kernel cannot warn either
        env: dict[str, Any] = dict(NUMPY_HELPERS)
        for name, routed in zip(program.scalars, scalars, strict=True):
            env[name] = np.asarray(host_scalar(backend, *routed)).astype(dtype)
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

