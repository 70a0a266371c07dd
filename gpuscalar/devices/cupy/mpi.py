"""`gs.distributed.all_reduce` over MPI on CuPy memory (CUDA-aware MPI).

Why this module exists: it is the MPI half of the CuPy device's "collectives" executor
(`gpuscalar.devices.cupy.collectives`), imported only with the user's mpi4py communicator
(`gpuscalar.distributed.mpi` is the front). MPI is not stream-aware: inside ONE counted sync
(`gpuscalar.sync.to_host`, reason ``"all_reduce"``) the current stream is waited for, then a
blocking ``Allreduce`` per packed buffer runs on the device buffers (handed to MPI as pointers),
and the read that ends the sync brings the reduced values home, so the results are known.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ... import sync
from ...distributed.mpi import MPI_OPS, MpiComm
from ...distributed.packing import join, pack, results_on_host, unpack
from .backend import CupyBackend

__all__ = ["all_reduce"]


def all_reduce(backend: CupyBackend, comm: MpiComm, device: object, arrays: list[Any],
               groups: dict[np.dtype, list[int]], op: str) -> tuple[list[Any], list[Any]]:
    """`gpuscalar.distributed.Collectives.mpi_all_reduce` on CuPy memory."""
    mpi_op = MPI_OPS[op]
    with backend.device_context(device):
        buffers = backend.call(pack, backend.xp, arrays, groups)  # one device op

        def collective() -> Any:
            backend.seam.current_stream().synchronize()  # MPI is not stream-aware: wait first
            for buffer in buffers:
                comm.comm.Allreduce(MPI.IN_PLACE, _message(backend, buffer), op=mpi_op)
            return backend.call(join, backend.xp, buffers)

        sync.admit("all_reduce")  # the guard first: a refused read sends nothing
        host = np.asarray(sync.to_host(backend, collective(), None))
        _, host_values = results_on_host(host, groups, arrays, op, comm.size)
        results = backend.call(unpack, backend.xp, buffers, groups, arrays, op, comm.size)
    return results, host_values


def _message(backend: CupyBackend, buffer: Any) -> Any:
    """What MPI is handed: device memory as its address, size and MPI datatype, the way a
    CUDA-aware MPI takes a device pointer (MPI finds the memory's kind itself; mpi4py is never
    asked to import the array through DLPack, which would query the device)."""
    address = backend.data_address(buffer)
    return [MPI.buffer.fromaddress(address, buffer.nbytes), MPI._typedict[buffer.dtype.char]]
