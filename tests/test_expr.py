"""Pending scalar expressions: keys, bounds, the switch, and lazy == eager bit for bit."""

from __future__ import annotations

import gc
import importlib
import math
import os
import subprocess
import sys
import tracemalloc
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gpuscalar as gs
from gpuscalar.lazy import expr

from . import recipes

# ---- structure keys -----------------------------------------------------------------------------


def test_equal_structures_share_a_key_whatever_the_values():
    a, b = gs.asscalar(1.5), gs.asscalar(-7.25)
    first = (a * 2.0 + 1) / a
    second = (b * 9.0 + 4) / b
    assert first._node[0] == second._node[0]
    assert expr.plan_of(first._node) is expr.plan_of(second._node)
    assert expr.leaves_of(first._node)[1] == 2.0 and expr.leaves_of(second._node)[1] == 9.0


@pytest.mark.parametrize(
    "other",
    [lambda s: s * 2.0 + 1j,                    # a complex constant: another loop
     lambda s: s * 2.0 - 1.0,                   # a different op
     lambda s: s * gs.asscalar(2.0) + 1.0,      # a device leaf where a constant was
     lambda s: -s * 2.0 + 1.0],                 # one node more
)
def test_different_structures_get_different_keys(other):
    s = gs.asscalar(1.5)
    assert other(s)._node[0] != (s * 2.0 + 1.0)._node[0]


def test_dtype_is_part_of_the_structure():
    assert (gs.asscalar(np.float32(1)) + 1.0)._node[0] != (gs.asscalar(1.0) + 1.0)._node[0]
    # a Python int meeting a float64 loop is converted to float64: the same structure as 2.0
    s = gs.asscalar(1.5)
    assert (s * 2 + 1)._node[0] == (s * 2.0 + 1.0)._node[0]


def test_python_numbers_are_arguments_converted_as_the_float_path_converts_them():
    """A GPUScalar is the Python number it replaces: ``float(s) + 0.1`` is a float64 sum, so
    the constant is a float64 (not rounded to the scalar's float32); an int8 GPUScalar plus
    1000 is ``int(s) + 1000``, an int64 1001 (no int8 overflow)."""
    s = gs.asscalar(np.float32(1.0))
    node = (s + 0.1)._node
    constant = expr.leaves_of(node)[1]
    assert type(constant) is np.float64 and constant == 0.1
    wide = gs.asscalar(np.int8(1)) + 1000
    assert wide.dtype == np.int64 and type(expr.leaves_of(wide._node)[1]) is np.int64
    assert wide.item() == 1001
    with pytest.raises(OverflowError, match="int64"):
        gs.asscalar(np.int8(1)) + 2**64  # beyond the device's int64, when the node is built


def test_pending_scalars_know_dtype_device_and_launch_nothing():
    s = gs.asscalar(np.float32(2.0))
    with gs.count_syncs() as counter:
        t = gs.sqrt(s * 3 + 1) < 5.0
    assert counter.device_ops == 0 and counter.count == 0
    assert not t.is_materialized and t.dtype == np.bool_ and t.device == "cpu"
    with gs.count_syncs() as counter:
        assert bool(t) is True
    assert counter.device_ops == 1 and counter.count == 1  # one evaluation, one transfer
    assert t.is_materialized


def test_a_counter_plus_one_stays_one_node():
    step = gs.asscalar(0, dtype=np.int64)
    for _ in range(10_000):
        step = step + 1
    assert step._node[1] == 1 and int(step) == 10_000
    down = gs.asscalar(np.uint8(5)) - 7 - 1  # int(s) - 7 - 1: an int64, no uint8 wrap
    assert down.dtype == np.int64 and down._node[1] == 1 and int(down) == 5 - 7 - 1


def test_a_folded_counter_wraps_as_its_device_integer():
    """The folded constant is summed in the loop's integer type: exactly (NumPy's arithmetic
    on the previous constant) where the sum fits, wrapped (two's complement) where it does
    not, with no warning either way, and the value is the eager one."""
    near_max = gs.asscalar(5, dtype=np.int64)
    small = gs.asscalar(np.int8(120)) + np.int8(0)  # a strong int8: an int8 loop
    recipes = [lambda: near_max + (2**63 - 1) + 1, lambda: near_max - 1 - (2**63 - 1) - 1,
               lambda: small + 5 + 5 - 1, lambda: small + 100 + 100, lambda: small - 100 - 100]
    for recipe in recipes:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            folded = recipe()
        assert folded._node.size == 1
        with gs.lazy(False):
            expected = recipe()
        assert folded.dtype == expected.dtype and int(folded) == int(expected)


def test_leaves_come_in_postorder_for_every_shape():
    """`leaves_of` (a size-one node's children at once, small trees recursively, large ones
    iteratively) gives the leaves `postorder` meets, in its order, for chains, wide trees,
    nodes of one op anywhere and trees past the size bound."""
    op = expr.get_op("ufunc", "add", (np.dtype(float),) * 2, (np.dtype(float),))
    rng = np.random.default_rng(0)
    leaf = np.asarray(0.5)

    def tree(ops: int) -> Any:
        if ops == 0:
            return leaf if rng.random() < 0.5 else np.float64(rng.random())
        left = int(rng.integers(0, ops))
        return expr.make_node(op, (tree(left), tree(ops - 1 - left)))

    for ops in [*range(1, 12), expr.MAX_NODES, expr.MAX_NODES + 1, 3 * expr.MAX_NODES]:
        for _ in range(20):
            root = tree(ops)
            expected = [item for item, is_node in expr.postorder(root) if not is_node]
            found = expr.leaves_of(root)
            assert len(found) == len(expected) == ops + 1
            assert all(a is b for a, b in zip(found, expected, strict=True))


def test_walks_are_iterative():
    op = expr.get_op("ufunc", "add", (np.dtype(float),) * 2, (np.dtype(float),))
    node = np.asarray(0.0)
    for _ in range(5 * sys.getrecursionlimit()):  # far deeper than any real expression
        node = expr.make_node(op, (node, np.float64(1.0)))
    assert len(expr.leaves_of(node)) == 5 * sys.getrecursionlimit() + 1
    assert expr.evaluate_on_host(node, lambda a: a) == 5 * sys.getrecursionlimit()
    assert expr.describe_structure(node[0]).count("Op(add") == 5 * sys.getrecursionlimit()


# ---- the size bound: long loops stay bounded ----------------------------------------------------


def test_expressions_materialize_past_the_bound():
    total = gs.asscalar(0.0)
    with gs.count_syncs() as counter:
        for _ in range(expr.MAX_NODES):
            total = total + 1.0
        assert not total.is_materialized and total._node[1] == expr.MAX_NODES
        total = total + 1.0
    assert total.is_materialized and counter.device_ops == 1
    assert total.item() == expr.MAX_NODES + 1


def test_a_hundred_thousand_step_accumulation_is_bounded():
    losses = [gs.sum(np.full(3, i, dtype=np.float64)) for i in range(7)]
    total = gs.asscalar(0.0)
    plans_before = len(expr._PLANS)
    keys_before = len(expr._KEYS)
    gc.collect()
    tracemalloc.start()
    try:
        for step in range(100_000):
            total = total + losses[step % 7]
            if step == 1_000:
                gc.collect()
                baseline = tracemalloc.get_traced_memory()[0]
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert grown < 200_000, f"memory grew by {grown} bytes over 99,000 steps"
    assert total._node is None or total._node[1] <= expr.MAX_NODES
    assert len(expr._PLANS) - plans_before <= 3  # distinct evaluated structures
    assert len(expr._KEYS) - keys_before <= expr.MAX_NODES + 5  # a chain's keys, once
    expected = sum(3.0 * (step % 7) for step in range(100_000))
    assert total.item() == pytest.approx(expected, rel=1e-12)


def _shapes(count: int, leaf, start: int = 0) -> list:
    """``count`` distinct expression shapes (chains of add/multiply by the bits of their index,
    from ``start``) over ``leaf``, each ending in a negation (its own key)."""
    f8 = np.dtype(np.float64)
    add = expr.get_op("ufunc", "add", (f8, f8), (f8,))
    mul = expr.get_op("ufunc", "multiply", (f8, f8), (f8,))
    neg = expr.get_op("ufunc", "negative", (f8,), (f8,))
    made = []
    for index in range(start, start + count):
        node = expr.make_node(add, (leaf, np.float64(1.0)))
        for bit in range(index.bit_length()):
            node = expr.make_node(mul if index >> bit & 1 else add, (node, np.float64(0.5)))
        made.append(expr.make_node(neg, (node,)))
    return made


def test_structure_keys_nothing_refers_to_are_dropped_never_reused():
    """Past the bound, a key no node, plan or kernel refers to is dropped; met again, its
    structure is interned under a NEW key, so no cache keyed by the old one finds another
    structure's plan or kernel, and a live node's key keeps describing and planning its tree."""
    from gpuscalar.lazy import keytable

    leaf = np.asarray(3.0)
    previous = expr.set_cache_size(4)  # the key table: swept past 8 keys
    try:
        kept = _shapes(40, leaf)[-1]  # a live node: its key and its subtree's are kept
        kept_text = expr.describe_structure(kept.key)
        kept_value = expr.evaluate_on_host(kept, np.asarray)
        planned = _shapes(41, leaf)[-1]
        plan = expr.plan_of(planned)  # a cached plan keeps its key too
        planned_key = int(str(planned.key))  # the number: only the plan cache holds the key
        planned_text = expr.describe_structure(planned_key)
        del planned
        gone = _shapes(300, leaf)[200]
        gone_text = expr.describe_structure(gone.key)
        gone_value = expr.evaluate_on_host(gone, np.asarray)
        stale = int(str(gone.key))  # the number, not the object: it refers to nothing
        newest = max(expr._KEY_STRUCTURE)
        del gone
        expr.plan_for_key(planned_key)  # (the most recently used plan now)
        for other in _shapes(3, leaf):
            expr.plan_of(other)  # gone's plan evicted: nothing refers to its key
        before = len(expr._KEY_STRUCTURE)
        dropped = keytable.sweep()
        assert dropped > 200 and len(expr._KEY_STRUCTURE) == before - dropped
        assert stale not in expr._KEY_STRUCTURE  # dropped, and not found by any structure
        assert stale not in set(expr._KEYS.values())
        # the cached plan's structure and the live node's are intact
        assert expr.plan_for_key(planned_key) is plan
        assert expr.describe_structure(planned_key) == planned_text
        assert expr.describe_structure(kept.key) == kept_text
        assert expr.evaluate_on_host(kept, np.asarray) == kept_value  # (its plan rebuilt)
        # met again: a new key (never a reused number), the same structure, plan and value
        again = _shapes(201, leaf)[200]
        assert again.key != stale and again.key > newest
        assert expr.describe_structure(again.key) == gone_text
        assert expr.plan_of(again).name == expr.Plan(again.key).name
        assert expr.evaluate_on_host(again, np.asarray) == gone_value
        assert expr.find_key(expr._KEY_STRUCTURE[again.key]) == again.key
        # interning past the bound sweeps by itself: the table stays bounded
        keytable.sweep()  # the next sweep at twice what is alive now
        before, newest = len(expr._KEY_STRUCTURE), max(expr._KEY_STRUCTURE)
        for round_ in range(1, 6):  # new shapes each round (deeper chains)
            _shapes(300, leaf, start=round_ << 12)
            assert len(expr._KEY_STRUCTURE) <= max(2 * before, keytable._sweep_at)
        assert max(expr._KEY_STRUCTURE) - newest > 5_000  # interned, most of them dropped
        keytable.sweep()
        assert len(expr._KEY_STRUCTURE) <= before  # every key the rounds made is dropped
        assert expr.describe_structure(kept.key) == kept_text
    finally:
        expr.set_cache_size(previous)


def test_a_churning_running_total_keeps_its_key_table_bounded_and_bit_identical():
    """The issue's loop past the key table's bound: the same bits as eager, and the table holds
    what is alive, not every shape ever built."""
    import random

    previous = expr.set_cache_size(16)
    try:
        keys_before = len(expr._KEY_STRUCTURE)
        results = []
        for lazy in (True, False):
            coin = random.Random(5).random
            total = gs.asscalar(0.0)
            with gs.lazy(lazy):
                for i in range(3000):
                    loss = gs.asscalar(float(i % 7) * 0.25)
                    total = total + (loss * 2 if coin() < 0.5 else loss + 1)
                    if i % 10 == 9:
                        results.append(np.asarray(total.item()).tobytes())
            results.append(np.asarray(total.item()).tobytes())
            if lazy:
                assert len(expr._KEY_STRUCTURE) < keys_before + 4_000
        half = len(results) // 2
        assert results[:half] == results[half:]
    finally:
        expr.set_cache_size(previous)


# ---- the switch ---------------------------------------------------------------------------------


def test_lazy_false_is_eager_and_nests():
    s = gs.asscalar(2.0)
    with gs.lazy(False):
        eager = s * 3
        with gs.lazy(True):
            pending = s * 3
        again = s * 3
    assert eager.is_materialized and again.is_materialized and not pending.is_materialized
    assert eager.item() == pending.item() == 6.0
    assert expr.is_lazy() is expr._LAZY_DEFAULT


def test_lazy_takes_a_bool():
    with pytest.raises(TypeError, match="bool"):
        with gs.lazy("no"):
            pass  # pragma: no cover - not reached


def _python(code: str, lazy: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != expr.LAZY_ENV_VAR}
    if lazy is not None:
        env[expr.LAZY_ENV_VAR] = lazy
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize(("value", "materialized"), [(None, False), ("1", False), ("0", True),
                                                     ("false", True)])
def test_environment_variable_sets_the_default(value, materialized):
    code = "import gpuscalar as gs; print((gs.asscalar(1.0) + 1).is_materialized)"
    result = _python(code, value)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(materialized)


def test_invalid_environment_value_stops_the_import():
    result = _python("import gpuscalar", "maybe")
    assert result.returncode != 0
    assert "GPUSCALAR_LAZY='maybe'" in result.stderr and "ValueError" in result.stderr


# ---- lazy == eager, bit for bit -----------------------------------------------------------------

#: Every shape the parity test evaluated lazily: tests/test_codegen.py compiles them all.
GENERATED_SHAPES: dict[int, tuple] = {}

_ERRORS = (TypeError, ValueError, OverflowError, ZeroDivisionError, FloatingPointError)


def _category(error: BaseException) -> type:
    return next(kind for kind in _ERRORS if isinstance(error, kind))


def assert_structure_is_consistent(root: expr.Node) -> None:
    """The key a node carries is the key of what it holds (ops, dtypes, which children are
    device leaves and which constants), recomputed from scratch; and the plan that kernels are
    generated from numbers its parameters as the leaves are passed (a device leaf where a
    pointer is declared, a NumPy scalar of the declared dtype where a value is)."""
    keys: dict[int, int] = {}
    for item, is_node in expr.postorder(root):
        if not is_node:
            continue
        structure = (item.op.id, *(keys[id(c)] if type(c) is expr.Node else expr.child_key(c)
                                   for c in item.children))
        assert expr.find_key(structure) == item.key, expr.describe_structure(item.key)
        keys[id(item)] = item.key
    plan = expr.plan_of(root)
    leaves = expr.leaves_of(root)
    assert len(leaves) == len(plan.leaf_kinds)
    for leaf, (kind, dtype) in zip(leaves, plan.leaf_kinds, strict=True):
        assert (kind == "const") == isinstance(leaf, np.generic), (kind, type(leaf))
        assert leaf.dtype == dtype


def _evaluate(recipe, lazy: bool, like=None, stepwise: bool = False):
    """("value", 0-d array) | ("raised", error category) | ("python", value)."""
    with gs.lazy(lazy), warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            value = recipes.build(recipe, like, stepwise=stepwise)
        except _ERRORS as error:
            return "raised", _category(error)
        if not isinstance(value, gs.GPUScalar):
            return "python", value
        if not value.is_materialized:
            assert_structure_is_consistent(value._node)
            GENERATED_SHAPES.setdefault(value._node[0], value._node)
        try:
            return "value", value.array
        except _ERRORS as error:  # a lazy expression raises where it is evaluated
            return "raised", _category(error)


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "c":
        return _same_bits(a.real, b.real) and _same_bits(a.imag, b.imag)
    if a.dtype.kind == "f" and np.isnan(a) and np.isnan(b):
        return True
    return a.tobytes() == b.tobytes()


def check_lazy_equals_eager(recipe, like=None) -> None:
    """Lazy == eager: the same dtype and bits, the same Python/NumPy result, or an error of
    the same category (TypeError, ValueError, OverflowError, ZeroDivisionError, ...).

    Two lazy runs: one evaluating every operation where it is built (``stepwise``), whose
    errors must be eager's exactly, and one evaluating the whole expression at the end, which
    must give the same value; there only a run-time error (NumPy's ValueError for an integer
    to a negative power) may surface later, where the expression is evaluated, so a later
    operation's own error may come first.
    """
    eager = _evaluate(recipe, False, like)
    stepwise = _evaluate(recipe, True, like, stepwise=True)
    lazy = _evaluate(recipe, True, like)
    for result in (stepwise, lazy):
        assert result[0] == eager[0], (recipe, eager, result)
        if eager[0] == "raised":
            if result is lazy and eager[1] is ValueError:
                continue
            assert result[1] is eager[1], (recipe, eager, result)
        elif eager[0] == "python":
            assert type(result[1]) is type(eager[1]), (recipe, eager, result)
            if isinstance(eager[1], (np.generic, np.ndarray)):
                assert eager[1].dtype == result[1].dtype, (recipe, eager, result)
                assert _same_bits(eager[1], result[1]), (recipe, eager, result)
        else:
            host = [_host_array(v) for v in (eager[1], result[1])]
            assert host[0].dtype == host[1].dtype, (recipe, host)
            assert _same_bits(*host), (recipe, host)


def _host_array(array):
    return array if isinstance(array, np.ndarray) else array.get()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes.recipes())
def test_random_expressions_give_the_eager_dtype_and_bits(recipe):
    check_lazy_equals_eager(recipe)


def test_seeded_expressions_give_the_eager_dtype_and_bits():
    """The same check on a fixed, broad set of shapes (every operation and dtype appears)."""
    import random

    rng = random.Random(2026)
    for _ in range(600):
        check_lazy_equals_eager(recipes.random_recipe(rng))


@pytest.mark.parametrize("name", sorted(recipes.OPERATIONS))
def test_every_operation_on_every_dtype_matches_eager(name):
    arity = recipes.OPERATIONS[name][0]
    for dtype in recipes.DTYPES:
        for python in (None, 3, 0.5, True, 1j):
            children = [("dev", dtype, recipes.device_value(dtype, 2.5))]
            children += [("py", python) if python is not None else
                         ("dev", dtype, recipes.device_value(dtype, -1.5))] * (arity - 1)
            check_lazy_equals_eager((name, *children))


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy is not installed")
def test_random_expressions_on_cupy_give_the_eager_bits(rng):
    """On a GPU: the fused kernels against eager CuPy, bit for bit (skips without a device)."""
    if not gs.gpu_available():
        pytest.skip("CuPy needs a CUDA device, and this machine has none")
    import random

    import cupy

    like = cupy.zeros(1)
    generator = random.Random(7)
    for _ in range(120):  # each new shape compiles a kernel: keep the GPU report's suite short
        check_lazy_equals_eager(recipes.random_recipe(generator), like)


def test_ieee_results_without_warnings():
    s = gs.asscalar(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (s / 0).item() == math.inf  # lazy: evaluated as a kernel would, no warning


def test_every_shape_the_parity_tests_built_compiles_with_nvrtc(nvrtc):
    """The CUDA source of each expression shape built above (hypothesis, seeded, every
    operation) compiles; run alone, this test builds the seeded shapes itself."""
    pytest.importorskip("cupy")
    import random

    from .test_codegen import compile_shapes, shapes_of

    shapes = dict(GENERATED_SHAPES)
    shapes.update(shapes_of(recipes.random_recipe(random.Random(2026)) for _ in range(100)))
    assert compile_shapes(nvrtc, shapes) == len(shapes)


# ---- integer offsets fold into constants only (never into a device leaf) ------------------------


@pytest.mark.needs_cupy  # count_syncs(include_cupy=True)
@pytest.mark.parametrize("build", [
    lambda a, b: (a + b) + 1,
    lambda a, b: (a + b) - 2,
    lambda a, b: (a + b) + 1 + 1,
    lambda a, b: a + 1 + 1,
    lambda a, b: (a - b) + 5,
    lambda a, b: (b + 1) + a + 1,
])
def test_integer_offsets_fold_into_constants_only(build):
    """A counter's ``+ 1 + 1`` is summed into one constant; a device leaf in the same place
    is never read (a hidden sync) nor turned into a constant (the kernel would receive a
    number where its key declares a pointer)."""
    from gpuscalar.optim import executors

    a = gs.GPUScalar(gs.strict.xp.asarray(np.int64(5)))
    b = gs.GPUScalar(gs.strict.xp.asarray(np.int64(3)))
    with gs.count_syncs(include_cupy=True) as counter, gs.sync_guard("error"):
        result = build(a, b)
    assert counter.count == 0 and counter.device_ops == 0
    assert not result.is_materialized
    assert_structure_is_consistent(result._node)
    kind, leaves = executors.route(result)  # what a fused optimizer passes its kernel
    plan = expr.plan_for_key(kind[1])
    assert [k for k, _ in plan.leaf_kinds] == [
        "const" if isinstance(leaf, np.generic) else "leaf" for leaf in leaves]
    with gs.lazy(False):
        expected = int(build(a, b))
    assert int(result) == expected


def test_a_counter_folds_its_offsets_into_one_constant():
    step = gs.asscalar(7, dtype=np.int64) * 2  # a pending multiply, then offsets
    counted = step + 1 + 1 - 5
    assert counted._node[1] == 2  # multiply, and one add of the summed constant
    assert expr.leaves_of(counted._node)[-1] == -3
    assert int(counted) == 11


# ---- Python numbers converted as NumPy converts them (eager decides the doubtful ones) ----------

F32, F64, U8, U64 = (np.dtype(n) for n in ("float32", "float64", "uint8", "uint64"))
BOOL = np.dtype(bool)

#: Each (recipe) once gave a different value, dtype or error lazily than eagerly. The comments
#: say what the float path gives (each GPUScalar replaced by its ``item()``), which eager and
#: lazy must both give now (tests/test_parity.py checks the flat ones against it here too).
NUMBER_CONVERSIONS = [
    ("np.logical_xor", ("py", 2**63), ("dev", F64, 1.5)),     # False
    ("np.logical_and", ("dev", BOOL, True), ("py", 2**64)),   # True
    ("where", ("dev", BOOL, True), ("py", -1), ("dev", U8, 5)),   # int64 -1 (no uint8 wrap)
    ("where", ("dev", BOOL, True), ("py", 300), ("dev", U8, 5)),  # int64 300
    ("where", ("dev", BOOL, True), ("py", 2**64), ("dev", U8, 5)),  # beyond int64: Overflow
    # beyond 2**53: a documented exception (the float path's np.where makes it float64 too)
    ("where", ("dev", BOOL, True), ("py", 2**53 + 2**29 + 1), ("dev", F32, 1.5)),
    ("add", ("dev", F32, 1.5), ("py", 2**53 + 2**29 + 1)),
    ("np.minimum", ("py", 2**64), ("dev", F64, 1.5)),         # float64 1.5
    ("np.ldexp", ("dev", F64, 1.5), ("py", 2**40)),           # inf
    ("lt", ("dev", U64, 5), ("py", -1)),                      # False (5 < -1, as ints)
    ("add", ("dev", U64, 5), ("py", 2**63)),                  # int64 overflow: OverflowError
    ("add", ("dev", U8, 5), ("py", 300)),                     # int64 305
    ("gt", ("np", F32, 1.5), ("mul", ("dev", F64, 1.0), ("py", 3))),  # a NumPy scalar left
    ("add", ("np", F32, 1.5), ("mul", ("dev", F64, 1.0), ("py", 3))),  # float32 4.5
    ("where", ("np", BOOL, True), ("np", F32, 2.5), ("mul", ("dev", F32, 1.0), ("py", 3))),
]


@pytest.mark.parametrize("recipe", NUMBER_CONVERSIONS, ids=str)
def test_python_numbers_give_the_eager_value_dtype_and_error(xp, recipe):
    check_lazy_equals_eager(recipe, like=xp.zeros(1))
    if all(child[0] in ("dev", "py", "np") for child in recipe[1:]):  # the float path too
        from . import test_parity

        operands = tuple(child if child[0] == "dev" else
                         child[1] if child[0] == "py" else child[1].type(child[2])
                         for child in recipe[1:])
        for lazy in (True, False):
            with gs.lazy(lazy):
                assert not test_parity.check(recipe[0], operands, xp.zeros(1))


def test_a_shared_subexpression_gives_the_eager_bits(xp):
    """A DAG: one pending scalar used by several operations (and twice by one)."""
    shared = ("shared", 0, ("mul", ("dev", F32, 1.5), ("py", 3)))
    check_lazy_equals_eager(("add", ("mul", shared, shared), ("sub", shared, ("py", 0.5))),
                            like=xp.zeros(1))
    big = ("shared", 1, ("add", ("mul", ("add", ("dev", F64, 1.25), ("py", 1)), ("py", 2.0)),
                         ("sqrt", ("dev", F64, 2.0))))
    check_lazy_equals_eager(("hypot", ("mul", big, big), ("minimum", big, ("py", 1.0))),
                            like=xp.zeros(1))


# ---- named nodes ---------------------------------------------------------------------------------


def test_nodes_have_named_fields_and_one_constructor():
    """`expr.make_node` is the one constructor: with the children's keys and size given (as the
    generated operators give them) or computed from the children, the same node; its fields
    read by name."""
    s = gs.asscalar(1.5)
    with gs.lazy(True):
        built = (s * 2.0 + 1.0)._node
    assert type(built) is expr.Node
    inner, constant = built.children
    assert type(inner) is expr.Node and isinstance(constant, np.float64)
    assert built.op.name == "add" and built.size == 2 and inner.size == 1
    assert (built.key, built.size, built.op, built.children) == tuple(built)
    again = expr.make_node(built.op, built.children)  # keys and size computed
    assert again == built and again.key == built.key
    leaf, two = inner.children
    assert leaf is s.array and two == 2.0
    assert expr.make_node(inner.op, (leaf, two)).key == inner.key
    assert expr.make_node(inner.op, (np.asarray(1.0), two)).key == inner.key  # another leaf
    assert expr.make_node(inner.op, (np.float64(1.0), two)).key != inner.key  # a constant
    assert repr(built).startswith("Node(Op(add(")


# ---- node fields by index, cache hits ----------------------------------------------------------


def test_node_fields_by_index_are_its_named_fields():
    """The hot paths read a node by the index constants; they must name the same fields."""
    node = ((gs.asscalar(1.5) * 2.0) + 1.0)._node
    by_index = (node[expr.KEY], node[expr.SIZE], node[expr.OP], node[expr.CHILDREN])
    assert by_index == (node.key, node.size, node.op, node.children)
    assert node.size == 2 and node.op.name == "add" and expr.is_node(node.children[0])


def test_a_cache_hit_counts_as_a_use_and_a_miss_gives_the_default():
    """`BoundedCache.hit` (the fold's plan lookup) is `get` without building a value: a hit
    makes the entry the most recently used (kept when the bound evicts), a miss builds nothing
    and answers the default."""
    previous = expr.set_cache_size(2)
    try:
        cache, built = expr.BoundedCache(), []

        def build(name: str) -> str:
            built.append(name)
            return name.upper()

        for name in "ab":
            cache.get(name, build, name)
        missing = object()
        assert cache.hit("z", missing) is missing and "z" not in cache and built == ["a", "b"]
        assert cache.hit("a", missing) == "A"
        cache.get("c", build, "c")  # evicts the least recently used: b, not a
        assert "a" in cache and "b" not in cache and "c" in cache
    finally:
        expr.set_cache_size(previous)


def test_the_cache_bound_is_public_and_refuses_bad_input():
    """`gs.set_cache_size(n)` sets the bound of every Python-side cache (plans, kernels,
    dispatch plans, loop pins) and returns the old one; `gs.cache_size()` reads it."""
    previous = gs.set_cache_size(7)
    try:
        assert gs.cache_size() == 7 and expr.cache_size() == 7
        for bad, error in ((0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)):
            with pytest.raises(error, match="cache"):
                gs.set_cache_size(bad)
        assert gs.cache_size() == 7  # a refused bound changes nothing
    finally:
        assert gs.set_cache_size(previous) == 7


def test_a_bounded_cache_reads_and_writes_like_the_seams_dict_caches():
    """`BoundedCache` keys / [] / update / clear (what `CupyBackend.seam_cache` does to the
    optimizer's kernel cache under a test seam) keep the bound and the recency order."""
    previous = expr.set_cache_size(2)
    try:
        cache = expr.BoundedCache()
        cache["a"], cache["b"] = 1, 2
        saved = dict(cache)  # keys() and []
        assert saved == {"a": 1, "b": 2}
        cache.clear()
        assert len(cache) == 0 and "a" not in cache
        cache.update(saved)
        assert cache["a"] == 1  # now the most recently used
        cache["c"] = 3  # evicts b
        assert sorted(cache.keys()) == ["a", "c"]
        with pytest.raises(KeyError):
            cache["b"]
    finally:
        expr.set_cache_size(previous)


# ---- loops CuPy runs otherwise than NumPy ------------------------------------------------------


def test_ldexp_clamps_an_int64_exponent_as_numpy_does_in_the_generated_cuda(nvrtc):
    """NumPy's ldexp clamps an int64 exponent into C int's range (``ldexp(1.5, 2**40)`` is inf);
    CuPy's int64 loop converts it to int, so 2**40 wrapped to 0 (1.5 on an H200). The CUDA
    gpuscalar writes clamps it, for a Python int exponent and a device one, and compiles."""
    pytest.importorskip("cupy")
    from gpuscalar.lazy import codegen

    from .test_codegen import compile_shapes

    s = gs.asscalar(1.5)
    with gs.lazy(True):
        built = [np.ldexp(s, 2**40), np.ldexp(s, gs.asscalar(-(2**40))),
                 np.ldexp(gs.asscalar(np.float32(1.5)), gs.asscalar(np.uint64(7))) * 2.0]
    shapes = {v._node[0]: v._node for v in built}
    for node in shapes.values():
        assert "_gs_int_exponent(" in codegen.materialize_spec(node).operation
    assert compile_shapes(nvrtc, shapes) == len(built)
    assert [v.item() for v in built] == [math.inf, 0.0, 384.0]


def test_an_unfused_replay_clamps_ldexp_and_tests_complex_truth_first():
    """Where CuPy runs an op unfused (a CuPy without the internals codegen reads), the eager
    call gets ldexp's exponent clamped and the truth of complex operands of a ``logical_*``
    loop CuPy lacks (`codegen.unfused_args`), so it gives the float path's value."""
    from gpuscalar.devices import NUMPY
    from gpuscalar.lazy import codegen

    s = gs.asscalar(1.5)
    with gs.lazy(True):
        ldexp = np.ldexp(s, 2**40)._node
        logical_not = np.logical_not(gs.asscalar(0j))._node
    args = codegen.unfused_args(NUMPY, ldexp.op, list(ldexp.children))
    assert args[1] == 2**31 - 1 and args[1].dtype == np.int64
    args = codegen.unfused_args(NUMPY, logical_not.op, list(logical_not.children))
    assert args[0].dtype == np.bool_ and not args[0]


def _walked_leaves(root):
    """The leaves by `postorder` (the definition `leaves_of` must agree with)."""
    return [item for item, is_node in expr.postorder(root) if not is_node]


def test_leaf_readers_read_what_a_walk_reads_for_every_small_shape():
    """`leaves_of` reads a tree of up to `READER_NODES` nodes with its structure's generated
    reader: for unary, binary, nested and left/right-leaning trees, the same objects in the
    same order as a walk, for a second tree of the same structure too (other leaves, the
    reader made by the first); past the size bound it walks."""
    f8 = np.dtype(np.float64)
    add = expr.get_op("ufunc", "add", (f8, f8), (f8,))
    neg = expr.get_op("ufunc", "negative", (f8,), (f8,))

    def shapes(a, b):
        left = expr.make_node(add, (a, np.float64(1.0)))
        right = expr.make_node(add, (np.float64(2.0), b))
        both = expr.make_node(add, (left, right))
        deep = both
        for _ in range(expr.READER_NODES):
            deep = expr.make_node(neg, (deep,))
        return [left, right, both, expr.make_node(neg, (both,)),
                expr.make_node(add, (both, expr.make_node(neg, (a,)))), deep]

    first = shapes(np.asarray(1.0), np.asarray(2.0))
    second = shapes(np.asarray(3.0), np.asarray(4.0))
    for one, other in zip(first, second, strict=True):
        assert one.key == other.key
        for tree in (one, other):
            found, walked = expr.leaves_of(tree), _walked_leaves(tree)
            assert len(found) == len(walked)
            assert all(x is y for x, y in zip(found, walked, strict=True))
    assert first[-1].size > expr.READER_NODES and first[-1].key not in expr._LEAF_READERS
    assert first[2].key in expr._LEAF_READERS


def test_an_argument_reader_splices_the_leaves_into_the_operands():
    """A fold's kernel arguments: the operands with the pending scalar's place taken by its
    leaves, in order, for the scalar first, in the middle or last."""
    f8 = np.dtype(np.float64)
    mul = expr.get_op("ufunc", "multiply", (f8, f8), (f8,))
    leaf = np.asarray(5.0)
    node = expr.make_node(mul, (leaf, np.float64(2.0)))
    for count, position in ((2, 0), (2, 1), (3, 1)):
        operands = tuple(f"op{i}" for i in range(count))
        reader = expr.argument_reader(node, count, position)
        expected = [*operands[:position], *_walked_leaves(node), *operands[position + 1:]]
        got = reader(operands, node)
        assert len(got) == len(expected) and all(x is y for x, y in zip(got, expected,
                                                                        strict=True))


def test_leaf_readers_are_bounded_by_the_cache_size():
    f8 = np.dtype(np.float64)
    add = expr.get_op("ufunc", "add", (f8, f8), (f8,))
    previous = expr.set_cache_size(4)
    try:
        leaf = np.asarray(1.0)
        node = leaf
        for _ in range(10):  # ten structures, each read once
            node = expr.make_node(add, (node, np.float64(1.0)))
            assert expr.leaves_of(node) == _walked_leaves(node)
            assert len(expr._LEAF_READERS) <= 4
    finally:
        expr.set_cache_size(previous)
