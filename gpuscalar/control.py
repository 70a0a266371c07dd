"""Device-side control flow: `while_loop` and `cond`, loops and branches decided on the device.

Why this module exists: once arithmetic is sync-free, the syncs left in a program are control
flow (``while residual > tol``, ``if not converged``). CUDA 12.3+ graphs have conditional nodes
(IF, WHILE) whose body runs while a device flag says so, so a whole solve can be one launch and
no sync. These functions give that to CuPy users, with the same semantics on every backend:

- ``gs.while_loop(cond, body, *state, max_iter)`` runs ``body(*state)`` while ``cond(*state)``
  (a bool GPUScalar or 0-d bool device array) holds and fewer than ``max_iter`` iterations have
  run; returns the number of iterations as an int64 GPUScalar (no sync). ``state`` is device
  arrays (a changing scalar in a 0-d array) that ``body`` updates in place, or whose new values
  it returns (JAX-style; copied into the state's buffers on the device). Either way the arrays
  passed hold the final state after the loop.
- ``gs.cond(pred, true_fn, false_fn, *operands)`` runs one branch (either may be None).

``cond``, ``body`` and the branches follow `gs.capture`'s rules: no sync (`SyncError` naming
the user's line), no host-to-device copy, and a pending GPUScalar made outside and used inside
is evaluated where it is used, never cached on the scalar (`ledger.loop_body`): it is still
pending after the loop. A GPU records a body once, and both branches of a ``cond``: so on every
backend a body is checked (no sync, no upload, its result's form) even when the loop runs zero
times, and both branches are checked though one runs (`bodies.checking`).

This module is the device-neutral front (argument checks, placement); each device runs loops
and branches with its "loops" executor (`Backend.executor`, protocol `Loops` below). On NumPy
and the strict device, `gpuscalar.devices.host.control` runs them on the host: the predicate
reads are not syncs (they stand for the device's decision), and the whole loop or branch counts
as ONE device op, as a graph launch does. On CuPy, `gpuscalar.devices.cupy.control` records
conditional nodes (or falls back to a host loop with one counted sync per iteration, with a
warning, where conditional nodes are unavailable).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .backend import Backend
from .bodies import predicate_array, refuse_scalar_state
from .devices import HOST, backend_of, default_backend
from .scalar import GPUScalar

__all__ = ["while_loop", "cond", "Loops"]


class Loops(Protocol):
    """A device's "loops" executor (``backend.executor("loops")``): what `while_loop` and `cond`
    hand a loop or branch to, its arguments checked and placed. Each runs under the rules of
    `gpuscalar.bodies` (no sync, no upload, nothing cached on a scalar; a body checked even
    where it does not run) and counts as one device op. CuPy's
    (`gpuscalar.devices.cupy.control`) records conditional graph nodes; the host's
    (`gpuscalar.devices.host.control`, NumPy and the strict device) runs them on the host."""

    def default_device(self) -> object:
        """The device a loop or branch without device arrays runs on."""
        ...

    def while_loop(self, cond: Callable[..., Any], body: Callable[..., Any],
                   state: tuple[Any, ...], max_iter: int, device: object) -> GPUScalar:
        """`gpuscalar.control.while_loop` on this device: the iteration count, as an int64
        GPUScalar on ``device``."""
        ...

    def cond(self, pred: Any, true_fn: Callable[..., Any] | None,
             false_fn: Callable[..., Any] | None, operands: tuple[Any, ...],
             device: object) -> None:
        """`gpuscalar.control.cond` on this device."""
        ...

# ---- argument checks ----------------------------------------------------------------------------


def _check_callable(value: Any, what: str, name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not callable(value):
        allowed = "a callable or None" if optional else "a callable"
        raise TypeError(f"gs.{what}: {name} must be {allowed}, got {type(value).__name__}")


def _check_max_iter(max_iter: Any) -> int:
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)):
        raise TypeError(
            f"gs.while_loop: max_iter must be a Python int >= 0, got {type(max_iter).__name__} "
            "(a loop on a GPU cannot be interrupted, so it needs a bound)"
        )
    if max_iter < 0:
        raise ValueError(f"gs.while_loop: max_iter must be >= 0, got {max_iter}")
    return int(max_iter)


def _placement(what: str, values: tuple[Any, ...]) -> tuple[Backend, object]:
    """The backend and device of the state (or operands): all device arrays or GPUScalars on
    one backend and device; with none, CuPy's current device when a GPU is present, else NumPy."""
    found: tuple[Backend, object] | None = None
    for index, value in enumerate(values):
        if isinstance(value, GPUScalar):
            where: tuple[Backend, object] = (value.backend, value.device)
        else:
            backend = backend_of(value)
            if backend is None:
                raise TypeError(
                    f"gs.{what}: argument {index} is a {type(value).__name__}; the state is "
                    "device arrays (close over anything else)"
                )
            where = (backend, backend.device_of(value))
        if found is None:
            found = where
        elif where[0] is not found[0] or where[1] != found[1]:
            raise ValueError(
                f"gs.{what}: argument {index} is on {where[0].name} device {where[1]!r} but an "
                f"earlier one on {found[0].name} device {found[1]!r}"
            )
    if found is not None:
        return found
    backend = default_backend()
    loops: Loops = backend.executor("loops")
    return backend, loops.default_device()


# ---- the public functions -----------------------------------------------------------------------


def while_loop(cond: Callable[..., Any], body: Callable[..., Any], *state: Any,
               max_iter: int) -> GPUScalar:
    """Run ``body(*state)`` while ``cond(*state)`` holds and fewer than ``max_iter`` iterations
    have run, deciding on the device; returns the number of iterations as an int64 GPUScalar.

    ``cond`` returns a bool GPUScalar or 0-d bool device array (a Python bool is a
    `TypeError`). ``state`` is device arrays (a changing scalar lives in a 0-d array; a
    GPUScalar, a value that never changes, cannot be state). ``body`` either updates them in
    place and returns None, or returns their new values (a tuple with one per state item, or
    the one value for a single item: arrays of the item's shape and dtype, GPUScalars for 0-d
    items), which the loop copies into the state's arrays on the device. Either way the arrays
    passed hold the final state afterwards. Neither function may sync or copy host data to the
    device. ``max_iter`` (a required keyword, an int >= 0) bounds the loop: one running on a
    GPU cannot be interrupted.
    """
    _check_callable(cond, "while_loop", "cond")
    _check_callable(body, "while_loop", "body")
    limit = _check_max_iter(max_iter)
    refuse_scalar_state(state)
    backend, device = _placement("while_loop", state)
    loops: Loops = backend.executor("loops")
    return loops.while_loop(cond, body, state, limit, device)


def cond(pred: Any, true_fn: Callable[..., Any] | None, false_fn: Callable[..., Any] | None,
         *operands: Any) -> None:
    """Run ``true_fn(*operands)`` if the device predicate ``pred`` (a bool GPUScalar or 0-d
    bool device array) holds, else ``false_fn(*operands)``, deciding on the device; either
    branch may be None. Branches update arrays in place and return None; they may not sync or
    copy host data to the device. Both are checked, as a GPU records both: the branch not taken
    runs once on the CPU backends only to be checked, its writes undone."""
    _check_callable(true_fn, "cond", "true_fn", optional=True)
    _check_callable(false_fn, "cond", "false_fn", optional=True)
    if type(pred) is np.bool_:  # NumPy's 0-d comparisons give NumPy scalars
        backend, device = _placement("cond", (np.asarray(pred), *operands))
    elif isinstance(pred, GPUScalar) or backend_of(pred) is not None:
        backend, device = _placement("cond", (pred, *operands))
    else:  # not a device value: the error saying what a predicate is
        raise AssertionError(predicate_array(pred, HOST, "cond"))  # (always raises)
    loops: Loops = backend.executor("loops")
    loops.cond(pred, true_fn, false_fn, operands, device)
