"""`gpuscalar.sync.describe`: naming a user's value in a message without reading it (issue 15).

Formatting a GPUScalar (``f"{value}"``, ``{value!r}``) reads it from the device: a hidden sync,
and under ``sync_guard("error")`` a `SyncError` in place of the message meant for the user. The
messages of each module are tested where that module's other bad input is; here are the
function itself and the pytest plugin's marker errors.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import pytest_plugin, strict, sync


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, "3"), (2.5, "2.5"), ("fast", "'fast'"), (None, "None"), (True, "True"),
     (np.float32(1.5), repr(np.float32(1.5))),
     (np.zeros((2, 3), np.float32), "a numpy.ndarray of shape (2, 3) and dtype float32"),
     (np.zeros((), np.int8), "a numpy.ndarray of dtype int8"),
     ((1, 2.0), "a tuple of 2 (1, 2.0)"), ([], "a list of 0 ()"), (object(), "an object")],
    ids=lambda v: type(v).__name__,
)
def test_host_values_are_shown_and_others_named(value, expected):
    assert sync.describe(value) == expected


@pytest.mark.needs_cupy  # count_syncs(include_cupy=True)
def test_device_values_are_named_by_type_and_dtype_without_a_sync():
    pending = gs.asscalar(2.0, like=strict.xp.zeros(1)) * 3  # a pending expression
    values = [gs.asscalar(np.float32(1.0)), pending, strict.xp.zeros(3),
              [1, gs.asscalar(2)]]
    with gs.sync_guard("error"), gs.count_syncs(include_cupy=True) as counter:
        names = [sync.describe(v) for v in values]
    assert names == ["a GPUScalar of dtype float32", "a GPUScalar of dtype float64",
                     "a StrictArray of shape (3,) and dtype float64",
                     "a list of 2 (1, a GPUScalar of dtype int64)"]
    assert counter.count == 0 and counter.device_ops == 0
    assert not pending.is_materialized


def _item(marker: pytest.Mark) -> types.SimpleNamespace:
    return types.SimpleNamespace(get_closest_marker=lambda name: marker)


@pytest.mark.parametrize(
    ("marker", "error", "match"),
    [(pytest.mark.max_syncs(gs.asscalar(3)), TypeError,
      "takes an int, got a GPUScalar of dtype int64"),
     (pytest.mark.max_syncs(gs.asscalar(3), 4), TypeError,
      r"exactly one argument, the limit n; got max_syncs\(a GPUScalar of dtype int64, 4\)"),
     (pytest.mark.max_syncs(limit=gs.asscalar(3)), TypeError,
      r"got max_syncs\(limit=a GPUScalar of dtype int64\)"),
     (pytest.mark.max_syncs(2.5), TypeError, "takes an int, got float 2.5")],
    ids=["device-limit", "two-arguments", "keyword", "float"],
)
def test_max_syncs_marker_errors_name_device_values_without_a_sync(marker, error, match):
    with gs.sync_guard("error"), pytest.raises(error, match=match):
        pytest_plugin._max_syncs(_item(marker.mark))
