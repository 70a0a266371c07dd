"""Pending scalar expressions (the small IR behind lazy GPUScalars and optimizer rules), THE walk
of a tree and THE host evaluator.

Why this module exists: on a GPU every scalar operation is a kernel launch (~10 us of CPU time
in CuPy); a 12-op learning-rate schedule cost 149 us per step as CuPy 0-d ops and 7.6 us as one
kernel on an H100. So by default a GPUScalar operation does not launch anything: it records a
*node*, and the expression is evaluated where it is consumed, in one kernel or folded into the
kernel that consumes it (`gpuscalar.fusion`).

A node is a `Node`: an immutable tuple ``(key, size, op, children)`` with those fields named
(``node.key``, ``node.size``, ``node.op``, ``node.children``), built only by `make_node`:

- ``op`` is an interned `Op`: a NumPy ufunc (or ``where``, ``round``) with the loop it runs,
  decided when the node is built by `gpuscalar.promote` exactly as the eager operation would be,
  so a pending scalar's dtype is known without evaluating anything; its kind's row of `OP_KINDS`
  says how it runs on the host, replayed eagerly and in generated C;
- each child is another node, a 0-d device array (a *leaf*: a materialized GPUScalar's array),
  or a NumPy scalar (a Python number, converted when the node is built to the dtype the loop
  reads it in, as NumPy converts it: a kernel argument, never a constant in generated source);
- ``key`` is an int interned from the op and the children's keys when the node is built: equal
  keys mean equal structure (ops, dtypes, leaf kinds), never equal values, so a loop that builds
  the same expression every step compiles once, and a kernel lookup is O(1);
- ``size`` counts the op nodes of the tree; past `MAX_NODES` an expression is materialized where
  it is built, so ``total = total + loss`` over 100,000 steps stays bounded.

Structures can vary with the data (``total = total + (a if cond else b)`` makes 2^k shapes in
k steps), and a kernel is compiled per structure evaluated whole, never dropped by CuPy: so the
consumers bound the structures they evaluate whole per *family* (the root's op and the tree's
size), evaluating a churning family's new shapes in pieces of a bounded set of shapes, with
bit-identical results (`gpuscalar.lazy.fusion.splits`). A program that repeats its shapes
never meets that rule.

Children are never GPUScalars: when a pending GPUScalar is materialized it drops its node, and
expressions built from it earlier keep the subtree they captured (and the key that describes
it), so materialization never changes an existing node and memory stays bounded.

Walks are iterative (post-order), so no expression depth meets Python's recursion limit.

Threads: the process-wide tables (`Op` ids, structure keys, plans) are shared by every thread,
as a float's arithmetic would be. A lookup that hits is a plain dict read (no lock: recording a
node costs well under a microsecond); a miss takes `_TABLE_LOCK`, looks again, and only then
hands out the next id or key, so two threads using an op or a shape for the first time together
get one id or key (never the same id for two ops, which would share a kernel and give wrong
values). Plans are a `BoundedCache` (an LRU, bounded with fusion's kernel caches by one setting,
`set_cache_size`; a plan is rebuilt from its key);
structure keys are dropped once nothing refers to them (no node, kernel, plan: see
`gpuscalar.lazy.keytable`), never reused, so the table holds ~`KEY_BYTES_PER_SHAPE` per shape
alive, not per shape ever built.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from operator import itemgetter
from typing import Any, ClassVar

import numpy as np

from . import caches, hostprogram
from .caches import DEFAULT_CACHE_SIZE, BoundedCache, cache_size, set_cache_size
from .keytable import KEY_STRUCTURE as _KEY_STRUCTURE
from .keytable import KEYS as _KEYS
from .keytable import OPS_BY_ID as _OPS_BY_ID
from .keytable import TABLE_LOCK as _TABLE_LOCK
from .keytable import intern as _intern

__all__ = [
    "MAX_NODES",
    "KEEP_NODES",
    "LAZY_ENV_VAR",
    "Op",
    "get_op",
    "OpKind",
    "OP_KINDS",
    "Node",
    "KEY",
    "SIZE",
    "OP",
    "CHILDREN",
    "make_node",
    "leaf_key",
    "LEAF_KEYS",
    "const_key",
    "is_node",
    "child_key",
    "find_key",
    "intern_key",
    "describe_structure",
    "structure_name",
    "postorder",
    "leaves_of",
    "Plan",
    "plan_of",
    "plan_for_key",
    "BoundedCache",
    "DEFAULT_CACHE_SIZE",
    "cache_size",
    "set_cache_size",
    "KEY_BYTES_PER_SHAPE",
    "RULE_FUNCTIONS",
    "fold_plan",
    "evaluate",
    "evaluate_on_host",
    "evaluate_plan",
    "host_program",
    "host_program_of",
    "lazy",
    "is_lazy",
]

#: An expression larger than this (op nodes) is materialized where it is built.
MAX_NODES = 64
#: A pending expression of more than this many nodes is *kept* (its value stored) when it is
#: used a second time, rather than computed again inside every consumer: an array kernel that
#: consumes it stores it as a side output (no launch of its own), and a second operand use
#: materializes it (one launch). So a loop-carried scalar (``a = a - lr * grad_a`` consumed by
#: ``a * x`` every step) keeps a bounded, repeating structure: a handful of kernels, compiled once.
KEEP_NODES = 4
#: Environment variable that switches the default mode: ``GPUSCALAR_LAZY=0`` is eager.
LAZY_ENV_VAR = "GPUSCALAR_LAZY"


# ---- the switch -----------------------------------------------------------------------------


def _lazy_default_from_env() -> bool:
    raw = os.environ.get(LAZY_ENV_VAR, "")
    value = raw.strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(
        f"environment variable {LAZY_ENV_VAR}={raw!r} is invalid; use 1 (lazy, the default) or "
        "0 (eager)"
    )


_LAZY_DEFAULT: bool = _lazy_default_from_env()
_lazy_mode: ContextVar[bool] = ContextVar("gpuscalar_lazy", default=_LAZY_DEFAULT)
#: Whether GPUScalar operations record nodes (True) or launch at once (False). A C call.
is_lazy = _lazy_mode.get


@contextlib.contextmanager
def lazy(enabled: bool = True) -> Iterator[None]:
    """Within the block, GPUScalar operations are lazy (``True``, the default) or eager.

    ``gs.lazy(False)`` gives the eager behaviour (one backend call per operation, errors at the
    line that caused them): for debugging. Nests and restores on exit; per thread / context.
    ``GPUSCALAR_LAZY=0`` makes eager the default of a whole program.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"gpuscalar.lazy() takes a bool, got {type(enabled).__name__}")
    token = _lazy_mode.set(enabled)
    try:
        yield
    finally:
        _lazy_mode.reset(token)


# ---- ops and keys ---------------------------------------------------------------------------


class Op:
    """One operation of an expression: what runs, on which loop dtypes. Interned: equal ops are
    the same object with the same small ``id``."""

    __slots__ = ("kind", "name", "in_dtypes", "out_dtypes", "output", "param", "id",
                 "signature", "keys", "row")

    kind: str  # a key of `OP_KINDS`: "ufunc", "where", "round" (or "rule", an update rule's)
    name: str  # NumPy's ufunc name (or "where" / "round"; a rule's operator or function)
    in_dtypes: tuple[np.dtype, ...]
    out_dtypes: tuple[np.dtype, ...]
    output: int  # which output of a multi-output ufunc (divmod, frexp, modf)
    param: Any  # round's decimals; None otherwise
    id: int
    signature: tuple[np.dtype, ...]  # in_dtypes + out_dtypes
    keys: dict[tuple[int, ...], int]  # the children's keys -> the structure key of a node
    row: OpKind  # OP_KINDS[kind]: how the op runs (on the host, replayed, in generated C)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the node's value."""
        return self.out_dtypes[self.output]

    def __repr__(self) -> str:
        ins = ",".join(d.name for d in self.in_dtypes)
        outs = ",".join(d.name for d in self.out_dtypes)
        extra = "" if self.param is None else f", {self.param!r}"
        pick = f"[{self.output}]" if len(self.out_dtypes) > 1 else ""
        return f"Op({self.name}({ins})->{outs}{pick}{extra})"


_OPS: dict[tuple, Op] = {}


def get_op(kind: str, name: str, in_dtypes: tuple[np.dtype, ...],
           out_dtypes: tuple[np.dtype, ...], output: int = 0, param: Any = None) -> Op:
    """The interned `Op` for these properties (thread-safe: one id per op); ``kind`` is a key of
    `OP_KINDS`."""
    identity = (kind, name, in_dtypes, out_dtypes, output, param)
    op = _OPS.get(identity)
    if op is None:
        row = OP_KINDS.get(kind)
        if row is None:
            raise ValueError(f"unknown op kind {kind!r}: the kinds are {', '.join(OP_KINDS)} "
                             "(gpuscalar.lazy.expr.OP_KINDS)")
        with _TABLE_LOCK:
            op = _OPS.get(identity)
            if op is None:
                op = object.__new__(Op)
                op.kind, op.name, op.in_dtypes, op.out_dtypes = kind, name, in_dtypes, out_dtypes
                op.output, op.param, op.id = output, param, len(_OPS_BY_ID)
                op.signature = in_dtypes + out_dtypes
                op.keys = {}
                op.row = row
                _OPS_BY_ID.append(op)  # findable by id before its identity is published
                _OPS[identity] = op
    return op


#: Rough memory of the structure-key tables per distinct expression shape alive (one node
#: structure: its tuple of op id and child keys, the dict entries and the int key, plus the op's
#: own entry, child keys -> key, that `make_node` looks up), measured with tracemalloc over
#: 10,000 distinct binary-op shapes on CPython 3.11 (215 bytes each). Keys nothing refers to
#: any more (no node, cached kernel or plan) are dropped (`gpuscalar.lazy.keytable`), so the
#: table holds the shapes alive, not every shape ever built.
KEY_BYTES_PER_SHAPE = 215


#: A node's structure key from its structure tuple (op id, child keys...): None if never built
#: (or dropped since: `gpuscalar.lazy.keytable`).
find_key = _KEYS.get
intern_key = _intern

class _LeafKeys(dict):
    """dtype -> the key of a 0-d device array of that dtype used as a leaf (made on demand;
    concurrent first uses store the same key, `_intern` being thread-safe)."""

    def __missing__(self, dtype: np.dtype) -> int:
        key = self[dtype] = _intern(("leaf", dtype))
        return key


LEAF_KEYS: dict[np.dtype, int] = _LeafKeys()
_CONST_KEYS: dict[np.dtype, int] = {}


def leaf_key(dtype: np.dtype) -> int:
    """The key of a 0-d device array of ``dtype`` used as a leaf."""
    return LEAF_KEYS[dtype]


def const_key(dtype: np.dtype) -> int:
    """The key of a Python number passed to a kernel as ``dtype``."""
    key = _CONST_KEYS.get(dtype)
    if key is None:
        key = _CONST_KEYS[dtype] = _intern(("const", dtype))
    return key


#: A `Node`'s fields by index, for the few hot paths that read them without the named
#: properties (an index is a C call; ``node.key`` a property call): ``node[KEY]`` is
#: ``node.key``, and so on.
KEY, SIZE, OP, CHILDREN = 0, 1, 2, 3


class Node(tuple):
    """One pending operation: the tuple ``(key, size, op, children)`` with named fields.

    A tuple subclass (not a dataclass) because recording a node is the hot path of every lazy
    operation: building one is a single tuple construction. Build nodes only with `make_node`
    (or its known-key lookup, written out where `make_node` says).
    """

    __slots__ = ()

    #: The interned structure key (equal keys: equal ops, dtypes and leaf kinds).
    key: int = property(itemgetter(KEY))  # type: ignore[assignment]
    #: How many op nodes the tree holds (this one included).
    size: int = property(itemgetter(SIZE))  # type: ignore[assignment]
    #: The `Op` this node applies.
    op: Op = property(itemgetter(OP))  # type: ignore[assignment]
    #: The operands, in call order: nodes, 0-d device arrays (leaves) or NumPy scalars
    #: (constants).
    children: tuple[Any, ...] = property(itemgetter(CHILDREN))  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Node({describe_structure(self[0])}, size={self[1]})"


def is_node(value: Any) -> bool:
    """Whether ``value`` is an expression node (not a leaf or a constant)."""
    return type(value) is Node


def child_key(child: Any) -> int:
    """The key of any child: a node's own, or that of its leaf or constant kind."""
    if type(child) is Node:
        return child.key
    if isinstance(child, np.generic):
        return const_key(child.dtype)
    return leaf_key(child.dtype)


def make_node(op: Op, children: tuple[Any, ...], keys: tuple[int, ...] | None = None,
              size: int = 0) -> Node:
    """THE constructor of a `Node`: ``op`` applied to ``children`` (a tuple of nodes, 0-d device
    arrays and NumPy scalars), its structure key interned.

    ``keys`` (each child's key, see `child_key`) and ``size`` (1 + the children's sizes) are
    given by callers that already know them (the generated operators read a leaf's or a
    constant's key from their loop tables): recording a node then costs one dict lookup (the
    op's own table of child keys) and one tuple. Left out, they are computed from the children.
    The scalar operators' hot paths write that lookup out and call this on a miss
    (`gpuscalar.operators._install_fast_operators` says why); a test
    (``test_operators_make_the_nodes_make_node_makes``) keeps them making the same node.
    """
    if keys is None:
        keys = tuple(map(child_key, children))
        size = 1 + sum(child.size for child in children if type(child) is Node)
    key = op.keys.get(keys)
    if key is None:
        key = op.keys[keys] = _intern((op.id, *keys))  # the same key however many threads
    return Node((key, size, op, children))


def describe_structure(key: int) -> str:
    """The structure behind ``key`` as text (ops, dtypes, leaf kinds; no values), the same in
    every process."""
    parts: list[str] = []
    stack: list[Any] = [key]
    while stack:
        item = stack.pop()
        if type(item) is str:
            parts.append(item)
            continue
        structure = _KEY_STRUCTURE[item]
        if type(structure[0]) is str:  # a leaf kind (an op's structure starts with its id)
            parts.append(f"{structure[0]}:{getattr(structure[1], 'str', structure[1])}")
            continue
        parts.append(f"{_OPS_BY_ID[structure[0]]!r}(")
        stack.append(")")
        for i, child in enumerate(reversed(structure[1:])):
            if i:
                stack.append(",")
            stack.append(child)
    return "".join(parts)


def structure_name(key: int) -> str:
    """A short name for an expression structure, the same in every process (for kernel names
    and CuPy's on-disk cache, which is keyed by source text)."""
    return hashlib.sha1(describe_structure(key).encode()).hexdigest()[:16]


# ---- walks ------------------------------------------------------------------------------------


def postorder(root: Node) -> Iterator[tuple[Any, bool]]:
    """Every item of the tree, children before parents, left to right: ``(item, is_node)``.
    A subexpression used twice is visited twice (expressions are trees)."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        item, next_child = stack.pop()
        if type(item) is not Node:
            yield item, False
            continue
        if next_child < len(item.children):
            stack.append((item, next_child + 1))
            stack.append((item.children[next_child], 0))
        else:
            yield item, True


def leaves_of(root: Node) -> list[Any]:
    """The leaves and constants of ``root`` in the order its `Plan` numbers them (left to right,
    as `postorder` meets them). Called for every evaluation and fold: one op's are its
    children; a tree of up to `READER_NODES` nodes (every expression within the size bound) is
    read by its structure's generated reader (`leaf_reader`: subscripts, no walk); a larger tree
    (built by hand) is walked iteratively, at any depth. (Fields by index: this is on the path
    of every fold.)"""
    size = root[SIZE]
    if size == 1:  # one op: its children are the leaves
        return list(root[CHILDREN])
    reader = _LEAF_READERS.get(root[KEY])
    if reader is not None:
        return reader(root)
    if size <= READER_NODES:
        return leaf_reader(root)(root)
    leaves: list[Any] = []
    stack: list[Any] = [root]
    pop, push, append = stack.pop, stack.extend, leaves.append
    while stack:
        item = pop()
        if type(item) is Node:
            push(item[CHILDREN][::-1])  # the children, last first: popped left to right
        else:
            append(item)
    return leaves


#: The largest tree (in nodes) whose structure gets a generated leaf reader (`leaf_reader`).
READER_NODES = MAX_NODES
#: structure key -> its leaf reader; bounded by `cache_size` (emptied when full, and at each
#: sweep of the key table: a reader is made again from any tree of its structure, the same)
_LEAF_READERS: dict[int, Callable[[Node], list[Any]]] = caches.derived({})


def leaf_reader(root: Node) -> Callable[[Node], list[Any]]:
    """A function giving `leaves_of` of every tree of ``root``'s structure: the list of its
    leaves and constants read by subscripts, each node's children bound once
    (``t0 = n[3]; t1 = t0[0][3]; return [t1[0], t1[1], t0[1]]``).

    Why generated: a fold or evaluation of a small tree reads its leaves on every call, and a
    walk costs a Python call per node; a structure fixes which children are nodes and which
    are leaves (the key of a leaf kind is never a node's), so the subscripts are the same for
    every tree of one key."""
    reader: Callable[[Node], list[Any]] = _generated_reader("n", *_leaf_reads(root))
    caches.keep(_LEAF_READERS, root[KEY], reader)
    return reader


def argument_reader(root: Node, count: int, position: int
                    ) -> Callable[[tuple[Any, ...], Node], list[Any]]:
    """A function ``(operands, node) -> list`` for every tree of ``root``'s structure: the
    ``count`` operands with the one at ``position`` (a pending scalar whose node is the tree)
    replaced by the tree's leaves, in order (a fold's kernel arguments, `leaf_reader`'s
    subscripts spliced in; the caller caches it with its plan)."""
    statements, leaves = _leaf_reads(root)
    items = [f"o[{i}]" for i in range(position)] + leaves + [
        f"o[{i}]" for i in range(position + 1, count)]
    return _generated_reader("o, n", statements, items)


def _leaf_reads(root: Node) -> tuple[list[str], list[str]]:
    """Statements binding each node's children of ``root`` (a tree named ``n``) to a local,
    and each leaf as a subscript of one (left to right, as `postorder` meets them)."""
    statements: list[str] = []
    leaves: list[str] = []

    def visit(node: Node, path: str) -> None:
        local = f"t{len(statements)}"
        statements.append(f"{local} = {path}[{CHILDREN}]")
        for i, child in enumerate(node[CHILDREN]):
            if type(child) is Node:
                visit(child, f"{local}[{i}]")
            else:
                leaves.append(f"{local}[{i}]")

    visit(root, "n")  # (recursive: a reader is made for trees within `MAX_NODES`)
    return statements, leaves


def _generated_reader(parameters: str, statements: list[str], items: list[str]) -> Any:
    """``def reader(<parameters>): <statements>; return [<items>]``: only names and integer
    subscripts enter the text."""
    lines = [f"def reader({parameters}):", *(f"    {line}" for line in statements),
             f"    return [{', '.join(items)}]"]
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102
    return namespace["reader"]


class Plan:
    """How to evaluate one expression structure: ``steps`` in post-order, each ``(op, refs)``
    where a ref ``>= 0`` is a leaf index and ``~j`` is the result of step ``j``. Built from the
    structure key alone (the key table describes the whole tree), so an evicted plan is rebuilt
    the same."""

    __slots__ = ("key", "steps", "leaf_kinds", "name")

    def __init__(self, key: int) -> None:
        self.key = key
        steps: list[tuple[Op, tuple[int, ...]]] = []
        leaf_kinds: list[tuple[str, np.dtype]] = []
        refs: list[int] = []
        # Post-order over the structures, children left to right (as `postorder` walks nodes).
        stack: list[tuple[int, int]] = [(key, 1)]
        while stack:
            item, next_child = stack.pop()
            structure = _KEY_STRUCTURE[item]
            if type(structure[0]) is str:  # a leaf kind: "leaf", "const", a rule's symbol...
                refs.append(len(leaf_kinds))
                leaf_kinds.append(structure)
                continue
            if next_child < len(structure):
                stack.append((item, next_child + 1))
                stack.append((structure[next_child], 1))
                continue
            arity = len(structure) - 1
            args = tuple(refs[len(refs) - arity:])
            del refs[len(refs) - arity:]
            refs.append(~len(steps))
            steps.append((_OPS_BY_ID[structure[0]], args))
        self.steps = tuple(steps)
        self.leaf_kinds = tuple(leaf_kinds)
        self.name = structure_name(key)


#: key -> `Plan`, least recently used dropped first past `cache_size`.
_PLANS = BoundedCache()


def plan_for_key(key: int) -> Plan:
    """The (cached) plan of the structure ``key``: O(1) after the first use of a shape."""
    return _PLANS.get(key, Plan, key)


def plan_of(root: Node) -> Plan:
    """The (cached) plan of ``root``'s structure: O(1) after the first expression of a shape."""
    return plan_for_key(root.key)


# ---- op kinds: how each kind of op runs, one row each ----------------------------------------


class OpKind:
    """How the ops of one kind (`Op.kind`) run, everywhere they run: one row of `OP_KINDS`.

    Why: an op runs in three places, the host evaluator (NumPy), the eager replay of a tree CuPy
    cannot fuse (`gpuscalar.lazy.fusion`) and the generated CUDA C (`gpuscalar.lazy.codegen`);
    one row per kind keeps them together, so a new kind is one subclass defining every column of
    `COLUMNS` (checked when the class is made), added to `OP_KINDS`. A column is given what it
    needs (a backend, the CuPy module): this module imports none of the modules that run ops.
    """

    #: The columns: the methods every kind defines.
    COLUMNS = ("on_host", "replay", "cupy_ufunc", "routine_operands")
    #: The kind's name: the value of `Op.kind` and the row's key in `OP_KINDS`.
    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        lacks = [] if cls.name else ["name"]
        lacks += [column for column in OpKind.COLUMNS
                  if getattr(cls, column) is getattr(OpKind, column)]
        if lacks:
            raise TypeError(f"op kind {cls.__name__} ({cls.name or 'no name'}) lacks "
                            f"{', '.join(lacks)}: every kind has a name and every column of "
                            "OpKind.COLUMNS")

    def on_host(self, op: Op, args: list[Any]) -> Any:
        """The op with NumPy on host values, as the eager operation runs it (`fold_plan`)."""
        raise NotImplementedError

    def _host_source(self, op: Op, operands: list[str], bind: Callable[[Any], str]) -> str:
        """`on_host` as a Python expression over ``operands`` (Python expressions giving what
        `fold_plan` gives it), for the compiled host evaluator (`host_program`); ``bind(x)``
        names an object for that text. Not a column: this default, the call of `on_host`
        itself, serves every kind; a kind may write its call out."""
        return f"{bind(self.on_host)}({bind(op)}, [{', '.join(operands)}])"

    def replay(self, backend: Any, op: Op, args: list[Any]) -> Any:
        """The op as ``backend``'s eager call on ``args`` (as `codegen.unfused_args` gives
        them), for a tree CuPy cannot fuse; the caller casts the value to ``op.dtype``."""
        raise NotImplementedError

    def cupy_ufunc(self, cupy: Any, op: Op) -> Any:
        """The CuPy ufunc whose routine for the op's loop the generated C runs, or None (CuPy's
        private internals: an AttributeError or ImportError makes the op unfusable)."""
        raise NotImplementedError

    def routine_operands(self, op: Op) -> tuple[tuple[str, np.dtype], ...]:
        """What that routine reads after the op's own operands, as ``(C text, dtype)`` each."""
        raise NotImplementedError


class UfuncKind(OpKind):
    """A NumPy ufunc, ``op.name``, on the loop ``op.signature`` (``op.output`` picks one output
    of a multi-output ufunc: divmod, frexp, modf)."""

    name = "ufunc"

    def on_host(self, op: Op, args: list[Any]) -> Any:
        result = getattr(np, op.name)(*args, signature=op.signature, casting="unsafe")
        return result[op.output] if len(op.out_dtypes) > 1 else result

    def _host_source(self, op: Op, operands: list[str], bind: Callable[[Any], str]) -> str:
        call = (f"{bind(getattr(np, op.name))}({', '.join(operands)}, "
                f"signature={bind(op.signature)}, casting='unsafe')")  # `on_host`, written out
        return f"{call}[{op.output}]" if len(op.out_dtypes) > 1 else call

    def replay(self, backend: Any, op: Op, args: list[Any]) -> Any:
        value = backend.call(backend.ufunc(op.name), *args)
        return value[op.output] if len(op.out_dtypes) > 1 else value

    def cupy_ufunc(self, cupy: Any, op: Op) -> Any:
        return getattr(cupy, op.name, None)

    def routine_operands(self, op: Op) -> tuple[tuple[str, np.dtype], ...]:
        return ()


class WhereKind(OpKind):
    """``where(condition, x, y)``, the branches meeting in the node's dtype."""

    name = "where"

    def on_host(self, op: Op, args: list[Any]) -> Any:  # cast as the kernel casts the branches
        condition, x, y = args
        return np.where(condition, np.asarray(x).astype(op.in_dtypes[1], copy=False),
                        np.asarray(y).astype(op.in_dtypes[2], copy=False))

    def replay(self, backend: Any, op: Op, args: list[Any]) -> Any:
        return backend.call(backend.xp.where, *args)

    def cupy_ufunc(self, cupy: Any, op: Op) -> Any:
        from cupy._sorting import search  # noqa: PLC0415 - asked for only on CuPy

        return search._where_ufunc

    def routine_operands(self, op: Op) -> tuple[tuple[str, np.dtype], ...]:
        return ()


class RoundKind(OpKind):
    """``round(x, decimals)`` on its loop's dtype, ``decimals`` being ``op.param``."""

    name = "round"

    def on_host(self, op: Op, args: list[Any]) -> Any:  # cast as the kernel casts its operand
        return np.round(np.asarray(args[0]).astype(op.in_dtypes[0], copy=False), op.param)

    def replay(self, backend: Any, op: Op, args: list[Any]) -> Any:
        return backend.call(backend.xp.round, args[0], op.param)

    def cupy_ufunc(self, cupy: Any, op: Op) -> Any:
        from cupy._core import core  # noqa: PLC0415 - asked for only on CuPy

        return core._round_ufunc

    def routine_operands(self, op: Op) -> tuple[tuple[str, np.dtype], ...]:
        return ((f"{int(op.param)}LL", np.dtype(np.int64)),)  # CuPy's routine reads decimals


#: The NumPy twin of each operation of an optimizer update rule (`gpuscalar.lazy.rules`, ops of
#: kind ``"rule"``): the ufunc applied node by node on the host, as the kernel's C operator or
#: helper of the same name applies it on the device (`gpuscalar.lazy.codegen.c_source`).
RULE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
    ">": np.greater, ">=": np.greater_equal,
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
    "sqrt": np.sqrt, "pow": np.power, "select": np.where,
    "minimum": np.minimum, "maximum": np.maximum, "sign": np.sign,
}


class RuleKind(OpKind):
    """An operation of an optimizer update rule (`gpuscalar.lazy.rules`): no loop dtypes; on
    the host its `RULE_FUNCTIONS` twin on the dtype its operands already have, on the device
    infix C on the kernel's type (`gpuscalar.lazy.codegen.c_source`), never a CuPy routine."""

    name = "rule"

    def on_host(self, op: Op, args: list[Any]) -> Any:
        return RULE_FUNCTIONS[op.name](*args)

    def replay(self, backend: Any, op: Op, args: list[Any]) -> Any:
        raise TypeError(f"{op!r} is an update rule's op: it runs in its optimizer's kernel "
                        "(or on the host), never replayed eagerly")

    def cupy_ufunc(self, cupy: Any, op: Op) -> Any:
        return None

    def routine_operands(self, op: Op) -> tuple[tuple[str, np.dtype], ...]:
        return ()


#: THE table of op kinds: `Op.kind` -> its row. A new kind is one `OpKind` subclass here.
OP_KINDS: dict[str, OpKind] = {row.name: row for row in (
    UfuncKind(), WhereKind(), RoundKind(), RuleKind())}


# ---- the host evaluator ---------------------------------------------------------------------


def fold_plan(plan: Plan, sources: list[Any],
              apply: Callable[[Op, list[Any]], Any] | None = None) -> Any:
    """THE walk of an expression: ``plan``'s steps in order, ``apply(op, operands)`` on each
    (its operands being ``sources``, the leaves' values in plan order, and earlier steps'
    results); returns the last result. The host evaluator applies NumPy here (``apply`` None:
    each op's `OpKind.on_host`, called from the walk itself; `evaluate`), its compiled form
    (`host_program`) writes Python, the eager replay (`gpuscalar.lazy.fusion`) calls the
    backend and the code generator (`gpuscalar.lazy.codegen`) writes C, so all read a tree in
    the same order."""
    results: list[Any] = []
    for op, refs in plan.steps:
        operands = [sources[r] if r >= 0 else results[~r] for r in refs]
        results.append(op.row.on_host(op, operands) if apply is None else apply(op, operands))
    return results[-1]


def evaluate(root: Any, value_of: Callable[[Any], Any]) -> Any:
    """THE host evaluator: ``root`` (a node, or a lone leaf) with NumPy, node by node in the
    tree's order; ``value_of`` gives each leaf's value (a pending scalar's leaf: its host data;
    an update rule's symbol: the array or scalar it names). Warnings are the caller's choice
    (``np.errstate``), as a kernel gives IEEE results without any."""
    if type(root) is not Node:
        return value_of(root)
    return fold_plan(plan_of(root), [value_of(leaf) for leaf in leaves_of(root)])


def evaluate_on_host(root: Node, host_data: Callable[[Any], Any]) -> np.ndarray:
    """The value of ``root`` as a NumPy 0-d array, computed with NumPy on the leaves' host data
    (``host_data``: the backend's accessor). IEEE results, no warnings: a kernel cannot warn."""
    return evaluate_plan(plan_of(root), leaves_of(root), host_data)


def evaluate_plan(plan: Plan, leaves: list[Any] | tuple[Any, ...],
                  host_data: Callable[[Any], Any]) -> np.ndarray:
    """`evaluate_on_host` for a plan and the leaves of an expression of its structure."""
    sources = [v if isinstance(v, np.generic) else host_data(v) for v in leaves]
    return np.asarray(host_program(plan)[0](sources))


# ---- the host evaluator, compiled per structure (`gpuscalar.lazy.hostprogram`) -----------------

#: structure key -> its compiled host evaluator (`host_program`); bounded by `cache_size`
#: (emptied when full, and at each sweep of the key table, as the leaf readers).
_HOST_PROGRAMS: dict[int, tuple[Callable[[list[Any]], Any], bool]] = caches.derived({})


def host_program(plan: Plan) -> tuple[Callable[[list[Any]], Any], bool]:
    """``(run, gives_python)``: ``run(sources)`` is `fold_plan`'s host evaluation of ``plan``
    under ``np.errstate(all="ignore")``, bit for bit, ``sources`` being the leaves' host
    values (Python numbers, NumPy scalars or 0-d arrays of the leaves' dtypes) and the
    constants; its value is a NumPy value of the root's dtype, or, where ``gives_python``, the
    Python float or bool of that value. Compiled once per structure, by
    `gpuscalar.lazy.hostprogram` over `fold_plan`: the float path's numbers, cheaply."""
    program = _HOST_PROGRAMS.get(plan.key)
    if program is None:
        program = hostprogram.compile_host_program(plan, fold_plan)
        caches.keep(_HOST_PROGRAMS, plan.key, program)
    return program


def host_program_of(root: Node) -> tuple[Callable[[list[Any]], Any], bool]:
    """`host_program` of ``root``'s structure (one dict lookup once compiled)."""
    program = _HOST_PROGRAMS.get(root[KEY])
    return program if program is not None else host_program(plan_of(root))
