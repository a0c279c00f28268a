"""The repacked-weight cache: a model's packed weights for one target and execution, kept on disk (``repack/`` beside
the model cache) so that the next load reads them instead of converting and packing again. :func:`cache_files` and
:func:`remove_model_caches` serve ``kleidipy models`` and ``kleidipy rm``.

The file's key, header and checks: docs/weights-and-repacking.md."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import struct
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.buffers import HugePageArena, PackedBuffer, PackedLayout, roundup
from kleidipy.errors import KleidipyError
from kleidipy.runtime.pull import cache_dir, catalogue_sha256
from kleidipy.target import Target

#: bumped whenever the file layout, the meaning of its fields or a weight's conversion changes
#: (2: Q5_0/Q6_K/... quantized per channel from their exact values, no longer through Q8_0 blocks; 3: Q5_0/Q6_K/...
#: as int8 codes with the file's scales and offsets, weight type qai8c16, which earlier versions cannot select; 4: the
#: qai8c16 layout in groups of 16 columns × 4 values)
FORMAT_VERSION = 4
_MAGIC = b"KLEIDIPY-REPACK\n"
_ALIGN = 64


class RepackCacheError(KleidipyError, ValueError):
    """A repack cache file that cannot be used (unreadable, truncated, a checksum that does not match) or removed."""


@dataclass(frozen=True)
class CachedWeight:
    """One weight as the backend rebuilds it: its GGUF type, the kernel weight type and shape, the packed bytes."""

    source_type: GGMLType
    weight_type: str
    n: int
    k: int
    packed: PackedBuffer


def repack_dir() -> Path:
    """Where repack cache files live: ``repack/`` beside the model cache directory."""
    return cache_dir().parent / "repack"


def _target_text(target: Target) -> str:
    return f"{target.name}:{','.join(sorted(target.features))}:svl={target.svl_bits}"


def cache_key(model_path: Path, target: Target, execution: str) -> dict[str, str | int]:
    """Everything a cache file's content depends on (a file made for another key is stale)."""
    sha = catalogue_sha256(model_path)
    if sha is None:
        st = model_path.stat()
        model = f"{model_path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    else:
        model = f"sha256:{sha}"
    return {
        "model": model,
        "target": _target_text(target),
        "execution": execution,
        "kleidipy": importlib.metadata.version("kleidipy"),
        "format": FORMAT_VERSION,
    }


def cache_path(model_path: Path, target: Target, execution: str) -> Path:
    """The cache file of a model for a target and execution (a model edited in place keeps its file name, so
    the stale file is replaced rather than left behind)."""
    sha = catalogue_sha256(model_path)
    place = f"sha256:{sha}" if sha else str(model_path.resolve())
    digest = hashlib.sha256(f"{place}|{_target_text(target)}|{execution}".encode()).hexdigest()[:16]
    return repack_dir() / f"{model_path.stem}.{target.name}.{execution}.{digest}.kpack"


class RepackCache:
    """The cache file of one model for one target and execution: :meth:`get` the weights it holds, :meth:`put`
    every weight of the load, :meth:`save` (rewrites the file when a weight had to be repacked)."""

    def __init__(self, model_path: Path, target: Target, execution: str, notice: Callable[[str], None]) -> None:
        self.path = cache_path(model_path, target, execution)
        self.key = cache_key(model_path, target, execution)
        self.notice = notice
        self.loaded: dict[str, CachedWeight] = {}
        self.weights: dict[str, CachedWeight] = {}
        self.dirty = False
        if not self.path.is_file():
            return
        try:
            key, self.loaded = read_cache(self.path)
        except RepackCacheError as exc:
            self.notice(f"repack cache {self.path} is corrupt ({exc}); repacking and rewriting it")
            return
        if key != self.key:
            changed = ", ".join(name for name in self.key if key.get(name) != self.key[name])
            self.notice(f"repack cache {self.path} is stale ({changed} changed); repacking and rewriting it")
            self.loaded = {}

    def get(self, name: str, source_type: GGMLType, n: int, k: int) -> CachedWeight | None:
        """The cached weight ``name`` if it was made from a weight of this type and shape, else None."""
        hit = self.loaded.get(name)
        if hit is None or (hit.source_type, hit.n, hit.k) != (source_type, n, k):
            return None
        return hit

    def put(self, name: str, weight: CachedWeight, fresh: bool) -> None:
        """Record a weight of this load; ``fresh`` when it was repacked rather than read from the file."""
        self.weights[name] = weight
        self.dirty |= fresh

    def save(self) -> None:
        """Write the load's weights when any was repacked (a notice, not an error, when the directory is not
        writable: the cache only saves time)."""
        if not self.dirty:
            return
        try:
            write_cache(self.path, self.key, self.weights)
        except OSError as exc:
            self.notice(f"could not write the repack cache {self.path}: {exc.strerror or exc}")
            return
        self.dirty = False


def write_cache(path: Path, key: dict[str, str | int], weights: dict[str, CachedWeight]) -> None:
    """Write ``weights`` under ``key`` to ``path`` atomically (temporary file in the same directory, then rename)."""
    entries, arrays, offset = [], [], 0
    for name, w in weights.items():
        data = np.ascontiguousarray(w.packed).view(np.ndarray)
        arrays.append(data)
        entries.append(
            {
                "name": name,
                "source_type": int(w.source_type),
                "weight_type": w.weight_type,
                "n": w.n,
                "k": w.k,
                "layout": asdict(w.packed.layout),
                "shape": list(data.shape),
                "offset": offset,
                "nbytes": int(data.nbytes),
                "crc32": zlib.crc32(data),
            }
        )
        offset += roundup(data.nbytes, _ALIGN)
    header = json.dumps({"key": key, "weights": entries}).encode()
    start = _data_start(len(header))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + struct.pack("<Q", len(header)) + header)
            f.write(bytes(start - f.tell()))
            for data in arrays:
                f.write(memoryview(data.reshape(-1)))
                f.write(bytes(roundup(data.nbytes, _ALIGN) - data.nbytes))
        os.chmod(tmp, 0o644)  # mkstemp made it private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_cache(path: Path) -> tuple[dict, dict[str, CachedWeight]]:
    """(key, weights) of a cache file, every weight's size and crc32 checked (RepackCacheError otherwise)."""
    try:
        with path.open("rb") as f:
            header, start = _read_header(f)
            weights, arena = {}, HugePageArena()
            for e in header["weights"]:
                f.seek(start + e["offset"])
                data = arena.take(e["nbytes"])
                if f.readinto(memoryview(data)) != data.nbytes:
                    raise RepackCacheError(f"truncated at weight '{e['name']}'")
                if zlib.crc32(data) != e["crc32"]:
                    raise RepackCacheError(f"checksum mismatch in weight '{e['name']}'")
                layout = PackedLayout(**e["layout"])
                packed = PackedBuffer(data.reshape(e["shape"]), layout)
                weights[e["name"]] = CachedWeight(GGMLType(e["source_type"]), e["weight_type"], e["n"], e["k"], packed)
            return header["key"], weights
    except RepackCacheError:
        raise
    except OSError as exc:
        raise RepackCacheError(exc.strerror or str(exc)) from None
    except (ValueError, KeyError, TypeError) as exc:  # JSON, GGML type, layout or shape that is not what we wrote
        raise RepackCacheError(f"unreadable header: {exc}") from None


def read_key(path: Path) -> dict:
    """The key a cache file was made for, from its header alone (RepackCacheError when it cannot be read)."""
    try:
        with path.open("rb") as f:
            return dict(_read_header(f)[0]["key"])
    except RepackCacheError:
        raise
    except OSError as exc:
        raise RepackCacheError(exc.strerror or str(exc)) from None
    except (ValueError, KeyError, TypeError) as exc:  # not the JSON header we write
        raise RepackCacheError(f"unreadable header: {exc}") from None


@dataclass(frozen=True)
class CacheFile:
    """A repack cache file on disk: its size and, when it was made from a pulled catalogue model, that model's
    sha256 (None for a GGUF file of the user's, or a file whose header cannot be read)."""

    path: Path
    size: int
    model_sha256: str | None


def cache_files() -> list[CacheFile]:
    """Every repack cache file in :func:`repack_dir` (none when it does not exist), by name."""
    files = []
    for path in sorted(repack_dir().glob("*.kpack")):
        try:
            size = path.stat().st_size
        except OSError:  # removed meanwhile
            continue
        try:
            model = str(read_key(path).get("model", ""))
        except RepackCacheError:  # counted all the same, as no model's
            model = ""
        files.append(CacheFile(path, size, model.removeprefix("sha256:") if model.startswith("sha256:") else None))
    return files


def remove_model_caches(sha256: str) -> list[CacheFile]:
    """Delete every repack cache file (all targets and executions) made from the catalogue model with this sha256;
    the files removed (RepackCacheError, naming the file, when one cannot be)."""
    removed = [file for file in cache_files() if file.model_sha256 == sha256]
    for file in removed:
        try:
            file.path.unlink(missing_ok=True)
        except OSError as exc:
            raise RepackCacheError(f"cannot remove the repack cache file {file.path}: {exc.strerror or exc}") from None
    return removed


def _data_start(header_size: int) -> int:
    """Offset of the first weight: after the magic, the header length and the header, aligned."""
    return roundup(len(_MAGIC) + 8 + header_size, _ALIGN)


def _read_header(f: BinaryIO) -> tuple[dict, int]:
    """(header, offset of the first weight) of the cache file open as ``f``, read from its start."""
    if f.read(len(_MAGIC)) != _MAGIC:
        raise RepackCacheError("not a kleidipy repack cache file")
    (size,) = struct.unpack("<Q", _read_exactly(f, 8))
    return json.loads(_read_exactly(f, size)), _data_start(size)


def _read_exactly(f, size: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise RepackCacheError("truncated header")
    return data
