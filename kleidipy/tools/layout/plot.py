"""The picture of a layout map (matplotlib, PNG or SVG by the file extension; needs the ``plot`` extra).

One panel per buffer, wrapped at a row width that lines up the region boundaries. Every byte is a cell: a
4-bit-value byte is split in two (top = low nibble, bottom = high nibble), a multi-byte value spans its cells.
Cells are coloured by source row (hue) and, for elements, by K block (light / strong); padding copies are pale,
constant bytes grey. Region runs are outlined, named on the right and summarised in the panel heading.
"""

from __future__ import annotations

import colorsys
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from kleidipy.tools.layout.probe import PAD, BufferMap, Field
from kleidipy.tools.layout.text import LEGEND, NO_LHS, label, label_width, region_kinds

if TYPE_CHECKING:
    from kleidipy.tools.layout.maps import LayoutMaps

DPI = 120
#: labels are monospace text, CHARS_PER_CELL characters per byte cell: DejaVu Sans Mono (shipped with matplotlib)
#: advances 0.60205 em, sized here to ADVANCE_PX whole pixels (Agg rounds advances to pixels, so any other size
#: drifts along a row); the filler is a no-break space, which SVG viewers do not collapse
MONO, CHARS_PER_CELL, ADVANCE_PX, FILL = ["DejaVu Sans Mono", "monospace"], 7, 6, "\u00a0"
MONO_SIZE = ADVANCE_PX * 72 / (DPI * 0.60205078125)
#: inches per byte cell (width), per grid row with / without 4-bit bytes
CELL_W, ROW_H_NIBBLES, ROW_H_BYTES = CHARS_PER_CELL * ADVANCE_PX / DPI, 0.34, 0.22
LEFT, RIGHT, GAP = 0.7, 2.7, 0.35
FONT = 5.6
OUTLINES = ("#1f4e9c", "#b2182b", "#1b7837", "#762a83", "#e08214", "#35978f", "#8c510a")
PAD_COLOUR, GRID_COLOUR, ROW_LINE = "#ececec", "#ffffff", "#8c8c8c"
GOLDEN = 0.6180339887


def _matplotlib() -> Any:
    """The matplotlib module (imported lazily: the ``plot`` extra is optional)."""
    from kleidipy.tools.layout.maps import LayoutError

    try:
        import matplotlib
        import matplotlib.figure
    except ImportError as exc:
        raise LayoutError("writing a picture needs matplotlib: pip install 'kleidipy[plot]'") from exc
    return matplotlib


def colour(f: Field) -> tuple[float, float, float]:
    """Hue by source row; elements of odd K blocks stronger; per-block/per-row values strongest; copies pale."""
    hue = (f.row * GOLDEN) % 1.0
    if f.copy:
        sat = 0.10
    elif f.kind == "element":
        sat = 0.28 if (f.col // 32) % 2 == 0 else 0.48
    else:
        sat = 0.50
    return colorsys.hsv_to_rgb(hue, sat, 0.97)


def row_width(period: int, field_width: int) -> int:
    """Bytes per grid row: whole periods of the layout (a tensor row, a packed group) when a period is short, else
    the divisor of the period nearest 64 (32..96); a multiple of the widest field so that none wraps."""
    if period <= 96:
        width = period * max(1, round(64 / period))
    else:
        divisors = [w for w in range(32, 97) if period % w == 0 and w % field_width == 0]
        width = min(divisors, key=lambda w: abs(w - 64)) if divisors else 64
    return width if width % field_width == 0 else 64


def _outline(start: int, end: int, width: int) -> list[tuple[float, float]]:
    """Polygon around bytes [start, end) on a grid of ``width`` bytes per row (y grows downwards)."""
    r0, c0 = divmod(start, width)
    r1, c1 = divmod(end - 1, width)
    c1 += 1
    if r0 == r1:
        return [(c0, r0), (c1, r0), (c1, r0 + 1), (c0, r0 + 1)]
    return [(c0, r0), (width, r0), (width, r1), (c1, r1), (c1, r1 + 1), (0, r1 + 1), (0, r0 + 1), (c0, r0 + 1)]


class _PanelLayout:
    def __init__(self, bmap: BufferMap, period: int) -> None:
        self.map = bmap
        self.width = row_width(period, max((f.width for f in bmap.fields if f.nibble is None), default=1))
        self.rows = -(-bmap.size // self.width)
        self.nibbles = any(f.nibble is not None for f in bmap.fields)
        self.kinds = region_kinds(bmap.regions)
        self.head = 0.30 + 0.17 * len(self.kinds) + 0.18
        self.grid_h = self.rows * (ROW_H_NIBBLES if self.nibbles else ROW_H_BYTES)

    @property
    def height(self) -> float:
        return self.head + self.grid_h

    @property
    def grid_w(self) -> float:
        return self.width * CELL_W


def _cells(bmap: BufferMap, width: int) -> tuple[list[Any], list[Any]]:
    """Rectangles (x, y, w, h) and face colours of every field, constant byte and empty nibble."""
    rects, colours = [], []
    labelled = set()
    for f in bmap.fields:
        row, col = divmod(f.offset, width)
        if f.nibble is None:
            rects.append((col, row, f.width, 1))
        else:
            rects.append((col, row + 0.5 * f.nibble, 1, 0.5))
        colours.append(colour(f))
        labelled.add((f.offset, f.nibble))
    for region in bmap.regions:
        for b in range(region.start, region.end):
            row, col = divmod(b, width)
            if region.key == PAD:
                rects.append((col, row, 1, 1))
                colours.append(PAD_COLOUR)
            elif region.width == 0:  # nibbles holding no value inside 4-bit regions
                for nib in (0, 1):
                    if (b, nib) not in labelled:
                        rects.append((col, row + 0.5 * nib, 1, 0.5))
                        colours.append(PAD_COLOUR)
    return rects, colours


def _label_lines(bmap: BufferMap, width: int) -> dict[tuple[int, int], list[str]]:
    """Per (grid row, line: 0 = low nibble, 1 = byte values, 2 = high nibble) the row's text, each label centred in
    its cells' CHARS_PER_CELL monospace characters (one text object per line keeps big pictures fast)."""
    widths = label_width(bmap)
    lines: dict[tuple[int, int], list[str]] = {}
    for f in bmap.fields:
        row, col = divmod(f.offset, width)
        line = lines.setdefault((row, 1 if f.nibble is None else 2 * f.nibble), [FILL] * (width * CHARS_PER_CELL))
        slot = f.width * CHARS_PER_CELL
        text = label(f, widths).center(slot, FILL)[:slot]
        line[col * CHARS_PER_CELL : col * CHARS_PER_CELL + slot] = text
    return lines


def _draw_panel(ax: Any, title: str, lay: _PanelLayout) -> None:
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Polygon

    bmap, width = lay.map, lay.width
    ax.set_xlim(0, width)
    ax.set_ylim(lay.rows, 0)
    ax.axis("off")
    rects, colours = _cells(bmap, width)
    verts = [[(x, y), (x + w, y), (x + w, y + h), (x, y + h)] for x, y, w, h in rects]
    ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors=GRID_COLOUR, linewidths=0.4))
    if lay.nibbles:  # grid rows apart from the two nibbles of a byte
        ax.hlines(range(1, lay.rows), 0, width, colors=ROW_LINE, linewidths=0.7)
    mono = {"family": MONO, "fontsize": MONO_SIZE}
    for (row, line), chars in _label_lines(bmap, width).items():
        text = "".join(chars)
        body = text.lstrip(FILL)
        x = (len(text) - len(body)) / CHARS_PER_CELL
        ax.text(x, row + (0.25, 0.5, 0.75)[line], body.rstrip(FILL), ha="left", va="center", **mono)
    keys = [k for k, *_ in lay.kinds]
    tags: dict[int, list[str]] = {}
    for region in bmap.regions:
        edge = "#888888" if region.key == PAD else OUTLINES[keys.index(region.key) % len(OUTLINES)]
        style = "--" if region.key == PAD else "-"
        ax.add_patch(
            Polygon(
                _outline(region.start, region.end, width),
                closed=True,
                fill=False,
                edgecolor=edge,
                linewidth=1.4,
                linestyle=style,
            )
        )
        if region.key != PAD and region.end - region.start >= width // 2:
            tags.setdefault(region.start // width, []).append(f"{region.title} [{region.start}, {region.end})")
    for row in range(lay.rows):
        ax.text(-0.25, row + 0.5, str(row * width), ha="right", va="center", color="#555555", **mono)
    columns = "".join(str(col).center(CHARS_PER_CELL, FILL) for col in range(width))
    ax.text(0, -0.12, columns, ha="left", va="bottom", color="#777777", **mono)
    for row, texts in tags.items():
        ax.text(width + 0.3, row + 0.5, "◀ " + "; ".join(texts), ha="left", va="center", fontsize=FONT + 0.8)
    # heading: title, then one coloured line per region kind
    top = 1.0 + lay.head / lay.grid_h
    ax.text(0, top, title, transform=ax.transAxes, ha="left", va="top", fontsize=FONT + 3, weight="bold")
    for i, (key, ktitle, size, total, where) in enumerate(lay.kinds):
        edge = "#888888" if key == PAD else OUTLINES[keys.index(key) % len(OUTLINES)]
        y = top - (0.30 + 0.17 * i) / lay.grid_h
        ax.text(
            0,
            y,
            f"■ {ktitle} — {size}, {total} B: {where}",
            transform=ax.transAxes,
            ha="left",
            va="top",
            fontsize=FONT + 1.6,
            color=edge,
        )


def _figure(maps: LayoutMaps) -> tuple[Any, Any]:
    """(matplotlib, the figure of :class:`~kleidipy.tools.layout.LayoutMaps`)."""
    mpl = _matplotlib()
    panels = [(p.title + f"  ({p.detail}; {p.map.size} B)", _PanelLayout(p.map, p.period)) for p in maps.panels]
    head = 0.75
    fig_w = LEFT + max(lay.grid_w for _, lay in panels) + RIGHT
    fig_h = head + sum(lay.height + GAP for _, lay in panels)
    fig = mpl.figure.Figure(figsize=(fig_w, fig_h))  # no pyplot: no global state, nothing to close
    notes = [maps.heading, maps.geometry, LEGEND + "; 4-bit bytes: top = low nibble, bottom = high nibble"]
    if maps.lhs is None:
        notes.append(NO_LHS)
    fig.text(LEFT / fig_w, 1 - 0.12 / fig_h, "\n".join(notes), ha="left", va="top", fontsize=FONT + 2.5)
    y = fig_h - head
    for title, lay in panels:
        y -= lay.head
        bottom = y - lay.grid_h
        ax = fig.add_axes((LEFT / fig_w, bottom / fig_h, lay.grid_w / fig_w, lay.grid_h / fig_h))
        _draw_panel(ax, title, lay)
        y = bottom - GAP
    return mpl, fig


def draw(maps: LayoutMaps, out: Path | BinaryIO, fmt: str | None = None) -> None:
    """Write the picture of :class:`~kleidipy.tools.layout.LayoutMaps` to ``out``: a file (.png or .svg, by its
    extension) or a binary stream in format ``fmt`` ("png" or "svg")."""
    from kleidipy.tools.layout.maps import LayoutError

    mpl, fig = _figure(maps)
    try:
        with mpl.rc_context({"svg.fonttype": "none"}):  # SVG text stays text (searchable, small)
            fig.savefig(out, dpi=DPI, format=fmt or Path(out).suffix.lower()[1:])
    except OSError as exc:
        raise LayoutError(f"cannot write '{out}': {exc.strerror or exc}") from exc
