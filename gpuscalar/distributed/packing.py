"""Packing values into one buffer per dtype, and the results back out: shared by the MPI and
NCCL paths of `gpuscalar.distributed.all_reduce` (each function takes ``xp``: NumPy on host data,
CuPy on the device, composed into one counted device op by the caller)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import Backend
from ..known import python_value

__all__ = ["result_dtype", "buffer_dtype", "pack", "join", "split", "finish", "results_on_host",
           "own", "unpack"]


def result_dtype(dtype: np.dtype, op: str) -> np.dtype:
    """The dtype of the reduction ``op`` of values of ``dtype`` (NumPy's: ``mean`` of
    integers and bools is float64, ``sum`` and ``prod`` of bools int64; otherwise the
    input's, as the elementwise ``x0 + x1 + ...`` across processes keeps it)."""
    if op == "mean" and dtype.kind in "biu":
        return np.dtype(np.float64)
    if op in ("sum", "prod") and dtype.kind == "b":
        return np.dtype(np.int64)
    return dtype


def buffer_dtype(dtype: np.dtype, op: str) -> np.dtype:
    """The dtype the collective runs in for values of ``dtype``: the result's, except bools
    under max/min, reduced as uint8 (0 and 1: MPI has no max of C_BOOL), and a mean of
    integers, summed in 64 bits before the division."""
    if dtype.kind == "b" and op in ("max", "min"):
        return np.dtype(np.uint8)
    if op == "mean" and dtype.kind in "biu":
        return np.dtype(np.int64) if dtype.kind != "u" else np.dtype(np.uint64)
    return result_dtype(dtype, op)


def pack(xp: Any, arrays: list[Any], groups: dict[np.dtype, list[int]]) -> list[Any]:
    """One 1-d buffer per dtype group: its arrays raveled, converted, concatenated."""
    return [xp.concatenate([xp.asarray(arrays[i].reshape(-1), dtype=dtype) for i in indices])
            for dtype, indices in groups.items()]


def join(xp: Any, buffers: list[Any]) -> Any:
    """The buffers' bytes in one uint8 vector: what the sync reads, in one transfer."""
    return xp.concatenate([b.view(xp.uint8) for b in buffers])


def split(host: np.ndarray, groups: dict[np.dtype, list[int]],
           sizes: list[int]) -> dict[int, np.ndarray]:
    """Each value's reduced elements (1-d views of the host copy), by its position; ``sizes``:
    each value's element count."""
    found: dict[int, np.ndarray] = {}
    offset = 0
    for dtype, indices in groups.items():
        count = sum(sizes[i] for i in indices)
        flat = host[offset:offset + count * dtype.itemsize].view(dtype)
        offset += count * dtype.itemsize
        start = 0
        for index in indices:
            found[index] = flat[start:start + sizes[index]]
            start += sizes[index]
    return found


def finish(xp: Any, flat: Any, like: Any, op: str, size: int) -> Any:
    """A value's reduced elements as its result: its shape, `result_dtype`, a mean divided."""
    dtype = result_dtype(like.dtype, op)
    value = xp.array(flat[:like.size].reshape(like.shape), dtype=dtype)  # a copy: its own
    if op == "mean":
        scale = np.dtype(dtype.char.lower()).type(size) if dtype.kind == "c" else dtype.type(size)
        value = xp.divide(value, scale)
    return value


def results_on_host(host: np.ndarray, groups: dict[np.dtype, list[int]], arrays: list[Any],
                    op: str, size: int) -> tuple[list[np.ndarray], list[Any]]:
    """From the host copy of the reduced buffers (`join`'s bytes): each value's result as a
    NumPy array (`finish`), and its host value (a Python number for a 0-d one)."""
    reduced = split(host, groups, [a.size for a in arrays])
    values = [finish(np, reduced[i], arrays[i], op, size) for i in range(len(arrays))]
    return values, [python_value(v) if v.ndim == 0 else v for v in values]


def own(backend: Backend, values: list[np.ndarray], arrays: list[Any]) -> list[Any]:
    """The results (each a copy of its own, never a view of the buffer the host read) as
    arrays of the host-evaluating ``backend``."""
    return [backend.from_host_data(v, a) for v, a in zip(values, arrays, strict=True)]


def unpack(xp: Any, buffers: list[Any], groups: dict[np.dtype, list[int]], arrays: list[Any],
            op: str, size: int) -> list[Any]:
    """The results on the device, cut from the reduced device buffers."""
    results: list[Any] = [None] * len(arrays)
    for buffer, indices in zip(buffers, groups.values(), strict=True):
        start = 0
        for index in indices:
            like = arrays[index]
            results[index] = finish(xp, buffer[start:start + like.size], like, op, size)
            start += like.size
    return results
