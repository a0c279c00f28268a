"""kleidipy.core.names: every KleidiAI name of the golden set decodes token by token with no unknown part."""

from __future__ import annotations

from pathlib import Path

import pytest

from kleidipy.core.names import (
    KernelNameError,
    current_name,
    decode,
    explain,
    folder,
    format_explanation,
    is_legacy,
    kind,
    summary,
)
from kleidipy.errors import KleidipyError
from kleidipy.kernels import catalogue
from kleidipy.tools.golden import GoldenSet

EXAMPLE = "kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
# names named by the spec, the golden README's cross-checks and KleidiAI's naming notes
OTHER_NAMES = [
    "kai_run_lhs_pack_bf16p2vlx2_f32_sme2",
    "kai_run_rhs_pack_kxn_bf16p12x4biasf32_f16_neon",
    "kai_run_rhs_pack_nxk_x32p16x1bx32_x32_x32_neon",
    "kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon",
    "kai_matmul_clamp_f32_qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm",
    "kai_matmul_clamp_f32_qsi8d32p1x8_qsi4c32p8x8_1x8_sve_dotprod",
    "kai_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa",
    "kai_lhs_pack_f16pmrx2_f32_neon",
    "kai_matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla_cortexa55",
    "kai_matmul_clamp_qai8_qai8_qsi8cxp4vsx4bi32sf32_1x32vs_sme2_dot",
    "kai_imatmul_clamp_f32_f32p2vlx1_f32p2vlx1b_2vlx2vl_sme2_mopa",
]
# KleidiAI's early spelling, as its overview page quotes it -> the name KleidiAI (and kleidipy) has today
LEGACY = {
    "kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x32_neon_i8mm": (
        "kai_matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm"
    ),
    "kai_run_lhs_quant_pack_qa8dxP_f32": "kai_lhs_quant_pack_qai8dxp_f32",
    "kai_run_rhs_pack_nxk_qs4cxP_qs4cxS1S0": "kai_rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
    "matmul_clip_f32_qa8dxP_qs4cxP": "matmul_clamp_f32_qai8dxp_qsi4cxp",  # a folder
}
# the names of the llama.cpp pages: today's spelling already
LLAMA_CPP_PAGES = [
    "kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon",
    "kai_run_lhs_quant_pack_qsi8d32p_f32_neon",
    "kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa",
    "kai_run_matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot",
]


def _check_decodes(name: str) -> None:
    for svl_bits in (None, 512):
        for token, meaning in explain(name, svl_bits):
            assert token and meaning, (name, token, meaning)
            assert "unknown" not in meaning.lower(), (name, token, meaning)
        # the fields put back together are the name, and each field is the concatenation of its tokens
        fields = decode(name, svl_bits)
        assert "_".join(f.spelled or f.text for f in fields) == name
        assert any(f.spelled for f in fields) == is_legacy(name)
        for field in fields:
            sep = "_" if field.role == "operation" else ""
            assert sep.join(tok for tok, _ in field.parts) == field.text, field


def test_every_golden_kernel_and_packer_name_decodes(golden_dir: Path) -> None:
    runs = [run for case in GoldenSet(golden_dir).manifest["cases"] for run in case["runs"]]
    names = sorted({name for run in runs for name in run.get("kernels", {}).values() if name})
    assert len(names) >= 50
    assert {n.split("_")[2] for n in names} == {"matmul", "lhs", "rhs"}
    for name in names:
        _check_decodes(name)


@pytest.mark.parametrize("name", OTHER_NAMES)
def test_other_names_decode(name: str) -> None:
    _check_decodes(name)


def _catalogue_entries(name: str) -> list[str]:
    """What a name denotes in the catalogue: its kernel, its packer, or the kernels of its folder."""
    if kind(name) == "folder":
        return [k.name for k in catalogue.all_kernels() if folder(k.name) == folder(name)]
    lookup = catalogue.get_kernel if kind(name) == "kernel" else catalogue.get_packer
    return [lookup(name).name]


def test_catalogue_names_decode() -> None:
    entries = catalogue.all_kernels() + catalogue.all_packers()
    for entry in entries:
        _check_decodes(entry.name)
        assert _catalogue_entries(entry.name) == [entry.name]


@pytest.mark.parametrize("name", LLAMA_CPP_PAGES)
def test_llama_cpp_page_names_decode_and_are_current(name: str) -> None:
    _check_decodes(name)
    assert not is_legacy(name)
    assert _catalogue_entries(name) == [current_name(name).removeprefix("kai_")]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_names_decode_and_map_to_todays(name: str) -> None:
    _check_decodes(name)
    assert is_legacy(name)
    assert current_name(name) == LEGACY[name]
    assert not is_legacy(LEGACY[name])
    assert _catalogue_entries(name) == _catalogue_entries(LEGACY[name])
    text = format_explanation(name)
    assert text.splitlines()[0] == name and "unknown" not in text
    assert text.splitlines()[-1] == f"legacy name; today: {LEGACY[name]}"


def test_legacy_names_get_the_same_kernel_and_packers() -> None:
    kernel = catalogue.get_kernel("kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x32_neon_i8mm")
    assert kernel == catalogue.get_kernel("kai_matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm")
    assert catalogue.get_packer("kai_run_lhs_quant_pack_qa8dxP_f32") is kernel.lhs_packer
    assert catalogue.get_packer("kai_run_rhs_pack_nxk_qs4cxP_qs4cxS1S0") is kernel.rhs_packer
    with pytest.raises(KleidipyError, match="did you mean kai_matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32"):
        catalogue.get_kernel("kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x64_neon_i8mm")


def test_legacy_roles_say_what_the_kernel_computes() -> None:
    """LHS = int8 activations (per-row asymmetric), RHS = int4 weights (per-channel symmetric), 'clip' = clamp."""
    name = "kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x32_neon_i8mm"
    fields = {f.spelled or f.text: f for f in decode(name)}
    assert fields["matmul_clip"].text == "matmul_clamp"
    assert fields["f32"].role.startswith("destination")
    lhs, rhs = fields["qa8dxP4X8"], fields["qs4cxP4X8"]
    assert lhs.role == "LHS operand (m x k, activations)" and lhs.text == "qai8dxp4x8"
    assert [tok for tok, _ in lhs.parts] == ["q", "a", "i8", "dx", "p", "4", "x8"]
    assert rhs.role == "RHS operand (k x n, weights)" and rhs.text == "qsi4cxp4x8"
    assert [tok for tok, _ in rhs.parts] == ["q", "s", "i4", "cx", "p", "4", "x8"]
    assert summary(name) == (
        "computes dst f32 = LHS activations int8 (per-row asymmetric) x RHS weights int4 (per-channel symmetric), "
        "clamped to [scalar_min, scalar_max]"
    )
    assert summary("kai_run_lhs_quant_pack_qa8dxP_f32") == "packs LHS activations: f32 -> int8 (per-row asymmetric)"
    assert [kind(n) for n in LEGACY] == ["kernel", "packer", "packer", "folder"]
    assert folder("matmul_clip_f32_qa8dxP_qs4cxP") == "matmul_clamp_f32_qai8dxp_qsi4cxp"
    assert folder(EXAMPLE) == "matmul_clamp_f32_qsi8d32p_qsi4c32p" and folder("kai_lhs_pack_f16pmrx2_f32_neon") is None


def test_example_tokens_and_concrete_lane_counts() -> None:
    tokens = [tok for tok, _ in explain(EXAMPLE)]
    lhs = tokens[tokens.index("qsi8d32p1vlx4") + 1 : tokens.index("qsi4c32p4vlx4")]
    assert lhs == ["q", "s", "i8", "d32", "p", "1vl", "x4"]
    rhs = tokens[tokens.index("qsi4c32p4vlx4") + 1 : tokens.index("1vlx4vl")]
    assert rhs == ["q", "s", "i4", "c32", "p", "4vl", "x4"]
    assert tokens[-2:] == ["sme2", "mopa"]

    lhs512 = dict(explain(EXAMPLE, 512)[tokens.index("qsi8d32p1vlx4") : tokens.index("qsi4c32p4vlx4")])
    assert lhs512["1vl"] == "mr = 1 VL = 16 rows at SVL 512 interleaved per packed group"
    tile512 = dict(explain(EXAMPLE, 512)[tokens.index("1vlx4vl") :])
    assert tile512["1vl"] == "m_step = 1 VL = 16 dst rows at SVL 512 per step"
    assert "16/32/64/128 at SVL 128/256/512/1024" in dict(explain(EXAMPLE))["x4vl"]
    for svl, lanes in [(128, 4), (256, 8), (1024, 32)]:
        meanings = [m for tok, m in explain(EXAMPLE, svl) if tok == "4vl"]
        assert meanings == [f"nr = 4 VL = {4 * lanes} columns at SVL {svl} interleaved per packed group"]


def test_packer_tokens() -> None:
    pairs = explain("kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon")
    tokens = [tok for tok, _ in pairs]
    assert tokens[:3] == ["kai", "run", "rhs_pack_nxk"]
    assert tokens[3:6] == ["rhs", "pack", "nxk"]
    assert tokens[tokens.index("qsi4c32ps1s0scalef16") + 1 :][:7] == ["q", "s", "i4", "c32", "p", "s1s0", "scalef16"]
    meanings = dict(pairs)
    assert "fp16 scales" in meanings["scalef16"]
    assert "j+16" in meanings["s16s0"]
    assert "portable C" in dict(explain("kai_run_lhs_quant_pack_qsi8d32p_f32"))["pack"]
    kxn = dict(explain("kai_run_rhs_pack_kxn_x32p16x1b_x32_x32_neon"))
    assert kxn["kxn"].startswith("source is K x N")
    roles = [m for tok, m in explain("kai_run_rhs_pack_nxk_qai4c32p_qau4c32s0s1_f32_f32_f32_neon") if tok == "f32"]
    assert [r.split(":")[0] for r in roles] == ["zero-point/offset input", "bias input", "scale input"]


def test_format_explanation_is_aligned() -> None:
    text = format_explanation(EXAMPLE, 512)
    lines = text.splitlines()
    assert lines[0] == EXAMPLE
    assert lines[1] == "(SVL 512 bits: 1 VL = 16 32-bit lanes)"
    assert lines[2] == ""
    body = lines[3 : lines.index("", 3)]  # the token rows; then what it computes
    column = body[0].index("prefix: KleidiAI")  # every meaning starts in this column
    for line in body:
        token, meaning = line[:column], line[column:]
        assert token.startswith("  ") and token.endswith(" ") and meaning[:1].strip(), line
        assert len(token.split()) <= 1, line  # one token (or none: a wrapped meaning)
    assert "1vl" in text and "16 rows at SVL 512" in text
    assert all(len(line) <= 110 for line in lines)
    # no SVL header for a NEON kernel, even with svl_bits
    neon = format_explanation("kai_matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", 512)
    assert "SVL" not in neon


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "hello",
        "kai_",
        "kai_softmax_f32_f32_1d_neon",
        "ggml_vec_dot_q4_0_q8_0",
        "matmul_clamp_f32_sme2_mopa",
        "kai_run_matmul_clamp_f32_qsi8d32p1vlx4_1vlx4vl_sme2_mopa",
        "kai_rhs_pack_qsi4c32p_qsu4c32s16s0",
        # an unknown token is an error, not a line of output
        "kai_matmul_clamp_f32_zz_f32p16x1b_6x16_neon_mla",
        "kai_matmul_clamp_f32_qsi9d32p1x4_qsi4c32p4x4_1x4_neon_dotprod",
        "kai_lhs_quant_pack_qsi8d32pq_f32_neon",
        "kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x32_neon_zzz",
    ],
)
def test_not_a_kleidiai_name(bad: str) -> None:
    with pytest.raises(KernelNameError) as info:
        explain(bad)
    message = str(info.value)
    assert "\n" not in message and "KleidiAI" in message
    if bad.endswith("_zzz"):
        assert "unknown token 'zzz' after the engine 'neon'" in message
    assert isinstance(info.value, KleidipyError)


def test_bad_svl_is_a_kleidipy_error() -> None:
    with pytest.raises(KleidipyError):
        explain(EXAMPLE, 500)
