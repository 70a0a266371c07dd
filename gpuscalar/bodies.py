"""The rules of a body recorded once and run many times, and the host executor of device loops.

Why this module exists: `gs.while_loop` and `gs.cond` (`gpuscalar.control`) run their predicate
and bodies under `gs.capture`'s rules on every backend, and two executors carry them out: the
host executor here (NumPy, the strict device: the predicate read is the device's decision, not a
sync; the whole loop is one device op) and the CUDA one (`gpuscalar.cuda.control`, conditional
graph nodes). Both need the same rules (`body_rules`: no sync, no host-to-device copy, no
evaluation cached on a scalar) and the same predicate checks; keeping them below both executors
is what lets `control` choose between them without an import circle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import ledger
from .backend import NUMPY, Backend, backend_of
from .scalar import GPUScalar, _array_of, _make_array, _wrap

__all__ = ["check_returned_none", "predicate_array", "body_rules", "count_scalar", "host_while",
           "host_cond"]

_INT64 = np.dtype(np.int64)


def check_returned_none(result: Any, what: str, name: str) -> None:
    """A body or branch returns None: the state is updated in place (a functional, JAX-style
    body returning new state would otherwise loop until ``max_iter``)."""
    if result is not None:
        raise TypeError(
            f"gs.{what}: {name} returned a {type(result).__name__}; it must return None and "
            "update the state arrays in place (x[...] = new_x, x += dx); a changing scalar "
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


# ---- the rules of a body ------------------------------------------------------------------------


@contextlib.contextmanager
def body_rules(backend: Backend) -> Iterator[None]:
    """What ``cond``, ``body`` and the branches run under: `gs.capture`'s guard (every sync
    raises, the array library's own included), no host-to-device copy (`ledger.graph_body`),
    and no evaluation cached on a scalar (`ledger.loop_body`)."""
    from .cuda import graphs  # noqa: PLC0415 - graphs imports linalg (cuBLAS): only when looping

    with graphs._guarded(backend, recording=False), ledger.graph_body(), ledger.loop_body():
        yield


def count_scalar(backend: Backend, device: object, count: int) -> GPUScalar:
    """The iteration count as an int64 GPUScalar: a fill kernel, no host-to-device copy."""
    return _wrap(backend, _make_array(backend, count, _INT64, device))


# ---- the host executor (NumPy, the strict device) ----------------------------------------------


def _decide(backend: Backend, value: Any, what: str) -> bool:
    """The device's decision, read on the host without a sync: the host executor runs only on
    backends that evaluate on the host, where the array's data is already here."""
    return bool(backend.host_data(predicate_array(value, backend, what)))


def host_while(cond_fn: Callable[..., Any], body: Callable[..., Any], state: tuple[Any, ...],
                max_iter: int, backend: Backend, device: object) -> GPUScalar:
    count = 0
    with ledger.one_device_op():
        with body_rules(backend):
            while count < max_iter and _decide(backend, cond_fn(*state), "while_loop"):
                check_returned_none(body(*state), "while_loop", "body")
                count += 1
        return count_scalar(backend, device, count)


def host_cond(pred: Any, true_fn: Callable[..., Any] | None,
               false_fn: Callable[..., Any] | None, operands: tuple[Any, ...],
               backend: Backend) -> None:
    with ledger.one_device_op(), body_rules(backend):
        branch, name = (true_fn, "true_fn") if _decide(backend, pred, "cond") else (
            false_fn, "false_fn")
        if branch is not None:
            check_returned_none(branch(*operands), "cond", name)
