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

import numpy as np

from . import ledger, sync
from .known import UNREAD, known_values, python_value, remember, unread_positions
from .lazy import expr, fusion

__all__ = ["read_pending", "known_result"]


def known_result(node: expr.Node) -> Any:
    """The host value of ``node`` if every leaf's value is known (computed on the host, no
    sync), else `UNREAD`: a scalar materialized from known values is known too."""
    values = known_values(expr.leaves_of(node))
    return UNREAD if values is None else _evaluated(node, values)


def _evaluated(node: expr.Node, values: list[Any]) -> Any:
    """``node`` on its leaves' host ``values`` (the constants as they are) by its structure's
    compiled host evaluator (`expr.host_program`: the float path's numbers), as a Python
    number."""
    run, gives_python = _host_program_of(node)
    value = run(values)
    return value if gives_python else python_value(value)


_GENERIC, _host_program_of = np.generic, expr.host_program_of


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
    values = known_values(leaves)  # (stops at the first unknown leaf)
    if values is not None:
        return _evaluated(node, values)
    # the unknown leaves (each once); every device leaf where another thread's forget_all
    # emptied the registry between the two looks
    extras = tuple(unread_positions(leaves) or [
        i for i, leaf in enumerate(leaves) if not isinstance(leaf, _GENERIC)])
    sync.admit(reason)  # the guard first: a refused read launches nothing
    array, packed = scalar._executor.read(node, scalar._device, extras)
    if packed is None:
        host = sync.to_host(scalar._backend, array, None)
    else:  # packed: the value, then each unknown leaf
        unpacked = fusion.unpack(sync.to_host(scalar._backend, packed, None),
                                 [node.op.dtype, *[leaves[i].dtype for i in extras]])
        host = unpacked[0]
        for index, value in zip(extras, unpacked[1:], strict=True):
            remember(leaves[index], value)
    if scalar._array is None and not ledger.in_loop_body():  # publish, as scalar._materialize
        scalar._array, scalar._node = array, None
    remember(scalar._array, host)
    return host
