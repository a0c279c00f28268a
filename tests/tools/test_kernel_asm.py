"""Issue 17: ``kleidipy kernels --asm`` — the hot loop of the machine code the jit runs for a kernel, per ISA, with
instruction counts per 1,024 int8 MACs beside KleidiAI's own kernel; the assembly reader under it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kleidipy.core.vnni import HAS_AVX512_VNNI
from kleidipy.kernels.catalogue import all_kernels, family_of
from kleidipy.tools import asm
from kleidipy.tools.kernel_asm import NoTileError, kleidiai_counts, listing

#: the int8 families and the instruction of each aarch64 ISA in their NEON kernels' hot loops
INT8_FAMILIES = ("qsi8d32p_qsi4c32p", "qai8dxp_qsi8cxp", "qsi8d32p_qai4c32p", "qai8dxp_qsi4cxp")
#: the aarch64 ISAs each tier's kernels run natively on (an I8MM kernel gets an sdot tile on a DotProd-only CPU,
#: an SME kernel runs on an SME2 CPU too) and the dot instructions their hot loops may use there
TIER_ISAS = {
    "dotprod": ("aarch64-dotprod",),
    "i8mm": ("aarch64-i8mm", "aarch64-dotprod"),
    "sme": ("aarch64-sme", "aarch64-sme2"),
    "sme2": ("aarch64-sme2",),
}
ISA_DOTS = {
    "aarch64-dotprod": {"sdot"},
    "aarch64-i8mm": {"smmla"},
    "aarch64-sme": {"smopa", "sdot"},
    "aarch64-sme2": {"smopa", "sdot"},
}
NEON = {"dotprod": ("aarch64-dotprod", "sdot"), "i8mm": ("aarch64-i8mm", "smmla")}
#: how many instructions per 1,024 MACs a native tile may take against KleidiAI's own kernel (issue 17)
MAX_RATIO = 1.25


def neon_kernels() -> list:
    return [k for k in all_kernels() if k.family in INT8_FAMILIES and k.tier in NEON and family_of(k).native]


KAI_SOURCE = """
KAI_ASM_LABEL(label_3)  // Block loop
    ldr d16, [x24, #0x0]
    fcvtl v23.4s, v16.4h
KAI_ASM_LABEL(label_4)  // Subblock loop
    ldr q30, [x24, #0x0]
    KAI_ASM_INST(0x4e9a96bc)  // sdot v28.4s, v21.16b, v26.16b
    KAI_ASM_INST(0x4e9a969b)  // sdot v27.4s, v20.16b, v26.16b
    subs x6, x6, #0x1
    bgt label_4
    fmla v0.4s, v28.4s, v23.4s
    subs x20, x20, #0x1
    bgt label_3
"""

C_INLINE = r"""
    __asm__ volatile(
        " 4: // .LOOP_BL_START%=: \n"
        " .inst 0xa0840100 // smopa za0.s, p0/m, p0/m, z8.b, z4.b \n"
        " subs x11, x11, #4 \n"
        " b.gt 4b // .LOOP_BL_START%= \n"
    );
"""


def test_reads_kleidiai_sources_and_counts_the_block_loop() -> None:
    loop = asm.hot_loop(KAI_SOURCE)
    assert loop is not None
    assert loop.instructions == 10 and loop.counts["sdot"] == 2 and loop.macs == 32  # nested loop counted once
    assert loop.per_1024_macs() == 10 * 32
    inline = asm.hot_loop(C_INLINE, svl_bits=512)  # GNU local labels, .inst with the mnemonic in the comment
    assert inline is not None and inline.counts["smopa"] == 1 and inline.macs == 16 * 16 * 4
    assert asm.hot_loop(C_INLINE, svl_bits=128).macs == 4 * 4 * 4


def test_llvm_listing_and_dot_widths() -> None:
    text = "f:\n.LBB0_1:\n\tvpdpbusd\t%zmm1, %zmm2, %zmm0\n\tvfmadd231ps\t%zmm0, %zmm3, %zmm4\n\tjne\t.LBB0_1\n\tretq\n"
    loop = asm.hot_loop(text)
    assert loop is not None and loop.instructions == 3 and loop.macs == 64
    assert asm.dot_macs(asm.Line("", mnemonic="smmla", operands="v0.4s, v1.16b, v2.16b"), 512) == 32
    assert asm.dot_macs(asm.Line("", mnemonic="sdot", operands="za.s[w8, 0, VGx4], {z0.b-z3.b}, z8.b"), 256) == 128
    assert asm.hot_loop("f:\n\tret\n") is None


def test_an_x86_reduction_loop_is_not_the_hot_loop() -> None:
    """A loop whose vpdpbusd all accumulate into one register (the LHS's block sums, more dots than a tile's loop)
    is passed over for the tile's loop, which accumulates into several; alone, it is still found."""
    reduction = "".join(f"\tvpdpbusd\t{8 * i}(%rax), %zmm24, %zmm1\n" for i in range(4))
    tile = "\tvpdpbusd\t(%rdx), %zmm24, %zmm2\n\tvpdpbusd\t64(%rdx), %zmm24, %zmm3\n"
    text = f"f:\n.LBB0_1:\n{reduction}\tjne\t.LBB0_1\n.LBB0_2:\n{tile}\tjne\t.LBB0_2\n\tretq\n"
    loop = asm.hot_loop(text, block_loops=False)
    assert loop is not None and loop.macs == 2 * 64 and loop.instructions == 3
    alone = asm.hot_loop(f"f:\n.LBB0_1:\n{reduction}\tjne\t.LBB0_1\n\tretq\n", block_loops=False)
    assert alone is not None and alone.macs == 4 * 64


def test_kleidiai_counts_cover_the_int8_neon_kernels() -> None:
    counts = kleidiai_counts()
    assert len(counts["kleidiai_commit"]) == 40
    for kern in all_kernels():
        if kern.family in INT8_FAMILIES and kern.tier in ("dotprod", "i8mm", "sme2"):
            assert kern.name in counts["kernels"], kern.name


@pytest.mark.parametrize("kern", neon_kernels(), ids=lambda k: k.name)
def test_native_tiles_use_their_instruction_within_budget(kern) -> None:  # noqa: ANN001
    """Cross-compiled on this host: the kernel's own ISA puts its dot instruction in the hot loop, at most 1.25x the
    instructions per 1,024 MACs of KleidiAI's kernel; a DotProd-only CPU still gets sdot for the I8MM kernels."""
    isa, instruction = NEON[kern.tier]
    found = listing(kern, isa)
    assert found.loop.counts[instruction] > 0 and found.kleidiai is not None
    kai = found.kleidiai["instructions"] * 1024 / found.kleidiai["macs_at_svl512"]
    assert found.loop.per_1024_macs() <= MAX_RATIO * kai, (found.loop.per_1024_macs(), kai)
    if kern.tier == "i8mm":
        assert listing(kern, "aarch64-dotprod").loop.counts["sdot"] > 0


def int8_kernels() -> list:
    return [k for k in all_kernels() if k.family in INT8_FAMILIES]


@pytest.mark.parametrize("kern", int8_kernels(), ids=lambda k: k.name)
def test_every_int8_kernel_is_native_on_each_of_its_isas(kern) -> None:  # noqa: ANN001
    """Issue 17: every int8 kernel's hot loop holds its dot instruction on each aarch64 ISA that runs its tier
    (cross-compiled here); on an SME1-only ISA no SME2 instruction (luti4, ZT0, multi-vector forms) appears."""
    for isa in TIER_ISAS[kern.tier]:
        found = listing(kern, isa)
        used = set(found.loop.counts) & asm.DOT_MNEMONICS
        assert used and used <= ISA_DOTS[isa] | ({"sdot"} if kern.tier == "i8mm" else set()), (isa, used)
        if isa == "aarch64-sme":
            text = " ".join(f"{line.mnemonic} {line.operands}" for line in found.loop.lines)
            assert "luti4" not in text and "zt0" not in text and "vgx" not in text.lower(), isa


@pytest.mark.parametrize(("suffix", "needed"), [("sme2_mopa", {"smopa", "luti4"}), ("sme2_sdot", {"sdot", "luti4"})])
def test_sme2_tiles_use_smopa_luti4_and_za_dot(suffix: str, needed: set) -> None:
    kern = next(k for k in all_kernels() if k.family == "qsi8d32p_qsi4c32p" and k.name.endswith(suffix))
    found = listing(kern, "aarch64-sme2")
    assert needed <= set(found.loop.counts), found.loop.counts
    if suffix == "sme2_sdot":  # the multi-vector dot into ZA vector groups
        assert any(line.mnemonic == "sdot" and "za.s" in line.operands for line in found.loop.lines)


def test_no_tile_is_a_clear_error() -> None:
    bf16 = next(k for k in all_kernels() if k.family == "bf16p_bf16p")
    with pytest.raises(NoTileError, match="no native aarch64-dotprod tile"):
        listing(bf16, "aarch64-dotprod")
    with pytest.raises(NoTileError, match="unknown ISA"):
        listing(bf16, "riscv")


def kleidipy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kleidipy", *args], capture_output=True, text=True, timeout=600)


def test_cli_shows_the_hot_loop_and_says_no_clearly() -> None:
    proc = kleidipy(
        "kernels", "--asm", "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", "--isa", "aarch64-i8mm"
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "smmla" in proc.stdout and "per 1,024 MACs" in proc.stdout and "KleidiAI's kernel (kai/ukernels" in proc.stdout
    )
    bad = kleidipy("kernels", "--isa", "aarch64-i8mm")
    assert bad.returncode != 0 and "kleidipy: error: --isa goes with --asm NAME" in bad.stderr
    bf16 = next(k for k in all_kernels() if k.family == "bf16p_bf16p")
    none = kleidipy("kernels", "--asm", bf16.name, "--isa", "aarch64-i8mm")
    assert none.returncode != 0 and "Traceback" not in none.stderr and "no native aarch64-i8mm tile" in none.stderr


@pytest.mark.parametrize("family", INT8_FAMILIES)
def test_x86_vnni_hot_loops_use_vpdpbusd(family: str) -> None:
    """On this host (x86 with AVX-512 VNNI, as CI): each layout of each int8 family (every tier: SME2, SME, I8MM,
    DotProd) runs vpdpbusd in its hot loop."""
    if not HAS_AVX512_VNNI:
        pytest.fail("the x86-vnni listing needs an x86 host with AVX-512 VNNI (this project's CI machine has it)")
    seen = set()
    for kern in all_kernels():
        layout = (kern.family, kern.rhs_packer.name, kern.kind)
        if kern.family != family or layout in seen:
            continue
        seen.add(layout)
        proc = kleidipy("kernels", "--asm", kern.name, "--isa", "x86-vnni")
        assert proc.returncode == 0, proc.stderr
        assert "vpdpbusd" in proc.stdout.split("hot loop:")[1], kern.name


def test_portable_code_counts_integer_multiplies() -> None:
    """Portable code has no dot instruction: its hot loop is the loop of integer multiplies, counted per lane."""
    x86 = "f:\n.LBB0_1:\n\tvpmaddwd\t%zmm1, %zmm2, %zmm0\n\tvpaddd\t%zmm0, %zmm3, %zmm3\n\tjne\t.LBB0_1\n\tretq\n"
    loop = asm.hot_loop(x86, portable=True)
    assert loop is not None and loop.macs == 32 and loop.multiplies == 1 and loop.dots == 0
    assert asm.hot_loop(x86) is None  # no dot instruction
    arm = "f:\n.LBB0_1:\n\tsmull\tv0.8h, v1.8b, v2.8b\n\tsmlal2\tv3.4s, v4.8h, v5.8h\n\tb.ne\t.LBB0_1\n"
    assert asm.hot_loop(arm, portable=True).macs == 8 + 4
    assert asm.mul_macs(asm.Line("", mnemonic="pmuludq", operands="%xmm0, %xmm4")) == 2
    assert asm.mul_macs(asm.Line("", mnemonic="imulq", operands="%rax, %rbx")) == 1


@pytest.mark.parametrize("tier", ["dotprod", "sme2"])
def test_portable_listing_is_the_generic_cpus_code(tier: str) -> None:
    """``--isa portable``: numba's code for a generic CPU of this host's architecture (no VNNI, no native tile)
    — integer multiplies, no dot instruction, and many more instructions per 1,024 MACs than KleidiAI's kernel."""
    kern = next(k for k in all_kernels() if k.family == "qsi8d32p_qsi4c32p" and k.tier == tier and k.kind == "gemv")
    found = listing(kern, "portable")
    assert found.loop.dots == 0 and found.loop.multiplies > 0, found.loop.counts
    assert not set(found.loop.counts) & asm.DOT_MNEMONICS
    kai = found.kleidiai["instructions"] * 1024 / found.kleidiai["macs_at_svl512"]
    assert found.loop.per_1024_macs() > 2 * kai
    assert "generic" in found.how
