"""gs.distributed.all_reduce's contract, run under ``mpiexec -n N`` by tests/test_distributed.py.

``python contract.py BACKEND`` (numpy or strict) on every rank: each rank makes its own values
(from its rank), all-reduces them, and checks the results against ONE process's reduction of
all ranks' values (each rank can make every rank's values), the structure of the results, the
syncs and device ops counted, and the errors. Exits non-zero (an AssertionError) on any
difference; prints ``ok RANK`` at the end.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import gpuscalar as gs
from gpuscalar import strict

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
XP = strict.xp if sys.argv[1] == "strict" else np
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}
DTYPES = ("float64", "float32", "int64", "int32", "uint8", "complex128", "bool")


def values_of(rank: int, dtype: str, shape: tuple = ()) -> np.ndarray:
    """Rank ``rank``'s values: small integers (exact sums and products in every dtype, so the
    order MPI adds them in cannot matter), its rank mixed in."""
    count = int(np.prod(shape))
    raw = (np.arange(count) * 3 + rank * 5 + 1) % 7 + 1
    if dtype == "bool":
        raw = (np.arange(count) + rank) % 2
    array = raw.astype(dtype).reshape(shape)
    if dtype.startswith("complex"):
        array = array + 1j * (raw % 3).reshape(shape)
    return array


def expected(op: str, dtype: str, shape: tuple = ()) -> np.ndarray:
    """One process's reduction over the ranks (axis 0); sum and prod in the values' own dtype
    (an elementwise ``x0 + x1 + ...``, as the collective), but of bools as NumPy's (int64)."""
    stacked = np.stack([values_of(r, dtype, shape) for r in range(SIZE)])
    keep = {"dtype": dtype} if op in ("sum", "prod") and dtype != "bool" else {}
    return np.asarray(REDUCE[op](stacked, axis=0, **keep))


def host(value):
    """A result's host value, for the checks (a GPUScalar read; an array fetched)."""
    if isinstance(value, gs.GPUScalar):
        return np.asarray(value.item()), value.dtype
    data = value.get() if XP is not np else value
    return data, value.dtype


def check_equal(result, want: np.ndarray, what: str) -> None:
    got, dtype = host(result)
    assert dtype == want.dtype, (what, dtype, want.dtype)
    assert np.shape(got) == want.shape, (what, np.shape(got), want.shape)
    assert np.array_equal(got, want), (what, got, want)


def test_each_op_and_dtype() -> None:
    for op in REDUCE:
        for dtype in DTYPES:
            if dtype.startswith("complex") and op in ("max", "min"):
                continue
            scalar = gs.asscalar(values_of(RANK, dtype)[()], like=XP.zeros(()))
            array = XP.asarray(values_of(RANK, dtype, (2, 3)))
            one = gs.distributed.all_reduce(scalar, op, comm=COMM)
            assert isinstance(one, gs.GPUScalar) and one.backend is scalar.backend
            check_equal(one, expected(op, dtype), f"{op} {dtype} scalar")
            many = gs.distributed.all_reduce([scalar, array, scalar], op, comm=COMM)
            assert type(many) is list and len(many) == 3
            assert isinstance(many[0], gs.GPUScalar) and type(many[1]) is type(array)
            check_equal(many[0], expected(op, dtype), f"{op} {dtype} packed scalar")
            check_equal(many[1], expected(op, dtype, (2, 3)), f"{op} {dtype} packed array")
            check_equal(many[2], expected(op, dtype), f"{op} {dtype} packed scalar 2")


def test_structure_and_mixed_dtypes() -> None:
    a = gs.asscalar(float(RANK + 1), like=XP.zeros(()))
    b = XP.asarray(np.arange(4, dtype=np.int32) + RANK)
    c = gs.asscalar(np.float32(2 * RANK))
    c = gs.asscalar(c.item(), like=XP.zeros((), np.float32))
    out = gs.distributed.all_reduce((a, b, c), "sum", comm=COMM)
    assert type(out) is tuple and len(out) == 3
    check_equal(out[0], expected_sum([float(r + 1) for r in range(SIZE)], np.float64), "a")
    check_equal(out[1], np.sum([np.arange(4, dtype=np.int32) + r for r in range(SIZE)], axis=0,
                               dtype=np.int32), "b")
    check_equal(out[2], expected_sum([2.0 * r for r in range(SIZE)], np.float32), "c")
    assert gs.distributed.all_reduce([], comm=COMM) == []
    assert gs.distributed.all_reduce((), comm=COMM) == ()
    alone = gs.distributed.all_reduce(b, "max", comm=COMM)
    assert type(alone) is type(b) and alone is not b
    # a pending scalar is evaluated first (one op), then reduced
    pending = a * 2.0 + 1.0
    check_equal(gs.distributed.all_reduce(pending, comm=COMM),
                expected_sum([2.0 * (r + 1) + 1.0 for r in range(SIZE)], np.float64), "pending")


def expected_sum(values: list, dtype) -> np.ndarray:
    return np.asarray(np.sum(np.asarray(values, dtype=dtype)))


def test_counts() -> None:
    """One packed collective per dtype: pack (1 op), the collective and its read (1 sync), the
    results (1 op); then every result is known: reading them costs nothing."""
    scalars = [gs.asscalar(float(RANK + i), like=XP.zeros(())) for i in range(8)]
    grad = XP.asarray(np.full(5, float(RANK)))
    for scalar in scalars:  # materialized already
        assert scalar.is_materialized
    with gs.count_syncs(include_cupy=True) as counter:
        out = gs.distributed.all_reduce([*scalars, grad], "mean", comm=COMM)
    assert counter.count == 1, counter.report()
    assert [r.reason for r in counter.records] == ["all_reduce"]
    assert counter.device_ops == 2, counter.report()
    with gs.count_syncs(include_cupy=True) as counter:
        floats = [float(s) for s in out[:8]]
        total = gs.read(*out[:8])
    assert counter.count == 0 and counter.device_ops == 0, counter.report()
    mean_rank = (SIZE - 1) / 2
    assert floats == [mean_rank + i for i in range(8)] == list(total)
    # GPUScalars alone, two dtypes: two non-blocking collectives, no sync; the results are
    # pending until used, and one read of both waits for them: one sync
    rank = gs.asscalar(RANK, like=XP.zeros((), np.int64))
    with gs.count_syncs(include_cupy=True) as counter:
        pair = gs.distributed.all_reduce([scalars[0], rank], comm=COMM)
    assert counter.count == 0 and counter.device_ops == 1, counter.report()
    assert not any(s.is_materialized for s in pair)
    assert pair[0].dtype == np.float64 and pair[1].dtype == np.int64
    with gs.count_syncs(include_cupy=True) as counter:
        values = gs.read(*pair)
    assert counter.count == 1, counter.report()
    assert values == (sum(range(SIZE)) * 1.0, sum(range(SIZE)))
    # a pending result under the guard: the call sends (no sync), the read is refused, and a
    # read outside the guard then waits as usual
    with gs.sync_guard("error"):
        pending = gs.distributed.all_reduce(scalars[1], "max", comm=COMM)
        try:
            float(pending)
        except gs.SyncError:
            pass
        else:
            raise AssertionError("no SyncError for the read under sync_guard('error')")
    assert float(pending) == SIZE  # max over ranks of RANK + 1
    # with an array among the values the collective runs in its sync: the guard refuses it
    # before anything is sent (on every rank alike)
    with gs.sync_guard("error"):
        try:
            gs.distributed.all_reduce([scalars[0], grad], comm=COMM)
        except gs.SyncError as error:
            assert "all_reduce" in str(error)
        else:
            raise AssertionError("no SyncError under sync_guard('error')")
    # no rank has sent anything: the next collective pairs up as usual
    check_equal(gs.distributed.all_reduce(scalars[0], "min", comm=COMM),
                np.asarray(0.0), "after the refusal")


def expect(error: type, words: str, call) -> None:
    try:
        call()
    except error as raised:
        assert words in str(raised), (words, str(raised))
    else:
        raise AssertionError(f"no {error.__name__} ({words})")


def test_errors() -> None:
    s = gs.asscalar(1.0, like=XP.zeros(()))
    all_reduce = gs.distributed.all_reduce
    expect(TypeError, "mpi4py MPI.Comm", lambda: all_reduce(s, comm=object()))
    expect(TypeError, "comm= is None", lambda: all_reduce(s, comm=None))
    expect(ValueError, "unknown op 'avg'", lambda: all_reduce(s, "avg", comm=COMM))
    expect(TypeError, "op= is", lambda: all_reduce(s, MPI.SUM, comm=COMM))
    expect(TypeError, "values[1] is 2.0", lambda: all_reduce([s, 2.0], comm=COMM))
    expect(TypeError, "values is 'x'", lambda: all_reduce("x", comm=COMM))
    expect(TypeError, "not ordered", lambda: all_reduce(
        gs.asscalar(1j, like=XP.zeros(())), "max", comm=COMM))
    expect(TypeError, "values[1] is on numpy", lambda: all_reduce(
        [s, np.zeros(2)], comm=COMM)) if XP is not np else None
    if XP is not np:
        with strict.device(1):
            other = XP.zeros(())
        expect(ValueError, "device 1", lambda: all_reduce([s, other], comm=COMM))

    def in_loop() -> None:
        gs.while_loop(lambda i: i < 2, lambda i: all_reduce(i, comm=COMM) + 1,
                      XP.zeros(()), max_iter=4)

    expect(RuntimeError, "NCCL collectives are not supported inside CUDA conditional",
           in_loop)

    def in_branch() -> None:
        def branch(x) -> None:
            x[...] = all_reduce(x, comm=COMM)

        gs.cond(s > 0, branch, None, XP.zeros(()))

    expect(RuntimeError, "gs.while_loop/gs.cond body or a gs.capture step", in_branch)

    def in_capture() -> None:
        gs.capture(lambda x: all_reduce(x, comm=COMM), XP.zeros(()), warmup=1)

    expect(RuntimeError, "an MPI collective is a host call", in_capture)


if __name__ == "__main__":
    for name, test in list(globals().items()):
        if name.startswith("test_") and callable(test):
            test()
            COMM.Barrier()
    print(f"ok {RANK}", flush=True)
