"""Instruction programs of the ``f32_f32p`` family: ``matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla`` and
``matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla``.

NEON: a 6×16 tile lives in v8–v31 (row r, columns 4v..4v+3 in v8 + 4r + v), started at the 16 packed biases
(4 × LDR q, MOV per row). Per k: the 16 RHS values of row k (4 × LDR q) and, per LHS row, its value
(LDR s) feed 4 FMLA by element (fused, one rounding each, k in ascending order). Then clamp and store.
KleidiAI's source was not available to read; the sequence follows the packed layout and the golden-pinned
arithmetic (one fma per k, from the bias).

SME2 GEMV (KleidiAI's source): the columns in chunks of up to four vector groups of 4·VL columns (two packed RHS
groups of 2·VL each; a last group past n reads the chunk's first instead, as the kernel's CSEL does). Per chunk, each
group's 4·VL biases (two LD1W of two vectors) go to ZA vector group w (MOVA ZA.D[w8, w, VGx4]); per quad of K values,
the quad of LHS values (LD1RQW, the K tail's lanes off) and, per K value of the quad and per group, its 4·VL RHS
values (two LDNT1W of two vectors) and one FMLA ZA.S[w8, w, VGx4] by the quad's element (fused, k ascending); then
per group a MOVA of its four vectors and their ST1W (the last group's stores predicated to n). The program writes the
unclamped result (the kernel's FCLAMP is the clamp ``MatmulKernel.run`` applies).
"""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import neon, sme
from kleidipy.emulator.common import neon_limits, output_tiles
from kleidipy.emulator.machine import Buffer, Machine

NR, MR = 16, 6


def _neon_mla(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    rhs_stride = NR * 4 * (1 + k)
    for m0, rows, n0 in output_tiles(m, mm, MR, n, NR, "bias, then the K loop (first 2 k traced)"):
        group = (n0 // NR) * rhs_stride
        for v in range(4):
            neon.ldr(m, 16, v, rhs, group + 16 * v)
        for r in range(rows):
            for v in range(4):
                neon.mov(m, 8 + 4 * r + v, v)
        for kk in range(k):
            m.trace_when(m0 == 0 and n0 == 0 and kk < 2)
            for v in range(4):
                neon.ldr(m, 16, v, rhs, group + NR * 4 * (1 + kk) + 16 * v)
            for r in range(rows):
                neon.ldr(m, 4, 4, lhs, ((m0 + r) * k + kk) * 4)
                for v in range(4):
                    neon.fmla_elem(m, 8 + 4 * r + v, v, 4, 0)
        m.trace_when(m0 == 0 and n0 == 0)
        neon_limits(m, 4)
        for r in range(rows):
            for v in range(4):
                col = n0 + 4 * v
                if col >= n:
                    continue
                reg = 8 + 4 * r + v
                neon.fmax(m, reg, reg, 4)
                neon.fmin(m, reg, reg, 5)
                neon.store(m, reg, min(4, n - col), 4, dst, ((m0 + r) * n + col) * 4)


def _sme2_gemv(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    vb, vl = m.vb, m.vl
    nr, group = 2 * vl, 4 * vl
    block = nr * (1 + k) * 4
    sme.smstart(m)
    sme.ptrue_pn(m, 9, 4)
    for n0 in range(0, n, 4 * group):
        widths = min(4, -(-(n - n0) // group))
        first = (n0 // nr) * block
        blocks = [first + b * block for b in range(2 * widths)]
        if n - n0 <= (2 * widths - 1) * nr:  # (no last RHS group: the kernel's CSEL reads the chunk's first)
            blocks[-1] = first
        m.trace_when(n0 == 0)
        m.section(f"columns {n0}..: {widths} vector group(s) of {group}, biases then K")
        for w in range(widths):
            sme.ld1_multi(m, 4, 20, 2, 9, rhs, blocks[2 * w])
            sme.ld1_multi(m, 4, 22, 2, 9, rhs, blocks[2 * w + 1])
            sme.mova_to_vgx4(m, w, 20)
        for kq in range(0, k, 4):
            m.trace_when(n0 == 0 and kq == 0)
            sme.whilelt(m, 0, kq, k, 4)
            sme.ld1rq(m, 8, 0, lhs, 4 * kq, esize=4)
            for t in range(min(4, k - kq)):
                row = (1 + kq + t) * 2 * vb
                for w in range(widths):
                    sme.ld1_multi(m, 4, 0, 2, 9, rhs, blocks[2 * w] + row)
                    sme.ld1_multi(m, 4, 2, 2, 9, rhs, blocks[2 * w + 1] + row)
                    sme.fmla_za_vgx4(m, w, 0, 8, t)
        m.trace_when(False)
        sme.whilelt_pn(m, 8, n0 + (widths - 1) * group, n, 4, 4)
        for w in range(widths):
            sme.mova_vgx4(m, 4, w)
            sme.st1_multi(m, 4, 4, 4, 8 if w == widths - 1 else 9, dst, 4 * (n0 + w * group))
    sme.smstop(m)


PROGRAMS = {
    "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla": _neon_mla,
    "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla": _sme2_gemv,
}
