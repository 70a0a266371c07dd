"""The host devices' "collectives" executor (NumPy, the strict device): MPI on host data.

Why this module exists: `gs.distributed.all_reduce` asks the device of its values for the
collective (`gpuscalar.distributed.Collectives`); NumPy and the strict device share this one.
MPI runs on their host data (`gpuscalar.devices.host.mpi`, imported only with the user's mpi4py
communicator); a NCCL communicator is refused (NCCL reduces device memory).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from ...backend import Backend

if TYPE_CHECKING:
    from ...distributed.mpi import MpiComm
    from ...distributed.nccl import NcclComm

__all__ = ["HostCollectives"]


class HostCollectives:
    """`gpuscalar.distributed.Collectives` on a host-evaluating backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def mpi_all_reduce(self, comm: MpiComm, device: object, arrays: list[Any],
                       groups: dict[np.dtype, list[int]], op: str
                       ) -> tuple[list[Any], list[Any]]:
        # mpi4py only with the user's MPI communicator: imported at the first call, which
        # puts the MPI path itself in this method's place (later calls go straight there)
        from . import mpi  # noqa: PLC0415

        self.mpi_all_reduce = functools.partial(  # type: ignore[method-assign]
            mpi.all_reduce, self.backend)
        return mpi.all_reduce(self.backend, comm, device, arrays, groups, op)

    def nccl_all_reduce(self, comm: NcclComm, device: object, arrays: list[Any],
                        op: str) -> tuple[list[Any], list[Any]]:
        raise comm.refused(self.backend)
