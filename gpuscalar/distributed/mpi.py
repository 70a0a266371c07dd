"""`all_reduce` over an mpi4py communicator: on host data, and over CuPy memory.

Why this module exists: MPI is the engine every cluster (and CI, through mpich's wheel) has. It
is imported only when the user hands gpuscalar an ``mpi4py`` communicator, so gpuscalar never
imports mpi4py (nor initializes MPI) itself.

On host data (NumPy, the strict device), GPUScalars alone: a non-blocking ``Iallreduce`` per
packed buffer, and the results are pending GPUScalars over the receive buffers (registered with
`gpuscalar.known.expect`): nothing waits until a result is used, and the first read waits inside
its counted sync (an array operation using one waits too). With arrays among the values, or on
CuPy memory, the collective is a blocking ``Allreduce`` run inside ONE counted sync
(`gpuscalar.sync.to_host`, reason ``"all_reduce"``): the guard is checked before anything is
sent, and the read that ends the sync brings the reduced values to the host, so the results are
known. Over CuPy memory (CUDA-aware MPI, which is not stream-aware) the sync first waits for the
current stream, then MPI reads and writes the device buffers, and the read copies them back.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import known, sync
from ..backend import Backend
from ..devices import CUPY
from ..known import python_value
from ..lazy import expr
from ..scalar import _classes_for, _pending
from .packing import buffer_dtype, finish, join, own, pack, result_dtype, split, unpack

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
        if backend.evaluates_on_host and all(
                a.ndim == 0 and result_dtype(a.dtype, op).kind in "iufc" for a in arrays):
            return self._pending(backend, device, arrays, groups, op, mpi_op), [None] * len(arrays)
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


    def _pending(self, backend: Backend, device: object, arrays: list[Any],
                 groups: dict[np.dtype, list[int]], op: str, mpi_op: Any) -> list[Any]:
        """Scalars on the host: one ``Iallreduce`` per buffer, the results pending GPUScalars
        that read their receive buffer (waited for at first use), no sync now."""
        data = [backend.host_data(a) for a in arrays]
        buffers = backend.call(pack, np, data, groups)  # one device op
        requests = [self.comm.Iallreduce(MPI.IN_PLACE, buffer, op=mpi_op) for buffer in buffers]
        _outstanding(requests)

        lock = threading.Lock()

        def wait() -> None:  # any thread, any number of times: the requests complete once
            with lock:
                if requests:
                    MPI.Request.Waitall(requests)
                    requests.clear()

        classes = _classes_for(backend)
        results: list[Any] = [None] * len(arrays)
        for buffer, indices in zip(buffers, groups.values(), strict=True):
            for position, index in enumerate(indices):
                leaf = backend.from_host_data(buffer[position:position + 1].reshape(()),
                                              arrays[index])
                known.expect(leaf, wait)
                dtype = result_dtype(arrays[index].dtype, op)
                results[index] = _pending(classes[dtype.kind], _finish_node(leaf, dtype, op,
                                                                            self.size),
                                          dtype, device)
        return results


#: Requests of non-blocking collectives whose results may never be used: completed at exit,
#: before MPI is finalized (an MPI program must complete every request it starts).
_OUTSTANDING: list[list[Any]] = []


def _outstanding(requests: list[Any]) -> None:
    if not _OUTSTANDING:
        atexit.register(_complete_all)  # after mpi4py's own: so it runs before finalizing
    _OUTSTANDING[:] = [r for r in _OUTSTANDING if not MPI.Request.Testall(r)]
    _OUTSTANDING.append(requests)


def _complete_all() -> None:
    for requests in _OUTSTANDING:
        MPI.Request.Waitall(requests)
    _OUTSTANDING.clear()


def _finish_node(leaf: Any, dtype: np.dtype, op: str, size: int) -> expr.Node:
    """The result of a reduced element ``leaf`` as a pending expression: converted to the
    result's dtype (the input cast of ``positive`` on that loop), a mean divided by the number
    of processes (as `packing.finish`)."""
    if op == "mean":  # (a complex by (n + 0j): the same bits as by the real n)
        divide = expr.get_op("ufunc", "divide", (dtype, dtype), (dtype,))
        return expr.make_node(divide, (leaf, dtype.type(size)))
    return expr.make_node(expr.get_op("ufunc", "positive", (dtype,), (dtype,)), (leaf,))


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


