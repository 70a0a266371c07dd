"""`all_reduce` over an mpi4py communicator: the front (the communicator, MPI's ops and types).

Why this module exists: MPI is the engine every cluster (and CI, through mpich's wheel) has. It
is imported only when the user hands gpuscalar an ``mpi4py`` communicator, so gpuscalar never
imports mpi4py (nor initializes MPI) itself.

Here: the user's communicator as gpuscalar uses it (`MpiComm`), the packing into one buffer per
dtype, and the checks made before anything is sent. The collective itself is the device's
("collectives" executor, `gpuscalar.distributed.Collectives`): on host data (NumPy, the strict
device: `gpuscalar.devices.host.mpi`), GPUScalars alone go by a non-blocking ``Iallreduce`` per
packed buffer, the results pending GPUScalars over the receive buffers (registered with
`gpuscalar.known.expect`): nothing waits until a result is used, and the first read waits
inside its counted sync (an array operation using one waits too). With arrays among the
values, or on CuPy memory (`gpuscalar.devices.cupy.mpi`), the collective is a blocking
``Allreduce`` run inside ONE counted sync (`gpuscalar.sync.to_host`, reason ``"all_reduce"``):
the guard is checked before anything is sent, and the read that ends the sync brings the
reduced values to the host, so the results are known. Over CuPy memory (CUDA-aware MPI, which
is not stream-aware) the sync first waits for the current stream, then MPI reads and writes
the device buffers, and the read copies them back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from ..backend import Backend
from .packing import buffer_dtype

if TYPE_CHECKING:
    from . import Collectives

__all__ = ["MpiComm", "MPI_OPS"]

#: gpuscalar's op names -> MPI's reduction (a mean is a sum, divided after)
MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}


class MpiComm:
    """The user's ``mpi4py`` intracommunicator, as `gpuscalar.distributed.all_reduce` uses it
    (gpuscalar never creates, duplicates or frees it)."""

    __slots__ = ("comm", "size")

    def __init__(self, comm: MPI.Intracomm) -> None:
        if comm == MPI.COMM_NULL:
            raise ValueError("gs.distributed.all_reduce: comm= is MPI.COMM_NULL")
        self.comm = comm
        self.size = comm.Get_size()

    def all_reduce(self, collectives: Collectives, device: object, arrays: list[Any],
                   op: str) -> tuple[list[Any], list[Any]]:
        """The reduced ``arrays`` by the device's ``collectives`` (new arrays of the device,
        each of its input's shape, in `result_dtype`) and their host values (Python numbers for
        0-d ones; None for a pending result)."""
        groups: dict[np.dtype, list[int]] = {}
        for index, array in enumerate(arrays):
            groups.setdefault(buffer_dtype(array.dtype, op), []).append(index)
        for dtype, indices in groups.items():
            _check_mpi_type(dtype, arrays[indices[0]].dtype)
        return collectives.mpi_all_reduce(self, device, arrays, groups, op)

    def refused(self, backend: Backend) -> TypeError:
        """The error for values of a device that has no collectives."""
        return TypeError(f"gs.distributed.all_reduce: MPI reduces host data and CuPy memory, "
                         f"not {backend.name} arrays")


def _check_mpi_type(dtype: np.dtype, given: np.dtype) -> None:
    """A TypeError, before anything is sent, for a dtype MPI has no predefined datatype for
    (float16, where MPI has none)."""
    if dtype.char not in MPI._typedict:
        raise TypeError(f"gs.distributed.all_reduce: MPI has no datatype for {given} "
                        f"values; convert them first (e.g. to float32)")
