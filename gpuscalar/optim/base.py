"""The optimizer base class: hyperparameters, the step, checkpoints.

Why this module exists: every fused optimizer (`Adam`, `SGD`, `RMSprop`, `Lion`, ...) shares the
same contract, written once here: the arrays passed in are updated in place; a step is one
multi-tensor launch per dtype group plus one for the step counter, with no sync, no allocation
and no host-to-device copy (so it can be captured as a CUDA graph); hyperparameters are
validated whenever they are set and may be GPUScalars (even pending expressions of the live
step counter: a schedule costs no launch); ``skip_if`` is read on the device; and
`state_dict`/`load_state_dict` checkpoint on the device. An algorithm's file only names its
Program(s), its hyperparameters and the scalars its kernel reads.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import known, sync
from ..scalar import GPUScalar, _wrap
from .checks import (
    betas_pair,
    byte_span,
    check_array,
    check_like,
    check_skip,
    check_writeable,
    describe,
    first_overlap,
    hyper,
)
from .executors import executor_for, route
from .kernels import ADDRESS_CHUNK, MULTI_TENSOR_CHUNK
from .multi_tensor import Group
from .program import COUNTER_READS, CounterRead, Program

#: a gradient's layout, compared with its parameter's: type, shape, dtype, strides
_LAYOUT = operator.attrgetter("__class__", "shape", "dtype", "strides")

__all__ = ["Optimizer", "Hyperparameter", "nonnegative", "betas_setting",
           "uses_momentum", "momentum_setting", "BETAS", "EPS", "WEIGHT_DECAY", "MOMENTUM"]


class Hyperparameter:
    """An optimizer hyperparameter: a number or a GPUScalar, validated whenever it is set (so a
    bad value never reaches a kernel). ``check(optimizer, name, value)`` returns the value."""

    def __init__(self, check: Callable[[Any, str, Any], Any], doc: str) -> None:
        self.check = check
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.attribute = name, f"_{name}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.attribute)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.attribute, self.check(obj, self.name, value))


def nonnegative(opt: Optimizer, name: str, value: Any) -> Any:
    return hyper(value, name, opt._backend, opt._device)


def betas_setting(opt: Optimizer, name: str, value: Any) -> tuple[Any, Any]:
    """A ``(beta1, beta2)`` hyperparameter: numbers in [0, 1) or GPUScalars."""
    return betas_pair(value, opt._backend, opt._device, name)


def uses_momentum(momentum: Any) -> bool:
    """Whether an optimizer made with ``momentum`` keeps momentum buffers (a GPUScalar counts:
    its value is not read)."""
    return isinstance(momentum, GPUScalar) or (
        isinstance(momentum, numbers.Real) and momentum != 0
    )


def momentum_setting(opt: Optimizer, name: str, value: Any) -> Any:
    """A momentum hyperparameter: non-negative, and only 0 on an optimizer made without
    momentum buffers. 0 on one made with them is a plain step, buffers kept (PyTorch's)."""
    value = nonnegative(opt, name, value)
    if "momentum_buffer" not in opt._program.arrays and uses_momentum(value):
        kind = type(opt).__name__
        raise ValueError(f"{name}: this {kind} was made without momentum (no momentum "
                         f"buffers); make a new {kind} with momentum > 0")
    return value


#: The hyperparameters several optimizers share, declared once (a descriptor keeps no state of
#: its class: each optimizer class names the one it uses, ``weight_decay = WEIGHT_DECAY``).
BETAS = Hyperparameter(betas_setting, "(beta1, beta2): numbers in [0, 1) or GPUScalars.")
EPS = Hyperparameter(nonnegative, "Added to the denominator: a number or GPUScalar.")
WEIGHT_DECAY = Hyperparameter(nonnegative, "Weight decay: a number or GPUScalar (>= 0).")
MOMENTUM = Hyperparameter(momentum_setting, "Momentum: a number or GPUScalar (>= 0).")


def _scalar_read(opt: Optimizer, name: str) -> Callable[[Optimizer], Any]:
    """How an optimizer reads the Program scalar ``name``: a read of the live step counter
    (`COUNTER_READS`: ``step``, ``fresh``), one of the pair ``betas`` (``beta1``, ``beta2``),
    or the hyperparameter of that name."""
    if name in COUNTER_READS:
        counter = CounterRead(opt._count, name)
        return lambda _: counter
    if name in ("beta1", "beta2"):
        index, betas = int(name[-1]) - 1, operator.attrgetter("_betas")
        return lambda o: betas(o)[index]
    if not isinstance(getattr(type(opt), name, None), Hyperparameter):
        raise TypeError(f"{type(opt).__name__} has no hyperparameter {name!r}, which its "
                        f"program {opt._program.name!r} reads")
    return operator.attrgetter(f"_{name}")


class Optimizer:
    """Base of the fused multi-tensor optimizers (`Adam`, `AdamW`, `SGD`, `RMSprop`, `Lion`).

    The arrays passed in are the parameters: `step` updates them in place (``opt.params[0] is
    w``). Per dtype group a step is one multi-tensor kernel, whatever the number of tensors,
    plus one op for the step counter; no copy of parameters or gradients is made. State lives
    on the device (`state`, `state_dict`). The step counter is a 0-d int64 device buffer updated
    in place (`step_count`), hyperparameters may be GPUScalars, and ``skip_if`` is read on the
    device, so a step never syncs, allocates no device memory, and can be captured as a CUDA
    graph (with the same or new gradient arrays each call: see `step`).
    """

    _program: Program
    #: hyperparameter attributes, in `state_dict` order
    _hyperparameters: tuple[str, ...] = ("lr",)
    #: Elements per block of the multi-tensor kernel (a tuning knob read when an optimizer is
    #: made: a subclass may set another; the kernels' code does not depend on it).
    chunk_size: int = MULTI_TENSOR_CHUNK

    lr = Hyperparameter(nonnegative, "The learning rate: a number or a GPUScalar (>= 0).")

    def __init__(self, params: Sequence[Any], lr: Any, program: Program,
                 **hyperparameters: Any) -> None:
        """Validate ``params``, set ``lr`` and the other ``hyperparameters`` (by attribute
        name, each validated by its `Hyperparameter`), and allocate the state ``program``
        keeps, on the device of the parameters."""
        chunk = self.chunk_size
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"{type(self).__name__}.chunk_size must be an int >= 1, got "
                             f"{describe(chunk)}")
        items = list(params) if not hasattr(params, "shape") else None
        if not items:
            raise TypeError(
                "params must be a non-empty list of arrays"
                + ("" if items is not None else ", not a single array (wrap it in a list)")
            )
        backend = check_array(items[0], "params[0]")
        device = backend.device_of(items[0])
        for i, p in enumerate(items[1:], 1):
            other = check_array(p, f"params[{i}]")
            if other is not backend:
                raise TypeError(f"params[{i}] is a {other.name} array but params[0] is "
                                f"{backend.name}")
            if backend.multi_device and backend.device_of(p) != device:
                raise ValueError(f"params[{i}] is on device {backend.device_of(p)!r} but "
                                 f"params[0] on {device!r}")
        for i, p in enumerate(items):
            check_writeable(backend, p, f"params[{i}]")
        overlap = first_overlap(backend, items)
        if overlap is not None:
            i, j = overlap
            raise ValueError(
                f"params[{i}] and params[{j}] share memory (the same array twice, or "
                "overlapping views): each parameter must be updated once per step"
            )
        self._backend, self._device, self._program = backend, device, program
        self._executor = executor = executor_for(backend)
        self._params = items
        self._param_ids = frozenset(map(id, items))
        # what a gradient must match, per parameter, compared in one C-level pass per step
        # (`_checked_grads`); a mismatch goes to the per-gradient checks that say what differs
        self._layouts = list(map(_LAYOUT, items))
        self.lr = lr
        for name, value in hyperparameters.items():
            setattr(self, name, value)
        by_dtype: dict[Any, list[int]] = {}
        for i, p in enumerate(items):
            by_dtype.setdefault(p.dtype, []).append(i)
        with backend.device_context(device):
            xp = backend.xp
            self._count = backend.call(xp.zeros, (), dtype=np.int64)
            known.mark_live(self._count)  # rewritten by every step: never a known value
            grad_table = executor.new_grad_table(len(items))
            self._groups: list[Group] = []
            offset = 0
            for indices in by_dtype.values():
                rows = None if grad_table is None else grad_table[offset:offset + len(indices)]
                self._groups.append(Group(executor, program, indices,
                                          [items[i] for i in indices], rows, chunk))
                offset += len(indices)
        # The gradient table, in table order (dtype group by group), is written in chunks of
        # ADDRESS_CHUNK entries, one launch each: on a device by a kernel that carries them in
        # its arguments (the table slice it writes, and how many); on a host-evaluating backend
        # the "table" is each tensor's "grad" entry.
        self._grad_table = grad_table
        self._order = [i for group in self._groups for i in group.indices]
        self._in_order = self._order == list(range(len(items)))  # (one dtype group, say)
        n = len(items)
        bounds = [(lo, min(lo + ADDRESS_CHUNK, n)) for lo in range(0, n, ADDRESS_CHUNK)]
        self._address_chunks = [
            (lo, hi, None if grad_table is None else grad_table[lo:hi]) for lo, hi in bounds
        ]
        self._where = {i: (group, k) for group in self._groups
                       for k, i in enumerate(group.indices)}
        # What Python knows the gradient table holds: the arrays it points to (kept alive, so
        # that an identity check is sound), as of `graph_replays()` when it was written eagerly;
        # None when unknown (after a captured step wrote it).
        self._grads: tuple[Any, ...] | None = None
        self._grads_replays = -1
        # what each of the program's scalars reads, by name (see `_scalars`)
        self._scalar_reads = [_scalar_read(self, name) for name in program.scalars]

    # -- public attributes --
    @property
    def params(self) -> list[Any]:
        """The parameters: the arrays passed in, updated in place by `step`, in that order."""
        return list(self._params)

    @property
    def step_count(self) -> GPUScalar:
        """Updates applied so far (skipped steps excluded): an int64 GPUScalar viewing the live
        device counter, which `step` increments in place.

        It is read where it is consumed: an expression built from it and consumed by this
        step's `step` (e.g. a learning-rate schedule assigned to ``opt.lr``) sees the count
        before this step; read it (``int(...)``) or copy it before `step` to keep an old value.
        Each access returns a new GPUScalar, so a host read is never a stale cached value.
        """
        return _wrap(self._backend, self._count)

    def state(self, name: str) -> list[Any]:
        """Live per-parameter views of a state buffer (e.g. ``"exp_avg"``), in parameter order
        (later steps update them; `state_dict` returns copies)."""
        names = self._program.arrays[2:]
        if name not in names:
            raise KeyError(f"{type(self).__name__} has no state {name!r}; it has {list(names)}")
        return [self._state_view(i, name) for i in range(len(self._params))]

    def _state_view(self, i: int, name: str) -> Any:
        group, k = self._where[i]
        return group.state_views[name][k]

    # -- the step --
    def step(self, grads: Sequence[Any], *, skip_if: GPUScalar | None = None) -> None:
        """Apply one update from ``grads`` to the parameters, in place, with no sync.

        ``grads``: one array per parameter, of its shape, dtype, backend and device (C-contiguous
        on CuPy), not a parameter itself. Reusing the same gradient arrays from step to step
        costs nothing extra; new ones cost writing their addresses into the kernel's table (one
        launch per `ADDRESS_CHUNK` parameters), and the optimizer keeps a reference to the last
        ones. Inside a captured step (`gs.capture`) the table is always written, from kernel
        arguments the graph keeps, so any gradient arrays work there, new ones each call
        included. ``skip_if``: a bool GPUScalar; when true on the device, parameters, state and
        the step counter stay unchanged. Everything that could make the step fail is checked
        before anything is written.
        """
        backend, executor = self._backend, self._executor
        executor.check_before_step(self._groups)
        items, changed = self._checked_grads(grads)
        skip = check_skip(skip_if, backend, self._device)
        scalars = [route(value) for value in self._scalars()]
        skip_routed = None if skip is None else route(skip)
        in_graph_body = sync.in_graph_body()
        with backend.device_context(self._device):
            # a captured step always writes the table (each replay then restores its own), and
            # a replay on a GPU changes the table without Python: then it is written again
            if changed or in_graph_body or self._grads_replays != sync.graph_replays():
                executor.write_grads(self, items)
                if in_graph_body:  # recorded (nothing ran yet) or replayed: unknown afterwards
                    self._grads, self._grads_replays = None, -1
                else:
                    self._grads, self._grads_replays = tuple(items), sync.graph_replays()
            for group in self._groups:
                group.launch(self._program, scalars, skip_routed)
            executor.increment(self._count, skip_routed)

    def _checked_grads(self, grads: Any) -> tuple[list[Any], bool]:
        """The gradients as a list, and whether they differ from the arrays the table points to.
        Each new gradient is validated before anything is touched (on a host-evaluating backend,
        every gradient: NumPy lets an array's shape change in place)."""
        items = list(grads) if not hasattr(grads, "shape") else None
        n = len(self._params)
        last = self._grads
        same = items is not None and last is not None and len(items) == n and all(
            map(operator.is_, items, last)
        )
        if same and items is not None and not self._executor.recheck_grads:
            return items, False
        if items is None or len(items) != n:
            got = "a single array" if items is None else f"{len(items)} arrays"
            raise ValueError(f"step() needs one gradient per parameter ({n}), got {got}")
        backend, param_ids = self._backend, self._param_ids
        try:
            if list(map(_LAYOUT, items)) == self._layouts and param_ids.isdisjoint(
                    map(id, items)) and (not backend.multi_device
                                         or set(backend.devices_of(items)) == {self._device}):
                return items, not same
        except AttributeError:  # not an array: the checks below say which
            pass
        for i, (g, p) in enumerate(zip(items, self._params, strict=True)):
            if type(g) is not type(p) or g.shape != p.shape or g.dtype != p.dtype or (
                g.strides != p.strides
            ) or (backend.multi_device and backend.device_of(g) != self._device):
                check_like(g, p, f"grads[{i}]", f"params[{i}]", backend)
            if id(g) in param_ids:
                raise ValueError(f"grads[{i}] is a parameter array itself; pass its gradient")
        return items, not same

    def _scalars(self) -> list[Any]:
        """The values of ``self._program.scalars`` for this step (numbers, GPUScalars, or
        reads of the live step counter)."""
        return [read(self) for read in self._scalar_reads]

    # -- checkpointing --
    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of the optimizer: copies on the device, no sync.

        ``{"step": 0-d int64 array, "state": [per parameter, {state name: array}],
        "hyperparams": {name: value}}``. ``hyperparams`` holds the hyperparameters that are
        plain numbers (a GPUScalar hyperparameter, e.g. a schedule, is code: set it again).
        For SGD with momentum, the momentum buffers hold history exactly when step > 0.
        """
        backend = self._backend
        copy = backend.xp.copy
        names = self._program.arrays[2:]
        with backend.device_context(self._device):
            step = backend.call(copy, self._count)
            state = [{name: backend.call(copy, self._state_view(i, name)) for name in names}
                     for i in range(len(self._params))]
        hyperparams = {}
        for name in self._hyperparameters:
            value = getattr(self, name)
            parts = value if isinstance(value, tuple) else (value,)
            if not any(isinstance(part, GPUScalar) for part in parts):
                hyperparams[name] = value
        return {"step": step, "state": state, "hyperparams": hyperparams}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a checkpoint made by `state_dict` (of an optimizer of the same class over
        parameters of the same shapes and dtypes). The arrays are copied into the optimizer's
        own buffers. Everything is validated first: a bad entry raises an error naming its key
        and leaves the optimizer as it was."""
        _check_keys(state_dict, ("step", "state", "hyperparams"), "state_dict")
        backend = self._backend
        copies = [(self._count, state_dict["step"], "state_dict['step']",
                   "the step counter (0-d int64)")]
        state = state_dict["state"]
        n = len(self._params)
        if not isinstance(state, Sequence) or len(state) != n:
            got = f"{len(state)} entries" if isinstance(state, Sequence) else type(state).__name__
            raise ValueError(f"state_dict['state'] must be a list of one entry per parameter "
                             f"({n}), got {got}")
        names = self._program.arrays[2:]
        for i, entry in enumerate(state):
            where = f"state_dict['state'][{i}]"
            _check_keys(entry, names, where)
            copies += [(self._state_view(i, name), entry[name], f"{where}[{name!r}]",
                        f"the optimizer's {name} of params[{i}]") for name in names]
        for target, source, what, ref_what in copies:
            check_like(source, target, what, ref_what, backend, contiguous=False)
            check_writeable(backend, target, ref_what)
        hyperparams = state_dict["hyperparams"]
        if not isinstance(hyperparams, Mapping):
            raise TypeError("state_dict['hyperparams'] must be a mapping, got "
                            f"{type(hyperparams).__name__}")
        checked = {}
        for name, value in hyperparams.items():
            if name not in self._hyperparameters:
                raise ValueError(f"state_dict['hyperparams'] has unknown key {name!r} "
                                 f"(expected some of {list(self._hyperparameters)})")
            descriptor = getattr(type(self), name)
            checked[descriptor.attribute] = descriptor.check(
                self, f"state_dict['hyperparams'][{name!r}]", value
            )
        # A source may view the optimizer's own buffers (e.g. `state` views, swapped): copied
        # in sequence, a later source would read what an earlier copy wrote. Those are copied
        # aside first (one op each).
        own = [byte_span(backend, self._count)] + [
            byte_span(backend, flat) for group in self._groups for flat in group.state.values()
            if flat.size
        ]

        def aliased(source: Any) -> bool:
            if not source.size:
                return False
            low, high = byte_span(backend, source)
            return any(low < own_high and own_low < high for own_low, own_high in own)

        with backend.device_context(self._device):
            sources = [backend.call(backend.xp.copy, source) if aliased(source) else source
                       for _, source, _, _ in copies]
            for (target, _, _, _), source in zip(copies, sources, strict=True):
                backend.call(backend.xp.copyto, target, source)
        for attribute, value in checked.items():
            setattr(self, attribute, value)


def _check_keys(mapping: Any, expected: Sequence[str], where: str) -> None:
    """``mapping`` is a mapping with exactly the keys ``expected``; else a clear error naming
    ``where``: TypeError (not a mapping), KeyError (a key missing), ValueError (unknown keys)."""
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{where} must be a mapping, got {type(mapping).__name__}")
    for key in expected:
        if key not in mapping:
            raise KeyError(f"{where} is missing {key!r} (expected {list(expected)})")
    unknown = sorted(set(mapping) - set(expected), key=str)
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown} (expected {list(expected)})")
