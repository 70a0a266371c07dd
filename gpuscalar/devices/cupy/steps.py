"""The CuPy device's ``"steps"`` executor: optimizer steps as generated CUDA kernels.

Why this module exists: it is the CUDA half of `gpuscalar.optim.executors` (which holds the
executor protocol, `route` and `run_program`): each step is a kernel generated from its
`Program` (`gpuscalar.optim.kernels`, device-neutral text) and launched through
`Backend.launch_kernel`'s seam, the compiled kernels kept in ONE bounded cache
(`_STEP_KERNELS`). The launch emulator (tests/test_optim_launch.py) replaces CuPy's `CudaSeam`
(`CUPY.seam_replaced`), not this executor. `CupyBackend` names `CudaExecutor` as its
``"steps"`` executor.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from ...optim.program import Program
from .backend import CUPY

__all__ = ["CudaExecutor", "step_kernel_count", "STEP_BLOCK"]


class CudaExecutor(Executor):
    """Generated CUDA kernels launched through `Backend.launch_kernel` (the seam)."""

    backend: Any  # CuPy's (``launch_kernel``); tests replace its seam, never this backend

    def fuses(self, plan: expr.Plan) -> bool:
        return _cupy_fuses(plan)

    def run(self, program: Program, routed: list[Routed], arrays: Mapping[str, Any],
            skip: Routed | None) -> None:
        first = arrays[program.arrays[0]]
        key = (program, KERNEL_DTYPE_NAMES[first.dtype], tuple(kind for kind, _ in routed),
               None if skip is None else skip[0], False)
        kernel = _STEP_KERNELS.hit(key) or _STEP_KERNELS.get(key, _compile, self.backend, key)
        args: list[Any] = [np.int64(first.size)]
        args += [arrays[name_] for name_ in program.arrays]
        size, block = first.size, STEP_BLOCK
        grid = max(1, min((size + block - 1) // block, 65535))  # as `Backend.launch_kernel`
        self.backend.call(kernel, (grid,), (block,),
                          tuple(_scalar_arguments(args, routed, skip, first.dtype.type)))

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

    def launch(self, group: Group, program: Program, scalars: list[Routed],
               skip: Routed | None) -> None:
        key = (program, KERNEL_DTYPE_NAMES[group.dtype], tuple(kind for kind, _ in scalars),
               None if skip is None else skip[0], True)
        kernel = _STEP_KERNELS.hit(key) or _STEP_KERNELS.get(key, _compile, self.backend, key)
        args = _scalar_arguments(list(group.prefix), scalars, skip, group.dtype.type)
        self.backend.call(kernel, (group.n_blocks,), (MULTI_TENSOR_BLOCK,), tuple(args))

    def write_grads(self, opt: Optimizer, items: list[Any]) -> None:
        """One launch per `ADDRESS_CHUNK` entries of the gradient table, each carrying its
        addresses by value (never a host-to-device copy, so it works inside a captured step,
        and no host memory is read after the launch)."""
        backend, order = self.backend, opt._order
        addresses = np.zeros(len(opt._address_chunks) * ADDRESS_CHUNK, np.int64)
        addresses[: len(order)] = np.fromiter(
            backend.data_addresses(map(items.__getitem__, order)), np.int64, count=len(order))
        packed = addresses.view(ADDRESS_STRUCT)  # one struct per chunk
        source, name = address_table_source()
        for k, (lo, hi, table) in enumerate(opt._address_chunks):
            args = [table, np.int64(hi - lo), packed[k : k + 1]]  # the struct: by value
            backend.launch_kernel(source, name, hi - lo, args, grid=1, block=ADDRESS_BLOCK)

    def increment(self, count: Any, skip: Routed | None) -> None:
        key = ("count", None if skip is None else skip[0])
        kernel = _STEP_KERNELS.hit(key) or _STEP_KERNELS.get(key, _compile, self.backend, key)
        args = [count] + ([] if skip is None else list(skip[1]))
        self.backend.call(kernel, (1,), (1,), tuple(args))


def _scalar_arguments(args: list[Any], scalars: list[Routed], skip: Routed | None,
                      ctype: type) -> list[Any]:
    """``args`` followed by each scalar's kernel arguments (as its kind declares them) and the
    skip flag's."""
    for kind, leaves in scalars:
        args += kind.arguments(leaves, ctype)
    if skip is not None:
        args += skip[1]
    return args


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


#: plan key -> whether CuPy can compute that structure in a step's prelude (bounded alike).
_CUPY_FUSES: Any = expr.BoundedCache()


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
