"""The generated optimizer kernel texts are a contract: every variant's source, byte for byte.

Why this file exists: the kernels are generated from the Programs and from how each scalar is
received (its kind: `gpuscalar.optim.program`); a refactoring of either must not change one
byte of what NVRTC compiles (CuPy's on-disk cache, the NVRTC tests and the figures measured on
a GPU all assume the same texts). This test generates every variant the library can ask for
(each Program x dtype x layout x scalar kinds x skip kind, the step-counter kernel, the
address-table kernel, and the kernels the optimizer classes launch, their kinds routed by
`gpuscalar.optim.executors.route` itself) and compares a digest per Program with the digests
recorded before the scalar kinds became classes (issue 22). A deliberate change of the texts
records new digests here, in the same commit, and says why.
"""

from __future__ import annotations

import hashlib
import itertools

import numpy as np

import gpuscalar as gs
from gpuscalar.optim import executors
from gpuscalar.optim.kernels import (
    KERNEL_DTYPES,
    POINTER_CTYPES,
    address_table_source,
    counter_source,
    kernel_source,
)
from gpuscalar.optim.program import COUNTER_READS, PROGRAMS, Program

from . import test_kernels

#: sha256 (first 16 hex digits) of every variant's (name, source), by Program, and how many
#: variants; recorded on the commit before the scalar kinds became classes.
DIGESTS: dict[str, tuple[str, int]] = {
    'adam': ('a128fd2ec822501d', 192),
    'adamw': ('e30838a7206d7c90', 192),
    'lion': ('7919f45b61f15e1f', 192),
    'rmsprop': ('2439d45ccc53ab97', 192),
    'rmsprop_momentum': ('02cdf8a48b3ccdd0', 192),
    'rmsprop_centered': ('3c5744405d833df7', 192),
    'rmsprop_centered_momentum': ('afcbcf008c6ed608', 192),
    'sgd': ('ef651e81503e0c79', 192),
    'sgd_momentum': ('bea0fbbf7742114a', 192),
    'sgd_nesterov': ('08c0dc88779601e4', 192),
    'count': ('3287614aafa47bef', 4),
    'address': ('a75b87cdb318a782', 1),
    'class:adam': ('08b1489568d45d76', 12),
    'class:adamw': ('5e618ed08961118e', 12),
    'class:sgd': ('4668d1bde4e8ab58', 12),
    'class:sgd_momentum': ('3450213cdb8f3988', 12),
    'class:sgd_nesterov': ('d3422dfa4e937ce7', 12),
    'class:rmsprop': ('ca9c09263527d8ba', 12),
    'class:rmsprop_momentum': ('854e65d2e9c5ebc0', 12),
    'class:rmsprop_centered': ('6c520bff9ca2dee8', 12),
    'class:rmsprop_centered_momentum': ('520d05dbe4111540', 12),
    'class:lion': ('bb37d18051c5ae57', 12),
}

#: the optimizer classes' configurations: tests/test_kernels.py's, which compiles them
CLASS_CONFIGS = test_kernels.CLASS_CONFIGS


def _pending_kinds() -> list[object]:
    """Kinds of pending scalars of a few structures, as `route` gives them."""
    count = gs.asscalar(np.zeros((), np.int64))
    half = gs.asscalar(np.float32(0.5))
    values = [
        0.01 * gs.minimum(1.0, (count + 1) / 100) * gs.cos(count),
        half * 2.0 + gs.sqrt(half),
    ]
    kinds = [executors.route(value)[0] for value in values]
    assert all(kind[0] == "pending" for kind in kinds), kinds
    return kinds


def _pending_skip() -> object:
    count = gs.asscalar(np.zeros((), np.int64))
    kind = executors.route(~gs.isfinite(gs.asscalar(1.0) / count))[0]
    assert kind[0] == "pending", kind
    return kind


def _kind_rows(program: Program, pending: list[object]) -> list[list[object]]:
    """Scalar kinds to generate ``program`` with: all by value, by pointer (each dtype at each
    position), the step counter's reads, and pending expressions."""
    n = len(program.scalars)
    pointers = list(POINTER_CTYPES)
    rows: list[list[object]] = [[None] * n]
    for offset in range(len(pointers)):
        rows.append([pointers[(offset + i) % len(pointers)] for i in range(n)])
    counters = [("counter", name) if name in COUNTER_READS else None for name in program.scalars]
    rows.append(counters)
    rows.append([kind or "float64" for kind in counters])
    rows.append([pending[i % len(pending)] for i in range(n)])
    rows.append([pending[(i + 1) % len(pending)] if i % 2 else None for i in range(n)])
    return rows


def _class_sources(config: str) -> list[tuple[str, str]]:
    """The multi-tensor kernels an optimizer class launches, its kinds routed by `route`."""
    return [test_kernels.class_kernel(config, dtype, hyper, has_skip)
            for dtype, hyper, has_skip in itertools.product(
                KERNEL_DTYPES, ("numbers", "gpuscalars", "pending"), (False, True))]


def _digest(sources: list[tuple[str, str]]) -> tuple[str, int]:
    h = hashlib.sha256()
    for source, name in sources:
        h.update(name.encode() + b"\0" + source.encode() + b"\0")
    return h.hexdigest()[:16], len(sources)


def generated_digests() -> dict[str, tuple[str, int]]:
    """The digest of every variant's text, by Program name (and ``count``, ``address``,
    ``class:<config>``)."""
    pending, pending_skip = _pending_kinds(), _pending_skip()
    digests = {}
    for program in PROGRAMS:
        sources = [
            kernel_source(program, dtype, kinds, skip, multi_tensor=multi_tensor)
            for dtype, multi_tensor, kinds, skip in itertools.product(
                KERNEL_DTYPES, (False, True), _kind_rows(program, pending),
                (None, True, "int32", pending_skip))
        ]
        digests[program.name] = _digest(sources)
    digests["count"] = _digest([counter_source(skip)
                                for skip in (None, True, "int32", pending_skip)])
    digests["address"] = _digest([address_table_source()])
    for config in CLASS_CONFIGS:
        digests[f"class:{config}"] = _digest(_class_sources(config))
    return digests


def test_every_kernel_text_is_the_one_recorded():
    assert generated_digests() == DIGESTS


if __name__ == "__main__":  # print the digests to record (a deliberate change of the texts)
    for key, value in generated_digests().items():
        print(f"    {key!r}: {value!r},")
