"""The host devices' "collectives" executor (NumPy, the strict device): MPI on host data.

Why this module exists: `gs.distributed.all_reduce` asks the device of its values for the
collective (`gpuscalar.distributed.Collectives`); NumPy and the strict device share this one.
MPI runs on their host data (`gpuscalar.devices.host.mpi`, imported only with the user's mpi4py
communicator); a NCCL communicator is refused (NCCL reduces device memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...distributed import MpiOnFirstUse

if TYPE_CHECKING:
    from ...distributed.nccl import NcclComm

__all__ = ["HostCollectives"]


class HostCollectives(MpiOnFirstUse):
    """`gpuscalar.distributed.Collectives` on a host-evaluating backend."""

    mpi_module = "gpuscalar.devices.host.mpi"

    def nccl_all_reduce(self, comm: NcclComm, device: object, arrays: list[Any],
                        op: str) -> tuple[list[Any], list[Any]]:
        raise comm.refused(self.backend)
