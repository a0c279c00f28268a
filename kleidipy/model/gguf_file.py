"""GGUF model files: open (memory-mapped, via ``gguf.GGUFReader``), validate, and expose metadata, hyper-parameters
and tensors.

Validation covers what llama.cpp checks before it runs a model: magic, version (2 or 3), little-endian, alignment,
every tensor's type, row length and data range inside the file (aligned), a known architecture (llama, qwen2),
the hyper-parameters, and every tensor the architecture needs with the shape its hyper-parameters imply (no missing
and no unexpected tensors). Every bad input raises a :class:`GGUFError` subclass whose one-line message names the
file and the problem.

Tensor data is never copied: :attr:`Tensor.data` is a uint8 view into the file's memory map.
"""

from __future__ import annotations

import enum
import functools
import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
# architectures and hyper-parameters


class RopeType(enum.IntEnum):
    """How RoPE pairs the dimensions of a head (llama.cpp's ``LLAMA_ROPE_TYPE_*`` values)."""

    NORM = 0  #: adjacent pairs (x[2i], x[2i+1]): llama
    NEOX = 2  #: halves (x[i], x[i + n_rot/2]): GPT-NeoX, qwen2


@dataclass(frozen=True)
class Architecture:
    """What distinguishes the supported decoder-only architectures in a GGUF file."""

    name: str
    rope_type: RopeType
    qkv_bias: bool  #: q/k/v projections have biases (required); otherwise they are optional
    output_bias: bool  #: an optional attn_output bias is accepted


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", RopeType.NORM, qkv_bias=False, output_bias=True),
    "qwen2": Architecture("qwen2", RopeType.NEOX, qkv_bias=True, output_bias=False),
}


@dataclass(frozen=True)
class HyperParameters:
    """The model hyper-parameters of a GGUF file (llama.cpp's ``llama_hparams`` for the supported architectures)."""

    architecture: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  #: per-head size of Q, K and V (attention.key_length, default n_embd / n_head)
    n_ff: int
    n_rot: int  #: number of rotated dimensions per head (rope.dimension_count, default head_dim)
    rms_eps: float
    rope_type: RopeType
    rope_freq_base: float
    rope_freq_scale: float  #: 1 / rope.scaling.factor (linear scaling), 1.0 without scaling
    rope_scaling: str  #: "none" or "linear"
    tied_embeddings: bool  #: no output.weight: the LM head is token_embd

    @property
    def n_group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_head // self.n_head_kv

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim


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


class _PastEnd(Exception):
    """A read past the end of the mapped file (raised inside the reader, turned into GGUFFormatError)."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__(start, end)
        self.start, self.end = start, end


class _BadTensorInfo(Exception):
    """A tensor-info record that cannot describe valid data (turned into GGUFTensorError)."""


class _BoundedReader(gguf.GGUFReader):
    """``GGUFReader`` that refuses any read past the end of the file (the stock reader silently returns short
    arrays there, which later surface as reshape/index errors or very long loops) and that checks each tensor-info
    record (type, dims, data range, alignment) before the stock code builds the tensor views."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        end = int(offset) + _itemsize(dtype) * int(count)
        if end > self.data.shape[0]:
            raise _PastEnd(int(offset), end)
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        size = self.data.shape[0]
        for field in fields:
            name = field.name
            _len, _name, n_dims, dims, raw_type, offset = field.parts
            if not 1 <= int(n_dims[0]) <= GGML_MAX_DIMS:
                raise _BadTensorInfo(f"tensor '{name}' has {int(n_dims[0])} dims (1..{GGML_MAX_DIMS} allowed)")
            ne = [int(d) for d in dims]
            try:
                ggml_type = GGMLType(int(raw_type[0]))
            except ValueError:
                raise _BadTensorInfo(f"tensor '{name}' has unknown ggml type {int(raw_type[0])}") from None
            block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
            if min(ne) <= 0 or ne[0] % block:
                raise _BadTensorInfo(
                    f"tensor '{name}' has shape {ne}: dims must be > 0 and ne[0] a multiple of {block} "
                    f"for {ggml_type.name}"
                )
            n_bytes = math.prod(ne) // block * type_size
            start = int(start_offs) + int(offset[0])
            if int(offset[0]) % self.alignment:
                raise _BadTensorInfo(
                    f"tensor '{name}' data offset {int(offset[0])} is not a multiple of the alignment {self.alignment}"
                )
            if start + n_bytes > size:
                raise _BadTensorInfo(
                    f"tensor '{name}' data [{start}, {start + n_bytes}) extends past the end of the file "
                    f"({size} bytes): truncated file"
                )
        super()._build_tensors(start_offs, fields)


@functools.cache
def _itemsize(dtype: Any) -> int:
    return np.dtype(dtype).itemsize


def _read_preamble(path: Path) -> int:
    """Check magic, byte order and version from the first 8 bytes; returns the file size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise GGUFOpenError(f"{path}: cannot open: {e.strerror or e}") from None
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        if len(head) < 4 and GGUF_MAGIC.startswith(head):
            raise GGUFFormatError(f"{path}: truncated file ({size} bytes): no GGUF header")
        raise GGUFFormatError(f"{path}: bad magic {head[:4]!r} (expected {GGUF_MAGIC!r}): not a GGUF file")
    if len(head) < 8:
        raise GGUFFormatError(f"{path}: truncated file ({size} bytes): no GGUF version")
    (version,) = struct.unpack("<I", head[4:8])
    if version & 0xFFFF == 0 and version != 0:
        raise GGUFFormatError(f"{path}: big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFFormatError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    return size


def _open_reader(path: Path) -> gguf.GGUFReader:
    size = _read_preamble(path)
    try:
        return _BoundedReader(path)
    except _PastEnd as e:
        raise GGUFFormatError(
            f"{path}: truncated file: the header needs bytes up to {e.end} but the file has {size}"
        ) from None
    except _BadTensorInfo as e:
        raise GGUFTensorError(f"{path}: {e}") from None
    except OSError as e:
        raise GGUFOpenError(f"{path}: cannot map: {e.strerror or e}") from None
    except (ValueError, KeyError, IndexError, OverflowError, TypeError, MemoryError, struct.error) as e:
        # duplicate keys/tensors, unknown value types, invalid UTF-8, bad general.alignment, ...
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GGUFFormatError(f"{path}: corrupt GGUF header: {detail}") from None


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
_MISSING = object()


class GGUFFile:
    """A validated GGUF model file of a supported architecture.

    ``GGUFFile(path)`` maps the file, validates it (see the module docstring) and raises a :class:`GGUFError`
    subclass on any problem. Metadata has typed accessors (:meth:`get_int`, :meth:`get_float`, :meth:`get_str`,
    :meth:`get_bool`, :meth:`get_array`); :attr:`hparams` holds the hyper-parameters and :meth:`tensor` returns
    tensors by name.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        reader = _open_reader(self.path)
        self.version = int(reader.fields["GGUF.version"].parts[-1][0])
        self.alignment = int(reader.alignment)
        self._fields = {k: v for k, v in reader.fields.items() if not k.startswith("GGUF.")}
        self.tensors: Mapping[str, Tensor] = {
            t.name: Tensor(
                name=t.name,
                ggml_type=GGMLType(t.tensor_type),
                shape=tuple(int(d) for d in t.shape),
                data=np.asarray(t.data).reshape(-1).view(np.uint8).reshape(-1, _row_bytes(t)),
                offset=int(t.data_offset),
            )
            for t in reader.tensors
        }
        self.architecture = self.get_str("general.architecture")
        if self.architecture not in ARCHITECTURES:
            known = ", ".join(sorted(ARCHITECTURES))
            raise UnsupportedArchitectureError(
                f"{self.path}: unsupported architecture '{self.architecture}' (supported: {known})"
            )
        self.hparams = self._read_hparams(ARCHITECTURES[self.architecture])
        self._check_tensors(ARCHITECTURES[self.architecture])

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, architecture={self.architecture!r}, tensors={len(self.tensors)})"

    # -- metadata ------------------------------------------------------------------------------------------------

    @property
    def fields(self) -> Mapping[str, gguf.ReaderField]:
        """The raw metadata fields (GGUF.* header fields excluded), e.g. for the tokenizer."""
        return self._fields

    def keys(self) -> Iterator[str]:
        """Metadata keys in file order."""
        return iter(self._fields)

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def value_type(self, key: str) -> GGUFValueType | None:
        """The GGUF value type of ``key`` (ARRAY for arrays), or None when absent."""
        field = self._fields.get(key)
        return field.types[0] if field is not None and field.types else None

    def _field(self, key: str, default: Any, allowed: frozenset, what: str) -> Any:
        field = self._fields.get(key)
        if field is None:
            if default is _MISSING:
                raise GGUFMetadataError(f"{self.path}: missing metadata key '{key}'")
            return default
        if field.types[0] not in allowed:
            raise GGUFMetadataError(f"{self.path}: metadata key '{key}' has type {_type_name(field)}, expected {what}")
        return field

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        field = self._field(key, default, _INT_TYPES, "an integer")
        return field if field is default else int(field.parts[-1][0])

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        field = self._field(key, default, _FLOAT_TYPES, "a float")
        return field if field is default else float(field.parts[-1][0])

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        field = self._field(key, default, frozenset({GGUFValueType.BOOL}), "a bool")
        return field if field is default else bool(field.parts[-1][0])

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        field = self._field(key, default, frozenset({GGUFValueType.STRING}), "a string")
        if field is default:
            return field
        try:
            return bytes(field.parts[-1]).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFMetadataError(f"{self.path}: metadata key '{key}' is not valid UTF-8") from None

    def get_array(self, key: str, default: Any = _MISSING) -> list:
        """An array value as a Python list (strings decoded as UTF-8, numbers as int/float/bool)."""
        field = self._field(key, default, frozenset({GGUFValueType.ARRAY}), "an array")
        if field is default:
            return field
        try:
            return field.contents()
        except UnicodeDecodeError:
            raise GGUFMetadataError(f"{self.path}: metadata array '{key}' is not valid UTF-8") from None

    def array_length(self, key: str) -> int | None:
        """Number of elements of an array value without decoding it (None when absent)."""
        field = self._field(key, None, frozenset({GGUFValueType.ARRAY}), "an array")
        return None if field is None else len(field.data)

    def _int_or_uniform_array(self, key: str, default: Any = _MISSING) -> int:
        """llama.cpp's get_key_or_arr for per-layer values: a scalar, or an array whose entries are all equal."""
        if self.value_type(key) != GGUFValueType.ARRAY:
            return self.get_int(key, default)
        values = self.get_array(key)
        if not values or any(v != values[0] for v in values) or not isinstance(values[0], int):
            raise UnsupportedModelError(f"{self.path}: per-layer values of '{key}' are not supported: {values[:8]}")
        return int(values[0])

    # -- validation ----------------------------------------------------------------------------------------------

    def _read_hparams(self, arch: Architecture) -> HyperParameters:
        a = arch.name
        n_embd = self.get_int(f"{a}.embedding_length")
        n_head = self._int_or_uniform_array(f"{a}.attention.head_count")
        n_layer = self.get_int(f"{a}.block_count")
        n_ctx_train = self.get_int(f"{a}.context_length")
        n_ff = self._int_or_uniform_array(f"{a}.feed_forward_length")
        for key, value in (
            ("embedding_length", n_embd),
            ("attention.head_count", n_head),
            ("block_count", n_layer),
            ("context_length", n_ctx_train),
            ("feed_forward_length", n_ff),
        ):
            if value <= 0:
                raise GGUFMetadataError(f"{self.path}: {a}.{key} = {value} must be > 0")
        n_head_kv = self._int_or_uniform_array(f"{a}.attention.head_count_kv", n_head)
        if n_head_kv <= 0 or n_head % n_head_kv:
            raise GGUFMetadataError(
                f"{self.path}: {a}.attention.head_count_kv = {n_head_kv} must divide head_count = {n_head}"
            )
        if self.get_int(f"{a}.expert_count", 0) > 0:
            raise UnsupportedModelError(f"{self.path}: mixture-of-experts models are not supported")
        default_head_dim = n_embd // n_head if n_embd % n_head == 0 else _MISSING
        if default_head_dim is _MISSING and f"{a}.attention.key_length" not in self:
            raise GGUFMetadataError(
                f"{self.path}: {a}.embedding_length = {n_embd} is not a multiple of head_count = {n_head}"
            )
        head_dim = self.get_int(f"{a}.attention.key_length", default_head_dim)
        head_dim_v = self.get_int(f"{a}.attention.value_length", head_dim)
        if head_dim <= 0 or head_dim % 2 or head_dim_v != head_dim:
            raise UnsupportedModelError(
                f"{self.path}: head sizes key={head_dim} value={head_dim_v} are not supported (need equal, even, > 0)"
            )
        n_rot = self.get_int(f"{a}.rope.dimension_count", head_dim)
        if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
            raise GGUFMetadataError(
                f"{self.path}: {a}.rope.dimension_count = {n_rot} must be even and in 2..{head_dim}"
            )
        rms_eps = self.get_float(f"{a}.attention.layer_norm_rms_epsilon")
        freq_base = self.get_float(f"{a}.rope.freq_base", 10000.0)
        if not (rms_eps > 0 and math.isfinite(rms_eps)) or not (freq_base > 0 and math.isfinite(freq_base)):
            raise GGUFMetadataError(
                f"{self.path}: layer_norm_rms_epsilon = {rms_eps} and rope.freq_base = {freq_base} must be > 0"
            )
        scaling = self.get_str(f"{a}.rope.scaling.type", "none")
        factor = self.get_float(f"{a}.rope.scaling.factor", self.get_float(f"{a}.rope.scale_linear", 0.0))
        if scaling not in ("none", "linear"):
            raise UnsupportedModelError(f"{self.path}: rope scaling '{scaling}' is not supported (none, linear)")
        if factor < 0 or not math.isfinite(factor):
            raise GGUFMetadataError(f"{self.path}: rope scaling factor {factor} must be >= 0")
        n_vocab = self._n_vocab(a)
        return HyperParameters(
            architecture=a,
            n_vocab=n_vocab,
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=n_ff,
            n_rot=n_rot,
            rms_eps=rms_eps,
            rope_type=arch.rope_type,
            rope_freq_base=freq_base,
            rope_freq_scale=1.0 if factor == 0.0 else 1.0 / factor,
            rope_scaling=scaling,
            tied_embeddings="output.weight" not in self.tensors,
        )

    def _n_vocab(self, a: str) -> int:
        """Vocabulary size: {arch}.vocab_size, else the tokenizer's token count, else token_embd's row count."""
        n_tokens = self.array_length("tokenizer.ggml.tokens")
        n_vocab = self.get_int(f"{a}.vocab_size", n_tokens)
        if n_vocab is None:
            embd = self.tensors.get("token_embd.weight")
            if embd is None or len(embd.shape) != 2:
                raise GGUFMetadataError(f"{self.path}: cannot tell the vocabulary size (no {a}.vocab_size)")
            n_vocab = embd.shape[1]
        if n_vocab <= 0 or (n_tokens is not None and n_tokens != n_vocab):
            raise GGUFMetadataError(
                f"{self.path}: vocabulary size {n_vocab} does not match the {n_tokens} tokenizer tokens"
            )
        return n_vocab

    def tensor_schema(self) -> dict[str, tuple[tuple[int, ...], bool]]:
        """Every tensor the architecture reads: name -> (shape in ggml order, required)."""
        hp = self.hparams
        arch = ARCHITECTURES[hp.architecture]
        d, q, kv, ff, v = hp.n_embd, hp.n_embd_q, hp.n_embd_kv, hp.n_ff, hp.n_vocab
        schema: dict[str, tuple[tuple[int, ...], bool]] = {
            "token_embd.weight": ((d, v), True),
            "output_norm.weight": ((d,), True),
            "output.weight": ((d, v), False),
            "rope_freqs.weight": ((hp.n_rot // 2,), False),
        }
        for i in range(hp.n_layer):
            schema.update(
                {
                    f"blk.{i}.attn_norm.weight": ((d,), True),
                    f"blk.{i}.attn_q.weight": ((d, q), True),
                    f"blk.{i}.attn_k.weight": ((d, kv), True),
                    f"blk.{i}.attn_v.weight": ((d, kv), True),
                    f"blk.{i}.attn_output.weight": ((q, d), True),
                    f"blk.{i}.attn_q.bias": ((q,), arch.qkv_bias),
                    f"blk.{i}.attn_k.bias": ((kv,), arch.qkv_bias),
                    f"blk.{i}.attn_v.bias": ((kv,), arch.qkv_bias),
                    f"blk.{i}.ffn_norm.weight": ((d,), True),
                    f"blk.{i}.ffn_gate.weight": ((d, ff), True),
                    f"blk.{i}.ffn_up.weight": ((d, ff), True),
                    f"blk.{i}.ffn_down.weight": ((ff, d), True),
                }
            )
            if arch.output_bias:
                schema[f"blk.{i}.attn_output.bias"] = ((d,), False)
        return schema

    def _check_tensors(self, arch: Architecture) -> None:
        if 9 * self.hparams.n_layer > len(self.tensors):  # each block has at least 9 tensors
            raise GGUFTensorError(
                f"{self.path}: {arch.name}.block_count = {self.hparams.n_layer} but the file has only "
                f"{len(self.tensors)} tensors"
            )
        schema = self.tensor_schema()
        for name in self.tensors:
            if name not in schema:
                raise GGUFTensorError(f"{self.path}: unexpected tensor '{name}' for architecture '{arch.name}'")
        for name, (shape, required) in schema.items():
            t = self.tensors.get(name)
            if t is None:
                if required:
                    raise GGUFTensorError(f"{self.path}: missing tensor '{name}'")
                continue
            if t.shape != shape:
                raise GGUFTensorError(
                    f"{self.path}: tensor '{name}' has shape {list(t.shape)}, expected {list(shape)} "
                    "from the hyper-parameters"
                )
            allowed = WEIGHT_TYPES if len(shape) == 2 else VECTOR_TYPES
            if t.ggml_type not in allowed:
                raise GGUFTensorError(f"{self.path}: tensor '{name}' has unsupported type {t.ggml_type.name}")

    # -- tensors -------------------------------------------------------------------------------------------------

    def tensor(self, name: str) -> Tensor:
        """The tensor ``name``; a GGUFTensorError when absent."""
        t = self.tensors.get(name)
        if t is None:
            raise GGUFTensorError(f"{self.path}: missing tensor '{name}'")
        return t


def _row_bytes(t: Any) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[GGMLType(t.tensor_type)]
    return int(t.shape[0]) // block * type_size


def _type_name(field: Any) -> str:
    names = [t.name for t in field.types]
    return names[0] if len(names) == 1 else f"{names[0]}[{names[-1]}]"
