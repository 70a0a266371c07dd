"""SGD (momentum, dampening, Nesterov): the fused multi-tensor class and the functional
`sgd_step`.

Why this module exists: one file per algorithm. PyTorch's semantics (``torch.optim.SGD``),
including its first momentum step (``buf = grad``), decided on the device from the live step
counter, and its plain step when momentum is 0 (set later, or a GPUScalar's value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..lazy.rules import select, symbols
from ..scalar import GPUScalar
from .base import (
    MOMENTUM,
    WEIGHT_DECAY,
    Hyperparameter,
    Optimizer,
    nonnegative,
    uses_momentum,
)
from .checks import check_like, check_skip, check_writeable, hyper, step_arrays
from .executors import executor_for, route, run_program
from .program import VALUE, Program, register

__all__ = ["SGD_PLAIN", "SGD_MOMENTUM", "SGD_NESTEROV", "sgd_step", "SGD"]


def _programs() -> tuple[Program, Program, Program]:
    """PyTorch SGD without momentum, with momentum (heavy ball), and with Nesterov momentum."""
    lr, momentum, dampening, weight_decay, fresh = symbols(
        "lr momentum dampening weight_decay fresh")
    param, grad, momentum_buffer, g, b = symbols("param grad momentum_buffer g b")
    decayed = ("g", grad + weight_decay * param)
    plain = Program("sgd", ("lr", "weight_decay"), ("param", "grad"), (),
                    (decayed, ("p", param - lr * g)), (("param", "p"),))
    # ``fresh`` is 1 while the momentum buffer holds no history: PyTorch then sets buf = grad.
    # With momentum 0 (a number set after construction, or a GPUScalar's value) PyTorch's step
    # is plain SGD and leaves the buffer alone: so does this one, decided on the device.
    buffer = ("b", select(momentum == 0, momentum_buffer,
                          select(fresh != 0, g, momentum * momentum_buffer + (1 - dampening) * g)))
    scalars = ("lr", "momentum", "dampening", "weight_decay", "fresh")
    arrays = ("param", "grad", "momentum_buffer")
    outputs = (("param", "p"), ("momentum_buffer", "b"))
    heavy_ball = Program("sgd_momentum", scalars, arrays, (),
                         (decayed, buffer, ("p", param - lr * select(momentum == 0, g, b))),
                         outputs)
    nesterov = Program("sgd_nesterov", scalars, arrays, (),
                       (decayed, buffer,
                        ("p", param - lr * select(momentum == 0, g, g + momentum * b))), outputs)
    return plain, heavy_ball, nesterov


#: PyTorch SGD without momentum, with momentum (heavy ball), and with Nesterov momentum.
SGD_PLAIN, SGD_MOMENTUM, SGD_NESTEROV = _programs()
register(SGD_PLAIN, SGD_MOMENTUM, SGD_NESTEROV)


def sgd_step(
    param: Any,
    grad: Any,
    momentum_buffer: Any = None,
    *,
    lr: Any,
    momentum: Any = 0.0,
    dampening: Any = 0.0,
    weight_decay: Any = 0.0,
    nesterov: bool = False,
    skip_if: GPUScalar | None = None,
) -> Any:
    """One SGD update of ``param`` in place (PyTorch's semantics); returns the momentum buffer.

    With momentum (a GPUScalar counts as momentum), ``momentum_buffer=None`` creates the buffer
    (PyTorch's first step: ``buf = grad``). Hyperparameters may be Python numbers or GPUScalars.
    One fused kernel, no sync; ``skip_if`` as in `adam_step` (a buffer created by a skipped
    call holds no history yet: pass None again).
    """
    if (type(lr) is float and type(weight_decay) is float and type(momentum) is float
            and type(dampening) is float and lr >= 0.0 and weight_decay >= 0.0
            and momentum == 0.0 and dampening >= 0.0 and momentum_buffer is None
            and nesterov is False and skip_if is None):
        # the plain step with Python floats (a loop's usual call): what the checks below
        # accept (`hyper`'s own first case for each number; NaN fails ``>=`` and goes on), the
        # numbers routed as `route` routes a float: one check of the arrays and the launch
        backend, _ = step_arrays(param, grad)
        executor_for(backend).run(SGD_PLAIN, [(VALUE, (lr,)), (VALUE, (weight_decay,))],
                                  (param, grad), None)
        return None
    backend, device = step_arrays(param, grad)
    scalars = {
        "lr": hyper(lr, "lr", backend, device),
        "weight_decay": hyper(weight_decay, "weight_decay", backend, device),
    }
    momentum = hyper(momentum, "momentum", backend, device)
    dampening = hyper(dampening, "dampening", backend, device)
    if not isinstance(nesterov, bool):
        raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__}")
    skip = None if skip_if is None else check_skip(skip_if, backend, device)
    if not isinstance(momentum, GPUScalar) and momentum == 0:
        if nesterov:
            raise ValueError("nesterov momentum needs momentum > 0")
        if momentum_buffer is not None:
            raise ValueError("momentum_buffer given but momentum is 0")
        routed = [route(scalars["lr"]), route(scalars["weight_decay"])]  # SGD_PLAIN's scalars
        executor_for(backend).run(SGD_PLAIN, routed, (param, grad),
                                  None if skip is None else route(skip))
        return None
    if nesterov and not isinstance(dampening, GPUScalar) and dampening != 0:
        raise ValueError("nesterov momentum needs dampening == 0")
    fresh = momentum_buffer is None
    if fresh:
        with backend.device_context(device):
            momentum_buffer = backend.call(backend.xp.zeros_like, param)
    else:
        check_like(momentum_buffer, param, "momentum_buffer", "param", backend)
        check_writeable(backend, momentum_buffer, "momentum_buffer")
    scalars.update(momentum=momentum, dampening=dampening, fresh=1 if fresh else 0)
    arrays = {"param": param, "grad": grad, "momentum_buffer": momentum_buffer}
    run_program(backend, SGD_NESTEROV if nesterov else SGD_MOMENTUM, scalars, arrays, skip)
    return momentum_buffer


def _sgd_dampening(opt: SGD, name: str, value: Any) -> Any:
    value = nonnegative(opt, name, value)
    if opt._program is SGD_NESTEROV and not isinstance(value, GPUScalar) and value != 0:
        raise ValueError(f"{name}: nesterov momentum needs dampening == 0")
    return value


class SGD(Optimizer):
    """Fused multi-tensor SGD on the user's arrays (PyTorch's ``torch.optim.SGD``: momentum,
    dampening, Nesterov, L2 weight decay). Made with momentum (> 0 or a GPUScalar), the state
    is a ``momentum_buffer``, which starts as the first non-skipped step's gradient. As in
    PyTorch, a step whose momentum is 0 (set later, or a GPUScalar's value, decided on the
    device) is a plain SGD step that leaves the buffers as they are."""

    _hyperparameters = ("lr", "momentum", "dampening", "weight_decay")

    momentum = MOMENTUM
    dampening = Hyperparameter(_sgd_dampening, "Dampening: a number or GPUScalar (>= 0).")
    weight_decay = WEIGHT_DECAY

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any,
        momentum: Any = 0.0,
        dampening: Any = 0.0,
        weight_decay: Any = 0.0,
        nesterov: bool = False,
    ) -> None:
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__}")
        with_momentum = uses_momentum(momentum)
        if nesterov and (not with_momentum or (
            not isinstance(dampening, GPUScalar) and dampening != 0
        )):
            raise ValueError("nesterov momentum needs momentum > 0 and dampening == 0")
        program = (SGD_NESTEROV if nesterov else SGD_MOMENTUM) if with_momentum else SGD_PLAIN
        super().__init__(params, lr, program, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay)

    @property
    def nesterov(self) -> bool:
        """Whether the update uses Nesterov momentum (fixed at construction)."""
        return self._program is SGD_NESTEROV
