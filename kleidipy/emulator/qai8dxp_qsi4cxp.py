"""Instruction programs of the per-channel int4 family ``qai8dxp × qsi4cxp``: the loops of
:mod:`.qai8dxp_qsi8cxp` on int4 weights (NEON: nibbles read as 16·w with SHL #4 / AND #0xF0; SME2: LUTI4 with
the two's-complement table)."""

from __future__ import annotations

import numpy as np

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator.qai8dxp_qsi8cxp import _neon_dotprod_1x8, _neon_i8mm, _sme_dot, _sme_mopa

PROGRAMS = {
    "matmul_clamp_f32_qai8dxp1vlx8_qsi4cxp4vlx8_1vlx4vl_sme2_mopa": _sme_mopa,
    "matmul_clamp_f32_qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot": _sme_dot,
    "matmul_clamp_f32_qai8dxp1x8_qsi4cxp4x8_1x4x32_neon_dotprod": _neon_dotprod_1x8,
    "matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm": _neon_i8mm,
    "matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_8x4x32_neon_i8mm": _neon_i8mm,
}


def rhs_inputs(kern: MatmulKernel, weights: np.ndarray) -> tuple[np.ndarray, dict]:
    """The RHS packer inputs for float weights [n, k]: unsigned 4-bit codes u (weight (u − 8)·scale, scale =
    amax/7 per row) two per byte, element 2j in the low nibble (s1s0), and the f32 scales."""
    n, k = weights.shape
    amax = np.abs(weights).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(7), np.float32(1)).astype(np.float32)
    u = np.clip(np.rint(weights / scale[:, None]) + 8, 0, 15).astype(np.uint8)
    if k % 2:
        u = np.concatenate([u, np.full((n, 1), 8, np.uint8)], axis=1)
    return (u[:, 0::2] | u[:, 1::2] << 4).astype(np.uint8), {"scale": scale}
