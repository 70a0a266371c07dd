"""`gs.capture` on the host devices (NumPy, the strict device): a step re-run at each replay.

Why this module exists: it is the "graphs" executor (`gpuscalar.capture.Graphs`) of the devices
that evaluate on the host, one home that both wings' entries name. No graph exists there:
recording executes nothing, so a step is warmed up under `gs.capture`'s guard, and each replay
runs ``fn`` ``steps`` times under the same guard as ONE counted device op (a replay is one launch
on a GPU too). The outputs are the same buffers at every replay, as a graph's are
(`_StaticOutputs`): the first replay's outputs become the step's buffers, and each later
replay's are copied into them (copies inside the replay's one device op).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ... import sync
from ...backend import Backend
from ...capture import CapturedStep, _fresh, _materialized, _rebuilt
from ...scalar import GPUScalar, _array_of, _wrap
from .. import backend_of

__all__ = ["HostGraphs"]


class HostGraphs:
    """The host devices' "graphs" executor (`gpuscalar.capture.Graphs`): steps re-run."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.form = f"{backend.name}, re-run"

    def default_device(self) -> object:
        return None

    def library_syncs(self) -> contextlib.AbstractContextManager[Any]:
        """The strict device declares its reads without CuPy (NumPy has none to declare)."""
        return sync._activate(sync.SyncCounter(include_cupy=True))

    def record(self, step: CapturedStep) -> _Rerun:
        step.warm_up()
        return _Rerun(self.backend)


class _Rerun:
    """A step on the host (`gpuscalar.capture.Recording`): nothing recorded, each replay a
    re-run whose outputs are kept in the same buffers (`_StaticOutputs`)."""

    __slots__ = ("backend", "outputs")

    def __init__(self, backend: Backend) -> None:
        self.backend, self.outputs = backend, _StaticOutputs()

    def replay(self, step: CapturedStep) -> Any:
        return step.run_inline(contextlib.nullcontext(), self._keep)

    def _keep(self, result: Any) -> Any:
        return self.outputs.keep(self.backend, result)  # the same buffers at every replay

    def release(self) -> None:
        self.outputs = _StaticOutputs()


class _StaticOutputs:
    """A step's outputs on NumPy and the strict device, as a GPU gives them: the same buffers at
    every replay. The first replay's outputs (a GPUScalar's value in its 0-d array) become the
    buffers; each later replay's are copied into them (device ops of the replay: not counted
    again). A NumPy scalar (NumPy's 0-d results) is returned as computed; any other value (a
    Python number, None) is the first replay's, as a recording freezes it. A later replay
    returning outputs of another form is an error (a graph's outputs cannot change)."""

    __slots__ = ("outputs",)

    def __init__(self) -> None:
        self.outputs: Any = _NOTHING_YET

    def keep(self, backend: Backend, result: Any) -> Any:
        if self.outputs is _NOTHING_YET:
            self.outputs = _materialized(backend, result)
            return _fresh(backend, self.outputs)
        return _copy_into(self.outputs, result, "the output")


_NOTHING_YET: Any = object()


def _copy_into(kept: Any, new: Any, where: str) -> Any:
    """Copy a replay's outputs ``new`` into the buffers ``kept`` (`_StaticOutputs`); returns
    what the replay returns: the buffers (GPUScalars fresh over theirs)."""

    def mismatch(what: str) -> TypeError:
        return TypeError(f"gs.capture: {where} of this replay is {what}, unlike the first "
                         "replay's; a captured step returns the same buffers at every replay, "
                         "so its outputs keep their form (on a GPU they are the recorded ones)")

    if isinstance(kept, GPUScalar):
        if not isinstance(new, GPUScalar) or new.dtype != kept.dtype:
            raise mismatch(f"a {type(new).__name__}" + (
                f" of dtype {new.dtype}" if isinstance(new, GPUScalar) else ""))
        target, source = _array_of(kept), _array_of(new)
        result: Any = _wrap(kept.backend, target)
    elif backend_of(kept) is not None:
        if backend_of(new) is not backend_of(kept) or new.shape != kept.shape or (
                new.dtype != kept.dtype):
            raise mismatch(f"a {type(new).__name__}" + (
                f" of shape {new.shape} and dtype {new.dtype}" if hasattr(new, "shape") else ""))
        target = result = kept
        source = new
    elif isinstance(kept, (tuple, list)):
        if type(new) is not type(kept) or len(new) != len(kept):
            raise mismatch(f"a {type(new).__name__}" + (
                f" of {len(new)} item{'' if len(new) == 1 else 's'}"
                if isinstance(new, (tuple, list)) else ""))
        return _rebuilt(kept, [_copy_into(old, value, f"{where}[{index}]")
                               for index, (old, value) in enumerate(zip(kept, new, strict=True))])
    elif isinstance(kept, dict):
        if not isinstance(new, dict) or new.keys() != kept.keys():
            raise mismatch(f"a {type(new).__name__}" + (
                f" with keys {sorted(map(str, new))}" if isinstance(new, dict) else ""))
        return {key: _copy_into(old, new[key], f"{where}[{key!r}]") for key, old in kept.items()}
    elif isinstance(kept, np.generic) and isinstance(new, np.generic):
        return new  # a NumPy 0-d result: a value, as computed
    else:  # a Python value, frozen as a recording freezes it
        return kept
    if source is not target:
        backend = backend_of(target)
        assert backend is not None
        backend.call(backend.xp.copyto, target, source)
    return result
