"""The functional steps' fast checks (issue 22's host cost): taken when a step's arrays have a
layout `check_array` accepted before, equal to the general checks, and falling back to them,
which say what is wrong, in every other case (NumPy and the strict device here; CuPy's real
dispatch over fake memory in tests/test_optim_launch.py)."""

from __future__ import annotations

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import optim
from gpuscalar.optim import checks
from gpuscalar.optim.sgd import SGD_PLAIN

from .helpers import host


def _refuse(*args, **kwargs):
    raise AssertionError("the general checks ran")


@pytest.fixture
def fresh_layouts():
    """No layout learned yet (and none left behind for the next test)."""
    checks._LAYOUTS.clear()
    yield
    checks._LAYOUTS.clear()


def test_sgd_steps_plain_launch_routes_the_programs_scalars_in_order():
    """`sgd_step` routes ``lr`` then ``weight_decay`` by hand for its plain program."""
    assert SGD_PLAIN.scalars == ("lr", "weight_decay") and SGD_PLAIN.arrays == ("param", "grad")


def test_a_known_layout_skips_the_general_checks(xp, rng, fresh_layouts, monkeypatch):
    p = xp.asarray(rng.standard_normal((3, 4)))
    g = xp.asarray(rng.standard_normal((3, 4)))
    assert checks._placed(p, g) is None  # not learned yet: the general checks run
    placed = checks.step_arrays(p, g)
    assert checks._placed(p, g) == placed
    other = xp.asarray(rng.standard_normal((3, 4)))  # another array of the layout
    monkeypatch.setattr(checks, "check_array", _refuse)
    monkeypatch.setattr(checks, "check_like", _refuse)
    assert checks.step_arrays(other, g, exp_avg=p) == placed


def test_the_fast_checks_give_the_general_paths_results(xp, rng, fresh_layouts, monkeypatch):
    """Steps through the fast checks update the arrays bit for bit as the general ones do."""
    p0 = rng.standard_normal(40)
    grads = [xp.asarray(rng.standard_normal(40)) for _ in range(3)]
    lr = gs.asscalar(0.25, like=grads[0]) * 0.5  # pending: computed in the kernel
    results = []
    for fast in (False, True):
        p = xp.asarray(p0.copy())
        with monkeypatch.context() as patch:
            if not fast:
                patch.setattr(checks, "_placed", lambda *arrays: None)
            else:
                patch.setattr(checks, "check_array", _refuse)
            with gs.count_syncs() as counter:
                for g in grads:
                    optim.sgd_step(p, g, lr=lr, weight_decay=0.01)
        assert counter.count == 0 and counter.device_ops == len(grads)
        results.append(np.array(host(p), copy=True))
    np.testing.assert_array_equal(results[0], results[1])


def _bad_grads(xp, p):
    """Gradients the fast checks leave to the general ones, with the error each gets (None:
    accepted there)."""
    strided = xp.asarray(np.zeros(12))[::2]
    cases = [
        (xp.asarray(np.zeros(5)), ValueError, r"grad has shape \(5,\)"),
        (xp.asarray(np.zeros(6, np.float32)), TypeError, "grad has dtype float32"),
        ([0.0] * 6, TypeError, "grad must be a NumPy or CuPy array"),
        (np.zeros(6) if xp is not np else gs.strict.xp.zeros(6), TypeError, "grad is a"),
        (strided, None, None) if xp is np else (strided, ValueError, "must be C-contiguous"),
    ]
    return cases


def test_what_the_fast_checks_cannot_tell_the_general_ones_say(xp, rng, fresh_layouts):
    p = xp.asarray(rng.standard_normal(6))
    checks.step_arrays(p, xp.asarray(np.ones(6)))  # the layout is known from here on
    before = np.array(host(p), copy=True)
    for grad, error, match in _bad_grads(xp, p):
        assert checks._placed(p, grad) is None
        if error is None:
            assert checks.step_arrays(p, grad)[0] is checks.backend_of(p)
            continue
        with pytest.raises(error, match=match):
            optim.sgd_step(p, grad, lr=0.1)
    np.testing.assert_array_equal(host(p), before)


def test_a_read_only_param_is_still_refused(rng, fresh_layouts):
    p = rng.standard_normal(6)
    g = np.ones(6)
    checks.step_arrays(p, g)
    p.flags.writeable = False
    assert checks._placed(p, g) is None
    with pytest.raises(ValueError, match="param is read-only"):
        optim.sgd_step(p, g, lr=0.1)


def test_a_gradient_on_another_strict_device_is_still_refused(rng, fresh_layouts):
    xp = gs.strict.xp
    p = xp.asarray(rng.standard_normal(6))
    checks.step_arrays(p, xp.asarray(np.ones(6)))
    with gs.strict.device(1):
        g = xp.asarray(np.ones(6))
    assert checks._placed(p, g) is None
    with pytest.raises(ValueError, match="grad is on device 1 but param is on 0"):
        optim.sgd_step(p, g, lr=0.1)


def test_a_registered_backend_forgets_the_layouts(rng, fresh_layouts, monkeypatch):
    """An array type's backend is decided in the registry's order: a new entry may change it,
    so the layouts learned before are not trusted."""
    p, g = rng.standard_normal(6), np.ones(6)
    checks.step_arrays(p, g)
    monkeypatch.setattr(checks, "BACKENDS", [*checks.BACKENDS, object()])
    assert checks._placed(p, g) is None
    checks.step_arrays(p, g)  # learned again under the new registry
    assert checks._placed(p, g) is not None


def test_hyperparameter_numbers_keep_their_checks():
    numpy = gs.get_backend("numpy")
    assert checks.hyper(-0.0, "lr", numpy, "cpu") == 0.0
    for bad, error in [(float("nan"), ValueError), (-1e-9, ValueError), (True, TypeError)]:
        with pytest.raises(error, match="lr must be"):
            checks.hyper(bad, "lr", numpy, "cpu")
    with pytest.raises(ValueError, match=r"beta must be in \[0.0, 1.0\)"):
        checks.hyper(1.0, "beta", numpy, "cpu", high=1.0, high_open=True)


def test_sgd_steps_float_fast_path_is_the_general_steps_result(xp, rng, monkeypatch):
    """``sgd_step(w, g, lr=<float>)`` (the plain step with Python floats) skips the general
    hyperparameter checks, with the same weights, bit for bit, and the same one device op as
    the general path (reached here with NumPy numbers, which the fast path leaves alone)."""
    w0 = rng.standard_normal((5, 3))
    g = xp.asarray(rng.standard_normal((5, 3)))
    fast, general = xp.asarray(w0), xp.asarray(w0)
    with gs.count_syncs() as counter:
        assert optim.sgd_step(general, g, lr=np.float64(0.05),
                              weight_decay=np.float64(0.01)) is None
    assert counter.count == 0 and counter.device_ops == 1
    with monkeypatch.context() as patch:
        patch.setattr("gpuscalar.optim.sgd.hyper", _refuse)
        with gs.count_syncs() as counter:
            assert optim.sgd_step(fast, g, lr=0.05, weight_decay=0.01) is None
    assert counter.count == 0 and counter.device_ops == 1
    assert host(fast).tobytes() == host(general).tobytes()


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"lr": float("nan")}, ValueError, "lr must be >= 0.0"),
    ({"lr": -0.1}, ValueError, "lr must be >= 0.0"),
    ({"lr": 0.1, "weight_decay": float("nan")}, ValueError, "weight_decay must be"),
    ({"lr": 0.1, "dampening": -1.0}, ValueError, "dampening must be"),
    ({"lr": 0.1, "nesterov": True}, ValueError, "nesterov momentum needs momentum > 0"),
    ({"lr": 0.1, "nesterov": 1}, TypeError, "nesterov must be a bool"),
])
def test_what_sgd_steps_fast_path_cannot_take_the_general_path_refuses(xp, rng, kwargs, error,
                                                                        match):
    w = xp.asarray(rng.standard_normal(4))
    before = host(w).tobytes()
    with pytest.raises(error, match=match):
        optim.sgd_step(w, xp.asarray(rng.standard_normal(4)), **kwargs)
    assert host(w).tobytes() == before  # nothing written
