"""Target parsing, host detection fallback and llama.cpp-order kernel selection."""

import pytest

from kleidipy.errors import TargetError
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.target import (
    F32_KLEIDIAI,
    TABLES,
    WEIGHT_TYPES,
    detect_target,
    has_kernels,
    parse_target,
    resolve_target,
    select_kernels,
    select_kv_gemm,
    selected_uses,
    selection_table,
    standing,
)


def test_default_on_non_arm_host_is_virtual_sme2_512(monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    t = detect_target()
    assert (t.name, t.svl_bits, t.virtual, t.source) == ("sme2", 512, True, "default")
    assert t.table == "seeds" and parse_target("host").table == "seeds"  # (master's F16-LHS GEMM: no x86 tiles)
    assert parse_target("sme2").table == "master" and parse_target("host:table=master").table == "master"


@pytest.mark.parametrize(
    "spec,name,svl",
    [
        ("sme2:svl=512", "sme2", 512),
        ("SME2:svl=128", "sme2", 128),
        ("sme", "sme", 512),
        ("i8mm", "i8mm", None),
        ("dotprod", "dotprod", None),
    ],
)
def test_parse_named_targets(spec, name, svl):
    t = parse_target(spec)
    assert (t.name, t.svl_bits) == (name, svl)


@pytest.mark.parametrize(
    "spec,svl,table,again",
    [
        ("sme2", 512, "master", "sme2:svl=512"),
        ("sme2:svl=256,table=seeds", 256, "seeds", "sme2:svl=256,table=seeds"),
        ("SME2:table=SEEDS", 512, "seeds", "sme2:svl=512,table=seeds"),
        ("sme2:table=master,svl=128", 128, "master", "sme2:svl=128"),
        ("i8mm:table=seeds", None, "seeds", "i8mm:table=seeds"),
    ],
)
def test_target_table_option(spec, svl, table, again):
    """``table=master|seeds`` chooses llama.cpp's selection table (master by default); spec() names it again."""
    t = parse_target(spec)
    assert (t.svl_bits, t.table, t.spec()) == (svl, table, again)
    assert parse_target(t.spec()) == t
    assert t.describe().endswith(f"llama.cpp's {table} kernel table")


def test_host_table_option(monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert (parse_target("host").table, parse_target("host:table=master").table) == ("seeds", "master")
    assert parse_target("host").spec() == "sme2:svl=512,table=seeds"  # the virtual default (no x86 F16-LHS tiles)


@pytest.mark.parametrize(
    "spec",
    ["avx512", "sme2:svl=384", "sme2:svl=4096", "sme2:vl=512", "i8mm:svl=512", "sme2:table=old", "host:svl=512"],
)
def test_bad_targets_raise(spec):
    with pytest.raises(TargetError):
        parse_target(spec)


def test_env_target(monkeypatch):
    monkeypatch.setenv("KLEIDIPY_TARGET", "dotprod")
    assert resolve_target().name == "dotprod"
    assert resolve_target("i8mm").name == "i8mm"


def test_selection_follows_llama_cpp_order():
    sme2, i8mm, dot = parse_target("sme2:svl=512"), parse_target("i8mm"), parse_target("dotprod")
    q4 = select_kernels("q4_0", sme2)  # llama.cpp master: the F16-LHS GEMM, the int8 SDOT GEMV
    assert q4.gemm.name == "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"
    assert q4.gemm.lhs_packer.name == "lhs_pack_f16pmrx2_f32_neon"
    assert q4.gemv.name.endswith("qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot")
    assert (q4.gemm.mr, q4.gemm.nr, q4.gemv.nr) == (16, 64, 64)
    seeds = select_kernels("q4_0", parse_target("sme2:svl=512,table=seeds"))  # the seeds': the int8 MOPA GEMM
    assert seeds.gemm.name.endswith("qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa") and seeds.gemv == q4.gemv
    assert select_kernels("q4_0", i8mm).gemm.name.endswith("16x4_neon_i8mm")
    assert select_kernels("q4_0", i8mm).gemv.name.endswith("1x4x32_neon_dotprod")
    assert select_kernels("q4_0", dot).gemm.name.endswith("qsi4c32p4x4_16x4_neon_dotprod")
    assert select_kernels("q8_0", sme2).gemv.name.endswith("qsi8cxp4vlx4_1x4vl_sme2_dot")
    assert select_kernels("q8_0", dot).gemm.name.endswith("qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod")
    assert select_kernels("q4_0", parse_target("sme2:svl=128")).gemm.nr == 16


@pytest.mark.parametrize("table", TABLES)
def test_every_table_entry_exists_and_pairs_share_rhs_layout(table):
    for _wtype, _requires, gemm_name, gemv_name in selection_table(table):
        for svl in (128, 512, 2048):
            gemm, gemv = get_kernel(gemm_name, svl), get_kernel(gemv_name, svl)
            assert gemm.rhs_packer.name == gemv.rhs_packer.name
            assert (gemm.nr, gemm.kr, gemm.sr) == (gemv.nr, gemv.kr, gemv.sr)
            assert gemm.rhs_packed_size(96, 256) == gemv.rhs_packed_size(96, 256)
    for wtype in WEIGHT_TYPES:
        for spec in ("sme2:svl=1024", "i8mm", "dotprod"):
            target = parse_target(f"{spec}{',' if ':' in spec else ':'}table={table}")
            if wtype == F32_KLEIDIAI and not (spec.startswith("sme2") and table == "master"):  # (SME2 master's only)
                assert not has_kernels(wtype, target)
                continue
            assert has_kernels(wtype, target) and select_kernels(wtype, target).weight_type == wtype


def test_tables_differ_only_in_the_sme2_q4_0_gemm_the_f16_neon_bf16_and_the_f32_entry():
    """Master: the F16-LHS GEMM for Q4_0 on SME2, no F16 entry on NEON BF16 (llama.cpp master multiplies F16 weights
    with ggml's own code off SME2: kleidipy's F32 NEON kernel, the weights as stored), the SME2 F32 entry."""
    master, seeds = selection_table("master"), selection_table("seeds")
    assert master[-1] == (
        F32_KLEIDIAI,
        frozenset({"sme2"}),
        "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa",
        "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla",
    )
    dropped = [e for e in seeds if e[:2] == ("f16", frozenset({"bf16"}))]
    assert len(dropped) == 1 and dropped[0] not in master
    kept = [e for e in seeds if e not in dropped]
    changed = [(a, b) for a, b in zip(master[:-1], kept, strict=True) if a != b]
    assert len(changed) == 1
    ((new, old),) = changed
    assert new[:2] == old[:2] == ("q4_0", frozenset({"sme2"})) and new[3] == old[3] and "f16p1vlx2" in new[2]
    assert select_kernels("f16", parse_target("i8mm")).gemm.name == "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"
    with pytest.raises(TargetError, match="no kernel table"):
        selection_table("b3000")


def test_unknown_weight_type():
    with pytest.raises(TargetError, match="no KleidiAI kernels for weight type"):
        select_kernels("q5_k", parse_target("sme2"))


def test_selected_uses_name_each_selected_kernel_once():
    uses = selected_uses(parse_target("i8mm"))
    assert uses["matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm"] == ["q4_0 GEMM"]
    assert sum(len(u) for u in uses.values()) == 2 * (len(WEIGHT_TYPES) - 1)  # (no f32_kleidiai pair off SME2)


def test_standing_of_kernels_packers_and_folders_legacy_names_too():
    i8mm, sme2 = parse_target("i8mm"), parse_target("sme2")
    legacy = standing("kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x32_neon_i8mm", i8mm)
    assert legacy == standing("kai_matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm", i8mm)
    assert " ".join(legacy.split()) == (
        "in kleidipy: family qai8dxp_qsi4cxp, tier i8mm, GEMM; the i8mm target selects no kernel of family "
        "qai8dxp_qsi4cxp"
    )
    folder = standing("matmul_clip_f32_qa8dxP_qs4cxP", i8mm)
    assert "family qai8dxp_qsi4cxp, 5 kernels (tiers dotprod, i8mm, sme2)" in " ".join(folder.split())
    lhs = " ".join(standing("kai_run_lhs_quant_pack_qa8dxP_f32", i8mm).split())
    assert "LHS packer of 13 kernels (family qai8dxp_qsi4cxp, qai8dxp_qsi8cxp)" in lhs
    assert "selects kai_matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm for q8_0 GEMM" in lhs
    neon_q4 = " ".join(standing("kai_matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", sme2).split())
    assert "the sme2 target selects none of it; of its family it selects" in neon_q4
    assert "sme2_sdot for q4_0 GEMV" in neon_q4 and "q4_0 GEMM" not in neon_q4  # master: the GEMM is F16-LHS's
    f16p = " ".join(standing("matmul_clamp_f32_f16p_qsi4c32p", sme2).split())
    assert (
        "the sme2 target selects kai_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa for q4_0 GEMM" in f16p
    )
    missing = standing("kai_matmul_clamp_f32_qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm", sme2)
    assert missing.startswith("in kleidipy: not in the catalogue") and "did you mean" in missing
    assert all(len(line) <= 110 for line in "\n".join([legacy, folder, missing]).splitlines())


def test_master_tables_kv_cache_gemm_on_sme2():
    """llama.cpp master's table on SME2 also takes the F16 KV cache's GEMM (a batch's KQV); the seeds' table, SME
    without SME2 and the NEON targets do not."""
    sme2 = parse_target("sme2:svl=256")
    kv = select_kv_gemm(sme2)
    assert kv is not None and kv.name == "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa" and kv.nr == 16
    assert selected_uses(sme2)[kv.name] == ["f16 GEMM", "f16 GEMV", "F16 KV cache GEMM"]
    for spec in ("sme2:svl=512,table=seeds", "sme:svl=512", "i8mm", "dotprod", "i8mm:table=seeds"):
        target = parse_target(spec)
        assert select_kv_gemm(target) is None
        assert not any("KV cache" in u for uses in selected_uses(target).values() for u in uses)
