"""The int4 per-channel NEON kernels as native aarch64 tiles (``kernels/qai8dxp_qsi4cxp/neon.py``).

On any host: each tile cross-compiles for DotProd and I8MM with the instruction it is written for (the nibble split
``shl``/``and`` in its block loop), its block loop does a block's multiply-adds with no more instructions than 1.25×
KleidiAI's own block loop, the layout probe takes exactly the NEON kernels' layouts and :func:`neon.tiles` leaves the
others to the rest of the family's tile chain. Under QEMU (``scripts/qemu-aarch64``, on a DotProd-only CPU and on one
with I8MM): every NEON kernel of the family on the native tiles is bit for bit the numpy reference
(``native_tiles_check.py``).
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
from kleidipy.kernels.qai8dxp_qsi4cxp import neon
from kleidipy.kernels.qai8dxp_qsi4cxp import ukernels as fam
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as core
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
@pytest.mark.parametrize(("mr", "m_step"), neon.SHAPES, ids=str)
def test_tiles_cross_compile_to_their_instruction(isa: str, mr: int, m_step: int) -> None:
    target = native.ISAS[isa]
    text = native.assembly(neon.tile_module(mr, m_step, target), target)
    ops = mnemonics(text)
    used = neon.instruction(mr, target)
    assert used == ("smmla" if (isa, mr) == ("aarch64-i8mm", 4) else "sdot")
    rows = neon.groups(mr, m_step, target) * mr
    assert rows == (m_step if used == "smmla" else mr)
    tiles = [rows] if rows == mr else [rows, mr]  # the 8-row tile, then the group left over
    loops = block_loops(text)
    assert [loop.macs for loop in loops] == [r * neon.NR * neon.BLOCK for r in tiles]  # a block: rows × 4 × 32 K
    assert ops[used] == sum(loop.counts[used] for loop in loops) and ops[used] == sum(loop.dots for loop in loops)
    assert all(loop.counts["shl"] == loop.counts["and"] == 4 for loop in loops)  # the 64 RHS bytes split once
    assert ops["scvtf"] == ops["fadd"] == sum(tiles)  # one conversion and one bias add per row of a tile
    portable = portable_int8_lines(text)  # only the zero-point correction: one vector MLA per row (as KleidiAI's)
    assert len(portable) == sum(tiles) and all(line.split()[0] == "mla" for line in portable)


@pytest.mark.parametrize("kern", NEON_KERNELS, ids=lambda k: k.name)
def test_hot_loops_within_kleidiai_budget(kern) -> None:  # noqa: ANN001
    """The tile of the kernel's own ISA: at most 1.25× the instructions per 1,024 int8 MACs of KleidiAI's block
    loop (counted from its sources); on a DotProd-only CPU the I8MM kernels' tiles are sdot."""
    target = native.ISAS[TIER_ISA[kern.tier]]
    loop = asm.hot_loop(native.assembly(neon.kernel_tile(kern, target), target))
    kai = kleidiai_counts()["kernels"][kern.name]
    assert loop is not None and loop.macs == kai["macs_at_svl512"]  # the same tile: 1, 4 or 8 rows × 4 columns × 32
    used = neon.instruction(kern.mr, target)
    assert loop.counts[used] == kai["counts"][used]
    assert loop.counts["shl"] == kai["counts"]["shl"] and loop.counts["and"] == kai["counts"]["and"]
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
    k_int = core.k_internal(k)
    return kern.mr, k_int, kern.kr // kern.sr, kern.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi


@pytest.mark.parametrize("k", [1, 32, 100])
def test_native_layouts_are_the_neon_kernels(k: int) -> None:
    """The probe takes the three NEON kernels' layouts (every k) and none of the SME ones or of the Q8_0 family."""
    for kern in fam.KERNELS + core.KERNELS:
        native_layout = kern.family == fam.FAMILY_NAME and not kern.is_sme
        assert neon.is_native_layout(*layout_args(kern.name, k, 512)) == native_layout, kern.name
    gemm = "matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm"
    mr, k_int, kbl, nr, blen, nibble, k_lo, k_hi = layout_args(gemm, k)
    assert not neon.is_native_layout(mr, k_int, 4, nr, blen, nibble, k_lo, k_hi)  # LHS chunks other than 8
    assert not neon.is_native_layout(mr, k_int, kbl, nr, blen, 1, k_lo, k_hi)  # nibbles of weight 1
    assert not neon.is_native_layout(mr, k_int, kbl, nr, blen, nibble, np.roll(k_lo, 1), k_hi)
    assert not neon.is_native_layout(mr, k_int, kbl, nr, blen, nibble, k_lo, k_lo)


def test_no_tiles_without_dotprod() -> None:
    """On this host (no Arm DotProd) nothing is installed (the family's tile chain has no NEON link)."""
    if neon.AVAILABLE:
        pytest.fail("this test runs on hosts without Arm DotProd (x86 CI)")
    assert native.host_isa(*native.ISAS) is None


@pytest.mark.parametrize(
    "name",
    [
        "matmul_clamp_f32_qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot",
        "matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm",
    ],
)
def test_other_layouts_go_to_the_fallback(name: str) -> None:
    """Layouts the tiles do not have (an SME2 one, a Q8_0 one) are left to the chain's next link (here the portable
    loop), on any host."""
    kern = get_kernel(name, 512)
    m, n, k = (1 if kern.kind == "gemv" else 5), 9, 70
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, k)).astype(np.float32)
    if kern.rhs_packer.rhs_dtype == np.uint8:
        w = rng.integers(0, 256, (n, -(-k // 2)), dtype=np.uint8)
    else:
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = rng.random(n).astype(np.float32)
    lhs = np.asarray(core.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="reference"))
    rhs = np.asarray(kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale, execution="reference"))
    mr, k_int, kbl, nr, blen, nibble, k_lo, k_hi = layout_args(name, k, 512)
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    out = np.empty((m, n), np.float32)
    rhs_u8 = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    views = (lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs_u8)
    matmul_qai8dxp = jit.with_tiles((neon.tiles,), jit.matmul_qai8dxp)
    matmul_qai8dxp(m, n, k_int, *views, mr, kbl, nr, blen, nibble, k_lo, k_hi, int(kern.recipe), out)
    want = kern.run(m, n, k, lhs, rhs, execution="reference")
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("cpu", ["cortex-a76", "max,sme=off"], ids=["dotprod", "i8mm"])
def test_tiles_bit_exact_under_qemu(cpu: str) -> None:
    ensure_emulator()
    code, out, err = run_emulated(cpu, str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = out.strip().splitlines()
    assert lines[0] == f"native tiles: {'aarch64-dotprod' if cpu == 'cortex-a76' else 'aarch64-i8mm'}"
    assert len(lines) == 5 and "DIFFERENT" not in out and "NOT NATIVE" not in out
    assert sum(line.endswith("smmla") for line in lines) == (0 if cpu == "cortex-a76" else 2)  # the I8MM kernels
