"""GPUScalar: construction, operators, host reads, caching, protocols, bad input."""

from __future__ import annotations

import copy
import inspect
import math
import numbers
import operator
import pickle
from typing import Any

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict
from gpuscalar.scalar import BINARY_OPERATORS, COMPARISON_OPERATORS, UNARY_OPERATORS

from .helpers import backend_name, host

#: Every test here runs with lazy GPUScalar expressions and again eagerly.
pytestmark = pytest.mark.usefixtures("scalar_mode")


def test_wraps_zero_d_array_without_sync(xp):
    array = xp.asarray(2.5, dtype=xp.float32)
    with gs.count_syncs() as counter:
        s = gs.GPUScalar(array)
        assert s.array is not array  # a value, like float(array): a device-side copy
        assert s.dtype == np.float32
        assert s.is_materialized  # it holds an array, not a pending expression
        assert s.shape == () and s.ndim == 0
    assert counter.count == 0 and counter.device_ops == 1  # the copy; no sync
    array[...] = 7.0  # a later write to the array never changes the scalar
    assert s.item() == 2.5 and host(array).item() == 7.0


def test_numpy_generic_is_normalized_to_zero_d_array():
    s = gs.GPUScalar(np.float32(1.5))
    assert isinstance(s.array, np.ndarray) and s.array.shape == ()
    assert s.dtype == np.float32
    assert gs.sum(np.ones(3)).array.__class__ is np.ndarray


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (np.ones(3), ValueError, "shape (3,)"),
        (np.ones((2, 2)), ValueError, "shape (2, 2)"),
        ([1.0], TypeError, "list"),
        ("1.0", TypeError, "str"),
        (None, TypeError, "NoneType"),
        (1.0, TypeError, "asscalar"),
        (np.asarray("x"), TypeError, "<U1"),
        (np.asarray(None, dtype=object), TypeError, "object"),
    ],
)
def test_constructor_rejects_bad_input(value, error, words):
    with pytest.raises(error) as info:
        gs.GPUScalar(value)
    assert words in str(info.value)


@pytest.mark.parametrize(("stem", "ufunc_name"), sorted(BINARY_OPERATORS.items()))
@pytest.mark.parametrize("reflected", [False, True])
def test_binary_operators_match_numpy_zero_d(xp, stem, ufunc_name, reflected):
    is_bitwise = ufunc_name in ("bitwise_and", "bitwise_or", "bitwise_xor",
                                "left_shift", "right_shift")
    dtype = xp.int32 if is_bitwise else xp.float64
    a, b = xp.asarray(7, dtype=dtype), xp.asarray(3, dtype=dtype)
    s, t = gs.GPUScalar(a), gs.GPUScalar(b)
    dunder = getattr(operator, stem if stem not in ("and", "or") else stem + "_", None)
    function = dunder if stem != "divmod" else divmod
    with gs.count_syncs() as counter:
        got = function(t, s) if reflected else function(s, t)
        got_python = function(3, s) if reflected else function(s, 3)
    assert counter.count == 0
    expected = getattr(np, ufunc_name)(*([3, 7] if reflected else [7, 3]))
    for result in (got, got_python):
        results = result if isinstance(result, tuple) else (result,)
        expectations = expected if isinstance(expected, tuple) else (expected,)
        for r, e in zip(results, expectations, strict=True):
            assert isinstance(r, gs.GPUScalar)
            assert r.item() == e


@pytest.mark.parametrize(("stem", "ufunc_name"), sorted(COMPARISON_OPERATORS.items()))
def test_comparisons_return_bool_scalars_without_sync(xp, stem, ufunc_name):
    s = gs.asscalar(2.0, like=xp.zeros(1))
    compare = getattr(operator, stem)
    with gs.count_syncs() as counter:
        results = [compare(s, 3.0), compare(s, s), compare(3.0, s)]
    assert counter.count == 0
    for result in results:
        assert isinstance(result, gs.GPUScalar) and result.dtype == np.bool_
    reference = getattr(np, ufunc_name)
    assert [bool(r) for r in results] == [
        bool(reference(2.0, 3.0)), bool(reference(2.0, 2.0)), bool(reference(3.0, 2.0))
    ]


@pytest.mark.parametrize(("stem", "ufunc_name"), sorted(UNARY_OPERATORS.items()))
def test_unary_operators(xp, stem, ufunc_name):
    dtype = xp.int16 if ufunc_name == "invert" else xp.float64
    value = 5 if ufunc_name == "invert" else -2.5
    s = gs.GPUScalar(xp.asarray(value, dtype=dtype))
    function = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}.get(
        stem, getattr(operator, stem, None)
    )
    with gs.count_syncs() as counter:
        result = function(s)
    assert counter.count == 0
    assert isinstance(result, gs.GPUScalar)
    assert result.item() == getattr(np, ufunc_name)(np.asarray(value, dtype=dtype)).item()


def test_invert_of_bool_is_logical_not():
    assert (~gs.asscalar(True)).item() is False
    assert (~gs.asscalar(False)).item() is True


def test_round_floor_ceil_stay_on_device():
    s = gs.asscalar(2.567)
    with gs.count_syncs() as counter:
        values = [round(s), round(s, 2), math.floor(s), math.ceil(s), math.trunc(-s)]
    assert counter.count == 0
    assert all(isinstance(v, gs.GPUScalar) for v in values)
    assert [v.item() for v in values] == [3, 2.57, 2, 3, -2]
    # the Python types the float path gives: ints, and a float for round(x, 2)
    assert [type(v.item()) for v in values] == [int, float, int, int, int]
    assert [v.dtype for v in values] == [np.int64, np.float64, np.int64, np.int64, np.int64]
    f32 = gs.asscalar(np.float32(2.5))
    assert round(f32).item() == round(2.5) == 2 and round(f32).dtype == np.int64
    with pytest.raises(TypeError, match="complex"):
        round(gs.asscalar(1 + 2j))
    with pytest.raises(TypeError, match="complex"):
        math.floor(gs.asscalar(1 + 2j))


def test_statistics_takes_gpuscalars_as_floats():
    """statistics.mean asks each number for as_integer_ratio (a read, as a float would make)
    and converts its exact result back to the data's type."""
    import statistics  # noqa: PLC0415

    values = [gs.asscalar(v) for v in (1.0, 2.5, 4.0)]
    mean = statistics.mean(values)
    assert isinstance(mean, gs.GPUScalar) and mean.item() == statistics.mean([1.0, 2.5, 4.0])
    assert gs.asscalar(0.75).as_integer_ratio() == (3, 4)
    assert statistics.median(values).item() == 2.5


def test_pow_with_modulus_is_rejected():
    with pytest.raises(TypeError, match="modulus"):
        pow(gs.asscalar(2), 3, 5)


def test_ieee_division_by_zero_gives_inf_and_nan():
    s = gs.asscalar(1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        assert (s / 0).item() == math.inf
        assert math.isnan((s * 0 / 0).item())


def test_host_reads_sync_once_and_cache():
    s = gs.asscalar(3.75)
    with gs.count_syncs() as counter:
        assert float(s) == 3.75
        assert s.is_materialized
        assert s.item() == 3.75
        assert int(s) == 3
        assert bool(s) is True
        assert complex(s) == 3.75 + 0j
        assert f"{s:.1f}" == "3.8"
        assert str(s) == "3.75"
        assert repr(s) == "GPUScalar(3.75, dtype=float64, device='cpu')"
        assert np.asarray(s).dtype == np.float64
    assert counter.count == 1
    assert counter.records[0].reason == "float"


@pytest.mark.parametrize(
    ("read", "reason"),
    [(float, "float"), (int, "int"), (bool, "bool"), (str, "str"), (repr, "repr"),
     (complex, "complex"), (lambda s: s.item(), "item"), (lambda s: f"{s:.2f}", "format"),
     (operator.index, "index"), (np.asarray, "__array__"), (pickle.dumps, "pickle")],
)
def test_each_host_read_is_one_sync_with_its_reason(read, reason):
    s = gs.asscalar(4)
    with gs.count_syncs() as counter:
        read(s)
    assert [r.reason for r in counter.records] == [reason]


def test_index_only_for_integer_dtypes():
    assert [10, 20, 30][gs.asscalar(1)] == 20
    with pytest.raises(TypeError, match="float64"):
        operator.index(gs.asscalar(1.5))


def test_numbers_abc_registration():
    assert isinstance(gs.asscalar(1.5), numbers.Real)
    assert isinstance(gs.asscalar(True), numbers.Real)
    assert isinstance(gs.asscalar(1j), numbers.Complex)
    assert not isinstance(gs.asscalar(1j), numbers.Real)
    assert isinstance(gs.asscalar(1j), gs.GPUScalar)


def test_unhashable_because_equality_is_on_device():
    with pytest.raises(TypeError, match="unhashable"):
        hash(gs.asscalar(1.0))


def test_immutable_augmented_assignment_rebinds():
    s = gs.asscalar(1.0)
    original = s
    s += 1
    assert original.item() == 1.0 and s.item() == 2.0


def test_pickle_and_copy_round_trip():
    s = gs.asscalar(np.float32(1.25))
    restored = pickle.loads(pickle.dumps(s))
    assert restored.dtype == np.float32 and restored.item() == 1.25
    with gs.count_syncs() as counter:
        assert copy.copy(s) is s and copy.deepcopy(s) is s
    assert counter.count == 0


def test_array_ufunc_numpy_functions_return_scalars(xp):
    s = gs.asscalar(4.0, like=xp.zeros(1))
    with gs.count_syncs() as counter:
        results = [xp.sqrt(s), xp.add(s, 1.0), xp.maximum(s, 5.0), xp.isfinite(s)]
    assert counter.count == 0
    assert all(isinstance(r, gs.GPUScalar) for r in results)
    assert [r.item() for r in results] == [2.0, 5.0, 5.0, True]
    mantissa, exponent = np.frexp(s)
    assert isinstance(mantissa, gs.GPUScalar) and mantissa.item() * 2 ** exponent.item() == 4.0


def test_array_ufunc_rejects_gpuscalar_out():
    s = gs.asscalar(1.0)
    with pytest.raises(TypeError, match="immutable"):
        np.add(s, 1.0, out=(s,))


def test_in_place_array_update_keeps_numpy_casting_rules():
    x = np.arange(3, dtype=np.int8)
    x += gs.asscalar(2)
    assert x.tolist() == [2, 3, 4] and x.dtype == np.int8
    with pytest.raises(TypeError, match="same_kind"):
        x += gs.asscalar(1.5)
    assert x.tolist() == [2, 3, 4]  # a rejected update leaves the data as it was


def test_math_helpers(xp, scalar_mode):
    s = gs.asscalar(4.0, like=xp.zeros(1))
    x = xp.asarray([1.0, 4.0, 9.0], dtype=xp.float32)
    with gs.count_syncs() as counter:
        assert gs.sqrt(s).item() == 2.0
        assert gs.exp(gs.log(s)).item() == pytest.approx(4.0)
        assert gs.log1p(gs.expm1(s)).item() == pytest.approx(4.0)
        assert gs.abs(-s).item() == 4.0
        assert gs.sign(-s).item() == -1.0
        assert gs.minimum(s, 3.0).item() == 3.0 and gs.maximum(s, 3.0).item() == 4.0
        assert gs.clip(s, 0.0, 1.0).item() == 1.0
        assert gs.where(s > 3, s, 0.0).item() == 4.0
        assert gs.isfinite(s).item() and not gs.isnan(s).item() and not gs.isinf(s).item()
        clipped = gs.clip(x, 2.0, s)
        assert clipped.dtype == xp.float32
        selected = gs.where(x > 2, x, s)
        assert selected.dtype == xp.float32
    # lazy: s is read once (by the first .item(), whose transfer brings s back too); every
    # other value is built from it and Python numbers alone, so it is answered on the host.
    # Eager evaluates each operation at once: a read brings back that value alone.
    assert counter.count == (1 if scalar_mode == "lazy" else 12)
    assert gs.sqrt(x).dtype == xp.float32
    assert gs.sqrt(9.0).item() == 3.0
    with pytest.raises(TypeError, match="takes 1 operand"):
        gs.sqrt(s, s)
    with pytest.raises(TypeError, match="str"):
        gs.sqrt("9")


def test_two_operand_helpers_keep_the_hot_path_they_find(xp):
    """A two-operand helper keeps the hot path its general path finds for a scalar class
    (first or second operand): every call after the first of each form gives what the first
    gave (value, dtype, strength, the same node structure), arrays and numbers alone still
    take the general path, and its errors are the general path's."""
    from gpuscalar import math as gs_math  # noqa: PLC0415

    s = gs.asscalar(4.0, like=xp.zeros(1))
    t = gs.asscalar(np.float32(2.5), like=xp.zeros(1))
    x = xp.asarray([1.0, 5.0], dtype=xp.float32)
    calls: list[Any] = []
    general = gs_math._apply_math

    def counted(*operands: Any) -> Any:
        calls.append(operands)
        return general(*operands)

    forms = [(s, 3.0), (3.0, s), (s, t), (t, s), (1, s), (s, True), (2.0, 5)]
    for _ in range(3):
        results = [gs.minimum(a, b) for a, b in forms] + [gs.maximum(a, b) for a, b in forms]
        assert [float(r) for r in results] == [3.0, 3.0, 2.5, 2.5, 1.0, 1.0, 2.0,
                                               4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 5.0]
        assert [r.dtype for r in results[:6]] == [np.float64] * 6
        with pytest.raises(TypeError, match="takes 2 operand"):
            gs.minimum(s)
        with pytest.raises(TypeError, match="str"):
            gs.minimum(s, "1")
        with pytest.raises(TypeError, match="str"):
            gs.minimum("1", s)
    import unittest.mock  # noqa: PLC0415

    with unittest.mock.patch.object(gs_math, "_apply_math", counted):
        assert float(gs.minimum(s, 3.0)) == 3.0 and float(gs.minimum(3.0, s)) == 3.0
        assert calls == []  # the kept hot paths: no general path
        assert gs.minimum(x, s).dtype == xp.float32 and gs.minimum(2.0, 5).item() == 2.0
    assert len(calls) == 1  # numbers alone; (x, s) is the scalar's reflected hot path


def test_asscalar_dtype_rules(xp):
    f32 = xp.zeros(2, dtype=xp.float32)
    i8 = xp.zeros(2, dtype=xp.int8)
    assert gs.asscalar(1.5).dtype == np.float64
    assert gs.asscalar(1.5, like=f32).dtype == np.float32
    assert gs.asscalar(1.5, like=i8).dtype == np.float64
    assert gs.asscalar(3, like=i8).dtype == np.int8
    assert gs.asscalar(3, like=f32).dtype == np.int64
    assert gs.asscalar(True, like=f32).dtype == np.bool_
    assert gs.asscalar(1j, like=f32).dtype == np.complex128
    assert gs.asscalar(np.float16(1)).dtype == np.float16
    assert gs.asscalar(1, dtype=np.uint8).dtype == np.uint8
    assert gs.asscalar(gs.asscalar(1.0), dtype=np.float32).dtype == np.float32
    existing = gs.asscalar(2.0, like=f32)
    assert gs.asscalar(existing) is existing


def test_asscalar_rejects_bad_input():
    with pytest.raises(TypeError, match="list"):
        gs.asscalar([1.0])
    with pytest.raises(TypeError, match="NoneType"):
        gs.asscalar(None)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        gs.asscalar(np.ones(2))
    with pytest.raises(TypeError, match="like"):
        gs.asscalar(1.0, like=[1.0])
    with pytest.raises(TypeError, match="<U1"):
        gs.asscalar(1.0, dtype="U1")
    with pytest.raises(OverflowError):
        gs.asscalar(300, like=np.zeros(1, dtype=np.int8))


def test_error_messages_never_read_the_value():
    s = gs.asscalar(1.0)
    with gs.sync_guard("error"):
        with pytest.raises(TypeError):
            operator.index(s)
        with pytest.raises(TypeError):
            s + "text"
        with pytest.raises(TypeError):
            pow(s, 2, 3)
    with gs.count_syncs() as counter:
        s.item()
    assert counter.count == 1  # nothing above read (and cached) the value


def test_unknown_operand_returns_not_implemented():
    class Other:
        def __radd__(self, other):
            return "other handled it"

    assert gs.asscalar(1.0) + Other() == "other handled it"
    assert (gs.asscalar(1.0) == None) is False  # noqa: E711 - falls back to identity


# ---- promotion rules 4 and 5 on a fake multi-device backend ---------------------------------


def test_device_scalar_with_host_array_reads_once():
    s = gs.GPUScalar(strict.xp.asarray(2.0, device=0))
    assert s.backend is strict.STRICT
    host_array = np.arange(3, dtype=np.float32)
    with gs.count_syncs() as counter:
        result = host_array * s
        again = host_array + s
    assert type(result) is np.ndarray and result.dtype == np.float32
    assert result.tolist() == [0.0, 2.0, 4.0] and again.tolist() == [2.0, 3.0, 4.0]
    assert [r.reason for r in counter.records] == ["host operand"]


def test_device_scalar_with_host_array_raises_under_error_guard():
    s = gs.GPUScalar(strict.xp.asarray(2.0))
    with gs.sync_guard("error"), pytest.raises(gs.SyncError, match="host operand"):
        np.ones(2) * s
    with gs.count_syncs() as counter:
        s.item()
    assert counter.count == 1  # the refused read did not transfer (or cache) anything


def test_mixed_devices_and_backends_are_errors_naming_both_sides():
    on_zero = gs.GPUScalar(strict.xp.asarray(1.0, device=0))
    on_one = gs.GPUScalar(strict.xp.asarray(1.0, device=1))
    with gs.sync_guard("error"):
        with pytest.raises(ValueError, match=r"device=0.*device=1"):
            on_zero + on_one
        with pytest.raises(ValueError, match="different devices"):
            on_zero * strict.xp.asarray([1.0, 2.0], device=1)
        with pytest.raises(TypeError, match=r"strict.*numpy"):
            on_zero + gs.asscalar(1.0)
        with pytest.raises(TypeError, match="never copies"):
            gs.asscalar(1.0) * strict.xp.asarray([1.0, 2.0])
    same = on_zero * strict.xp.asarray([1.0, 2.0], device=0)
    assert same.device.id == 0 and host(same).tolist() == [1.0, 2.0]


def test_asscalar_like_a_device_array_lands_on_its_device():
    on_one = strict.xp.zeros(2, device=1)
    s = gs.asscalar(2.5, like=on_one)
    assert s.device == 1 and s.backend is strict.STRICT and s.dtype == np.float64
    assert (s * on_one).device.id == 1


def test_cupy_elementwise_override_routes_cupy_ufuncs_through_promotion(scalar_mode):
    cupy = pytest.importorskip("cupy")  # the ufunc objects exist without a device
    s = gs.asscalar(np.float32(4.0))
    with gs.count_syncs() as counter:
        root = s.__cupy_override_elementwise_kernel__(cupy.sqrt, s)
        total = s.__cupy_override_elementwise_kernel__(cupy.add, np.ones(2, np.float16), s)
    # lazy: the scalar sqrt is pending (no launch); eager: one op each
    assert counter.count == 0 and counter.device_ops == (1 if scalar_mode == "lazy" else 2)
    assert isinstance(root, gs.GPUScalar) and root.item() == 2.0
    assert total.dtype == np.float16 and total.tolist() == [5.0, 5.0]  # parity: as + 4.0


def test_cupy_elementwise_override_passes_device_arrays_to_user_kernels():
    received = []

    def user_kernel(*args):
        received.extend(args)
        return args[0] * args[1]

    s = gs.asscalar(3.0)
    x = np.arange(3.0)
    with gs.count_syncs() as counter:
        result = s.__cupy_override_elementwise_kernel__(user_kernel, x, s)
    assert counter.count == 0
    assert received[1] is s.array and result.tolist() == [0.0, 3.0, 6.0]


def test_apply_ufunc_with_out_array_updates_in_place():
    from gpuscalar.arrays import apply_ufunc

    x = np.zeros(3, dtype=np.float32)
    result = apply_ufunc("add", np.arange(3, dtype=np.float32), gs.asscalar(2.0), out=x)
    assert result is x and x.tolist() == [2.0, 3.0, 4.0] and x.dtype == np.float32


# ---- interop without a host round trip ----------------------------------------------------------


def test_dlpack_exports_the_zero_d_array_without_copy_or_sync(xp):
    s = gs.asscalar(2.5, like=xp.zeros(1, dtype=xp.float32)) * 2  # pending when lazy
    counter = gs.sync.SyncCounter(include_cupy=True)  # the device's own reads count too
    with gs.sync._activate(counter):
        device = s.__dlpack_device__()
        if backend_name(xp) == "cupy":
            exported = xp.from_dlpack(s)
        else:
            exported = np.from_dlpack(s)
    assert counter.count == 0 and s.is_materialized
    assert exported.shape == () and exported.dtype == np.float64  # float32 * 2: a Python float
    if backend_name(xp) == "numpy":
        assert np.shares_memory(exported, s.array) and device == (1, 0)
    assert host(exported).item() == 5.0


def test_cuda_array_interface_only_on_cupy(xp):
    s = gs.asscalar(1.0, like=xp.zeros(1))
    if backend_name(xp) == "cupy":
        interface = s.__cuda_array_interface__
        assert interface["shape"] == () and interface["data"][0] == s.array.data.ptr
        assert xp.asarray(s).data.ptr == s.array.data.ptr  # no copy
    else:
        assert not hasattr(s, "__cuda_array_interface__")
        with pytest.raises(AttributeError, match="DLPack"):
            s.__cuda_array_interface__  # noqa: B018


@pytest.mark.cupy
def test_torch_and_numba_take_a_cupy_gpuscalar_without_a_copy():
    """On a GPU machine (which has both): DLPack and the CUDA Array Interface, no copy."""
    if not gs.gpu_available():
        pytest.skip("CuPy needs a CUDA device, and this machine has none")
    import cupy

    torch = pytest.importorskip("torch")
    numba_cuda = pytest.importorskip("numba.cuda")
    s = gs.asscalar(3.0, like=cupy.zeros(1)) * 2
    tensor = torch.from_dlpack(s)
    assert tensor.shape == () and tensor.data_ptr() == s.array.data.ptr
    assert numba_cuda.as_cuda_array(s).__cuda_array_interface__["data"][0] == s.array.data.ptr
    assert float(tensor) == 6.0


# ---- no host-to-device copy: a CUDA graph being captured refuses one -----------------------------


@pytest.fixture
def uploads_refused(monkeypatch):
    """The strict device's ``asarray`` refuses host data (as CuPy refuses an upload while a
    stream captures); device arrays pass."""
    original = strict.xp.asarray

    def asarray(value, *args, **kwargs):
        if type(value) is not strict.StrictArray and getattr(value, "_backend", None) is None:
            raise AssertionError(f"a host-to-device copy of {type(value).__name__}")
        return original(value, *args, **kwargs)

    monkeypatch.setitem(strict.xp.__dict__, "asarray", asarray)
    monkeypatch.setitem(strict.xp.__dict__, "array", asarray)


@pytest.mark.needs_cupy  # count_syncs(include_cupy=True)
@pytest.mark.parametrize(("value", "dtype"), [
    (2.5, None), (3, None), (True, None), (1 + 2j, None), (np.float32(1.5), None),
    (np.array(7, dtype=np.int16), None), (2.5, "float16"), (-1, "int8"), (255, "uint8"),
])
def test_asscalar_makes_device_values_without_an_upload(uploads_refused, value, dtype):
    """Python numbers and NumPy scalars become device scalars through a fill kernel that
    takes the value as an argument: allowed inside a captured step's body, one device op,
    the value and dtype ``asarray`` would give."""
    with strict.device(1):
        like = strict.xp.zeros(1, dtype=np.float32)
    with gs.sync.graph_body(), gs.count_syncs(include_cupy=True) as counter:
        scalar = gs.asscalar(value, like=like, dtype=dtype)
    assert counter.device_ops == 1 and counter.count == 0
    expected = gs.asscalar(value, like=np.zeros(1, dtype=np.float32), dtype=dtype)  # NumPy
    assert scalar.dtype == expected.dtype and scalar.device == 1
    assert scalar.item() == expected.item()


def test_asscalar_keeps_asarrays_errors_on_a_device(uploads_refused):
    like = strict.xp.zeros(1)
    with pytest.raises(OverflowError):
        gs.asscalar(300, like=like, dtype=np.uint8)
    with pytest.raises(TypeError):
        gs.asscalar(1 + 2j, like=like, dtype=np.float64)
    with pytest.raises(ValueError):
        gs.asscalar(math.nan, like=like, dtype=np.int64)


def test_unpickling_a_device_scalar_uploads_nothing(uploads_refused):
    scalar = gs.asscalar(np.float32(2.5), like=strict.xp.zeros(1))
    payload = pickle.dumps(scalar)  # the read of the value: a sync, outside the body
    with gs.sync.graph_body(), gs.count_syncs() as counter:
        again = pickle.loads(payload)
    assert counter.device_ops == 1
    assert again.dtype == np.float32 and again.backend.name == "strict" and again.item() == 2.5


# ---- numbers.Real / numbers.Complex members and calls into the array library (issue 15) -------


@pytest.mark.parametrize("value", [1.5, 3, True, 2 - 0.5j], ids=["float", "int", "bool", "complex"])
def test_real_imag_conjugate_are_device_scalars(xp, value):
    """``s.real``, ``s.imag``, ``s.conjugate()`` as for the Python number (numbers ABC), as
    GPUScalars of NumPy's dtypes for them, without a sync."""
    s = gs.asscalar(value, like=xp.zeros(1))
    with gs.sync_guard("error"):
        parts = s.real, s.imag, s.conjugate()
    assert all(isinstance(p, gs.GPUScalar) for p in parts)
    data = np.asarray(value, dtype=s.dtype)
    # a real number is its own conjugate (numbers.Real; np.conjugate makes a bool an int8)
    expected = np.real(data), np.imag(data), np.conjugate(data) if data.dtype.kind == "c" else data
    assert [p.dtype for p in parts] == [e.dtype for e in expected]
    assert [host(p) for p in parts] == [e.item() for e in expected]
    assert [host(p) for p in parts] == [value.real, value.imag, value.conjugate()]


@pytest.mark.parametrize("how", ["np.clip", "x.clip", "xp.clip"])
def test_clip_with_a_scalar_bound_follows_the_parity_rule(xp, how):
    """``clip`` (no NumPy ufunc by name) with a GPUScalar bound: as with the Python float."""
    x = xp.asarray(np.array([0.5, 1.0, 3.0], dtype=np.float32))
    s = gs.asscalar(2.0, like=x, dtype=np.float64)
    clip = {"np.clip": np.clip, "x.clip": lambda a, lo, hi: a.clip(lo, hi), "xp.clip": xp.clip}
    with gs.sync_guard("error"):
        result = clip[how](x, 1.0, s)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(host(result), [1.0, 1.0, 2.0])



def test_clip_of_a_scalar_is_a_device_scalar(xp):
    """``np.clip(s, lo, hi)`` calls ``s.clip`` (as ``cupy.clip`` does): a GPUScalar, no sync;
    a None bound leaves that side open."""
    s = gs.asscalar(3.0, like=xp.zeros(1))
    with gs.sync_guard("error"):
        results = [np.clip(s, 0, 1.0), np.clip(s, None, 1.0), np.clip(s, 5, None), s.clip(0, 4)]
    assert all(isinstance(r, gs.GPUScalar) and r.dtype == np.float64 for r in results)
    assert [host(r) for r in results] == [1.0, 1.0, 5.0, 3.0]


# ---- static types of the generated operators and helpers ----------------------------------------


def _type_checking_names(path: str, class_name: str | None) -> set[str]:
    """The names declared in the ``if TYPE_CHECKING:`` block of ``class_name`` (or of the module,
    for None) in gpuscalar's source file ``path``: what type checkers see of what is generated
    at run time."""
    import ast  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    tree = ast.parse((Path(gs.__file__).parent / path).read_text())
    body = tree.body
    if class_name is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    blocks = [n for n in body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1
    return {n.target.id for n in blocks[0].body if isinstance(n, ast.AnnAssign)}


def test_declared_operator_types_match_the_operator_tables():
    """GPUScalar's operators are generated from the tables; their static types are declared by
    hand in the class. Both name exactly the same dunders (``__pow__`` with its three-argument
    form), so a new table row without a declaration (or the reverse) fails."""
    generated = {f"__{prefix}{stem}__" for stem in BINARY_OPERATORS for prefix in ("", "r")}
    generated |= {f"__{stem}__" for stem in (*COMPARISON_OPERATORS, *UNARY_OPERATORS)}
    declared = _type_checking_names("scalar.py", "GPUScalar")
    assert declared == generated
    for name in generated:  # and each is there at run time, on every concrete class
        assert callable(getattr(type(gs.asscalar(1.0)), name))


def test_declared_helper_types_match_the_helper_table():
    from gpuscalar import math as gs_math  # noqa: PLC0415

    assert _type_checking_names("math.py", None) == set(gs_math.MATH_FUNCTIONS)
    for public in gs_math.MATH_FUNCTIONS:
        assert getattr(gs, public) is getattr(gs_math, public) is gs_math.HELPERS[public]
        assert gs_math.HELPERS[public].__name__ == public


def test_an_expression_kept_inside_a_loop_body_is_used_with_its_value(xp):
    """A pending scalar larger than `expr.KEEP_NODES` used twice is materialized (kept) at its
    second use. Inside a `gs.while_loop` body the kept array is not cached on the scalar (the
    body is a recipe, evaluated afresh each iteration), so the operator must use the array the
    materialization returned: 0.2's recorded a missing operand there (NaN)."""
    x = xp.zeros(1)
    lr = gs.asscalar(0.5, like=x)

    def body(x):
        y = (((lr * 2.0 + 1.0) - 0.5) * 3.0) + 1.0  # 5 nodes: kept when used twice
        x += y * y

    iterations = gs.while_loop(lambda x: gs.sum(x) < 3.0, body, x, max_iter=10)
    assert int(iterations) == 1
    np.testing.assert_array_equal(host(x), [30.25])


def test_the_modules_above_install_every_declared_member_on_the_class():
    """gpuscalar.operators, .arrays and .math install GPUScalar's members they own on the class
    itself, once, at import (their ``install``): every member the class declares for type
    checkers is there at run time, defined by one of them, and gpuscalar.scalar keeps no
    function of theirs (no hook slots)."""
    import ast  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from gpuscalar import scalar as scalar_module  # noqa: PLC0415

    tree = ast.parse((Path(gs.__file__).parent / "scalar.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPUScalar").body
    block = next(n for n in body
                 if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    declared = {n.target.id if isinstance(n, ast.AnnAssign) else n.name for n in block.body}
    above = {"gpuscalar.operators", "gpuscalar.arrays", "gpuscalar.math"}
    for name in declared:
        member = inspect.getattr_static(gs.GPUScalar, name)
        function = getattr(member, "__func__", member)
        assert function.__module__ in above, name
        assert getattr(type(gs.asscalar(1.0)), name) is not None
    leaked = {name for name, value in vars(scalar_module).items()
              if callable(value) and getattr(value, "__module__", None) in above}
    assert not leaked


def test_the_scalar_layers_import_downwards_only_and_stay_small():
    """gpuscalar.scalar (the scalar itself) imports none of the modules built on it
    (operators, arrays, math: they install its members on the class), operators imports
    neither arrays nor math, arrays not math; and none of the four exceeds 800 lines."""
    import ast  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    package = Path(gs.__file__).parent
    above = {"scalar": {"operators", "arrays", "math"}, "operators": {"arrays", "math"},
             "arrays": {"math"}, "math": set()}
    for module, forbidden in above.items():
        source = (package / f"{module}.py").read_text(encoding="utf-8")
        imported = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported.add((node.module or "").split(".")[0])
                if not node.module:
                    imported.update(alias.name for alias in node.names)
        assert not imported & forbidden, (module, imported & forbidden)
        assert len(source.splitlines()) <= 800, module


def test_every_pending_scalar_is_made_by_the_one_constructor(xp):
    """Pending scalars have one constructor, `gpuscalar.scalar._pending`: the operators' hot
    paths (binary, divmod's pair, one-operand, the folded add), the general path and the
    helpers make exactly the object it makes from the same node (class and every slot)."""
    from gpuscalar import scalar as scalar_module  # noqa: PLC0415

    s = gs.asscalar(1.5, like=xp.zeros(1))
    t = gs.asscalar(2.0, like=xp.zeros(1))
    n = gs.asscalar(3, like=xp.zeros(1))
    with gs.lazy(True):
        made = [s * 2.0, 2.0 * s, s * t, *divmod(s, t), -s, math.floor(s), (n + 1) + 1,
                np.sqrt(s), gs.minimum(s, 1.0), gs.where(s > t, s, t), (s + 1j) * 2.0,
                round(s, 1)]
    for result in made:
        assert not result.is_materialized
        again = scalar_module._pending(type(result), result._node, result._dtype,
                                       result._device)
        assert type(again) is type(result)
        for slot in gs.GPUScalar.__slots__:
            assert getattr(again, slot) is getattr(result, slot), slot


def test_operators_make_the_nodes_make_node_makes(xp):
    """The operators' hot paths write `expr.make_node` out on a known key: each node they make
    (binary, reflected, divmod's pair, the folded add, a node of nodes, a subtraction recorded
    as an add) is the node `make_node` makes from the same op and children (key, size)."""
    from gpuscalar.lazy import expr  # noqa: PLC0415

    s = gs.asscalar(1.5, like=xp.zeros(1))
    t = gs.asscalar(2.0, like=xp.zeros(1))
    n = gs.asscalar(3, like=xp.zeros(1))
    with gs.lazy(True):
        made = [s * 2.0, 2.0 * s, s * t, *divmod(s, t), (s + t) * (s - t), n + 1, n - 1,
                (n + 1) + 1, (n - 1) - 1, (n * 2) - 3, gs.minimum(s, 1.0), gs.minimum(1.0, s),
                0.1 * gs.minimum(1.0, n / 10)]
    for result in made:
        node = result._node
        again = expr.make_node(node.op, node.children)
        assert (again.key, again.size, again.op) == (node.key, node.size, node.op)
        assert all(a is b for a, b in zip(again.children, node.children, strict=True))


def test_operators_convert_each_python_number_once_per_loop(xp):
    """A Python number's conversion to a loop's type is kept (a NumPy scalar is immutable:
    nodes share it), bounded per loop; a float or complex zero is converted each time (its
    signs compare equal), and a number out of the loop's range raises each time."""
    from gpuscalar import operators  # noqa: PLC0415

    s = gs.asscalar(1.5, like=xp.zeros(1))
    n = gs.asscalar(3, like=xp.zeros(1))
    with gs.lazy(True):
        assert (s * 2.0)._node.children[1] is (s * 2.0)._node.children[1]
        assert (n * 7)._node.children[1] is (n * 7)._node.children[1]
        signs = [math.copysign(1.0, (s * zero)._node.children[1]) for zero in (0.0, -0.0, 0.0)]
        assert signs == [1.0, -1.0, 1.0]
        c = gs.asscalar(1.5 + 0.5j, like=xp.zeros(1))
        for zero in (0j, complex(-0.0, -0.0), 0j, complex(0.0, -0.0)):  # complex zeros too
            kept = (c + zero)._node.children[1]
            assert (math.copysign(1.0, kept.real), math.copysign(1.0, kept.imag)) == (
                math.copysign(1.0, zero.real), math.copysign(1.0, zero.imag))
        for value in range(3 * operators.CONSTANTS_PER_LOOP):
            assert float((s * float(value))._node.children[1]) == float(value)
        for _ in range(2):
            with pytest.raises(OverflowError, match="does not fit the int64"):
                n * 2**70
    with gs.lazy(False):
        assert float(s * 2.0) == 3.0 and float(s * -0.0) == -0.0
