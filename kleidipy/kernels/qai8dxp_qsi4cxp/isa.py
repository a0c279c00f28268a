"""Instruction programs of the per-channel int4 family ``qai8dxp × qsi4cxp``: the loops of
:mod:`.qai8dxp_qsi8cxp` on int4 weights (NEON: nibbles read as 16·w with SHL #4 / AND #0xF0; SME2: LUTI4 with
the two's-complement table)."""

from __future__ import annotations

from kleidipy.kernels.qai8dxp_qsi8cxp.isa import neon_dotprod_1x8, neon_i8mm, sme_dot, sme_mopa

PROGRAMS = {
    "matmul_clamp_f32_qai8dxp1vlx8_qsi4cxp4vlx8_1vlx4vl_sme2_mopa": sme_mopa,
    "matmul_clamp_f32_qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot": sme_dot,
    "matmul_clamp_f32_qai8dxp1x8_qsi4cxp4x8_1x4x32_neon_dotprod": neon_dotprod_1x8,
    "matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm": neon_i8mm,
    "matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_8x4x32_neon_i8mm": neon_i8mm,
}
