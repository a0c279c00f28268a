"""The Q8_0 NEON kernels as native aarch64 tiles (``kernels/qai8dxp_qsi8cxp/neon.py``).

On any host: each tile cross-compiles for DotProd and I8MM with the instruction it is written for, its block loop does a
block's multiply-adds with no more instructions than 1.25× KleidiAI's own block loop, and the layout probe takes exactly
the NEON kernels' layouts. Under QEMU (``scripts/qemu-aarch64``, on a DotProd-only CPU and on one with I8MM): every NEON
kernel of the family on the native tiles is bit for bit the numpy reference, and the family's tile chain
``ukernels.matmul_tiled`` the portable jit with either float epilogue (``native_tiles_check.py``).
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from emulator import NEON_GROUP, ensure_emulator, run_emulated
from kernel_helpers import mnemonics, portable_int8_lines

from kleidipy.core import native
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qai8dxp_qsi8cxp import neon
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam
from kleidipy.kernels.qai8dxp_qsi8cxp.vnni import HAVE_VNNI
from kleidipy.tools import asm
from kleidipy.tools.kernel_asm import kleidiai_counts

pytestmark = NEON_GROUP

CHECK = Path(__file__).resolve().parent / "native_tiles_check.py"
NEON_KERNELS = [k for k in fam.KERNELS if not k.is_sme]
#: the ISA whose instruction each NEON tier's kernel is written for
TIER_ISA = {"dotprod": "aarch64-dotprod", "i8mm": "aarch64-i8mm"}
#: how many instructions per 1,024 MACs a tile's block loop may take against KleidiAI's own kernel
MAX_RATIO = 1.25


def block_loops(text: str) -> list[asm.LoopCount]:
    """The innermost loops of a listing holding int8 dot instructions (a tile's block loops), in listing order."""
    lines = asm.parse(text)
    spans = [
        (first, last)
        for first, last in asm.loops(lines)
        if any(line.mnemonic in asm.DOT_MNEMONICS for line in lines[first : last + 1])
    ]
    out = []
    for first, last in spans:
        if any(o != (first, last) and first <= o[0] and o[1] <= last for o in spans):
            continue
        body = tuple(line for line in lines[first : last + 1] if line.mnemonic)
        macs = sum(asm.dot_macs(line, 512) for line in body)
        out.append(asm.LoopCount(body, collections.Counter(line.mnemonic for line in body), macs))
    return out


@pytest.mark.parametrize("isa", ["aarch64-dotprod", "aarch64-i8mm"])
@pytest.mark.parametrize(("mr", "kr"), neon.SHAPES, ids=str)
def test_tiles_cross_compile_to_their_instruction(isa: str, mr: int, kr: int) -> None:
    target = native.ISAS[isa]
    text = native.assembly(neon.tile_module(mr, kr, target), target)
    ops = mnemonics(text)
    used = neon.instruction(mr, kr, target)
    assert used == ("smmla" if (isa, mr, kr) == ("aarch64-i8mm", 4, 8) else "sdot")
    rows = neon.groups(mr, kr, target) * mr
    tiles = [rows] if rows == mr else [rows, mr]  # the 16-row tile, then the groups left over
    loops = block_loops(text)
    assert [loop.macs for loop in loops] == [r * neon.NR * neon.BLOCK for r in tiles]  # a block: rows × 4 × 32 K
    assert ops[used] == sum(loop.counts[used] for loop in loops) and ops[used] == sum(loop.dots for loop in loops)
    assert ops["scvtf"] == ops["fadd"] == sum(tiles)  # one conversion and one bias add per row of a tile
    portable = portable_int8_lines(text)  # only the zero-point correction: one vector MLA per row (as KleidiAI's)
    assert len(portable) == sum(tiles) and all(line.split()[0] == "mla" for line in portable)


@pytest.mark.parametrize("kern", NEON_KERNELS, ids=lambda k: k.name)
def test_hot_loops_within_kleidiai_budget(kern) -> None:  # noqa: ANN001
    """The tile of the kernel's own ISA: at most 1.25× the instructions per 1,024 int8 MACs of KleidiAI's block
    loop (counted from its sources); on a DotProd-only CPU the I8MM kernel's tile is sdot."""
    target = native.ISAS[TIER_ISA[kern.tier]]
    loop = asm.hot_loop(native.assembly(neon.kernel_tile(kern, target), target))
    kai = kleidiai_counts()["kernels"][kern.name]
    assert loop is not None and loop.macs == kai["macs_at_svl512"]  # the same tile: 16 or 1 rows × 4 columns × 32
    used = neon.instruction(kern.mr, kern.kr, target)
    assert loop.counts[used] == kai["counts"][used]
    assert loop.per_1024_macs() <= MAX_RATIO * kai["instructions"] * 1024 / kai["macs_at_svl512"]
    if kern.tier == "i8mm":
        dotprod = native.ISAS["aarch64-dotprod"]
        assert asm.hot_loop(native.assembly(neon.kernel_tile(kern, dotprod), dotprod)).counts["sdot"] > 0


def test_kernel_tiles_are_the_neon_kernels_on_arm() -> None:
    for kern in fam.KERNELS:
        for name, isa in native.ISAS.items():
            has = not kern.is_sme and isa.has("+dotprod") and name.startswith("aarch64")
            assert (neon.kernel_tile(kern, isa) is not None) == has, (kern.name, name)


def layout_args(name: str, k: int, svl: int | None = None) -> tuple:
    kern = get_kernel(name, svl)
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    k_int = fam.k_internal(k)
    return kern.mr, k_int, kern.kr // kern.sr, kern.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi


@pytest.mark.parametrize("k", [1, 32, 100])
def test_native_layouts_are_the_neon_kernels(k: int) -> None:
    """The probe takes the four NEON kernels' layouts (every k) and none of the SME ones or of the int4 family."""
    for kern in fam.KERNELS:
        assert neon.is_native_layout(*layout_args(kern.name, k, 512)) == (kern.tier in ("dotprod", "i8mm")), kern.name
    int4 = "matmul_clamp_f32_qai8dxp1x8_qsi4cxp4x8_1x4x32_neon_dotprod"
    assert not neon.is_native_layout(*layout_args(int4, k))
    gemm = "matmul_clamp_f32_qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod"
    mr, k_int, kbl, nr, blen, nibble, k_lo, k_hi = layout_args(gemm, k)
    assert not neon.is_native_layout(mr, k_int, 8, nr, blen, nibble, k_lo, k_hi)  # LHS chunks other than kr
    assert not neon.is_native_layout(mr, k_int, kbl, nr, blen, nibble, np.roll(k_lo, 1), k_hi)


def test_no_tiles_without_dotprod() -> None:
    """On this host (no Arm DotProd) nothing is installed and the family's tile chain takes the NEON layouts only
    with AVX-512 VNNI."""
    if neon.AVAILABLE:
        pytest.fail("this test runs on hosts without Arm DotProd (x86 CI)")
    assert native.host_isa(*native.ISAS) is None
    assert fam.is_tiled_layout(*layout_args("matmul_clamp_f32_qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod", 64)) == HAVE_VNNI


@pytest.mark.parametrize("cpu", ["cortex-a76", "max,sme=off"], ids=["dotprod", "i8mm"])
def test_tiles_bit_exact_under_qemu(cpu: str) -> None:
    ensure_emulator()
    code, out, err = run_emulated(cpu, str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = out.strip().splitlines()
    assert lines[0] == f"native tiles: {'aarch64-dotprod' if cpu == 'cortex-a76' else 'aarch64-i8mm'}"
    assert len(lines) == 6 and "DIFFERENT" not in out and "NOT NATIVE" not in out
    assert sum(line.endswith("smmla") for line in lines) == (0 if cpu == "cortex-a76" else 1)  # the I8MM GEMM
