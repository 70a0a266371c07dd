"""`expr.OP_KINDS`, the one table of op kinds: every kind has every column, a kind without one
fails when its class is made, and a new kind is one row that the host evaluator, the eager
replay and the code generator all read."""

from __future__ import annotations

import types

import numpy as np
import pytest

from gpuscalar.devices import NUMPY
from gpuscalar.lazy import codegen, expr, fusion

F32, F64, I64, BOOL = (np.dtype(t) for t in (np.float32, np.float64, np.int64, np.bool_))


@pytest.mark.parametrize("name", sorted(expr.OP_KINDS))
def test_every_kind_has_every_column(name):
    row = expr.OP_KINDS[name]
    assert row.name == name and isinstance(row, expr.OpKind)
    for column in expr.OpKind.COLUMNS:
        assert getattr(type(row), column) is not getattr(expr.OpKind, column), (name, column)


def test_the_columns_are_the_methods_of_opkind():
    methods = {n for n, v in vars(expr.OpKind).items() if callable(v) and not n.startswith("_")}
    assert methods == set(expr.OpKind.COLUMNS)


def test_a_planted_kind_without_a_column_fails_when_it_is_made():
    lacks = r"op kind Planted \(planted\) lacks replay, cupy_ufunc: every kind has"
    with pytest.raises(TypeError, match=lacks):
        class Planted(expr.OpKind):
            name = "planted"

            def on_host(self, op, args):
                return args[0]

            def routine_operands(self, op):
                return ()


def test_a_planted_kind_without_a_name_fails_when_it_is_made():
    with pytest.raises(TypeError, match=r"op kind Nameless \(no name\) lacks name"):
        class Nameless(expr.UfuncKind):
            name = ""


def test_an_op_of_a_kind_not_in_the_table_is_refused():
    with pytest.raises(ValueError, match=r"unknown op kind 'planted'.*OP_KINDS"):
        expr.get_op("planted", "negative", (F64,), (F64,))


class _Negate(expr.OpKind):
    """A planted kind: ``-x``, spelled with CuPy's ``negative``."""

    name = "negate"

    def on_host(self, op, args):
        return np.negative(args[0])

    def replay(self, backend, op, args):
        return backend.call(backend.ufunc("negative"), args[0])

    def cupy_ufunc(self, cupy, op):
        return cupy.negative

    def routine_operands(self, op):
        return ()


def test_a_new_kind_is_one_row(monkeypatch):
    """A kind added to the table runs on the host and replayed eagerly, with no other change."""
    monkeypatch.setitem(expr.OP_KINDS, "negate", _Negate())
    op = expr.get_op("negate", "negate", (F64,), (F64,))
    node = expr.make_node(op, (np.asarray(2.5),))
    assert expr.evaluate_on_host(node, lambda a: a) == -2.5
    assert fusion.Executor(NUMPY).materialize(node, None) == -2.5
    negative = types.SimpleNamespace(_ops=())
    assert expr.OP_KINDS["negate"].cupy_ufunc(types.SimpleNamespace(negative=negative), op) \
        is negative


def _ops() -> list[expr.Op]:
    return [expr.get_op("ufunc", "divmod", (F64, F64), (F64, F64), 1),
            expr.get_op("ufunc", "add", (F32, F32), (F32,)),
            expr.get_op("where", "where", (BOOL, F64, F64), (F64,)),
            expr.get_op("round", "round", (F64,), (F64,), 0, 2),
            expr.get_op("round", "round", (I64,), (I64,), 0, -1)]


@pytest.mark.parametrize("op", _ops(), ids=repr)
def test_host_and_replay_columns_give_the_same_bits(op):
    values = {BOOL: np.asarray(True), F64: np.asarray(7.25), F32: np.float32(1.1),
              I64: np.asarray(1234)}
    node = expr.make_node(op, tuple(values[d] for d in op.in_dtypes))
    on_host = expr.evaluate_on_host(node, lambda a: a)
    replayed = fusion.Executor(NUMPY).materialize(node, None)
    assert replayed.dtype == on_host.dtype == op.dtype
    assert replayed.tobytes() == on_host.tobytes()


def test_round_alone_gives_its_routine_an_operand_of_its_own():
    """round's decimals are the one extra operand of a CuPy routine (an int64 literal)."""
    extras = {name: row.routine_operands(_ops()[3]) for name, row in expr.OP_KINDS.items()}
    assert extras == {"ufunc": (), "where": (), "round": (("2LL", I64),), "rule": ()}


def test_a_rule_op_is_never_replayed_nor_a_cupy_routine():
    op = expr.get_op("rule", "+", (), ())
    with pytest.raises(TypeError, match="never replayed"):
        expr.OP_KINDS["rule"].replay(NUMPY, op, [1.0, 2.0])
    assert expr.OP_KINDS["rule"].on_host(op, [np.float64(1.0), np.float64(2.0)]) == 3.0
    pytest.importorskip("cupy")  # (the code generator reads CuPy's tables; no GPU needed)
    with pytest.raises(codegen.FusionUnsupported, match="no ufunc"):
        codegen.cupy_op(op)
