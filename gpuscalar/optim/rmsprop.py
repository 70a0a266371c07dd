"""RMSprop (centered, momentum): the fused multi-tensor class and the functional `rmsprop_step`.

Why this module exists: one file per algorithm, the whole of RMSprop in one place. PyTorch's
semantics and signature (``torch.optim.RMSprop``): L2 weight decay added to the gradient;
``square_avg = alpha * square_avg + (1 - alpha) * g * g``; centered, the denominator subtracts
the square of ``grad_avg = alpha * grad_avg + (1 - alpha) * g``; ``eps`` is added after the
square root; with momentum, ``buf = momentum * buf + g / denominator`` (from a zero buffer) and
the parameter moves by ``lr * buf``. A step whose momentum is 0 (set later, or a GPUScalar's
value, decided on the device) is a plain step that leaves the buffers alone, as PyTorch's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..lazy.rules import select, sqrt, symbols
from ..scalar import GPUScalar
from .base import (
    EPS,
    MOMENTUM,
    WEIGHT_DECAY,
    Hyperparameter,
    Optimizer,
    nonnegative,
    uses_momentum,
)
from .checks import check_skip, hyper, step_arrays
from .executors import run_program
from .program import Program, register

__all__ = ["RMSPROP_PROGRAMS", "rmsprop_step", "RMSprop"]


def _program(centered: bool, momentum: bool) -> Program:
    """The RMSprop update for one (centered, momentum) variant."""
    lr, alpha, eps, weight_decay, mu = symbols("lr alpha eps weight_decay momentum")
    param, grad, square_avg, momentum_buffer, grad_avg = symbols(
        "param grad square_avg momentum_buffer grad_avg")
    g, v, a, d, b = symbols("g v a d b")
    body = [("g", grad + weight_decay * param),
            ("v", alpha * square_avg + (1 - alpha) * g * g)]
    if centered:
        body += [("a", alpha * grad_avg + (1 - alpha) * g), ("d", sqrt(v - a * a) + eps)]
    else:
        body.append(("d", sqrt(v) + eps))
    outputs = [("param", "p"), ("square_avg", "v")]
    if momentum:
        body += [("b", select(mu == 0, momentum_buffer, mu * momentum_buffer + g / d)),
                 ("p", param - lr * select(mu == 0, g / d, b))]
        outputs.append(("momentum_buffer", "b"))
    else:
        body.append(("p", param - lr * (g / d)))
    if centered:
        outputs.append(("grad_avg", "a"))
    return Program(
        name="rmsprop" + "_centered" * centered + "_momentum" * momentum,
        scalars=("lr", "alpha", "eps", "weight_decay", "momentum"),
        # PyTorch's state order: square_avg, momentum_buffer, grad_avg
        arrays=("param", "grad", "square_avg", *("momentum_buffer",) * momentum,
                *("grad_avg",) * centered),
        prelude=(),
        body=tuple(body),
        outputs=tuple(outputs),
    )


#: The RMSprop Programs by (centered, momentum).
RMSPROP_PROGRAMS: dict[tuple[bool, bool], Program] = {
    (centered, momentum): _program(centered, momentum)
    for centered in (False, True) for momentum in (False, True)
}
register(*RMSPROP_PROGRAMS.values())


def _check_bool(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def rmsprop_step(
    param: Any,
    grad: Any,
    square_avg: Any,
    momentum_buffer: Any = None,
    grad_avg: Any = None,
    *,
    lr: Any = 1e-2,
    alpha: Any = 0.99,
    eps: Any = 1e-8,
    weight_decay: Any = 0.0,
    momentum: Any = 0.0,
    centered: bool = False,
    skip_if: GPUScalar | None = None,
) -> None:
    """One RMSprop update of ``param``, in place (PyTorch's semantics; see the module doc).

    ``square_avg`` (and, with momentum, ``momentum_buffer``; centered, ``grad_avg``) are the
    state arrays, zeros before the first step, updated in place. Hyperparameters may be Python
    numbers or GPUScalars (a GPUScalar momentum needs a buffer). One fused kernel (one device
    op), no sync; ``skip_if``: a bool GPUScalar, when true on the device nothing changes.
    """
    _check_bool(centered, "centered")
    with_momentum = uses_momentum(momentum)
    state = {"square_avg": square_avg}
    for name, value, needed, when in (("momentum_buffer", momentum_buffer, with_momentum,
                                       ("momentum is not 0", "momentum is 0")),
                                      ("grad_avg", grad_avg, centered,
                                       ("centered is True", "centered is False"))):
        if needed and value is None:
            raise ValueError(f"{name} is needed when {when[0]}: pass zeros like param before "
                             "the first step")
        if not needed and value is not None:
            raise ValueError(f"{name} given but {when[1]}")
        if needed:
            state[name] = value
    backend, device = step_arrays(param, grad, **state)
    scalars = {
        "lr": hyper(lr, "lr", backend, device),
        "alpha": hyper(alpha, "alpha", backend, device),
        "eps": hyper(eps, "eps", backend, device),
        "weight_decay": hyper(weight_decay, "weight_decay", backend, device),
        "momentum": hyper(momentum, "momentum", backend, device),
    }
    skip = check_skip(skip_if, backend, device)
    run_program(backend, RMSPROP_PROGRAMS[centered, with_momentum], scalars,
                {"param": param, "grad": grad, **state}, skip)


class RMSprop(Optimizer):
    """Fused multi-tensor RMSprop on the user's arrays (PyTorch's ``torch.optim.RMSprop``).
    State: ``square_avg``, and ``momentum_buffer`` when made with momentum (> 0 or a
    GPUScalar), ``grad_avg`` when ``centered``."""

    _hyperparameters = ("lr", "alpha", "eps", "weight_decay", "momentum")

    alpha = Hyperparameter(nonnegative, "Smoothing constant: a number or GPUScalar (>= 0).")
    eps = EPS
    weight_decay = WEIGHT_DECAY
    momentum = MOMENTUM

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any = 1e-2,
        alpha: Any = 0.99,
        eps: Any = 1e-8,
        weight_decay: Any = 0,
        momentum: Any = 0,
        centered: bool = False,
    ) -> None:
        _check_bool(centered, "centered")
        super().__init__(params, lr, RMSPROP_PROGRAMS[centered, uses_momentum(momentum)],
                         alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum)

    @property
    def centered(self) -> bool:
        """Whether the denominator is centered (fixed at construction)."""
        return "grad_avg" in self._program.arrays
