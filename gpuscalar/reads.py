"""A pending GPUScalar's host read: from known values, or one transfer that brings its inputs.

Why this module exists: the float path reads each value once and then computes on the host. A
pending expression (``gamma * c``) whose inputs the host already knows (`gpuscalar.known`) is
therefore evaluated on the host, with NumPy, as the float path computes it: no sync and no device
op. One with unknown inputs is evaluated on the device and its unknown leaves come back in the
same transfer (the executor packs them: `gpuscalar.lazy.fusion.Executor.read`), so they are known
afterwards, as the float path would have read them first. Below `gpuscalar.scalar` (which calls
`read_pending` from ``GPUScalar._host_value``): the scalar is used by its slots only.
"""

from __future__ import annotations

from typing import Any

from . import ledger, sync
from .known import UNREAD, python_value, remember, unread_positions, value_of
from .lazy import expr, fusion

__all__ = ["read_pending", "known_result"]


def _on_host(node: expr.Node, leaves: list[Any]) -> Any:
    """The value of ``node`` from its leaves' known values, with NumPy: the float path's."""
    value = expr.evaluate_plan(expr.plan_of(node), leaves,
                               lambda leaf: leaf.dtype.type(value_of(leaf)))
    return python_value(value)


def known_result(node: expr.Node) -> Any:
    """The host value of ``node`` if every leaf's value is known (computed on the host, no
    sync), else `UNREAD`: a scalar materialized from known values is known too."""
    leaves = expr.leaves_of(node)
    return UNREAD if unread_positions(leaves) else _on_host(node, leaves)


def read_pending(scalar: Any, reason: str) -> Any:
    """The host value of a pending GPUScalar (``GPUScalar._host_value``; duck-typed:
    this module sits below gpuscalar.scalar).

    Its leaves all known (gpuscalar.known): evaluated on the host, with NumPy on the host
    values, as the float path computes it: no sync, no device op. Else one transfer: the
    expression is evaluated on the device (kept, as ``scalar._materialize`` keeps it) and its
    unknown leaves come back in the same transfer (packed by the executor): known too.
    """
    node = scalar._node
    if node is None:  # materialized meanwhile by another thread
        return scalar._host_value(reason)
    leaves = expr.leaves_of(node)
    unknown = unread_positions(leaves)
    if not unknown:
        return _on_host(node, leaves)
    extras = tuple(unknown)
    sync.admit(reason)  # the guard first: a refused read launches nothing
    array, packed = scalar._executor.read(node, scalar._device, extras)
    if packed is None:
        host = sync.to_host(scalar._backend, array, None)
    else:  # packed: the value, then each unknown leaf
        values = fusion.unpack(sync.to_host(scalar._backend, packed, None),
                               [node.op.dtype, *[leaves[i].dtype for i in extras]])
        host = values[0]
        for index, value in zip(extras, values[1:], strict=True):
            remember(leaves[index], value)
    if scalar._array is None and not ledger.in_loop_body():  # publish, as scalar._materialize
        scalar._array, scalar._node = array, None
    remember(scalar._array, host)
    return host
