"""Update rules as data: `Program`, the scalar kinds a kernel receives, and the host evaluator.

Why this module exists: each optimizer's update is written once, as a `Program` whose
per-element values are `gpuscalar.lazy.rules` expressions (lazy nodes built with Python
operators: ``+ - * /``, comparisons, ``sqrt``, ``pow``, ``select``, ``minimum``, ``maximum``,
``sign``). One host evaluator and one C printer read the same nodes, so the CPU and GPU math
cannot drift: this module's `evaluate_host` applies them with NumPy ufuncs (inside one counted
backend call, the CPU stand-in for one kernel), and `gpuscalar.optim.kernels` prints them into
CUDA. An algorithm's file defines its Programs and `register`s them (the kernel tests walk
`PROGRAMS`), so a new optimizer touches no shared list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import Backend
from ..lazy import codegen, expr, rules
from ..lazy.rules import RuleTerm

__all__ = ["Program", "PROGRAMS", "register", "COUNTER_READS", "ScalarKind", "VALUE",
           "CounterRead", "evaluate_host", "host_scalar", "apply_rules"]

_counter = rules.symbol("counter")
#: What a class kernel computes from the live step counter ``counter`` (an int64 read on the
#: device): Adam's 1-based step, and SGD's "no history yet" flag.
COUNTER_READS: dict[str, RuleTerm] = {"step": _counter + 1, "fresh": _counter == 0}


@dataclass(frozen=True, eq=False)  # identity: a kernel-cache key hashed on every step
class Program:
    """One fused elementwise update, described once for NumPy and CUDA.

    ``scalars`` are hyperparameter names; ``prelude`` computes per-call values from them;
    ``body`` computes per-element temporaries from the arrays' current elements and earlier
    temporaries; each entry is ``(name, rule)``, the rule reading earlier names as
    `gpuscalar.lazy.rules` symbols. ``outputs`` maps each written array to the temporary stored
    in it. Every array is read before any is written, so in-place updates are safe. ``helpers``
    (derived) is the CUDA code the rules call beyond ``kernels/fused_elementwise.cu``.
    """

    name: str
    scalars: tuple[str, ...]
    arrays: tuple[str, ...]
    prelude: tuple[tuple[str, RuleTerm], ...]
    body: tuple[tuple[str, RuleTerm], ...]
    outputs: tuple[tuple[str, str], ...]
    helpers: str = field(init=False, default="")

    def __post_init__(self) -> None:
        known = set(self.scalars)
        for part, entries in (("prelude", self.prelude), ("body", self.body)):
            if part == "body":
                known.update(self.arrays)
            for name, rule in entries:
                if not isinstance(rule, RuleTerm):
                    raise TypeError(f"Program {self.name!r}: {part} entry {name!r} must be a "
                                    f"gpuscalar.lazy.rules.RuleTerm, got {type(rule).__name__}")
                unknown = sorted(rules.symbols_read(rule) - known)
                if unknown:
                    raise ValueError(f"Program {self.name!r}: {part} entry {name!r} reads "
                                     f"{', '.join(unknown)}, not defined before it")
                known.add(name)
        for array, temporary in self.outputs:
            if array not in self.arrays or temporary not in dict(self.body):
                raise ValueError(f"Program {self.name!r}: output ({array!r}, {temporary!r}) "
                                 "must store a body temporary in one of the arrays")
        helpers = codegen.cuda_helpers(rule for _, rule in (*self.prelude, *self.body))
        object.__setattr__(self, "helpers", helpers)


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
        return rules.evaluate(COUNTER_READS[kind[1]], {"counter": backend.host_data(leaves[0])})
    if tag == "pending":
        return expr.evaluate_plan(expr.plan_for_key(kind[1]), leaves, backend.host_data)
    raise ValueError(f"unknown scalar kind {kind!r}")


# ---- the host evaluator of a Program -------------------------------------------------------


def apply_rules(program: Program, scalars: Mapping[str, Any],
                tensors: Iterable[Mapping[str, np.ndarray]]) -> None:
    """``program``'s rules with NumPy: the prelude once from ``scalars`` (values of the arrays'
    dtype by name), then the body over each tensor's arrays, outputs written in place."""
    with np.errstate(all="ignore"):  # IEEE results, no warnings: a kernel cannot warn either
        env = dict(scalars)
        for name, rule in program.prelude:
            env[name] = rules.evaluate(rule, env)
        for arrays in tensors:
            local = dict(env)
            local.update(arrays)
            for name, rule in program.body:
                local[name] = rules.evaluate(rule, local)
            for array_name, temporary in program.outputs:
                np.copyto(arrays[array_name], local[temporary], casting="same_kind")


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
    with np.errstate(all="ignore"):
        values = {name: np.asarray(host_scalar(backend, *routed)).astype(dtype)
                  for name, routed in zip(program.scalars, scalars, strict=True)}
    apply_rules(program, values, tensors)
