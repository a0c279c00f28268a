"""The instruction-level emulator (``execution="isa"``): golden runs, hand-counted instructions, the trace,
random shapes against the jit execution, and bad input."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal

from kleidipy.errors import KernelShapeError, UnknownKernelError
from kleidipy.kernels.catalogue import all_kernels, families, get_kernel
from kleidipy.tools.emulate import emulate_report, random_operands, uncovered_kernels
from kleidipy.tools.golden import verify

SEED_MOPA = "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
SEED_SDOT = "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot"


def test_every_catalogue_kernel_has_a_program():
    assert uncovered_kernels() == []
    programs = {name for fam in families() for name in fam.programs}
    assert programs == {kern.name for kern in all_kernels()}


def test_golden_set_passes_under_isa(golden_dir):
    results, _ = verify(golden_dir, ["isa"])
    assert results, "no golden run was verified"
    failures = [r.line() for r in results if not r.ok]
    assert not failures, "\n".join(failures[:20])


def _run(name: str, m: int, n: int, k: int, svl: int | None = None, trace: bool = False):
    kern = get_kernel(name, svl)
    lhs, rhs = random_operands(kern, m, n, k, seed=0)
    dst, machine = kern.isa(kern, m, n, k, lhs, rhs, trace=trace)
    return kern, lhs, rhs, dst, machine


def test_seed_example_mopa_counts_by_hand():
    # m, n, k = 16, 64, 64 at SVL 512: VL = 16, one 16x64 tile, 2 blocks of 32, 8 K-steps of 4 per block.
    kern, lhs, rhs, dst, mach = _run(SEED_MOPA, 16, 64, 64, 512)
    n_blocks, m_blocks, k_steps, rows, nb = 1, 1, 64 // 4, 16, 2
    c = mach.counts
    assert c["SMOPA"] == n_blocks * m_blocks * k_steps * 4 == 64  # one per ZA.S tile per K-step
    assert c["LUTI4"] == k_steps * 2 == 32  # two 2-register expansions per K-step
    assert c["LD1H"] == k_steps == 16  # LHS: VL rows x 4 int8 per K-step
    # RHS data per K-step + RHS scales per block + dst reloads (every row of every block after the first)
    assert c["LD1W"] == k_steps + nb + rows * (nb - 1) == 34
    assert c["LD1B"] == nb == 2  # LHS fp16 scales per block
    assert c["ZERO"] == nb and c["ZIP"] == nb
    assert c["MOVA"] == c["SCVTF"] == rows * nb == 32  # one 4-register MOVA / SCVTF per row per block
    assert c["FMLALB"] == c["FMLALT"] == 2 * rows * nb == 64
    assert c["FMUL"] == 4 * rows == 64  # first block: FMUL
    assert c["FMLA"] == 4 * rows * (nb - 1) == 64  # later blocks: reload + FMLA
    assert c["ST1W"] == rows * nb == 32
    svl_bytes = 64
    loaded = k_steps * 3 * svl_bytes + nb * (2 * svl_bytes + 2 * 16) + 64 + rows * (nb - 1) * 4 * svl_bytes
    assert mach.bytes_loaded == loaded == 7552
    assert mach.bytes_stored == rows * nb * 4 * svl_bytes == 8192
    assert bits_equal(dst, kern.run(16, 64, 64, lhs, rhs, execution="jit"))


def test_seed_example_sdot_counts_by_hand():
    # GEMV 1x64x64 at SVL 512: per block two 16-K halves, each 2 x (LD1H x4 regs, 4 LUTI4, 2 SDOT).
    _, _, _, _, mach = _run(SEED_SDOT, 1, 64, 64, 512)
    c = mach.counts
    assert c["SDOT"] == 2 * 2 * 2 * 2 == 16
    assert c["LUTI4"] == 2 * 2 * 2 * 4 == 32
    assert c["LD1RQB"] == 4
    assert c["LD1H"] == 2 * (4 + 1)  # per block 4 data loads + 1 scale load
    assert c["MOVA"] == c["SCVTF"] == 2 and c["FMLA"] == 8 and c["ST1W"] == 1


def test_trace_shows_the_first_block_of_the_first_tile():
    report = emulate_report(SEED_MOPA, 16, 64, 64, 512, trace=True)
    assert "bit-exact with the jit execution: yes" in report
    assert "SMOPA ZA0.S" in report and "ZA3.S" in report and "LUTI4" in report
    assert "row 0 of ZA0.S..ZA3.S" in report
    assert "K block 1" not in report  # only the first block is traced
    lines = report.splitlines()
    assert len(lines) < 400
    plain = emulate_report(SEED_MOPA, 16, 64, 64, 512, trace=False)
    assert "SMOPA ZA0.S" not in plain and "SMOPA" in plain


@pytest.mark.parametrize("svl", [128, 2048])
def test_report_other_svl(svl):
    assert "bit-exact with the jit execution: yes" in emulate_report(SEED_MOPA, 5, 70, 96, svl, trace=False)


#: one kernel per program (and per SME tier), run on random shapes with tails at random SVLs.
_PROPERTY_KERNELS = sorted({prog.__qualname__ + kern.tier: kern.name for kern in all_kernels()
                            for prog in [kern.isa.program]}.values())  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(_PROPERTY_KERNELS),
    m=st.integers(1, 19),
    n=st.integers(1, 70),
    blocks=st.integers(1, 3),
    svl=st.sampled_from([128, 256, 512, 1024]),
    seed=st.integers(0, 1000),
)
def test_isa_equals_jit_on_random_shapes(name, m, n, blocks, svl, seed):
    kern = get_kernel(name, svl)
    if kern.kind == "gemv":
        m = 1
    k = 32 * blocks
    lhs, rhs = random_operands(kern, m, n, k, seed)
    ours = kern.run(m, n, k, lhs, rhs, execution="isa")
    jit = kern.run(m, n, k, lhs, rhs, execution="jit")
    assert bits_equal(ours, jit)


def test_isa_honours_clamp_and_threads():
    """With a clamp the isa output is the unclamped one clipped (and some values are clipped); with 2 threads
    the same bits; both as the jit execution gives them."""
    kern = get_kernel(SEED_MOPA, 256)
    m, n, k = 9, 50, 64
    lhs, rhs = random_operands(kern, m, n, k, seed=3)
    free = kern.run(m, n, k, lhs, rhs, execution="isa")
    clamp = {"clamp_min": -0.5, "clamp_max": 0.25}
    clamped = kern.run(m, n, k, lhs, rhs, execution="isa", **clamp)
    assert bits_equal(clamped, np.clip(free, np.float32(-0.5), np.float32(0.25))) and not bits_equal(clamped, free)
    for kw in (clamp, {"threads": 2, "min_split_macs": 0}):
        ours = kern.run(m, n, k, lhs, rhs, execution="isa", **kw)
        jit = kern.run(m, n, k, lhs, rhs, execution="jit", **kw)
        assert bits_equal(ours, jit)


def test_unknown_kernel_is_typed_error():
    with pytest.raises(UnknownKernelError):
        emulate_report("matmul_clamp_f32_no_such_kernel", 1, 4, 32, 512, trace=False)


@pytest.mark.parametrize("svl", [384, 100, 4096])
def test_bad_svl_is_shape_error(svl):
    with pytest.raises(KernelShapeError):
        emulate_report(SEED_MOPA, 16, 64, 64, svl, trace=False)


def test_bad_shape_is_shape_error():
    with pytest.raises(KernelShapeError):
        emulate_report(SEED_MOPA, 16, 64, 40, 512, trace=False)
    with pytest.raises(KernelShapeError):
        emulate_report(SEED_SDOT, 2, 64, 64, 512, trace=False)


def test_uncovered_kernel_names_itself():
    kern = replace(get_kernel(SEED_MOPA, 512), name="matmul_clamp_f32_not_emulated")
    kern.isa = None  # a kernel its family gave no program
    with pytest.raises(NotImplementedError, match="matmul_clamp_f32_not_emulated"):
        kern.run(1, 64, 32, *random_operands(kern, 1, 64, 32), execution="isa")
