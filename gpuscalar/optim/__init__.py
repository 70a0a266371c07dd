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
  executors.py     host (NumPy) or CUDA (the launch seam) execution, chosen once per backend;
                   `route`: how a kernel receives each scalar
  multi_tensor.py  dtype groups, state buffers, address and block tables
  checks.py        validation of arrays, hyperparameters and ``skip_if``
  base.py          `Optimizer`: hyperparameter descriptors, the step, state_dict
  clip.py          `clip_grad_norm`, `all_finite`
  adam.py, sgd.py, rmsprop.py, lion.py   one algorithm each: Programs, class, functional step
A new optimizer is one file plus one import line here (its Programs `register` themselves, so
the kernel tests compile them). ``Program``, ``PROGRAMS`` and ``kernel_source`` describe the
generated kernels, not the optimizers' API; ``_route``, ``_run_program`` and the
``MULTI_TENSOR_*`` constants stay importable here for the tests and benchmarks.
"""

from __future__ import annotations

from .adam import ADAM, ADAMW, Adam, AdamW, adam_step
from .base import Optimizer
from .clip import all_finite, clip_grad_norm
from .executors import route as _route  # noqa: F401
from .executors import run_program as _run_program  # noqa: F401
from .kernels import (  # noqa: F401
    ADDRESS_CHUNK,
    ADDRESS_STRUCT,
    KERNEL_DTYPES,
    MULTI_TENSOR_BLOCK,
    MULTI_TENSOR_CHUNK,
    MULTI_TENSOR_ILP,
    POINTER_CTYPES,
    address_table_source,
    counter_source,
    kernel_source,
)
from .lion import LION, Lion, lion_step
from .program import COUNTER_READS, PROGRAMS, Program
from .rmsprop import RMSPROP_PROGRAMS, RMSprop, rmsprop_step
from .sgd import SGD, SGD_MOMENTUM, SGD_NESTEROV, SGD_PLAIN, sgd_step

__all__ = [
    "Program",
    "ADAM",
    "ADAMW",
    "SGD_PLAIN",
    "SGD_MOMENTUM",
    "SGD_NESTEROV",
    "PROGRAMS",
    "KERNEL_DTYPES",
    "POINTER_CTYPES",
    "COUNTER_READS",
    "kernel_source",
    "counter_source",
    "address_table_source",
    "ADDRESS_CHUNK",
    "ADDRESS_STRUCT",
    "adam_step",
    "sgd_step",
    "clip_grad_norm",
    "all_finite",
    "Optimizer",
    "Adam",
    "AdamW",
    "SGD",
    "RMSprop",
    "Lion",
    "rmsprop_step",
    "lion_step",
    "RMSPROP_PROGRAMS",
    "LION",
]
