"""Calls *into* CuPy with GPUScalars, on real ``cupy.ndarray``s over fake device memory.

Why: CuPy's own dispatch decides what happens to a GPUScalar handed to it, and neither NumPy nor
the strict device runs that code: in-place operators pass their output positionally
(``_add(x, s, x)``), ``cupy.where``/``clip``/``copyto`` are CuPy ufuncs that NumPy does not have,
``cupy.full`` asks NumPy for the fill value's dtype, and an array on the left of an operator
goes through NumPy's dispatch (unless the right operand's ``__array_ufunc__`` is None), whose
probe of ``__cuda_array_interface__`` would evaluate a pending scalar on its own. Each call
here must be handled by gpuscalar (its launches recorded and checked against CuPy by
`tests.cupy_seam`) or get as far as CUDA (`reaches_cuda`); a ``TypeError``,
``AttributeError`` or ``SyncError`` (every test runs under ``sync_guard("error")``) is a
failure. CuPy is installed in CI: these tests fail, never skip, where it is missing there.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest

import gpuscalar as gs

from .cupy_fake import cupy_or_fail, fake_memory, from_host, host_view, reaches_cuda
from .cupy_seam import recording

X = np.array([0.5, 1.0, 2.5], dtype=np.float32)
S = 2.0  # the GPUScalar's value (float64): a Python float's stand-in


@pytest.fixture
def env(monkeypatch):
    """``(cupy, memory, seam)``: fake memory, gpuscalar's launches recorded, syncs refused.

    CuPy exports the CUDA Array Interface v2 here (no ``stream`` entry): the v3 export asks
    the CUDA runtime for the current stream, which would stop a call that reads
    ``s.__cuda_array_interface__`` before gpuscalar's part could be seen."""
    cupy = cupy_or_fail()
    monkeypatch.setattr(cupy._util, "CUDA_ARRAY_INTERFACE_EXPORT_VERSION", 2)
    with fake_memory() as memory, recording(memory) as seam, gs.sync_guard("error"):
        yield cupy, memory, seam


def _scalar(memory, seam, pending: bool):
    """A float64 GPUScalar holding `S`, materialized or pending (``leaf * 2.0``, unevaluated).

    ``gs.GPUScalar(a)`` is a value, like ``float(a)``: it copies ``a`` on the device (one
    ``cupy.copy`` launch, checked here). That launch is then dropped from the recording, so each
    test counts the launches of the operation under test alone, as strictly as before."""
    source = from_host(memory, np.float64(S if not pending else S / 2))
    before = len(seam.launches)
    leaf = gs.GPUScalar(source)
    copies = seam.launches[before:]
    assert [(c.kind, c.name) for c in copies] == [("function", "copy")], seam.kinds()
    assert copies[0].args[0] is source and leaf.array is not source
    del seam.launches[before:]
    return leaf * 2.0 if pending else leaf


PENDING = pytest.mark.parametrize("pending", [False, True], ids=["materialized", "pending"])

IN_PLACE = {"iadd": operator.iadd, "isub": operator.isub, "imul": operator.imul,
            "itruediv": operator.itruediv, "ifloordiv": operator.ifloordiv,
            "imod": operator.imod, "ipow": operator.ipow}
BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
          "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
          "pow": operator.pow, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
          "ge": operator.ge, "eq": operator.eq, "ne": operator.ne,
          "maximum": lambda a, b: gs.maximum(a, b)}


# ---- operators -------------------------------------------------------------------------------


@PENDING
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_in_place_operator_is_one_launch_into_the_array(env, name, pending):
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, pending)
    result = IN_PLACE[name](x, s)
    assert result is x  # CuPy's positional output became out=, not a third input
    assert seam.count() == 1, seam.kinds()
    launch = seam.launches[0]
    if not pending:  # a CuPy ufunc writing into x, in x's dtype (parity: s acts as 2.0)
        assert launch.kwargs["out"] is x
        expected = IN_PLACE[name](X.copy(), S)
        np.testing.assert_allclose(host_view(x), expected, rtol=1e-6)
    else:  # one fused kernel computing s and the update, x among its outputs
        assert any(a is x for a in launch.args[len(launch.args) // 2:])


def test_in_place_keeps_the_same_kind_rule(env):
    cupy, memory, seam = env
    x = from_host(memory, np.arange(3, dtype=np.int64))
    s = _scalar(memory, seam, False)
    with pytest.raises(TypeError, match="same_kind"):
        x += s  # as x += 2.0: float64 into int64 is refused
    with pytest.raises(TypeError, match="immutable"):
        cupy.add(x, x, s)  # a GPUScalar as the (positional) output


@PENDING
@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("side", ["array_left", "scalar_left"])
def test_binary_operator_is_one_launch(env, name, side, pending):
    """``g * lr_expr`` and ``lr_expr * g``: one launch each, a pending scalar folded in."""
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, pending)
    result = BINARY[name](x, s) if side == "array_left" else BINARY[name](s, x)
    assert isinstance(result, cupy.ndarray)
    expected = BINARY[name](X, S) if side == "array_left" else BINARY[name](S, X)
    assert result.dtype == np.asarray(expected).dtype  # parity with the Python float
    assert seam.count() == 1, seam.kinds()
    assert s.is_materialized is not pending  # folded: never evaluated on its own


def test_array_operators_defer_to_the_scalar_and_export_still_works(env):
    """CuPy's operators read ``__array_ufunc__`` from the instance (None: defer to the reflected
    operator); NumPy reads it from the type, so NumPy ufuncs still reach GPUScalar."""
    cupy, memory, seam = env
    s, p = _scalar(memory, seam, False), _scalar(memory, seam, True)
    assert s.__array_ufunc__ is None and type(s).__array_ufunc__ is not None
    assert isinstance(np.sqrt(s), gs.GPUScalar) and isinstance(np.add(s, 1.0), gs.GPUScalar)
    assert seam.count() == 0  # all lazy
    assert s.__cuda_array_interface__["shape"] == ()
    assert p.__cuda_array_interface__["shape"] == ()  # exporting evaluates: one launch
    assert p.is_materialized and seam.count() == 1
    assert p.__cuda_array_interface__["data"] == p.array.__cuda_array_interface__["data"]


# ---- CuPy ufuncs and kernels -------------------------------------------------------------------


@PENDING
def test_cupy_ufuncs(env, pending):
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, pending)
    root = cupy.sqrt(s)
    assert isinstance(root, gs.GPUScalar) and seam.count() == 0  # lazy: nothing launched
    assert cupy.add(x, s, out=x) is x
    assert cupy.add(x, s, x) is x  # the output positionally, as CuPy's operators pass it
    assert seam.count() == 2, seam.kinds()


@PENDING
def test_user_elementwise_kernel_reads_the_scalar_on_the_device(env, pending):
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, pending)
    kernel = cupy.ElementwiseKernel("float32 a, float64 b", "float32 c", "c = a * b",
                                    "test_cupy_into_scale")
    result = kernel(x, s)
    assert isinstance(result, cupy.ndarray) and result.shape == X.shape
    launch = seam.launches[-1]
    assert launch.func is kernel and launch.args[1] is s.array  # the 0-d array, no host value
    assert seam.count() == 1 + pending  # a pending scalar is evaluated first


# ---- CuPy's non-NumPy ufuncs: where, clip, copy --------------------------------------------------


@PENDING
def test_where_with_a_scalar_branch(env, pending):
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, pending)
    condition = from_host(memory, np.array([True, False, True]))
    result = cupy.where(condition, x, s)
    assert result.dtype == np.float32  # as where(c, x, 2.0)
    if not pending:  # (the recorder does not compute a fused kernel's values)
        np.testing.assert_array_equal(host_view(result), np.where([True, False, True], X, S))
    assert seam.launches[-1].name == "where"


@PENDING
@pytest.mark.parametrize("how", ["cupy.clip", "x.clip", "np.clip"])
def test_clip_with_a_scalar_bound(env, how, pending):
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, pending)
    clip = {"cupy.clip": cupy.clip, "np.clip": np.clip, "x.clip": lambda a, lo, hi: a.clip(lo, hi)}
    result = clip[how](x, 1.0, s)
    assert result.dtype == np.float32  # as clip(x, 1.0, 2.0)
    if not pending:
        np.testing.assert_array_equal(host_view(result), np.clip(X, 1.0, S))


@PENDING
def test_clip_of_a_scalar_is_a_scalar(env, pending):
    cupy, memory, seam = env
    s = _scalar(memory, seam, pending)
    result = cupy.clip(s, 0, 1.0)  # CuPy calls s.clip
    assert isinstance(result, gs.GPUScalar) and result.dtype == np.float64
    assert seam.count() == 0  # lazy


@PENDING
def test_copyto_and_full_and_setitem_copy_on_the_device(env, pending):
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, pending)
    cupy.copyto(x, s)
    assert seam.launches[-1].name == "copyto" and seam.launches[-1].args[1] is s.array
    seam.clear()
    # full asks NumPy for the fill value's dtype only: no host read; the copy reads s.array
    filled = cupy.full((2,), s)
    assert filled.dtype == np.float64
    if not pending:
        np.testing.assert_array_equal(host_view(x), np.full(3, S, np.float32))
        np.testing.assert_array_equal(host_view(filled), [S, S])
    typed = cupy.full((2,), s, dtype=np.float32)
    assert typed.dtype == np.float32
    assert seam.count("function") == 2
    # x[...] = s: CuPy converts s to its 0-d array (no sync) and copies it itself
    assert reaches_cuda(x.__setitem__, Ellipsis, s)


def test_fill_with_a_scalar_syncs_in_cupy(env):
    """``x.fill(s)``: CuPy 14 compares ``s == 0`` on the device and reads the answer back (its
    own sync, documented); it never reads the value through gpuscalar. ``x[...] = s`` is the
    no-sync way."""
    cupy, memory, seam = env
    x, s = from_host(memory, X), _scalar(memory, seam, False)
    assert reaches_cuda(x.fill, s)  # CuPy's own comparison kernel, before its read
    assert seam.count() == 0
