"""Label encodings: for each input format a packer takes, the :class:`~kleidipy.tools.layout.probe.Channel` list that
makes its values traceable.

How the two values of a label are chosen: docs/layout-maps.md."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.formats import q4_0, q4_1, q8_0
from kleidipy.kernels.catalogue import family_of_packer
from kleidipy.tools.layout.probe import Channel, View

BL = 32
RhsInputs = tuple[np.ndarray | None, dict[str, np.ndarray | None]]

F16_ONE = 0x3C00
#: two fp16 bit patterns differing in every nibble (also after /16 and in bf16)
F16_A, F16_B = 0x3555, 0x42AA
#: two float32 values differing in every nibble (also after ×0.0625)
F32_A, F32_B = np.array([0x3F955555, 0xC06AAAAA], dtype=np.uint32).view(np.float32)
#: two float32 values exactly representable in bf16, differing in every nibble of their bf16 bits
BF16_A, BF16_B = np.array([0x3EAB0000, 0x40550000], dtype=np.uint32).view(np.float32)


def _channel(
    key: str,
    kind: str,
    shape: tuple[int, int],
    build: Callable[[np.ndarray], object],
    source: tuple[str, int] | None = None,
    packed: tuple[str, int] | None = None,
) -> Channel:
    """A channel labelling the RHS as given (``source``) and/or the packed buffer: (region title, field bytes)."""
    views = {name: View(*view) for name, view in (("source", source), ("packed", packed)) if view is not None}
    return Channel(key, kind, shape, build, views)


def _pick(choice: np.ndarray, a: float | int, b: float | int, dtype: type) -> np.ndarray:
    return np.where(choice, np.asarray(b, dtype=dtype), np.asarray(a, dtype=dtype))


def _per_block(values: np.ndarray) -> np.ndarray:
    """[rows, nb] -> [rows, nb·32]: each block's value repeated over its 32 elements."""
    return np.repeat(values, BL, axis=1)


def _f32_rows(choice: np.ndarray, n: int) -> np.ndarray:
    return _pick(choice[:, 0], F32_A, F32_B, np.float32).reshape(n)


# --------------------------------------------------------------------------------------------- RHS formats


def _from_ggml(ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker) -> dict[str, np.ndarray]:
    """The packer's keyword inputs for GGML bytes, from the packer's family adaptor (as the runtime repacks)."""
    rhs, kwargs = family_of_packer(packer).from_ggml(ggml_type, raw, n, k, packer, "reference")
    return {"rhs": rhs, **kwargs}


def rhs_q4_0(n: int, k: int, packer: RhsPacker) -> tuple[str, list[Channel]]:
    """GGML Q4_0 blocks, passed to the packer unchanged (llama.cpp's Q4_0 route)."""
    nb = k // BL

    def blocks(d: np.ndarray, u: np.ndarray) -> RhsInputs:
        raw = q4_0.from_fields(d, u)
        return raw.reshape(-1), {"rhs": raw}

    def codes(choice: np.ndarray) -> RhsInputs:
        return blocks(np.full((n, nb), F16_ONE, np.uint16), _pick(choice, 0, 15, np.uint8))

    def scales(choice: np.ndarray) -> RhsInputs:
        return blocks(_pick(choice, F16_A, F16_B, np.uint16), np.zeros((n, k), np.uint8))

    return "GGML Q4_0 blocks (fp16 d, then 16 bytes: byte j = code j low | code j+16 high)", [
        _channel("codes", "element", (n, k), codes, source=("qs codes", 0), packed=("data", 0)),
        _channel("d", "block", (n, nb), scales, source=("d (fp16)", 2), packed=("scales (fp16)", 2)),
    ]


def rhs_q4_1(n: int, k: int, packer: RhsPacker) -> tuple[str, list[Channel]]:
    """GGML Q4_1 blocks -> codes, scale = d, zero = m + 8d in the packer's nibble order (the family's adaptor)."""
    nb = k // BL

    def inputs(d: np.ndarray, m: np.ndarray, u: np.ndarray, bias: np.ndarray) -> RhsInputs:
        raw = q4_1.from_fields(d, m, u).reshape(-1)
        return raw, _from_ggml(GGMLType.Q4_1, raw, n, k, packer) | {"bias": bias}

    ones, zeros = np.full((n, nb), F16_ONE, np.uint16), np.zeros((n, nb), np.uint16)
    no_codes, no_bias = np.zeros((n, k), np.uint8), np.zeros(n, np.float32)
    return "GGML Q4_1 blocks (fp16 d, fp16 m, then 16 bytes: byte j = code j low | code j+16 high)", [
        _channel(
            "codes",
            "element",
            (n, k),
            lambda c: inputs(ones, zeros, _pick(c, 0, 15, np.uint8), no_bias),
            source=("qs codes", 0),
            packed=("data", 0),
        ),
        _channel(
            "m",
            "block",
            (n, nb),
            lambda c: inputs(ones, _pick(c, F16_A, F16_B, np.uint16), no_codes, no_bias),
            source=("m (fp16)", 2),
            packed=("zero points m + 8d (f32)", 4),
        ),
        _channel(
            "d",
            "block",
            (n, nb),
            lambda c: inputs(_pick(c, F16_A, F16_B, np.uint16), zeros, no_codes, no_bias),
            source=("d (fp16)", 2),
            packed=("scales d (f32)", 4),
        ),
        _channel(
            "bias", "row", (n, 1), lambda c: inputs(ones, zeros, no_codes, _f32_rows(c, n)), packed=("bias (f32)", 4)
        ),
    ]


def rhs_q8_0(n: int, k: int, packer: RhsPacker) -> tuple[str, list[Channel]]:
    """GGML Q8_0 blocks -> per-channel int8 + f32 scale (the family's adaptor: llama.cpp's requantization);
    for k not a multiple of 32 (no Q8_0 tensor has it) the packer's own int8 input, as :func:`rhs_per_channel`."""
    if k % BL:
        return rhs_per_channel(n, k, packer)
    nb = k // BL

    def inputs(d: np.ndarray, q: np.ndarray, bias: np.ndarray | None = None) -> RhsInputs:
        raw = q8_0.from_fields(d, q).reshape(-1)
        return raw, _from_ggml(GGMLType.Q8_0, raw, n, k, packer) | {
            "bias": np.zeros(n, np.float32) if bias is None else bias
        }

    ones, full = np.full((n, nb), F16_ONE, np.uint16), np.full((n, k), 127, np.int8)

    def sums(choice: np.ndarray) -> RhsInputs:
        q = np.zeros((n, k), np.int8)
        q[:, 0] = 127  # keeps every row's amax, hence its scale
        q[:, 1] = np.where(choice[:, 0], -127, 0)
        return inputs(ones, q)

    return "GGML Q8_0 blocks (fp16 d, then 32 int8 in K order)", [
        _channel(
            "q",
            "element",
            (n, k),
            lambda c: inputs(ones, _pick(c, 127, -127, np.int8)),
            source=("qs (int8)", 1),
            packed=("data (int8)", 1),
        ),
        _channel(
            "d", "block", (n, nb), lambda c: inputs(_pick(c, F16_A, F16_B, np.uint16), full), source=("d (fp16)", 2)
        ),
        _channel("sum", "row", (n, 1), sums, packed=("row sums Σq (int32)", 4)),
        _channel(
            "scale",
            "row",
            (n, 1),
            lambda c: inputs(np.repeat(_pick(c[:, :1], F16_A, F16_B, np.uint16), nb, axis=1), full),
            packed=("scales (f32)", 4),
        ),
        _channel("bias", "row", (n, 1), lambda c: inputs(ones, full, _f32_rows(c, n)), packed=("bias (f32)", 4)),
    ]


def rhs_qai8c16(n: int, k: int, packer: RhsPacker) -> tuple[str, list[Channel]]:
    """The exact-weight packer's own input: int8 codes [n, k], f32 scale and offset per 16 values, f32 bias per row."""
    nb = k // 16
    codes, ones, zeros = np.zeros((n, k), np.int8), np.ones((n, nb), np.float32), np.zeros((n, nb), np.float32)

    def inputs(q=codes, scale=ones, zero=zeros, bias=None) -> RhsInputs:
        bias = np.zeros(n, np.float32) if bias is None else bias
        return q.view(np.uint8).reshape(-1), {"rhs": q, "scale": scale, "zero": zero, "bias": bias}

    return "int8 codes [n][k] (the packer's rhs input)", [
        _channel(
            "codes",
            "element",
            (n, k),
            lambda c: inputs(q=_pick(c, 85, -86, np.int8)),
            source=("codes (int8)", 1),
            packed=("data", 1),
        ),
        *(
            _channel(
                key,
                "block16",
                (n, nb),
                lambda c, key=key: inputs(**{key: _pick(c, F32_A, F32_B, np.float32)}),
                packed=(title, 4),
            )
            for key, title in (("zero", "offsets (f32)"), ("scale", "scales (f32)"))
        ),
        _channel("bias", "row", (n, 1), lambda c: inputs(bias=_f32_rows(c, n)), packed=("bias (f32)", 4)),
    ]


def rhs_per_channel(n: int, k: int, packer: RhsPacker) -> tuple[str, list[Channel]]:
    """The per-channel packers' own input: int8 values [n, k], or 4-bit codes u (weight u − 8) with element k in
    nibble k%2 of byte k//2 (s1s0); plus f32 scale and bias per row."""
    nibbles = packer.rhs_dtype == np.uint8
    zero, a, b, sum_a, sum_b = (8, 0, 15, 9, 0) if nibbles else (0, 127, -127, 1, -8)
    dtype = np.uint8 if nibbles else np.int8

    def inputs(u: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None) -> RhsInputs:
        raw = u
        if nibbles:
            even = np.zeros((n, k + k % 2), np.uint8)
            even[:, :k] = u
            raw = (even[:, 0::2] | even[:, 1::2] << 4).astype(np.uint8)
        scale = np.full(n, F32_A, np.float32) if scale is None else scale
        bias = np.zeros(n, np.float32) if bias is None else bias
        return raw.view(np.uint8).reshape(-1), {"rhs": raw, "scale": scale, "bias": bias}

    mid = np.full((n, k), zero, dtype)

    def sums(choice: np.ndarray) -> RhsInputs:
        u = mid.copy()
        u[:, 0] = np.where(choice[:, 0], sum_b, sum_a)
        return inputs(u)

    title = "4-bit codes u, byte j = code 2j low | code 2j+1 high" if nibbles else "int8 values [n][k]"
    width = 0 if nibbles else 1
    return f"{title} (the packer's rhs input)", [
        _channel(
            "w",
            "element",
            (n, k),
            lambda c: inputs(_pick(c, a, b, dtype)),
            source=("codes" if nibbles else "values (int8)", width),
            packed=("data", width),
        ),
        _channel("sum", "row", (n, 1), sums, packed=("row sums Σw (int32)", 4)),
        _channel("scale", "row", (n, 1), lambda c: inputs(mid, scale=_f32_rows(c, n)), packed=("scales (f32)", 4)),
        _channel("bias", "row", (n, 1), lambda c: inputs(mid, bias=_f32_rows(c, n)), packed=("bias (f32)", 4)),
    ]


def _float_rhs(
    n: int, k: int, packer: RhsPacker, ggml_type: GGMLType, values: tuple, one: float | int, dtype: type, label: str
) -> tuple[str, list[Channel]]:
    """GGML float weights [n][k] (the bit patterns ``values`` of ``dtype``) through the family's adaptor + bias."""
    width = 2 if "bf16" in packer.name else 4

    def inputs(bits: np.ndarray, bias: np.ndarray | None = None) -> RhsInputs:
        given = _from_ggml(ggml_type, bits, n, k, packer)
        return bits.view(np.uint8).reshape(-1), given | ({} if bias is None else {"bias": bias})

    ones = np.full((n, k), one, dtype)
    return f"GGML {ggml_type.name} tensor [n][k]", [
        _channel(
            "w",
            "element",
            (n, k),
            lambda c: inputs(_pick(c, *values, dtype)),
            source=(f"values ({label})", np.dtype(dtype).itemsize),
            packed=(f"data ({'bf16' if width == 2 else 'f32'})", width),
        ),
        _channel("bias", "row", (n, 1), lambda c: inputs(ones, _f32_rows(c, n)), packed=("bias (f32)", 4)),
    ]


def rhs_f16(n: int, k: int, packer: RhsPacker) -> tuple[str, list[Channel]]:
    """GGML F16 weights [n][k] -> exact f32 K x N (the family's adaptor: llama.cpp's F16 route) + bias."""
    return _float_rhs(n, k, packer, GGMLType.F16, (F16_A, F16_B), F16_ONE, np.uint16, "fp16")


def rhs_f32(n: int, k: int, packer: RhsPacker) -> tuple[str, list[Channel]]:
    """GGML F32 weights [n][k] as stored (llama.cpp's F32 route) + bias."""
    return _float_rhs(n, k, packer, GGMLType.F32, (F32_A, F32_B), 1.0, np.float32, "f32")


#: RHS packer name fragment -> encoding of the weights the packer is given (first match wins)
RHS_FORMATS: tuple[tuple[str, Callable[[int, int, RhsPacker], tuple[str, list[Channel]]]], ...] = (
    ("qsi4c32p", rhs_q4_0),
    ("qai4c32p", rhs_q4_1),
    ("qai8c16p", rhs_qai8c16),
    ("qsi8cxp", rhs_q8_0),
    ("qsi4cxp", rhs_per_channel),
    ("_kxn_", rhs_f16),
    ("_nxk_f32p", rhs_f32),
)


# --------------------------------------------------------------------------------------------- LHS formats


def lhs_qsi8d32p(m: int, k: int) -> list[Channel]:
    """qsi8d32p: per-32-block int8 with an fp16 scale. Every block has amax 127 (scale 1), or 127·v for the scales."""
    nb = k // BL
    f16 = np.array([F16_A, F16_B], np.uint16).view(np.float16).astype(np.float32) * np.float32(127)
    return [
        _channel("q", "element", (m, k), lambda c: _pick(c, 127, -127, np.float32), packed=("data (int8)", 1)),
        _channel(
            "scale",
            "block",
            (m, nb),
            lambda c: _per_block(_pick(c, f16[0], f16[1], np.float32)),
            packed=("scales (fp16)", 2),
        ),
    ]


def lhs_qsi8d32pscalef32(m: int, k: int) -> list[Channel]:
    """qsi8d32pscalef32: per-32-block int8, f32 row sum Σq·(1/s) and f32 recip 1/s per block."""
    nb = k // BL
    half = np.tile(np.repeat(np.array([1, -1], np.float32), BL // 2), nb)  # blocks summing to 0
    alternate = np.tile(np.array([1, -1], np.float32), k // 2)  # blocks summing to 0, signs interleaved

    def sums(choice: np.ndarray) -> np.ndarray:
        return np.where(_per_block(choice), half, 1).astype(np.float32) * np.float32(127)

    def recips(choice: np.ndarray) -> np.ndarray:
        return _per_block(_pick(choice, 127, 254, np.float32)) * alternate

    return [
        _channel("q", "element", (m, k), lambda c: _pick(c, 127, -127, np.float32), packed=("data (int8)", 1)),
        _channel("sum", "block", (m, nb), sums, packed=("row sums Σq/s (f32)", 4)),
        _channel("recip", "block", (m, nb), recips, packed=("scales 1/s (f32)", 4)),
    ]


def lhs_qai8dxp(m: int, k: int) -> list[Channel]:
    """qai8dxp: per-row asymmetric int8 with int32 −zero point and f32 1/scale. Values ±1 quantize to 127 / −128."""
    alternate = np.resize(np.array([1, -1], np.float32), k)
    return [
        _channel("q", "element", (m, k), lambda c: _pick(c, 1, -1, np.float32), packed=("data (int8)", 1)),
        _channel(
            "offset",
            "row",
            (m, 1),
            lambda c: np.repeat(_pick(c, 1, -1, np.float32), k, axis=1),
            packed=("offsets −zero point (int32)", 4),
        ),
        _channel(
            "recip",
            "row",
            (m, 1),
            lambda c: _pick(c, 1, 2, np.float32) * alternate,
            packed=("scales 1/scale (f32)", 4),
        ),
    ]


def lhs_bf16(m: int, k: int) -> list[Channel]:
    """bf16 packers: float32 values converted to bf16 (RNE); A and B are exact in bf16."""
    return [_channel("x", "element", (m, k), lambda c: _pick(c, BF16_A, BF16_B, np.float32), packed=("data (bf16)", 2))]


def lhs_f32(m: int, k: int) -> list[Channel]:
    """f32 packers: the float32 values moved as they are."""
    return [_channel("x", "element", (m, k), lambda c: _pick(c, F32_A, F32_B, np.float32), packed=("data (f32)", 4))]


def lhs_f16(m: int, k: int) -> list[Channel]:
    """f16 packers: float32 values converted to F16 (RNE); the values of F16_A and F16_B are exact in F16."""
    a, b = np.array([F16_A, F16_B], np.uint16).view(np.float16).astype(np.float32)
    return [_channel("x", "element", (m, k), lambda c: _pick(c, a, b, np.float32), packed=("data (f16)", 2))]


#: LHS packer name fragment -> encoding of the activations (first match wins)
LHS_FORMATS: tuple[tuple[str, Callable[[int, int], list[Channel]]], ...] = (
    ("qsi8d32pscalef32", lhs_qsi8d32pscalef32),
    ("qsi8d32p", lhs_qsi8d32p),
    ("qai8dxp", lhs_qai8dxp),
    ("bf16", lhs_bf16),
    ("f16pmrx2", lhs_f16),
    ("f32p2vlx1_f32", lhs_f32),
)


def lookup(table: tuple[tuple[str, Callable], ...], packer_name: str) -> Callable:
    for fragment, encoding in table:
        if fragment in packer_name:
            return encoding
    raise KeyError(packer_name)
