"""gs.while_loop and gs.cond on NumPy and the strict device (the host executor): the contract.

Results and iteration counts equal a plain host loop's, ``max_iter`` bounds the loop, the
predicate reads are not syncs, the whole loop or branch is one device op, bodies follow
gs.capture's rules (a sync is a SyncError naming the line, a host-to-device copy is refused), a
pending GPUScalar made outside is a recipe evaluated afresh every iteration and never cached,
and every bad input is an error saying what was wrong.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import gpuscalar as gs
from bench import gpu_control

from .helpers import backend_name, host

ROOT = Path(__file__).resolve().parent.parent


def adds(value):
    """A body or branch adding ``value`` to its first argument, in place."""

    def body(x, *rest):
        x += value

    return body


def scales(value):
    """A body multiplying its first argument by ``value``, in place."""

    def body(x, *rest):
        x *= value

    return body


def _halving(xp, start=100.0):
    x = xp.full((), start)
    return x, (lambda x: gs.GPUScalar(x) > 1.0), (scales(0.5))


def _plain_halving(start=100.0):
    x, n = start, 0
    while x > 1.0:
        x *= 0.5
        n += 1
    return x, n


def test_a_loop_equals_the_plain_host_loop_and_returns_its_count(xp):
    x, cond, body = _halving(xp)
    n = gs.while_loop(cond, body, x, max_iter=1000)
    expected_x, expected_n = _plain_halving()
    assert isinstance(n, gs.GPUScalar) and n.dtype == np.int64
    assert n.backend is gs.GPUScalar(x).backend
    assert host(n) == expected_n and host(x).item() == expected_x


def test_a_loop_is_one_device_op_and_no_sync(xp):
    x, cond, body = _halving(xp)
    with gs.count_syncs() as counter:
        n = gs.while_loop(cond, body, x, max_iter=1000)
    assert counter.count == 0 and counter.device_ops == 1
    assert host(n) == _plain_halving()[1]


@pytest.mark.parametrize("max_iter", [0, 1, 3])
def test_max_iter_bounds_the_loop(xp, max_iter):
    x, cond, _ = _halving(xp)
    calls = []

    def body(x):
        calls.append(1)
        x *= 0.5

    n = gs.while_loop(cond, body, x, max_iter=max_iter)
    assert host(n) == max_iter
    assert host(x).item() == 100.0 * 0.5**max_iter
    # the body runs in Python at least once: recorded once on a GPU; on the CPU once per
    # iteration, or once only to be checked when the loop runs zero times (undone: x above)
    assert len(calls) == (1 if backend_name(xp) == "cupy" else max(max_iter, 1))


def test_a_false_predicate_runs_no_iteration(xp):
    x = xp.zeros(())
    n = gs.while_loop(lambda x: gs.GPUScalar(x) > 1.0, adds(1), x,
                      max_iter=10)
    assert host(n) == 0 and host(x).item() == 0.0


def test_a_zero_d_bool_array_is_a_predicate(xp):
    x = xp.zeros(())
    n = gs.while_loop(lambda x: x < 4, adds(1), x, max_iter=10)
    assert host(n) == 4 and host(x).item() == 4.0


def test_a_sync_in_a_body_is_a_sync_error_naming_the_line(xp):
    x = xp.full((), 3.0)

    def body(x):
        if float(gs.GPUScalar(x)) > 0:  # the line named
            x -= 1

    line = inspect.getsourcelines(body)[1] + 1
    with pytest.raises(gs.SyncError, match=rf"test_control.py:{line}"):
        gs.while_loop(lambda x: gs.GPUScalar(x) > 0, body, x, max_iter=10)


def test_a_sync_in_cond_is_a_sync_error(xp):
    x = xp.full((), 3.0)
    with pytest.raises(gs.SyncError):
        gs.while_loop(lambda x: gs.asscalar(bool(gs.GPUScalar(x) > 0), like=x), lambda x: None,
                      x, max_iter=10)


def test_a_host_to_device_copy_in_a_body_is_refused_on_the_strict_device():
    xp = gs.strict.xp
    x = xp.zeros(3)

    def body(x):
        x += xp.asarray(np.ones(3))  # an upload, which a recorded graph cannot replay

    with pytest.raises(RuntimeError, match="H2D"):
        gs.while_loop(lambda x: gs.sum(x) < 2, body, x, max_iter=5)


def test_a_pending_scalar_made_outside_is_evaluated_afresh_and_stays_pending(xp):
    a, total = xp.zeros(()), xp.zeros(())
    twice = gs.GPUScalar(a) * 2.0 + 1.0  # a recipe over a's value now (GPUScalar(a) copies)
    assert not twice.is_materialized

    def body(a, total):
        total += twice  # evaluated in each iteration, from its inputs: always 1.0
        a += 1.0

    n = gs.while_loop(lambda a, total: gs.GPUScalar(a) < 5, body, a, total, max_iter=100)
    assert host(n) == 5
    assert host(total).item() == 5 * 1.0  # the writes to a never changed the value taken
    assert not twice.is_materialized  # nothing evaluated inside was cached on it
    assert host(twice) == 1.0


def test_a_pending_predicate_is_not_cached_either(xp):
    a = xp.zeros(())
    below = gs.GPUScalar(a) < 3  # made outside: a's value then (0 < 3), every iteration
    n = gs.while_loop(lambda a: below, adds(1), a, max_iter=10)
    assert host(n) == 10 and not below.is_materialized
    assert host(a).item() == 10.0


def test_loops_and_conds_nest_as_one_device_op(xp):
    i, j, total = xp.zeros(()), xp.zeros(()), xp.zeros(())

    def inner(j, total, i):
        gs.cond(gs.GPUScalar(j) < gs.GPUScalar(i), adds(1), None, total)
        j += 1

    def outer(i, j, total):
        j[...] = 0
        gs.while_loop(lambda j, t, i: gs.GPUScalar(j) < 4, inner, j, total, i, max_iter=10)
        i += 1

    with gs.count_syncs() as counter:
        n = gs.while_loop(lambda i, j, t: gs.GPUScalar(i) < 3, outer, i, j, total, max_iter=10)
    assert counter.count == 0 and counter.device_ops == 1
    expected = sum(1 for a in range(3) for b in range(4) if b < a)
    assert host(n) == 3 and host(total).item() == expected


def test_matmul_in_a_body(xp, rng):
    m = rng.standard_normal((4, 4)) * 0.1
    a, v, tmp = xp.asarray(m), xp.ones(4), xp.zeros(4)

    def body(v, tmp):
        gs.matmul(a, v, out=tmp)
        v[...] = tmp

    n = gs.while_loop(lambda v, tmp: gs.norm(v) > 1e-3, body, v, tmp, max_iter=50)
    w, count = np.ones(4), 0
    while np.linalg.norm(w) > 1e-3 and count < 50:
        w = m @ w
        count += 1
    assert host(n) == count
    np.testing.assert_allclose(host(v), w, rtol=1e-12)


def test_a_while_loop_inside_a_captured_step(xp):
    x, cond, body = _halving(xp, start=8.0)
    counts = xp.zeros((), dtype=np.int64)

    def step(x, counts):
        x[...] = 8.0
        counts += gs.while_loop(cond, body, x, max_iter=100)

    captured = gs.capture(step, x, counts, warmup=0)
    captured()
    captured()
    assert host(counts).item() == 2 * 3 and host(x).item() == 1.0


# ---- gs.cond ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1.0, -1.0])
def test_cond_runs_one_branch_as_one_device_op(xp, value):
    x, out = xp.full((), value), xp.zeros(())
    positive = gs.GPUScalar(x) > 0  # (the copy of x: one device op of its own)
    with gs.count_syncs() as counter:
        result = gs.cond(positive, adds(10), adds(-10), out)
    assert result is None and counter.count == 0 and counter.device_ops == 1
    assert host(out).item() == (10.0 if value > 0 else -10.0)


def test_cond_with_a_missing_branch_does_nothing(xp):
    out = xp.zeros(())
    gs.cond(gs.GPUScalar(out) > 0, adds(1), None, out)
    gs.cond(gs.GPUScalar(out) == 0, None, adds(1), out)
    assert host(out).item() == 0.0


# ---- functional state: the body returns the new values ------------------------------------------


def test_a_body_may_return_the_new_state_which_the_arrays_passed_hold_afterwards(xp):
    x = xp.full((), 100.0)
    with gs.count_syncs() as counter:
        n = gs.while_loop(lambda x: gs.GPUScalar(x) > 1.0, lambda x: x * 0.5, x,
                          max_iter=1000)
    assert counter.count == 0 and counter.device_ops == 1
    expected_x, expected_n = _plain_halving()
    assert host(n) == expected_n and host(x).item() == expected_x


def _cg_system(xp, n=12):
    rng = np.random.default_rng(3)
    m = rng.standard_normal((n, n))
    return xp.asarray(m @ m.T / n + np.eye(n)), xp.asarray(rng.standard_normal(n))


def _dot(u, v):
    """``u . v`` as a GPUScalar through gs.matmul (works in bodies on every device)."""
    return gs.GPUScalar(gs.matmul(u, v))


def _cg_start(xp, a, b):
    x = xp.zeros_like(b)
    r = b - gs.matmul(a, x)
    return x, r, r.copy(), _dot(r, r).array.copy()


def test_cg_rebinding_as_written_equals_cg_in_place_bit_for_bit(xp):
    """``p = r + beta * p`` and ``rr = rr_new`` ported as written (the body returns the new
    state, a GPUScalar for the 0-d item) and as in-place writes: the same iterates."""
    a, b = _cg_system(xp)

    def functional(x, r, p, rr):
        ap = gs.matmul(a, p)
        alpha = gs.GPUScalar(rr) / _dot(p, ap)
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = _dot(r, r)
        p = r + (rr_new / gs.GPUScalar(rr)) * p
        return x, r, p, rr_new

    def in_place(x, r, p, rr):
        ap = gs.matmul(a, p)
        alpha = gs.GPUScalar(rr) / _dot(p, ap)
        x[...] = x + alpha * p
        r[...] = r - alpha * ap
        rr_new = _dot(r, r)
        p[...] = r + (rr_new / gs.GPUScalar(rr)) * p
        rr[...] = rr_new.array

    results = []
    for body in (functional, in_place):
        state = _cg_start(xp, a, b)
        with gs.count_syncs() as counter:
            n = gs.while_loop(lambda x, r, p, rr: gs.norm(r) > 1e-10, body, *state,
                              max_iter=100)
        assert counter.count == 0 and counter.device_ops == 1
        results.append((host(n), host(state[0]).tobytes()))
    assert results[0] == results[1] and 0 < results[0][0] < 100
    np.testing.assert_allclose(host(gs.matmul(a, xp.asarray(np.frombuffer(results[0][1])))),
                               host(b), atol=1e-8)


def test_new_values_are_taken_before_any_buffer_is_written(xp):
    """``a, b = b, a`` and a reversed view of the state: values that are (views of) state
    buffers being written are copied aside first."""
    a, b, i = xp.zeros(3), xp.ones(3), xp.zeros((), dtype=np.int64)
    n = gs.while_loop(lambda a, b, i: i < 3, lambda a, b, i: (b, a, i + 1), a, b, i,
                      max_iter=10)
    assert host(n) == 3 and host(a).tolist() == [1.0] * 3 and host(b).tolist() == [0.0] * 3
    x = xp.arange(4.0)
    gs.while_loop(lambda x: gs.sum(x) < 100.0, lambda x: x[::-1], x, max_iter=3)
    assert host(x).tolist() == [3.0, 2.0, 1.0, 0.0]  # reversed three times


def test_items_returned_unchanged_are_not_copied_and_in_place_writes_stay(xp):
    x, total = xp.zeros(2), xp.zeros(())

    def body(x, total):
        x += 1.0  # in place
        return x, gs.GPUScalar(total) + gs.sum(x)  # x itself: no copy

    n = gs.while_loop(lambda x, total: gs.GPUScalar(total) < 10.0, body, x, total, max_iter=10)
    assert host(n) == 3 and host(x).tolist() == [3.0, 3.0]
    assert host(total).item() == 2.0 + 4.0 + 6.0


@pytest.mark.parametrize(("result", "match"), [
    (lambda x, y: x, "the body returned an? \\w+; .*None.*or a tuple of 2 new values"),
    (lambda x, y: (x,), "a tuple of 1 items for 2 state items"),
    (lambda x, y: (x, y, x), "a tuple of 3 items"),
    (lambda x, y: (x, x[:2]), "new state item 1 is an array of shape \\(2,\\).*state item 1 "
                              "has shape \\(3,\\)"),
    (lambda x, y: (x, y.astype(np.float32)), "new state item 1 .*dtype float32.*dtype float64"),
    (lambda x, y: (gs.sum(x), y), "new state item 0 is a GPUScalar of shape \\(\\).*state item "
                                  "0 has shape \\(2,\\)"),
    (lambda x, y: (x, 1.5), "new state item 1 is a float, not a device value"),
    (lambda x, y: (x, [1.0, 2.0, 3.0]), "new state item 1 is a list"),
])
def test_a_result_of_neither_form_is_a_type_error_saying_what_was_expected(xp, result, match):
    x, y = xp.zeros(2), xp.zeros(3)
    with pytest.raises(TypeError, match=match):
        gs.while_loop(lambda x, y: gs.sum(x) < 1.0, result, x, y, max_iter=5)
    assert host(x).tolist() == [0.0, 0.0]


def test_a_value_of_another_backend_is_named(xp):
    if backend_name(xp) == "numpy":
        other, x = gs.strict.xp.zeros(()), np.zeros(())
    else:
        other, x = np.zeros(()), xp.zeros(())
    with pytest.raises(TypeError, match="new state item 0 is a .* value but the state is on"):
        gs.while_loop(lambda x: gs.GPUScalar(x) < 1.0, lambda x: other, x, max_iter=3)


def test_a_gpuscalar_cannot_be_state_and_the_error_says_what_to_pass(xp):
    s = gs.asscalar(1.0, like=xp.zeros(()))
    with pytest.raises(TypeError, match="state item 0 is a GPUScalar, an immutable value.*0-d "
                                        "array"):
        gs.while_loop(lambda s: s < 3.0, lambda s: s + 1.0, s, max_iter=3)
    box = s.array.copy()  # what to pass instead: a 0-d array the loop keeps the value in
    n = gs.while_loop(lambda b: gs.GPUScalar(b) < 3.0, lambda b: gs.GPUScalar(b) + 1.0, box,
                      max_iter=10)
    assert host(n) == 2 and host(box).item() == 3.0 and host(s) == 1.0


# ---- the CPU checks what the GPU records ---------------------------------------------------------


def test_a_body_whose_loop_runs_zero_times_is_checked_for_syncs(xp):
    x = xp.zeros(())

    def body(x):
        if float(gs.GPUScalar(x)) > 0:  # the line named
            x -= 1

    line = inspect.getsourcelines(body)[1] + 1
    with pytest.raises(gs.SyncError, match=rf"test_control.py:{line}"):
        gs.while_loop(lambda x: gs.GPUScalar(x) > 0, body, x, max_iter=10)
    with pytest.raises(gs.SyncError):  # max_iter=0 too: a GPU records the body all the same
        gs.while_loop(lambda x: gs.GPUScalar(x) < 1, body, x, max_iter=0)


def test_a_body_whose_loop_runs_zero_times_is_checked_for_its_results_form(xp):
    x = xp.zeros(())
    with pytest.raises(TypeError, match="new state item 0 is a float"):
        gs.while_loop(lambda x: gs.GPUScalar(x) > 0, lambda x: 2.0, x, max_iter=10)
    with pytest.raises(TypeError, match="a tuple of 2 items for 1 state item"):
        gs.while_loop(lambda x: gs.GPUScalar(x) > 0, lambda x: (x, x), x, max_iter=10)


def test_an_upload_in_a_body_that_never_runs_is_refused_on_the_strict_device():
    xp = gs.strict.xp
    x = xp.zeros(3)

    def body(x):
        x += xp.asarray(np.ones(3))

    with pytest.raises(RuntimeError, match="H2D"):
        gs.while_loop(lambda x: gs.sum(x) > 2, body, x, max_iter=5)


def test_the_check_run_changes_nothing_and_counts_nothing(xp):
    """A loop that runs zero times: its body runs once only to be checked, and what it wrote
    (the state, an array it closes over, one reached through an object) is put back; the
    loop is one device op and no sync, as before. Floating-point warnings are off there (a
    body that never runs may see 0/0)."""
    x, scratch = xp.ones(3), xp.zeros(3)
    holder = type("Holder", (), {})()
    holder.buffer = xp.zeros(2)

    def body(x):
        scratch[...] = x / (x - x)  # 0/0 in the check run: no warning
        holder.buffer += 5.0
        return x * 2.0

    with gs.count_syncs() as counter, warnings.catch_warnings():
        warnings.simplefilter("error")
        n = gs.while_loop(lambda x: gs.sum(x) > 10.0, body, x, max_iter=10)
    assert counter.count == 0 and counter.device_ops == 1 and host(n) == 0
    assert host(x).tolist() == [1.0] * 3 and host(scratch).tolist() == [0.0] * 3
    assert host(holder.buffer).tolist() == [0.0, 0.0]


def test_a_loop_that_runs_is_not_run_again(xp):
    x, calls = xp.zeros(()), []

    def body(x):
        calls.append(1)
        x += 1.0

    n = gs.while_loop(lambda x: gs.GPUScalar(x) < 3.0, body, x, max_iter=10)
    assert host(n) == 3 and host(x).item() == 3.0
    assert len(calls) == (1 if backend_name(xp) == "cupy" else 3)  # (recorded once on a GPU)


def test_the_branch_not_taken_is_checked_for_syncs_and_its_form(xp):
    out = xp.zeros(())
    taken = gs.GPUScalar(out) == 0

    def syncs(o):
        if float(gs.GPUScalar(o)) > 0:  # the line named
            o += 1

    line = inspect.getsourcelines(syncs)[1] + 1
    with pytest.raises(gs.SyncError, match=rf"test_control.py:{line}"):
        gs.cond(taken, adds(1.0), syncs, out)
    assert host(out).item() == 0.0  # checked before the branch taken runs (a GPU records both)
    with pytest.raises(gs.SyncError):
        gs.cond(taken, syncs, adds(1.0), out)  # taken: raised by the run itself
    with pytest.raises(TypeError, match="false_fn returned a"):
        gs.cond(taken, adds(1.0), lambda o: o + 1, out)


def test_the_branch_not_taken_changes_nothing_and_the_cond_is_one_device_op(xp):
    out, other = xp.zeros(()), xp.zeros(2)

    def not_taken(o):
        o += 100.0
        other[...] = 7.0

    zero = gs.GPUScalar(out) == 0
    with gs.count_syncs() as counter:
        gs.cond(zero, adds(1.0), not_taken, out)
    assert counter.count == 0 and counter.device_ops == 1
    assert host(out).item() == 1.0 and host(other).tolist() == [0.0, 0.0]


def test_loops_and_branches_in_a_check_run_are_checked_not_run(xp):
    """A loop nested in a body that never runs: its body is checked (a sync raises), its
    predicate and body run once each, and nothing it wrote stays."""
    i, j = xp.zeros(()), xp.zeros(())
    inner_calls = []

    def inner(j):
        inner_calls.append(1)
        j += 1.0

    def outer(i, j):
        gs.while_loop(lambda j: gs.GPUScalar(j) < 1000.0, inner, j, max_iter=1000)
        gs.cond(gs.GPUScalar(j) > 0, adds(1.0), adds(2.0), i)

    n = gs.while_loop(lambda i, j: gs.GPUScalar(i) > 0, outer, i, j, max_iter=5)
    assert host(n) == 0 and host(i).item() == 0.0 and host(j).item() == 0.0
    assert len(inner_calls) == 1  # checked once, not run a thousand times

    def outer_syncing(i, j):
        gs.while_loop(lambda j: gs.GPUScalar(j) < 3.0, lambda j: bool(gs.GPUScalar(j)) and None,
                      j, max_iter=3)

    with pytest.raises(gs.SyncError):
        gs.while_loop(lambda i, j: gs.GPUScalar(i) > 0, outer_syncing, i, j, max_iter=5)


@pytest.mark.parametrize("xp", [np, gs.strict.xp], ids=["numpy", "strict"])  # host arrays
def test_reachable_arrays_follow_closures_globals_partials_methods_and_objects(xp):
    from gpuscalar.devices.host import control as host_control  # noqa: PLC0415

    a, b, c, d, e = (xp.zeros(1) for _ in range(5))

    class Solver:
        def __init__(self):
            self.work = [c]

        def step(self, x):
            return x

    def helper(x):
        x += d

    def body(x, scale=e):
        helper(x)
        x += a

    found = host_control.reachable_arrays((body, functools.partial(helper, b), Solver().step))
    ids = {id(array) for _, array in found}
    assert {id(a), id(b), id(c), id(d), id(e)} <= ids
    assert host_control.reachable_arrays((gs.norm, np.linalg.norm)) == []  # library code

    def library_body(x):  # a body a library defines (a solver's) is followed
        x += a

    library_body.__module__ = "gpuscalar.linalg"
    assert [array for _, array in host_control.reachable_arrays((library_body,))] == [a]


# ---- errors -------------------------------------------------------------------------------------


def test_a_python_bool_predicate_is_a_type_error(xp):
    x = xp.zeros(())
    with pytest.raises(TypeError, match="Python bool"):
        gs.while_loop(lambda x: True, lambda x: None, x, max_iter=3)
    with pytest.raises(TypeError, match="Python bool"):
        gs.cond(True, None, None, x)


def test_a_non_bool_predicate_is_a_type_error(xp):
    x = xp.zeros(())
    with pytest.raises(TypeError, match="dtype bool, got float64"):
        gs.while_loop(lambda x: gs.GPUScalar(x), lambda x: None, x, max_iter=3)
    with pytest.raises(TypeError, match="0-d bool device array, got str"):
        gs.cond("yes", None, None, x)


def test_a_branch_returning_a_value_is_a_type_error(xp):
    x = xp.zeros(())
    with pytest.raises(TypeError, match="true_fn returned a .*update the operand arrays"):
        gs.cond(gs.GPUScalar(x) == 0, lambda x: x + 1, None, x)
    with pytest.raises(TypeError, match="false_fn returned a"):  # (the branch not taken too)
        gs.cond(gs.GPUScalar(x) == 0, None, lambda x: x + 1, x)


@pytest.mark.parametrize(("max_iter", "error", "match"), [
    (-1, ValueError, "max_iter must be >= 0, got -1"),
    (2.0, TypeError, "max_iter must be a Python int >= 0, got float"),
    (True, TypeError, "got bool"),
])
def test_a_bad_max_iter_is_an_error(xp, max_iter, error, match):
    x = xp.zeros(())
    with pytest.raises(error, match=match):
        gs.while_loop(lambda x: gs.GPUScalar(x) < 3, lambda x: None, x, max_iter=max_iter)


def test_max_iter_is_a_required_keyword(xp):
    x = xp.zeros(())
    with pytest.raises(TypeError, match="max_iter"):
        gs.while_loop(lambda x: gs.GPUScalar(x) < 3, lambda x: None, x)  # type: ignore[call-arg]


def test_non_callables_and_bad_state_are_errors(xp):
    x = xp.zeros(())
    with pytest.raises(TypeError, match="body must be a callable, got int"):
        gs.while_loop(lambda x: gs.GPUScalar(x) < 3, 3, x, max_iter=3)
    with pytest.raises(TypeError, match="false_fn must be a callable or None"):
        gs.cond(gs.GPUScalar(x) < 3, None, "no", x)
    with pytest.raises(TypeError, match="argument 1 is a list"):
        gs.while_loop(lambda *s: gs.GPUScalar(x) < 3, lambda *s: None, x, [1], max_iter=3)


def test_capture_inside_a_body_is_an_error(xp):
    x = xp.zeros(())

    def body(x):
        gs.capture(lambda: None)

    with pytest.raises(RuntimeError, match="cannot capture inside a gs.while_loop"):
        gs.while_loop(lambda x: gs.GPUScalar(x) < 3, body, x, max_iter=3)


# ---- the page: docs/control-flow.md runs as written -------------------------------------------


def test_the_control_flow_page_runs_in_order_and_prints_what_it_shows(tmp_path, monkeypatch):
    """Its blocks, in order, in one namespace (the port of CG in both state forms included),
    each printing what the text shows (sections of other pages' subjects, the Krylov solvers,
    are tested with them)."""
    from .test_readme import SKETCH, python_blocks, run_block  # noqa: PLC0415

    page = [block for block in python_blocks(ROOT / "docs" / "control-flow.md")
            if "Krylov" not in block.section and not block.code.startswith(SKETCH)]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__page__"}
    shown = 0
    for block in page:
        run_block(block, namespace)
        shown += block.shown is not None
    assert shown >= 3 and "cg_functional" in namespace and "cg_in_place" in namespace


# ---- the shipped examples, on every backend ---------------------------------------------------


def _example(name):
    """``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cg_example_solves_with_zero_syncs(xp):
    cg = _example("cg")
    a, b = cg.spd_system(xp, 40)
    with gs.count_syncs() as counter:
        x, n = cg.solve_on_device(a, b, xp)
    assert counter.count == 0 and counter.device_ops < 40  # the setup, and one op for the loop
    x_plain, n_plain = cg.solve_with_host_checks(a, b, xp)
    assert host(n) == n_plain and host(x).tobytes() == host(x_plain).tobytes()


def test_gs_dot_is_the_same_bits_in_a_loop_body_and_outside(xp):
    """Why the CG example's two solves are the same bits on a GPU: ``gs.dot`` of two vectors is
    one routine wherever it runs (on CuPy gpuscalar's own dot kernel; it was ``cupy.dot``'s
    cuBLAS call outside a recording once, and the two solves differed in the last bit on an
    H200). Long vectors, so an order shows."""
    rng = np.random.default_rng(5)
    u, v = (xp.asarray(rng.standard_normal(5000)) for _ in range(2))
    outside = gs.dot(u, v)
    inside, count = xp.zeros(()), xp.zeros((), dtype=np.int64)

    def body(u, v, inside, count):
        inside[...] = gs.dot(u, v).array
        count += 1

    gs.while_loop(lambda *state: gs.GPUScalar(state[-1]) < 1, body, u, v, inside, count,
                  max_iter=1)
    assert host(count) == 1
    assert np.asarray(host(inside)).tobytes() == np.asarray(host(outside)).tobytes()


def test_the_kmeans_example_clusters_with_zero_syncs(xp):
    kmeans = _example("kmeans")
    points = kmeans.blobs(xp)
    with gs.count_syncs() as counter:
        centers, labels, n = kmeans.cluster_on_device(points, xp)
    assert counter.count == 0
    centers_plain, labels_plain, n_plain = kmeans.cluster_with_host_checks(points, xp)
    assert host(n) == n_plain
    assert host(labels).tobytes() == host(labels_plain).tobytes()
    assert host(centers).tobytes() == host(centers_plain).tobytes()


def test_the_benchmark_says_so_and_exits_0_without_a_gpu(tmp_path):
    if gs.gpu_available():
        pytest.skip("a GPU is present: the benchmark measures")

    script = ROOT / "bench" / "gpu_control.py"
    out = tmp_path / "result.json"
    result = subprocess.run([sys.executable, str(script), "--json", str(out)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "needs a CUDA GPU" in result.stdout and " ms" not in result.stdout
    assert json.loads(out.read_text()) == {"measured": False, "reason": "no CUDA GPU"}


def test_the_benchmark_cg_measurement_agrees_on_the_cpu(xp):
    """The measured code runs (NumPy, strict, CuPy): same iterates, zero syncs for while_loop
    (on a GPU the same bits since the example's dot is one cuBLAS routine in both solves)."""

    found = gpu_control.measure_cg(xp, 30, repeats=1)
    assert found["same_iterates"] and found["syncs"]["while_loop"] == 0
    assert found["syncs"]["host checks"] == found["iterations"]["host checks"] + 1
    cost = gpu_control.measure_iteration_cost(xp, 5, repeats=1)
    assert cost["iterations"] == 5 and "microseconds_per_iteration_beyond_body" in cost


# ---- the "loops" executor slot (issue 22) ------------------------------------------------------


def test_each_device_runs_loops_through_its_loops_executor():
    """`gs.while_loop`/`gs.cond` hand a loop to ``backend.executor("loops")`` (the protocol
    `gpuscalar.control.Loops`): NumPy and the strict device share the host one (one home)."""
    from gpuscalar.control import Loops  # noqa: PLC0415
    from gpuscalar.devices import NUMPY, STRICT  # noqa: PLC0415
    from gpuscalar.devices.host.control import HostLoops  # noqa: PLC0415

    on_numpy, on_strict = NUMPY.executor("loops"), STRICT.executor("loops")
    assert type(on_numpy) is type(on_strict) is HostLoops
    assert (on_numpy.backend, on_strict.backend) == (NUMPY, STRICT)
    assert NUMPY.executor("loops") is on_numpy  # made once
    members = [name for name in vars(Loops) if not name.startswith("_")]
    assert set(members) == {"default_device", "while_loop", "cond"}
    assert all(callable(getattr(on_numpy, name)) for name in members)


@pytest.mark.needs_cupy  # the CuPy wing's executor module imports CuPy's side of the seam
def test_cupy_records_loops_through_its_own_loops_executor():
    from gpuscalar.devices import CUPY  # noqa: PLC0415
    from gpuscalar.devices.cupy.control import CudaLoops  # noqa: PLC0415

    assert type(CUPY.executor("loops")) is CudaLoops
