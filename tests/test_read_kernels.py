"""A pending GPUScalar's host read on CuPy: one packing ``RawKernel`` (`codegen.read_source`,
`codegen.pack_source` for `gs.read`) into ONE allocation whose first slot is the value's 0-d
array, its bytes read back with `struct` (`gpuscalar.lazy.fusion.unpack`).

Checked here: every generated read kernel compiles with NVRTC (every operation on every dtype,
its leaves packed), it runs the materializing kernel's statements (so no FMA spans two
operations in its machine code either), the launch the recording seam sees (its kind, its
arguments against the C signature, one allocation, the kernel cached, bounded and emptied under
a test seam), the fallbacks (no fusable routine, a structure evaluated in pieces), and that
every path gives the eager value (NumPy, the strict device, CuPy where a GPU runs the tests)."""

from __future__ import annotations

import math
import re
import struct

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import known
from gpuscalar.lazy import codegen, expr, fusion

from . import nvrtc as nv
from .test_codegen import every_operation_recipes, shapes_of

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _device_leaf_positions(node: expr.Node) -> tuple[int, ...]:
    """The positions a first read packs: each device leaf once (`known.unread_positions` with
    nothing known)."""
    seen: set[int] = set()
    positions = []
    for position, leaf in enumerate(expr.leaves_of(node)):
        if not isinstance(leaf, np.generic) and id(leaf) not in seen:
            seen.add(id(leaf))
            positions.append(position)
    return tuple(positions)


def _raw_options() -> list[str]:
    from gpuscalar.devices.cupy.backend import CupyBackend

    return nv.cupy_options(CupyBackend.kernel_options)


# ---- the generated source: NVRTC, the same statements, no FMA across operations --------------


def test_every_operation_read_kernel_compiles(nvrtc):
    """Each operation on each dtype (CuPy's routine, or gpuscalar's own), every device leaf
    packed (so every dtype is a pointer parameter and a packed store), one thread."""
    pytest.importorskip("cupy")
    shapes = shapes_of(every_operation_recipes())
    kernels = [codegen.read_source(node, _device_leaf_positions(node))
               for node in shapes.values()]
    assert len(kernels) > 500
    options = _raw_options()
    for start in range(0, len(kernels), 250):
        part = kernels[start:start + 250]
        ptx = nv.compile_source(nvrtc, nv.join_raw_sources(part), "reads.cu", options)
        assert all(f".entry {kernel.name}" in ptx for kernel in part)


def test_the_read_kernel_runs_the_materializing_statements():
    """The value is computed by the very C `codegen.materialize_spec` runs (`scalar_code`):
    the same routines, casts and barriers, so the same bits."""
    pytest.importorskip("cupy")
    s, t = gs.asscalar(np.float32(1.5)), gs.asscalar(2.0)
    node = (gs.sqrt(s * t + 1.0) / t)._node
    kernel = codegen.read_source(node, (0, 3))
    statements = codegen.materialize_spec(node).operation.splitlines()[:-1]
    assert "\n".join(f"    {line}" for line in statements) in kernel.function
    assert kernel.function.count("_gs_opaque(") == 4
    assert codegen.OPAQUE_PREAMBLE in kernel.preambles
    assert "if (blockIdx.x != 0 || threadIdx.x != 0) return;" in kernel.function
    assert kernel.source.startswith(codegen.cupy_headers())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_no_fma_spans_two_operations_in_the_read_kernels_machine_code(nvrtc, tmp_path, dtype):
    """What the GPU runs (as tests/test_codegen.py checks the materializing kernel)."""
    pytest.importorskip("cupy")
    s, t, u = (gs.asscalar(value, dtype=dtype) for value in (1.1, 2.2, 3.3))
    kernel = codegen.read_source((s * t + u)._node, (0, 1, 2))
    sass = nv.machine_code(nv.compile_source(nvrtc, kernel.source, "read_fma.cu",
                                             _raw_options()), tmp_path)
    assert re.search(r"\b[DF]MUL\b", sass) and re.search(r"\b[DF]ADD\b", sass)
    assert {"float64": "DFMA", "float32": "FFMA"}[dtype] not in sass


def test_the_multi_value_read_kernel_compiles(nvrtc):
    """`gs.read`'s kernel (`codegen.pack_source`): leaves and pending values of several
    dtypes, their leaves after the values."""
    pytest.importorskip("cupy")
    a, z = gs.asscalar(np.float16(0.5)), gs.asscalar(np.complex128(1j))
    node = (gs.asscalar(np.int8(3)) * 2 + 1)._node
    kernel = codegen.pack_source([("leaf", np.dtype(np.float16)), ("node", node, (0,)),
                                  ("leaf", np.dtype(np.complex128))])
    assert kernel.name.startswith(codegen.READ_PREFIX + "many_3_")
    offsets = re.findall(r"&_gs_pack\[(\d+)\]", kernel.function)
    assert offsets == ["0", "16", "32", "48"]
    ptx = nv.compile_source(nvrtc, kernel.source, "pack.cu", _raw_options())
    assert f".entry {kernel.name}" in ptx
    del a, z


# ---- unpacking: struct reads what NumPy's item() reads ----------------------------------------

_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"]


#: itemsize -> the bytes of a quiet NaN with a payload
_PAYLOAD_NANS = {size: np.array([bits], f"u{size}").view(np.uint8)
                 for size, bits in ((2, 0x7E05), (4, 0x7FC0BEEF), (8, 0x7FF80000DEADBEEF))}


def _bits(value):
    """A value's type and exact bits (NaN payloads and signed zeros included)."""
    if isinstance(value, float):
        return float, struct.pack("<d", value)
    if isinstance(value, complex):
        return complex, struct.pack("<dd", value.real, value.imag)
    return type(value), value


@pytest.mark.parametrize("dtypes", [_DTYPES, _DTYPES[::-1], ["float64"], ["float32", "bool"]],
                         ids=["all", "reversed", "float64", "float32-bool"])
def test_unpack_reads_each_slot_as_numpy_item_does(dtypes):
    rng = np.random.default_rng(22)
    dtypes = [np.dtype(d) for d in dtypes]
    packed = rng.integers(0, 256, size=fusion.PACK_SLOT * len(dtypes), dtype=np.uint8)
    for slot, dtype in enumerate(dtypes):
        if dtype.kind == "b":
            packed[fusion.PACK_SLOT * slot] &= 1
        elif dtype.kind == "f":  # a NaN with a payload, a negative zero, an infinity
            special = (_PAYLOAD_NANS[dtype.itemsize] if slot % 3 == 0
                       else np.array([[-0.0, math.inf][slot % 3 - 1]], dtype).view(np.uint8))
            packed[fusion.PACK_SLOT * slot:fusion.PACK_SLOT * slot + dtype.itemsize] = special
    expected = [packed[fusion.PACK_SLOT * k:fusion.PACK_SLOT * k + d.itemsize].view(d)[0].item()
                for k, d in enumerate(dtypes)]
    got = fusion.unpack(packed, dtypes)
    assert [_bits(v) for v in got] == [_bits(v) for v in expected]
    assert [_bits(v) for v in fusion.unpack(packed, dtypes)] == [_bits(v) for v in got]


def test_unpack_readers_are_bounded(monkeypatch):
    """At most `gs.cache_size` readers (a new one past the bound empties the table first)."""
    monkeypatch.setattr(fusion, "_UNPACKERS", {})
    previous = gs.set_cache_size(2)
    try:
        for n in range(1, 6):
            assert fusion.unpack(np.zeros(fusion.PACK_SLOT * n, np.uint8), [F64] * n) == (
                0.0,) * n
            assert len(fusion._UNPACKERS) <= 2
    finally:
        gs.set_cache_size(previous)


# ---- every path gives the eager value -----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128", "int64"])
def test_a_read_gives_the_materialized_value(xp, dtype):
    """A read of a pending expression (on CuPy: the packing RawKernel) gives the bits of its
    materialization (on CuPy: the ElementwiseKernel) and of the eager operations."""
    def build(s, t, u):
        return (s * t + u) * 3 - t

    def leaves():
        return [gs.sum(xp.asarray([v], dtype=dtype)) for v in (1.1, 2.2, 3.3)]

    read = host_value(build(*leaves()))
    materialized = build(*leaves())
    materialized.array  # noqa: B018 - evaluated into its 0-d array, then read
    with gs.lazy(False):
        eager = build(*leaves())
    assert _bits(read) == _bits(host_value(materialized)) == _bits(host_value(eager))


def host_value(s):
    return s.item()


# ---- the launch the recording seam sees (CuPy's dispatch over fake memory) ----------------------


@pytest.fixture
def dev():
    from .cupy_fake import cupy_or_fail, fake_memory
    from .cupy_seam import recording

    cupy_or_fail()
    with fake_memory() as memory, recording(memory) as seam:
        seam.memory = memory
        yield seam


def _leaf(dev, value, dtype=np.float64):
    from .cupy_fake import from_host

    scalar = gs.GPUScalar(from_host(dev.memory, np.asarray(value, dtype)))
    return scalar


def test_a_read_is_one_raw_launch_into_one_allocation(dev):
    from gpuscalar.devices.cupy import fusion as cupy_fusion

    a, b = _leaf(dev, 1.5), _leaf(dev, -2.0, np.float32)
    pending = a * b + 1.0
    dev.clear()
    buffers = len(dev.memory._buffers)
    with gs.count_syncs() as counter:
        pending.item()
    assert counter.count == 1 and counter.device_ops == 1
    assert dev.kinds() == ["raw"]  # its arguments checked against its C signature
    launch = dev.launches[0]
    assert launch.name.startswith(codegen.READ_PREFIX) and launch.args[:2] == ((1,), (1,))
    [packed] = dev.reads
    assert packed.dtype == np.uint8 and packed.shape == (3 * fusion.PACK_SLOT,)
    assert launch.args[2][-1] is packed
    assert len(dev.memory._buffers) == buffers + 1  # ONE allocation
    value = pending.array  # kept: the first slot of that allocation
    assert value.shape == () and value.dtype == np.float64
    assert value.data.ptr == packed.data.ptr
    assert (known.value_of(a.array), known.value_of(b.array)) == (1.5, -2.0)
    assert len(cupy_fusion._RAW_KERNELS) == 1
    dev.clear()
    other = _leaf(dev, 4.0) * _leaf(dev, 0.5, np.float32) + 2.0  # the same structure
    dev.clear()
    other.item()
    assert dev.kinds() == ["raw"] and dev.launches[0].func is launch.func  # compiled once
    assert len(cupy_fusion._RAW_KERNELS) == 1


def test_read_kernels_are_bounded_and_made_through_the_current_seam(dev):
    from gpuscalar.devices.cupy import fusion as cupy_fusion

    assert len(cupy_fusion._RAW_KERNELS) == 0  # emptied while a test seam stands
    previous = gs.set_cache_size(2)
    try:
        for k in range(4):
            leaf = _leaf(dev, 2.0)
            pending = leaf
            for _ in range(k + 1):
                pending = pending * 2.0
            pending.item()
            assert len(cupy_fusion._RAW_KERNELS) <= 2
    finally:
        gs.set_cache_size(previous)


def test_a_structure_cupy_cannot_fuse_is_materialized_then_read(dev, monkeypatch):
    from gpuscalar.devices.cupy import fusion as cupy_fusion

    def unsupported(*args):
        raise codegen.FusionUnsupported("no routine")

    monkeypatch.setattr(codegen, "read_source", unsupported)
    a = _leaf(dev, 3.0)
    pending = a * 2.0 + 1.0
    dev.clear()
    with gs.count_syncs() as counter:
        pending.item()
    assert counter.count == 1 and counter.device_ops == 1
    assert dev.kinds() == ["elementwise"]  # the materializing kernel, then its 0-d array read
    assert [r.shape for r in dev.reads] == [()]
    assert known.value_of(a.array) is known.UNREAD  # nothing packed: the leaf stays unread
    assert None in cupy_fusion._RAW_KERNELS.values()


def test_a_structure_evaluated_in_pieces_is_read_from_its_array(dev, monkeypatch):
    """A new structure of a churning family (`fusion.splits`) gets no read kernel: it is
    evaluated in pieces and its 0-d array read."""
    from gpuscalar.devices.cupy import fusion as cupy_fusion

    monkeypatch.setattr(cupy_fusion, "splits", lambda root, count=True: True)
    a = _leaf(dev, 1.0)
    pending = a
    for _ in range(fusion.SPLIT_NODES + 1):
        pending = pending + 1.0
    dev.clear()
    pending.item()
    assert "raw" not in dev.kinds() and len(dev.reads) == 1 and dev.reads[0].shape == ()
    assert len(cupy_fusion._RAW_KERNELS) == 0


def test_a_read_on_a_device_that_is_not_current_enters_it(dev, monkeypatch):
    """The common read makes no device switch (its device is current); one whose device is not
    current (forced here: the fake memory has one device) enters it for the allocation and the
    launch, with the same kernel and the same packed leaves."""
    entered: list[object] = []
    enter = type(dev).device_context

    def counted(seam, device):
        entered.append(device)
        return enter(seam, device)

    monkeypatch.setattr(type(dev), "device_context", counted)
    first = _leaf(dev, 1.25) * 2.0 + 1.0
    first.item()
    assert entered == [] and dev.kinds()[-1] == "raw"
    kernel = dev.launches[-1].func
    monkeypatch.setattr(type(dev), "is_current_device", lambda seam, device: False)
    leaf = _leaf(dev, -3.5)
    second = leaf * 2.0 + 1.0
    dev.clear()
    second.item()
    assert entered == [0] and dev.kinds() == ["raw"] and dev.launches[0].func is kernel
    assert known.value_of(leaf.array) == -3.5 and second.array.shape == ()
