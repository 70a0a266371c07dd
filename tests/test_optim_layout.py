"""The layout of gpuscalar.optim (issue 16): one file per idea, the executor chosen once.

Why this file exists: the split is a design rule, not a behaviour, so nothing else would notice
it eroding: a backend branch creeping back into an algorithm's file, a module growing past
~800 lines, or a name users import disappearing.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import gpuscalar as gs
from gpuscalar import optim
from gpuscalar.devices.host.steps import HostExecutor
from gpuscalar.optim import executors
from gpuscalar.optim.program import PROGRAMS

OPTIM = pathlib.Path(optim.__file__).parent
#: the modules that must not ask which backend they run on (the executors decide)
NO_BACKEND_BRANCH = ("adam", "sgd", "rmsprop", "lion", "base", "clip", "checks", "multi_tensor",
                     "program", "kernels", "executors")
#: every name `gpuscalar.optim` exported before the split
IMPORTED_BEFORE = (
    "Program ADAM ADAMW SGD_PLAIN SGD_MOMENTUM SGD_NESTEROV PROGRAMS KERNEL_DTYPES POINTER_CTYPES "
    "COUNTER_READS kernel_source counter_source address_table_source ADDRESS_CHUNK ADDRESS_STRUCT "
    "adam_step sgd_step clip_grad_norm all_finite Optimizer Adam AdamW SGD"
).split()


def _source(module: str) -> str:
    return (OPTIM / f"{module}.py").read_text()


@pytest.mark.parametrize("module", NO_BACKEND_BRANCH)
def test_no_backend_branch_outside_the_executors(module):
    tree = ast.parse(_source(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            assert node.attr != "evaluates_on_host", f"{module}.py:{node.lineno}"
        if isinstance(node, ast.Name):
            assert node.id not in ("NUMPY", "CUPY"), f"{module}.py:{node.lineno}"


def test_no_module_is_over_800_lines_and_init_only_reexports():
    for path in OPTIM.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 800, path.name
    tree = ast.parse(_source("__init__"))
    assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def test_every_name_users_imported_still_imports():
    for name in IMPORTED_BEFORE:
        assert getattr(optim, name) is not None, name
    for name in optim.__all__:
        assert hasattr(optim, name), name
    for name in ("RMSprop", "Lion", "rmsprop_step", "lion_step"):
        assert name in optim.__all__


def test_the_executor_is_chosen_once_per_backend():
    numpy, strict = gs.get_backend("numpy"), gs.get_backend("strict")
    host = executors.executor_for(numpy)
    assert executors.executor_for(numpy) is host and isinstance(host, HostExecutor)
    assert host is numpy.executor("steps")  # the device's "steps" slot
    assert host.plain_numpy and not host.contiguous
    # the strict device evaluates on the host (the same evaluator) but keeps CuPy's layout rule
    strict_host = executors.executor_for(strict)
    assert isinstance(strict_host, HostExecutor) and strict_host is strict.executor("steps")
    assert strict_host.contiguous and not strict_host.plain_numpy


def test_a_new_algorithm_registers_its_programs():
    """Each algorithm file registers its Programs (the kernel tests walk PROGRAMS)."""
    names = {program.name for program in PROGRAMS}
    for module, expected in (("adam", {"adam", "adamw"}), ("lion", {"lion"}),
                             ("sgd", {"sgd", "sgd_momentum", "sgd_nesterov"}),
                             ("rmsprop", {"rmsprop", "rmsprop_momentum", "rmsprop_centered",
                                          "rmsprop_centered_momentum"})):
        importlib.import_module(f"gpuscalar.optim.{module}")
        assert expected <= names, module
    assert len(names) == len(PROGRAMS)  # registered once each
