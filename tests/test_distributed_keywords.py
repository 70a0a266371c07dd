"""``comm=`` on gs.global_norm, gs.clip_grad_norm and gs.MetricLog, and the distributed CG example.

Under ``mpiexec -n 2`` and ``-n 3`` (tests/distributed_cases/keywords.py, through
tests/test_distributed.py's `run_ranks`): the values against one process's computation on the
concatenation of every rank's data, the collectives counted on the real MPI. In pytest's own
process (MPI is never initialized here): the refusals, and the NCCL path through CuPy arrays
over fake device memory with recording communicator doubles (one ``allReduce``, no sync).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import gpuscalar as gs

from .test_distributed import CASES, ROOT, RecordingNccl, run_ranks


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_the_keywords_under_mpiexec(ranks, backend):
    """Each norm order, clipping and a MetricLog's flushes equal one process on every rank's
    data; one collective per call, counted on MPI; the errors."""
    out = run_ranks(ranks, CASES / "keywords.py", backend)
    assert sorted(re.findall(r"ok (\d+)", out)) == [str(r) for r in range(ranks)], out


@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_the_distributed_cg_example_on_two_ranks(backend):
    """Rows of A split across 2 ranks, chunked blocks of 5 iterations: the solution equals one
    process's (the example asserts it), one counted sync per iteration, the check free."""
    out = run_ranks(2, ROOT / "examples" / "distributed_cg.py", "--backend", backend)
    line = next(text for text in out.splitlines() if text.startswith("SYNCS"))
    counts = dict(part.split("=") for part in line.split()[1:])
    per_block = [int(v) for v in counts["per_block"].split(",")]
    assert counts["k"] == "5" and int(counts["blocks"]) == len(per_block) >= 2, out
    assert per_block == [5] * len(per_block), out  # K syncs per block of K iterations
    assert "x == numpy.linalg.solve and gs.linalg.cg" in out


# ---- in pytest's own process ----------------------------------------------------------------


@pytest.mark.parametrize("comm", [object(), 3, "world"])
def test_a_bad_comm_is_a_type_error_naming_it_before_any_work(comm):
    x = np.ones(3)
    with gs.count_syncs() as counter:
        with pytest.raises(TypeError, match=r"gpuscalar.global_norm\(\): comm= is .*mpi4py"):
            gs.global_norm([x], comm=comm)
        with pytest.raises(TypeError, match=r"gpuscalar.clip_grad_norm\(\): comm= is "):
            gs.clip_grad_norm([x], 1.0, comm=comm)
        with pytest.raises(TypeError, match=r"gpuscalar.MetricLog\(\): comm= is "):
            gs.MetricLog(comm=comm)
    assert counter.count == 0 and counter.device_ops == 0
    assert np.array_equal(x, np.ones(3))


def test_metric_log_ops_need_a_comm_and_known_ops():
    with pytest.raises(ValueError, match="ops= reduces columns across processes; it needs comm"):
        gs.MetricLog(ops={"loss": "sum"})
    comm = RecordingNccl(None)
    with pytest.raises(ValueError, match=r"ops\['loss'\] is 'avg'"):
        gs.MetricLog(comm=comm, ops={"loss": "avg"})
    with pytest.raises(TypeError, match="ops= must be a mapping"):
        gs.MetricLog(comm=comm, ops=["sum"])


def test_without_comm_nothing_changes():
    arrays = [np.arange(5.0), np.ones((2, 3))]
    flat = np.concatenate([a.ravel() for a in arrays])
    for ord in (2, 1, 0, 3, math.inf, -math.inf):
        assert float(gs.global_norm(arrays, ord, comm=None)) == pytest.approx(
            np.linalg.vector_norm(flat, ord=ord), rel=1e-15)
    log = gs.MetricLog(4, comm=None)
    log.record(loss=1.5)
    assert log.ready() == [{"step": 0, "loss": 1.5}]


# ---- NCCL: CuPy arrays over fake device memory, recording communicator doubles ---------------


class GatheringNccl(RecordingNccl):
    """A NCCL communicator of rank 0 among ``ranks`` whose other ranks hold the same ring: a
    MetricLog's gather (an int64 sum where each rank fills its own slot) answered by copying
    slot 0 into the others."""

    def allReduce(self, send, recv, count, datatype, op, stream) -> None:  # noqa: N802
        self.calls.append((send, recv, count, datatype, op, stream))
        words = self.memory.region(send, count * 8).view(np.int64)
        each = count // self.ranks
        for rank in range(1, self.ranks):
            words[rank * each:(rank + 1) * each] = words[:each]


@pytest.fixture
def fake_cupy():
    from .cupy_fake import cupy_or_fail, fake_memory, refuse_on_a_gpu
    from .cupy_seam import recording

    cupy_or_fail()
    refuse_on_a_gpu()
    with fake_memory() as memory, recording(memory) as seam:
        yield memory, seam


@pytest.mark.needs_cupy
@pytest.mark.parametrize("ord", [2, 1, 0, 3, math.inf, -math.inf])
def test_global_norm_on_nccl_is_one_collective_and_no_sync(fake_cupy, ord):
    memory, seam = fake_cupy
    host = [np.arange(5.0) - 2, np.ones((2, 3))]
    arrays = [seam.array(a) for a in host]
    comm = RecordingNccl(memory, ranks=3)  # 3 ranks holding the same arrays
    seam.clear()
    with gs.count_syncs(include_cupy=True) as counter:
        norm = gs.global_norm(arrays, ord, comm=comm)
    assert counter.count == 0 and not seam.reads and not seam.uploads, counter.report()
    (send, recv, count, _, op, stream), = comm.calls  # ONE collective, of one scalar
    assert send == recv and count == 1 and stream == seam.current_stream().ptr
    assert op == {math.inf: 2, -math.inf: 3}.get(ord, 0)  # max, min, else a sum
    assert isinstance(norm, gs.GPUScalar) and norm.dtype == np.float64
    if ord in (1, 0, math.inf, -math.inf):  # (the seam computes no fused kernel's values)
        flat = np.concatenate([a.ravel() for a in host] * 3)
        assert float(norm) == np.linalg.vector_norm(flat, ord=ord)


@pytest.mark.needs_cupy
def test_clip_grad_norm_on_nccl_clips_with_one_collective(fake_cupy):
    memory, seam = fake_cupy
    grads = [seam.array(np.full(4, 3.0)), seam.array(np.full((2, 2), 4.0))]
    comm = RecordingNccl(memory, ranks=2)
    with gs.count_syncs(include_cupy=True) as counter:
        total = gs.clip_grad_norm(grads, 1.0, norm_type=1, comm=comm)
    assert counter.count == 0 and len(comm.calls) == 1, counter.report()
    assert float(total) == 2 * (4 * 3.0 + 4 * 4.0)  # the 1-norm over both ranks: 56


@pytest.mark.needs_cupy
def test_metric_log_on_nccl_flushes_with_one_collective_and_one_sync(fake_cupy):
    memory, seam = fake_cupy
    like = seam.array(np.zeros(()))
    comm = GatheringNccl(memory, ranks=3)
    log = gs.MetricLog(4, like=like, comm=comm, ops={"n": "sum", "peak": "max"})
    for step in range(3):
        log.record(loss=gs.asscalar(0.5 * step, like=like), n=step, peak=float(step))
    assert log.ready() == [] and not comm.calls  # with comm: rows at flush only
    seam.clear()
    with gs.count_syncs(include_cupy=True) as counter:
        rows = log.flush()
    assert len(comm.calls) == 1 and counter.count == 1, counter.report()  # the read
    assert len(seam.reads) == 1 and not seam.uploads
    assert rows == [{"step": s, "loss": 0.5 * s, "n": 3 * s, "peak": float(s)}
                    for s in range(3)]


def test_the_allreduce_overhead_benchmark_runs():
    """bench/allreduce_overhead.py (one process, MPI.COMM_SELF: no mpiexec) prints its table."""
    import subprocess
    import sys

    pytest.importorskip("mpi4py")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "allreduce_overhead.py"),
                           "--n", "3"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, check=False)
    if done.returncode == 2:  # pragma: no cover - no shared/nullcuda markers here
        pytest.skip(done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "packing 8 GPUScalars into one all_reduce" in done.stdout
