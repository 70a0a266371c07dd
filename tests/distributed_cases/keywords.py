"""``comm=`` on gs.global_norm, gs.clip_grad_norm and gs.MetricLog, run under ``mpiexec -n N`` by
tests/test_distributed_keywords.py.

``python keywords.py BACKEND`` (numpy or strict) on every rank: each rank holds its own shard
(arrays of its own counts and shapes, made from its rank, so every rank can make every rank's
values), and the results are checked against ONE process's computation on the concatenation of
every rank's data; the collectives are counted on the real MPI by a counting subclass of the
communicator (`Counting`). Exits non-zero on any difference; prints ``ok RANK`` at the end.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
from mpi4py import MPI

import gpuscalar as gs
from gpuscalar import strict
from gpuscalar.deferred import DroppedRowsWarning

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
XP = strict.xp if sys.argv[1] == "strict" else np


class Counting(MPI.Intracomm):
    """COMM_WORLD itself (the same handle), counting the reductions gpuscalar starts on it."""

    calls = 0

    def Allreduce(self, *args, **kwargs):  # noqa: N802 - mpi4py's names
        Counting.calls += 1
        return super().Allreduce(*args, **kwargs)

    def Iallreduce(self, *args, **kwargs):  # noqa: N802
        Counting.calls += 1
        return super().Iallreduce(*args, **kwargs)

    def allreduce(self, *args, **kwargs):
        Counting.calls += 1
        return super().allreduce(*args, **kwargs)


COMM = Counting(MPI.COMM_WORLD)


def collectives(call):
    """(call's result, the collectives it started)."""
    before = Counting.calls
    result = call()
    return result, Counting.calls - before


def shard(rank: int, dtype: str = "float64", empty: bool = False) -> list[np.ndarray]:
    """Rank ``rank``'s arrays: ``rank + 1`` of them, of different shapes (none with elements
    when ``empty``)."""
    rng = np.random.default_rng(100 + rank)
    shapes = [(0,)] * (rank + 1) if empty else [(3 + rank,), (2, rank + 2), ()][: rank + 1]
    return [np.asarray(rng.standard_normal(s) * (1 + rank)).astype(dtype) for s in shapes]


def concatenated(dtype: str = "float64", empty_on: int | None = None) -> np.ndarray:
    return np.concatenate([a.ravel() for r in range(SIZE)
                           for a in shard(r, dtype, empty=r == empty_on)])


def host(value) -> float:
    return float(value)


def same_on_every_rank(value: float) -> None:
    found = MPI.COMM_WORLD.allgather(np.float64(value).tobytes())
    assert all(v == found[0] for v in found), ("ranks disagree", found)


def test_global_norm() -> None:
    for dtype, rtol in (("float64", 1e-12), ("float32", 1e-5)):
        mine = [XP.asarray(a) for a in shard(RANK, dtype)]
        for ord in (2, 1, 0, 3, 0.5, -1, math.inf, -math.inf, None):
            with gs.count_syncs() as counter:
                norm, count = collectives(lambda o=ord, m=mine: gs.global_norm(m, o, comm=COMM))
                value = host(norm)
            assert count == 1, (ord, count)  # ONE collective for all the arrays
            assert counter.count == 1, (ord, counter.report())  # MPI: one sync, then known
            want = np.linalg.vector_norm(concatenated(dtype), ord=2 if ord is None else ord)
            assert norm.dtype == want.dtype, (ord, norm.dtype, want.dtype)
            assert np.isclose(value, want, rtol=rtol, atol=0), (dtype, ord, value, want)
            same_on_every_rank(value)
    # one array alone, a GPUScalar, and a rank with no elements at all
    single, count = collectives(lambda: gs.global_norm(XP.asarray(shard(RANK)[0]), comm=COMM))
    want = np.linalg.vector_norm(np.concatenate([shard(r)[0] for r in range(SIZE)]))
    assert count == 1 and np.isclose(host(single), want, rtol=1e-12)
    for ord in (2, math.inf, -math.inf, 0):
        mine = [XP.asarray(a) for a in shard(RANK, empty=RANK == 0)]
        norm, count = collectives(lambda o=ord, m=mine: gs.global_norm(m, o, comm=COMM))
        want = np.linalg.vector_norm(concatenated(empty_on=0), ord=ord)
        assert count == 1 and np.isclose(host(norm), want, rtol=1e-12), (ord, host(norm), want)


def test_clip_grad_norm() -> None:
    for max_norm in (1.0, 1e6):  # clipped, and left alone
        mine = [XP.asarray(a) for a in shard(RANK)]
        total, count = collectives(lambda m=max_norm, g=mine: gs.clip_grad_norm(g, m,
                                                                                comm=COMM))
        assert count == 1, count
        everything = [shard(r) for r in range(SIZE)]
        flat = [a for part in everything for a in part]
        want_total = gs.clip_grad_norm(flat, max_norm)  # one process, every shard
        assert np.isclose(host(total), host(want_total), rtol=1e-12)
        got = [a.get() if XP is not np else a for a in mine]
        for g, w in zip(got, everything[RANK], strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=0)
        same_on_every_rank(host(total))


def rows_of(rank: int, steps: int) -> list[dict]:
    return [{"loss": 0.5 * step + rank / 3, "correct": step + rank,
             "peak": np.float32(step * (rank + 1)), "finite": (step + rank) % 3 != 0}
            for step in range(steps)]


def record(log: gs.MetricLog, rows: list[dict]) -> None:
    for row in rows:
        log.record(loss=gs.asscalar(row["loss"], like=XP.zeros(())), correct=row["correct"],
                   peak=gs.asscalar(row["peak"], like=XP.zeros((), np.float32)),
                   finite=row["finite"])


def test_metric_log() -> None:
    ops = {"correct": "sum", "peak": "max", "finite": "min"}  # loss: mean (the default)
    log = gs.MetricLog(8, like=XP.zeros(()), comm=COMM, ops=ops)
    record(log, rows_of(RANK, 5))
    assert log.ready() == []  # with comm: rows at flush only
    with gs.count_syncs() as counter:
        rows, count = collectives(log.flush)
    assert count == 1 and counter.count == 1, (count, counter.report())
    every = [rows_of(r, 5) for r in range(SIZE)]
    assert [row["step"] for row in rows] == list(range(5))
    for step, row in enumerate(rows):
        losses = np.array([every[r][step]["loss"] for r in range(SIZE)])
        assert row["loss"] == float(np.mean(losses)), (row, losses)
        assert row["correct"] == sum(every[r][step]["correct"] for r in range(SIZE))
        assert row["peak"] == max(float(every[r][step]["peak"]) for r in range(SIZE))
        assert row["finite"] is all(every[r][step]["finite"] for r in range(SIZE))
    assert log.latest == rows[-1] and log.delivered == 5
    # next flush: only the new rows; more than the capacity: dropped on every rank alike
    record(log, rows_of(RANK, 16)[5:])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows, count = collectives(log.flush)
    assert count == 1 and [row["step"] for row in rows] == list(range(8, 16)), rows
    assert log.dropped == 3 and any(issubclass(w.category, DroppedRowsWarning)
                                    for w in caught)
    # nothing new: still a collective, no rows
    assert collectives(log.flush) == ([], 1)
    # different row counts: a RuntimeError on every rank alike
    other = gs.MetricLog(8, like=XP.zeros(()), comm=COMM)
    record(other, rows_of(RANK, 2 + (RANK == 0)))
    try:
        other.flush()
    except RuntimeError as error:
        assert "different numbers of rows" in str(error), error
    else:
        raise AssertionError("no RuntimeError for different row counts")


def test_errors() -> None:
    for make in (lambda: gs.global_norm([XP.zeros(2)], comm=object()),
                 lambda: gs.clip_grad_norm([XP.zeros(2)], 1.0, comm=object()),
                 lambda: gs.MetricLog(comm=object())):
        try:
            make()
        except TypeError as error:
            assert "comm= is an object" in str(error), error
        else:
            raise AssertionError("no TypeError for a bad comm")

    def in_loop() -> None:
        gs.while_loop(lambda i: i < 2, lambda i: i + gs.global_norm(XP.ones(2), comm=COMM),
                      XP.zeros(()), max_iter=4)

    try:
        in_loop()
    except RuntimeError as error:
        assert "NCCL collectives are not supported" in str(error), error
    else:
        raise AssertionError("no RuntimeError in a loop body")


if __name__ == "__main__":
    for name, test in list(globals().items()):
        if name.startswith("test_") and callable(test):
            test()
            MPI.COMM_WORLD.Barrier()
    print(f"ok {RANK}", flush=True)
