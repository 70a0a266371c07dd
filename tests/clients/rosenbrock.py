"""An objective for ``scipy.optimize.minimize`` computed with device arrays: the Rosenbrock
function written as a least-squares mean, ``mean(r * r)`` over the residuals
``r = [10 (x[1:] - x[:-1]**2), 1 - x[:-1]]``, and its gradient, on any CuPy-like namespace.

SciPy is the client here, used unmodified: it reads what the objective returns as a float would
be read. Two paths, as a user would write them: `float_path` returns ``float(xp.mean(...))``
(the read every SciPy user writes today), `gpuscalar_path` returns ``gs.mean(...)`` (no read:
SciPy takes it as a number, ``numbers.Real``). The gradient reaches SciPy the same way in both:
computed on the device, then one explicit read (``.get()``), since SciPy needs a host array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import gpuscalar as gs

from ..helpers import host


def _residuals(xp: Any, x: Any) -> tuple[Any, Any]:
    return 10.0 * (x[1:] - x[:-1] ** 2), 1.0 - x[:-1]


def _mean_square(xp: Any, x_host: np.ndarray) -> Any:
    """``mean(r * r)`` as a 0-d device array (the upload of SciPy's host ``x`` included)."""
    x = xp.asarray(x_host)
    r1, r2 = _residuals(xp, x)
    r = xp.concatenate([r1, r2])
    return xp.mean(r * r)


def gradient(xp: Any) -> Callable[[np.ndarray], np.ndarray]:
    """The gradient of the mean square, on the device, read once (``.get()``) for SciPy."""

    def jac(x_host: np.ndarray) -> np.ndarray:
        x = xp.asarray(x_host)
        r1, r2 = _residuals(xp, x)
        scale = 2.0 / (2 * (x.shape[0] - 1))  # d mean(r*r) / dr = 2 r / len(r)
        g = xp.zeros_like(x)
        g[1:] += 10.0 * r1
        g[:-1] += -20.0 * x[:-1] * r1 - r2
        return host(g * scale)

    return jac


def float_path(xp: Any) -> Callable[[np.ndarray], float]:
    """The objective as written today: ``float(xp.mean(...))``, one read per evaluation."""
    return lambda x: float(_mean_square(xp, x))


def gpuscalar_path(xp: Any) -> Callable[[np.ndarray], gs.GPUScalar]:
    """The same objective returning ``gs.mean(...)``: a GPUScalar, read only where SciPy needs
    its value."""

    def fun(x_host: np.ndarray) -> gs.GPUScalar:
        x = xp.asarray(x_host)
        r1, r2 = _residuals(xp, x)
        r = xp.concatenate([r1, r2])
        return gs.mean(r * r)

    return fun
