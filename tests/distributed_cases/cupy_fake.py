"""gs.distributed.all_reduce over CuPy memory, without a GPU, under ``mpiexec -n N``.

Real ``cupy.ndarray`` objects over fake device memory (tests/cupy_fake.py: host buffers whose
addresses stand for device pointers) and gpuscalar's CUDA seam replaced by the recording double
(tests/cupy_seam.py), with the real MPI of the test extra: MPI is handed each packed buffer as a
pointer, as a CUDA-aware MPI takes a device pointer, so here it reduces the fake memory itself.
Checked: the results against one process's reduction, their structure and backend; for each
call one stream wait (MPI is not stream-aware) before the collective, one read (the results,
known after it), one counted sync, no upload, and the device ops. Prints ``ok RANK``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import gpuscalar as gs  # noqa: E402
from gpuscalar.devices import CUPY  # noqa: E402
from tests.cupy_fake import FakeMemory, host_view  # noqa: E402
from tests.cupy_seam import recording  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


def values_of(rank: int, dtype: str, shape: tuple = ()) -> np.ndarray:
    count = int(np.prod(shape))
    return (((np.arange(count) * 3 + rank * 5 + 1) % 7 + 1).astype(dtype)).reshape(shape)


def expected(op: str, dtype: str, shape: tuple = ()) -> np.ndarray:
    stacked = np.stack([values_of(r, dtype, shape) for r in range(SIZE)])
    keep = {"dtype": dtype} if op in ("sum", "prod") else {}
    return np.asarray(REDUCE[op](stacked, axis=0, **keep))


def main() -> None:
    memory = FakeMemory()
    with recording(memory) as seam:
        stream = seam.current_stream()
        for op in REDUCE:
            for dtype in ("float64", "float32", "int64", "int32"):
                scalar = gs.GPUScalar(seam.array(values_of(RANK, dtype)))
                grad = seam.array(values_of(RANK, dtype, (2, 3)))
                seam.clear()
                waits = seam.stream_waits
                with gs.count_syncs(include_cupy=True) as counter:
                    out = gs.distributed.all_reduce((scalar, grad), op, comm=COMM)
                what = f"{op} {dtype}"
                assert type(out) is tuple and len(out) == 2, what
                assert isinstance(out[0], gs.GPUScalar) and out[0].backend is CUPY, what
                assert type(out[1]) is type(grad) and out[1].shape == (2, 3), what
                assert counter.count == 1 and counter.records[0].reason == "all_reduce", (
                    what, counter.report())
                assert counter.device_ops == 3, (what, counter.report())  # pack, join, unpack
                assert seam.stream_waits == waits + 1, what  # MPI is not stream-aware
                assert len(seam.reads) == 1 and not seam.uploads, what
                assert seam.current_stream() is stream, what
                want, want_grad = expected(op, dtype), expected(op, dtype, (2, 3))
                assert out[0].dtype == want.dtype and out[1].dtype == want_grad.dtype, what
                with gs.count_syncs(include_cupy=True) as counter:
                    value = out[0].item()  # known: no second read
                assert counter.count == 0 and len(seam.reads) == 1, what
                assert value == want[()], (what, value, want)
                assert np.array_equal(host_view(out[1]), want_grad), (what, host_view(out[1]))
    print(f"ok {RANK}", flush=True)


if __name__ == "__main__":
    main()
