"""The executor slots of the scalar evaluators and the optimizer steps (issue 22, phase 2).

A feature asks a device for its executor by slot (`Backend.executor`): ``"scalars"`` for
pending scalar expressions (`gpuscalar.lazy.fusion`), ``"steps"`` for optimizer steps
(`gpuscalar.optim.executors`). Each device names its own in its wing; NumPy and the strict
device share the host's; a device without a slot gets the eager evaluator, or a LookupError
for steps; and what a feature used to decide by asking which executor it had is a question the
executor answers.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuscalar.backend import Backend
from gpuscalar.devices import CUPY, NUMPY, get_backend
from gpuscalar.lazy import fusion
from gpuscalar.optim import executors


def test_each_device_names_its_scalars_and_steps_executors_in_its_wing():
    strict = get_backend("strict")
    for backend in (NUMPY, strict, CUPY):
        wing = {"numpy": "host", "strict": "host", "cupy": "cupy"}[backend.name]
        for slot in ("scalars", "steps"):
            module, _, _ = backend.executors[slot].partition(":")
            assert module.startswith(f"gpuscalar.devices.{wing}."), (backend.name, slot)
        assert isinstance(fusion.executor_for(backend), fusion.Executor)
        assert isinstance(executors.executor_for(backend), executors.Executor)
    # the host evaluators have one home: the strict device names NumPy's
    assert type(fusion.executor_for(NUMPY)) is type(fusion.executor_for(strict))
    assert type(executors.executor_for(NUMPY)) is type(executors.executor_for(strict))
    assert executors.executor_for(NUMPY) is not executors.executor_for(strict)


def test_a_device_without_a_scalars_slot_evaluates_eagerly():
    class Bare(Backend):
        name = "bare"

    bare = Bare()
    executor = fusion.executor_for(bare)
    assert type(executor) is fusion.Executor and executor.backend is bare
    assert fusion.executor_for(bare) is executor
    assert executor.direct_fold({}, ()) is None and executor.pins_loop("add", np.dtype("f4"))
    with pytest.raises(NotImplementedError, match="no packed read on the bare backend"):
        fusion.pack_values(bare, None, [])
    with pytest.raises(LookupError, match="the bare device has no 'steps' executor"):
        executors.executor_for(bare)


def test_only_cupys_executor_has_a_direct_fold():
    """`gpuscalar.arrays` asks the executor whether a fold of one pending scalar goes straight
    to a fused launch (CuPy's, for the keywords its kernel implements and no Python int), rather
    than asking which executor it has."""
    keywords = {"casting": "unsafe", "out": None}
    for backend in (NUMPY, get_backend("strict")):
        assert fusion.executor_for(backend).direct_fold(keywords, (1.0,)) is None
    cupy = fusion.executor_for(CUPY)
    from gpuscalar.devices.cupy import fusion as cupy_fusion

    assert cupy.direct_fold(keywords, (1.0,)) is cupy_fusion.fold_on_cupy
    assert cupy.direct_fold(keywords, (1,)) is None  # CuPy: int64 or uint64, by value
    assert cupy.direct_fold({**keywords, "where": True}, (1.0,)) is None
    assert cupy.defers_to_reflected and not cupy.fuses_plain_ufuncs
    assert fusion.executor_for(NUMPY).fuses_plain_ufuncs


def test_a_seam_cache_registered_under_a_test_seam_is_emptied_with_it():
    """A wing module imported on first use (an executor slot's) may register its seam cache
    while a test seam stands: what that seam made must not outlive it."""
    from gpuscalar.devices.cupy.backend import CudaSeam

    cache: dict = {}
    try:
        with CUPY.seam_replaced(CudaSeam()):
            CUPY.seam_cache(cache)["kernel"] = "made through the test seam"
        assert cache == {}
    finally:
        CUPY._seam_caches.remove(cache)

