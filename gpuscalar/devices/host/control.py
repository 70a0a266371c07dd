"""`gs.while_loop` and `gs.cond` on the host devices (NumPy, the strict device): the host executor.

Why this module exists: it is the "loops" executor (`gpuscalar.control.Loops`) of the devices
that evaluate on the host, one home that both wings' entries name. The predicate reads are not
syncs (they stand for the device's decision: the array's data is already here), and the whole
loop or branch counts as ONE device op, as a graph launch does.

The CPU checks what the GPU records (`gpuscalar.bodies`): a body that does not run (a loop that
runs zero times, the branch not taken) runs once by a *check run* (`check_run`), after which
every array it could have written (the state or operands, and the arrays its functions reach:
`reachable_arrays`) is put back as it was. While a check runs (`bodies.checking`), a loop or
branch nested in it is checked the same way and runs nothing more.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ... import ledger
from ...backend import Backend
from ...bodies import (
    body_rules,
    check_returned_none,
    checking,
    commit,
    count_scalar,
    marked_checking,
    predicate_array,
)
from ...scalar import GPUScalar
from .. import backend_of

__all__ = ["HostLoops", "host_while", "host_cond", "check_run", "reachable_arrays"]


class HostLoops:
    """The host devices' "loops" executor (`gpuscalar.control.Loops`)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def default_device(self) -> object:
        return "cpu"

    def while_loop(self, cond_fn: Callable[..., Any], body: Callable[..., Any],
                   state: tuple[Any, ...], max_iter: int, device: object) -> GPUScalar:
        return host_while(cond_fn, body, state, max_iter, self.backend, device)

    def cond(self, pred: Any, true_fn: Callable[..., Any] | None,
             false_fn: Callable[..., Any] | None, operands: tuple[Any, ...],
             device: object) -> None:
        host_cond(pred, true_fn, false_fn, operands, self.backend)


# ---- check runs: a body checked as a GPU records it, without its effects ---------------------

#: how deep `reachable_arrays` follows functions, containers and objects, and how many values
#: it looks at in all (a bound on the cost of a check run's snapshot)
_REACH_DEPTH = 4
_REACH_LIMIT = 10_000
#: modules whose functions are library code: what their globals hold is not the body's
_LIBRARY_MODULES = ("gpuscalar", "numpy", "cupy", "cupyx", "scipy", "builtins")
_ATOMS = (type(None), bool, int, float, complex, str, bytes, types.ModuleType, type,
          types.BuiltinFunctionType, GPUScalar)


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


# ---- the host executor ------------------------------------------------------------------------


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
