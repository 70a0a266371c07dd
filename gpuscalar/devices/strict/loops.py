"""The NumPy loops CuPy has no routine for, refused by the strict device as CuPy refuses them.

Why this module exists: the strict device computes with NumPy, which has a loop for every dtype,
so a gpuscalar operation that CuPy cannot run at all passed CI and failed on the first real GPU
(``np.logical_not`` of a complex GPUScalar: CuPy 14's ``logical_not`` has no complex loop, a
``TypeError`` where the float path gives a bool). Here the strict device refuses those loops as
CuPy does: an array call (``xp.logical_not(z)``, ``np.logical_not(z)`` of a strict array), and a
pending GPUScalar expression evaluated on the device whose op CuPy lacks and gpuscalar's code
generator does not write itself (`gpuscalar.lazy.codegen.OWN_ROUTINES`: what the CuPy kernel of
that expression runs instead of CuPy's routine).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ...lazy import codegen, expr

__all__ = ["CUPY_MISSING_LOOPS", "cupy_lacks_loop", "refuse_array_call", "refuse_pending"]

#: ufunc name -> the input dtype kinds CuPy 14 has no loop for (cupy/_logic/ops.py: the
#: ``logical_*`` ufuncs list bool, integer and real floating loops only).
CUPY_MISSING_LOOPS: dict[str, str] = {
    "logical_not": "c", "logical_and": "c", "logical_or": "c", "logical_xor": "c",
}
_MISSING_BY_UFUNC = {getattr(np, name): kinds for name, kinds in CUPY_MISSING_LOOPS.items()}
#: structure keys of pending expressions already found runnable on CuPy
_RUNNABLE: set[int] = set()


def cupy_lacks_loop(name: str, dtypes: Iterable[Any]) -> bool:
    """Whether CuPy has no loop for ufunc ``name`` with inputs of ``dtypes``."""
    kinds = CUPY_MISSING_LOOPS.get(name)
    return kinds is not None and any(np.dtype(d).kind in kinds for d in dtypes)


def _refusal(name: str, dtypes: tuple[np.dtype, ...]) -> TypeError:
    return TypeError(f"Wrong type ({dtypes}) of arguments for cupy_{name} (the strict device "
                     "refuses it as CuPy does: CuPy has no loop for these input types)")


def refuse_array_call(function: Any, raw_args: tuple) -> None:
    """CuPy's ``TypeError`` for a ufunc call (``function``, on NumPy data ``raw_args``) whose
    loop CuPy lacks; nothing for any other call."""
    if type(function) is not np.ufunc or function not in _MISSING_BY_UFUNC:
        return
    dtypes = tuple(np.result_type(a) for a in raw_args[:function.nin])
    if cupy_lacks_loop(function.__name__, dtypes):
        raise _refusal(function.__name__, dtypes)


def _pending_roots(args: tuple) -> Iterator[expr.Node]:
    """The pending expressions among a backend call's arguments: a root (materialize, read), the
    values of a dict (a fold's pending operands), the first items of a list of entries (a packed
    read)."""
    for arg in args:
        kind = type(arg)
        if kind is expr.Node:
            yield arg
        elif kind is dict:
            yield from (v for v in arg.values() if type(v) is expr.Node)
        elif kind is list:
            yield from (e[0] for e in arg if type(e) is tuple and e and type(e[0]) is expr.Node)


def refuse_pending(args: tuple) -> None:
    """CuPy's ``TypeError`` where a pending expression among ``args`` holds an op that CuPy lacks
    a loop for and gpuscalar's CUDA does not write itself (on CuPy it could not run)."""
    for root in _pending_roots(args):
        if root[expr.KEY] in _RUNNABLE:
            continue
        for op, _ in expr.plan_of(root).steps:
            if op.kind == "ufunc" and cupy_lacks_loop(op.name, op.in_dtypes) and (
                    (op.name, op.in_dtypes[0].kind) not in codegen.OWN_ROUTINES):
                raise _refusal(op.name, op.in_dtypes)
        _RUNNABLE.add(root[expr.KEY])
