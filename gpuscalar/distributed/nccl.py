"""`all_reduce` over a NCCL communicator: the front (recognising it, checking the values).

Why this module exists: on GPUs the collective belongs on the stream, like a kernel: NCCL
enqueues it on CuPy's current stream and returns at once, so the results are GPUScalars and
arrays the next kernels read on the device, and nothing waits (a read of a result later is one
ordinary counted sync). The communicator is the user's: CuPy's
``cupy.cuda.nccl.NcclCommunicator`` or the one a ``cupyx.distributed.NCCLBackend`` holds
(its ``_comm``), anything with NCCL's calls (``allReduce(sendbuf, recvbuf, count, datatype, op,
stream)`` on device pointers, ``size()``, ``device_id()``), or NVIDIA's nccl4py
``nccl.core.Communicator`` (``allreduce(sendbuf, recvbuf, op, stream=)`` on buffers: the packed
CuPy array itself); gpuscalar never creates one, and never imports ``cupy.cuda.nccl`` or
nccl4py (which load libnccl): NCCL's datatype and op numbers are its stable ``nccl.h`` enums,
below. The collective itself is the device's ("collectives" executor,
`gpuscalar.distributed.Collectives`: `gpuscalar.devices.cupy.collectives` on CuPy; the host
devices refuse it).

NCCL has no complex and no 16-bit integer datatypes: complex values are reduced as pairs of
reals (sum and mean; a complex product or ordering is refused), int16/uint16 are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..backend import Backend
from .packing import buffer_dtype

if TYPE_CHECKING:
    from . import Collectives

__all__ = ["NcclComm", "NCCL_TYPES", "NCCL_OPS", "is_nccl_communicator",
           "is_nccl4py_communicator"]

#: NumPy dtype -> NCCL's ``ncclDataType_t`` (nccl.h: ncclInt8 0, ncclUint8 1, ncclInt32 2,
#: ncclUint32 3, ncclInt64 4, ncclUint64 5, ncclFloat16 6, ncclFloat32 7, ncclFloat64 8)
NCCL_TYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
              np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
              np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8}
#: gpuscalar's op -> NCCL's ``ncclRedOp_t`` (ncclSum 0, ncclProd 1, ncclMax 2, ncclMin 3); a
#: mean is a sum divided after, as on MPI (NCCL's ncclAvg truncates integers)
NCCL_OPS = {"sum": 0, "mean": 0, "prod": 1, "max": 2, "min": 3}


def is_nccl_communicator(comm: Any) -> bool:
    """Whether ``comm`` has NCCL's communicator calls: CuPy's ``NcclCommunicator``
    (``allReduce`` on pointers, ``size()``, ``device_id()``) or nccl4py's
    ``nccl.core.Communicator`` (`is_nccl4py_communicator`)."""
    return all(callable(getattr(comm, name, None))
               for name in ("allReduce", "size", "device_id")) or is_nccl4py_communicator(comm)


def is_nccl4py_communicator(comm: Any) -> bool:
    """Whether ``comm`` is nccl4py's communicator: ``allreduce(sendbuf, recvbuf, op, *,
    stream)`` on buffers (a CuPy array), the ``nranks`` and ``device`` properties. (An mpi4py
    communicator also has an ``allreduce``, but neither property.)"""
    kind = type(comm)
    return callable(getattr(comm, "allreduce", None)) and all(
        isinstance(getattr(kind, name, None), property) for name in ("nranks", "device"))


class NcclComm:
    """The user's NCCL communicator, as `gpuscalar.distributed.all_reduce` uses it: CuPy's
    (a pointer call) or nccl4py's (a call on buffers, NCCL's datatype read from their dtype;
    its op numbers are nccl.h's, as here)."""

    __slots__ = ("comm", "size", "device_id", "on_buffers")

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.on_buffers = is_nccl4py_communicator(comm)
        if self.on_buffers:
            self.size = int(comm.nranks)
            self.device_id = int(comm.device.device_id)
        else:
            self.size = int(comm.size())
            self.device_id = int(comm.device_id())

    def all_reduce(self, collectives: Collectives, device: object, arrays: list[Any],
                   op: str) -> tuple[list[Any], list[Any]]:
        """The reduced ``arrays`` by the device's ``collectives``: new arrays of the device,
        the collective enqueued on the current stream (no sync; their host values are not
        known: None each)."""
        return collectives.nccl_all_reduce(self, device, arrays, op)

    def refused(self, backend: Backend) -> TypeError:
        """The error for values of a device that has no NCCL (no collectives, or collectives
        that refuse NCCL)."""
        return TypeError(f"gs.distributed.all_reduce: a NCCL communicator reduces CuPy "
                         f"arrays, not {backend.name} ones (use an mpi4py communicator)")

    def plan(self, device: object, arrays: list[Any], op: str
             ) -> tuple[dict[np.dtype, list[int]], list[tuple[int, int]], int]:
        """The checks made before anything is sent (the values on the communicator's device,
        dtypes NCCL has) and the packing: the buffers' dtype groups (value positions), each
        buffer's (NCCL datatype, NCCL elements per value), NCCL's op."""
        own = self.device_id
        if own != device:
            raise ValueError(f"gs.distributed.all_reduce: the values are on CUDA device "
                             f"{device!r}, the NCCL communicator on device {own}")
        groups: dict[np.dtype, list[int]] = {}
        for index, array in enumerate(arrays):
            groups.setdefault(buffer_dtype(array.dtype, op), []).append(index)
        return groups, [_nccl_kind(dtype, op) for dtype in groups], NCCL_OPS[op]


def _nccl_kind(dtype: np.dtype, op: str) -> tuple[int, int]:
    """(NCCL's datatype, NCCL elements per value) for a buffer of ``dtype``."""
    if dtype.kind == "c":
        if op not in ("sum", "mean"):
            raise TypeError(f"gs.distributed.all_reduce: op={op!r} of {dtype} values on NCCL "
                            "(no complex datatype: sum and mean only, as pairs of reals)")
        return NCCL_TYPES[np.dtype(dtype.char.lower())], 2
    found = NCCL_TYPES.get(dtype)
    if found is None:
        raise TypeError(f"gs.distributed.all_reduce: NCCL has no datatype for {dtype} values; "
                        "convert them first (e.g. to int32)")
    return found, 1
