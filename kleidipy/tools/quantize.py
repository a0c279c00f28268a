"""``kleidipy quantize``: requantize a GGUF model to Q4_0 or Q8_0 exactly as llama.cpp's ``llama-quantize`` does,
byte for byte. The output goes to a temporary file beside OUT, renamed into place only when complete.

What llama-quantize does, rule by rule: docs/quantize.md."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GGMLType
from gguf import GGUFValueType, LlamaFileType
from tqdm import tqdm

from kleidipy import formats
from kleidipy.errors import KleidipyError
from kleidipy.runtime.gguf_file import Tensor
from kleidipy.runtime.model_file import ModelFile

#: ``--type`` choices: the tensor type and the ``general.file_type`` llama-quantize writes for it.
QUANT_TYPES: dict[str, tuple[GGMLType, LlamaFileType]] = {
    "q4_0": (GGMLType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q8_0": (GGMLType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}
#: the type llama-quantize gives the LM head unless the file type is Q8_0
_HEAD_TYPE = GGMLType.Q6_K
#: keys llama-quantize drops (a split model is written as one file)
_SPLIT_KEYS = (
    gguf.Keys.Split.LLM_KV_SPLIT_NO,
    gguf.Keys.Split.LLM_KV_SPLIT_COUNT,
    gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT,
)
_LAYER = re.compile(r"blk\.\s*([+-]?\d+)")


class QuantizeError(KleidipyError, ValueError):
    """A model that cannot be requantized as asked (a tensor whose rows do not split into blocks, ...)."""


class UnsupportedQuantTypeError(QuantizeError):
    """A ``--type`` kleidipy cannot quantize to (only q4_0 and q8_0)."""


class OutputPathError(QuantizeError, OSError):
    """An output path that cannot be written: missing directory, a directory, or the input file itself."""


@dataclass(frozen=True)
class TensorResult:
    """What happened to one tensor: its types before and after, and whether it was requantized or copied."""

    name: str
    shape: tuple[int, ...]  #: ggml order (shape[0] is the row length)
    src_type: GGMLType
    dst_type: GGMLType
    n_bytes: int

    @property
    def action(self) -> str:
        if self.src_type == self.dst_type:
            return "copied_unchanged"
        return f"dequantized_{self.src_type.name}_to_f32_then_quantized_{self.dst_type.name}"


@dataclass
class QuantizeReport:
    """The result of :func:`quantize_gguf`: tensors in file order, sizes, time and the notices given."""

    src: Path
    dst: Path
    qtype: str
    pure: bool
    file_type: int
    tensors: list[TensorResult] = field(default_factory=list)
    size_in: int = 0
    size_out: int = 0
    seconds: float = 0.0
    notices: list[str] = field(default_factory=list)

    @property
    def n_requantized(self) -> int:
        return sum(t.src_type != t.dst_type for t in self.tensors)

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.dst_type.name] = counts.get(t.dst_type.name, 0) + 1
        return counts

    def summary(self) -> str:
        types = ", ".join(f"{n} {name}" for name, n in sorted(self.type_counts().items()))
        return (
            f"{self.dst}: {len(self.tensors)} tensors ({types}; {self.n_requantized} requantized), "
            f"{self.size_in / 2**20:.2f} MiB -> {self.size_out / 2**20:.2f} MiB in {self.seconds:.1f} s"
        )


def quant_type(qtype: str) -> tuple[GGMLType, LlamaFileType]:
    """The (tensor type, file type) of a ``--type`` name; UnsupportedQuantTypeError otherwise."""
    try:
        return QUANT_TYPES[qtype.strip().lower()]
    except (KeyError, AttributeError):
        raise UnsupportedQuantTypeError(
            f"cannot quantize to {qtype!r}: supported types are {', '.join(QUANT_TYPES)} "
            "(K-quants and the other llama-quantize types have no quantizer in kleidipy)"
        ) from None


def tensor_order_key(name: str) -> tuple[int, str]:
    """llama.cpp's ``weight_name_comparer``: the layer number of ``blk.N.`` (-1 for other tensors), then the name."""
    m = _LAYER.match(name)
    return (int(m.group(1)) if m else -1, name)


def is_quantizable(t: Tensor) -> bool:
    """llama-quantize's test for the tensors of a dense llama/qwen2 model: 2-D ``*weight`` tensors except norms."""
    return t.name.endswith("weight") and len(t.shape) >= 2 and "_norm.weight" not in t.name


def target_type(t: Tensor, qtype: GGMLType, pure: bool, tied: bool) -> tuple[GGMLType, str | None]:
    """The type llama-quantize gives tensor ``t`` (see docs/quantize.md), and a notice when kleidipy must
    use another one. Raises QuantizeError when the row length does not split into blocks of the type."""
    if not is_quantizable(t):
        return t.ggml_type, None
    new = qtype
    notice = None
    is_head = t.name == "output.weight" or (tied and t.name == "token_embd.weight")
    if not pure and is_head and qtype != GGMLType.Q8_0:
        if t.shape[0] % gguf.GGML_QUANT_SIZES[_HEAD_TYPE][0]:  # llama-quantize's fallback for Q6_K
            new = GGMLType.Q8_0
        else:
            notice = (
                f"{t.name}: llama-quantize's mixture gives {_HEAD_TYPE.name}, which kleidipy cannot quantize: "
                f"using {qtype.name} instead (--pure matches llama-quantize exactly)"
            )
    block = gguf.GGML_QUANT_SIZES[new][0]
    if new != t.ggml_type and t.shape[0] % block:
        raise QuantizeError(
            f"tensor '{t.name}' rows of {t.shape[0]} values do not split into {new.name} blocks of {block}"
        )
    return new, notice


def quantize_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    qtype: str = "q4_0",
    pure: bool = False,
    progress: bool = True,
    notice: Callable[[str], None] = lambda msg: print(f"kleidipy: {msg}", file=sys.stderr),
) -> QuantizeReport:
    """Requantize GGUF model ``src`` to ``dst`` with ``qtype`` ("q4_0" or "q8_0") as ``llama-quantize
    --allow-requantize [--pure] src dst TYPE`` does (see docs/quantize.md). Returns a :class:`QuantizeReport`."""
    t0 = time.perf_counter()
    tensor_type, file_type = quant_type(qtype)
    src_path, dst_path = Path(src), Path(dst)
    _check_output(src_path, dst_path)
    model = ModelFile(src_path)  # typed GGUFError for a missing, unreadable or invalid input
    tied = model.hparams.tied_embeddings
    tensors = sorted(model.tensors.values(), key=lambda t: tensor_order_key(t.name))
    report = QuantizeReport(src_path, dst_path, qtype.lower(), pure, int(file_type), size_in=src_path.stat().st_size)
    plan = []
    for t in tensors:
        new, message = target_type(t, tensor_type, pure, tied)
        if message:
            notice(message)
            report.notices.append(message)
        plan.append((t, new))

    writer = _writer_with_metadata(model, file_type)
    for t, new in plan:
        n_bytes = _row_bytes(t.shape[0], new) * t.n_rows
        writer.add_tensor_info(t.name, _byte_shape(t.shape, new), np.dtype(np.uint8), n_bytes, raw_dtype=new)
        report.tensors.append(TensorResult(t.name, t.shape, t.ggml_type, new, n_bytes))

    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst_path.name}.", suffix=".part", dir=dst_path.parent)
    os.close(fd)
    bar = tqdm(total=len(plan), desc="quantize", unit="tensor", disable=not progress, file=sys.stderr, leave=False)
    try:
        writer.write_header_to_file(Path(tmp_name))
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, new in plan:
            bar.set_postfix_str(t.name, refresh=False)
            writer.write_tensor_data(requantize(t, new))
            bar.update()
        writer.close()
        os.chmod(tmp_name, 0o644)  # mkstemp made it private
        os.replace(tmp_name, dst_path)
    except BaseException:
        writer.close()
        Path(tmp_name).unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    report.size_out = dst_path.stat().st_size
    report.seconds = time.perf_counter() - t0
    return report


def requantize(t: Tensor, new: GGMLType) -> np.ndarray:
    """The bytes of tensor ``t`` in type ``new``: its own bytes when the type is unchanged, else dequantized to
    float32 (ggml's ``to_float``) and quantized with ggml's reference quantizer."""
    if t.ggml_type == new:
        return t.data
    values = formats.dequantize(t.data, t.ggml_type, t.n_rows, t.shape[0])
    try:
        return formats.quantize(values, new).reshape(t.n_rows, -1)
    except KleidipyError as exc:
        raise QuantizeError(f"tensor '{t.name}': {exc}") from exc


def _check_output(src: Path, dst: Path) -> None:
    parent = dst.parent
    if not parent.is_dir():
        raise OutputPathError(f"output directory {parent} does not exist")
    if dst.is_dir():
        raise OutputPathError(f"output {dst} is a directory")
    if not os.access(parent, os.W_OK):
        raise OutputPathError(f"output directory {parent} is not writable")
    if dst.exists() and src.exists() and dst.samefile(src):
        raise OutputPathError(f"output {dst} is the input file")


def _byte_shape(shape: tuple[int, ...], t: GGMLType) -> tuple[int, ...]:
    """numpy byte shape [..., row_bytes] of a tensor of ggml shape ``shape`` in type ``t`` (GGUFWriter's form)."""
    rev = tuple(reversed(shape))
    return (*rev[:-1], _row_bytes(rev[-1], t))


def _row_bytes(k: int, t: GGMLType) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[t]
    return k // block * type_size


def _writer_with_metadata(model: ModelFile, file_type: LlamaFileType) -> gguf.GGUFWriter:
    """A GGUFWriter holding the input's metadata as llama-quantize rewrites it (see docs/quantize.md)."""
    writer = gguf.GGUFWriter(None, model.architecture)
    writer.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE)  # added by the constructor; re-added in source order
    moved = (gguf.Keys.General.QUANTIZATION_VERSION, gguf.Keys.General.FILE_TYPE)
    for key, f in model.fields.items():
        if key in moved or key in _SPLIT_KEYS:
            continue
        writer.add_key_value(key, *_field_value(model, key, f))
    if gguf.Keys.General.ALIGNMENT in model:
        writer.data_alignment = model.alignment
    writer.add_uint32(gguf.Keys.General.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION)
    writer.add_uint32(gguf.Keys.General.FILE_TYPE, int(file_type))
    return writer


def _field_value(model: ModelFile, key: str, f: gguf.ReaderField) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """(value, type, array sub-type) of a metadata field, strings as raw bytes so they round-trip exactly."""
    vtype = f.types[0]
    if vtype == GGUFValueType.STRING:
        return bytes(f.parts[-1]), vtype, None
    if vtype != GGUFValueType.ARRAY:
        return f.parts[-1].tolist()[0], vtype, None
    sub = f.types[-1]
    if len(f.types) != 2 or sub == GGUFValueType.ARRAY:
        raise QuantizeError(f"{model.path}: metadata key '{key}' is a nested array, which GGUFWriter cannot write")
    if not f.data:
        raise QuantizeError(f"{model.path}: metadata key '{key}' is an empty array, which GGUFWriter cannot write")
    if sub == GGUFValueType.STRING:
        return [bytes(f.parts[i]) for i in f.data], vtype, sub
    return np.concatenate([f.parts[i] for i in f.data]).tolist(), vtype, sub
