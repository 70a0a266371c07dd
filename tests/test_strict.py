"""The CuPy-strict CPU device: CuPy's refusals, declared syncs, device ops, devices, bad input."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict, sync
from gpuscalar.devices.strict import random as strict_random
from gpuscalar.strict import xp

from .helpers import host


def library_counter() -> sync.SyncCounter:
    """A counter that sees the device's own reads (what count_syncs(include_cupy=True) gives,
    without needing CuPy installed)."""
    return sync.SyncCounter(include_cupy=True)


# ---- what CuPy refuses, the strict device refuses -----------------------------------------------


@pytest.mark.parametrize(
    "implicit",
    [np.asarray, np.array, lambda x: np.testing.assert_allclose(x, np.ones(3)),
     lambda x: pytest.approx(x) == np.ones(3), lambda x: np.ones(3) + x,
     lambda x: np.concatenate([np.ones(1), x])],
    ids=["asarray", "array", "assert_allclose", "approx", "host-operand", "mixed-function"],
)
def test_implicit_host_conversion_is_a_type_error(implicit):
    x = xp.ones(3)
    with pytest.raises(TypeError, match=r"Implicit conversion|Unsupported type"):
        implicit(x)


def test_the_refusal_uses_cupys_words():
    with pytest.raises(TypeError) as info:
        np.asarray(xp.zeros(2))
    assert str(info.value) == strict.IMPLICIT_MESSAGE
    assert "`.get()`" in str(info.value)


def test_strict_arrays_are_made_through_the_namespace_only():
    with pytest.raises(TypeError, match="xp.asarray"):
        strict.StrictArray(np.ones(2))
    with pytest.raises(TypeError, match="cannot make a strict array"):
        xp.asarray(gs.strict.Device(0))  # not array data


# ---- explicit reads are declared syncs ----------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "expected"),
    [(lambda x: x.get(), [0.0, 1.0, 2.0, 3.0]), (lambda x: x.tolist(), [0.0, 1.0, 2.0, 3.0]),
     (lambda x: x.sum().item(), 6.0), (lambda x: float(x[1]), 1.0), (lambda x: int(x[2]), 2),
     (lambda x: bool(x[3] > 2), True), (lambda x: complex(x[1]), 1 + 0j),
     (lambda x: f"{x.sum():.1f}", "6.0"), (lambda x: [10, 20, 30][x.astype(int)[1]], 20),
     (lambda x: xp.asnumpy(x).tolist(), [0.0, 1.0, 2.0, 3.0])],
    ids=["get", "tolist", "item", "float", "int", "bool", "complex", "format", "index",
         "asnumpy"],
)
def test_each_explicit_read_is_one_declared_sync(read, expected):
    x = xp.asarray(np.arange(4.0))
    counter = library_counter()
    with sync._activate(counter):
        value = read(x)
    value = value.tolist() if isinstance(value, np.ndarray) else value
    assert value == expected
    assert counter.count == 1 and [r.reason for r in counter.records] == ["cupy"]
    assert counter.records[0].filename == __file__  # the user's line, not strict.py


def test_device_reads_are_invisible_to_plain_counters_as_cupys_are():
    x = xp.ones(2)
    with gs.count_syncs() as plain:
        float(x.sum())
    assert plain.count == 0 and plain.device_ops == 1


def test_device_reads_obey_the_guard_while_a_library_counter_is_active():
    x = xp.ones(2)
    with sync._activate(library_counter()), gs.sync_guard("error"):
        with pytest.raises(gs.SyncError, match=r"\(cupy\) at .*test_strict.py"):
            float(x.sum())
        with pytest.raises(gs.SyncError):
            x.get()


def test_a_gpuscalar_read_is_counted_once():
    s = gs.sum(xp.ones(3))
    counter = library_counter()
    with sync._activate(counter):
        assert float(s) == 3.0
    assert [r.reason for r in counter.records] == ["float"]


def test_boolean_mask_indexing_and_nonzero_sync_as_in_cupy():
    x = xp.asarray(np.arange(5.0))
    counter = library_counter()
    with sync._activate(counter):
        picked = x[x > 2]
        (where,) = xp.nonzero(x > 3)
        (again,) = (x > 3).nonzero()
    assert counter.count == 3
    assert picked.get().tolist() == [3.0, 4.0] and where.get().tolist() == [4]
    assert again.get().tolist() == [4]


def test_reads_of_several_elements_are_refused_like_numpy():
    with pytest.raises(TypeError, match=r"size-1.*\(3,\)"):
        float(xp.ones(3))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(xp.ones(3))
    with pytest.raises(TypeError, match="integer"):
        [1, 2][xp.asarray(1.0)]


# ---- reductions, views and device ops -----------------------------------------------------------


def test_reductions_return_zero_d_device_arrays():
    x = xp.asarray(np.arange(6.0).reshape(2, 3))
    for result in (x.sum(), x.max(), xp.mean(x), np.sum(x), xp.linalg.norm(x), x[1, 2],
                   xp.count_nonzero(x)):
        assert type(result) is strict.StrictArray and result.shape == ()


def test_every_array_library_call_is_one_device_op_and_views_are_free():
    x = xp.asarray(np.arange(6.0))
    with gs.count_syncs() as counter:
        y = x * 2.0            # ufunc (operator)
        y += 1.0               # in-place ufunc
        total = y.sum()        # method reduction
        n = np.linalg.norm(y)  # NumPy function through __array_function__: ONE op
        z = xp.stack([x, y])   # namespace function
        view = z.T[1:, ::2]    # views: no device work
        flat = z.reshape(-1)
        first = x[0]
        z[0, 1:3] = 5.0        # assignment
        picked = x[xp.asarray([0, 2])]  # advanced indexing: a gather
    assert counter.device_ops == 8 and counter.count == 0
    assert view.shape == (5, 1) and flat.shape == (12,) and first.shape == ()
    assert (total.get(), picked.get().tolist()) == (36.0, [0.0, 2.0])
    assert n.get() == pytest.approx(np.linalg.norm(np.arange(6.0) * 2 + 1))


def test_gpuscalar_ops_are_counted_once_however_numpy_implements_them():
    y = xp.ones(4)
    s = gs.mean(y)
    with gs.count_syncs() as counter, gs.lazy(False):
        t = s + s              # gpuscalar's inlined hot path
        u = gs.sqrt(t)         # Backend.call
        z = y * u              # promotion rule 1, one ufunc
        norm = gs.global_norm([y, z])
    assert counter.device_ops == 3 + 4  # global_norm: the slot vector, two shares, the norm
    assert counter.count == 0
    with gs.count_syncs() as counter:  # lazy: t and u are computed inside y * u's kernel
        z = y * gs.sqrt(s + s)
        norm = gs.global_norm([y, z])
    assert counter.device_ops == 1 + 4 and counter.count == 0
    assert float(norm) == pytest.approx(np.sqrt(4 + 4 * 2.0))


def test_namespace_ufuncs_defer_to_gpuscalars():
    s = gs.asscalar(4.0, like=xp.zeros(1))
    with gs.count_syncs() as counter, gs.lazy(False):
        root = xp.sqrt(s)
    assert isinstance(root, gs.GPUScalar) and counter.device_ops == 1
    assert root.backend is strict.STRICT and root.item() == 2.0
    from_number = xp.sqrt(9.0)  # as cupy.sqrt(9.0): a 0-d device array
    assert type(from_number) is strict.StrictArray and from_number.item() == 3.0


def test_asarray_returns_the_same_array_when_nothing_changes():
    x = xp.ones(3)
    with gs.count_syncs() as counter:
        same = xp.asarray(x)
        cast = xp.asarray(x, dtype=np.float32)
    assert same is x and cast.dtype == np.float32 and counter.device_ops == 1


# ---- devices ------------------------------------------------------------------------------------


def test_arrays_live_on_the_current_device():
    assert xp.zeros(2).device.id == 0
    with strict.device(2) as current:
        made = xp.ones(2)
        derived = made * 2
    assert current.id == 2 and made.device.id == 2 and derived.device.id == 2
    assert xp.asarray([1.0], device=3).device.id == 3
    assert xp.zeros(1, device=1).device.id == 1
    assert xp.zeros(1).device.id == 0  # restored


def test_operands_on_different_devices_are_an_error_naming_both():
    a, b = xp.ones(2, device=0), xp.ones(2, device=1)
    with pytest.raises(ValueError, match=r"different strict devices \(0 and 1\)"):
        a + b
    with pytest.raises(ValueError, match="different strict devices"):
        xp.stack([a, b])
    moved = xp.asarray(b, device=0)  # explicit copy
    assert (a + moved).get().tolist() == [2.0, 2.0]


@pytest.mark.parametrize("bad", [-1, 1.5, "0", None])
def test_bad_device_ids_are_rejected(bad):
    with pytest.raises(ValueError, match="strict device id"):
        with strict.device(bad):
            pass  # pragma: no cover - not reached


def test_a_device_id_on_the_device_is_named_without_a_sync():
    with gs.sync_guard("error"), pytest.raises(
            ValueError, match="strict device id is an int >= 0, got a GPUScalar of dtype int64"):
        with strict.device(gs.asscalar(1)):
            pass  # pragma: no cover - not reached


def test_host_array_assignment_through_a_plain_index_is_refused_as_in_cupy():
    x = xp.zeros(3)
    for host_data in (np.arange(3.0), [1.0, 2.0, 3.0]):
        with pytest.raises(ValueError, match=r"non-scalar numpy\.ndarray cannot be used for "
                                             r"fill \(upload host data with x\.set"):
            x[...] = host_data
    assert x.get().tolist() == [0.0, 0.0, 0.0]
    with gs.count_syncs() as counter:
        x[...] = np.float64(2.0)  # a scalar fills, as in CuPy
        x[1:] = 5.0
    assert counter.device_ops == 2 and x.get().tolist() == [2.0, 5.0, 5.0]


def test_set_uploads_and_checks_as_cupy_does():
    x = xp.zeros(3)
    with gs.count_syncs() as counter:
        x.set(np.arange(3.0))
    assert counter.device_ops == 1 and x.get().tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(TypeError, match="Only numpy.ndarray can be set"):
        x.set([1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="float32 array cannot be set to float64 array"):
        x.set(np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match=r"Shape mismatch. Old shape: \(3,\), new shape: "
                                         r"\(2,\)"):
        x.set(np.ones(2))
    with pytest.raises(RuntimeError, match="Cannot set to non-contiguous array"):
        xp.zeros((3, 3))[:, 1].set(np.ones(3))
    assert x.get().tolist() == [0.0, 1.0, 2.0]


def test_an_advanced_index_uploads_host_values_as_cupy_does():
    x = xp.zeros(4)
    x[xp.asarray([0, 2])] = np.array([5.0, 6.0])
    x[[1, 3]] = 7.0  # a host index list: CuPy uploads it
    assert x.get().tolist() == [5.0, 7.0, 6.0, 7.0]


# ---- inside a captured step's body: what CuPy refuses while its stream captures ------------------


def _uploads():
    x = xp.zeros(3)
    return x, {
        "asarray": lambda: xp.asarray(np.ones(3)),
        "array-of-a-list": lambda: xp.array([1.0, 2.0, 3.0]),
        "asarray-empty": lambda: xp.asarray(np.ones(0)),
        "set": lambda: x.set(np.ones(3)),
        "backend-upload": lambda: strict.STRICT.upload(x, np.ones(3)),
        "host-index-list": lambda: x.__setitem__([0, 1], 1.0),
        "host-index-array": lambda: x.__setitem__(np.array([0, 1]), xp.ones(2)),
    }


@pytest.mark.parametrize("name", list(_uploads()[1]))
def test_host_to_device_copies_are_refused_in_a_graph_body_with_cupys_words(name):
    x, uploads = _uploads()
    uploads[name]()  # outside a step's body: an upload like any other
    x[...] = 0.0
    with sync.graph_body(), pytest.raises(RuntimeError) as raised:
        uploads[name]()
    assert str(raised.value) == strict.H2D_CAPTURE_MESSAGE
    assert x.get().tolist() == [0.0, 0.0, 0.0]  # refused before anything was written


def test_zero_d_values_are_made_in_a_graph_body_as_cupy_fills_them():
    x = xp.zeros(3)
    with sync.graph_body(), gs.count_syncs() as counter:
        made = [xp.asarray(2.0), xp.asarray(np.float32(1.5)), xp.full(3, 4.0),
                gs.asscalar(3.0, like=x)]
        x[...] = 3.0
        x[0] = np.float64(1.0)
    assert counter.count == 0 and host(made[0]) == 2.0 and float(made[3]) == 3.0
    assert x.get().tolist() == [1.0, 3.0, 3.0]


@pytest.mark.parametrize(
    "product",
    [lambda a, b: a @ b, lambda a, b: xp.matmul(a, b), lambda a, b: np.matmul(a, b),
     lambda a, b: xp.dot(a, b), lambda a, b: np.dot(a, b), lambda a, b: a.dot(b),
     lambda a, b: xp.inner(a, b), lambda a, b: xp.vdot(a, b),
     lambda a, b: xp.tensordot(a, b, axes=1)],
    ids=["@", "xp.matmul", "np.matmul", "xp.dot", "np.dot", "method-dot", "inner", "vdot",
         "tensordot"],
)
def test_float_matrix_products_are_refused_in_a_graph_body_as_cupys_cublas(product):
    a, b = xp.ones((2, 2)), xp.ones((2, 2))
    assert product(a, b).get().sum() > 0  # outside a step's body: computed
    with sync.graph_body():
        with pytest.raises(NotImplementedError) as raised:
            product(a, b)
        message = str(raised.value)
        assert message.startswith(strict.CUBLAS_CAPTURE_MESSAGE + " (CuPy's ")
        assert "cuBLAS call, refused while a graph is recorded" in message
        assert "gs.matmul" in message or "gs.dot" in message or "gs.vdot" in message
        integers = xp.ones((2, 2), dtype=np.int64)
        assert product(integers, integers).get().sum() > 0  # CuPy's own kernel, no cuBLAS
        assert host(gs.matmul(a, b)).sum() == 8.0  # gpuscalar's capturable product


def test_a_product_with_a_zero_d_operand_is_a_multiply_in_a_graph_body():
    with sync.graph_body():
        assert xp.dot(xp.ones(3), xp.asarray(2.0)).get().tolist() == [2.0, 2.0, 2.0]


# ---- interop and pickling -----------------------------------------------------------------------


def test_dlpack_exports_without_a_transfer():
    x = xp.asarray(np.arange(3.0))
    counter = library_counter()
    with sync._activate(counter):
        shared = np.from_dlpack(x)
    assert counter.count == 0 and shared.tolist() == [0.0, 1.0, 2.0]
    assert x.__dlpack_device__() == (1, 0)  # the data really is host memory


def test_pickling_reads_explicitly_and_restores_the_device():
    x = xp.asarray([1.0, 2.0], device=1)
    counter = library_counter()
    with sync._activate(counter):
        data = pickle.dumps(x)
    restored = pickle.loads(data)
    assert counter.count == 1
    assert restored.device.id == 1 and restored.get().tolist() == [1.0, 2.0]


def test_repr_is_a_sync_and_names_the_device():
    x = xp.asarray([1.5], device=2)
    counter = library_counter()
    with sync._activate(counter):
        text = repr(x)
    assert text == "strict_array([1.5], device=2)" and counter.count == 1


def test_the_backend_is_registered_and_named():
    assert gs.get_backend("strict") is strict.STRICT
    assert gs.devices.backend_of(xp.ones(1)) is strict.STRICT
    assert "strict device" in gs.devices.describe(strict.STRICT)


# ---- CuPy's concatenate through a host-built pointer table (issue 15) ----------------------


@pytest.mark.parametrize("join", [
    lambda arrays: xp.stack(arrays), lambda arrays: np.stack(arrays),
    lambda arrays: xp.concatenate([a.reshape(1) for a in arrays]),
    lambda arrays: xp.hstack(arrays),
], ids=["xp.stack", "np.stack", "concatenate", "hstack"])
def test_joining_more_than_eight_small_same_dtype_arrays_is_an_upload_in_a_graph_body(join):
    """CuPy 14's ``_concatenate`` joins more than 8 inputs of the result's dtype (under 2 MiB
    each on average) in one kernel reading a table of their pointers, copied from the host
    (``core.array(ptrs)``): refused while capturing, so refused in a step's body."""
    nine = [xp.asarray(float(i)) for i in range(9)]
    assert join(nine).shape == (9,)  # outside a body: allowed, as in CuPy
    with sync.graph_body(), pytest.raises(RuntimeError) as raised:
        join(nine)
    assert str(raised.value) == strict.H2D_CAPTURE_MESSAGE


@pytest.mark.parametrize("arrays", [
    [xp.asarray(float(i)) for i in range(8)],  # 8 inputs: one copy kernel each in CuPy
    [xp.asarray(float(i)) for i in range(8)] + [xp.asarray(1, dtype=np.int32)],  # mixed dtypes
    [xp.zeros(300_000) for _ in range(9)],  # 2.4 MB each: one copy kernel each
], ids=["eight", "mixed-dtypes", "large"])
def test_joins_cupy_does_with_copy_kernels_are_allowed_in_a_graph_body(arrays):
    with sync.graph_body():
        joined = xp.concatenate([a.reshape(-1) for a in arrays])
    assert joined.shape == (sum(a.size for a in arrays),)


def test_a_join_into_out_of_another_dtype_is_allowed_in_a_graph_body():
    """With ``out`` (or ``dtype``) of another dtype than the inputs, CuPy copies each input."""
    nine = [xp.ones(2, dtype=np.float32) for _ in range(9)]
    out = xp.zeros(18)
    with sync.graph_body():
        xp.concatenate(nine, 0, out)
        xp.concatenate(nine, dtype=np.float64)
    with sync.graph_body(), pytest.raises(RuntimeError, match="H2D"):
        xp.concatenate(nine, dtype=np.float32)


# ---- CuPy's rules for a GPUScalar handed to CuPy (issue 15; tests/test_cupy_into.py) ------------


def test_fill_with_a_device_value_is_a_declared_sync_as_in_cupy():
    """CuPy 14's ``fill`` compares a device value with 0 and reads the answer back; ``x[...] =
    s`` and ``copyto`` copy on the device."""
    x = xp.zeros(3)
    s = gs.asscalar(2.0, like=x)
    counter = library_counter()
    with sync._activate(counter):
        x.fill(s)
        x.fill(xp.asarray(np.float64(1.0)))
        x.fill(2.0)  # a host number: compared on the host, no sync
        x[...] = s
        xp.copyto(x, s)
    assert [r.reason for r in counter.records] == ["cupy", "cupy"]
    np.testing.assert_array_equal(host(x), [2.0, 2.0, 2.0])
    with sync._activate(library_counter()), gs.sync_guard("error"):
        with pytest.raises(gs.SyncError):
            x.fill(s)


def test_where_and_clip_with_a_gpuscalar_take_its_promotion_rules():
    """CuPy's where/clip kernels hand a GPUScalar to its hook (the scalar is weak, as the
    Python number it replaces); NumPy would take it as a strong float64 0-d array."""
    x = xp.asarray(np.array([0.5, 3.0], dtype=np.float32))
    s = gs.asscalar(2.0, like=x, dtype=np.float64)
    condition = x > 1
    assert xp.where(condition, x, s).dtype == np.float32
    assert xp.clip(x, 0, s).dtype == np.float32
    assert x.clip(0, s).dtype == np.float32
    assert np.clip(x, 0, s).dtype == np.float32
    np.testing.assert_array_equal(host(x.clip(0, s)), [0.5, 2.0])
    assert xp.clip(x, 0, 2.0).dtype == np.float32  # without a GPUScalar: NumPy's own call


# ---- documented numerics of round() and ** (issue 15) ---------------------------------------


@pytest.mark.parametrize("value, ndigits, numpys, pythons", [
    (0.15, 1, 0.2, 0.1), (0.05, 1, 0.0, 0.1), (0.025, 2, 0.02, 0.03), (0.0055, 3, 0.006, 0.005),
])
def test_round_follows_numpy_not_python(value, ndigits, numpys, pythons):
    """``round(s, n)`` is ``np.round`` on the device (scale by 10**n, round half to even, scale
    back), not Python's correctly rounded decimal ``round``: ``round(0.15, 1)`` is 0.2 for a
    GPUScalar and 0.1 for a float. Lazy and eager give the same bits."""
    results = []
    for lazy in (True, False):
        with gs.lazy(lazy), gs.count_syncs() as counter:
            rounded = round(gs.asscalar(value, like=xp.zeros(1)), ndigits)
        assert isinstance(rounded, gs.GPUScalar) and counter.count == 0
        results.append(rounded.item())
    assert results[0] == results[1] == np.round(value, ndigits) == numpys
    assert round(value, ndigits) == pythons != numpys


@pytest.mark.parametrize("exponent", [-1, 0.5, 2])
def test_a_gpuscalar_exponent_follows_np_power(exponent):
    """NumPy's ``**`` looks at a Python exponent's value (``x ** 2`` is ``square``, ``** 0.5``
    ``sqrt``, ``** -1`` ``reciprocal``); a GPUScalar's value is on the device, so ``x ** s`` is
    always ``np.power(x, s)`` (one kernel on a GPU), lazy and eager alike, bit for bit."""
    x = np.array([-np.inf, -2.0, -0.0, 0.0, 0.3, 4.0, np.inf, np.nan])
    results = []
    with np.errstate(all="ignore"):
        for lazy in (True, False):
            with gs.lazy(lazy):
                got = xp.asarray(x) ** gs.asscalar(exponent, like=xp.zeros(1))
            results.append(got.get())
        expected = np.power(x, np.float64(exponent))
    for got in results:
        assert got.tobytes() == expected.tobytes()


def test_a_gpuscalar_base_follows_np_power_not_pythons_pow():
    """Python's ``float ** 0.5`` is C's ``pow``: ``(-inf) ** 0.5`` is ``inf``. A GPUScalar base
    follows NumPy's array ``power`` (what the device kernel computes on the strict device),
    which gives ``sqrt``'s ``nan`` there."""
    with np.errstate(all="ignore"):
        expected = np.power(np.asarray(-np.inf), 0.5)
        for lazy in (True, False):
            with gs.lazy(lazy):
                got = gs.asscalar(-np.inf, like=xp.zeros(1)) ** 0.5
            assert np.asarray(got.item()).tobytes() == expected.tobytes()
    assert float("-inf") ** 0.5 == math.inf and np.isnan(expected)


# ---- CuPy's launch counts that depend on more than the call (issue 15) --------------------------

#: ``a[index] = value(a)`` on a 3x3 array, and whether CuPy 14 launches a copy for it
SELF_ASSIGNMENTS = {
    "whole": (Ellipsis, lambda a: a, False),
    "its-view": (Ellipsis, lambda a: a[...], False),
    "rows": (slice(1, None), lambda a: a[1:], False),
    "row": (0, lambda a: a[0], False),
    "column": ((slice(None), 1), lambda a: a[:, 1], False),
    "leading-unit-dims": (Ellipsis, lambda a: a.reshape(1, 1, 3, 3), False),
    "reinterpreted": (Ellipsis, lambda a: a.view(np.int64), False),  # CuPy checks no dtype
    "shifted": (slice(1, None), lambda a: a[:-1], True),
    "other-row": (0, lambda a: a[1], True),
    "transposed": (Ellipsis, lambda a: a.T, True),
    "broadcast-row": (Ellipsis, lambda a: a[0:1], True),
}


@pytest.mark.parametrize("case", list(SELF_ASSIGNMENTS))
def test_assigning_an_array_onto_itself_launches_nothing_as_in_cupy(case):
    """CuPy's ``_scatter_op`` returns without a launch when the value is the target view
    itself (what ``a[...] += v`` stores back): the strict device counts what real CuPy code,
    run over fake memory, launches (it stops at CUDA exactly when it would copy)."""
    from .cupy_fake import fake_memory, from_host, host_view, reaches_cuda  # noqa: PLC0415

    index, value, launches = SELF_ASSIGNMENTS[case]
    data = np.arange(9.0).reshape(3, 3)
    with fake_memory() as memory:
        on_cupy = from_host(memory, data)
        assert reaches_cuda(on_cupy.__setitem__, index, value(on_cupy)) == launches
        if not launches:
            np.testing.assert_array_equal(host_view(on_cupy), data)
    a = xp.asarray(data)
    with gs.count_syncs() as counter:
        a[index] = value(a)
    assert counter.device_ops == launches
    expected = data.copy()
    if launches:  # (else unchanged: CuPy does not even convert a reinterpreted view)
        expected[index] = value(data)
    np.testing.assert_array_equal(host(a), expected)


def test_an_augmented_item_assignment_is_one_launch():
    """``x[...] -= v`` is CuPy's in-place subtract on the view, then ``x[...] = view``, which
    CuPy skips: one launch, as ``x -= v``; a materialized GPUScalar over the target is skipped
    the same way, another value is copied."""
    x = xp.asarray(np.arange(4.0))
    with gs.count_syncs() as counter:
        x[...] -= 1.0
        x[1:] *= 2.0
    assert counter.device_ops == 2
    np.testing.assert_array_equal(host(x), [-1.0, 0.0, 2.0, 4.0])
    z = xp.asarray(np.float64(3.0))
    own, other = gs.GPUScalar(z), gs.asscalar(5.0, like=z)
    with gs.count_syncs() as counter:
        z[...] = own
    assert counter.device_ops == (own.array is not z)
    with gs.count_syncs() as counter:
        z[...] = other
    assert counter.device_ops == 1
    assert host(z) == 5.0


#: ``cupy.linalg.norm`` calls the fake CuPy device runs through CuPy's own code
NORMS = {
    "vector": ((5,), np.float64, {}),
    "vector-ord-2": ((5,), np.float64, {"ord": 2}),
    "int-vector": ((5,), np.int64, {}),
    "complex-vector": ((5,), np.complex128, {}),
    "matrix": ((3, 4), np.float64, {}),
    "matrix-fro": ((3, 4), np.float64, {"ord": "fro"}),
    "vector-ord-1": ((5,), np.float64, {"ord": 1}),
    "vector-ord-0": ((5,), np.float64, {"ord": 0}),
    "vector-ord-inf": ((5,), np.float64, {"ord": np.inf}),
    "rows-ord-1": ((3, 4), np.float64, {"ord": 1, "axis": 1}),
    "matrix-ord-inf": ((3, 4), np.float64, {"ord": np.inf}),
    "matrix-ord-minus-1": ((3, 4), np.float32, {"ord": -1}),
}


@pytest.mark.needs_cupy  # CuPy's own norm on the fake CuPy device
@pytest.mark.parametrize("case", list(NORMS))
def test_linalg_norm_counts_the_kernels_cupy_launches(case):
    """``cupy.linalg.norm(v)`` is ``sqrt((v * v).sum())``: three launches, not one. CuPy's own
    ``norm`` runs on the fake CuPy device, which counts each kernel; the strict device counts
    as many and returns NumPy's value."""
    from .cupy_device import fake_device  # noqa: PLC0415 - imports CuPy

    shape, dtype, kwargs = NORMS[case]
    data = (np.arange(np.prod(shape)).reshape(shape) - 4).astype(dtype)
    if data.dtype.kind == "c":
        data = data * (1 - 2j)
    import cupy  # noqa: PLC0415 - after fake_device's check that CuPy is installed

    with fake_device() as (fake_xp, log):
        array = fake_xp.asarray(data)
        before = log.launches
        cupy.linalg.norm(array, **kwargs)
        cupy_launches = log.launches - before
    with gs.count_syncs() as counter:
        got = xp.linalg.norm(xp.asarray(data), **kwargs)
    assert counter.device_ops - 1 == cupy_launches  # (the upload of the data is one op)
    np.testing.assert_allclose(host(got), np.linalg.norm(data, **kwargs), rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "launches"),
    [({"axis": 1}, 1), ({"axis": (0, 1)}, 1), ({"ord": 3, "axis": 1}, 5)],
    ids=["rows", "both-axes", "rows-ord-3"],
)
def test_linalg_norm_counts_cupys_reduction_kernels(kwargs, launches):
    """The norms the fake CuPy device cannot run (CuPy's ``_norm_ord2`` reduction kernel,
    ``reciprocal`` of a Python number): counted from cupy/linalg/_norms.py, CuPy 14.2 — one
    reduction for a 2-norm over axes; ``abs``, ``**=``, ``sum``, ``reciprocal``, ``**=`` for
    another order."""
    data = np.arange(12.0).reshape(3, 4)
    x = xp.asarray(data)
    with gs.count_syncs() as counter:
        got = xp.linalg.norm(x, **kwargs)
    assert counter.device_ops == launches
    np.testing.assert_allclose(host(got), np.linalg.norm(data, **kwargs), rtol=1e-12)


# ---- random numbers: xp.random.default_rng is cupy.random.default_rng -------------------------


def test_default_rng_draws_strict_arrays_the_next_operation_takes():
    rng = xp.random.default_rng(0)
    x = rng.standard_normal((4, 3))
    assert type(x) is strict.StrictArray and x.shape == (4, 3) and x.dtype == np.float64
    y = x * 2.0 + xp.ones(3)  # a NumPy array here was the bug: the strict device refused it
    assert type(y) is strict.StrictArray
    np.testing.assert_array_equal(host(y), np.random.default_rng(0).standard_normal((4, 3)) * 2 + 1)


@pytest.mark.parametrize(("name", "args", "kwargs", "dtype"), [
    ("random", (), {"size": 5}, np.float64),
    ("random", (), {"size": 5, "dtype": np.float32}, np.float32),
    ("standard_normal", (), {"size": (2, 3), "dtype": np.float32}, np.float32),
    ("uniform", (-1.0, 1.0), {"size": 4}, np.float64),
    ("uniform", (-1.0, 1.0), {"size": 4, "dtype": np.float32}, np.float32),
    ("integers", (0, 10), {"size": 6}, np.int64),
    ("integers", (10,), {"size": 6, "dtype": np.int32}, np.int32),
    ("beta", (2.0, 3.0), {"size": 3, "dtype": np.float32}, np.float32),
    ("exponential", (2.0,), {"size": 3}, np.float64),
    ("gamma", (2.0,), {"size": 3}, np.float64),
    ("poisson", (3.0,), {"size": 3}, np.int64),
    ("binomial", (10, 0.5), {"size": 3}, np.int64),
    ("standard_exponential", (), {"size": 3, "method": "inv"}, np.float64),
    ("dirichlet", ([1.0, 2.0, 3.0],), {"size": 2}, np.float64),
])
def test_each_draw_is_a_strict_array_and_one_device_op_without_a_sync(name, args, kwargs, dtype):
    rng = xp.random.default_rng(7)
    counter = library_counter()  # sees the device's own reads too
    with sync._activate(counter):
        x = getattr(rng, name)(*args, **kwargs)
    assert type(x) is strict.StrictArray and x.dtype == dtype
    assert counter.device_ops == 1 and counter.count == 0
    plain = {k: v for k, v in kwargs.items() if k != "dtype" or name not in ("uniform", "beta")}
    expected = np.asarray(getattr(np.random.default_rng(7), name)(*args, **plain)).astype(dtype)
    np.testing.assert_array_equal(host(x), expected)  # NumPy's values for the seed


@pytest.mark.parametrize("name", ["random", "standard_normal", "uniform", "integers"])
def test_a_draw_without_size_is_a_0d_array_as_in_cupy(name):
    rng = xp.random.default_rng(1)
    x = rng.integers(5) if name == "integers" else getattr(rng, name)()
    assert type(x) is strict.StrictArray and x.shape == ()
    assert isinstance(gs.GPUScalar(x), gs.GPUScalar)  # a GPUScalar wraps it (a 0-d array)


def test_parameters_may_be_strict_arrays_on_their_device_and_out_is_filled_in_place():
    with strict.device(1):
        low, high = xp.zeros(3), xp.full(3, 2.0)
    x = xp.random.default_rng(2).uniform(low, high)
    assert x.shape == (3,) and x.device.id == 1
    assert np.all((host(x) >= 0) & (host(x) < 2))
    out = xp.zeros(4)
    assert xp.random.default_rng(3).standard_normal(4, out=out) is out
    np.testing.assert_array_equal(host(out), np.random.default_rng(3).standard_normal(4))
    with pytest.raises(TypeError, match="host NumPy array"):
        xp.random.default_rng(2).uniform(np.zeros(3), 1.0)


def test_the_generator_has_cupys_methods_only():
    rng = xp.random.default_rng(0)
    for name in ("normal", "choice", "permutation", "shuffle"):  # NumPy's, not CuPy's
        with pytest.raises(AttributeError, match=f"cupy.random.Generator has no method '{name}'"):
            getattr(rng, name)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        rng.nonsense  # noqa: B018
    assert xp.random.default_rng(rng) is rng and isinstance(rng, xp.random.Generator)
    assert type(xp.random.permutation(xp.arange(5))) is strict.StrictArray  # the legacy API


def test_making_a_generator_is_one_device_op():
    with gs.count_syncs() as counter:
        xp.random.default_rng(0)
    assert counter.device_ops == 1 and counter.count == 0


@pytest.mark.needs_cupy  # cupy.random.Generator, inspected (no device needed)
def test_the_method_list_is_cupys():
    import cupy

    public = {n for n in dir(cupy.random.Generator) if not n.startswith("_")}
    assert set(strict_random.GENERATOR_METHODS) == public - {"bit_generator"}


# ---- what CuPy refuses while a graph is recorded, refused in bodies (issue 23) ------------------


def _spd(n=3):
    m = np.arange(1.0, n * n + 1).reshape(n, n)
    return xp.asarray(m @ m.T + n * np.eye(n))


CUSOLVER_CALLS = {
    "solve": lambda a: xp.linalg.solve(a, xp.ones(3)),
    "lstsq": lambda a: xp.linalg.lstsq(a, xp.ones(3)),
    "inv": lambda a: xp.linalg.inv(a),
    "pinv": lambda a: xp.linalg.pinv(a),
    "eigh": lambda a: xp.linalg.eigh(a),
    "eigvalsh": lambda a: xp.linalg.eigvalsh(a),
    "cholesky": lambda a: xp.linalg.cholesky(a),
    "qr": lambda a: xp.linalg.qr(a),
    "svd": lambda a: xp.linalg.svd(a),
    "det": lambda a: xp.linalg.det(a),
    "slogdet": lambda a: xp.linalg.slogdet(a),
    "matrix_rank": lambda a: xp.linalg.matrix_rank(a),
    "np.linalg.solve": lambda a: np.linalg.solve(a, xp.ones(3)),  # through __array_function__
    "norm-2": lambda a: xp.linalg.norm(a, ord=2),
    "norm-nuc": lambda a: xp.linalg.norm(a, ord="nuc"),
}


@pytest.mark.parametrize("name", sorted(CUSOLVER_CALLS))
def test_cusolver_calls_are_refused_in_a_body_as_cupy_refuses_them(name):
    call, a = CUSOLVER_CALLS[name], _spd()
    call(a)  # outside a body: computed
    with sync.graph_body(), pytest.raises(NotImplementedError) as raised:
        call(a)
    message = str(raised.value)
    assert message.startswith(strict.CUSOLVER_CAPTURE_MESSAGE + " (CuPy's linalg.")
    assert "before the loop" in message and "gs.matmul" in message


def test_a_cusolver_call_in_a_loop_body_is_refused_even_when_the_loop_would_not_run():
    a, x = _spd(), xp.zeros(3)

    def body(x):
        x[...] = xp.linalg.solve(a, x)

    with pytest.raises(NotImplementedError, match="cuSOLVER"):
        gs.while_loop(lambda x: gs.GPUScalar(x[0]) < 1.0, body, x, max_iter=1)


def test_vector_norms_and_cupys_own_matrix_norms_are_allowed_in_a_body():
    a = _spd()
    with sync.graph_body():
        for ord in (None, 1, np.inf, "fro"):
            assert float(host(xp.linalg.norm(a, ord=ord))) > 0
        assert float(host(xp.linalg.norm(a[0], ord=2))) > 0
        assert float(host(xp.linalg.norm(a, ord=2, axis=1)).sum()) > 0


@pytest.mark.parametrize("draw", [lambda: xp.random.rand(3), lambda: xp.random.standard_normal(3),
                                  lambda: xp.random.permutation(3),
                                  lambda: RNG.standard_normal(3), lambda: RNG.random(),
                                  lambda: xp.random.default_rng(0)],
                         ids=["rand", "standard_normal", "permutation", "Generator.standard_normal",
                              "Generator.random", "default_rng"])
def test_random_draws_are_refused_in_a_body_as_curand(draw):
    draw()  # outside a body: drawn
    with sync.graph_body(), pytest.raises(NotImplementedError) as raised:
        draw()
    assert str(raised.value).startswith(strict.CURAND_CAPTURE_MESSAGE)
    assert "draw what the loop needs before it" in str(raised.value)


RNG = xp.random.default_rng(1)


@pytest.mark.parametrize("product", [lambda a: xp.linalg.multi_dot([a, a, a]),
                                     lambda a: xp.linalg.matrix_power(a, 3),
                                     lambda a: xp.einsum("ij,jk->ik", a, a)],
                         ids=["multi_dot", "matrix_power", "einsum"])
def test_other_cublas_products_are_refused_in_a_body(product):
    a = _spd()
    product(a)
    with sync.graph_body(), pytest.raises(NotImplementedError, match="cuBLAS"):
        product(a)
    with sync.graph_body():
        assert host(xp.linalg.matrix_power(a, 1)).shape == (3, 3)  # no product


def test_gpuscalars_products_are_allowed_in_a_body():
    a, v = _spd(), xp.ones(3)
    with sync.graph_body():
        assert float(gs.dot(v, v)) == 3.0 and float(gs.vdot(v, v)) == 3.0
        assert host(gs.dot(a, v)).shape == (3,) and host(gs.matmul(a, a)).shape == (3, 3)
        assert float(gs.norm(v)) == pytest.approx(math.sqrt(3.0))


def test_boolean_mask_assignment_is_a_sync_as_in_cupy():
    x = xp.arange(4.0)
    mask = x > 1
    with gs.count_syncs(include_cupy=True) as counter:
        x[mask] = 0.0
        x[xp.asarray([0, 1])] = 5.0  # an integer index array: no count read back
    assert counter.count == 1 and host(x).tolist() == [5.0, 5.0, 0.0, 0.0]

    def branch():
        x[mask] = 1.0  # CuPy reads the mask's count back: a sync, refused in a body

    with pytest.raises(gs.SyncError):
        gs.cond(xp.asarray(True), branch, None)


@pytest.mark.parametrize(("name", "call"), [
    ("eigh", lambda a: xp.linalg.eigh(a)), ("svd", lambda a: xp.linalg.svd(a)),
    ("qr", lambda a: xp.linalg.qr(a)), ("slogdet", lambda a: xp.linalg.slogdet(a))])
def test_namedtuple_results_hold_strict_arrays(name, call):
    with strict.device(1):
        a = _spd()
        result = call(a)
    assert hasattr(result, "_fields"), name
    assert all(type(part) is strict.StrictArray and part.device.id == 1 for part in result)
    if name == "eigh":
        np.testing.assert_allclose(host(result.eigenvalues), np.linalg.eigvalsh(host(a)))


# ---- loops CuPy has no routine for -------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda z: np.logical_not(z), lambda z: xp.logical_not(z), lambda z: np.logical_and(z, z),
    lambda z: xp.logical_or(z, xp.ones(2)), lambda z: np.logical_xor(z, 1j),
], ids=["np.logical_not", "xp.logical_not", "logical_and", "logical_or", "logical_xor"])
def test_a_loop_cupy_lacks_is_cupys_type_error(call):
    """CuPy 14's ``logical_*`` ufuncs have no complex loop (cupy/_logic/ops.py): a TypeError."""
    z = xp.asarray(np.array([1j, 0j]))
    with pytest.raises(TypeError, match="cupy_logical_"):
        call(z)
    assert host(np.logical_not(xp.asarray(np.array([1.5, 0.0])))).tolist() == [False, True]


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_a_gpuscalar_op_cupy_lacks_a_loop_for_is_refused_unless_gpuscalar_writes_it(
        lazy, monkeypatch):
    """``np.logical_not`` of a complex GPUScalar gives the float path's bool on the strict device
    because gpuscalar's CUDA writes that loop itself (`codegen.OWN_ROUTINES`: CuPy has none);
    without it the strict device refuses the expression as CuPy would (the TypeError a real GPU
    run met), so CI sees such a gap."""
    from gpuscalar.devices.strict import loops as strict_loops
    from gpuscalar.lazy import codegen

    like = xp.zeros(1)
    z = gs.asscalar(2.5 + 1j, like=like)
    with gs.lazy(lazy):
        assert np.logical_not(z).item() is False
        assert np.logical_xor(z, gs.asscalar(0j, like=like)).item() is True
    own = {k: v for k, v in codegen.OWN_ROUTINES.items() if k[0] != "logical_not"}
    monkeypatch.setattr(codegen, "OWN_ROUTINES", own)
    monkeypatch.setattr(strict_loops, "_RUNNABLE", set())
    with gs.lazy(lazy), pytest.raises(TypeError, match="cupy_logical_not"):
        np.logical_not(gs.asscalar(2.5 + 1j, like=like)).item()


def test_a_ufunc_keyword_cupy_lacks_is_cupys_type_error():
    """CuPy 14's ufuncs take out, dtype and casting only: ``where=`` (a NumPy keyword) is a
    TypeError there, so on the strict device too, before anything runs."""
    x = strict.xp.ones(3)
    mask = strict.xp.asarray(np.array([True, False, True]))
    with gs.count_syncs() as counter, pytest.raises(TypeError, match=r"Wrong arguments \{'where'"):
        np.add(x, 1.0, where=mask, out=x)
    assert counter.device_ops == 0
    assert np.add(x, 1.0, out=x, casting="same_kind", dtype=np.float64) is x  # what CuPy takes
