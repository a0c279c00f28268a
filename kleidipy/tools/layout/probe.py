"""Label tracing: where each input value lands in a buffer, found by running the real code on label-encoding inputs.
Owns :class:`Channel` (one logical input array) and :func:`trace`.

The method: docs/layout-maps.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

#: kinds of label: (row, k) of an element; (row, block); (row) for a per-row value
KINDS = ("element", "block", "row")
#: region key of bytes no channel labels (constant under every probe: padding, zero fill)
PAD = "pad"


@dataclass(frozen=True)
class View:
    """How a channel's values appear in one observed buffer: the region title and the field width in bytes
    (0 = 4-bit values, one per nibble)."""

    title: str
    width: int


@dataclass(frozen=True)
class Channel:
    """One logical input with labels (row, col) in ``shape``; ``build(choice)`` gives the inputs for a boolean
    choice array of that shape (False = value A, True = value B); ``views`` names the buffers it labels."""

    key: str
    kind: str
    shape: tuple[int, int]
    build: Callable[[np.ndarray], Any]
    views: dict[str, View]


@dataclass(frozen=True)
class Field:
    """A labelled value in a buffer: ``width`` bytes at ``offset`` (``nibble`` 0/1 for a 4-bit value)."""

    offset: int
    width: int
    nibble: int | None
    key: str
    kind: str
    row: int
    col: int
    copy: bool = False


@dataclass(frozen=True)
class Region:
    """A maximal run of bytes [start, end) holding fields of one channel (or constant bytes: key ``pad``)."""

    key: str
    title: str
    start: int
    end: int
    width: int


@dataclass
class BufferMap:
    """Which label every byte (or nibble) of a buffer holds."""

    name: str
    size: int
    fields: list[Field]
    regions: list[Region]
    #: nibbles that change under some probe but carry no label (0 for every supported layout)
    unexplained: int = 0
    _index: dict[tuple[int, int | None], Field] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {(f.offset, f.nibble): f for f in self.fields}

    def at(self, offset: int, nibble: int | None = None) -> Field | None:
        """The field starting at ``offset`` (nibble 0 = low, 1 = high for 4-bit values)."""
        return self._index.get((offset, nibble))

    def find(self, key: str, row: int, col: int = 0) -> list[Field]:
        """Every field of channel ``key`` holding label (row, col), the original first."""
        return [f for f in self.fields if f.key == key and f.row == row and f.col == col]

    def labels(self, key: str) -> dict[tuple[int, int], list[Field]]:
        """Label -> fields holding it, for one channel."""
        out: dict[tuple[int, int], list[Field]] = {}
        for f in self.fields:
            if f.key == key:
                out.setdefault((f.row, f.col), []).append(f)
        return out


# --------------------------------------------------------------------------------------------- probing


def _nibbles(buf: np.ndarray) -> np.ndarray:
    """Nibble i of a byte buffer: byte i // 2, low nibble for even i."""
    u8 = np.ascontiguousarray(buf, dtype=np.uint8).reshape(-1)
    return np.stack([u8 & 0x0F, u8 >> 4], axis=1).reshape(-1)


def _bits(n: int) -> int:
    return (n - 1).bit_length()


def _label_grid(shape: tuple[int, int]) -> np.ndarray:
    rows, cols = shape
    return (np.arange(rows)[:, None] << _bits(cols)) | np.arange(cols)[None, :]


def _observe(channel: Channel, run: Callable[[Any], dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """Nibbles of every observed buffer for the probes all-A, all-B, then (pattern, complement) per label bit."""
    grid = _label_grid(channel.shape)
    choices = [np.zeros(channel.shape, bool), np.ones(channel.shape, bool)]
    for p in range(_bits(channel.shape[0]) + _bits(channel.shape[1])):
        pattern = ((grid >> p) & 1).astype(bool)
        choices += [pattern, ~pattern]
    seen: dict[str, list[np.ndarray]] = {}
    for choice in choices:
        for name, buf in run(channel.build(choice)).items():
            seen.setdefault(name, []).append(_nibbles(buf))
    return seen


def _decode(channel: Channel, probes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(footprint, labelled, label index) per nibble of one buffer."""
    a, b = probes[0], probes[1]
    footprint = a != b
    ok = footprint.copy()
    idx = np.zeros(a.size, dtype=np.int64)
    for p in range((len(probes) - 2) // 2):
        pat, comp = probes[2 + 2 * p], probes[3 + 2 * p]
        is_set = (pat == b) & (comp == a)
        ok &= is_set | ((pat == a) & (comp == b))
        idx |= is_set.astype(np.int64) << p
    rows, cols = channel.shape
    row, col = idx >> _bits(cols), idx & ((1 << _bits(cols)) - 1)
    ok &= (row < rows) & (col < cols)
    return footprint, ok, idx


class _Claims:
    """Per nibble of one buffer: the channel that labels it (−1: none), its label, whether any probe changed it,
    and whether its owner is a 4-bit channel."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.owner = np.full(size, -1, dtype=np.int64)
        self.label = np.zeros(size, dtype=np.int64)
        self.touched = np.zeros(size, dtype=bool)
        self.single = np.zeros(size, dtype=bool)

    def claim(self, ci: int, width: int, ok: np.ndarray, idx: np.ndarray) -> None:
        """Give channel ``ci`` the nibbles it labels that no earlier channel took. A multi-byte value takes its
        whole aligned slot of ``width`` bytes: the nibbles it left unchanged, and nibbles a 4-bit channel took by
        coincidence that follow this channel too (a nibble of a sum can look like one element's: counts of 16
        vanish modulo 16)."""
        new = ok & (self.owner < 0)
        if width == 0:
            self.owner[new], self.label[new], self.single[new] = ci, idx[new], True
            return
        span = 2 * width
        for slot in np.unique(np.flatnonzero(new) // span):
            nibs = slice(slot * span, (slot + 1) * span)
            labels = np.unique(idx[nibs][new[nibs]])
            taken = self.owner[nibs] >= 0
            if labels.size != 1 or (taken & ~(self.single[nibs] & ok[nibs])).any():
                where = f"bytes {slot * width}..{(slot + 1) * width}"
                raise AssertionError(f"{self.name}: {where} are not one value of one channel")
            self.owner[nibs], self.label[nibs], self.single[nibs] = ci, labels[0], False


def trace(channels: list[Channel], run: Callable[[Any], dict[str, np.ndarray]]) -> dict[str, BufferMap]:
    """Label maps of every buffer ``run`` returns (name -> uint8 bytes), probing ``channels`` in priority order."""
    claims: dict[str, _Claims] = {}
    for ci, channel in enumerate(channels):
        for name, probes in _observe(channel, run).items():
            buf = claims.setdefault(name, _Claims(name, probes[0].size))
            if any(p.size != buf.owner.size for p in probes):
                raise AssertionError(f"{name}: buffer size changes with the values of '{channel.key}'")
            footprint, ok, idx = _decode(channel, probes)
            buf.touched |= footprint
            if name in channel.views:
                buf.claim(ci, channel.views[name].width, ok, idx)
    return {name: _assemble(buf, channels) for name, buf in claims.items()}


# --------------------------------------------------------------------------------------------- assembling


def _assemble(buf: _Claims, channels: list[Channel]) -> BufferMap:
    name, owner, label = buf.name, buf.owner, buf.label
    pairs = owner.reshape(-1, 2)
    if ((pairs[:, 0] >= 0) & (pairs[:, 1] >= 0) & (pairs[:, 0] != pairs[:, 1])).any():
        raise AssertionError(f"{name}: a byte holds nibbles of two channels")
    byte_owner = pairs.max(axis=1)
    fields: dict[tuple[int, int | None], Field] = {}
    for nib in np.flatnonzero(owner >= 0):
        channel = channels[owner[nib]]
        width = channel.views[name].width
        cbits = _bits(channel.shape[1])
        row, col = int(label[nib] >> cbits), int(label[nib] & ((1 << cbits) - 1))
        byte = int(nib) // 2
        if width == 0:
            key = (byte, int(nib) % 2)
            fields[key] = Field(byte, 1, key[1], channel.key, channel.kind, row, col)
        else:
            key = (byte - byte % width, None)
            fields.setdefault(key, Field(key[0], width, None, channel.key, channel.kind, row, col))
    seen: set[tuple[str, int, int]] = set()
    ordered = []
    for key in sorted(fields, key=lambda t: (t[0], t[1] or 0)):
        f = fields[key]
        tag = (f.key, f.row, f.col)
        ordered.append(replace(f, copy=tag in seen))
        seen.add(tag)
    regions = []
    start = 0
    for pos in range(1, byte_owner.size + 1):
        if pos == byte_owner.size or byte_owner[pos] != byte_owner[start]:
            ci = int(byte_owner[start])
            if ci < 0:
                regions.append(Region(PAD, "constant (padding)", start, pos, 1))
            else:
                view = channels[ci].views[name]
                regions.append(Region(channels[ci].key, view.title, start, pos, view.width))
            start = pos
    unexplained = int((buf.touched & (owner < 0)).sum())
    return BufferMap(name, byte_owner.size, ordered, regions, unexplained)
