"""How a fused optimizer kernel receives each scalar: the scalar kinds as small classes.

Why this file exists: `gpuscalar.optim.executors.route` is the one place that decides a scalar's
kind (`ValueScalar`, `PointerScalar`, `CounterScalar`, `PendingScalar`), and each consumer asks
the kind instead of switching on a tag: the source generator its declaration, the CUDA executor
its launch arguments, the host executor its value. These tests hold the kinds to that contract:
what `route` gives each value, that a kind is frozen, hashable and keys the kernel cache as the
plain tuples did, and that each kind answers each question as the tag switches did.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar.devices import NUMPY
from gpuscalar.optim import executors
from gpuscalar.optim.program import (
    COUNTER_KINDS,
    PENDING_KINDS,
    POINTER_CTYPES,
    POINTER_KINDS,
    VALUE,
    CounterRead,
    CounterScalar,
    PendingScalar,
    PointerScalar,
    ScalarKind,
    ValueScalar,
)


def _pending() -> gs.GPUScalar:
    value = gs.asscalar(np.float32(0.5)) * 2.0 + 1.0
    assert not value.is_materialized
    return value


def test_route_decides_each_kind():
    assert executors.route(0.25) == (VALUE, (0.25,)) and executors.route(0.25)[0] is VALUE
    for name in POINTER_CTYPES:
        scalar = gs.asscalar(np.zeros((), name))
        kind, leaves = executors.route(scalar)
        assert kind is POINTER_KINDS[np.dtype(name)] and kind.dtype == name
        assert type(kind) is PointerScalar and len(leaves) == 1
    count = np.zeros((), np.int64)
    kind, leaves = executors.route(CounterRead(count, "step"))
    assert kind is COUNTER_KINDS["step"] and type(kind) is CounterScalar and kind.read == "step"
    assert leaves[0] is count
    kind, leaves = executors.route(_pending())
    assert type(kind) is PendingScalar and len(leaves) >= 1
    # each shape's kind is made once (route asks on every step): the same object next time
    assert executors.route(_pending())[0] is kind is PENDING_KINDS[kind.key]


def test_a_kind_is_frozen_hashable_and_keys_as_its_plain_tuple():
    """A kind is the tuple ``(tag, *fields)``: the kernel-cache keys (and their hashes) are the
    ones the plain tuple kinds made, and equal kinds are interchangeable keys."""
    kinds = [VALUE, PointerScalar("float32"), CounterScalar("fresh"), PendingScalar(7)]
    plain = [("value",), ("pointer", "float32"), ("counter", "fresh"), ("pending", 7)]
    for kind, parts in zip(kinds, plain, strict=True):
        assert kind == parts and hash(kind) == hash(parts)
        assert ScalarKind.of(parts) == kind and type(ScalarKind.of(parts)) is type(kind)
        assert copy.copy(kind) == kind and type(copy.deepcopy(kind)) is type(kind)
        assert pickle.loads(pickle.dumps(kind)) == kind
        with pytest.raises(AttributeError):
            kind.tag_ = "x"  # type: ignore[attr-defined]
    assert PointerScalar("float32") == POINTER_KINDS[np.dtype("float32")]
    assert ValueScalar() == VALUE and len({*kinds, *plain}) == len(kinds)
    assert repr(PointerScalar("bool")) == "PointerScalar('bool')" and repr(VALUE) == "ValueScalar()"
    with pytest.raises(ValueError, match="unknown scalar kind"):
        ScalarKind.of(("mystery",))


def test_each_kind_declares_itself():
    code = VALUE.declaration("lr")
    assert code.params == ("const T lr_val",) and code.statements == ("const T lr = (T)(lr_val);",)
    code = PointerScalar("int64").declaration("skip", "bool")
    assert code.params == ("const long long* __restrict__ skip_ptr",)
    assert code.statements == ("const bool skip = (bool)(*skip_ptr);",)
    code = CounterScalar("step").declaration("step")
    assert code.statements == ("const T step = (T)((*step_ptr) + 1);",) and not code.preambles
    pending = executors.route(_pending())[0]
    code = pending.declaration("lr")
    assert code.statements[-1].startswith("const T lr = (T)(lr_v") and code.preambles
    assert all(param.split()[-1].startswith("lr_") for param in code.params)


def test_each_kind_gives_its_launch_arguments_and_host_value():
    assert VALUE.arguments((0.5,), np.float32) == (np.float32(0.5),)
    assert type(VALUE.arguments((0.5,), np.float32)[0]) is np.float32
    array = np.asarray(np.float64(0.25))
    assert PointerScalar("float64").arguments((array,), np.float32) == (array,)
    assert VALUE.host_value(NUMPY, (0.5,)) == 0.5
    assert PointerScalar("float64").host_value(NUMPY, (array,)) == 0.25
    count = np.asarray(np.int64(4))
    assert CounterScalar("step").host_value(NUMPY, (count,)) == 5
    assert not CounterScalar("fresh").host_value(NUMPY, (count,))
    value = _pending()
    kind, leaves = executors.route(value)
    assert kind.arguments(leaves, np.float32) == leaves
    assert kind.host_value(NUMPY, leaves) == float(value) == np.float32(2.0)
