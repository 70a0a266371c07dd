"""gs.distributed.all_reduce under MPI: every case runs under ``mpiexec -n N`` from pytest.

Why subprocesses: a collective needs several processes, and MPI is initialized once per process
(never in pytest's own). Each case is a script in tests/distributed_cases/ (or the shipped
examples/data_parallel.py), started with the ``mpiexec`` of the venv (mpich's wheel, the test
extra) and bounded in time; it fails the test with its output when any rank fails. These run in
CI (.ci/run installs the test extra): with mpi4py installed they never skip, and a missing
``mpiexec`` is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict

from .cupy_fake import cupy_or_fail, refuse_on_a_gpu

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "distributed_cases"
#: seconds one mpiexec run may take (each takes well under 5 s on 2 cores)
TIMEOUT = 60


def _mpiexec() -> str:
    pytest.importorskip("mpi4py", reason="the test extra installs mpi4py and mpich")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("mpiexec", path=path)
    assert found, "mpi4py is installed but no mpiexec was found (pip install mpich)"
    return found


def run_ranks(ranks: int, script: Path, *args: str) -> str:
    """Run ``script`` on ``ranks`` MPI processes; its output (failing the test with it when a
    rank fails or the run takes more than `TIMEOUT` seconds)."""
    command = [_mpiexec(), "-n", str(ranks), sys.executable, str(script), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "GPUSCALAR_SYNC_GUARD": "allow"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT,
                              cwd=ROOT, env=env, check=False)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{' '.join(command)} ran over {TIMEOUT} s:\n{error.stdout}\n{error.stderr}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{output}"
    return done.stdout


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_the_contract_under_mpiexec(ranks, backend):
    """Each op, dtype and structure equals one process's reduction of every rank's values;
    one sync per call, results known after it; the errors (tests/distributed_cases)."""
    out = run_ranks(ranks, CASES / "contract.py", backend)
    assert sorted(re.findall(r"ok (\d+)", out)) == [str(r) for r in range(ranks)], out


@pytest.mark.needs_cupy
@pytest.mark.parametrize("ranks", [2, 3])
def test_over_cupy_memory_through_the_fake_device(ranks):
    """CuPy arrays over fake device memory, the recording seam, real MPI on their pointers:
    per call one stream wait before the collective, one read, one sync, no upload, the
    results equal one process's reduction (tests/distributed_cases/cupy_fake.py)."""
    cupy_or_fail()
    refuse_on_a_gpu()
    out = run_ranks(ranks, CASES / "cupy_fake.py")
    assert sorted(re.findall(r"ok (\d+)", out)) == [str(r) for r in range(ranks)], out


@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_the_data_parallel_example_on_two_ranks(backend):
    """The shipped example: weights equal one process on the full batch (rtol 1e-12) and the
    shard-ordered one to the last bit, and one sync per step against the baseline's 2 (NumPy:
    the float of the loss and the norm's read) or 3 (strict: the gradient's get too)."""
    out = run_ranks(2, ROOT / "examples" / "data_parallel.py", "--backend", backend,
                    "--steps", "12")
    line = next(text for text in out.splitlines() if text.startswith("SYNCS"))
    counts = dict(part.split("=") for part in line.split()[1:])
    assert counts == {"ours": "12", "baseline": str(12 * (2 if backend == "numpy" else 3)),
                      "steps": "12"}, out
    assert "to the last bit: True" in out


# ---- in pytest's own process: what needs no second rank (MPI is never initialized here) ----


@pytest.mark.parametrize("comm", [None, object(), 3, "world"])
def test_anything_but_a_communicator_is_a_type_error_naming_it(comm):
    with pytest.raises(TypeError, match="comm= is .*an mpi4py MPI.Comm, or a NCCL communicator"):
        gs.distributed.all_reduce(gs.asscalar(1.0), comm=comm)


def test_bad_ops_are_named_before_the_communicator_is_looked_at():
    with pytest.raises(ValueError, match="unknown op 'avg'.*'sum', 'mean'"):
        gs.distributed.all_reduce(np.zeros(2), "avg", comm=None)
    with pytest.raises(TypeError, match="op= is 1"):
        gs.distributed.all_reduce(np.zeros(2), 1, comm=None)


class _UncalledNccl:
    """NCCL's communicator calls, none of which may run (a refusal comes first)."""

    def allReduce(self, *args) -> None:  # noqa: N802 - NCCL's
        raise AssertionError("a refused collective reached the communicator")

    def size(self) -> int:
        return 2

    def device_id(self) -> int:
        return 0


@pytest.mark.parametrize("backend", ["numpy", "strict"])
def test_a_nccl_communicator_is_refused_by_the_host_devices(backend):
    """The host wing's collectives (NumPy, the strict device) have no NCCL: the error names
    the device before any check of the values or the communicator's device."""
    xp = np if backend == "numpy" else strict.xp
    with pytest.raises(TypeError, match=f"reduces CuPy arrays, not {backend} ones"):
        gs.distributed.all_reduce([gs.asscalar(xp.asarray(1.0)), xp.ones(2, np.int16)],
                                  "prod", comm=_UncalledNccl())


def test_a_device_without_collectives_is_named(monkeypatch):
    """A device of its own with no "collectives" executor: the error names it (NCCL's here;
    MPI's would initialize MPI in pytest's process)."""
    from gpuscalar import devices
    from gpuscalar.backend import Backend

    class PlantedArray(np.ndarray):
        pass

    class Planted(Backend):
        name = "planted"

        def owns(self, value):
            return type(value) is PlantedArray

    monkeypatch.setattr(devices, "BACKENDS", [Planted(), *devices.BACKENDS])
    with pytest.raises(TypeError, match="reduces CuPy arrays, not planted ones"):
        gs.distributed.all_reduce(np.ones(2).view(PlantedArray), comm=_UncalledNccl())


def test_result_dtypes_follow_numpy():
    from gpuscalar.distributed import buffer_dtype, result_dtype

    f32, i32, b = np.dtype(np.float32), np.dtype(np.int32), np.dtype(bool)
    assert result_dtype(f32, "mean") == f32 and result_dtype(i32, "mean") == np.float64
    assert result_dtype(i32, "sum") == i32 and result_dtype(b, "sum") == np.int64
    assert result_dtype(b, "max") == b and buffer_dtype(b, "max") == np.uint8
    assert buffer_dtype(i32, "mean") == np.int64
    assert strict.xp is not None


# ---- NCCL through the fake device: a recording communicator double --------------------------


class RecordingNccl:
    """Stands for ``cupy.cuda.nccl.NcclCommunicator`` of one rank among ``ranks``, whose other
    ranks hold the same values: records each ``allReduce`` and answers it on the fake device
    memory (sum: x * ranks, prod: x ** ranks, max/min: x). Reads nothing through the host."""

    def __init__(self, memory, ranks: int = 2, device: int = 0) -> None:
        self.memory, self.ranks, self.device = memory, ranks, device
        self.calls: list[tuple] = []

    def size(self) -> int:
        return self.ranks

    def device_id(self) -> int:
        return self.device

    def rank_id(self) -> int:
        return 0

    def allReduce(self, send, recv, count, datatype, op, stream) -> None:  # noqa: N802 - NCCL's
        from gpuscalar.distributed.nccl import NCCL_TYPES

        self.calls.append((send, recv, count, datatype, op, stream))
        dtype = {number: dtype for dtype, number in NCCL_TYPES.items()}[datatype]
        region = self.memory.region(send, count * dtype.itemsize)
        assert region is not None, "allReduce on memory the fake device never handed out"
        values = region.view(dtype)
        values[...] = {0: values * self.ranks, 1: values ** self.ranks}.get(op, values)


def _nccl_setup():
    cupy_or_fail()
    refuse_on_a_gpu()
    from .cupy_fake import FakeMemory
    from .cupy_seam import recording

    memory = FakeMemory()
    return memory, recording(memory)


@pytest.mark.needs_cupy
@pytest.mark.parametrize(("dtype", "op"), [
    (dtype, op) for dtype in ("float32", "float64", "int32", "complex128")
    for op in ("sum", "mean", "prod", "max")
    if not (dtype.startswith("complex") and op in ("prod", "max"))])  # (refused: see below)
def test_nccl_is_stream_ordered_packed_and_never_reads_the_host(dtype, op):
    from gpuscalar.devices import CUPY
    from gpuscalar.distributed.nccl import NCCL_OPS, NCCL_TYPES

    from .cupy_fake import host_view

    memory, seam_context = _nccl_setup()
    with seam_context as seam:
        x = np.asarray(3, dtype=dtype) + (1j if dtype.startswith("complex") else 0)
        grad_values = (np.arange(6) % 4 + 1).astype(dtype).reshape(2, 3)
        scalar = gs.GPUScalar(seam.array(x))
        grad = seam.array(grad_values)
        comm = RecordingNccl(memory)
        seam.clear()
        with gs.count_syncs(include_cupy=True) as counter:
            loss, g = gs.distributed.all_reduce([scalar, grad], op, comm=comm)
        assert counter.count == 0 and not seam.reads and not seam.uploads, counter.report()
        assert counter.device_ops == 3, counter.report()  # pack, the collective, unpack
        assert seam.stream_waits == 0
        (send, recv, count, datatype, nccl_op, stream), = comm.calls  # ONE collective
        assert send == recv and stream == seam.current_stream().ptr
        real = np.dtype(dtype) if not dtype.startswith("complex") else np.dtype(np.float64)
        buffer = np.dtype(np.int64) if op == "mean" and dtype == "int32" else real
        assert datatype == NCCL_TYPES[buffer] and nccl_op == NCCL_OPS[op]
        assert count == 7 * (2 if dtype.startswith("complex") else 1)
        assert isinstance(loss, gs.GPUScalar) and loss.backend is CUPY
        assert type(g) is type(grad) and g.shape == (2, 3)
        reduce = {"sum": lambda v: v * 2, "mean": lambda v: v * 2 / 2,
                  "prod": lambda v: v ** 2, "max": lambda v: v}[op]
        want_dtype = np.float64 if op == "mean" and dtype == "int32" else np.dtype(dtype)
        assert loss.dtype == want_dtype and g.dtype == want_dtype
        assert np.array_equal(host_view(g), reduce(grad_values).astype(want_dtype))
        with gs.count_syncs() as counter:
            value = loss.item()  # an ordinary read, later: one sync
        assert counter.count == 1 and value == reduce(x).astype(want_dtype)[()]


@pytest.mark.needs_cupy
def test_nccl_refusals_and_cupyx_backends():
    memory, seam_context = _nccl_setup()
    with seam_context as seam:
        comm = RecordingNccl(memory)
        z = seam.array(np.ones(2, np.complex64))
        with pytest.raises(TypeError, match="op='prod' of complex64 values on NCCL"):
            gs.distributed.all_reduce(z, "prod", comm=comm)
        with pytest.raises(TypeError, match="NCCL has no datatype for int16"):
            gs.distributed.all_reduce(seam.array(np.ones(2, np.int16)), comm=comm)
        with pytest.raises(ValueError, match="the NCCL communicator on device 1"):
            gs.distributed.all_reduce(seam.array(np.ones(2)), comm=RecordingNccl(memory, 2, 1))
        with pytest.raises(TypeError, match="reduces CuPy arrays, not numpy ones"):
            gs.distributed.all_reduce(np.ones(2), comm=comm)
        assert not comm.calls
        backend = type("NCCLBackend", (), {})()
        backend._comm = comm  # cupyx.distributed.NCCLBackend holds its NcclCommunicator so
        out = gs.distributed.all_reduce(seam.array(np.ones(2)), comm=backend)
        assert len(comm.calls) == 1 and out.shape == (2,)


@pytest.mark.needs_cupy
def test_a_nccl_collective_may_be_recorded_in_a_captured_step():
    """Allowed in `gs.capture` (NCCL is capturable), unlike loop and branch bodies: no sync, the
    collective enqueued on the stream being captured."""
    memory, seam_context = _nccl_setup()
    with seam_context as seam:
        comm = RecordingNccl(memory)
        g = seam.array(np.ones(3))
        streams = []

        def step(g):
            streams.append(seam.current_stream().ptr)
            gs.distributed.all_reduce(g, "mean", comm=comm)

        with gs.count_syncs(include_cupy=True) as counter:
            gs.capture(step, g, warmup=1)
        assert counter.count == 0 and not seam.reads and len(seam.graphs) == 1
        assert [call[5] for call in comm.calls] == streams and len(streams) == 2


class RecordingNccl4py:
    """Stands for nccl4py's ``nccl.core.Communicator`` of one rank among ``ranks`` whose other
    ranks hold the same values: ``allreduce(sendbuf, recvbuf, op, *, stream)`` on buffers (the
    CuPy array itself; nccl4py reads pointer, count and NCCL datatype from it), ``nranks``,
    ``rank`` and ``device`` as properties. Answers on the fake device memory."""

    def __init__(self, ranks: int = 2, device: int = 0) -> None:
        self.ranks, self._device = ranks, device
        self.calls: list[tuple] = []

    @property
    def nranks(self) -> int:
        return self.ranks

    @property
    def rank(self) -> int:
        return 0

    @property
    def device(self):
        from types import SimpleNamespace

        return SimpleNamespace(device_id=self._device)

    def allreduce(self, sendbuf, recvbuf, op, *, stream=None) -> None:
        from .cupy_fake import host_view

        assert sendbuf is recvbuf or sendbuf.data.ptr == recvbuf.data.ptr  # in place
        self.calls.append((sendbuf.data.ptr, np.dtype(sendbuf.dtype), sendbuf.size, op, stream))
        values = host_view(sendbuf)
        values[...] = {0: values * self.ranks, 1: values ** self.ranks}.get(op, values)


@pytest.mark.needs_cupy
@pytest.mark.parametrize(("dtype", "op"), [("float32", "sum"), ("float64", "mean"),
                                           ("int32", "max"), ("complex128", "sum")])
def test_nccl4py_communicators_reduce_buffers_on_the_stream_with_no_sync(dtype, op):
    """nccl4py's call takes buffers, not pointers: the packed buffer itself (complex as its
    real view), NCCL's op number, the current stream; one call, no sync, the same results."""
    from gpuscalar.distributed.nccl import NCCL_OPS

    from .cupy_fake import host_view

    memory, seam_context = _nccl_setup()
    with seam_context as seam:
        x = np.asarray(3, dtype=dtype) + (1j if dtype.startswith("complex") else 0)
        grad_values = (np.arange(6) % 4 + 1).astype(dtype).reshape(2, 3)
        scalar, grad = gs.GPUScalar(seam.array(x)), seam.array(grad_values)
        comm = RecordingNccl4py()
        seam.clear()
        with gs.count_syncs(include_cupy=True) as counter:
            loss, g = gs.distributed.all_reduce([scalar, grad], op, comm=comm)
        assert counter.count == 0 and not seam.reads and not seam.uploads, counter.report()
        (_, buffer_dtype, count, nccl_op, stream), = comm.calls
        real = np.dtype(dtype.lower().replace("complex128", "float64"))
        assert buffer_dtype == (np.dtype(np.int64) if op == "mean" and dtype == "int32"
                                else real)
        assert count == 7 * (2 if dtype.startswith("complex") else 1)
        assert nccl_op == NCCL_OPS[op] and stream == seam.current_stream().ptr
        reduce = {"sum": lambda v: v * 2, "mean": lambda v: v * 2 / 2, "max": lambda v: v}[op]
        assert np.array_equal(host_view(g), reduce(grad_values).astype(g.dtype))
        with gs.count_syncs() as counter:
            assert loss.item() == reduce(x).astype(loss.dtype)[()]
        assert counter.count == 1


def test_nccl4py_is_told_from_mpi4py_by_its_properties():
    from gpuscalar.distributed.nccl import is_nccl4py_communicator

    class MpiLike:  # mpi4py's Comm has a lowercase allreduce too
        def allreduce(self, sendobj, op=None):
            return sendobj

        def Get_size(self):  # noqa: N802 - mpi4py's
            return 1

    assert is_nccl4py_communicator(RecordingNccl4py())
    assert not is_nccl4py_communicator(MpiLike())
    with pytest.raises(TypeError, match="nccl4py's nccl.core.Communicator"):
        gs.distributed.all_reduce(np.ones(2), comm=MpiLike())


def _real_nccl4py():
    """nccl4py's own communicator of one rank on device 0, where nccl4py imports and a GPU is
    present (nccl4py is not a dependency: it is tested where it imports)."""
    if not gs.gpu_available():
        pytest.skip("nccl4py for real needs a CUDA device (the recording double runs in CI)")
    nccl = pytest.importorskip("nccl.core", reason="nccl4py is not installed")
    unique_id = nccl.get_unique_id()
    return nccl.Communicator.init(nranks=1, rank=0, unique_id=unique_id)


def test_a_real_nccl4py_communicator_reduces_with_no_sync():
    import cupy

    comm = _real_nccl4py()
    loss = gs.sum(cupy.arange(4.0)) * 0.5
    grad = cupy.arange(6, dtype=cupy.float32)
    with gs.count_syncs(include_cupy=True) as counter:
        total, g = gs.distributed.all_reduce([loss, grad], "sum", comm=comm)
    assert counter.count == 0, counter.report()
    assert float(total) == 3.0
    assert np.array_equal(cupy.asnumpy(g), np.arange(6, dtype=np.float32))


# ---- NCCL for real: one rank on a GPU (CI has none: skipped there) ---------------------------


def _one_rank_nccl():
    """CuPy's own NcclCommunicator of one rank on device 0, where a GPU and NCCL are present.
    (Two ranks would need two GPUs: NCCL refuses two ranks on one device.)"""
    if not gs.gpu_available():
        pytest.skip("NCCL for real needs a CUDA device (the recording double runs in CI)")
    try:
        from cupy.cuda import nccl
    except ImportError as error:
        pytest.skip(f"CuPy's NCCL binding is not available: {error}")
    if not getattr(nccl, "available", True):
        pytest.skip("CuPy was built without NCCL")
    return nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_a_real_nccl_communicator_reduces_scalars_and_arrays_with_no_sync(op):
    import cupy

    comm = _one_rank_nccl()
    loss = gs.sum(cupy.arange(4.0)) * 0.5  # a pending GPUScalar: 3.0
    grad = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    count = gs.GPUScalar(cupy.asarray(7, dtype=cupy.int32))
    with gs.count_syncs(include_cupy=True) as counter:
        total, g, n = gs.distributed.all_reduce([loss, grad, count], op, comm=comm)
    assert counter.count == 0, counter.report()
    assert isinstance(total, gs.GPUScalar) and isinstance(g, cupy.ndarray)
    assert g.dtype == np.float32 and g.shape == (2, 3)
    assert n.dtype == (np.float64 if op == "mean" else np.int32)
    assert gs.read(total, n) == (3.0, 7)  # one rank: each value is its own reduction
    assert np.array_equal(cupy.asnumpy(g), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_a_real_nccl_collective_is_recorded_into_a_captured_step():
    import cupy

    comm = _one_rank_nccl()
    g = cupy.ones(3)

    def step(g):
        g *= 2.0
        gs.distributed.all_reduce(g, "sum", comm=comm)

    captured = gs.capture(step, g, warmup=1)  # the warm-up: 2
    with gs.count_syncs(include_cupy=True) as counter:
        captured()
        captured()
    assert counter.count == 0
    assert cupy.asnumpy(g).tolist() == [8.0, 8.0, 8.0]
    captured.release()


@pytest.mark.needs_cupy
def test_the_nccl_latency_benchmark_runs_on_the_fake_device_with_no_sync():
    """bench/gpu_nccl.py's measurement, run over CuPy's dispatch on fake memory with the
    recording communicator: every loop runs, the collective makes no sync, and the captured
    loops replay their graphs (the figures themselves need a GPU)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "gpu_nccl", Path(__file__).resolve().parent.parent / "bench" / "gpu_nccl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cupy_or_fail()
    refuse_on_a_gpu()
    from .cupy_fake import fake_memory
    from .cupy_seam import recording

    with fake_memory() as memory, recording(memory) as seam:
        comm = RecordingNccl(memory, ranks=1)
        loss = seam.array(np.asarray(1.0))
        half, one = (gs.asscalar(v, like=loss) for v in (0.5, 1.0))  # (no upload in a step)
        result = bench.measure(loss, half, one, comm, steps=20, repeats=1)
        assert result["syncs_per_collective"] == 0 and result["steps"] == 20
        assert all(result[key] > 0 for key in ("eager_s_per_step", "captured_s_per_step",
                                                "captured_without_s_per_step"))
        assert seam.graph_launches == 2 * 2 * (20 // bench.CHUNK)  # two loops, 2 runs each
        assert "the collective in a graph" in bench.report(result)


def test_the_nccl_latency_benchmark_says_so_without_a_gpu(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    if gs.gpu_available():
        pytest.skip("a GPU is present: the benchmark measures")
    out = tmp_path / "nccl.json"
    script = Path(__file__).resolve().parent.parent / "bench" / "gpu_nccl.py"
    done = subprocess.run([sys.executable, str(script), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "nothing was measured" in done.stdout
    assert json.loads(out.read_text()) == {"measured": False, "reason": "no CUDA GPU"}
