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

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..backend import Backend
from ..lazy import codegen, expr, rules
from ..lazy.rules import RuleTerm

__all__ = ["Program", "PROGRAMS", "register", "COUNTER_READS", "ScalarKind", "ScalarCode",
           "ValueScalar", "PointerScalar", "CounterScalar", "PendingScalar", "VALUE",
           "POINTER_CTYPES", "POINTER_KINDS", "PENDING_KINDS", "COUNTER_KINDS", "CounterRead",
           "BoundedTable",
           "evaluate_host", "apply_rules"]

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
# value); its *leaves* are the runtime arguments the kernel receives for it. Each kind is a
# small class that answers what each consumer asks of it: its kernel parameters and prelude
# lines (`ScalarKind.declaration`, for `gpuscalar.optim.kernels`), its launch arguments
# (`ScalarKind.arguments`, for the CUDA executor) and its value on the host
# (`ScalarKind.host_value`, for the host executor). `gpuscalar.optim.executors.route` is the one
# place that decides a value's kind.

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


@dataclass(frozen=True)
class ScalarCode:
    """How a kernel declares one scalar: its parameters, the prelude statements that end by
    defining the scalar's name, and any preamble code they need (emitted once, before the
    kernel, in first-use order)."""

    params: tuple[str, ...]
    statements: tuple[str, ...]
    preambles: tuple[str, ...] = ()


_Kind = TypeVar("_Kind", bound="ScalarKind")


class ScalarKind(tuple):
    """How a kernel receives one scalar: frozen and hashable, part of the kernel's key.

    A kind is the tuple ``(tag, *fields)`` (``("pointer", "float32")``): it hashes and compares
    as a tuple does, in C, in the kernel-cache key a step hashes on every launch, and equals the
    plain tuple of its parts (`ScalarKind.of` makes the class back from them). A subclass sets
    `tag`, names its fields, and answers the three questions of its consumers.
    """

    __slots__ = ()
    #: the kind's first element, naming it in the plain tuple form
    tag: ClassVar[str]
    #: whether `arguments` returns the leaves as they are (a launch then skips the call)
    passes_leaves: ClassVar[bool] = True

    def __new__(cls: type[_Kind], *fields: Any) -> _Kind:
        return tuple.__new__(cls, (cls.tag, *fields))

    def __getnewargs__(self) -> tuple[Any, ...]:  # (copy, pickle: the fields, not the tag)
        return tuple(self[1:])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self[1:]))})"

    @staticmethod
    def of(parts: Sequence[Any]) -> ScalarKind:
        """The kind whose plain tuple is ``parts`` (``("counter", "step")``)."""
        kind = _KINDS.get(parts[0]) if parts else None
        if kind is None:
            raise ValueError(f"unknown scalar kind {tuple(parts)!r}")
        return kind(*parts[1:])

    def declaration(self, name: str, ctype: str = "T") -> ScalarCode:
        """The kernel code that gives scalar ``name`` (of C type ``ctype``) of this kind: every
        identifier it adds starts with ``name``."""
        raise NotImplementedError

    def arguments(self, leaves: tuple[Any, ...], ctype: type) -> tuple[Any, ...]:
        """The scalar's kernel arguments, in the order `declaration` declares them; ``ctype``
        is the NumPy scalar type of the kernel's T."""
        return leaves

    def host_value(self, backend: Backend, leaves: tuple[Any, ...]) -> Any:
        """The value the kernel would compute for the scalar, on a host-evaluating backend
        (called inside the counted device op, where reading device data is the device's own
        work)."""
        raise NotImplementedError


class ValueScalar(ScalarKind):
    """A Python number, passed by value as the arrays' type T."""

    __slots__ = ()
    tag = "value"
    passes_leaves = False

    def declaration(self, name: str, ctype: str = "T") -> ScalarCode:
        return ScalarCode((f"const T {name}_val",),
                          (f"const {ctype} {name} = ({ctype})({name}_val);",))

    def arguments(self, leaves: tuple[Any, ...], ctype: type) -> tuple[Any, ...]:
        return (ctype(leaves[0]),)  # converted to T, as the kernel declares it

    def host_value(self, backend: Backend, leaves: tuple[Any, ...]) -> Any:
        return leaves[0]


class PointerScalar(ScalarKind):
    """A GPUScalar's 0-d array of `dtype`, dereferenced by the kernel."""

    __slots__ = ()
    tag = "pointer"

    @property
    def dtype(self) -> str:
        return self[1]

    def declaration(self, name: str, ctype: str = "T") -> ScalarCode:
        return ScalarCode((f"const {POINTER_CTYPES[self.dtype]}* __restrict__ {name}_ptr",),
                          (f"const {ctype} {name} = ({ctype})(*{name}_ptr);",))

    def host_value(self, backend: Backend, leaves: tuple[Any, ...]) -> Any:
        return backend.host_data(leaves[0])


class CounterScalar(ScalarKind):
    """The optimizer's int64 step counter, through a pointer, with the arithmetic
    ``COUNTER_READS[read]`` inlined into the prelude."""

    __slots__ = ()
    tag = "counter"

    @property
    def read(self) -> str:
        return self[1]

    def declaration(self, name: str, ctype: str = "T") -> ScalarCode:
        read = codegen.c_source(COUNTER_READS[self.read], {"counter": f"(*{name}_ptr)"})
        return ScalarCode((f"const long long* __restrict__ {name}_ptr",),
                          (f"const {ctype} {name} = ({ctype})({read});",))

    def host_value(self, backend: Backend, leaves: tuple[Any, ...]) -> Any:
        return rules.evaluate(COUNTER_READS[self.read], {"counter": backend.host_data(leaves[0])})


class PendingScalar(ScalarKind):
    """A pending (lazy) GPUScalar of the expression structure `key`: its leaves (0-d arrays and
    constants) are parameters, and the prelude computes it with `gpuscalar.lazy.codegen`'s code
    (CuPy's routines, FMA barriers), so ``opt.lr = base * gs.minimum(1, (opt.step_count + 1) /
    warmup)`` costs no launch of its own; on the host, `gpuscalar.lazy.expr` evaluates it."""

    __slots__ = ()
    tag = "pending"

    @property
    def key(self) -> Any:
        return self[1]

    def declaration(self, name: str, ctype: str = "T") -> ScalarCode:
        # the expression's own code (gpuscalar.lazy.codegen), then the cast to T
        code = codegen.plan_code(expr.plan_for_key(self.key), f"{name}_")
        return ScalarCode(
            tuple(codegen.raw_kernel_params(code)),
            (*code.statements, f"const {ctype} {name} = ({ctype})({code.value});"),
            (codegen.cupy_headers(), *code.preambles),
        )

    def host_value(self, backend: Backend, leaves: tuple[Any, ...]) -> Any:
        return expr.evaluate_plan(expr.plan_for_key(self.key), leaves, backend.host_data)


#: Every kind, by its tag (`ScalarKind.of`).
_KINDS: dict[str, type[ScalarKind]] = {
    kind.tag: kind for kind in (ValueScalar, PointerScalar, CounterScalar, PendingScalar)
}
#: The kind of a scalar passed by value.
VALUE = ValueScalar()
#: The pointer kind of a 0-d array, by its dtype (made once: `route` asks on every step).
POINTER_KINDS: dict[np.dtype, PointerScalar] = {
    np.dtype(name): PointerScalar(name) for name in POINTER_CTYPES
}
class BoundedTable(OrderedDict):
    """A table keyed by structure (a pending kind, a fusion answer, a launch plan): a plain dict
    read on a hit (``get``, one C call: the step's hot path); filled with ``setdefault``, so
    threads meeting a key first together keep one value, and past `expr.cache_size` entries
    the oldest is dropped (each is remade equal from its key), so the structure keys it holds
    can be dropped too (`gpuscalar.lazy.keytable`)."""

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = super().setdefault(key, default)
        while len(self) > expr.cache_size():
            try:
                self.popitem(last=False)
            except KeyError:  # emptied by another thread meanwhile
                break
        return value


#: The pending kinds, by structure key, each made once: `route` asks on every step of a pending
#: scalar (making a kind per step cost ~3,500 host instructions, the demo's step measured).
#: Bounded with gpuscalar.lazy's caches (`expr.cache_size` kinds, ~100 bytes each, oldest
#: dropped first); filled with ``setdefault``, so threads meeting a shape first together keep
#: one kind.
PENDING_KINDS: dict[Any, PendingScalar] = BoundedTable()
#: The step counter's kinds, by read (`CounterRead.kind`).
COUNTER_KINDS: dict[str, CounterScalar] = {read: CounterScalar(read) for read in COUNTER_READS}


class CounterRead:
    """A value the kernel derives from a live int64 counter buffer on the device."""

    __slots__ = ("array", "read", "kind")

    def __init__(self, array: Any, read: str) -> None:
        self.array, self.read, self.kind = array, read, COUNTER_KINDS[read]


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
    if skip is not None and bool(skip[0].host_value(backend, skip[1])):
        return
    if not tensors:
        return
    dtype = tensors[0][program.arrays[0]].dtype
    with np.errstate(all="ignore"):
        values = {name: np.asarray(kind.host_value(backend, leaves)).astype(dtype)
                  for name, (kind, leaves) in zip(program.scalars, scalars, strict=True)}
    apply_rules(program, values, tensors)
