"""Workloads: both paths give the same answer, the gpuscalar path reads only what it needs, and
bad parameters are rejected with a clear error."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar.tools.workloads import PATHS, SIZES, WORKLOADS, get_workload

NAMES = list(WORKLOADS)


def host(xp, value):
    """A test-side host copy of an answer value (floats, lists, device arrays)."""
    if isinstance(value, list) and value and not isinstance(value[0], (int, float)):
        return [host(xp, v) for v in value]
    if hasattr(value, "shape"):
        return xp.asnumpy(value) if hasattr(xp, "asnumpy") else np.asarray(value)
    return np.asarray(value, dtype=float)


def assert_same_answer(xp, a, b):
    assert a.keys() == b.keys()
    for key in a:
        left, right = host(xp, a[key]), host(xp, b[key])
        if isinstance(left, list):
            assert len(left) == len(right)
            for x, y in zip(left, right, strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12, err_msg=key)
        else:
            np.testing.assert_allclose(left, right, rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_every_path_gives_the_same_answer(xp, name):
    workload = WORKLOADS[name]
    params = workload.params("quick")
    inputs = workload.make_inputs(xp, params)
    float_answer = workload.run("float", xp, params, inputs)
    for path in PATHS[1:]:
        assert_same_answer(xp, float_answer, workload.run(path, xp, params, inputs))


@pytest.mark.parametrize("name", NAMES)
def test_the_capture_path_reads_what_the_gpuscalar_path_reads(name):
    """Replays are one device op each; the host reads the same values between them, except
    where the capture path is one `gs.while_loop`: there the device decides when to stop and
    the host reads only the answers it returns (none, or the iteration count)."""
    from gpuscalar.tools import benchmarks

    workload = WORKLOADS[name]
    params = workload.params("quick")
    gs_syncs, _, _ = benchmarks.count_path(workload, "gpuscalar", params)
    capture_syncs, capture_ops, _ = benchmarks.count_path(workload, "capture", params)
    if workload.loop_on_device:
        answer_reads = sum(isinstance(v, int) for v in workload.run(
            "capture", np, params).values())
        assert capture_syncs == answer_reads < gs_syncs
        assert capture_ops <= 10  # set-up and the loop itself, one device op
    else:
        assert capture_syncs == gs_syncs
    float_ops = benchmarks.count_path(workload, "float", params)[1]
    assert capture_ops < float_ops


@pytest.mark.parametrize("name", NAMES)
def test_paths_do_not_mutate_their_inputs(name):
    workload = WORKLOADS[name]
    params = workload.params("quick")
    inputs = workload.make_inputs(np, params)
    flat = {
        f"{key}{i}": array
        for key, value in inputs.items()
        for i, array in enumerate(value if isinstance(value, list) else [value])
    }
    before = {key: array.copy() for key, array in flat.items()}
    first = workload.run("gpuscalar", np, params, inputs)
    workload.run("float", np, params, inputs)
    workload.run("capture", np, params, inputs)
    for key, array in flat.items():
        np.testing.assert_array_equal(array, before[key], err_msg=key)
    assert_same_answer(np, first, workload.run("gpuscalar", np, params, inputs))


# Exact gpuscalar-path syncs for the quick size, each derived from what the host reads.
def _expected_gpuscalar_syncs(name, params, answer):
    if name in ("jacobi", "cg"):  # one check per check_every iterations until converged,
        checks = math.ceil(int(np.max(answer["iterations"])) / params["check_every"])
        return checks + (name == "cg")  # and cg's iteration count, read at the end
    return WORKLOADS[name].host_values_needed(params)


@pytest.mark.parametrize("name", NAMES)
def test_gpuscalar_path_syncs_only_for_host_values(name):
    workload = WORKLOADS[name]
    params = workload.params("quick")
    inputs = workload.make_inputs(np, params)
    with gs.count_syncs() as counter:
        answer = workload.run("gpuscalar", np, params, inputs)
    assert counter.count == _expected_gpuscalar_syncs(name, params, answer)
    assert counter.count <= workload.host_values_needed(params)


def test_lr_schedule_gpuscalar_path_never_syncs():
    workload = WORKLOADS["lr_schedule"]
    params = workload.params("quick")
    inputs = workload.make_inputs(np, params)
    with gs.sync_guard("error"):
        answer = workload.run("gpuscalar", np, params, inputs)
    rates = np.asarray(answer["lr"])
    assert rates.shape == (params["steps"],)
    assert rates[params["warmup"] - 1] == pytest.approx(params["base_lr"])  # end of warm-up
    assert rates[-1] == pytest.approx(params["min_lr"])  # end of the cosine


def test_clipping_engages_in_clip_adam():
    workload = WORKLOADS["clip_adam"]
    clipped = workload.run("gpuscalar", np, workload.params("quick"))
    unclipped = workload.run("gpuscalar", np, workload.params("quick", max_norm=1e9))
    assert not np.allclose(clipped["params"][0], unclipped["params"][0])


def test_jacobi_solves_the_systems_and_converges_at_different_iterations():
    workload = WORKLOADS["jacobi"]
    params = workload.params("quick")
    inputs = workload.make_inputs(np, params)
    answer = workload.run("gpuscalar", np, params, inputs)
    x = np.asarray(answer["x"])
    residual = np.linalg.norm(inputs["b"] - np.einsum("pij,pj->pi", inputs["A"], x), axis=1)
    assert (residual < params["tol"]).all()
    iterations = np.asarray(answer["iterations"])
    assert len(set(iterations.tolist())) > 1
    assert iterations.max() < params["max_iter"]


def test_broadcast_ad_fits_the_model():
    workload = WORKLOADS["broadcast_ad"]
    answer = workload.run("float", np, workload.params("quick", steps=400))
    assert answer["a"] == pytest.approx(1.5, abs=0.05)  # target = 1.5 x - 0.5 + column offset


def test_registry_entries_are_complete():
    for name, workload in WORKLOADS.items():
        assert workload.name == name
        assert workload.description and workload.host_values_reason
        assert set(workload.sizes) == set(SIZES)
        for size in SIZES:
            assert workload.host_values_needed(workload.params(size)) >= 0
        assert {workload.path(p) for p in PATHS} == {
            workload.float_path,
            workload.gpuscalar_path,
            workload.capture_path,
        }


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="unknown workload 'nope'; expected one of train_logging"):
        get_workload("nope")
    workload = WORKLOADS["train_logging"]
    with pytest.raises(ValueError, match="unknown workload path 'fast'"):
        workload.path("fast")
    with pytest.raises(ValueError, match="unknown size 'huge'"):
        workload.params("huge")
    with pytest.raises(TypeError, match=r"unknown parameter\(s\) \['batch'\]"):
        workload.params("quick", batch=3)


@pytest.mark.parametrize(
    ("name", "override", "message"),
    [
        ("train_logging", {"steps": 0}, "'steps' must be a positive int, got 0"),
        ("train_logging", {"log_every": 2.5}, "'log_every' must be a positive int, got 2.5"),
        ("clip_adam", {"max_norm": 0.0}, "'max_norm' must be a number > 0, got 0.0"),
        ("clip_adam", {"shapes": ()}, "'shapes' must name at least one"),
        ("broadcast_ad", {"rows": -1}, "'rows' must be a positive int"),
        ("jacobi", {"tol": 0.0}, "'tol' must be a number > 0"),
        ("jacobi", {"tol": "1e-8"}, "'tol' must be a number > 0, got '1e-8'"),
        ("jacobi", {"check_every": 0}, "'check_every' must be a positive int"),
        ("lr_schedule", {"warmup": 100}, r"'warmup' \(100\) must be smaller than 'steps' \(100\)"),
    ],
)
def test_bad_parameters_are_rejected(name, override, message):
    with pytest.raises(ValueError, match=message):
        WORKLOADS[name].params("quick", **override)


@pytest.mark.parametrize(
    ("name", "override", "message"),
    [
        ("train_logging", {"steps": 3}, "'steps' must be a positive int, got a GPUScalar of "
         "dtype int64"),
        ("jacobi", {"tol": 1e-8}, "'tol' must be a number > 0, got a GPUScalar of dtype float64"),
        ("clip_adam", {"max_norm": 1.0}, "'max_norm' must be a number > 0, got a GPUScalar"),
    ],
)
def test_a_device_parameter_is_named_without_a_sync(name, override, message):
    """A GPUScalar where a host number belongs: the error names it by type and dtype (showing
    or comparing its value would read it from the device, a SyncError under the guard)."""
    ((key, value),) = override.items()
    with gs.sync_guard("error"), pytest.raises(ValueError, match=message):
        WORKLOADS[name].params("quick", **{key: gs.asscalar(value)})
