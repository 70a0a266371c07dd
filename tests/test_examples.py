"""The examples run as a user would run them (a subprocess), and their printed claims hold."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_logistic_regression_syncs_only_to_log_and_learns():
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "logistic_regression.py")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+loss\s+(\S+)$", out, re.MULTILINE)]
    logged = int(re.search(r"^logged values: (\d+)$", out, re.MULTILINE).group(1))
    syncs = int(re.search(r"^syncs: (\d+)$", out, re.MULTILINE).group(1))
    assert len(losses) == logged == 20  # 200 steps, one loss every 10
    assert syncs == logged, "every sync should be a logged loss, and nothing else"
    assert losses[0] == 0.6931  # log(2): zero weights predict 1/2 everywhere
    assert losses[-1] < 0.5 * losses[0]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), "loss falls every log"


def _run_example(name: str) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _loop_lines(out: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(iterations, syncs) of the while_loop run and of the host-checked run."""
    found = [tuple(int(v) for v in m) for m in
             re.findall(r"^(?:while_loop|host checks): iterations (\d+), syncs (\d+)$", out,
                        re.MULTILINE)]
    assert len(found) == 2, out
    return found[0], found[1]


def test_cg_decides_on_the_device_with_zero_syncs_and_the_same_iterates():
    out = _run_example("cg.py")
    (n, syncs), (n_plain, syncs_plain) = _loop_lines(out)
    assert syncs == 0 and n == n_plain > 5
    assert syncs_plain == n_plain + 1  # one check per iteration, and the last one that stops
    assert "same iterates: True" in out
    assert float(re.search(r"^residual: (\S+)$", out, re.MULTILINE).group(1)) < 1e-8


def test_kmeans_stops_when_labels_stop_changing_with_zero_syncs():
    out = _run_example("kmeans.py")
    (n, syncs), (n_plain, syncs_plain) = _loop_lines(out)
    assert syncs == 0 and n == n_plain > 1 and syncs_plain == n_plain + 1
    assert "same labels and centers: True" in out


def test_krylov_solvers_each_solve_with_zero_syncs_and_converge():
    out = _run_example("krylov_solvers.py")
    found = re.findall(r"^(\w+): iterations (\d+), info (-?\d+), syncs (\d+), residual (\S+)$",
                       out, re.MULTILINE)
    assert [f[0] for f in found] == ["cg", "cgs", "bicgstab", "gmres", "minres"], out
    for name, iterations, info, syncs, residual in found:
        assert int(syncs) == 0 and int(info) == 0 and int(iterations) > 5, name
        # minres's test is ||r|| <= rtol ||A|| ||x|| (here ||A|| ~ 4, ||x|| ~ 10^2 ||b||)
        assert float(residual) < (1e-8 if name != "minres" else 1e-5), name
