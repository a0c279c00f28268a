"""GGML weight types as int8 codes with an f32 scale and an f32 offset per 16 values, exactly.

For each type here ggml's dequantization (``dequantize_row_*`` in ggml-quants.c) is, per 16 values,
``y = f32(scale·code) + offset`` with an integer code that fits int8 and the f32 scale and offset ggml itself
computes: Q8_0 ``q·d``, Q8_K ``d·q``, Q5_0 ``(q − 16)·d``, IQ4_NL ``d·kvalues[q]`` (offset −0: adding it changes no
bit), Q4_1 and Q5_1 ``q·d + m`` (an fp16 times a 5-bit code is exact, so a fused or unfused add is the same), Q4_K/Q5_K
``(d·sc)·q − dmin·m`` (scale d·sc and min dmin·m are exact f32 products, offset −(dmin·m)) and Q6_K
``(d·sc)·(q − 32)`` (d·sc exact; the product with the code is rounded once, as ggml rounds it). Types with a
scale per 32 values carry it on both halves. :func:`dequantize` states the value; the
``qsi8d32p_qai8c16p`` kernel family multiplies these codes.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType
from gguf import quants

from kleidipy.core.numerics import f16_bits_to_f32
from kleidipy.errors import UnsupportedTensorTypeError
from kleidipy.formats import q4_1, q4_k
from kleidipy.formats.blocks import BlockFormat, fp16_field, split_nibbles

BL = 16  #: values per scale and offset

_FORMATS = {
    GGMLType.Q8_0: BlockFormat("Q8_0", 34, 32),
    GGMLType.Q5_0: BlockFormat("Q5_0", 22, 32),
    GGMLType.Q5_1: BlockFormat("Q5_1", 24, 32),
    GGMLType.Q4_1: q4_1.FORMAT,
    GGMLType.IQ4_NL: BlockFormat("IQ4_NL", 18, 32),
    GGMLType.Q4_K: q4_k.FORMAT,
    GGMLType.Q5_K: BlockFormat("Q5_K", 176, 256),
    GGMLType.Q6_K: BlockFormat("Q6_K", 210, 256),
    GGMLType.Q8_K: BlockFormat("Q8_K", 292, 256),
}
#: the GGML types :func:`codes16` takes
TYPES: tuple[GGMLType, ...] = tuple(_FORMATS)

_KVALUES_IQ4_NL = np.array(quants.IQ4_NL.kvalues, np.int8)
_NEG_ZERO = np.float32(-0.0)


def _per16(per_block: np.ndarray, n: int, k: int) -> np.ndarray:
    """f32 [n, k/16] from one value per block (of 32 or 256 values), each repeated over its 16-blocks."""
    values = per_block.astype(np.float32).reshape(n, -1)
    return np.repeat(values, k // BL // values.shape[1], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Bit e of the little-endian uint32 ``qh`` bytes [..., 4] for e < 32, as 0/16: uint8 [..., 32]."""
    word = qh.astype(np.uint32) @ np.array([1, 1 << 8, 1 << 16, 1 << 24], np.uint32)
    return (((word[..., None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _k_scale_min(view: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Q5_K's f32 d·sc and dmin·m per 32 values [n, k/32] (ggml's ``get_scale_min_k4``, as Q4_K's)."""
    d = f16_bits_to_f32(fp16_field(view, 0))[..., None]
    dmin = f16_bits_to_f32(fp16_field(view, 2))[..., None]
    q = view[..., 4:16]
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    return (d * sc.astype(np.float32)).reshape(n, -1), (dmin * m.astype(np.float32)).reshape(n, -1)


def codes16(raw: np.ndarray, ggml_type: GGMLType, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8 [n, k], scale f32 [n, k/16], offset f32 [n, k/16]) of a GGML tensor of n rows of k values such that
    ``f32(scale·code) + offset`` is ggml's dequantized value bit for bit (see the module docstring)."""
    if ggml_type not in _FORMATS:
        names = ", ".join(t.name for t in TYPES)
        raise UnsupportedTensorTypeError(f"{GGMLType(ggml_type).name} has no int8 codes per 16 values (types: {names})")
    fmt = _FORMATS[ggml_type]
    view = fmt.view(np.asarray(raw).reshape(-1).view(np.uint8), n, k)
    zero = np.full((n, k // BL), _NEG_ZERO)
    if ggml_type == GGMLType.Q8_0:
        d = f16_bits_to_f32(fp16_field(view, 0))
        return view[..., 2:].view(np.int8).reshape(n, k), _per16(d, n, k), zero
    if ggml_type == GGMLType.Q8_K:
        d = np.ascontiguousarray(view[..., :4]).view(np.float32)
        return np.ascontiguousarray(view[..., 4:260]).view(np.int8).reshape(n, k), _per16(d, n, k), zero
    if ggml_type == GGMLType.IQ4_NL:
        d = f16_bits_to_f32(fp16_field(view, 0))
        return _KVALUES_IQ4_NL[split_nibbles(view[..., 2:])].reshape(n, k), _per16(d, n, k), zero
    if ggml_type == GGMLType.Q4_1:
        d, m = (f16_bits_to_f32(fp16_field(view, off)) for off in (0, 2))
        return split_nibbles(view[..., 4:]).astype(np.int8).reshape(n, k), _per16(d, n, k), _per16(m, n, k)
    if ggml_type in (GGMLType.Q5_0, GGMLType.Q5_1):
        d = f16_bits_to_f32(fp16_field(view, 0))
        asym = ggml_type == GGMLType.Q5_1
        u = split_nibbles(view[..., 6 + 2 * asym :]) | _fifth_bits(view[..., 2 + 2 * asym : 6 + 2 * asym])
        if not asym:
            return (u.astype(np.int8) - np.int8(16)).reshape(n, k), _per16(d, n, k), zero
        m = f16_bits_to_f32(fp16_field(view, 2))
        return u.astype(np.int8).reshape(n, k), _per16(d, n, k), _per16(m, n, k)
    if ggml_type == GGMLType.Q4_K:
        scale, minimum, u = q4_k.sub_block_fields(view, n, k)
        return u.astype(np.int8), _per16(scale, n, k), _per16(-minimum, n, k)
    if ggml_type == GGMLType.Q5_K:
        scale, minimum = _k_scale_min(view, n)
        qs = view[..., 48:].reshape(n, -1, 4, 1, 32)  # 32 bytes per pair of sub-blocks: low nibbles, then high
        qh = view[..., 16:48].reshape(n, -1, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 4, 2, 1)
        u = np.concatenate([qs & 0xF, qs >> 4], axis=3) | ((qh & 1) << 4)
        return u.astype(np.int8).reshape(n, k), _per16(scale, n, k), _per16(-minimum, n, k)
    # Q6_K: ql[128], qh[64], int8 scales[16], fp16 d; per half of 128: values l + 32c (c < 4, l < 32) take the
    # nibble (c // 2) of ql[l + 32 (c % 2)], bits 2c of qh[l], and the scale of their 16-block 2c + l // 16
    d = f16_bits_to_f32(fp16_field(view, 208))[..., None]
    sc = view[..., 192:208].view(np.int8).astype(np.float32)
    ql = view[..., :128].reshape(n, -1, 2, 1, 2, 32)  # [super-block, half, -, ql row c % 2, l]
    qh = view[..., 128:192].reshape(n, -1, 2, 1, 1, 32)
    low = np.concatenate([ql & 0xF, ql >> 4], axis=3).reshape(n, -1, 2, 2, 32)  # [half, c // 2, c % 2, l]
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 2, 2, 1)
    high = ((qh >> shifts) & 3).reshape(n, -1, 2, 2, 32)  # the same order: shift 2c
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    return q.reshape(n, k), (d * sc).reshape(n, -1).astype(np.float32), zero


def dequantize(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """float32 [n, k] values ``f32(scale·code) + offset`` of :func:`codes16`'s fields."""
    n, k = codes.shape
    values = codes.reshape(n, -1, BL).astype(np.float32) * scale[..., None]
    return (values + offset[..., None]).reshape(n, k)
