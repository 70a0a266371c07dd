"""Threads: a GPUScalar is shared like a float, and the process-wide tables stay consistent.

Each race is first forced deterministically (a barrier or an event injected at the racy point,
so the bad interleaving happens on every run), then stressed with a tiny switch interval. On
NumPy: the races are in gpuscalar's Python, whatever the backend.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import arrays, reads
from gpuscalar import scalar as scalar_module
from gpuscalar.devices.host.backend import NumpyBackend
from gpuscalar.lazy import expr

from .helpers import host

F64 = np.dtype(np.float64)
#: Long enough for the other thread to reach the racy point; a fixed lock makes it expire.
MEET_TIMEOUT = 0.3
_fresh = count()  # unique values, so every op and structure below is new to the process


def _run_threads(*targets: Callable[[], Any]) -> list[Any]:
    """Run each target in its own thread; their results, or re-raise the first error."""
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def run(i: int, target: Callable[[], Any]) -> None:
        try:
            results[i] = target()
        except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a thread hung"
    if errors:  # the cause first, before the broken barriers it left behind
        errors.sort(key=lambda error: isinstance(error, threading.BrokenBarrierError))
        raise errors[0]
    return results


class _MeetOnSecondHash:
    """A hashable whose second hash in each thread (a table *store*, after the lookup missed)
    waits for the other threads': all then sit between "not in the table" and "stored", the
    window in which an unlocked table hands out one id twice (or two ids for one op). A locked
    miss path keeps the others out of that window: the wait times out, each proceeds alone."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier, self.hashes, self.value = barrier, threading.local(), next(_fresh)

    def __hash__(self) -> int:
        count = self.hashes.count = getattr(self.hashes, "count", 0) + 1
        if count == 2:
            try:
                self.barrier.wait(MEET_TIMEOUT)
            except threading.BrokenBarrierError:
                pass
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        return self is other


def test_two_new_ops_interned_together_get_distinct_ids():
    barrier = threading.Barrier(2)
    params = [_MeetOnSecondHash(barrier), _MeetOnSecondHash(barrier)]
    ops = _run_threads(*(lambda p=p: expr.get_op("round", "round", (F64,), (F64,), 0, p)
                         for p in params))
    assert ops[0] is not ops[1]
    assert ops[0].id != ops[1].id  # the same id would share keys, plans and kernels
    for op, param in zip(ops, params, strict=True):
        assert op.param is param
        assert expr._OPS_BY_ID[op.id] is op


def test_two_new_structures_interned_together_get_distinct_keys():
    barrier = threading.Barrier(2)
    structures = [("test", _MeetOnSecondHash(barrier)), ("test", _MeetOnSecondHash(barrier))]
    keys = _run_threads(*(lambda s=s: expr.intern_key(s) for s in structures))
    assert keys[0] != keys[1]
    for key, structure in zip(keys, structures, strict=True):
        assert expr.find_key(structure) == key
        assert expr._KEY_STRUCTURE[key] is structure


def test_many_threads_interning_the_same_new_op_share_one():
    threads = 4
    param = _MeetOnSecondHash(threading.Barrier(threads))
    ops = _run_threads(*[lambda: expr.get_op("round", "round", (F64,), (F64,), 0, param)]
                       * threads)
    assert all(op is ops[0] for op in ops)
    assert expr._OPS_BY_ID[ops[0].id] is ops[0]


def test_threads_starting_on_a_backend_together_share_its_scalar_classes(monkeypatch):
    """``type(a) is type(b)`` is the fast path's same-backend test: one class pair a backend."""
    backend, barrier = NumpyBackend(), threading.Barrier(2)
    real_install = scalar_module._install_fast_operators

    def install_slowly(*args: Any) -> None:  # the other thread arrives meanwhile, unless locked
        try:
            barrier.wait(MEET_TIMEOUT)
        except threading.BrokenBarrierError:
            pass
        real_install(*args)

    monkeypatch.setattr(scalar_module, "_install_fast_operators", install_slowly)
    first, second = _run_threads(*[lambda: scalar_module._classes_for(backend)] * 2)
    assert first["f"] is second["f"] and first["c"] is second["c"]
    assert backend.__dict__["_scalar_classes"] is first


@pytest.fixture
def second_waits_for_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Wrap functions of gpuscalar.scalar (or .arrays) so that two threads both enter one, then
    one completes its call before the other starts (the first to enter, or the call to the function
    installed with ``first=True``): the second then works on a scalar that was pending when it
    looked and is materialized now."""
    barrier, first_done = threading.Barrier(2), threading.Event()
    order: list[int] = []
    lock = threading.Lock()

    def install(name: str, first: bool | None = None) -> None:
        # the array side: gs.arrays; a pending scalar's host read: gs.reads
        module = arrays if name == "_fused" else reads if name == "read_pending" else \
            scalar_module
        real = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with lock:
                order.append(threading.get_ident())
                goes_first = len(order) == 1 if first is None else first
            barrier.wait(5)
            if goes_first:
                try:
                    return real(*args, **kwargs)
                finally:
                    first_done.set()
            assert first_done.wait(5)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    yield install


def _pending_scalar() -> tuple[gs.GPUScalar, float]:
    """A fresh pending scalar larger than `expr.KEEP_NODES` (an array op consuming it keeps
    it: materializes it as a side output) and its value."""
    base = 1.0 + next(_fresh)
    s = (((gs.asscalar(base) * 3.0 + 0.5) - 0.25) * 2.0) + 1.0
    assert not s.is_materialized and s._node[1] > expr.KEEP_NODES
    return s, (((base * 3.0 + 0.5) - 0.25) * 2.0) + 1.0


def test_concurrent_first_reads_of_one_pending_scalar(second_waits_for_first):
    second_waits_for_first("_materialize")
    s, expected = _pending_scalar()
    values = _run_threads(s.item, lambda: float(s))
    assert values == [expected, expected]
    assert s.is_materialized and float(s) == expected


def test_consuming_a_pending_scalar_another_thread_materializes(second_waits_for_first):
    second_waits_for_first("_fused")
    x = np.arange(4.0)
    s, expected = _pending_scalar()
    results = _run_threads(lambda: x * s, lambda: x + s)
    np.testing.assert_array_equal(host(results[0]), np.arange(4.0) * expected)
    np.testing.assert_array_equal(host(results[1]), np.arange(4.0) + expected)


def test_consuming_while_another_thread_reads(second_waits_for_first):
    """One thread reads the value (materializing it) while another folds it into an array op,
    having looked when it was still pending."""
    second_waits_for_first("read_pending", first=True)
    second_waits_for_first("_fused", first=False)
    x = np.arange(3.0)
    s, expected = _pending_scalar()
    got = _run_threads(lambda: x - s, lambda: float(s))
    np.testing.assert_array_equal(host(got[0]), np.arange(3.0) - expected)
    assert got[1] == expected


# ---- stress: tiny switch interval, many threads ---------------------------------------------


class _Fresh:
    """A new hashable hashed in Python: a thread can be switched out while a table hashes it
    (interning plain ints and dtypes runs in C, where CPython 3.11 rarely switches)."""

    def __init__(self) -> None:
        self.value = next(_fresh)

    def __hash__(self) -> int:
        return hash(self.value)


def test_stress_new_ops_and_keys_from_many_threads(switch_often):
    """Threads intern fresh ops and structures at once: every id and key names its own."""
    threads, per_thread = 8, 2000
    start = threading.Barrier(threads)

    def work() -> list[tuple[expr.Op, Any, tuple, int]]:
        start.wait(5)
        made = []
        for _ in range(per_thread):
            param = _Fresh()
            op = expr.get_op("round", "round", (F64,), (F64,), 0, param)
            structure = (op.id, expr.leaf_key(F64), _Fresh())
            made.append((op, param, structure, expr.intern_key(structure)))
        return made

    results = [item for made in _run_threads(*[work] * threads) for item in made]
    ids, keys = {op.id for op, *_ in results}, {key for *_, key in results}
    assert len(ids) == len(results), f"{len(results) - len(ids)} ops share an id"
    assert len(keys) == len(results), f"{len(results) - len(keys)} structures share a key"
    for op, param, structure, key in results:
        assert op.param == param and expr._OPS_BY_ID[op.id] is op
        assert expr._KEY_STRUCTURE[key] == structure and expr.find_key(structure) == key


def test_stress_threads_share_pending_scalars(switch_often):
    """Rounds of fresh pending scalars, each read, consumed and built on by every thread at
    once; every result is the float arithmetic's."""
    threads, rounds = 6, 500
    x = np.arange(5.0)
    shared: list[tuple[gs.GPUScalar, float]] = []
    ready = threading.Barrier(threads + 1)
    go = threading.Barrier(threads + 1)

    def worker(i: int) -> list[str]:
        try:
            return uses(i)
        except BaseException:
            ready.abort()  # the other threads stop at once rather than wait out the barriers
            go.abort()
            raise

    def uses(i: int) -> list[str]:
        failures = []
        for _ in range(rounds):
            ready.wait(10)
            go.wait(10)
            s, value = shared[-1]
            for action in range(i, i + 3):  # each thread starts with a different use of s
                if action % 3 == 0 and float(s) != value:
                    failures.append(f"read {float(s)} != {value}")
                elif action % 3 == 1 and not np.array_equal(host(x * s), x * value):
                    failures.append(f"x * s gave {host(x * s)}")
                elif action % 3 == 2 and bool((s + 1.0) * 2.0 < value * 4.0) != (
                        (value + 1.0) * 2.0 < value * 4.0):
                    failures.append("built comparison differs")
        return failures

    def main() -> None:
        for r in range(rounds):
            s = gs.asscalar(0.25 + r) * 2.0 - 1.0
            for _ in range(r % 5):  # pending chains of several lengths (some past KEEP_NODES)
                s = s + 0.5
            shared.append((s, (0.25 + r) * 2.0 - 1.0 + 0.5 * (r % 5)))
            ready.wait(10)
            go.wait(10)

    results = _run_threads(main, *(lambda i=i: worker(i) for i in range(threads)))
    failures = [f for got in results[1:] for f in got]
    assert not failures, failures[:5]


# ---- bounded plan cache ---------------------------------------------------------------------


def test_plan_cache_is_a_bounded_lru():
    """Structure plans share the one bound of gpuscalar.lazy's caches (`set_cache_size`)."""
    previous = expr.set_cache_size(3)
    try:
        a = gs.asscalar(2.0)
        shapes = [a + 1.0, a * 2.0, a - 3.0, a / 4.0]
        keys = [s._node.key for s in shapes]
        for s in shapes[:3]:
            expr.plan_of(s._node)
        expr.plan_of(shapes[0]._node)  # used again: the most recent
        expr.plan_of(shapes[3]._node)  # a fourth: drops the least recently used (a * 2.0)
        assert len(expr._PLANS) == 3
        assert set(expr._PLANS) == {keys[0], keys[2], keys[3]}
        # A dropped plan is rebuilt from its key, the same.
        rebuilt = expr.plan_for_key(keys[1])
        assert rebuilt.steps == expr.Plan(keys[1]).steps and rebuilt.key == keys[1]
        assert float(shapes[1]) == 4.0
    finally:
        expr.set_cache_size(previous)
    assert expr.cache_size() == previous


def test_stress_an_all_threads_counter_counts_every_read_and_op_exactly(switch_often):
    """One counter that sees every thread (what `gpuscalar profile` and the pytest plugin use),
    many threads reading at once: every sync and device op is counted once, at its line."""
    threads, per_thread = 8, 300
    start = threading.Barrier(threads)
    x = np.arange(3.0)

    def work() -> None:
        start.wait(5)
        for _ in range(per_thread):
            float(gs.sum(x))  # one device op, one sync

    with gs.count_syncs(all_threads=True) as everywhere:
        _run_threads(*[work] * threads)
    assert everywhere.count == everywhere.device_ops == threads * per_thread
    assert {(r.function, r.reason) for r in everywhere.records} == {("work", "float")}


def test_keys_swept_while_threads_build_nodes_keep_describing_their_nodes():
    """Structure keys are swept (`gpuscalar.lazy.keytable`) while threads build, drop and
    rebuild the same shapes: every node's key still describes its own tree (never a dropped
    or another structure's), and its value is the eager one."""
    import sys

    add = expr.get_op("ufunc", "add", (F64, F64), (F64,))
    mul = expr.get_op("ufunc", "multiply", (F64, F64), (F64,))
    leaf = np.asarray(1.5)

    def build(seed: int) -> int:
        checked = 0
        for index in range(seed, seed + 400):
            node, value = leaf, np.float64(1.5)
            for bit in range(index.bit_length()):
                op = mul if index >> bit & 1 else add
                node = expr.make_node(op, (node, np.float64(0.5)))
                value = value * 0.5 if op is mul else value + 0.5
            ops = [item.op for item, is_node in expr.postorder(node) if is_node]
            assert [op for op, _ in expr.Plan(node.key).steps] == ops
            assert expr.evaluate_on_host(node, np.asarray) == value
            checked += 1
        return checked

    previous, interval = expr.set_cache_size(2), sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        assert _run_threads(*(lambda s=s: build(s) for s in (1 << 10, 1 << 10, 3 << 9, 1 << 11))
                            ) == [400] * 4
    finally:
        sys.setswitchinterval(interval)
        expr.set_cache_size(previous)
