"""Packer inputs for the per-channel int4 family. No GGML type is per-channel int4 (KleidiAI's own format),
so only float weights are converted: unsigned codes u with value (u - 8)·scale, scale = amax/7 per row."""

from __future__ import annotations

import numpy as np

from kleidipy.core.packers import RhsPacker


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] -> (codes two per byte, element 2j in the low nibble (s1s0), {scale: f32 [n]})."""
    n, k = weights.shape
    amax = np.abs(weights).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(7), np.float32(1)).astype(np.float32)
    u = np.clip(np.rint(weights / scale[:, None]) + 8, 0, 15).astype(np.uint8)
    if k % 2:
        u = np.concatenate([u, np.full((n, 1), 8, np.uint8)], axis=1)
    return (u[:, 0::2] | u[:, 1::2] << 4).astype(np.uint8), {"scale": scale}
