"""Lion (EvoLved Sign Momentum): the fused multi-tensor class and the functional `lion_step`.

Why this module exists: one file per algorithm, the whole of Lion in one place. The published
update (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023, Algorithm 2)::

    update = sign(beta1 * m + (1 - beta1) * g)
    p      = p - lr * (update + weight_decay * p)      (decoupled weight decay)
    m      = beta2 * m + (1 - beta2) * g

computed as the reference PyTorch implementation (lucidrains/lion-pytorch) and optax order it:
``p * (1 - lr * weight_decay) - lr * update``, the decay factor computed once per step, as
AdamW's. The state is ``exp_avg`` (m), zeros before the first step. ``sign`` is NumPy's
(NaN stays NaN, zero gives 0), in CUDA a helper only kernels that call it carry
(`gpuscalar.lazy.codegen.CUDA_HELPERS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..lazy.rules import sign, symbols
from ..scalar import GPUScalar
from .base import BETAS, WEIGHT_DECAY, Optimizer
from .checks import betas_pair, check_skip, hyper, step_arrays
from .executors import run_program
from .program import Program, register

__all__ = ["LION", "lion_step", "Lion"]


def _program() -> Program:
    """Lion's update, decoupled weight decay."""
    lr, beta1, beta2, weight_decay, decay = symbols("lr beta1 beta2 weight_decay decay")
    param, grad, exp_avg, c = symbols("param grad exp_avg c")
    return Program(
        name="lion",
        scalars=("lr", "beta1", "beta2", "weight_decay"),
        arrays=("param", "grad", "exp_avg"),
        prelude=(("decay", 1 - lr * weight_decay),),
        body=(
            ("c", beta1 * exp_avg + (1 - beta1) * grad),
            ("p", param * decay - lr * sign(c)),
            ("m", beta2 * exp_avg + (1 - beta2) * grad),
        ),
        outputs=(("param", "p"), ("exp_avg", "m")),
    )


#: Lion's update, decoupled weight decay.
LION = _program()
register(LION)


def lion_step(
    param: Any,
    grad: Any,
    exp_avg: Any,
    *,
    lr: Any = 1e-4,
    betas: tuple[Any, Any] = (0.9, 0.99),
    weight_decay: Any = 0.0,
    skip_if: GPUScalar | None = None,
) -> None:
    """One Lion update of ``param`` and its momentum ``exp_avg``, in place (see the module
    doc). Hyperparameters may be Python numbers or GPUScalars. One fused kernel (one device
    op), no sync; ``skip_if``: a bool GPUScalar, when true on the device nothing changes."""
    backend, device = step_arrays(param, grad, exp_avg=exp_avg)
    beta1, beta2 = betas_pair(betas, backend, device)
    scalars = {
        "lr": hyper(lr, "lr", backend, device),
        "beta1": beta1,
        "beta2": beta2,
        "weight_decay": hyper(weight_decay, "weight_decay", backend, device),
    }
    skip = check_skip(skip_if, backend, device)
    run_program(backend, LION, scalars, {"param": param, "grad": grad, "exp_avg": exp_avg}, skip)


class Lion(Optimizer):
    """Fused multi-tensor Lion on the user's arrays (decoupled weight decay). State:
    ``exp_avg``."""

    _hyperparameters = ("lr", "betas", "weight_decay")

    betas = BETAS
    weight_decay = WEIGHT_DECAY

    def __init__(
        self,
        params: Sequence[Any],
        lr: Any = 1e-4,
        betas: tuple[Any, Any] = (0.9, 0.99),
        weight_decay: Any = 0,
    ) -> None:
        super().__init__(params, lr, LION, betas=betas, weight_decay=weight_decay)
