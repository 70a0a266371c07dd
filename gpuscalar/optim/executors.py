"""How an optimizer step reaches the device: the protocol of a device's ``"steps"`` executor.

Why this module exists: a step's work is either evaluated with NumPy on the host (NumPy, and the
strict device standing in for CuPy: one counted op per would-be kernel;
``gpuscalar.devices.host.steps``) or launched as a CUDA kernel through
`Backend.launch_kernel`, the one seam where CuPy code reaches CUDA
(``gpuscalar.devices.cupy.steps``). Each device names its executor in its wing
(`Backend.executor`, slot ``"steps"``), asked once per backend here (`executor_for`), so the
algorithm files (`adam.py`, `sgd.py`, ...), `base.py` and `clip.py` are written once and never
ask which backend they run on. Every executor exposes the operations of `Executor`: run a
Program on one tensor, set up and launch a multi-tensor group, point the kernels at new
gradient arrays, increment the step counter, and answer the few questions validation needs
(layouts, writeability, overlaps). The launch emulator (tests/test_optim_launch.py) replaces
CuPy's `CudaSeam` (`CUPY.seam_replaced`), not the backend: CuPy gets its CUDA executor there
too, so the emulator stands in for one seam, not for the library's logic.

How a kernel receives each scalar (the learning rate, betas, the step, ``skip_if`` ...) is
decided in one place, `route`: a Python number by value, a GPUScalar through a pointer to its
0-d array, a pending GPUScalar expression computed in the kernel's prelude (one code generator,
`gpuscalar.lazy.codegen`, serves these preludes and the fused scalar kernels), the optimizer's
live step counter through a pointer with the arithmetic inlined. Each way is a small class,
a `gpuscalar.optim.program.ScalarKind`, that the consumers ask (its kernel code, its launch
arguments, its host value) instead of switching on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..backend import Backend
from ..lazy import expr
from ..lazy.expr import KEY
from ..scalar import GPUScalar, _array_of, _node_of
from .program import (
    PENDING_KINDS,
    POINTER_KINDS,
    VALUE,
    CounterRead,
    PendingScalar,
    Program,
    ScalarKind,
)


class Group(Protocol):
    """What an executor reads and sets on a dtype group (`multi_tensor.Group`, which holds its
    executor: a protocol here, so this module imports neither it nor the optimizer base)."""

    dtype: np.dtype
    indices: list[int]
    shapes: list[tuple[int, ...]]
    written: tuple[str, ...]
    state_views: dict[str, list[Any]]
    n_blocks: int
    tensors: list[dict[str, Any]]  # set by the host executor
    prefix: tuple[Any, ...]  # set by the CUDA executor: the kernel's leading arguments
    grid: tuple[int]  # set by the CUDA executor: the multi-tensor kernel's grid
    _tables: Any
    _blocks: Any


class Optimizer(Protocol):
    """What `Executor.write_grads` reads of an optimizer (`base.Optimizer`): its gradient
    tables' layout."""

    @property
    def _order(self) -> Sequence[int]: ...
    @property
    def _in_order(self) -> bool: ...
    @property
    def _address_chunks(self) -> Sequence[tuple[int, int, Any]]: ...
    @property
    def _where(self) -> Mapping[int, tuple[Group, int]]: ...

__all__ = ["Executor", "executor_for", "route", "run_program"]

Routed = tuple[ScalarKind, tuple[Any, ...]]


class Executor:
    """What an optimizer step needs from a backend, evaluated one way (see the module doc): the
    protocol of a device's ``"steps"`` executor, which subclasses it in the device's wing."""

    #: whether arrays must be C-contiguous (a kernel indexes flat memory)
    contiguous: bool = True
    #: whether arrays are plain NumPy arrays (any layout works; a value can be printed in an
    #: error message without a device read)
    plain_numpy: bool = False
    #: whether an array may be read-only (then `writeable` is asked before a step writes it)
    read_only_possible: bool = False
    #: whether gradients the optimizer saw last step must be validated again (NumPy lets an
    #: array's shape change in place; device arrays cannot)
    recheck_grads: bool = False

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def fuses(self, key: int) -> bool:
        """Whether a pending scalar of the structure ``key`` can be computed inside the step
        (asked on every step of a pending scalar: an executor answers from a table by key)."""
        raise NotImplementedError

    def writeable(self, array: Any) -> bool:
        """Whether the step may write ``array``."""
        return True

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether two arrays whose byte spans overlap really share an element."""
        return True

    def run(self, program: Program, routed: list[Routed], arrays: Sequence[Any],
            skip: Routed | None) -> None:
        """``program`` on one tensor (``arrays`` in the order of ``program.arrays``, validated;
        ``routed``: its scalars, `route`d in the order of ``program.scalars``): one op."""
        raise NotImplementedError

    def new_grad_table(self, n: int) -> Any:
        """The device table of ``n`` gradient addresses an optimizer keeps (None: none)."""
        return None

    def attach(self, group: Group, params: list[Any], sizes: list[int], chunks: list[int],
               chunk: int, grad_table: Any) -> None:
        """Give ``group`` what its launches read (data per tensor, or device tables)."""
        raise NotImplementedError

    def launch(self, group: Group, program: Program, scalars: list[Routed],
               skip: Routed | None) -> None:
        """One multi-tensor step over ``group`` (which has at least one block): one op."""
        raise NotImplementedError

    def check_before_step(self, groups: Sequence[Group]) -> None:
        """Raise if a step would fail half-way (some tensors updated)."""

    def write_grads(self, opt: Optimizer, items: list[Any]) -> None:
        """Point ``opt``'s kernels at the gradient arrays ``items``: one op per
        `ADDRESS_CHUNK` parameters."""
        raise NotImplementedError

    def increment(self, count: Any, skip: Routed | None) -> None:
        """``count += 1`` (or ``+= !skip``) in place, after the kernels read it: one op."""
        raise NotImplementedError


def _read_only(what: str) -> ValueError:
    return ValueError(f"{what} is read-only (flags.writeable is False), but it is updated in "
                      "place")


def executor_for(backend: Backend) -> Executor:
    """``backend``'s ``"steps"`` executor (`Backend.executor`), asked once per backend object
    and kept on it (a step asks per call)."""
    found = backend.__dict__.get("_optim_executor")
    if found is None:
        found = backend.__dict__["_optim_executor"] = backend.executor("steps")
    return found


def route(value: Any) -> Routed:
    """THE one place that decides how a fused kernel receives a scalar: ``(kind, leaves)``, the
    kind a `gpuscalar.optim.program.ScalarKind` (`ValueScalar`, `PointerScalar`, `CounterScalar`
    or `PendingScalar`), the leaves its runtime arguments.

    ``value`` is a Python number, a GPUScalar, or a `CounterRead`; it is already validated.
    A pending GPUScalar is computed by the kernel itself, in its prelude: no launch of its own
    (unless its executor cannot compute it there: then it is materialized first, one launch).
    """
    cls = type(value)
    if cls is float or cls is int:  # (the common case first: hyperparameters are numbers)
        return VALUE, (value,)
    if isinstance(value, GPUScalar):
        node = _node_of(value)
        if node is not None:
            key = node[KEY]
            if executor_for(value.backend).fuses(key):  # each shape's kind made once
                kind = PENDING_KINDS.get(key) or PENDING_KINDS.setdefault(key, PendingScalar(key))
                return kind, tuple(expr.leaves_of(node))
        array = _array_of(value)  # CuPy cannot compute it in the kernel: one launch first
        return POINTER_KINDS[array.dtype], (array,)
    if cls is CounterRead:
        return value.kind, (value.array,)
    return VALUE, (value,)


def run_program(
    backend: Backend,
    program: Program,
    scalars: Mapping[str, Any],
    arrays: Mapping[str, Any],
    skip: GPUScalar | None,
) -> None:
    """Run ``program`` once on one tensor (one counted device op). Scalars are Python numbers
    or GPUScalars; arrays are same-shape, same-dtype arrays of ``backend``."""
    routed = [route(scalars[name]) for name in program.scalars]
    skip_routed = None if skip is None else route(skip)
    executor_for(backend).run(program, routed, [arrays[name] for name in program.arrays],
                              skip_routed)
