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
