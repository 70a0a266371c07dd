"""GPUScalar's operators: the one generator of its dunders and hot paths, and the lazy ufunc.

Why this module exists: every operation on a GPUScalar (``s * t``, ``-s``, ``gs.sqrt(s)``,
``np.minimum(s, t)``) must record its node in far less time than the ~10 us launch it saves, so
the operators are generated once per backend class with that backend's ufuncs and loop tables
bound (`_install_fast_operators`, installed on the per-backend classes that
`gpuscalar.scalar._classes_for` makes), and the base class gets thin general dunders from the
same tables (`_install_operators`). `_lazy_ufunc` records any ufunc over scalars as pending
node(s), with the loop `promote` chooses for the eager call; `_binary` is the dunders' general
path. Built on `gpuscalar.scalar` (registered there through `scalar.register_hooks`, so that
module never imports this one); array operands go on to `gpuscalar.arrays` through the same
hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import ledger, promote, sync
from . import scalar as scalar_module
from .backend import Backend
from .lazy import expr
from .lazy.expr import KEY, SIZE, Node, make_node
from .scalar import (
    _MISSING,
    _SCALAR_CLASSES,
    BINARY_OPERATORS,
    COMPARISON_OPERATORS,
    UNARY_OPERATORS,
    GPUScalar,
    _array_of,
    _child,
    _classes_for,
    _materialize,
    _pending,
    _wrap,
)

__all__ = ["BINARY_OPERATORS", "COMPARISON_OPERATORS", "UNARY_OPERATORS"]

_NO_LOOPS: dict[Any, Any] = {}  # an empty loop table (never written): a miss without a branch


def _binary(left: GPUScalar, right: Any, name: str, reflected: bool) -> Any:
    """A dunder's general path: GPUScalar with another GPUScalar or a Python scalar (rules 2-3);
    anything else goes to `gpuscalar.arrays.apply_ufunc`."""
    kind = type(right)
    backend = left._backend
    if kind in promote.PYTHON_SCALAR_TYPES:
        other = right
    elif kind in _SCALAR_CLASSES and kind._backend is backend and right._device == left._device:
        other = None
    else:  # an array (``lr_expr * g``: the fold, straight to its cached decision) or other
        operands = (right, left) if reflected else (left, right)
        result = scalar_module._array_call(name, operands, None)  # (gpuscalar.arrays, a hook)
        return scalar_module._apply_ufunc(name, *operands) if result is _MISSING else result
    if expr.is_lazy():
        operands = (right, left) if reflected else (left, right)
        result = _lazy_ufunc(backend, name, operands, left.device)
        if result is not None:
            return result
    if other is None:
        other = _array_of(right)
    mine = _array_of(left)
    args = (other, mine) if reflected else (mine, other)
    result = backend.call(backend.ufunc(name), *args, **backend.ufunc_array_kwargs)
    if type(result) is tuple:
        return tuple(_wrap(backend, r) for r in result)
    return _wrap(backend, result)


#: (ufunc name, operand kinds) -> (one op per output, the loop's input dtypes, each operand's
#: key as a leaf or constant), or None where the ufunc is not elementwise (a gufunc such as
#: matmul): eager code decides. An operand's *kind* is a GPUScalar's dtype, or the type of a
#: Python or NumPy scalar (a type is never a dtype, so leaves and constants never share a kind).
_LAZY_LOOPS: dict[tuple[Any, ...], Any] = {}


def _kind_stand_in(kind: Any) -> Any:
    """What NumPy's resolver sees for an operand of ``kind`` in a scalar-only operation (rules
    2-3): a GPUScalar as a 0-d array of its dtype, a Python scalar weak, a NumPy scalar strong."""
    if isinstance(kind, np.dtype):
        return kind
    if kind in promote.PYTHON_SCALAR_TYPES:
        return np.dtype(bool) if kind is bool else kind
    return np.dtype(kind)


def _resolve_lazy_loop(name: str, kinds: tuple[Any, ...]) -> Any:
    """Fill `_LAZY_LOOPS` for ``name`` over operands of ``kinds`` (NumPy's error where NumPy
    has no loop for them, as the eager call raises)."""
    found = None
    if getattr(np, name).signature is None:
        signature = promote.parity_signature(name, tuple(map(_kind_stand_in, kinds)))
        nin = len(kinds)
        in_dtypes, out_dtypes = signature[:nin], signature[nin:]
        ops = tuple(expr.get_op("ufunc", name, in_dtypes, out_dtypes, k)
                    for k in range(len(out_dtypes)))
        keys = tuple(expr.leaf_key(kind) if isinstance(kind, np.dtype) else expr.const_key(dtype)
                     for kind, dtype in zip(kinds, in_dtypes, strict=True))
        found = (tuple((op, op.dtype) for op in ops), in_dtypes, keys)
    _LAZY_LOOPS[(name,) + kinds] = found
    return found


def _constant(value: Any, dtype: np.dtype) -> Any:
    """A Python or NumPy number as a kernel argument of ``dtype``, converted as NumPy converts
    it for the eager operation; None where only NumPy can say (see `_EXACT_INT`) or where the
    value does not fit ``dtype`` (NumPy raises, or special-cases it: comparisons)."""
    if type(value) is int and not -_EXACT_INT <= value <= _EXACT_INT:
        return None
    try:
        return dtype.type(value)
    except OverflowError:
        return None


def _lazy_ufunc(backend: Backend, name: str, operands: tuple[Any, ...],
                device: object) -> Any:
    """Record ufunc ``name`` over GPUScalars and Python/NumPy scalars as pending node(s).

    The loop (and so every result dtype) is `promote`'s, NumPy's own choice for the eager call;
    a NumPy error for these operand types is raised here, as eager code would. Python numbers
    are converted to the loop's input dtype now, as NumPy converts them. Returns None where
    eager code must decide: a number NumPy converts in its own way (`_constant`), a gufunc.
    """
    scalar_classes = _SCALAR_CLASSES
    kinds: list[Any] = [name]
    for operand in operands:
        kinds.append(operand._dtype if type(operand) in scalar_classes else type(operand))
    found = _LAZY_LOOPS.get(tuple(kinds), _MISSING)
    if found is _MISSING:
        found = _resolve_lazy_loop(name, tuple(kinds[1:]))
    if found is None:
        return None
    outputs, in_dtypes, leaf_keys = found
    children = list(operands)
    keys = list(leaf_keys)
    size = 1
    scalars = []
    for i, operand in enumerate(operands):  # every number first: nothing is marked used yet
        if type(operand) in scalar_classes:
            scalars.append(i)
        else:
            children[i] = constant = _constant(operand, in_dtypes[i])
            if constant is None:
                return None
    for i in scalars:
        children[i] = child = _child(operands[i])
        if type(child) is Node:
            keys[i] = child.key
            size += child.size
    children_, keys_ = tuple(children), tuple(keys)
    classes = _classes_for(backend)
    results = tuple(_pending(classes[dtype.kind], make_node(op, children_, keys_, size), dtype,
                             device)
                    for op, dtype in outputs)
    return results[0] if len(results) == 1 else results


#: A Python int beyond +-2**53 is left to NumPy, eagerly: NumPy converts such an int to a float
#: loop's dtype in two ways depending on the ufunc (directly, or through int64, which rounds once
#: where the direct way rounds twice), and some ufuncs (the logical ones) refuse ints beyond
#: int64 where others take them. Within +-2**53 every way gives the same value.
_EXACT_INT = 2**53


def _wrapped_int(value: int, dtype: np.dtype) -> np.generic:
    """``value`` modulo 2**bits as a NumPy integer of ``dtype`` (two's complement)."""
    bits = dtype.itemsize * 8
    value %= 1 << bits
    if dtype.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return dtype.type(value)


def _make_binary(name: str, reflected: bool) -> Any:
    def operator(self: GPUScalar, other: Any) -> Any:
        return _binary(self, other, name, reflected)

    return operator


def _make_unary(name: str) -> Any:
    def operator(self: GPUScalar) -> GPUScalar:
        backend = self._backend
        if expr.is_lazy():
            return _lazy_ufunc(backend, name, (self,), self.device)
        return _wrap(
            backend,
            backend.call(backend.ufunc(name), _array_of(self), **backend.ufunc_array_kwargs),
        )

    return operator


def _install_fast_operators(cls: Any, backend: Backend) -> None:
    """Give a real per-backend class dunders with the backend's ufuncs bound (the hot path).

    A real GPUScalar with a Python bool/int/float, or with a GPUScalar of the same class,
    can only produce a real result of the same backend, so the result class is known without
    looking at dtypes. Everything else goes to `_binary`, which handles all cases. Lazy, an
    operation is a dict lookup of its loop (per operand dtypes), the conversion of a Python
    number, and one node; eager, one ufunc call.
    """
    fast_class = cls
    multi_device = backend.multi_device
    device_of = backend.device_of
    out_ellipsis = backend.ufunc_array_kwargs == {"out": ...}
    real_python_types = frozenset({bool, int, float})
    python_types = promote.PYTHON_SCALAR_TYPES
    hooks = scalar_module  # `_array_call` (gpuscalar.arrays) is registered there
    note_op = sync.note_device_op
    counting = ledger.counting  # ContextVar.get, inlined: counting costs nothing when idle
    is_lazy = expr.is_lazy
    leaf_keys = expr.LEAF_KEYS
    max_nodes, keep_nodes = expr.MAX_NODES, expr.KEEP_NODES
    new = object.__new__

    def finish(result: Any) -> GPUScalar:
        if not out_ellipsis and type(result) is not np.ndarray and isinstance(result, np.generic):
            result = np.asarray(result)
        scalar: GPUScalar = new(cls)
        scalar._array = result
        scalar._node = None
        scalar._dtype = result.dtype
        scalar._device = device_of(result) if multi_device else "cpu"
        return scalar

    def finish_pair(results: tuple[Any, Any]) -> tuple[GPUScalar, GPUScalar]:
        return finish(results[0]), finish(results[1])

    def make_record(reflected: bool, pair: bool) -> Callable[..., Any]:
        """The recorder of one binary operator's pending results (one node; two for divmod)."""

        def record(self: GPUScalar, op: Any, dtype: Any, other: Any, other_key: int,
                   other_size: int, mine_key: int) -> Any:
            """The pending result of ``op`` on this scalar (a leaf of key ``mine_key``, or its
            node) and ``other`` (a node, leaf or constant of key ``other_key``); for divmod
            (``op``, ``dtype``: pairs) two results with the same children.
            The result's class is this one (a real operation of real operands); the scalar is
            made here, not by `_pending`: this is the hot path of every operator."""
            node = self._node
            if node is None:
                mine, size = self._array, 1 + other_size
            elif self._used and node[SIZE] > keep_nodes:  # used again: keep it (a leaf now)
                mine, size = _materialize(self), 1 + other_size
            else:
                self._used = True
                mine, mine_key, size = node, node[KEY], node[SIZE] + 1 + other_size
            if reflected:
                children, keys = (other, mine), (other_key, mine_key)
            else:
                children, keys = (mine, other), (mine_key, other_key)
            if pair:  # (op, op2), (dtype, dtype2): the second result below
                op, op2, dtype, dtype2 = op[0], op[1], dtype[0], dtype[1]
            result: GPUScalar = new(cls)
            result._node = make_node(op, children, keys, size)
            result._array = None
            result._used = False
            result._dtype = dtype
            result._device = self._device
            if size > max_nodes:
                _materialize(result)
            if pair:  # the second result (same children): `_pending` written out, as above
                second: GPUScalar = new(cls)
                second._array, second._used = None, False
                second._node, second._dtype, second._device = (
                    make_node(op2, children, keys, size), dtype2, self._device)
                if size > max_nodes:
                    _materialize(second)
                return result, second
            return result

        return record

    def make(name: str, reflected: bool) -> Any:
        ufunc = backend.ufunc(name)
        # own dtype -> other's dtype or Python type -> (op, result dtype, the other operand's
        # loop type, the other's leaf or constant key, add, own leaf key); for two results
        # (divmod), op and result dtype are pairs. Nested: no pair key to build and hash.
        loops: dict[np.dtype, dict[Any, tuple[Any, ...]]] = {}
        foldable = name in ("add", "subtract") and not reflected
        pair = getattr(np, name).nout == 2
        record = make_record(reflected, pair)

        def resolve(mine: np.dtype, other: Any) -> tuple[Any, ...]:
            is_scalar = isinstance(other, np.dtype)
            other_stand_in = other if is_scalar else promote.python_operand_stand_in(other(0))
            operands = (other_stand_in, mine) if reflected else (mine, other_stand_in)
            signature = promote.parity_signature(name, operands)
            ops = tuple(expr.get_op("ufunc", name, signature[:2], signature[2:], k)
                        for k in range(2 if pair else 1))
            other_loop = signature[0 if reflected else 1]
            other_key = expr.leaf_key(other) if is_scalar else expr.const_key(other_loop)
            # x + c and x - c with a Python int in an integer loop are both recorded as one
            # add of a wrapped constant, so a counter's step + 1 + 1 ... stays one node
            add = None
            if foldable and other is int and ops[0].dtype.kind in "iu":
                add = expr.get_op("ufunc", "add", signature[:2], signature[2:])
            found: tuple[Any, ...] = (
                (ops, signature[2:]) if pair else (ops[0], ops[0].dtype)
            ) + (other_loop.type, other_key, add, leaf_keys[mine])
            loops.setdefault(mine, {})[other] = found
            return found

        def operator(self: GPUScalar, other: Any) -> Any:
            kind = type(other)
            if kind is fast_class:
                if multi_device and other._device != self._device:
                    return _binary(self, other, name, reflected)  # rule 5: the device error
                if is_lazy():  # both GPUScalars of this class
                    mine, theirs = self._dtype, other._dtype
                    op, dtype, _, other_key, _, mine_key = (
                        loops.get(mine, _NO_LOOPS).get(theirs) or resolve(mine, theirs))
                    if other._node is None:
                        return record(self, op, dtype, other._array, other_key, 0, mine_key)
                    other_child = _child(other)
                    if type(other_child) is not Node:  # kept (materialized) now: a leaf
                        return record(self, op, dtype, other_child, other_key, 0, mine_key)
                    return record(self, op, dtype, other_child, other_child[KEY],
                                  other_child[SIZE], mine_key)
                other = other._array if other._array is not None else _materialize(other)
            elif kind not in real_python_types:
                if kind not in python_types and kind not in _SCALAR_CLASSES:  # an array: a fold
                    operands = (other, self) if reflected else (self, other)
                    found = hooks._array_call(name, operands, None)
                    if found is not _MISSING:
                        return found
                return _binary(self, other, name, reflected)
            elif is_lazy():
                mine = self._dtype
                op, dtype, loop_type, other_key, add, mine_key = (
                    loops.get(mine, _NO_LOOPS).get(kind) or resolve(mine, kind))
                try:
                    if kind is int and not -_EXACT_INT <= other <= _EXACT_INT:
                        raise OverflowError  # see _EXACT_INT
                    constant = loop_type(other)
                except OverflowError:  # NumPy decides such cases eagerly (and may raise)
                    with expr.lazy(False):
                        return _binary(self, other, name, reflected)
                if add is not None:  # exact in integer (modular) arithmetic
                    offset = other if op is add else -other
                    # fold into an add whose right operand is a constant (never a device
                    # leaf: reading one would be a hidden sync, and the key says "constant")
                    node = self._node
                    if node is not None and node.op is add \
                            and isinstance(node.children[1], np.generic) \
                            and not (self._used and node.size > keep_nodes):
                        first, previous = node.children
                        constant = _wrapped_int(offset + int(previous), dtype)
                        self._used = True
                        keys = (expr.child_key(first), other_key)
                        return _pending(cls, make_node(add, (first, constant), keys,
                                                           node.size), dtype, self._device)
                    op, constant = add, _wrapped_int(offset, dtype)
                return record(self, op, dtype, constant, other_key, 0, mine_key)
            mine_array = self._array if self._array is not None else _materialize(self)
            if counting():
                note_op()
            done = finish_pair if pair else finish
            if out_ellipsis:
                if reflected:
                    return done(ufunc(other, mine_array, out=...))
                return done(ufunc(mine_array, other, out=...))
            return done(ufunc(other, mine_array) if reflected else ufunc(mine_array, other))

        return operator

    def make_unary(name: str) -> Any:
        ufunc = backend.ufunc(name)
        # own dtype -> (op, dtype, the child keys of this op's node on a leaf of that dtype)
        ops: dict[np.dtype, tuple[Any, ...]] = {}

        def resolve(mine: np.dtype) -> tuple[Any, ...]:
            signature = promote.parity_signature(name, (mine,))
            op = expr.get_op("ufunc", name, signature[:1], signature[1:])
            found = ops[mine] = (op, op.dtype, (leaf_keys[mine],))
            return found

        def operator(self: GPUScalar) -> Any:
            if is_lazy():  # as `record` does for two operands (a call is a tenth of this path)
                op, dtype, keys = ops.get(self._dtype) or resolve(self._dtype)
                child, size = self._node, 1
                if child is None:
                    child = self._array
                else:
                    child = _child(self)
                    if type(child) is Node:
                        keys, size = (child[KEY],), child[SIZE] + 1
                result: GPUScalar = new(cls)
                result._array, result._used = None, False
                result._dtype, result._device = dtype, self._device
                result._node = make_node(op, (child,), keys, size)
                if size > max_nodes:
                    _materialize(result)
                return result
            mine_array = self._array if self._array is not None else _materialize(self)
            if counting():
                note_op()
            # a real operand gives a real result for every unary operator
            return finish(ufunc(mine_array, out=...) if out_ellipsis else ufunc(mine_array))

        return operator

    for stem, ufunc_name in UNARY_OPERATORS.items():
        method = make_unary(ufunc_name)
        method.__name__ = method.__qualname__ = f"__{stem}__"
        setattr(cls, method.__name__, method)
    # the helpers (gs.sqrt(s), gs.minimum(s, t), ...) take the same hot paths, and so do other
    # elementwise ufuncs called through __array_ufunc__ (made on first use: `_fast_function`)
    helpers = set(UNARY_OPERATORS.values())  # others are made on first use
    cls._fast_unary = {name: make_unary(name) for name in helpers
                       if getattr(np, name).nin == 1 and getattr(np, name).nout == 1}
    cls._fast_binary = {name: make(name, False) for name in helpers
                        if getattr(np, name).nin == 2 and getattr(np, name).nout == 1}
    cls._fast_binary["divmod"] = make("divmod", False)
    cls._fast_rbinary = {name: make(name, True) for name in cls._fast_binary}
    cls._fast_makers = (make_unary, make)
    _FAST_TABLES[cls] = (cls._fast_unary, cls._fast_binary, cls._fast_rbinary)

    tables = [(BINARY_OPERATORS, ("", "r")), (COMPARISON_OPERATORS, ("",))]
    for table, prefixes in tables:
        for stem, ufunc_name in table.items():
            for prefix in prefixes:
                if ufunc_name == "power" and prefix == "":
                    continue  # pow(s, x, modulo) needs the base class's three-argument form
                method = make(ufunc_name, prefix == "r")
                method.__name__ = method.__qualname__ = f"__{prefix}{stem}__"
                setattr(cls, method.__name__, method)


def _fast_function(cls: Any, key: Any, nin: int, reflected: bool) -> Any:
    """The hot path of the real class ``cls`` for a ufunc (``key``: NumPy's name, or the NumPy
    ufunc itself) with ``nin`` operands (a GPUScalar first, or second when ``reflected``), made
    on first use; None where it has none: not NumPy's own elementwise ufunc of one output (two
    for a binary one), or not one the backend has (the general path decides)."""
    table = cls._fast_unary if nin == 1 else cls._fast_rbinary if reflected else cls._fast_binary
    function = table.get(key, _MISSING)
    if function is _MISSING:
        name = key if type(key) is str else getattr(key, "__name__", "")
        ufunc = getattr(np, name, None)
        function = None
        if not isinstance(ufunc, np.ufunc) or (ufunc is not key and name is not key):
            pass  # another library's ufunc of the same name, or none
        elif name in table:
            function = table[name]
        elif (ufunc.signature is None and ufunc.nin == nin
                and (ufunc.nout == 1 or (nin == 2 and ufunc.nout == 2))
                and getattr(cls._backend.xp, name, None) is not None):
            make_unary, make = cls._fast_makers
            function = table[name] = make_unary(name) if nin == 1 else make(name, reflected)
        table[key] = function
    return function


#: real GPUScalar class -> its hot paths (one-operand, binary, reflected binary): name -> function
_FAST_TABLES: dict[type, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}


def _call_fast(name: Any, operands: tuple[Any, ...]) -> Any:
    """``ufunc name(*operands)`` (``name``: NumPy's name or the NumPy ufunc) through a real
    GPUScalar class's hot path (the operators'), or `_MISSING` where none applies. One operand:
    it must be a real GPUScalar; two: either may be (the other anything: the hot path hands
    what it does not know to `_binary`)."""
    if len(operands) == 2:
        first, second = operands
        tables = _FAST_TABLES.get(type(first))
        if tables is not None:
            function = tables[1].get(name) or _fast_function(type(first), name, 2, False)
            return _MISSING if function is None else function(first, second)
        tables = _FAST_TABLES.get(type(second))
        if tables is not None:
            function = tables[2].get(name) or _fast_function(type(second), name, 2, True)
            return _MISSING if function is None else function(second, first)
        return _MISSING
    if len(operands) == 1:
        tables = _FAST_TABLES.get(type(operands[0]))
        if tables is not None:
            function = tables[0].get(name) or _fast_function(type(operands[0]), name, 1, False)
            return _MISSING if function is None else function(operands[0])
    return _MISSING


def _install_operators() -> None:
    for stem, ufunc_name in BINARY_OPERATORS.items():
        for dunder, reflected in ((f"__{stem}__", False), (f"__r{stem}__", True)):
            if dunder in GPUScalar.__dict__:
                continue
            method = _make_binary(ufunc_name, reflected)
            method.__name__ = method.__qualname__ = dunder
            setattr(GPUScalar, dunder, method)
    for stem, ufunc_name in COMPARISON_OPERATORS.items():
        method = _make_binary(ufunc_name, False)
        method.__name__ = method.__qualname__ = f"__{stem}__"
        setattr(GPUScalar, f"__{stem}__", method)
    for stem, ufunc_name in UNARY_OPERATORS.items():
        method = _make_unary(ufunc_name)
        method.__name__ = method.__qualname__ = f"__{stem}__"
        setattr(GPUScalar, f"__{stem}__", method)


_install_operators()


scalar_module.register_hooks(install_fast_operators=_install_fast_operators, call_fast=_call_fast,
                             binary=_binary)
