"""AVX-512 VNNI building blocks for numba kernels: host feature check, ISA markers and llvmlite IR emitters.

Kernels written with these helpers are compiled per :class:`Isa` (an argument of the jitted function, so the
numba cache holds one version per ISA): ``VNNI512`` emits ``vpdpbusd``/``vpmultishiftqb``/``vcvtph2ps``,
``PORTABLE`` emits plain LLVM vector IR (zext/sext/mul/shuffle, integer fp16 decoding) that any LLVM target
compiles. Both give the same bits: the integer dot products are exact and the fp16 conversions are exact.
``HOST_ISA`` is ``VNNI512`` when llvmlite reports AVX-512 F/BW/VNNI on the host CPU, else ``PORTABLE``.

Vectors are 512 bits: ``I32X16`` (4 bytes per 32-bit lane for the dot products), ``F32X16``.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import NativeValue
from numba.extending import intrinsic, models, register_model, typeof_impl, unbox

_FEATURES = {name for name, on in llvm.get_host_cpu_features().items() if on}
#: the host can run vpdpbusd on zmm registers.
HAS_AVX512_VNNI = {"avx512f", "avx512bw", "avx512vnni"} <= _FEATURES
#: the host has vpmultishiftqb (AVX-512 VBMI) and vcvtph2ps (F16C).
HAS_AVX512_VBMI = HAS_AVX512_VNNI and "avx512vbmi" in _FEATURES
HAS_F16C = "f16c" in _FEATURES

I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
I8X64 = ir.VectorType(I8, 64)
I16X16 = ir.VectorType(I16, 16)
I32X8 = ir.VectorType(I32, 8)
I32X16 = ir.VectorType(I32, 16)
I64X8 = ir.VectorType(I64, 8)
F32X16 = ir.VectorType(F32, 16)


# --------------------------------------------------------------------------------------------- ISA markers


class Isa:
    """Which instructions a kernel is compiled with (pass it to the jitted kernel as an argument)."""

    def __init__(self, name: str, native: bool) -> None:
        self.name = name
        self.native = native

    def __repr__(self) -> str:
        return f"Isa({self.name})"

    def __reduce__(self) -> tuple:
        return (_isa_by_name, (self.name,))


class IsaType(types.Type):
    """numba type of an :class:`Isa`; code generators read ``native`` from it."""

    def __init__(self, name: str, native: bool) -> None:
        self.native = native
        super().__init__(name=f"Isa[{name}]")


register_model(IsaType)(models.OpaqueModel)


@typeof_impl.register(Isa)
def _typeof_isa(val: Isa, c: object) -> IsaType:
    return IsaType(val.name, val.native)


@unbox(IsaType)
def _unbox_isa(typ: IsaType, obj: object, c: object) -> NativeValue:
    return NativeValue(c.context.get_dummy_value())


VNNI512 = Isa("vnni512", True)
PORTABLE = Isa("portable", False)
#: the ISA kernels use on this host.
HOST_ISA = VNNI512 if HAS_AVX512_VNNI else PORTABLE


def _isa_by_name(name: str) -> Isa:
    return VNNI512 if name == VNNI512.name else PORTABLE


def isa_native(isa_type: types.Type) -> bool:
    """Whether a kernel typed with this IsaType is compiled with the native AVX-512 instructions."""
    if not isinstance(isa_type, IsaType):
        raise TypeError(f"expected an Isa argument, got {isa_type}")
    if isa_type.native and not HAS_AVX512_VNNI:
        raise RuntimeError("the VNNI512 ISA was requested but the host CPU lacks AVX-512 VNNI")
    return isa_type.native


# --------------------------------------------------------------------------------------------- IR emitters


def array_ptr(context, builder, aryty, ary) -> ir.Value:  # noqa: ANN001
    """i8* to the first element of a numba array value."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(data, I8.as_pointer())


def byte_ptr(builder: ir.IRBuilder, base: ir.Value, offset: ir.Value | int) -> ir.Value:
    """base (i8*) + offset bytes."""
    off = offset if isinstance(offset, ir.Value) else ir.Constant(I64, offset)
    return builder.gep(base, [off])


def load(builder: ir.IRBuilder, ptr: ir.Value, ty: ir.Type) -> ir.Value:
    """Unaligned load of a value of type ty at an i8* address."""
    return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)


def store(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    """Unaligned store at an i8* address."""
    builder.store(value, builder.bitcast(ptr, value.type.as_pointer()), align=1)


def splat(builder: ir.IRBuilder, scalar: ir.Value, vty: ir.VectorType) -> ir.Value:
    """A vector with every lane = scalar."""
    undef = ir.Constant(vty, ir.Undefined)
    one = builder.insert_element(undef, scalar, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, vty.count), None))


def const_splat(vty: ir.VectorType, value: int | float) -> ir.Constant:
    return ir.Constant(vty, [ir.Constant(vty.element, value)] * vty.count)


def _lanes(builder: ir.IRBuilder, vec: ir.Value, idx: list[int]) -> ir.Value:
    mask = ir.Constant(ir.VectorType(I32, len(idx)), [ir.Constant(I32, i) for i in idx])
    return builder.shuffle_vector(vec, ir.Constant(vec.type, ir.Undefined), mask)


def _call(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    module = builder.module
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = module.globals.get(name) or ir.Function(module, fnty, name)
    return builder.call(fn, args)


def dpbusd(builder: ir.IRBuilder, acc: ir.Value, a_u8: ir.Value, b_s8: ir.Value, native: bool) -> ir.Value:
    """acc (i32x16) + per lane Σ_{t<4} u8(a byte 4j+t)·s8(b byte 4j+t): AVX-512 VNNI ``vpdpbusd`` (no saturation)."""
    if native:
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", I32X16, [acc, a_u8, b_s8])
    wide = ir.VectorType(I32, 64)
    a = builder.zext(builder.bitcast(a_u8, I8X64), wide)
    b = builder.sext(builder.bitcast(b_s8, I8X64), wide)
    prod = builder.mul(a, b)
    total = acc
    for t in range(4):
        total = builder.add(total, _lanes(builder, prod, [4 * j + t for j in range(16)]))
    return total


#: vpmultishiftqb control: output byte e of a qword takes the 8 bits at offset 4e of the source qword.
_NIBBLE_OFFSETS = ir.Constant(I8X64, [ir.Constant(I8, 4 * (e % 8)) for e in range(64)])


def spread_nibbles(builder: ir.IRBuilder, ptr: ir.Value, native: bool) -> ir.Value:
    """Load 16 uint16 at ptr; lane j of the i32x16 result holds the four 4-bit fields of uint16 j, one per byte
    (LSB first): byte 4j+e = (u16[j] >> 4e) & 15."""
    if native and HAS_AVX512_VBMI:
        pairs = builder.zext(load(builder, ptr, I32X8), I64X8)
        fields = _call(
            builder, "llvm.x86.avx512.pmultishift.qb.512", I8X64, [_NIBBLE_OFFSETS, builder.bitcast(pairs, I8X64)]
        )
        return builder.bitcast(builder.and_(fields, const_splat(I8X64, 15)), I32X16)
    x = builder.zext(load(builder, ptr, I16X16), I32X16)
    x = builder.and_(builder.or_(x, builder.shl(x, const_splat(I32X16, 8))), const_splat(I32X16, 0x00FF00FF))
    return builder.and_(builder.or_(x, builder.shl(x, const_splat(I32X16, 4))), const_splat(I32X16, 0x0F0F0F0F))


def f16_to_f32(builder: ir.IRBuilder, ptr: ir.Value, native: bool) -> ir.Value:
    """Load 16 fp16 bit patterns at ptr and convert them exactly to float32 (NaNs come out quiet)."""
    bits = load(builder, ptr, I16X16)
    if native and HAS_F16C:
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 16)), F32X16)
    h = builder.zext(bits, I32X16)
    sign = builder.shl(builder.and_(h, const_splat(I32X16, 0x8000)), const_splat(I32X16, 16))
    em = builder.and_(h, const_splat(I32X16, 0x7FFF))
    shifted = builder.shl(em, const_splat(I32X16, 13))
    # finite: the fp16 exponent lands in the low float32 exponent bits; × 2^112 rebiases (exact, subnormals too)
    finite = builder.bitcast(builder.fmul(builder.bitcast(shifted, F32X16), const_splat(F32X16, 2.0**112)), I32X16)
    is_inf = builder.icmp_unsigned("==", em, const_splat(I32X16, 0x7C00))
    is_nan = builder.icmp_unsigned(">", em, const_splat(I32X16, 0x7C00))
    special = builder.or_(shifted, const_splat(I32X16, 0x7F800000))
    nan = builder.or_(special, const_splat(I32X16, 0x00400000))
    out = builder.select(is_nan, nan, builder.select(is_inf, special, finite))
    return builder.bitcast(builder.or_(out, sign), F32X16)


def fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a·b + c with one rounding, lane by lane (llvm.fma: vfmadd)."""
    return _call(builder, "llvm.fma.v16f32", F32X16, [a, b, c])


# --------------------------------------------------------------------------------------------- measurement


def _peak_codegen(chains: int):  # noqa: ANN202
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        isa_t = signature.args[0]
        native = isa_native(isa_t)
        iters = args[1]
        a = const_splat(I32X16, 0x01020304)
        accs = [cgutils.alloca_once_value(builder, const_splat(I32X16, c)) for c in range(chains)]
        with cgutils.for_range(builder, iters):
            for acc in accs:
                value = builder.load(acc)
                builder.store(dpbusd(builder, value, a, value, native), acc)
        total = builder.load(accs[0])
        for acc in accs[1:]:
            total = builder.add(total, builder.load(acc))
        return builder.extract_element(total, ir.Constant(I32, 0))

    return codegen


@intrinsic
def _dpbusd_chains(typingctx, isa, iters):
    return types.int32(isa, types.int64), _peak_codegen(12)


@numba.njit(cache=True, nogil=True)
def dpbusd_loop(isa, iters):
    """Run 12 independent chains of ``iters`` vpdpbusd each (12·iters·16·4 multiply-adds); returns a checksum."""
    return _dpbusd_chains(isa, iters)


def vpdpbusd_peak_gops(isa: Isa = HOST_ISA, iters: int = 2_000_000, repeat: int = 5) -> float:
    """Measured int8 GOPS (2 ops per multiply-add) of one thread running independent vpdpbusd chains."""
    import time

    dpbusd_loop(isa, 10)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dpbusd_loop(isa, iters)
        best = min(best, time.perf_counter() - t0)
    return 12 * iters * 16 * 4 * 2 / best / 1e9


__all__ = [
    "HAS_AVX512_VNNI",
    "HAS_AVX512_VBMI",
    "HAS_F16C",
    "HOST_ISA",
    "PORTABLE",
    "VNNI512",
    "Isa",
    "IsaType",
]
