"""SVE / SME / SME2 instructions (streaming mode), each a small numpy function over a :class:`Machine` that executes
one instruction with its architectural semantics, counts it and, while tracing, logs it.

Register conventions and floating point: docs/emulator.md."""

from __future__ import annotations

import numpy as np

from kleidipy.emulator.fp import bf16_outer_pairs, f16_outer_pairs, fma_lanes
from kleidipy.emulator.machine import Buffer, Machine, addr, fmt

_SUFFIX = {1: "b", 2: "h", 4: "s", 8: "d"}
#: memory-access size letters of the load/store mnemonics (LD1B, LD1H, LD1W, LD1D)
_MEM = {1: "B", 2: "H", 4: "W", 8: "D"}
_INT = {1: "<i1", 2: "<i2", 4: "<i4"}


def _expand(flags: np.ndarray, esize: int) -> np.ndarray:
    """Byte mask of a byte-granular predicate read at element size ``esize``."""
    return np.repeat(flags[::esize], esize)


def _regs(first: int, count: int, esize: int) -> str:
    s = _SUFFIX[esize]
    return f"{{z{first}.{s}-z{first + count - 1}.{s}}}" if count > 1 else f"z{first}.{s}"


# --------------------------------------------------------------------------------------------- mode, predicates


def smstart(m: Machine) -> None:
    """SMSTART: enter streaming mode with ZA enabled — Z, P and ZA are zeroed."""
    m.z[:] = 0
    m.p[:] = False
    m.pn[:] = False
    m.za[:] = 0
    m.retire("SMSTART")
    if m.tracing:
        m.note(f"SMSTART               streaming mode on, SVL = {m.vb * 8} bits: Z, P, ZA zeroed")


def smstop(m: Machine) -> None:
    m.retire("SMSTOP")
    if m.tracing:
        m.note("SMSTOP")


def ptrue(m: Machine, pd: int, esize: int) -> None:
    m.p[pd] = False
    m.p[pd][::esize] = True
    m.retire("PTRUE")
    if m.tracing:
        m.note(f"PTRUE p{pd}.{_SUFFIX[esize]}")


def ptrue_pn(m: Machine, pn: int, esize: int) -> None:
    """PTRUE pnN.T (predicate-as-counter, every element of a multi-vector group active)."""
    m.pn[pn] = False
    m.pn[pn][::esize] = True
    m.retire("PTRUE")
    if m.tracing:
        m.note(f"PTRUE pn{pn}.{_SUFFIX[esize]}")


def pfalse(m: Machine, pd: int) -> None:
    m.p[pd] = False
    m.retire("PFALSE")


def whilelt(m: Machine, pd: int, start: int, end: int, esize: int) -> bool:
    """WHILELT pd.T, start, end: elements i with start + i < end. Returns the "first" flag (b.first / b.mi)."""
    count = int(np.clip(end - start, 0, m.vb // esize))
    m.p[pd] = False
    m.p[pd][: count * esize : esize] = True
    m.retire("WHILELT")
    if m.tracing:
        m.note(f"WHILELT p{pd}.{_SUFFIX[esize]}, {start}, {end}     {count} active")
    return count > 0


def whilelt_pn(m: Machine, pn: int, start: int, end: int, esize: int, vectors: int) -> bool:
    """WHILELT pnN.T, start, end, VLx{vectors} (predicate-as-counter over a multi-vector group)."""
    count = int(np.clip(end - start, 0, vectors * m.vb // esize))
    m.pn[pn] = False
    m.pn[pn][: count * esize : esize] = True
    m.retire("WHILELT")
    if m.tracing:
        m.note(f"WHILELT pn{pn}.{_SUFFIX[esize]}, {start}, {end}, VLx{vectors}     {count} active")
    return count > 0


def pnext(m: Machine, pdn: int, pg: int, esize: int) -> None:
    """PNEXT pdn.T, pg, pdn.T: the next active element of pg after the last active one of pdn."""
    flags = m.p[pdn][::esize]
    active = m.p[pg][::esize]
    last = int(np.flatnonzero(flags)[-1]) if flags.any() else -1
    later = np.flatnonzero(active[last + 1 :])
    m.p[pdn] = False
    if later.size:
        m.p[pdn][(last + 1 + int(later[0])) * esize] = True
    m.retire("PNEXT")


def clastb(m: Machine, zdn: int, pg: int, zm: int, esize: int) -> None:
    """CLASTB zdn.T, pg, zdn.T, zm.T: broadcast the last active element of zm (or keep zdn's last-lane value)."""
    lanes = m.zv(zm, _INT[esize])
    active = np.flatnonzero(m.p[pg][::esize])
    out = m.zv(zdn, _INT[esize])
    value = lanes[active[-1]] if active.size else out[-1]
    out[:] = value
    m.retire("CLASTB")
    if m.tracing:
        m.note(f"CLASTB z{zdn}.{_SUFFIX[esize]}, p{pg}, z{zm}      broadcast lane {active[-1] if active.size else '-'}")


# --------------------------------------------------------------------------------------------- loads / stores


def _load(m: Machine, name: str, first: int, count: int, esize: int, mask: np.ndarray, buf: Buffer, off: int) -> None:
    data = m.read(buf, off, mask)
    m.z[first : first + count] = data.reshape(count, m.vb)
    loaded = int(mask.sum())
    m.retire(name, loaded=loaded)
    if m.tracing:
        m.note(f"{name} {_regs(first, count, esize)}, {addr(buf, off)}   {loaded} B: z{first}.b = {fmt(data)}")


def ld1(m: Machine, esize: int, zt: int, pg: int, buf: Buffer, off: int) -> None:
    """LD1B/LD1H/LD1W zt, pg/z, [addr]: one vector, inactive elements zeroed."""
    _load(m, f"LD1{_MEM[esize]}", zt, 1, esize, _expand(m.p[pg], esize), buf, off)


def ld1_multi(m: Machine, esize: int, first: int, count: int, pn: int, buf: Buffer, off: int) -> None:
    """LD1B/LD1H/LD1W {z_first-…}, pn/z, [addr] (SME2 multi-vector, 2 or 4 consecutive registers)."""
    mask = _expand(m.pn[pn][: count * m.vb], esize)
    _load(m, f"LD1{_MEM[esize]}", first, count, esize, mask, buf, off)


def ld2(m: Machine, esize: int, zt: int, pg: int, buf: Buffer, off: int) -> None:
    """LD2B/LD2H {zt, zt+1}, pg/z, [addr]: 2-element structures de-interleaved (element 0 of each into zt, element
    1 into zt+1), a structure loaded when its element of pg is active."""
    mask = np.repeat(m.p[pg][::esize], 2 * esize)
    data = m.read(buf, off, mask).reshape(-1, 2, esize)
    m.z[zt : zt + 2] = data.transpose(1, 0, 2).reshape(2, m.vb)
    m.retire(f"LD2{_MEM[esize]}", loaded=int(mask.sum()))
    if m.tracing:
        m.note(f"LD2{_MEM[esize]} {{z{zt}, z{zt + 1}}}, {addr(buf, off)}   z{zt}.b = {fmt(m.z[zt])}")


def ld1rq(m: Machine, zt: int, pg: int, buf: Buffer, off: int, esize: int = 1) -> None:
    """LD1RQB / LD1RQW zt.T, pg/z, [addr]: 16 bytes (the elements active in pg's first 128 bits, the others 0)
    replicated into every 128-bit segment."""
    mask = _expand(m.p[pg][:16], esize)
    data = m.read(buf, off, mask)
    m.z[zt] = np.tile(data, m.vb // 16)
    name = f"LD1RQ{_MEM[esize]}"
    m.retire(name, loaded=int(mask.sum()))
    if m.tracing:
        m.note(f"{name} z{zt}.{_SUFFIX[esize]}, {addr(buf, off)}   16 B replicated per 128 bits: {fmt(data, 16)}")


def ld1r(m: Machine, esize: int, zt: int, pg: int, buf: Buffer, off: int) -> None:
    """LD1RH / LD1RW zt, pg/z, [addr]: one element broadcast to every active lane."""
    data = m.read(buf, off, np.ones(esize, dtype=bool))
    lanes = np.tile(data, m.vb // esize)
    m.z[zt] = np.where(_expand(m.p[pg], esize), lanes, 0)
    name = f"LD1R{_MEM[esize]}"
    m.retire(name, loaded=esize)
    if m.tracing:
        m.note(f"{name} z{zt}.{_SUFFIX[esize]}, {addr(buf, off)}   broadcast {fmt(data)}")


def ldr_zt0(m: Machine, buf: Buffer, off: int) -> None:
    """LDR ZT0, [addr]: the 64-byte lookup table."""
    m.zt0[:] = m.read(buf, off, np.ones(64, dtype=bool))
    m.retire("LDR", loaded=64)
    if m.tracing:
        m.note(f"LDR ZT0, {addr(buf, off)}      table (int32) = {fmt(m.zt0.view('<i4'), 16)}")


def _store(m: Machine, name: str, first: int, count: int, esize: int, mask: np.ndarray, buf: Buffer, off: int) -> None:
    data = m.z[first : first + count].reshape(-1)
    stored = m.write(buf, off, data, mask)
    m.retire(name, stored=stored)
    if m.tracing:
        m.note(f"{name} {_regs(first, count, esize)}, {addr(buf, off)}   {stored} B: {fmt(data.view('<f4'))}")


def st1(m: Machine, esize: int, zt: int, pg: int, buf: Buffer, off: int) -> None:
    """ST1W zt, pg, [addr]: active elements stored."""
    _store(m, f"ST1{_MEM[esize]}", zt, 1, esize, _expand(m.p[pg], esize), buf, off)


def st1_multi(m: Machine, esize: int, first: int, count: int, pn: int, buf: Buffer, off: int) -> None:
    """ST1W {z_first-…}, pn, [addr] (SME2 multi-vector store)."""
    _store(m, f"ST1{_MEM[esize]}", first, count, esize, _expand(m.pn[pn][: count * m.vb], esize), buf, off)


# --------------------------------------------------------------------------------------------- data movement


def dup_imm(m: Machine, zd: int, value: float | int, dtype: str, mnemonic: str = "DUP") -> None:
    """DUP/FMOV/MOV zd.T, #imm."""
    m.zv(zd, dtype)[:] = value
    m.retire(mnemonic)
    if m.tracing:
        m.note(f"{mnemonic} z{zd}, #{value}")


def movprfx(m: Machine, zd: int, zn: int) -> None:
    m.z[zd] = m.z[zn]
    m.retire("MOVPRFX")


def zip_x2(m: Machine, zd: int, zn: int, zm: int, esize: int) -> None:
    """ZIP {zd-zd+1}.T, zn.T, zm.T (SME2): the elements of zn and zm interleaved over two registers."""
    a, b = m.zv(zn, _INT[esize]).copy(), m.zv(zm, _INT[esize]).copy()
    both = np.stack([a, b], axis=1).reshape(2, -1)
    m.zv(zd, _INT[esize])[:] = both[0]
    m.zv(zd + 1, _INT[esize])[:] = both[1]
    m.retire("ZIP")
    if m.tracing:
        shown = both[0].view("<f2") if esize == 2 else both[0]  # .h zips move fp16 scales here
        m.note(f"ZIP {_regs(zd, 2, esize)}, z{zn}, z{zm}    z{zd}.h = {fmt(shown)}")


def zip1(m: Machine, zd: int, zn: int, zm: int, esize: int) -> None:
    """ZIP1 zd.T, zn.T, zm.T: interleave the low halves of zn and zm."""
    a, b = m.zv(zn, _INT[esize]), m.zv(zm, _INT[esize])
    half = a.size // 2
    m.zv(zd, _INT[esize])[:] = np.stack([a[:half], b[:half]], axis=1).reshape(-1)
    m.retire("ZIP1")


def zip2(m: Machine, zd: int, zn: int, zm: int, esize: int) -> None:
    """ZIP2 zd.T, zn.T, zm.T: interleave the high halves of zn and zm."""
    a, b = m.zv(zn, _INT[esize]), m.zv(zm, _INT[esize])
    half = a.size // 2
    m.zv(zd, _INT[esize])[:] = np.stack([a[half:], b[half:]], axis=1).reshape(-1)
    m.retire("ZIP2")


def luti4_x2(m: Machine, zd: int, zn: int) -> None:
    """LUTI4 {zd.b-zd+1.b}, ZT0, zn[0] (2-register, 8-bit): byte e of register r is the low byte of the 32-bit
    ZT0 entry indexed by 4-bit field r·VB + e of zn (field i = bits [4i+3:4i])."""
    src = m.z[zn]
    nibbles = np.stack([src & 0x0F, src >> 4], axis=1).reshape(-1)
    table = m.zt0[::4]  # low byte of each 32-bit entry
    m.z[zd : zd + 2] = table[nibbles].reshape(2, m.vb)
    m.retire("LUTI4")
    if m.tracing:
        m.note(f"LUTI4 {{z{zd}.b-z{zd + 1}.b}}, ZT0, z{zn}[0]   int4 -> int8: z{zd}.b = {fmt(m.zv(zd, '<i1'), 12)}")


def luti4_x4_h(m: Machine, zd: int, zn: int) -> None:
    """LUTI4 {zd.h-zd+3.h}, ZT0, zn[0] (4-register, 16-bit): halfword e of register r is the low halfword of the
    32-bit ZT0 entry indexed by 4-bit field r·VB/2 + e of zn (field i = bits [4i+3:4i])."""
    src = m.z[zn]
    nibbles = np.stack([src & 0x0F, src >> 4], axis=1).reshape(-1)
    table = m.zt0.view("<u2")[::2]  # low halfword of each 32-bit entry
    m.z[zd : zd + 4] = table[nibbles].reshape(4, -1).view(np.uint8)
    m.retire("LUTI4")
    if m.tracing:
        m.note(f"LUTI4 {{z{zd}.h-z{zd + 3}.h}}, ZT0, z{zn}[0]   int4 -> f16: z{zd}.h = {fmt(m.zv(zd, '<f2'), 12)}")


def mova_tile_rows(m: Machine, zd: int, row: int) -> None:
    """MOVA {zd.b-zd+3.b}, ZA0H.B[w, 0:3] (SME2): ZA array rows w..w+3 — row w/4 of ZA0.S…ZA3.S."""
    m.z[zd : zd + 4] = m.za[row : row + 4]
    m.retire("MOVA")
    if m.tracing:
        m.note(
            f"MOVA {{z{zd}.b-z{zd + 3}.b}}, ZA0H.B[{row}, 0:3]   row {row // 4} of ZA0.S..ZA3.S: "
            f"z{zd}.s = {fmt(m.zv(zd, '<i4'))}"
        )


def mova_tile_row(m: Machine, zd: int, row: int) -> None:
    """MOVA zd.b, p/m, ZA0H.B[w, 0] (SME, one vector): ZA array row w."""
    m.z[zd] = m.za[row]
    m.retire("MOVA")
    if m.tracing:
        m.note(f"MOVA z{zd}.b, ZA0H.B[{row}]   z{zd}.s = {fmt(m.zv(zd, '<i4'))}")


def mova_vgx4(m: Machine, zd: int, slice_index: int) -> None:
    """MOVA {zd.s-zd+3.s}, ZA.S[w, 0, VGx4]: the four vectors of the vector group."""
    rows = m.za_vgx4_rows(slice_index)
    m.z[zd : zd + 4] = m.za[rows]
    m.retire("MOVA")
    if m.tracing:
        m.note(f"MOVA {{z{zd}.s-z{zd + 3}.s}}, ZA.S[w8, {slice_index}, VGx4]   ZA rows {rows}: {fmt(m.zv(zd, '<i4'))}")


def mova_to_vgx4(m: Machine, slice_index: int, zn: int) -> None:
    """MOVA ZA.D[w, 0, VGx4], {zn.d-zn+3.d}: the four vectors into the vector group's ZA rows."""
    rows = m.za_vgx4_rows(slice_index)
    m.za[rows] = m.z[zn : zn + 4]
    m.retire("MOVA")
    if m.tracing:
        m.note(f"MOVA ZA.D[w8, {slice_index}, VGx4], {{z{zn}.d-z{zn + 3}.d}}   ZA rows {rows}")


def zero_za(m: Machine) -> None:
    m.za[:] = 0
    m.retire("ZERO")
    if m.tracing:
        m.note("ZERO {ZA}")


# --------------------------------------------------------------------------------------------- integer


def lsl_imm(m: Machine, zd: int, zn: int, shift: int) -> None:
    """LSL zd.b, zn.b, #shift."""
    m.z[zd] = (m.z[zn] << shift).astype(np.uint8)
    m.retire("LSL")


def and_(m: Machine, zd: int, zn: int, zm: int) -> None:
    """AND zd.d, zn.d, zm.d."""
    m.z[zd] = m.z[zn] & m.z[zm]
    m.retire("AND")


def smopa4(m: Machine, tile: int, pn: int, pm: int, zn: int, zm: int) -> None:
    """SMOPA ZAt.S, pn/m, pm/m, zn.B, zm.B: 4-way signed int8 outer product into a 32-bit tile,
    ZAt[i][j] += Σ_e zn.b[4i+e]·zm.b[4j+e] (int32, wrapping); rows/columns whose predicate element is off keep
    their value."""
    vl = m.vl
    a = m.zv(zn, "<i1").reshape(vl, 4).astype(np.int32)
    b = m.zv(zm, "<i1").reshape(vl, 4).astype(np.int32)
    prod = a @ b.T
    rows, cols = m.p[pn][::4], m.p[pm][::4]
    if not (rows.all() and cols.all()):
        prod *= np.outer(rows, cols)
    view = m.za_tile_s(tile)
    view += prod
    m.retire("SMOPA")
    if m.tracing:
        m.note(f"SMOPA ZA{tile}.S, p{pn}/m, p{pm}/m, z{zn}.b, z{zm}.b   ZA{tile}.S[0][0:4] = {fmt(view[0, :4])}")


def sdot_za_vgx4(m: Machine, slice_index: int, zn: int, zm: int, index: int) -> None:
    """SDOT ZA.S[w, 0, VGx4], {zn.b-zn+3.b}, zm.b[index] (SME2 multi-vector, indexed): for v = 0..3 and lane e,
    ZA row (v·VB/4 + w).s[e] += Σ_t zn+v.b[4e+t]·zm.b[16·(e//4) + 4·index + t]."""
    vl = m.vl
    seg = m.zv(zm, "<i1").reshape(-1, 16)[:, 4 * index : 4 * index + 4].astype(np.int32)  # [segments, 4]
    lhs = np.repeat(seg, 4, axis=0)  # lane e uses segment e // 4
    za = m.za_s()
    rows = m.za_vgx4_rows(slice_index)
    for v in range(4):
        w = m.zv(zn + v, "<i1").reshape(vl, 4).astype(np.int32)
        za[rows[v]] += (w * lhs).sum(axis=1, dtype=np.int32)
    m.retire("SDOT")
    if m.tracing:
        m.note(
            f"SDOT ZA.S[w8, {slice_index}, VGx4], {{z{zn}.b-z{zn + 3}.b}}, z{zm}.b[{index}]   "
            f"ZA rows {rows}: row {rows[0]}.s = {fmt(za[rows[0]])}"
        )


def fmla_za_vgx4(m: Machine, slice_index: int, zn: int, zm: int, index: int) -> None:
    """FMLA ZA.S[w, 0, VGx4], {zn.s-zn+3.s}, zm.s[index] (SME2 multi-vector, indexed): for v = 0..3 and lane e,
    ZA row (v·VB/4 + w).s[e] = fma(zn+v.s[e], zm.s[4·(e//4) + index], itself) (one rounding)."""
    scalars = np.repeat(m.zv(zm, "<f4").reshape(-1, 4)[:, index], 4)  # lane e uses its segment's element
    za = m.za.view("<f4")
    rows = m.za_vgx4_rows(slice_index)
    for v in range(4):
        za[rows[v]] = fma_lanes(m.zv(zn + v, "<f4").copy(), scalars, za[rows[v]].copy())
    m.retire("FMLA")
    if m.tracing:
        m.note(
            f"FMLA ZA.S[w8, {slice_index}, VGx4], {{z{zn}.s-z{zn + 3}.s}}, z{zm}.s[{index}]   "
            f"ZA rows {rows}: row {rows[0]}.s = {fmt(za[rows[0]])}"
        )


def sdot_indexed(m: Machine, zda: int, zn: int, zm: int, index: int) -> None:
    """SDOT zda.s, zn.b, zm.b[index] (SVE): lane e += Σ_t zn.b[4e+t]·zm.b[16·(e//4) + 4·index + t]."""
    seg = m.zv(zm, "<i1").reshape(-1, 16)[:, 4 * index : 4 * index + 4].astype(np.int32)
    w = m.zv(zn, "<i1").reshape(-1, 4).astype(np.int32)
    acc = m.zv(zda, "<i4")
    acc += (w * np.repeat(seg, 4, axis=0)).sum(axis=1, dtype=np.int32)
    m.retire("SDOT")
    if m.tracing:
        m.note(f"SDOT z{zda}.s, z{zn}.b, z{zm}.b[{index}]   z{zda}.s = {fmt(acc)}")


# --------------------------------------------------------------------------------------------- floating point


def scvtf(m: Machine, zd: int, zn: int) -> None:
    """SCVTF zd.s, p/m, zn.s: int32 → float32, round to nearest even."""
    m.zv(zd, "<f4")[:] = m.zv(zn, "<i4").astype(np.float32)
    m.retire("SCVTF")


def scvtf_x4(m: Machine, zd: int) -> None:
    """SCVTF {zd.s-zd+3.s}, {zd.s-zd+3.s} (SME2 multi-vector)."""
    block = m.z[zd : zd + 4]
    block.view("<f4")[:] = block.view("<i4").astype(np.float32)
    m.retire("SCVTF")
    if m.tracing:
        m.note(f"SCVTF {{z{zd}.s-z{zd + 3}.s}}   z{zd}.s = {fmt(m.zv(zd, '<f4'))}")


def _fmlal(m: Machine, name: str, zda: int, zn: int, zm: int, top: int) -> None:
    a = m.zv(zn, "<f2")[top::2].astype(np.float32)
    b = m.zv(zm, "<f2")[top::2].astype(np.float32)
    acc = m.zv(zda, "<f4")
    acc[:] = fma_lanes(a, b, acc.copy())
    m.retire(name)
    if m.tracing:
        m.note(f"{name} z{zda}.s, z{zn}.h, z{zm}.h   z{zda}.s = {fmt(acc)}")


def fmlalb(m: Machine, zda: int, zn: int, zm: int) -> None:
    """FMLALB zda.s, zn.h, zm.h: fp16 even lanes widened, fused multiply-add into float32."""
    _fmlal(m, "FMLALB", zda, zn, zm, 0)


def fmlalt(m: Machine, zda: int, zn: int, zm: int) -> None:
    """FMLALT zda.s, zn.h, zm.h: the odd fp16 lanes."""
    _fmlal(m, "FMLALT", zda, zn, zm, 1)


def fmul(m: Machine, zd: int, zn: int, zm: int) -> None:
    """FMUL zd.s, zn.s, zm.s (unpredicated)."""
    m.zv(zd, "<f4")[:] = m.zv(zn, "<f4") * m.zv(zm, "<f4")
    m.retire("FMUL")
    if m.tracing:
        m.note(f"FMUL z{zd}.s, z{zn}.s, z{zm}.s   z{zd}.s = {fmt(m.zv(zd, '<f4'))}")


def fmul_h(m: Machine, zd: int, zn: int, zm: int) -> None:
    """FMUL zd.h, zn.h, zm.h (unpredicated, F16: the exact product rounded once to F16)."""
    m.zv(zd, "<f2")[:] = m.zv(zn, "<f2") * m.zv(zm, "<f2")
    m.retire("FMUL")
    if m.tracing:
        m.note(f"FMUL z{zd}.h, z{zn}.h, z{zm}.h   z{zd}.h = {fmt(m.zv(zd, '<f2'), 12)}")


def fmla(m: Machine, zda: int, pg: int, zn: int, zm: int) -> None:
    """FMLA zda.s, pg/m, zn.s, zm.s: fused zda + zn·zm on active lanes."""
    acc = m.zv(zda, "<f4")
    fused = fma_lanes(m.zv(zn, "<f4").copy(), m.zv(zm, "<f4").copy(), acc.copy())
    active = m.p[pg][::4]
    acc[:] = np.where(active, fused, acc)
    m.retire("FMLA")
    if m.tracing:
        m.note(f"FMLA z{zda}.s, p{pg}/m, z{zn}.s, z{zm}.s   z{zda}.s = {fmt(acc)}")


def fclamp_x4(m: Machine, zd: int, zmin: int, zmax: int) -> None:
    """FCLAMP {zd.s-zd+3.s}, zmin.s, zmax.s (SME2): min(max(x, lo), hi) per lane."""
    block = m.z[zd : zd + 4].view("<f4")
    block[:] = np.minimum(np.maximum(block, m.zv(zmin, "<f4")), m.zv(zmax, "<f4"))
    m.retire("FCLAMP")


def fmax(m: Machine, zdn: int, pg: int, zm: int) -> None:
    """FMAX zdn.s, pg/m, zdn.s, zm.s."""
    acc = m.zv(zdn, "<f4")
    acc[:] = np.where(m.p[pg][::4], np.maximum(acc, m.zv(zm, "<f4")), acc)
    m.retire("FMAX")


def fmin(m: Machine, zdn: int, pg: int, zm: int) -> None:
    """FMIN zdn.s, pg/m, zdn.s, zm.s."""
    acc = m.zv(zdn, "<f4")
    acc[:] = np.where(m.p[pg][::4], np.minimum(acc, m.zv(zm, "<f4")), acc)
    m.retire("FMIN")


def bfmopa(m: Machine, tile: int, zn: int, zm: int) -> None:
    """BFMOPA ZAt.S, p/m, p/m, zn.H, zm.H: bf16 pair outer product accumulated into a float32 tile,
    ZAt[i][j] = BFDotAdd(ZAt[i][j], zn.h[2i]·zm.h[2j] + zn.h[2i+1]·zm.h[2j+1]) (FPCR.EBF = 0)."""
    vl = m.vl
    view = m.za_tile_s(tile, "<f4")
    a = m.zv(zn, "<u2").reshape(vl, 2)
    b = m.zv(zm, "<u2").reshape(vl, 2)
    view[:] = bf16_outer_pairs(view.copy(), a, b)
    m.retire("BFMOPA")
    if m.tracing:
        m.note(f"BFMOPA ZA{tile}.S, z{zn}.h, z{zm}.h   ZA{tile}.S[0][0:4] = {fmt(view[0, :4])}")


def mla(m: Machine, zda: int, pg: int, zn: int, zm: int) -> None:
    """MLA zda.s, pg/m, zn.s, zm.s (int32, wrapping)."""
    acc = m.zv(zda, "<i4")
    acc[:] = np.where(m.p[pg][::4], acc + m.zv(zn, "<i4") * m.zv(zm, "<i4"), acc)
    m.retire("MLA")
    if m.tracing:
        m.note(f"MLA z{zda}.s, p{pg}/m, z{zn}.s, z{zm}.s   z{zda}.s = {fmt(acc)}")


def fadd(m: Machine, zdn: int, pg: int, zm: int) -> None:
    """FADD zdn.s, pg/m, zdn.s, zm.s."""
    acc = m.zv(zdn, "<f4")
    acc[:] = np.where(m.p[pg][::4], acc + m.zv(zm, "<f4"), acc)
    m.retire("FADD")
    if m.tracing:
        m.note(f"FADD z{zdn}.s, p{pg}/m, z{zdn}.s, z{zm}.s   z{zdn}.s = {fmt(acc)}")


def mova_to_tile_row(m: Machine, tile: int, row: int, zn: int) -> None:
    """MOVA ZAtH.S[w, 0], p/m, zn.s: row ``row`` of the 32-bit tile ZAt (ZA array row 4·row + t) ← zn."""
    m.za[4 * row + tile] = m.z[zn]
    m.retire("MOVA")
    if m.tracing:
        m.note(f"MOVA ZA{tile}H.S[{row}], z{zn}.s   {fmt(m.zv(zn, '<f4'))}")


def mova_from_tile_row(m: Machine, zd: int, tile: int, row: int) -> None:
    """MOVA zd.s, p/m, ZAtH.S[w, 0]: row ``row`` of the 32-bit tile ZAt."""
    m.z[zd] = m.za[4 * row + tile]
    m.retire("MOVA")
    if m.tracing:
        m.note(f"MOVA z{zd}.s, ZA{tile}H.S[{row}]   {fmt(m.zv(zd, '<f4'))}")


def fmopa(m: Machine, tile: int, zn: int, zm: int) -> None:
    """FMOPA ZAt.S, p/m, p/m, zn.s, zm.s: float32 outer product, ZAt[i][j] = fma(zn[i], zm[j], ZAt[i][j])."""
    view = m.za_tile_s(tile, "<f4")
    rows, cols = view.shape
    a = np.repeat(m.zv(zn, "<f4"), cols)
    b = np.tile(m.zv(zm, "<f4"), rows)
    view[:] = fma_lanes(a, b, view.reshape(-1).copy()).reshape(rows, cols)
    m.retire("FMOPA")
    if m.tracing:
        m.note(f"FMOPA ZA{tile}.S, z{zn}.s, z{zm}.s   ZA{tile}.S[0][0:4] = {fmt(view[0, :4])}")


def fmopa_wide_h(m: Machine, tile: int, zn: int, zm: int) -> None:
    """FMOPA ZAt.S, p/m, p/m, zn.H, zm.H (widening, FP16 to FP32): ZAt[i][j] += zn.h[2i]·zm.h[2j] +
    zn.h[2i+1]·zm.h[2j+1], the pair of products rounded once to float32, then the sum rounded
    (:func:`~kleidipy.emulator.fp.f16_outer_pairs`)."""
    vl = m.vl
    view = m.za_tile_s(tile, "<f4")
    view[:] = f16_outer_pairs(view.copy(), m.zv(zn, "<u2").reshape(vl, 2), m.zv(zm, "<u2").reshape(vl, 2))
    m.retire("FMOPA")
    if m.tracing:
        m.note(f"FMOPA ZA{tile}.S, z{zn}.h, z{zm}.h   ZA{tile}.S[0][0:4] = {fmt(view[0, :4])}")
