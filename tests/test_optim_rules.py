"""Update rules as lazy nodes (`gpuscalar.lazy.rules`): the C printer, the host evaluator and
the Programs built from them.

Why this file exists: an optimizer's CUDA kernel prints its rules as infix C and the host
backends apply the same nodes with NumPy ufuncs. The two agree only if the printer keeps each
tree's grouping exactly (a dropped parenthesis is a different rounding on the device, and no
host test would see it), so the printer is checked against the tree it printed, over many
random trees; and a Program is checked to read only names it defines.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar.lazy import codegen, expr, rules
from gpuscalar.optim import executors
from gpuscalar.optim.adam import ADAM
from gpuscalar.optim.kernels import kernel_source
from gpuscalar.optim.lion import LION
from gpuscalar.optim.program import COUNTER_READS, PROGRAMS, Program

_INFIX = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Eq: "==", ast.NotEq: "!=",
          ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FUNCTIONS = {"sqrt": 1, "pow": 2, "select": 3, "minimum": 2, "maximum": 2, "sign": 1}


def _tree_of_rule(rule: rules.RuleTerm) -> object:
    """The rule's node tree as nested tuples (op name, children...), leaves as their text."""
    def walk(term: object) -> object:
        if expr.is_node(term):
            return (term.op.name, *map(walk, term.children))
        return str(term)
    return walk(rule.term)


def _tree_of_text(text: str) -> object:
    """The same nested tuples, from C text parsed as Python (the operators and calls a rule
    prints bind and associate alike in both; a comparison operand is always parenthesized, so
    Python never chains one)."""
    def walk(node: ast.AST) -> object:
        if isinstance(node, ast.BinOp):
            return (_INFIX[type(node.op)], walk(node.left), walk(node.right))
        if isinstance(node, ast.Compare):
            assert len(node.ops) == 1, text
            return (_INFIX[type(node.ops[0])], walk(node.left), walk(node.comparators[0]))
        if isinstance(node, ast.Call):
            return (node.func.id, *map(walk, node.args))
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.UnaryOp):  # a negative literal
            return str(-node.operand.value)
        return str(node.value)
    return walk(ast.parse(text, mode="eval").body)


def _random_rule(rng: random.Random, depth: int) -> rules.RuleTerm | int:
    if depth == 0 or rng.random() < 0.2:
        return rng.choice([*rules.symbols("a b c d"), 0, 1, 2, -3])
    if rng.random() < 0.3:
        name = rng.choice(list(_FUNCTIONS))
        args = [_random_rule(rng, depth - 1) for _ in range(_FUNCTIONS[name])]
        if not any(isinstance(arg, rules.RuleTerm) for arg in args):
            args[0] = rules.symbol("a")
        return getattr(rules, name)(*args)
    left, right = _random_rule(rng, depth - 1), _random_rule(rng, depth - 1)
    if not isinstance(left, rules.RuleTerm) and not isinstance(right, rules.RuleTerm):
        left = rules.symbol("b")
    op = rng.choice(list(_INFIX.values()))
    return {"+": lambda: left + right, "-": lambda: left - right, "*": lambda: left * right,
            "/": lambda: left / right, "==": lambda: left == right, "!=": lambda: left != right,
            "<": lambda: left < right, "<=": lambda: left <= right, ">": lambda: left > right,
            ">=": lambda: left >= right}[op]()


def test_the_c_printer_keeps_every_trees_grouping():
    """500 random trees: the printed text parses back to the very tree printed (so no needed
    parenthesis is dropped), and printing adds no parenthesis the grouping does not need."""
    rng = random.Random(16)
    for _ in range(500):
        rule = _random_rule(rng, 5)
        if not isinstance(rule, rules.RuleTerm):
            continue
        text = codegen.c_source(rule)
        assert _tree_of_text(text) == _tree_of_rule(rule), text
        assert ast.unparse(ast.parse(text, mode="eval")) == text.replace("(-3)", "-3"), text


def test_the_printer_groups_as_written():
    a, b, c = rules.symbols("a b c")
    assert str(a - (b - c)) == "a - (b - c)"
    assert str(a - b - c) == "a - b - c"
    assert str(a * (b / c)) == "a * (b / c)"
    assert str((a + b) * c * c) == "(a + b) * c * c"
    assert str((a == b) == 0) == "(a == b) == 0"
    assert str(rules.select(a < 1, b, -2 * c)) == "select(a < 1, b, (-2) * c)"
    assert codegen.c_source(a + b, {"a": "(*a_ptr)"}) == "(*a_ptr) + b"


def test_the_fma_barrier_is_a_parameter():
    """With a barrier every operation's value is wrapped (no contraction spans two), and the
    optimizer kernels print with none (their text as written)."""
    a, b, c = rules.symbols("a b c")
    assert codegen.c_source(a * b + c, barrier="_gs_opaque") == "_gs_opaque(_gs_opaque(a * b) + c)"
    assert codegen.c_source(rules.sqrt(a * b), barrier="_gs_opaque") == (
        "_gs_opaque(sqrt(_gs_opaque(a * b)))")
    source, _ = kernel_source(ADAM, "float32", [None] * 6)
    assert "_gs_opaque" not in source
    assert "const T m = beta1 * exp_avg + (1 - beta1) * g;" in source


def test_the_host_evaluator_applies_each_nodes_ufunc_in_tree_order():
    """Bit for bit the ufuncs in the tree's order, float32 kept (an int literal is weak)."""
    rng = np.random.default_rng(7)
    x, y, z = (rng.standard_normal(64).astype(np.float32) for _ in range(3))
    s = np.float32(0.3)
    a, b, c, k, nan = rules.symbols("a b c k nan")
    values = {"a": x, "b": y, "c": z, "k": s, "nan": np.float32(np.nan)}
    got = rules.evaluate(a - k * b / (rules.sqrt(c * c) + 1), values)
    want = np.subtract(x, np.divide(np.multiply(s, y), np.add(np.sqrt(np.multiply(z, z)), 1)))
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    regrouped = rules.evaluate(a - k * (b / (rules.sqrt(c * c) + 1)), values)
    assert regrouped.tobytes() != got.tobytes()  # the grouping is the tree's, not the text's
    picked = rules.evaluate(rules.select(a > 0, rules.sign(b), rules.maximum(c, nan)), values)
    np.testing.assert_array_equal(picked, np.where(x > 0, np.sign(y), np.nan))


def _outcome(compute: Callable[[], object]) -> object:
    """The bytes of what ``compute`` gives, or the type of the error it raises."""
    try:
        with np.errstate(all="ignore"):
            return np.asarray(compute()).tobytes()
    except (TypeError, ValueError) as error:  # no ufunc loop; an int to a negative int power
        return type(error)


@pytest.mark.needs_cupy  # codegen.plan_code reads CuPy's ufunc tables
def test_one_walk_writes_and_evaluates_every_tree():
    """The C writer is one walk with the spelling a parameter, and it is the host evaluator's
    walk: a spelling that writes each op as a call of its NumPy twin, run by Python, gives the
    host evaluator's bits on 200 random rules (so the two read every tree alike); and a pending
    GPUScalar's plan goes through the same walk (`plan_code` reaches `write_c`)."""
    rng = random.Random(161)
    values = {name: np.random.default_rng(i).standard_normal(16).astype(np.float32)
              for i, name in enumerate("abcd")}
    spelled = {name: f"RULE_FUNCTIONS[{name!r}]" for name in expr.RULE_FUNCTIONS}
    checked = 0
    for _ in range(200):
        rule = _random_rule(rng, 4)
        if not isinstance(rule, rules.RuleTerm) or not expr.is_node(rule.term):
            continue
        sources = [(repr(leaf) if isinstance(leaf, int) else leaf, None)
                   for leaf in expr.leaves_of(rule.term)]
        text, _ = codegen.write_c(
            expr.plan_of(rule.term), sources,
            lambda op, args, barrier: (codegen.with_barrier(
                f"{spelled[op.name]}({', '.join(arg for arg, _ in args)})", barrier), None),
            "identity")
        written = _outcome(lambda: eval(text, {  # noqa: S307, B023
            "RULE_FUNCTIONS": expr.RULE_FUNCTIONS, "identity": lambda v: v, **values}))
        evaluated = _outcome(lambda: rules.evaluate(rule, values))  # noqa: B023
        assert written == evaluated, text
        checked += isinstance(evaluated, bytes)
    assert checked > 100  # most random rules have a value (a few meet no ufunc loop: sign(bool))
    walked: list[expr.Plan] = []
    original = codegen.write_c

    def spy(plan: expr.Plan, *args: object) -> object:
        walked.append(plan)
        return original(plan, *args)

    node = (gs.asscalar(np.float32(2.0)) * 3 + 1)._node
    try:
        codegen.write_c = spy  # type: ignore[assignment]
        codegen.plan_code(expr.plan_of(node), "_t_")
        codegen.c_source(rules.symbol("a") + 1)
    finally:
        codegen.write_c = original  # type: ignore[assignment]
    assert [plan.key for plan in walked] == [node.key, (rules.symbol("a") + 1).term.key]


def test_rules_are_lazy_nodes():
    """A Program's rules are `gpuscalar.lazy.expr` nodes made by `make_node`, the node type of
    pending GPUScalars: one expression IR for both."""
    terms = [rule.term for program in PROGRAMS for _, rule in program.prelude + program.body]
    nodes = [term for term in terms if expr.is_node(term)]
    assert len(nodes) >= len(terms) - 2  # all but AdamW's g = grad and its like
    assert all(type(node) is expr.Node and node.op.kind == "rule" for node in nodes)
    a, b = rules.symbols("a b")
    assert (a * b + 1).term.key == (a * b + 1).term.key  # a structure key, as every node's...
    assert (a * b + 1).term.key != (a * (b + 1)).term.key  # ...grouping included
    assert (a * b + 1).term.size == 2


def test_only_kernels_that_call_a_helper_carry_it():
    lion_source, _ = kernel_source(LION, "float32", [None] * 4)
    adam_source, _ = kernel_source(ADAM, "float32", [None] * 6)
    assert codegen.CUDA_HELPERS["sign"] in lion_source
    assert codegen.CUDA_HELPERS["sign"] not in adam_source
    assert LION.helpers == codegen.CUDA_HELPERS["sign"] and ADAM.helpers == ""


def test_a_new_program_with_maximum_runs_on_the_host_and_carries_its_helper():
    """maximum (not in the shared .cu header) works end to end: NumPy's NaN-propagating
    maximum on the host, and its CUDA twin in the kernel that calls it."""
    param, grad, lr = rules.symbols("param grad lr")
    program = Program("clamped", ("lr",), ("param", "grad"), (),
                            (("p", rules.maximum(param - lr * grad, 0)),), (("param", "p"),))
    p = np.array([1.0, 0.1, np.nan])
    executors.run_program(gs.get_backend("numpy"), program, {"lr": 0.5},
                       {"param": p, "grad": np.array([1.0, 1.0, 1.0])}, None)
    np.testing.assert_array_equal(p, [0.5, 0.0, np.nan])
    source, _ = kernel_source(program, "float64", [None])
    assert codegen.CUDA_HELPERS["maximum"] in source
    assert "const T p = maximum(param - lr * grad, 0);" in source


def test_counter_reads_are_rules_on_both_sides():
    counter = np.asarray(np.int64(4))
    assert rules.evaluate(COUNTER_READS["step"], {"counter": counter}) == 5
    assert not rules.evaluate(COUNTER_READS["fresh"], {"counter": counter})
    assert codegen.c_source(COUNTER_READS["step"], {"counter": "(*p)"}) == "(*p) + 1"


def test_bad_rules_and_programs_are_refused_with_clear_errors():
    a, b = rules.symbols("a b")
    with pytest.raises(TypeError, match="int literals, got float 0.5"):
        a * 0.5
    with pytest.raises(TypeError, match="int literals, got str"):
        a + "b"
    with pytest.raises(TypeError, match="no truth value"):
        bool(a < b)
    with pytest.raises(ValueError, match="must be an identifier"):
        rules.symbol("a b")
    with pytest.raises(ValueError, match=r"'p' reads b, c, not defined before it"):
        Program("bad", ("a",), ("x",), (), (("p", a + rules.symbol("c") * b),),
                      (("x", "p"),))
    with pytest.raises(ValueError, match=r"'q' reads x, not defined before it"):
        Program("bad", ("a",), ("x",), (("q", rules.symbol("x")),), (("p", a),),
                      (("x", "p"),))
    with pytest.raises(TypeError, match="must be a gpuscalar.lazy.rules.RuleTerm, got str"):
        Program("bad", ("a",), ("x",), (), (("p", "a + 1"),), (("x", "p"),))
    with pytest.raises(ValueError, match=r"output \('y', 'p'\) must store"):
        Program("bad", ("a",), ("x",), (), (("p", a),), (("y", "p"),))
