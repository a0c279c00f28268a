"""Tests for kleidipy.tools.layout: label maps found by probing the real packers, text snapshot, PNG/SVG, bad input."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import paths
import pytest

from kleidipy.core.buffers import SVL_CHOICES
from kleidipy.errors import KernelShapeError, KleidipyError, UnknownKernelError
from kleidipy.kernels.catalogue import all_kernels
from kleidipy.tools.layout import DEFAULT_KERNEL, MAX_BYTES, BufferMap, LayoutError, layout_maps, render_layout

SNAPSHOT = paths.SNAPSHOTS / "layout_default.txt"
I8MM = "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm"


@pytest.fixture(scope="module")
def default_maps():
    return layout_maps(DEFAULT_KERNEL, 16, 64, 64, 512)


def _field(bmap: BufferMap, offset: int, nibble: int | None = None) -> tuple[str, int, int]:
    f = bmap.at(offset, nibble)
    assert f is not None, (offset, nibble)
    return f.key, f.row, f.col


def _positions(bmap: BufferMap, key: str) -> dict[tuple[int, int], tuple[int, int | None]]:
    """Label -> (offset, nibble) of its original (not a padding copy)."""
    return {(f.row, f.col): (f.offset, f.nibble) for f in bmap.fields if f.key == key and not f.copy}


# --------------------------------------------------------------------------------------------- spec §7


def test_spec_worked_example_offsets(default_maps) -> None:
    rhs, lhs, src = default_maps.rhs.map, default_maps.lhs.map, default_maps.rhs_source.map
    assert (rhs.size, lhs.size, src.size) == (2304, 1088, 2304)
    assert _field(rhs, 1162, 1) == ("codes", 5, 37)  # (n=5, k=37) -> byte 1162, high nibble
    assert _field(rhs, 1162, 0) == ("codes", 5, 36)
    assert [f.offset for f in rhs.find("d", 5, 1)] == [2186]  # scale (n=5, b=1) at bytes 2186-2187
    assert _field(lhs, 589) == ("q", 3, 37)
    assert [(f.offset, f.width) for f in lhs.find("scale", 3, 1)] == [(1062, 2)]
    # the Q4_0 blocks as given: row 5, block 1 starts at (5*2 + 1)*18; byte j holds element j low, j+16 high
    assert _field(src, 198) == ("d", 5, 1)
    assert _field(src, 200 + 5, 0) == ("codes", 5, 37) and _field(src, 205, 1) == ("codes", 5, 53)


def test_spec_4_1_and_4_4_formulas(default_maps) -> None:
    rhs = _positions(default_maps.rhs.map, "codes")
    assert rhs == {(n, k): (2 * ((k // 4) * 64 + n) + (k % 4) // 2, k % 2) for n in range(64) for k in range(64)}
    assert _positions(default_maps.rhs.map, "d") == {
        (n, b): (2048 + 2 * (b * 64 + n), None) for n in range(64) for b in range(2)
    }
    lhs = _positions(default_maps.lhs.map, "q")
    assert lhs == {(i, k): ((k // 4) * 64 + 4 * i + k % 4, None) for i in range(16) for k in range(64)}
    assert _positions(default_maps.lhs.map, "scale") == {
        (i, b): (1024 + 2 * (b * 16 + i), None) for i in range(16) for b in range(2)
    }


def test_spec_gemv_and_i8mm_sizes() -> None:
    gemv = layout_maps("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", 1, 64, 64, 512).lhs.map
    assert gemv.size == 68
    assert _positions(gemv, "q") == {(0, k): (k, None) for k in range(64)}
    assert _positions(gemv, "scale") == {(0, 0): (64, None), (0, 1): (66, None)}
    i8mm = layout_maps(I8MM, 16, 64, 64, 512)
    assert (i8mm.rhs.map.size, i8mm.lhs.map.size) == (16 * 144, 4 * 272)


def test_spec_4_2_and_4_3_formulas() -> None:
    """NEON RHS: per block nr fp16 scales then 32/kr segments of nr x kr/2 bytes (byte j: element j low, j+16 high);
    LHS: per block mr fp16 scales then chunks of kr/sr values per row."""
    n, k, nr, kr, mr, kbl = 13, 64, 4, 16, 4, 8
    maps = layout_maps(I8MM, 7, n, k, 512)
    stride, half = nr * 2 * 18, kr // 2
    want = {}
    for row in range(n):
        g, r = divmod(row, nr)
        for kk in range(k):
            b, j = divmod(kk, 32)
            s, t = divmod(j % 16, half)
            want[(row, kk)] = (g * stride + b * nr * 18 + 2 * nr + s * nr * half + r * half + t, j // 16)
    assert _positions(maps.rhs.map, "codes") == want
    assert _positions(maps.rhs.map, "d") == {
        (row, b): ((row // nr) * stride + b * nr * 18 + 2 * (row % nr), None) for row in range(n) for b in range(2)
    }
    lstride = mr * 2 * 34
    assert _positions(maps.lhs.map, "q") == {
        (i, kk): (
            (i // mr) * lstride
            + (kk // 32) * mr * 34
            + 2 * mr
            + ((kk % 32) // kbl) * mr * kbl
            + (i % mr) * kbl
            + kk % kbl,
            None,
        )
        for i in range(7)
        for kk in range(k)
    }
    # padding rows 13..15 copy row 12 (codes and scales); padding LHS rows are not written
    assert all(f.row == 12 for f in maps.rhs.map.fields if f.copy)
    assert sum(f.copy for f in maps.rhs.map.fields) == 3 * (k + 2)
    assert not any(f.copy for f in maps.lhs.map.fields)


def test_spec_4_5_qai8dxp_and_qsi4cxp() -> None:
    m, n, k, mr, nr, kbl = 5, 6, 40, 4, 4, 8
    maps = layout_maps("matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm", m, n, k, 512)
    k_int = 64
    lstride = mr * (k_int + 8)
    lhs = maps.lhs.map
    assert _positions(lhs, "q") == {
        (i, kk): ((i // mr) * lstride + (kk // kbl) * mr * kbl + (i % mr) * kbl + kk % kbl, None)
        for i in range(m)
        for kk in range(k)
    }
    assert _positions(lhs, "offset") == {
        (i, 0): ((i // mr) * lstride + mr * k_int + 4 * (i % mr), None) for i in range(m)
    }
    assert _positions(lhs, "recip") == {
        (i, 0): ((i // mr) * lstride + mr * k_int + 4 * mr + 4 * (i % mr), None) for i in range(m)
    }
    # K padding replicates the last value of each row
    assert {(f.row, f.col) for f in lhs.fields if f.copy} == {(i, k - 1) for i in range(m)}
    rhs = maps.rhs.map
    rstride, blen = nr * (k_int // 2 + 12), 8
    want = {}
    for db in range(nr * k_int // 2):
        blk, bbi = divmod(db, blen)
        sb, col = divmod(blk, nr)
        t = sb * blen + bbi
        k0 = 32 * (t // 16) + t % 16
        for g in range(2):
            for nib, kk in ((0, k0), (1, k0 + 16)):
                if g * nr + col < n and kk < k:
                    want[(g * nr + col, kk)] = (g * rstride + db, nib)
    assert _positions(rhs, "w") == want
    for key, base in (("sum", 0), ("scale", 4), ("bias", 8)):
        assert _positions(rhs, key) == {
            (c, 0): ((c // nr) * rstride + nr * k_int // 2 + base * nr + 4 * (c % nr), None) for c in range(n)
        }


def test_spec_4_6_qsi8cxp_and_bf16() -> None:
    n, k, nr, kr = 6, 64, 4, 8
    rhs = layout_maps("matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm", 4, n, k, 512).rhs.map
    stride = nr * (k + 12)
    assert _positions(rhs, "q") == {
        (c, kk): ((c // nr) * stride + (kk // kr) * nr * kr + (c % nr) * kr + kk % kr, None)
        for c in range(n)
        for kk in range(k)
    }
    assert _positions(rhs, "scale") == {
        (c, 0): ((c // nr) * stride + nr * k + 4 * nr + 4 * (c % nr), None) for c in range(n)
    }
    sme = layout_maps("matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa", 8, 8, 5, 128)
    nr = 8  # 2 VL at SVL 128
    bstride = nr * 4 + 3 * nr * 2 * 2  # biases, then ceil(5/2) chunks of nr x 2 bf16
    assert _positions(sme.rhs.map, "bias") == {(c, 0): (4 * c, None) for c in range(8)}
    assert _positions(sme.rhs.map, "w") == {
        (c, kk): (nr * 4 + (kk // 2) * nr * 4 + c * 4 + 2 * (kk % 2), None) for c in range(8) for kk in range(5)
    }
    assert sme.rhs.map.size == bstride
    assert _positions(sme.lhs.map, "x") == {
        (i, kk): ((kk // 2) * nr * 4 + i * 4 + 2 * (kk % 2), None) for i in range(8) for kk in range(5)
    }


# --------------------------------------------------------------------------------------------- every family


def _tail_case(i: int, kern) -> tuple[str, tuple[int, int, int], int]:
    """Every catalogue kernel at a shape with tails (m, n not multiples of the tile; k padded where it can be)."""
    k = 64 if kern.bl else (40, 7)[kern.family.startswith(("bf16", "f32"))]
    return kern.name, (1 if kern.kind == "gemv" else 5, 13, k), SVL_CHOICES[i % 4]


CASES = [_tail_case(i, kern) for i, kern in enumerate(all_kernels())] + [
    (DEFAULT_KERNEL, (16, 64, 96), 1024),
    ("matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa", (5, 13, 64), 128),  # GGML Q8_0 route
    ("matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_8x4x32_neon_i8mm", (5, 6, 33), 512),
    ("matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla", (9, 13, 6), 512),
]


@pytest.mark.parametrize(("kernel", "shape", "svl"), CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_map_is_a_bijection(kernel: str, shape: tuple[int, int, int], svl: int) -> None:
    """Every logical value appears exactly once as an original; repeats are marked padding copies of an edge value;
    nothing that changes with the inputs is left without a label."""
    m, n, k = shape
    maps = layout_maps(kernel, m, n, k, svl)
    for panel in maps.panels:
        bmap = panel.map
        assert bmap.unexplained == 0, panel.title
        rows = m if panel is maps.lhs else n
        for key in {f.key for f in bmap.fields}:
            fields = [f for f in bmap.fields if f.key == key]
            originals = [(f.row, f.col) for f in fields if not f.copy]
            cols = {"element": k, "block": k // 32, "block16": k // 16, "row": 1}[fields[0].kind]
            assert sorted(originals) == [(r, c) for r in range(rows) for c in range(cols)], (panel.title, key)
            copies = {(f.row, f.col) for f in fields if f.copy}
            assert all(r in (0, rows - 1) or c == cols - 1 for r, c in copies), (panel.title, key, copies)
    assert (maps.lhs is None) == (maps.kernel.lhs_packer is None)


# --------------------------------------------------------------------------------------------- outputs


def test_default_text_matches_snapshot() -> None:
    text = render_layout(DEFAULT_KERNEL, 16, 64, 64, 512, text=True)
    if os.environ.get("KLEIDIPY_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text()
    assert "  1160 codes   04,36|04,37 04,38|04,39 05,36|05,37" in text


def test_summary_without_text() -> None:
    out = render_layout(DEFAULT_KERNEL, None, 64, 64, 512)
    assert out.splitlines()[0].startswith(
        "kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa at SVL 512"
    )
    assert "[2048, 2304)" in out and "m=16" in out
    gemv = render_layout("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot")
    assert "m=1," in gemv
    assert "LHS: not packed" in render_layout("kai_matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla", 2, 16, 4)


def test_png_and_svg(tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    png = tmp_path / "layout.png"
    out = render_layout(DEFAULT_KERNEL, 16, 64, 64, 512, out=png)
    assert f"wrote {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 2000 and pixels.shape[1] > 2000
    svg = tmp_path / "layout.SVG"
    render_layout(DEFAULT_KERNEL, 16, 64, 64, 512, out=svg)
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert "05,37" in svg.read_text()  # labels stay text


def test_missing_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(LayoutError, match="needs matplotlib"):
        render_layout(DEFAULT_KERNEL, 16, 64, 64, 512, out=tmp_path / "x.png")


# --------------------------------------------------------------------------------------------- bad input


def test_unknown_kernel_suggests_closest() -> None:
    with pytest.raises(UnknownKernelError, match="did you mean kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4"):
        render_layout("matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopaa")


@pytest.mark.parametrize(
    ("kernel", "shape", "svl", "match"),
    [
        (DEFAULT_KERNEL, (16, 64, 48), 512, "not a multiple of the block length"),
        ("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", (4, 64, 64), 512, "GEMV kernel takes m == 1"),
        (DEFAULT_KERNEL, (16, 64, 64), 384, "not a power of two"),
        (DEFAULT_KERNEL, (16, 64, 64), 4096, "not a power of two"),
        ("matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_8x4x32_neon_i8mm", (4, 8, 1), 512, "k >= 2"),
        (DEFAULT_KERNEL, (0, 64, 64), 512, "must all be positive"),
    ],
)
def test_bad_shapes(kernel: str, shape: tuple[int, int, int], svl: int, match: str) -> None:
    with pytest.raises(KernelShapeError, match=match):
        render_layout(kernel, *shape, svl)


def test_too_large() -> None:
    with pytest.raises(LayoutError, match=f"at most {MAX_BYTES} B"):
        layout_maps(DEFAULT_KERNEL, 16, 512, 4096, 512)


@pytest.mark.parametrize("name", ["x.jpg", "missing/x.png", "folder.png", "noext"])
def test_bad_output(tmp_path: Path, name: str) -> None:
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(LayoutError) as err:
        render_layout(DEFAULT_KERNEL, 16, 64, 64, 512, out=tmp_path / name)
    assert isinstance(err.value, KleidipyError) and "\n" not in str(err.value)


def test_unwritable_output() -> None:
    with pytest.raises(LayoutError, match="cannot write '/proc/kleidipy-layout.png'"):
        render_layout(DEFAULT_KERNEL, 16, 64, 64, 512, out=Path("/proc/kleidipy-layout.png"))
