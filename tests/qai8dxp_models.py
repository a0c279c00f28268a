"""Independent scalar models of the qai8dxp LHS packer (per-row asymmetric int8) and of the qai8dxp kernels' arithmetic,
from the golden README; shared by the Q8_0 and per-channel int4 families' tests."""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import HealthCheck, settings
from kernel_helpers import exact_fma

from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam

F32 = np.float32
SVLS = (128, 256, 512, 1024)
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def model_quant_row(x: np.ndarray, k_int: int) -> tuple[list[int], int, np.float32]:
    """README 'LHS qai8dxp_f32' for one row, scalar float32 steps: q [k_int], zero point, recip."""
    rmin = min(F32(0), *map(F32, x))
    rmax = max(F32(0), *map(F32, x))
    s = F32(1) if rmin == rmax else F32(F32(255) / F32(rmax - rmin))
    recip = F32(F32(1) / s)
    dmin, dmax = F32(rmin * s), F32(rmax * s)
    err = F32(F32(F32(-128) + dmin) + F32(F32(127) + dmax))
    zp = F32(F32(-128) - dmin) if err > 0 else F32(F32(127) - dmax)
    nzp = round(float(min(max(zp, F32(-128)), F32(127))))  # Python round: ties to even, like rintf
    q = []
    for kk in range(k_int):
        v = float(F32(F32(x[min(kk, len(x) - 1)]) * s))
        q.append(min(max(int(math.copysign(math.floor(abs(v) + 0.5), v)) + nzp, -128), 127))
    return q, nzp, recip


def model_lhs_packed(lhs: np.ndarray, mr: int, kr: int, sr: int, row_offset: int = 0) -> bytes:
    """README layout: int8 (r, k) at (k//kbl)·mr·kbl + r·kbl + k%kbl, then mr int32 −zp, then mr f32 recip."""
    m, k = lhs.shape
    k_int, kbl = fam.k_internal(k), kr // sr
    stride = mr * (k_int + 8)
    out = bytearray(-(-(m + row_offset) // mr) * stride)
    for i in range(m):
        q, nzp, recip = model_quant_row(lhs[i], k_int)
        g, r = divmod(i + row_offset, mr)
        for kk in range(k_int):
            struct.pack_into("<b", out, g * stride + (kk // kbl) * mr * kbl + r * kbl + kk % kbl, q[kk])
        struct.pack_into("<i", out, g * stride + mr * k_int + 4 * r, -nzp)
        struct.pack_into("<f", out, g * stride + mr * k_int + 4 * mr + 4 * r, recip)
    return bytes(out)


def model_dst(lhs, w, scale, bias, recipe, weight_factor=1, scale_factor=None):  # noqa: ANN001, ANN201
    """Exact model of a qai8dxp kernel from the unpacked operands: acc = factor·Σ_k (q − zp)·w (int32 wrap),
    F = f32(acc), S = f32(scale_stored·recip); FMUL_FADD: f32(f32(F·S) + bias), FMA_BIAS: fma(S, F, bias)."""
    m, k = lhs.shape
    n = w.shape[0]
    out = np.empty((m, n), dtype=np.float32)
    for i in range(m):
        q, nzp, recip = model_quant_row(lhs[i], k)
        for j in range(n):
            acc = weight_factor * sum((q[kk] - nzp) * int(w[j, kk]) for kk in range(k))
            acc = (acc + 2**31) % 2**32 - 2**31
            f = F32(float(acc))  # exact int → float64, then one rounding to f32 (SCVTF)
            sc = scale[j] if scale_factor is None else F32(scale[j] * F32(scale_factor))
            s = F32(sc * recip)
            if recipe == fam.Recipe.FMA_BIAS:
                out[i, j] = exact_fma(s, f, bias[j])
            else:
                out[i, j] = F32(F32(f * s) + bias[j])
    return out


def model_rhs_qsi8cxp(q: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, nr: int, kr: int) -> bytes:
    """README 'RHS qsi8cxp_qsi8cx_neon': int8 (col, k) at (k//kr)·nr·kr + col·kr + k%kr (0 past K), then nr int32
    Σq, nr f32 scale, nr f32 bias; padding columns copy column N−1."""
    n, k = q.shape
    k_int = fam.k_internal(k)
    stride = nr * (k_int + 12)
    out = bytearray(-(-n // nr) * stride)
    for g in range(-(-n // nr)):
        for col in range(nr):
            src = min(g * nr + col, n - 1)
            for kk in range(k):
                struct.pack_into("<b", out, g * stride + (kk // kr) * nr * kr + col * kr + kk % kr, int(q[src, kk]))
            base = g * stride + nr * k_int
            struct.pack_into("<i", out, base + 4 * col, int(q[src].astype(np.int64).sum()))
            struct.pack_into("<f", out, base + 4 * nr + 4 * col, scale[src])
            struct.pack_into("<f", out, base + 8 * nr + 4 * col, 0.0 if bias is None else bias[src])
    return bytes(out)


def call_matmul(fn, kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """Call a ``matmul_qai8dxp`` (portable jit or VNNI) the way ``Qai8dxpMatmulKernel._jit`` does: float32 [m, n]."""
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    rhs = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    out = np.empty((m, n), np.float32)
    args = (lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs, kern.mr, kern.kr // kern.sr, kern.nr)
    fn(m, n, fam.k_internal(k), *args, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi, int(kern.recipe), out)
    return out
