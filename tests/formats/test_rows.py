"""kleidipy.formats.rows: the compiled GET_ROWS gives gguf's dequantized rows bit for bit, for every type it
handles; RowEmbedding uses it and keeps gguf for the other types."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from kleidipy.core.numerics import f32_to_f16_bits
from kleidipy.formats import rows
from kleidipy.runtime.weights import RowEmbedding, dequantize_rows


def random_bytes(rng: np.random.Generator, t: T, n: int, k: int) -> np.ndarray:
    """Random rows of type t whose fp16 fields (scales, mins, F16 values) are finite and of mixed size and sign."""
    block, size = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (n, k // block * size), dtype=np.uint8)
    if t == T.F32:
        return rng.normal(0, 3, (n, k)).astype(np.float32).view(np.uint8)
    halves = f32_to_f16_bits(rng.normal(0, 1, (n, raw.shape[1] // 2)).astype(np.float32) * 10.0 ** rng.integers(-6, 3))
    fields = {T.F16: range(0, k, 1), T.Q4_0: (0,), T.Q4_1: (0, 1), T.Q5_0: (0,), T.Q8_0: (0,)}[t]
    as16 = raw.view(np.uint16)
    for b in range(k // block):
        for f in fields:
            at = (b * size) // 2 + f if t != T.F16 else f
            as16[:, at] = halves[:, at]
        if t == T.F16:
            break
    return raw


@pytest.mark.parametrize("t", sorted(rows.CODES, key=int), ids=lambda t: t.name)
def test_get_rows_is_gguf_bit_for_bit(t: T) -> None:
    rng = np.random.default_rng(int(t))
    n, k = 37, 96
    raw = random_bytes(rng, t, n, k)
    ids = np.array([0, 5, 36, 5, 17], np.int64)
    want = np.array(gguf.quants.dequantize(raw[ids], t), np.float32).reshape(ids.size, k)
    out = np.empty((ids.size, k), np.float32)
    rows.get_rows(rows.CODES[t], raw, ids, out)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_row_embedding_uses_it_and_keeps_gguf_for_other_types() -> None:
    rng = np.random.default_rng(3)
    for t in (T.Q8_0, T.Q6_K):
        block, size = GGML_QUANT_SIZES[t]
        k = 2 * block
        raw = random_bytes(rng, T.Q8_0, 9, k) if t == T.Q8_0 else rng.integers(0, 256, (9, 2 * size), dtype=np.uint8)
        if t == T.Q6_K:  # finite super-block scales
            raw[:, size - 2 : size] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
            raw[:, 2 * size - 2 :] = np.frombuffer(np.float16(-0.5).tobytes(), np.uint8)
        emb = RowEmbedding(t, raw, k)
        got = emb([3, 1, 8])
        want = dequantize_rows(t, raw[[3, 1, 8]]).reshape(3, k)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert T.Q6_K not in rows.CODES and T.Q5_0 in rows.CODES
