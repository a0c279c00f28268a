"""Advanced SIMD (NEON) instructions on the 128-bit V registers, each a small numpy function over a
:class:`Machine` (the V registers are the low 128 bits of its Z registers).

Integer: SMMLA (I8MM), SDOT by element and by vector (DotProd), MLA, ADDP, SHL, AND, UZP1/UZP2, ZIP1/ZIP2.
Floating point (binary32, round to nearest even): SCVTF (optionally fixed-point #fbits — exact division by
2^fbits), FCVTL (fp16 → fp32, exact), FMUL/FADD, FMLA fused (:func:`.fp.fma_lanes`), FMAX/FMIN, FADDP, and the
BF16 BFMMLA/BFDOT with FPCR.EBF = 0 semantics (:func:`.fp.bf16_outer_pairs`).
"""

from __future__ import annotations

import numpy as np

from kleidipy.emulator.fp import bf16_dot_lanes, bf16_outer_pairs, fma_lanes
from kleidipy.emulator.machine import Buffer, Machine, addr, fmt

_ARR = {1: "16b", 2: "8h", 4: "4s", 8: "2d"}
_INT = {1: "<i1", 2: "<i2", 4: "<i4", 8: "<i8"}


# --------------------------------------------------------------------------------------------- loads / stores


def ldr(m: Machine, size: int, vt: int, buf: Buffer, off: int) -> None:
    """LDR q/d/s vt, [addr]: 16, 8 or 4 bytes into the low bytes of vt (the rest zeroed)."""
    data = m.read(buf, off, np.ones(size, dtype=bool))
    m.v[vt] = 0
    m.v[vt, :size] = data
    m.retire("LDR", loaded=size)
    if m.tracing:
        reg = {16: "q", 8: "d", 4: "s"}[size]
        m.note(f"LDR {reg}{vt}, {addr(buf, off)}   {fmt(data, 16)}")


def ld1r(m: Machine, esize: int, vt: int, buf: Buffer, off: int) -> None:
    """LD1R {vt.T}, [addr]: one element replicated to every lane."""
    data = m.read(buf, off, np.ones(esize, dtype=bool))
    m.v[vt] = np.tile(data, 16 // esize)
    m.retire("LD1R", loaded=esize)
    if m.tracing:
        m.note(f"LD1R {{v{vt}.{_ARR[esize]}}}, {addr(buf, off)}   {fmt(data)}")


def store(m: Machine, vt: int, lanes: int, esize: int, buf: Buffer, off: int) -> None:
    """STR q (all lanes) or ST1 {vt.d}[0] / {vt.s}[i] (a tail of ``lanes`` lanes, as the kernels' partial stores)."""
    if lanes * esize == 16:
        m.write(buf, off, m.v[vt].copy(), np.ones(16, dtype=bool))
        m.retire("STR", stored=16)
        m.note(f"STR q{vt}, {addr(buf, off)}   {fmt(m.vv(vt, '<f4'))}")
        return
    done = 0
    while done < lanes:
        chunk = 2 if lanes - done >= 2 and done % 2 == 0 else 1
        size = chunk * esize
        m.write(buf, off + done * esize, m.v[vt, done * esize : done * esize + size].copy(), np.ones(size, dtype=bool))
        m.retire("ST1", stored=size)
        done += chunk
    if m.tracing:
        m.note(f"ST1 v{vt} ({lanes} lanes), {addr(buf, off)}   {fmt(m.vv(vt, '<f4')[:lanes])}")


# --------------------------------------------------------------------------------------------- integer


def movi(m: Machine, vd: int, value: int, dtype: str = "<u1") -> None:
    """MOVI vd.T, #imm."""
    m.vv(vd, dtype)[:] = value
    m.retire("MOVI")


def shl(m: Machine, vd: int, vn: int, shift: int) -> None:
    """SHL vd.16b, vn.16b, #shift."""
    m.v[vd] = (m.v[vn] << shift).astype(np.uint8)
    m.retire("SHL")


def and_(m: Machine, vd: int, vn: int, vm: int) -> None:
    """AND vd.16b, vn.16b, vm.16b."""
    m.v[vd] = m.v[vn] & m.v[vm]
    m.retire("AND")


def smmla(m: Machine, vd: int, vn: int, vm: int) -> None:
    """SMMLA vd.4s, vn.16b, vm.16b: vd (2×2, row-major) += vn (2×8 int8 rows) · vm (2×8 int8 rows)ᵀ."""
    a = m.vv(vn, "<i1").reshape(2, 8).astype(np.int32)
    b = m.vv(vm, "<i1").reshape(2, 8).astype(np.int32)
    acc = m.vv(vd, "<i4")
    acc += (a @ b.T).reshape(4)
    m.retire("SMMLA")
    if m.tracing:
        m.note(f"SMMLA v{vd}.4s, v{vn}.16b, v{vm}.16b   v{vd}.4s = {fmt(acc)}")


def sdot_elem(m: Machine, vd: int, vn: int, vm: int, index: int) -> None:
    """SDOT vd.4s, vn.16b, vm.4b[index]: lane c += Σ_t vn.b[4c+t]·vm.b[4·index+t]."""
    w = m.vv(vn, "<i1").reshape(4, 4).astype(np.int32)
    x = m.vv(vm, "<i1")[4 * index : 4 * index + 4].astype(np.int32)
    acc = m.vv(vd, "<i4")
    acc += w @ x
    m.retire("SDOT")
    if m.tracing:
        m.note(f"SDOT v{vd}.4s, v{vn}.16b, v{vm}.4b[{index}]   v{vd}.4s = {fmt(acc)}")


def sdot(m: Machine, vd: int, vn: int, vm: int) -> None:
    """SDOT vd.4s, vn.16b, vm.16b: lane l += Σ_t vn.b[4l+t]·vm.b[4l+t]."""
    a = m.vv(vn, "<i1").reshape(4, 4).astype(np.int32)
    b = m.vv(vm, "<i1").reshape(4, 4).astype(np.int32)
    acc = m.vv(vd, "<i4")
    acc += (a * b).sum(axis=1, dtype=np.int32)
    m.retire("SDOT")
    if m.tracing:
        m.note(f"SDOT v{vd}.4s, v{vn}.16b, v{vm}.16b   v{vd}.4s = {fmt(acc)}")


def mla(m: Machine, vd: int, vn: int, vm: int) -> None:
    """MLA vd.4s, vn.4s, vm.4s (int32, wrapping)."""
    acc = m.vv(vd, "<i4")
    acc += m.vv(vn, "<i4") * m.vv(vm, "<i4")
    m.retire("MLA")


def mla_elem(m: Machine, vd: int, vn: int, vm: int, index: int) -> None:
    """MLA vd.4s, vn.4s, vm.s[index] (int32, wrapping)."""
    acc = m.vv(vd, "<i4")
    acc += m.vv(vn, "<i4") * m.vv(vm, "<i4")[index]
    m.retire("MLA")
    if m.tracing:
        m.note(f"MLA v{vd}.4s, v{vn}.4s, v{vm}.s[{index}]   v{vd}.4s = {fmt(acc)}")


def addp(m: Machine, vd: int, vn: int, vm: int, esize: int) -> None:
    """ADDP vd.T, vn.T, vm.T: pairwise sums of the concatenation vn:vm (integer, wrapping)."""
    both = np.concatenate([m.vv(vn, _INT[esize]), m.vv(vm, _INT[esize])]).reshape(-1, 2)
    m.vv(vd, _INT[esize])[:] = both.sum(axis=1, dtype=_INT[esize])
    m.retire("ADDP")


def uzp(m: Machine, which: int, vd: int, vn: int, vm: int, esize: int) -> None:
    """UZP1 (which = 1: even elements) / UZP2 (odd elements) of the concatenation vn:vm."""
    both = np.concatenate([m.vv(vn, _INT[esize]), m.vv(vm, _INT[esize])])
    m.vv(vd, _INT[esize])[:] = both[which - 1 :: 2]
    m.retire(f"UZP{which}")
    if m.tracing:
        m.note(f"UZP{which} v{vd}.{_ARR[esize]}, v{vn}, v{vm}   v{vd}.4s = {fmt(m.vv(vd, '<i4'))}")


def zip_(m: Machine, which: int, vd: int, vn: int, vm: int, esize: int) -> None:
    """ZIP1 (low halves) / ZIP2 (high halves) of vn and vm, interleaved."""
    a, b = m.vv(vn, _INT[esize]), m.vv(vm, _INT[esize])
    half = a.size // 2
    part = slice(0, half) if which == 1 else slice(half, None)
    m.vv(vd, _INT[esize])[:] = np.stack([a[part], b[part]], axis=1).reshape(-1)
    m.retire(f"ZIP{which}")


def dup_elem(m: Machine, vd: int, vn: int, index: int, esize: int) -> None:
    """DUP vd.T, vn.T[index]."""
    m.vv(vd, _INT[esize])[:] = m.vv(vn, _INT[esize])[index]
    m.retire("DUP")


# --------------------------------------------------------------------------------------------- floating point


def scvtf(m: Machine, vd: int, vn: int, fbits: int = 0) -> None:
    """SCVTF vd.4s, vn.4s[, #fbits]: int32 → float32 (round to nearest even), divided by 2^fbits (exact)."""
    vals = m.vv(vn, "<i4").astype(np.float32)
    if fbits:
        vals = vals * np.float32(2.0**-fbits)
    m.vv(vd, "<f4")[:] = vals
    m.retire("SCVTF")
    if m.tracing:
        m.note(f"SCVTF v{vd}.4s, v{vn}.4s{f', #{fbits}' if fbits else ''}   {fmt(m.vv(vd, '<f4'))}")


def fcvtl(m: Machine, vd: int, vn: int, high: bool = False) -> None:
    """FCVTL (FCVTL2 when ``high``) vd.4s, vn.4h: four fp16 lanes widened to float32 (exact)."""
    lanes = m.vv(vn, "<f2")[4:] if high else m.vv(vn, "<f2")[:4]
    m.vv(vd, "<f4")[:] = lanes.astype(np.float32)
    m.retire("FCVTL2" if high else "FCVTL")
    if m.tracing:
        m.note(f"FCVTL{'2' if high else ''} v{vd}.4s, v{vn}.{'8h' if high else '4h'}   {fmt(m.vv(vd, '<f4'))}")


def fmul(m: Machine, vd: int, vn: int, vm: int) -> None:
    """FMUL vd.4s, vn.4s, vm.4s."""
    m.vv(vd, "<f4")[:] = m.vv(vn, "<f4") * m.vv(vm, "<f4")
    m.retire("FMUL")
    if m.tracing:
        m.note(f"FMUL v{vd}.4s, v{vn}.4s, v{vm}.4s   {fmt(m.vv(vd, '<f4'))}")


def fmul_elem(m: Machine, vd: int, vn: int, vm: int, index: int) -> None:
    """FMUL vd.4s, vn.4s, vm.s[index]."""
    m.vv(vd, "<f4")[:] = m.vv(vn, "<f4") * m.vv(vm, "<f4")[index]
    m.retire("FMUL")
    if m.tracing:
        m.note(f"FMUL v{vd}.4s, v{vn}.4s, v{vm}.s[{index}]   {fmt(m.vv(vd, '<f4'))}")


def fadd(m: Machine, vd: int, vn: int, vm: int) -> None:
    """FADD vd.4s, vn.4s, vm.4s."""
    m.vv(vd, "<f4")[:] = m.vv(vn, "<f4") + m.vv(vm, "<f4")
    m.retire("FADD")
    if m.tracing:
        m.note(f"FADD v{vd}.4s, v{vn}.4s, v{vm}.4s   {fmt(m.vv(vd, '<f4'))}")


def faddp(m: Machine, vd: int, vn: int, vm: int) -> None:
    """FADDP vd.4s, vn.4s, vm.4s: pairwise float32 sums of vn:vm."""
    both = np.concatenate([m.vv(vn, "<f4"), m.vv(vm, "<f4")]).reshape(4, 2)
    m.vv(vd, "<f4")[:] = both[:, 0] + both[:, 1]
    m.retire("FADDP")


def fmla(m: Machine, vd: int, vn: int, vm: int) -> None:
    """FMLA vd.4s, vn.4s, vm.4s: vd + vn·vm fused (one rounding)."""
    acc = m.vv(vd, "<f4")
    acc[:] = fma_lanes(m.vv(vn, "<f4").copy(), m.vv(vm, "<f4").copy(), acc.copy())
    m.retire("FMLA")
    if m.tracing:
        m.note(f"FMLA v{vd}.4s, v{vn}.4s, v{vm}.4s   v{vd}.4s = {fmt(acc)}")


def fmla_elem(m: Machine, vd: int, vn: int, vm: int, index: int) -> None:
    """FMLA vd.4s, vn.4s, vm.s[index] (fused)."""
    acc = m.vv(vd, "<f4")
    scalar = np.full(4, m.vv(vm, "<f4")[index], dtype=np.float32)
    acc[:] = fma_lanes(m.vv(vn, "<f4").copy(), scalar, acc.copy())
    m.retire("FMLA")
    if m.tracing:
        m.note(f"FMLA v{vd}.4s, v{vn}.4s, v{vm}.s[{index}]   v{vd}.4s = {fmt(acc)}")


def fmax(m: Machine, vd: int, vn: int, vm: int) -> None:
    m.vv(vd, "<f4")[:] = np.maximum(m.vv(vn, "<f4"), m.vv(vm, "<f4"))
    m.retire("FMAX")


def fmin(m: Machine, vd: int, vn: int, vm: int) -> None:
    m.vv(vd, "<f4")[:] = np.minimum(m.vv(vn, "<f4"), m.vv(vm, "<f4"))
    m.retire("FMIN")


def bfmmla(m: Machine, vd: int, vn: int, vm: int) -> None:
    """BFMMLA vd.4s, vn.8h, vm.8h: vd (2×2 float32) += vn (2×4 bf16 rows) · vm (2×4 bf16 rows)ᵀ, each output
    taking its 4 products as pair (0, 1) then pair (2, 3) through BFDotAdd (FPCR.EBF = 0)."""
    a = m.vv(vn, "<u2").reshape(2, 4)
    b = m.vv(vm, "<u2").reshape(2, 4)
    acc = m.vv(vd, "<f4").reshape(2, 2)
    first = bf16_outer_pairs(acc.copy(), np.ascontiguousarray(a[:, :2]), np.ascontiguousarray(b[:, :2]))
    acc[:] = bf16_outer_pairs(first, np.ascontiguousarray(a[:, 2:]), np.ascontiguousarray(b[:, 2:]))
    m.retire("BFMMLA")
    if m.tracing:
        m.note(f"BFMMLA v{vd}.4s, v{vn}.8h, v{vm}.8h   v{vd}.4s = {fmt(acc)}")


def bfdot(m: Machine, vd: int, vn: int, vm: int) -> None:
    """BFDOT vd.4s, vn.8h, vm.8h: lane l = BFDotAdd(lane, vn.h[2l]·vm.h[2l] + vn.h[2l+1]·vm.h[2l+1])."""
    acc = m.vv(vd, "<f4")
    a = np.ascontiguousarray(m.vv(vn, "<u2").reshape(4, 2))
    b = np.ascontiguousarray(m.vv(vm, "<u2").reshape(4, 2))
    acc[:] = bf16_dot_lanes(acc.copy(), a, b)
    m.retire("BFDOT")
    if m.tracing:
        m.note(f"BFDOT v{vd}.4s, v{vn}.8h, v{vm}.8h   v{vd}.4s = {fmt(acc)}")


def mov(m: Machine, vd: int, vn: int) -> None:
    """MOV vd.16b, vn.16b (ORR)."""
    m.v[vd] = m.v[vn]
    m.retire("MOV")
