"""The main job (`gpuscalar demo`) and the command dispatcher."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import __main__ as cli
from gpuscalar import strict
from gpuscalar.devices import NUMPY
from gpuscalar.tools import demo


@pytest.mark.parametrize("backend", [NUMPY, strict.STRICT], ids=["numpy", "strict"])
def test_demo_paths_agree_and_gpuscalar_reads_only_what_it_prints(backend):
    results = demo.run(backend, steps=33, repeats=3)
    assert results["float"]["syncs"] == 33  # one float(loss) per step
    # The best loss is read once; that read brings back every loss it was built from (the
    # float path read each of them), and the mean is built from the same losses and Python
    # numbers: it is answered on the host (known values never sync twice). Past the expression
    # size bound (64 nodes: the 200-step demo) the mean needs a read of its own.
    assert results["gpuscalar"]["syncs"] == 1
    assert results["gpuscalar + capture"]["syncs"] == 2
    assert results["max_weight_difference"] == 0.0
    for name in demo.PATHS:
        assert results[name]["max_weight_difference"] == 0.0
        assert results[name]["best"] == results["float"]["best"]
        assert np.isclose(results[name]["mean"], results["float"]["mean"], rtol=1e-12)
        times = results[name]["times"]
        assert len(times) == 3 and results[name]["seconds"] == sorted(times)[1]  # the median


def test_demo_counts_launches_as_a_gpu_sees_them():
    """Counted on the strict device: the gpuscalar path launches as many ops per step as the
    float path, its loss log's record included, and the captured path's 3 chunks of 10 steps
    are one launch each (the 3 leftover steps, the warm-up step and the set-up run eagerly)."""
    results = demo.run(NUMPY, steps=33, repeats=1)
    float_ops = results["float"]["device_ops"]
    eager_step_ops = 8  # x @ w, - y, square, mean, x.T @ r, scale, lr * grad, w -=
    inputs_ops = 3  # x, y uploaded, w made
    assert float_ops == inputs_ops + 33 * eager_step_ops
    # per step 7 launches: the same first 6, then `lr * grad` and `w -=` as one fused SGD
    # kernel (the scalar work is fused into them), and the loss log's record (one launch; the
    # progress bar's polls launch nothing on the strict device); plus the log's ring made
    # before the loop and the one evaluation read at the end (best; the mean is computed on
    # the host from the losses that read brought back). The learning rate is a Python number,
    # as in the float path: no step counter on the device.
    log_ops = 33 + 1
    assert results["gpuscalar"]["device_ops"] == (
        inputs_ops + 33 * (eager_step_ops - 1) + log_ops + 1)
    assert results["gpuscalar"]["device_ops"] == float_ops + 2
    captured = results["gpuscalar + capture"]["device_ops"]
    # gs.GPUScalar(a) copies a: each step run eagerly (3 leftover, 1 warm-up) copies its
    # counter, and the two state arrays read at the end are copied: 6 device ops of their own
    assert captured < float_ops / 4 + 6
    with gs.count_syncs() as counter:
        demo.capture_path(strict.xp, 30)
    assert counter.count == 2


def test_capture_path_uses_one_graph_of_ten_steps_per_replay(monkeypatch):
    made = []
    real_capture = gs.capture

    def spy(fn, *args, **kwargs):
        made.append(kwargs)
        return real_capture(fn, *args, **kwargs)

    monkeypatch.setattr(gs, "capture", spy)
    demo.capture_path(NUMPY.xp, 25)
    assert made == [{"warmup": 1, "steps": demo.CHUNK}]


def test_demo_warms_up_every_path_before_timing(monkeypatch):
    calls: list[str] = []
    timed: list[bool] = []

    def recorder(name, original):
        def path(xp, steps):
            calls.append(name)
            return original(xp, steps)
        return path

    monkeypatch.setattr(demo, "PATHS", {n: recorder(n, p) for n, p in demo.PATHS.items()})
    real_timed = demo._timed
    monkeypatch.setattr(demo, "_timed", lambda *a: timed.append(True) or real_timed(*a))
    demo.run(NUMPY, steps=3, repeats=2)
    names = list(demo.PATHS)
    # a counted run of each, then one warm-up of each, then the timed runs of each
    assert calls == names + names + [n for n in names for _ in range(2)]
    assert len(timed) == 3 * 2


def test_the_gpuscalar_path_logs_its_loss_and_its_warm_up_run_draws_the_bar():
    """Only the warm-up run of the gpuscalar path draws on ``show`` (the counted and timed runs
    draw nowhere): one line there, not a terminal, with the last step's loss as the log brought
    it back (at once on NumPy: lag 0). The counted run had the bar and the log on: 1 sync."""
    shown = io.StringIO()
    results = demo.run(NUMPY, steps=33, repeats=2, show=shown)
    assert results["gpuscalar"]["syncs"] == 1
    lines = shown.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuscalar: 33/33 [100%, ")
    _, best, _ = demo.float_path(NUMPY.xp, 33)
    loss = re.search(r"loss=([\d.e+-]+), step=32, lag=0$", lines[0])
    assert loss and float(loss.group(1)) == pytest.approx(best, rel=1e-3)  # decreasing: the last


def test_the_gpuscalar_path_records_every_step_into_a_metric_log(monkeypatch):
    made = []

    class Log(gs.MetricLog):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(gs, "MetricLog", Log)
    with gs.count_syncs() as counter:
        demo.gpuscalar_path(strict.xp, 20)
    assert counter.count == 1 and len(made) == 1
    assert made[0].capacity == demo.LOG_CAPACITY and made[0].delivered == 20  # all seen
    assert made[0].dropped == 0 and made[0].latest["step"] == 19


def test_demo_rejects_a_bad_repeat_count():
    with pytest.raises(ValueError, match="repeats"):
        demo.run(NUMPY, steps=3, repeats=0)
    # a device value is named, not read (formatting it would be a SyncError under the guard)
    with gs.sync_guard("error"), pytest.raises(
            ValueError, match="repeats must be a positive int, got a GPUScalar of dtype int64"):
        demo.run(NUMPY, steps=3, repeats=gs.asscalar(2))


def _table(out: str) -> dict[str, tuple[int, int]]:
    """path -> (syncs, device ops) from the demo's printed table."""
    rows = re.findall(r"^  (float|gpuscalar(?: \+ capture)?) +(\d+) +(\d+) +[\d.]+ +best loss",
                      out, flags=re.MULTILINE)
    return {name: (int(syncs), int(ops)) for name, syncs, ops in rows}


def test_demo_cli_prints_the_table(capsys):
    assert cli.main(["demo", "--steps", "12"]) == 0
    out = capsys.readouterr().out
    table = _table(out)
    assert {name: syncs for name, (syncs, _) in table.items()} == {
        "float": 12, "gpuscalar": 1, "gpuscalar + capture": 2}  # (see the test above)
    # a launch a step for the loss log: 2 more than the float path (the ring, the read at the
    # end)
    assert table["gpuscalar"][1] == table["float"][1] + 2
    text = " ".join(out.split())
    assert "median of 5 runs of each path after one untimed warm-up run" in text
    assert "gpuscalar path: 1 sync with a progress bar and a per-step loss log on" in text
    if not gs.gpu_available():  # the output says what CPU times mean, before the table
        assert out.index("No GPU: times are CPU times") < out.index("syncs  device ops")


def test_demo_draws_its_progress_bar_on_stderr_unless_quiet(capsys):
    assert cli.main(["demo", "--steps", "12", "--repeats", "1"]) == 0
    out, err = capsys.readouterr()
    assert re.fullmatch(r"gpuscalar: 12/12 \[100%, .*\] loss=[\d.]+, step=11, lag=0\n", err)
    assert "gpuscalar: 12/12" not in out  # the table's stdout stays what the README shows
    assert cli.main(["demo", "--steps", "12", "--repeats", "1", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "with a progress bar and a per-step loss log on" in " ".join(out.split())


def test_demo_runs_on_the_strict_device(capsys):
    assert cli.main(["demo", "--steps", "5", "--repeats", "1", "--backend", "strict"]) == 0
    out = capsys.readouterr().out
    assert "strict device" in out and "time: 1 run of each path" in " ".join(out.split())


def test_demo_rejects_bad_arguments(capsys):
    rejected = [["demo", "--steps", "0"], ["demo", "--repeats", "0"]]
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
    assert "--steps must be at least 1" in err and "must be at least 1, got 0" in err
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
    assert "largest difference from the float path's = 0.00e+00 (bit-identical)" in result.stdout
