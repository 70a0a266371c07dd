"""Multi-tensor groups: one launch per dtype per step, however many tensors.

Why this module exists: an optimizer over hundreds of parameter arrays must not launch hundreds
of kernels per step. The optimizer classes group their parameters by dtype; per group the state
lives in one flat buffer per state name (a view per tensor), and one multi-tensor kernel updates
every tensor, each block reading its tensor's addresses from a device-side table (one address
table per array role, and a block table of (tensor, start, end) chunks), as PyTorch's
``multi_tensor_apply`` does. The parameter and state tables are built once. The gradient table
is rewritten when the gradient arrays differ from the previous step's, by a small kernel that
carries the addresses in its own arguments (one launch per `ADDRESS_CHUNK` tensors), never by a
host-to-device copy: inside a captured step (`gs.capture`) CuPy refuses such a copy, while kernel
arguments are copied into the CUDA graph when it is recorded, so every replay rewrites the table
with the addresses it was recorded with. What the kernel reads (device tables, or NumPy data per
tensor on a host-evaluating backend) is set up by the group's executor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .executors import Executor, Routed
from .program import Program

__all__ = ["Group"]


class Group:
    """One dtype's tensors: the user's parameters, the optimizer's state (one flat buffer per
    state, with a view per tensor), and what the kernel reads them through (`Executor.attach`:
    NumPy data per tensor on a host-evaluating backend, device address tables and a block table
    on CuPy)."""

    tensors: list[dict[str, Any]]  # host executor: NumPy data per tensor, by array name
    prefix: tuple[Any, ...]  # CUDA executor: the kernel's table arguments
    grid: tuple[int]  # CUDA executor: the kernel's grid (one block per chunk)
    _tables: Any  # CUDA executor: the address tables and block table, kept alive
    _blocks: Any

    def __init__(
        self,
        executor: Executor,
        program: Program,
        indices: list[int],
        params: list[Any],
        grad_table: Any,
        chunk: int,
    ) -> None:
        backend = executor.backend
        xp = backend.xp
        self.executor = executor
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
        executor.attach(self, params, sizes, chunks, chunk, grad_table)

    def launch(self, program: Program, scalars: list[Routed], skip: Routed | None) -> None:
        """The group's update: one counted device op (none when every tensor is empty)."""
        if self.n_blocks:
            self.executor.launch(self, program, scalars, skip)
