"""The micro-kernel interface shared by every KleidiAI family: packers, matmul kernels, executions, threading.

A family module (``kernels/<family>.py``) subclasses :class:`LhsPacker`, :class:`RhsPacker` and
:class:`MatmulKernel`, implementing one ``_reference`` and one ``_jit`` method each; this module owns
everything the families share: KleidiAI's size/offset functions, argument validation (GET_ROWS arguments
included), clamping, the llama.cpp thread split and the :class:`PackedBuffer` provenance check (accepting the
buffers of alternative packers that write the same bytes).

Executions: ``"reference"`` (plain numpy: the readable statement of the math), ``"jit"`` (numba) and
``"isa"`` (the instruction-level emulator in :mod:`kleidipy.emulator`, kernels only: packers run their
reference under it); all bit-exact with KleidiAI.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    KernelShapeError,
    NonFiniteInputError,
    PackedLayoutMismatchError,
)
from kleidipy.numerics import FLT_MAX, clamp_f32

EXECUTIONS = ("reference", "jit", "isa")
DEFAULT_EXECUTION = "jit"
#: Smaller matmuls run on one thread: handing work to the pool costs tens of µs, more than they take.
MIN_SPLIT_MACS = 1 << 21
#: A GEMV is memory-bound: a second thread adds little bandwidth, so only very large ones are split
#: (measured: splitting TinyLlama-1.1B's GEMVs made decode slower at 2 threads than at 1).
GEMV_SPLIT_FACTOR = 64
#: SVL values (bits) an SME/SME2 kernel can be built for.
SVL_CHOICES = (128, 256, 512, 1024, 2048)


def check_execution(execution: str | None) -> str:
    execution = execution or DEFAULT_EXECUTION
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution {execution!r}: choose one of {', '.join(EXECUTIONS)}")
    return execution


def check_svl(svl_bits: int) -> int:
    """Validate an SME streaming vector length in bits (a power of two in 128..2048)."""
    if svl_bits not in SVL_CHOICES:
        raise KernelShapeError(f"SVL {svl_bits} is not a power of two in 128..2048 bits")
    return svl_bits


def roundup(a: int, b: int) -> int:
    return (a + b - 1) // b * b


# --------------------------------------------------------------------------------------------- buffers


@dataclass(frozen=True)
class PackedLayout:
    """Where a packed buffer came from: the packer and every parameter that shapes its bytes."""

    packer: str
    rows: int  # m for LHS, n for RHS
    k: int
    mr_or_nr: int
    kr: int
    sr: int
    bl: int | None = None


class PackedBuffer(np.ndarray):
    """A uint8 buffer written by a packer, remembering its :class:`PackedLayout`.

    It is an ordinary numpy array (compare it, save it, slice it); kernels use ``layout`` to refuse a
    buffer packed for another kernel or SVL. Plain uint8 arrays are accepted too (size checks only).
    """

    layout: PackedLayout | None

    def __new__(cls, data: np.ndarray, layout: PackedLayout) -> PackedBuffer:
        obj = np.asarray(data, dtype=np.uint8).view(cls)
        obj.layout = layout
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.layout = getattr(obj, "layout", None)


def as_u8(buf: np.ndarray, what: str) -> np.ndarray:
    """A flat, contiguous uint8 view of a packed buffer (raises DTypeError for other dtypes)."""
    arr = np.asarray(buf)
    if arr.dtype != np.uint8:
        raise DTypeError(f"{what} must be a uint8 buffer, got {arr.dtype}")
    return np.ascontiguousarray(arr).reshape(-1).view(np.ndarray)


def check_finite(x: np.ndarray, who: str) -> None:
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise NonFiniteInputError(f"{who}: LHS has NaN/Inf (first at index {tuple(int(i) for i in bad)})")


def as_f32_rows(x: np.ndarray, m: int, k: int, who: str, lhs_stride: int | None = None) -> np.ndarray:
    """View of m rows of k float32 values; lhs_stride is in bytes (KleidiAI's convention)."""
    arr = np.asarray(x)
    if arr.dtype != np.float32:
        raise DTypeError(f"{who}: LHS must be float32, got {arr.dtype}")
    flat = np.ascontiguousarray(arr).reshape(-1)
    stride = k if lhs_stride is None else lhs_stride // 4
    if lhs_stride is not None and (lhs_stride % 4 or stride < k):
        raise KernelShapeError(f"{who}: lhs_stride {lhs_stride} bytes is not a multiple of 4 >= 4*k")
    need = (m - 1) * stride + k if m else 0
    if flat.size < need:
        raise BufferSizeError(f"{who}: LHS holds {flat.size} floats, {m}x{k} with stride {stride} needs {need}")
    rows = np.lib.stride_tricks.as_strided(flat, shape=(m, k), strides=(stride * 4, 4))
    return rows


# --------------------------------------------------------------------------------------------- packers


class Packer:
    """Common part of LHS and RHS packers: a KleidiAI name and the two executions."""

    #: KleidiAI name without the ``kai_run_`` prefix, e.g. ``lhs_quant_pack_qsi8d32p_f32_neon``.
    name: str = ""
    side: str = ""

    @property
    def kai_name(self) -> str:
        return "kai_run_" + self.name

    def __repr__(self) -> str:
        return f"<{self.side.upper()} packer {self.name}>"

    def _impl(self, execution: str) -> Callable:
        """The packing function of an execution (packers run their reference under the emulator)."""
        return self._jit if execution == "jit" else self._reference

    def _group_index(self, idx: int, idx_name: str, r: int, r_name: str) -> int:
        """The group of mr rows / nr columns that starts at row/column ``idx`` (KernelShapeError if none does)."""
        if idx % r:
            raise KernelShapeError(f"{self.name}: {idx_name} {idx} is not a multiple of {r_name}={r}")
        return idx // r

    def _check_block_length(self, k: int, bl: int | None) -> None:
        """The rule of the block-quantized (``blocked``) packers: bl = 32 and k a multiple of it."""
        if self.blocked:
            if bl is None or bl != 32:
                raise KernelShapeError(f"{self.name}: block length bl must be 32, got {bl}")
            if k % bl:
                raise KernelShapeError(f"{self.name}: k={k} is not a multiple of the block length {bl}")


class LhsPacker(Packer):
    """LHS (activation) quantize+pack. Subclasses implement the layout functions and two executions.

    ``_reference``/``_jit`` receive validated float32 rows ``lhs`` [m, k] and must return the packed
    bytes for those m rows (``get_lhs_packed_size(m, ...)`` long, padding rows 0).
    """

    side = "lhs"
    #: whether the packer takes ``bl`` (block-quantized ``d32`` packers) — the KleidiAI signature differs.
    blocked: bool = True

    def get_m_step(self, mr: int) -> int:
        return mr

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        """Bytes of one group of mr packed rows."""
        raise NotImplementedError

    def get_lhs_packed_offset(self, m_idx: int, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return self._group_index(m_idx, "m_idx", mr, "mr") * self.get_lhs_packed_stride(k, mr, kr, sr, bl)

    def get_lhs_packed_size(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return -(-m // mr) * self.get_lhs_packed_stride(k, mr, kr, sr, bl)

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        """Family packers extend this with their own rules (kr/sr values, bl)."""
        if m < 0 or k <= 0:
            raise KernelShapeError(f"{self.name}: m={m}, k={k} must be m >= 0, k > 0")
        self._check_block_length(k, bl)

    def run(
        self,
        m: int,
        k: int,
        mr: int,
        kr: int,
        sr: int,
        lhs: np.ndarray,
        *,
        bl: int | None = None,
        m_idx_start: int = 0,
        lhs_stride: int | None = None,
        execution: str | None = None,
        threads: int = 1,
    ) -> PackedBuffer:
        """Quantize+pack m rows of ``lhs`` (float32, row stride ``lhs_stride`` bytes). Returns the packed buffer.

        ``m_idx_start`` follows KleidiAI: the row index of the first packed row (offsets rows inside a group).
        With ``threads`` > 1 the rows are split in multiples of mr across threads (llama.cpp's split).
        """
        execution = check_execution(execution)
        self.check_args(m, k, mr, kr, sr, bl)
        rows = as_f32_rows(lhs, m, k, self.name, lhs_stride)
        check_finite(rows, self.name)
        impl = self._impl(execution)
        size = self.get_lhs_packed_size(m + m_idx_start % mr, k, mr, kr, sr, bl)
        out = np.zeros(size, dtype=np.uint8)
        if m_idx_start % mr == 0 and threads > 1 and m > mr:
            per = roundup(m, mr * threads) // threads
            parts = [(s, min(m, s + per)) for s in range(0, m, per)]

            def pack_part(part: tuple[int, int]) -> None:
                s, e = part
                off = self.get_lhs_packed_offset(s, k, mr, kr, sr, bl)
                packed = impl(rows[s:e], mr, kr, sr, bl, 0)
                out[off : off + packed.size] = packed

            parallel_map(pack_part, parts, threads)
        else:
            packed = impl(rows, mr, kr, sr, bl, m_idx_start % mr)
            out[: packed.size] = packed
        return PackedBuffer(out, PackedLayout(self.name, m, k, mr, kr, sr, bl))

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        """Pack rows; ``row_offset`` = m_idx_start % mr (row position of lhs[0] inside its group)."""
        raise NotImplementedError

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        raise NotImplementedError


class RhsPacker(Packer):
    """RHS (weights) pack, done once at model load. Inputs are keyword arrays named as KleidiAI's arguments.

    ``rhs`` is the weight data (GGML blocks, codes or floats), ``scale``/``zero``/``bias`` the per-channel or
    per-block parameters the packer takes. Subclasses implement the layout functions and two executions.
    """

    side = "rhs"
    blocked: bool = True
    #: the names of the keyword inputs this packer needs besides ``rhs`` (e.g. ("scale",)).
    inputs: tuple[str, ...] = ()
    #: "nxk" or "kxn"
    rhs_order: str = "nxk"

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        raise NotImplementedError

    def get_rhs_packed_offset(self, n_idx: int, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return self._group_index(n_idx, "n_idx", nr, "nr") * self.get_rhs_packed_stride(k, nr, kr, sr, bl)

    def get_rhs_packed_size(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return -(-n // nr) * self.get_rhs_packed_stride(k, nr, kr, sr, bl)

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        if n <= 0 or k <= 0:
            raise KernelShapeError(f"{self.name}: n={n}, k={k} must be positive")
        self._check_block_length(k, bl)

    def check_inputs(self, given: dict[str, np.ndarray | None]) -> None:
        """The keyword inputs ``given`` (scale, zero, bias) must include every name in ``inputs``; a family packer
        may refuse others."""
        for name in self.inputs:
            if given[name] is None:
                raise KernelShapeError(f"{self.name}: needs the '{name}' input")

    def run(
        self,
        n: int,
        k: int,
        nr: int,
        kr: int,
        sr: int,
        rhs: np.ndarray,
        *,
        bl: int | None = None,
        scale: np.ndarray | None = None,
        zero: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        execution: str | None = None,
    ) -> PackedBuffer:
        """Pack n output channels of k values. Returns the packed buffer (padding as KleidiAI writes it)."""
        execution = check_execution(execution)
        self.check_args(n, k, nr, kr, sr, bl)
        self.check_inputs({"scale": scale, "zero": zero, "bias": bias})
        impl = self._impl(execution)
        packed = impl(n, k, nr, kr, sr, bl, rhs, scale=scale, zero=zero, bias=bias)
        expected = self.get_rhs_packed_size(n, k, nr, kr, sr, bl)
        assert packed.size == expected, (self.name, packed.size, expected)
        return PackedBuffer(packed, PackedLayout(self.name, n, k, nr, kr, sr, bl))

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:  # noqa: ANN001
        raise NotImplementedError

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:  # noqa: ANN001
        raise NotImplementedError

    def get_rows_operands(
        self, rhs_packed: np.ndarray, rows: np.ndarray, n: int, k: int, nr: int, kr: int, sr: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The checked operands of a GET_ROWS (dequantizing output channels ``rows`` straight from a buffer this
        packer wrote for n channels of k values): the packed bytes (flat uint8, exactly the packed size) and the
        row ids (int64)."""
        self.check_args(n, k, nr, kr, sr, 32 if self.blocked else None)
        layout = getattr(rhs_packed, "layout", None)
        if layout is not None and (layout.packer, layout.k, layout.mr_or_nr, layout.kr, layout.sr) != (
            self.name,
            k,
            nr,
            kr,
            sr,
        ):
            raise PackedLayoutMismatchError(
                f"{self.name}: buffer was packed by {layout.packer} (k={layout.k}, nr={layout.mr_or_nr}, "
                f"kr={layout.kr}, sr={layout.sr}); GET_ROWS asked for k={k}, nr={nr}, kr={kr}, sr={sr}"
            )
        buf = as_u8(rhs_packed, f"{self.name} packed RHS")
        size = self.get_rhs_packed_size(n, k, nr, kr, sr)
        if buf.size < size:
            raise BufferSizeError(f"{self.name}: packed RHS is {buf.size} bytes, n={n}, k={k} needs {size}")
        idx = np.asarray(rows)
        if idx.size and idx.dtype.kind not in "iu":
            raise DTypeError(f"{self.name}: GET_ROWS row ids must be integers, got {idx.dtype}")
        idx = idx.reshape(-1).astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise KernelShapeError(f"{self.name}: GET_ROWS row ids must be in [0, {n}), got [{idx.min()}, {idx.max()}]")
        return buf[:size], idx


# --------------------------------------------------------------------------------------------- kernels


@dataclass(frozen=True)
class Geometry:
    """KleidiAI's per-kernel constants (SME kernels compute them from the vector length)."""

    m_step: int
    n_step: int
    mr: int
    nr: int
    kr: int
    sr: int


@dataclass
class MatmulKernel:
    """One KleidiAI matmul micro-kernel (bound to an SVL when it is an SME kernel).

    ``geometry`` maps VL (number of 32-bit lanes of the SVL; 0 for NEON kernels) to :class:`Geometry`.
    Families subclass this and implement ``_reference``/``_jit``, which get validated flat uint8 buffers
    and return the **unclamped** float32 result [m, n]; clamping and dst writing are done here.
    """

    name: str  # without the kai_ prefix: "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
    family: str
    tier: str  # "sme2" | "sme" | "i8mm" | "dotprod" | "neon" (the CPU feature that runs it)
    kind: str  # "gemm" | "gemv"
    lhs_packer: LhsPacker | None
    rhs_packer: RhsPacker
    geometry: Callable[[int], Geometry]
    bl: int | None = 32
    svl_bits: int | None = None
    #: free-form per-kernel flags the family's compute code reads (e.g. {"first_block_fmul": True}).
    flags: dict[str, Any] = field(default_factory=dict)
    #: other packers that write the same bytes as ``lhs_packer`` / ``rhs_packer`` (e.g. from another input
    #: order, or another rounding of the same layout): buffers they packed are accepted too.
    alt_lhs_packers: tuple[LhsPacker, ...] = ()
    alt_rhs_packers: tuple[RhsPacker, ...] = ()

    # --- identity -----------------------------------------------------------------------------
    @property
    def kai_name(self) -> str:
        return "kai_" + self.name

    @property
    def is_sme(self) -> bool:
        return self.tier in ("sme", "sme2")

    def bind(self, svl_bits: int | None) -> MatmulKernel:
        """This kernel at a given SVL (SME kernels only; NEON kernels ignore it)."""
        if not self.is_sme:
            return self
        return replace(self, svl_bits=check_svl(svl_bits or 512))

    def _geo(self) -> Geometry:
        geo = self.__dict__.get("_geometry_cache")
        if geo is None:
            vl = (self.svl_bits or 512) // 32 if self.is_sme else 0
            geo = self.__dict__["_geometry_cache"] = self.geometry(vl)
        return geo

    def get_m_step(self) -> int:
        return self._geo().m_step

    def get_n_step(self) -> int:
        return self._geo().n_step

    def get_mr(self) -> int:
        return self._geo().mr

    def get_nr(self) -> int:
        return self._geo().nr

    def get_kr(self) -> int:
        return self._geo().kr

    def get_sr(self) -> int:
        return self._geo().sr

    m_step = property(get_m_step)
    n_step = property(get_n_step)
    mr = property(get_mr)
    nr = property(get_nr)
    kr = property(get_kr)
    sr = property(get_sr)

    def get_lhs_packed_offset(self, m_idx: int, k: int) -> int:
        if self.lhs_packer is None:  # kernels reading a plain f32 LHS
            return m_idx * k * 4
        g = self._geo()
        return self.lhs_packer.get_lhs_packed_offset(m_idx, k, g.mr, g.kr, g.sr, self.bl)

    def get_rhs_packed_offset(self, n_idx: int, k: int) -> int:
        g = self._geo()
        if n_idx % g.n_step:
            raise KernelShapeError(f"{self.name}: n_idx {n_idx} is not a multiple of n_step={g.n_step}")
        return self.rhs_packer.get_rhs_packed_offset(n_idx, k, g.nr, g.kr, g.sr, self.bl)

    def get_dst_offset(self, m_idx: int, n_idx: int, dst_stride_row: int) -> int:
        return n_idx * 4 + m_idx * dst_stride_row

    def get_dst_size(self, m: int, n: int) -> int:
        return m * n * 4

    def lhs_packed_size(self, m: int, k: int) -> int:
        if self.lhs_packer is None:
            return m * k * 4
        g = self._geo()
        return self.lhs_packer.get_lhs_packed_size(m, k, g.mr, g.kr, g.sr, self.bl)

    def rhs_packed_size(self, n: int, k: int) -> int:
        g = self._geo()
        return self.rhs_packer.get_rhs_packed_size(n, k, g.nr, g.kr, g.sr, self.bl)

    # --- packing with this kernel's parameters --------------------------------------------------
    def pack_lhs(self, lhs: np.ndarray, m: int | None = None, k: int | None = None, **kw: Any) -> np.ndarray:
        """Quantize+pack activations [m, k] with the packer and mr/kr/sr this kernel needs."""
        arr = np.asarray(lhs)
        if m is None or k is None:
            m, k = arr.reshape(-1, arr.shape[-1]).shape
        if self.lhs_packer is None:
            return as_f32_rows(arr, m, k, self.name).copy()
        g = self._geo()
        return self.lhs_packer.run(m, k, g.mr, g.kr, g.sr, arr, bl=self.bl, **kw)

    def pack_rhs(self, n: int, k: int, rhs: np.ndarray, **kw: Any) -> np.ndarray:
        """Pack weights with the packer and nr/kr/sr this kernel needs (keywords: scale, zero, bias, execution)."""
        g = self._geo()
        return self.rhs_packer.run(n, k, g.nr, g.kr, g.sr, rhs, bl=self.bl, **kw)

    # --- run ------------------------------------------------------------------------------------
    def as_packer_buffer(self, buf: np.ndarray, side: str) -> np.ndarray:
        """``buf``, relabelled as written by the kernel's own ``side`` packer when an alternative one wrote it."""
        layout = getattr(buf, "layout", None)
        alternatives = self.alt_lhs_packers if side == "lhs" else self.alt_rhs_packers
        if layout is not None and layout.packer in {p.name for p in alternatives}:
            own = self.lhs_packer if side == "lhs" else self.rhs_packer
            return PackedBuffer(buf, replace(layout, packer=own.name))
        return buf

    def _check_layout(self, buf: np.ndarray, side: str, rows: int, k: int) -> None:
        layout = getattr(self.as_packer_buffer(buf, side), "layout", None)
        if layout is None:
            return
        g = self._geo()
        packer = self.lhs_packer if side == "lhs" else self.rhs_packer
        want = PackedLayout(
            packer.name if packer else "",
            layout.rows,
            k,
            g.mr if side == "lhs" else g.nr,
            g.kr,
            g.sr,
            self.bl,
        )
        if (layout.packer, layout.k, layout.mr_or_nr, layout.kr, layout.sr, layout.bl) != (
            want.packer,
            want.k,
            want.mr_or_nr,
            want.kr,
            want.sr,
            want.bl,
        ):
            raise PackedLayoutMismatchError(
                f"{self.name}: {side.upper()} buffer was packed by {layout.packer} "
                f"(k={layout.k}, {'mr' if side == 'lhs' else 'nr'}={layout.mr_or_nr}, kr={layout.kr}, "
                f"sr={layout.sr}); this kernel{self._svl_text()} needs {want.packer} "
                f"(k={k}, {'mr' if side == 'lhs' else 'nr'}={want.mr_or_nr}, kr={g.kr}, sr={g.sr})"
            )
        if layout.rows < rows:
            raise KernelShapeError(f"{self.name}: {side.upper()} buffer holds {layout.rows} rows, {rows} needed")

    def _svl_text(self) -> str:
        return f" at SVL {self.svl_bits}" if self.is_sme else ""

    def check_args(self, m: int, n: int, k: int) -> None:
        if m <= 0 or n <= 0 or k <= 0:
            raise KernelShapeError(f"{self.name}: m={m}, n={n}, k={k} must all be positive")
        if self.kind == "gemv" and m != 1:
            raise KernelShapeError(f"{self.name}: GEMV kernel takes m == 1, got m={m}")
        if self.bl is not None and k % self.bl:
            raise KernelShapeError(f"{self.name}: k={k} is not a multiple of the block length bl={self.bl}")

    def run(
        self,
        m: int,
        n: int,
        k: int,
        lhs_packed: np.ndarray,
        rhs_packed: np.ndarray,
        dst: np.ndarray | None = None,
        dst_stride_row: int | None = None,
        clamp_min: float = -FLT_MAX,
        clamp_max: float = FLT_MAX,
        *,
        bl: int | None = None,
        execution: str | None = None,
        threads: int = 1,
        min_split_macs: int = MIN_SPLIT_MACS,
    ) -> np.ndarray:
        """``kai_run_<name>``: dst[m, n] = clamp(lhs_packed · rhs_packedᵀ, clamp_min, clamp_max).

        ``dst`` is a float32 buffer written with a row stride of ``dst_stride_row`` bytes (default 4n);
        when omitted a new [m, n] array is returned. With ``threads`` > 1 the columns are split in multiples
        of n_step (llama.cpp's split) once the matmul has ``min_split_macs`` multiply-adds (GEMV: 64× that);
        the result is the same at every thread count. Returns the [m, n] float32 view of dst.
        """
        execution = check_execution(execution)
        self.check_args(m, n, k)
        if bl is not None and bl != self.bl:
            raise KernelShapeError(f"{self.name}: block length bl={bl}, the kernel's is {self.bl}")
        if math.isnan(clamp_min) or math.isnan(clamp_max) or clamp_min > clamp_max:
            raise KernelShapeError(f"{self.name}: clamp range [{clamp_min}, {clamp_max}] is not ordered")
        self._check_layout(lhs_packed, "lhs", m, k)
        rhs = self._rhs_bytes(rhs_packed, n, k)
        lhs = as_u8(lhs_packed, f"{self.name} LHS") if self.lhs_packer else np.asarray(lhs_packed)
        if self.lhs_packer is None:
            if lhs.dtype != np.float32:
                raise DTypeError(f"{self.name}: LHS must be float32, got {lhs.dtype}")
            lhs = np.ascontiguousarray(lhs).reshape(-1)
            if lhs.size < m * k:
                raise BufferSizeError(f"{self.name}: LHS holds {lhs.size} floats, {m}x{k} needs {m * k}")
        elif lhs.size < self.lhs_packed_size(m, k):
            raise BufferSizeError(
                f"{self.name}: LHS packed buffer is {lhs.size} bytes, m={m}, k={k} needs {self.lhs_packed_size(m, k)}"
            )
        out = self._dst_view(dst, m, n, dst_stride_row)
        out[:, :] = clamp_f32(
            self._compute(self._impl(execution), m, n, k, lhs, rhs, threads, min_split_macs), clamp_min, clamp_max
        )
        return out

    def _impl(self, execution: str) -> Callable:
        return {"reference": self._reference, "jit": self._jit, "isa": self._isa}[execution]

    def _rhs_bytes(self, rhs_packed: np.ndarray, n: int, k: int) -> np.ndarray:
        """The packed RHS as flat bytes, after checking its layout (if known) and its size for n, k."""
        self._check_layout(rhs_packed, "rhs", n, k)
        rhs = as_u8(rhs_packed, f"{self.name} RHS")
        if rhs.size < self.rhs_packed_size(n, k):
            raise BufferSizeError(
                f"{self.name}{self._svl_text()}: RHS packed buffer is {rhs.size} bytes, "
                f"n={n}, k={k} needs {self.rhs_packed_size(n, k)}"
            )
        return rhs

    def prepare(
        self,
        n: int,
        k: int,
        rhs_packed: np.ndarray,
        *,
        execution: str | None = None,
        min_split_macs: int = MIN_SPLIT_MACS,
    ) -> Callable[..., np.ndarray]:
        """Validate packed weights once and return ``matmul(x, threads=1) -> x·Wᵀ`` (float32 [m, k] -> [m, n],
        clamped to ±FLT_MAX as llama.cpp calls the kernels; threads split as in :meth:`run`).

        This is what a runtime calls per MUL_MAT: the returned function only checks the activations (dtype,
        shape, finite) and runs the LHS quantize+pack and the kernel, as ``pack_lhs`` + ``run`` would.
        """
        execution = check_execution(execution)
        self.check_args(self.mr if self.kind == "gemm" else 1, n, k)
        rhs = self._rhs_bytes(rhs_packed, n, k)
        impl = self._impl(execution)
        g, packer, bl = self._geo(), self.lhs_packer, self.bl
        pack = None
        if packer is not None:
            pack = packer._impl(execution)
            packer.check_args(1, k, g.mr, g.kr, g.sr, bl)

        lo, hi = np.float32(-FLT_MAX), np.float32(FLT_MAX)

        def matmul(x: np.ndarray, threads: int = 1) -> np.ndarray:
            if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != k:
                raise DTypeError(f"{self.name}: activations must be float32 [m, {k}], got {x.dtype} {x.shape}")
            m = x.shape[0]
            if self.kind == "gemv" and m != 1:
                raise KernelShapeError(f"{self.name}: GEMV kernel takes m == 1, got m={m}")
            if pack is None:
                check_finite(x, self.name)
                lhs = np.ascontiguousarray(x).reshape(-1)
            else:
                check_finite(x, packer.name)
                if threads > 1 and m > g.mr:
                    lhs = packer.run(m, k, g.mr, g.kr, g.sr, x, bl=bl, execution=execution, threads=threads)
                    lhs = lhs.view(np.ndarray)
                else:
                    lhs = pack(np.ascontiguousarray(x), g.mr, g.kr, g.sr, bl, 0)
            out = self._compute(impl, m, n, k, lhs, rhs, threads, min_split_macs)
            np.maximum(out, lo, out=out)  # llama.cpp's clamp range [-FLT_MAX, FLT_MAX]: ±inf -> ±FLT_MAX
            return np.minimum(out, hi, out=out)

        return matmul

    def _compute(
        self,
        impl: Callable,
        m: int,
        n: int,
        k: int,
        lhs: np.ndarray,
        rhs: np.ndarray,
        threads: int,
        min_split_macs: int,
    ) -> np.ndarray:
        """Unclamped [m, n]; with threads > 1 the columns are split in multiples of n_step (llama.cpp's split)."""
        n_step = self._geo().n_step
        if threads <= 1 or n <= n_step or m * n * k < min_split_macs * (GEMV_SPLIT_FACTOR if m == 1 else 1):
            return impl(m, n, k, lhs, rhs)
        out = np.empty((m, n), dtype=np.float32)
        per_n = roundup(-(-n // threads), n_step)

        def run_slice(n_start: int) -> None:
            n_cnt = min(per_n, n - n_start)
            out[:, n_start : n_start + n_cnt] = impl(m, n_cnt, k, lhs, rhs[self.get_rhs_packed_offset(n_start, k) :])

        parallel_map(run_slice, list(range(0, n, per_n)), threads)
        return out

    def _dst_view(self, dst: np.ndarray | None, m: int, n: int, dst_stride_row: int | None) -> np.ndarray:
        if dst is None:
            return np.empty((m, n), dtype=np.float32)
        if dst.dtype != np.float32:
            raise DTypeError(f"{self.name}: dst must be float32, got {dst.dtype}")
        stride = dst_stride_row if dst_stride_row is not None else n * 4
        if stride % 4 or stride < n * 4:
            raise KernelShapeError(f"{self.name}: dst_stride_row {stride} is not a multiple of 4 >= 4n")
        if dst.ndim == 2 and dst.flags.c_contiguous is False and dst.strides == (stride, 4):
            return dst[:m, :n]
        if not dst.flags.c_contiguous:
            raise DTypeError(f"{self.name}: dst must be contiguous")
        flat = dst.reshape(-1)
        need = (m - 1) * (stride // 4) + n
        if flat.size < need:
            raise BufferSizeError(f"{self.name}: dst holds {flat.size} floats, {m}x{n} at stride {stride} needs {need}")
        return np.lib.stride_tricks.as_strided(flat, shape=(m, n), strides=(stride, 4))

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """Unclamped float32 [m, n] from flat packed buffers (rhs starts at the first group used)."""
        raise NotImplementedError

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _isa(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """Instruction-level emulation of this kernel (NotImplementedError if the emulator does not cover it)."""
        from kleidipy.emulator import emulate_kernel

        return emulate_kernel(self, m, n, k, lhs, rhs)


# --------------------------------------------------------------------------------------------- threads

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def parallel_map(fn: Callable[[Any], None], items: list[Any], threads: int) -> None:
    """Run fn over items on up to ``threads`` threads (numba code releases the GIL with nogil=True)."""
    global _POOL
    if threads <= 1 or len(items) <= 1:
        for it in items:
            fn(it)
        return
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < threads:
            _POOL = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kleidipy")
        pool = _POOL
    futures = [pool.submit(fn, it) for it in items[1:]]
    fn(items[0])
    for f in futures:
        f.result()
