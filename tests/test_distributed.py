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
    with pytest.raises(TypeError, match="comm= is .*mpi4py MPI.Comm"):
        gs.distributed.all_reduce(gs.asscalar(1.0), comm=comm)


def test_a_cupy_nccl_communicator_is_recognised_and_not_yet_supported():
    nccl_like = type("NcclCommunicator", (), {"__module__": "cupy.cuda.nccl"})()
    with pytest.raises(NotImplementedError, match="cupy.cuda.nccl.NcclCommunicator"):
        gs.distributed.all_reduce(gs.asscalar(1.0), comm=nccl_like)


def test_bad_ops_are_named_before_the_communicator_is_looked_at():
    with pytest.raises(ValueError, match="unknown op 'avg'.*'sum', 'mean'"):
        gs.distributed.all_reduce(np.zeros(2), "avg", comm=None)
    with pytest.raises(TypeError, match="op= is 1"):
        gs.distributed.all_reduce(np.zeros(2), 1, comm=None)


def test_result_dtypes_follow_numpy():
    from gpuscalar.distributed import buffer_dtype, result_dtype

    f32, i32, b = np.dtype(np.float32), np.dtype(np.int32), np.dtype(bool)
    assert result_dtype(f32, "mean") == f32 and result_dtype(i32, "mean") == np.float64
    assert result_dtype(i32, "sum") == i32 and result_dtype(b, "sum") == np.int64
    assert result_dtype(b, "max") == b and buffer_dtype(b, "max") == np.uint8
    assert buffer_dtype(i32, "mean") == np.int64
    assert strict.xp is not None
