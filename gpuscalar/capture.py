"""`gs.capture`: record a sync-free step once as a CUDA graph, replay it with one launch.

Why this module exists: removing syncs alone does not make a launch-bound loop fast on a GPU;
each CuPy launch costs ~10 us of CPU. A step that never syncs can be recorded as a CUDA graph and
replayed with a single launch (an H100 ran a small training loop 13.3x faster than its float
path this way). The float path can never be captured: a sync inside a capture invalidates it.
gpuscalar makes steps sync-free, so it is the library that can make them capturable.

``gs.capture(fn, *args, warmup=2, steps=1)`` runs ``fn(*args)`` ``warmup`` times (kernels
compile, caches settle), then records ``steps`` consecutive calls into one graph on a private
stream with a private memory pool; calling the returned `CapturedStep` replays the graph and
returns what ``fn`` returned: the same device buffers every time (a GPUScalar result as a fresh
GPUScalar over its buffer, so no stale host value is ever cached). The arrays ``fn`` reads and
writes are the graph's static buffers: update inputs in place (``x[...] = batch``).

Where the step runs: on the backend and device of its array and GPUScalar arguments (all on one);
for a step without array arguments, on those of the arrays its function closes over (a NumPy
array beside device arrays does not count); failing that, on CuPy's current device when a GPU is
present, else on NumPy.

Warm-up and recording run under ``sync_guard("error")``, with the array library's own syncs
guarded too (CuPy's syncdetect hook; the strict device's declared reads), so a sync raises
`SyncError` naming its reason and line before CUDA sees it. Any error ends the capture cleanly
(stream out of capture mode, partial graph discarded, stream and allocator restored) and the
user's error is raised, never a cleanup error. Nested captures are refused, but a step may call
another captured step: while a graph is being recorded (the current stream captures) the inner
step's ``fn`` runs ``steps`` times inline, so its kernels are recorded into the outer graph
(launching a graph into a capturing stream is not reliable), as on the CPU.

On NumPy and the strict device no graph exists: recording executes nothing, and each call runs
``fn`` ``steps`` times under the same guard, as ONE counted device op (a replay is one launch on
a GPU too). The outputs are the same buffers at every replay there too
(`gpuscalar.devices.host.graphs`): the first replay's outputs become the step's buffers, and
each later replay's are copied into them (copies inside the replay's one device op). So code and
tests run everywhere with the GPU's semantics for sync-free code.

A Python number inside a captured step is baked in when it is recorded: values that change per
step (the learning rate, the step count) must be device scalars updated inside the step.

No host-to-device copy inside a step: CuPy refuses one while its stream captures (a graph would
replay a copy from host memory long gone), and the strict device refuses it in the step's body
(`sync.graph_body`) with CuPy's words, so CPU tests see it; both errors say what to do instead,
as does CuPy's refusal of its own cuBLAS calls (``x @ w``; use ``gs.matmul``). A 0-d array made
from a Python number is a fill kernel, not a copy, and is allowed.

This module is the device-neutral front: the argument checks, where a step runs, the guard,
`CapturedStep`'s public API and the `_capturing` flag other modules read. What a device does
with a step is its "graphs" executor (`Backend.executor`, protocol `Graphs` below): on CuPy,
`gpuscalar.devices.cupy.graphs` records a CUDA graph on a private stream with a private memory
pool; on NumPy and the strict device, `gpuscalar.devices.host.graphs` re-runs the steps.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, Protocol

import numpy as np

from . import known, ledger, sync
from .backend import Backend
from .devices import backend_of, default_backend
from .scalar import GPUScalar, _array_of, _wrap

__all__ = ["capture", "CapturedStep", "Graphs", "Recording"]

#: True while a step is being warmed up or recorded in this context (captures cannot nest)
_capturing: ContextVar[bool] = ContextVar("gpuscalar_capturing", default=False)

_NUMBERS = (bool, int, float, complex, np.generic)
#: what CuPy's refusals inside a capture say (CuPy 14: cupy_backends.cuda.libs.cublas.setStream,
#: a NotImplementedError; cupy/cuda/memory.pyx copy_from_host_async, a RuntimeError); the
#: strict device says the same inside a step's body
_CUBLAS_REFUSAL = "cuBLAS"
_UPLOAD_REFUSAL = "H2D transfers are disallowed"


# ---- what a device does with a step: its "graphs" executor -----------------------------------


class Recording(Protocol):
    """One step as a device holds it (a recorded graph, or nothing to re-run), made by
    `Graphs.record`. It never holds the step itself (the step is handed to each call), so a
    step nobody holds is freed, and its recording with it."""

    def replay(self, step: CapturedStep) -> Any:
        """Run the step once more (`CapturedStep.__call__`, after the released check and the
        replay count): one launch, or `CapturedStep.run_inline`; returns its outputs."""
        ...

    def release(self) -> None:
        """Free what the recording holds (graph, stream, pool, kept outputs); no replay
        follows."""
        ...


class Graphs(Protocol):
    """A device's "graphs" executor (``backend.executor("graphs")``): what `gs.capture`, and
    the rules of a loop body (`gpuscalar.bodies.body_rules`), ask of the device. CuPy's
    (`gpuscalar.devices.cupy.graphs`) records CUDA graphs; the host's
    (`gpuscalar.devices.host.graphs`, NumPy and the strict device) re-runs the steps."""

    #: how a step's repr names what a replay is ("CUDA graph", "numpy, re-run")
    form: str

    def default_device(self) -> object:
        """The device a step that names no array of this backend runs on."""
        ...

    def library_syncs(self) -> AbstractContextManager[Any]:
        """A guard on the array library's own syncs (CuPy's ``float(x)``, the strict device's
        declared reads), counted as gpuscalar's so that `sync_guard` sees them."""
        ...

    def record(self, step: CapturedStep) -> Recording:
        """Warm ``step`` up and record it (`CapturedStep`'s constructor, after the checks)."""
        ...


def capture(fn: Callable[..., Any] | None = None, /, *args: Any, warmup: int = 2,
            steps: int = 1) -> Any:
    """Warm up and record ``fn(*args)``; returns a `CapturedStep` (call it to replay).

    Also a decorator: ``@gs.capture`` (no arguments, the defaults) or
    ``@gs.capture(warmup=3, steps=10)``.
    """
    if fn is None:
        if args:
            raise TypeError("gs.capture(...) as a decorator takes keyword arguments only")
        return lambda function: CapturedStep(function, (), warmup=warmup, steps=steps)
    return CapturedStep(fn, args, warmup=warmup, steps=steps)


def _check_count(value: Any, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"gs.capture: {name} must be an int, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"gs.capture: {name} must be >= {least}, got {sync.describe(value)}")
    return int(value)


# ---- where a step runs ----------------------------------------------------------------------

Placement = tuple[Backend, object]  # (backend, device)


def _where(value: Any) -> Placement | None:
    """The backend and device of an array or GPUScalar; None for anything else."""
    if isinstance(value, GPUScalar):
        return value.backend, value.device
    backend = backend_of(value)
    return None if backend is None else (backend, backend.device_of(value))


def _placement_of_args(args: tuple[Any, ...]) -> Placement | None:
    """Where every array or GPUScalar argument lives (None when there is none)."""
    found: Placement | None = None
    for index, arg in enumerate(args):
        if isinstance(arg, _NUMBERS):
            continue
        where = _where(arg)
        if where is None:
            raise TypeError(
                f"gs.capture: argument {index} is a {type(arg).__name__}; a captured step "
                "takes arrays, GPUScalars and numbers (close over anything else)"
            )
        if found is None:
            found = where
        elif where[0] is not found[0]:
            raise TypeError(f"gs.capture: argument {index} is a {where[0].name} value but an "
                            f"earlier one is {found[0].name}")
        elif where[1] != found[1]:
            raise ValueError(f"gs.capture: argument {index} is on device {where[1]!r} but an "
                             f"earlier one on {found[1]!r}")
    return found


def _placement_of_closure(fn: Callable[..., Any]) -> Placement | None:
    """Where the arrays that a step without array arguments closes over live (the variables
    it names directly; None when there are none or ``fn`` is not a Python function)."""
    try:
        variables = inspect.getclosurevars(fn)
    except TypeError:  # a callable object or a partial: nothing to inspect
        return None
    except ValueError:  # a closure cell not yet assigned ("cell is empty")
        return None
    places: dict[Placement, str] = {}
    for name, value in (*variables.nonlocals.items(), *variables.globals.items()):
        where = _where(value)
        if where is not None:
            places.setdefault(where, name)
    if len(places) > 1:  # a host array beside device arrays (a host copy, say): the device's
        places = {where: name for where, name in places.items()
                  if not where[0].host_memory} or places
    if len(places) > 1:
        found = ", ".join(f"{name!r} ({backend.name}, device {device!r})"
                          for (backend, device), name in places.items())
        raise TypeError(f"gs.capture: {getattr(fn, '__name__', 'fn')} uses arrays on different "
                        f"backends or devices ({found}); pass the arrays it computes on as "
                        "arguments")
    return next(iter(places), None)


def _placement(fn: Callable[..., Any], args: tuple[Any, ...]) -> Placement:
    found = _placement_of_args(args) or _placement_of_closure(fn)
    if found is not None:
        return found
    backend = default_backend()  # a step that reaches its arrays some other way
    graphs: Graphs = backend.executor("graphs")
    return backend, graphs.default_device()


# ---- the guard ----------------------------------------------------------------------------


def _refuse_nested_recording() -> None:
    """A capture may not start while another step is recorded or warmed up, nor inside a loop
    body (recorded into the enclosing graph already). Asked before anything else, so the error
    names the cause rather than what it leads to (on a GPU, the body's stream is capturing)."""
    if _capturing.get(False):  # (a ContextVar, not a device read)
        raise RuntimeError("gs.capture: a step is already being captured; captures cannot "
                           "nest (a captured step may replay another one)")
    if ledger.in_loop_body():
        raise RuntimeError("gs.capture: cannot capture inside a gs.while_loop or gs.cond "
                           "body (it is recorded into the enclosing graph already); "
                           "capture the whole loop instead")


@contextlib.contextmanager
def _guarded(backend: Backend, *, recording: bool) -> Iterator[None]:
    """Every sync raises, the array library's own included (`Graphs.library_syncs`). While
    ``recording`` (warm-up and capture), another capture may not start inside."""
    token = None
    if recording:
        _refuse_nested_recording()
        token = _capturing.set(True)
    try:
        graphs: Graphs = backend.executor("graphs")
        # a body, as a loop's: a pending GPUScalar made outside is a recipe evaluated where it
        # is used, from its inputs' values at each replay (what a recorded graph does), never
        # cached on the scalar by an evaluation in here
        with sync.sync_guard("error"), graphs.library_syncs(), ledger.loop_body():
            yield
    finally:
        if token is not None:
            _capturing.reset(token)


def _materialized(backend: Backend, result: Any) -> Any:
    """``result`` with every GPUScalar as a materialized one over the array its value is in
    (inside the capture: the evaluating kernel is recorded, and the value lives in a static
    buffer); the step's own scalars are not changed (nothing is cached in a body)."""
    if isinstance(result, GPUScalar):
        static = _array_of(result)
        known.mark_live(static)  # rewritten by every replay: never a known value
        return _wrap(backend, static)
    if isinstance(result, (tuple, list)):
        return _rebuilt(result, [_materialized(backend, r) for r in result])
    if isinstance(result, dict):
        return {key: _materialized(backend, value) for key, value in result.items()}
    return result


def _rebuilt(container: Any, items: list[Any]) -> Any:
    """A tuple or list (a named tuple included) like ``container`` holding ``items``."""
    if isinstance(container, tuple) and hasattr(container, "_fields"):
        return type(container)(*items)
    return type(container)(items)


def _fresh(backend: Backend, result: Any) -> Any:
    """The recorded outputs with each GPUScalar re-wrapped: the graph rewrote its buffer, so a
    value read (and cached) after an earlier replay must not be returned again."""
    if isinstance(result, GPUScalar):
        return _wrap(backend, _array_of(result))
    if isinstance(result, (tuple, list)):
        return _rebuilt(result, [_fresh(backend, r) for r in result])
    if isinstance(result, dict):
        return {key: _fresh(backend, value) for key, value in result.items()}
    return result


def _while_raising(error: BaseException, cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` while ``error`` is on its way: a cleanup failure is attached to it as a
    note, never raised in its place."""
    try:
        cleanup()
    except Exception as failure:  # noqa: BLE001 - the user's error is the one to raise
        if hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(f"(gs.capture cleanup also failed: {type(failure).__name__}: "
                           f"{failure})")


def _pointed(error: BaseException) -> BaseException | None:
    """CuPy's refusal of cuBLAS or of a host-to-device copy inside a capture, as an error that
    says what to do instead; None for any other error."""
    if isinstance(error, NotImplementedError) and _CUBLAS_REFUSAL in str(error):
        return NotImplementedError(
            f"{error}: CuPy cannot call cuBLAS while a graph is captured (x @ w, "
            "cupy.matmul, cupy.dot ...); use gs.matmul(a, b, out=...) in a captured step"
        )
    if isinstance(error, RuntimeError) and _UPLOAD_REFUSAL in str(error):
        return RuntimeError(
            f"{error}: a captured step cannot copy host data to the device (xp.asarray of a "
            "host array or list, x.set(host), host index arrays); make and upload arrays "
            "before capturing, and write new inputs into the step's buffers between replays "
            "(x[...] = device_batch)"
        )
    return None


def _released_step(*args: Any) -> Any:
    """What a released `CapturedStep` holds instead of the user's function (never called: a
    released step refuses to run before reaching it)."""
    raise RuntimeError("gs.capture: this CapturedStep was released; capture it again")


class CapturedStep:
    """A step recorded by `capture`: call it to replay (one launch on a GPU, one counted device
    op everywhere). ``release()`` frees its graph and memory pool; the step cannot be replayed
    afterwards."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], *, warmup: int = 2,
                 steps: int = 1) -> None:
        if not callable(fn):
            raise TypeError(f"gs.capture: fn must be callable, got {type(fn).__name__}")
        self.warmup = _check_count(warmup, "warmup", 0)
        self.steps = _check_count(steps, "steps", 1)
        self.backend, self.device = _placement(fn, args)
        _refuse_nested_recording()
        self._fn, self._args = fn, args
        self._name = getattr(fn, "__name__", "fn")
        self._released = False
        self._graphs: Graphs = self.backend.executor("graphs")
        try:
            self._recording: Recording = self._graphs.record(self)
        except BaseException:
            self._released = True
            raise

    def warm_up(self, *, materialize: bool = False) -> None:
        """``fn(*args)`` ``warmup`` times under the guard, as a recording step (a nested capture
        refused; `Graphs.record` calls it, then records). With ``materialize``, a returned
        pending GPUScalar is evaluated too, so that its kernel is compiled before recording
        (recording then compiles nothing)."""
        with _guarded(self.backend, recording=True):
            for _ in range(self.warmup):
                result = self._fn(*self._args)
                if materialize:
                    _materialized(self.backend, result)

    def run_recorded_steps(self) -> Any:
        """``fn(*args)`` ``steps`` times in a graph body: what a recording records; returns the
        last call's outputs, materialized (`Graphs.record`, inside its guard)."""
        result = None
        with sync.graph_body():
            for _ in range(self.steps):
                result = self._fn(*self._args)
            return _materialized(self.backend, result)

    def __call__(self) -> Any:
        """Replay the step: one graph launch (on NumPy, ``steps`` calls of fn under the sync
        guard, counted as one device op); returns the step's outputs, the same buffers at
        every replay (a GPUScalar as a fresh GPUScalar over its buffer)."""
        if self._released:
            raise RuntimeError("gs.capture: this CapturedStep was released; capture it again")
        sync.note_graph_replay()
        return self._recording.replay(self)

    def run_inline(self, place: AbstractContextManager[Any],
                   finish: Callable[[Any], Any]) -> Any:
        """``steps`` calls of fn under the sync guard in ``place`` (a device context), as one
        counted device op, the last call's outputs handed to ``finish`` inside it: a replay on
        NumPy and the strict device, and on CuPy a call while another graph is being recorded
        (launching a graph into a capturing stream is not reliable; the steps' kernels are
        recorded into the outer graph instead)."""
        result = None
        try:
            with place, _guarded(self.backend, recording=False), sync.one_device_op(), (
                sync.graph_body()
            ):
                for _ in range(self.steps):
                    result = self._fn(*self._args)
                result = finish(result)
        except (NotImplementedError, RuntimeError) as error:
            pointed = _pointed(error)
            if pointed is None:
                raise
            raise pointed from error
        return result

    def release(self) -> None:
        """Free the graph, the private stream and memory pool (temporaries; outputs you still
        hold stay valid). A released step cannot be replayed. The step's function and arguments
        are dropped too, so whatever they hold (arrays, closures) can be freed."""
        self._released = True
        self._fn, self._args = _released_step, ()
        self._recording.release()

    @property
    def released(self) -> bool:
        return self._released

    def __repr__(self) -> str:
        state = "released" if self._released else "ready"
        return (f"<gpuscalar CapturedStep {self._name}: "
                f"{self.steps} step(s), {self._graphs.form}, {state}>")
