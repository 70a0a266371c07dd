"""`all_reduce` over an mpi4py communicator: on host data, and over CuPy memory.

Why this module exists: MPI is the engine every cluster (and CI, through mpich's wheel) has. It
is imported only when the user hands gpuscalar an ``mpi4py`` communicator, so gpuscalar never
imports mpi4py (nor initializes MPI) itself.

The collective is a blocking ``Allreduce`` run inside ONE counted sync (`gpuscalar.sync.to_host`,
reason ``"all_reduce"``): the guard is checked before anything is sent, and the read that ends
the sync brings the reduced values to the host, so the results are known. On the host the
collective reads and writes one NumPy buffer per dtype; over CuPy memory (CUDA-aware MPI, which
is not stream-aware) the sync first waits for the current stream, then MPI reads and writes the
device buffers, and the read copies them back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .. import sync
from ..backend import CUPY, Backend
from ..known import python_value
from .packing import buffer_dtype, finish, join, own, pack, split, unpack

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

    def all_reduce(self, backend: Backend, device: object, arrays: list[Any],
                   op: str) -> tuple[list[Any], list[Any]]:
        """The reduced ``arrays`` (new arrays of ``backend``, each of its input's shape, in
        `result_dtype`) and their host values (Python numbers for 0-d ones)."""
        if not backend.evaluates_on_host and backend is not CUPY:
            raise TypeError(f"gs.distributed.all_reduce: MPI reduces host data and CuPy "
                            f"memory, not {backend.name} arrays")
        groups: dict[np.dtype, list[int]] = {}
        for index, array in enumerate(arrays):
            groups.setdefault(buffer_dtype(array.dtype, op), []).append(index)
        for dtype, indices in groups.items():
            _check_mpi_type(dtype, arrays[indices[0]].dtype)
        mpi_op = MPI_OPS[op]
        comm = self.comm
        with backend.device_context(device):
            if backend.evaluates_on_host:
                data = [backend.host_data(a) for a in arrays]
                buffers = backend.call(pack, np, data, groups)  # one device op
            else:
                buffers = backend.call(pack, backend.xp, arrays, groups)

            def collective() -> Any:
                if not backend.evaluates_on_host:  # MPI is not stream-aware: wait first
                    CUPY.seam.current_stream().synchronize()
                for buffer in buffers:
                    comm.Allreduce(MPI.IN_PLACE, _message(backend, buffer), op=mpi_op)
                if backend.evaluates_on_host:
                    return backend.from_host_data(join(np, buffers), arrays[0])
                return backend.call(join, backend.xp, buffers)

            host = np.asarray(sync.to_host(backend, collective, "all_reduce"))
            reduced = split(host, groups, [a.size for a in arrays])
            values = [finish(np, reduced[i], arrays[i], op, self.size)
                      for i in range(len(arrays))]
            if backend.evaluates_on_host:
                results = backend.call(own, backend, values, arrays)  # one device op
            else:
                results = backend.call(unpack, backend.xp, buffers, groups, arrays, op,
                                       self.size)
        host_values = [python_value(v) if v.ndim == 0 else v for v in values]  # (on the host)
        return results, host_values


def _message(backend: Backend, buffer: Any) -> Any:
    """What MPI is handed: a NumPy buffer as it is (mpi4py takes MPI's datatype from its
    dtype); device memory as its address, size and MPI datatype, the way a CUDA-aware MPI
    takes a device pointer (MPI finds the memory's kind itself; mpi4py is never asked to
    import the array through DLPack, which would query the device)."""
    if backend.evaluates_on_host:
        return buffer
    address = backend.data_address(buffer)
    return [MPI.buffer.fromaddress(address, buffer.nbytes), MPI._typedict[buffer.dtype.char]]


def _check_mpi_type(dtype: np.dtype, given: np.dtype) -> None:
    """A TypeError, before anything is sent, for a dtype MPI has no predefined datatype for
    (float16, where MPI has none)."""
    if dtype.char not in MPI._typedict:
        raise TypeError(f"gs.distributed.all_reduce: MPI has no datatype for {given} "
                        f"values; convert them first (e.g. to float32)")


