"""The CuPy device's "collectives" executor: NCCL on the stream, and MPI over device memory.

Why this module exists: on GPUs the collective belongs on the stream, like a kernel. With the
user's NCCL communicator (`gpuscalar.distributed.nccl` recognises it and checks the values), the
collective is enqueued on CuPy's current stream, in place in the packed buffer, and returns at
once: the results are GPUScalars and arrays the next kernels read on the device, nothing waits
(a read of a result later is one ordinary counted sync), and a `gs.capture` step may record it.
CuPy's ``NcclCommunicator`` is called on device pointers (``allReduce(sendbuf, recvbuf, count,
datatype, op, stream)``), nccl4py's ``nccl.core.Communicator`` on buffers (the packed CuPy array
itself, complex as its real view). With an mpi4py communicator: `gpuscalar.devices.cupy.mpi`
(imported only then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...distributed import MpiOnFirstUse
from ...distributed.packing import pack, unpack

if TYPE_CHECKING:
    from ...distributed.nccl import NcclComm
    from .backend import CupyBackend

__all__ = ["CudaCollectives"]


class CudaCollectives(MpiOnFirstUse):
    """`gpuscalar.distributed.Collectives` on CuPy (see the module docstring)."""

    backend: CupyBackend
    mpi_module = "gpuscalar.devices.cupy.mpi"

    def nccl_all_reduce(self, comm: NcclComm, device: object, arrays: list[Any],
                        op: str) -> tuple[list[Any], list[Any]]:
        """The reduced ``arrays`` as new CuPy arrays, the collective enqueued on the current
        stream (no sync; their host values are not known: None each)."""
        groups, kinds, nccl_op = comm.plan(device, arrays, op)
        backend, user = self.backend, comm.comm
        with backend.device_context(device):
            buffers = backend.call(pack, backend.xp, arrays, groups)  # one device op
            stream = backend.seam.current_stream()
            for buffer, (nccl_type, per_element) in zip(buffers, kinds, strict=True):
                if comm.on_buffers:  # nccl4py: complex as pairs of reals, by a real view
                    reals = buffer if per_element == 1 else buffer.view(buffer.dtype.char.lower())
                    backend.call(user.allreduce, reals, reals, nccl_op, stream=stream.ptr)
                    continue
                address = backend.data_address(buffer)
                backend.call(user.allReduce, address, address, buffer.size * per_element,
                             nccl_type, nccl_op, stream.ptr)  # in place, on the stream
            results = backend.call(unpack, backend.xp, buffers, groups, arrays, op, comm.size)
        return results, [None] * len(arrays)
