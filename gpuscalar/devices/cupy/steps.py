"""The CuPy device's ``"steps"`` executor: optimizer steps as generated CUDA kernels.

Why this module exists: it is the CUDA half of `gpuscalar.optim.executors` (which holds the
executor protocol, `route` and `run_program`): each step is a kernel generated from its
`Program` (`gpuscalar.optim.kernels`, device-neutral text) and launched through
`Backend.launch_kernel`'s seam, the compiled kernels kept in ONE bounded cache
(`_STEP_KERNELS`). What a launch needs beyond its arguments (the kernel, a single-tensor
launch's grid and count) is decided once per variant and found again with one dict read
(`_LAUNCH_PLANS`): a repeated step costs little more than CuPy's launch. The launch emulator
(tests/test_optim_launch.py) replaces CuPy's `CudaSeam` (`CUPY.seam_replaced`), not this
executor. `CupyBackend` names `CudaExecutor` as its ``"steps"`` executor.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...lazy import codegen, expr
from ...optim.executors import Executor, Group, Optimizer, Routed
from ...optim.kernels import (
    ADDRESS_BLOCK,
    ADDRESS_CHUNK,
    ADDRESS_STRUCT,
    KERNEL_DTYPE_NAMES,
    MULTI_TENSOR_BLOCK,
    _counter_source,
    _kernel_source,
    address_table_source,
)
from ...optim.program import BoundedTable, Program
from .backend import CUPY

__all__ = ["CudaExecutor", "step_kernel_count", "STEP_BLOCK"]


class CudaExecutor(Executor):
    """Generated CUDA kernels launched through `Backend.launch_kernel` (the seam)."""

    backend: Any  # CuPy's (``launch_kernel``); tests replace its seam, never this backend

    def fuses(self, key: int) -> bool:
        found = _CUPY_FUSES.get(key)
        return _cupy_fuses(key) if found is None else found

    def run(self, program: Program, routed: list[Routed], arrays: Sequence[Any],
            skip: Routed | None) -> None:
        first = arrays[0]
        dtype = first.dtype
        key = (program, dtype, tuple(map(_KIND, routed)), None if skip is None else skip[0],
               first.size)
        plan = _LAUNCH_PLANS.get(key) or self._plan(key)
        args = [plan.n, *arrays]
        self.backend.call(plan.kernel, plan.grid, (STEP_BLOCK,),
                          _arguments(args, routed, skip, dtype.type))

    def _plan(self, key: tuple) -> LaunchPlan:
        """The launch plan of a `_LAUNCH_PLANS` key (its kernel compiled on first use)."""
        program, dtype, kinds, skip, size = key
        kernel_key = (program, KERNEL_DTYPE_NAMES[dtype], kinds, skip, size is None)
        kernel = _STEP_KERNELS.hit(kernel_key) or _STEP_KERNELS.get(kernel_key, _compile,
                                                                    self.backend, kernel_key)
        if size is None:  # the multi-tensor layout: its group gives the grid
            plan = LaunchPlan(kernel, None, None)
        else:  # grid-stride over the tensor, the grid as `Backend.launch_kernel` makes it
            grid = max(1, min((size + STEP_BLOCK - 1) // STEP_BLOCK, 65535))
            plan = LaunchPlan(kernel, (grid,), np.int64(size))
        return _LAUNCH_PLANS.setdefault(key, plan)

    def new_grad_table(self, n: int) -> Any:
        backend = self.backend
        return backend.call(backend.xp.zeros, n, dtype=np.int64)

    def attach(self, group: Group, params: list[Any], sizes: list[int], chunks: list[int],
               chunk: int, grad_table: Any) -> None:
        backend, xp, address = self.backend, self.backend.xp, self.backend.data_address
        table = np.array(
            [[address(p) for p in params],
             *[[address(v) for v in views] for views in group.state_views.values()]],
            dtype=np.int64,
        )
        tensor = np.repeat(np.arange(len(params), dtype=np.int64), chunks)
        first_block = np.repeat(np.cumsum([0, *chunks[:-1]]), chunks)
        start = (np.arange(group.n_blocks, dtype=np.int64) - first_block) * chunk
        end = np.minimum(start + chunk, np.asarray(sizes, np.int64)[tensor])
        group._tables = backend.call(xp.asarray, table)  # kept alive: the kernel reads its rows
        group._blocks = backend.call(xp.asarray,
                                     np.stack([tensor, start, end]).astype(np.int64))
        # one address table per array of the program: param, grad (the optimizer's, rewritten
        # when the gradient arrays change), then the state buffers
        group.prefix = (group._tables[0], grad_table, *group._tables[1:], group._blocks,
                        np.int64(group.n_blocks))
        group.grid = (group.n_blocks,)

    def launch(self, group: Group, program: Program, scalars: list[Routed],
               skip: Routed | None) -> None:
        key = (program, group.dtype, tuple(map(_KIND, scalars)),
               None if skip is None else skip[0], None)
        plan = _LAUNCH_PLANS.get(key) or self._plan(key)
        self.backend.call(plan.kernel, group.grid, (MULTI_TENSOR_BLOCK,),
                          _arguments(list(group.prefix), scalars, skip, group.dtype.type))

    def write_grads(self, opt: Optimizer, items: list[Any]) -> None:
        """One launch per `ADDRESS_CHUNK` entries of the gradient table, each carrying its
        addresses by value (never a host-to-device copy, so it works inside a captured step,
        and no host memory is read after the launch)."""
        backend, order = self.backend, opt._order
        addresses = np.zeros(len(opt._address_chunks) * ADDRESS_CHUNK, np.int64)
        ordered = items if opt._in_order else map(items.__getitem__, order)
        addresses[: len(order)] = np.fromiter(backend.data_addresses(ordered), np.int64,
                                              count=len(order))
        packed = addresses.view(ADDRESS_STRUCT)  # one struct per chunk
        source, name = address_table_source()
        for k, (lo, hi, table) in enumerate(opt._address_chunks):
            args = [table, np.int64(hi - lo), packed[k : k + 1]]  # the struct: by value
            backend.launch_kernel(source, name, hi - lo, args, grid=1, block=ADDRESS_BLOCK)

    def increment(self, count: Any, skip: Routed | None) -> None:
        key = ("count", None if skip is None else skip[0])
        kernel = _LAUNCH_PLANS.get(key)
        if kernel is None:
            kernel = _STEP_KERNELS.hit(key) or _STEP_KERNELS.get(key, _compile, self.backend, key)
            kernel = _LAUNCH_PLANS.setdefault(key, kernel)
        self.backend.call(kernel, (1,), (1,), (count,) if skip is None else (count, *skip[1]))


class LaunchPlan:
    """What a step's launch needs beyond its arrays and scalars, decided once per (program,
    dtype, scalar kinds, skip kind, layout and size): the compiled kernel, and the grid and
    element count of a single-tensor launch."""

    __slots__ = ("kernel", "grid", "n")

    def __init__(self, kernel: Any, grid: tuple[int] | None, n: np.int64 | None) -> None:
        self.kernel, self.grid, self.n = kernel, grid, n


def _arguments(args: list[Any], scalars: list[Routed], skip: Routed | None,
               ctype: type) -> tuple[Any, ...]:
    """``args`` followed by each scalar's kernel arguments (as its kind declares them) and the
    skip flag's."""
    for kind, leaves in scalars:
        args += leaves if kind.passes_leaves else kind.arguments(leaves, ctype)
    if skip is not None:
        args += skip[1]
    return tuple(args)


#: a routed scalar's kind
_KIND = operator.itemgetter(0)


#: THE cache of compiled optimizer kernels, one `expr.BoundedCache` (bounded with fusion's caches
#: by ``gpuscalar.lazy.set_cache_size``): (program, dtype name, scalar kinds, skip kind,
#: multi-tensor layout) -> the update kernel, ("count", skip kind) -> the step-counter kernel.
#: A step looks its kernel up once (`BoundedCache.hit`); a miss generates the source
#: (`kernels._kernel_source`, not cached itself) and compiles it through the seam. An evicted
#: kernel is compiled again from the same text (CuPy's on-disk cache answers). Registered with
#: the backend's seam caches when this module is first imported (the first step on CuPy): a
#: kernel compiled through one seam is never launched through another (`CupyBackend.seam_replaced`
#: empties it under a test seam and restores it after, or empties it when it was registered
#: under that seam).
_STEP_KERNELS = expr.BoundedCache()
CUPY.seam_cache(_STEP_KERNELS)  # type: ignore[arg-type]  # (dict-like: keys, [], update, clear)
#: What a step looks up on every launch, one C-level dict read on a hit: (program, dtype,
#: scalar kinds, skip kind, tensor size or None for the multi-tensor layout) -> `LaunchPlan`,
#: and the step counter's kernel by its `_STEP_KERNELS` key. Bounded alike (oldest dropped
#: first); each entry holds its kernel, so at most twice the bound of kernels stay alive (as
#: fusion's dispatch plans). Emptied under a test seam like `_STEP_KERNELS`.
_LAUNCH_PLANS: dict[Any, Any] = CUPY.seam_cache(BoundedTable())
#: Block size of the single-tensor (grid-stride) step kernels, `Backend.launch_kernel`'s.
STEP_BLOCK = 256


def _compile(backend: Any, key: tuple) -> Any:
    """The compiled kernel for a `_STEP_KERNELS` key (through the backend's current seam)."""
    if key[0] == "count":
        source, name = _counter_source(key[1])
    else:
        source, name = _kernel_source(*key)
    return backend.seam.compile_kernel(source, name, backend.kernel_options)


def step_kernel_count() -> int:
    """How many optimizer kernels are cached now (at most ``gpuscalar.lazy.cache_size()``)."""
    return len(_STEP_KERNELS)


#: structure key -> whether CuPy can compute that structure in a step's prelude (bounded alike).
_CUPY_FUSES: dict[int, bool] = BoundedTable()


def _cupy_fuses(key: int) -> bool:
    """Whether CuPy kernel code can be generated for the expressions of structure ``key`` (not,
    e.g., an operation CuPy has no fusable routine for): decided once per structure."""
    try:
        codegen.plan_code(expr.plan_for_key(key), "probe_")
    except codegen.FusionUnsupported:
        fuses = False
    else:
        fuses = True
    return _CUPY_FUSES.setdefault(key, fuses)
