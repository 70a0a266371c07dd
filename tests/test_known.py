"""gpuscalar.known: the registry of values the host already read (lifetime, live buffers,
threads)."""

from __future__ import annotations

import gc
import threading

import numpy as np

import gpuscalar as gs
from gpuscalar import known, optim


def test_a_remembered_value_is_found_for_that_array_only():
    a, b = np.zeros(()), np.zeros(())
    known.remember(a, 1.5)
    assert known.value_of(a) == 1.5
    assert known.value_of(b) is known.UNREAD


def test_an_entry_dies_with_its_array_and_is_purged():
    arrays = [np.full((), float(i)) for i in range(known._PURGE_AT + 10)]
    for i, array in enumerate(arrays):
        known.remember(array, float(i))
    before = known.size()
    del arrays, array
    gc.collect()
    known.remember(keep := np.zeros(()), 0.0)  # a registration purges the dead entries
    assert known.size() <= before - known._PURGE_AT
    assert known.value_of(keep) == 0.0


def test_a_new_array_at_a_dead_arrays_address_is_not_known():
    """An id can be reused once its array died: a lookup trusts only a live reference."""
    seen = set()
    for i in range(200):
        array = np.zeros(())
        if id(array) in seen:
            assert known.value_of(array) is known.UNREAD
        known.remember(array, float(i))
        seen.add(id(array))
        del array


def test_a_live_buffer_is_never_registered():
    counter = np.zeros(())
    known.mark_live(counter)
    known.remember(counter, 0.0)
    assert known.value_of(counter) is known.UNREAD
    other = np.zeros(())
    known.remember(other, 2.0)
    known.mark_live(other)  # marking drops a value registered before
    assert known.value_of(other) is known.UNREAD


def test_an_array_type_without_weak_references_is_skipped():
    class Plain:
        __slots__ = ()

    known.remember(Plain(), 1.0)  # nothing to register it with: no error, not known
    assert known.value_of(Plain()) is known.UNREAD


def test_the_step_counter_is_never_a_stale_known_value(xp):
    p = xp.zeros(2)
    opt = optim.SGD([p], lr=0.1)
    assert int(opt.step_count) == 0
    opt.step([xp.ones(2)])
    assert int(opt.step_count) == 1  # a new read of the rewritten counter, not the old value
    with gs.count_syncs() as counter:
        assert int(opt.step_count + 1) == 2
    assert counter.count == 1


def test_python_value_is_what_item_gives():
    for value in (np.float32(1.5), np.int8(-3), np.bool_(True), np.complex64(1 + 2j),
                  np.asarray(7, dtype=np.uint16)):
        result = known.python_value(value)
        assert type(result) is type(value.item()) and result == value.item()


def test_threads_register_and_look_up_at_once(switch_often):
    """Many threads register, look up and drop arrays together: every lookup gives the value
    of its own array or UNREAD, never another array's (purges run meanwhile)."""
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work(seed: int) -> None:
        try:
            start.wait()
            for i in range(800):
                array = np.full((), float(seed * 10_000 + i))
                known.remember(array, float(seed * 10_000 + i))
                value = known.value_of(array)
                assert value in (known.UNREAD, float(seed * 10_000 + i))
                del array
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_every_thread_using_an_incoming_array_waits_for_it():
    """A non-blocking collective's receive buffer: whichever threads use it first, each returns
    from `arrive` only once the data is there (the entry is dropped after the wait)."""
    buffer = np.zeros(())
    done = threading.Event()
    lock = threading.Lock()

    def wait() -> None:  # as gpuscalar.devices.host.mpi's: locked, completes once
        with lock:
            if not done.is_set():
                done.wait(0.2)
                buffer[...] = 7.0
                done.set()

    known.expect(buffer, wait)
    seen: list[float] = []
    start = threading.Barrier(4)

    def use() -> None:
        start.wait()
        known.arrive(buffer)
        seen.append(float(buffer))

    threads = [threading.Thread(target=use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [7.0] * 4
    assert id(buffer) not in known.INCOMING


def test_unread_positions_name_each_unregistered_array_once_and_skip_constants():
    a, b, c = np.zeros(()), np.zeros(()), np.zeros(())
    known.remember(b, 2.0)
    leaves = [a, np.float64(1.0), b, a, c, b, np.int64(3), c]
    assert known.unread_positions(leaves) == [0, 4]
    known.remember(a, 1.0)
    assert known.unread_positions(leaves) == [4]
    assert known.unread_positions([b, np.float64(0.0), b]) == []
