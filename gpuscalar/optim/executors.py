"""How an optimizer step reaches the device: one executor per backend kind, chosen once.

Why this module exists: a step's work is either evaluated with NumPy on the host (NumPy, and the
strict device standing in for CuPy: one counted op per would-be kernel) or launched as a CUDA
kernel through `Backend.launch_kernel`, the one seam where CuPy code reaches CUDA. The choice is
made here, once per backend (`executor_for`), so the algorithm files (`adam.py`, `sgd.py`, ...),
`base.py` and `clip.py` are written once and never ask which backend they run on. Both
executors expose the same operations: run a Program on one tensor, set up and launch a
multi-tensor group, point the kernels at new gradient arrays, increment the step counter, and
answer the few questions validation needs (layouts, writeability, overlaps). The launch
emulator (tests/test_optim_launch.py) replaces CuPy's `CudaSeam` (`CUPY.seam_replaced`), not the
backend: CuPy gets this CUDA executor there too, so the emulator stands in for one seam, not for
the library's logic.

How a kernel receives each scalar (the learning rate, betas, the step, ``skip_if`` ...) is
decided in one place, `route`: a Python number by value, a GPUScalar through a pointer to its
0-d array, a pending GPUScalar expression computed in the kernel's prelude (one code generator,
`gpuscalar.lazy.codegen`, serves these preludes and the fused scalar kernels), the optimizer's
live step counter through a pointer with the arithmetic inlined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..backend import Backend
from ..devices import CUPY
from ..lazy import codegen, expr
from ..scalar import GPUScalar, _array_of, _node_of
from .kernels import (
    ADDRESS_BLOCK,
    ADDRESS_CHUNK,
    ADDRESS_STRUCT,
    KERNEL_DTYPE_NAMES,
    MULTI_TENSOR_BLOCK,
    POINTER_DTYPE_NAMES,
    _counter_source,
    _kernel_source,
    address_table_source,
    kernel_arguments,
)
from .program import VALUE, CounterRead, Program, ScalarKind, evaluate_host, host_scalar


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
    _tables: Any
    _blocks: Any


class Optimizer(Protocol):
    """What `Executor.write_grads` reads of an optimizer (`base.Optimizer`): its gradient
    tables' layout."""

    @property
    def _order(self) -> Sequence[int]: ...
    @property
    def _address_chunks(self) -> Sequence[tuple[int, int, Any]]: ...
    @property
    def _where(self) -> Mapping[int, tuple[Group, int]]: ...

__all__ = ["Executor", "HostExecutor", "CudaExecutor", "executor_for", "route", "run_program"]

Routed = tuple[ScalarKind, tuple[Any, ...]]


class Executor:
    """What an optimizer step needs from a backend, evaluated one way (see the module doc)."""

    #: whether arrays must be C-contiguous (a kernel indexes flat memory)
    contiguous: bool = True
    #: whether arrays are plain NumPy arrays (any layout works; a value can be printed in an
    #: error message without a device read)
    plain_numpy: bool = False
    #: whether gradients the optimizer saw last step must be validated again (NumPy lets an
    #: array's shape change in place; device arrays cannot)
    recheck_grads: bool = False

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def fuses(self, plan: expr.Plan) -> bool:
        """Whether a pending scalar of ``plan``'s structure can be computed inside the step."""
        raise NotImplementedError

    def writeable(self, array: Any) -> bool:
        """Whether the step may write ``array``."""
        return True

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether two arrays whose byte spans overlap really share an element."""
        return True

    def run(self, program: Program, routed: list[Routed], arrays: Mapping[str, Any],
            skip: Routed | None) -> None:
        """``program`` on one tensor (``arrays`` by the program's array names): one op."""
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


class HostExecutor(Executor):
    """NumPy evaluation of the Programs inside one counted op per would-be kernel."""

    recheck_grads = True

    def __init__(self, backend: Backend, *, plain_numpy: bool) -> None:
        super().__init__(backend)
        self.plain_numpy = plain_numpy
        self.contiguous = not plain_numpy  # the strict device keeps CuPy's requirement

    def fuses(self, plan: expr.Plan) -> bool:
        return True  # the host evaluator computes any expression

    def writeable(self, array: Any) -> bool:
        return bool(self.backend.host_data(array).flags.writeable)

    def shares_memory(self, a: Any, b: Any) -> bool:
        data = self.backend.host_data
        return bool(np.shares_memory(data(a), data(b)))

    def run(self, program: Program, routed: list[Routed], arrays: Mapping[str, Any],
            skip: Routed | None) -> None:
        backend = self.backend
        tensors = [{name: backend.host_data(array) for name, array in arrays.items()}]
        backend.call(evaluate_host, backend, program, routed, tensors, skip)

    def attach(self, group: Group, params: list[Any], sizes: list[int], chunks: list[int],
               chunk: int, grad_table: Any) -> None:
        data = self.backend.host_data
        group.tensors = [
            {"param": data(p), **{name: data(views[t])
                                  for name, views in group.state_views.items()}}
            for t, p in enumerate(params)
        ]

    def launch(self, group: Group, program: Program, scalars: list[Routed],
               skip: Routed | None) -> None:
        backend = self.backend
        backend.call(evaluate_host, backend, program, scalars, group.tensors, skip)

    def check_before_step(self, groups: Sequence[Group]) -> None:
        """Every array the step writes must still be writeable and have its shape and dtype
        (NumPy lets either change in place after the optimizer was made)."""
        for group in groups:
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

    def write_grads(self, opt: Optimizer, items: list[Any]) -> None:
        # the "table" is each tensor's "grad" entry
        backend, order, data = self.backend, opt._order, self.backend.host_data
        for lo, hi, _ in opt._address_chunks:
            indices = order[lo:hi]
            backend.call(_set_host_grads, opt._where, indices, [data(items[i]) for i in indices])

    def increment(self, count: Any, skip: Routed | None) -> None:
        backend = self.backend
        backend.call(_increment_on_host, backend, backend.host_data(count), skip)


def _set_host_grads(where: Mapping[int, tuple[Group, int]], indices: list[int],
                    data: list[Any]) -> None:
    for i, array in zip(indices, data, strict=True):
        group, k = where[i]
        group.tensors[k]["grad"] = array


def _increment_on_host(backend: Backend, count: Any, skip: Routed | None) -> None:
    if skip is None or not bool(host_scalar(backend, *skip)):
        np.add(count, 1, out=count)


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
    """``args`` followed by each scalar's kernel arguments and the skip flag's."""
    for kind, leaves in scalars:
        args += kernel_arguments(kind, leaves, ctype)
    if skip is not None:
        args += skip[1]
    return args


def executor_for(backend: Backend) -> Executor:
    """THE choice of executor for ``backend``, made once per backend object and kept on it."""
    found = backend.__dict__.get("_optim_executor")
    if found is None:
        if backend.evaluates_on_host:
            found = HostExecutor(backend, plain_numpy=backend.host_memory)
        else:
            found = CudaExecutor(backend)
        backend.__dict__["_optim_executor"] = found
    return found


#: THE cache of compiled optimizer kernels, one `expr.BoundedCache` (bounded with fusion's caches
#: by ``gpuscalar.lazy.set_cache_size``): (program, dtype name, scalar kinds, skip kind,
#: multi-tensor layout) -> the update kernel, ("count", skip kind) -> the step-counter kernel.
#: A step looks its kernel up once (`BoundedCache.hit`); a miss generates the source
#: (`kernels._kernel_source`, not cached itself) and compiles it through the seam. An evicted
#: kernel is compiled again from the same text (CuPy's on-disk cache answers). Registered with
#: the backend's seam caches: a kernel compiled through one seam is never launched through
#: another (`CupyBackend.seam_replaced` empties it under a test seam and restores it after).
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


def route(value: Any) -> Routed:
    """THE one place that decides how a fused kernel receives a scalar: ``(kind, leaves)``.

    ``value`` is a Python number, a GPUScalar, or a `CounterRead`; it is already validated.
    A pending GPUScalar is computed by the kernel itself, in its prelude: no launch of its own
    (unless its executor cannot compute it there: then it is materialized first, one launch).
    """
    if isinstance(value, GPUScalar):
        node = _node_of(value)
        if node is not None:
            plan = expr.plan_of(node)
            if executor_for(value.backend).fuses(plan):
                return ("pending", plan.key), tuple(expr.leaves_of(node))
        array = _array_of(value)  # CuPy cannot compute it in the kernel: one launch first
        return ("pointer", POINTER_DTYPE_NAMES[array.dtype]), (array,)
    if type(value) is CounterRead:
        return ("counter", value.read), (value.array,)
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
    executor_for(backend).run(program, routed, arrays, skip_routed)
