"""The host device's backend: NumPy arrays (the CPU backend and the promotion oracle).

Why this module exists: it is the root of the host wing (`gpuscalar.devices.host`).
NumPy data is host memory (`Backend.host_memory`), so it may meet any device, and gpuscalar's
host evaluators compute on it directly (`Backend.evaluates_on_host`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ...backend import Backend
from ...known import INCOMING, arrive

__all__ = ["NumpyBackend", "NUMPY"]


class NumpyBackend(Backend):
    name = "numpy"
    # NumPy >= 2.3 returns 0-d arrays from ufuncs given out=...; older NumPy returns scalars,
    # which the scalar wrapper normalizes.
    ufunc_array_kwargs = (
        {"out": ...} if tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 3) else {}
    )

    @property
    def xp(self) -> ModuleType:
        return np

    evaluates_on_host = True
    host_memory = True
    #: the host executors, one home shared with the strict device (`Backend.executors`)
    executors = {
        "blas": "gpuscalar.devices.host.blas:HostBlas",
        "sparse": "gpuscalar.devices.host.sparse:HostSparse",
        "loops": "gpuscalar.devices.host.control:HostLoops",
        "graphs": "gpuscalar.devices.host.graphs:HostGraphs",
        "scalars": "gpuscalar.devices.host.fusion:HostExecutor",
        "steps": "gpuscalar.devices.host.steps:numpy_steps",
        "metrics": "gpuscalar.devices.host.metrics:HostRings",
        "collectives": "gpuscalar.devices.host.collectives:HostCollectives",
    }

    def owns(self, value: object) -> bool:
        return isinstance(value, np.ndarray)

    def device_of(self, array: Any) -> object:
        return "cpu"

    def read_scalar(self, array: Any) -> Any:
        return array.item() if array.ndim == 0 else array.copy()

    def host_data(self, array: Any) -> Any:
        if INCOMING:  # a non-blocking collective still writing it: wait (gpuscalar.known)
            arrive(array)
        return array

    def from_host_data(self, data: Any, like: Any) -> Any:
        return np.asarray(data)

    def vector_norm(self, x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
        return self.call(np.linalg.vector_norm, x, ord=ord, axis=axis, keepdims=keepdims)


#: the host device (`gpuscalar.devices` lists it last: other array types may subclass ndarray)
NUMPY = NumpyBackend()
