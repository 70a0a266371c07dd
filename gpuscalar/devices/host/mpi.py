"""`gs.distributed.all_reduce` over MPI on host data (NumPy, the strict device).

Why this module exists: it is the MPI half of the host devices' "collectives" executor
(`gpuscalar.devices.host.collectives`), imported only with the user's mpi4py communicator
(`gpuscalar.distributed.mpi` is the front). GPUScalars alone: a non-blocking ``Iallreduce``
per packed buffer, the results pending GPUScalars over the receive buffers (registered with
`gpuscalar.known.expect`), waited for at their first use. With arrays among the values: a
blocking ``Allreduce`` inside ONE counted sync (reason ``"all_reduce"``), the results known.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

import numpy as np
from mpi4py import MPI

from ... import known, sync
from ...backend import Backend
from ...distributed.mpi import MPI_OPS, MpiComm
from ...distributed.packing import join, own, pack, result_dtype, results_on_host
from ...lazy import expr
from ...scalar import _classes_for, _pending

__all__ = ["all_reduce"]


def all_reduce(backend: Backend, comm: MpiComm, device: object, arrays: list[Any],
               groups: dict[np.dtype, list[int]], op: str) -> tuple[list[Any], list[Any]]:
    """`gpuscalar.distributed.Collectives.mpi_all_reduce` on the host-evaluating ``backend``."""
    mpi_op = MPI_OPS[op]
    if all(a.ndim == 0 and result_dtype(a.dtype, op).kind in "iufc" for a in arrays):
        return _nonblocking(backend, comm, device, arrays, groups, op, mpi_op), [None] * len(arrays)
    with backend.device_context(device):
        data = [backend.host_data(a) for a in arrays]
        buffers = backend.call(pack, np, data, groups)  # one device op

        def collective() -> Any:
            for buffer in buffers:
                comm.comm.Allreduce(MPI.IN_PLACE, buffer, op=mpi_op)
            return backend.from_host_data(join(np, buffers), arrays[0])

        sync.admit("all_reduce")  # the guard first: a refused read sends nothing
        host = np.asarray(sync.to_host(backend, collective(), None))
        values, host_values = results_on_host(host, groups, arrays, op, comm.size)
        results = backend.call(own, backend, values, arrays)  # one device op
    return results, host_values


def _nonblocking(backend: Backend, comm: MpiComm, device: object, arrays: list[Any],
                 groups: dict[np.dtype, list[int]], op: str, mpi_op: Any) -> list[Any]:
    """Scalars on the host: one ``Iallreduce`` per buffer, the results pending GPUScalars
    that read their receive buffer (waited for at first use), no sync now."""
    data = [backend.host_data(a) for a in arrays]
    buffers = backend.call(pack, np, data, groups)  # one device op
    requests = [comm.comm.Iallreduce(MPI.IN_PLACE, buffer, op=mpi_op) for buffer in buffers]
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
                                                                        comm.size),
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
    of processes (as `gpuscalar.distributed.packing.finish`)."""
    if op == "mean":  # (a complex by (n + 0j): the same bits as by the real n)
        divide = expr.get_op("ufunc", "divide", (dtype, dtype), (dtype,))
        return expr.make_node(divide, (leaf, dtype.type(size)))
    return expr.make_node(expr.get_op("ufunc", "positive", (dtype,), (dtype,)), (leaf,))
