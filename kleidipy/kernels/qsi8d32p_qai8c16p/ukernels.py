"""Exact-weight family ``qsi8d32p × qai8c16p``: 8-bit blocked activations × int8 weight codes with an f32 scale and
an f32 offset per block of 16 values. kleidipy's own: KleidiAI has no kernel for these weights (its golden data is
none; the tests hold the executions to this module's reference).

It carries every GGML type whose value is ``f32(scale·code) + offset`` per 16 values with an int8 code
(:mod:`kleidipy.formats.codes16`: Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Q8_K, IQ4_NL, Q4_K), so the weights multiplied are the
file's. bl = 16 for the RHS because Q6_K has a scale per 16 values, the finest of any GGUF type, and one layout then
takes every type (the per-32 types repeat scale and offset: 8 bytes of them per 16 codes, 1.5 bytes per weight).

The LHS is the Q4_1 family's (``lhs_quant_pack_qsi8d32pscalef32_f32_neon``: per row and 32-block int8 q with an f32
recip rc). Geometry of both kernels: nr = 16, kr = 4, sr = 1 (LHS chunks of 4 values); the GEMM has mr = 4. Four
values of 16 columns are one 64-byte vector (one VNNI ``vpdpbusd`` or four NEON ``sdot`` by element against a
row's 4 values), so no lane of a dot needs reducing before its block's float steps.

RHS layout ``rhs_pack_nxk_qai8c16p_qai8c16_f32_f32_f32_neon``: per group of nr columns and 16-block b (nr·24
bytes) the nr·16 int8 codes in chunks of 4 per column (column c's code t at ((t // 4)·nr + c)·4 + t % 4), nr f32
offsets, nr f32 scales; after the last block nr f32 bias. Columns past n are zero.

Kernel recipe (float32; per row i, column j; 16-block b inside LHS block B = b // 2)::

    a_b  = Σ_t q[i, t]·w[j, t]     s_b = Σ_t q[i, t]      int32 over the 16 values of b, converted exactly
    acc  = +0
    for b in blocks:  acc = fma(f32(scale[j, b]·rc[i, B]), a_b, acc)
                      acc = fma(f32(offset[j, b]·rc[i, B]), s_b, acc)
    dst  = f32(acc + bias[j]), then clamp

A zero offset (±0: the symmetric types store −0) makes its step return acc unchanged (acc is never −0), so an
execution may skip it. A GEMM row is its GEMV (one recipe for both kernels).
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.buffers import check_execution
from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import fma_f32
from kleidipy.core.packers import RhsPacker
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError
from kleidipy.kernels.qsi8d32p_qai4c32p.ukernels import LHS_PACKER, inputs_f32, unpack_lhs, writable
from kleidipy.kernels.qsi8d32p_qai8c16p import jit as _jit
from kleidipy.kernels.qsi8d32p_qai8c16p import neon as _neon
from kleidipy.kernels.qsi8d32p_qai8c16p import vnni as _vnni

FAMILY_NAME = "qsi8d32p_qai8c16p"
BL = _jit.BL
RHS_BLOCK_BYTES = _jit.RHS_BLOCK_BYTES
#: the tile chain of the jit and of the compiled plan, ``(m, n, k, mr, nr, kbl, lhs, rhs)`` -> unclamped [m, n]: the
#: native aarch64 tiles on an Arm host with DotProd, the AVX-512 VNNI tile where the host has it, else the portable
#: loops (the same bits)
COMPUTE = _neon.compute if _neon.AVAILABLE else _vnni.compute if _vnni.HAVE_VNNI else _jit.matmul


class RhsPackNxkQai8c16pQai8c16F32F32F32Neon(RhsPacker):
    """``rhs_pack_nxk_qai8c16p_qai8c16_f32_f32_f32_neon``: int8 codes [n, k] with f32 ``scale`` and ``zero`` (the
    offset) per 16 values [n, k/16] and an optional f32 bias [n], in the layout of the module docstring."""

    name = "rhs_pack_nxk_qai8c16p_qai8c16_f32_f32_f32_neon"
    inputs = ("scale", "zero")
    rhs_dtype = np.int8

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return nr * ((k // BL) * RHS_BLOCK_BYTES + 4)

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        if nr <= 0 or kr != 4 or sr != 1:
            raise KernelShapeError(f"{self.name}: needs kr=4, sr=1 (got nr={nr}, kr={kr}, sr={sr})")

    def _inputs(self, n, k, rhs, scale, zero, bias) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        codes = np.asarray(rhs)
        if codes.dtype != np.int8:
            raise DTypeError(f"{self.name}: rhs codes must be int8, got {codes.dtype}")
        if codes.size < n * k:
            raise BufferSizeError(f"{self.name}: rhs holds {codes.size} codes, n={n}, k={k} needs {n * k}")
        nb = k // BL
        codes = writable(codes.reshape(-1)[: n * k]).reshape(n, k)
        scale = inputs_f32(scale, n * nb, "scale", self.name).reshape(n, nb)
        zero = inputs_f32(zero, n * nb, "zero", self.name).reshape(n, nb)
        return codes, scale, zero, inputs_f32(bias, n, "bias", self.name)

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        codes, scale, zero, bias = self._inputs(n, k, rhs, scale, zero, bias)
        nb, groups, chunk = k // BL, -(-n // nr), kr // sr
        pad = groups * nr - n

        def padded(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) if pad else a

        data = padded(codes).reshape(groups, nr, nb, BL // chunk, chunk).transpose(0, 2, 3, 1, 4)
        params = np.stack([padded(zero), padded(scale)]).reshape(2, groups, nr, nb).transpose(1, 3, 0, 2)
        params = np.ascontiguousarray(params.reshape(groups, nb, -1), "<f4")
        blocks = np.concatenate([data.reshape(groups, nb, -1).view(np.uint8), params.view(np.uint8)], axis=-1)
        tail = padded(bias if bias is not None else np.zeros(n, np.float32)).astype("<f4").view(np.uint8)
        return np.concatenate([blocks.reshape(groups, -1), tail.reshape(groups, -1)], axis=1).reshape(-1)

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        codes, scale, zero, bias = self._inputs(n, k, rhs, scale, zero, bias)
        bias = bias if bias is not None else np.zeros(n, np.float32)
        return _jit.rhs_pack(codes, zero, scale, bias, nr, kr // sr)

    def unpack(
        self, rhs: np.ndarray, n: int, k: int, nr: int, kr: int, sr: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(codes int8 [n, k], offset, scale f32 [n, k/16], bias f32 [n]) of a packed buffer."""
        nb, groups, chunk = k // BL, -(-n // nr), kr // sr
        grp = rhs[: groups * self.get_rhs_packed_stride(k, nr, kr, sr)].reshape(groups, -1)
        blocks = grp[:, : nb * nr * RHS_BLOCK_BYTES].reshape(groups, nb, nr * RHS_BLOCK_BYTES)
        data = blocks[:, :, : BL * nr].view(np.int8).reshape(groups, nb, BL // chunk, nr, chunk)
        codes = data.transpose(0, 3, 1, 2, 4).reshape(groups * nr, k)[:n]
        fields = np.ascontiguousarray(blocks[:, :, BL * nr :]).view("<f4").reshape(groups, nb, 2, nr)
        offset, scale = (f.transpose(0, 2, 1).reshape(groups * nr, nb)[:n] for f in fields.transpose(2, 0, 1, 3))
        bias = np.ascontiguousarray(grp[:, nb * nr * RHS_BLOCK_BYTES :]).view("<f4").reshape(-1)[:n]
        return codes, offset, scale, bias


def matmul_reference(
    q: np.ndarray, recip: np.ndarray, codes: np.ndarray, offset: np.ndarray, scale: np.ndarray, bias: np.ndarray
) -> np.ndarray:
    """The recipe of the module docstring: LHS q [m, k/32, 32] and recip [m, k/32]; RHS codes [n, k], offset and
    scale [n, k/16], bias [n]. Returns the unclamped float32 [m, n]."""
    m, n, nb = q.shape[0], codes.shape[0], scale.shape[1]
    q16 = q.reshape(m, nb, BL).astype(np.int64)
    a = np.einsum("mbt,nbt->bmn", q16, codes.reshape(n, nb, BL).astype(np.int64)).astype(np.float32)
    s = q16.sum(axis=-1).astype(np.float32)
    rc = np.repeat(recip, 2, axis=1)
    acc = np.zeros((m, n), np.float32)
    for b in range(nb):
        acc = fma_f32(scale[None, :, b] * rc[:, None, b], a[b], acc)
        acc = fma_f32(offset[None, :, b] * rc[:, None, b], s[:, None, b], acc)
    return acc + bias[None, :]


class Qsi8d32pQai8c16pKernel(MatmulKernel):
    """A qsi8d32p × qai8c16p kernel (the GEMM and the GEMV run one recipe)."""

    def _operands(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> tuple:
        g = self._geo()
        lhs = writable(lhs[: self.lhs_packed_size(m, k)])
        return g, lhs, writable(rhs[: self.rhs_packer.get_rhs_packed_size(n, k, g.nr, g.kr, g.sr)])

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g, lhs, rhs = self._operands(m, n, k, lhs, rhs)
        q, _, recip = unpack_lhs(lhs, m, k, g.mr, g.kr // g.sr)
        codes, offset, scale, bias = self.rhs_packer.unpack(rhs, n, k, g.nr, g.kr, g.sr)
        return matmul_reference(q, recip, codes, offset, scale, bias)

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g, lhs, rhs = self._operands(m, n, k, lhs, rhs)
        return COMPUTE(m, n, k, g.mr, g.nr, g.kr // g.sr, lhs, rhs)


def get_rows(
    kernel: MatmulKernel, rhs_packed: np.ndarray, rows: np.ndarray, n: int, k: int, *, execution: str | None = None
) -> np.ndarray:
    """GET_ROWS from an RHS packed for ``kernel``: the weight rows (output columns) ``rows`` as float32 [len(rows), k]
    straight from the packed buffer, f32(scale·code) + offset (:func:`kleidipy.formats.codes16.dequantize`'s value)."""
    if not isinstance(kernel, Qsi8d32pQai8c16pKernel):
        raise KernelShapeError(f"{kernel.name} does not read a qai8c16p RHS")
    execution = check_execution(execution)
    packer, nr, kr, sr = kernel.rhs_packer, kernel.nr, kernel.kr, kernel.sr
    buf, idx = packer.get_rows_operands(rhs_packed, rows, n, k, nr, kr, sr)
    buf = writable(buf)
    if execution == "jit":
        return _jit.get_rows(buf, idx, k, nr, kr // sr)
    codes, offset, scale, _ = packer.unpack(buf, n, k, nr, kr, sr)
    values = codes[idx].reshape(idx.size, -1, BL).astype(np.float32) * scale[idx, :, None]
    return (values + offset[idx, :, None]).reshape(idx.size, k)


RHS_PACKER = RhsPackNxkQai8c16pQai8c16F32F32F32Neon()


def _geometry(m_step: int, mr: int):
    return lambda vl: Geometry(m_step=m_step, n_step=16, mr=mr, nr=16, kr=4, sr=1)


KERNELS = [
    Qsi8d32pQai8c16pKernel(
        "matmul_clamp_f32_qsi8d32p4x4_qai8c16p16x4_4x16_neon_dotprod",
        FAMILY_NAME,
        "dotprod",
        "gemm",
        LHS_PACKER,
        RHS_PACKER,
        _geometry(4, 4),
    ),
    Qsi8d32pQai8c16pKernel(
        "matmul_clamp_f32_qsi8d32p1x4_qai8c16p16x4_1x16_neon_dotprod",
        FAMILY_NAME,
        "dotprod",
        "gemv",
        LHS_PACKER,
        RHS_PACKER,
        _geometry(1, 1),
    ),
]

PACKERS = [LHS_PACKER, RHS_PACKER]
