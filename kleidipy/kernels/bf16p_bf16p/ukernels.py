"""The ``bf16p_bf16p`` family: F16 weights run on KleidiAI's BF16 kernels (llama.cpp's SME route, NEON BF16 fallbacks).

Owns the LHS packers ``lhs_pack_bf16p2vlx2_f32_sme``, ``lhs_quant_pack_bf16p8x4_f32_neon`` and
``lhs_quant_pack_bf16p1x4_f32_neon``, the RHS packers ``rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme`` and
``rhs_quant_pack_kxn_bf16p12x4biasf32_f32_neon`` and the four ``matmul_clamp_f32_bf16p*`` kernels; their weights
come as K x N float32 (:mod:`kleidipy.kernels.pack.kxn`).

Packing: f32 -> bf16 rounds to nearest even (BFCVT); K is zero-padded to a multiple of kr. LHS groups of mr rows
hold, per chunk of kr K values, mr rows x kr bf16 (padding rows: 0 for SME, copies of the group's first row for the
NEON 8x4 packer). RHS groups of nr columns hold nr f32 biases, then per chunk of kr K values nr columns x kr bf16.

Arithmetic (confirmed bit for bit against every golden run: KleidiAI v1.30 under qemu 11.1). Linux leaves
FPCR.EBF = 0, and then qemu's BFMOPA, BFMMLA and BFDOT helpers all evaluate ``bfdotadd`` (the Arm ``BFDotAdd``)
with a float_status that rounds to odd, flushes denormal inputs and results to zero (sign kept), returns the
default NaN and ignores FPCR's own rounding/FZ bits. For one K pair (k0, k1) and accumulator ``acc``::

    p0 = RO(a[k0]·b[k0]);  p1 = RO(a[k1]·b[k1]);  t = RO(p0 + p1);  acc = RO(acc + t)

with RO = float32 round-to-odd + flush-to-zero; nothing is fused (a bf16 product is exact in float32, so RO only
matters there at under/overflow, but the two sums are genuinely rounded to odd).
* SME2/SME ``2vlx2vl_*_mopa`` (BFMOPA, one pair per instruction) and NEON ``8x12_neon_mmla`` (BFMMLA: pair 0 then
  pair 1 of each 4-value chunk): one accumulator per output, started at the bias, takes the pairs in ascending K.
  Hence SME2 = SME1 = MMLA, bit-identical, at every SVL.
* NEON ``1x36_neon_dot`` (GEMV, BFDOT): each output has two lanes; the one started at the bias takes the pairs
  (4i, 4i+1), the one started at 0 takes (4i+2, 4i+3); FADDP then adds the two in plain float32 (round to nearest,
  no flush). This is why it differs from the other three by a few ulps.
Evidence on the 37 golden unclamped runs (19253 outputs): this recipe 0 mismatches; unfused round-to-nearest
instead of round-to-odd 15393; the exact sum rounded once 13929; a single accumulator for the dot kernel 255/320.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kleidipy.core import numerics
from kleidipy.core.buffers import SVL_CHOICES, roundup
from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import bf16_bits_to_f32, f32_to_bf16_bits
from kleidipy.core.packers import LhsPacker, RhsPacker
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.bf16p_bf16p import jit, native
from kleidipy.kernels.pack.kxn import check_no_bl, kxn_inputs

FAMILY_NAME = "bf16p_bf16p"
#: mr / nr of the SME packers: 2·VL for every supported SVL.
SME_2VL = tuple(2 * svl // 32 for svl in SVL_CHOICES)

_MIN_NORMAL = 2.0**-126
_LOW29 = np.int64((1 << 29) - 1)
_DEFAULT_NAN = float(np.array([numerics.DEFAULT_NAN_BITS], dtype=np.uint32).view(np.float32)[0])


# --------------------------------------------------------------------------------------------- BF16 numerics


def _flush(x: np.ndarray) -> np.ndarray:
    """Denormals -> zero of the same sign (FPCR.EBF = 0 input flush)."""
    return np.where(np.abs(x) < _MIN_NORMAL, np.copysign(0.0, x), x)


def round_to_odd_f32(s: np.ndarray, err: np.ndarray | float) -> np.ndarray:
    """float32 round-to-odd of the exact value s + err (s: float64 rounding of it, err: the exact remainder),
    flushed to zero below 2^-126 (sign kept), ±inf from 2^128, the default NaN for NaN. Returned as float64.

    Round to odd = truncate toward zero, then set the last bit if anything was dropped. It is done in two exact
    steps: to odd in float64 (move s one ulp toward the exact value when err != 0 and s is even), then keep the
    24 leading bits and OR the dropped-bits flag into the float32 result."""
    s, err = np.asarray(s, dtype=np.float64), np.asarray(err, dtype=np.float64)
    bits = s.view(np.int64)
    toward_exact = np.where((err > 0) == (s > 0), 1, -1)
    bits = bits + np.where((err != 0) & ((bits & 1) == 0), toward_exact, 0)
    kept = (bits & ~_LOW29).view(np.float64)
    dropped = (bits & _LOW29) != 0
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = kept.astype(np.float32)
    f32 = np.where(np.isfinite(f32) & dropped, f32.view(np.uint32) | 1, f32.view(np.uint32)).astype(np.uint32)
    out = np.where(np.abs(kept) < _MIN_NORMAL, np.copysign(0.0, s), f32.view(np.float32).astype(np.float64))
    return np.where(np.isnan(s), _DEFAULT_NAN, out)


def ro_add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 x + y, round to odd, FTZ (float64 arrays holding float32 values)."""
    x, y = _flush(x), _flush(y)
    with np.errstate(invalid="ignore"):
        s = x + y
        bp = s - x
        err = (y - bp) + (x - (s - bp))  # TwoSum: s + err is the exact sum
    return round_to_odd_f32(s, np.where(np.isfinite(s), err, 0.0))


def ro_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 a·b, round to odd, FTZ (for bf16 operands the float64 product is exact)."""
    with np.errstate(invalid="ignore"):
        return round_to_odd_f32(_flush(a) * _flush(b), 0.0)


def bfdotadd(acc: np.ndarray, a0: np.ndarray, b0: np.ndarray, a1: np.ndarray, b1: np.ndarray) -> np.ndarray:
    """Arm BFDotAdd with FPCR.EBF = 0 (qemu ``bfdotadd``): acc + (a0·b0 + a1·b1), every step rounded to odd."""
    return ro_add(acc, ro_add(ro_mul(a0, b0), ro_mul(a1, b1)))


def bf16_matmul_reference(a: np.ndarray, b: np.ndarray, bias: np.ndarray, two_accumulators: bool) -> np.ndarray:
    """Unclamped float32 [m, n] from bf16 values a [m, kp], b [kp, n] (as floats) and f32 bias [n].

    ``acc`` starts at the bias and takes the K pairs in order; with ``two_accumulators`` (BFDOT GEMV) the odd
    pairs go to a second accumulator started at 0, added to the first in float32 at the end (FADDP)."""
    m, kp = a.shape
    acc = [np.broadcast_to(bias.astype(np.float64), (m, b.shape[1])), np.zeros((m, b.shape[1]))]
    for p in range(kp // 2):
        slot = p % 2 if two_accumulators else 0
        k0, k1 = 2 * p, 2 * p + 1
        acc[slot] = bfdotadd(acc[slot], a[:, k0, None], b[None, k0], a[:, k1, None], b[None, k1])
    if two_accumulators:
        return acc[0].astype(np.float32) + acc[1].astype(np.float32)
    return acc[0].astype(np.float32)


# --------------------------------------------------------------------------------------------- packed layouts


def lhs_values(lhs: np.ndarray, m: int, kp: int, mr: int, kr: int) -> np.ndarray:
    """The bf16 LHS values [m, kp] (float64) of a packed buffer (groups of mr rows, chunks of kr)."""
    groups = -(-m // mr)
    bits = lhs[: groups * mr * kp * 2].view(np.uint16).reshape(groups, kp // kr, mr, kr)
    return bf16_bits_to_f32(bits.transpose(0, 2, 1, 3).reshape(groups * mr, kp)[:m]).astype(np.float64)


def rhs_values(rhs: np.ndarray, n: int, kp: int, nr: int, kr: int) -> tuple[np.ndarray, np.ndarray]:
    """(bias [n] f32, bf16 values [kp, n] as float64) of a packed RHS buffer (groups of nr columns)."""
    groups = -(-n // nr)
    stride = nr * 4 + nr * kp * 2
    grp = rhs[: groups * stride].reshape(groups, stride)
    bias = np.ascontiguousarray(grp[:, : nr * 4]).view(np.float32).reshape(-1)[:n]
    bits = np.ascontiguousarray(grp[:, nr * 4 :]).view(np.uint16).reshape(groups, kp // kr, nr, kr)
    values = bf16_bits_to_f32(bits.transpose(1, 3, 0, 2).reshape(kp, groups * nr)[:, :n]).astype(np.float64)
    return bias, values


def pack_lhs_reference(lhs: np.ndarray, mr: int, kr: int, pad_first_row: bool) -> np.ndarray:
    """LHS rows [m, k] -> packed bytes (padding rows 0, or the group's first row when ``pad_first_row``)."""
    m, k = lhs.shape
    kp, groups = roundup(k, kr), -(-m // mr)
    rows = np.zeros((groups * mr, kp), dtype=np.float32)
    rows[:m, :k] = lhs
    if pad_first_row and m % mr:
        rows[m:] = rows[(groups - 1) * mr]
    bits = f32_to_bf16_bits(rows).reshape(groups, mr, kp // kr, kr).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(bits).reshape(-1).view(np.uint8)


def pack_rhs_reference(rhs: np.ndarray, bias: np.ndarray, nr: int, kr: int) -> np.ndarray:
    """RHS K x N -> packed bytes: per group of nr columns, nr f32 biases then kp/kr chunks of nr x kr bf16."""
    k, n = rhs.shape
    kp, groups = roundup(k, kr), -(-n // nr)
    cols = np.zeros((kp, groups * nr), dtype=np.float32)
    cols[:k, :n] = rhs
    data = f32_to_bf16_bits(cols).reshape(kp // kr, kr, groups, nr).transpose(2, 0, 3, 1)
    head = np.zeros(groups * nr, dtype=np.float32)
    head[:n] = bias
    parts = [head.view(np.uint8).reshape(groups, -1), np.ascontiguousarray(data).reshape(groups, -1).view(np.uint8)]
    return np.concatenate(parts, axis=1).reshape(-1)


# --------------------------------------------------------------------------------------------- packers


def _check_shape(
    name: str, bl: int | None, dim: str, value: int, values: tuple[int, ...], kr: int, kr_value: int, sr: int
) -> None:
    """A packer's shape check: no block length, ``dim`` (mr or nr) ``value`` one of ``values``, kr = ``kr_value``
    and sr = 1 (else KernelShapeError)."""
    check_no_bl(name, bl)
    if value not in values or kr != kr_value or sr != 1:
        raise KernelShapeError(
            f"{name}: takes {dim} in {values}, kr={kr_value}, sr=1; got {dim}={value}, kr={kr}, sr={sr}"
        )


class Bf16LhsPacker(LhsPacker):
    """f32 -> bf16 LHS packers (``blocked = False``: no bl); they require m_idx_start == 0 as KleidiAI does."""

    blocked = False

    def __init__(self, name: str, mr_values: tuple[int, ...], kr: int, pad_first_row: bool, single_row: bool) -> None:
        self.name = name
        self.mr_values = mr_values
        self.kr_value = kr
        self.pad_first_row = pad_first_row
        self.single_row = single_row

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return mr * roundup(k, kr) * 2

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        _check_shape(self.name, bl, "mr", mr, self.mr_values, kr, self.kr_value, sr)
        if self.single_row and m != 1:
            raise KernelShapeError(f"{self.name}: packs exactly one row (GEMV), got m={m}")

    def _check_offset(self, row_offset: int) -> None:
        if row_offset:
            raise KernelShapeError(f"{self.name}: m_idx_start must be a multiple of mr (KleidiAI assumes 0)")

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        self._check_offset(row_offset)
        return pack_lhs_reference(np.asarray(lhs), mr, kr, self.pad_first_row)

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        self._check_offset(row_offset)
        return jit.pack_lhs_bf16(np.ascontiguousarray(lhs), mr, kr, self.pad_first_row)


class Bf16KxnRhsPacker(RhsPacker):
    """K x N f32 weights + f32 bias -> bf16 groups of nr columns (``blocked = False``)."""

    blocked = False
    rhs_order = "kxn"

    def __init__(self, name: str, nr_values: tuple[int, ...], kr: int, inputs: tuple[str, ...]) -> None:
        self.name = name
        self.nr_values = nr_values
        self.kr_value = kr
        self.inputs = inputs

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return nr * 4 + nr * roundup(k, kr) * 2

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        _check_shape(self.name, bl, "nr", nr, self.nr_values, kr, self.kr_value, sr)

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        weights, biases = kxn_inputs(self.name, n, k, rhs, scale, zero, bias)
        return pack_rhs_reference(weights, biases, nr, kr)

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        weights, biases = kxn_inputs(self.name, n, k, rhs, scale, zero, bias)
        return jit.pack_rhs_bf16_kxn(np.ascontiguousarray(weights), biases, nr, kr)


LHS_SME = Bf16LhsPacker("lhs_pack_bf16p2vlx2_f32_sme", SME_2VL, kr=2, pad_first_row=False, single_row=False)
LHS_NEON_8X4 = Bf16LhsPacker("lhs_quant_pack_bf16p8x4_f32_neon", (8,), kr=4, pad_first_row=True, single_row=False)
LHS_NEON_1X4 = Bf16LhsPacker("lhs_quant_pack_bf16p1x4_f32_neon", (1,), kr=4, pad_first_row=False, single_row=True)
#: the SME packer's bias is required (llama.cpp passes zeros); the NEON packer takes NULL as zeros.
RHS_SME = Bf16KxnRhsPacker("rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme", SME_2VL, kr=2, inputs=("bias",))
RHS_NEON = Bf16KxnRhsPacker("rhs_quant_pack_kxn_bf16p12x4biasf32_f32_neon", (12,), kr=4, inputs=())

PACKERS = [LHS_SME, LHS_NEON_8X4, LHS_NEON_1X4, RHS_SME, RHS_NEON]


# --------------------------------------------------------------------------------------------- kernels


class Bf16MatmulKernel(MatmulKernel):
    """``matmul_clamp_f32_bf16p*_bf16p*``: BF16 dot products with FPCR.EBF = 0 semantics (module docstring).

    ``flags["two_accumulators"]``: the BFDOT GEMV's split of the K pairs over two lanes (see above)."""

    def _operands(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> tuple:
        g = self._geo()
        kp = roundup(k, g.kr)
        lhs_bytes = -(-m // g.mr) * g.mr * kp * 2
        rhs_bytes = -(-n // g.nr) * (g.nr * 4 + g.nr * kp * 2)
        return g, np.ascontiguousarray(lhs[:lhs_bytes]), np.ascontiguousarray(rhs[:rhs_bytes])

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g, lhs, rhs = self._operands(m, n, k, lhs, rhs)
        kp = roundup(k, g.kr)
        bias, b = rhs_values(rhs, n, kp, g.nr, g.kr)
        a = lhs_values(lhs, m, kp, g.mr, g.kr)
        return bf16_matmul_reference(a, b, bias, self.flags.get("two_accumulators", False))

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g, lhs, rhs = self._operands(m, n, k, lhs, rhs)
        return native.matmul_bf16_native(m, n, k, lhs, rhs, g.mr, g.nr, g.kr, self.flags.get("two_accumulators", False))


def sme_geometry(vl: int) -> Geometry:
    """2VL x 2VL tiles, kr = 2 (one BFMOPA pair)."""
    return Geometry(m_step=2 * vl, n_step=2 * vl, mr=2 * vl, nr=2 * vl, kr=2, sr=1)


def mmla_geometry(vl: int) -> Geometry:
    return Geometry(m_step=8, n_step=12, mr=8, nr=12, kr=4, sr=1)


def dot_geometry(vl: int) -> Geometry:
    return Geometry(m_step=1, n_step=36, mr=1, nr=12, kr=4, sr=1)


def _kernel(
    name: str,
    tier: str,
    kind: str,
    lhs: Bf16LhsPacker,
    rhs: Bf16KxnRhsPacker,
    geometry: Callable[[int], Geometry],
    **kw: object,
) -> Bf16MatmulKernel:
    return Bf16MatmulKernel(name, FAMILY_NAME, tier, kind, lhs, rhs, geometry, bl=None, **kw)


KERNELS = [
    _kernel("matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa", "sme2", "gemm", LHS_SME, RHS_SME, sme_geometry),
    _kernel("matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme_mopa", "sme", "gemm", LHS_SME, RHS_SME, sme_geometry),
    _kernel(
        "matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla", "bf16", "gemm", LHS_NEON_8X4, RHS_NEON, mmla_geometry
    ),
    _kernel(
        "matmul_clamp_f32_bf16p1x4_bf16p12x4b_1x36_neon_dot",
        "bf16",
        "gemv",
        LHS_NEON_1X4,
        RHS_NEON,
        dot_geometry,
        flags={"two_accumulators": True},
    ),
]
