"""The rules of a body recorded once and run many times: what every device loop executor keeps.

Why this module exists: `gs.while_loop` and `gs.cond` (`gpuscalar.control`) run their predicate and
bodies under `gs.capture`'s rules on every backend, and each device's "loops" executor carries
them out: the host one (`gpuscalar.devices.host.control`, NumPy and the strict device: the
predicate read is the device's decision, not a sync; the whole loop is one device op) and the
CUDA one (`gpuscalar.devices.cupy.control`, conditional graph nodes). All need the same rules
(`body_rules`: no sync, no host-to-device copy, no evaluation cached on a scalar), the same
predicate checks and the same loop state (`commit`: a body updates the state in place and returns
None, or returns the new state, which is copied into the state's buffers); keeping them here,
below the executors, is what lets each wing's executor use them without an import circle.

The CPU checks what the GPU records. A GPU records a loop's body once, and both branches of a
`cond`, whatever the predicate says; recording executes nothing. So a body that does not run (a
loop that runs zero times, the branch not taken) is checked all the same, by a *check run*: the
host executor runs it once and puts back every array it could have written
(`gpuscalar.devices.host.control.check_run`); the CUDA executor records it into a graph it
discards. While a check runs (`checking`), a loop or branch nested in it is checked the same way
and runs nothing more. The check run is part of the loop's one device op: counts do not change,
and a loop that runs is not run again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np

from . import ledger
from .backend import Backend
from .capture import _guarded
from .devices import backend_of
from .scalar import GPUScalar, _array_of, _make_array, _wrap

__all__ = ["check_returned_none", "predicate_array", "body_rules", "count_scalar", "commit",
           "checking", "marked_checking", "refuse_scalar_state"]

_INT64 = np.dtype(np.int64)


def check_returned_none(result: Any, what: str, name: str) -> None:
    """A branch of `gs.cond` returns None: it updates its operands in place."""
    if result is not None:
        raise TypeError(
            f"gs.{what}: {name} returned a {type(result).__name__}; it must return None and "
            "update the operand arrays in place (x[...] = new_x, x += dx); a changing scalar "
            "lives in a 0-d array, read with gs.GPUScalar(a)"
        )


def predicate_array(value: Any, backend: Backend, what: str) -> Any:
    """The 0-d bool device array that ``value`` (what ``cond`` returned, or ``pred``) stands
    for, on ``backend``; a pending GPUScalar is evaluated here (under `ledger.loop_body`, not
    cached on it). A Python bool, a non-bool or another backend's value is a `TypeError`."""
    # (NumPy's 0-d comparisons give NumPy scalars: a device value on the host device)
    if isinstance(value, (bool, np.bool_)) and not (backend.host_memory
                                                    and type(value) is np.bool_):
        raise TypeError(
            f"gs.{what}: the predicate is a Python bool ({value}), decided on the host once; "
            "return a device value instead, e.g. gs.GPUScalar(r) > tol or a 0-d bool array"
        )
    owner: Backend | None
    if isinstance(value, GPUScalar):
        owner, array = value.backend, None
    elif type(value) is np.bool_:  # NumPy's 0-d comparisons give NumPy scalars
        array = np.asarray(value)
        owner = backend_of(array)
    else:
        owner, array = backend_of(value), value
        if owner is None or getattr(value, "ndim", None) != 0:
            raise TypeError(
                f"gs.{what}: the predicate must be a bool GPUScalar or a 0-d bool device array, "
                f"got {_describe(value)}"
            )
    if owner is not backend:
        assert owner is not None
        raise TypeError(
            f"gs.{what}: the predicate is a {owner.name} value but the state is on {backend.name}"
        )
    if value.dtype != np.bool_:
        raise TypeError(
            f"gs.{what}: the predicate must have dtype bool, got {value.dtype}; compare it "
            "(e.g. r > tol, labels_changed != 0)"
        )
    return _array_of(value) if array is None else array


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return type(value).__name__ + ("" if shape is None else f" of shape {shape}")


# ---- loop state: in place, or returned (functional) ----------------------------------------------


def refuse_scalar_state(state: tuple[Any, ...]) -> None:
    """A GPUScalar is a value, which never changes: it cannot hold a loop's state."""
    for index, value in enumerate(state):
        if isinstance(value, GPUScalar):
            raise TypeError(
                f"gs.while_loop: state item {index} is a GPUScalar, an immutable value, which "
                "cannot hold loop state; pass a 0-d array instead (e.g. s.array.copy() or "
                "xp.zeros((), dtype)), read in the body with gs.GPUScalar(a); a body may "
                "return a GPUScalar as that item's new value"
            )


def _items(count: int) -> str:
    return f"{count} state item" + ("" if count == 1 else "s")


def _expected(count: int) -> str:
    form = ("the new value of the one state item, or a tuple of it" if count == 1
            else f"a tuple of {count} new values, one per state item")
    return (f"the body must return None (the state arrays updated in place) or {form}: arrays "
            "of the state's shape and dtype, or GPUScalars for 0-d items")


def _new_state(result: Any, state: tuple[Any, ...], backend: Backend) -> list[tuple[Any, Any]]:
    """(state buffer, new value's array) for each item a functional body's ``result`` changes;
    a result of another form is a `TypeError` saying what was expected (the item named)."""
    if isinstance(result, (tuple, list)):
        if len(result) != len(state):
            raise TypeError(f"gs.while_loop: the body returned a {type(result).__name__} of "
                            f"{len(result)} items for {_items(len(state))}; "
                            + _expected(len(state)))
        items: Iterable[Any] = result
    elif len(state) == 1:
        items = (result,)
    else:
        raise TypeError(f"gs.while_loop: the body returned a {type(result).__name__}; "
                        + _expected(len(state)))
    pairs = []
    for index, (new, old) in enumerate(zip(items, state, strict=True)):
        if new is old:
            continue
        if type(new) is not np.ndarray and isinstance(new, np.generic) and backend.host_memory:
            new = np.asarray(new)  # NumPy's 0-d arithmetic gives NumPy scalars
        owner: Backend | None
        if isinstance(new, GPUScalar):
            owner, shape, what = new.backend, (), "a GPUScalar"
        else:
            owner = backend_of(new)
            if owner is None:
                raise TypeError(
                    f"gs.while_loop: the body's new state item {index} is a "
                    f"{type(new).__name__}, not a device value (a Python number is decided on "
                    "the host once); " + _expected(len(state)))
            shape, what = new.shape, "an array"
        if owner is not backend:
            assert owner is not None
            raise TypeError(f"gs.while_loop: the body's new state item {index} is a "
                            f"{owner.name} value but the state is on {backend.name}")
        if shape != old.shape or new.dtype != old.dtype:
            raise TypeError(
                f"gs.while_loop: the body's new state item {index} is {what} of shape {shape} "
                f"and dtype {new.dtype}, but state item {index} has shape {old.shape} and "
                f"dtype {old.dtype}; a new value has its item's shape and dtype (convert "
                "with .astype(...) where the dtype changes)")
        array = _array_of(new) if isinstance(new, GPUScalar) else new
        if array is not old:
            pairs.append((old, array))
    return pairs


def _span(backend: Backend, array: Any) -> tuple[int, int] | None:
    """The addresses ``array``'s elements lie between (None when it has none)."""
    if array.size == 0:
        return None
    start = backend.data_address(array)
    low = sum(s * (n - 1) for s, n in zip(array.strides, array.shape, strict=True) if s < 0)
    high = sum(s * (n - 1) for s, n in zip(array.strides, array.shape, strict=True) if s > 0)
    return start + low, start + high + array.itemsize


def _overlaps(one: tuple[int, int] | None, other: tuple[int, int] | None) -> bool:
    return one is not None and other is not None and one[0] < other[1] and other[0] < one[1]


def commit(result: Any, state: tuple[Any, ...], backend: Backend) -> None:
    """Keep a loop body's ``result`` on the device: None (the body updated the state in place)
    or the new state (`_new_state`), copied into the state's buffers, all values taken before
    any buffer is written: a new value that overlaps a buffer being written (``return r, p``
    for state ``p, r``) is copied aside first. Each copy is a kernel of the body (recorded
    into the body's graph on a GPU)."""
    if result is None:
        return
    pairs = _new_state(result, state, backend)
    targets = [_span(backend, old) for old, _ in pairs]
    xp = backend.xp
    staged = []
    for old, new in pairs:
        if any(_overlaps(_span(backend, new), target) for target in targets):
            new = backend.call(xp.copy, new)
        staged.append((old, new))
    for old, new in staged:
        backend.call(xp.copyto, old, new)


# ---- the rules of a body ------------------------------------------------------------------------


@contextlib.contextmanager
def body_rules(backend: Backend) -> Iterator[None]:
    """What ``cond``, ``body`` and the branches run under: `gs.capture`'s guard (every sync
    raises, the array library's own included), no host-to-device copy (`ledger.graph_body`),
    and no evaluation cached on a scalar (`ledger.loop_body`)."""
    with _guarded(backend, recording=False), ledger.graph_body(), ledger.loop_body():
        yield


def count_scalar(backend: Backend, device: object, count: int) -> GPUScalar:
    """The iteration count as an int64 GPUScalar: a fill kernel, no host-to-device copy."""
    return _wrap(backend, _make_array(backend, count, _INT64, device))


# ---- check runs: a body checked as a GPU records it, without its effects ---------------------

#: True while a body runs only to be checked (a check run): nested loops and branches are
#: checked too and run nothing more
_checking: ContextVar[bool] = ContextVar("gpuscalar_checking_body", default=False)

def checking() -> bool:
    """Whether the caller runs in a check run (the host executor's `check_run`, or a recording
    the CUDA executor discards): a loop or branch called there is checked, never run."""
    return _checking.get()


@contextlib.contextmanager
def marked_checking() -> Iterator[None]:
    """Mark the block as a check run (the host executor runs one and puts back what it wrote;
    the CUDA executor records one into a discarded graph)."""
    token = _checking.set(True)
    try:
        yield
    finally:
        _checking.reset(token)
