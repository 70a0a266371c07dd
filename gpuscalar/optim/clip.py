"""Sync-free gradient clipping and the finiteness flag that feeds ``skip_if``.

Why this module exists: "clip to a norm" and "skip this step if the gradients overflowed" are
where training loops usually read a device value on the host (``if norm > max: ...``,
``if not isfinite(loss): continue``). Here both stay on the device: the clipping coefficient is
computed and applied as device scalars, and `all_finite` returns a bool GPUScalar that every
optimizer step (and `adam_step`, `sgd_step`, ...) accepts as ``skip_if``, read by the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import reduce
from ..arrays import apply_ufunc
from ..backend import backend_of
from ..math import minimum
from ..scalar import GPUScalar
from .checks import check_array, describe, hyper

__all__ = ["clip_grad_norm", "all_finite"]


def clip_grad_norm(grads: Sequence[Any], max_norm: Any, norm_type: float = 2.0) -> GPUScalar:
    """Scale ``grads`` in place so their total ``norm_type``-norm is at most ``max_norm``.

    PyTorch's ``clip_grad_norm_``: the coefficient is ``min(1, max_norm / (norm + 1e-6))``,
    computed and applied on the device (no ``if``, no sync). Returns the total norm before
    clipping as a GPUScalar. ``norm_type`` may be ``math.inf``; ``max_norm`` a GPUScalar.
    """
    items = list(grads)
    if not items:
        raise ValueError("clip_grad_norm() needs at least one gradient array")
    backend = check_array(items[0], "grads[0]")
    for i, g in enumerate(items[1:], 1):
        other = check_array(g, f"grads[{i}]")
        if other is not backend:
            raise TypeError(f"grads[{i}] is a {other.name} array but grads[0] is "
                            f"{backend.name}")
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)) or norm_type <= 0:
        raise ValueError(
            f"norm_type must be a positive number or math.inf, got {describe(norm_type)}"
        )
    max_norm = hyper(max_norm, "max_norm", backend, backend.device_of(items[0]))
    total = reduce.global_norm(items, ord=norm_type)
    # as PyTorch, the coefficient is applied in each gradient's dtype; when lazy, each multiply
    # computes it in its own kernel (no launch for the coefficient)
    coef = minimum(max_norm / (total + 1e-6), 1.0)
    for g in items:
        apply_ufunc("multiply", g, coef, out=g)
    return total


def all_finite(arrays: Sequence[Any]) -> GPUScalar:
    """Whether every element of every array is finite, as a bool GPUScalar (no sync).

    For loss scaling: ``opt.step(grads, skip_if=~all_finite(grads))``. Device ops: 2 for one
    array (``isfinite``, ``all``); for ``n`` arrays 1 (a bool vector of ``n`` slots) + 2 per
    array (``isfinite``, and its ``all`` written into the array's slot) + 1 (``all`` of the
    slots). No ``xp.stack``, which in CuPy would be a hidden host-to-device copy for more than
    8 arrays (`gpuscalar.reduce.partials_into_slots`): it runs inside a captured step.
    """
    items = list(arrays)
    if not items:
        raise ValueError("all_finite() needs at least one array")
    backend = backend_of(items[0])
    if backend is None:
        raise TypeError("all_finite(): arrays[0] must be a NumPy or CuPy array, got "
                        f"{type(items[0]).__name__}")
    for i, a in enumerate(items):
        if backend_of(a) is not backend:
            raise TypeError(f"all_finite(): arrays[{i}] must be a {backend.name} array, "
                            f"got {type(a).__name__}")
    xp = backend.xp

    def flags(a: Any) -> Any:
        # a 0-d array's flag is a NumPy bool on NumPy, not an array: reduce a 1-element view
        return backend.call(xp.isfinite, a.reshape(1) if a.ndim == 0 else a)

    if len(items) == 1:
        return reduce.all(flags(items[0]))
    slots = reduce.partials_into_slots(
        backend, items, np.bool_, lambda a, out: backend.call(xp.all, flags(a), out=out)
    )
    return reduce.all(slots)

