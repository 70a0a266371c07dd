"""Test helpers that hold on every backend, a real GPU included.

CuPy (and the strict device) refuse implicit host conversion: ``np.asarray(x)``,
``pytest.approx(x)`` and ``np.testing.assert_allclose(x, ...)`` raise on a device array. Tests
read device arrays with `host` instead, which transfers explicitly (``.get()``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import gpuscalar as gs


def host(value: Any) -> Any:
    """A NumPy array (or Python scalar, for a GPUScalar) holding ``value``'s data, read
    explicitly from whatever device it lives on. Lists and tuples are read element by element."""
    if isinstance(value, gs.GPUScalar):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(host(v) for v in value)
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return value
    return value.get()


def backend_name(xp: Any) -> str:
    """The gpuscalar backend name of an ``xp`` namespace from the fixture."""
    return "strict" if xp is gs.strict.xp else xp.__name__
