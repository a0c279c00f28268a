"""GGUF files as a container: open (memory-mapped, the header parsed here in one pass), validate the format, and
expose metadata and tensors. Format facts only: what a model needs of a file is in :mod:`kleidipy.runtime.model_file`
and the architecture modules. Every bad input raises a :class:`GGUFError` subclass.

What is validated, and why opening is fast: docs/gguf.md."""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GGMLType
from gguf import GGUFValueType

from kleidipy.errors import KleidipyError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4

#: ggml types a 2-D weight may have: those ``gguf.quants`` can dequantize (the float reference backend needs it).
WEIGHT_TYPES = frozenset(
    {
        GGMLType.F32,
        GGMLType.F16,
        GGMLType.BF16,
        GGMLType.Q4_0,
        GGMLType.Q4_1,
        GGMLType.Q5_0,
        GGMLType.Q5_1,
        GGMLType.Q8_0,
        GGMLType.Q2_K,
        GGMLType.Q3_K,
        GGMLType.Q4_K,
        GGMLType.Q5_K,
        GGMLType.Q6_K,
    }
)
#: ggml types a 1-D tensor (norm weight, bias, rope frequency factors) may have.
VECTOR_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})


# ---------------------------------------------------------------------------------------------------------------
# errors


class GGUFError(KleidipyError):
    """Base of every error raised while opening or validating a GGUF file."""

    def __str__(self) -> str:  # names read from a corrupt file may hold control characters: keep one line
        return super().__str__().replace("\r", "\\r").replace("\n", "\\n")


class GGUFOpenError(GGUFError, OSError):
    """The file cannot be opened or mapped (missing, unreadable, empty)."""


class GGUFFormatError(GGUFError, ValueError):
    """The bytes are not a valid GGUF file (bad magic, version, truncated or corrupt header, bad alignment)."""


class GGUFMetadataError(GGUFFormatError):
    """A metadata key the model needs is missing, has the wrong type, or an impossible value."""


class GGUFTensorError(GGUFFormatError):
    """A tensor is missing, unexpected, of the wrong shape or type, or its data is not inside the file."""


class UnsupportedArchitectureError(GGUFError, ValueError):
    """``general.architecture`` names an architecture this runtime does not implement."""


class UnsupportedModelError(GGUFError, ValueError):
    """A valid model of a known architecture that uses a feature this runtime does not implement (YaRN, MoE...)."""


# ---------------------------------------------------------------------------------------------------------------
# tensors


@dataclass(frozen=True)
class Tensor:
    """One tensor of a GGUF file: type, shape in ggml order (``shape[0]`` is the contiguous row length) and its raw
    bytes as a uint8 view ``[n_rows, row_bytes]`` into the memory map."""

    name: str
    ggml_type: GGMLType
    shape: tuple[int, ...]
    data: np.ndarray
    offset: int  #: absolute byte offset of the data in the file

    @property
    def n_rows(self) -> int:
        return self.data.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.data.shape[1]

    def to_float(self) -> np.ndarray:
        """Dequantized float32 values in numpy order (the reversed ggml shape): a new array."""
        values = gguf.quants.dequantize(self.data, self.ggml_type)
        return np.array(values, dtype=np.float32).reshape(tuple(reversed(self.shape)))


# ---------------------------------------------------------------------------------------------------------------
# reading

_PREAMBLE = struct.Struct("<4sIQQ")  # magic, version, tensor count, key/value count
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
#: each scalar value type's little-endian layout (an array of them is a numpy view with the same dtype)
_SCALARS: dict[GGUFValueType, struct.Struct] = {
    t: struct.Struct(f)
    for t, f in (
        (GGUFValueType.UINT8, "<B"),
        (GGUFValueType.INT8, "<b"),
        (GGUFValueType.UINT16, "<H"),
        (GGUFValueType.INT16, "<h"),
        (GGUFValueType.UINT32, "<I"),
        (GGUFValueType.INT32, "<i"),
        (GGUFValueType.FLOAT32, "<f"),
        (GGUFValueType.BOOL, "<?"),
        (GGUFValueType.UINT64, "<Q"),
        (GGUFValueType.INT64, "<q"),
        (GGUFValueType.FLOAT64, "<d"),
    )
}


class _Value(NamedTuple):
    """One metadata value as read: a scalar as a Python value, a string as ``str`` decoded with
    ``surrogateescape`` (so ``encode("utf-8", "surrogateescape")`` gives the file's exact bytes back), an array of
    strings as a list of them, any other array as a read-only numpy view into the map (bool arrays as a copy)."""

    type: GGUFValueType
    item_type: GGUFValueType | None  #: the element type of an ARRAY
    value: Any
    offset: int  #: where the key/value record starts in the file

    def type_name(self) -> str:
        return self.type.name if self.item_type is None else f"{self.type.name}[{self.item_type.name}]"

    def plain(self) -> Any:
        """The value with arrays as new lists of Python values."""
        if isinstance(self.value, np.ndarray):
            return self.value.tolist()
        return list(self.value) if isinstance(self.value, list) else self.value


def _map(path: Path) -> mmap.mmap:
    """The file mapped read-only, after checking magic, byte order and version from its first 8 bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if len(head) == 8 else None
    except OSError as e:
        raise GGUFOpenError(f"{path}: cannot open: {e.strerror or e}") from None
    if not GGUF_MAGIC.startswith(head[:4]):
        raise GGUFFormatError(f"{path}: bad magic {head[:4]!r} (expected {GGUF_MAGIC!r}): not a GGUF file")
    if buf is None:
        what = "header" if len(head) < 4 else "version"
        raise GGUFFormatError(f"{path}: truncated file ({len(head)} bytes): no GGUF {what}")
    (version,) = _U32.unpack_from(head, 4)
    if version & 0xFFFF == 0 and version != 0:
        raise GGUFFormatError(f"{path}: big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFFormatError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    return buf


class _HeaderReader:
    """Sequential little-endian reads of the header from the map, each checked to lie inside the file."""

    def __init__(self, path: Path, buf: mmap.mmap) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, len(buf), 0

    def corrupt(self, detail: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: corrupt GGUF header: {detail}")

    def truncated(self, end: int) -> GGUFFormatError:
        return GGUFFormatError(
            f"{self.path}: truncated file: the header needs bytes up to {end} but the file has {self.size}"
        )

    def skip(self, n: int) -> int:
        """Moves past the next ``n`` bytes; returns where they start."""
        start, self.pos = self.pos, self.pos + n
        if self.pos > self.size:
            raise self.truncated(self.pos)
        return start

    def unpack(self, layout: struct.Struct) -> tuple:
        return layout.unpack_from(self.buf, self.skip(layout.size))

    def u32(self) -> int:
        return self.unpack(_U32)[0]

    def u64(self) -> int:
        return self.unpack(_U64)[0]

    def name(self, what: str) -> str:
        """A string that must be valid UTF-8: a key or a tensor name."""
        at = self.pos
        start = self.skip(self.u64())
        try:
            return self.buf[start : self.pos].decode("utf-8")
        except UnicodeDecodeError:
            raise self.corrupt(f"{what} at offset {at} is not valid UTF-8") from None

    def value_type(self, key: str) -> GGUFValueType:
        raw = self.u32()
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.corrupt(f"key '{key}' has unknown value type {raw}") from None

    def metadata(self, n_kv: int) -> dict[str, _Value]:
        values: dict[str, _Value] = {}
        for _ in range(n_kv):  # each record takes >= 13 bytes: a huge count stops at the end of the file
            offset = self.pos
            key = self.name("key")
            if key in values:
                raise self.corrupt(f"duplicate key '{key}' at offset {offset}")
            values[key] = self.value(key, offset)
        return values

    def value(self, key: str, offset: int) -> _Value:
        vtype = self.value_type(key)
        if vtype == GGUFValueType.STRING:
            return _Value(vtype, None, self.strings(1)[0], offset)
        if vtype != GGUFValueType.ARRAY:
            return _Value(vtype, None, self.unpack(_SCALARS[vtype])[0], offset)
        item = self.value_type(key)
        n = self.u64()
        if item == GGUFValueType.ARRAY:
            raise self.corrupt(f"key '{key}' is an array of arrays (GGUF readers reject nested arrays)")
        if item == GGUFValueType.STRING:
            return _Value(vtype, item, self.strings(n), offset)
        layout = _SCALARS[item]
        start = self.skip(n * layout.size)
        if item == GGUFValueType.BOOL:
            return _Value(vtype, item, np.frombuffer(self.buf, np.uint8, n, start) != 0, offset)
        return _Value(vtype, item, np.frombuffer(self.buf, layout.format, n, start), offset)

    def strings(self, n: int) -> list[str]:
        """``n`` strings (u64 length + bytes each) decoded with surrogateescape: the hot loop for vocabularies."""
        buf, size, pos = self.buf, self.size, self.pos
        if n > (size - pos) // 8:  # each takes >= 8 bytes
            raise self.truncated(pos + 8 * n)
        length_at = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(n):
            if pos + 8 > size:
                raise self.truncated(pos + 8)
            start = pos + 8
            pos = start + length_at(buf, pos)[0]
            if pos > size:
                raise self.truncated(pos)
            append(buf[start:pos].decode("utf-8", "surrogateescape"))
        self.pos = pos
        return out

    def tensor_infos(self, n_tensors: int) -> list[tuple[str, GGMLType, tuple[int, ...], int]]:
        """The tensor-info records: (name, type, shape in ggml order, data offset from the data section)."""
        infos: dict[str, tuple[str, GGMLType, tuple[int, ...], int]] = {}
        for _ in range(n_tensors):  # each record takes >= 24 bytes
            name = self.name("tensor name")
            if name in infos:
                raise GGUFTensorError(f"{self.path}: duplicated tensor '{name}'")
            n_dims = self.u32()
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise GGUFTensorError(f"{self.path}: tensor '{name}' has {n_dims} dims (1..{GGML_MAX_DIMS} allowed)")
            ne = struct.unpack_from(f"<{n_dims}Q", self.buf, self.skip(8 * n_dims))
            raw_type = self.u32()
            try:
                ggml_type = GGMLType(raw_type)
            except ValueError:
                raise GGUFTensorError(f"{self.path}: tensor '{name}' has unknown ggml type {raw_type}") from None
            block = gguf.GGML_QUANT_SIZES[ggml_type][0]
            if min(ne) <= 0 or ne[0] % block:
                raise GGUFTensorError(
                    f"{self.path}: tensor '{name}' has shape {list(ne)}: dims must be > 0 and ne[0] a multiple of "
                    f"{block} for {ggml_type.name}"
                )
            infos[name] = (name, ggml_type, ne, self.u64())
        return list(infos.values())


def _reader_field(key: str, v: _Value) -> gguf.ReaderField:
    """``v`` as ``gguf.GGUFReader`` represents it: numpy ``parts`` (key length, key, type, for an array its item
    type and count, then per item its value, or a string's length and bytes) and ``data`` indexing the values."""
    name = key.encode("utf-8")
    parts: list[np.ndarray] = [
        np.array([len(name)], np.uint64),
        np.frombuffer(name, np.uint8),
        np.array([v.type], np.uint32),
    ]
    is_array = v.item_type is not None
    if is_array:
        parts += [np.array([v.item_type], np.uint32), np.array([len(v.value)], np.uint64)]
    data: list[int] = []
    for i, item in enumerate(v.value if is_array else [v.value]):
        if isinstance(item, str):
            raw = item.encode("utf-8", "surrogateescape")
            parts += [np.array([len(raw)], np.uint64), np.frombuffer(raw, np.uint8)]
        elif is_array:
            parts.append(v.value[i : i + 1])
        else:
            parts.append(np.array([item], _SCALARS[v.type].format))
        data.append(len(parts) - 1)
    types = [v.type, v.item_type] if is_array else [v.type]
    return gguf.ReaderField(v.offset, key, parts, data, types)


_INT_TYPES = frozenset(
    {
        GGUFValueType.UINT8,
        GGUFValueType.INT8,
        GGUFValueType.UINT16,
        GGUFValueType.INT16,
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.UINT64,
        GGUFValueType.INT64,
    }
)
_FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
MISSING = object()


class GGUFContainer:
    """A GGUF file read as a container, whatever it holds (a model, a vocabulary only, ...).

    ``GGUFContainer(path)`` maps the file read-only and parses its header once: magic, version (2 or 3),
    little-endian, every read inside the file, unique keys and tensor names, known value types and no nested
    arrays, ``general.alignment`` a power of two, and for every tensor 1..4 dims, a known ggml type, a row length
    that is a whole number of blocks and an aligned data range inside the file. Any problem raises a
    :class:`GGUFError` subclass. Metadata has typed accessors (:meth:`get_int`, :meth:`get_float`, :meth:`get_str`,
    :meth:`get_bool`, :meth:`get_array`) and plain Python values (:meth:`metadata`); :meth:`tensor` returns
    tensors by name.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        buf = _map(self.path)
        header = _HeaderReader(self.path, buf)
        _magic, self.version, n_tensors, n_kv = header.unpack(_PREAMBLE)
        self._values = header.metadata(n_kv)
        self.alignment = self._alignment()
        infos = header.tensor_infos(n_tensors)
        data_start = -(-header.pos // self.alignment) * self.alignment
        file_bytes = np.frombuffer(buf, np.uint8)
        self._buf = buf
        self.tensors: Mapping[str, Tensor] = {info[0]: self._tensor(file_bytes, data_start, *info) for info in infos}

    def _alignment(self) -> int:
        value = self._values.get("general.alignment")
        if value is None:
            return gguf.GGUF_DEFAULT_ALIGNMENT
        if value.type != GGUFValueType.UINT32:
            raise GGUFFormatError(f"{self.path}: general.alignment has type {value.type_name()}, expected UINT32")
        if value.value == 0 or value.value & (value.value - 1):
            raise GGUFFormatError(f"{self.path}: general.alignment = {value.value} is not a power of two")
        return value.value

    def _tensor(
        self, file_bytes: np.ndarray, data_start: int, name: str, ggml_type: GGMLType, shape: tuple[int, ...], at: int
    ) -> Tensor:
        if at % self.alignment:
            raise GGUFTensorError(
                f"{self.path}: tensor '{name}' data offset {at} is not a multiple of the alignment {self.alignment}"
            )
        block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        row_bytes = shape[0] // block * type_size
        start = data_start + at
        end = start + row_bytes * math.prod(shape[1:])
        if end > file_bytes.size:
            raise GGUFTensorError(
                f"{self.path}: tensor '{name}' data [{start}, {end}) extends past the end of the file "
                f"({file_bytes.size} bytes): truncated file"
            )
        return Tensor(name, ggml_type, shape, file_bytes[start:end].reshape(-1, row_bytes), start)

    # -- metadata ------------------------------------------------------------------------------------------------

    def metadata(self, prefix: str | tuple[str, ...] = "") -> dict[str, Any]:
        """The key/values whose keys start with ``prefix``, in file order, as plain Python values: strings decoded
        with ``surrogateescape`` (token texts keep their exact bytes), arrays as lists."""
        return {key: value.plain() for key, value in self._values.items() if key.startswith(prefix)}

    @functools.cached_property
    def fields(self) -> Mapping[str, gguf.ReaderField]:
        """The metadata as ``gguf.ReaderField`` records, the form ``gguf.GGUFReader.fields`` has (built on first
        use, for code written against the stock reader)."""
        return {key: _reader_field(key, value) for key, value in self._values.items()}

    def keys(self) -> Iterator[str]:
        """Metadata keys in file order."""
        return iter(self._values)

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def value_type(self, key: str) -> GGUFValueType | None:
        """The GGUF value type of ``key`` (ARRAY for arrays), or None when absent."""
        value = self._values.get(key)
        return None if value is None else value.type

    def _value(self, key: str, default: Any, allowed: frozenset, what: str) -> Any:
        value = self._values.get(key)
        if value is None:
            if default is MISSING:
                raise GGUFMetadataError(f"{self.path}: missing metadata key '{key}'")
            return default
        if value.type not in allowed:
            raise GGUFMetadataError(f"{self.path}: metadata key '{key}' has type {value.type_name()}, expected {what}")
        return value.value

    def get_int(self, key: str, default: Any = MISSING) -> int:
        return self._value(key, default, _INT_TYPES, "an integer")

    def get_float(self, key: str, default: Any = MISSING) -> float:
        return self._value(key, default, _FLOAT_TYPES, "a float")

    def get_bool(self, key: str, default: Any = MISSING) -> bool:
        return self._value(key, default, frozenset({GGUFValueType.BOOL}), "a bool")

    def get_str(self, key: str, default: Any = MISSING) -> str:
        value = self._value(key, default, frozenset({GGUFValueType.STRING}), "a string")
        self._check_utf8(key, value)
        return value

    def get_array(self, key: str, default: Any = MISSING) -> list:
        """An array value as a Python list (strings valid UTF-8, numbers as int/float/bool)."""
        value = self._value(key, default, frozenset({GGUFValueType.ARRAY}), "an array")
        if value is default:
            return value
        if isinstance(value, np.ndarray):
            return value.tolist()
        self._check_utf8(key, "".join(value))
        return list(value)

    def _check_utf8(self, key: str, text: Any) -> None:
        """Strings are decoded with surrogateescape: a surrogate left in ``text`` means bytes that are not UTF-8."""
        if isinstance(text, str) and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise GGUFMetadataError(f"{self.path}: metadata key '{key}' is not valid UTF-8") from None

    def array_length(self, key: str) -> int | None:
        """Number of elements of an array value (None when absent)."""
        value = self._value(key, None, frozenset({GGUFValueType.ARRAY}), "an array")
        return None if value is None else len(value)

    # -- tensors -------------------------------------------------------------------------------------------------

    def tensor(self, name: str) -> Tensor:
        """The tensor ``name``; a GGUFTensorError when absent."""
        t = self.tensors.get(name)
        if t is None:
            raise GGUFTensorError(f"{self.path}: missing tensor '{name}'")
        return t

    def release(self, name: str) -> None:
        """Drop the resident pages of tensor ``name`` (e.g. once it is repacked): the mapping stays valid and the
        bytes are read back from the file if used again, so peak RSS stays near file size, not twice it."""
        t = self.tensor(name)
        page = mmap.PAGESIZE
        start = t.offset // page * page
        end = t.offset + t.data.nbytes
        if hasattr(self._buf, "madvise"):
            self._buf.madvise(mmap.MADV_DONTNEED, start, end - start)
