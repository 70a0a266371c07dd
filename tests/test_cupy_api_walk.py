"""Every public name is covered by a CuPy dispatch test, or listed here as not touching the device.

Why: the CuPy dispatch tests (tests/test_cupy_seam.py and the others that run gpuscalar on
CuPy objects through `tests.cupy_seam`) are only worth what they cover. This walks the public
API (``gs.__all__``, ``gs.optim.__all__``, ``gs.ad.__all__``, the CLI subcommands) and fails
for a name that no dispatch test covers (`tests.cupy_seam.covers`, or `MAPPED` for tests that
do not use the decorator) and that is not in `NOT_DEVICE` with a reason. A new public function
thus needs a dispatch test (or a reviewed reason) before it ships.
"""

from __future__ import annotations

import importlib

import gpuscalar as gs
from gpuscalar import __main__ as cli
from gpuscalar import ad, optim

from .cupy_seam import COVERED

#: the test modules whose tests are marked with `covers` (imported so the marks are collected)
DISPATCH_MODULES = ("tests.test_cupy_seam", "tests.test_cupy_into", "tests.test_cupy_workloads",
                    "tests.test_optim_rmsprop_lion", "tests.test_control_cuda",
                    "tests.test_cupy_metrics", "tests.test_sparse")

#: public name -> (module, test) of a dispatch test that covers it without the decorator
_WORKLOADS = "tests.test_cupy_workloads"
MAPPED: dict[str, tuple[str, str]] = {
    "cli bench": (_WORKLOADS, "test_workload_paths_run_end_to_end_on_cupy_objects"),
    "cli demo": (_WORKLOADS, "test_demo_paths_run_end_to_end_on_cupy_objects"),
}

_CONFIG = "configuration or accounting, on the host: no array, no device work"
_TYPE = "a class or exception used in annotations and isinstance checks; makes no device call"

#: public names that do not touch the device, with the reason
NOT_DEVICE: dict[str, str] = {
    "gs.__version__": "a string",
    "gs.set_cache_size": "sets a bound on Python-side caches (tested in tests/test_expr.py)",
    "gs.cache_size": "reads that bound",
    "gs.Backend": _TYPE,
    "gs.Rule": _TYPE + " (a promotion rule of gpuscalar.promote)",
    "gs.SyncCounter": _TYPE,
    "gs.SyncError": _TYPE,
    "gs.SyncRecord": _TYPE,
    "gs.SyncSite": _TYPE,
    "gs.SyncWarning": _TYPE,
    "gs.count_syncs": _CONFIG,
    "gs.total_syncs": _CONFIG,
    "gs.sync_guard": _CONFIG + " (CuPy's own sync hook is tested in tests/test_sync.py)",
    "gs.default_backend": "asks CUDA for a device count only (tested in tests/test_backend.py)",
    "gs.gpu_available": "asks CUDA for a device count only (tested in tests/test_backend.py)",
    "gs.get_backend": "a lookup by name; imports CuPy at most",
    "gs.strict": "the CuPy-strict CPU device module: never CuPy",
    "gs.optim": "a module: its names are walked below",
    "gs.linalg": "a module: its names are walked below",
    "gs.distributed": "a module: all_reduce runs under mpiexec on NumPy, strict and CuPy over "
                      "fake device memory, and on NCCL through a recording communicator double "
                      "on the recording seam (tests/test_distributed.py)",
    "gs.progress": "draws a bar from rows a MetricLog already brought to the host (the log's "
                   "own device work is covered by tests/test_cupy_metrics.py): no device call",
    "cli profile": "runs the user's script under the sync profiler; the device work in it is "
                   "the user's and that of the gpuscalar names above",
}


def _public_names() -> list[str]:
    names = [f"gs.{name}" for name in gs.__all__]
    names += [f"optim.{name}" for name in optim.__all__]
    names += [f"linalg.{name}" for name in gs.linalg.__all__]
    names += [f"ad.{name}" for name in ad.__all__]
    names += [f"cli {name}" for name in cli.SUBCOMMANDS]
    return names


def _covered() -> dict[str, list[str]]:
    for module in DISPATCH_MODULES:
        importlib.import_module(module)
    return COVERED


def test_every_public_name_has_a_dispatch_test_or_a_reason():
    covered = _covered()
    missing = [name for name in _public_names()
               if name not in covered and name not in MAPPED and name not in NOT_DEVICE]
    assert not missing, (
        f"public names no CuPy dispatch test covers: {missing}; add a test through "
        "tests/cupy_seam.py marked @covers(name), or a reason in NOT_DEVICE")


def test_the_lists_name_only_public_names_and_existing_tests():
    public = set(_public_names())
    stale = sorted((set(_covered()) | set(MAPPED) | set(NOT_DEVICE)) - public)
    assert not stale, f"names that are not public (renamed or removed?): {stale}"
    both = sorted(set(NOT_DEVICE) & (set(_covered()) | set(MAPPED)))
    assert not both, f"listed as not touching the device, yet covered: {both}"
    for name, (module, test) in MAPPED.items():
        assert callable(getattr(importlib.import_module(module), test, None)), (name, test)
