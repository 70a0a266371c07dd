"""Scalars across processes: `all_reduce` over the user's own communicator.

Why this package exists: once a job runs on several processes, the loss, the gradients and a
solver's residual are combined across them every step, and the usual
``comm.allreduce(float(loss))`` reads each value on the host (a sync per value). gpuscalar runs
the collective on the engine the user already has (MPI through ``mpi4py``, NCCL through CuPy's
communicator), never on a transport of its own, and never makes the communicator itself:
``comm`` is the user's, wrapped here.

`all_reduce` packs every value of one dtype into one buffer, so a list of scalars and arrays of
one dtype costs ONE collective (a list mixing dtypes, one per dtype: no value is converted to
another dtype, so an int64 max or a float32 sum is exactly what one process computes). How the
collective meets the sync accounting:

- MPI on host data (NumPy, the strict device): packing is one counted device op, the collective
  and the read of its results are ONE counted sync (reason ``"all_reduce"``, through
  `gpuscalar.sync.to_host`, so ``sync_guard("error")`` refuses it before anything is sent), and
  the results are *known* afterwards: reading any of them (``float(loss)``, ``gs.read``) costs
  nothing more.
- MPI over CuPy memory (CUDA-aware MPI): MPI is not stream-aware, so the same counted sync
  first waits for the current stream, then the collective runs on the device buffers (handed
  to MPI as pointers); the results are read back in that sync (known afterwards). Tested in CI
  through the fake device (tests/cupy_fake.py, the recording seam), never yet on a GPU.

- NCCL (CuPy's ``NcclCommunicator``, `gpuscalar.distributed.nccl`): the collective is enqueued
  on the current stream, in place in the packed buffer: no sync at all, and allowed inside a
  `gs.capture` step; results are read later as any GPUScalar (one counted sync at first read).

This package is the front (arguments, structure, ops, packing, the user's communicator
recognised and wrapped: `gpuscalar.distributed.mpi`, `gpuscalar.distributed.nccl`); the
collective itself is the device's "collectives" executor (`Collectives`): NCCL and MPI over
device memory in the CuPy wing (`gpuscalar.devices.cupy.collectives`), MPI on host data in the
host wing (`gpuscalar.devices.host.collectives`, for NumPy and the strict device).

A collective inside a `gs.while_loop`/`gs.cond` body is refused (NCCL cannot run inside CUDA
conditional graph nodes), and so is an MPI one inside a `gs.capture` step (a host call no graph
keeps); docs/distributed.md shows the chunked form.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .. import ledger, sync
from ..backend import Backend
from ..devices import backend_of
from ..known import remember
from ..scalar import GPUScalar, _wrap
from .nccl import NcclComm, is_nccl_communicator
from .packing import buffer_dtype, result_dtype

if TYPE_CHECKING:
    from .mpi import MpiComm

__all__ = ["all_reduce", "OPS", "buffer_dtype", "result_dtype"]

#: The reductions `all_reduce` knows, by name.
OPS = ("sum", "mean", "max", "min", "prod")

_KINDS = "biufc"

#: Why a collective is refused in a body (the error names NCCL's limit and the way out).
BODY_MESSAGE = (
    "gs.distributed.all_reduce was called inside a gs.while_loop/gs.cond body or a gs.capture "
    "step: a collective cannot be recorded there (NCCL collectives are not supported inside "
    "CUDA conditional graph nodes, NVIDIA/nccl#1986; an MPI collective is a host call, which "
    "neither a conditional node nor a captured graph can hold); run k iterations in a captured "
    "block, then one all_reduce and one check per block (the chunked form, docs/distributed.md)"
)


class Collectives(Protocol):
    """A device's ``"collectives"`` executor (`gpuscalar.backend.Backend.executor`): the
    collective on values of that device, for a wrapped communicator (`wrap_comm`). Each returns
    the reduced arrays (new arrays of the device, or pending GPUScalars where nothing waits
    yet) and their host values (a Python number or NumPy array each, None where not read)."""

    def mpi_all_reduce(self, comm: MpiComm, device: object, arrays: list[Any],
                       groups: dict[np.dtype, list[int]], op: str
                       ) -> tuple[list[Any], list[Any]]:
        """MPI, ``arrays`` packed one buffer per dtype of ``groups`` (buffer dtype -> the
        positions of its values, checked by the front): on host data, or a counted sync then
        MPI on device memory."""

    def nccl_all_reduce(self, comm: NcclComm, device: object, arrays: list[Any],
                        op: str) -> tuple[list[Any], list[Any]]:
        """NCCL on the current stream, no sync (``comm.plan`` checks and packs first); a
        device without NCCL raises ``comm.refused(backend)``."""


class MpiOnFirstUse:
    """What every device's collectives share: the backend, and `mpi_all_reduce` importing the
    device's MPI path (`mpi_module`, whose ``all_reduce(backend, comm, ...)`` it is) at its
    first call and putting it in the method's place: mpi4py is imported only with the user's
    MPI communicator, and later calls go straight there."""

    #: the wing's MPI module (host data, or device memory after a counted stream sync)
    mpi_module: str = ""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def mpi_all_reduce(self, comm: MpiComm, device: object, arrays: list[Any],
                       groups: dict[np.dtype, list[int]], op: str
                       ) -> tuple[list[Any], list[Any]]:
        path = functools.partial(importlib.import_module(self.mpi_module).all_reduce,
                                 self.backend)
        self.mpi_all_reduce = path  # type: ignore[method-assign]
        return path(comm, device, arrays, groups, op)


#: each device's "collectives" executor, once found (`all_reduce` runs every step: the slot's
#: lookup is off its path); one entry per backend that has one
_COLLECTIVES: dict[Backend, Collectives] = {}


def all_reduce(values: Any, op: str = "sum", *, comm: Any) -> Any:
    """Reduce ``values`` across the processes of ``comm``: the results, in the same structure.

    ``values``: a GPUScalar, an array (NumPy, strict or CuPy), or a list/tuple of them, all on
    one backend and device. ``op``: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"prod"``
    (``"mean"`` is the sum divided by the number of processes; of integers and bools, a float64
    as ``numpy.mean``; sum and prod keep the values' dtype, as the elementwise ``x0 + x1 +
    ...`` across processes, except of bools: an int64, as ``numpy.sum``; complex values take
    sum, mean and prod only; on NCCL sum and mean). ``comm``: the user's own ``mpi4py``
    communicator (an ``MPI.Intracomm``) or NCCL communicator (`wrap_comm`); anything else is a
    TypeError naming it. Every process must call it with the same structure, dtypes and
    shapes, as for any collective.

    Returns a GPUScalar for each GPUScalar (known on the host: reading it costs nothing more),
    a new array of the input's backend, shape and dtype for each array, in a list, a tuple or
    alone as given. Values of one dtype go in one packed collective (one per dtype in a mixed
    list). Accounting: one counted device op packs the values, one counted sync (reason
    ``"all_reduce"``) runs the collective and reads its results (on CuPy: a stream wait first,
    and one more device op joining the buffers for that read), one device op unpacks them. On
    NCCL (``comm`` a NCCL communicator, CuPy values): no sync; one device op packs, one per
    dtype is the collective on the current stream, one unpacks; results not read yet.
    """
    if not isinstance(op, str):
        raise TypeError(f"gs.distributed.all_reduce: op= is {sync.describe(op)}; expected one of "
                        f"{', '.join(repr(o) for o in OPS)}")
    if op not in OPS:
        raise ValueError(f"gs.distributed.all_reduce: unknown op {op!r}; expected one of "
                         f"{', '.join(repr(o) for o in OPS)}")
    communicator = wrap_comm(comm)
    if (ledger.in_loop_body() or ledger.in_graph_body()) and not (
            isinstance(communicator, NcclComm) and _in_capture_step()):
        raise RuntimeError(BODY_MESSAGE)
    structure, items = _flatten(values)
    if not items:
        return [] if structure is list else ()
    backend, device, arrays = _placed(items, structure)
    for index, array in enumerate(arrays):
        kind = array.dtype.kind
        if kind not in _KINDS:
            raise TypeError(f"gs.distributed.all_reduce: {_where(index, structure)} has dtype "
                            f"{array.dtype}; it reduces bool, integer, floating and complex "
                            "values")
        if kind == "c" and op in ("max", "min"):
            raise TypeError(f"gs.distributed.all_reduce: op={op!r} of complex values "
                            f"({_where(index, structure)} is {array.dtype}): complex numbers "
                            "are not ordered")
    collectives = _COLLECTIVES.get(backend)
    if collectives is None:
        try:
            collectives = _COLLECTIVES[backend] = backend.executor("collectives")
        except LookupError:
            raise communicator.refused(backend) from None
    reduced, host = communicator.all_reduce(collectives, device, arrays, op)
    results: list[Any] = []
    for item, array, value in zip(items, reduced, host, strict=True):
        if isinstance(array, GPUScalar):  # pending already (host MPI: a non-blocking collective)
            results.append(array)
        elif isinstance(item, GPUScalar):
            if value is not None:  # read in the collective's sync: a new array, never written
                remember(array, value)
            results.append(_wrap(backend, array))
        else:
            results.append(array)
    if structure is None:
        return results[0]
    return structure(results)


def wrap_comm(comm: Any) -> Any:
    """The wrapper gpuscalar reduces through, for the user's own communicator ``comm``.

    An ``mpi4py`` ``MPI.Comm`` (intracommunicator) gives a `gpuscalar.distributed.mpi.MpiComm`.
    A NCCL communicator (CuPy's ``cupy.cuda.nccl.NcclCommunicator``, or anything with its
    ``allReduce``/``size``/``device_id`` calls; a ``cupyx.distributed.NCCLBackend`` gives the
    one it holds; NVIDIA's nccl4py ``nccl.core.Communicator``) gives a
    `gpuscalar.distributed.nccl.NcclComm`. Anything else is a TypeError
    naming it. Never imports mpi4py or CuPy: a user who holds such a communicator has imported
    them."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(comm, mpi.Comm):
        if not isinstance(comm, mpi.Intracomm):
            raise TypeError(f"gs.distributed.all_reduce: comm= is an {type(comm).__name__}; "
                            "it reduces over an intracommunicator (MPI.Intracomm)")
        from .mpi import MpiComm  # noqa: PLC0415 - only where the user has mpi4py

        return MpiComm(comm)
    if type(comm).__name__ == "NCCLBackend" and is_nccl_communicator(getattr(comm, "_comm",
                                                                             None)):
        comm = comm._comm  # cupyx.distributed's backend: the NcclCommunicator it holds
    if is_nccl_communicator(comm):
        return NcclComm(comm)
    raise TypeError(
        f"gs.distributed.all_reduce: comm= is {sync.describe(comm)}; expected your own "
        "communicator: an mpi4py MPI.Comm, or a NCCL communicator (cupy.cuda.nccl."
        "NcclCommunicator, cupyx.distributed.NCCLBackend, nccl4py's nccl.core.Communicator); "
        "gpuscalar never creates one"
    )


def _in_capture_step() -> bool:
    """Whether a `gs.capture` step is being warmed up or recorded (a NCCL collective may be
    recorded there; a loop or branch body is refused by its own flag, except one nested in a
    capture step, which this cannot tell apart: NCCL's own error is raised there)."""
    from ..capture import _capturing  # noqa: PLC0415 - only inside a body

    return bool(_capturing.get(False))


def _flatten(values: Any) -> tuple[Any, list[Any]]:
    """(the container type, list or tuple, or None for one value; the values in order)."""
    if type(values) in (list, tuple):
        return type(values), list(values)
    return None, [values]


def _where(index: int, structure: Any) -> str:
    return "values" if structure is None else f"values[{index}]"


def _placed(items: list[Any], structure: Any) -> tuple[Backend, object, list[Any]]:
    """The one backend and device of ``items`` and each one's array (a GPUScalar's, evaluated
    if pending); anything else, or values on two backends or devices, is an error naming it."""
    place: tuple[Backend, object, int] | None = None
    arrays = []
    for index, item in enumerate(items):
        if isinstance(item, GPUScalar):
            backend, array = item.backend, item.array
        else:
            found = backend_of(item)
            if found is None:
                raise TypeError(
                    f"gs.distributed.all_reduce: {_where(index, structure)} is "
                    f"{sync.describe(item)}; it reduces GPUScalars and arrays (a host number "
                    "needs no gpuscalar: comm.allreduce(x))")
            backend, array = found, item
        device = backend.device_of(array) if backend.multi_device else "cpu"
        if place is None:
            place = (backend, device, index)
        elif backend is not place[0] or device != place[1]:
            error = TypeError if backend is not place[0] else ValueError
            raise error(
                f"gs.distributed.all_reduce: {_where(index, structure)} is on {backend.name} "
                f"device {device!r} but {_where(place[2], structure)} is on {place[0].name} "
                f"device {place[1]!r}; one call reduces values of one device")
        arrays.append(array)
    assert place is not None
    return place[0], place[1], arrays
