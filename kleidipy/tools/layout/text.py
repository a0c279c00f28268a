"""Text form of a layout map: byte offset -> labels, one table per buffer with its regions (``--text``).

Labels: ``rr,kk`` = element (row rr, k kk); ``rr,bB`` = the value of block B of row rr; ``rr`` = a per-row value;
a byte of two 4-bit values shows ``low|high``; ``*`` marks a padding copy of a label seen earlier; ``--`` is a
nibble holding no value (padding).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kleidipy.tools.layout.probe import PAD, BufferMap, Field, Region

if TYPE_CHECKING:
    from kleidipy.tools.layout.maps import LayoutMaps

LEGEND = (
    "labels: rr,kk = element (row, k); rr,bB = block B of row rr; rr = per-row value; "
    "low|high = the two nibbles of a byte; * = padding copy; -- = no value"
)

NO_LHS = "LHS: not packed (the kernel reads the float32 rows as they are)"


def label_width(bmap: BufferMap) -> tuple[int, int]:
    """Digits of the row and column numbers in this buffer's labels (at least 2)."""
    rows = [f.row for f in bmap.fields] or [0]
    cols = [f.col for f in bmap.fields if f.kind == "element"] or [0]
    return max(2, len(str(max(rows)))), max(2, len(str(max(cols))))


def label(f: Field | None, widths: tuple[int, int]) -> str:
    """The label text of a field (``--`` for none)."""
    if f is None:
        return "-" * widths[0]
    rw, cw = widths
    text = f"{f.row:0{rw}d}"
    if f.kind == "element":
        text += f",{f.col:0{cw}d}"
    elif f.kind.startswith("block"):  # (block: per 32 values, block16: per 16)
        text += f",b{f.col}"
    return text + ("*" if f.copy else "")


def region_kinds(regions: list[Region]) -> list[tuple[str, str, str, int, str]]:
    """Per region kind, in order of first appearance: (key, title, field size, total bytes, where its runs are)."""
    kinds: dict[str, list[Region]] = {}
    for r in regions:
        kinds.setdefault(r.key, []).append(r)
    out = []
    for key, runs in kinds.items():
        first = runs[0]
        size = "constant" if key == PAD else ("4-bit values" if first.width == 0 else f"{first.width} B fields")
        if len(runs) <= 3:
            where = ", ".join(f"[{r.start}, {r.end})" for r in runs)
        else:
            steps = {b.start - a.start for a, b in zip(runs, runs[1:], strict=False)}
            lengths = {r.end - r.start for r in runs}
            every = f", one every {steps.pop()} B" if len(steps) == 1 and len(lengths) == 1 else ""
            where = f"{len(runs)} runs, first [{first.start}, {first.end}){every}"
        out.append((key, first.title, size, sum(r.end - r.start for r in runs), where))
    return out


def region_summary(regions: list[Region]) -> list[str]:
    """One line per region kind: key, title, field size, bytes and where its runs are."""
    return [
        f"  {key:<7} {title:<30} {size:<13} {total:>6} B  {where}"
        for key, title, size, total, where in region_kinds(regions)
    ]


def _entries(bmap: BufferMap, region: Region, widths: tuple[int, int]) -> list[tuple[int, str]]:
    if region.width == 0:
        return [
            (b, f"{label(bmap.at(b, 0), widths)}|{label(bmap.at(b, 1), widths)}")
            for b in range(region.start, region.end)
        ]
    return [(off, label(bmap.at(off), widths)) for off in range(region.start, region.end, region.width)]


def buffer_table(title: str, detail: str, bmap: BufferMap) -> list[str]:
    """The table of one buffer: heading, region summary, then offset, region key and up to 8 or 16 labels a line."""
    lines = [f"== {title}", f"   {detail}: {bmap.size} B", *region_summary(bmap.regions)]
    if bmap.unexplained:
        lines.append(f"  !! {bmap.unexplained} nibbles change with the inputs but carry no label")
    widths = label_width(bmap)
    digits = len(str(bmap.size))
    for region in bmap.regions:
        if region.key == PAD:
            lines.append(f"  {region.start:>{digits}} {PAD:<7} ({region.end - region.start} B)")
            continue
        per_line = 8 if region.width != 1 else 16
        entries = _entries(bmap, region, widths)
        for i in range(0, len(entries), per_line):
            chunk = entries[i : i + per_line]
            lines.append(f"  {chunk[0][0]:>{digits}} {region.key:<7} " + " ".join(text for _, text in chunk))
    return lines


def text_table(maps: LayoutMaps) -> str:
    """The whole text form of :class:`~kleidipy.tools.layout.LayoutMaps`."""
    lines = [maps.heading, maps.geometry, LEGEND]
    for panel in maps.panels:
        lines += ["", *buffer_table(panel.title, panel.detail, panel.map)]
    if maps.lhs is None:
        lines += ["", f"== {NO_LHS}"]
    return "\n".join(lines) + "\n"


def summary(maps: LayoutMaps) -> str:
    """Heading and the region summary of every buffer (what ``kleidipy layout`` prints without --text)."""
    lines = [maps.heading, maps.geometry]
    for panel in maps.panels:
        lines += [f"{panel.title} ({panel.detail}): {panel.map.size} B", *region_summary(panel.map.regions)]
    if maps.lhs is None:
        lines.append(NO_LHS)
    return "\n".join(lines) + "\n"
