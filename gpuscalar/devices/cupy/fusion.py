"""The CuPy device's ``"scalars"`` executor: pending scalar expressions as generated kernels.

Why this module exists: it is the CuPy half of `gpuscalar.lazy.fusion` (which holds the
device-neutral logic: the executor protocol, the churn rule `fusion.splits`, what is
materialized when). Here a pending expression becomes ONE ``cupy.ElementwiseKernel`` generated
by `gpuscalar.lazy.codegen` and cached by the expression's structure (never its values), and an
array operation with a pending operand is one fused kernel, decided by a cached *plan* (CuPy's
routine for the loop, the kernel, output dtypes, kept scalars) keyed by exactly what it was
decided from, so a repeated fold is one dict lookup, the leaves and the launch. The kernel,
plan and loop-pin caches are `expr.BoundedCache`\\ s, bounded with `expr`'s structure plans by
one setting, ``gpuscalar.lazy.set_cache_size``; eviction only costs a rebuild (the same
source). An operation CuPy has no fusable routine for is evaluated eagerly (the base
`fusion.Executor`), one operation per launch, with the same result. `CupyBackend` names
`CupyExecutor` as its ``"scalars"`` executor.

A host read (`CupyExecutor.read`, and `CupyExecutor.pack` for `gpuscalar.read`) is the most
common sync of a training loop, so its host cost counts: it is one ``cupy.RawKernel`` launched
on one thread (`codegen.read_source`: the same statements as the materializing kernel, so the
same bits; a pointer argument costs CuPy a fraction of an ElementwiseKernel's raw argument)
that packs the value and the unknown leaves into ONE new allocation, whose first slot is the
value's 0-d array (a second ``ndarray`` over the same memory, no second allocation). These
kernels are made through the seam (`CUPY.seam.compile_kernel`), so their bounded cache is
emptied while a test seam stands.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...backend import Backend
from ...lazy import codegen, expr, fusion
from ...lazy.expr import KEY, BoundedCache
from ...lazy.fusion import (
    PACK_SLOT,
    Executor,
    _any_splits,
    _fold_in_pieces,
    _in_pieces,
    _replay_eagerly,
    splits,
)
from .backend import CUPY

__all__ = ["CupyExecutor", "fold_on_cupy", "kernel_count", "eager_cupy_op", "dtype_pins_loop",
           "cupy_fuses_keywords"]

# ---- bounded caches (`expr.BoundedCache`: one LRU, one bound for plans and kernels) ---------

#: (kind, structure...) -> compiled ElementwiseKernel, or None where fusion is unsupported.
_KERNELS = BoundedCache()
#: (ufunc, dtype=, operand kinds, out dtypes) -> how `_fused_on_cupy` launches, or None (eager).
_PLANS = BoundedCache()
#: (ufunc name, dtype) -> whether dtype= pins CuPy's loop (`dtype_pins_loop`).
_PINNED = BoundedCache()


def kernel_count() -> int:
    """How many distinct fused kernels are cached now (for tests and benchmarks)."""
    return sum(1 for cache in (_KERNELS, _RAW_KERNELS) for kernel in cache.values()
               if kernel is not None)


class CupyExecutor(Executor):
    """CuPy: one generated ``ElementwiseKernel`` per expression structure; what CuPy cannot
    fuse is evaluated eagerly (the base class)."""

    __slots__ = ()
    defers_to_reflected = True

    def materialize(self, root: expr.Node, device: object) -> Any:
        if root[expr.SIZE] > fusion.SPLIT_NODES and splits(root):
            return _in_pieces(self, root, device)
        return self.materialize_whole(root, device)

    def materialize_whole(self, root: expr.Node, device: object) -> Any:
        backend = self.backend
        kernel = _cached_kernel(("materialize", root.key), codegen.materialize_spec, root)
        if kernel is None:
            return _replay_eagerly(backend, root)
        with backend.device_context(device):
            out = backend.xp.empty((), dtype=root.op.dtype)
            backend.call(kernel, *expr.leaves_of(root), out)
        return out

    def read(self, root: expr.Node, device: object,
             extras: tuple[int, ...]) -> tuple[Any, Any]:
        kernel = _RAW_KERNELS.hit((root[KEY], extras), _NO_PLAN)
        if kernel is _NO_PLAN:
            kernel = _read_kernel(root, extras)
        if kernel is None:
            return self.materialize(root, device), None
        if CUPY.seam.is_current_device(device):  # (the common read: no device switch to make)
            return _launch_packing(kernel, expr.leaves_of(root), 1 + len(extras),
                                   root.op.dtype)
        with CUPY.device_context(device):
            return _launch_packing(kernel, expr.leaves_of(root), 1 + len(extras),
                                   root.op.dtype)

    def fused_ufunc(self, name: str, operands: list[Any], kwargs: dict[str, Any],
                    pending: dict[int, expr.Node], keep: frozenset[int]) -> tuple[Any, dict]:
        if not kwargs or cupy_fuses_keywords(kwargs):  # (no keywords: the common fold)
            found = _fused_on_cupy(self.backend, name, operands, kwargs, pending, keep)
            if found is _SPLITS:  # a new structure of a churning family (`splits`)
                return _fold_in_pieces(self, name, operands, kwargs, pending, keep)
            if found is not NotImplemented:
                return found
        return self.unfused_ufunc(name, operands, kwargs, pending, keep)

    def direct_fold(self, keywords: dict[str, Any], operands: tuple[Any, ...]
                    ) -> Callable[..., Any] | None:
        if cupy_fuses_keywords(keywords) and not any(type(op) is int for op in operands):
            return fold_on_cupy  # (a Python int: CuPy passes int64 or uint64, by value)
        return None

    def pins_loop(self, name: str, dtype: np.dtype) -> bool:
        return dtype_pins_loop(name, dtype)

    def pack(self, device: object, entries: list[tuple[Any, tuple[int, ...]]]) -> Any:
        items: list[tuple[Any, ...]] = []
        args: list[Any] = []
        for value, extras in entries:
            if type(value) is expr.Node:
                items.append(("node", value, extras))
                args += expr.leaves_of(value)
            else:
                items.append(("leaf", value.dtype))
                args.append(value)
        key = ("read_many", tuple(("leaf", item[1]) if item[0] == "leaf"
                                  else ("node", item[1].key, item[2]) for item in items))
        kernel = _RAW_KERNELS.get(key, _compile_raw, codegen.pack_source, items)
        if kernel is None:  # an op CuPy cannot fuse: its entries evaluated first, then packed
            return self.pack(device, _materialized_entries(self.backend, device, entries))
        with CUPY.device_context(device):
            return _launch_packing(kernel, args, _slot_count(entries), None)[1]


#: The launch configuration of a one-thread kernel.
_ONE_THREAD = (1,)


def _launch_packing(kernel: Any, args: list[Any], slots: int, dtype: np.dtype | None
                    ) -> tuple[Any, Any]:
    """Launch a packing kernel (`codegen.read_source`, `codegen.pack_source`) on the current
    device with ``args`` and its output: ONE new allocation of ``slots`` slots, the bytes the
    transfer reads. Returns (slot 0 as a 0-d array of ``dtype`` over that allocation, or None
    without a dtype; the bytes). (Each dtype is given to CuPy by its character code, and the
    memory positionally: CuPy's constructor takes those fastest.)"""
    ndarray = CUPY.xp.ndarray
    packed = ndarray((PACK_SLOT * slots,), "B")
    args.append(packed)
    CUPY.call(kernel, _ONE_THREAD, _ONE_THREAD, tuple(args))
    return (None if dtype is None else ndarray((), dtype.char, packed.data)), packed


#: (structure key, extras) of a read, or ("read_many", items) of `CupyExecutor.pack` -> the
#: compiled packing ``RawKernel`` (made through the seam: emptied while a test seam stands),
#: or None where CuPy cannot fuse. Bounded as the other caches (`expr.BoundedCache`).
_RAW_KERNELS = BoundedCache()
CUPY.seam_cache(_RAW_KERNELS)  # type: ignore[arg-type]  # (dict-like: keys, [], update, clear)


def _read_kernel(root: expr.Node, extras: tuple[int, ...]) -> Any:
    """The packing kernel of a host read of ``root`` (`codegen.read_source`), keyed by its
    structure and ``extras``; None when CuPy cannot fuse it, or (not cached) for a structure
    evaluated in pieces (`splits`): the read then materializes it, in pieces, and reads the
    0-d array."""
    if root[expr.SIZE] > fusion.SPLIT_NODES and splits(root, count=False):
        return None
    return _RAW_KERNELS.get((root[KEY], extras), _compile_raw, codegen.read_source, root,
                            extras)


def _compile_raw(make_source: Callable[..., codegen.RawSource], *args: Any) -> Any:
    try:
        made = make_source(*args)
    except codegen.FusionUnsupported:
        return None
    return CUPY.seam.compile_kernel(made.source, made.name, CUPY.kernel_options)


def _cached_kernel(key: tuple, make_spec: Callable[..., codegen.KernelSpec], *args: Any) -> Any:
    """The ElementwiseKernel for ``key`` (built once from ``make_spec(*args)``), or None when
    CuPy cannot fuse it."""
    return _KERNELS.get(key, _build_kernel, make_spec, args)


def _build_kernel(make_spec: Callable[..., codegen.KernelSpec], args: tuple) -> Any:
    try:
        spec = make_spec(*args)
    except codegen.FusionUnsupported:
        return None
    return CUPY.xp.ElementwiseKernel(
        spec.in_params, spec.out_params, spec.operation, spec.name,
        preamble=spec.preamble, loop_prep=spec.loop_prep,
    )


#: What `_fused_on_cupy` answers for a fold whose pending scalar is evaluated in pieces.
_SPLITS = object()

#: The keyword arguments `_fused_on_cupy` implements (with ``casting="unsafe"`` only).
_FUSED_KEYWORDS = frozenset({"out", "dtype", "casting"})


def cupy_fuses_keywords(kwargs: dict[str, Any]) -> bool:
    """Whether the fused CuPy kernel implements every keyword argument of the eager call:
    ``out=``, and the parity loop gpuscalar pins (``dtype=`` with ``casting="unsafe"``). Any
    other (``where=``, ``order=``, a ``dtype=`` checked under ``same_kind``, ...) is the eager
    call's to honour, so the scalars are evaluated first and nothing is dropped."""
    return _FUSED_KEYWORDS.issuperset(kwargs) and (
        not kwargs or kwargs.get("casting") == "unsafe")

def _kind_score(kind: type) -> int:
    if issubclass(kind, np.bool_):
        return 0
    if issubclass(kind, (np.integer, int)):
        return 1
    if issubclass(kind, (np.inexact, float, complex)):
        return 2
    return 3


def eager_cupy_op(ufunc: Any, in_types: tuple[np.dtype, ...], weaks: tuple[Any, ...],
                  dtype: np.dtype | None) -> Any:
    """The CuPy ``_Op`` an eager call ``ufunc(*args, dtype=dtype)`` runs, for arguments of
    dtypes ``in_types`` where ``weaks[i]`` is the Python type of a Python-number argument
    (NEP 50 weak) and False for arrays: CuPy's own ``guess_routine``, step by step.

    These are CuPy's private internals (CuPy 14): where a CuPy version lacks them (or calls them
    differently) the answer is None, "no routine known", and callers evaluate eagerly, unfused.
    """
    try:
        if dtype is not None:
            ops = ufunc._out_ops if ufunc._out_ops is not None else ufunc._ops
            return ops._guess_routine_from_dtype(dtype)
        any_weak = any(w is not False for w in weaks)
        if any_weak:
            array_kinds = [_kind_score(t.type) for t, w in zip(in_types, weaks, strict=True)
                           if not w]
            scalar_kinds = [_kind_score(w) for w in weaks if w]
            if not array_kinds or max(array_kinds) < max(scalar_kinds):
                any_weak = False
        return ufunc._ops._guess_routine_from_in_types(in_types, weaks if any_weak else None)
    except (AttributeError, TypeError):
        return None


def dtype_pins_loop(name: str, dtype: np.dtype) -> bool:
    """Whether ``cupy.<name>(..., dtype=dtype)`` runs the homogeneous ``dtype`` loop. CuPy picks
    the first loop whose *outputs* are ``dtype``, which for a few ufuncs reads other inputs
    (``power`` with int8: a bool loop): there, dtype= must not be passed."""
    return _PINNED.get((name, dtype), _pins_loop, name, dtype)


def _pins_loop(name: str, dtype: np.dtype) -> bool:
    op = eager_cupy_op(getattr(CUPY.xp, name), (), (), dtype)
    try:
        return op is not None and all(t == dtype for t in (*op.in_types, *op.out_types))
    except AttributeError:  # another CuPy's _Op: do not pin (CuPy's own promotion runs)
        return False


_PYTHON_KINDS = frozenset({bool, float, complex})
_NO_PLAN = object()  # a plan not cached (a cached plan may be None: CuPy cannot fuse)


def _fused_on_cupy(backend: Backend, name: str, operands: list[Any], kwargs: dict[str, Any],
                   pending: dict[int, expr.Node], keep: frozenset[int],
                   device: object = None) -> Any:
    """The fused launch on CuPy, or NotImplemented where CuPy has no fusable routine (or an
    output partly overlaps an input). Everything decided from the operands' kinds and dtypes
    (CuPy's routine, the kernel, the outputs' dtypes, which scalars are kept) is one cached
    plan, keyed by exactly what it was decided from: a repeated fold is one lookup and the
    launch. Only values are looked at per call: leaves, overlaps, the device, the shape.
    ``device``: the device every operand is on where the caller checked it (rule 5), else
    None (the device of the first array argument); made current for the launch where it is
    not already."""
    out = kwargs.get("out")
    outs = () if out is None else (out if type(out) is tuple else (out,))
    key: list[Any] = [name, kwargs.get("dtype")]
    args: list[Any] = []
    leaves_of = expr.leaves_of
    for position, operand in enumerate(operands):
        root = pending.get(position)
        if root is not None:
            key.append((root[KEY], position in keep))
            args += leaves_of(root)
            continue
        kind = type(operand)
        key.append(kind)  # an array (or a materialized GPUScalar's 0-d array) or a number
        if kind is int:
            key.append(operand < 0x8000000000000000)  # else CuPy passes it as uint64
        elif kind not in _PYTHON_KINDS:
            dtype = getattr(operand, "dtype", None)
            key.append(np.asarray(operand).dtype if dtype is None else dtype)
        args.append(operand)
    if outs:
        key.append(tuple(o.dtype for o in outs))
        if _any_overlap(outs, args, backend.xp.ndarray):
            return NotImplemented  # partial overlap: CuPy's ufunc copies inputs first; so do we
    plan_key = tuple(key)
    plan = _PLANS.hit(plan_key, _NO_PLAN)
    if plan is _NO_PLAN:
        if _any_splits(pending):  # (only on a miss: a repeating fold never looks)
            return _SPLITS
        plan = _PLANS.get(plan_key, _make_plan, backend, name, operands, kwargs, pending, keep,
                          outs, args)
    if plan is None:
        return NotImplemented
    kernel, out_dtypes, kept_dtypes, device_index = plan
    if device is None:
        device = backend.device_of(args[device_index])
    current = CUPY.seam.is_current_device(device)
    if not kept_dtypes and current:  # (the common fold)
        result = backend.call(kernel, *args, *outs)
        return (result if out is None else out), {}
    with contextlib.nullcontext() if current else backend.device_context(device):
        if not kept_dtypes:
            result = backend.call(kernel, *args, *outs)
            return (result if out is None else out), {}
        ndarray = backend.xp.ndarray
        kept = {position: ndarray((), dtype) for position, dtype in kept_dtypes}
        if not outs:  # a raw side output means every output is passed
            shapes = [a.shape for a in args if isinstance(a, ndarray)]
            shape = shapes[0] if len(shapes) == 1 else np.broadcast_shapes(*shapes)
            outs = tuple(ndarray(shape, d) for d in out_dtypes)
        result = backend.call(kernel, *args, *outs, *kept.values())
    result = result[:len(out_dtypes)]
    result = result[0] if len(result) == 1 else tuple(result)
    return (result if out is None else out), kept


def fold_on_cupy(key: int, name: str, operands: tuple[Any, ...], kwargs: dict[str, Any],
                 position: int, root: expr.Node, device: object) -> Any:
    """`fused_ufunc` on CuPy for the common fold, called by `gpuscalar.arrays` once its cached
    decision (``key``: its number; decided from the ufunc, each operand's kind and dtype, no
    Python int, the output's) said CuPy fuses these keywords: ONE pending scalar (at
    ``position``, its node ``root``, not kept) on ``device`` (checked by the caller). Its plan
    is `_fused_on_cupy`'s, keyed by the decision's number and the structure (which determine
    `_fused_on_cupy`'s key), with the structure's argument reader (`expr.argument_reader`: the
    leaves without a walk). The result, or NotImplemented where the general path must decide
    (no fusable routine, an overlap, a churning structure: nothing was launched)."""
    plan_key = (key, root[KEY])
    plan = _PLANS.hit(plan_key, _NO_PLAN)
    if plan is _NO_PLAN:
        if _any_splits({position: root}):
            return NotImplemented
        plan = _PLANS.get(plan_key, _make_fold_plan, name, operands, kwargs, position, root)
    if plan is None:
        return NotImplemented
    kernel, arguments, device_index = plan
    args = arguments(operands, root)
    out = kwargs.get("out")
    if out is not None:
        if _any_overlap((out,), args, CUPY.xp.ndarray):
            return NotImplemented  # partial overlap: the general path copies inputs first
        args.append(out)  # (the launch's arguments: the inputs, then the output)
    if device is None:
        device = CUPY.device_of(args[device_index])
    if CUPY.seam.is_current_device(device):
        result = CUPY.call(kernel, *args)
    else:
        with CUPY.device_context(device):
            result = CUPY.call(kernel, *args)
    return result if out is None else out


def _make_fold_plan(name: str, operands: tuple[Any, ...], kwargs: dict[str, Any],
                    position: int, root: expr.Node) -> tuple | None:
    """`fold_on_cupy`'s plan: `_make_plan`'s kernel and launch device (None where CuPy has no
    fusable routine) with the structure's argument reader."""
    arguments = expr.argument_reader(root, len(operands), position)
    out = kwargs.get("out")
    plan = _make_plan(CUPY, name, operands, kwargs, {position: root}, _NO_KEEP,
                      () if out is None else (out,), arguments(operands, root))
    if plan is None:
        return None
    kernel, _, _, device_index = plan
    return kernel, arguments, device_index


_NO_KEEP: frozenset[int] = frozenset()


def _make_plan(backend: Backend, name: str, operands: Sequence[Any], kwargs: dict[str, Any],
               pending: dict[int, expr.Node], keep: frozenset[int], outs: tuple,
               args: list[Any]) -> tuple | None:
    """What `_fused_on_cupy` decides once per key: (kernel, output dtypes, (position, dtype)
    of each kept scalar, index in the arguments of the array whose device runs the launch);
    None where CuPy has no fusable routine (evaluated eagerly)."""
    try:  # CuPy's private conversion of Python numbers (CuPy 14): without it, eager
        from cupy._core._scalar import numpy_dtype_from_pyscalar  # noqa: PLC0415
    except ImportError:
        return None
    ufunc = getattr(backend.xp, name)
    in_types, weaks, described = [], [], []
    for position, operand in enumerate(operands):
        if position in pending:
            root = pending[position]
            in_types.append(root.op.dtype)
            weaks.append(False)
            described.append(codegen.ArrayOperand("scalar", root.op.dtype, root,
                                                  position in keep))
        elif backend.owns(operand):
            in_types.append(operand.dtype)
            weaks.append(False)
            described.append(codegen.ArrayOperand("array", operand.dtype))
        else:
            descr, weak = numpy_dtype_from_pyscalar(operand)
            if descr is None:
                descr, weak = np.asarray(operand).dtype, False
            in_types.append(descr)
            weaks.append(weak)
            described.append(codegen.ArrayOperand("python", descr))
    routine_op = eager_cupy_op(ufunc, tuple(in_types), tuple(weaks), kwargs.get("dtype"))
    if routine_op is None or not isinstance(getattr(routine_op, "routine", None), str):
        return None
    out_dtypes = tuple(o.dtype for o in outs) if outs else tuple(routine_op.out_types)
    kernel_key = ("fused", name, tuple(routine_op.in_types), tuple(routine_op.out_types),
                  tuple((d.kind, d.dtype, None if d.root is None else d.root.key, d.keep)
                        for d in described),
                  out_dtypes)
    kernel = _cached_kernel(kernel_key, codegen.fused_spec, name, routine_op, described,
                            out_dtypes)
    if kernel is None:
        return None
    kept_dtypes = tuple((p, pending[p].op.dtype) for p in sorted(keep))
    device_index = next(i for i, a in enumerate(args) if backend.owns(a))
    return kernel, out_dtypes, kept_dtypes, device_index


_may_share_bounds: Callable[[Any, Any], bool] | None = None


def _any_overlap(outs: tuple, args: list[Any], ndarray: type) -> bool:
    """Whether an output may share memory with an argument without being the same elements."""
    global _may_share_bounds
    if _may_share_bounds is None:
        try:  # CuPy's own bounds check behind cupy.may_share_memory, without its Python layer
            from cupy._core._memory_range import may_share_bounds  # noqa: PLC0415
        except ImportError:
            from cupy import may_share_memory as may_share_bounds  # noqa: PLC0415
        _may_share_bounds = may_share_bounds
    for o in outs:
        for a in args:
            if a is not o and isinstance(a, ndarray) and _overlaps(o, a):
                return True
    return False


def _overlaps(out: Any, other: Any) -> bool:
    """Whether ``other`` may share memory with ``out`` without being the same elements."""
    if other.data.ptr == out.data.ptr and other.shape == out.shape and (
            other.strides == out.strides):
        return False
    may_share = _may_share_bounds
    assert may_share is not None  # set by `_any_overlap`, the only caller
    return bool(may_share(out, other))


def _slot_count(entries: list[tuple[Any, tuple[int, ...]]]) -> int:
    return len(entries) + sum(len(extras) for _, extras in entries)


def _materialized_entries(backend: Backend, device: object,
                          entries: list[tuple[Any, tuple[int, ...]]]
                          ) -> list[tuple[Any, tuple[int, ...]]]:
    """``entries`` with every pending value evaluated eagerly (`_replay_eagerly`) and its
    extras as entries of their own, after the values: the same slots."""
    values: list[tuple[Any, tuple[int, ...]]] = []
    extras: list[tuple[Any, tuple[int, ...]]] = []
    for value, positions in entries:
        if type(value) is expr.Node:
            leaves = expr.leaves_of(value)
            with backend.device_context(device):
                values.append((_replay_eagerly(backend, value), ()))
            extras += [(leaves[i], ()) for i in positions]
        else:
            values.append((value, ()))
    return values + extras
