"""The rules of a body recorded once and run many times, and the host executor of device loops.

Why this module exists: `gs.while_loop` and `gs.cond` (`gpuscalar.control`) run their predicate and
bodies under `gs.capture`'s rules on every backend, and two executors carry them out: the host
executor here (NumPy, the strict device: the predicate read is the device's decision, not a sync;
the whole loop is one device op) and the CUDA one (`gpuscalar.devices.cupy.control`, conditional
graph nodes). Both need the same rules (`body_rules`: no sync, no host-to-device copy, no evaluation
cached on a scalar), the same predicate checks and the same loop state (`commit`: a body updates the
state in place and returns None, or returns the new state, which is copied into the state's
buffers); keeping them below both executors is what lets `control` choose between them without an
import circle.

The CPU checks what the GPU records. A GPU records a loop's body once, and both branches of a
`cond`, whatever the predicate says; recording executes nothing. So the host executor checks a
body that does not run (a loop that runs zero times, the branch not taken) by a *check run*
(`check_run`): the body runs once, then every array it could have written (the state or
operands, and the arrays its functions reach: `reachable_arrays`) is put back as it was. While
a check runs (`checking`), a loop or branch nested in it is checked the same way and runs
nothing more. The check run is part of the loop's one device op: counts do not change, and a
loop that runs is not run again.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np

from . import ledger
from .backend import Backend
from .devices import NUMPY, backend_of
from .scalar import GPUScalar, _array_of, _make_array, _wrap

__all__ = ["check_returned_none", "predicate_array", "body_rules", "count_scalar", "host_while",
           "host_cond", "commit", "checking", "check_run", "reachable_arrays",
           "refuse_scalar_state"]

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
    if isinstance(value, (bool, np.bool_)) and not (backend is NUMPY and type(value) is np.bool_):
        raise TypeError(
            f"gs.{what}: the predicate is a Python bool ({value}), decided on the host once; "
            "return a device value instead, e.g. gs.GPUScalar(r) > tol or a 0-d bool array"
        )
    owner: Backend | None
    if isinstance(value, GPUScalar):
        owner, array = value.backend, None
    elif type(value) is np.bool_:  # NumPy's 0-d comparisons give NumPy scalars
        owner, array = NUMPY, np.asarray(value)
    else:
        owner, array = backend_of(value), value
        if owner is None or getattr(value, "ndim", None) != 0:
            raise TypeError(
                f"gs.{what}: the predicate must be a bool GPUScalar or a 0-d bool device array, "
                f"got {_describe(value)}"
            )
    if owner is not backend:
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
        if type(new) is not np.ndarray and isinstance(new, np.generic) and backend is NUMPY:
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
    from .devices.cupy import graphs  # noqa: PLC0415 - graphs imports linalg (cuBLAS): only when looping

    with graphs._guarded(backend, recording=False), ledger.graph_body(), ledger.loop_body():
        yield


def count_scalar(backend: Backend, device: object, count: int) -> GPUScalar:
    """The iteration count as an int64 GPUScalar: a fill kernel, no host-to-device copy."""
    return _wrap(backend, _make_array(backend, count, _INT64, device))


# ---- check runs: a body checked as a GPU records it, without its effects ---------------------

#: True while a body runs only to be checked (`check_run`): nested loops and branches are
#: checked too and run nothing more
_checking: ContextVar[bool] = ContextVar("gpuscalar_checking_body", default=False)

#: how deep `reachable_arrays` follows functions, containers and objects, and how many values
#: it looks at in all (a bound on the cost of a check run's snapshot)
_REACH_DEPTH = 4
_REACH_LIMIT = 10_000
#: modules whose functions are library code: what their globals hold is not the body's
_LIBRARY_MODULES = ("gpuscalar", "numpy", "cupy", "cupyx", "scipy", "builtins")
_ATOMS = (type(None), bool, int, float, complex, str, bytes, types.ModuleType, type,
          types.BuiltinFunctionType, GPUScalar)


def checking() -> bool:
    """Whether the caller runs in a check run (`check_run`): a loop or branch called there is
    checked, never run."""
    return _checking.get()


@contextlib.contextmanager
def marked_checking() -> Iterator[None]:
    """Mark the block as a check run (the CUDA executor records one into a discarded graph)."""
    token = _checking.set(True)
    try:
        yield
    finally:
        _checking.reset(token)


def _names_used(code: types.CodeType) -> Iterator[str]:
    """The global (and attribute) names ``code`` and the functions defined in it use."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names_used(constant)


def _cell_value(cell: Any) -> Any:
    """What a closure cell holds (None while it is empty: a name not assigned yet)."""
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _attributes(value: Any) -> list[Any]:
    """What an object's ``__dict__`` and ``__slots__`` hold (nothing where asking fails)."""
    found: list[Any] = []
    try:
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            found.extend(attributes.values())
        for slot in getattr(type(value), "__slots__", ()):
            if isinstance(slot, str) and hasattr(value, slot):
                found.append(getattr(value, slot))
    except Exception:  # noqa: BLE001 - an object that refuses to be looked at holds nothing here
        return found
    return found


def reachable_arrays(roots: Iterable[Any]) -> list[tuple[Backend, Any]]:
    """The host-evaluated arrays (NumPy, the strict device) reachable from ``roots``: the
    arrays themselves, what containers hold, what functions close over, name as globals or
    take as defaults (not the module-level functions of NumPy, CuPy, SciPy or gpuscalar: their
    caches are no body's state; a body defined inside one is followed), and the attributes
    of other objects, to `_REACH_DEPTH` levels and `_REACH_LIMIT` values."""
    found: dict[int, tuple[Backend, Any]] = {}
    seen: set[int] = set()

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, _ATOMS) or id(value) in seen or len(seen) >= _REACH_LIMIT:
            return
        seen.add(id(value))
        backend = backend_of(value)
        if backend is not None:
            if backend.evaluates_on_host:
                found[id(value)] = (backend, value)
            return
        if depth == 0:
            return
        inner: Iterable[Any]
        if isinstance(value, (tuple, list, set, frozenset)):
            inner = value
        elif isinstance(value, dict):
            inner = value.values()
        elif isinstance(value, functools.partial):
            inner = (value.func, *value.args, *value.keywords.values())
        elif isinstance(value, types.MethodType):
            inner = (value.__func__, value.__self__)
        elif isinstance(value, types.FunctionType):
            library = (value.__module__ or "").split(".")[0] in _LIBRARY_MODULES
            if library and "<locals>" not in value.__qualname__:  # (a body defined there is not)
                return
            cells = [_cell_value(cell) for cell in value.__closure__ or ()]
            named = value.__globals__
            inner = (*cells, *(named[n] for n in set(_names_used(value.__code__)) if n in named),
                     *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values())
        else:
            inner = _attributes(value)
        for item in inner:
            visit(item, depth - 1)

    for root in roots:
        visit(root, _REACH_DEPTH)
    return list(found.values())


def check_run(run: Callable[[], Any], roots: Iterable[Any]) -> None:
    """Run ``run()`` (a body, under `body_rules`) only to check it, then put every array
    reachable from ``roots`` back as it was: what a GPU's recording of the body checks (no
    sync, no upload, the result's form), without what it would do. Floating-point warnings
    are off (a body that does not run may see values it never runs on: 0/0 where nothing is
    left to do), and loops and branches called in it are checked, not run (`checking`)."""
    saved = []
    for backend, array in reachable_arrays(roots):
        data = backend.host_data(array)
        if data.flags.writeable:
            saved.append((data, data.copy()))
    try:
        with marked_checking(), np.errstate(all="ignore"):
            run()
    finally:
        for data, copy in saved:
            data[...] = copy


# ---- the host executor (NumPy, the strict device) ----------------------------------------------


def _decide(backend: Backend, value: Any, what: str) -> bool:
    """The device's decision, read on the host without a sync: the host executor runs only on
    backends that evaluate on the host, where the array's data is already here."""
    return bool(backend.host_data(predicate_array(value, backend, what)))


def host_while(cond_fn: Callable[..., Any], body: Callable[..., Any], state: tuple[Any, ...],
               max_iter: int, backend: Backend, device: object) -> GPUScalar:
    """The loop on the host: as a GPU would, the body is checked even when it never runs (a
    check run), and inside a check run the loop is checked, not run (its count reads 0)."""

    def iteration() -> None:
        commit(body(*state), state, backend)

    count = 0
    with ledger.one_device_op():
        with body_rules(backend):
            if checking():
                predicate_array(cond_fn(*state), backend, "while_loop")
                check_run(iteration, (body, cond_fn, *state))
            else:
                while count < max_iter and _decide(backend, cond_fn(*state), "while_loop"):
                    iteration()
                    count += 1
                if count == 0:
                    check_run(iteration, (body, cond_fn, *state))
        return count_scalar(backend, device, count)


def host_cond(pred: Any, true_fn: Callable[..., Any] | None,
              false_fn: Callable[..., Any] | None, operands: tuple[Any, ...],
              backend: Backend) -> None:
    """The branch on the host: the other one is checked first (a check run), as a GPU records
    both before anything runs, then the taken one runs; inside a check run both are checked."""
    with ledger.one_device_op(), body_rules(backend):
        taken = _decide(backend, pred, "cond")
        check_only = checking()
        branches = [(true_fn, "true_fn", taken), (false_fn, "false_fn", not taken)]
        run_after = None
        for branch, name, runs in branches:
            if branch is None:
                continue

            def run(branch: Callable[..., Any] = branch, name: str = name) -> None:
                check_returned_none(branch(*operands), "cond", name)

            if runs and not check_only:
                run_after = run
            else:
                check_run(run, (branch, *operands))
        if run_after is not None:
            run_after()
