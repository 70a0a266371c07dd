"""The host's ``"scalars"`` executor: pending scalar expressions evaluated with NumPy.

Why this module exists: it is the host half of `gpuscalar.lazy.fusion` (which holds the
device-neutral logic: the executor protocol, the churn rule `fusion.splits`, what is
materialized when), and the one home of the host evaluator that NumPy and the strict device
share (both name `HostExecutor` as their ``"scalars"`` executor): "one kernel" is one counted
device op that evaluates the same ufuncs on the same loops with NumPy on the host data
(`expr.evaluate_on_host`), so the results are the eager ones, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backend import Backend
from ...lazy import expr, fusion
from ...lazy.fusion import (
    PACK_SLOT,
    Executor,
    _any_splits,
    _first_array,
    _fold_in_pieces,
    _in_pieces,
    splits,
)
from .backend import NUMPY

__all__ = ["HostExecutor"]


class HostExecutor(Executor):
    """NumPy and the strict device: "one kernel" is one counted device op evaluating the same
    ufuncs on the same loops with NumPy (`expr.evaluate_on_host`): the eager results, bit for
    bit."""

    __slots__ = ()
    fuses_plain_ufuncs = True

    def materialize(self, root: expr.Node, device: object) -> Any:
        if root[expr.SIZE] > fusion.SPLIT_NODES and splits(root):
            return _in_pieces(self, root, device)
        return self.backend.call(_materialize_on_host, self.backend, root)

    def materialize_whole(self, root: expr.Node, device: object) -> Any:
        return self.backend.call(_materialize_on_host, self.backend, root)

    def read(self, root: expr.Node, device: object,
             extras: tuple[int, ...]) -> tuple[Any, Any]:
        # in pieces, as on CuPy
        if root[expr.SIZE] > fusion.SPLIT_NODES and splits(root, count=False):
            return self.materialize(root, device), None
        return self.backend.call(_read_on_host, self.backend, root, extras)

    def fused_ufunc(self, name: str, operands: list[Any], kwargs: dict[str, Any],
                    pending: dict[int, expr.Node], keep: frozenset[int]) -> tuple[Any, dict]:
        if _any_splits(pending):
            return _fold_in_pieces(self, name, operands, kwargs, pending, keep)
        backend = self.backend
        return backend.call(_fused_on_host, backend, name, operands, kwargs, pending, keep)

    def pack(self, device: object, entries: list[tuple[Any, tuple[int, ...]]]) -> Any:
        return self.backend.call(_pack_on_host, self.backend, entries)


def _materialize_on_host(backend: Backend, root: expr.Node) -> Any:
    value = expr.evaluate_on_host(root, backend.host_data)
    return backend.from_host_data(value, _first_array(expr.leaves_of(root)))


def _read_on_host(backend: Backend, root: expr.Node, extras: tuple[int, ...]) -> Any:
    leaves = expr.leaves_of(root)
    value = expr.evaluate_on_host(root, backend.host_data)
    packed = np.zeros(PACK_SLOT * (1 + len(extras)), np.uint8)
    for slot, data in enumerate([value, *(backend.host_data(leaves[i]) for i in extras)]):
        packed[PACK_SLOT * slot:PACK_SLOT * slot + data.dtype.itemsize] = \
            np.asarray(data).reshape(1).view(np.uint8)
    like = _first_array(leaves)
    return backend.from_host_data(value, like), backend.from_host_data(packed, like)


def _host_argument(backend: Backend, value: Any) -> Any:
    """A keyword argument as the host call takes it: the backend's arrays as their NumPy data
    (``out=``, ``where=``, in tuples too); anything else unchanged."""
    if type(value) is tuple:
        return tuple(_host_argument(backend, v) for v in value)
    return backend.host_data(value) if backend.owns(value) else value


def _fused_on_host(backend: Backend, name: str, operands: list[Any], kwargs: dict[str, Any],
                   pending: dict[int, expr.Node], keep: frozenset[int]) -> tuple[Any, dict]:
    data = backend.host_data
    args = []
    like = _first_array([o for o in operands if backend.owns(o)])
    kept = {}
    for position, operand in enumerate(operands):
        if position in pending:
            value = expr.evaluate_on_host(pending[position], data)
            args.append(value)
            if position in keep:
                kept[position] = backend.from_host_data(value, like)
        elif backend.owns(operand):
            args.append(data(operand))
        else:
            args.append(operand)
    out = kwargs.get("out")
    host_kwargs = {key: _host_argument(backend, value) for key, value in kwargs.items()}
    result = getattr(np, name)(*args, **host_kwargs)
    if out is not None:
        return out, kept
    if backend is NUMPY:
        return result, kept  # as the eager call returns it (a NumPy scalar for 0-d operands)
    if isinstance(result, tuple):
        return tuple(backend.from_host_data(r, like) for r in result), kept
    return backend.from_host_data(result, like), kept


def _pack_on_host(backend: Backend, entries: list[tuple[Any, tuple[int, ...]]]) -> Any:
    data = backend.host_data
    values: list[Any] = []
    extras: list[Any] = []
    like = None
    for value, positions in entries:
        if type(value) is expr.Node:
            leaves = expr.leaves_of(value)
            values.append(expr.evaluate_on_host(value, data))
            extras += [data(leaves[i]) for i in positions]
            like = like if like is not None else _first_array(leaves)
        else:
            values.append(data(value))
            like = like if like is not None else value
    packed = np.zeros(PACK_SLOT * (len(values) + len(extras)), np.uint8)
    for slot, item in enumerate([*values, *extras]):
        item = np.asarray(item)
        packed[PACK_SLOT * slot:PACK_SLOT * slot + item.dtype.itemsize] = \
            item.reshape(1).view(np.uint8)
    return backend.from_host_data(packed, like)
