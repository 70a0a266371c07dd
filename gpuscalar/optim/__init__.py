"""Fused optimizer steps on the user's own arrays, sync-free clipping and on-device skipping.

Why this package exists: an optimizer step is where device scalars pay off or are wasted. A
learning-rate schedule, Adam's bias correction from the step count, a clipping coefficient from
the gradient norm, a "skip this step, the gradients overflowed" flag: in most Python code each of
these is a Python float or bool, so computing it from device values costs a synchronization per
step. Here every hyperparameter may be a `GPUScalar`, read by the kernel on the device, and
nothing is ever read back to the host.

One file per idea (this module only re-exports):
  program.py       update rules as data (`Program` of `gpuscalar.lazy.rules` nodes), scalar
                   kinds, the host evaluator
  kernels.py       CUDA source generation (update, step-counter and address-table kernels)
  executors.py     the "steps" executor protocol, asked of each backend once (the host and
                   CUDA executors live in the device wings); `route`: how a kernel receives
                   each scalar
  multi_tensor.py  dtype groups, state buffers, address and block tables
  checks.py        validation of arrays, hyperparameters and ``skip_if``
  base.py          `Optimizer`: hyperparameter descriptors, the step, state_dict
  clip.py          `clip_grad_norm`, `all_finite`
  adam.py, sgd.py, rmsprop.py, lion.py   one algorithm each: Programs, class, functional step
A new optimizer is one file plus one import line here (its Programs `register` themselves, so
the kernel tests compile them). This module exports only what a user calls: the optimizer
classes, their functional steps, `clip_grad_norm`, `all_finite` and `Optimizer` (the base a
user subclasses or type-annotates with). The generated kernels' description (``Program``, the
Programs ``ADAM``/``SGD_*``/``LION``/``RMSPROP_PROGRAMS``, ``PROGRAMS``, ``kernel_source``,
the ``ADDRESS_*``/``MULTI_TENSOR_*`` constants, ``route``, ``run_program``) is imported from
its own module (``program``, ``kernels``, ``executors``, ``adam``, ...); the names this
module exported before the split stay importable here, outside ``__all__``.
"""

from __future__ import annotations

# Besides the names in __all__: the kernel internals this module exported before the split
# (Programs, kernel sources and constants), outside __all__, importable here for older code
# (tests/test_optim_layout.py); new code imports them from their own modules.
from .adam import ADAM, ADAMW, Adam, AdamW, adam_step  # noqa: F401
from .base import Optimizer
from .clip import all_finite, clip_grad_norm
from .kernels import (  # noqa: F401
    ADDRESS_CHUNK,
    ADDRESS_STRUCT,
    KERNEL_DTYPES,
    POINTER_CTYPES,
    address_table_source,
    counter_source,
    kernel_source,
)
from .lion import LION, Lion, lion_step  # noqa: F401
from .program import COUNTER_READS, PROGRAMS, Program  # noqa: F401
from .rmsprop import RMSPROP_PROGRAMS, RMSprop, rmsprop_step  # noqa: F401
from .sgd import SGD, SGD_MOMENTUM, SGD_NESTEROV, SGD_PLAIN, sgd_step  # noqa: F401

__all__ = [
    "Optimizer",
    "Adam",
    "AdamW",
    "SGD",
    "RMSprop",
    "Lion",
    "adam_step",
    "sgd_step",
    "rmsprop_step",
    "lion_step",
    "clip_grad_norm",
    "all_finite",
]
