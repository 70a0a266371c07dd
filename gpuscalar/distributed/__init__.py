"""Scalars across processes: `all_reduce` over the user's own communicator.

Why this package exists: once a job runs on several processes, the loss, the gradients and a
solver's residual are combined across them every step, and the usual
``comm.allreduce(float(loss))`` reads each value on the host (a sync per value). gpuscalar runs
the collective on the engine the user already has (MPI through ``mpi4py`` today; NCCL through
CuPy is planned, see docs/distributed.md), never on a transport of its own, and never makes the
communicator itself: ``comm`` is the user's, wrapped here.

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

A collective inside a `gs.while_loop`/`gs.cond` body or a `gs.capture` step is refused (NCCL
cannot run inside CUDA conditional graph nodes; an MPI call is a host call no recording keeps);
docs/distributed.md shows the chunked form.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import ledger, sync
from ..backend import Backend, backend_of
from ..known import remember
from ..scalar import GPUScalar, _wrap

__all__ = ["all_reduce", "OPS"]

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


def all_reduce(values: Any, op: str = "sum", *, comm: Any) -> Any:
    """Reduce ``values`` across the processes of ``comm``: the results, in the same structure.

    ``values``: a GPUScalar, an array (NumPy, strict or CuPy), or a list/tuple of them, all on
    one backend and device. ``op``: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"prod"``
    (``"mean"`` is the sum divided by the number of processes; of integers and bools, a float64
    as ``numpy.mean``; sum and prod keep the values' dtype, as the elementwise ``x0 + x1 +
    ...`` across processes, except of bools: an int64, as ``numpy.sum``; complex values take
    sum, mean and prod only). ``comm``: the user's own ``mpi4py`` communicator (an
    ``MPI.Comm``); anything else is a TypeError naming it. Every process must call it with the
    same structure, dtypes and shapes, as for any collective.

    Returns a GPUScalar for each GPUScalar (known on the host: reading it costs nothing more),
    a new array of the input's backend, shape and dtype for each array, in a list, a tuple or
    alone as given. Values of one dtype go in one packed collective (one per dtype in a mixed
    list). Accounting: one counted device op packs the values, one counted sync (reason
    ``"all_reduce"``) runs the collective and reads its results (on CuPy: a stream wait first,
    and one more device op joining the buffers for that read), one device op unpacks them.
    """
    if not isinstance(op, str):
        raise TypeError(f"gs.distributed.all_reduce: op= is {sync.describe(op)}; expected one of "
                        f"{', '.join(repr(o) for o in OPS)}")
    if op not in OPS:
        raise ValueError(f"gs.distributed.all_reduce: unknown op {op!r}; expected one of "
                         f"{', '.join(repr(o) for o in OPS)}")
    communicator = wrap_comm(comm)
    if ledger.in_loop_body() or ledger.in_graph_body():  # (a capture's steps mark both)
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
    reduced, host = communicator.all_reduce(backend, device, arrays, op)
    results: list[Any] = []
    for item, array, value in zip(items, reduced, host, strict=True):
        if isinstance(item, GPUScalar):  # a new array nothing writes: its value is known
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
    A CuPy NCCL communicator is recognised and refused for now (NotImplementedError: the NCCL
    path is not written yet); anything else is a TypeError naming it. Never imports mpi4py or
    CuPy: a user who holds such a communicator has imported them."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(comm, mpi.Comm):
        if not isinstance(comm, mpi.Intracomm):
            raise TypeError(f"gs.distributed.all_reduce: comm= is an {type(comm).__name__}; "
                            "it reduces over an intracommunicator (MPI.Intracomm)")
        from .mpi import MpiComm  # noqa: PLC0415 - only where the user has mpi4py

        return MpiComm(comm)
    kind = type(comm)
    if kind.__module__.startswith(("cupy", "cupyx", "nccl")):
        raise NotImplementedError(
            f"gs.distributed.all_reduce: comm= is a {kind.__module__}.{kind.__name__}; the NCCL "
            "path is not implemented yet (docs/distributed.md): use an mpi4py communicator"
        )
    raise TypeError(
        f"gs.distributed.all_reduce: comm= is {sync.describe(comm)}; expected your own "
        "communicator: an mpi4py MPI.Comm (gpuscalar never creates one)"
    )


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


def result_dtype(dtype: np.dtype, op: str) -> np.dtype:
    """The dtype of the reduction ``op`` of values of ``dtype`` (NumPy's: ``mean`` of
    integers and bools is float64, ``sum`` and ``prod`` of bools int64; otherwise the
    input's, as the elementwise ``x0 + x1 + ...`` across processes keeps it)."""
    if op == "mean" and dtype.kind in "biu":
        return np.dtype(np.float64)
    if op in ("sum", "prod") and dtype.kind == "b":
        return np.dtype(np.int64)
    return dtype


def buffer_dtype(dtype: np.dtype, op: str) -> np.dtype:
    """The dtype the collective runs in for values of ``dtype``: the result's, except bools
    under max/min, reduced as uint8 (0 and 1: MPI has no max of C_BOOL), and a mean of
    integers, summed in 64 bits before the division."""
    if dtype.kind == "b" and op in ("max", "min"):
        return np.dtype(np.uint8)
    if op == "mean" and dtype.kind in "biu":
        return np.dtype(np.int64) if dtype.kind != "u" else np.dtype(np.uint64)
    return result_dtype(dtype, op)
