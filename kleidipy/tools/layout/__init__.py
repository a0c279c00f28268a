"""Pictures of KleidiAI packed layouts, generated from the real packers (``kleidipy layout``): a text table
(:mod:`kleidipy.tools.layout.text`) and a matplotlib picture (:mod:`kleidipy.tools.layout.plot`). Nothing is drawn
from a description of the layout: a packer change shows up in the picture.

The method: docs/layout-maps.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kleidipy.core.buffers import check_svl
from kleidipy.core.matmul import MatmulKernel
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.tools.layout import encodings
from kleidipy.tools.layout.maps import LayoutError, LayoutMaps, Panel
from kleidipy.tools.layout.probe import BufferMap, Field, Region, trace

__all__ = [
    "BufferMap",
    "Field",
    "LayoutError",
    "LayoutMaps",
    "Panel",
    "Region",
    "default_m",
    "layout_maps",
    "layout_svg",
    "render_layout",
]

#: the seeds' example: LHS [16, 64] F32 x RHS [64, 64] Q4_0 at SVL 512
DEFAULT_KERNEL = "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
DEFAULT_SHAPE = (16, 64, 64)
DEFAULT_SVL = 512
#: the largest buffer (bytes) a map is made for: pictures are for small shapes
MAX_BYTES = 32768
PICTURE_SUFFIXES = (".png", ".svg")


def default_m(kernel: MatmulKernel) -> int:
    """The default LHS rows: 1 for a GEMV kernel, else the seeds' 16."""
    return 1 if kernel.kind == "gemv" else DEFAULT_SHAPE[0]


def _check_shape(kern: MatmulKernel, m: int, n: int, k: int) -> None:
    kern.check_args(m, n, k)
    if k < 2:
        raise KernelShapeError(
            f"{kern.name}: a layout map needs k >= 2 (with k=1 a row's value and its per-row "
            "parameters cannot be told apart)"
        )
    sizes = {"RHS": kern.rhs_packed_size(n, k), "LHS": kern.lhs_packed_size(m, k)}
    for side, size in sizes.items():
        if size > MAX_BYTES:
            raise LayoutError(
                f"{side} packed buffer of {size} B at m={m}, n={n}, k={k} is too large to draw "
                f"(at most {MAX_BYTES} B): use a smaller --shape"
            )


def _packed_panel(kern: MatmulKernel, side: str, kai_name: str, shape: str, packed: BufferMap,
                  period: int) -> Panel:  # fmt: skip
    """The panel of a packed buffer: titled by its packer, subtitled by ``shape`` (the sizes and the tile rows)
    and the kernel's kr, sr and bl."""
    bl = "" if kern.bl is None else f", bl={kern.bl}"
    return Panel(f"{side} packed by {kai_name}", f"{shape}, kr={kern.kr}, sr={kern.sr}{bl}", packed, period)


def layout_maps(kernel_name: str, m: int | None = None, n: int = 64, k: int = 64, svl_bits: int = 512) -> LayoutMaps:
    """Label maps of the kernel's buffers at LHS [m, k] x RHS [n, k] (m defaults to :func:`default_m`).

    Raises UnknownKernelError (closest name suggested), KernelShapeError (a shape the kernel cannot take, SVL not
    a power of two in 128..2048) or LayoutError (buffers too large to draw).
    """
    check_svl(svl_bits)
    kern = get_kernel(kernel_name, svl_bits)
    m = default_m(kern) if m is None else m
    _check_shape(kern, m, n, k)
    rhs_packer = kern.rhs_packer
    source_title, channels = encodings.lookup(encodings.RHS_FORMATS, rhs_packer.name)(n, k, rhs_packer)

    def run_rhs(inputs: encodings.RhsInputs) -> dict[str, np.ndarray]:
        source, kwargs = inputs
        packed = kern.pack_rhs(n, k, execution="reference", **kwargs)
        return {"source": source, "packed": packed}

    rhs_maps = trace(channels, run_rhs)
    rhs = _packed_panel(kern, "RHS", rhs_packer.kai_name, f"n={n}, k={k}, nr={kern.nr}", rhs_maps["packed"],
                        kern.rhs_packed_size(kern.nr, k))  # fmt: skip
    source = Panel(f"RHS as given: {source_title}", f"n={n}, k={k}", rhs_maps["source"], rhs_maps["source"].size // n)
    lhs = None
    if kern.lhs_packer is not None:
        lhs_channels = encodings.lookup(encodings.LHS_FORMATS, kern.lhs_packer.name)(m, k)
        lhs_maps = trace(lhs_channels, lambda x: {"packed": kern.pack_lhs(x, m, k, execution="reference")})
        lhs = _packed_panel(kern, "LHS", kern.lhs_packer.kai_name, f"m={m}, k={k}, mr={kern.mr}",
                            lhs_maps["packed"], kern.lhs_packed_size(kern.mr, k))  # fmt: skip
    return LayoutMaps(kern, m, n, k, source, rhs, lhs)


def _check_out(out: Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in PICTURE_SUFFIXES:
        raise LayoutError(f"cannot write '{out}': the picture format is chosen by the extension, .png or .svg")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise LayoutError(f"cannot write '{out}': folder '{parent}' does not exist")
    if out.is_dir():
        raise LayoutError(f"cannot write '{out}': it is a folder")
    existed = out.exists()
    try:  # fail before the work, not after it
        out.open("ab").close()
    except OSError as exc:
        raise LayoutError(f"cannot write '{out}': {exc.strerror or exc}") from exc
    if not existed:
        out.unlink()
    return out


def layout_svg(kernel_name: str = DEFAULT_KERNEL, m: int | None = None, n: int = 64, k: int = 64,
               svl_bits: int = DEFAULT_SVL) -> bytes:  # fmt: skip
    """The picture ``kleidipy layout --out FILE.svg`` writes, as bytes (the server's Inside view shows it); raises as
    :func:`layout_maps`."""
    import io

    from kleidipy.tools.layout.plot import draw

    out = io.BytesIO()
    draw(layout_maps(kernel_name, m, n, k, svl_bits), out, "svg")
    return out.getvalue()


def render_layout(
    kernel_name: str,
    m: int | None = None,
    n: int = 64,
    k: int = 64,
    svl_bits: int = DEFAULT_SVL,
    out: Path | None = None,
    text: bool = False,
) -> str:
    """``kleidipy layout``: the layout of a kernel's buffers at LHS [m, k] x RHS [n, k].

    Writes the picture to ``out`` (.png or .svg) when given. Returns the full text table when ``text`` is true,
    else a short summary (heading and regions) to print.
    """
    from kleidipy.tools.layout.text import summary, text_table

    if out is not None:
        out = _check_out(out)
    maps = layout_maps(kernel_name, m, n, k, svl_bits)
    if out is not None:
        from kleidipy.tools.layout.plot import draw

        draw(maps, out)
    result = text_table(maps) if text else summary(maps)
    if out is not None and not text:
        result += f"\nwrote {out}\n"
    return result
