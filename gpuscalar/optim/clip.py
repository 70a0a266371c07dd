"""Sync-free gradient clipping and the finiteness flag that feeds ``skip_if``.

Why this module exists: "clip to a norm" and "skip this step if the gradients overflowed" are
where training loops usually read a device value on the host (``if norm > max: ...``,
``if not isfinite(loss): continue``). Here both stay on the device: the clipping coefficient is
computed and applied as device scalars, and `all_finite` returns a bool GPUScalar that every
optimizer step (and `adam_step`, `sgd_step`, ...) accepts as ``skip_if``, read by the kernel.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .. import reduce
from ..arrays import apply_ufunc
from ..backend import Backend
from ..devices import backend_of
from ..math import minimum
from ..scalar import GPUScalar, _array_of
from .checks import check_array, describe, hyper

__all__ = ["clip_grad_norm", "all_finite"]


def clip_grad_norm(grads: Any, max_norm: Any, norm_type: float = 2.0, *,
                   comm: Any = None) -> GPUScalar:
    """Scale ``grads`` in place so their total ``norm_type``-norm is at most ``max_norm``.

    PyTorch's ``clip_grad_norm_``: the coefficient is ``min(1, max_norm / (norm + 1e-6))``,
    computed and applied on the device (no ``if``, no sync). Returns the total norm before
    clipping as a GPUScalar. ``grads``: as PyTorch, one array (any ndim: the same as
    ``[grads]``, never split into its rows or elements) or an iterable (list, tuple,
    generator) of float32/float64 arrays (`gpuscalar.reduce.array_items`); not a GPUScalar,
    which cannot be scaled in place. ``norm_type``: a positive number or ``math.inf``;
    ``max_norm``: a number >= 0 or a GPUScalar. Device ops: the total norm
    (`gpuscalar.global_norm`) and one multiply per array (the coefficient, when lazy, computed
    inside each multiply's kernel).

    ``comm``: the user's own communicator (`gpuscalar.global_norm`'s ``comm``), for sharded
    gradients (each process holds a different part of the parameters): the total norm is the
    norm of every process's gradients together, with ONE collective of one scalar (MPI: one
    counted sync; NCCL: none), and every process scales its part by the same coefficient, as
    one process clipping all the gradients would. Anything else is a TypeError naming it,
    before any device work. (Data-parallel gradients, averaged first, are the same on every
    process: clip them without ``comm``.)
    """
    if comm is not None:
        reduce.checked_comm(comm, "clip_grad_norm")
    items, single = reduce.array_items(grads, "clip_grad_norm", "grads", "gradient array")
    names = ["grads"] if single else [f"grads[{i}]" for i in range(len(items))]
    for g, what in zip(items, names, strict=True):
        if isinstance(g, GPUScalar):
            raise TypeError(f"{what} must be a NumPy or CuPy array, got a GPUScalar of dtype "
                            f"{g.dtype}, which cannot be scaled in place")
    backend = check_array(items[0], names[0])
    device = backend.device_of(items[0])
    for g, what in zip(items[1:], names[1:], strict=True):
        other = check_array(g, what)
        if other is not backend:
            raise TypeError(f"{what} is a {other.name} array but grads[0] is {backend.name}")
        if backend.multi_device and backend.device_of(g) != device:
            raise ValueError(f"{what} is on device {backend.device_of(g)!r} but grads[0] on "
                             f"{device!r}")
    order: Any = norm_type  # (checked as what users may pass, not as annotated)
    if (isinstance(order, (bool, np.bool_, GPUScalar))
            or not isinstance(order, numbers.Real) or not float(order) > 0):  # (NaN too)
        raise ValueError(
            f"norm_type must be a positive number or math.inf, got {describe(norm_type)}"
        )
    max_norm = hyper(max_norm, "max_norm", backend, device)
    total = reduce.global_norm(items, ord=norm_type, comm=comm)
    # as PyTorch, the coefficient is applied in each gradient's dtype; when lazy, each multiply
    # computes it in its own kernel (no launch for the coefficient)
    coef = minimum(max_norm / (total + 1e-6), 1.0)
    for g in items:
        apply_ufunc("multiply", g, coef, out=g)
    return total


def all_finite(arrays: Any) -> GPUScalar:
    """Whether every element of every array is finite, as a bool GPUScalar (no sync).

    For loss scaling: ``opt.step(grads, skip_if=~all_finite(grads))``. ``arrays``: one array
    (any ndim, 0-d included: the same as ``[arrays]``, never split into its elements), a
    GPUScalar (e.g. the loss) or an iterable of arrays and GPUScalars
    (`gpuscalar.reduce.array_items`). Device ops: 2 for one array (``isfinite``, ``all``); for
    ``n`` arrays 1 (a bool vector of ``n`` slots) + 2 per array (``isfinite``, and its ``all``
    written into the array's slot) + 1 (``all`` of the slots). No ``xp.stack``, which in CuPy
    would be a hidden host-to-device copy for more than 8 arrays
    (`gpuscalar.reduce.partials_into_slots`): it runs inside a captured step. (A pending
    GPUScalar is evaluated first: one launch more.)
    """
    items, single = reduce.array_items(arrays, "all_finite")
    names = ["arrays"] if single else [f"arrays[{i}]" for i in range(len(items))]
    owners: list[Backend] = []
    for a, what in zip(items, names, strict=True):
        owner = a.backend if isinstance(a, GPUScalar) else backend_of(a)
        if owner is None:
            expected = owners[0].name if owners else "NumPy or CuPy"
            raise TypeError(f"all_finite(): {what} must be a {expected} array, got "
                            f"{type(a).__name__}")
        if owners and owner is not owners[0]:
            raise TypeError(f"all_finite(): {what} must be a {owners[0].name} array, "
                            f"got a {owner.name} one")
        owners.append(owner)
    backend = owners[0]
    if backend.multi_device:
        devices = [a.device if isinstance(a, GPUScalar) else backend.device_of(a) for a in items]
        for device, what in zip(devices[1:], names[1:], strict=True):
            if device != devices[0]:
                raise ValueError(f"all_finite(): {what} is on device {device!r} but arrays[0] "
                                 f"on {devices[0]!r}")
    # a GPUScalar's 0-d array (a pending one is evaluated here: one launch)
    raw = [_array_of(a) if isinstance(a, GPUScalar) else a for a in items]
    xp = backend.xp

    def flags(a: Any) -> Any:
        # a 0-d array's flag is a NumPy bool on NumPy, not an array: reduce a 1-element view
        return backend.call(xp.isfinite, a.reshape(1) if a.ndim == 0 else a)

    if len(raw) == 1:
        return reduce.all(flags(raw[0]))
    slots = reduce.partials_into_slots(
        backend, raw, np.bool_, lambda a, out: backend.call(xp.all, flags(a), out=out)
    )
    return reduce.all(slots)
