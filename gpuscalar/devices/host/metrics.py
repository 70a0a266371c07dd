"""`gs.MetricLog` on the host devices (NumPy, the strict device): the ring in host data.

Why this module exists: it is the "metrics" executor (`gpuscalar.deferred.Rings`) of both
devices that evaluate on the host, one home for the two (the strict device's entry names it
too). The ring has the GPU's layout (`gpuscalar.deferred.RowLayout`) in the backend's data:
writing a row is one counted device op (what the record kernel does, with NumPy), a snapshot is
ready at once (``ready()``: no sync, no device op) and ``flush()`` is one counted sync.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import sync
from ...backend import Backend
from ...lazy import expr, fusion

if TYPE_CHECKING:
    from ...deferred import RowLayout

__all__ = ["HostRings", "HostRing"]

_SLOT = fusion.PACK_SLOT


class HostRings:
    """The "metrics" executor of a host-evaluating backend (`gpuscalar.deferred.Rings`)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def default_device(self) -> object:
        return "cpu"

    def ring(self, device: object, layout: RowLayout) -> HostRing:
        return HostRing(self.backend, device, layout)


class HostRing:
    """The ring on NumPy and the strict device: the GPU's layout in the backend's data;
    writing a row is one counted device op, and a snapshot is ready at once."""

    def __init__(self, backend: Backend, device: object, layout: RowLayout) -> None:
        self.backend, self.device, self.layout = backend, device, layout
        self._lock = threading.Lock()
        with backend.device_context(device):
            self.state = backend.call(backend.xp.zeros, layout.nbytes // 8, dtype=np.int64)

    def record(self, values: dict[str, Any]) -> None:
        items = self.layout.items(values, self.backend, self.device)
        with self._lock:  # the counter's read and write: one row per record, threads included
            self.backend.call(_write_row, self.backend, self.state, self.layout, items)

    def poll(self) -> list[np.ndarray]:
        return [np.array(self.backend.host_data(self.state))]  # (host data: no transfer)

    def drain(self) -> list[np.ndarray]:
        return [sync.to_host(self.backend, self.state, "flush")]

    def compute(self, func: Callable[..., Any], *args: Any) -> Any:
        backend, state = self.backend, self.state
        return backend.call(lambda: backend.from_host_data(
            func(np, backend.host_data(state), *args), state))

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(self.backend.host_data(array))  # (host data: no transfer)

    def close(self) -> None:
        pass


def _write_row(backend: Backend, state: Any, layout: RowLayout,
               items: list[tuple[str, Any, np.dtype]]) -> None:
    """What the record kernel does, with NumPy on the host data (one device op)."""
    data = backend.host_data(state).view(np.uint8)
    step = int(data[:8].view(np.int64)[0])
    base = _SLOT + (step % layout.capacity) * layout.row_bytes
    data_of: Callable[[Any], Any] = backend.host_data
    for column, ((kind, payload, _), dtype) in enumerate(zip(items, layout.dtypes,
                                                             strict=True)):
        if kind == "value":
            value = np.asarray(payload).astype(dtype)
        elif kind == "leaf":
            value = np.asarray(data_of(payload)).astype(dtype)
        else:
            value = expr.evaluate_on_host(payload, data_of).astype(dtype)
        offset = base + _SLOT * (column + 1)
        data[offset:offset + dtype.itemsize] = value.reshape(1).view(np.uint8)
    data[base:base + 8] = np.array([step], np.int64).view(np.uint8)
    data[:8] = np.array([step + 1], np.int64).view(np.uint8)
