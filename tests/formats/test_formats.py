"""kleidipy.formats: GGML Q4_0 / Q4_1 / Q8_0 / F16 / F32 bit-exact with ggml's reference code, the type
registry, and the dequantize-only types.

Checked three ways: against an independent scalar model that follows ggml's C line by line, against
gguf-py's ``gguf.quants``, and against real data (the golden inputs, and llama-quantize's SmolLM2
re-quantization hashes in shared/reference/models.json).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal
from model_files import SMOLLM2, model_file

from kleidipy import formats
from kleidipy.core.numerics import f16_bits_to_f32
from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    KernelShapeError,
    KleidipyError,
    NonFiniteInputError,
    UnsupportedTensorTypeError,
)
from kleidipy.formats import f16, other, q4_0, q4_1, q4_k, q8_0
from kleidipy.kernels.qsi8d32p_qai4c32p.ggml import from_ggml
from kleidipy.kernels.qsi8d32p_qai4c32p.ukernels import q4_1_to_qai4c32
from kleidipy.tools.golden import GoldenSet

MODULES = {T.Q4_0: q4_0, T.Q4_1: q4_1, T.Q8_0: q8_0}
F32 = np.float32


# --------------------------------------------------------------------------------------------- C model


def _fp16_bits(v: np.float32) -> int:
    with np.errstate(over="ignore"):
        return int(np.array([v], dtype=np.float32).astype(np.float16).view(np.uint16)[0])


def _to_int(v: np.float32) -> int:
    """C float -> int conversion (truncation); NaN/Inf (undefined in C) give x86's 0x80000000 -> low byte 0."""
    return math.trunc(float(v)) if math.isfinite(v) else 0


def c_block(t: T, x: np.ndarray) -> bytes:
    """ggml's quantize_row_<t>_ref for one block of 32 float32 values, scalar float32 arithmetic as in C."""
    with np.errstate(all="ignore"):
        if t == T.Q8_0:
            amax = F32(0)
            for v in x:
                amax = max(amax, abs(v))
            d = F32(amax / F32(127))
            inv = F32(1) / d if d else F32(0)
            q = []
            for v in x:
                p = F32(v * inv)
                q.append(math.copysign(math.floor(abs(float(p)) + 0.5), float(p)) if math.isfinite(p) else 0)
            return _fp16_bits(d).to_bytes(2, "little") + np.array(q, dtype=np.int64).astype(np.int8).tobytes()
        if t == T.Q4_0:
            amax, vmax = F32(0), F32(0)
            for v in x:
                if amax < abs(v):
                    amax, vmax = abs(v), v
            d = F32(vmax / F32(-8))
            inv = F32(1) / d if d else F32(0)
            u = [min(15, _to_int(F32(F32(v * inv) + F32(8.5)))) for v in x]
            head = _fp16_bits(d).to_bytes(2, "little")
        else:  # Q4_1
            vmin, vmax = F32(np.finfo(F32).max), F32(-np.finfo(F32).max)
            for v in x:
                if v < vmin:
                    vmin = v
                if v > vmax:
                    vmax = v
            d = F32(F32(vmax - vmin) / F32(15))
            inv = F32(1) / d if d else F32(0)
            u = [min(15, _to_int(F32(F32(F32(v - vmin) * inv) + F32(0.5)))) for v in x]
            head = _fp16_bits(d).to_bytes(2, "little") + _fp16_bits(vmin).to_bytes(2, "little")
        return head + bytes(u[j] | (u[j + 16] << 4) for j in range(16))


def c_quantize(t: T, x: np.ndarray) -> np.ndarray:
    blocks = [c_block(t, b) for b in x.reshape(-1, 32)]
    return np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(x.shape[0], -1, GGML_QUANT_SIZES[t][1])


def gguf_quantize(t: T, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf.quants.quantize(x, t).reshape(x.shape[0], -1, GGML_QUANT_SIZES[t][1])


# --------------------------------------------------------------------------------------------- test data


def _structured(rng: np.random.Generator, rows: int = 24, k: int = 256) -> np.ndarray:
    """Rows at many magnitudes, plus blocks that hit the corner cases of the reference quantizers."""
    scale = np.array([1e-44, 1e-38, 1e-30, 1e-7, 1e-3, 1.0, 7.0, 1e4, 6.6e4, 1e20, 1e37, 3e38], dtype=np.float64)
    x = rng.standard_normal((rows, k)) * scale[np.arange(rows) % scale.size, None]
    x = np.clip(x, -3.4e38, 3.4e38).astype(F32)
    ramp = np.arange(32, dtype=F32)
    x[0, :32] = 0.0  # all-zero block
    x[1, :32] = 0.5 * (ramp - 16)  # exact .5 steps: every scaled value is a tie
    x[1, 32:64] = -(ramp - 15) / 2  # negative max (d > 0 for Q4_0)
    x[2, :32] = 127 * (ramp - 16) / 16 + 0.5  # Q8_0 ties at x*id = n + 0.5
    x[2, 32:64] = 3.0  # constant block: Q4_1 d = 0
    x[2, 64:96] = -ramp  # Q4_0 max is negative
    x[3, :32] = 8 * (ramp - 15) / 16  # Q4_0 d = 1 ties at code boundaries
    x[3, 32:64] = ramp * 0.25  # Q4_1 ties (x - min) * id + 0.5 on the .5
    x[4, :64] = np.repeat([-5.0, 5.0], 32)  # equal-magnitude first max
    x[4, 64:96] = np.where(ramp % 2 == 0, 5.0, -5.0)
    return x


# --------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("t", list(MODULES))
def test_quantize_matches_c_model_and_gguf_on_corner_cases(t: T) -> None:
    x = _structured(np.random.default_rng(7))
    ours = MODULES[t].quantize(x)
    assert ours.dtype == np.uint8 and ours.shape == (24, 8, GGML_QUANT_SIZES[t][1])
    np.testing.assert_array_equal(ours, c_quantize(t, x))
    np.testing.assert_array_equal(ours, gguf_quantize(t, x))


@st.composite
def _rows(draw: st.DrawFn) -> np.ndarray:
    rows = draw(st.integers(1, 5))
    k = 32 * draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["floats", "ties", "magnitudes"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if kind == "floats":  # any finite float32 bit pattern
        bits = rng.integers(0, 2**32, size=(rows, k), dtype=np.uint64).astype(np.uint32)
        x = bits.view(F32)
        return np.where(np.isfinite(x), x, F32(1.5)).astype(F32)
    if kind == "ties":  # small multiples of a power of two: many exact .5 cases
        step = 2.0 ** draw(st.integers(-10, 10))
        return (rng.integers(-32, 33, size=(rows, k)) * step / 2).astype(F32)
    scale = 10.0 ** rng.uniform(-45, 38, size=(rows, 1))
    return np.clip(rng.standard_normal((rows, k)) * scale, -3.4e38, 3.4e38).astype(F32)


@settings(max_examples=150, deadline=None)
@given(x=_rows(), t=st.sampled_from(list(MODULES)))
def test_quantize_property_c_model_and_gguf(x: np.ndarray, t: T) -> None:
    ours = MODULES[t].quantize(x)
    np.testing.assert_array_equal(ours, c_quantize(t, x))
    np.testing.assert_array_equal(ours, gguf_quantize(t, x + F32(0)))  # gguf: see the signed-zero test


def test_signed_zero_blocks_follow_ggml_c() -> None:
    """ggml's Q4_0 scan starts from max = +0.0 and keeps it for a block of zeros, so d = +0/-8 = -0.0
    (fp16 0x8000) whatever the zeros' signs. gguf-py takes the block's first element instead and stores
    +0.0 (0x0000) for a block of -0.0: ggml's C is the reference, and we follow it."""
    x = np.zeros((2, 64), dtype=F32)
    x[0, :32] = -0.0
    x[0, 33] = -0.0
    x[1, 32:] = np.where(np.arange(32) % 3 == 0, -0.0, 0.0).astype(F32)
    for t, mod in MODULES.items():
        np.testing.assert_array_equal(mod.quantize(x), c_quantize(t, x))
    assert (q4_0.d_bits(q4_0.quantize(x)) == 0x8000).all()
    assert int(gguf_quantize(T.Q4_0, x)[0, 0, 1]) == 0x00  # gguf-py's d of the -0.0 block: +0.0
    # Q4_1 keeps the first zero found by its '<' scan as m: its sign is the block's first zero's sign
    assert q4_1.m_bits(q4_1.quantize(x)).tolist() == [[0x8000, 0x0000], [0x0000, 0x8000]]
    # dequantized zero blocks are -0.0 for Q4_0 ((8 - 8) * -0.0), +0.0 for Q8_0
    assert np.signbit(q4_0.dequantize(q4_0.quantize(x), 2, 64)).all()
    assert not np.signbit(q8_0.dequantize(q8_0.quantize(x), 2, 64)).any()


def _random_blocks(t: T, rows: int, nb: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes whose fp16 fields are finite."""
    size = GGML_QUANT_SIZES[t][1]
    blocks = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    for off in (0, 2) if t == T.Q4_1 else (0,):
        blocks[..., off + 1] &= 0x7B  # exponent < 31
    return blocks


@pytest.mark.parametrize("t", list(MODULES))
def test_dequantize_matches_gguf_and_float64_model(t: T) -> None:
    rng = np.random.default_rng(11)
    blocks = _random_blocks(t, 9, 5, rng)
    ours = MODULES[t].dequantize(blocks, 9, 160)
    assert ours.dtype == np.float32 and ours.shape == (9, 160)
    theirs = gguf.quants.dequantize(blocks.reshape(9, -1), t)
    assert bits_equal(ours, theirs)
    # float64 model: the products are exact, Q4_1's "+ m" is the only rounding
    d = f16_bits_to_f32(MODULES[t].d_bits(blocks)).astype(np.float64)[..., None]
    if t == T.Q8_0:
        model = q8_0.qs(blocks).reshape(9, 5, 32) * d
    elif t == T.Q4_0:
        model = (q4_0.codes(blocks).reshape(9, 5, 32).astype(np.int64) - 8) * d
    else:
        m = f16_bits_to_f32(q4_1.m_bits(blocks)).astype(np.float64)[..., None]
        model = q4_1.codes(blocks).reshape(9, 5, 32) * d + m
    assert bits_equal(ours, model.reshape(9, 160).astype(F32))


@pytest.mark.parametrize("t", list(MODULES))
def test_field_accessors_round_trip(t: T) -> None:
    mod = MODULES[t]
    blocks = _random_blocks(t, 3, 4, np.random.default_rng(5))
    flat = blocks.reshape(-1)
    assert np.array_equal(mod.d_bits(blocks), mod.d_bits(flat, 3, 128))
    assert mod.d_bits(blocks).dtype == np.uint16 and mod.d_bits(blocks).shape == (3, 4)
    if t == T.Q8_0:
        assert np.array_equal(mod.from_fields(mod.d_bits(blocks), mod.qs(blocks)), blocks)
        assert np.array_equal(mod.qs(blocks)[:, 32:64], blocks[:, 1, 2:].view(np.int8))
        return
    u = mod.codes(flat, 3, 128)
    assert u.shape == (3, 128) and u.max() <= 15
    qs = blocks[..., -16:]
    assert np.array_equal(u[:, 5], qs[:, 0, 5] & 15) and np.array_equal(u[:, 32 + 21], qs[:, 1, 5] >> 4)
    if t == T.Q4_0:
        assert np.array_equal(mod.from_fields(mod.d_bits(blocks), u), blocks)
    else:
        assert np.array_equal(mod.from_fields(mod.d_bits(blocks), mod.m_bits(blocks), u), blocks)


# --------------------------------------------------------------------------------------------- real data


def test_golden_inputs(golden_dir: Path) -> None:
    """Every golden shape: the GGML inputs the KleidiAI runs were fed are our quantizations of the f32 weights."""
    golden = GoldenSet(golden_dir)
    for case in golden.manifest["cases"]:
        inputs = case["inputs"]

        def load(name: str, inputs: dict = inputs) -> np.ndarray:
            return golden.array(inputs[name])

        w = load("rhs_f32_unquantized")
        n, k = w.shape
        assert np.array_equal(q4_0.quantize(w), load("rhs_q4_0"))
        assert np.array_equal(q8_0.quantize(w), load("rhs_q8_0"))
        blocks = q4_1.quantize(w)
        assert np.array_equal(blocks, load("rhs_q4_1"))
        assert np.array_equal(f16.quantize(w), load("rhs_f16"))
        assert bits_equal(f16.dequantize(load("rhs_f16"), n, k).T, load("rhs_f16_as_f32_kxn"))
        # Q4_1 onto KleidiAI's qai4c32 inputs: codes in sequential nibble order, f32 scale and offset
        u = q4_1.codes(blocks)
        assert np.array_equal(u[:, 0::2] | (u[:, 1::2] << 4), load("rhs_q4_1_qau4c32_s1s0"))
        _, kai_scale, kai_zero = q4_1_to_qai4c32(blocks, n, k)
        assert bits_equal(kai_scale, load("rhs_q4_1_scale_f32"))
        assert bits_equal(kai_zero, load("rhs_q4_1_zero_f32"))
        deq = q4_1.dequantize(blocks, n, k).reshape(n, -1, 32)
        scale, zero = kai_scale[..., None], kai_zero[..., None]
        assert bits_equal(deq, scale * (u.reshape(n, -1, 32) - F32(8)) + zero)


SMOLLM2_TENSORS = ["token_embd.weight", "blk.0.attn_k.weight", "blk.7.ffn_down.weight", "blk.29.attn_output.weight"]


def test_smollm2_requantization_matches_llama_quantize(reference_dir: Path) -> None:
    """llama-quantize --pure Q4_0 / Q8_0 of SmolLM2 Q4_1: dequantize (ggml to_float), re-quantize (the _ref
    quantizers), and the sha256 of every tested tensor's bytes matches models.json."""
    models = json.loads((reference_dir / "models.json").read_text())
    expected = {
        f["target_type"]: {e["name"]: e for e in f["tensors"]} for f in models["files"] if f["model"] == "smollm2"
    }
    path = model_file(SMOLLM2)
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    types = set()
    for name in SMOLLM2_TENSORS:
        t = tensors[name]
        k, rows = (int(v) for v in t.shape)
        types.add(t.tensor_type)
        x = formats.dequantize(t.data, t.tensor_type, rows, k)
        for target in ("Q4_0", "Q8_0"):
            entry = expected[target][name]
            assert entry["ne"] == [k, rows]
            assert hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest() == entry["source_sha256"]
            if entry["action"] == "copied_unchanged":
                continue
            assert entry["action"] == f"dequantized_{t.tensor_type.name}_to_f32_then_quantized_{target}"
            ours = formats.quantize(x, target)
            assert hashlib.sha256(ours.tobytes()).hexdigest() == entry["sha256"], (name, target)
    assert types == {T.Q8_0, T.Q4_1}


# --------------------------------------------------------------------------------------------- F16 / F32


def test_f16_f32_exact() -> None:
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    values = f16.dequantize(bits.view(np.uint8), 256, 256)  # raw bytes, as in a GGUF file
    assert values.dtype == np.float32
    finite = ~np.isnan(values)
    assert np.array_equal(f16.quantize(values).view(np.uint16)[finite], bits[finite])
    assert bits_equal(f16.dequantize(bits.view(np.float16), 256, 256)[finite], values[finite])
    x = np.random.default_rng(1).standard_normal((4, 8), dtype=F32) * F32(1e5)
    with np.errstate(over="ignore"):
        assert np.array_equal(f16.quantize(x), gguf.quants.quantize(x, T.F16))  # RNE, overflow to Inf
    y = f16.quantize_f32(x)
    assert bits_equal(y, x) and y is not x
    assert bits_equal(f16.dequantize_f32(x.view(np.uint8), 4, 8), x)


# --------------------------------------------------------------------------------------------- registry


def test_registry_sizes_and_dispatch() -> None:
    x = _structured(np.random.default_rng(3), rows=5, k=128)
    for t in formats.supported_types():
        fmt = formats.get_format(t)
        assert (fmt.block_size, fmt.type_size) == GGML_QUANT_SIZES[t]
    assert formats.get_format("q4_0") is formats.get_format(T.Q4_0) is formats.get_format(2)
    assert formats.get_format(T.Q4_1).row_bytes(576) == 360
    for t, mod in MODULES.items():
        assert np.array_equal(formats.quantize(x, t.name), mod.quantize(x))
        blocks = formats.quantize(x, t)
        assert bits_equal(formats.dequantize(blocks, t, 5, 128), mod.dequantize(blocks, 5, 128))
    assert formats.quantize(x, "F16").dtype == np.float16
    assert bits_equal(formats.dequantize(x, T.F32, 5, 128), x)


@pytest.mark.parametrize("t", [T.BF16, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS])
def test_other_types_dequantize_like_gguf(t: T) -> None:
    block_size, type_size = GGML_QUANT_SIZES[t]
    rows, k = 3, 2 * max(block_size, 256)
    raw = np.random.default_rng(int(t)).integers(0, 256, size=rows * k // block_size * type_size, dtype=np.uint8)
    with np.errstate(all="ignore"):
        theirs = gguf.quants.dequantize(raw.reshape(rows, -1), t)
        ours = formats.dequantize(raw, t, rows, k)
    assert ours.shape == (rows, k) and ours.dtype == np.float32
    assert bits_equal(ours, theirs)
    assert formats.get_format(t).quantize is None


def test_q8_k_dequantize() -> None:
    rng = np.random.default_rng(2)
    d = np.array([0.5, -3.25], dtype=F32)
    q = rng.integers(-128, 128, size=(2, 256)).astype(np.int8)
    bsums = q.reshape(2, 16, 16).sum(-1).astype(np.int16)
    raw = np.concatenate([d[:, None].view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)], axis=1)
    assert raw.shape[1] == GGML_QUANT_SIZES[T.Q8_K][1]
    out = formats.dequantize(raw, T.Q8_K, 1, 512)
    assert bits_equal(out.reshape(2, 256), q.astype(F32) * d[:, None])


@pytest.mark.parametrize("t", [T.Q8_1, T.I32, T.F64, T.NVFP4, "Q9_9", 999])
def test_unsupported_types(t: T | str | int) -> None:
    with pytest.raises(UnsupportedTensorTypeError) as info:
        formats.get_format(t)
    assert "\n" not in str(info.value) and isinstance(info.value, KleidipyError)


def test_quantize_to_a_dequantize_only_type() -> None:
    with pytest.raises(UnsupportedTensorTypeError, match="cannot quantize to Q5_0"):
        formats.quantize(np.zeros((1, 32), dtype=F32), T.Q5_0)
    assert T.Q5_0 in other.SUPPORTED


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("mod", list(MODULES.values()))
def test_bad_input(mod) -> None:  # noqa: ANN001
    with pytest.raises(DTypeError):
        mod.quantize(np.zeros((2, 64), dtype=np.float64))
    with pytest.raises(KernelShapeError):
        mod.quantize(np.zeros(64, dtype=F32))
    with pytest.raises(KernelShapeError, match="not a multiple"):
        mod.quantize(np.zeros((2, 48), dtype=F32))
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros((2, 64), dtype=F32)
        x[1, 40] = bad
        with pytest.raises(NonFiniteInputError, match=r"\(1, 40\)"):
            mod.quantize(x)
    blocks = mod.quantize(np.ones((2, 64), dtype=F32))
    with pytest.raises(BufferSizeError):
        mod.dequantize(blocks, 3, 64)
    with pytest.raises(KernelShapeError):
        mod.dequantize(blocks, 2, 48)
    with pytest.raises(DTypeError):
        mod.dequantize(blocks.view(np.int8), 2, 64)
    with pytest.raises(KernelShapeError, match="pass rows and k"):
        mod.d_bits(blocks.reshape(2, -1))
    with pytest.raises(DTypeError):
        f16.dequantize(np.zeros((2, 64), dtype=np.float64), 2, 64)
    with pytest.raises(BufferSizeError):
        formats.dequantize(np.zeros(10, dtype=np.uint8), T.Q5_0, 1, 32)


def test_q4_k_sub_blocks_are_the_q4_1_family_exactly() -> None:
    """Q4_K -> Q4_1-family inputs: scale·(u − 8) + zero reproduces ggml's dequantization bit for bit (the f32
    products d·sc and dmin·m and the offset 8·d·sc − dmin·m are exact)."""
    rng = np.random.default_rng(13)
    n, k = 4, 512
    raw = rng.integers(0, 256, size=(n, k // 256 * 144), dtype=np.uint8)
    raw.reshape(n, -1, 144)[..., :4] = np.array([0x3C00, 0x2E66], np.float16).view(np.uint8)  # d=1, dmin=0.1
    want = gguf.quants.dequantize(raw, T.Q4_K).reshape(n, k)
    scale, minimum, u = q4_k.sub_block_fields(raw, n, k)
    packer = SimpleNamespace(code_order="s1s0")  # low nibble first
    codes, fields = from_ggml(T.Q4_K, raw, n, k, packer)
    unpacked = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(n, k)
    assert np.array_equal(unpacked, u)
    got = np.repeat(fields["scale"], 32, 1) * (unpacked.astype(np.float32) - 8) + np.repeat(fields["zero"], 32, 1)
    assert np.array_equal(got, want)
