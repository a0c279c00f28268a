"""The packer interface shared by every KleidiAI family: KleidiAI's size/offset functions and the checks.

A family subclasses :class:`LhsPacker` / :class:`RhsPacker`, implementing one ``_reference`` and one ``_jit``
method; this module owns KleidiAI's size and offset getters, argument validation (GET_ROWS arguments included),
the row split of an LHS pack over threads and the provenance of the packed buffer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kleidipy.core.buffers import (
    PackedBuffer,
    PackedLayout,
    as_f32_rows,
    as_u8,
    check_execution,
    check_finite,
    check_threads,
    roundup,
)
from kleidipy.core.threads import parallel_map
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError, PackedLayoutMismatchError


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
        check_threads(threads)
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
        elif m:  # no rows: the buffer is only the zero padding of a started group
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
        for what, arr in (("rhs", rhs), ("scale", scale), ("zero", zero), ("bias", bias)):
            if arr is not None:
                check_finite(np.asarray(arr), self.name, what)
        impl = self._impl(execution)
        packed = impl(n, k, nr, kr, sr, bl, rhs, scale=scale, zero=zero, bias=bias)
        expected = self.get_rhs_packed_size(n, k, nr, kr, sr, bl)
        assert packed.size == expected, (self.name, packed.size, expected)
        return PackedBuffer(packed, PackedLayout(self.name, n, k, nr, kr, sr, bl))

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        raise NotImplementedError

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
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
