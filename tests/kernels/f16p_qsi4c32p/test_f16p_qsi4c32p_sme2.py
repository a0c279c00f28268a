"""The F16-LHS Q4_0 SME2 kernel as a native SME2 tile (``kernels/f16p_qsi4c32p/sme2.py``).

On any host: the tile cross-compiles to KleidiAI's instruction sequence — ``luti4`` of the codes to F16, the F16
``fmul`` by the block's scales and the widening ``fmopa`` into ZA in its hot loop — within a quarter of KleidiAI's
instructions per MAC. Under QEMU: ``../test_sme2_tiles_under_qemu.py``.
"""

from __future__ import annotations

from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.f16p_qsi4c32p import sme2
from kleidipy.tools.kernel_asm import listing

KERNEL = "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"


def test_hot_loop_is_luti4_fmul_and_widening_fmopa_as_kleidiai() -> None:
    found = listing(get_kernel(KERNEL, 512), "aarch64-sme2")
    counts, kai = found.loop.counts, found.kleidiai
    assert kai is not None and {"fmopa", "luti4", "fmul", "ld2b"} <= set(counts) & set(kai["counts"])
    # per K quad, as KleidiAI's: 2 luti4, 8 fmul (F16, by the zipped scales), 8 widening fmopa into ZA0.S-ZA3.S
    quads = counts["ld2b"]
    assert (counts["luti4"], counts["fmul"], counts["fmopa"]) == (2 * quads, 8 * quads, 8 * quads)
    assert all(".h" in line.operands for line in found.loop.lines if line.mnemonic in ("fmul", "fmopa"))
    kai_per = kai["instructions"] * 1024 / kai["macs_at_svl512"]
    assert found.loop.per_1024_macs() <= 1.25 * kai_per, (found.loop.per_1024_macs(), kai_per)


def test_no_tile_without_sme2() -> None:
    assert not sme2.AVAILABLE or sme2.HOST_ISA.name == "aarch64-sme2"
