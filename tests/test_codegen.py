"""CUDA generation for pending expressions: CuPy's routines and casts, determinism, no FMA
across operations, and an NVRTC compile of every generated shape (no GPU needed)."""

from __future__ import annotations

import random
import re
import warnings

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar.devices.cupy.backend import CupyBackend
from gpuscalar.devices.cupy.fusion import eager_cupy_op
from gpuscalar.lazy import codegen, expr

from . import nvrtc as nv
from . import recipes

cupy = pytest.importorskip("cupy")  # the ufunc tables and code generator exist without a GPU

F32, F64, I8, I64 = (np.dtype(n) for n in ("float32", "float64", "int8", "int64"))


def shapes_of(recipe_list) -> dict[int, tuple]:
    """The distinct pending expressions the recipes build (lazily; nothing is evaluated)."""
    found: dict[int, tuple] = {}
    for recipe in recipe_list:
        with gs.lazy(True), warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                value = recipes.build(recipe)
            except (TypeError, ValueError, OverflowError, ZeroDivisionError):
                continue
        if isinstance(value, gs.GPUScalar) and not value.is_materialized:
            found.setdefault(value._node[0], value._node)
    return found


#: Structure keys whose kernels compiled in this session (each shape is compiled once).
COMPILED: set[int] = set()


def compile_shapes(nvrtc, shapes: dict[int, tuple], chunk: int = 250) -> int:
    """Compile the materializing kernel of every shape not compiled yet in this session
    (CuPy's exact source); returns how many shapes are now known to compile. Every shape has a
    routine (CuPy's, or gpuscalar's own where CuPy has no loop, as for complex logical ufuncs):
    one without fails the test."""
    specs = []
    for key, node in shapes.items():
        if key in COMPILED:
            continue
        try:
            specs.append(codegen.materialize_spec(node))
        except codegen.FusionUnsupported as error:
            pytest.fail(f"{expr.describe_structure(key)} has no routine: {error}")
    options = nv.cupy_options()
    for start in range(0, len(specs), chunk):
        part = specs[start:start + chunk]
        ptx = nv.compile_source(nvrtc, nv.join_sources(part, array_ndim=0), "shapes.cu", options)
        assert all(f".entry {spec.name}" in ptx for spec in part)
    COMPILED.update(shapes)
    return sum(1 for key in shapes if key in COMPILED)


def every_operation_recipes():
    """Each operation on each dtype, with a device or Python second operand of each kind."""
    for name, (arity, _) in sorted(recipes.OPERATIONS.items()):
        for dtype in recipes.DTYPES:
            for python in (None, 3, 0.5, True, 1j):
                children = [("dev", dtype, recipes.device_value(dtype, 2.5))]
                children += [("py", python) if python is not None else
                             ("dev", dtype, recipes.device_value(dtype, -1.5))] * (arity - 1)
                yield (name, *children)


# ---- mirrors of CuPy ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "expected"),
    [("float32", "float64", "x"), ("bool", "float32", "(x) ? 1 : 0"),
     ("complex64", "float32", "(x).real()"), ("complex128", "bool", "(x) != "),
     ("int8", "int64", "x")],
)
def test_casts_are_cupys(src, dst, expected):
    assert codegen.cast_expression(np.dtype(src), np.dtype(dst), "x").startswith(expected)


def test_the_exact_loop_is_preferred_and_cupys_own_choice_fills_gaps():
    add = expr.get_op("ufunc", "add", (F32, F32), (F32,))
    _, routine = codegen.cupy_op(add)
    assert routine.in_types == (F32, F32) and routine.routine == "out0 = in0 + in1"
    # CuPy has no int8 comparison loop: it compares int8 values in its int64 loop (same values)
    less = expr.get_op("ufunc", "less", (I8, I8), (np.dtype(bool),))
    _, routine = codegen.cupy_op(less)
    assert routine.in_types == (I64, I64)
    with pytest.raises(codegen.FusionUnsupported, match="no ufunc"):
        codegen.cupy_op(expr.get_op("ufunc", "no_such_ufunc", (F32,), (F32,)))


def test_eager_loop_choice_follows_cupys_rules():
    multiply = cupy.multiply
    # a weak Python float with a float32 array: the float32 loop (NEP 50, as NumPy)
    assert eager_cupy_op(multiply, (F32, F64), (False, float), None).in_types == (F32, F32)
    # two strong dtypes: promotion
    assert eager_cupy_op(multiply, (F32, F64), (False, False), None).in_types == (F64, F64)
    # dtype= pins the output loop
    assert eager_cupy_op(multiply, (F64, F64), (False, False), F32).out_types == (F32,)


# ---- the generated source -----------------------------------------------------------------------


def test_source_depends_on_structure_not_values():
    a, b = gs.asscalar(np.float32(1.25)), gs.asscalar(np.float32(-3.5))
    first = codegen.materialize_spec(((a * 0.3 + 7.0) / a)._node)
    second = codegen.materialize_spec(((b * 11.0 + 2.0) / b)._node)
    assert first == second
    assert "0.3" not in first.operation and "7" not in first.operation  # values are arguments
    # the float32 leaves stay raw float32 arguments; a float32 GPUScalar with a Python float
    # computes at the Python float's precision (it is the number it replaces), so the constants
    # are float64 arguments and so is the result (they were float32 before that rule)
    assert first.in_params.count("raw float32") == 2
    assert "float64 _gs_c1" in first.in_params and "float64 _gs_c2" in first.in_params
    assert first.out_params.startswith("float64 ")


def test_each_operation_value_passes_an_opaque_barrier():
    s = gs.asscalar(2.0)
    spec = codegen.materialize_spec((s * s + s)._node)
    assert spec.operation.count("_gs_opaque(") == 2
    assert codegen.OPAQUE_PREAMBLE in spec.preambles


def test_no_fma_spans_two_operations(nvrtc):
    """s * t + u as two eager kernels cannot be an FMA; the fused kernel must not be either."""
    s, t, u = (gs.asscalar(v) for v in (1.1, 2.2, 3.3))
    spec = codegen.materialize_spec((s * t + u)._node)
    ptx = nv.compile_source(nvrtc, nv.join_sources([spec], array_ndim=0), "fma.cu",
                            nv.cupy_options())
    body = ptx[ptx.index(f".entry {spec.name}"):]
    assert re.search(r"\bmul(\.rn)?\.f64", body) and re.search(r"\badd(\.rn)?\.f64", body)
    assert not re.search(r"\bfma\.rn\.f64", body)


_CONTRACTED = {"float64": "DFMA", "float32": "FFMA"}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("build", [
    lambda s, t, u, v: s * t + u,
    lambda s, t, u, v: s * t - u * v,
    lambda s, t, u, v: (s - t * u) * v,
    lambda s, t, u, v: u + s * t + v,
], ids=["st+u", "st-uv", "(s-tu)v", "u+st+v"])
def test_no_fma_spans_two_operations_in_the_machine_code(nvrtc, tmp_path, dtype, build):
    """What the GPU runs: ptxas contracts a PTX multiply with the add that reads it unless an
    instruction with a rounding mode stands between them (an H200 run found the lazy kernels of
    a MINRES port contracted where the eager kernels, one per operation, cannot be)."""
    s, t, u, v = (gs.asscalar(value, dtype=dtype) for value in (1.1, 2.2, 3.3, 4.4))
    spec = codegen.materialize_spec(build(s, t, u, v)._node)
    ptx = nv.compile_source(nvrtc, nv.join_sources([spec], array_ndim=0), "fma.cu",
                            nv.cupy_options())
    sass = nv.machine_code(ptx, tmp_path)
    assert f"Function : {spec.name}" in sass or spec.name in sass
    assert re.search(r"\b[DF]MUL\b", sass) and re.search(r"\b[DF]ADD\b", sass)
    assert _CONTRACTED[dtype] not in sass


@pytest.mark.parametrize("barrier", ["none", "empty asm (0.3's)"])
def test_the_machine_code_check_finds_a_contraction(nvrtc, tmp_path, barrier):
    """The check above can fail: without a barrier, and with 0.3's empty ``asm volatile`` (which
    stops NVVM but not ptxas), ``s * t + u`` runs as one DFMA."""
    s, t, u = (gs.asscalar(v) for v in (1.1, 2.2, 3.3))
    spec = codegen.materialize_spec((s * t + u)._node)
    source = nv.join_sources([spec], array_ndim=0)
    assert codegen.OPAQUE_PREAMBLE in source
    empty = ('template <typename T> __device__ __forceinline__ T _gs_opaque(T x) { return x; }\n'
             '__device__ __forceinline__ double _gs_opaque(double x) {'
             ' asm volatile("" : "+d"(x)); return x; }\n')
    planted = codegen.OPAQUE_PREAMBLE.split("template")[0] + (
        "template <typename T> __device__ __forceinline__ T _gs_opaque(T x) { return x; }\n"
        if barrier == "none" else empty) + "#endif\n"
    ptx = nv.compile_source(nvrtc, source.replace(codegen.OPAQUE_PREAMBLE, planted), "bare.cu",
                            nv.cupy_options())
    assert "DFMA" in nv.machine_code(ptx, tmp_path)


def test_without_the_barrier_the_compiler_would_contract(nvrtc):
    """The FMA check can fail: the same expression without the barrier becomes an FMA."""
    s, t, u = (gs.asscalar(v) for v in (1.1, 2.2, 3.3))
    spec = codegen.materialize_spec((s * t + u)._node)
    bare = spec.operation.replace("_gs_opaque(", "(")
    unguarded = codegen.KernelSpec(spec.in_params, spec.out_params, bare, spec.name + "_bare",
                                   spec.preambles)
    ptx = nv.compile_source(nvrtc, nv.join_sources([unguarded], array_ndim=0), "bare.cu",
                            nv.cupy_options())
    assert re.search(r"\bfma\.rn\.f64", ptx)


def test_a_kept_scalar_is_stored_once_by_the_consuming_kernel(nvrtc):
    lr = gs.minimum(1.0, gs.asscalar(0.5) * 3) / 10 + 1
    routine = eager_cupy_op(cupy.multiply, (F32, F64), (False, False), F32)
    spec = codegen.fused_spec(
        "multiply", routine,
        [codegen.ArrayOperand("array", F32), codegen.ArrayOperand("scalar", F64, lr._node, True)],
        (F32,),
    )
    assert spec.out_params == "float32 _gs_out0, raw float64 _gs_w1"
    assert "if (blockIdx.x == 0 && threadIdx.x == 0) _gs_w1[0] = _gs_s1_v3;" in spec.loop_prep
    nv.compile_source(nvrtc, nv.join_sources([spec]), "kept.cu", nv.cupy_options())


def test_fused_array_kernel_computes_the_scalar_once_per_thread(nvrtc):
    s = gs.asscalar(np.float64(0.5))
    lr = gs.minimum(1.0, s * 3) / 10
    routine = eager_cupy_op(cupy.multiply, (F32, F64), (False, False), F32)
    spec = codegen.fused_spec(
        "multiply", routine,
        [codegen.ArrayOperand("array", F32), codegen.ArrayOperand("scalar", F64, lr._node)],
        (F32,),
    )
    assert "_gs_s1_v2" in spec.loop_prep and "_gs_s1_v" not in spec.operation.replace(
        "_gs_s1_v2", "")
    assert "in1(_gs_s1_v2)" in spec.operation  # the scalar, cast to the loop's float32
    nv.compile_source(nvrtc, nv.join_sources([spec]), "fused.cu", nv.cupy_options())


#: Ufuncs with no complex loop in NumPy or CuPy: there is no fused kernel to compile.
REAL_ONLY_UFUNCS = {"arctan2", "divmod"}


@pytest.mark.parametrize(("ufunc_name", "array_dtype"), [
    (ufunc_name, array_dtype)
    for ufunc_name in ["add", "subtract", "multiply", "true_divide", "power", "less", "maximum",
                       "arctan2", "divmod"]
    for array_dtype in ["float16", "float32", "float64", "int32", "complex64", "bool"]
    if not (ufunc_name in REAL_ONLY_UFUNCS and array_dtype == "complex64")
])
def test_fused_array_kernels_compile(nvrtc, ufunc_name, array_dtype):
    array_dtype = np.dtype(array_dtype)
    pending = (gs.asscalar(2.5) * 3 + 1)._node
    operands = [
        [codegen.ArrayOperand("array", array_dtype), codegen.ArrayOperand("scalar", F64, pending)],
        [codegen.ArrayOperand("scalar", F64, pending, keep=True),
         codegen.ArrayOperand("array", array_dtype)],
        [codegen.ArrayOperand("array", array_dtype), codegen.ArrayOperand("scalar", F32)],
    ]
    ufunc = getattr(cupy, ufunc_name)
    specs = []
    for described in operands:
        in_types = tuple(d.dtype for d in described)
        try:
            getattr(np, ufunc_name).resolve_dtypes(in_types + (None,) * ufunc.nout)
        except TypeError:
            continue  # NumPy has no such loop: gpuscalar raises before CuPy is asked
        routine = eager_cupy_op(ufunc, in_types, (False, False), None)
        if routine is None or not isinstance(routine.routine, str):
            continue  # CuPy itself has no loop for these dtypes (eager raises too)
        specs.append(codegen.fused_spec(ufunc_name, routine, described,
                                        tuple(routine.out_types)))
    assert specs, f"no {ufunc_name} kernel for {array_dtype} was generated"
    nv.compile_source(nvrtc, nv.join_sources(specs), "fused.cu", nv.cupy_options())


# ---- every shape compiles -----------------------------------------------------------------------


def test_every_operation_on_every_dtype_compiles(nvrtc):
    shapes = shapes_of(every_operation_recipes())
    assert compile_shapes(nvrtc, shapes) == len(shapes) > 500


def test_seeded_random_shapes_compile(nvrtc):
    rng = random.Random(2026)
    shapes = shapes_of(recipes.random_recipe(rng) for _ in range(300))
    assert compile_shapes(nvrtc, shapes) == len(shapes) > 100


def test_the_packed_read_kernel_compiles(nvrtc):
    """A host read of a pending expression on CuPy (`codegen.read_source`): a one-thread
    RawKernel running the materializing kernel's statements, then packing the value and each
    unknown device leaf into uint8 bytes, one 16-byte slot each, for one transfer (a complex
    leaf and a float32 leaf of a float64 value here)."""
    a, z = gs.asscalar(np.float32(1.25)), gs.asscalar(np.complex64(1j))
    node = (a * 2.0 + abs(z) / a)._node
    leaves = expr.leaves_of(node)  # a, the constant 2.0, z, a again
    assert leaves[0] is leaves[3] is a.array and leaves[2] is z.array
    extras = (0, 2)  # each device leaf once, as gpuscalar.reads asks for them
    kernel = codegen.read_source(node, extras)
    assert kernel.name.startswith("gpuscalar_read_") and kernel.name.endswith("_2")
    materialize = codegen.materialize_spec(node)
    statements = materialize.operation.splitlines()[:-1]  # (its last line stores _gs_out)
    assert "\n".join(f"    {line}" for line in statements) in kernel.function  # the same C
    signature = kernel.function.split(") {")[0]
    assert signature.endswith(", unsigned char* __restrict__ _gs_pack")
    assert signature.count("const float* __restrict__") == 2  # a (twice: a leaf each time)
    assert "const double _gs_c1" in signature  # the constant, by value
    stores = re.findall(r"reinterpret_cast<([\w:<>]+)\*>\(&_gs_pack\[(\d+)\]\)",
                        kernel.function)
    assert [offset for _, offset in stores] == ["0", "16", "32"]
    assert stores[0][0] == "double" and stores[1][0] == "float"
    assert "complex<float>" in stores[2][0]
    ptx = nv.compile_source(nvrtc, kernel.source, "read.cu",
                            nv.cupy_options(CupyBackend.kernel_options))
    assert f".entry {kernel.name}" in ptx


def test_the_compile_check_can_fail(nvrtc):
    spec = codegen.materialize_spec((gs.asscalar(1.0) + 2.0)._node)
    broken = codegen.KernelSpec(spec.in_params, spec.out_params,
                                spec.operation.replace("in0 + in1", "in0 + undefined_helper(in1)"),
                                spec.name, spec.preambles)
    with pytest.raises(pytest.fail.Exception, match="undefined_helper"):
        nv.compile_source(nvrtc, nv.join_sources([broken], array_ndim=0), "broken.cu",
                          nv.cupy_options())


# ---- another CuPy without the private internals: unfused, never broken --------------------------


def test_missing_cupy_internals_make_fusion_unsupported(monkeypatch):
    """Code generation reads CuPy's private pieces; a CuPy without one of them gets
    `FusionUnsupported` (the caller evaluates eagerly), not an AttributeError."""
    from cupy._core import _scalar

    from gpuscalar.devices.cupy import fusion

    node = (gs.asscalar(np.float32(1.5)) * 2.0 + 1.0)._node
    monkeypatch.delattr(_scalar, "get_typename")
    with pytest.raises(codegen.FusionUnsupported, match="get_typename"):
        codegen.materialize_spec(node)
    monkeypatch.undo()
    fake = type("ufunc", (), {"_ops": type("ops", (), {"ops": ()})(), "_preamble": "",
                              "_loop_prep": ""})()
    monkeypatch.setattr(cupy, "sin", fake)  # a routine table without CuPy 14's lookup
    sine = expr.get_op("ufunc", "sin", (F64,), (F64,))
    with pytest.raises(codegen.FusionUnsupported, match="_ops"):
        codegen.cupy_op(sine)
    monkeypatch.setattr(fusion, "_KERNELS", fusion.BoundedCache())
    assert fusion._cached_kernel(("materialize", 0), lambda: codegen.materialize_spec(
        gs.sin(gs.asscalar(1.0) * 2)._node)) is None  # None: evaluated eagerly


def test_missing_cupy_internals_make_array_operations_eager(monkeypatch):
    from cupy._core import _scalar

    from gpuscalar.devices import CUPY
    from gpuscalar.devices.cupy import fusion

    fake = type("ufunc", (), {})()  # no _ops, no _out_ops
    assert fusion.eager_cupy_op(fake, (F32, F32), (False, False), None) is None
    assert fusion.eager_cupy_op(fake, (), (), F32) is None
    monkeypatch.setattr(cupy, "add", fake)
    monkeypatch.setattr(fusion, "_PINNED", fusion.BoundedCache())
    assert fusion.dtype_pins_loop("add", F32) is False  # CuPy's own promotion, no dtype=
    monkeypatch.delattr(_scalar, "numpy_dtype_from_pyscalar")
    assert fusion._fused_on_cupy(CUPY, "multiply", [], {}, {}, frozenset()) is NotImplemented
