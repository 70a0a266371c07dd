"""The host's ``"steps"`` executor: optimizer steps evaluated with NumPy, one op per kernel.

Why this module exists: it is the host half of `gpuscalar.optim.executors` (which holds the
executor protocol, `route` and `run_program`), and the one home of the step evaluator that
NumPy and the strict device share: each would-be kernel is one counted device op that runs the
step's `Program` with NumPy on the host data (`program.evaluate_host`). NumPy names
`numpy_steps` as its ``"steps"`` executor, the strict device `strict_steps`: the same evaluator,
the strict device keeping CuPy's layout requirement (C-contiguous arrays).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...backend import Backend
from ...optim.executors import Executor, Group, Optimizer, Routed, _read_only
from ...optim.program import Program, evaluate_host

__all__ = ["HostExecutor", "numpy_steps", "strict_steps"]


class HostExecutor(Executor):
    """NumPy evaluation of the Programs inside one counted op per would-be kernel."""

    recheck_grads = True
    read_only_possible = True

    def __init__(self, backend: Backend, *, plain_numpy: bool) -> None:
        super().__init__(backend)
        self.plain_numpy = plain_numpy
        self.contiguous = not plain_numpy  # the strict device keeps CuPy's requirement

    def fuses(self, key: int) -> bool:
        return True  # the host evaluator computes any expression

    def writeable(self, array: Any) -> bool:
        return bool(self.backend.host_data(array).flags.writeable)

    def shares_memory(self, a: Any, b: Any) -> bool:
        data = self.backend.host_data
        return bool(np.shares_memory(data(a), data(b)))

    def run(self, program: Program, routed: list[Routed], arrays: Sequence[Any],
            skip: Routed | None) -> None:
        backend = self.backend
        tensors = [dict(zip(program.arrays, map(backend.host_data, arrays), strict=True))]
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
    if skip is None or not bool(skip[0].host_value(backend, skip[1])):
        np.add(count, 1, out=count)


def numpy_steps(backend: Backend) -> HostExecutor:
    """NumPy's ``"steps"`` executor: plain NumPy arrays (any layout; a value can be printed in
    an error message without a device read)."""
    return HostExecutor(backend, plain_numpy=True)


def strict_steps(backend: Backend) -> HostExecutor:
    """The strict device's ``"steps"`` executor: the host evaluator under CuPy's rules."""
    return HostExecutor(backend, plain_numpy=False)
