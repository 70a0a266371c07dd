"""A fake "device" backend over NumPy, so rules 4 and 5 (host operands, mixed backends and
devices) are tested on a machine without a GPU. Arrays are an ndarray subclass carrying a
device id; the backend counts and reads exactly like a real one."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from gpuscalar import backend as backend_module


class FakeDeviceArray(np.ndarray):
    device_id = 0

    def __array_finalize__(self, obj: Any) -> None:
        self.device_id = getattr(obj, "device_id", 0)


class FakeDeviceBackend(backend_module.Backend):
    name = "fakegpu"
    multi_device = True
    ufunc_array_kwargs = {"out": ...}

    @property
    def xp(self):
        return np

    def owns(self, value: object) -> bool:
        return isinstance(value, FakeDeviceArray)

    def device_of(self, array: Any) -> object:
        return array.device_id

    def read_scalar(self, array: Any) -> Any:
        return np.asarray(array).item()


FAKE = FakeDeviceBackend()


def on_device(value: Any, device: int = 0, dtype: Any = None) -> FakeDeviceArray:
    array = np.asarray(value, dtype=dtype).view(FakeDeviceArray)
    array.device_id = device
    return array


@contextlib.contextmanager
def fake_backend_installed():
    backend_module.BACKENDS.insert(0, FAKE)
    try:
        yield FAKE
    finally:
        backend_module.BACKENDS.remove(FAKE)
