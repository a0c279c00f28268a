"""AVX-512 VNNI building blocks for numba kernels: host feature check, ISA markers (:class:`Isa`, ``HOST_ISA``),
llvmlite IR emitters (and the argument handling of the kernels' intrinsics), and the −w·Σq LHS block sums that start
the kernels' vpdpbusd accumulators (:func:`neg_block_sums`).

Per-ISA compilation and vector types: docs/vnni.md."""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core import config as numba_config
from numba.core.extending import NativeValue
from numba.core.imputils import lower_constant
from numba.extending import intrinsic, models, register_model, typeof_impl, unbox


def _codegen_features() -> set[str]:
    """The CPU features numba compiles for, so that no tile emits an instruction the code is not compiled for (LLVM
    would abort the process): those of its CPU — the host's as llvmlite reads them, none for
    ``NUMBA_CPU_NAME=generic`` — with ``NUMBA_CPU_FEATURES``'s ``+name`` / ``-name`` entries applied, as LLVM
    applies them to the CPU's own."""
    features: set[str] = set()
    if str(numba_config.CPU_NAME).lower() != "generic":
        try:
            features = {name for name, on in llvm.get_host_cpu_features().items() if on}
        except RuntimeError:  # llvmlite cannot read the features on some hosts: use the portable code
            features = set()
    for entry in (numba_config.CPU_FEATURES or "").split(","):
        entry = entry.strip()
        if entry[:1] == "+":
            features.add(entry[1:])
        elif entry[:1] == "-":
            features.discard(entry[1:])
    return features


_FEATURES = _codegen_features()
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
    """Which instructions a kernel is compiled with: an argument of the jitted kernel, or a global it reads
    (typing an Isa argument at each call costs ~2 µs; a global costs nothing)."""

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


@lower_constant(IsaType)
def _constant_isa(context, builder, ty, pyval):
    return context.get_dummy_value()


VNNI512 = Isa("vnni512", True)
PORTABLE = Isa("portable", False)
#: the ISA kernels use on this host.
HOST_ISA = VNNI512 if HAS_AVX512_VNNI else PORTABLE


def _isa_by_name(name: str) -> Isa:
    return VNNI512 if name == VNNI512.name else PORTABLE


def require_vnni() -> None:
    """Called while generating code that uses vpdpbusd / vpmultishiftqb natively: refuse on a host without them."""
    if not HAS_AVX512_VNNI:
        raise RuntimeError(
            "this kernel needs AVX-512 VNNI: use the best_* selectors, which fall back to the portable jit"
        )


def isa_native(isa_type: types.Type) -> bool:
    """Whether a kernel typed with this IsaType is compiled with the native AVX-512 instructions."""
    if not isinstance(isa_type, IsaType):
        raise TypeError(f"expected an Isa argument, got {isa_type}")
    if isa_type.native and not HAS_AVX512_VNNI:
        raise RuntimeError("the VNNI512 ISA was requested but the host CPU lacks AVX-512 VNNI")
    return isa_type.native


# --------------------------------------------------------------------------------------------- IR emitters


def i64(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def array_ptr(context, builder, aryty, ary) -> ir.Value:
    """i8* to the first element of a numba array value."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(data, I8.as_pointer())


def intrinsic_args(context, builder, signature, args) -> list:
    """An intrinsic's arguments for its code generator: i8* of every array argument, the members of tuple
    arguments as a tuple, other values as they are."""
    out = []
    for ty, val in zip(signature.args, args, strict=True):
        if isinstance(ty, types.Array):
            if ty.layout != "C":
                raise TypeError(f"the VNNI kernels read C-contiguous arrays only, got {ty}")
            out.append(array_ptr(context, builder, ty, val))
        elif isinstance(ty, types.BaseTuple):
            out.append(tuple(builder.extract_value(val, i) for i in range(len(ty))))
        else:
            out.append(val)
    return out


def byte_ptr(builder: ir.IRBuilder, base: ir.Value, offset: ir.Value | int) -> ir.Value:
    """base (i8*) + offset bytes."""
    off = offset if isinstance(offset, ir.Value) else i64(offset)
    return builder.gep(base, [off])


def load(builder: ir.IRBuilder, ptr: ir.Value, ty: ir.Type) -> ir.Value:
    """Unaligned load of a value of type ty at an i8* address."""
    return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)


def store(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    """Unaligned store at an i8* address."""
    builder.store(value, builder.bitcast(ptr, value.type.as_pointer()), align=1)


def masked_store(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value, count: ir.Value) -> None:
    """Store the first min(count, 16) lanes of a 16-lane float vector at an i8* address (``llvm.masked.store``)."""
    lanes = ir.VectorType(I64, value.type.count)
    mask = builder.icmp_signed(
        "<", ir.Constant(lanes, [i64(i) for i in range(lanes.count)]), splat(builder, count, lanes)
    )
    name = f"llvm.masked.store.v{value.type.count}f32.p0"
    vptr = builder.bitcast(ptr, value.type.as_pointer())
    fnty = ir.FunctionType(ir.VoidType(), [value.type, vptr.type, I32, mask.type])
    fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name)
    builder.call(fn, [value, vptr, ir.Constant(I32, 4), mask])


def masked_load(builder: ir.IRBuilder, ptr: ir.Value, vty: ir.VectorType, count: ir.Value) -> ir.Value:
    """Load the first min(count, lanes) lanes of a vector at an i8* address, the others 0 and not read
    (``llvm.masked.load``: no fault past the buffer)."""
    lanes = ir.VectorType(I64, vty.count)
    mask = builder.icmp_signed(
        "<", ir.Constant(lanes, [i64(i) for i in range(vty.count)]), splat(builder, count, lanes)
    )
    vptr = builder.bitcast(ptr, vty.as_pointer())
    name = f"llvm.masked.load.v{vty.count}i{vty.element.width}.p0"
    fnty = ir.FunctionType(vty, [vptr.type, I32, mask.type, vty])
    fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name)
    return builder.call(fn, [vptr, ir.Constant(I32, 1), mask, ir.Constant(vty, None)])


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


def pick(builder: ir.IRBuilder, first: ir.Value, second: ir.Value, idx: list[int]) -> ir.Value:
    """The lanes ``idx`` of first ‖ second (two vectors of one type): a concatenation, an interleave, ..."""
    mask = ir.Constant(ir.VectorType(I32, len(idx)), [ir.Constant(I32, i) for i in idx])
    return builder.shuffle_vector(first, second, mask)


def concat(builder: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """One vector of the given vectors (one type, a power-of-two count) side by side, the first in the low lanes."""
    while len(parts) > 1:
        width = 2 * parts[0].type.count
        parts = [pick(builder, parts[i], parts[i + 1], list(range(width))) for i in range(0, len(parts), 2)]
    return parts[0]


def group_bases(
    builder: ir.IRBuilder, rhs: ir.Value, j0: ir.Value, n: ir.Value, stride: ir.Value, vectors: int, group_cols: int = 4
) -> list[list[ir.Value]]:
    """i8* to the packed-RHS groups of ``group_cols`` columns (``stride`` bytes apart) under each of ``vectors``
    16-column vectors from column j0 (a multiple of group_cols): [vector][group]. A group past the last of the n
    columns is the last one again (NEON layouts: its columns land in the tile's padding)."""
    groups = builder.udiv(builder.add(n, i64(group_cols - 1)), i64(group_cols))
    last = builder.sub(groups, i64(1))
    first = builder.udiv(j0, i64(group_cols))
    per = 16 // group_cols
    out = []
    for v in range(vectors):
        row = []
        for q in range(per):
            g = builder.add(first, i64(v * per + q))
            g = builder.select(builder.icmp_signed("<", g, groups), g, last)
            row.append(byte_ptr(builder, rhs, builder.mul(g, stride)))
        out.append(row)
    return out


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


def _multishift_offsets(first_bit: int) -> ir.Constant:
    """vpmultishiftqb control: byte e of every qword takes the 8 bits at first_bit + 4e of the source qword."""
    return ir.Constant(I8X64, [ir.Constant(I8, first_bit + 4 * (e % 8)) for e in range(64)])


def _spread_words(builder: ir.IRBuilder, words: ir.Value) -> ir.Value:
    """i32x16 lanes holding a uint16 each -> byte e of lane j = (u16 >> 4e) & 15 (plain shifts and masks)."""
    x = builder.and_(builder.or_(words, builder.shl(words, const_splat(I32X16, 8))), const_splat(I32X16, 0x00FF00FF))
    return builder.and_(builder.or_(x, builder.shl(x, const_splat(I32X16, 4))), const_splat(I32X16, 0x0F0F0F0F))


def spread_nibbles(builder: ir.IRBuilder, ptr: ir.Value, native: bool) -> ir.Value:
    """Load 16 uint16 at ptr; lane j of the i32x16 result holds the four 4-bit fields of uint16 j, one per byte
    (LSB first): byte 4j+e = (u16[j] >> 4e) & 15."""
    if native and HAS_AVX512_VBMI:
        pairs = builder.bitcast(builder.zext(load(builder, ptr, I32X8), I64X8), I8X64)
        fields = _call(builder, "llvm.x86.avx512.pmultishift.qb.512", I8X64, [_multishift_offsets(0), pairs])
        return builder.bitcast(builder.and_(fields, const_splat(I8X64, 15)), I32X16)
    return _spread_words(builder, builder.zext(load(builder, ptr, I16X16), I32X16))


#: the uint16 (of the 32 loaded) whose nibbles lane j of the first / second result of spread_nibble_pairs holds.
PAIR_LANES = (
    [4 * (j // 2) + j % 2 for j in range(16)],
    [4 * (j // 2) + 2 + j % 2 for j in range(16)],
)


def spread_nibble_pairs(builder: ir.IRBuilder, ptr: ir.Value, native: bool) -> tuple[ir.Value, ir.Value]:
    """Load 32 uint16 at ptr and spread their nibbles to bytes as :func:`spread_nibbles` does, in two i32x16
    whose lanes hold the uint16 listed in PAIR_LANES (no cross-lane shuffle on the native path: each qword of
    four uint16 gives two lanes to each result)."""
    if native and HAS_AVX512_VBMI:
        src = load(builder, ptr, I8X64)
        mask = const_splat(I8X64, 15)
        out = []
        for first_bit in (0, 32):
            fields = _call(builder, "llvm.x86.avx512.pmultishift.qb.512", I8X64, [_multishift_offsets(first_bit), src])
            out.append(builder.bitcast(builder.and_(fields, mask), I32X16))
        return out[0], out[1]
    words = load(builder, ptr, ir.VectorType(I16, 32))
    return tuple(_spread_words(builder, builder.zext(_lanes(builder, words, lanes), I32X16)) for lanes in PAIR_LANES)


def f16_to_f32(builder: ir.IRBuilder, ptr: ir.Value, native: bool, lanes: list[int] | None = None) -> ir.Value:
    """Convert 16 fp16 bit patterns exactly to float32 (NaNs come out quiet): the 16 at ptr, or the 16 listed
    in ``lanes`` of the 32 at ptr."""
    if lanes is None:
        bits = load(builder, ptr, I16X16)
    else:
        bits = _lanes(builder, load(builder, ptr, ir.VectorType(I16, 32)), lanes)
    return f16_bits_to_f32(builder, bits, native)


def f16_bits_to_f32(builder: ir.IRBuilder, bits: ir.Value, native: bool) -> ir.Value:
    """Convert the 16 fp16 bit patterns of an i16x16 exactly to float32 (NaNs come out quiet)."""
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


def f32_to_f16(builder: ir.IRBuilder, value: ir.Value, native: bool) -> ir.Value:
    """fp16 bit patterns (i16x16) of 16 finite float32, rounded to nearest even (vcvtps2ph / FCVT); values
    rounding past 65504 give infinity."""
    if native and HAS_F16C:
        return builder.bitcast(builder.fptrunc(value, ir.VectorType(ir.HalfType(), 16)), I16X16)
    u = builder.bitcast(value, I32X16)
    sign = builder.and_(builder.lshr(u, const_splat(I32X16, 16)), const_splat(I32X16, 0x8000))
    a = builder.and_(u, const_splat(I32X16, 0x7FFFFFFF))
    # normal halves: drop 13 mantissa bits with round-to-nearest-even, rebias the exponent by 112
    odd = builder.and_(builder.lshr(a, const_splat(I32X16, 13)), const_splat(I32X16, 1))
    normal = builder.lshr(
        builder.sub(builder.add(builder.add(a, const_splat(I32X16, 0xFFF)), odd), const_splat(I32X16, 112 << 23)),
        const_splat(I32X16, 13),
    )
    # subnormal halves (|x| < 2^-14): adding 0.5 leaves the value rounded to a multiple of 2^-24 (RNE) in the
    # low mantissa bits
    magic = const_splat(F32X16, 0.5)
    sub = builder.sub(
        builder.bitcast(builder.fadd(builder.bitcast(a, F32X16), magic), I32X16), const_splat(I32X16, 0x3F000000)
    )
    is_sub = builder.icmp_unsigned("<", a, const_splat(I32X16, 113 << 23))
    is_inf = builder.icmp_unsigned(">=", a, const_splat(I32X16, 0x477FF000))
    h = builder.select(is_inf, const_splat(I32X16, 0x7C00), builder.select(is_sub, sub, normal))
    return builder.trunc(builder.or_(h, sign), I16X16)


def round_f16(builder: ir.IRBuilder, value: ir.Value, native: bool) -> ir.Value:
    """The F16 value of 16 float32 lanes, as float32 (:func:`f32_to_f16` then :func:`f16_bits_to_f32`: nearest even,
    past F16's range infinity; natively vcvtps2ph and vcvtph2ps, which keep NaNs as well)."""
    return f16_bits_to_f32(builder, f32_to_f16(builder, value, native), native)


def unpair(builder: ir.IRBuilder, first: ir.Value, second: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Inverse of the PAIR_LANES order: two vectors in pair order -> the 32 values in natural order."""
    order = [0] * 32
    for half, lanes in enumerate(PAIR_LANES):
        for j, src in enumerate(lanes):
            order[src] = 16 * half + j
    both = [ir.Constant(I32, i) for i in order]
    mask = ir.VectorType(I32, 16)
    return (
        builder.shuffle_vector(first, second, ir.Constant(mask, both[:16])),
        builder.shuffle_vector(first, second, ir.Constant(mask, both[16:])),
    )


def opaque(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """value, hidden from the optimizer (an empty inline asm): e.g. a loop count LLVM must not unroll."""
    asm = ir.InlineAsm(ir.FunctionType(value.type, [value.type]), "", "=r,0")
    return builder.call(asm, [value])


def prefetch(builder: ir.IRBuilder, ptr: ir.Value) -> None:
    """Prefetch the cache line at ptr for reading (llvm.prefetch, all cache levels)."""
    _call(
        builder,
        "llvm.prefetch.p0i8",
        ir.VoidType(),
        [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)],
    )


def load_block(builder: ir.IRBuilder, row: ir.Value, blk: ir.Value) -> list[ir.Value]:
    """The two f32x16 of 32-block blk of a float32 row at the i8* ``row`` (an LHS packer's input)."""
    b = builder
    return [load(b, byte_ptr(b, row, b.add(b.mul(blk, i64(128)), i64(64 * h))), F32X16) for h in (0, 1)]


def block_amax(builder: ir.IRBuilder, x: list[ir.Value]) -> ir.Value:
    """max |x| over every lane of the finite f32x16 vectors x (an LHS packer's 32-block), as f32: the largest
    magnitude's bits (sign cleared) compared as unsigned integers."""
    b = builder
    mags = [b.and_(b.bitcast(v, I32X16), const_splat(I32X16, 0x7FFFFFFF)) for v in x]
    top = mags[0]
    for mag in mags[1:]:
        top = b.select(b.icmp_unsigned(">", top, mag), top, mag)
    return b.bitcast(reduce_umax(b, top), F32)


def store_k_groups(
    builder: ir.IRBuilder, q: list[ir.Value], out: ir.Value, base: ir.Value, chunk_stride: ir.Value, per_chunk: ir.Value
) -> None:
    """Store the 32 int8 of an LHS packer's block, the low bytes of the two i32x16 q (its values 0-15, 16-31), in
    K groups of 4: group g at out + base + (g // per_chunk)·chunk_stride + (g % per_chunk)·4."""
    b = builder
    both = b.shuffle_vector(
        b.trunc(q[0], ir.VectorType(ir.IntType(8), 16)),
        b.trunc(q[1], ir.VectorType(ir.IntType(8), 16)),
        ir.Constant(ir.VectorType(I32, 32), [ir.Constant(I32, i) for i in range(32)]),
    )
    words = b.bitcast(both, ir.VectorType(I32, 8))
    for g in range(8):
        at = b.add(b.mul(b.udiv(i64(g), per_chunk), chunk_stride), b.mul(b.urem(i64(g), per_chunk), i64(4)))
        store(b, b.extract_element(words, ir.Constant(I32, g)), byte_ptr(b, out, b.add(base, at)))


def reduce_umax(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """Largest unsigned i32 lane of an i32x16."""
    return _call(builder, "llvm.vector.reduce.umax.v16i32", I32, [value])


def reduce_fmax(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """Largest float32 lane of an f32x16 (NaN lanes ignored)."""
    return _call(builder, "llvm.vector.reduce.fmax.v16f32", F32, [value])


def reduce_add(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """Sum (wrapping) of the i32 lanes of an i32x16."""
    return _call(builder, "llvm.vector.reduce.add.v16i32", I32, [value])


def permute(builder: ir.IRBuilder, value: ir.Value, index: ir.Value) -> ir.Value:
    """Lane j of the result = lane index[j] (a run-time i32x16, each < 16) of the i32x16 value (``vpermd``)."""
    return _call(builder, "llvm.x86.avx512.permvar.si.512", I32X16, [value, index])


def round_even(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """Each float32 lane rounded to the nearest integer, ties to even (rintf; vrndscaleps)."""
    return _call(builder, "llvm.roundeven.v16f32", F32X16, [value])


def fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a·b + c with one rounding, lane by lane (llvm.fma: vfmadd)."""
    return _call(builder, "llvm.fma.v16f32", F32X16, [a, b, c])


# --------------------------------------------------------------------------------------------- LHS block sums


@intrinsic
def _neg_block_sums_vec(typingctx, isa, lhs, base, mr, blocks, block_bytes, groups, weights, corr, corr_off):
    """corr[corr_off + blk·mr + r] = −w·Σq of the int8 of rows r < mr in blocks blk < ``blocks`` of the LHS group
    at byte ``base``, with vpdpbusd (see :func:`neg_block_sums`); ``weights`` holds w in each of its 4 bytes.
    mr % 16 == 0: a vector holds one K group of 16 rows. 16 % mr == 0 and groups·mr % 16 == 0: a vector holds
    16 / mr K groups of all mr rows, whose lanes of one row (every mr-th) are then added by rotations."""
    int64 = types.int64
    sig = types.void(isa, lhs, int64, int64, int64, int64, int64, types.int32, corr, int64)

    def codegen(context, builder, signature, args):
        native = isa_native(signature.args[0])
        _, lhs_p, base_v, mr_v, blocks_v, block_v, groups_v, weights_v, corr_p, off_v = intrinsic_args(
            context, builder, signature, args
        )
        b = builder
        w = splat(b, weights_v, I32X16)
        small = b.icmp_signed("<", mr_v, i64(16))
        rows = b.select(small, mr_v, i64(16))  # rows per vector
        step = b.select(small, i64(64), b.mul(mr_v, i64(4)))  # bytes from one vector to the next of its rows
        loads = b.udiv(b.mul(groups_v, rows), i64(16))
        chunks = b.udiv(b.add(mr_v, i64(15)), i64(16))
        with cgutils.for_range(b, blocks_v) as blk, cgutils.for_range(b, chunks) as chunk:
            start = b.add(b.add(base_v, b.mul(blk.index, block_v)), b.mul(chunk.index, i64(64)))
            acc = cgutils.alloca_once_value(b, const_splat(I32X16, 0))
            with cgutils.for_range(b, loads) as t:
                data = load(b, byte_ptr(b, lhs_p, b.add(start, b.mul(step, t.index))), I32X16)
                b.store(dpbusd(b, b.load(acc), w, data, native), acc)
            total = b.load(acc)
            for shift in (8, 4, 2, 1):
                rotated = b.add(total, _lanes(b, total, [(j + shift) % 16 for j in range(16)]))
                total = b.select(b.icmp_signed("<=", mr_v, i64(shift)), rotated, total)
            idx = b.add(b.add(off_v, b.mul(blk.index, mr_v)), b.mul(chunk.index, i64(16)))
            masked_store(b, b.bitcast(b.neg(total), F32X16), byte_ptr(b, corr_p, b.mul(idx, i64(4))), rows)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def neg_block_sums(isa, lhs, m, mr, group_bytes, blocks, block_bytes, groups, weight):
    """−weight·Σq (int32, wrapping) per row and block of a packed LHS whose groups of mr rows are ``group_bytes``
    apart and hold, from block b's start at b·block_bytes, the int8 of (K group t < ``groups``, row r) at
    4·(t·mr + r): the int32 accumulator start that turns vpdpbusd's Σ q·u into Σ q·(u − weight). Laid out
    [group][block][mr] (with vpdpbusd when mr % 16 == 0, or 16 % mr == 0 and a block's groups·mr int32 fill whole
    vectors; else scalar code). Callers pass the bytes as uint8 and every count as int64, not a literal: one compile
    serves every family (a literal argument compiles its own specialization).
    """
    n_groups = (m + mr - 1) // mr
    corr = np.empty(n_groups * blocks * mr, np.int32)
    lhs_i8 = lhs.view(np.int8)
    weights = np.int32(weight * 0x01010101)
    for g in range(n_groups):
        off = g * blocks * mr
        if mr % 16 == 0 or (16 % mr == 0 and groups * mr % 16 == 0):
            _neg_block_sums_vec(isa, lhs, g * group_bytes, mr, blocks, block_bytes, groups, weights, corr, off)
            continue
        for b in range(blocks):
            base = g * group_bytes + b * block_bytes
            for r in range(mr):
                s = 0
                for t in range(groups):
                    o = base + (t * mr + r) * 4
                    s += np.int32(lhs_i8[o]) + np.int32(lhs_i8[o + 1]) + np.int32(lhs_i8[o + 2]) + lhs_i8[o + 3]
                corr[off + b * mr + r] = -weight * s
    return corr


# --------------------------------------------------------------------------------------------- measurement


def _peak_codegen(chains: int):
    def codegen(context, builder, signature, args):
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


def _make_fp16_vectors(widen: bool):
    """Intrinsic ``convert(isa, src, src_off, count16, dst, dst_off)`` over x < 16·count16, the fp16 side at byte
    offsets off + 2x, the float32 side at element offsets off + x: ``widen``, dst[dst_off + x] = float32 of the
    fp16 at src byte src_off + 2x; else the fp16 bits (RNE) of src[src_off + x] at dst byte dst_off + 2x."""

    @intrinsic
    def convert(typingctx, isa, src, src_off, count16, dst, dst_off):
        sig = types.void(isa, src, types.int64, types.int64, dst, types.int64)

        def codegen(context, builder, signature, args):
            _, src_p, src_off_v, count_v, dst_p, dst_off_v = intrinsic_args(context, builder, signature, args)
            native = isa_native(signature.args[0])
            b = builder

            def f16_at(base, off, x):
                return byte_ptr(b, base, b.add(off, b.mul(x, i64(2))))

            def f32_at(base, off, x):
                return byte_ptr(b, base, b.mul(b.add(off, x), i64(4)))

            with cgutils.for_range(b, count_v) as loop:
                x = b.mul(loop.index, i64(16))
                if widen:
                    value = f16_to_f32(b, f16_at(src_p, src_off_v, x), native)
                    store(b, value, f32_at(dst_p, dst_off_v, x))
                else:
                    bits = f32_to_f16(b, load(b, f32_at(src_p, src_off_v, x), F32X16), native)
                    store(b, bits, f16_at(dst_p, dst_off_v, x))
            return context.get_dummy_value()

        return sig, codegen

    return convert


f16_to_f32_vectors = _make_fp16_vectors(True)
f32_to_f16_vectors = _make_fp16_vectors(False)
