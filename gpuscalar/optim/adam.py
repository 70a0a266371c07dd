"""Adam and AdamW: the fused multi-tensor classes and the functional `adam_step`.

Why this module exists: one file per algorithm. PyTorch's semantics (``torch.optim.Adam``: L2
weight decay added to the gradient; ``torch.optim.AdamW``: decoupled weight decay), with the
bias correction computed on the device from the live step counter, so a step never syncs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..lazy import rules
from ..lazy.rules import sqrt, symbols
from ..scalar import GPUScalar
from .base import BETAS, EPS, WEIGHT_DECAY, Optimizer
from .checks import betas_pair, check_skip, hyper, step_arrays
from .executors import run_program
from .program import Program, register

__all__ = ["ADAM", "ADAMW", "adam_step", "Adam", "AdamW"]


def _programs() -> tuple[Program, Program]:
    """PyTorch's Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay
    shrinks the parameter before the Adam update), sharing the moments and bias correction."""
    lr, beta1, beta2, eps, weight_decay, step = symbols("lr beta1 beta2 eps weight_decay step")
    param, grad, exp_avg, exp_avg_sq = symbols("param grad exp_avg exp_avg_sq")
    bias1, bias2_sqrt, step_size, decay, g, m, v = symbols(
        "bias1 bias2_sqrt step_size decay g m v")
    prelude = (
        ("bias1", 1 - rules.pow(beta1, step)),
        ("bias2_sqrt", sqrt(1 - rules.pow(beta2, step))),
        ("step_size", lr / bias1),
    )
    moments = (
        ("m", beta1 * exp_avg + (1 - beta1) * g),
        ("v", beta2 * exp_avg_sq + (1 - beta2) * g * g),
    )
    update = step_size * m / (sqrt(v) / bias2_sqrt + eps)
    scalars = ("lr", "beta1", "beta2", "eps", "weight_decay", "step")
    arrays = ("param", "grad", "exp_avg", "exp_avg_sq")
    outputs = (("param", "p"), ("exp_avg", "m"), ("exp_avg_sq", "v"))
    adam = Program("adam", scalars, arrays, prelude,
                   (("g", grad + weight_decay * param), *moments, ("p", param - update)), outputs)
    adamw = Program("adamw", scalars, arrays, (*prelude, ("decay", 1 - lr * weight_decay)),
                    (("g", grad), *moments, ("p", param * decay - update)), outputs)
    return adam, adamw


#: PyTorch Adam and AdamW.
ADAM, ADAMW = _programs()
register(ADAM, ADAMW)


def adam_step(
    param: Any,
    grad: Any,
    exp_avg: Any,
    exp_avg_sq: Any,
    *,
    step: Any,
    lr: Any = 1e-3,
    betas: tuple[Any, Any] = (0.9, 0.999),
    eps: Any = 1e-8,
    weight_decay: Any = 0.0,
    decoupled_weight_decay: bool = False,
    skip_if: GPUScalar | None = None,
) -> None:
    """One Adam (or, with ``decoupled_weight_decay``, AdamW) update of ``param``, in place.

    PyTorch's semantics. ``step`` is the 1-based number of this update. Every hyperparameter
    and ``step`` may be a Python number or a GPUScalar; bias correction is computed on the
    device from ``step``. One fused kernel (one device op), no sync. ``skip_if``: a bool
    GPUScalar; when true on the device, nothing is changed.
    """
    backend, device = step_arrays(param, grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    beta1, beta2 = betas_pair(betas, backend, device)
    scalars = {
        "lr": hyper(lr, "lr", backend, device),
        "beta1": beta1,
        "beta2": beta2,
        "eps": hyper(eps, "eps", backend, device),
        "weight_decay": hyper(weight_decay, "weight_decay", backend, device),
        "step": hyper(step, "step", backend, device, low=1.0),
    }
    skip = check_skip(skip_if, backend, device)
    program = ADAMW if decoupled_weight_decay else ADAM
    arrays = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    run_program(backend, program, scalars, arrays, skip)


class Adam(Optimizer):
    """Fused multi-tensor Adam on the user's arrays (PyTorch's ``torch.optim.Adam``; L2
    ``weight_decay``). State: ``exp_avg``, ``exp_avg_sq``."""

    _decoupled = False
    _hyperparameters = ("lr", "betas", "eps", "weight_decay")

    betas = BETAS
    eps = EPS
    weight_decay = WEIGHT_DECAY

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 0.0,
    ) -> None:
        super().__init__(params, lr, ADAMW if self._decoupled else ADAM, betas=betas, eps=eps,
                         weight_decay=weight_decay)


class AdamW(Adam):
    """Fused multi-tensor AdamW (PyTorch's ``torch.optim.AdamW``: decoupled weight decay)."""

    _decoupled = True

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 1e-2,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay)
