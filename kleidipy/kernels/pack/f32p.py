"""The F32 weights of llama.cpp's SME2 F32 route (kernels.cpp's ``ggml_kleidiai_kernels_f32``): KleidiAI's
``rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme``, one packing shared by the MOPA GEMM (``f32p_f32p``) and the MLA GEMV
(``f32_f32p``), the bias-then-rows layout it shares with ``rhs_pack_kxn_x32p16x1b_x32_x32_neon``, and the adaptor
from GGML F32 tensors (llama.cpp packs them as stored, N x K, with zero biases: kleidiai.cpp ``repack``).

Packed RHS: per group of nr columns, nr f32 biases, then for each k the nr f32 of row k (columns past n are 0, as
KleidiAI's packer writes them into a zeroed buffer: confirmed against the golden data).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.pack import f32p_jit
from kleidipy.kernels.pack.kxn import check_no_bl, float_rhs, kxn_bias, kxn_inputs


def bias_rows(weights_kxn: np.ndarray, bias: np.ndarray, nr: int) -> np.ndarray:
    """The bias-then-rows layout of K x N float32 weights and n biases, in groups of nr columns (flat uint8)."""
    k, n = weights_kxn.shape
    groups = -(-n // nr)
    packed = np.zeros((groups, 1 + k, nr), dtype=np.float32)
    head = np.zeros(groups * nr, dtype=np.float32)
    head[:n] = bias
    packed[:, 0] = head.reshape(groups, nr)
    cols = np.zeros((k, groups * nr), dtype=np.float32)
    cols[:, :n] = weights_kxn
    packed[:, 1:] = cols.reshape(k, groups, nr).transpose(1, 0, 2)
    return packed.reshape(-1).view(np.uint8)


def unpack_bias_rows(rhs: np.ndarray, n: int, k: int, nr: int) -> tuple[np.ndarray, np.ndarray]:
    """(biases [n], K x N weights) of a bias-then-rows buffer (flat uint8, from its first group)."""
    groups = -(-n // nr)
    packed = np.ascontiguousarray(rhs[: groups * nr * 4 * (1 + k)]).view(np.float32).reshape(groups, 1 + k, nr)
    return packed[:, 0].reshape(-1)[:n], packed[:, 1:].transpose(1, 0, 2).reshape(k, -1)[:, :n]


class BiasRowsRhsPacker(RhsPacker):
    """A packer of the bias-then-rows layout: f32 weights (K x N or N x K, its ``rhs_order``) + n f32 biases (None =
    zeros), kr = sr = 1, nr = ``fixed_nr`` (None: 2·VL, a multiple of 8)."""

    blocked = False
    inputs = ()
    fixed_nr: int | None = None

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return nr * 4 * (1 + k)

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        check_no_bl(self.name, bl)
        good_nr = nr == self.fixed_nr if self.fixed_nr else nr >= 8 and nr % 8 == 0
        if not good_nr or (kr, sr) != (1, 1):
            takes = self.fixed_nr or "2·VL"
            raise KernelShapeError(f"{self.name}: takes nr={takes}, kr=1, sr=1; got nr={nr}, kr={kr}, sr={sr}")

    def _inputs(self, n, k, rhs, scale, zero, bias) -> tuple[np.ndarray, np.ndarray]:
        """(K x N weights, n biases) of a call; these packers take no scale or zero (KleidiAI asserts scale ==
        NULL)."""
        if self.rhs_order == "kxn":
            return kxn_inputs(self.name, n, k, rhs, scale, zero, bias)
        if scale is not None or zero is not None:
            raise KernelShapeError(f"{self.name}: takes no scale or zero input, only rhs and bias")
        return float_rhs(rhs, n, k, self.name, "N x K").T, kxn_bias(bias, n, self.name)

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        return bias_rows(*self._inputs(n, k, rhs, scale, zero, bias), nr)

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        weights, biases = self._inputs(n, k, rhs, scale, zero, bias)
        return f32p_jit.pack_bias_rows(np.ascontiguousarray(weights), biases, nr)


class RhsPackNxkF32p2vlx1biasf32(BiasRowsRhsPacker):
    """``rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme``: N x K f32 weights + n f32 biases (KleidiAI asserts a bias:
    llama.cpp passes zeros) in groups of nr = 2·VL columns."""

    name = "rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"
    rhs_order = "nxk"


RHS_F32P2VLX1BIASF32_SME = RhsPackNxkF32p2vlx1biasf32()


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """GGML F32 weights [n, k] as stored, with zero biases (kleidiai.cpp ``repack``)."""
    return np.asarray(raw).view(np.float32).reshape(n, k), {"bias": np.zeros(n, np.float32)}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] kept as float32."""
    n, k = weights.shape
    return from_ggml(GGMLType.F32, np.ascontiguousarray(weights, np.float32), n, k, packer)
