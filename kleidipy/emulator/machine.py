"""The emulated machine (:class:`Machine`): register file and state as little-endian bytes, memory buffers
(:class:`Buffer`), counters and the trace log.

The layout of each register: docs/emulator.md."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

#: the trace stops growing after this many lines (the programs already trace only the first block of the
#: first tile; this bounds pathological shapes).
TRACE_LIMIT = 600


@dataclass
class Buffer:
    """A named, flat uint8 memory region the program reads or writes."""

    name: str
    data: np.ndarray

    def check(self, off: int, size: int) -> None:
        if off < 0 or off + size > self.data.size:
            raise IndexError(f"emulator: access [{off}, {off + size}) outside {self.name} ({self.data.size} bytes)")


class Machine:
    """Register state + counters of one emulated kernel call.

    ``svl_bits`` is the streaming vector length of an SME kernel, or None for a NEON kernel (the Z registers are
    then 128 bits, i.e. the V registers).
    """

    def __init__(self, svl_bits: int | None = None, trace: bool = False, record: bool = False) -> None:
        self.svl_bits = svl_bits
        self.vb = (svl_bits or 128) // 8
        self.z = np.zeros((32, self.vb), dtype=np.uint8)
        self.v = self.z[:, :16]
        self.p = np.zeros((16, self.vb), dtype=bool)
        self.pn = np.zeros((16, 4 * self.vb), dtype=bool)
        self.za = np.zeros((self.vb, self.vb), dtype=np.uint8)
        self.zt0 = np.zeros(64, dtype=np.uint8)
        self.counts: Counter[str] = Counter()
        self.bytes_loaded = 0
        self.bytes_stored = 0
        self.trace_wanted = trace
        self.tracing = False
        self.log: list[str] = []
        self._z_views: dict[str | type, np.ndarray] = {}
        self._v_views: dict[str | type, np.ndarray] = {}
        #: with ``record``: per trace line, the Z registers and ZA rows it changed ({number: bytes as hex})
        self.steps: list[dict[str, dict[int, str]]] | None = [] if record else None
        self._before = (self.z.copy(), self.za.copy())

    # --- register views ------------------------------------------------------------------------
    @property
    def vl(self) -> int:
        """32-bit lanes per Z register (SVL/32)."""
        return self.vb // 4

    def zv(self, reg: int, dtype: str | type) -> np.ndarray:
        """Z register ``reg`` viewed as lanes of ``dtype`` (writes go to the register)."""
        view = self._z_views.get(dtype)
        if view is None:
            view = self._z_views[dtype] = self.z.view(dtype)
        return view[reg]

    def vv(self, reg: int, dtype: str | type) -> np.ndarray:
        """NEON V register ``reg`` (128 bits) viewed as lanes of ``dtype``."""
        view = self._v_views.get(dtype)
        if view is None:
            view = self._v_views[dtype] = self.v.view(dtype)
        return view[reg]

    def za_s(self) -> np.ndarray:
        """The ZA array as int32 words [VB, VB/4] (a view)."""
        return self.za.view("<i4")

    def za_tile_s(self, tile: int, dtype: str = "<i4") -> np.ndarray:
        """ZA``tile``.S as a [VL, VL] view: its row i is ZA array row 4i + tile."""
        return self.za.view(dtype)[tile::4]

    def za_vgx4_rows(self, slice_index: int) -> list[int]:
        """The four ZA array rows of vector group VGx4 at slice ``slice_index`` (w + offset)."""
        quarter = self.vb // 4
        return [v * quarter + slice_index % quarter for v in range(4)]

    @staticmethod
    def element_mask(mask: np.ndarray, esize: int) -> np.ndarray:
        """Per-element activity of a byte-granular predicate mask."""
        return mask[::esize]

    # --- bookkeeping ---------------------------------------------------------------------------
    def retire(self, mnemonic: str, loaded: int = 0, stored: int = 0) -> None:
        self.counts[mnemonic] += 1
        self.bytes_loaded += loaded
        self.bytes_stored += stored

    def trace_when(self, condition: bool) -> None:
        """Trace the instructions that follow iff tracing was asked for and ``condition`` holds."""
        self.tracing = self.trace_wanted and condition

    def note(self, text: str) -> None:
        """Append a trace line (only while tracing, up to TRACE_LIMIT lines)."""
        if self.tracing and len(self.log) < TRACE_LIMIT:
            self.log.append(text)
            if self.steps is not None:
                self.steps.append({"z": self._changed(self.z, 0), "za": self._changed(self.za, 1)})

    def _changed(self, state: np.ndarray, which: int) -> dict[int, str]:
        """The rows of ``state`` (Z or ZA) changed since the last trace line, as hex bytes (and remembered)."""
        before = self._before[which]
        rows = np.flatnonzero((state != before).any(axis=1))
        before[rows] = state[rows]
        return {int(r): state[r].tobytes().hex() for r in rows}

    def section(self, text: str) -> None:
        """A heading line in the trace (loop boundaries)."""
        self.note(f"-- {text}")

    # --- memory --------------------------------------------------------------------------------
    def read(self, buf: Buffer, off: int, mask: np.ndarray) -> np.ndarray:
        """Bytes at buf[off : off + mask.size] where mask is set, 0 elsewhere (a zeroing predicated load)."""
        size = mask.size
        out = np.zeros(size, dtype=np.uint8)
        if mask.all():
            buf.check(off, size)
            out[:] = buf.data[off : off + size]
        elif mask.any():
            last = int(np.flatnonzero(mask)[-1]) + 1
            buf.check(off, last)
            out[:last] = np.where(mask[:last], buf.data[off : off + last], 0)
        return out

    def write(self, buf: Buffer, off: int, data: np.ndarray, mask: np.ndarray) -> int:
        """Store data bytes where mask is set; returns the number of bytes written."""
        if mask.all():
            buf.check(off, data.size)
            buf.data[off : off + data.size] = data
            return data.size
        if not mask.any():
            return 0
        last = int(np.flatnonzero(mask)[-1]) + 1
        buf.check(off, last)
        dst = buf.data[off : off + last]
        dst[mask[:last]] = data[:last][mask[:last]]
        return int(mask.sum())

    # --- report --------------------------------------------------------------------------------
    def instructions(self) -> int:
        return sum(self.counts.values())

    def counts_table(self) -> str:
        """The counters as an aligned table: mnemonic, count; then totals and bytes moved."""
        width = max([len(k) for k in self.counts] + [12])
        lines = [f"{'instruction':<{width}}  {'count':>10}"]
        for name, count in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"{name:<{width}}  {count:>10}")
        lines.append(f"{'total':<{width}}  {self.instructions():>10}")
        lines.append(f"bytes loaded: {self.bytes_loaded}, bytes stored: {self.bytes_stored}")
        return "\n".join(lines)


def fmt(values: np.ndarray, limit: int = 8) -> str:
    """A short rendering of register lanes: the first ``limit`` values, then the count."""
    flat = np.asarray(values).reshape(-1)
    if flat.dtype.kind == "f":
        items = [f"{float(x):.6g}" for x in flat[:limit]]
    elif flat.dtype == np.uint8:
        items = [f"{int(x):02x}" for x in flat[:limit]]
    else:
        items = [str(int(x)) for x in flat[:limit]]
    more = f", … ({flat.size})" if flat.size > limit else ""
    return "[" + ", ".join(items) + more + "]"


def addr(buf: Buffer, off: int) -> str:
    return f"[{buf.name}+{off:#x}]"
