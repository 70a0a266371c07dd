"""GPUScalar's operators: the one generator of its dunders and hot paths, and the lazy ufunc.

Why this module exists: every operation on a GPUScalar (``s * t``, ``-s``, ``gs.sqrt(s)``,
``np.minimum(s, t)``) must record its node in far less time than the ~10 us launch it saves, so
the operators are generated once per backend class with that backend's ufuncs and loop tables
bound (`_install_fast_operators`, run on the per-backend classes that
`gpuscalar.scalar._classes_for` makes), and the base class gets thin general dunders from the
same tables. Both are registered on GPUScalar in one call, `install`, at import (the generator
as its ``_generate_operators``), so `gpuscalar.scalar` never imports this module. `_lazy_ufunc`
records any ufunc over scalars as pending node(s), with the loop `promote` chooses for the eager
call; `_binary` is the dunders' general path. Array operands go on to `gpuscalar.arrays` through
the class too (``GPUScalar._array_call`` and ``_apply_ufunc``, installed by that module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import promote
from .backend import Backend
from .lazy import expr
from .lazy.expr import CHILDREN, KEY, OP, SIZE, Node, make_node
from .lazy.keytable import KEY_STRUCTURE as _KEY_STRUCTURE
from .scalar import (
    _MISSING,
    _SCALAR_CLASSES,
    _UNREAD,
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
    to_int64_op,
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
        result = GPUScalar._array_call(name, operands, None)  # (gpuscalar.arrays's: `install`)
        return GPUScalar._apply_ufunc(name, *operands) if result is _MISSING else result
    operands = (right, left) if reflected else (left, right)
    result = _lazy_ufunc(backend, name, operands, left.device, python_operator=True)
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


#: Marks the kind of a strong GPUScalar operand: ``(STRONG, dtype)`` (a weak one's kind is its
#: dtype, a number's its type).
STRONG = "strong"


def operand_kind(operand: Any) -> Any:
    """The kind of an operand of a scalar-only operation (a GPUScalar's dtype, strong ones
    marked; a number's type): what its loop and keys depend on."""
    kind = type(operand)
    if kind in _SCALAR_CLASSES:
        return (STRONG, operand._dtype) if kind._is_strong else operand._dtype
    return kind


def is_scalar_kind(kind: Any) -> bool:
    """Whether ``kind`` (see `operand_kind`) is a GPUScalar's: a device leaf."""
    return isinstance(kind, np.dtype) or type(kind) is tuple


def _is_strong_kind(kind: Any) -> bool:
    return type(kind) is tuple or (isinstance(kind, type) and issubclass(kind, np.generic))


def scalar_dtype(kind: Any) -> np.dtype:
    """A GPUScalar kind's dtype."""
    return kind[1] if type(kind) is tuple else kind


def _kind_stand_in(kind: Any, name: str = "", python_operator: bool = False) -> Any:
    """What NumPy's resolver sees for an operand of ``kind`` in a scalar-only operation (rules
    2-3): a weak GPUScalar (``kind`` its dtype) as the Python type of its ``item()``, a Python
    scalar as itself (both weak), a strong GPUScalar or a NumPy scalar as its dtype
    (`promote.scalar_stand_in`)."""
    if isinstance(kind, np.dtype):
        return promote.scalar_stand_in(kind, name, python_operator)
    if type(kind) is tuple:
        return kind[1]
    if kind in promote.PYTHON_SCALAR_TYPES:
        return promote.python_number_stand_in(kind, name, python_operator)
    return np.dtype(kind)


def _resolve_lazy_loop(name: str, kinds: tuple[Any, ...], python_operator: bool,
                       numpy_call: bool) -> Any:
    """Fill `_LAZY_LOOPS` for ``name`` over operands of ``kinds`` (NumPy's error where NumPy
    has no loop for them, as the float path raises)."""
    found = None
    if getattr(np, name).signature is None:
        stand_ins = tuple(_kind_stand_in(kind, name, python_operator) for kind in kinds)
        if python_operator and name in _ORDERINGS and any(
                s is complex or (isinstance(s, np.dtype) and s.kind == "c") for s in stand_ins):
            raise TypeError(f"'{_ORDERINGS[name]}' not supported for complex numbers (Python's "
                            f"complex has no order; np.{name} orders them as NumPy does)")
        if name in _COMPARISONS and int in stand_ins and any(
                isinstance(s, np.dtype) and s.kind in "iu" for s in stand_ins):
            # NumPy compares a Python int with an integer scalar exactly (never wrapping it
            # into the scalar's type): an int64 loop does so for every value a device int holds
            stand_ins = tuple(_INT64 if s is int else s for s in stand_ins)
        signature = promote.parity_signature(name, stand_ins)
        nin = len(kinds)
        in_dtypes, out_dtypes = signature[:nin], signature[nin:]
        ops = tuple(expr.get_op("ufunc", name, in_dtypes, out_dtypes, k)
                    for k in range(len(out_dtypes)))
        keys = tuple(expr.leaf_key(scalar_dtype(kind)) if is_scalar_kind(kind)
                     else expr.const_key(dtype)
                     for kind, dtype in zip(kinds, in_dtypes, strict=True))
        # a NumPy scalar in the float path: a NumPy ufunc's result, or any result with one
        strong = numpy_call or any(map(_is_strong_kind, kinds))
        found = (tuple((op, op.dtype) for op in ops), in_dtypes, keys, strong)
    _LAZY_LOOPS[(name, python_operator, numpy_call) + kinds] = found
    return found


def _constant(value: Any, dtype: np.dtype) -> Any:
    """A Python or NumPy number as a kernel argument of ``dtype``, converted as NumPy converts
    it (a Python int into a float loop: correctly rounded, as Python's ``float(int)``)."""
    try:
        return dtype.type(value)
    except OverflowError:
        raise _out_of_range(value, dtype) from None


#: How many Python numbers one loop of a hot operator keeps converted (`_converted`).
CONSTANTS_PER_LOOP = 64


def _converted(found: tuple[Any, ...], value: Any) -> Any:
    """A Python number as a hot operator's kernel argument: ``value`` converted to the loop
    type ``found[2]`` (`_constant`'s conversion and error), and kept in ``found[6]`` (a loop's
    table of the numbers it met, bounded by `CONSTANTS_PER_LOOP`), so the next operation
    with the same number looks it up (a NumPy scalar is immutable: nodes may share it). Not
    kept: a float or complex zero, whose signs compare equal (``-0.0 == 0.0``, ``complex(-0.0,
    -0.0) == 0j``)."""
    loop_type = found[2]
    try:
        constant = loop_type(value)
    except OverflowError:
        raise _out_of_range(value, np.dtype(loop_type)) from None
    constants = found[6]
    if (value or type(value) is int or type(value) is bool) and (
            len(constants) < CONSTANTS_PER_LOOP):
        constants[value] = constant
    return constant


def _out_of_range(value: Any, dtype: np.dtype) -> OverflowError:
    return OverflowError(
        f"the Python int {value} does not fit the {dtype} the device computes this operation "
        "in (Python ints are unbounded, device integers are not: docs/semantics.md)")


def _lazy_ufunc(backend: Backend, name: str, operands: tuple[Any, ...],
                device: object, python_operator: bool = False, numpy_call: bool = False) -> Any:
    """Ufunc ``name`` over GPUScalars and Python/NumPy scalars as pending node(s): evaluated
    where consumed when lazy, at once (one device op each) when eager.

    The loop (and so every result dtype) is `promote`'s: NumPy's choice for the float path,
    each GPUScalar standing for the Python number it replaces (``python_operator``: Python's
    operator, where a bool is an int in arithmetic; else the NumPy ufunc). The result is strong
    (`gpuscalar.scalar._classes_for`) where the float path holds a NumPy scalar: a NumPy ufunc's
    result (``numpy_call``: ``np.sqrt(s)``, not ``gs.sqrt(s)``, whose float path is
    ``math.sqrt``), or any result with a strong operand or a NumPy scalar. A NumPy error for
    these operand types is raised here, as the float path raises it. Python numbers are
    converted to the loop's input dtype now, as NumPy converts them. Returns None for a gufunc
    (matmul): the caller decides.
    """
    scalar_classes = _SCALAR_CLASSES
    kinds: list[Any] = [name, python_operator, numpy_call]
    kinds += map(operand_kind, operands)
    found = _LAZY_LOOPS.get(tuple(kinds), _MISSING)
    if found is _MISSING:
        found = _resolve_lazy_loop(name, tuple(kinds[3:]), python_operator, numpy_call)
    if found is None:
        return None
    outputs, in_dtypes, leaf_keys, strong = found
    children = list(operands)
    keys = list(leaf_keys)
    size = 1
    scalars = []
    for i, operand in enumerate(operands):  # every number first: nothing is marked used yet
        if type(operand) in scalar_classes:
            scalars.append(i)
        else:
            children[i] = _constant(operand, in_dtypes[i])
    for i in scalars:
        children[i] = child = _child(operands[i])
        if type(child) is Node:
            keys[i] = child.key
            size += child.size
    children_, keys_ = tuple(children), tuple(keys)
    classes = _classes_for(backend)
    if strong:
        classes = classes["f"]._strong  # type: ignore[attr-defined]
    results = tuple(_pending(classes[dtype.kind], make_node(op, children_, keys_, size), dtype,
                             device)
                    for op, dtype in outputs)
    if not expr.is_lazy():  # eager: each result now, one device op
        for result in results:
            _materialize(result)
    return results[0] if len(results) == 1 else results


#: Python's ordering operators: a complex operand raises TypeError, as Python's complex does
_ORDERINGS = {"less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">="}
_COMPARISONS = frozenset({*_ORDERINGS, "equal", "not_equal"})

#: The operators whose Python result is an int (``math.floor(x)``, ``math.ceil``,
#: ``math.trunc``): their float value is converted to int64 by a second node, the ufunc
#: ``positive`` on the int64 loop (the conversion happens in the loop's input cast: exact, the
#: value being integral).
_TO_INT = frozenset({"floor", "ceil", "trunc"})
_INT64 = np.dtype(np.int64)


def _refuse_complex(name: str, dtype: np.dtype) -> None:
    if dtype.kind == "c":
        raise TypeError(f"{name}() of a complex GPUScalar: a Python complex has no {name} "
                        f"(the float path raises too)")


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
    """The base class's (complex scalars') one-operand operator."""

    def operator(self: GPUScalar) -> GPUScalar:
        if name in _TO_INT:
            _refuse_complex(f"math.{name}", self._dtype)
        return _lazy_ufunc(self._backend, name, (self,), self.device, python_operator=True)

    return operator


def _install_fast_operators(cls: Any, backend: Backend) -> None:
    """Give a real per-backend class dunders with the backend's ufuncs bound (the hot path).

    A real GPUScalar with a Python bool/int/float, or with a GPUScalar of the same class,
    can only produce a real result of the same backend (weak, or strong for a NumPy ufunc or a
    strong class), so the result class is known without looking at dtypes. Everything else
    goes to the general paths. An operation is a dict lookup of its loop (per operand dtypes),
    the conversion of a Python number (itself looked up: `_converted`), and one node; eager
    evaluates that node at once.

    The pending results are made as `gpuscalar.scalar._pending` (the one constructor of pending
    scalars) makes them, and their nodes as `expr.make_node` makes them when the structure key
    is known (the lookup of the op's child keys), both bodies written out in each operator:
    the calls would cost about 1,000 host instructions an operation (2% of a fold,
    ``bench/host_instructions.py``). Tests (``test_every_pending_scalar_is_made_by_the_one_
    constructor``, ``test_operators_make_the_nodes_make_node_makes``) keep the objects equal.
    """
    fast_class = cls
    strong = cls._is_strong
    multi_device = backend.multi_device
    real_python_types = frozenset({bool, int, float})
    python_types = promote.PYTHON_SCALAR_TYPES
    # the array path (gpuscalar.arrays's, installed on the class before any backend class is made)
    array_call, apply_ufunc = cls._array_call, cls._apply_ufunc
    is_lazy = expr.is_lazy
    leaf_keys = expr.LEAF_KEYS
    max_nodes, keep_nodes = expr.MAX_NODES, expr.KEEP_NODES
    new = object.__new__
    generic = np.generic

    def make_pair(cls: type) -> Callable[..., Any]:
        """The recorder of divmod's two pending results (same children and size)."""

        def record_pair(ops: tuple[Any, Any], dtypes: tuple[Any, Any], children: tuple,
                        keys: tuple, size: int, device: object) -> tuple[Any, Any]:
            results = []
            for op, dtype in zip(ops, dtypes, strict=True):
                result: GPUScalar = new(cls)  # `_pending`, written out (see above)
                result._array, result._used, result._host = None, False, _UNREAD
                result._node, result._dtype, result._device = (
                    make_node(op, children, keys, size), dtype, device)
                results.append(result)
            if size > max_nodes or not is_lazy():  # too large, or eager
                for result in results:
                    _materialize(result)
            return results[0], results[1]

        return record_pair

    def make(name: str, reflected: bool, python_operator: bool, numpy_call: bool = False) -> Any:
        """One binary operation's hot path: Python's operator (``python_operator``: a bool
        operand is an int in arithmetic), a gs helper, or the NumPy ufunc called on GPUScalars
        (``numpy_call``: its result is strong, a NumPy scalar in the float path; so is any
        result of a strong class)."""
        result_class = cls._strong["f"] if numpy_call or strong else cls
        # own dtype -> other's dtype or Python type -> (op, result dtype, the other operand's
        # loop type, the other's leaf or constant key, add, own leaf key, the Python numbers
        # converted to the loop type so far, the loop type's integer range); for two results
        # (divmod), op and result dtype are pairs. Nested: no pair key to build and hash.
        loops: dict[np.dtype, dict[Any, tuple[Any, ...]]] = {}
        foldable = name in ("add", "subtract") and not reflected
        pair = getattr(np, name).nout == 2
        record_pair = make_pair(result_class)

        def resolve(mine: np.dtype, other: Any) -> tuple[Any, ...]:
            is_scalar = isinstance(other, np.dtype)
            other_stand_in = (other if strong and is_scalar else
                              _kind_stand_in(other, name, python_operator))
            mine_stand_in = mine if strong else _kind_stand_in(mine, name, python_operator)
            operands = ((other_stand_in, mine_stand_in) if reflected
                        else (mine_stand_in, other_stand_in))
            signature = promote.parity_signature(name, operands)
            ops = tuple(expr.get_op("ufunc", name, signature[:2], signature[2:], k)
                        for k in range(2 if pair else 1))
            other_loop = signature[0 if reflected else 1]
            other_key = expr.leaf_key(other) if is_scalar else expr.const_key(other_loop)
            # x + c and x - c with a Python int in an integer loop are both recorded as one
            # add of a wrapped constant, so a counter's step + 1 + 1 ... stays one node
            add = bounds = None
            if foldable and other is int and ops[0].dtype.kind in "iu":
                add = expr.get_op("ufunc", "add", signature[:2], signature[2:])
                limits = np.iinfo(other_loop)
                bounds = (int(limits.min), int(limits.max))
            found: tuple[Any, ...] = (
                (ops, signature[2:]) if pair else (ops[0], ops[0].dtype)
            ) + (other_loop.type, other_key, add, leaf_keys[mine],
                 None if is_scalar else {}, bounds)
            loops.setdefault(mine, {})[other] = found
            return found

        def operator(self: GPUScalar, other: Any) -> Any:
            kind = type(other)
            if kind is fast_class:
                if multi_device and other._device != self._device:
                    return _binary(self, other, name, reflected)  # rule 5: the device error
                mine = self._dtype
                found = loops.get(mine, _NO_LOOPS).get(other._dtype) or resolve(mine,
                                                                                  other._dtype)
                op = found[0]
                # the other operand's child, as `gpuscalar.scalar._child` gives it (written
                # out): its array, its node, or (a larger node used again) its kept value
                other_child = other._node
                if other_child is None:
                    other_child, other_key, size = other._array, found[3], 1
                elif other._used and other_child[SIZE] > keep_nodes:
                    other_child, other_key, size = _materialize(other), found[3], 1
                else:
                    other._used = True
                    other_key, size = other_child[KEY], other_child[SIZE] + 1
            elif kind in real_python_types:
                mine = self._dtype
                found = loops.get(mine, _NO_LOOPS).get(kind) or resolve(mine, kind)
                other_child = found[6].get(other)
                if other_child is None:
                    other_child = _converted(found, other)
                op, other_key, size = found[0], found[3], 1
                if found[4] is not None:  # exact in integer (modular) arithmetic
                    folded = fold(self, other, other_child, found)
                    if folded is not None:
                        return folded
                    if op is not found[4]:  # x - c: recorded as x + (-c), wrapped
                        op, other_child = found[4], _wrapped_int(-other, found[1])
            else:
                if kind not in python_types and kind not in _SCALAR_CLASSES:  # an array: a fold
                    operands = (other, self) if reflected else (self, other)
                    folded_array = array_call(name, operands, None)
                    if folded_array is not _MISSING:
                        return folded_array
                if python_operator:
                    return _binary(self, other, name, reflected)
                return apply_ufunc(
                    name, *((other, self) if reflected else (self, other)), numpy_call=numpy_call)
            # this operand's child (`_child`, written out, as above)
            node = self._node
            if node is None:
                mine_child, mine_key = self._array, found[5]
            elif self._used and node[SIZE] > keep_nodes:  # used again: keep it (a leaf now)
                mine_child, mine_key = _materialize(self), found[5]
            else:
                self._used = True
                mine_child, mine_key, size = node, node[KEY], size + node[SIZE]
            if reflected:
                children, keys = (other_child, mine_child), (other_key, mine_key)
            else:
                children, keys = (mine_child, other_child), (mine_key, other_key)
            if pair:
                return record_pair(op, found[1], children, keys, size, self._device)
            key = op.keys.get(keys)  # `make_node`, written out (see above), on a known key
            result: GPUScalar = new(result_class)  # `_pending`, written out (see above)
            result._array, result._used, result._host = None, False, _UNREAD
            result._node = (Node((key, size, op, children)) if key is not None
                            else make_node(op, children, keys, size))
            result._dtype, result._device = found[1], self._device
            if size > max_nodes or not is_lazy():  # too large, or eager
                _materialize(result)
            return result

        def fold(self: GPUScalar, other: int, constant: Any, found: tuple[Any, ...]) -> Any:
            """``self + other`` or ``self - other`` (``constant``: ``other`` in the loop type)
            folded into ``self``'s own add of a constant, or None where ``self`` is not one
            (the caller then records an add of the constant, negated and wrapped for ``-``).
            Reached only through ``found[4]``, which `resolve` sets for these two only."""
            op, dtype, loop_type, other_key, add = found[:5]
            node = self._node
            # fold into an add whose right operand is a constant (never a device leaf:
            # reading one would be a hidden sync, and the key says "constant")
            if node is None or node[OP] is not add or (self._used and node[SIZE] > keep_nodes):
                return None
            first, previous = node[CHILDREN]
            if type(previous) is loop_type:
                value = int(previous) + other if op is add else int(previous) - other
                low, high = found[7]
                if low <= value <= high:  # no wrap: the same value in the loop's arithmetic
                    constant = previous + constant if op is add else previous - constant
                else:
                    constant = _wrapped_int(value, dtype)
            elif isinstance(previous, generic):
                constant = _wrapped_int((other if op is add else -other) + int(previous), dtype)
            else:
                return None
            self._used = True
            # the first child's key, as the node's structure records it (the node holds its
            # key, so its structure stays in the table: `gpuscalar.lazy.keytable`)
            keys = (_KEY_STRUCTURE[node[KEY]][1], other_key)
            children = (first, constant)
            size = node[SIZE]
            key = add.keys.get(keys)  # `make_node` and `_pending`, written out (see above)
            result: GPUScalar = new(result_class)
            result._array, result._used, result._host = None, False, _UNREAD
            result._node = (Node((key, size, add, children)) if key is not None
                            else make_node(add, children, keys, size))
            result._dtype, result._device = dtype, self._device
            if size > max_nodes or not is_lazy():
                _materialize(result)
            return result

        return operator

    def make_unary(name: str, python_operator: bool, numpy_call: bool = False) -> Any:
        """One one-operand operation's hot path (Python's operator, or the NumPy ufunc)."""
        # own dtype -> (op, dtype, the child keys of this op's node on a leaf of that dtype,
        # the int64 conversion `_TO_INT` operators apply after it, or None)
        ops: dict[np.dtype, tuple[Any, ...]] = {}
        to_int = python_operator and name in _TO_INT
        # math.floor(x) of a NumPy float is a Python int too: weak whatever the operand
        result_class = (cls._classes["f"] if to_int else
                        cls._strong["f"] if numpy_call or strong else cls)

        def resolve(mine: np.dtype) -> tuple[Any, ...]:
            signature = promote.parity_signature(
                name, (mine if strong else _kind_stand_in(mine, name, python_operator),))
            op = expr.get_op("ufunc", name, signature[:1], signature[1:])
            then = to_int64_op() if to_int and op.dtype != _INT64 else None
            found = ops[mine] = (op, op.dtype if then is None else _INT64,
                                 (leaf_keys[mine],), then)
            return found

        def operator(self: GPUScalar) -> Any:
            op, dtype, keys, then = ops.get(self._dtype) or resolve(self._dtype)
            child, size = self._node, 1
            if child is None:
                child = self._array
            else:
                child = _child(self)
                if type(child) is Node:
                    keys, size = (child[KEY],), child[SIZE] + 1
            node = make_node(op, (child,), keys, size)
            if then is not None:
                size += 1
                node = make_node(then, (node,), (node[KEY],), size)
            result: GPUScalar = new(result_class)  # `_pending`, written out (see above)
            result._array, result._used, result._host = None, False, _UNREAD
            result._node, result._dtype, result._device = node, dtype, self._device
            if size > max_nodes or not is_lazy():  # too large, or eager
                _materialize(result)
            return result

        return operator

    for stem, ufunc_name in UNARY_OPERATORS.items():
        method = make_unary(ufunc_name, True)
        method.__name__ = method.__qualname__ = f"__{stem}__"
        setattr(cls, method.__name__, method)
    # the helpers (gs.sqrt(s), gs.minimum(s, t), ...) take the same hot paths, and so do other
    # elementwise ufuncs called through __array_ufunc__ (made on first use: `_fast_function`)
    helpers = set(UNARY_OPERATORS.values())  # others are made on first use
    cls._fast_unary = {name: make_unary(name, False) for name in helpers
                       if getattr(np, name).nin == 1 and getattr(np, name).nout == 1}
    cls._fast_binary = {name: make(name, False, False) for name in helpers
                        if getattr(np, name).nin == 2 and getattr(np, name).nout == 1}
    cls._fast_binary["divmod"] = make("divmod", False, False)
    cls._fast_rbinary = {name: make(name, True, False) for name in cls._fast_binary}
    cls._fast_makers = (make_unary, make)
    _FAST_TABLES[cls] = (cls._fast_unary, cls._fast_binary, cls._fast_rbinary)
    _NUMPY_TABLES[cls] = ({}, {}, {})  # NumPy's ufuncs called on GPUScalars: made on first use

    tables = [(BINARY_OPERATORS, ("", "r")), (COMPARISON_OPERATORS, ("",))]
    for table, prefixes in tables:
        for stem, ufunc_name in table.items():
            for prefix in prefixes:
                if ufunc_name == "power" and prefix == "":
                    continue  # pow(s, x, modulo) needs the base class's three-argument form
                method = make(ufunc_name, prefix == "r", True)
                method.__name__ = method.__qualname__ = f"__{prefix}{stem}__"
                setattr(cls, method.__name__, method)


def _fast_function(cls: Any, key: Any, nin: int, reflected: bool,
                   numpy_call: bool = False) -> Any:
    """The hot path of the real class ``cls`` for a ufunc (``key``: NumPy's name, or the NumPy
    ufunc itself) with ``nin`` operands (a GPUScalar first, or second when ``reflected``), as a
    gs helper or (``numpy_call``) as the NumPy ufunc itself, made on first use; None where it
    has none: not NumPy's own elementwise ufunc of one output (two for a binary one), or not one
    the backend has (the general path decides)."""
    tables = (_NUMPY_TABLES if numpy_call else _FAST_TABLES)[cls]
    table = tables[0] if nin == 1 else tables[2] if reflected else tables[1]
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
            function = table[name] = (make_unary(name, False, numpy_call) if nin == 1
                                      else make(name, reflected, False, numpy_call))
        table[key] = function
    return function


#: real GPUScalar class -> its hot paths (one-operand, binary, reflected binary): name -> function,
#: as gs helpers (`_FAST_TABLES`) and as NumPy's ufuncs (`_NUMPY_TABLES`: strong results)
_FAST_TABLES: dict[type, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}
_NUMPY_TABLES: dict[type, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}


def _call_fast(name: Any, operands: tuple[Any, ...]) -> Any:
    """NumPy's ``ufunc name(*operands)`` (``name``: NumPy's name or the NumPy ufunc: a strong
    result) through a real GPUScalar class's hot path, or `_MISSING` where none applies. One
    operand: it must be a real GPUScalar; two: either may be (the other anything: the hot path
    hands what it does not know to the general path)."""
    if len(operands) == 2:
        first, second = operands
        tables = _NUMPY_TABLES.get(type(first))
        if tables is not None:
            function = tables[1].get(name) or _fast_function(type(first), name, 2, False, True)
            return _MISSING if function is None else function(first, second)
        tables = _NUMPY_TABLES.get(type(second))
        if tables is not None:
            function = tables[2].get(name) or _fast_function(type(second), name, 2, True, True)
            return _MISSING if function is None else function(second, first)
        return _MISSING
    if len(operands) == 1:
        tables = _NUMPY_TABLES.get(type(operands[0]))
        if tables is not None:
            function = (tables[0].get(name)
                        or _fast_function(type(operands[0]), name, 1, False, True))
            return _MISSING if function is None else function(operands[0])
    return _MISSING


def _pow(self: GPUScalar, other: Any, modulo: Any = None) -> Any:
    if modulo is not None:
        raise TypeError("pow() with a modulus is not supported for GPUScalar")
    return _binary(self, other, "power", False)


_pow.__name__, _pow.__qualname__ = "__pow__", "GPUScalar.__pow__"


def _conjugate(self: GPUScalar) -> GPUScalar:
    """The complex conjugate (the scalar itself for a real dtype), a GPUScalar; no sync."""
    if self._dtype.kind != "c":
        return self
    # as NumPy's ufunc on the scalar (`gpuscalar.arrays.apply_ufunc`'s scalar-only path)
    return _lazy_ufunc(self._backend, "conjugate", (self,), self._device, numpy_call=True)


_conjugate.__name__, _conjugate.__qualname__ = "conjugate", "GPUScalar.conjugate"


def install(cls: type[GPUScalar]) -> None:
    """THE registration of the operator generator on GPUScalar (``cls``), once, at import: the
    base class's general operators from the tables (complex scalars use them), ``pow`` with its
    modulus argument, ``conjugate``, and the generator of the per-backend classes' hot operators
    (``cls._generate_operators(backend)``, which `gpuscalar.scalar._classes_for` calls on each
    real per-backend class it makes)."""
    methods: dict[str, Any] = {}
    for stem, ufunc_name in BINARY_OPERATORS.items():
        for dunder, reflected in ((f"__{stem}__", False), (f"__r{stem}__", True)):
            methods[dunder] = _make_binary(ufunc_name, reflected)
    for stem, ufunc_name in COMPARISON_OPERATORS.items():
        methods[f"__{stem}__"] = _make_binary(ufunc_name, False)
    for stem, ufunc_name in UNARY_OPERATORS.items():
        methods[f"__{stem}__"] = _make_unary(ufunc_name)
    for name, method in methods.items():
        method.__name__ = method.__qualname__ = name
    methods.update(__pow__=_pow, conjugate=_conjugate)
    for name, method in methods.items():
        setattr(cls, name, method)
    cls._generate_operators = classmethod(_install_fast_operators)  # type: ignore[assignment]


install(GPUScalar)
