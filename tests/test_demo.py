"""The main job (`gpuscalar demo`) and the command dispatcher."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import gpuscalar as gs
from gpuscalar import __main__ as cli
from gpuscalar import demo
from gpuscalar.backend import NUMPY


def test_demo_paths_agree_and_gpuscalar_reads_only_what_it_prints():
    results = demo.run(NUMPY, steps=30)
    assert results["float"]["syncs"] == 30  # one float(loss) per step
    assert results["gpuscalar"]["syncs"] == 2  # the two printed values
    assert results["max_weight_difference"] == 0.0
    assert np.isclose(results["float"]["best"], results["gpuscalar"]["best"])


def test_demo_cli_prints_the_table(capsys):
    assert cli.main(["demo", "--steps", "12"]) == 0
    out = capsys.readouterr().out
    assert "float" in out and "gpuscalar" in out
    rows = [line.split() for line in out.splitlines()]
    rows = [r for r in rows if len(r) == 3 and r[0] in ("float", "gpuscalar") and r[1].isdigit()]
    assert [(r[0], int(r[1])) for r in rows] == [("float", 12), ("gpuscalar", 2)]


def test_demo_rejects_bad_arguments(capsys):
    rejected = [["demo", "--steps", "0"]]
    if not gs.gpu_available():  # on a GPU machine --backend cupy is a valid request
        rejected.append(["demo", "--backend", "cupy"])
    for argv in rejected:
        try:
            cli.main(argv)
        except SystemExit as exit_:
            assert exit_.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
    err = capsys.readouterr().err
    assert "--steps must be at least 1" in err
    assert ("CUDA device" in err) == (not gs.gpu_available())


def test_dispatcher_usage_and_unknown_command(capsys):
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_python_dash_m_runs_the_demo():
    result = subprocess.run([sys.executable, "-m", "gpuscalar", "demo", "--steps", "5"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "max |w_float - w_gpuscalar|" in result.stdout
