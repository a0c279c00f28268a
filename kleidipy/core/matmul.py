"""The matmul kernel interface shared by every KleidiAI family: geometry, run, prepare, executions.

A family subclasses :class:`MatmulKernel`, implementing one ``_reference`` and one ``_jit`` method; this module
owns KleidiAI's getters (m_step, n_step, mr, nr, kr, sr, packed offsets), argument validation, clamping, the
llama.cpp thread split over n and the prepared path a runtime calls per MUL_MAT.

Executions: ``"reference"`` (plain numpy: the readable statement of the math), ``"jit"`` (numba) and
``"isa"`` (the instruction-level emulator, through the program its family registers: ``isa_runner``); all
bit-exact with KleidiAI.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kleidipy.core.buffers import (
    PackedBuffer,
    PackedLayout,
    as_f32_rows,
    as_u8,
    check_execution,
    check_finite,
    check_svl,
    check_threads,
    roundup,
)
from kleidipy.core.numerics import FLT_MAX, clamp_f32
from kleidipy.core.packers import LhsPacker, RhsPacker
from kleidipy.core.threads import GEMV_SPLIT_FACTOR, MIN_SPLIT_MACS, parallel_map
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError, PackedLayoutMismatchError


@dataclass(frozen=True)
class Geometry:
    """KleidiAI's per-kernel constants (SME kernels compute them from the vector length)."""

    m_step: int
    n_step: int
    mr: int
    nr: int
    kr: int
    sr: int


def _geometry_getter(name: str) -> Callable[[MatmulKernel], int]:
    """KleidiAI's ``get_<name>`` of a kernel: that field of its :class:`Geometry`."""

    def get(self: MatmulKernel) -> int:
        return getattr(self._geo(), name)

    get.__name__ = get.__qualname__ = f"get_{name}"
    return get


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
    #: the ``isa`` execution: ``isa(kernel, m, n, k, lhs, rhs, trace=False) -> (unclamped dst, machine)``, set
    #: by the kernel's family from its emulator program (None: not emulated)
    isa: Callable[..., tuple[np.ndarray, Any]] | None = field(default=None, repr=False, compare=False)

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

    get_m_step = _geometry_getter("m_step")
    get_n_step = _geometry_getter("n_step")
    get_mr = _geometry_getter("mr")
    get_nr = _geometry_getter("nr")
    get_kr = _geometry_getter("kr")
    get_sr = _geometry_getter("sr")

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
            if arr.ndim == 0 or arr.shape[-1] == 0:
                raise KernelShapeError(f"{self.name}: activations of shape {list(arr.shape)} have no k columns")
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
        """``kai_run_<name>``: dst[m, n] = clamp(lhs_packed · rhs_packedᵀ, clamp_min, clamp_max): the buffers
        checked, then the prepared path's kernel (:meth:`PreparedMatmul.matmul`) and KleidiAI's clamp.

        ``dst`` is a float32 buffer written with a row stride of ``dst_stride_row`` bytes (default 4n);
        when omitted a new [m, n] array is returned. With ``threads`` > 1 the columns are split in multiples
        of n_step (llama.cpp's split) once the matmul has ``min_split_macs`` multiply-adds (GEMV: 64× that);
        the result is the same at every thread count. Returns the [m, n] float32 view of dst.
        """
        execution = check_execution(execution)
        check_threads(threads)
        self.check_args(m, n, k)
        if bl is not None and bl != self.bl:
            raise KernelShapeError(f"{self.name}: block length bl={bl}, the kernel's is {self.bl}")
        if math.isnan(clamp_min) or math.isnan(clamp_max) or clamp_min > clamp_max:
            raise KernelShapeError(f"{self.name}: clamp range [{clamp_min}, {clamp_max}] is not ordered")
        self._check_layout(lhs_packed, "lhs", m, k)
        prepared = PreparedMatmul(self, n, k, rhs_packed, execution, min_split_macs)
        lhs = as_u8(lhs_packed, f"{self.name} LHS") if self.lhs_packer else np.asarray(lhs_packed)
        if self.lhs_packer is None:
            if lhs.dtype != np.float32:
                raise DTypeError(f"{self.name}: LHS must be float32, got {lhs.dtype}")
            lhs = np.ascontiguousarray(lhs).reshape(-1)
            if lhs.size < m * k:
                raise BufferSizeError(f"{self.name}: LHS holds {lhs.size} floats, {m}x{k} needs {m * k}")
        else:
            self._check_size(lhs_packed, lhs.size, self.lhs_packed_size(m, k), f"LHS packed buffer for m={m}, k={k}")
        out = self._dst_view(dst, m, n, dst_stride_row)
        out[:, :] = clamp_f32(prepared.matmul(lhs, m, threads), clamp_min, clamp_max)
        return out

    def _impl(self, execution: str) -> Callable:
        return {"reference": self._reference, "jit": self._jit, "isa": self._isa}[execution]

    def _rhs_bytes(self, rhs_packed: np.ndarray, n: int, k: int) -> np.ndarray:
        """The packed RHS as flat bytes, after checking its layout (if known) and its size for n, k."""
        self._check_layout(rhs_packed, "rhs", n, k)
        rhs = as_u8(rhs_packed, f"{self.name} RHS")
        self._check_size(rhs_packed, rhs.size, self.rhs_packed_size(n, k), f"RHS packed buffer for n={n}, k={k}")
        return rhs

    def _check_size(self, buf: np.ndarray, size: int, need: int, what: str) -> None:
        """A packed buffer must hold ``need`` bytes; a plain array (no packer provenance to check its layout
        against) must be exactly that size, so that one packed for another k or row count is refused."""
        plain = getattr(buf, "layout", None) is None
        if size < need or (plain and size != need):
            exactly = " exactly (a plain array, without packer provenance)" if plain and size > need else ""
            raise BufferSizeError(f"{self.name}{self._svl_text()}: {what} is {size} bytes, needs {need}{exactly}")

    def prepare(
        self,
        n: int,
        k: int,
        rhs_packed: np.ndarray,
        *,
        execution: str | None = None,
        min_split_macs: int = MIN_SPLIT_MACS,
    ) -> PreparedMatmul:
        """Validate packed weights once and return the :class:`PreparedMatmul` a runtime calls per MUL_MAT:
        ``prepared(x, threads=1) -> x·Wᵀ`` (float32 [m, k] -> [m, n], clamped to ±FLT_MAX as llama.cpp calls the
        kernels; threads split as in :meth:`run`)."""
        return PreparedMatmul(self, n, k, rhs_packed, check_execution(execution), min_split_macs)

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
        """Instruction-level emulation of this kernel (NotImplementedError if its family has no program)."""
        if self.isa is None:
            raise NotImplementedError(f"the isa emulator has no program for kernel {self.kai_name}")
        return self.isa(self, m, n, k, lhs, rhs)[0]


class PreparedMatmul:
    """One packed weight ready for MUL_MAT: ``prepared(x, threads)`` is :meth:`pack` (check the activations,
    quantize+pack them with the kernel's LHS packer) then :meth:`matmul` (the kernel, split over threads, clamped).
    Tracing and benchmarks time the two halves of this same path."""

    def __init__(
        self, kernel: MatmulKernel, n: int, k: int, rhs_packed: np.ndarray, execution: str, min_split_macs: int
    ) -> None:
        kernel.check_args(kernel.mr if kernel.kind == "gemm" else 1, n, k)
        self.kernel, self.n, self.k, self.execution, self.min_split_macs = kernel, n, k, execution, min_split_macs
        self.rhs = kernel._rhs_bytes(rhs_packed, n, k)
        self._impl = kernel._impl(execution)
        self._pack = None
        if kernel.lhs_packer is not None:
            g = kernel._geo()
            kernel.lhs_packer.check_args(1, k, g.mr, g.kr, g.sr, kernel.bl)
            self._pack = kernel.lhs_packer._impl(execution)

    def __call__(self, x: np.ndarray, threads: int = 1) -> np.ndarray:
        return self.matmul(self.pack(x, threads), x.shape[0], threads)

    def pack(self, x: np.ndarray, threads: int = 1) -> np.ndarray:
        """The activations [m, k] checked (float32, shape, finite) and quantized+packed as a flat buffer (the
        f32 kernel reads the rows themselves)."""
        kern, k = self.kernel, self.k
        check_threads(threads)
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != k:
            got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise DTypeError(f"{kern.name}: activations must be a float32 array [m, {k}], got {got}")
        m = x.shape[0]
        if kern.kind == "gemv" and m != 1:
            raise KernelShapeError(f"{kern.name}: GEMV kernel takes m == 1, got m={m}")
        packer = kern.lhs_packer
        if packer is None:
            check_finite(x, kern.name)
            return np.ascontiguousarray(x).reshape(-1)
        check_finite(x, packer.name)
        g = kern._geo()
        if threads > 1 and m > g.mr:
            lhs = packer.run(m, k, g.mr, g.kr, g.sr, x, bl=kern.bl, execution=self.execution, threads=threads)
            return lhs.view(np.ndarray)
        return self._pack(np.ascontiguousarray(x), g.mr, g.kr, g.sr, kern.bl, 0)

    def matmul(self, lhs: np.ndarray, m: int, threads: int = 1, n0: int = 0, n1: int | None = None) -> np.ndarray:
        """The kernel over a buffer :meth:`pack` made for m rows: [m, n] float32, ±inf clamped to ±FLT_MAX; with
        ``n0``, ``n1`` the columns [n0, n1) alone (n0 a multiple of the kernel's n_step)."""
        n1 = self.n if n1 is None else n1
        rhs = self.rhs[self.kernel.get_rhs_packed_offset(n0, self.k) :] if n0 else self.rhs
        out = self.kernel._compute(self._impl, m, n1 - n0, self.k, lhs, rhs, threads, self.min_split_macs)
        np.maximum(out, _LO, out=out)  # llama.cpp's clamp range [-FLT_MAX, FLT_MAX]: ±inf -> ±FLT_MAX
        return np.minimum(out, _HI, out=out)


_LO, _HI = np.float32(-FLT_MAX), np.float32(FLT_MAX)
