"""The BF16 kernels as native aarch64 tiles (``kernels/bf16p_bf16p/native.py``).

On any host: the tiles cross-compile to KleidiAI's instructions in their hot loops (``bfmopa`` into ZA0.S–ZA3.S,
with SME2's multi-vector ``ld1h`` where the ISA has it; ``bfmmla``; ``bfdot`` with the LHS broadcast), each loop
within KleidiAI's instruction count (+15 %) per K step; without the tiles, ``matmul_bf16_native`` is
``jit.matmul_bf16`` bit for bit. Under QEMU (``scripts/qemu-aarch64``: SME2 at SVL 256, and BF16 NEON without
SME): every kernel of the family through ``matmul_bf16_native`` is bit for bit the numpy reference, on the tiles
where they apply (``native_tiles_check.py``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from emulator import NEON_GROUP, ensure_emulator, run_emulated

from kleidipy.core import native
from kleidipy.kernels.bf16p_bf16p import jit, ukernels
from kleidipy.kernels.bf16p_bf16p import native as tiles
from kleidipy.tools import asm

pytestmark = NEON_GROUP

CHECK = Path(__file__).resolve().parent / "native_tiles_check.py"
#: (tile, ISA) -> (the instruction, its count per K step, KleidiAI's loop instructions per K step): K steps of 4
#: pairs (MOPA: KleidiAI's loop of 16 ``bfmopa``; SME2 4 ``ld1h`` of 4 vectors, SME1 16 ``ld1h``, 2 ``addvl``,
#: ``subs``, ``bgt``) or one chunk of 4 K values (MMLA: 78 instructions per 2 chunks, 5 of them ``prfm``; DOT at
#: 36 columns: 49, 5 of them ``prfm``), counted in its sources
LOOPS = {
    (tiles.MOPA, "aarch64-sme2"): ("bfmopa", 16, 24),
    (tiles.MOPA, "aarch64-sme"): ("bfmopa", 16, 36),
    (tiles.MMLA, "aarch64-bf16"): ("bfmmla", 24, 39),
    (tiles.DOT, "aarch64-bf16"): ("bfdot", 18, 49),
}


def hot_loop(symbol: str, isa: str) -> Counter:
    """Instructions per mnemonic of the tile's innermost loop with the most of its BF16 instruction."""
    target = native.ISAS[isa]
    lines = asm.parse(native.assembly(tiles.tile_module(symbol, target), target))
    op = LOOPS[symbol, isa][0]
    spans = [(a, b) for a, b in asm.loops(lines) if any(line.mnemonic == op for line in lines[a : b + 1])]
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    counts = [Counter(line.mnemonic for line in lines[a : b + 1] if line.mnemonic) for a, b in inner]
    return max(counts, key=lambda c: c[op])


@pytest.mark.parametrize(("symbol", "isa"), list(LOOPS), ids=lambda x: str(x))
def test_hot_loop_is_kleidiais(symbol: str, isa: str) -> None:
    op, per_step, kleidiai = LOOPS[symbol, isa]
    counts = hot_loop(symbol, isa)
    assert counts[op] == per_step
    assert sum(counts.values()) <= 1.15 * kleidiai
    assert not counts["fmla"] and not counts["fmul"] and not counts["fadd"]  # no portable float code
    if symbol == tiles.MOPA:  # 2 LHS and 2 RHS vectors per pair: one ld1h of 4 vectors each on SME2
        assert counts["ld1h"] == (4 if isa == "aarch64-sme2" else 0)
    if symbol == tiles.DOT:
        assert counts["ld1r"] == 1  # the 4 LHS values, broadcast


def test_mopa_tile_streaming_and_bias_rows() -> None:
    for isa in ("aarch64-sme2", "aarch64-sme"):
        target = native.ISAS[isa]
        lines = asm.parse(native.assembly(tiles.tile_module(tiles.MOPA, target), target))
        ops = Counter(line.mnemonic for line in lines if line.mnemonic)
        assert ops["smstart"] == ops["smstop"] == 2  # sm and za: the entry point enables both
        assert not [line for line in lines if line.mnemonic == "bl" and line.operands.startswith("__arm_")]
        assert not ops["fmopa"]  # the bias enters ZA as rows (mova), not by FMOPA
        to_za = [line for line in lines if line.mnemonic == "mov" and line.operands.startswith("za")]
        assert len(to_za) == 4 and all(line.operands.startswith(f"za{t}h.s") for t, line in enumerate(to_za))


def test_kernel_tiles_per_isa() -> None:
    from kleidipy.kernels.catalogue import all_kernels

    kernels = {k.name: k for k in all_kernels() if k.family == "bf16p_bf16p"}
    for symbol, names in tiles.KERNELS.items():
        for name in names:
            for isa in native.ISAS.values():
                tile = tiles.kernel_tile(kernels[name], isa)
                assert (tile is not None) == (isa.name in tiles.TILE_ISAS[symbol])


def test_without_tiles_it_is_the_jit() -> None:
    """On this host (no Arm BF16/SME: x86 CI) nothing is installed and ``matmul_bf16_native`` is
    ``jit.matmul_bf16``, bit for bit."""
    if tiles.SME_ISA or tiles.NEON_ISA:
        pytest.fail("this test runs on hosts without Arm BF16 and SME (x86 CI)")
    rng = np.random.default_rng(0)
    for mr, nr, kr, two, m in ((16, 16, 2, False, 19), (8, 12, 4, False, 9), (1, 12, 4, True, 1)):
        n, k = 29, 13
        lhs = ukernels.pack_lhs_reference(rng.standard_normal((m, k)).astype(np.float32), mr, kr, mr == 8)
        rhs = ukernels.pack_rhs_reference(
            rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32), nr, kr
        )
        want = jit.matmul_bf16(m, n, k, lhs, rhs, mr, nr, kr, two)
        got = tiles.matmul_bf16_native(m, n, k, lhs, rhs, mr, nr, kr, two)
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("cpu", ["max,sme-default-vector-length=32", "max,sme=off"], ids=["sme2", "bf16"])
def test_tiles_bit_exact_under_qemu(cpu: str) -> None:
    ensure_emulator()
    code, out, err = run_emulated(cpu, str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = out.strip().splitlines()
    sme = cpu != "max,sme=off"
    assert (
        lines[0]
        == f"native tiles: SME {'aarch64-sme2' if sme else 'none'}, NEON aarch64-bf16, SVL {256 if sme else 512}"
    )
    assert len(lines) == 6 and "DIFFERENT" not in out
    calls = [int(line.split(", ")[1].split()[0]) for line in lines[1:]]
    shapes = [int(line.split(": ")[1].split()[0]) for line in lines[1:]]
    assert calls == [shapes[0] * sme, shapes[1] * sme, shapes[2], shapes[3], 0]  # the last: SME2 at another SVL
